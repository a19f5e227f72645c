"""DequantGEMV (rules/dequant_gemv.py) on Phi-2's q4 decode kernels, reduced config.

Every fused decode GEMV kernel (qkv, dense + residuals, fc1 + gelu, fc2, lm_head), scheduled
untuned and with sampled decisions, matches NumPy (``phi2.dequantize_np``); the whole fused
module with ``untuned`` matches the workload's reference; functions that are not a 1-row
dequantize-GEMV (the unfused plain matmuls, attention, LayerNorm, a prefill matmul, an int8
conv, a plain fp32 GEMV) come back structurally unchanged from both the rule and ``untuned``.
"""
import math

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

import tvm_ffi  # noqa: E402
from tvm.s_tir import Schedule, Trace  # noqa: E402
from tvm.script import tirx as T  # noqa: E402

from tvm_ext.arrays import random_arrays  # noqa: E402
from tvm_ext.analysis.gemv_pattern import match_func  # noqa: E402
from tvm_ext.intrinsics import q4_gemv  # noqa: E402
from tvm_ext.rules.dequant_gemv import DequantGEMV, factored_lanes  # noqa: E402
from tvm_ext.targets import resolve_target  # noqa: E402
from tvm_ext.tir_utils import blocks_of  # noqa: E402
from tvm_ext.workloads.phi2 import kernels as phi2  # noqa: E402

TARGET = resolve_target("llvm")
# fused kernel -> projection, recognised by the unfused kernels it was made of
PROJECTIONS = ("qkv", "dense", "fc1", "fc2", "lm_head")


def _projection(kernel) -> str:
    if kernel.part == "head":
        return "lm_head"
    if "gelu_tanh" in kernel.parts:
        return "fc1"
    n_out = int(kernel.func.params[-1].shape[-1])
    k_in = int(kernel.func.params[0].shape[1]) * 8
    if n_out == 3 * k_in:
        return "qkv"
    return "fc2" if k_in > n_out else "dense"


@pytest.fixture(scope="module")
def fused():
    wl = phi2.build_decode(context=8, config="reduced", fusion=True)
    return wl, phi2.kernels(wl)


@pytest.fixture(scope="module")
def gemvs(fused):
    found = {}
    for k in fused[1].kernels:
        if DequantGEMV().matches(k.func):
            found[_projection(k)] = k
    assert sorted(found) == sorted(PROJECTIONS)
    return found


def _main(func):
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def _reference(kernel, arrays):
    """NumPy float64: epilogue(x @ dequantize(P, S) + bias) (+ residual inputs)."""
    packed, scale, act, bias, *extra, _ = arrays
    y = act.reshape(-1).astype("float64") @ phi2.dequantize_np(packed, scale) + bias
    if "gelu_tanh" in kernel.parts:  # gelu_new, as Phi-2
        y = 0.5 * y * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y**3)))
    for e in extra:
        y = y + e.reshape(-1)
    return y


def _is_factored(mod) -> bool:
    """Whether the module's GEMV is the factored intrinsic (its prefetch and byte view)."""
    script = mod["main"].script()
    return "llvm.prefetch" in script and '"uint8", data=' in script


