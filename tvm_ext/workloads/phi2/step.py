"""The whole Phi-2 decode step as one Relax function, for GPUs: ``decode`` = embed, every layer, head.

Why: ``model.Decoder`` calls the VM once per layer (34 calls a token) and each call launches a dozen
kernels; on a GPU one layer streams its weights in ~10 us, less than those launches take.  Here the
layers are inline in one function (``STEP``) whose parameters are all static (``num_input`` 0): the
token and the position go into two device tensors that ``StepDecoder`` rewrites in place before
each call, the caches are written in place, the weights never move.  Relax's RewriteCUDAGraph
(``relax.backend.use_cuda_graph``, which ``compile_step`` sets on CUDA targets) then captures every
kernel of the step but the last (it writes the returned logits) as one CUDA graph at the first call
and replays it after.

``build_step(config, layers, capacity, seed, dtype)``: a ``model.Phi2Model`` whose module holds
``decode(token, pos, caches.., layer weights.., head weights..) -> logits (1, 1, vocab)`` (the embedding
reads the head's lm_head words and scales)
(the kernels are the ones ``model.build_model`` makes: the BlockBuilder and FuseOps keep one
PrimFunc per distinct kernel); ``StepDecoder``: ``model.Decoder``'s weights, caches and ``generate``
with ``step`` as one call.  ``dtype``: float16 on GPUs (q4f16_1), float32 on CPUs.
"""
from __future__ import annotations

import numpy as np

from .kernels import lower
from .kv_cache import cached_attention, writer
from .layers import emit_head, emit_layer
from .model import (DEFAULT_LAYERS, LAYER_WEIGHTS, Decoder, Phi2Model, _flat, _te_embed, _weight_vars, check_config,
                    resolve_config, table_vars)

STEP = "decode"
HEAD_WEIGHTS = ("lnf_g", "lnf_b", "lm_head")


def _kv_write_gpu(capacity, heads, head_dim, dtype):
    """``kv_cache.writer``'s one-token write with its thread bindings (a block a head, a thread an element),
    marked scheduled."""
    from tvm.script import tirx as T

    @T.prim_func(private=True)
    def kv_write(cache: T.Buffer((1, capacity, heads, head_dim), dtype),
                 new: T.Buffer((1, 1, heads, head_dim), dtype), pos: T.Buffer((1,), "int32")):
        T.func_attr({"op_pattern": 8, "tirx.noalias": True, "tirx.is_scheduled": True})
        for h in T.thread_binding(heads, thread="blockIdx.x"):
            for d in T.thread_binding(head_dim, thread="threadIdx.x"):
                cache[0, pos[0], h, d] = new[0, 0, h, d]

    return kv_write


def _build_step(cfg, layers: int, capacity: int, dtype: str, gpu: bool):
    from tvm import relax

    hh, hd = cfg["heads"], cfg["head_dim"]
    bb = relax.BlockBuilder()
    cache_t = relax.TensorType((1, capacity, hh, hd), dtype)
    token = relax.Var("token", relax.TensorType((1,), "int32"))
    pos = relax.Var("pos", relax.TensorType((1,), "int32"))
    caches = [(relax.Var(f"k_cache{i}", cache_t), relax.Var(f"v_cache{i}", cache_t)) for i in range(layers)]
    weights = [_weight_vars(cfg, LAYER_WEIGHTS, dtype=dtype) for _ in range(layers)]
    head_w = _weight_vars(cfg, HEAD_WEIGHTS, dtype=dtype)
    tied = cfg.get("embed", "tied") == "tied"
    table = head_w["lm_head"][:-1] if tied else table_vars(cfg)  # a tied embedding reads lm_head's words
    kv_write = bb.add_func(_kv_write_gpu(capacity, hh, hd, dtype) if gpu else writer(capacity, 1, hh, hd, dtype, dtype),
                           "kv_write")
    params = [token, pos] + [c for pair in caches for c in pair]
    params += [v for w in weights for v in _flat(w, LAYER_WEIGHTS)] + _flat(head_w, HEAD_WEIGHTS)
    if not tied:
        params += list(table)  # a separate table comes last
    with bb.function(STEP, params, attrs={"num_input": 0}):  # every parameter static: one CUDA graph
        with bb.dataflow():
            x = bb.emit_te(_te_embed, token, *table, dtype, primfunc_name_hint="embed_lookup")
            for (kc, vc), w in zip(caches, weights):
                attend = cached_attention(bb, cfg, [kc, vc], pos, kv_write, dtype, [])
                x = emit_layer(bb, cfg, w, x, dtype, attend)
            out = bb.emit_output(emit_head(bb, cfg, head_w, x, 1, dtype))
        bb.emit_func_output(out)
    return bb.get()


def build_step(config="full", layers=None, capacity=512, seed=0, dtype="float16", gpu=True) -> Phi2Model:
    """The lowered (fused) module of the one-function decode step (module doc) and the weights' recipe;
    ``gpu``: the KV-cache write with its thread bindings (else plain loops, for a CPU)."""
    name, cfg = resolve_config(config)
    layers = DEFAULT_LAYERS.get(name, 1) if layers is None else int(layers)
    check_config(config, layers, capacity)
    mod, _ = lower(_build_step(cfg, layers, int(capacity), dtype, gpu), fusion=True)
    return Phi2Model(name, cfg, layers, int(capacity), int(seed), mod, dtype=dtype, kv_dtype=dtype)


def compile_step(mod, target):
    """``tvm.compile`` of a scheduled step module; on CUDA with Relax's CUDA-graph rewriting on."""
    import tvm

    config = {"relax.backend.use_cuda_graph": True} if target.kind.name == "cuda" else {}
    with tvm.transform.PassContext(opt_level=3, config=config):
        return tvm.compile(mod, target=target)


class StepDecoder(Decoder):
    """``Decoder`` whose ``step`` is one call of ``STEP``: the token and position written into the
    same two device tensors each time (a captured CUDA graph reads them there), the caches in place."""

    def __init__(self, model: Phi2Model, executable, dev=None, log=None, share=None):
        super().__init__(model, executable, dev=dev, log=log, share=share)
        self.token_t, self.pos_t = self._i32(0), self._i32(0)
        self.args = [self.token_t, self.pos_t] + [c for pair in self.caches for c in pair]
        self.args += [a for w in self.layer_w for a in w] + list(self.head_w)
        if model.cfg.get("embed", "tied") != "tied":
            self.args += list(self.table)

    def step(self, token, pos, call=None):
        self.token_t.copyfrom(np.array([token], "int32"))
        self.pos_t.copyfrom(np.array([pos], "int32"))
        call = call or (lambda name, *args: self.vm[name](*args))
        return call(STEP, *self.args).numpy().reshape(-1)

    def prefill(self, tokens, start=0, call=None):
        raise ValueError("the one-function decode step has no compiled prefill: its prompt runs token by token")
