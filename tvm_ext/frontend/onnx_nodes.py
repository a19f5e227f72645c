"""One converter per ONNX op type, on the meanings of :mod:`.qvalues` (QT, View, Weight, Pending)."""
from __future__ import annotations

import numpy as np

from .qvalues import INF, QT, Pending, Steps, View, Weight, quant_params

QDQ = ("QuantizeLinear", "DequantizeLinear", "Conv", "Gemm", "MatMul", "Add", "Relu", "Clip", "MaxPool",
       "AveragePool", "GlobalAveragePool", "Flatten", "Reshape", "Concat", "Identity", "Constant")
QOPERATOR = ("QLinearConv", "QLinearMatMul", "QLinearAdd", "QGemm", "QLinearGlobalAveragePool",
             "QLinearAveragePool", "QLinearConcat")
SUPPORTED = frozenset(QDQ + QOPERATOR)
NHWC_AXIS = {0: 0, 1: 3, 2: 1, 3: 2}  # ONNX NCHW axis -> ours


def _attrs(node) -> dict:
    from onnx import helper  # pylint: disable=import-outside-toplevel

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


class Converter:
    """Walks the nodes of a model in order and records the steps of its integer graph."""

    def __init__(self, steps: Steps, model, input_name: str, sample: np.ndarray):
        from onnx import numpy_helper  # pylint: disable=import-outside-toplevel

        self.steps, self.model = steps, model
        self.env: dict = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        self.input_name, self.sample = input_name, sample
        self.env[input_name] = "input"

    # -- helpers ---------------------------------------------------------------------------
    def get(self, name, node):
        if name not in self.env:
            raise ValueError(f"node {node.name!r} ({node.op_type}): input {name!r} is not produced by a "
                             "supported pattern")
        return self.env[name]

    def const(self, node, i, default=None):
        if i >= len(node.input) or not node.input[i]:
            return default
        value = self.get(node.input[i], node)
        if not isinstance(value, np.ndarray):
            raise ValueError(f"node {node.name!r} ({node.op_type}): input {i} must be a constant")
        return value

    def want(self, node, value, kinds, what):
        if not isinstance(value, kinds):
            raise ValueError(f"node {node.name!r} ({node.op_type}): {what} is not quantized as expected "
                             f"(got {type(value).__name__}); only QDQ groups and QLinear ops are imported")
        return value

    def weight(self, node, i) -> Weight:
        value = self.get(node.input[i], node)
        if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.integer):
            return Weight(value, np.float32(1), np.int8(0))
        return self.want(node, value, Weight, f"weight input {node.input[i]!r}")

    def qin(self, node, i) -> QT:
        """Input ``i`` of a QOperator node: an integer tensor (its scale/zp inputs follow it)."""
        return self.want(node, self.get(node.input[i], node), QT, f"input {node.input[i]!r}")

    def vin(self, node, i) -> QT:
        """Input ``i`` of a QDQ node: a dequantized tensor; returns its integer tensor."""
        v = self.want(node, self.get(node.input[i], node), View, f"input {node.input[i]!r}")
        if v.lo != -INF or v.hi != INF:
            raise ValueError(f"node {node.name!r}: a Relu/Clip on a dequantized input is not supported")
        return v.q

    def qparams(self, node, i):
        return quant_params(self.const(node, i), self.const(node, i + 1))

    def finish(self, node, pending, i, out=None):
        """Quantize ``pending`` with the scale/zp inputs ``i``, ``i + 1`` of ``node``."""
        q = self.steps.finish(pending, *self.qparams(node, i))
        self.steps.layers[out or node.output[0]] = q
        return q

    def run(self):
        for node in self.model.graph.node:
            result = getattr(self, "_" + node.op_type)(node, **_attrs(node))
            self.env[node.output[0]] = result
        return self.env[self.model.graph.output[0].name]

    # -- edges and QDQ -------------------------------------------------------------------
    def _Constant(self, node, value=None, **_):
        from onnx import numpy_helper  # pylint: disable=import-outside-toplevel

        if value is None:
            raise ValueError(f"Constant node {node.name!r}: only tensor values are supported")
        return numpy_helper.to_array(value)

    def _Identity(self, node, **_):
        return self.get(node.input[0], node)

    def _QuantizeLinear(self, node, axis=1, **_):
        x = self.get(node.input[0], node)
        if isinstance(x, np.ndarray):  # a float constant quantized in the file: keep the integers
            scale, zp = self.const(node, 1), self.const(node, 2, np.uint8(0))
            shape = [-1 if a == axis % x.ndim else 1 for a in range(x.ndim)] if np.ndim(scale) else []
            info = np.iinfo(zp.dtype)
            q = np.clip(np.rint(x / np.reshape(scale, shape)) + np.reshape(zp, shape), info.min, info.max)
            return q.astype(zp.dtype)
        params = self.qparams(node, 1)
        if isinstance(x, str):  # the model's float input
            q = self.steps.input(self.sample, *params, name=node.name or "quantize")
            self.steps.layers[node.output[0]] = q
            return q
        if isinstance(x, View):
            x = Pending("view", node.name, [x.q], lo=x.lo, hi=x.hi)
        return self.finish(node, self.want(node, x, Pending, "its input"), 1)

    def _DequantizeLinear(self, node, axis=1, **_):
        x = self.get(node.input[0], node)
        if isinstance(x, np.ndarray):
            return Weight(x, self.const(node, 1), self.const(node, 2, np.zeros((), x.dtype)))
        if isinstance(x, Weight):  # Q -> DQ of a float constant
            return Weight(x.q, self.const(node, 1), self.const(node, 2, np.zeros((), x.q.dtype)))
        return View(self.want(node, x, QT, "its input"))

    def _Conv(self, node, **attrs):
        x, w = self.vin(node, 0), self.weight(node, 1)
        bias = self.get(node.input[2], node) if len(node.input) > 2 and node.input[2] else None
        return self.steps.conv(node.name, x, w, bias, **self.conv_attrs(node, x, w.q.shape[2:], attrs))

    def _Gemm(self, node, transA=0, transB=0, alpha=1.0, beta=1.0, **_):
        if transA or alpha != 1.0 or beta != 1.0:
            raise ValueError(f"Gemm node {node.name!r}: transA, alpha and beta other than 0, 1, 1 are not supported")
        x, w = self.vin(node, 0), self.weight(node, 1)
        w = w if transB else Weight(w.q.T, w.scale, w.zp)
        bias = self.get(node.input[2], node) if len(node.input) > 2 and node.input[2] else None
        return self.steps.dense(node.name, self.flat(node, x), w, bias)

    def _MatMul(self, node, **_):
        x, w = self.vin(node, 0), self.weight(node, 1)
        return self.steps.dense(node.name, self.flat(node, x), Weight(w.q.T, w.scale, w.zp), None)

    def _Add(self, node, **_):
        a, b = self.vin(node, 0), self.vin(node, 1)
        self.same_shape(node, a, b)
        return Pending("add", node.name, [a, b])

    def _Relu(self, node, **_):
        return self.clip(node, 0.0, INF)

    def _Clip(self, node, min=None, max=None, **_):  # pylint: disable=redefined-builtin
        lo = self.const(node, 1, min if min is not None else -INF)
        hi = self.const(node, 2, max if max is not None else INF)
        return self.clip(node, float(lo), float(hi))

    def clip(self, node, lo, hi):
        x = self.get(node.input[0], node)
        if isinstance(x, View):
            return View(x.q, max(x.lo, lo), min(x.hi, hi))
        return self.want(node, x, Pending, "its input").clipped(lo, hi)

    def _MaxPool(self, node, kernel_shape, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), ceil_mode=0,
                 auto_pad="NOTSET", **_):
        x = self.get(node.input[0], node)
        if ceil_mode or any(d != 1 for d in dilations) or auto_pad not in ("NOTSET", b"NOTSET"):
            raise ValueError(f"MaxPool node {node.name!r}: ceil_mode, dilations and auto_pad are not supported")
        q = x.q if isinstance(x, View) else self.want(node, x, QT, "its input")
        y = self.steps.graph.step(node.name, "max_pool2d", [q.value], zp=q.zp, size=tuple(kernel_shape),
                                  stride=tuple(strides), pad=tuple(pads))
        out = QT(y, q.scale, q.zp, q.signed)
        return View(out, x.lo, x.hi) if isinstance(x, View) else out

    def _AveragePool(self, node, **attrs):
        return self.avg_pool(node, self.vin(node, 0), attrs)

    def avg_pool(self, node, x, attrs):
        if attrs.get("ceil_mode") or (any(attrs.get("pads", ())) and not attrs.get("count_include_pad")):
            raise ValueError(f"AveragePool node {node.name!r}: ceil_mode, and padding without "
                             "count_include_pad, are not supported")
        size = tuple(attrs["kernel_shape"])
        a = self.conv_attrs(node, x, size, attrs)
        return self.steps.avg_pool(node.name, x, size=size, stride=a["stride"], pad=a["pad"])

    def _GlobalAveragePool(self, node, **_):
        return self.steps.global_pool(node.name, self.vin(node, 0))

    def _Flatten(self, node, axis=1, **_):
        if axis != 1:
            raise ValueError(f"Flatten node {node.name!r}: only axis 1 is supported")
        return self.reshape(node, self.get(node.input[0], node))

    def _Reshape(self, node, **_):
        x, shape = self.get(node.input[0], node), self.const(node, 1)
        q = x.q if isinstance(x, View) else x
        if isinstance(q, QT) and len(shape) == 2 and shape[1] in (-1, int(np.prod(q.shape[1:]))):
            return self.reshape(node, x)
        raise ValueError(f"Reshape node {node.name!r}: only flattening to (N, -1) is supported")

    def reshape(self, node, x):
        q = x.q if isinstance(x, View) else self.want(node, x, QT, "its input")
        if len(q.shape) == 4:  # (N, C) values need nothing: GlobalAveragePool gives (N, C) already
            q = QT(self.steps.graph.step(node.name, "flatten", [q.value], zp=q.zp), q.scale, q.zp, q.signed)
        return View(q, x.lo, x.hi) if isinstance(x, View) else q

    def _Concat(self, node, axis, **_):
        xs = [self.vin(node, i) for i in range(len(node.input))]
        return Pending("concat", node.name, xs, axis=self.axis(xs[0], axis))

    # -- QOperator -------------------------------------------------------------------------
    def _QLinearConv(self, node, **attrs):
        x, w = self.qin(node, 0), self.weight(node, 3)
        w = Weight(w.q, self.const(node, 4), self.const(node, 5, np.zeros((), w.q.dtype)))
        bias = self.const(node, 8)
        p = self.steps.conv(node.name, x, w, bias, **self.conv_attrs(node, x, w.q.shape[2:], attrs))
        return self.finish(node, p, 6)

    def _QLinearMatMul(self, node, **_):
        x, w = self.qin(node, 0), self.weight(node, 3)
        w = Weight(w.q.T, self.const(node, 4), self.const(node, 5, np.zeros((), w.q.dtype)))
        return self.finish(node, self.steps.dense(node.name, self.flat(node, x), w, None), 6)

    def _QGemm(self, node, transA=0, transB=0, alpha=1.0, **_):
        if transA or alpha != 1.0 or len(node.input) < 8:
            raise ValueError(f"QGemm node {node.name!r}: transA, alpha != 1 or a float output are not supported")
        x, w = self.qin(node, 0), self.weight(node, 3)
        w = Weight(w.q if transB else w.q.T, self.const(node, 4), self.const(node, 5, np.zeros((), w.q.dtype)))
        p = self.steps.dense(node.name, self.flat(node, x), w, self.const(node, 6))
        return self.finish(node, p, 7)

    def _QLinearAdd(self, node, **_):
        a, b = self.qin(node, 0), self.qin(node, 3)
        self.same_shape(node, a, b)
        return self.finish(node, Pending("add", node.name, [a, b]), 6)

    def _QLinearGlobalAveragePool(self, node, channels_last=0, **_):
        if channels_last:
            raise ValueError(f"node {node.name!r}: channels_last QLinearGlobalAveragePool is not supported")
        return self.finish(node, self.steps.global_pool(node.name, self.qin(node, 0)), 3)

    def _QLinearAveragePool(self, node, **attrs):
        return self.finish(node, self.avg_pool(node, self.qin(node, 0), attrs), 3)

    def _QLinearConcat(self, node, axis, **_):
        xs = [self.qin(node, i) for i in range(2, len(node.input), 3)]
        return self.finish(node, Pending("concat", node.name, xs, axis=self.axis(xs[0], axis)), 0)

    # -- shapes and attributes -------------------------------------------------------------------
    def conv_attrs(self, node, x: QT, kernel, attrs) -> dict:
        if any(d != 1 for d in attrs.get("dilations", (1, 1))):
            raise ValueError(f"node {node.name!r}: dilated convolutions are not supported")
        strides = tuple(attrs.get("strides", (1, 1)))
        pads = tuple(attrs.get("pads", (0, 0, 0, 0)))
        auto = attrs.get("auto_pad", "NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            pads = [0] * 4
            for d, (size, k, s) in enumerate(zip(x.shape[1:3], kernel, strides)):
                total = max((-(-size // s) - 1) * s + k - size, 0)
                small, big = total // 2, total - total // 2
                pads[d], pads[d + 2] = (small, big) if auto == "SAME_UPPER" else (big, small)
        elif auto == "VALID":
            pads = (0, 0, 0, 0)
        pad = pads[0] if len(set(pads)) == 1 else tuple(pads)
        stride = strides[0] if len(set(strides)) == 1 else strides
        return {"stride": stride, "pad": pad, "groups": int(attrs.get("group", 1))}

    def flat(self, node, x: QT) -> QT:
        if len(x.shape) != 2:
            raise ValueError(f"node {node.name!r}: Gemm/MatMul on a {len(x.shape)}-d input is not supported")
        return x

    def same_shape(self, node, a: QT, b: QT):
        if a.shape != b.shape:
            raise ValueError(f"Add node {node.name!r}: broadcasting {a.shape} with {b.shape} is not supported")

    def axis(self, x: QT, axis: int) -> int:
        axis %= len(x.shape)
        return NHWC_AXIS[axis] if len(x.shape) == 4 else axis
