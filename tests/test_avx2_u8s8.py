"""The AVX2 forms of the 16x4 u8 x s8 product and the gate between them.

On x86 with AVX2 and no VNNI, VNNITensorize tensorizes packed conv/dense blocks annotated
``PAIRS_FIT_INT16_ATTR`` with vpmaddubsw + vpmaddwd (``tvm_ext.dot_16x4_avx2``: vpmaddubsw
saturates its pair sums to int16, so only where the weights fit), and every other packed block
with vpmaddwd on int16 pairs (``tvm_ext.dot_16x4_avx2_exact``: exact for any int8 weight).
Kernels are compiled for a Haswell target (AVX2, no VNNI) and run where the host has AVX2; the
VNNI target is compiled only.
"""

import numpy as np
import pytest
import tvm
from tvm import te

import tvm_ext
from tvm_ext import rulesets as R
from tvm_ext.intrinsics import vnni as I
from tvm_ext.targets import has_avx2, host_target
from tvm_ext.tune.sampling import sample_candidates, tune_context
from tvm_ext.workloads.qnn_vnni import pairs_fit_int16

import qnn_cases as C

AVX2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
VNNI = tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2})
HOST_AVX2 = has_avx2(host_target())
W_MAX = 64  # 7-bit weights: 255 * (64 + 64) = 32640 <= 32767
CASES = {"conv": lambda: C.conv2d_case(h=6, w=6, c_in=16, c_out=32, w_max=W_MAX),
         "dense": lambda: C.dense_case(m=2, n=32, k=64, w_max=W_MAX)}
FULL_CASES = {"conv": lambda: C.conv2d_case(h=6, w=6, c_in=16, c_out=32, stride=2, seed=3),  # 8-bit weights
              "dense": lambda: C.dense_case(m=2, n=32, k=64, seed=3)}


def _candidates(case, target, n=2):
    """``n`` candidates of the plugin's design space for ``target``, every postproc applied."""
    space = tvm_ext.space(target)
    ctx = tune_context(case.mod, target, space)
    schs = sample_candidates(case.mod, target, space, n, seed=1, context=ctx,
                             postprocs=list(ctx.space_generator.postprocs))
    assert len(schs) == n
    return ctx, schs


def _one_tile(intrin: str):
    """c[16] int32 = sum_k a[k] u8 * b[16][k] s8 over 4 bytes, tensorized with ``intrin``."""
    a = te.placeholder((4,), "uint8", name="a")
    b = te.placeholder((16, 4), "int8", name="b")
    k = te.reduce_axis((0, 4), name="k")
    c = te.compute((16,), lambda i: te.sum(a[k].astype("int32") * b[i, k].astype("int32"), axis=k), name="c")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b, c]))
    block = sch.get_sblock("c")
    lane = sch.get_loops(block)[0]
    sch.decompose_reduction(block, lane)
    sch.tensorize(lane, intrin)
    return tvm.compile(sch.mod, target=AVX2)