def _check(kernel, mod, seed=0):
    rng = np.random.default_rng(seed)
    arrays = random_arrays(kernel.func, rng, {"uint32": (0, 2**32 - 1)}, int_range=(0, 15))
    args = [tvm.runtime.tensor(a, tvm.cpu()) for a in arrays]
    tvm.compile(mod, target=TARGET)["main"](*args)
    ref = _reference(kernel, arrays)
    np.testing.assert_allclose(args[-1].numpy().reshape(-1), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("projection", PROJECTIONS)
def test_untuned_matches_numpy(gemvs, projection):
    kernel = gemvs[projection]
    mod = DequantGEMV().apply_to_module(_main(kernel.func), TARGET)
    script = mod["main"].script()
    assert "T.parallel" in script and "T.vectorized" in script and 'T.sblock("dequantize")' not in script
    _check(kernel, mod)


def _sampled(func, seed):
    """The rule's sketch replayed with its decisions drawn again (as MetaSchedule samples)."""
    sch = Schedule(_main(func))
    (sketch,) = DequantGEMV().candidates(sch, sch.get_sblock(match_func(func).gemv), None)
    out = Schedule(_main(func), seed=seed)
    Trace(sketch.trace.insts, {}).apply_to_schedule(out, remove_postproc=True)
    return out


@pytest.mark.parametrize("projection", PROJECTIONS)
def test_sampled_decisions_match_numpy(gemvs, projection):
    kernel = gemvs[projection]
    decisions = set()
    for seed in (271828183, 314159265):  # MetaSchedule draws large seeds (small ones correlate)
        sch = _sampled(kernel.func, seed)
        assert not tvm_ffi.structural_equal(sch.mod, _main(kernel.func))
        decisions.add(tuple(int(v) for v in sch.trace.decisions.values()))
        _check(kernel, sch.mod, seed)
    assert len(decisions) > 1  # the space has more than the default point


def test_rule_also_matches_after_autoinline(gemvs):
    """MetaSchedule's AutoInline may inline the dequantize before the rule sees the GEMV."""
    kernel = gemvs["fc1"]
    sch = Schedule(_main(kernel.func), seed=5)
    sch.compute_inline(sch.get_sblock(match_func(kernel.func).dequantize))
    (out,) = DequantGEMV().candidates(sch, sch.get_sblock("matmul"), None)
    assert "T.parallel" in out.mod["main"].script()
    _check(kernel, out.mod)


def test_untuned_whole_fused_module_matches_reference(fused):
    """``untuned`` on the lowered Relax module: GEMVs scheduled, everything else untouched,
    and the decode step (layer + head) still matches the workload's NumPy reference."""
    wl, _ = fused
    mod = DequantGEMV().apply_to_module(wl.mod, TARGET)
    changed = [gv.name_hint for gv, f in wl.mod.functions.items()
               if not tvm_ffi.structural_equal(f, mod[gv])]
    assert len(changed) == len(PROJECTIONS) and all(DequantGEMV().matches(wl.mod[n]) for n in changed)
    vm = tvm.relax.VirtualMachine(tvm.compile(mod, target=TARGET), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a, tvm.cpu()) for a in wl.inputs]).numpy()
    ok, message = wl.check(out)
    assert ok, message


def _assert_left_alone(func):
    mod = _main(func)
    assert not DequantGEMV().matches(func)
    tvm.ir.assert_structural_equal(DequantGEMV().apply_to_module(mod, TARGET), mod)
    sch = Schedule(mod)
    for block in blocks_of(func):
        (out,) = DequantGEMV().candidates(sch, sch.get_sblock(block.name_hint), None)
        tvm.ir.assert_structural_equal(out.mod, mod)


def test_other_decode_kernels_left_alone(fused):
    wl = phi2.build_decode(context=8, config="reduced", fusion=False)
    others = [k for k in phi2.kernels(wl).kernels] + [k for k in fused[1].kernels if not DequantGEMV().matches(k.func)]
    assert any(k.name.startswith("matmul") for k in others)  # plain fp32 matmuls (unfused)
    for kernel in others:
        _assert_left_alone(kernel.func)


def test_prefill_matmul_left_alone():
    """Many rows (prefill, 16 tokens): not a GEMV; the 1-row lm_head of prefill is one."""
    ks = phi2.kernels(phi2.build_prefill(tokens=16, config="reduced", fusion=True))
    gemm = [k for k in ks.kernels if "dequantize" in k.name and k.part == "layer"]
    assert gemm
    for kernel in gemm:
        _assert_left_alone(kernel.func)
    assert [DequantGEMV().matches(k.func) for k in ks.kernels if k.part == "head" and "dequantize" in k.name] == [True]


def test_int8_conv_left_alone():
    from tvm_ext.workloads.conv2d_int8 import seed_conv_primfunc

    _assert_left_alone(seed_conv_primfunc(image=8, channels=16))


