"""A kernel's float32 reference: its own unscheduled TIR, every float16 widened to float32, run on the CPU.

A float16 kernel's output is checked against this (``tvm_ext.bundle.tolerance``: a tolerance for
float16 accumulation over the kernel's K), never against another float16 schedule: two schedules
that both accumulate in float16 over K = 2560-10240 in different orders differ by far more than
1e-3 and are both right.  The twin is the kernel's definition (what every schedule of it must
compute) with float16 buffers, casts and constants made float32 (``float32_twin``); its inputs are
the float16 kernel's inputs, exactly representable in float32, so only the arithmetic differs.
"""
from __future__ import annotations

import numpy as np

_WIDE = "float32"


def float32_twin(func):
    """``func`` (a PrimFunc, unscheduled) with every float16 made float32, as a PrimFunc."""
    import tvm

    text = func.with_attr("global_symbol", "main").script()
    if "reinterpret" in text and "float16" in text:
        raise ValueError("a float16 kernel that reinterprets bits has no widened twin")
    return tvm.script.from_source(text.replace('"float16"', f'"{_WIDE}"').replace("T.float16(", f"T.{_WIDE}("))


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
