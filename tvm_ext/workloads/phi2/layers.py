"""Phi-2 decoder-layer pieces shared by the single-layer kernel workload (kernels.py) and the
whole-model decode (model.py): configs, the q4 weight format, TE kernels, the Relax
layer / head builders and the NumPy float64 reference.

Weights are q4f16_1: 4-bit values packed 8 per uint32 along the input dim, one float16
scale per group of ``GROUP`` input elements, value = (q - 7) * scale.  A weight entry in
the dicts below is either a NumPy array (bound as a Relax constant) or a Relax Var (a
function parameter): ``linear`` and ``emit_layer`` take both.

A position (``past``) is a Python int (static, as kernels.py builds) or a (1,) int32 tensor
holding it (model.py, one compiled layer for every position).
"""
from __future__ import annotations

import math

import numpy as np

from .arch import ARCH_DEFAULTS, EPS, GROUP, ROPE_BASE, WEIGHT_FORMATS, arch, architecture  # noqa: F401
from .gelu import gelu_tanh_np  # the NumPy gelu both arithmetics' references use
from .gelu import te_gelu_tanh as _te_gelu_tanh

CONFIGS = {
    "full": dict(hidden=2560, heads=32, head_dim=80, mlp=10240, vocab=51200, rotary=32),
    "reduced": dict(hidden=256, heads=4, head_dim=64, mlp=1024, vocab=1024, rotary=32),
}


