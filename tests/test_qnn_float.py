"""float32 epilogues (qnn_float): compiled by TVM, scalar and in 16-lane vectors, they equal
their NumPy twins bit for bit, at the clip bounds, on rounding ties and where the int32
offset wraps; the folded residual epilogue equals its two steps."""
import numpy as np
import pytest
import tvm
from tvm import te
from tvm.s_tir import Schedule

from tvm_ext.workloads import qnn, qnn_float, qnn_reference

LLVM = tvm.target.Target("llvm")


def _compile(tensors, out, vector_lanes=None):
    """The TE function, its innermost loop vectorized by ``vector_lanes`` if given (as the
    tuned schedules do; LLVM may contract the add's multiply there)."""
    func = te.create_prim_func([*tensors, out])
    if vector_lanes:
        sch = Schedule(func)
        block = sch.get_sblock(out.op.name)
        *_, inner = sch.get_loops(block)
        _, lanes = sch.split(inner, [None, vector_lanes])
        sch.vectorize(lanes)
        func = sch.mod["main"]
    return tvm.compile(func, target=LLVM)


def _call(lib, args, shape):
    got = tvm.runtime.tensor(np.zeros(shape, "uint8"))
    lib(*(tvm.runtime.tensor(a) for a in args), got)
    return got.numpy()


def _requantize_case(rng, n, c):
    acc = rng.integers(-(2**22), 2**22, (n, c)).astype("int32")
    acc[:8] = 2**31 - rng.integers(1, 50, (8, c))  # acc + offset wraps in int32
    acc[8:16] = rng.integers(-(2**31), -(2**30), (8, c))
    zp_corr = rng.integers(-3000, 3000, (1, c)).astype("int32")
    bias = rng.integers(-500, 500, (1, c)).astype("int32")
    mult, rshift = qnn.fixed_point(rng.uniform(2e-5, 6e-5, c))
    return [acc, zp_corr, bias, mult, np.zeros(c, "int32"), rshift]


@pytest.mark.parametrize("lanes", [None, 16])
@pytest.mark.parametrize("lo,hi", [(0, 255), (113, 255), (0, 200)])
def test_requantize_f32_matches_numpy(lanes, lo, hi):
    rng = np.random.default_rng(0)
    n, c = 512, 32
    consts = _requantize_case(rng, n, c)
    offset, scale = qnn_float.requantize_consts(*consts[1:])
    args = [consts[0], offset, scale]
    holders = [te.placeholder(a.shape, str(a.dtype), name=f"p{i}") for i, a in enumerate(args)]
    out = qnn_float.requantize_f32(*holders, zp_out=113, lo=lo, hi=hi)
    got = _call(_compile(holders, out, lanes), args, (n, c))
    expected = qnn_float.requantize(*consts, zp_out=113, lo=lo, hi=hi)
    np.testing.assert_array_equal(got, expected)
    assert expected.min() == lo and expected.max() == hi and len(np.unique(expected)) > 100
    # the same step in fixed point differs only by rounding: at most one step
    fixed = qnn_reference.requantize(*consts, zp_out=113, lo=lo, hi=hi)
    assert np.abs(fixed.astype(int) - expected).max() <= 1


def test_requantize_f32_rounds_half_to_even():
    """Ties: acc * 2**-1 for odd acc, half to even like ONNX Runtime (the fixed-point form
    rounds them up)."""
    acc = np.array([[-5, -3, -1, 1, 3, 5, 7]], "int32").T
    offset, scale = np.zeros((1, 1), "int32"), np.array([0.5], "float32")
    holders = [te.placeholder(a.shape, str(a.dtype), name=f"p{i}") for i, a in enumerate([acc, offset, scale])]
    out = qnn_float.requantize_f32(*holders, zp_out=100)
    got = _call(_compile(holders, out), [acc, offset, scale], acc.shape)
    np.testing.assert_array_equal(got[:, 0], [98, 98, 100, 100, 102, 102, 104])


def _add_case(rng, c):
    mults = [qnn.fixed_point(rng.uniform(0.2, 0.9, c)) for _ in range(2)]
    return [mults[0][0], mults[0][1], mults[1][0], mults[1][1]]


@pytest.mark.parametrize("lanes", [None, 16])
def test_add_requantize_f32_matches_numpy(lanes):
    rng = np.random.default_rng(1)
    n, c = 512, 32
    a_np, b_np = (rng.integers(0, 256, (n, c)).astype("uint8") for _ in range(2))
    consts = _add_case(rng, c)
    scales = list(qnn_float.add_consts(*consts))
    holders = [te.placeholder((n, c), "uint8", name="a"), te.placeholder((n, c), "uint8", name="b"),
               *(te.placeholder((c,), "float32", name=f"s{i}") for i in range(2))]
    zps = {"zp_a": 113, "zp_b": 35, "zp_out": 40}
    out = qnn_float.add_requantize_f32(*holders, **zps)
    got = _call(_compile(holders, out, lanes), [a_np, b_np, *scales], (n, c))
    expected = qnn_float.add_requantize(a_np, b_np, *consts, **zps)
    np.testing.assert_array_equal(got, expected)
    assert expected.min() == 0 and expected.max() == 255 and len(np.unique(expected)) > 200


