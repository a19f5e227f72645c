"""TE kernels the tests schedule: the seed's quantized conv + requantize pattern."""
from __future__ import annotations

import tvm
from tvm import te, tirx

CUDA = {"kind": "cuda", "arch": "sm_80", "max_threads_per_block": 1024,
        "max_shared_memory_per_block": 49152, "thread_warp_size": 32}


def cuda_target() -> tvm.target.Target:
    return tvm.target.Target(CUDA)


def llvm_target() -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "num-cores": 2})


def requantize_primfunc(rows: int = 256, cols: int = 64) -> tirx.PrimFunc:
    """y = q_multiply_shift_per_axis(x, m, l, r, 31, False, True), elementwise."""
    x = te.placeholder((rows, cols), "int32", name="x")
    m, l, r = (te.placeholder((cols,), "int32", name=n) for n in ("m", "l", "r"))
    y = te.compute((rows, cols), lambda i, j: tirx.q_multiply_shift_per_axis(
        x[i, j], m[j], l[j], r[j], 31, False, True), name="y")
    return te.create_prim_func([x, m, l, r, y])
