"""MLC-LLM's converted Phi weights: ``mlc-chat-config.json`` + ``ndarray-cache.json`` + ``params_shard_*.bin``.

MLC's q4f16_1 is the format our decoder computes in (``q_weight`` (out, in/8) uint32, eight 4-bit values per
word, ``q_scale`` (out, in/32) float16, value ``(q - 7) * scale``), so its tensors are taken as they are; its
unquantized q0f16 / q0f32 come as float.  Names are MLC's Phi model's (``transformer.h.{i}.mixer.Wqkv``, ...).
The shards are memory-mapped; ``ndarray-cache.json`` gives each tensor's shard, byte offset, dtype and
encoding ("raw", or "f32-to-bf16": a float32 parameter stored as bfloat16).

``save(directory, checkpoint)`` writes a q4 checkpoint (``checkpoint.load(..., weights="q4")``) in this form:
a Hugging Face checkpoint converted to q4f16_1 as ``mlc_llm convert_weight`` lays it out, and the tests' way
to make one.
"""
from __future__ import annotations

import json
import os

import numpy as np

from .tensors import check_shape, missing, release, shape_of, whole

QUANTIZATIONS = ("q4f16_1", "q0f16", "q0f32")
MODEL_TYPES = ("phi", "phi-msft")
DTYPES = {"uint32": np.uint32, "float16": np.float16, "float32": np.float32}
PER_LAYER = {"ln_g": "ln.weight", "ln_b": "ln.bias", "qkv": "mixer.Wqkv", "dense": "mixer.out_proj",
             "fc1": "mlp.fc1", "fc2": "mlp.fc2"}
GLOBAL = {"lnf_g": "lm_head.ln.weight", "lnf_b": "lm_head.ln.bias", "lm_head": "lm_head.linear",
          "embed": "transformer.embd"}


def _mlc_name(name, layer):
    """MLC's name of our weight ``name`` (a matrix's without the .q_weight/.weight suffix)."""
    table = GLOBAL if layer is None else PER_LAYER
    base, bias = (name[:-2], True) if name.endswith("_b") and name not in table else (name, False)
    stem = GLOBAL[base] if layer is None else f"transformer.h.{layer}.{PER_LAYER[base]}"
    return f"{stem}.bias" if bias else stem


