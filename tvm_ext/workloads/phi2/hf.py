"""Hugging Face ``PhiForCausalLM`` checkpoints: ``config.json`` + ``model*.safetensors`` (one file or shards
with ``model.safetensors.index.json``), F32 / F16 / BF16, and ``tokenizer.json`` beside them.

Each safetensors file is memory-mapped (its header is 8 bytes of length and a JSON index; the tensors follow,
row-major): a tensor is a view of the mapping until ``checkpoint.Source`` converts it, so the file is never
in RAM twice.  The header is read here rather than through ``safetensors.safe_open``: NumPy has no bfloat16,
and the safetensors library's NumPy loader refuses BF16 tensors (Phi-2 ships F16; BF16 is common in
fine-tunes), while a BF16 view widens to float32 exactly with a 16-bit shift.
"""
from __future__ import annotations

import glob
import json
import os

import numpy as np

from .tensors import check_shape, missing, release, shape_of, whole

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
ARCHITECTURE = "PhiForCausalLM"
PER_LAYER = {"ln_g": ("input_layernorm.weight",), "ln_b": ("input_layernorm.bias",),
             "qkv": tuple(f"self_attn.{p}_proj.weight" for p in "qkv"),
             "qkv_b": tuple(f"self_attn.{p}_proj.bias" for p in "qkv"),
             "dense": ("self_attn.dense.weight",), "dense_b": ("self_attn.dense.bias",),
             "fc1": ("mlp.fc1.weight",), "fc1_b": ("mlp.fc1.bias",), "fc2": ("mlp.fc2.weight",),
             "fc2_b": ("mlp.fc2.bias",)}
GLOBAL = {"lnf_g": "model.final_layernorm.weight", "lnf_b": "model.final_layernorm.bias",
          "lm_head": "lm_head.weight", "lm_head_b": "lm_head.bias", "embed": "model.embed_tokens.weight"}


def read_config(path) -> dict:
    """Our decoder's numbers from a ``PhiForCausalLM`` config.json; one line for what it cannot run."""
    with open(path) as f:
        c = json.load(f)
    archs = c.get("architectures") or [c.get("model_type", "?")]
    if ARCHITECTURE not in archs:
        raise ValueError(f"{path}: architecture {', '.join(archs)}, not {ARCHITECTURE} (Phi-2)")
    rope = c.get("rope_parameters") or {}
    heads = int(c["num_attention_heads"])
    unsupported = {"qk_layernorm": c.get("qk_layernorm", False) or None,
                   "hidden_act": None if c.get("hidden_act", "gelu_new") == "gelu_new" else c["hidden_act"],
                   "num_key_value_heads": None if c.get("num_key_value_heads") in (None, heads)
                   else c["num_key_value_heads"],
                   "rope_scaling": c.get("rope_scaling") or (None if rope.get("rope_type", "default") == "default"
                                                             else rope["rope_type"])}
    for key, value in unsupported.items():
        if value:
            raise ValueError(f"{path}: {key} {value!r} is not what our Phi decoder computes")
    return dict(hidden=c["hidden_size"], heads=heads, mlp=c["intermediate_size"], vocab=c["vocab_size"],
                layers=int(c["num_hidden_layers"]), eps=c.get("layer_norm_eps", 1e-5),
                partial_rotary_factor=rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 0.5)),
                rope_base=rope.get("rope_theta", c.get("rope_theta", 10000.0)),
                max_positions=c.get("max_position_embeddings", 2048), lm_bias=True,
                tied=bool(c.get("tie_word_embeddings", False)), dtype=c.get("dtype", c.get("torch_dtype")))


def safetensors_index(path) -> dict:
    """{tensor name: (dtype, shape, begin, end, file)} of one safetensors file (offsets from the file's start)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: not a safetensors file (too short)")
        n = int.from_bytes(head, "little")
        try:
            index = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            raise ValueError(f"{path}: not a safetensors file (no JSON header)") from None
    out = {}
    for name, t in index.items():
        if name != "__metadata__":
            b, e = t["data_offsets"]
            out[name] = (t["dtype"], tuple(t["shape"]), 8 + n + b, 8 + n + e, path)
    return out


class HFReader:
    """``checkpoint``'s reader protocol over a Hugging Face ``PhiForCausalLM`` directory."""

    def __init__(self, path):
        self.path = path
        c = read_config(os.path.join(path, "config.json"))
        self.layers = c.pop("layers")
        self.tied = c.pop("tied")
        self.cfg = c
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise ValueError(f"{path}: no *.safetensors file (other weight files, e.g. pytorch_model.bin, are "
                             f"not read: save with safe_serialization)")
        self.index, self.maps = {}, {}
        for f in files:
            self.index.update(safetensors_index(f))
        kinds = sorted({t[0] for t in self.index.values()})
        bad = [k for k in kinds if k not in DTYPES]
        if bad:
            raise ValueError(f"{path}: tensors of dtype {', '.join(bad)}; this reader takes F32, F16 and BF16")
        self.stored = "/".join(kinds)

    def _raw(self, name):
        """The tensor ``name`` as a view of its file (BF16 as its uint16 bits) and its dtype."""
        if name not in self.index:
            raise missing(self.path, name)
        dtype, shape, begin, end, file = self.index[name]
        if file not in self.maps:
            self.maps[file] = np.memmap(file, dtype=np.uint8, mode="r")
        return self.maps[file][begin:end].view(DTYPES[dtype]).reshape(shape), dtype

    def _tensor(self, name):
        return _widened(*self._raw(name))

    def _names(self, name, layer):
        if layer is None:
            hf = GLOBAL[name]
            if name == "lm_head" and self.tied and hf not in self.index:
                hf = GLOBAL["embed"]
            return (hf,)
        return tuple(f"model.layers.{layer}.{p}" for p in PER_LAYER[name])

    def parts(self, name, layer=None):
        """The matrix or vector ``name`` as row parts (``tensors.whole``): one per file tensor (q, k and v
        apart), each read as views of the file, rows at a time."""
        names = self._names(name, layer)
        want = shape_of(self.cfg, name)
        out = []
        for n in names:
            raw, dtype = self._raw(n)
            check_shape(f"{self.path}: {n}", raw, (want[0] // len(names),) + tuple(want[1:]))
            out.append((raw.shape[0], lambda r0, r1, raw=raw, dtype=dtype: ("float", _widened(raw[r0:r1], dtype))))
        return out

    def matrix(self, name, layer=None):
        return whole(self.parts(name, layer))

    def vector(self, name, layer=None):
        return np.asarray(self.matrix(name, layer)[1], dtype=np.float32)

    def release(self):
        release(self.maps.values())

    def tokenizer(self):
        from .tokenizer import beside

        return beside(self.path)


def _widened(raw, dtype):
    """A view of the file as float: BF16 (the top half of a float32) widened exactly, F16 / F32 as they are."""
    if dtype == "BF16":
        return (raw.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return raw
