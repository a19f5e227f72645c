"""Random NumPy arguments for a PrimFunc: one array per parameter, in parameter order.

Every checker and benchmark that runs a PrimFunc on made-up data draws it here, so
the choice of values (small integers that keep sums of products far from overflow,
floats in [-1, 1]) is made once.

random_arrays(func, rng, ranges=None, *, int_range=None, float_range=(-1.0, 1.0))
    -> list[np.ndarray]

Integers are drawn uniformly from an inclusive range, chosen in this order:
  1. ``ranges[param name]``  (e.g. requantize multipliers and shifts in their valid range)
  2. ``ranges[dtype]``       (e.g. ``{"uint32": (0, 2**31 - 1)}`` for packed 4-bit words)
  3. ``int_range``           (one range for every integer dtype)
  4. the defaults below: uint8/uint16 [0, 255], wider unsigned [0, 15], signed [-8, 8],
     bool {0, 1}
and always clipped to what the dtype can hold.  Floats are uniform in ``float_range``.
Output parameters get random values too; a function overwrites them.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

# small defaults: a k=4608 dot product of uint8 x int8 stays far below 2**31
_UNSIGNED_SMALL = (0, 255)
_UNSIGNED_WIDE = (0, 15)
_SIGNED = (-8, 8)


def _default_range(dtype: str) -> tuple:
    if dtype == "bool":
        return (0, 1)
    if dtype.startswith("uint"):
        return _UNSIGNED_SMALL if dtype in ("uint8", "uint16") else _UNSIGNED_WIDE
    return _SIGNED


def param_buffers(func) -> list:
    """(parameter name, dtype, shape) for every parameter of ``func``.

    TVM 0.27 parameters are buffer-typed Vars (no ``buffer_map``); a scalar parameter
    has no buffer type and is a ValueError: there is no array to draw for it."""
    out = []
    for p in func.params:
        try:
            dtype, shape = str(p.dtype), [int(s) for s in p.shape]
        except AttributeError:
            raise ValueError(f"parameter {str(p.name)!r} is a scalar, not a buffer") from None
        out.append((str(p.name), dtype, shape))
    return out


def random_arrays(func, rng, ranges: Optional[dict] = None, *, int_range: Optional[tuple] = None,
                  float_range: tuple = (-1.0, 1.0)) -> list:
    """One random array per parameter of ``func`` (see the module docstring).

    ``rng``: a ``np.random.Generator`` or an int seed."""
    rng = np.random.default_rng(rng)
    ranges = ranges or {}
    arrays = []
    for name, dtype, shape in param_buffers(func):
        if dtype.startswith(("int", "uint")) or dtype == "bool":
            lo, hi = ranges.get(name) or ranges.get(dtype) or int_range or _default_range(dtype)
            if dtype != "bool":
                info = np.iinfo(dtype)
                lo, hi = max(int(lo), int(info.min)), min(int(hi), int(info.max), 2**63 - 1)
            if lo > hi:
                raise ValueError(f"{name}: empty range [{lo}, {hi}] for {dtype}")
            arrays.append(rng.integers(lo, hi, size=shape, endpoint=True, dtype="int64").astype(dtype))
        elif dtype.startswith("float"):
            lo, hi = ranges.get(name) or ranges.get(dtype) or float_range
            arrays.append(rng.uniform(lo, hi, size=shape).astype(dtype))
        else:
            raise ValueError(f"{name}: no random values for dtype {dtype}")
    return arrays


__all__ = ["param_buffers", "random_arrays"]
