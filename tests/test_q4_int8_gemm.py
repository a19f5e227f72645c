"""The q4 x int8 GEMM (workloads/phi2/q4_int8_gemm.py: a prompt's prefill, and one token's GEMV), its
tile intrinsic (AVX-512 VNNI, AVX-VNNI, AVX2 forms) and the Q4Int8GEMM schedule rule
(rules/q4_int8_gemm.py).

Every sketch the rule offers is built and, where the host runs its form, run against the same
integer arithmetic in NumPy (``reference_np``); elsewhere each is cross-compiled and its assembly
must hold the form's instructions.  The rule finds the pattern by structure (renamed blocks match, a
different nibble order does not), stays out of the way on targets without AVX2, and MetaSchedule
tunes the GEMM through ``tvm_ext.space``.  Bad shapes get one ValueError.
"""
import subprocess
import sys

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm.s_tir import Schedule  # noqa: E402

from tvm_ext.intrinsics.q4_vnni import form_for as q4_vnni_form  # noqa: E402
from tvm_ext.rules import q4_int8_gemm as rule  # noqa: E402
from tvm_ext.targets import resolve_target  # noqa: E402
from tvm_ext.workloads.phi2 import q4_int8_gemm as g  # noqa: E402
from tvm_ext.workloads.phi2.layers import _quantized_linear  # noqa: E402

HOST = resolve_target("llvm")
CASCADELAKE = resolve_target({"kind": "llvm", "mcpu": "cascadelake"})
ALDERLAKE = resolve_target({"kind": "llvm", "mcpu": "alderlake"})  # AVX-VNNI, no AVX-512
ON_VNNI = q4_vnni_form(HOST) == "avx512vnni"  # the sketches run here are the 512-bit form
M, N, K = 8, 64, 96


def _operands(m=M, n=N, k=K, seed=0):
    rng = np.random.default_rng(seed)
    packed, scale, bias = _quantized_linear(rng, k, n)
    x = rng.uniform(-3, 3, (m, k)).astype("float32")
    x[1, 32:64] = 0.0  # a group of zeros: scale 0
    x[2, 5] = 40.0  # an outlier sets its group's scale
    return x, packed, scale.astype("float32"), bias  # float16 scales: test_one_token_sketches


def _scheduled(func, sketch, form="avx512vnni"):
    """``func`` scheduled with ``sketch`` = (MB, NB, prefetch bytes, token chunks)."""
    sch = Schedule(tvm.IRModule({"main": func}))
    p = rule.match(sch, sch.get_sblock(g.DOT_BLOCK))
    rule.schedule(sch, p, *sketch, form=form)
    return sch.mod


def _run(mod, x, packed, scale, bias, m=M, n=N, target=HOST):
    dev = tvm.cpu()
    wq, ws = g.repack(packed, scale)
    args = [tvm.runtime.tensor(a, dev) for a in (*g.quantize_np(x), wq, ws, bias)]
    y = tvm.runtime.tensor(np.zeros((1, m, n), "float32"), dev)
    tvm.compile(mod, target=target)["main"](*args, y)
    return y.numpy()[0]


