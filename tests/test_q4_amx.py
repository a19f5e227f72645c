"""The AMX form of the q4 x int8 GEMM (intrinsics/q4_amx.py: one tdpbssd per group and 16 columns,
int8 activations as ``quantize_tokens`` writes them, nibbles unpacked into the B tile) and how
rules/q4_int8_gemm.py offers it.

On every host: the rule's AMX schedules with the emulated tile (same unpacking, same tile
addresses and strides, tdpbssd's arithmetic written out) run bit-exact against the integer dot and
within the float tests' tolerance of ``reference_np`` (equal to the VNNI form's result); the real
form cross-compiles for Sapphire Rapids with its tile instructions and config; the VNNI forms are
unchanged on targets without AMX; a sampled AMX candidate replays from its trace's JSON (databases).
On a host whose /proc/cpuinfo shows amx_tile the real form also runs.
"""
import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

import tvm_ffi  # noqa: E402
from tvm.s_tir import Schedule, TensorIntrin  # noqa: E402
from tvm.s_tir.schedule import Trace  # noqa: E402

from tvm_ext.intrinsics import amx as amx_intrin  # noqa: E402
from tvm_ext.intrinsics import q4_amx, q4_vnni  # noqa: E402
from tvm_ext.rules import q4_int8_gemm as rule  # noqa: E402
from tvm_ext.targets import _cpuinfo, resolve_target  # noqa: E402
from tvm_ext.workloads.phi2 import q4_int8_gemm as g  # noqa: E402
from tvm_ext.workloads.phi2.layers import _quantized_linear  # noqa: E402

HOST = resolve_target("llvm")
SPR = resolve_target({"kind": "llvm", "mcpu": "sapphirerapids"})
ZNVER5 = resolve_target({"kind": "llvm", "mcpu": "znver5"})
HOST_AMX = "amx_tile" in _cpuinfo().get("flags", set())
N = 64
SHAPES = [(16, 64), (32, 128)]  # (M, K)


def _operands(m, k, seed=0):
    rng = np.random.default_rng(seed)
    packed, scale, bias = _quantized_linear(rng, k, N)
    x = rng.uniform(-3, 3, (m, k)).astype("float32")
    x[1, 32:64] = 0.0  # a group of zeros: scale 0
    x[2, 5] = 40.0  # an outlier
    return x, packed, scale.astype("float32"), bias


def _pattern(func):
    sch = Schedule(tvm.IRModule({"main": func}))
    return sch, rule.match(sch, sch.get_sblock(g.DOT_BLOCK))


def _scheduled(m, k, sketch, form="amx_emu", chunks=1):
    sch, p = _pattern(g.gemm(m, N, k))
    rule.schedule(sch, p, *sketch, chunks=chunks, form=form)
    return sch.mod


def _call(mod, inputs, m, target=HOST):
    dev = tvm.cpu()
    y = tvm.runtime.tensor(np.zeros((1, m, N), "float32"), dev)
    tvm.compile(mod, target=target)["main"](*[tvm.runtime.tensor(a, dev) for a in inputs], y)
    return y.numpy()[0]


def _float_inputs(x, packed, scale, bias):
    return (*g.quantize_np(x), *g.repack(packed, scale), bias)


