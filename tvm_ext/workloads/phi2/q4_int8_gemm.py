"""The q4 x int8 GEMM: activations quantized to int8 per token and group, integer dot products per group.

The arithmetic of ONNX Runtime's MatMulNBits at accuracy_level 4, for M tokens at once (M = 1: the
decode's GEMV, M even: a prompt's prefill):

    y[m, n] = bias[n] + sum_g  w_scale[n, g] * x_scale[m, g] * (sum_{k in g} q[n, k] * xq[m, k] + corr[m, g])

with ``corr[m, g] = -7 * sum_{k in g} xq[m, k]`` (the weights' zero point, applied once per group).

Operands, in the layouts the VNNI tile (``intrinsics.q4_vnni``) reads:
``xq`` (M, K/8, 2, 4) int8   token m's input 8v + 2b + p at [m, v, p, b] (per word: even inputs, then odd)
``x_scale``, ``corr`` (M, K/32) float32 / int32, from ``quantize_tokens`` (per token, per group of 32)
``wq`` (N/16, K/8, 16) uint32   the model's (N, K/8) packed words, 16 columns side by side
                                (``repack``: a transpose of whole words, same bytes)
``ws`` (N/16, K/32, 16)         the model's (N, K/32) scales (float16 or float32), likewise (``repack``)

``gemm`` is a TE compute of two blocks, ``q4_int8_dot`` (int32 per token, column and group) and
``q4_int8_scale`` (the float sum over groups, bias first); ``rules/q4_int8_gemm.py`` schedules it.
"""
from __future__ import annotations

import numpy as np

from tvm_ext.intrinsics.q4_gemv import GROUP, ZERO_POINT  # the q4 weight format's (32 inputs a scale, q - 7)

from .gelu import gelu_tanh_np, te_gelu_tanh

LANES = 16
WORDS = GROUP // 8
EPILOGUES = ("bias", "bias_gelu")
DOT_BLOCK = "q4_int8_dot"
SCALE_BLOCK = "q4_int8_scale"


def check_shape(m: int, n: int, k: int) -> None:
    """ValueError unless M is 1 or even (tiles of 2, 4 or 8 tokens), N a multiple of 32 and K of 32."""
    if m < 1 or (m > 1 and m % 2) or n % (2 * LANES) or k % GROUP or k < GROUP:
        raise ValueError(f"the q4 x int8 GEMM needs M 1 or even, N a multiple of {2 * LANES} and K of {GROUP}, "
                         f"not M={m}, N={n}, K={k}")


def check_target(target) -> None:
    """ValueError unless ``target`` is an x86 LLVM target with AVX2 (the tile intrinsic's forms)."""
    from tvm_ext.intrinsics.q4_vnni import form_for
    from tvm_ext.targets import resolve_target

    if form_for(resolve_target(target)) is None:
        raise ValueError(f"the int8-activation kernels need an x86 CPU target with AVX2, not {target}")


