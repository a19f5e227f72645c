"""DequantGEMVCUDA (rules/dequant_gemv_cuda.py) on Phi-2's q4f16_1 decode kernels, reduced config.

No GPU here: what the schedule does is read off the CUDA source TVM generates (one kernel, the
block shape, the packed words loaded 64 or 128 bits at a time, the cross-thread sum as warp
shuffles) and, where nvcc is installed, compiled; the design space's candidates pass every
postprocessor (our VerifyGPUCode included) and compile.  Kernels that are not a q4 GEMV pass
unchanged.  Numerics are checked on a lent GPU by ``tvm-ext bench phi2-decode --target cuda``.
"""
import re
import shutil

import pytest

tvm = pytest.importorskip("tvm")

from tvm.s_tir import Schedule  # noqa: E402

from tir_kernels import as_main, design_spaces  # noqa: E402
from tvm_ext.analysis.gemv_pattern import GemvPattern, match_func  # noqa: E402
from tvm_ext.lowering import count_kernels, cuda_source  # noqa: E402
from tvm_ext.rules import dequant_gemv_cuda as rule  # noqa: E402
from tvm_ext.targets import cuda_target  # noqa: E402
from tvm_ext.workloads.phi2 import kernels as phi2  # noqa: E402

TARGET = cuda_target("sm_80")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


@pytest.fixture(scope="module")
def decode_kernels():
    fused = phi2.kernels(phi2.build_decode(context=8, config="reduced", fusion=True, compute_dtype="float16"))
    unfused = phi2.kernels(phi2.build_decode(context=8, config="reduced", fusion=False, compute_dtype="float16"))
    return fused.kernels, unfused.kernels


def _gemvs(kernels):
    return [k for k in kernels if match_func(k.func) is not None]