def _integer_case(m, k, seed=1):
    """Inputs whose float step is exact: scales 1, corr 0, bias 0 (every partial sum an integer below
    2^24), so the output is the int32 dot summed over groups; and that sum from NumPy."""
    rng = np.random.default_rng(seed)
    packed = _quantized_linear(rng, k, N)[0]
    q = rng.integers(-128, 128, (m, k)).astype("int8")  # the full int8 range, -128 included
    xq = np.ascontiguousarray(q.reshape(m, k // 8, 4, 2).transpose(0, 1, 3, 2))
    ones = np.ones((N, k // 32), "float32")
    wq, ws = g.repack(packed, ones)
    nib = np.stack([(packed >> np.uint32(4 * j)) & np.uint32(15) for j in range(8)], -1).reshape(N, k)
    want = q.astype(np.int64) @ nib.astype(np.int64).T
    inputs = (xq, np.ones((m, k // 32), "float32"), np.zeros((m, k // 32), "int32"), wq, ws, np.zeros(N, "float32"))
    return inputs, want


def _asm(mod, target):
    return tvm.compile(mod, target=target).mod.inspect_source("asm")


# --------------------------------------------------------------------------- emulated, on every host
@pytest.mark.parametrize("m,k", SHAPES)
def test_first_amx_sketch_emulated_matches_reference_and_vnni(m, k):
    """The rule's first AMX sketch (16 tokens x 4 column blocks) with the emulated tile: within the
    float tolerance of ``reference_np`` and equal to the VNNI form's result."""
    sch, p = _pattern(g.gemm(m, N, k))
    first = rule.sketches(p, "amx_emu")[0]
    assert first == (16, 4, 0) and rule.sketches(p, "amx") == rule.sketches(p, "amx_emu")
    x, packed, scale, bias = _operands(m, k)
    inputs = _float_inputs(x, packed, scale, bias)
    got = _call(_scheduled(m, k, first), inputs, m)
    want = g.reference_np(x, packed, scale, bias)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    vnni = rule.Q4Int8GEMM().apply_to_module(tvm.IRModule({"main": g.gemm(m, N, k)}), HOST)
    np.testing.assert_array_equal(got, _call(vnni, inputs, m))


@pytest.mark.parametrize("m,k", SHAPES + [(8, 64)])
def test_every_amx_sketch_emulated_integer_dot_exact(m, k):
    """Every AMX sketch (NB 4, 2, 1; M < 16: one tile of all tokens), token chunks 1 and M / MB:
    the int32 dot bit-exact (activations over the full int8 range)."""
    _, p = _pattern(g.gemm(m, N, k))
    sketches = rule.sketches(p, "amx_emu")
    mb = min(m, 16)
    assert [s[:2] for s in sketches] == [(mb, 4), (mb, 2), (mb, 1)]
    inputs, want = _integer_case(m, k)
    for i, sketch in enumerate(sketches):
        chunks = 1 if i % 2 == 0 else m // mb
        got = _call(_scheduled(m, k, sketch, chunks=chunks), inputs, m)
        np.testing.assert_array_equal(got.astype(np.int64), want, err_msg=str((sketch, chunks)))


def test_sampled_amx_candidate_replays_from_its_trace():
    """The rule (``emulated``) offers the AMX sketches first, then the VNNI ones; an AMX candidate's
    trace, through JSON as a database stores it, rebuilds the same module (dot and its init
    tensorized: the tile config is in the trace), which computes the integer dot."""
    m, k = 32, 64
    func = g.gemm(m, N, k)
    r = rule.Q4Int8GEMM(emulated=True)
    forms = r.forms(HOST)
    assert forms == ["amx_emu", q4_vnni.form_for(HOST)]
    sch = Schedule(tvm.IRModule({"main": func}), seed=3)
    cands = r.candidates(sch, sch.get_sblock(g.DOT_BLOCK), HOST)
    assert len(cands) == 3 + len(rule.sketches(rule.match(sch, sch.get_sblock(g.DOT_BLOCK)), forms[1]))
    cand = cands[0]
    text = str(cand.trace)
    assert q4_amx.intrin_name(16, 4, True) in text and q4_amx.init_name(16, 4, True) in text
    assert "sample_perfect_tile" in text
    replayed = Schedule(tvm.IRModule({"main": func}))
    Trace.apply_json_to_schedule(cand.trace.as_json(), replayed)
    assert tvm_ffi.structural_equal(replayed.mod, cand.mod)
    inputs, want = _integer_case(m, k)
    np.testing.assert_array_equal(_call(replayed.mod, inputs, m).astype(np.int64), want)


def test_opening_a_database_registers_the_amx_tiles_its_records_name(tmp_path):
    """What opening a database calls registers the q4 tiles its records name, AMX ones too (their
    dot with its init), and every tile has a name it can be found by."""
    from tvm_ext.intrinsics import makers
    from tvm_ext.tune.database import register_record_intrinsics

    known = makers()
    assert all(q4_amx.intrin_name(mb, nb, e) in known and q4_amx.init_name(mb, nb, e) in known
               for mb in q4_amx.TOKEN_TILES for nb in q4_amx.COLUMN_TILES for e in (False, True))
    dot, vnni = q4_amx.intrin_name(6, 2, True), q4_vnni.intrin_name(1, 4, "avx2", 8192)
    records = tmp_path / "database_tuning_record.json"
    records.write_text(f'[0, [[[["Tensorize", ["b1"], ["{dot}", 1], []],'
                       f' ["Tensorize", ["b2"], ["{vnni}", 1], []]], []]]]\n')
    register_record_intrinsics(str(records))
    for name in (dot, q4_amx.init_name(6, 2, True), vnni):
        TensorIntrin.get(name)


# --------------------------------------------------------------------------- the real form, cross-compiled
def test_real_amx_form_compiles_with_its_tile_config():
    """On Sapphire Rapids the rule's untuned schedule is the AMX form: tdpbssd per column block, the
    tiles loaded and stored, the thread's config read back and this form's loaded where it differs
    (C 16 x 64 bytes, A 16 x 32, B 8 x 64), no vpdpbusd."""
    cfg = q4_amx.tile_config(16)
    assert cfg[16:22] == [64, 0, 32, 0, 64, 0] and cfg[48:51] == [16, 16, 8] and cfg[0] == 1
    assert cfg == amx_intrin.tile_config_bytes(16, 32, 8) != amx_intrin.tile_config_bytes(16)
    words = [int.from_bytes(bytes(cfg[8 * w: 8 * w + 8]), "little") for w in range(8)]
    assert rule.forms(SPR) == ["amx", "avx512vnni"]
    m, k = 32, 128
    mod = rule.Q4Int8GEMM().apply_to_module(tvm.IRModule({"main": g.gemm(m, N, k)}), SPR)
    asm = _asm(mod, SPR)
    assert asm.count("tdpbssd") == 4 and "vpdpbusd" not in asm  # NB = 4: one per column block
    for instr in ("tileloadd", "tilestored", "tilezero", "ldtilecfg", "sttilecfg"):
        assert instr in asm, instr
    for w in (words[2], words[6]):
        assert str(w) in asm or hex(w) in asm, w
    # M < 16 (even): one tile of all the tokens
    asm8 = _asm(rule.Q4Int8GEMM().apply_to_module(tvm.IRModule({"main": g.gemm(8, N, k)}), SPR), SPR)
    assert "tdpbssd" in asm8 and str(words[6] - 8 - (8 << 8)) in asm8  # rows word of an 8-row C and A


def test_plugin_space_on_an_amx_target():
    """``tvm_ext.space`` for Sapphire Rapids: three AMX sketches (NB 4, 2, 1) and six VNNI ones;
    a sample of each passes the space's postprocs and compiles with its form's instructions."""
    from tvm.s_tir import meta_schedule as ms

    import tvm_ext

    target = tvm.target.Target(dict(SPR.export(), **{"num-cores": 2}))
    mod = tvm.IRModule({"main": g.gemm(32, N, 128)})
    ctx = ms.TuneContext(mod=mod, target=target, space_generator=tvm_ext.space(target), task_name="q4", rand_state=1)
    sketches = ctx.generate_design_space()
    forms = ["tdpbssd" if "q4_int8_group_amx" in str(s.trace) else "vpdpbusd" for s in sketches]
    # the sketches' order is PostOrderApply's (each rule after the GEMM's reverses it), not the rule's
    assert sorted(forms) == ["tdpbssd"] * 3 + ["vpdpbusd"] * 6
    for sketch, instr in zip(sketches, forms):
        sch = Schedule(mod, seed=2)
        Trace(sketch.trace.insts, {}).apply_to_schedule(sch, remove_postproc=True)
        assert all(p.apply(sch) for p in ctx.space_generator.postprocs)
        asm = _asm(sch.mod, target)
        assert instr in asm and ("ldtilecfg" in asm) == (instr == "tdpbssd")


def test_prompt_model_on_an_amx_target_prefills_with_amx():
    """The model needs nothing of its own: scheduled for Sapphire Rapids, the prompt's GEMMs (16
    tokens: qkv, dense, fc1, fc2) are the AMX form, the decode's and lm_head's (one token) VNNI."""
    from tvm_ext.workloads.phi2.compiled import schedule
    from tvm_ext.workloads.phi2 import model as pm

    model = pm.build_model("reduced", 2, capacity=18, seed=5, compute="int8", prompt=16)
    mod, used = schedule(model.mod, SPR, "int8")
    gemms = {gv.name_hint: f.script() for gv, f in mod.functions_items() if used.get(gv.name_hint) == "q4_int8_gemm"}
    amx = [n for n, text in gemms.items() if "llvm.x86.tdpbssd" in text]
    assert len(gemms) == 4 + 4 + 1 and len(amx) == 4, sorted(gemms)
    assert all("vpdpbusd" in text for n, text in gemms.items() if n not in amx)


def test_vnni_forms_unchanged_without_amx():
    """On targets without AMX the rule's first sketch is the VNNI one exactly as before (the schedule
    ``rule.schedule`` makes with the VNNI form's first sketch); one token is VNNI on AMX targets too."""
    assert rule.forms(ZNVER5) == ["avx512vnni"] and rule.forms(HOST) == [q4_vnni.form_for(HOST)]
    for m in (1, 8, 32):
        func = g.gemm(m, N, 128)
        sch, p = _pattern(func)
        rule.schedule(sch, p, *rule.sketches(p, "avx512vnni")[0], form="avx512vnni")
        assert tvm_ffi.structural_equal(rule.Q4Int8GEMM().apply(func, ZNVER5).mod, sch.mod), m
        assert tvm_ffi.structural_equal(rule.Q4Int8GEMM().apply(func, None).mod, sch.mod), m  # no target: VNNI
    one = rule.Q4Int8GEMM().apply(g.gemm(1, N, 128), SPR)
    assert "avx512vnni" in str(one.trace) and "amx" not in str(one.trace)


def test_tokens_the_amx_tile_cannot_cover_get_the_vnni_form():
    """Documented: M > 16 not a multiple of 16 (and M = 1) has no AMX sketch; on an AMX target its
    schedule is the VNNI form's.  A tile outside MB 2..16 even, NB 1, 2, 4 is a ValueError."""
    for m in (1, 24, 40):
        _, p = _pattern(g.gemm(m, N, 64))
        assert rule.sketches(p, "amx") == [] and rule.sketches(p, "avx512vnni"), m
    trace = str(rule.Q4Int8GEMM().apply(g.gemm(24, N, 64), SPR).trace)
    assert q4_vnni.intrin_name(4, 2) in trace and "amx" not in trace
    assert q4_amx.token_tile(48) == 16 and q4_amx.token_tile(14) == 14 and q4_amx.token_tile(7) is None
    for mb, nb in ((3, 2), (32, 2), (16, 8)):
        with pytest.raises(ValueError, match="no q4 AMX tile"):
            q4_amx.register(mb, nb)


# --------------------------------------------------------------------------- on an AMX host
@pytest.mark.skipif(not HOST_AMX, reason="no amx_tile in /proc/cpuinfo")
@pytest.mark.parametrize("m,k", SHAPES)
def test_real_amx_form_runs_on_amx_host(m, k):
    from tvm_ext import amx

    amx.request_amx()
    inputs, want = _integer_case(m, k)
    for sketch in rule.sketches(_pattern(g.gemm(m, N, k))[1], "amx"):
        got = _call(_scheduled(m, k, sketch, form="amx"), inputs, m, target=SPR)
        np.testing.assert_array_equal(got.astype(np.int64), want, err_msg=str(sketch))
    x, packed, scale, bias = _operands(m, k)
    want = g.reference_np(x, packed, scale, bias)
    mod = rule.Q4Int8GEMM().apply_to_module(tvm.IRModule({"main": g.gemm(m, N, k)}), SPR)
    got = _call(mod, _float_inputs(x, packed, scale, bias), m, target=SPR)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
