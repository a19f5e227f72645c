"""TE helpers the quantized ops share (``qnn``, ``qnn_float``, ``qnn_ort``): a per-channel
constant at an output index, a constant left shift, and float32 rounding to int32 without
``nearbyint``."""
from __future__ import annotations

import tvm

MAGIC = 12582912.0  # 1.5 * 2**23: x + MAGIC has rint(x) in its low mantissa bits, |x| <= 2**22
MAGIC_BITS = 0x4B400000  # the int32 bits of MAGIC


def _shl(x, shift):
    """``x`` shifted left by a constant ``shift`` (as a multiply; nothing for 0)."""
    return x * (1 << int(shift)) if shift else x


def _per_channel(const, idx, channel_axes):
    """Element of a per-channel constant at output index ``idx``.

    ``const`` has either the output's rank, with extent 1 on every axis but the channel
    axes (e.g. ``(1, 1, 1, C)``), or one axis per channel axis (e.g. ``(C,)``; packed:
    ``(C // cb, cb)`` for ``channel_axes`` (1, 4) of NCHW[cb]c).
    """
    if len(const.shape) == len(idx):
        return const(*(idx[a] if a in channel_axes else 0 for a in range(len(idx))))
    return const(*(idx[a] for a in channel_axes))


def _rint_clipped(x, lo, hi, zp):
    """int32 ``clip(rint(x), lo - zp, hi - zp)`` of float32 ``x``, without its ``+ zp``: clipped
    first (the bounds are integers: the same integers, and |x| small), then rounded half to even
    by the float trick MLAS uses, ``bits(x + 1.5 * 2**23) - bits(1.5 * 2**23)`` (TVM's vectorizer
    does not take ``nearbyint``)."""
    f32 = lambda v: tvm.tirx.const(float(v), "float32")  # noqa: E731
    xc = tvm.tirx.max(tvm.tirx.min(x, f32(int(hi) - int(zp))), f32(int(lo) - int(zp)))
    return tvm.tirx.reinterpret("int32", xc + f32(MAGIC)) - tvm.tirx.const(MAGIC_BITS, "int32")


__all__ = ["MAGIC", "MAGIC_BITS"]
