"""float32 requantize epilogues: ONNX QLinearConv / QLinearAdd arithmetic, exact in NumPy.

The seed's epilogues (``qnn.requantize``, ``qnn.add_requantize``) rescale in fixed point:
``q_multiply_shift`` multiplies in int64, 8 lanes per AVX-512 vector, and the residual add
does it twice more. On the AMX layout, where the convolution itself got cheap, that
arithmetic is most of a residual task (measured on the tuned 56x56x64->256 + add task:
234 us, 64 us with the epilogue reduced to a cast). ONNX's QLinearConv defines the same
step in float: ``saturate(round_half_even(acc * scale) + zp)``, which is what ONNX Runtime
computes. This module is that form, 16 lanes per vector:

* requantize: ``x = float32(acc - zp_corr + bias) * scale`` (``scale`` the fixed-point
  multiplier's value, ``mult * 2**(lshift - 31 - rshift)``, rounded to float32), clipped to
  ``[lo - zp, hi - zp]`` and rounded half to even, ``+ zp``;
* residual add: ``float32(a - zp_a) * scale_a + float32(b - zp_b) * scale_b``, clipped and
  rounded the same way. ``scale_a`` and ``scale_b`` keep 15 significant bits, so each product
  (|a - zp_a| <= 255: 8 bits) is exact in float32: the sum is rounded once, whether or not
  LLVM contracts it into an FMA, and NumPy gets the same bits.

Rounding is the float trick ONNX Runtime's MLAS uses: for |x| <= 2**22, the bits of
``x + 1.5 * 2**23`` minus those of ``1.5 * 2**23`` are ``rint(x)`` (TVM's vectorizer does not
take ``nearbyint``; this is one add and one integer subtract). Clipping before rounding
gives the same integers as clipping after (the bounds are integers) and keeps |x| small.

The graph's constants stay the fixed-point ones (``QuantGraph`` records, ``onnx_export``
exports them); ``requantize_consts`` and ``add_consts`` derive the float ones, and
``FloatQuantGraph`` runs a recorded graph with this module's NumPy twins.
"""
from __future__ import annotations

import numpy as np
from tvm import te

from . import qnn_reference as ref
from .qnn import QuantGraph, const_scalar
from .qnn_te import _per_channel, _rint_clipped

ADD_SCALE_BITS = 15  # significant bits of a residual add's scales: 15 + 8 <= float32's 24


# ----------------------------------------------------------------------------- constants
def requantize_consts(zp_corr, bias, mult, lshift, rshift, left=0) -> tuple[np.ndarray, np.ndarray]:
    """(int32 offset ``bias - zp_corr``, float32 scale) of a fixed-point requantize's
    constants: the offset wraps in int32 as ``acc - zp_corr + bias`` does."""
    offset = np.asarray(bias).astype(np.int32) - np.asarray(zp_corr).astype(np.int32)
    exponent = (np.asarray(lshift, np.int64) if left else 0) - 31 - np.asarray(rshift, np.int64)
    return offset, (np.asarray(mult, np.float64) * np.exp2(exponent)).astype(np.float32)


def add_scale(mult, rshift) -> np.ndarray:
    """A residual add input's scale ``mult * 2**(-31 - rshift)`` rounded to ``ADD_SCALE_BITS``
    significant bits, as float32."""
    frac, exp = np.frexp(np.asarray(mult, np.float64) * np.exp2(-31 - np.asarray(rshift, np.int64)))
    return np.ldexp(np.round(frac * 2.0**ADD_SCALE_BITS), exp - ADD_SCALE_BITS).astype(np.float32)


def add_consts(mult_a, rshift_a, mult_b, rshift_b):
    """(scale_a, scale_b) of a fixed-point residual add's constants."""
    return add_scale(mult_a, rshift_a), add_scale(mult_b, rshift_b)


# ----------------------------------------------------------------------------- TE
def _requantized(acc, idx, at, offset, scale, zp, lo, hi):
    """``requantize_f32``'s value at ``idx`` minus its zero point: int32 in [lo - zp, hi - zp]."""
    return _rint_clipped((acc(*idx) + at(offset)).astype("float32") * at(scale), lo, hi, zp)


def _added(da, db, at, scale_a, scale_b, zp_out, lo, hi):
    x = da.astype("float32") * at(scale_a) + db.astype("float32") * at(scale_b)
    return (_rint_clipped(x, lo, hi, zp_out) + const_scalar(zp_out)[()]).astype("uint8")


def _at(idx, axes):
    return lambda c: _per_channel(c, idx, axes)


