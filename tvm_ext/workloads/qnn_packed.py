"""A recorded :class:`~tvm_ext.workloads.qnn.QuantGraph` emitted in the packed VNNI layouts.

The NHWC emission (``QuantGraph.to_relax()``) reads the 4 input channels of a weight
row 16*C_out bytes apart, so the VNNI rule never matches it.
:class:`PackedEmitter` emits the *same* graph -- same steps, weights and quantization
parameters, hence the same NumPy reference, bit for bit -- in the layouts of
:mod:`tvm_ext.workloads.qnn_vnni`:

* the NHWC uint8 input is transformed inside the module to NCHW[cb]c, channels padded
  with zeros to a multiple of cb (the stem's 3 -> 4, ``cb`` 4; 16 everywhere else);
* convolutions take NCHW[cb]c activations and OIHW[cb/4]i16o4i weights, packed once in
  NumPy when the module is built and bound as Relax constants (padded input channels
  get zero weights, so they add nothing); they produce NCHW16c;
* requantize, residual add_requantize and max pool are the NHWC ops of
  :mod:`~tvm_ext.workloads.qnn`, told where H, W and the channel axes are, with the
  per-channel constants reshaped to the packed channel axes (``(C/16, 16)``,
  ``(1, C/16, 1, 1, 16)``), so FuseOps + FuseTIR still fold each requantize (and a
  residual add) into its conv, and the output zero point still comes from a
  constant-scalar block; for a ``qnn_float.FloatQuantGraph`` (``resnet50-int8-nchwc``,
  ``resnet50-int8-amx``) requantize and residual adds are ``qnn_float``'s float32 ops
  instead, the same NumPy reference as that graph's;
* global average pool reduces H and W of NCHW16c and is flattened to ``(N, C)`` in
  channel order; the classifier is the packed dense (weights ``(ceil(N/16), K/4, 16, 4)``):
  its 1000 classes are computed as 1008 (8 zero rows, so that the 16 VNNI lanes tile
  them), requantized, and sliced back to 1000 at the output, in the same fused task.

Imported ONNX models (``tvm_ext.frontend.onnx_int8``, ``layout="nchwc"``) bring more: a float
NCHW input quantized and then packed, a dequantized float output, asymmetric pads and strides,
depthwise convs (``depthwise_nchwc_acc``, no dot product to tensorize), a flatten of the pooled
1x1 map, and channel counts that 16 does not divide (the last block zero-padded, with zero
weights and constants, so padded channels never reach a real one). Convs and denses whose weights
pass ``pairs_fit_int16`` are annotated for the ``vpmaddubsw`` form of the AVX2 intrinsic; the
others get its exact ``vpmaddwd`` form. Steps it cannot lay out (grouped convs that are not
depthwise, concat, rescale) are refused with one line.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from tvm import relax, te, tirx

from . import qnn, qnn_float, qnn_ort
from .qnn_vnni import (OC_BLOCK, channel_block, conv2d_nchwc_acc, dense_acc, depthwise_nchwc_acc, pack_conv_weight,
                       pack_dense_weight, pack_depthwise_weight, pairs_fit_int16)

NCHWC_SPATIAL = (2, 3)  # H and W of (N, C/cb, H, W, cb)
NCHWC_CHANNELS = (1, 4)  # channel = index[1] * cb + index[4]


@dataclass(frozen=True)
class Packed:
    """A Relax value of the packed emission and its layout.

    ``cb``: the channel block of an NCHW[cb]c tensor, or None for a flat ``(N, C)`` one;
    ``channels`` the graph's, the tensor's rounded up to whole blocks (weights of the padded
    channels are zero, so they never reach a real channel).
    ``width``: the flat tensor's last extent, ``channels`` rounded up to 16 after a
    packed dense (the padding rows are dropped at the output).
    """

    var: relax.Expr
    channels: int
    cb: int | None
    width: int | None = None

    @property
    def channel_axes(self):
        return NCHWC_CHANNELS if self.cb else None

    def per_channel(self, const: np.ndarray) -> np.ndarray:
        """A per-channel constant of the NHWC graph (``(C,)`` or ``(1, ..., 1, C)``)
        reshaped to this value's channel axes."""
        c = const.shape[-1]
        if not self.cb:
            pad = (self.width or c) - c
            return np.pad(const, [(0, 0)] * (const.ndim - 1) + [(0, pad)]) if pad else const
        assert c == self.channels, (const.shape, self.channels, self.cb)
        padded = self.blocks * self.cb  # padded channels get 0: their (unused) outputs are zp_out
        if padded != c:
            const = np.pad(const, [(0, 0)] * (const.ndim - 1) + [(0, padded - c)])
        shape = (self.blocks, self.cb) if const.ndim == 1 else (1, self.blocks, 1, 1, self.cb)
        return np.ascontiguousarray(const.reshape(shape))

    @property
    def blocks(self) -> int:
        """Channel blocks of an NCHW[cb]c tensor (the last one zero-padded when ``cb`` does
        not divide ``channels``)."""
        return -(-self.channels // self.cb)


def _pad_last(a: np.ndarray, size: int) -> np.ndarray:
    """``a`` zero-padded along its last axis to ``size``."""
    pad = size - a.shape[-1]
    return np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, pad)]) if pad else a


