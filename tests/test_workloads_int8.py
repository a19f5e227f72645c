"""Quantized workloads: compiled with default schedules, they equal the NumPy reference
bit for bit; their fused tasks keep the constant-scalar block."""
import math

import numpy as np
import pytest
import tvm
from tvm import relax, te
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms

from tvm_ext.workloads import conv2d_int8, qnn, qnn_reference, resnet50_int8

LLVM = tvm.target.Target("llvm")
SMALL_IMAGE = 32


def _run_relax(workload):
    exe = relax.build(workload.mod, target=LLVM)
    vm = relax.VirtualMachine(exe, tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(x) for x in workload.inputs)).numpy()


def _const_scalar_blocks(func):
    """Blocks with no reads and one write of a single-element buffer."""
    sch = Schedule(tvm.IRModule({"main": func}))
    found = []
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(rv)
        if block.reads or len(block.writes) != 1:
            continue
        shape = [int(d) for d in block.writes[0].source.shape]
        if math.prod(shape) == 1:
            found.append(block.name_hint)
    return found


@pytest.fixture(scope="module")
def resnet():
    return resnet50_int8.build(batch=1, image=SMALL_IMAGE, seed=0)


def test_q_multiply_shift_per_axis_rounding_matches_tvm():
    rng = np.random.RandomState(1)
    n, c = 64, 16
    x_np = rng.randint(-(2**30), 2**30, (n, c)).astype("int32")
    x_np[0] = [-3, -2, -1, 0, 1, 2, 3, 2**31 - 1, -(2**31), 5, -5, 7, -7, 100, -100, 1]
    mult_np = rng.randint(2**30, 2**31 - 1, c).astype("int32")
    mult_np[:2] = [2**30, 2**31 - 1]
    rshift_np = rng.randint(0, 24, c).astype("int32")
    rshift_np[:2] = [0, 1]
    x = te.placeholder((n, c), "int32", name="x")
    mult, lshift, rshift = (te.placeholder((c,), "int32", name=s) for s in ("m", "l", "r"))
    out = te.compute((n, c), lambda i, j: qnn._qmsa(x[i, j], mult[j], lshift[j], rshift[j]), name="out")
    lib = tvm.compile(te.create_prim_func([x, mult, lshift, rshift, out]), target=LLVM)
    args = [x_np, mult_np, np.full(c, 7, "int32"), rshift_np, np.zeros((n, c), "int32")]
    tensors = [tvm.runtime.tensor(a) for a in args]
    lib(*tensors)
    expected = qnn_reference.q_multiply_shift_per_axis(x_np, mult_np, 7, rshift_np)
    np.testing.assert_array_equal(tensors[-1].numpy(), expected)


