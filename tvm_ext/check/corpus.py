"""The equivalence corpus: PrimFuncs from TVM's operator library (topi: conv2d
NHWC/NCHW int8 and float, depthwise conv, dense, batch_matmul, pooling, softmax,
layer_norm, elementwise chains, reductions, transpose, fixed-point requantize),
tvm_ext's quantized ops (the seed's conv + requantize epilogue with its
constant-scalar block, residual add-requantize, int pooling) and tasks of the
workloads.  Shapes are drawn from the generator each case's ``build`` is given.
``tvm_ext.check.equivalence`` runs them.

Case(name, build, int_ranges=None, rtol=1e-4, atol=1e-4)   build(rng) -> PrimFunc
corpus(seed=0) -> list[Case]                  the full corpus (>= 30 cases)
FAST = (...)                                  names of the CI subset
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import tvm
from tvm import te, tirx, topi


@dataclass
class Case:
    """One corpus entry.

    build:      rng -> PrimFunc (shapes drawn from rng); the last parameter(s) are outputs
    int_ranges: {param name: (low, high)} for integer inputs that need a valid range
                (requantize multipliers and shifts); others get small random values
    """

    name: str
    build: Callable[[np.random.RandomState], tirx.PrimFunc]
    int_ranges: dict = field(default_factory=dict)
    rtol: float = 1e-4
    atol: float = 1e-4



# --------------------------------------------------------------------------- corpus
def _pf(args) -> tirx.PrimFunc:
    return te.create_prim_func(args).with_attr("global_symbol", "main")


def _pick(rng, values):
    return values[rng.randint(len(values))]


def _conv_nhwc(dtype, out_dtype, kernel=None, stride=None):
    def build(rng):
        n, h, c, k = 1, _pick(rng, [6, 7, 8, 10]), _pick(rng, [4, 8, 16]), _pick(rng, [4, 8, 16])
        kh = kernel or _pick(rng, [1, 3])
        s = stride or _pick(rng, [1, 2])
        data = te.placeholder((n, h, h, c), dtype, name="data")
        w = te.placeholder((kh, kh, c, k), "int8" if "int" in dtype else dtype, name="weight")
        out = topi.nn.conv2d_nhwc(data, w, s, kh // 2, 1, out_dtype=out_dtype)
        return _pf([data, w, out])
    return build


def _conv_nchw(dtype, out_dtype):
    def build(rng):
        n, h, c, k = 1, _pick(rng, [6, 8, 9]), _pick(rng, [3, 4, 8]), _pick(rng, [4, 8])
        kh, s = _pick(rng, [1, 3]), _pick(rng, [1, 2])
        data = te.placeholder((n, c, h, h), dtype, name="data")
        w = te.placeholder((k, c, kh, kh), dtype, name="weight")
        out = topi.nn.conv2d_nchw(data, w, s, kh // 2, 1, out_dtype=out_dtype)
        return _pf([data, w, out])
    return build


def _depthwise(rng):
    h, c = _pick(rng, [6, 8]), _pick(rng, [4, 8, 16])
    data = te.placeholder((1, h, h, c), "float32", name="data")
    w = te.placeholder((3, 3, c, 1), "float32", name="weight")
    out = topi.nn.depthwise_conv2d_nhwc(data, w, 1, 1, 1, kernel_layout="HWOI")
    return _pf([data, w, out])


def _dense(dtype, out_dtype, bias_relu=False):
    def build(rng):
        m, k, n = _pick(rng, [1, 4, 16]), _pick(rng, [16, 32, 64]), _pick(rng, [8, 16, 32])
        x = te.placeholder((m, k), dtype, name="x")
        w = te.placeholder((n, k), dtype, name="w")
        y = topi.nn.dense(x, w, out_dtype=out_dtype)
        args = [x, w]
        if bias_relu:
            b = te.placeholder((n,), out_dtype or dtype, name="b")
            y = topi.nn.relu(topi.add(y, b))
            args.append(b)
        return _pf(args + [y])
    return build


def _batch_matmul(dtype, out_dtype):
    def build(rng):
        b, m, k, n = _pick(rng, [1, 2, 4]), _pick(rng, [4, 8]), _pick(rng, [16, 32]), _pick(rng, [8, 16])
        x = te.placeholder((b, m, k), dtype, name="x")
        y = te.placeholder((b, n, k), dtype, name="y")
        return _pf([x, y, topi.nn.batch_matmul(x, y, out_dtype=out_dtype)])
    return build


def _pool(kind, layout):
    def build(rng):
        h, c = _pick(rng, [6, 8, 9]), _pick(rng, [4, 8])
        shape = (1, h, h, c) if layout == "NHWC" else (1, c, h, h)
        x = te.placeholder(shape, "float32", name="x")
        y = topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), kind, layout=layout,
                           count_include_pad=False)
        return _pf([x, y])
    return build


def _global_pool(rng):
    x = te.placeholder((1, _pick(rng, [4, 8]), _pick(rng, [5, 7]), _pick(rng, [5, 7])), "float32", name="x")
    return _pf([x, topi.nn.global_pool(x, "avg", layout="NCHW")])


def _adaptive_pool(rng):
    # input sizes divisible by the output's: otherwise topi's pooling windows have a
    # data-dependent extent and MetaSchedule's DisallowDynamicLoop rejects every
    # candidate of any rule set (TVM's default one too), leaving nothing to compare
    x = te.placeholder((1, 4, _pick(rng, [6, 9, 12]), 8), "float32", name="x")
    return _pf([x, topi.nn.adaptive_pool(x, (3, 2), "max", layout="NCHW")])


def _softmax(log=False):
    def build(rng):
        x = te.placeholder((_pick(rng, [2, 4, 8]), _pick(rng, [16, 33, 64])), "float32", name="x")
        return _pf([x, (topi.nn.log_softmax if log else topi.nn.softmax)(x)])
    return build


def _layer_norm(rng):
    r, c = _pick(rng, [2, 4]), _pick(rng, [16, 32, 48])
    x = te.placeholder((r, c), "float32", name="x")
    g = te.placeholder((c,), "float32", name="gamma")
    b = te.placeholder((c,), "float32", name="beta")
    return _pf([x, g, b, topi.nn.layer_norm(x, g, b, axis=[1])])


def _elementwise_chain(rng):
    shape = (_pick(rng, [3, 8, 16]), _pick(rng, [5, 16, 31]))
    a, b, c = (te.placeholder(shape, "float32", name=n) for n in "abc")
    y = topi.multiply(topi.exp(topi.add(a, b)), topi.nn.relu(c))
    return _pf([a, b, c, y])


def _activation_chain(rng):
    shape = (_pick(rng, [4, 16]), _pick(rng, [7, 32]))
    a = te.placeholder(shape, "float32", name="a")
    return _pf([a, topi.sigmoid(topi.tanh(topi.multiply(a, topi.sigmoid(a))))])


def _int_chain(rng):
    shape = (_pick(rng, [4, 16]), _pick(rng, [8, 33]))
    a = te.placeholder(shape, "int32", name="a")
    b = te.placeholder(shape, "int32", name="b")
    y = topi.cast(topi.clip(topi.add(topi.multiply(a, b), a), 0, 255), "uint8")
    return _pf([a, b, y])


def _reduce(op, dtype="float32"):
    def build(rng):
        x = te.placeholder((_pick(rng, [3, 8]), _pick(rng, [16, 40]), _pick(rng, [4, 6])), dtype, name="x")
        return _pf([x, op(x, axis=1)])
    return build


def _argmax(rng):
    x = te.placeholder((_pick(rng, [4, 8]), _pick(rng, [17, 32])), "float32", name="x")
    return _pf([x, topi.argmax(x, axis=1)])


def _transpose(rng):
    x = te.placeholder((_pick(rng, [2, 4]), _pick(rng, [8, 16]), _pick(rng, [3, 8])), "float32", name="x")
    return _pf([x, topi.transpose(x, (2, 0, 1))])


def _transpose_add(rng):
    m, n = _pick(rng, [8, 16]), _pick(rng, [4, 12])
    x = te.placeholder((m, n), "int32", name="x")
    y = te.placeholder((n, m), "int32", name="y")
    return _pf([x, y, topi.add(topi.transpose(x), y)])


def _fixed_point_multiply(rng):
    x = te.placeholder((_pick(rng, [4, 16]), _pick(rng, [8, 32])), "int32", name="x")
    return _pf([x, topi.fixed_point_multiply(x, int(rng.randint(1 << 30, (1 << 31) - 1)), -int(rng.randint(1, 8)))])


def _qmsa_requantize(rng):
    rows, cols = _pick(rng, [4, 16, 32]), _pick(rng, [8, 16, 64])
    x = te.placeholder((rows, cols), "int32", name="x")
    m, lsh, rsh = (te.placeholder((cols,), "int32", name=n) for n in ("mult", "lshift", "rshift"))
    y = te.compute((rows, cols), lambda i, j: tirx.q_multiply_shift_per_axis(
        x[i, j], m[j], lsh[j], rsh[j], 31, False, True), name="y")
    return _pf([x, m, lsh, rsh, y])


_QNN_RANGES = {"p4": (1 << 30, (1 << 31) - 1), "p5": (0, 1), "p6": (1, 12),
               "mult": (1 << 30, (1 << 31) - 1), "lshift": (0, 1), "rshift": (1, 12),
               "mult_a": (1 << 30, (1 << 31) - 1), "mult_b": (1 << 30, (1 << 31) - 1),
               "rshift_a": (1, 12), "rshift_b": (1, 12)}
# fused requantize tasks of the int8 workloads: weight, zp correction, bias, multiplier, shifts
_TASK_RANGES = {"param_3": (1 << 30, (1 << 31) - 1), "param_4": (0, 1), "param_5": (1, 12)}


def _seed_conv(kernel):
    def build(rng):
        from tvm_ext.workloads.conv2d_int8 import seed_conv_primfunc

        return seed_conv_primfunc(image=_pick(rng, [5, 7, 8]), channels=_pick(rng, [4, 8, 16]),
                                  out_channels=_pick(rng, [8, 16]), kernel=kernel, stride=_pick(rng, [1, 2]))
    return build


def _qnn_requantize(rng):
    from tvm_ext.workloads import qnn

    shape = (1, _pick(rng, [3, 5]), _pick(rng, [3, 5]), _pick(rng, [8, 16]))
    c = shape[-1]
    acc = te.placeholder(shape, "int32", name="acc")
    zp = te.placeholder((1, 1, 1, c), "int32", name="zp_corr")
    bias = te.placeholder((1, 1, 1, c), "int32", name="bias")
    mult, lsh, rsh = (te.placeholder((c,), "int32", name=n) for n in ("mult", "lshift", "rshift"))
    out = qnn.requantize(acc, zp, bias, mult, lsh, rsh, zp_out=int(rng.randint(0, 100)))
    return _pf([acc, zp, bias, mult, lsh, rsh, out])


def _qnn_add_requantize(rng):
    from tvm_ext.workloads import qnn

    shape = (1, _pick(rng, [3, 4]), _pick(rng, [3, 4]), _pick(rng, [8, 16]))
    c = shape[-1]
    a = te.placeholder(shape, "uint8", name="a")
    b = te.placeholder(shape, "uint8", name="b")
    ma, ra, mb, rb = (te.placeholder((c,), "int32", name=n) for n in ("mult_a", "rshift_a", "mult_b", "rshift_b"))
    out = qnn.add_requantize(a, b, ma, ra, mb, rb, zp_a=3, zp_b=5, zp_out=7)
    return _pf([a, b, ma, ra, mb, rb, out])


def _qnn_pool(kind):
    def build(rng):
        from tvm_ext.workloads import qnn

        x = te.placeholder((1, _pick(rng, [6, 8]), _pick(rng, [6, 8]), _pick(rng, [4, 8])), "uint8", name="x")
        out = qnn.max_pool2d(x) if kind == "max" else qnn.global_avg_pool(x)
        return _pf([x, out])
    return build


def _qnn_dense(rng):
    from tvm_ext.workloads import qnn

    x = te.placeholder((1, _pick(rng, [16, 32])), "uint8", name="x")
    w = te.placeholder((_pick(rng, [8, 16]), int(x.shape[1])), "int8", name="w")
    return _pf([x, w, qnn.dense(x, w)])


def _workload_task(name, index=0, **options):
    def build(_rng):
        from tvm.s_tir.meta_schedule.relax_integration import extract_tasks
        import tvm_ext.workloads as workloads

        wl = workloads.get(name, **options)
        tasks = extract_tasks(wl.mod, tvm.target.Target({"kind": "llvm"}))
        convs = [t for t in tasks if "conv" in t.task_name or "matmul" in t.task_name] or tasks
        func = convs[index % len(convs)].dispatched[0]["main"]
        return func.with_attr("global_symbol", "main")
    return build


def corpus(seed: int = 0) -> list:
    """The full corpus (shapes are drawn from ``seed`` when each case is built)."""
    del seed  # shapes are drawn in check_case from (seed, name)
    f32, i8 = "float32", "int8"
    cases = [
        Case("conv2d_nhwc_f32", _conv_nhwc(f32, f32), rtol=1e-4, atol=1e-3),
        Case("conv2d_nhwc_f32_3x3_s1", _conv_nhwc(f32, f32, kernel=3, stride=1), rtol=1e-4, atol=1e-3),
        Case("conv2d_nchw_f32", _conv_nchw(f32, f32), rtol=1e-4, atol=1e-3),
        Case("conv2d_nhwc_int8", _conv_nhwc(i8, "int32")),
        Case("conv2d_nhwc_uint8", _conv_nhwc("uint8", "int32", kernel=3)),
        Case("conv2d_nchw_int8", _conv_nchw(i8, "int32")),
        Case("depthwise_conv2d_nhwc_f32", _depthwise, atol=1e-3),
        Case("dense_f32", _dense(f32, f32), atol=1e-3),
        Case("dense_int8", _dense(i8, "int32")),
        Case("dense_bias_relu_f32", _dense(f32, f32, bias_relu=True), atol=1e-3),
        Case("batch_matmul_f32", _batch_matmul(f32, f32), atol=1e-3),
        Case("batch_matmul_int8", _batch_matmul(i8, "int32")),
        Case("max_pool2d_nhwc", _pool("max", "NHWC")),
        Case("avg_pool2d_nchw", _pool("avg", "NCHW")),
        Case("global_avg_pool_nchw", _global_pool),
        Case("adaptive_max_pool", _adaptive_pool),
        Case("softmax", _softmax()),
        Case("log_softmax", _softmax(log=True)),
        Case("layer_norm", _layer_norm, atol=1e-3),
        Case("elementwise_chain_f32", _elementwise_chain),
        Case("activation_chain_f32", _activation_chain),
        Case("elementwise_chain_int", _int_chain),
        Case("sum_f32", _reduce(topi.sum), atol=1e-3),
        Case("max_f32", _reduce(topi.max)),
        Case("sum_int32", _reduce(topi.sum, "int32")),
        Case("argmax", _argmax),
        Case("transpose", _transpose),
        Case("transpose_add_int", _transpose_add),
        Case("fixed_point_multiply", _fixed_point_multiply),
        Case("q_multiply_shift_per_axis", _qmsa_requantize, int_ranges=_QNN_RANGES),
        Case("qnn_requantize_const_scalar", _qnn_requantize, int_ranges=_QNN_RANGES),
        Case("qnn_conv3x3_requantize_seed", _seed_conv(3), int_ranges=_QNN_RANGES),
        Case("qnn_conv1x1_requantize_seed", _seed_conv(1), int_ranges=_QNN_RANGES),
        Case("qnn_add_requantize", _qnn_add_requantize, int_ranges=_QNN_RANGES),
        Case("qnn_max_pool2d", _qnn_pool("max")),
        Case("qnn_global_avg_pool", _qnn_pool("avg")),
        Case("qnn_dense", _qnn_dense),
        Case("task_conv2d_int8", _workload_task("conv2d-int8", image=6, channels=8), int_ranges=_TASK_RANGES),
        Case("task_resnet50_int8_conv", _workload_task("resnet50-int8", index=3, image=32),
             int_ranges=_TASK_RANGES),
        Case("task_phi2_decode_matmul", _workload_task("phi2-decode", config="reduced", context=8),
             rtol=1e-3, atol=1e-3),
    ]
    return cases


# the CI subset: the seed pattern, an int8 conv, a float reduction chain, a requantize op,
# and the u8 x s8 dense that VNNI tensorization once got wrong (on VNNI hosts)
FAST = ("qnn_conv3x3_requantize_seed", "dense_int8", "softmax", "q_multiply_shift_per_axis", "qnn_dense")


__all__ = ["Case", "FAST", "corpus"]
