"""A recorded :class:`~tvm_ext.workloads.qnn.QuantGraph` emitted in the packed VNNI layouts.

The NHWC emission (``QuantGraph.to_relax()``) reads the 4 input channels of a weight
row 16*C_out bytes apart, so the VNNI rule never matches it (issue 6).
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
  constant-scalar block;
* global average pool reduces H and W of NCHW16c and is flattened to ``(N, C)`` in
  channel order; the classifier is the packed dense (weights ``(ceil(N/16), K/4, 16, 4)``):
  its 1000 classes are computed as 1008 (8 zero rows, so that the 16 VNNI lanes tile
  them), requantized, and sliced back to 1000 at the output, in the same fused task.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from tvm import relax, te, tirx

from . import qnn
from .qnn_vnni import OC_BLOCK, channel_block, conv2d_nchwc_acc, dense_acc, pack_conv_weight, pack_dense_weight

NCHWC_SPATIAL = (2, 3)  # H and W of (N, C/cb, H, W, cb)
NCHWC_CHANNELS = (1, 4)  # channel = index[1] * cb + index[4]


@dataclass(frozen=True)
class Packed:
    """A Relax value of the packed emission and its layout.

    ``cb``: the channel block of an NCHW[cb]c tensor, or None for a flat ``(N, C)`` one.
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
        assert c == self.channels and c % self.cb == 0, (const.shape, self.channels, self.cb)
        shape = (c // self.cb, self.cb) if const.ndim == 1 else (1, c // self.cb, 1, 1, self.cb)
        return np.ascontiguousarray(const.reshape(shape))


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


class PackedEmitter:
    """Emits the steps of a QuantGraph on packed tensors (see the module doc)."""

    def input(self, bb, var) -> Packed:
        c = _shape(var)[-1]
        cb = channel_block(c)
        return Packed(bb.emit_te(pack_input, var, cb=cb, primfunc_name_hint="layout_nchwc"), c, cb)

    def step(self, bb, step, args) -> Packed:
        return getattr(self, f"_{step.op}")(bb, *args, *step.consts, **step.attrs)

    def output(self, bb, value: Packed):
        assert not value.cb, "the network ends on a flat tensor"
        if value.width in (None, value.channels):
            return value.var
        return bb.emit(relax.op.strided_slice(value.var, axes=[1], begin=[0], end=[value.channels]))

    # -- one method per op of qnn, same arguments with Packed activations -------------------
    def _conv2d_nhwc(self, bb, x: Packed, w_hwio, *, stride, pad, zp_in) -> Packed:
        weight = pack_conv_weight(w_hwio.transpose(3, 0, 1, 2), x.cb)  # HWIO -> OHWI -> packed
        acc = bb.emit_te(conv2d_nchwc_acc, x.var, relax.const(weight), stride=stride, pad=pad,
                         zp_x=zp_in, primfunc_name_hint="conv2d_nchwc")
        return Packed(acc, int(w_hwio.shape[3]), OC_BLOCK)

    def _requantize(self, bb, acc: Packed, *consts, zp_out) -> Packed:
        consts = [relax.const(acc.per_channel(c)) for c in consts]
        out = bb.emit_te(qnn.requantize, acc.var, *consts, zp_out=zp_out, channel_axes=acc.channel_axes,
                         primfunc_name_hint="requantize")
        return replace(acc, var=out)

    def _add_requantize(self, bb, a: Packed, b: Packed, *consts, **zps) -> Packed:
        assert (a.channels, a.cb) == (b.channels, b.cb)
        consts = [relax.const(a.per_channel(c)) for c in consts]
        out = bb.emit_te(qnn.add_requantize, a.var, b.var, *consts, **zps, channel_axes=a.channel_axes,
                         primfunc_name_hint="add_requantize")
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

    def _dense(self, bb, x: Packed, w_nk) -> Packed:
        assert not x.cb, "dense takes a flat (N, K) tensor"
        # all packed rows, so that the 16 output lanes of VNNI tile the units evenly
        weight = pack_dense_weight(w_nk)
        acc = bb.emit_te(dense_acc, x.var, relax.const(weight), primfunc_name_hint="dense_packed")
        return Packed(acc, int(w_nk.shape[0]), None, weight.shape[0] * OC_BLOCK)


def to_relax(graph: qnn.QuantGraph, fused: bool = True):
    """``graph`` as a Relax module in the packed layouts (same ``main`` signature)."""
    return graph.to_relax(fused=fused, emitter=PackedEmitter())


__all__ = ["Packed", "PackedEmitter", "pack_input", "to_relax"]
