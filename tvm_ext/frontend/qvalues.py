"""What an ONNX tensor is while an int8 model is imported, and the integer steps they become.

Both ONNX Runtime formats are read through the same few meanings:

* :class:`QT`: an integer activation of the graph (a QuantGraph value), always held as
  uint8 (an int8 tensor is shifted by 128, its zero point too: ``s * (q - zp)`` is
  unchanged, so every op stays a uint8 x int8 op the rules know);
* :class:`View`: the float tensor ``DequantizeLinear(q)`` of QDQ models, with the bounds
  of a Relu/Clip applied to it;
* :class:`Weight`: a constant integer tensor with its scale and zero point (weights,
  int32 biases);
* :class:`Pending`: the float result of an integer op (conv, dense, pooled sum, add,
  concat) waiting for its QuantizeLinear; :meth:`Steps.finish` emits its requantize,
  with a Relu/Clip met on the way folded into the clip bounds.

A QOperator node (QLinearConv, ...) is the same op on a ``View`` followed by ``finish``.

Rounding: in the NHWC layout the requantize multiplies by a 31-bit fixed-point multiplier
(``qnn.fixed_point``) and rounds half up, where ORT computes ``acc * scale`` in float32 and
rounds half to even: near a .5 boundary the two differ by one step. The packed layouts
requantize in float32 as ORT does (``onnx_int8.emit``), with a conv's scale ratio computed
as ORT does, ``x_scale * w_scale / y_scale`` in float32 (the multiplier holds it exactly). A
residual add is ORT's own arithmetic in every layout (``qnn_ort``: float32 ratios and two
FMAs). So a packed import gives ORT's output on the same file, every element, wherever ORT's
own int8 kernels are exact (VNNI).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from tvm_ext.workloads.qnn import QuantGraph, Value, fixed_point
from tvm_ext.workloads.qnn_ort import qlinear_add_consts

INF = float("inf")


@dataclass
class QT:
    value: Value
    scale: float
    zp: int  # of the uint8 representation
    signed: bool = False  # the ONNX tensor is int8 (ours holds it + 128)

    @property
    def shape(self):
        return self.value.shape


@dataclass
class View:
    q: QT
    lo: float = -INF
    hi: float = INF


@dataclass
class Weight:
    q: np.ndarray  # integer values as stored
    scale: np.ndarray
    zp: np.ndarray

    def centered(self, axis: int = 0) -> np.ndarray:
        """``q - zp`` (zero point per slice of ``axis``) as int8, or int16 where it does not fit."""
        zp = np.asarray(self.zp, np.int32)
        if zp.ndim == 1:
            zp = zp.reshape([-1 if a == axis else 1 for a in range(self.q.ndim)])
        c = self.q.astype(np.int32) - zp
        return c.astype(np.int8 if c.min() >= -128 and c.max() <= 127 else np.int16)


@dataclass
class Pending:
    kind: str  # "acc", "add", "view" or "concat"
    name: str
    inputs: list  # of QT
    scale: np.ndarray = None  # acc: real value of one accumulator unit, per channel
    consts: tuple = ()  # acc: (zp_corr, bias), shaped (1, ..., 1, C)
    axis: int = -1  # concat
    lo: float = -INF
    hi: float = INF

    def clipped(self, lo, hi):
        return replace(self, lo=max(self.lo, lo), hi=min(self.hi, hi))


def quant_params(scale, zp) -> tuple[float, int, bool]:
    """(scale, uint8 zero point, signed) of ONNX scale / zero-point arrays."""
    zp = np.asarray(zp if zp is not None else np.uint8(0))
    if np.size(scale) != 1 or zp.size != 1:
        raise ValueError("per-channel quantization of activations is not supported")
    signed = zp.dtype == np.int8
    if zp.dtype not in (np.uint8, np.int8):
        raise ValueError(f"activations of type {zp.dtype} are not supported (uint8 or int8)")
    return float(np.asarray(scale).reshape(())), int(zp.reshape(())) + (128 if signed else 0), signed


@dataclass
class Steps:
    """Emits QuantGraph steps for the meanings above."""

    graph: QuantGraph
    layers: dict = field(default_factory=dict)  # ONNX tensor name -> QT it was imported as

    def input(self, sample: np.ndarray, scale: float, zp: int, signed: bool, name: str) -> QT:
        x = self.graph.input(sample, zp=0)
        q = self.graph.step(name, "quantize", [x], [np.float32(scale)], zp=zp, zp_out=zp)
        return QT(q, scale, zp, signed)

    def conv(self, name, x: QT, w: Weight, bias, *, stride, pad, groups) -> Pending:
        """Conv of OIHW weights (ONNX) as conv2d_nhwc (HWIO) + a pending requantize."""
        wc = w.centered(0)
        attrs = {"groups": groups} if groups != 1 else {}
        acc = self.graph.step(name + ".acc", "conv2d_nhwc", [x.value], [wc.transpose(2, 3, 1, 0)],
                              stride=stride, pad=pad, zp_in=x.zp, **attrs)
        return self._acc(name, x, acc, wc.reshape(wc.shape[0], -1).sum(axis=1), w.scale, bias)

    def dense(self, name, x: QT, w: Weight, bias) -> Pending:
        """``x @ w.T`` with w ``(units, K)``."""
        wc = w.centered(0)
        if wc.dtype != np.int8:
            raise ValueError(f"node {name!r}: weights outside int8 after their zero point")
        acc = self.graph.step(name + ".acc", "dense", [x.value], [wc])
        return self._acc(name, x, acc, wc.astype(np.int64).sum(axis=1), w.scale, bias)

    def avg_pool(self, name, x: QT, *, size, stride, pad) -> Pending:
        """AveragePool (count_include_pad) as a depthwise conv with weights 1: the window sum."""
        c = x.shape[-1]
        ones = Weight(np.ones((c, 1) + tuple(size), np.int8), np.float32(1.0 / np.prod(size)), np.int8(0))
        return self.conv(name, x, ones, None, stride=stride, pad=pad, groups=c)

    def global_pool(self, name, x: QT) -> Pending:
        """GlobalAveragePool: the window sum over all of H x W (a depthwise conv with weights 1,
        so that FuseOps folds its requantize into it, as for any conv), scale ``1 / (H*W)``."""
        _, h, w, _ = x.shape
        return self.avg_pool(name, x, size=(h, w), stride=1, pad=0)

    def _acc(self, name, x: QT, acc: Value, w_sum, w_scale, bias) -> Pending:
        c = acc.shape[-1]
        lead = (1,) * (acc.sample.ndim - 1) + (c,)
        # in float32, as ORT computes a conv's output scale: (x_scale * w_scale) / y_scale
        scale = np.broadcast_to(np.float32(x.scale) * np.asarray(w_scale, np.float32), (c,))
        zp_corr = (x.zp * np.asarray(w_sum, np.int64)).astype(np.int32).reshape(lead)
        bias = np.zeros(c, np.int32) if bias is None else bias_int32(bias, scale)
        return Pending("acc", name, [QT(acc, 0.0, 0)], scale=scale, consts=(zp_corr, bias.reshape(lead)))

    def finish(self, p: Pending, scale: float, zp: int, signed: bool) -> QT:
        """The QuantizeLinear of a pending float result: its requantize step."""
        lo = 0 if p.lo == -INF else int(np.clip(zp + np.rint(p.lo / scale), 0, 255))
        hi = 255 if p.hi == INF else int(np.clip(zp + np.rint(p.hi / scale), 0, 255))
        bounds = {k: v for k, v in (("lo", lo), ("hi", hi)) if v != (0 if k == "lo" else 255)}
        g, c = self.graph, p.inputs[0].shape[-1]
        if p.kind == "acc":
            mult, rshift, lshift = multiplier(p.scale / np.float32(scale))  # float32: exact in the 31-bit mult
            (acc,), (zp_corr, bias) = p.inputs, p.consts
            left = {"left": 1} if lshift.any() else {}
            out = g.step(p.name, "requantize", [acc.value], [zp_corr, bias, mult, lshift, rshift],
                         zp=zp, zp_out=zp, **bounds, **left)
        elif p.kind == "add":
            a, b = p.inputs
            shift = 128 if signed and a.signed and b.signed else 0  # ORT adds int8 tensors' int8 values
            consts = qlinear_add_consts(a.scale, a.zp, b.scale, b.zp, scale, zp, c, shift)
            out = g.step(p.name, "qlinear_add", [a.value, b.value], consts, zp=zp, **bounds,
                         **({"shift": shift} if shift else {}))
        elif p.kind == "view":
            (x,) = p.inputs
            if x.scale == scale and x.zp == zp and not bounds:
                return replace(x, signed=signed)
            mult, rshift, lshift = multiplier(np.full(c, x.scale / scale))
            shift = {"lshift": int(lshift[0])} if lshift[0] else {}
            out = g.step(p.name, "rescale", [x.value], [mult, rshift], zp=zp, zp_in=x.zp, zp_out=zp,
                         **bounds, **shift)
        else:  # concat
            parts = [self.finish(Pending("view", f"{p.name}.in{i}", [x]), scale, zp, signed).value
                     for i, x in enumerate(p.inputs)]
            out = g.step(p.name, "concat", parts, zp=zp, axis=p.axis)
        return QT(out, scale, zp, signed)

    def output(self, v: View) -> Value:
        """The model's float output: DequantizeLinear of ``v`` (NHWC back to NCHW)."""
        if v.lo != -INF or v.hi != INF:
            raise ValueError("a Relu/Clip on the dequantized model output is not supported")
        q = v.q
        return self.graph.step("output", "dequantize", [q.value], [np.float32(q.scale)], zp=0, zp_in=q.zp)


