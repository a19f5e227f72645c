"""Phi-2 q4f16_1 decoder-layer kernels (decode and prefill) as Relax modules.

One Phi-2 decoder layer plus the final LayerNorm and lm_head, at real size
(``config="full"``: hidden 2560, 32 heads x 80, MLP 10240, vocab 51200, rotary over
32 of the 80 head dims) or reduced for tests (``config="reduced"``: hidden 256,
4 heads x 64, MLP 1024, vocab 1024).

Weights are q4f16_1: 4-bit values packed 8 per uint32 along the input dim, one
float16 scale per group of 32 input elements, value = (q - 7) * scale.  They are
random from ``seed`` and bound as Relax constants, so ``main`` takes only the
activations (hidden states and, for decode, the KV cache of the past tokens).

Each linear layer is ``matmul(x, dequantize(qweight, scale)) + bias`` where the
dequantize produces the (in, out) weight, so the unfused module has one kernel per
op (dequantize, matmul, add, gelu, ...) and the fused one (FuseOps + FuseTIR) has
the dequantize fused into the matmul with its epilogues.

``compute_dtype`` is the activation / dequantized-weight dtype: ``None`` means
float32 (q4f32_1, what the CPU runs); pass ``"float16"`` for CUDA.

Public API
----------
build_decode(context=512, config="full", fusion=True, compute_dtype=None, seed=0) -> Workload
build_prefill(tokens=128, config="full", fusion=True, compute_dtype=None, seed=0) -> Workload
kernels(workload) -> KernelSet            (per-kernel view used by the bench)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .base import Workload

CONFIGS = {
    "full": dict(hidden=2560, heads=32, head_dim=80, mlp=10240, vocab=51200, rotary=32),
    "reduced": dict(hidden=256, heads=4, head_dim=64, mlp=1024, vocab=1024, rotary=32),
}
GROUP = 32  # input elements per fp16 scale
EPS = 1e-5
ROPE_BASE = 10000.0


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


def _make_weights(cfg, seed):
    rng = np.random.default_rng(seed)
    d, m, v = cfg["hidden"], cfg["mlp"], cfg["vocab"]
    w = {}
    w["ln_g"] = (1.0 + 0.1 * rng.standard_normal(d)).astype("float32")
    w["ln_b"] = (0.02 * rng.standard_normal(d)).astype("float32")
    w["qkv"] = _quantized_linear(rng, d, 3 * d)
    w["dense"] = _quantized_linear(rng, d, d)
    w["fc1"] = _quantized_linear(rng, d, m)
    w["fc2"] = _quantized_linear(rng, m, d)
    w["lnf_g"] = (1.0 + 0.1 * rng.standard_normal(d)).astype("float32")
    w["lnf_b"] = (0.02 * rng.standard_normal(d)).astype("float32")
    w["lm_head"] = _quantized_linear(rng, d, v)
    return w, rng


# --------------------------------------------------------------------------- TE pieces
def _te_dequantize(packed, scale, dtype):
    from tvm import te, tirx

    n, kw = packed.shape
    k = kw * 8

    def f(i, j):  # (in, out)
        q = (packed[j, i // 8] >> (tirx.Cast("uint32", i % 8) * tirx.const(4, "uint32"))) & tirx.const(15, "uint32")
        return (tirx.Cast(dtype, q) - tirx.const(7, dtype)) * tirx.Cast(dtype, scale[j, i // GROUP])

    return te.compute((k, n), f, name="dequantize")


def _te_rope(qkv, offset, heads, head_dim, rotary, past, dtype):
    """Split one of q/k out of the fused qkv projection and apply partial rotary."""
    from tvm import te, tirx

    _, n, _ = qkv.shape
    half = rotary // 2

    def f(b, i, h, d):
        x = qkv[b, i, offset + h * head_dim + d]
        pos = tirx.Cast("float32", i + past)
        j = tirx.truncmod(d, half)
        inv = tirx.exp(tirx.Cast("float32", j) * tirx.const(-2.0 * math.log(ROPE_BASE) / rotary, "float32"))
        ang = pos * inv
        cos = tirx.Cast(dtype, tirx.cos(ang))
        sin = tirx.Cast(dtype, tirx.sin(ang))
        other = tirx.if_then_else(
            d < half,
            -qkv[b, i, offset + h * head_dim + tirx.min(d + half, head_dim - 1)],
            qkv[b, i, offset + h * head_dim + tirx.max(d - half, 0)],
        )
        return tirx.if_then_else(d < rotary, x * cos + other * sin, x)

    return te.compute((1, n, heads, head_dim), f, name="rope")


def _te_split_heads(qkv, offset, heads, head_dim):
    from tvm import te

    _, n, _ = qkv.shape
    return te.compute(
        (1, n, heads, head_dim), lambda b, i, h, d: qkv[b, i, offset + h * head_dim + d], name="split_heads"
    )


def _te_attn_score(q, k, head_dim, dtype):
    from tvm import te, tirx

    _, n, heads, _ = q.shape
    _, t, _, _ = k.shape
    r = te.reduce_axis((0, head_dim), name="r")
    scale = tirx.const(1.0 / math.sqrt(head_dim), dtype)
    return te.compute(
        (1, heads, n, t),
        lambda b, h, i, j: te.sum(q[b, i, h, r] * k[b, j, h, r] * scale, axis=r),
        name="attn_score",
    )


def _te_causal_mask(s, past, dtype):
    from tvm import te, tirx

    return te.compute(
        s.shape,
        lambda b, h, i, j: tirx.if_then_else(j > i + past, tirx.min_value(dtype), s[b, h, i, j]),
        name="causal_mask",
    )


def _te_attn_value(p, v):
    from tvm import te

    _, heads, n, t = p.shape
    _, _, _, head_dim = v.shape
    r = te.reduce_axis((0, t), name="r")
    return te.compute(
        (1, n, heads * head_dim),
        lambda b, i, c: te.sum(p[b, c // head_dim, i, r] * v[b, r, c // head_dim, c % head_dim], axis=r),
        name="attn_value",
    )


# --------------------------------------------------------------------------- Relax graph
def _linear(bb, x, wt, dtype, name):
    from tvm import relax

    packed, scale, bias = wt
    w = bb.emit_te(_te_dequantize, relax.const(packed), relax.const(scale), dtype, primfunc_name_hint="dequantize")
    y = bb.emit(relax.op.matmul(x, w, out_dtype=dtype))
    return bb.emit(relax.op.add(y, relax.const(bias.astype(dtype))))


def _emit_layer(bb, cfg, w, x, kc, vc, n, past, dtype):
    from tvm import relax

    d, hh, hd, rot = cfg["hidden"], cfg["heads"], cfg["head_dim"], cfg["rotary"]
    c = lambda a: relax.const(a.astype(dtype))  # noqa: E731
    ln = bb.emit(relax.op.nn.layer_norm(x, c(w["ln_g"]), c(w["ln_b"]), axes=[-1], epsilon=EPS))
    # attention branch
    qkv = _linear(bb, ln, w["qkv"], dtype, "qkv")
    q = bb.emit_te(_te_rope, qkv, 0, hh, hd, rot, past, dtype, primfunc_name_hint="rope")
    k = bb.emit_te(_te_rope, qkv, d, hh, hd, rot, past, dtype, primfunc_name_hint="rope")
    v = bb.emit_te(_te_split_heads, qkv, 2 * d, hh, hd, primfunc_name_hint="split_heads")
    if past > 0:
        k = bb.emit(relax.op.concat([kc, k], axis=1))
        v = bb.emit(relax.op.concat([vc, v], axis=1))
    s = bb.emit_te(_te_attn_score, q, k, hd, dtype, primfunc_name_hint="attn_score")
    if n > 1:
        s = bb.emit_te(_te_causal_mask, s, past, dtype, primfunc_name_hint="causal_mask")
    p = bb.emit(relax.op.nn.softmax(s, axis=-1))
    a = bb.emit_te(_te_attn_value, p, v, primfunc_name_hint="attn_value")
    attn = _linear(bb, a, w["dense"], dtype, "dense")
    # MLP branch, from the same LayerNorm output
    h1 = bb.emit(relax.op.nn.gelu_tanh(_linear(bb, ln, w["fc1"], dtype, "fc1")))
    mlp = _linear(bb, h1, w["fc2"], dtype, "fc2")
    return bb.emit(relax.op.add(bb.emit(relax.op.add(attn, mlp)), x))


def _emit_head(bb, cfg, w, h, n, dtype):
    from tvm import relax

    c = lambda a: relax.const(a.astype(dtype))  # noqa: E731
    if n > 1:
        h = bb.emit(relax.op.strided_slice(h, axes=[1], begin=[n - 1], end=[n]))
    ln = bb.emit(relax.op.nn.layer_norm(h, c(w["lnf_g"]), c(w["lnf_b"]), axes=[-1], epsilon=EPS))
    return _linear(bb, ln, w["lm_head"], dtype, "lm_head")


def _build_module(cfg, w, n, past, dtype, funcs):
    """Relax module with the requested functions: "main" (layer+head), "layer", "head"."""
    from tvm import relax

    d, hh, hd = cfg["hidden"], cfg["heads"], cfg["head_dim"]
    bb = relax.BlockBuilder()

    def acts():
        x = relax.Var("x", relax.TensorType((1, n, d), dtype))
        params = [x]
        kc = vc = None
        if past > 0:
            kc = relax.Var("k_cache", relax.TensorType((1, past, hh, hd), dtype))
            vc = relax.Var("v_cache", relax.TensorType((1, past, hh, hd), dtype))
            params += [kc, vc]
        return x, kc, vc, params

    if "main" in funcs:
        x, kc, vc, params = acts()
        with bb.function("main", params):
            with bb.dataflow():
                h = _emit_layer(bb, cfg, w, x, kc, vc, n, past, dtype)
                out = bb.emit_output(_emit_head(bb, cfg, w, h, n, dtype))
            bb.emit_func_output(out)
    if "layer" in funcs:
        x, kc, vc, params = acts()
        with bb.function("layer", params):
            with bb.dataflow():
                out = bb.emit_output(_emit_layer(bb, cfg, w, x, kc, vc, n, past, dtype))
            bb.emit_func_output(out)
    if "head" in funcs:
        h = relax.Var("h", relax.TensorType((1, n, d), dtype))
        with bb.function("head", [h]):
            with bb.dataflow():
                out = bb.emit_output(_emit_head(bb, cfg, w, h, n, dtype))
            bb.emit_func_output(out)
    return bb.get()


def _dequantize_matmul_pattern():
    """call_tir(matmul, (x, call_tir(dequantize, ...))): the q4 dequantize is fused into its
    matmul first (FuseOps alone never fuses an injective producer into an out-ewise-fusable
    consumer), then FuseOps adds the bias / gelu / residual epilogues, as MLC-LLM does."""
    from tvm import relax
    from tvm.relax.dpl import pattern as P

    dq = P._is_call_tir(P.wildcard(), P.wildcard())
    mm = P._is_call_tir(P.wildcard(), P.TuplePattern([P.wildcard(), dq]))

    def check(ctx):
        d, m = ctx.annotated_expr["dq"], ctx.annotated_expr["mm"]
        return d.args[0].name_hint.startswith("dequantize") and m.args[0].name_hint.startswith("matmul")

    return relax.transform.FusionPattern("dequantize_matmul", mm, {"dq": dq, "mm": mm}, check)


def _primitive_groups(mod):
    from tvm import relax

    out = {}
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and func.attrs is not None and "Primitive" in func.attrs:
            out[gv.name_hint] = _callees(func)
    return out


def lower(mod, fusion: bool):
    """LegalizeOps, then when ``fusion``: dequantize+matmul pattern fusion, FuseOps, FuseTIR.
    Returns (module, groups); groups maps each fused kernel name to the names of the
    unfused kernels (those of ``lower(mod, False)``) it was made of."""
    from tvm import relax

    mod = relax.transform.LegalizeOps()(mod)
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    groups = {}
    if fusion:
        mod = relax.transform.FuseOpsByPattern([_dequantize_matmul_pattern()], bind_constants=False)(mod)
        first = _primitive_groups(mod)
        mod = relax.transform.FuseTIR()(mod)
        mod = relax.transform.AnnotateTIROpPattern()(mod)
        mod = relax.transform.FuseOps()(mod)
        second = _primitive_groups(mod)
        mod = relax.transform.FuseTIR()(mod)
        groups = dict(first)
        for name, callees in second.items():
            groups[name] = [p for c in callees for p in first.get(c, [c])]
    mod = relax.transform.DeadCodeElimination()(mod)
    return mod, groups


def _callees(func):
    """Names of the PrimFuncs a (FuseOps-grouped) Relax function calls, in order."""
    from tvm import relax

    names = []
    for block in func.body.blocks:
        for binding in block.bindings:
            val = binding.value
            if isinstance(val, relax.Call) and getattr(val.op, "name", None) == "relax.call_tir":
                names.append(val.args[0].name_hint)
    return names


# --------------------------------------------------------------------------- reference
def _layernorm_np(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + EPS) * g + b


def _gelu_new_np(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _rope_np(x, past, rotary):
    """x: (1, n, heads, head_dim) float64."""
    n = x.shape[1]
    half = rotary // 2
    pos = np.arange(past, past + n, dtype="float64")[:, None]
    inv = np.exp(np.arange(half, dtype="float64") * (-2.0 * math.log(ROPE_BASE) / rotary))
    ang = np.concatenate([pos * inv, pos * inv], axis=1)  # (n, rotary)
    cos, sin = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]
    r = x[..., :rotary]
    rot_half = np.concatenate([-r[..., half:], r[..., :half]], axis=-1)
    out = x.copy()
    out[..., :rotary] = r * cos + rot_half * sin
    return out


def reference_layer(cfg, w, x, kc, vc, past):
    """NumPy float64 reference of the decoder layer output."""
    d, hh, hd, rot = cfg["hidden"], cfg["heads"], cfg["head_dim"], cfg["rotary"]
    x = x.astype("float64")
    n = x.shape[1]
    lin = lambda a, wt: a @ dequantize_np(wt[0], wt[1]) + wt[2].astype("float64")  # noqa: E731
    ln = _layernorm_np(x, w["ln_g"], w["ln_b"])
    qkv = lin(ln, w["qkv"])
    q = _rope_np(qkv[..., :d].reshape(1, n, hh, hd), past, rot)
    k = _rope_np(qkv[..., d : 2 * d].reshape(1, n, hh, hd), past, rot)
    v = qkv[..., 2 * d :].reshape(1, n, hh, hd)
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
    mlp = lin(_gelu_new_np(lin(ln, w["fc1"])), w["fc2"])
    return attn + mlp + x


def reference_head(cfg, w, h):
    h = h[:, -1:, :].astype("float64")
    ln = _layernorm_np(h, w["lnf_g"], w["lnf_b"])
    return ln @ dequantize_np(*w["lm_head"][:2]) + w["lm_head"][2].astype("float64")


# --------------------------------------------------------------------------- builders
def _build(kind, n, past, config, fusion, compute_dtype, seed):
    if config not in CONFIGS:
        raise ValueError(f"config must be one of {sorted(CONFIGS)}, got {config!r}")
    cfg = CONFIGS[config]
    dtype = compute_dtype or "float32"
    w, rng = _make_weights(cfg, seed)
    x = rng.standard_normal((1, n, cfg["hidden"])).astype(dtype)
    inputs = [x]
    if past > 0:
        shp = (1, past, cfg["heads"], cfg["head_dim"])
        inputs += [rng.standard_normal(shp).astype(dtype), rng.standard_normal(shp).astype(dtype)]
    mod, groups = lower(_build_module(cfg, w, n, past, dtype, ("main",)), fusion)

    def reference(ins):
        kc = ins[1] if past > 0 else None
        vc = ins[2] if past > 0 else None
        h = reference_layer(cfg, w, ins[0], kc, vc, past)
        return reference_head(cfg, w, h).astype(dtype)

    tol = 2e-3 if dtype == "float32" else 3e-2
    options = dict(kind=kind, tokens=n, context=past, config=config, fusion=fusion, compute_dtype=dtype, seed=seed)
    wl = Workload(
        name=f"phi2-{kind}",
        mod=mod,
        inputs=inputs,
        reference=reference,
        exact=False,
        rtol=tol,
        atol=tol,
        options=options,
    )
    # private extras for the bench / tests (not part of the Workload record)
    wl._phi2 = dict(cfg=cfg, weights=w, n=n, past=past, dtype=dtype, groups=groups)
    return wl


def build_decode(context=512, config="full", fusion=True, compute_dtype=None, seed=0) -> Workload:
    """Decode step: batch 1, one new token attending to ``context`` cached tokens (+ itself)."""
    return _build("decode", 1, int(context), config, bool(fusion), compute_dtype, seed)


def build_prefill(tokens=128, config="full", fusion=True, compute_dtype=None, seed=0) -> Workload:
    """Prefill: batch 1, ``tokens`` new tokens with a causal mask, no cache; lm_head on the last."""
    return _build("prefill", int(tokens), 0, config, bool(fusion), compute_dtype, seed)


# --------------------------------------------------------------------------- kernel view
@dataclass
class Kernel:
    name: str  # PrimFunc name in the lowered module
    func: object  # tirx.PrimFunc
    calls: int  # calls per layer (or per head)
    part: str  # "layer" or "head"
    parts: list = field(default_factory=list)  # unfused kernel names it was fused from


@dataclass
class KernelSet:
    fusion: bool
    dtype: str
    kernels: list  # list[Kernel], in call order, one entry per distinct PrimFunc and part
    mod: object  # lowered module with "layer" and "head" Relax functions


def kernels(workload: Workload) -> KernelSet:
    """Per-kernel view of a phi2 workload: the PrimFuncs called by one decoder layer and by
    the head (final LayerNorm + lm_head), with call counts and, when fused, the unfused
    kernels each fused kernel replaces (names match ``kernels()`` of the unfused build)."""
    from tvm import relax

    ex = workload._phi2
    fusion = workload.options["fusion"]
    mod, groups = lower(
        _build_module(ex["cfg"], ex["weights"], ex["n"], ex["past"], ex["dtype"], ("layer", "head")), fusion
    )
    out = []
    for part in ("layer", "head"):
        seen = {}
        for block in mod[part].body.blocks:
            for b in block.bindings:
                val = b.value
                if isinstance(val, relax.Call) and getattr(val.op, "name", None) == "relax.call_tir":
                    name = val.args[0].name_hint
                    if name in seen:
                        seen[name].calls += 1
                    else:
                        seen[name] = Kernel(name, mod[name], 1, part, list(groups.get(name, [name])))
                        out.append(seen[name])
    return KernelSet(fusion, ex["dtype"], out, mod)