# --------------------------------------------------------------------------- weights
def _quantized_linear(rng, k, n):
    """Random q4f16_1 weight for a linear layer with k inputs and n outputs."""
    q = rng.integers(0, 16, size=(n, k), dtype=np.uint32)
    packed = np.zeros((n, k // 8), dtype=np.uint32)
    for j in range(8):
        packed |= q[:, j::8] << np.uint32(4 * j)
    # (q - 7) has variance ~21; scale so outputs stay O(1)
    scale = (rng.uniform(0.5, 1.5, size=(n, k // GROUP)) / math.sqrt(21.0 * k)).astype("float16")
    bias = (rng.standard_normal(n) * 0.02).astype("float32")
    return packed, scale, bias


def dequantize_np(packed, scale):
    """NumPy dequantize: (n, k/8) uint32 + (n, k/32) fp16 -> (k, n) float64."""
    n, kw = packed.shape
    k = kw * 8
    q = np.empty((n, k), dtype=np.int64)
    for j in range(8):
        q[:, j::8] = (packed >> np.uint32(4 * j)) & np.uint32(15)
    w = (q - 7).astype("float64") * np.repeat(scale.astype("float64"), GROUP, axis=1)
    return w.T


def layer_weights(cfg, rng):
    """Random weights of one decoder layer: LayerNorm, qkv, dense (o), fc1, fc2."""
    d, m = cfg["hidden"], cfg["mlp"]
    w = {}
    w["ln_g"] = (1.0 + 0.1 * rng.standard_normal(d)).astype("float32")
    w["ln_b"] = (0.02 * rng.standard_normal(d)).astype("float32")
    w["qkv"] = _quantized_linear(rng, d, 3 * d)
    w["dense"] = _quantized_linear(rng, d, d)
    w["fc1"] = _quantized_linear(rng, d, m)
    w["fc2"] = _quantized_linear(rng, m, d)
    return w


def head_weights(cfg, rng):
    """Random weights of the head: final LayerNorm and lm_head."""
    d = cfg["hidden"]
    w = {}
    w["lnf_g"] = (1.0 + 0.1 * rng.standard_normal(d)).astype("float32")
    w["lnf_b"] = (0.02 * rng.standard_normal(d)).astype("float32")
    w["lm_head"] = _quantized_linear(rng, d, cfg["vocab"])
    return w


def embed_weights(cfg, rng):
    """Random q4 embedding table (vocab, hidden) of a config with its own table (``embed="table"``)."""
    packed, scale, _ = _quantized_linear(rng, cfg["hidden"], cfg["vocab"])
    return packed, scale, None


def in_format(cfg, w):
    """Random weights ``w`` (q4 triples) in the config's format: float (out, in) where ``weights`` is a float
    dtype, lm_head without its bias where ``lm_bias`` is off; the default config's weights unchanged."""
    fmt = arch(cfg, "weights")
    out = {}
    for name, v in w.items():
        if isinstance(v, tuple):
            if name == "lm_head" and not arch(cfg, "lm_bias"):
                v = (*v[:2], None)
            if fmt != "q4":
                v = (dequantize_np(v[0], v[1]).T.astype(fmt), v[2])
        out[name] = v
    return out


def weight_np(wt):
    """A weight tuple's matrix (in, out) in float64: q4 (packed, scale, bias) or float (w (out, in), bias)."""
    if len(wt) == 3:
        return dequantize_np(wt[0], wt[1])
    return np.asarray(wt[0], dtype="float64").T


def bias_np(wt):
    return 0.0 if wt[-1] is None else np.asarray(wt[-1], dtype="float64")


def _offset(i, past):
    """``i + past`` for a static position or a (1,) int32 position tensor."""
    from tvm import te, tirx

    if isinstance(past, te.Tensor):
        return i + tirx.Cast("int64", past[0])
    return i + past


# --------------------------------------------------------------------------- TE pieces
def _te_dequantize(packed, scale, dtype):
    from tvm import te

    n, kw = packed.shape
    # (in, out)
    return te.compute((kw * 8, n), lambda i, j: q4_value(packed, scale, j, i, dtype), name="dequantize")


def q4_value(packed, scale, row, col, dtype):
    """Element (row, col) of a q4 weight stored as (rows, cols/8) uint32 + (rows, cols/GROUP)
    scales: (q - 7) * scale (the expression the factored GEMV intrinsic matches)."""
    from tvm_ext.intrinsics.q4_gemv import q4_weight

    return q4_weight(packed, scale, row, col, dtype)


def rope_inv_freq(rotary: int, base: float = ROPE_BASE) -> np.ndarray:
    """The rotary frequencies ``base ** (-2 j / rotary)``, j < rotary / 2, float32."""
    return np.exp(np.arange(rotary // 2) * (-2.0 * math.log(base) / rotary)).astype("float32")


def _te_rope(qkv, inv_freq, offset, heads, head_dim, rotary, past, dtype):
    """Split one of q/k out of the fused qkv projection and apply partial rotary.  The angles' cos and
    sin are a table of (tokens, rotary / 2) computed first, shared by every head (as runtimes keep a
    rotary cache): per element, the 2560 cos/sin/exp of a decode step's rope took 9x as long as with the
    table, unscheduled.  The table reads ``inv_freq`` (``rope_inv_freq``) and
    is marked not to inline: MetaSchedule's AutoInline inlines a block that reads nothing whatever its
    annotation, and any other injective one unless marked."""
    from tvm import te, tirx

    _, n, _ = qkv.shape
    half = rotary // 2
    keep = {"meta_schedule.inline_rule": "disable"}

    def table(fn, name):
        return te.compute((n, half), lambda i, j: tirx.Cast(dtype, fn(
            tirx.Cast("float32", _offset(i, past)) * inv_freq[j])), name=name, attrs=keep)

    cos, sin = table(tirx.cos, "rope_cos"), table(tirx.sin, "rope_sin")

    def f(b, i, h, d):
        x = qkv[b, i, offset + h * head_dim + d]
        j = tirx.truncmod(d, half)
        other = tirx.Select(  # both sides' indices are clamped in range: a Select vectorizes
            d < half,
            -qkv[b, i, offset + h * head_dim + tirx.min(d + half, head_dim - 1)],
            qkv[b, i, offset + h * head_dim + tirx.max(d - half, 0)],
        )
        return tirx.Select(d < rotary, x * cos[i, j] + other * sin[i, j], x)

    return te.compute((1, n, heads, head_dim), f, name="rope")


def _te_split_heads(qkv, offset, heads, head_dim):
    from tvm import te

    _, n, _ = qkv.shape
    return te.compute(
        (1, n, heads, head_dim), lambda b, i, h, d: qkv[b, i, offset + h * head_dim + d], name="split_heads"
    )


def _up(x, dtype):
    """``x`` in the compute ``dtype``: a cache element stored narrower (float16, int8) is cast where it is loaded."""
    return x if x.dtype == dtype else x.astype(dtype)


def _te_attn_score(q, k, head_dim, dtype):
    from tvm import te, tirx

    _, n, heads, _ = q.shape
    _, t, _, _ = k.shape
    r = te.reduce_axis((0, head_dim), name="r")
    scale = tirx.const(1.0 / math.sqrt(head_dim), dtype)
    return te.compute(
        (1, heads, n, t),
        lambda b, h, i, j: te.sum(q[b, i, h, r] * scale * _up(k[b, j, h, r], dtype), axis=r),
        name="attn_score",
    )


EXP2_POLY = (1.5353362e-4, 1.3398874e-3, 9.6184374e-3, 5.5503325e-2, 2.4022648e-1, 6.9314720e-1, 1.0)


def _te_exp_nonpositive(x, name="softmax_exp"):
    """e^x for float32 ``x <= 0`` (softmax's shifted scores): ``t = x log2(e)``, ``n = nearbyint(t)``, 2^(t - n)
    by a degree-6 polynomial on [-1/2, 1/2] (``EXP2_POLY``: Cephes' exp2f), 2^n as exponent bits; x clamped
    at -88.02, where n = -127 makes those bits, and the result, exactly 0 (the causal mask's -FLT_MAX): below
    x = -87.68 (results under 2^-126.5, subnormal) it is 0.  Relative error <= 2.5e-6 for x >= -20, growing
    with |x| to ~4e-6 near -87.6 (the rounding of t itself; TVM's ``fast_exp``: 1.3e-6 on softmax's scores).
    Fewer vector operations than ``topi.fast_exp`` (no upper clamp, one rounding, no final max): a decode
    softmax over 513 keys a tenth faster, cache-hot.  Other dtypes:
    ``topi.fast_exp``."""
    from tvm import te, topi

    if x.dtype != "float32":
        return topi.fast_exp(x)
    return te.compute(x.shape, lambda *i: exp_nonpositive(x(*i)), name=name)


def exp_nonpositive(x, lanes: int = 1):
    """``_te_exp_nonpositive``'s arithmetic on one float32 expression ``x``: a scalar, or a vector of
    ``lanes`` (the fused prefill attention's softmax works on 8 lanes at once)."""
    from tvm import tirx

    f32, i32 = ("float32", "int32") if lanes == 1 else (f"float32x{lanes}", f"int32x{lanes}")

    def const(c, dtype="float32"):
        v = tirx.const(c, dtype)
        return v if lanes == 1 else tirx.Broadcast(v, lanes)

    t = tirx.max(x, const(-88.02)) * const(1.4426950408889634)
    n = tirx.nearbyint(t)
    r = t - n
    p = const(EXP2_POLY[0])
    for c in EXP2_POLY[1:]:
        p = p * r + const(c)
    return p * tirx.reinterpret(f32, (tirx.Cast(i32, n) + const(127, "int32")) << const(23, "int32"))


def _te_softmax(s, past=None, scales=None):
    """softmax over the last axis of scores ``s`` (1, heads, n, t), with the causal mask ``j > i + past``
    applied where each element is read (no kernel of its own: a 512-token prefill's separate mask kernel
    took 5.8 ms a layer for 8.7 M floats) unless ``past`` is None, as a
    ``Select`` (both sides are safe to evaluate), which vectorizes: as ``if_then_else`` the masked softmax
    took 7.5 ms a layer at 512 tokens, now 5.4 (unmasked 5.2).  A polynomial exp (``_te_exp_nonpositive``;
    TVM's ``fast_exp`` before it) instead of ``relax.op.nn.softmax``'s ``exp``, one scalar ``expf`` call per
    element on LLVM CPU targets: a 512-token prefill's softmax (32 x 512 x 528) took ~11 ms a layer whatever
    its schedule, 5.0-6.7 ms with fast_exp.  ``scales``: an int8 cache's key and value scales (1, heads, t)
    (``kv_cache``): the scores times the key scales, the probabilities times the value scales."""
    from tvm import te, tirx

    *rows, d = s.shape

    def score(b, h, i, j):
        x = s[b, h, i, j] if scales is None else s[b, h, i, j] * scales[0][0, h, j]
        if past is None:
            return x
        return tirx.Select(j > _offset(i, past), tirx.min_value(s.dtype), x)

    k = te.reduce_axis((0, d), name="k")
    peak = te.compute(rows, lambda *i: te.max(score(*i, k), axis=k), name="softmax_max")
    e = _te_exp_nonpositive(te.compute(s.shape, lambda *i: score(*i) - peak(*i[:-1]), name="softmax_shift"))
    k2 = te.reduce_axis((0, d), name="k2")
    total = te.compute(rows, lambda *i: te.sum(e(*i, k2), axis=k2), name="softmax_sum")
    if scales is None:
        return te.compute(s.shape, lambda *i: e(*i) / total(*i[:-1]), name="softmax_norm")
    return te.compute(s.shape, lambda b, h, i, j: e(b, h, i, j) / total(b, h, i) * scales[1][0, h, j],
                      name="softmax_norm")


def _te_attn_value(p, v):
    from tvm import te

    _, heads, n, t = p.shape
    _, _, _, head_dim = v.shape
    r = te.reduce_axis((0, t), name="r")
    return te.compute(
        (1, n, heads * head_dim),
        lambda b, i, c: te.sum(p[b, c // head_dim, i, r] * _up(v[b, r, c // head_dim, c % head_dim], p.dtype),
                               axis=r),
        name="attn_value",
    )


# --------------------------------------------------------------------------- Relax graph
def _arg(a, dtype=None):
    """A weight as a Relax expression: NumPy arrays become constants, Relax Vars stay."""
    from tvm import relax

    if isinstance(a, np.ndarray):
        return relax.const(a.astype(dtype) if dtype else a)
    return a


def _te_float_weight(w, dtype):
    """A float weight stored (out, in) as the (in, out) matrix in ``dtype``: named "dequantize" so that it
    fuses into its matmul as the q4 dequantize does (``kernels._dequantize_matmul_pattern``)."""
    from tvm import te, tirx

    n, k = w.shape
    return te.compute((k, n), lambda i, j: tirx.Cast(dtype, w[j, i]), name="dequantize")


def linear(bb, x, wt, dtype):
    """``matmul(x, dequantize(packed, scale)) + bias`` for a q4 weight triple, ``matmul(x, w^T) + bias`` for a
    float (w, bias) pair; no add where the bias is None."""
    from tvm import relax

    if len(wt) == 2:
        w = bb.emit_te(_te_float_weight, _arg(wt[0]), dtype, primfunc_name_hint="dequantize")
    else:
        w = bb.emit_te(_te_dequantize, _arg(wt[0]), _arg(wt[1]), dtype, primfunc_name_hint="dequantize")
    y = bb.emit(relax.op.matmul(x, w, out_dtype=dtype))
    return y if wt[-1] is None else bb.emit(relax.op.add(y, _arg(wt[-1], dtype)))


COMPUTES = ("float", "int8")


def projector(bb, dtype, compute="float"):
    """``proj(x, weight triple, gelu=False) -> x @ W + bias`` (gelu_tanh applied after when
    ``gelu``).  ``compute="float"``: ``linear`` (dequantize, matmul, add; fused later).
    ``compute="int8"``: activations quantized per token and group to int8 (once per distinct ``x``)
    and the q4 x int8 GEMM of ``q4_int8_gemm`` (weights repacked; float32)."""

    if compute not in COMPUTES:
        raise ValueError(f"compute must be one of {', '.join(COMPUTES)}, not {compute!r}")
    if compute == "float":
        def proj(x, wt, gelu=False):
            y = linear(bb, x, wt, dtype)
            return bb.emit_te(_te_gelu_tanh, y, primfunc_name_hint="gelu_tanh") if gelu else y
        return proj
    if dtype != "float32":
        raise ValueError(f"compute int8 computes in float32, not {dtype}")
    seen = []  # (x, its quantized activations)

    def proj(x, wt, gelu=False):
        q = next((q for v, q in seen if v.same_as(x)), None)
        if q is None:
            q = _quantize_int8(bb, x)
            seen.append((x, q))
        return _linear_int8(bb, q, wt, "bias_gelu" if gelu else "bias")
    return proj


def _shape(a) -> list:
    return [int(v) for v in (a.shape if isinstance(a, np.ndarray) else a.ty.shape.values)]


def _quantize_int8(bb, x):
    """Relax vars (xq, x_scale, corr) of ``x`` (1, M, K) quantized per token and group of 32 to int8
    (``q4_int8_gemm.quantize_tokens``)."""
    from tvm import relax

    from .q4_int8_gemm import GROUP as G, quantize_tokens

    _, n, k = _shape(x)
    gv = bb.add_func(quantize_tokens(n, k), f"quantize_int8_{n}x{k}")
    out_ty = [relax.TensorType((n, k // 8, 2, 4), "int8"), relax.TensorType((n, k // G), "float32"),
              relax.TensorType((n, k // G), "int32")]
    out = bb.emit(relax.call_tir(gv, [x], out_ty=out_ty))
    return [bb.emit(relax.TupleGetItem(out, i)) for i in range(3)]


def _linear_int8(bb, q, wt, epilogue):
    """``y = x @ W + bias`` (then gelu for ``epilogue="bias_gelu"``) from quantized activations: the
    GEMM of ``q4_int8_gemm`` (one token or many; scheduled by rules/q4_int8_gemm.py) on weights
    ``repack``-ed (a 3-d packed array)."""
    from .q4_int8_gemm import gemm_compute

    packed, scale, bias = wt
    return bb.emit_te(gemm_compute, *q, _arg(packed), _arg(scale), _arg(bias, "float32"), epilogue,
                      primfunc_name_hint="q4_int8_gemm")


def attention(bb, q, k, v, head_dim, dtype, mask_past=None, scales=None):
    """softmax(q k^T / sqrt(head_dim)) v, with the causal mask ``j > i + mask_past`` unless
    ``mask_past`` is None; (1, n, heads * head_dim).  ``k`` and ``v`` may be stored narrower than ``dtype``
    (float16, int8: cast as loaded); ``scales``: an int8 cache's (key scales, value scales)."""

    s = bb.emit_te(_te_attn_score, q, k, head_dim, dtype, primfunc_name_hint="attn_score")
    p = bb.emit_te(_te_softmax, s, mask_past, scales, primfunc_name_hint="softmax")
    return bb.emit_te(_te_attn_value, p, v, primfunc_name_hint="attn_value")


def emit_rope_qkv(bb, cfg, qkv, past, dtype):
    """(q, k, v) heads from the fused qkv projection, rotary applied to q and k at ``past``."""
    from tvm import relax

    d, hh, hd, rot = cfg["hidden"], cfg["heads"], cfg["head_dim"], cfg["rotary"]
    inv = relax.const(rope_inv_freq(rot, arch(cfg, "rope_base")))
    q = bb.emit_te(_te_rope, qkv, inv, 0, hh, hd, rot, past, dtype, primfunc_name_hint="rope")
    k = bb.emit_te(_te_rope, qkv, inv, d, hh, hd, rot, past, dtype, primfunc_name_hint="rope")
    v = bb.emit_te(_te_split_heads, qkv, 2 * d, hh, hd, primfunc_name_hint="split_heads")
    return q, k, v


def emit_layer(bb, cfg, w, x, dtype, attend, compute="float"):
    """One parallel attention + MLP decoder layer on ``x``; ``attend(qkv) -> (1, n, hidden)``
    is the attention branch after the qkv projection (rotary, cache, softmax); ``compute``:
    the projections' arithmetic (``projector``)."""
    from tvm import relax

    proj = projector(bb, dtype, compute)
    ln = bb.emit(relax.op.nn.layer_norm(x, _arg(w["ln_g"], dtype), _arg(w["ln_b"], dtype), axes=[-1],
                                        epsilon=arch(cfg, "eps")))
    a = attend(proj(ln, w["qkv"]))
    attn = proj(a, w["dense"])
    # MLP branch, from the same LayerNorm output
    mlp = proj(proj(ln, w["fc1"], gelu=True), w["fc2"])
    return bb.emit(relax.op.add(bb.emit(relax.op.add(attn, mlp)), x))


def emit_head(bb, cfg, w, h, n, dtype, compute="float"):
    """Final LayerNorm of the last token and lm_head: (1, 1, vocab) logits."""
    from tvm import relax

    if n > 1:
        h = bb.emit(relax.op.strided_slice(h, axes=[1], begin=[n - 1], end=[n]))
    ln = bb.emit(relax.op.nn.layer_norm(h, _arg(w["lnf_g"], dtype), _arg(w["lnf_b"], dtype), axes=[-1],
                                        epsilon=arch(cfg, "eps")))
    return projector(bb, dtype, compute)(ln, w["lm_head"])


# --------------------------------------------------------------------------- reference
def _layernorm_np(x, g, b, eps=EPS):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def _rope_np(x, past, rotary, base=ROPE_BASE):
    """x: (1, n, heads, head_dim) float64."""
    n = x.shape[1]
    half = rotary // 2
    pos = np.arange(past, past + n, dtype="float64")[:, None]
    inv = rope_inv_freq(rotary, base).astype("float64")
    ang = np.concatenate([pos * inv, pos * inv], axis=1)  # (n, rotary)
    cos, sin = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]
    r = x[..., :rotary]
    rot_half = np.concatenate([-r[..., half:], r[..., :half]], axis=-1)
    out = x.copy()
    out[..., :rotary] = r * cos + rot_half * sin
    return out


def reference_layer(cfg, w, x, kc, vc, past, return_kv=False):
    """NumPy float64 reference of the decoder layer output (and, with ``return_kv``, the
    new tokens' rotated keys and values, (1, n, heads, head_dim) each)."""
    d, hh, hd, rot = cfg["hidden"], cfg["heads"], cfg["head_dim"], cfg["rotary"]
    x = x.astype("float64")
    n = x.shape[1]
    base = arch(cfg, "rope_base")
    lin = lambda a, wt: a @ weight_np(wt) + bias_np(wt)  # noqa: E731
    ln = _layernorm_np(x, w["ln_g"], w["ln_b"], arch(cfg, "eps"))
    qkv = lin(ln, w["qkv"])
    q = _rope_np(qkv[..., :d].reshape(1, n, hh, hd), past, rot, base)
    k = _rope_np(qkv[..., d : 2 * d].reshape(1, n, hh, hd), past, rot, base)
    v = qkv[..., 2 * d :].reshape(1, n, hh, hd)
    new_kv = (k, v)
    if past > 0:
        k = np.concatenate([kc.astype("float64"), k], axis=1)
        v = np.concatenate([vc.astype("float64"), v], axis=1)
    s = np.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(hd)
    if n > 1:
        i = np.arange(n)[:, None]
        j = np.arange(past + n)[None, :]
        s = np.where(j > i + past, -np.inf, s)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    a = np.einsum("bhij,bjhd->bihd", p, v).reshape(1, n, d)
    attn = lin(a, w["dense"])
    mlp = lin(gelu_tanh_np(lin(ln, w["fc1"])), w["fc2"])
    out = attn + mlp + x
    return (out, *new_kv) if return_kv else out


def reference_head(cfg, w, h):
    h = h[:, -1:, :].astype("float64")
    ln = _layernorm_np(h, w["lnf_g"], w["lnf_b"], arch(cfg, "eps"))
    return ln @ weight_np(w["lm_head"]) + bias_np(w["lm_head"])