def multiplier(ratio) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mult, rshift, lshift)`` with ``ratio ~= mult * 2**(lshift - 31 - rshift)``: ratios
    >= 1 are divided by ``2**lshift`` into [0.5, 1) first (int32 arrays, one per ratio)."""
    ratio = np.asarray(ratio, np.float64)
    lshift = np.where(ratio >= 1.0, np.floor(np.log2(np.maximum(ratio, 1.0))) + 1, 0).astype(np.int32)
    mult, rshift = fixed_point(ratio / np.exp2(lshift))
    return mult, rshift, lshift


def bias_int32(bias, scale) -> np.ndarray:
    """A bias in accumulator units: an int32 array or a Weight whose scale is the accumulator's
    as it is, else rescaled and rounded; a float array is rounded to ``bias / scale``."""
    if isinstance(bias, Weight):
        if np.allclose(np.broadcast_to(bias.scale, scale.shape), scale, rtol=1e-6, atol=0) and not np.any(bias.zp):
            return bias.q.astype(np.int32)
        real = (bias.q.astype(np.float64) - bias.zp) * bias.scale
    elif np.issubdtype(np.asarray(bias).dtype, np.integer):  # QLinearConv / QGemm: int32 already
        return np.asarray(bias, np.int32)
    else:
        real = np.asarray(bias, np.float64)
    return np.clip(np.rint(real / scale), -(2**31), 2**31 - 1).astype(np.int32)