def _shape(var) -> list[int]:
    return [int(d) for d in var.ty.shape.values]


def pack_input(data: te.Tensor, *, cb: int) -> te.Tensor:
    """NHWC -> NCHW[cb]c inside the module; channels beyond C are 0."""
    n, h, w, c = (int(d) for d in data.shape)

    def _body(b, co, y, x, ci):
        ch = co * cb + ci
        if c % cb == 0:
            return data[b, y, x, ch]
        return tirx.if_then_else(ch < c, data[b, y, x, tirx.min(ch, c - 1)], tirx.const(0, data.dtype))

    return te.compute((n, -(-c // cb), h, w, cb), _body, name="layout_nchwc")


@dataclass(frozen=True)
class Deferred:
    """A requantize step not emitted: its int32 accumulator (``Packed``), constants and
    attributes, for the residual add that is its only use (``PackedEmitter.plan``)."""

    acc: "Packed"
    consts: tuple
    attrs: dict


class PackedEmitter:
    """Emits the steps of a QuantGraph on packed tensors (see the module doc)."""

    def __init__(self, float_epilogues: bool = False):
        self.float_epilogues = float_epilogues  # requantize and residual adds in float32 (qnn_float)

    @classmethod
    def for_graph(cls, graph, **kwargs):
        """The emitter whose arithmetic is ``graph``'s reference: float32 epilogues for a
        ``qnn_float.FloatQuantGraph``, the fixed point otherwise."""
        return cls(**kwargs, float_epilogues=isinstance(graph, qnn_float.FloatQuantGraph))

    def input(self, bb, var) -> Packed:
        """A uint8 NHWC input is packed here; a float input (an imported model's) is kept
        for its ``quantize`` step."""
        shape = _shape(var)
        if str(var.ty.dtype) != "uint8":
            return Packed(var, shape[1] if len(shape) == 4 else shape[-1], None)
        cb = channel_block(shape[-1])
        return Packed(bb.emit_te(pack_input, var, cb=cb, primfunc_name_hint="layout_nchwc"), shape[-1], cb)

    fold_requantize = False  # see ``plan``
    _fold = frozenset()  # ids of the requantize steps ``step`` defers

    def plan(self, steps, n_inputs: int) -> None:
        """With ``fold_requantize``: note the requantize steps whose only use is a residual
        add's first input; ``step`` defers them (``Deferred``) and the add computes them in
        int32 (``qnn.requantize_add_requantize``: same values, no uint8 round trip)."""
        if not self.fold_requantize:
            return
        uses = {}
        for st in steps:
            for pos, v in enumerate(st.inputs):
                uses.setdefault(v, []).append((st.op, pos))
        self._fold = frozenset(id(st) for i, st in enumerate(steps)
                               if st.op == "requantize" and uses.get(n_inputs + i) == [("add_requantize", 0)])

    def step(self, bb, step, args) -> Packed:
        if id(step) in self._fold:
            return Deferred(args[0], step.consts, step.attrs)
        method = getattr(self, f"_{step.op}", None)
        if method is None:
            raise ValueError(f"layout nchwc does not take {step.op} steps ({step.name}) yet; use layout nhwc")
        return method(bb, *args, *step.consts, **step.attrs)

    def output(self, bb, value: Packed):
        if value.cb:
            raise ValueError("layout nchwc needs a network that ends on a flat (N, C) tensor; use layout nhwc")
        if value.width in (None, value.channels):
            return value.var
        return bb.emit(relax.op.strided_slice(value.var, axes=[1], begin=[0], end=[value.channels]))

    # -- one method per op of qnn, same arguments with Packed activations -------------------
    def _quantize(self, bb, x: Packed, scale, **attrs) -> Packed:
        """float NCHW (an imported model's input) -> uint8 NHWC (qnn.quantize) -> NCHW[cb]c."""
        q = bb.emit_te(qnn.quantize, x.var, relax.const(scale), **attrs, primfunc_name_hint="quantize")
        return self.input(bb, q) if len(_shape(q)) == 4 else Packed(q, x.channels, None)

    def _conv2d_nhwc(self, bb, x: Packed, w_hwio, *, stride, pad, zp_in, groups=1) -> Packed:
        *_, cin, cout = w_hwio.shape
        if groups != 1:
            if not (groups == cout == x.channels and cin == 1):
                raise ValueError(f"layout nchwc takes depthwise convs (groups = channels), not groups={groups} "
                                 f"with {x.channels} -> {cout} channels; use layout nhwc")
            weight = pack_depthwise_weight(_pad_last(w_hwio, x.blocks * x.cb), x.cb)
            acc = bb.emit_te(depthwise_nchwc_acc, x.var, relax.const(weight), stride=stride, pad=pad, zp_x=zp_in,
                             primfunc_name_hint="depthwise_nchwc")
            return Packed(acc, cout, x.cb)
        # output channels padded to whole 16-lane blocks with zero weights
        weight = pack_conv_weight(_pad_last(w_hwio, -(-cout // OC_BLOCK) * OC_BLOCK).transpose(3, 0, 1, 2), x.cb)
        acc = bb.emit_te(conv2d_nchwc_acc, x.var, relax.const(weight), stride=stride, pad=pad,
                         zp_x=zp_in, pairs_fit=pairs_fit_int16(weight), primfunc_name_hint="conv2d_nchwc")
        return Packed(acc, int(cout), OC_BLOCK)

    def _requantize_form(self, consts, attrs):
        """(TE op, constants, attributes) of a requantize step in this emitter's arithmetic:
        the graph's fixed point, or with ``float_epilogues`` ``qnn_float``'s (its constants
        derived from the fixed-point ones)."""
        if not self.float_epilogues:
            return qnn.requantize, consts, attrs
        attrs = dict(attrs)
        return qnn_float.requantize_f32, qnn_float.requantize_consts(*consts, attrs.pop("left", 0)), attrs

    def _requantize(self, bb, acc: Packed, *consts, **attrs) -> Packed:
        op, consts, attrs = self._requantize_form(consts, attrs)
        out = bb.emit_te(op, acc.var, *(relax.const(acc.per_channel(c)) for c in consts), **attrs,
                         channel_axes=acc.channel_axes, primfunc_name_hint="requantize")
        return replace(acc, var=out)

    def _add_requantize(self, bb, a, b: Packed, *consts, **zps) -> Packed:
        acc = a.acc if isinstance(a, Deferred) else a
        assert (acc.channels, acc.cb) == (b.channels, b.cb)
        if self.float_epilogues:
            consts = qnn_float.add_consts(*consts)
            add, fused = qnn_float.add_requantize_f32, qnn_float.requantize_add_requantize_f32
        else:
            add, fused = qnn.add_requantize, qnn.requantize_add_requantize
        consts = [relax.const(acc.per_channel(c)) for c in consts]
        if isinstance(a, Deferred):  # the requantize computed here, kept in int32
            _, req, req_attrs = self._requantize_form(a.consts, a.attrs)
            req = [relax.const(acc.per_channel(c)) for c in req]
            req_attrs = {("zp_req" if k == "zp_out" else f"{k}_req"): v for k, v in req_attrs.items()}
            out = bb.emit_te(fused, acc.var, *req, b.var, *consts, **req_attrs, **zps,
                             channel_axes=acc.channel_axes, primfunc_name_hint="requantize_add_requantize")
        else:
            out = bb.emit_te(add, a.var, b.var, *consts, **zps, channel_axes=a.channel_axes,
                             primfunc_name_hint="add_requantize")
        return replace(acc, var=out)

    def _qlinear_add(self, bb, a: Packed, b: Packed, *consts, **attrs) -> Packed:
        """An imported model's add, as ONNX Runtime computes it (``qnn_ort``), on packed tensors."""
        assert (a.channels, a.cb) == (b.channels, b.cb)
        out = bb.emit_te(qnn_ort.qlinear_add, a.var, b.var, *(relax.const(a.per_channel(c)) for c in consts),
                         **attrs, channel_axes=a.channel_axes, primfunc_name_hint="qlinear_add")
        return replace(a, var=out)

    def _max_pool2d(self, bb, x: Packed, **attrs) -> Packed:
        out = bb.emit_te(qnn.max_pool2d, x.var, **attrs, spatial=NCHWC_SPATIAL, primfunc_name_hint="max_pool2d")
        return replace(x, var=out)

    def _global_avg_pool(self, bb, x: Packed) -> Packed:
        pooled = bb.emit_te(qnn.global_avg_pool, x.var, spatial=NCHWC_SPATIAL,
                            primfunc_name_hint="global_avg_pool")  # (N, C/cb, cb)
        n, blocks, cb = _shape(pooled)
        assert blocks * cb == x.channels, "padded channels would be flattened into the classifier"
        return Packed(bb.emit(relax.op.reshape(pooled, (n, x.channels))), x.channels, None)

    def _flatten(self, bb, x: Packed) -> Packed:
        """NCHW-order flatten of a 1x1 map (after a global pool): the channel order of
        NCHW[cb]c is already C's; padded channels are kept as the flat tensor's ``width``."""
        n, blocks, h, w, cb = _shape(x.var)
        if (h, w) != (1, 1):
            raise ValueError(f"layout nchwc flattens 1x1 maps only, not {h}x{w}; use layout nhwc")
        return Packed(bb.emit(relax.op.reshape(x.var, (n, blocks * cb))), x.channels, None, blocks * cb)

    def _dense(self, bb, x: Packed, w_nk) -> Packed:
        assert not x.cb, "dense takes a flat (N, K) tensor"
        # all packed rows, so that the 16 output lanes of VNNI tile the units evenly; inputs
        # padded by a flatten of padded channels get zero weights
        weight = pack_dense_weight(_pad_last(w_nk, x.width or w_nk.shape[1]))
        acc = bb.emit_te(dense_acc, x.var, relax.const(weight), pairs_fit=pairs_fit_int16(weight),
                         primfunc_name_hint="dense_packed")
        return Packed(acc, int(w_nk.shape[0]), None, weight.shape[0] * OC_BLOCK)

    def _dequantize(self, bb, x: Packed, scale, **attrs) -> Packed:
        """uint8 (N, width) -> float32 (padded classes are sliced off by ``output``)."""
        if x.cb:
            raise ValueError("layout nchwc dequantizes flat (N, C) outputs only; use layout nhwc")
        return replace(x, var=bb.emit_te(qnn.dequantize, x.var, relax.const(scale), **attrs,
                                         primfunc_name_hint="dequantize"))


def to_relax(graph: qnn.QuantGraph, fused: bool = True):
    """``graph`` as a Relax module in the packed layouts (same ``main`` signature); a
    ``qnn_float.FloatQuantGraph`` gets float32 epilogues (``PackedEmitter.for_graph``)."""
    return graph.to_relax(fused=fused, emitter=PackedEmitter.for_graph(graph))


__all__ = ["Packed", "PackedEmitter", "pack_input", "to_relax"]