def _run_tile(lib, a, b):
    out = tvm.runtime.tensor(np.zeros(16, np.int32))
    lib(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
    return out.numpy()


def test_intrinsic_per_target_and_rule_sets():
    assert I.u8s8_intrin_name(AVX2) == I.AVX2_INTRIN
    for mcpu in ("znver3", "skylake-avx512"):  # AVX2 (even AVX-512) without VNNI
        assert I.u8s8_intrin_name({"kind": "llvm", "mcpu": mcpu}) == I.AVX2_INTRIN
        assert I.vnni_intrin_name({"kind": "llvm", "mcpu": mcpu}) is None  # unchanged
    assert I.u8s8_intrin_name(VNNI) == I.AVX512_VNNI_INTRIN
    assert I.u8s8_intrin_name({"kind": "llvm", "mcpu": "alderlake"}) == I.AVX_VNNI_INTRIN
    for other in ({"kind": "llvm"}, {"kind": "cuda", "arch": "sm_80"}):  # baseline x86-64, GPU
        assert I.u8s8_intrin_name(other) is None
    (rule,) = [r for r in R.default_rules(AVX2) if type(r).__name__ == "VNNITensorize"]
    assert rule.intrin_name == I.AVX2_INTRIN
    assert "RewriteTensorize" in [type(p).__name__ for p in R.default_postprocs(AVX2)]
    assert "VNNITensorize" not in [type(r).__name__ for r in R.default_rules(AVX2, "upstream")]


def test_avx2_form_equals_the_description():
    """Random 7-bit weights and any uint8 activations, including the extremes of the bound."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, 4).astype(np.uint8)
    b = rng.integers(-W_MAX, W_MAX + 1, (16, 4)).astype(np.int8)
    a[:], b[0], b[1] = 255, W_MAX, -W_MAX  # 255 * 128 per pair: the largest exact sums
    lib = _one_tile(I.avx2_intrin())
    assert "vpmaddubsw" in lib.mod.inspect_source("asm")
    if not HOST_AVX2:
        pytest.skip("host has no AVX2: compiled, not run")
    for a_ in (a, rng.integers(0, 256, 4).astype(np.uint8)):
        np.testing.assert_array_equal(_run_tile(lib, a_, b), b.astype(np.int32) @ a_.astype(np.int32))


def test_unsafe_weights_saturate_in_avx2_form():
    """Why the gate: a pair 255 * (127 + 127) = 64770 saturates to 32767 in vpmaddubsw,
    while the VNNI form / NumPy sum it exactly."""
    a = np.full(4, 255, np.uint8)
    b = np.zeros((16, 4), np.int8)
    b[0, :2], b[1, 2:] = 127, -128
    lib = _one_tile(I.avx2_intrin())
    if not HOST_AVX2:
        pytest.skip("host has no AVX2")
    got, want = _run_tile(lib, a, b), b.astype(np.int32) @ a.astype(np.int32)
    assert want[:2].tolist() == [64770, -65280]
    assert got[:2].tolist() == [32767, -32768]  # int16 saturation, not the product
    np.testing.assert_array_equal(got[2:], want[2:])


@pytest.mark.parametrize("kind", sorted(CASES))
def test_annotated_block_tensorized_bit_exact_with_vpmaddubsw(kind):
    case = C.annotated(CASES[kind]())
    _, schs = _candidates(case, AVX2)
    for sch in schs:
        assert f'tensor_intrin="{I.AVX2_INTRIN}"' in str(sch.trace)
        lib = tvm.compile(sch.mod, target=AVX2)
        asm = lib.mod.inspect_source("asm")
        assert "vpmaddubsw" in asm and "vpmaddwd" in asm and "vpdpbusd" not in asm
        if HOST_AVX2:
            np.testing.assert_array_equal(C.run_case(case, lib), case.reference())
    if not HOST_AVX2:
        pytest.skip("host has no AVX2: compiled, not run")


def test_exact_form_equals_the_description_on_any_weights():
    """The vpmaddwd form sums what vpmaddubsw saturates: every int8 weight, including -128 and
    127 beside 255 (the pair sums 64770 and -65280 that saturate above), and random bytes."""
    lib = _one_tile(I.avx2_exact_intrin())
    asm = lib.mod.inspect_source("asm")
    assert "vpmaddwd" in asm and "vpmaddubsw" not in asm
    if not HOST_AVX2:
        pytest.skip("host has no AVX2: compiled, not run")
    rng = np.random.default_rng(1)
    tiles = [(np.full(4, 255, np.uint8), np.full((16, 4), w, np.int8)) for w in (127, -128)]
    tiles += [(rng.integers(0, 256, 4).astype(np.uint8), rng.integers(-128, 128, (16, 4)).astype(np.int8))
              for _ in range(50)]
    for a, b in tiles:
        np.testing.assert_array_equal(_run_tile(lib, a, b), b.astype(np.int32) @ a.astype(np.int32))


@pytest.mark.parametrize("value", [None, 0], ids=["absent", "zero"])
@pytest.mark.parametrize("kind", sorted(FULL_CASES))
def test_unannotated_block_tensorized_bit_exact_with_vpmaddwd(kind, value):
    """8-bit weights (no annotation, or a false one): the exact form, never vpmaddubsw."""
    case = FULL_CASES[kind]()
    if value is not None:
        case = C.annotated(case, value)
    assert not pairs_fit_int16(case.args[1])  # these weights could saturate vpmaddubsw
    _, schs = _candidates(case, AVX2)
    for sch in schs:
        assert f'tensor_intrin="{I.AVX2_EXACT_INTRIN}"' in str(sch.trace)
        assert f'tensor_intrin="{I.AVX2_INTRIN}"' not in str(sch.trace)
        lib = tvm.compile(sch.mod, target=AVX2)
        asm = lib.mod.inspect_source("asm")
        assert "vpmaddwd" in asm and "vpmaddubsw" not in asm and "vpdpbusd" not in asm
        if HOST_AVX2:
            np.testing.assert_array_equal(C.run_case(case, lib), case.reference())
    if not HOST_AVX2:
        pytest.skip("host has no AVX2: compiled, not run")


def _writeback_vector_lanes(func) -> list:
    """Extents of the vectorized loops around the accumulators' write-back block(s)."""
    from tvm.s_tir.stmt import SBlock

    from tvm_ext.tir_utils import collect

    return [int(loop.extent) for loop in collect(func.body, tvm.tirx.For)
            if loop.kind == tvm.tirx.ForKind.VECTORIZED
            and any(b.name_hint.endswith("_global") for b in collect(loop.body, SBlock))]


def test_writeback_is_vectorized_per_pixel():
    """The AVX2 forms' write-back (epilogue folded in) is vectorized over one pixel's 16 channels,
    never fused over the tile's pixels: a 112-lane write-back made LLVM turn the accumulator tile
    into one vector and every 8-lane update into element inserts/extracts (4.6 GMAC/s)."""
    case = FULL_CASES["conv"]()
    _, schs = _candidates(case, AVX2, 6)
    lanes = [_writeback_vector_lanes(sch.mod["main"]) for sch in schs]
    assert all(lanes) and all(n <= 16 for per in lanes for n in per), lanes


def test_vnni_target_keeps_the_vnni_form():
    """The annotation does not matter where VNNI exists: vpdpbusd, never vpmaddubsw."""
    case = C.annotated(CASES["dense"]())
    _, (sch,) = _candidates(case, VNNI, 1)
    assert f'tensor_intrin="{I.AVX512_VNNI_INTRIN}"' in str(sch.trace) and I.AVX2_INTRIN not in str(sch.trace)
    asm = tvm.compile(sch.mod, target=VNNI).mod.inspect_source("asm")
    assert "vpdpbusd" in asm and "vpmaddubsw" not in asm
