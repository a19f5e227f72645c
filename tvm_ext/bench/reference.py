"""A kernel's float32 reference: its own unscheduled TIR, every float16 widened to float32, run on the CPU.

A float16 kernel's output is checked against this (``tvm_ext.bundle.tolerance``: a tolerance for
float16 accumulation over the kernel's K), never against another float16 schedule: two schedules
that both accumulate in float16 over K = 2560-10240 in different orders differ by far more than
1e-3 and are both right.  The twin is the kernel's definition (what every schedule of it must
compute) with float16 buffers, casts and constants made float32 (``float32_twin``; a half made from its
bits by ``reinterpret`` stays one and is widened after); its inputs are
the float16 kernel's inputs, exactly representable in float32, so only the arithmetic differs.
"""
from __future__ import annotations

import numpy as np

_WIDE = "float32"


def float32_twin(func):
    """``func`` (a PrimFunc, unscheduled) with every float16 made float32, as a PrimFunc."""
    import tvm

    text = _keep_reinterpreted_halves(func.with_attr("global_symbol", "main").script())
    text = text.replace('"float16"', f'"{_WIDE}"').replace("T.float16(", f"T.{_WIDE}(")
    return tvm.script.from_source(text.replace(_HALF, '"float16"'))


_HALF = '"__half_kept__"'


def _keep_reinterpreted_halves(text: str) -> str:
    """Each ``T.reinterpret("float16", x)`` (a half made from its bits: the CUDA q4 unpack's ``0x6400 | q``)
    stays a half and is widened after: ``T.Cast("float16", T.reinterpret(<kept>, x))`` before the global
    float16 -> float32 replacement; exact (every half is a float32)."""
    head = 'T.reinterpret("float16",'
    out, i = [], 0
    while True:
        j = text.find(head, i)
        if j < 0:
            return "".join(out) + text[i:]
        depth, k = 0, j + len("T.reinterpret")
        for k in range(k, len(text)):  # the reinterpret's closing parenthesis
            depth += {"(": 1, ")": -1}.get(text[k], 0)
            if depth == 0:
                break
        inner = text[j + len(head):k]
        out.append(text[i:j] + f'T.Cast("float16", T.reinterpret({_HALF},{inner}))')
        i = k + 1


def reference_output(func, args: list, written: int = -1) -> np.ndarray:
    """float32 output of ``func``'s twin (``float32_twin``) on ``args`` (NumPy arrays, the kernel's
    parameters in order; floats upcast), built for and run on the CPU: parameter ``written``."""
    import tvm

    twin = float32_twin(func)
    lib = tvm.compile(tvm.IRModule({"main": twin}), target="llvm")
    dev = tvm.cpu(0)
    wide = [a.astype(_WIDE) if a.dtype == np.float16 else a for a in args]
    tensors = [tvm.runtime.tensor(a, dev) for a in wide]
    lib["main"](*tensors)
    return tensors[written].numpy()


def reduction_length(func) -> int:
    """K of a PrimFunc: the largest product of one block's reduction-axis extents (1 if none): the
    length of the sums whose rounding ``bundle.tolerance`` allows for."""
    from tvm_ext.tir_utils import blocks_of

    best = 1
    for block in blocks_of(func):
        n = 1
        for iv in block.iter_vars:
            if int(iv.iter_type) == 2:  # CommReduce
                n *= int(iv.dom.extent)
        best = max(best, n)
    return best