@T.prim_func(s_tir=True)
def _gemv_fp32(x: T.Buffer((1, 64), "float32"), w: T.Buffer((64, 16), "float32"),
               y: T.Buffer((1, 16), "float32")):
    for i, j, k in T.grid(1, 16, 64):
        with T.sblock("gemv"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                y[vi, vj] = T.float32(0)
            y[vi, vj] = y[vi, vj] + x[vi, vk] * w[vk, vj]


@T.prim_func(s_tir=True)
def _gemv_q4_small(p: T.Buffer((8, 8), "uint32"), s: T.Buffer((8, 2), "float16"),
                   x: T.Buffer((1, 64), "float32"), y: T.Buffer((1, 8), "float32")):
    w = T.sblock_alloc_buffer((64, 8))
    for i, j in T.grid(64, 8):
        with T.sblock("dq"):
            vi, vj = T.axis.remap("SS", [i, j])
            w[vi, vj] = (T.Cast("float32", p[vj, vi // 8] >> T.Cast("uint32", vi % 8) * T.uint32(4)
                                & T.uint32(15)) - T.float32(7)) * T.Cast("float32", s[vj, vi // 32])
    for i, j, k in T.grid(1, 8, 64):
        with T.sblock("gemv"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                y[vi, vj] = T.float32(0)
            y[vi, vj] = y[vi, vj] + x[vi, vk] * w[vk, vj]


@T.prim_func(s_tir=True)
def _gemv_q4_n16(p: T.Buffer((16, 8), "uint32"), s: T.Buffer((16, 2), "float16"),
                 x: T.Buffer((1, 64), "float32"), y: T.Buffer((1, 16), "float32")):
    w = T.sblock_alloc_buffer((64, 16))
    for i, j in T.grid(64, 16):
        with T.sblock("dq"):
            vi, vj = T.axis.remap("SS", [i, j])
            w[vi, vj] = (T.Cast("float32", p[vj, vi // 8] >> T.Cast("uint32", vi % 8) * T.uint32(4)
                                & T.uint32(15)) - T.float32(7)) * T.Cast("float32", s[vj, vi // 32])
    for i, j, k in T.grid(1, 16, 64):
        with T.sblock("gemv"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                y[vi, vj] = T.float32(0)
            y[vi, vj] = y[vi, vj] + x[vi, vk] * w[vk, vj]


@T.prim_func(s_tir=True)
def _gemv_q4_n16_untuned(p: T.Buffer((16, 8), "uint32"), s: T.Buffer((16, 2), "float16"),
                         x: T.Buffer((1, 64), "float32"), y: T.Buffer((1, 16), "float32")):
    # dequantize inlined; N = 4 parallel tiles x 4 rows, each row walked to the end;
    # K = 2 groups x 1 step x (4 accumulators x 8 lanes): 32 partial sums per row
    y_rf_local = T.sblock_alloc_buffer((1, 16, 32), scope="local")
    for i in range(1):
        for j_0 in T.parallel(4):
            for j_1 in T.unroll(4):
                for k_1_1_0_init in T.unroll(4):
                    for k_1_1_1_init in T.vectorized(8):
                        with T.sblock("gemv_rf_init"):
                            vk_1_1 = T.axis.spatial(32, k_1_1_0_init * 8 + k_1_1_1_init)
                            vi = T.axis.spatial(1, i)
                            vj = T.axis.spatial(16, j_0 * 4 + j_1)
                            y_rf_local[vi, vj, vk_1_1] = T.float32(0.0)
                for k_0 in range(2):
                    for k_1_0 in T.unroll(1):
                        for k_1_1_0 in T.unroll(4):
                            for k_1_1_1 in T.vectorized(8):
                                with T.sblock("gemv_rf_update"):
                                    vk_1_1 = T.axis.spatial(32, k_1_1_0 * 8 + k_1_1_1)
                                    vi = T.axis.spatial(1, i)
                                    vj = T.axis.spatial(16, j_0 * 4 + j_1)
                                    vk_0, vk_1_0 = T.axis.remap("RR", [k_0, k_1_0])
                                    kk = T.meta_var(vk_0 * 32 + vk_1_0 * 32 + vk_1_1)
                                    y_rf_local[vi, vj, vk_1_1] = y_rf_local[vi, vj, vk_1_1] + x[vi, kk] * (
                                        (T.Cast("float32", p[vj, kk // 8] >> T.Cast("uint32", kk % 8) * T.uint32(4)
                                                    & T.uint32(15)) - T.float32(7.0))
                                        * T.Cast("float32", s[vj, kk // 32]))
            for ax1, ax0 in T.grid(4, 32):  # the 32 partial sums of each row
                with T.sblock("gemv"):
                    vk_1_1 = T.axis.reduce(32, ax0)
                    vi = T.axis.spatial(1, 0)
                    vj = T.axis.spatial(16, j_0 * 4 + ax1)
                    with T.init():
                        y[vi, vj] = T.float32(0.0)
                    y[vi, vj] = y[vi, vj] + y_rf_local[vi, vj, vk_1_1]


def _cores(n):
    return tvm.target.Target({"kind": "llvm", "num-cores": n})


def test_untuned_before_after():
    """N = 16 on one core: 4 tiles of 4 rows are enough, no split-K."""
    after = DequantGEMV().apply_to_module(tvm.IRModule({"main": _gemv_q4_n16}), _cores(1))["main"]
    tvm.ir.assert_structural_equal(after.without_attr("global_symbol"),
                                   _gemv_q4_n16_untuned.without_attr("global_symbol"))


def _check_small(mod, seed=0):
    func = _gemv_q4_small
    rng = np.random.default_rng(seed)
    arrays = random_arrays(func, rng, {"uint32": (0, 2**32 - 1)}, int_range=(0, 15))
    args = [tvm.runtime.tensor(a, tvm.cpu()) for a in arrays]
    tvm.compile(mod, target=TARGET)["main"](*args)
    ref = arrays[2].reshape(-1).astype("float64") @ phi2.dequantize_np(arrays[0], arrays[1])
    np.testing.assert_allclose(args[-1].numpy().reshape(-1), ref, rtol=1e-5, atol=1e-5)


def test_split_k_when_n_is_small():
    """N = 8 (2 tiles) on 2 cores: K is split into parallel chunks as well; untuned and both
    sketches of the rule (plain, split-K), decisions redrawn, match NumPy."""
    mod = DequantGEMV().apply_to_module(_main(_gemv_q4_small), _cores(2))
    assert mod["main"].script().count("T.parallel") == 2 and "_rf_rf" in mod["main"].script()
    _check_small(mod)
    sch = Schedule(_main(_gemv_q4_small))
    sketches = DequantGEMV().candidates(sch, sch.get_sblock("gemv"), _cores(2))  # a 2-core target
    assert ["_rf_rf" in s.mod["main"].script() for s in sketches] == [False, True]
    for sketch in sketches:
        out = Schedule(_main(_gemv_q4_small), seed=271828183)
        Trace(sketch.trace.insts, {}).apply_to_schedule(out, remove_postproc=True)
        _check_small(out.mod)


def test_plain_fp32_gemv_left_alone():
    _assert_left_alone(_gemv_fp32)


def test_written_q4_gemv_matches_by_structure():
    """A hand-written q4 GEMV (other block and buffer names, no epilogue) is recognised."""
    found = match_func(_gemv_q4_small)
    assert found is not None and (found.gemv, found.dequantize, found.epilogues) == ("gemv", "dq", [])
    assert (found.n, found.k, found.pack, found.group) == (8, 64, 8, 32)


def test_registered_and_in_llvm_space():
    import tvm_ext
    from tvm.s_tir import meta_schedule as ms

    assert isinstance(tvm.get_global_func("tvm_ext.schedule_rule.DequantGEMV")(), ms.ScheduleRule)
    names = [type(r).__name__ for r in tvm_ext.default_rules(TARGET, "plugin")]
    assert names.index("AutoInline") < names.index("DequantGEMV") < names.index("MultiLevelTiling")
    assert "DequantGEMV" not in [type(r).__name__ for r in tvm_ext.default_rules(TARGET, "upstream")]
    assert "DequantGEMV" not in [type(r).__name__ for r in tvm_ext.default_rules(tvm.target.Target("cuda"))]


# ----------------------------------------------------------------------------- factored sketch
# x86 targets by name: the sketch's lanes follow the target (the code runs on any x86-64 host
# with AVX2: LLVM splits 16-lane vectors where the host has no AVX-512)
AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "mtriple": "x86_64-linux-gnu"})
AVX512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "mtriple": "x86_64-linux-gnu"})
needs_avx2 = pytest.mark.skipif(factored_lanes(TARGET) is None, reason="the host has no AVX2")


def test_factored_lanes_follow_the_target():
    assert (factored_lanes(AVX2), factored_lanes(AVX512)) == (8, 16)
    assert factored_lanes(tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"})) is None
    assert factored_lanes(None) is None


@needs_avx2
@pytest.mark.parametrize("target", [AVX2, AVX512], ids=["lanes8", "lanes16"])
@pytest.mark.parametrize("projection", PROJECTIONS)
def test_factored_matches_numpy(gemvs, projection, target):
    """Every fused projection (bias, gelu, residual adds, lm_head) in the factored sketch: the
    GEMV replaced by the intrinsic, the epilogue after it, the result NumPy's."""
    kernel = gemvs[projection]
    mod = DequantGEMV().apply_to_module(_main(kernel.func), target)
    assert _is_factored(mod)
    _check(kernel, mod)


def test_fc1_gelu_epilogue_vectorizes(gemvs):
    """fc1's gelu uses TVM's fast_tanh (``phi2_layers._te_gelu_tanh``): its epilogue loop has
    no libm call left (``relax.op.nn.gelu_tanh``'s tanh became one scalar ``expf`` per element
    on LLVM CPU targets) and the factored kernel stays within NumPy's tolerance (above)."""
    mod = DequantGEMV().apply_to_module(_main(gemvs["fc1"].func), AVX512)
    assert _is_factored(mod)
    asm = tvm.compile(mod, target=AVX512).mod.inspect_source("asm")
    assert "expf" not in asm and "tanhf" not in asm


def _te_q4_gemv(n, k, scale_dtype, zero_point=q4_gemv.ZERO_POINT):
    """A q4 GEMV written in TE with the workloads' dequantize (``q4_weight``)."""
    from tvm import te

    x = te.placeholder((1, 1, k), "float32", name="x")
    p = te.placeholder((n, k // 8), "uint32", name="p")
    s = te.placeholder((n, k // 32), scale_dtype, name="s")
    r = te.reduce_axis((0, k), "r")
    y = te.compute((1, 1, n), lambda i, j, c: te.sum(
        x[i, j, r] * q4_gemv.q4_weight(p, s, c, r, "float32", zero_point), axis=r))
    return te.create_prim_func([x, p, s, y])


@needs_avx2
def test_other_dequantize_keeps_the_scheduled_sketch():
    """Zero point 8: the rule matches (same structure) but the intrinsic does not (tensorize
    compares the expression), so ``untuned`` gives the scheduled sketch, and the right result."""
    func = _te_q4_gemv(16, 64, "float16", zero_point=8)
    mod = DequantGEMV().apply_to_module(_main(func), AVX2)
    assert not _is_factored(mod) and "_rf_local" in mod["main"].script()
    rng = np.random.default_rng(3)
    arrays = random_arrays(func, rng, {"uint32": (0, 2**32 - 1)}, int_range=(0, 15))
    args = [tvm.runtime.tensor(a, tvm.cpu()) for a in arrays]
    tvm.compile(mod, target=TARGET)["main"](*args)
    ref = arrays[0].reshape(-1).astype("float64") @ (phi2.dequantize_np(arrays[1], arrays[2])
                                                     - np.repeat(arrays[2].astype("float64"), 32, axis=1).T)
    np.testing.assert_allclose(args[-1].numpy().reshape(-1), ref, rtol=1e-5, atol=1e-5)


@needs_avx2
def test_rule_offers_the_factored_sketch_first_in_metaschedule():
    """On an x86 tune context the MetaSchedule rule's first sketch is the factored one (the q4_gemv
    intrinsic, as ``untuned`` schedules it), the scheduled sketches after it; elsewhere only those."""
    from tvm.s_tir import meta_schedule as ms

    rule = DequantGEMV().meta_schedule()  # MetaSchedule's face: the tune context gives the target
    rule._initialize_with_tune_context(ms.TuneContext(_main(_gemv_q4_small), target=AVX2))
    sch = Schedule(_main(_gemv_q4_small))
    first, *rest = rule.apply(sch, sch.get_sblock("gemv"))
    assert "tvm_ext.q4_gemv" in str(first.trace) and rest
    assert all("_rf_local" in s.mod["main"].script() for s in rest)
    assert "_rf_local" not in first.mod["main"].script()
    outs = []
    untuned = DequantGEMV().apply_to_module(_main(_gemv_q4_small), AVX2)
    for mod in (first.mod, untuned):  # the same kernel untuned builds
        args = [tvm.runtime.tensor(a) for a in random_arrays(_gemv_q4_small, 0)]
        tvm.compile(mod, target=AVX2)["main"](*args)
        outs.append(args[-1].numpy())
    np.testing.assert_array_equal(*outs)
    plain = DequantGEMV().meta_schedule()
    plain._initialize_with_tune_context(ms.TuneContext(_main(_gemv_q4_small), target=tvm.target.Target(
        {"kind": "llvm", "mtriple": "aarch64-linux-gnu"})))
    assert all("_rf_local" in s.mod["main"].script() for s in plain.apply(sch, sch.get_sblock("gemv")))


@needs_avx2
@pytest.mark.parametrize("n,k,scale_dtype", [(24, 96, "float32"), (5, 32, "float16"), (40, 1024, "float16")])
def test_factored_odd_shapes_match_numpy(n, k, scale_dtype):
    """Three groups (one accumulator, scalar scale dot), one group, N not a multiple of
    anything, float32 scales (q4f32_1): the intrinsic's result is NumPy's."""
    func = _te_q4_gemv(n, k, scale_dtype)
    mod = DequantGEMV().apply_to_module(_main(func), AVX512)
    assert _is_factored(mod)
    rng = np.random.default_rng(n)
    arrays = random_arrays(func, rng, {"uint32": (0, 2**32 - 1)}, int_range=(0, 15))
    args = [tvm.runtime.tensor(a, tvm.cpu()) for a in arrays]
    tvm.compile(mod, target=TARGET)["main"](*args)
    ref = arrays[0].reshape(-1).astype("float64") @ phi2.dequantize_np(arrays[1], arrays[2])
    np.testing.assert_allclose(args[-1].numpy().reshape(-1), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_intrinsic_registered_once_per_shape():
    from tvm.s_tir import TensorIntrin

    made = q4_gemv.register(3, 3, 24, 96, "float32", "int64", 16)
    assert made == q4_gemv.name(3, 3, 24, 96, "float32", "int64", 16) and TensorIntrin.get(made) is not None
    assert q4_gemv.register(3, 3, 24, 96, "float32", "int64", 16) == made
    with pytest.raises(ValueError, match="no q4 GEMV intrinsic"):
        q4_gemv.register(3, 3, 24, 100, "float16", "int64", 16)  # K not in whole groups


@pytest.mark.slow  # MetaSchedule's first TuneContext imports TVM's tensor intrinsics (~10 s here)
@pytest.mark.parametrize("projection", PROJECTIONS)
def test_space_candidates_match_numpy(gemvs, projection):
    """Candidates of ``tvm_ext.space(llvm)`` (every postprocessor applied) run correctly and
    come from our rule's sketch."""
    import tvm_ext
    from tvm_ext.tune.sampling import sample_candidates, tune_context

    kernel = gemvs[projection]
    mod = _main(kernel.func)
    ctx = tune_context(mod, TARGET, tvm_ext.space(TARGET))
    cands = sample_candidates(mod, TARGET, ctx.space_generator, 2, seed=0, context=ctx,
                              postprocs=list(ctx.space_generator.postprocs))
    assert len(cands) == 2
    for cand in cands:
        assert "_rf_local" in cand.mod["main"].script() or "tvm_ext.q4_gemv" in str(cand.trace)
        _check(kernel, cand.mod)


@pytest.mark.slow  # builds ResNet-50 (NHWC and NCHWc) and extracts its tasks
@pytest.mark.parametrize("layout", ["nhwc", "nchwc"])
def test_resnet50_int8_tasks_left_alone(layout):
    """No int8 conv/dense task of ResNet-50 matches: the rule passes every block through, so the
    plugin space of those tasks is what it was without the rule."""
    from tvm_ext.tune import extract_tasks
    from tvm_ext.workloads import resnet50_int8

    build = resnet50_int8.build if layout == "nhwc" else resnet50_int8.build_nchwc
    tasks = extract_tasks(build(), TARGET)
    assert len(tasks) > 10
    for task in tasks:
        _assert_left_alone(task.mod["main"])
