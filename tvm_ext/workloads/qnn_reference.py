"""Exact NumPy integer reference of the quantized ops in :mod:`tvm_ext.workloads.qnn`.

Every function has the same signature as its TE twin in ``qnn`` (activations first,
then constant arrays, then keyword attributes), so a graph can be run through either.
Convolutions and dense layers accumulate in float64 through BLAS: all products and
partial sums are integers below 2**53, so the result is exact and fast.
"""
from __future__ import annotations

import numpy as np

Q = 31  # fractional bits of the fixed-point multipliers (the seed's ``31``)


def q_multiply_shift_per_axis(x, mult, lshift, rshift, q=Q, lshift_required=False):
    """``tirx.q_multiply_shift_per_axis`` as TVM lowers it (src/target/intrin_rule.cc).

    int64: optional ``x << lshift``, times ``mult``, plus ``1 << (rshift + q - 1)``,
    arithmetic shift right by ``rshift + q``, truncated back to int32.
    Parameters broadcast against the last axis of ``x``.
    """
    x = np.asarray(x).astype(np.int64)
    if lshift_required:
        x = x << np.asarray(lshift, np.int64)
    total = np.asarray(rshift, np.int64) + q
    x = x * np.asarray(mult, np.int64)
    x = (x + (np.int64(1) << (total - 1))) >> total
    return x.astype(np.int32)


def _pair(value):
    return (int(value),) * 2 if np.ndim(value) == 0 else tuple(int(v) for v in value)


def _pad(x, pad, value):
    top, left, bottom, right = (int(pad),) * 4 if np.ndim(pad) == 0 else pad
    widths = [(0, 0), (top, bottom), (left, right), (0, 0)]
    return np.pad(x, widths, mode="constant", constant_values=value)


def conv2d_nhwc(data, weight, *, stride=1, pad=0, zp_in=0, groups=1):
    """Raw int32 accumulator of uint8 NHWC data x int8 HWIO weights; pads with ``zp_in``.

    ``stride``: int or (h, w); ``pad``: int or (top, left, bottom, right); ``groups``:
    weights ``(KH, KW, C_in / groups, C_out)``."""
    kh, kw, cin, cout = weight.shape
    x = _pad(data, pad, zp_in)
    if groups != 1:
        per = cout // groups
        return np.concatenate([conv2d_nhwc(x[..., g * cin:(g + 1) * cin], weight[..., g * per:(g + 1) * per],
                                           stride=stride) for g in range(groups)], axis=-1)
    (sh, sw), (n, hp, wp, _) = _pair(stride), x.shape
    ho, wo = (hp - kh) // sh + 1, (wp - kw) // sw + 1
    w = weight.astype(np.float64).reshape(kh * kw * cin, cout)
    out = np.empty((n, ho, wo, cout), np.int32)
    for b in range(n):  # im2col one image at a time: one BLAS call, bounded memory
        taps = [
            x[b, i : i + sh * ho : sh, j : j + sw * wo : sw, :]
            for i in range(kh)
            for j in range(kw)
        ]
        cols = np.concatenate(taps, axis=-1).reshape(ho * wo, kh * kw * cin)
        out[b] = (cols.astype(np.float64) @ w).reshape(ho, wo, cout)
    return out


def dense(data, weight):
    """Raw int32 accumulator of uint8 [N, K] data x int8 [units, K] weights."""
    return (data.astype(np.float64) @ weight.astype(np.float64).T).astype(np.int32)


def requantize(acc, zp_corr, bias, mult, lshift, rshift, *, zp_out, lo=0, hi=255, left=0):
    """The seed's epilogue: ``clip(qmsa(acc - zp_corr + bias) + zp_out, lo, hi)`` as uint8.

    Matches what TVM's compiled epilogue does where int32 overflows (measured in
    tests/test_workloads_int8.py): ``acc - zp_corr + bias`` wraps in int32 before the
    multiply, but ``+ zp_out`` followed by the clip saturates (LLVM folds the clip
    into the signed add), so it is done here in int64.
    """
    x = np.asarray(acc).astype(np.int32) - np.asarray(zp_corr, np.int32) + np.asarray(bias, np.int32)
    y = q_multiply_shift_per_axis(x, mult, lshift, rshift, lshift_required=bool(left)).astype(np.int64) + int(zp_out)
    return np.clip(y, lo, hi).astype(np.uint8)