def test_add_scales_make_every_product_exact():
    """15 significant bits: (a - zp) * scale is exact in float32 for |a - zp| <= 255, so the
    sum is rounded once, FMA or not."""
    rng = np.random.default_rng(2)
    mult, rshift = qnn.fixed_point(rng.uniform(1e-3, 0.99, 1000))
    scale = qnn_float.add_scale(mult, rshift)
    d = np.arange(-255, 256, dtype=np.float64)[:, None]
    assert np.array_equal((d * scale.astype(np.float64)).astype(np.float32).astype(np.float64),
                          d * scale.astype(np.float64))
    exact = mult * np.exp2(-31.0 - rshift)
    assert np.abs(scale / exact - 1).max() < 2.0**-15


@pytest.mark.parametrize("lanes", [None, 16])
@pytest.mark.parametrize("lo,hi", [(0, 255), (113, 255)])
def test_requantize_folded_into_the_f32_add_equals_the_two_steps(lanes, lo, hi):
    rng = np.random.default_rng(3)
    n, c = 512, 32
    consts = _requantize_case(rng, n, c)
    b_np = rng.integers(0, 256, (n, c)).astype("uint8")
    add = _add_case(rng, c)
    offset, scale = qnn_float.requantize_consts(*consts[1:])
    args = [consts[0], offset, scale, b_np, *qnn_float.add_consts(*add)]
    holders = [te.placeholder(a.shape, str(a.dtype), name=f"p{i}") for i, a in enumerate(args)]
    zps = {"zp_a": 113, "zp_b": 35, "zp_out": 40}
    out = qnn_float.requantize_add_requantize_f32(*holders, zp_req=113, lo_req=lo, hi_req=hi, **zps)
    got = _call(_compile(holders, out, lanes), args, (n, c))
    a_np = qnn_float.requantize(*consts, zp_out=113, lo=lo, hi=hi)
    expected = qnn_float.add_requantize(a_np, b_np, *add, **zps)
    np.testing.assert_array_equal(got, expected)
    assert len(np.unique(expected)) > 100


def test_float_view_runs_the_same_steps_with_float_epilogues():
    """FloatQuantGraph.of(graph) shares the recorded steps; only requantize and residual adds
    compute differently, by a few rounding steps at most."""
    g = qnn.QuantGraph(seed=0)
    x = g.input(np.random.RandomState(0).randint(0, 256, (1, 8, 8, 16)).astype("uint8"), zp=128)
    y = g.conv(x, 64, 3)
    g.add(g.conv(y, 64, 1, name="c2"), y)
    view = qnn_float.FloatQuantGraph.of(g)
    assert view.steps is g.steps
    sample = [np.random.RandomState(1).randint(0, 256, (1, 8, 8, 16)).astype("uint8")]
    fixed, flt = g(sample).astype(int), view(sample).astype(int)
    assert 0 < np.abs(fixed - flt).max() <= 4


@pytest.mark.parametrize("fold", [True, False])
def test_amx_emission_with_float_epilogues_equals_the_float_reference(fold):
    """A small residual block in the AMX layouts (64-channel blocks), untuned, equals the float
    view's NumPy reference bit for bit; with ``fold_requantize`` its add computes the conv's
    requantize (one fused function, no separate requantize)."""
    from tvm import relax

    from tvm_ext.workloads import qnn_amx

    g = qnn.QuantGraph(seed=0)
    rng = np.random.RandomState(0)
    x = g.input(rng.randint(0, 256, (1, 6, 6, 64)).astype("uint8"), zp=128)
    y = g.conv(x, 64, 3, name="c1")
    out = g.add(g.conv(y, 64, 1, name="c2"), y)
    g.dense(g.global_avg_pool(out), 16)
    view = qnn_float.FloatQuantGraph.of(g)
    mod = qnn_amx.to_relax(view, fold_requantize=fold)
    unfused = [gv.name_hint for gv in qnn_amx.to_relax(view, fused=False, fold_requantize=fold).get_global_vars()]
    assert any(n.startswith("requantize_add_requantize") for n in unfused) == fold
    vm = relax.VirtualMachine(relax.build(mod, target=LLVM), tvm.cpu())
    sample = [rng.randint(0, 256, (1, 6, 6, 64)).astype("uint8")]
    got = vm["main"](*(tvm.runtime.tensor(a) for a in sample)).numpy()
    np.testing.assert_array_equal(got, view(sample))
    assert len(np.unique(got)) > 5