def gemm_compute(xq, xs, corr, wq, ws, bias, epilogue: str = "bias"):
    """The GEMM's output tensor (1, M, N) from TE tensors in the module doc's layouts."""
    from tvm import te, tirx

    if epilogue not in EPILOGUES:
        raise ValueError(f"epilogue must be one of {EPILOGUES}, not {epilogue!r}")
    m, groups = (int(d) for d in xs.shape)
    n = int(wq.shape[0]) * LANES
    v = te.reduce_axis((0, WORDS), name="v")
    p = te.reduce_axis((0, 2), name="p")
    b = te.reduce_axis((0, 4), name="b")
    dot = te.compute(
        (groups, m, n // LANES, LANES),
        lambda g, t, nb, i: te.sum(
            tirx.Cast("int32", (wq[nb, g * WORDS + v, i] >> tirx.Cast("uint32", b * 8 + p * 4))
                      & tirx.const(15, "uint32")) * tirx.Cast("int32", xq[t, g * WORDS + v, p, b]), axis=[v, p, b]),
        name=DOT_BLOCK)
    g = te.reduce_axis((0, groups), name="g")
    as_f32 = (lambda e: e) if ws.dtype == "float32" else (lambda e: tirx.Cast("float32", e))
    y = te.compute(
        (1, m, n),
        lambda _, t, j: te.sum(as_f32(ws[j // LANES, g, j % LANES]) * xs[t, g] * tirx.Cast(
            "float32", dot[g, t, j // LANES, j % LANES] + corr[t, g]), axis=[g]),
        name=SCALE_BLOCK)
    out = te.compute((1, m, n), lambda _, t, j: y[0, t, j] + bias[j], name="q4_int8_bias")
    return te_gelu_tanh(out) if epilogue == "bias_gelu" else out


def gemm_te(m: int, n: int, k: int, epilogue: str = "bias", scale_dtype: str = "float32"):
    """TE tensors (xq, x_scale, corr, wq, ws, bias, y) of the GEMM (see the module doc)."""
    from tvm import te

    check_shape(m, n, k)
    groups = k // GROUP
    xq = te.placeholder((m, k // 8, 2, 4), "int8", name="xq")
    xs = te.placeholder((m, groups), "float32", name="x_scale")
    corr = te.placeholder((m, groups), "int32", name="corr")
    wq = te.placeholder((n // LANES, k // 8, LANES), "uint32", name="wq")
    ws = te.placeholder((n // LANES, groups, LANES), scale_dtype, name="ws")
    bias = te.placeholder((n,), "float32", name="bias")
    return xq, xs, corr, wq, ws, bias, gemm_compute(xq, xs, corr, wq, ws, bias, epilogue)


def gemm(m: int, n: int, k: int, epilogue: str = "bias", scale_dtype: str = "float32"):
    """The unscheduled PrimFunc of ``gemm_te``."""
    from tvm import te

    return te.create_prim_func(list(gemm_te(m, n, k, epilogue, scale_dtype))).with_attr("tirx.noalias", True)


# ----------------------------------------------------------------------------- quantize
# byte o of a group's 32 in ``xq`` holds input PERM[o] (o = 8v + 4p + b holds 8v + 2b + p)
PERM = [8 * (o // 8) + 2 * (o % 4) + (o % 8) // 4 for o in range(GROUP)]


def quantize_tokens(m: int, k: int):
    """PrimFunc x (1, M, K) float32 -> (xq (M, K/8, 2, 4) int8, x_scale (M, K/32), corr (M, K/32)):
    per token and group of 32, scale = max|x| / 127, xq = round-half-even(x / scale), corr = -7 sum xq.
    Written vectorized: a group is two 16-lane vectors, its max and sum folded to 16 lanes then summed,
    its 32 int8 values put in ``xq``'s order by one shuffle (``PERM``) and stored at once; the tokens in
    parallel.  Scalar, a 128 x 10240 prompt quantize took 6-12x as long, 6-8 % of a prefill."""
    from tvm.script import tirx as T

    check_shape(m, 2 * LANES, k)
    groups = k // GROUP
    # one token is a few microseconds of work: waking the thread pool costs more
    loop = T.parallel if m > 1 else T.serial
    half = GROUP // 2

    @T.prim_func(private=True, s_tir=True)
    def quantize(x: T.Buffer((1, m, k), "float32"), xq: T.Buffer((m, k // 8, 2, 4), "int8"),
                 x_scale: T.Buffer((m, groups), "float32"), corr: T.Buffer((m, groups), "int32")):
        T.func_attr({"op_pattern": 8, "tirx.noalias": True, "tirx.is_scheduled": True})
        with T.sblock("root"):
            flat = T.decl_buffer((m * k,), "int8", data=xq.data)
            for t in loop(m):
                folded = T.decl_buffer((half,), "float32", scope="local")
                amax = T.decl_buffer((1,), "float32", scope="local")
                partial = T.decl_buffer((half,), "int32", scope="local")
                total = T.decl_buffer((1,), "int32", scope="local")
                for g in range(groups):
                    lo = x.vload([0, t, g * GROUP], f"float32x{half}")
                    hi = x.vload([0, t, g * GROUP + half], f"float32x{half}")
                    folded[T.ramp(0, 1, half)] = T.max(T.fabs(lo), T.fabs(hi))
                    amax[0] = T.float32(0)
                    for lane in range(half):
                        amax[0] = T.max(amax[0], folded[lane])
                    inv = T.if_then_else(amax[0] > T.float32(0), T.float32(127) / amax[0], T.float32(0))
                    q_lo = T.Cast(f"int8x{half}", T.round(lo * T.Broadcast(inv, half)))
                    q_hi = T.Cast(f"int8x{half}", T.round(hi * T.Broadcast(inv, half)))
                    flat[T.ramp((t * groups + g) * GROUP, 1, GROUP)] = T.Shuffle([q_lo, q_hi], PERM)
                    partial[T.ramp(0, 1, half)] = T.Cast(f"int32x{half}", q_lo) + T.Cast(f"int32x{half}", q_hi)
                    total[0] = 0
                    for lane in range(half):
                        total[0] = total[0] + partial[lane]
                    x_scale[t, g] = amax[0] / T.float32(127)
                    corr[t, g] = total[0] * -ZERO_POINT

    return quantize


# ----------------------------------------------------------------------------- NumPy
def repack(packed, scale):
    """(wq, ws) of ``gemm`` from the model's (N, K/8) uint32 words and (N, K/32) scales (their dtype kept)."""
    n, kw = packed.shape
    wq = np.ascontiguousarray(packed.reshape(n // LANES, LANES, kw).transpose(0, 2, 1))
    ws = np.ascontiguousarray(scale.reshape(n // LANES, LANES, -1).transpose(0, 2, 1))
    return wq, ws


def quantize_np(x):
    """(xq (M, K/8, 2, 4) int8, x_scale (M, K/32), corr (M, K/32)) as ``quantize_tokens`` computes them."""
    x = np.asarray(x, "float32").reshape(x.shape[-2], -1)
    m, k = x.shape
    g = x.reshape(m, -1, GROUP)
    amax = np.abs(g).max(axis=2)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype("float32")
    q = np.round(g * inv[..., None]).astype("int8")
    corr = (q.astype("int32").sum(axis=2) * -ZERO_POINT).astype("int32")
    xq = q.reshape(m, k // 8, 4, 2).transpose(0, 1, 3, 2)  # [m, v, b, p] -> [m, v, p, b]
    return np.ascontiguousarray(xq), (amax / np.float32(127)).astype("float32"), corr


def reference_np(x, packed, scale, bias, epilogue: str = "bias"):
    """float64 result (M, N) of the int8-activation arithmetic for ``x`` (M, K)."""
    x = np.asarray(x, "float32").reshape(x.shape[-2], -1)
    m, k = x.shape
    xq, xs, _ = quantize_np(x)
    q_act = xq.transpose(0, 1, 3, 2).reshape(m, k).astype(np.int64)
    n, kw = packed.shape
    q = np.empty((n, kw * 8), dtype=np.int64)
    for j in range(8):
        q[:, j::8] = (packed >> np.uint32(4 * j)) & np.uint32(15)
    dots = np.einsum("mgk,ngk->mng", q_act.reshape(m, -1, GROUP), (q - ZERO_POINT).reshape(n, -1, GROUP))
    y = (dots * scale.astype("float64")[None] * xs.astype("float64")[:, None, :]).sum(axis=2) + bias
    return gelu_tanh_np(y) if epilogue == "bias_gelu" else y
