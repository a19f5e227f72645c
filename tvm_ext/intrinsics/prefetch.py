"""Software prefetch of a weight stream, shared by the q4 GEMV intrinsics (``q4_gemv``, ``q4_vnni``).

A decode GEMV reads each weight byte once, from DRAM, and the hardware prefetchers alone
leave it far from the bandwidth (they stop at 4 KiB pages and ramp up again after each).
The kernels ask for the line ``PREFETCH`` bytes ahead of the one they read, once per cache
line: Phi-2 qkv's factored float GEMV (``intrinsics.q4_gemv``) on the AVX-512 host, weights
cycled from DRAM, 1.72 ms without, 0.63 ms with 8 KiB ahead.
"""
from __future__ import annotations

from tvm.script import tirx as T

PREFETCH = 8192  # bytes ahead of the packed row stream
LINE = 64  # bytes per cache line


def prefetch(flat, index):
    """``llvm.prefetch`` (read, high locality, data) of ``flat[index]`` (``index`` an int or a tuple of
    indices): on x86 a prefetch never faults, the caller clamps ``index`` where it must stay inside."""
    return T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(flat[index]), 0, 3, 1)


__all__ = ["LINE", "PREFETCH", "prefetch"]
