"""rules/row_norm_cpu: LayerNorm on CPU with each row statistic computed once.

Against NumPy on the reduced Phi-2 kernels (decode: one row; prefill: 16 rows, parallel),
the shape of the schedule (statistics at the row loop, not inside the output's loop, as
dlight's CPU Reduction puts them), and every other Phi-2 kernel left alone.
"""
import numpy as np
import pytest
import tvm

from tir_kernels import as_main, ours_in_space, phi2_reduced_kernels
from tvm_ext.rules import row_norm_cpu
from tvm_ext.tir_utils import blocks_of, collect


@pytest.fixture(scope="module")
def kernels():
    return phi2_reduced_kernels()


def _layer_norms(ks):
    return [k for k in ks if row_norm_cpu.RowNormCPU().matches(k.func) and "layer_norm" in k.name]


def _layer_norm_reference(x, g, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * g + b


@pytest.mark.parametrize("which", ["decode", "prefill"])
def test_layer_norm_matches_numpy(kernels, which):
    ks = kernels[which]
    found = [k for k in ks if row_norm_cpu.RowNormCPU().matches(k.func)]
    assert {k.name.rstrip("0123456789") for k in found} == {"layer_norm", "softmax"}  # what matches
    found = _layer_norms(ks)
    kernel = found[0]
    mod = row_norm_cpu.RowNormCPU().apply_to_module(as_main(kernel.func), None)
    ex = tvm.compile(mod, target="llvm")
    rng = np.random.default_rng(0)
    params = kernel.func.params
    arrays = [rng.standard_normal([int(s) for s in p.shape]).astype(str(p.dtype)) for p in params]
    arrays[-1][...] = 0
    args = [tvm.runtime.tensor(a) for a in arrays]
    ex["main"](*args)
    x, g, b = arrays[:3]
    # the legalized kernel's epsilon is a literal in its body: 1e-5 in Phi-2
    np.testing.assert_allclose(args[-1].numpy(), _layer_norm_reference(x, g, b, 1e-5), rtol=1e-4, atol=1e-4)


def test_statistics_are_computed_once_per_row(kernels):
    """Under the row loop, each statistic's reduction loop is its own (not nested in the
    output's trailing loop); the rows run in parallel when there are several."""
    from tvm.s_tir import Schedule

    for ks, parallel in ((kernels["decode"], False), (kernels["prefill"], True)):
        kernel = _layer_norms(ks)[0]
        sch = Schedule(row_norm_cpu.RowNormCPU().apply_to_module(as_main(kernel.func), None))
        blocks = [b.name_hint for b in blocks_of(sch.mod["main"])]
        *stats, out = blocks
        out_loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock(out))]
        row = out_loops[0]
        for stat in stats:
            loops = [sch.get(loop) for loop in sch.get_loops(sch.get_sblock(stat))]
            assert loops[0].same_as(row)  # at the row loop, not inside the output's loops
            assert not any(loop.same_as(out_loops[-1]) or loop.same_as(out_loops[-2]) for loop in loops)
        assert (row.kind == tvm.tirx.ForKind.PARALLEL) == parallel
        assert out_loops[-1].kind == tvm.tirx.ForKind.VECTORIZED