def test_decisions_tile_the_rows_exactly():
    """Phi-2's K = 2560 has 320 words a row: 16 threads x 4 words (128-bit loads) first; K = 10240:
    32 threads x 4 words; every (threads, words) offered divides the row."""
    small, large = GemvPattern("g", None, [], 7680, 2560), GemvPattern("g", None, [], 2560, 10240)
    assert rule.thread_counts(small) == [16, 32, 64]
    assert rule.word_candidates(small, 16) == [1, 2, 4] and rule.word_candidates(small, 32) == [1, 2]
    assert rule.thread_counts(large)[0] == 32 and rule.word_candidates(large, 32) == [1, 2, 4]
    for p in (small, large):
        for t in rule.thread_counts(p):
            assert all((p.k // p.pack) % (t * w) == 0 for w in rule.word_candidates(p, t))
    assert rule.thread_counts(GemvPattern("g", None, [], 64, 8)) == []  # one word a row: nothing tiles it


def test_every_fused_projection_is_one_kernel_with_wide_loads_and_a_warp_sum(decode_kernels):
    fused, _ = decode_kernels
    gemvs = _gemvs(fused)
    assert len(gemvs) == 5  # qkv, dense + residuals, fc1 + gelu, fc2, lm_head
    for k in gemvs:
        p = match_func(k.func)
        threads = rule.thread_counts(p)[0]
        words = max(rule.word_candidates(p, threads))
        sch = rule.DequantGEMVCUDA().apply(k.func)
        assert count_kernels(sch, TARGET) == 1, k.name
        src = cuda_source(sch.mod, TARGET)
        assert f"__launch_bounds__({threads * rule.DEFAULT_ROWS})" in src, k.name
        packed = {2: "uint2", 4: "uint4"}[words]  # reduced K: 1024 (fc2) -> 128-bit, 256 -> 64-bit loads
        assert re.search(rf"\*\({packed}\*\)\(param_0_local", src), k.name
        body = src[src.index(") {", src.index("main_kernel(")):]  # the kernel, not the preamble's macros
        assert re.search(r"half \w+_rf_local_ptr\[1\];", body), k.name  # one partial sum a thread
        assert body.count("__shfl_down_sync(mask") == threads.bit_length() - 1, k.name  # summed across the row
        assert "param_0_local" in body and "param_0_ptr[" not in body, k.name  # no packed word read alone
        assert "& (uint)15) | (uint)25600)" in body, k.name  # each nibble made a half by its bits (0x6400 | q)


def test_the_fp16_unpack_is_exact_and_converts_no_integer():
    """q4f16_1's weight (q - 7) * scale in half from the bits 0x6400 | q (the half 1024 + q) minus 1031:
    the same halves as converting q, for every nibble, with no int-to-float conversion in the code."""
    import numpy as np
    from tvm import te, tirx

    from tvm_ext.intrinsics.q4_gemv import q4_weight
    from tvm_ext.tir_utils import collect

    packed, scale = te.placeholder((2, 2), "uint32", name="p"), te.placeholder((2, 1), "float16", name="s")
    w = te.compute((2, 16), lambda r, c: q4_weight(packed, scale, r, c, "float16"), name="w")
    func = te.create_prim_func([packed, scale, w])
    assert not [c for c in collect(func.body, tirx.Cast) if str(c.ty) == "float16" and "int" in str(c.value.ty)]
    words = np.array([[0x76543210, 0xFEDCBA98], [0x01234567, 0x89ABCDEF]], "uint32")
    scales = np.array([[0.0377], [-1.25]], "float16")
    out = tvm.runtime.tensor(np.zeros((2, 16), "float16"))
    tvm.compile(func, target="llvm")(tvm.runtime.tensor(words), tvm.runtime.tensor(scales), out)
    nibbles = (words[:, :, None] >> (4 * np.arange(8, dtype="uint32"))) & 15
    expected = (nibbles.reshape(2, 16).astype("float16") - np.float16(7)) * scales
    assert np.array_equal(out.numpy(), expected)


@needs_nvcc
def test_untuned_fused_module_compiles_with_nvcc(decode_kernels):
    from tvm_ext.bench.phi2.kernels import combine, nvcc_build

    fused, _ = decode_kernels
    mods = {k.name: rule.DequantGEMVCUDA().apply_to_module(as_main(k.func)) for k in _gemvs(fused)}
    nvcc_build(combine(mods), TARGET)  # raises with nvcc's first error


def test_other_kernels_pass_unchanged(decode_kernels):
    fused, unfused = decode_kernels
    others = [k for k in fused + unfused if match_func(k.func) is None]
    assert {"layer_norm", "softmax", "attn_score", "matmul1"} <= {k.name for k in others}
    for k in others:
        mod = as_main(k.func)
        assert rule.DequantGEMVCUDA().apply(k.func) is None and not rule.DequantGEMVCUDA().matches(k.func)
        tvm.ir.assert_structural_equal(rule.DequantGEMVCUDA().apply_to_module(mod), mod)
        sch = Schedule(mod)
        for block in sch.get_child_blocks(sch.get_sblock("root")):
            assert rule.DequantGEMVCUDA().candidates(sch, block, None) == [sch]


def test_the_space_has_one_sketch_per_thread_count(decode_kernels):
    import tvm_ext

    fused, _ = decode_kernels
    fc2 = next(k for k in _gemvs(fused) if int(k.func.params[0].shape[1]) * 8 == 1024)
    spaces = design_spaces(as_main(fc2.func)["main"], TARGET, ruleset="plugin")
    ours = [s for s in spaces if 'ann_val="None"' in str(s.trace)]
    assert len(ours) == len(spaces) == len(rule.thread_counts(match_func(fc2.func)))
    assert "DequantGEMVCUDA" in [type(r).__name__ for r in tvm_ext.default_rules(TARGET)]
    assert "DequantGEMVCUDA" not in [type(r).__name__ for r in tvm_ext.default_rules(TARGET, "upstream")]


@needs_nvcc
def test_sampled_candidates_pass_the_postprocs_and_compile(decode_kernels):
    """Random decisions of every sketch (rows, words, unroll) replay, pass every postprocessor (our
    VerifyGPUCode included) and compile with nvcc: the space has no candidate that fails late."""
    from tvm_ext.check.build_only import build_only

    fused, _ = decode_kernels
    tasks = [(k.name, as_main(k.func)) for k in _gemvs(fused)[:2]]
    for row in build_only(tasks, TARGET, candidates_per_task=12):
        assert row["candidates"] == 12 and row["build_failures"] == 0 and row["rejected"] == 0, row
        assert row["kernels"] == 1, row
