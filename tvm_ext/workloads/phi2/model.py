"""Whole-model Phi-2 decode: N decoder layers + head, a KV cache and a greedy token loop
on the Relax VM.

Same q4f16_1 weight format and layer builder as ``kernels.py`` (``layers``), computed in
float32 (q4f32_1).  The weights are **function parameters**, not constants, so the
compiled module is small and the same kernels serve every layer:

* ``embed(token (1,) int32, <table>) -> (1, 1, hidden)``: by default (the benchmark model) the
  embedding is tied to lm_head's q4 weights (row ``token`` dequantized); a config with
  ``embed="table"`` (Phi-2, every checkpoint) passes its own table, same format; either way a
  token reads one row;
* ``layer(x, k_cache, v_cache, pos (1,) int32, <14 layer weights>) -> (x, k_cache, v_cache)``
  called once per layer with that layer's weights and cache;
* ``head(h, lnf_g, lnf_b, lm_packed, lm_scale, lm_bias) -> (1, 1, vocab)`` logits.

KV cache: per layer two fixed-capacity arrays (1, capacity, heads, head_dim) in ``kv_dtype`` (float32 by
default; float16, or int8 with scales beside: ``kv_cache.py``; the attention computes in float32).
``layer`` writes the new token's rotated key and value at ``pos`` **in place**
(``call_tir_inplace``; the returned caches alias the ones passed in) and attends over the
whole capacity with the causal mask ``j > pos``, so one compiled module serves every
position.  The greedy loop (``Decoder.generate``) runs in Python: embed, the layers, head,
argmax on the host.  Scheduling and compiling ``mod``: ``compiled.decoder``.

Weights are random from ``(seed, layer)``, generated one layer at a time (the full model's
weights are 1.5 GB; NumPy copies are dropped once uploaded), or read from a checkpoint by a
``source`` (``checkpoint.py``), also one layer at a time.  The architecture comes from the
config (``arch.py``: shapes, rotary dims, LayerNorm epsilon, tied or separate embedding, lm_head
bias, q4 or float weights); the named configs build what they always built.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .kernels import lower
from .kv_cache import cache_types, cached_attention, check_kv_dtype, kv_bytes, quantize_np, writer
from .layers import (CONFIGS, GROUP, arch, emit_head, emit_layer, embed_weights, head_weights, in_format,
                     layer_weights, q4_value, reference_head, reference_layer, weight_np)
from .prefill_attention import supported

DEFAULT_LAYERS = {"full": 32, "reduced": 2}
LAYER_WEIGHTS = ("ln_g", "ln_b", "qkv", "dense", "fc1", "fc2")
DTYPE = "float32"
PREFILL_ATTENTION = ("fused", "unfused")
MAX_POSITIONS = 2048  # Phi-2's context window (max_position_embeddings)


@dataclass
class Phi2Model:
    config: str
    cfg: dict
    layers: int
    capacity: int  # KV cache positions
    seed: int
    mod: object  # lowered (fused) Relax module with embed / layer / head, unscheduled
    compute: str = "float"  # the projections' arithmetic (layers.projector)
    prompt: int = 0  # tokens of the compiled prefill (0: none; see ``_build_module``)
    dtype: str = DTYPE  # activations, caches, biases and LayerNorm (float16 in ``step``'s GPU build)
    source: object = None  # a checkpoint's weights (layer_weights(i), head_weights(), embed_weights()); None: random
    kv_dtype: str = DTYPE  # the KV cache's storage (kv_cache.KV_DTYPES); the attention computes in ``dtype``
    prefill_attention: str = "unfused"  # the compiled prefill's attention (PREFILL_ATTENTION; see build_model)

    def layer_weights(self, i):
        """NumPy weights of layer ``i`` (regenerated, or read from the checkpoint, on each call)."""
        if self.source is not None:
            return self.source.layer_weights(i)
        return in_format(self.cfg, layer_weights(self.cfg, np.random.default_rng([self.seed, i])))

    def head_weights(self):
        if self.source is not None:
            return self.source.head_weights()
        return in_format(self.cfg, head_weights(self.cfg, np.random.default_rng([self.seed, self.layers])))

    def embed_weights(self, head=None):
        """The embedding table's arrays (what ``embed`` takes after the token): lm_head's words and scales
        where the embedding is tied (``head``: the head's weights if already at hand), else the table."""
        if arch(self.cfg, "embed") == "tied":
            return [a for a in (head or self.head_weights())["lm_head"][:-1]]
        if self.source is not None:
            w = self.source.embed_weights()
        else:
            rng = np.random.default_rng([self.seed, self.layers + 1])
            w = in_format(self.cfg, {"embed": embed_weights(self.cfg, rng)})["embed"]
        return list(w[:-1])

    def weight_bytes(self):
        """Bytes of all layers' and the head's weights (what a token streams)."""
        def size(arrays):  # the recipe's float32 arrays (biases, LayerNorm) go up in the model's dtype
            return sum(a.size * np.dtype(self.dtype).itemsize if a.dtype == np.float32 else a.nbytes for a in arrays)

        return self.layers * size(_flat(self.layer_weights(0))) + size(_flat(self.head_weights()))

    def kv_bytes(self, positions):
        """Bytes of keys + values (and int8's scales) of ``positions`` cached tokens over all layers."""
        return kv_bytes(self.layers, positions, self.cfg["heads"], self.cfg["head_dim"], self.kv_dtype)


def _flat(w, names=None):
    """The arrays (or Vars) of weights ``w`` in order, a missing bias (None) left out."""
    out = []
    for name in names or list(w):
        out += [a for a in w[name] if a is not None] if isinstance(w[name], tuple) else [w[name]]
    return out


def resolve_config(config):
    """(name, cfg) of a named config ("full", "reduced") or of an architecture dict (``arch.architecture``)."""
    if isinstance(config, dict):
        return config.get("name", "custom"), config
    if config not in CONFIGS:
        raise ValueError(f"config must be one of {sorted(CONFIGS)}, got {config!r}")
    return config, CONFIGS[config]


def check_config(config, layers, capacity):
    _, cfg = resolve_config(config)
    window = cfg.get("max_positions", MAX_POSITIONS)
    if int(layers) < 1:
        raise ValueError(f"layers must be at least 1, not {layers}")
    if int(capacity) < 1:
        raise ValueError(f"the KV cache needs at least 1 position, not {capacity}")
    if int(capacity) > window:
        raise ValueError(f"context overflow: {capacity} positions (past context + tokens), "
                         f"the model's window is {window}")


def build_model(config="full", layers=None, capacity=512, seed=0, compute="float", prompt=0,
                source=None, kv_dtype=DTYPE, prefill_attention="fused") -> Phi2Model:
    """The lowered (FuseOps + FuseTIR) Relax module of the decode step, and the weights' recipe.
    ``config``: a name in ``CONFIGS`` or an architecture (``arch.architecture``); ``source``: the
    weights of a checkpoint (``checkpoint.py``; default random from ``seed``).
    ``compute="int8"``: the projections quantize their activations to int8 (same weights and
    parameters; ``layers.projector``; q4 weights only).  ``prompt``: also compile a prefill of that many
    tokens (even; with int8 its projections are the q4 x int8 GEMM on repacked weights).  ``kv_dtype``: the KV
    cache's storage, float32, float16 or int8 (``kv_cache.py``).  ``prefill_attention``: "fused" -- the int8
    prefill's attention as one x86 kernel that skips the masked half (``prefill_attention.py``; the int8 path
    runs on x86 CPUs only, and where the kernel does not take the shape it stays unfused) -- or "unfused":
    scores, softmax and values as three kernels our rules schedule (the float prefill's always)."""
    name, cfg = resolve_config(config)
    check_kv_dtype(kv_dtype)
    if prefill_attention not in PREFILL_ATTENTION:
        raise ValueError(f"prefill_attention must be one of {', '.join(PREFILL_ATTENTION)}, not {prefill_attention!r}")
    layers = DEFAULT_LAYERS.get(name, 1) if layers is None else int(layers)
    check_config(config, layers, capacity)
    if compute == "int8" and arch(cfg, "weights") != "q4":
        raise ValueError(f"compute int8 runs on q4 weights, not {arch(cfg, 'weights')}")
    prompt = int(prompt)
    if prompt and (prompt < 2 or prompt % 2 or prompt > capacity):
        raise ValueError(f"a compiled prefill takes an even number of tokens from 2 to the cache's {capacity}, "
                         f"not {prompt}")
    fused = bool(prefill_attention == "fused" and compute == "int8" and prompt and supported(prompt, cfg["head_dim"]))
    mod, _ = lower(_build_module(cfg, int(capacity), compute, prompt, kv_dtype, fused), fusion=True)
    return Phi2Model(name, cfg, layers, int(capacity), int(seed), mod, compute, prompt, source=source,
                     kv_dtype=kv_dtype, prefill_attention="fused" if fused else "unfused")


# --------------------------------------------------------------------------- Relax module
def _te_embed(token, *table_and_dtype):
    """Row ``token[i]`` of the table: q4 (packed, scale) dequantized, or a float (vocab, hidden) table cast."""
    from tvm import te, tirx

    *table, dtype = table_and_dtype
    if len(table) == 1:
        (w,) = table
        return te.compute((1, token.shape[0], w.shape[1]), lambda b, i, c: tirx.Cast(dtype, w[token[i], c]),
                          name="embed")
    packed, scale = table
    _, kw = packed.shape
    return te.compute((1, token.shape[0], kw * 8), lambda b, i, c: q4_value(packed, scale, token[i], c, dtype),
                      name="embed")


def _weight_vars(cfg, names, repacked=False, dtype=DTYPE):
    """Relax parameters for the weights ``names``: {name: Var, or (packed, scale, bias) Vars of a q4 weight,
    or (w, bias) of a float one}, biases and LayerNorm in ``dtype``, None for a bias the config has not (the
    embedding table's; lm_head's without ``lm_bias``); ``repacked``: the projections in the layout of
    ``q4_int8_gemm.repack``."""
    from tvm import relax

    d, m, v = cfg["hidden"], cfg["mlp"], cfg["vocab"]
    shapes = {"qkv": (d, 3 * d), "dense": (d, d), "fc1": (d, m), "fc2": (m, d), "lm_head": (d, v), "embed": (d, v)}
    fmt = arch(cfg, "weights")
    out = {}
    for name in names:
        if name not in shapes:
            out[name] = relax.Var(name, relax.TensorType((d,), dtype))
            continue
        k, n = shapes[name]
        biased = name != "embed" and (name != "lm_head" or arch(cfg, "lm_bias"))
        bias = relax.Var(f"{name}_b", relax.TensorType((n,), dtype)) if biased else None
        if fmt != "q4":
            out[name] = (relax.Var(f"{name}_w", relax.TensorType((n, k), fmt)), bias)
        elif repacked:
            out[name] = (relax.Var(f"{name}_wq", relax.TensorType((n // 16, k // 8, 16), "uint32")),
                         relax.Var(f"{name}_ws", relax.TensorType((n // 16, k // GROUP, 16), "float16")), bias)
        else:
            out[name] = (relax.Var(f"{name}_q", relax.TensorType((n, k // 8), "uint32")),
                         relax.Var(f"{name}_s", relax.TensorType((n, k // GROUP), "float16")), bias)
    return out


def table_vars(cfg):
    """Relax parameters of the embedding table: lm_head's words and scales where it is tied, else the table's."""
    name = "lm_head" if arch(cfg, "embed") == "tied" else "embed"
    return list(_weight_vars(cfg, (name,))[name][:-1])


def _build_module(cfg, capacity, compute="float", prompt=0, kv_dtype=DTYPE, fused_prefill=False):
    from tvm import relax

    d, hh, hd = cfg["hidden"], cfg["heads"], cfg["head_dim"]
    bb = relax.BlockBuilder()
    cache_ts = [relax.TensorType(shape, dt) for shape, dt in cache_types(capacity, hh, hd, kv_dtype)]
    names = ("k_cache", "v_cache", "k_scale", "v_scale")

    def embed(name, n):
        token = relax.Var("token", relax.TensorType((n,), "int32"))
        table = table_vars(cfg)  # own Vars: one function each
        with bb.function(name, [token, *table]):
            with bb.dataflow():
                out = bb.emit_output(bb.emit_te(_te_embed, token, *table, DTYPE, primfunc_name_hint="embed_lookup"))
            bb.emit_func_output(out)

    def layer(name, n, kv_write, repacked, fused=False):
        x = relax.Var("x", relax.TensorType((1, n, d), DTYPE))
        cache = [relax.Var(n, t) for n, t in zip(names, cache_ts)]
        pos = relax.Var("pos", relax.TensorType((1,), "int32"))
        w = _weight_vars(cfg, LAYER_WEIGHTS, repacked)
        with bb.function(name, [x, *cache, pos, *_flat(w, LAYER_WEIGHTS)]):
            with bb.dataflow():
                caches = []
                attend = cached_attention(bb, cfg, cache, pos, kv_write, DTYPE, caches, fused)
                h = emit_layer(bb, cfg, w, x, DTYPE, attend, compute)
                out = bb.emit_output(relax.Tuple([h, *caches]))
            bb.emit_func_output(out)

    repacked = compute == "int8"  # the int8 projections read the weights of q4_int8_gemm.repack

    def head(name, n):
        h = relax.Var("h", relax.TensorType((1, n, d), DTYPE))
        head_w = _weight_vars(cfg, ("lnf_g", "lnf_b", "lm_head"), repacked)
        with bb.function(name, [h, *_flat(head_w, ("lnf_g", "lnf_b", "lm_head"))]):
            with bb.dataflow():
                out = bb.emit_output(emit_head(bb, cfg, head_w, h, n, DTYPE, compute))
            bb.emit_func_output(out)

    embed("embed", 1)
    layer("layer", 1, bb.add_func(writer(capacity, 1, hh, hd, DTYPE, kv_dtype), "kv_write"), repacked)
    head("head", 1)
    if prompt:
        embed("embed_prompt", prompt)
        kv_prompt = bb.add_func(writer(capacity, prompt, hh, hd, DTYPE, kv_dtype), "kv_write_prompt")
        layer("prefill", prompt, kv_prompt, repacked, fused_prefill)
        head("head_prompt", prompt)
    return bb.get()


# --------------------------------------------------------------------------- decoder
class Decoder:
    """The compiled decode step with its weights and KV caches on ``dev`` (``tvm.cpu(0)``)."""

    def __init__(self, model: Phi2Model, executable, dev=None, log=None, share=None):
        """``executable``: ``tvm.compile`` of ``model.mod`` (scheduled or not); ``share``: a
        Decoder of the same model on the same device whose weights this one uses too (its own
        caches are fresh)."""
        import tvm
        from tvm import relax

        log = log or (lambda msg: None)
        self.model = model
        self.dev = dev or tvm.cpu(0)
        self.rt = executable.jit() if hasattr(executable, "jit") else executable  # linked once
        self.vm = relax.VirtualMachine(self.rt, self.dev)
        self.rules = {}  # kernel name -> schedule it got (set by whoever scheduled the module)
        # the float32 arrays of the recipe (biases, LayerNorm) in the model's dtype; words and scales as they are
        up = lambda a: tvm.runtime.tensor(a.astype(model.dtype) if a.dtype == np.float32 else a, self.dev)  # noqa: E731
        # weights by layout, shared with ``share`` (uploading the layout this model needs once): the
        # float projections read the model's (N, K/8) words, the int8 ones ``q4_int8_gemm.repack``'s
        self.store = share.store if share is not None else {}
        layout = "repacked" if model.compute == "int8" else "plain"
        if layout not in self.store:
            t0, layers = time.time(), []
            for i in range(model.layers):
                w = model.layer_weights(i)
                layers.append([up(a) for a in _flat(_repacked(w) if layout == "repacked" else w, LAYER_WEIGHTS)])
                done = i + 1
                if done % 4 == 0 or done == model.layers:
                    left = (time.time() - t0) / done * (model.layers - done)
                    log(f"weights ({layout}): {done}/{model.layers} layers, ETA {left:.0f} s")
            head = model.head_weights()
            self.store[layout] = layers, [up(a) for a in _flat(
                _repacked(head, ("lm_head",)) if layout == "repacked" else head, ("lnf_g", "lnf_b", "lm_head"))]
            if "table" not in self.store:  # a tied embedding reads the model's layout
                self.store["table"] = [up(a) for a in model.embed_weights(head)]
        self.layer_w, self.head_w = self.store[layout]
        self.table = self.store["table"]
        types = cache_types(model.capacity, model.cfg["heads"], model.cfg["head_dim"], model.kv_dtype)
        self.caches = [[tvm.runtime.tensor(np.zeros(*t), self.dev) for t in types] for _ in range(model.layers)]

    def fill_past(self, positions, seed=0, keep=False):
        """Random keys and values (standard normal, the same whatever the cache's dtype) in the first
        ``positions`` slots of every layer's cache, stored as the cache stores them: a synthetic past
        context.  With ``keep``, returns them per layer as (k, v) arrays (1, positions, heads, head_dim),
        as stored (``reference_generate``'s ``past``)."""
        check_positions(self.model, positions)
        rng = np.random.default_rng([seed, 1 << 20])
        cfg, kv = self.model.cfg, self.model.kv_dtype
        shape = (1, self.model.capacity, cfg["heads"], cfg["head_dim"])
        kept = []
        for arrays in self.caches:
            for i, c in enumerate(arrays[:2]):
                a = np.zeros(shape, "float32")
                a[:, :positions] = rng.standard_normal((1, positions) + shape[2:])
                if kv == "int8":
                    q, scale = quantize_np(a)
                    c.copyfrom(q)
                    arrays[2 + i].copyfrom(np.ascontiguousarray(scale.transpose(0, 2, 1)))
                    a = q * scale[..., None]
                else:
                    a = a.astype(kv)
                    c.copyfrom(a)
                if keep:
                    kept.append(a[:, :positions].copy())
        return [tuple(kept[i:i + 2]) for i in range(0, len(kept), 2)] if keep else None

    def _i32(self, v):
        import tvm

        return tvm.runtime.tensor(np.array([v], "int32"), self.dev)

    def step(self, token, pos, call=None):
        """Logits (vocab,) of the token after ``token`` at position ``pos``."""
        call = call or (lambda name, *args: self.vm[name](*args))
        pos_t = self._i32(pos)
        x = call("embed", self._i32(token), *self.table)
        for i, w in enumerate(self.layer_w):
            x, *self.caches[i] = call("layer", x, *self.caches[i], pos_t, *w)
        return call("head", x, *self.head_w).numpy().reshape(-1)

    def prefill(self, tokens, start=0, call=None):
        """Logits (vocab,) after the prompt ``tokens`` (``model.prompt`` of them), all processed at
        once from position ``start``; their keys and values go into the caches."""
        if len(tokens) != self.model.prompt:
            raise ValueError(f"this model's prefill was compiled for {self.model.prompt} tokens, not {len(tokens)}")
        check_positions(self.model, start + len(tokens))
        call = call or (lambda name, *args: self.vm[name](*args))
        import tvm

        pos_t = self._i32(start)
        x = call("embed_prompt", tvm.runtime.tensor(np.asarray(tokens, "int32"), self.dev), *self.table)
        for i, w in enumerate(self.layer_w):
            x, *self.caches[i] = call("prefill", x, *self.caches[i], pos_t, *w)
        return call("head_prompt", x, *self.head_w).numpy().reshape(-1)

    def timed_kernels(self, run):
        """Seconds spent in each kernel (PrimFunc name, summed over its calls) during ``run(call)``,
        which makes its VM calls through ``call(name, *args)`` (``step`` and ``prefill`` take it),
        timed around every VM call."""
        return {name: secs for name, (secs, _calls) in self.timed_calls(run).items()}

    def timed_calls(self, run):
        """{kernel: (seconds, calls)} of ``run(call)`` (as ``timed_kernels``, with how often each ran)."""
        from tvm_ext.vm_calls import timed_calls

        return timed_calls(self.rt, self.dev, lambda vm: run(lambda name, *args: vm[name](*args)))

    def generate(self, prompt, tokens, start=0, on_token=None, on_id=None):
        """Greedy decode of ``tokens`` tokens after ``prompt`` (token ids; the cache holds
        ``start`` past positions before it): (generated ids, [logits of each step]).
        ``on_token(count)`` / ``on_id(id)`` are called as each token is generated."""
        if tokens < 1 or not len(prompt):
            raise ValueError(f"need a prompt and at least 1 token to generate, not {len(prompt)} and {tokens}")
        check_positions(self.model, start + len(prompt) + tokens - 1)
        vocab = self.model.cfg["vocab"]
        if any(not 0 <= int(t) < vocab for t in prompt):
            raise ValueError(f"token ids must be from 0 to the vocabulary's {vocab - 1}, not {list(prompt)}")
        pos, first = start, None
        if len(prompt) == self.model.prompt:  # the compiled prefill, then the first token from its logits
            first = self.prefill(prompt, start)
            pos += len(prompt) - 1
        else:
            for t in prompt[:-1]:
                self.step(int(t), pos)
                pos += 1
        tok, out, logits = int(prompt[-1]), [], []
        for _ in range(tokens):
            lg = self.step(tok, pos) if first is None else first
            first = None
            tok = int(np.argmax(lg))
            out.append(tok)
            logits.append(lg)
            pos += 1
            if on_id is not None:
                on_id(tok)
            if on_token is not None:
                on_token(len(out))
        return out, logits


def _repacked(w, names=("qkv", "dense", "fc1", "fc2")):
    """Weights ``w`` with the projections ``names`` in the layout of ``q4_int8_gemm.repack``."""
    from .q4_int8_gemm import repack

    out = dict(w)
    for name in names:
        packed, scale, bias = w[name]
        out[name] = (*repack(packed, scale), bias)
    return out


def check_positions(model, positions):
    if positions > model.capacity:
        raise ValueError(f"context overflow: {positions} positions needed, the KV cache holds {model.capacity}")


# --------------------------------------------------------------------------- reference
def reference_generate(model: Phi2Model, prompt, tokens, past=None, follow=None):
    """NumPy float64 greedy decode of the same model: (ids, [logits of each step]).
    ``past``: per layer (k, v) arrays (1, P, heads, head_dim) already in the cache;
    ``follow``: feed these ids instead of the reference's own argmax (teacher forcing, so
    logits can be compared step by step with another decoder's)."""
    cfg = model.cfg
    lws = [model.layer_weights(i) for i in range(model.layers)]
    hw = model.head_weights()
    table = weight_np((*model.embed_weights(hw), None))  # (hidden, vocab): column t is token t's embedding
    kv = [list(p) for p in past] if past is not None else [[None, None] for _ in range(model.layers)]
    start = 0 if past is None else past[0][0].shape[1]
    feed = list(prompt)
    out, logits = [], []
    pos = start
    while len(out) < tokens:
        tok = feed[pos - start]
        x = table[:, tok].reshape(1, 1, -1)
        for i, w in enumerate(lws):
            kc, vc = kv[i]
            x, k, v = reference_layer(cfg, w, x, kc, vc, pos, return_kv=True)
            kv[i] = [k if kc is None else np.concatenate([kc, k], 1), v if vc is None else np.concatenate([vc, v], 1)]
        pos += 1
        if pos - start >= len(prompt):
            lg = reference_head(cfg, hw, x).reshape(-1)
            nxt = int(np.argmax(lg))
            out.append(nxt)
            logits.append(lg)
            feed.append(follow[len(out) - 1] if follow is not None else nxt)
    return out, logits


__all__ = ["Phi2Model", "Decoder", "build_model", "reference_generate"]
