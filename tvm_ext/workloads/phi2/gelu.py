"""Phi-2's gelu_tanh ("gelu_new") in NumPy and as a TE compute: the float and the int8 projections'
epilogue (fc1) and their references."""
from __future__ import annotations

import math


def gelu_tanh_np(x):
    """gelu_tanh (Phi-2's "gelu_new") in NumPy (the references of both arithmetics)."""
    import numpy as np

    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def te_gelu_tanh(y):
    """gelu_tanh (Phi-2's "gelu_new") with TVM's ``fast_tanh`` (a rational function, float32
    accurate to a few ulp) instead of ``relax.op.nn.gelu_tanh``: that one's ``tanh`` becomes a
    scalar ``expf`` call per element on LLVM CPU targets, which kept fc1's epilogue loop from
    vectorizing (~0.07 ms of fc1's 0.92 ms from DRAM on an AVX-512 CPU)."""
    from tvm import te, tirx, topi

    c = lambda v: tirx.const(v, y.dtype)  # noqa: E731
    inner = te.compute(y.shape, lambda *i: c(math.sqrt(2.0 / math.pi)) * (
        y(*i) + c(0.044715) * y(*i) * y(*i) * y(*i)), name="gelu_inner")
    t = topi.fast_tanh(inner)
    return te.compute(y.shape, lambda *i: c(0.5) * y(*i) * (c(1.0) + t(*i)), name="gelu_tanh")