def test_requantize_reference_matches_tvm_where_int32_overflows():
    """qnn.requantize compiled by TVM against qnn_reference.requantize, bit for bit, on
    accumulators at the int32 limits: ``acc - zp_corr + bias`` wraps (a plain int64
    reference differs there in ~7% of random draws), ``qmsa(.) + zp_out`` followed by
    the clip does not (an int32 reference gives 0 where TVM gives 255); also the
    rounding ties of the fixed-point multiply."""
    rng = np.random.default_rng(0)
    n = 4096
    acc = rng.integers(-(2**31), 2**31, n).astype("int32")
    acc[:64] = 2**31 - rng.integers(1, 50, 64)  # qmsa(acc) + zp_out overflows
    acc[64:128] = -(2**31) + rng.integers(0, 20, 64)  # acc - zp_corr wraps
    acc[128:134] = [-5, -4, -3, 3, 4, 5]  # ties: x * 2**30 / 2**33
    zp_corr = (rng.integers(-(2**31), 2**31, n) // rng.choice([1, 1000, 2**20], n)).astype("int32")
    zp_corr[:64] = rng.integers(0, 20, 64)
    zp_corr[64:128] = rng.integers(100, 200, 64)
    zp_corr[128:134] = 0
    bias = rng.integers(-5000, 5000, n).astype("int32")
    bias[:134] = 0
    mult = rng.choice([2**30, 3 * 2**29, 2**31 - 1], n).astype("int32")
    mult[:128], mult[128:134] = 2**31 - 1, 2**30
    rshift = rng.integers(0, 3, n).astype("int32")
    rshift[:134] = 0
    rshift[128:134] = 2
    lshift = np.zeros(n, "int32")
    zp_out = 100
    args = [acc, zp_corr, bias, mult, lshift, rshift]
    tensors = [te.placeholder((n,), "int32", name=f"p{i}") for i in range(len(args))]
    out = qnn.requantize(*tensors, zp_out=zp_out)
    lib = tvm.compile(te.create_prim_func([*tensors, out]), target=LLVM)
    got = tvm.runtime.tensor(np.zeros(n, "uint8"))
    lib(*(tvm.runtime.tensor(a) for a in args), got)
    expected = qnn_reference.requantize(*args, zp_out=zp_out)
    np.testing.assert_array_equal(got.numpy(), expected)
    assert (expected[:64] == 255).all() and (expected[64:128] == 255).all()  # the edges were reached
    np.testing.assert_array_equal(expected[128:134], [99, 100, 100, 100, 101, 101])  # x/8, half up


@pytest.mark.parametrize("lo,hi", [(0, 255), (0, 200), (20, 255)])
def test_requantize_folded_into_the_add_equals_the_two_steps(lo, hi):
    """qnn.requantize_add_requantize (the AMX layout's residual epilogue: the requantize kept
    in int32, no uint8 round trip) compiled by TVM equals the NumPy reference of the two
    recorded steps, requantize then add_requantize, bit for bit: accumulators driving the
    requantize below ``lo``, above ``hi`` and through the range, folded ReLU/Clip bounds."""
    rng = np.random.default_rng(5)
    n, c = 512, 8
    acc = rng.integers(-(2**20), 2**20, (n, c)).astype("int32")
    acc[:32], acc[32:64] = -(2**24), 2**24  # clipped at lo and at hi
    zp_corr = rng.integers(-3000, 3000, (1, c)).astype("int32")
    bias = rng.integers(-500, 500, (1, c)).astype("int32")
    mult = rng.integers(2**30, 2**31, c).astype("int32")
    lshift = np.zeros(c, "int32")
    rshift = rng.integers(10, 14, c).astype("int32")
    b_np = rng.integers(0, 256, (n, c)).astype("uint8")
    add = [rng.integers(2**29, 2**31, c).astype("int32"), rng.integers(0, 3, c).astype("int32"),
           rng.integers(2**29, 2**31, c).astype("int32"), rng.integers(0, 3, c).astype("int32")]
    req = {"zp_out": 113, "lo": lo, "hi": hi}
    zps = {"zp_a": 113, "zp_b": 35, "zp_out": 40}
    consts = [acc, zp_corr, bias, mult, lshift, rshift]
    holders = [te.placeholder(a.shape, "int32", name=f"r{i}") for i, a in enumerate(consts)]
    b = te.placeholder(b_np.shape, "uint8", name="b")
    add_holders = [te.placeholder((c,), "int32", name=f"a{i}") for i in range(4)]
    out = qnn.requantize_add_requantize(*holders, b, *add_holders, zp_req=113, lo_req=lo, hi_req=hi, **zps)
    lib = tvm.compile(te.create_prim_func([*holders, b, *add_holders, out]), target=LLVM)
    got = tvm.runtime.tensor(np.zeros((n, c), "uint8"))
    lib(*(tvm.runtime.tensor(a) for a in [*consts, b_np, *add]), got)
    a_np = qnn_reference.requantize(*consts, **req)
    assert a_np.min() == lo and a_np.max() == hi and len(np.unique(a_np)) > 50
    expected = qnn_reference.add_requantize(a_np, b_np, *add, **zps)
    np.testing.assert_array_equal(got.numpy(), expected)
    assert len(np.unique(expected)) > 50


def test_seed_conv_primfunc_matches_reference():
    func = conv2d_int8.seed_conv_primfunc(image=6, channels=8, out_channels=16)
    assert _const_scalar_blocks(func) == ["compile_engine_const"]
    rng = np.random.RandomState(2)
    data = rng.randint(0, 256, (1, 6, 6, 8)).astype("uint8")
    weight = rng.randint(-127, 128, (3, 3, 8, 16)).astype("int8")
    params = [
        rng.randint(-5000, 5000, (1, 1, 1, 16)).astype("int32"),
        rng.randint(-5000, 5000, (1, 1, 1, 16)).astype("int32"),
        rng.randint(2**30, 2**31 - 1, 16).astype("int32"),
        np.zeros(16, "int32"),
        rng.randint(6, 10, 16).astype("int32"),
    ]
    out = tvm.runtime.tensor(np.zeros((1, 6, 6, 16), "uint8"))
    lib = tvm.compile(func, target=LLVM)
    lib(*(tvm.runtime.tensor(a) for a in [data, weight, *params]), out)
    acc = qnn_reference.conv2d_nhwc(data, weight, stride=1, pad=1, zp_in=conv2d_int8.ZP_IN)
    expected = qnn_reference.requantize(acc, *params, zp_out=conv2d_int8.ZP_OUT)
    np.testing.assert_array_equal(out.numpy(), expected)


@pytest.mark.parametrize("kernel,stride", [(3, 1), (1, 2)])
def test_conv2d_int8_exact(kernel, stride):
    wl = conv2d_int8.build(batch=2, image=9, channels=16, out_channels=24, kernel=kernel, stride=stride)
    assert wl.options["batch"] == 2 and wl.options["image"] == 9 and wl.options["seed"] == 0
    ok, summary = wl.check(_run_relax(wl))
    assert ok, summary


def test_resnet50_int8_exact(resnet):
    assert resnet.options == {"batch": 1, "image": SMALL_IMAGE, "seed": 0}
    out = _run_relax(resnet)
    assert out.shape == (1, 1000) and out.dtype == np.uint8
    ok, summary = resnet.check(out)
    assert ok, summary
    assert len(np.unique(out)) > 10  # the classifier output is not constant


def test_resnet50_int8_structure(resnet):
    ops = [s.op for s in resnet.reference.steps]
    assert ops.count("conv2d_nhwc") == 53
    assert ops.count("add_requantize") == 16
    assert ops.count("max_pool2d") == ops.count("global_avg_pool") == ops.count("dense") == 1


def test_resnet50_int8_tasks_keep_constant_scalar_block(resnet):
    tasks = ms.relax_integration.extract_tasks(resnet.mod, LLVM)
    conv_tasks = [t for t in tasks if "conv2d_nhwc" in t.task_name]
    assert len(conv_tasks) >= 20
    assert sum(t.weight for t in conv_tasks) == 53
    for task in conv_tasks:
        (func,) = [f for f in task.dispatched[0].functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
        blocks = _const_scalar_blocks(func)
        expected = 2 if "add_requantize" in task.task_name else 1
        assert len(blocks) == expected, (task.task_name, blocks)


def test_resnet50_int8_clip_fractions_reasonable(resnet):
    fractions = resnet.reference.clip_fractions(resnet.inputs)
    assert len(fractions) == 53 + 16 + 1
    values = np.array(list(fractions.values()))
    assert values.max() < 0.35, fractions
    assert values.mean() < 0.15, fractions


def test_resnet50_int8_independent_of_batch():
    one = resnet50_int8.network(batch=1, image=16, seed=3)
    two = resnet50_int8.network(batch=2, image=16, seed=3)
    out_one = one[0](one[1])
    out_two = two[0](two[1])
    np.testing.assert_array_equal(out_two[:1], out_one)
