"""A kernel's inputs made from a seed, the same bits on every machine and NumPy version.

NumPy only: the bundle's runner ships this file.  Inputs are not shipped (a ResNet-50 conv at batch 16
reads megabytes): the build machine computes each kernel's reference on ``make_inputs(spec)`` and the
device machine makes the same arrays again.  ``np.random.Generator``'s methods may change their output
between NumPy versions (NEP 19 pins only the bit generators), so the values come from SplitMix64 over
the element index, written out here in uint64 arithmetic.

A spec is a list of parameters ``{"shape", "dtype", "range": [lo, hi]}`` (or ``"file"``: a small constant
that travels) and a ``seed``; parameter ``i`` draws from ``seed * 1000003 + i``.  Integers are uniform in
the inclusive range (lo + u mod (hi-lo+1)); floats uniform in [lo, hi) from the top 53 bits, then rounded
to the dtype.
"""
from __future__ import annotations

import os

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def splitmix64(n: int, seed: int) -> np.ndarray:
    """``n`` uint64 words of SplitMix64 started at ``seed`` (the state after i+1 increments, mixed)."""
    with np.errstate(over="ignore"):
        z = (np.arange(1, n + 1, dtype=np.uint64) * _GOLDEN + np.uint64(seed % 2**64))
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def make_array(shape, dtype: str, seed: int, lo, hi) -> np.ndarray:
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    u = splitmix64(n, seed)
    if dtype.startswith("float"):
        x = (u >> np.uint64(11)).astype(np.float64) * 2.0**-53
        return (float(lo) + x * (float(hi) - float(lo))).astype(dtype).reshape(shape)
    if dtype == "bool":
        return (u & np.uint64(1)).astype(bool).reshape(shape)
    span = int(hi) - int(lo) + 1
    if span <= 0:
        raise ValueError(f"empty range [{lo}, {hi}]")
    v = (u % np.uint64(span)).astype(np.int64) if span < 2**63 else u.astype(np.int64)
    with np.errstate(over="ignore"):
        return (v + np.int64(lo)).astype(dtype).reshape(shape)


def make_inputs(params: list, seed: int, root: str = ".") -> list:
    """One array per parameter spec (module doc): ``{"shape", "dtype", "range"}`` drawn from the seed, or
    ``{"shape", "dtype", "file"}`` read from the ``.npy`` file under ``root`` (a constant that travels)."""
    out = []
    for i, p in enumerate(params):
        if "file" in p:
            out.append(np.load(os.path.join(root, p["file"])).astype(p["dtype"]).reshape(p["shape"]))
        else:
            out.append(make_array(p["shape"], p["dtype"], seed * 1000003 + i, *p["range"]))
    return out
