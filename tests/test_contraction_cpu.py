"""rules/contraction_cpu: Phi-2's attention contractions on CPU, read in memory order.

Against the unscheduled kernels (same random inputs, compiled both ways) on the reduced decode
and prefill attention, the form each gets (dot: rfactored vector partial sums, with several queries
register tiles over a transposed copy of the keys; axpy: the reduction outside a vectorized output
row, for one query in parallel ranges of the cache rows, for several in register tiles of queries),
and the other kernels left alone.
"""
import numpy as np
import pytest
import tvm
import tvm_ffi

from tir_kernels import as_main, ours_in_space, phi2_reduced_kernels
from tvm_ext.rules import contraction_cpu


@pytest.fixture(scope="module")
def kernels():
    return phi2_reduced_kernels()


def _run(mod, func, seed=0):
    rng = np.random.default_rng(seed)
    arrays = [tvm.runtime.tensor(rng.standard_normal([int(s) for s in p.shape]).astype(str(p.dtype)))
              for p in func.params]
    tvm.compile(mod, target="llvm")["main"](*arrays)
    return arrays[-1].numpy()


@pytest.mark.parametrize("which", ["decode", "prefill"])
@pytest.mark.parametrize("name, form", [("attn_score", "dot"), ("attn_value", "axpy")])
def test_attention_matches_the_unscheduled_kernel(kernels, which, name, form):
    (kernel,) = [k for k in kernels[which] if k.name == name]
    assert contraction_cpu._form(kernel.func) == form  # pylint: disable=protected-access
    mod = as_main(kernel.func)
    scheduled = contraction_cpu.ContractionCPU().apply_to_module(mod, None)
    assert not tvm_ffi.structural_equal(scheduled["main"], mod["main"])
    script = scheduled["main"].script()
    assert "T.parallel" in script and "T.vectorized" in script
    if form == "dot" and which == "decode":
        assert "_rf" in script  # the vector of partial sums
    if which == "prefill":  # register tiles of queries (accumulated locally); for q . K over a transposed K copy
        assert "_local" in script and ("_global" in script) == (form == "dot")
    np.testing.assert_allclose(_run(scheduled, kernel.func), _run(mod, kernel.func), rtol=1e-5, atol=1e-5)


def test_other_kernels_are_left_alone(kernels):
    """LayerNorm, softmax, rope, the fused dequantize-GEMVs (several blocks): not matched, and
    ``untuned`` returns them unchanged."""
    others = [k for k in kernels["decode"] + kernels["prefill"] if not k.name.startswith("attn_")]
    assert any("dequantize" in k.name for k in others) and any("softmax" in k.name for k in others)
    for kernel in others:
        mod = as_main(kernel.func)
        assert not contraction_cpu.ContractionCPU().matches(kernel.func), kernel.name
        tvm.ir.assert_structural_equal(contraction_cpu.ContractionCPU().apply_to_module(mod, None), mod)


@pytest.mark.parametrize("which", ["decode", "prefill"])
def test_the_rule_in_the_plugin_space(kernels, which):
    """ContractionCPU in tvm_ext.space: this schedule (the one-query axpy form's chunk a sampled decision,
    first draw the untuned one) among the candidates, beside MetaSchedule's own, computing the kernel's
    result."""
    for name in ("attn_score", "attn_value"):
        func = next(k.func for k in kernels[which] if k.name == name)
        ours = ours_in_space(func)
        assert ours and len(ours) < len(ours_in_space(func, mine_only=False))
        want = _run(contraction_cpu.ContractionCPU().apply_to_module(as_main(func)), func)
        for cand in ours:
            np.testing.assert_allclose(_run(cand.mod, func), want, rtol=1e-5, atol=1e-5)


def _one_query_value(positions, heads=4, head_dim=16):
    from tvm import te

    from tvm_ext.workloads.phi2.layers import _te_attn_value  # pylint: disable=protected-access

    p = te.placeholder((1, heads, 1, positions), "float32", name="p")
    v = te.placeholder((1, positions, heads, head_dim), "float32", name="v")
    return te.create_prim_func([p, v, _te_attn_value(p, v)])


@pytest.mark.parametrize("positions, parts", [(32, 16), (24, 8), (33, None)])
def test_one_query_values_stream_in_parallel_ranges(positions, parts):
    """One query: the cache rows split in the largest of PARTS that divides them, each range summed in
    memory order into its own partial row (rfactored), the parts added at the end; where none
    divides (33 positions), parallel chunks of the output row.  Both equal NumPy's p . V."""
    func = _one_query_value(positions)
    assert contraction_cpu._form(func) == "axpy"  # pylint: disable=protected-access
    scheduled = contraction_cpu.ContractionCPU().apply_to_module(as_main(func))
    script = scheduled["main"].script()
    assert "T.parallel" in script and "T.vectorized" in script
    if parts:
        assert f"_rf = T.sblock_alloc_buffer(({parts}, 1, 1, 64))" in script
        assert f"for r_0 in T.parallel({parts})" in script
    else:
        assert "_rf" not in script
    rng = np.random.default_rng(1)
    p = rng.random((1, 4, 1, positions)).astype("float32")
    v = rng.standard_normal((1, positions, 4, 16)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((1, 1, 64), "float32"))
    tvm.compile(scheduled, target="llvm")["main"](tvm.runtime.tensor(p), tvm.runtime.tensor(v), out)
    want = np.einsum("hr,rhd->hd", p[0, :, 0], v[0]).reshape(1, 1, 64)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