def requantize_f32(acc, offset, scale, *, zp_out, lo=0, hi=255, channel_axes=None):
    """uint8 ``clip(rint(float32(acc + offset) * scale) + zp_out, lo, hi)``; constants and
    ``channel_axes`` as in ``qnn.requantize`` (``offset`` shaped like its ``bias``, ``scale``
    like its ``mult``)."""
    axes = channel_axes or (len(acc.shape) - 1,)

    def _body(*idx):
        r = _requantized(acc, idx, _at(idx, axes), offset, scale, zp_out, lo, hi)
        return (r + const_scalar(zp_out)[()]).astype("uint8")

    return te.compute(acc.shape, _body, name="T_cast")


def add_requantize_f32(a, b, scale_a, scale_b, *, zp_a, zp_b, zp_out, lo=0, hi=255, channel_axes=None):
    """Residual add of two uint8 tensors in float32 (see the module doc)."""
    axes = channel_axes or (len(a.shape) - 1,)

    def _body(*idx):
        da, db = a(*idx).astype("int32") - int(zp_a), b(*idx).astype("int32") - int(zp_b)
        return _added(da, db, _at(idx, axes), scale_a, scale_b, zp_out, lo, hi)

    return te.compute(a.shape, _body, name="T_add")


def requantize_add_requantize_f32(acc, offset, scale, b, scale_a, scale_b, *, zp_req, lo_req=0, hi_req=255,
                                  zp_a, zp_b, zp_out, lo=0, hi=255, channel_axes=None):
    """``add_requantize_f32`` whose input ``a`` is ``requantize_f32`` of ``acc`` (zero point
    and bounds ``zp_req``, ``lo_req``, ``hi_req``), kept in int32: ``a - zp_a`` is the rounded
    value plus ``zp_req - zp_a``, the same numbers as the two steps."""
    axes = channel_axes or (len(acc.shape) - 1,)

    def _body(*idx):
        at = _at(idx, axes)
        da = _requantized(acc, idx, at, offset, scale, zp_req, lo_req, hi_req) + const_scalar(zp_req)[()] - int(zp_a)
        db = b(*idx).astype("int32") - int(zp_b)
        return _added(da, db, at, scale_a, scale_b, zp_out, lo, hi)

    return te.compute(acc.shape, _body, name="T_add")


# ----------------------------------------------------------------------------- NumPy twins
def _rint_clipped_np(x, lo, hi, zp):
    return np.rint(np.clip(x, np.float32(int(lo) - int(zp)), np.float32(int(hi) - int(zp)))).astype(np.int32)


def requantize(acc, zp_corr, bias, mult, lshift, rshift, *, zp_out, lo=0, hi=255, left=0):
    """``qnn_reference.requantize``'s signature, float32 arithmetic (``requantize_f32``)."""
    offset, scale = requantize_consts(zp_corr, bias, mult, lshift, rshift, left)
    x = (np.asarray(acc).astype(np.int32) + offset).astype(np.float32) * scale
    return (_rint_clipped_np(x, lo, hi, zp_out) + int(zp_out)).astype(np.uint8)


def add_requantize(a, b, mult_a, rshift_a, mult_b, rshift_b, *, zp_a, zp_b, zp_out, lo=0, hi=255):
    """``qnn_reference.add_requantize``'s signature, float32 arithmetic (``add_requantize_f32``)."""
    sa, sb = add_consts(mult_a, rshift_a, mult_b, rshift_b)
    fa = (a.astype(np.int32) - np.int32(zp_a)).astype(np.float32) * sa
    fb = (b.astype(np.int32) - np.int32(zp_b)).astype(np.float32) * sb
    return (_rint_clipped_np(fa + fb, lo, hi, zp_out) + int(zp_out)).astype(np.uint8)


class _Reference:
    """``qnn_reference`` with this module's requantize and add_requantize."""

    requantize = staticmethod(requantize)
    add_requantize = staticmethod(add_requantize)

    def __getattr__(self, name):
        return getattr(ref, name)


class FloatQuantGraph(QuantGraph):
    """A recorded ``QuantGraph`` (same steps, weights and constants) whose requantize and
    residual add steps compute in float32: its NumPy reference (see the module doc)."""

    reference = _Reference()

    @classmethod
    def of(cls, graph: QuantGraph) -> "FloatQuantGraph":
        """The float-epilogue view of ``graph`` (sharing its steps)."""
        view = cls.__new__(cls)
        view.__dict__.update(graph.__dict__)
        return view


__all__ = ["FloatQuantGraph", "add_consts", "add_requantize_f32", "add_scale", "requantize_add_requantize_f32",
           "requantize_consts", "requantize_f32"]
