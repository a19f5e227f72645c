"""Int8-activation q4 GEMV for AVX2 CPUs: the ``int8`` compute option of the Phi-2 decode.

What it computes differs from the float kernels, on purpose and never silently: the
activation row is quantized per group of 32 to int8 (scale = max|x| / 127, round half to
even), as ONNX Runtime's MatMulNBits does at accuracy_level 4, and each group's dot product
with the 4-bit weights is exact in int32:

    y[n] = bias[n] + sum_g  w_scale[n, g] * x_scale[g] * sum_{k in g} (q[n, k] - 7) * xq[k]

Two hand-scheduled kernels (TVMScript; no schedule rule applies to them, they carry
``tir.is_scheduled``):

``quantize_activations(K)``  x (1, 1, K) float32 -> xq (K,) int8, corr (K/8,) int32,
    x_scale (K/8,) float32.  ``xq`` is stored in the order the GEMV's byte lanes want:
    in each block of 64 inputs, first the 32 even positions, then the 32 odd ones (a byte
    of packed weights holds an even input in its low nibble and the next odd one in its
    high nibble).  ``corr[w] = -7 * sum of the 8 xq of word w`` (the zero point, applied in
    int32) and ``x_scale[w]`` is its group's scale, both per packed word.
``q4_int8_gemv(N, K, ...)``  rows in parallel; per row, per block of 64 inputs (8 packed
    words, 32 bytes): low and high nibbles masked out of the bytes, ``vpmaddubsw`` with the
    even and odd activations (unsigned nibble x signed int8, pairs summed in int16: at most
    2 x 15 x 127, no saturation), the two added, ``vpmaddwd`` by ones (one int32 per packed
    word), ``corr`` added, converted to float and multiplied by ``x_scale x w_scale`` into 8
    float lanes; the lanes summed once per row, then bias (and gelu) added.  Each step asks
    for the packed bytes 8 KiB ahead (``intrinsics.prefetch``): from DRAM on the AVX-512 host
    (600 MB of weight copies cycled) o 0.202 -> 0.140 ms, fc2 0.820 -> 0.586, qkv 0.592 -> 0.414.

Needs AVX2 (``vpmaddubsw``/``vpmaddwd`` on 256 bits; every x86 CPU since Haswell); the
caller checks the target (``check_target``).  K must be a multiple of 64.  ``isa="vnni"``
(``isa_for`` picks it where the target has AVX-512 VNNI or AVX-VNNI) does each block's dot
products with two ``vpdpbusd`` (256-bit) accumulating onto ``corr``: the same sums, 3 fewer
instructions a block (compile-checked on this AVX2 host; its numbers are checked only on a
VNNI host, ``tests/test_q4_int8.py``).
``reference_np`` emulates the same arithmetic in NumPy (for tests and the error report).
"""
from __future__ import annotations

import math

import numpy as np

from tvm_ext.intrinsics.prefetch import LINE, PREFETCH
from tvm_ext.intrinsics.prefetch import prefetch as prefetch_line
from tvm_ext.intrinsics.vnni import MADDUBS, MADDWD, vpdpbusd

GROUP = 32  # inputs per scale (activation and weight)
BLOCK = 64  # inputs per 256-bit step: 8 packed words, 32 bytes
ZERO_POINT = 7
EPILOGUES = ("bias", "bias_gelu")
ISAS = ("avx2", "vnni")


def check_shape(k: int, n: int) -> None:
    if k % BLOCK or n < 1:
        raise ValueError(f"the int8 GEMV needs K a multiple of {BLOCK} and N >= 1, not K={k}, N={n}")


def check_target(target) -> None:
    """ValueError unless ``target`` is an x86 LLVM target with AVX2."""
    from tvm_ext.targets import has_avx2

    if not has_avx2(target):
        raise ValueError(f"the int8-activation kernels need an x86 CPU target with AVX2, not {target}")


def isa_for(target) -> str:
    """"vnni" where ``target`` has AVX-512 VNNI or AVX-VNNI, else "avx2"."""
    from tvm_ext.targets import vnni_kinds

    return "vnni" if vnni_kinds(target) else "avx2"