def test_reductions_are_vector_partial_sums(kernels):
    """Each reduction over D is split into 16 partial sums whose lane loop is vectorized and innermost
    (under the loop over D / 16), then summed: not one serial chain of D dependent adds."""
    from tvm.s_tir import Schedule

    for ks in (kernels["decode"], kernels["prefill"]):
        sch = Schedule(row_norm_cpu.RowNormCPU().apply_to_module(as_main(_layer_norms(ks)[0].func), None))
        partials = [b for b in blocks_of(sch.mod["main"]) if b.name_hint.endswith("_rf")]
        assert len(partials) == 2  # sum and variance sum
        d = int(sch.mod["main"].params[0].shape[-1])
        for block in partials:
            *outer, lane = (sch.get(loop) for loop in sch.get_loops(sch.get_sblock(block.name_hint)))
            assert lane.kind == tvm.tirx.ForKind.VECTORIZED and int(lane.extent) == 16
            assert [int(loop.extent) for loop in outer if int(loop.extent) > 1][-1:] == [d // 16]


def test_other_kernels_are_left_alone(kernels):
    """The GEMVs, attention, rope: not matched, and ``untuned`` returns them unchanged."""
    others = [k for k in kernels["decode"] + kernels["prefill"]
              if "layer_norm" not in k.name and "softmax" not in k.name]
    assert any("attn" in k.name for k in others)
    for kernel in others:
        mod = as_main(kernel.func)
        assert not row_norm_cpu.RowNormCPU().matches(kernel.func), kernel.name
        tvm.ir.assert_structural_equal(row_norm_cpu.RowNormCPU().apply_to_module(mod, None), mod)


def _check_softmax(func, masked_like_phi2):
    mod = row_norm_cpu.RowNormCPU().apply_to_module(as_main(func), None)
    assert row_norm_cpu.RowNormCPU().matches(func)
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal([int(s) for s in p.shape]).astype("float32") * 4 for p in func.params]
    arrays[0].reshape(-1)[::7] = float(np.finfo("float32").min)  # masked positions: exactly 0 out
    args = [tvm.runtime.tensor(a) for a in arrays]
    tvm.compile(mod, target="llvm")["main"](*args)
    x = arrays[0].astype("float64")
    if masked_like_phi2:  # query i sees positions j <= i + t - n
        n, t = x.shape[-2:]
        x = np.where(np.arange(t)[None, :] > np.arange(n)[:, None] + t - n, np.finfo("float32").min, x)
    want = np.exp(x - x.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(args[-1].numpy(), want, rtol=1e-5, atol=1e-7)
    return mod["main"]


@pytest.mark.parametrize("which", ["decode", "prefill"])
def test_softmax_rows(kernels, which):
    """Phi-2's softmax (fast_exp, an elementwise rows x D intermediate, the causal mask applied where the
    scores are read: the n queries are the last n of t positions): computed row by row, the shift
    (read by the exp only) inlined into the exp, the exp and the output vectorized, against NumPy."""
    ours = next(k.func for k in kernels[which] if "softmax" in k.name)
    before = [b.name_hint for b in blocks_of(as_main(ours)["main"])]
    after = [b.name_hint for b in blocks_of(_check_softmax(ours, masked_like_phi2=True))]
    assert "softmax_shift" in before and "softmax_shift" not in after
    assert [b for b in after if b.startswith("softmax_exp")]


@pytest.mark.parametrize("d", [48, 513, 514, 9])
def test_relax_softmax_rows(d):
    """Relax's legalized softmax over D keys: 16 lanes where they divide D (48); else a divisor of D in
    [8, 32] for the partial sums (513: 27) and the first 16 * (D // 16) elements of the elementwise rows
    16 wide, the rest scalar (513, and 514, which has no such divisor); a row under 16 at its divisor (9)."""
    assert row_norm_cpu._widths(513) == [27] and row_norm_cpu._widths(514) == []
    func = _check_softmax(_softmax_module((1, 4, 3, d))["softmax"], masked_like_phi2=False)
    vectorized = [loop for loop in collect(func.body, tvm.tirx.For) if loop.kind == tvm.tirx.ForKind.VECTORIZED]
    want = {48: {16}, 513: {27, 16}, 514: {16}, 9: {9}}[d]
    assert {int(loop.extent) for loop in vectorized} == want
    partitioned = any(b.name_hint.endswith("_partition") for b in blocks_of(func))
    assert partitioned == (d in (513, 514))


def _softmax_module(shape):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.softmax(x, axis=-1)))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    name = next(gv.name_hint for gv, f in mod.functions_items() if "softmax" in gv.name_hint)
    return tvm.IRModule({"softmax": mod[name]})


@pytest.mark.parametrize("which", ["decode", "prefill"])
def test_the_rule_in_the_plugin_space(kernels, which):
    """RowNormCPU in tvm_ext.space: this schedule with the vector width a sampled decision (first draw the
    untuned one) among the candidates, beside MetaSchedule's own, computing NumPy's result."""
    kernel = _layer_norms(kernels[which])[0]
    ours = ours_in_space(kernel.func)
    assert ours and len(ours) < len(ours_in_space(kernel.func, mine_only=False))
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal([int(s) for s in p.shape]).astype(str(p.dtype)) for p in kernel.func.params]
    x, g, b = arrays[:3]
    for cand in ours:
        assert "sample_categorical" in str(cand.trace)
        args = [tvm.runtime.tensor(a) for a in arrays]
        tvm.compile(cand.mod, target="llvm")["main"](*args)
        np.testing.assert_allclose(args[-1].numpy(), _layer_norm_reference(x, g, b, 1e-5), rtol=1e-4, atol=1e-4)
