"""ContractionCUDA (rules/contraction_cuda.py): decode attention's value product on GPUs.

No GPU here: the generated CUDA shows the schedule (each thread's partial sum zeroed before its range,
a warp reading consecutive values of one cache row, the parts added through shared memory, one
predicate where the parts do not divide the positions) and nvcc compiles it; sampled candidates pass
every postprocessor and compile; the score product and other kernels are left alone.  Numerics are
checked on a lent GPU (the Phi-2 bench's rule row against NumPy).
"""
import re
import shutil

import pytest

tvm = pytest.importorskip("tvm")

from tvm import te  # noqa: E402

from tir_kernels import as_main, design_spaces  # noqa: E402
from tvm_ext.lowering import cuda_source  # noqa: E402
from tvm_ext.rules import contraction_cuda as rule  # noqa: E402
from tvm_ext.targets import cuda_target  # noqa: E402
from tvm_ext.workloads.phi2 import kernels as phi2  # noqa: E402

TARGET = cuda_target("sm_80")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


def value_product(positions, heads=2, head_dim=64):
    p = te.placeholder((1, heads, 1, positions), "float16", name="p")
    v = te.placeholder((1, positions, heads, head_dim), "float16", name="v")
    r = te.reduce_axis((0, positions), name="r")
    out = te.compute((1, 1, heads * head_dim), lambda b, i, c: te.sum(
        p[b, c // head_dim, i, r] * v[b, r, c // head_dim, c % head_dim], axis=r), name="attn_value")
    return te.create_prim_func([p, v, out]).with_attr("global_symbol", "main")


def _body(sch):
    src = cuda_source(sch.mod, TARGET)
    return src[src.index(") {", src.index("main_kernel(")):]


@pytest.mark.parametrize("positions", [64, 33])
def test_the_value_product_is_read_row_by_row_and_summed_across_parts(positions):
    sch = rule.ContractionCUDA().apply(value_product(positions))
    body = _body(sch)
    zero = body.index("_rf_local_ptr[0] = __float2half_rn(0x0p+0f")
    assert zero < body.index("v_ptr[")  # zeroed before its range: a part past the end still adds 0
    # consecutive threads read consecutive values of one row of the cache
    assert re.search(r"v_ptr\[[^\]]*\(\(int\)threadIdx\.x\)\)\]", body)
    assert "__shared__" in body and body.count("__syncthreads()") >= 3  # the parts' sums added in shared memory
    assert ("threadIdx.y) < 7" in body) == (positions == 33)  # 8 parts of 5 positions: the last one empty


def test_phi2_decode_value_product_matches_at_513_positions_and_nothing_else_does():
    kernels = phi2.kernels(phi2.build_decode(context=512, config="full", fusion=True, compute_dtype="float16"))
    assert [k.name for k in kernels.kernels if rule.ContractionCUDA().matches(k.func)] == ["attn_value"]
    for k in kernels.kernels:
        if k.name != "attn_value":
            mod = as_main(k.func)
            tvm.ir.assert_structural_equal(rule.ContractionCUDA().apply_to_module(mod), mod)


def test_too_few_positions_or_an_odd_output_is_left_alone():
    assert not rule.ContractionCUDA().matches(value_product(4))  # fewer than 4 positions a part for any part count
    assert not rule.ContractionCUDA().matches(value_product(64, heads=1, head_dim=48))  # no column count divides 48


@needs_nvcc
def test_untuned_and_sampled_candidates_compile():
    from tvm_ext.bench.phi2.kernels import nvcc_build
    from tvm_ext.check.build_only import build_only

    func = value_product(513, heads=4, head_dim=80)
    nvcc_build(rule.ContractionCUDA().apply(func).mod, TARGET)
    spaces = design_spaces(func, TARGET, ruleset="plugin")
    ours = [s for s in spaces if 'ann_val="None"' in str(s.trace)]
    assert ours and len(ours) < len(spaces)  # ours beside MetaSchedule's own sketches
    (row,) = build_only([("attn_value", as_main(func))], TARGET, candidates_per_task=12)
    assert row["candidates"] == 12 and row["build_failures"] == 0, row
