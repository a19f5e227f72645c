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

from dataclasses import dataclass, field

import numpy as np

from ..base import Workload

from .layers import (CONFIGS, EPS, GROUP, ROPE_BASE, attention, dequantize_np,  # noqa: F401
                          emit_head, emit_layer, emit_rope_qkv, head_weights, layer_weights,
                          reference_head, reference_layer)


def _make_weights(cfg, seed):
    rng = np.random.default_rng(seed)
    w = layer_weights(cfg, rng)
    w.update(head_weights(cfg, rng))
    return w, rng


def _emit_layer(bb, cfg, w, x, kc, vc, n, past, dtype):
    """The layer with a static ``past``: the cache of past keys/values is concatenated."""
    from tvm import relax

    def attend(qkv):
        q, k, v = emit_rope_qkv(bb, cfg, qkv, past, dtype)
        if past > 0:
            k = bb.emit(relax.op.concat([kc, k], axis=1))
            v = bb.emit(relax.op.concat([vc, v], axis=1))
        return attention(bb, q, k, v, cfg["head_dim"], dtype, past if n > 1 else None)

    return emit_layer(bb, cfg, w, x, dtype, attend)


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
                out = bb.emit_output(emit_head(bb, cfg, w, h, n, dtype))
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
                out = bb.emit_output(emit_head(bb, cfg, w, h, n, dtype))
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
            out[gv.name_hint] = callees(func)
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


def callees(func):
    """Names of the PrimFuncs a (FuseOps-grouped) Relax function calls, in order."""
    from tvm import relax

    names = []
    for block in func.body.blocks:
        for binding in block.bindings:
            val = binding.value
            if isinstance(val, relax.Call) and getattr(val.op, "name", None) == "relax.call_tir":
                names.append(val.args[0].name_hint)
    return names


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