@pytest.mark.parametrize("m", [1, M])
def test_quantize_tokens_matches_numpy(m):
    """Bit for bit, one token (serial) and several (parallel): a group of zeros (scale 0), one of exact
    halves after scaling (round half to even: 2.5 -> 2, -3.5 -> -4), every byte in xq's order."""
    x = _operands()[0][:m].copy()
    x[0, 32:64] = 0.0
    x[0, 64:96] = np.linspace(-15.5, 15.5, 32, dtype="float32")
    x[0, 64] = 127.0  # the group's max: scale 1, the halves stay halves
    dev = tvm.cpu()
    outs = [tvm.runtime.tensor(np.zeros(s, dt), dev) for s, dt in
            (((m, K // 8, 2, 4), "int8"), ((m, K // 32), "float32"), ((m, K // 32), "int32"))]
    func = g.quantize_tokens(m, K).with_attr("global_symbol", "main")
    tvm.compile(tvm.IRModule({"main": func}), target=HOST)["main"](tvm.runtime.tensor(x[None], dev), *outs)
    for got, want in zip(outs, g.quantize_np(x)):
        np.testing.assert_array_equal(got.numpy(), want)


def test_reference_is_the_float_product_within_quantization():
    """The integer arithmetic is a quantized x @ W: close to the float product, not equal."""
    from tvm_ext.workloads.phi2.layers import dequantize_np

    x, packed, scale, bias = _operands()
    exact = x.astype("float64") @ dequantize_np(packed, scale) + bias
    got = g.reference_np(x, packed, scale, bias)
    err = np.abs(got - exact).max() / np.abs(exact).max()
    assert 0 < err < 0.02, err


@pytest.mark.parametrize("epilogue", g.EPILOGUES)
def test_every_sketch_computes_the_reference(epilogue):
    x, packed, scale, bias = _operands()
    func = g.gemm(M, N, K, epilogue)
    sch = Schedule(tvm.IRModule({"main": func}))
    p = rule.match(sch, sch.get_sblock(g.SCALE_BLOCK))  # either block of the pair finds it
    sketches = rule.sketches(p)
    assert sketches[0] == (rule.DEFAULT_MB, rule.DEFAULT_NB, 0) and len(sketches) == 3 * 2
    want = g.reference_np(x, packed, scale, bias, epilogue)
    for mb, nb, ahead in sketches:  # token tiles in one chunk (columns outer) and one chunk per tile (tokens outer)
        sketch = (mb, nb, ahead, 1 if (mb + nb) % 2 else M // mb)
        mod = _scheduled(func, sketch)
        if ON_VNNI:
            np.testing.assert_allclose(_run(mod, x, packed, scale, bias), want, rtol=1e-5,
                                       atol=1e-5 * np.abs(want).max(), err_msg=str(sketch))
        else:
            asm = tvm.compile(mod, target=CASCADELAKE).mod.inspect_source("asm")
            assert "vpdpbusd" in asm, sketch


@pytest.mark.parametrize("epilogue", g.EPILOGUES)
def test_one_token_sketches(epilogue):
    """M = 1 (the decode's GEMV, float16 scales as the model stores them): 1 x 1 tiles prefetching
    8 KiB ahead first, every sketch computes the reference; the prefetch is in the assembly."""
    x, packed, scale, bias = _operands()
    x, scale = x[2:3], scale.astype("float16")  # the token with an outlier
    func = g.gemm(1, N, K, epilogue, "float16")
    sch = Schedule(tvm.IRModule({"main": func}))
    sketches = rule.sketches(rule.match(sch, sch.get_sblock(g.DOT_BLOCK)))
    assert sketches[0] == (1, 1, rule.DEFAULT_AHEAD) and (1, 1, 0) in sketches and (1, 2, 8192) in sketches
    want = g.reference_np(x, packed, scale, bias, epilogue)
    for mb, nb, ahead in sketches:
        mod = _scheduled(func, (mb, nb, ahead, 1))
        if ON_VNNI:
            np.testing.assert_allclose(_run(mod, x, packed, scale, bias, m=1), want, rtol=1e-5,
                                       atol=1e-5 * np.abs(want).max(), err_msg=str((nb, ahead)))
    asm = tvm.compile(_scheduled(func, sketches[0]), target=CASCADELAKE).mod.inspect_source("asm")
    assert "vpdpbusd" in asm and "prefetcht0" in asm


@pytest.mark.parametrize("m", [1, M])
def test_avx2_form(m):
    """Without VNNI (Haswell .. Zen 3): vpmaddubsw + vpmaddwd, no vpdpbusd; run on this host (every
    x86 CPU the tests run on has AVX2)."""
    from tvm_ext.intrinsics import q4_vnni

    haswell = resolve_target({"kind": "llvm", "mcpu": "haswell"})
    assert q4_vnni.form_for(haswell) == "avx2"
    x, packed, scale, bias = _operands()
    x = x[:m]
    want = g.reference_np(x, packed, scale, bias)
    untuned = rule.Q4Int8GEMM().apply_to_module(tvm.IRModule({"main": g.gemm(m, N, K)}), haswell)
    asm = tvm.compile(untuned, target=haswell).mod.inspect_source("asm")
    assert "vpmaddubsw" in asm and "vpdpbusd" not in asm and "zmm" not in asm
    np.testing.assert_allclose(_run(untuned, x, packed, scale, bias, m=m, target=haswell), want, rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())


def test_avx2_form_is_exact_for_every_activation_byte():
    """The AVX2 form sums a group's 32 products in int16 lanes (16 each: at most 15 x 128 x 16 = 30720);
    every tile, fed int8 activations of the whole range and nibbles of 15 at the extremes, must give the
    integer dot exactly (unit scales, no correction, no bias: y is the dot).  Summing two groups in int16,
    or one with vpmaddubsw's saturating pair sums of bytes, would be off here."""
    rng = np.random.default_rng(3)
    sch = Schedule(tvm.IRModule({"main": g.gemm(M, N, K)}))
    p = rule.match(sch, sch.get_sblock(g.DOT_BLOCK))
    cases = [(rng.integers(-128, 128, (M, K // 8, 2, 4)).astype("int8"),
              rng.integers(0, 2**32, (N // 16, K // 8, 16), dtype=np.uint64).astype("uint32"))]
    cases += [(np.full((M, K // 8, 2, 4), x, "int8"), np.full((N // 16, K // 8, 16), 0xFFFFFFFF, "uint32"))
              for x in (-128, 127)]
    shifts = (8 * np.arange(4)[None, :] + 4 * np.arange(2)[:, None]).astype("uint32")  # [p, b]
    dev = tvm.cpu()
    for sketch in rule.sketches(p, "avx2"):
        kernel = tvm.compile(_scheduled(g.gemm(M, N, K), (*sketch, 1), form="avx2"), target=HOST)["main"]
        for xq, wq in cases:
            nibbles = (wq[..., None, None] >> shifts) & 15  # (N/16, K/8, 16, 2, 4)
            want = np.einsum("nvipb,mvpb->mni", nibbles.astype(np.int64), xq.astype(np.int64)).reshape(M, N)
            y = tvm.runtime.tensor(np.zeros((1, M, N), "float32"), dev)
            kernel(*[tvm.runtime.tensor(a, dev) for a in (xq, np.ones((M, K // 32), "float32"),
                                                          np.zeros((M, K // 32), "int32"), wq,
                                                          np.ones((N // 16, K // 32, 16), "float32"),
                                                          np.zeros(N, "float32"))], y)
            np.testing.assert_array_equal(y.numpy()[0], want.astype("float32"), err_msg=str((sketch, xq.flat[0])))


@pytest.mark.parametrize("epilogue", g.EPILOGUES)
def test_avx_vnni_form(epilogue):
    """The 256-bit form (AVX-VNNI, e.g. Alder Lake): two ymm vpdpbusd per 16 columns, no zmm; run
    where the host has AVX-VNNI (the AVX-512 VNNI hosts of Zen 4 and Sapphire Rapids do too)."""
    from tvm_ext.intrinsics import q4_vnni
    from tvm_ext.targets import vnni_kinds

    assert q4_vnni.form_for(ALDERLAKE) == "avxvnni" and q4_vnni.form_for(CASCADELAKE) == "avx512vnni"
    x, packed, scale, bias = _operands()
    want = g.reference_np(x, packed, scale, bias, epilogue)
    func = g.gemm(M, N, K, epilogue)
    untuned = rule.Q4Int8GEMM().apply_to_module(tvm.IRModule({"main": func}), ALDERLAKE)
    asm = tvm.compile(untuned, target=ALDERLAKE).mod.inspect_source("asm")
    assert "vpdpbusd" in asm and "zmm" not in asm
    if "avxvnni" in vnni_kinds(HOST):
        for sketch in ((2, 2, 0, 1), (4, 2, 0, 1), (8, 4, 0, M // 8)):
            got = _run(_scheduled(func, sketch, form="avxvnni"), x, packed, scale, bias, target=ALDERLAKE)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=str(sketch))


def test_match_is_by_structure():
    """Blocks renamed still match; a function already scheduled (tensorized) does not."""
    script = g.gemm(M, N, K).script().replace(g.DOT_BLOCK, "first").replace(g.SCALE_BLOCK, "second")
    renamed = tvm.script.from_source(script)
    sch = Schedule(tvm.IRModule({"main": renamed}))
    p = rule.match(sch, sch.get_sblock("second"))
    assert (p.dot, p.scale, p.tokens, p.column_blocks) == ("first", "second", M, N // 16)
    assert len(p.epilogues) == 1
    tensorized = _scheduled(g.gemm(M, N, K), (2, 2, 0, 2))
    assert rule.Q4Int8GEMM().apply_to_module(tensorized, CASCADELAKE)["main"].same_as(tensorized["main"])
    assert not rule.Q4Int8GEMM().apply_to_module(tvm.IRModule({"main": renamed}), CASCADELAKE)["main"].same_as(renamed)


def test_other_nibble_orders_and_kernels_are_left_alone():
    """A GEMM whose nibbles are read high first is a different computation: no match, unchanged."""
    from tvm import te, tirx

    xq, xs, corr, wq, ws, bias, _ = g.gemm_te(M, N, K)
    v, p, b = (te.reduce_axis((0, e), name=nm) for e, nm in ((4, "v"), (2, "p"), (4, "b")))
    dot = te.compute((K // 32, M, N // 16, 16), lambda gg, t, nb, i: te.sum(tirx.Cast(
        "int32", (wq[nb, gg * 4 + v, i] >> tirx.Cast("uint32", 28 - b * 8 - p * 4)) & tirx.const(15, "uint32"))
        * tirx.Cast("int32", xq[t, gg * 4 + v, p, b]), axis=[v, p, b]), name="d")
    func = te.create_prim_func([xq, wq, dot])
    mod = tvm.IRModule({"main": func})
    assert rule.Q4Int8GEMM().apply_to_module(mod, CASCADELAKE)["main"].same_as(func)
    gemm = tvm.IRModule({"main": g.gemm(M, N, K)})
    for target in ({"kind": "llvm", "mcpu": "x86-64"}, {"kind": "llvm", "mcpu": "sandybridge"}):
        assert rule.Q4Int8GEMM().apply_to_module(gemm, target)["main"].same_as(gemm["main"]), target  # no AVX2


@pytest.mark.skipif(not ON_VNNI, reason="this host has no AVX-512 VNNI (the rule offers nothing here)")
def test_metaschedule_tunes_it_through_the_plugin_space(tmp_path):
    """ms.tune_tir with tvm_ext.space (and the stack's builder and runner): every candidate is one
    of the rule's sketches, measured, and the best one computes the reference."""
    from tvm.s_tir import meta_schedule as ms

    import tvm_ext
    import tvm_ext.tune

    mod = tvm.IRModule({"main": g.gemm(M, N, K)})
    target = tvm.target.Target(dict(HOST.export(), **{"num-cores": 2}))
    db = ms.tune_tir(mod, target, str(tmp_path), max_trials_global=4, num_trials_per_iter=4,
                     space=tvm_ext.space(target), builder=tvm_ext.tune.make_builder(),
                     runner=tvm_ext.tune.make_runner(), strategy=tvm_ext.tune.search_strategy(4),
                     database=ms.database.JSONDatabase(work_dir=str(tmp_path)))
    records = db.get_all_tuning_records()
    assert len(records) == 4 and all(r.run_secs and float(r.run_secs[0]) < 1 for r in records)
    assert all("tvm_ext.q4_int8_group_avx" in str(r.trace) and "sample_perfect_tile" in str(r.trace)
               for r in records)
    sch = ms.tir_integration.compile_tir(db, mod, target)
    # a new process loads the records (their traces name our tile intrinsics, registered on load)
    code = ("from tvm_ext.tune.database import open_database; "
            f"print(len(open_database({str(tmp_path)!r}, read_only=True).get_all_tuning_records()))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.split()[-1] == "4", done.stderr[-500:]
    x, packed, scale, bias = _operands()
    want = g.reference_np(x, packed, scale, bias)
    np.testing.assert_allclose(_run(sch.mod, x, packed, scale, bias), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("m,n,k", [(7, 64, 96), (8, 48, 96), (8, 64, 40), (0, 64, 96)])
def test_bad_shapes(m, n, k):
    with pytest.raises(ValueError, match="M 1 or even, N a multiple of 32 and K of 32"):
        g.gemm(m, n, k)


def test_bad_epilogue():
    with pytest.raises(ValueError, match="epilogue"):
        g.gemm(M, N, K, "relu")
