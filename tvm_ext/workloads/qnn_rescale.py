"""Exact int32 forms of the fixed-point rescales of the quantized networks (``qnn``).

``q_multiply_shift_per_axis`` multiplies in int64: 8-lane vectors on AVX-512. Where the
operand is known to be small (a residual add's input, uint8 - zp, shifted left by at most
a few bits or by the 16 fractional bits an imported model keeps), the same value comes out
of int32 arithmetic in 16-lane vectors.
"""
from __future__ import annotations

import numpy as np
import tvm


def _shl(x, shift):
    return x * (1 << int(shift)) if shift else x


INT32_RESCALE_MAX_X = 1 << 15  # |x| bound of _qmsa_int32's shifted form
INT32_RESCALE_MIN_U = 10  # least total shift (rshift + 31 - pre) of its unshifted form


def _qmsa_int32(d, mult, rshift, pre: int = 0):
    """``_qmsa(d << pre, mult, 0, rshift)`` in int32 arithmetic, for a residual add's input
    ``d`` = uint8 - zp (|d| <= 255), 0 <= mult < 2**31, rshift >= 0. Exact:

    * ``pre`` <= 7: x = d << pre (|x| < 2**15). With T = rshift + 31 and mult = mh * 2**16
      + ml (0 <= ml < 2**16), floor division by 2**16 and then by 2**(T-16) is floor division
      by 2**T, and x*mh*2**16 and the rounding term 2**(T-1) are multiples of 2**16, so
      (x*mult + 2**(T-1)) >> T equals (x*mh + (x*ml >> 16) + 2**(T-17)) >> (T-16), every term
      within int32. For rshift >= 16 |x*mult| < 2**46 <= 2**(T-1) and the result is 0.
    * ``pre`` > 7 (an imported model's adds keep 16 fractional bits): 2**pre divides both
      x*mult and 2**(T-1), so the result is (d*mult + 2**(U-1)) >> U with U = T - pre, the same
      split at s = min(16, U - 1) bits (per channel); 0 for U >= 40 (|d*mult| < 2**39). Needs
      U >= 10 (``int32_rescale_fits`` checks), so that d*mh stays within int32.

    Why: the int64 form (``q_multiply_shift_per_axis``) runs in 8-lane int64 vectors, this
    in 16-lane int32 ones; a residual task's epilogue has two such rescales per output."""
    i32 = lambda v: tvm.tirx.const(v, "int32")  # noqa: E731
    sr, sl, band, lo, hi = (tvm.tirx.shift_right, tvm.tirx.shift_left, tvm.tirx.bitwise_and,
                            tvm.tirx.min, tvm.tirx.max)
    if pre <= 7:
        x = _shl(d, pre)
        rs = lo(rshift, 16)
        mh, ml = sr(mult, i32(16)), band(mult, i32(0xFFFF))
        inner = x * mh + sr(x * ml, i32(16)) + sl(i32(1), rs + 14)
        return tvm.tirx.Select(rshift >= 16, i32(0), sr(inner, rs + 15))
    u = rshift + (31 - pre)
    uc = lo(u, 40)
    split = lo(uc - 1, 16)
    mh, ml = sr(mult, split), band(mult, sl(i32(1), split) - 1)
    inner = d * mh + sr(d * ml, split) + sl(i32(1), hi(uc - 1 - split, 0))
    return tvm.tirx.Select(u >= 40, i32(0), sr(inner, uc - split))


def int32_rescale_fits(mult, rshift, pre: int) -> bool:
    """Whether :func:`_qmsa_int32` is exact for an add input shifted left by ``pre`` (lshift
    and ``frac_bits``) with these per-channel constants (NumPy arrays)."""
    mult, rshift = np.asarray(mult), np.asarray(rshift)
    if mult.size == 0 or mult.min() < 0 or rshift.min() < 0:
        return False
    return (255 << int(pre)) < INT32_RESCALE_MAX_X if pre <= 7 \
        else int(rshift.min()) + 31 - int(pre) >= INT32_RESCALE_MIN_U


__all__ = ["INT32_RESCALE_MAX_X", "INT32_RESCALE_MIN_U", "int32_rescale_fits"]
