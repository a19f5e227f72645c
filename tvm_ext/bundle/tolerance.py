"""Is a kernel's output right? Checked against a higher-precision reference, never another schedule.

NumPy only: the bundle's runner ships this file and imports nothing of TVM's compiler.

Integer outputs (the int8 networks) must equal their reference exactly; a large reference travels as
its SHA-256 (``digest``).  Float outputs are compared with a float32/float64 reference of the same
kernel at a tolerance that float16 (or float32) *accumulation* over the kernel's reduction length K
explains, and no more.

How the tolerance is derived (``float_tolerance``).  A float16 kernel sums K products in a float16
accumulator, in an order its schedule picks.  Each addition rounds with a relative error
``d_k``, ``|d_k| <= u`` (``u = 2**-11`` for float16, ``2**-24`` for float32); modelling the ``d_k``
as independent and uniform (variance ``u**2 / 3``), the sum's error is ``sum_k d_k S_k`` with ``S_k``
the partial sums.  For random-sign terms of rms ``s``, ``E S_k**2 = k s**2``, so the error's rms is
``u s sqrt(K**2 / 6)`` = ``u sqrt(K / 6)`` times the output's rms ``sqrt(K) s``; for same-sign terms
(a sum of squares) it is ``u sqrt(K) / 3`` of the output: both ``~u sqrt(K / 6)``.  The product, the
dequantize and the output's own rounding add about one ``u`` each (``ROUNDINGS = 4``).  The check
allows ``SIGMAS = 10`` of those rms errors in every element, measured against the reference's rms:
the largest of 51200 Gaussian errors (the lm_head's outputs) is ~4.5 sigma, and a schedule that
splits or factors its sums (``s * (sum x q - 7 sum x)``) carries partial sums up to ~2x the output's
magnitude (seen on the CPU: a factored float32 GEMV at 4.1 sigma over 256 outputs).  For Phi-2's
K = 10240 in float16 an element may be off by 20 % of the outputs' rms: a blocked or tree-shaped sum
(what GPU schedules do) lands far inside, a wrong element (off by ~the rms) or a NaN (never passes)
does not.  Plus ``FAST_MATH = 2**-16`` of the rms: schedules may evaluate exp and tanh with fast
approximations (our CPU rules' exp; nvcc's ``--use_fast_math``), accurate to a few 1e-6: in float32 a
tuned gelu candidate was 5.2e-6 off at K = 256 (87 float32 roundings), which no honest float32 check should
fail; in float16 the term is 1 % of the tolerance.  The old check, any two float16 schedules within
1e-3 of each other, fails honest kernels as soon as K is in the thousands.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np

UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}
SIGMAS = 10.0
ROUNDINGS = 4.0
FAST_MATH = 2.0**-16


def float_tolerance(dtype: str, k: int) -> float:
    """Largest |out - ref| allowed per element, as a fraction of the reference's rms (module doc)."""
    u = UNIT_ROUNDOFF.get(str(dtype))
    if u is None:
        raise ValueError(f"no float tolerance for dtype {dtype!r}")
    return SIGMAS * u * math.sqrt(max(int(k), 1) / 6.0 + ROUNDINGS) + FAST_MATH


def digest(array: np.ndarray) -> str:
    """SHA-256 of an array's bytes in C order, with its dtype and shape (what an exact check compares)."""
    a = np.ascontiguousarray(array)
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def check_output(out: np.ndarray, ref, k: int = 1, dtype: str | None = None) -> tuple[bool, str]:
    """(ok, one line) for an output against its reference: ``ref`` a digest string (exact), an integer
    array (exact) or a float array (``float_tolerance(dtype or out.dtype, k)`` times the reference's rms)."""
    if isinstance(ref, str):
        got = digest(out)
        return got == ref, "exact" if got == ref else f"digest {got[:12]} != expected {ref[:12]}"
    ref = np.asarray(ref)
    if out.shape != ref.shape:
        return False, f"shape {out.shape} != reference {ref.shape}"
    if not np.issubdtype(ref.dtype, np.floating) and not np.issubdtype(out.dtype, np.floating):
        bad = int(np.count_nonzero(out != ref))
        return bad == 0, "exact" if bad == 0 else f"{bad} of {out.size} elements differ"
    o, r = out.astype("float64"), ref.astype("float64")
    if not np.all(np.isfinite(o)):
        return False, f"{int(np.count_nonzero(~np.isfinite(o)))} of {o.size} elements not finite"
    scale = float(np.sqrt(np.mean(r * r))) or 1.0
    err = float(np.max(np.abs(o - r))) / scale if o.size else 0.0
    tol = float_tolerance(dtype or str(out.dtype), k)
    verdict = f"max err {err:.3g} of ref rms (tolerance {tol:.3g}, K={k})"
    return err <= tol, verdict