def permutation(k: int) -> np.ndarray:
    """``perm`` with ``xq_stored = xq[perm]``: per block of 64, even positions then odd ones."""
    t = np.arange(BLOCK // 2)
    block = np.concatenate([2 * t, 2 * t + 1])
    return (np.arange(0, k, BLOCK)[:, None] + block[None, :]).reshape(-1)


# ----------------------------------------------------------------------------- kernels
def quantize_activations(k: int):
    """PrimFunc (x (1, 1, K) float32) -> (xq (K,) int8, corr (K/8,) int32, x_scale (K/8,)
    float32); see the module doc."""
    from tvm.script import tirx as T

    check_shape(k, 1)
    groups = k // GROUP

    def slot(i):  # where input i is stored: its block of 64, then even inputs first (``permutation``)
        return i // BLOCK * BLOCK + i % 2 * (BLOCK // 2) + i % BLOCK // 2

    @T.prim_func(private=True, s_tir=True)
    def quantize(x: T.Buffer((1, 1, k), "float32"), xq: T.Buffer((k,), "int8"),
                 corr: T.Buffer((k // 8,), "int32"), x_scale: T.Buffer((k // 8,), "float32")):
        T.func_attr({"op_pattern": 8, "tirx.noalias": True, "tir.is_scheduled": True})
        with T.sblock("root"):  # a root block: Relax's passes read every call_tir callee as s_tir
            for g in T.parallel(groups):
                amax = T.decl_buffer((1,), "float32")
                amax[0] = T.float32(0)
                for j in range(GROUP):
                    amax[0] = T.max(amax[0], T.fabs(x[0, 0, g * GROUP + j]))
                inv = T.if_then_else(amax[0] > T.float32(0), T.float32(127) / amax[0], T.float32(0))
                for j in range(GROUP):
                    xq[slot(g * GROUP + j)] = T.Cast("int8", T.round(x[0, 0, g * GROUP + j] * inv))
                for w in range(GROUP // 8):
                    s = T.decl_buffer((1,), "int32")
                    s[0] = 0
                    for j in range(8):
                        s[0] = s[0] + T.Cast("int32", xq[slot(g * GROUP + w * 8 + j)])
                    corr[g * 4 + w] = s[0] * -ZERO_POINT
                    x_scale[g * 4 + w] = amax[0] / T.float32(127)

    return quantize


def gelu_tanh_np(x):
    """gelu_tanh (Phi-2's "gelu_new") in NumPy (the references of both arithmetics)."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def te_gelu_tanh(y):
    """gelu_tanh (Phi-2's "gelu_new") with TVM's ``fast_tanh`` (a rational function, float32
    accurate to a few ulp) instead of ``relax.op.nn.gelu_tanh``: that one's ``tanh`` becomes a
    scalar ``expf`` call per element on LLVM CPU targets, which kept fc1's epilogue loop from
    vectorizing (~0.07 ms of fc1's 0.92 ms from DRAM on the AVX-512 host, session 15)."""
    from tvm import te, tirx, topi

    c = lambda v: tirx.const(v, y.dtype)  # noqa: E731
    inner = te.compute(y.shape, lambda *i: c(math.sqrt(2.0 / math.pi)) * (
        y(*i) + c(0.044715) * y(*i) * y(*i) * y(*i)), name="gelu_inner")
    t = topi.fast_tanh(inner)
    return te.compute(y.shape, lambda *i: c(0.5) * y(*i) * (c(1.0) + t(*i)), name="gelu_tanh")


def _gelu_tanh(v):
    from tvm import tirx

    c = tirx.const(math.sqrt(2.0 / math.pi), "float32")
    return tirx.const(0.5, "float32") * v * (tirx.const(1.0, "float32") + tirx.tanh(
        c * (v + tirx.const(0.044715, "float32") * v * v * v)))


def q4_int8_gemv(n: int, k: int, scale_dtype: str = "float16", epilogue: str = "bias", isa: str = "avx2",
                 prefetch: int = PREFETCH):
    """PrimFunc (xq, corr, x_scale, packed (N, K/8) uint32, scale (N, K/32), bias (N,)) ->
    y (1, 1, N) float32; ``epilogue`` "bias" or "bias_gelu".  See the module doc.

    One row at a time, in memory order (a thread streams its rows' words and scales: computing
    4 rows together to share the activation loads measured 1.6x slower from DRAM here).  Blocks
    go ``per`` (4 when they divide K / 64) to a step: one load of their 8 weight scales, one
    lane permutation each, and two accumulators in turn (one alone makes every block wait for
    the previous block's FMA)."""
    from tvm.script import tirx as T

    check_shape(k, n)
    if epilogue not in EPILOGUES:
        raise ValueError(f"epilogue must be one of {EPILOGUES}, not {epilogue!r}")
    if isa not in ISAS:
        raise ValueError(f"isa must be one of {ISAS}, not {isa!r}")
    blocks, words = k // BLOCK, k // 8
    per = next(p for p in (4, 2, 1) if blocks % p == 0)
    nbytes = n * words * 4
    step_bytes = per * BLOCK // 2  # packed bytes a step reads
    n_lines = -(-step_bytes // LINE) if prefetch else 0
    finish = _gelu_tanh if epilogue == "bias_gelu" else (lambda v: v)
    mask = T.broadcast(T.uint32(0x0F0F0F0F), 8)
    four = T.broadcast(T.uint32(4), 8)
    ones = T.broadcast(T.int16(1), 16)
    zeros = T.broadcast(T.float32(0), 16)

    def maddubs(a, b):
        return T.call_llvm_pure_intrin("int16x16", T.llvm_lookup_intrinsic_id(MADDUBS), a, b)

    def block_sum(xq, corr, x_scale, packed, ws, row, b, j):
        """The 8 float lanes block ``b`` (the ``j``-th of its step, weight scales ``ws``)
        adds to its row: one expression (a name bound inside the kernel gets a buffer)."""
        w = packed[row, T.ramp(b * 8, 1, 8)]
        lo = T.reinterpret("int8x32", T.bitwise_and(w, mask))
        hi = T.reinterpret("int8x32", T.bitwise_and(T.shift_right(w, four), mask))
        xe, xo = xq[T.ramp(b * BLOCK, 1, 32)], xq[T.ramp(b * BLOCK + 32, 1, 32)]
        if isa == "vnni":  # 256-bit vpdpbusd (probed operand style: only built when asked for)
            dpbusd = vpdpbusd(8)
            s32 = dpbusd(dpbusd(corr[T.ramp(b * 8, 1, 8)], lo, xe), hi, xo)
        else:
            s16 = maddubs(lo, xe) + maddubs(hi, xo)
            s32 = T.call_llvm_pure_intrin("int32x8", T.llvm_lookup_intrinsic_id(MADDWD), s16, ones) + corr[
                T.ramp(b * 8, 1, 8)]
        lanes = [2 * j] * 4 + [2 * j + 1] * 4  # group 2b's scale to words 0-3, 2b+1's to 4-7
        return T.Cast("float32x8", s32) * (
            x_scale[T.ramp(b * 8, 1, 8)] * T.Shuffle([ws] * (4 // per), lanes))

    def row_sum(acc):
        a = [acc[i] + acc[i + 8] for i in range(8)]
        return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))

    @T.prim_func(private=True, s_tir=True)
    def gemv(xq: T.Buffer((k,), "int8"), corr: T.Buffer((words,), "int32"), x_scale: T.Buffer((words,), "float32"),
             packed: T.Buffer((n, words), "uint32"), scale: T.Buffer((n, k // GROUP), scale_dtype),
             bias: T.Buffer((n,), "float32"), y: T.Buffer((1, 1, n), "float32")):
        T.func_attr({"op_pattern": 8, "tirx.noalias": True, "tir.is_scheduled": True,
                     "tvm_ext.q4_int8_gemv": [n, k, scale_dtype, epilogue, isa]})
        with T.sblock("root"):  # a root block: Relax's passes read every call_tir callee as s_tir
            pb = T.decl_buffer((nbytes,), "uint8", data=packed.data)
            for row in T.parallel(n):
                # default scope: a stack array LLVM keeps in registers ("local" is a workspace per row)
                acc = T.decl_buffer((16,), "float32")
                acc[T.ramp(0, 1, 16)] = zeros
                for s in range(blocks // per):
                    for off in T.unroll(n_lines):
                        T.evaluate(prefetch_line(pb, T.min(
                            row * words * 4 + s * step_bytes + off * LINE + prefetch, nbytes - 1)))
                    for j in T.unroll(per):
                        acc[T.ramp(j % 2 * 8, 1, 8)] = acc[T.ramp(j % 2 * 8, 1, 8)] + block_sum(
                            xq, corr, x_scale, packed,
                            T.Cast(f"float32x{2 * per}", scale[row, T.ramp(s * 2 * per, 1, 2 * per)]),
                            row, s * per + j, j)
                y[0, 0, row] = finish(row_sum(acc) + bias[row])

    return gemv


def for_target(func, target):
    """``func`` again for ``target``'s ISA when it is a ``q4_int8_gemv`` made for another one
    (a module is built before its target is known); any other function unchanged."""
    spec = func.attrs.get("tvm_ext.q4_int8_gemv") if func.attrs is not None else None
    if spec is None:
        return func
    n, k, scale_dtype, epilogue, isa = (int(spec[0]), int(spec[1]), str(spec[2]), str(spec[3]), str(spec[4]))
    want = isa_for(target)
    if want == isa:
        return func
    out = q4_int8_gemv(n, k, scale_dtype, epilogue, want)
    return out.with_attr("global_symbol", func.attrs["global_symbol"]) if "global_symbol" in func.attrs else out


# ----------------------------------------------------------------------------- NumPy
def quantize_np(x):
    """(xq int8 [K] in natural order, x_scale float32 [K/32]) as ``quantize_activations``
    computes them (float32 arithmetic, round half to even)."""
    x = np.asarray(x, "float32").reshape(-1, GROUP)
    amax = np.abs(x).max(axis=1)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype("float32")
    xq = np.round(x * inv[:, None]).astype("int8").reshape(-1)
    return xq, (amax / np.float32(127)).astype("float32")


def reference_np(x, packed, scale, bias, epilogue: str = "bias"):
    """float64 result of the int8-activation arithmetic (exact integer dot products per
    group, then the scales), for ``x`` (K,), our q4 weights and bias."""
    xq, xs = quantize_np(x)
    n, kw = packed.shape
    q = np.empty((n, kw * 8), dtype=np.int64)
    for j in range(8):
        q[:, j::8] = (packed >> np.uint32(4 * j)) & np.uint32(15)
    dots = ((q - ZERO_POINT) * xq.astype(np.int64)[None, :]).reshape(n, -1, GROUP).sum(axis=2)
    y = (dots * scale.astype("float64") * xs.astype("float64")[None, :]).sum(axis=1) + bias.astype("float64")
    if epilogue == "bias_gelu":
        y = gelu_tanh_np(y)
    return y