def add_requantize(a, b, mult_a, rshift_a, mult_b, rshift_b, *, zp_a, zp_b, zp_out, lo=0, hi=255):
    """Residual add of two uint8 tensors, each requantized to the output scale."""
    ra = q_multiply_shift_per_axis(a.astype(np.int32) - np.int32(zp_a), mult_a, 0, rshift_a)
    rb = q_multiply_shift_per_axis(b.astype(np.int32) - np.int32(zp_b), mult_b, 0, rshift_b)
    return np.clip(ra + rb + np.int32(zp_out), lo, hi).astype(np.uint8)


def fma32(a, b, c) -> np.ndarray:
    """float32 ``fma(a, b, c)`` of float32 operands: the product of a value of at most 9
    significant bits and a float32 is exact in float64, and so is its sum with a float32 of
    a nearby exponent (within 53 bits: scale ratios down to ~2**-20), so one rounding to
    float32 is the FMA's."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(np.float32)


def qlinear_add(a, b, ratio_a, ratio_b, fixed, *, lo=0, hi=255, shift=0):
    """ONNX Runtime's residual add (``qnn_ort``): ``clip(rint(fma(a', r_a, fma(b', r_b, F))) + shift,
    lo, hi)`` with ``x' = x - shift``, constants per channel on the last axis."""
    fa, fb = ((x.astype(np.int32) - shift).astype(np.float32) for x in (a, b))
    x = fma32(fa, ratio_a, fma32(fb, ratio_b, fixed))
    return (np.clip(np.rint(x), lo - shift, hi - shift) + shift).astype(np.uint8)


def max_pool2d(data, *, size=3, stride=2, pad=1):
    """Max pool over H and W of uint8 NHWC data, padding with 0 (the uint8 minimum)."""
    (kh, kw), (sh, sw) = _pair(size), _pair(stride)
    x = _pad(data, pad, 0)
    n, hp, wp, c = x.shape
    ho, wo = (hp - kh) // sh + 1, (wp - kw) // sw + 1
    out = np.zeros((n, ho, wo, c), data.dtype)
    for i in range(kh):
        for j in range(kw):
            patch = x[:, i : i + sh * ho : sh, j : j + sw * wo : sw, :]
            out = np.maximum(out, patch)
    return out


def global_avg_pool(data):
    """Mean over H and W of uint8 NHWC data, rounded half up: ``(sum + hw/2) // hw``."""
    n, h, w, c = data.shape
    total = data.astype(np.int32).sum(axis=(1, 2))
    return ((total + (h * w) // 2) // (h * w)).astype(np.uint8)


def rescale(x, mult, rshift, *, zp_in, zp_out, lo=0, hi=255, lshift=0):
    """uint8 to another scale: ``clip(qmsa((x - zp_in) << lshift) + zp_out, lo, hi)``."""
    r = q_multiply_shift_per_axis((x.astype(np.int32) - np.int32(zp_in)) << lshift, mult, 0, rshift)
    return np.clip(r.astype(np.int64) + zp_out, lo, hi).astype(np.uint8)


def quantize(data, scale, *, zp_out, lo=0, hi=255):
    """float32 (NCHW, or 2-d) -> uint8 (NHWC): ``clip(round_half_even(x / scale) + zp_out, lo, hi)``."""
    x = data.transpose(0, 2, 3, 1) if data.ndim == 4 else data
    q = np.rint(x.astype(np.float32) / np.float32(scale).reshape(())) + np.float32(zp_out)
    return np.clip(q, lo, hi).astype(np.uint8)


def dequantize(data, scale, *, zp_in):
    """uint8 (NHWC, or 2-d) -> float32 (NCHW): ``(x - zp_in) * scale``."""
    x = data.transpose(0, 3, 1, 2) if data.ndim == 4 else data
    return (x.astype(np.int32) - np.int32(zp_in)).astype(np.float32) * np.float32(scale).reshape(())


def flatten(data):
    """NHWC -> ``(N, C*H*W)`` in NCHW order."""
    return np.ascontiguousarray(data.transpose(0, 3, 1, 2)).reshape(data.shape[0], -1)


def concat(*data, axis):
    """Concatenation along ``axis``."""
    return np.concatenate(data, axis=axis)


def clip_fraction(x):
    """Fraction of uint8 values at the ends of the range (0 or 255)."""
    x = np.asarray(x)
    return float(np.count_nonzero((x == 0) | (x == 255))) / max(x.size, 1)