def read_config(path) -> tuple:
    """(our numbers, layers, quantization) from mlc-chat-config.json; one line for what we cannot run."""
    with open(path) as f:
        c = json.load(f)
    if c.get("model_type") not in MODEL_TYPES:
        raise ValueError(f"{path}: model_type {c.get('model_type')!r}, not phi (Phi-2)")
    quant = c.get("quantization")
    if quant not in QUANTIZATIONS:
        raise ValueError(f"{path}: quantization {quant!r}; this reader takes {', '.join(QUANTIZATIONS)}")
    m = c.get("model_config", {})
    get = lambda *keys, default=None: next((m[k] for k in keys if m.get(k) is not None), default)  # noqa: E731
    hidden, heads = int(get("hidden_size", "n_embd")), int(get("num_attention_heads", "n_head"))
    kv = get("num_key_value_heads", "n_head_kv", default=heads) or heads
    if int(kv) != heads:
        raise ValueError(f"{path}: {kv} key/value heads for {heads} heads: our Phi decoder has no grouped attention")
    rotary = get("rotary_dim")
    cfg = dict(hidden=hidden, heads=heads, mlp=int(get("intermediate_size", "n_inner", default=4 * hidden)),
               vocab=int(get("vocab_size", default=c.get("vocab_size"))),
               eps=float(get("layer_norm_eps", "layer_norm_epsilon", default=1e-5)),
               partial_rotary_factor=(int(rotary) / (hidden // heads) if rotary is not None
                                      else float(get("partial_rotary_factor", default=0.5))),
               rope_base=float(get("position_embedding_base", "rope_theta", default=10000.0)),
               max_positions=int(get("context_window_size", "n_positions", default=c.get("context_window_size",
                                                                                            2048))),
               lm_bias=True)
    return cfg, int(get("num_hidden_layers", "n_layer")), quant


class MLCReader:
    """``checkpoint``'s reader protocol over an MLC weight directory."""

    def __init__(self, path):
        self.path = path
        conf = os.path.join(path, "mlc-chat-config.json")
        if not os.path.isfile(conf):
            raise ValueError(f"{path}: ndarray-cache.json without mlc-chat-config.json (the model's config)")
        self.cfg, self.layers, self.stored = read_config(conf)
        with open(os.path.join(path, "ndarray-cache.json")) as f:
            cache = json.load(f)
        self.index, self.maps = {}, {}
        for shard in cache.get("records", []):
            for r in shard["records"]:
                self.index[r["name"]] = (shard["dataPath"], r)

    def _tensor(self, name):
        if name not in self.index:
            raise missing(self.path, name)
        file, r = self.index[name]
        if r["dtype"] not in DTYPES or r.get("format", "raw") not in ("raw", "f32-to-bf16"):
            raise ValueError(f"{self.path}: {name} is {r['dtype']} ({r.get('format')}); this reader takes "
                             f"{', '.join(DTYPES)} raw or f32-to-bf16")
        if file not in self.maps:
            self.maps[file] = np.memmap(os.path.join(self.path, file), dtype=np.uint8, mode="r")
        raw = self.maps[file][r["byteOffset"]:r["byteOffset"] + r["nbytes"]]
        if r.get("format") == "f32-to-bf16":
            return (raw.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(r["shape"])
        return raw.view(DTYPES[r["dtype"]]).reshape(r["shape"])

    def parts(self, name, layer=None):
        """The matrix ``name`` as one row part (``tensors.whole``) of views of the file."""
        stem = _mlc_name(name, layer)
        n, k = shape_of(self.cfg, name)
        if f"{stem}.q_weight" in self.index:
            w = check_shape(f"{self.path}: {stem}.q_weight", self._tensor(f"{stem}.q_weight"), (n, k // 8))
            s = check_shape(f"{self.path}: {stem}.q_scale", self._tensor(f"{stem}.q_scale"), (n, k // 32))
            return [(n, lambda r0, r1: ("q4", w[r0:r1], s[r0:r1]))]
        w = check_shape(f"{self.path}: {stem}.weight", self._tensor(f"{stem}.weight"), (n, k))
        return [(n, lambda r0, r1: ("float", w[r0:r1]))]

    def matrix(self, name, layer=None):
        return whole(self.parts(name, layer))

    def vector(self, name, layer=None):
        mlc = _mlc_name(name, layer)
        return np.asarray(check_shape(f"{self.path}: {mlc}", self._tensor(mlc), shape_of(self.cfg, name)), np.float32)

    def release(self):
        release(self.maps.values())

    def tokenizer(self):
        from .tokenizer import beside

        return beside(self.path)


def save(directory, checkpoint, shard_bytes=32 << 20):
    """Write the q4 ``checkpoint`` (``checkpoint.load(..., weights="q4")``) as MLC's q4f16_1 in ``directory``:
    the tensors in shards of about ``shard_bytes``, one layer read at a time."""
    if checkpoint.cfg["weights"] != "q4":
        raise ValueError("save writes q4f16_1: load the checkpoint with weights='q4'")
    os.makedirs(directory, exist_ok=True)
    cfg, src = checkpoint.cfg, checkpoint.source
    shards, current, state = [], [], {"file": None, "offset": 0}

    def close():
        if state["file"] is not None:
            state["file"].close()
            shards.append({"dataPath": os.path.basename(state["file"].name), "format": "raw-shard",
                           "nbytes": state["offset"], "records": list(current)})
            current.clear()
            state["file"] = None

    def put(name, array):
        array = np.ascontiguousarray(array)
        if state["file"] is None or state["offset"] + array.nbytes > shard_bytes and current:
            close()
            state["file"], state["offset"] = open(os.path.join(directory, f"params_shard_{len(shards)}.bin"), "wb"), 0
        state["file"].write(array.tobytes())
        current.append({"name": name, "shape": list(array.shape), "dtype": str(array.dtype), "format": "raw",
                        "nbytes": array.nbytes, "byteOffset": state["offset"]})
        state["offset"] += array.nbytes

    def put_weights(w, layer):
        for ours, value in w.items():
            stem = _mlc_name(ours, layer)
            if isinstance(value, tuple):
                put(f"{stem}.q_weight", value[0])
                put(f"{stem}.q_scale", value[1])
                if value[-1] is not None:
                    put(f"{stem}.bias", value[-1].astype(np.float16))
            else:
                put(stem, value.astype(np.float16))

    packed, scale, _ = src.embed_weights()
    put_weights({"embed": (packed, scale, None)}, None)
    for i in range(checkpoint.layers):
        put_weights(src.layer_weights(i), i)
    put_weights(src.head_weights(), None)
    close()
    with open(os.path.join(directory, "ndarray-cache.json"), "w") as f:
        json.dump({"metadata": {"ParamSize": sum(len(s["records"]) for s in shards)}, "records": shards}, f)
    model_config = dict(hidden_size=cfg["hidden"], num_attention_heads=cfg["heads"], intermediate_size=cfg["mlp"],
                        vocab_size=cfg["vocab"], num_hidden_layers=checkpoint.layers, layer_norm_eps=cfg["eps"],
                        partial_rotary_factor=cfg["rotary"] / cfg["head_dim"],
                        position_embedding_base=cfg["rope_base"], context_window_size=cfg["max_positions"])
    with open(os.path.join(directory, "mlc-chat-config.json"), "w") as f:
        json.dump({"model_type": "phi", "quantization": "q4f16_1", "model_config": model_config,
                   "vocab_size": cfg["vocab"], "context_window_size": cfg["max_positions"]}, f, indent=1)
    return directory
