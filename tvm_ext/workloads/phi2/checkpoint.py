"""A user's Phi-2 checkpoint mapped onto our one decoder (``model.py``): ``load(path)``.

Three readers (one module each) present a checkpoint in our decoder's names, one tensor at a time, straight
from the memory-mapped file (a tensor is copied once, when it is converted):

* ``hf.py``: Hugging Face ``config.json`` + ``model*.safetensors`` of ``PhiForCausalLM`` (F32, F16, BF16);
* ``mlc.py``: MLC's ``mlc-chat-config.json`` + ``ndarray-cache.json`` + ``params_shard_*.bin`` (q4f16_1, or
  MLC's unquantized q0f16 / q0f32);
* ``gguf_file.py``: a GGUF of llama.cpp's ``phi2`` architecture (Q4_0 exactly; Q8_0, F16, F32, BF16 and every
  type ``gguf.quants`` dequantizes, the K-quants among them, through float).

A reader gives ``parts(name, layer)``, a matrix's row parts (one per file tensor) read rows at a time as
("float", w (rows, in)) or ("q4", packed, scale), ``matrix(name, layer)`` the same read whole, and
``vector(name, layer)`` (LayerNorm, biases) as float32; ``Source`` turns them into the format the model keeps:
q4f16_1 (float weights quantized as MLC quantizes them, ``quantize_q4``, a slice of rows at a time, the file's
pages given back between two) or float (q4 weights dequantized).  Names
of our decoder: per layer ln_g, ln_b, qkv (q, k, v rows concatenated), dense, fc1, fc2 and their biases
(``<name>_b``); lnf_g, lnf_b, lm_head, lm_head_b; embed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .arch import GROUP
from .layers import dequantize_np
from .tensors import quantize_q4, shape_of

MATRICES = ("qkv", "dense", "fc1", "fc2")
CHUNK = 16 << 20  # bytes of a matrix's rows converted between two releases of the file's pages
WEIGHTS = ("q4", "float")  # what ``load`` keeps: q4f16_1, or float as the checkpoint stores it (float32 on a CPU)


class Source:
    """The weights of a reader in the model's format (``model.Phi2Model.source``), one layer per call."""

    def __init__(self, reader, weights):
        self.reader, self.weights = reader, weights

    def _matrix(self, name, layer=None, bias=True):
        b = self.reader.vector(f"{name}_b", layer) if bias else None
        if self.weights == "q4":
            return (*self._q4(name, layer), b)
        got = self.reader.matrix(name, layer)
        if got[0] == "q4":
            return (np.ascontiguousarray(dequantize_np(*got[1:]).T.astype(self.weights)), b)
        return (np.ascontiguousarray(got[1], dtype=self.weights), b)

    def _q4(self, name, layer):
        """(packed, scale) of the matrix ``name``, read, converted and written into them ``CHUNK`` bytes of
        the file at a time, the file's pages given back after each (the lm_head and the embedding are 262 MB of
        fp16 each in Phi-2: read whole, their pages would stay resident beside what they become)."""
        parts = self.reader.parts(name, layer)
        n, k = sum(rows for rows, _ in parts), shape_of(self.reader.cfg, name)[1]
        packed, scale = np.empty((n, k // 8), np.uint32), np.empty((n, k // GROUP), np.float16)
        step = max(1, CHUNK // (2 * k))  # rows of an fp16 file
        base = 0
        for rows, read in parts:
            for r in range(0, rows, step):
                got, at = read(r, min(r + step, rows)), slice(base + r, base + min(r + step, rows))
                if got[0] == "q4":
                    packed[at], scale[at] = got[1], got[2]
                else:
                    quantize_q4(got[1], out=(packed[at], scale[at]))
                self.reader.release()
            base += rows
        return packed, scale

    def _done(self, w):
        """``w`` owning its arrays (no view of the file left), the file's pages given back (``tensors.release``)."""
        def own(a):  # a view of the file copied, an array already converted kept
            return a if a is None or (a.flags.owndata and not isinstance(a, np.memmap)) else np.array(a)

        w = {k: tuple(own(a) for a in v) if isinstance(v, tuple) else own(v) for k, v in w.items()}
        self.reader.release()
        return w

    def layer_weights(self, i):
        v = lambda name: self.reader.vector(name, i)  # noqa: E731
        return self._done({"ln_g": v("ln_g"), "ln_b": v("ln_b"), **{m: self._matrix(m, i) for m in MATRICES}})

    def head_weights(self):
        return self._done({"lnf_g": self.reader.vector("lnf_g"), "lnf_b": self.reader.vector("lnf_b"),
                           "lm_head": self._matrix("lm_head", bias=self.reader.cfg["lm_bias"])})

    def embed_weights(self):
        return self._done({"embed": self._matrix("embed", bias=False)})["embed"]


@dataclass
class Checkpoint:
    """A loaded checkpoint: its architecture (``cfg``, the format kept included), layers, weights (``source``)
    and tokenizer (None where the checkpoint has none)."""
    path: str
    kind: str  # "hf", "mlc" or "gguf"
    cfg: dict
    layers: int
    source: Source
    tokenizer: object = None
    stored: str = ""  # what the file holds, in words (dtype or quantization)

    def build(self, capacity=512, compute="float"):
        """The decoder (``model.Phi2Model``) of these weights with a KV cache of ``capacity`` positions."""
        from .model import build_model

        return build_model(self.cfg, self.layers, capacity=capacity, compute=compute, source=self.source)

    def generator(self, capacity=None, schedule="dlight", target="llvm", log=None):
        """A ``text.Generator``: the decoder compiled (``schedule``), its weights uploaded, and the tokenizer."""
        from .text import Generator

        return Generator(self, capacity=capacity, schedule=schedule, target=target, log=log)


def detect(path) -> str:
    """"hf", "mlc" or "gguf" for a checkpoint directory or file; one line for anything else."""
    path = str(path)
    if os.path.isfile(path):
        with open(path, "rb") as f:
            if f.read(4) == b"GGUF":
                return "gguf"
        raise ValueError(f"{path}: not a GGUF file (a Hugging Face or MLC checkpoint is a directory)")
    if not os.path.isdir(path):
        raise ValueError(f"{path}: no such checkpoint (a directory of config.json + *.safetensors, an MLC "
                         f"directory with ndarray-cache.json, or a .gguf file)")
    if os.path.isfile(os.path.join(path, "ndarray-cache.json")):
        return "mlc"
    if os.path.isfile(os.path.join(path, "config.json")):
        return "hf"
    ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
    if len(ggufs) == 1:
        return "gguf"
    raise ValueError(f"{path}: no config.json (Hugging Face), ndarray-cache.json (MLC) or single .gguf file in it")


def load(path, weights="q4", layers=None) -> Checkpoint:
    """The checkpoint at ``path`` (a Hugging Face or MLC directory, a GGUF file) mapped onto our decoder.
    ``weights``: "q4" (q4f16_1: float checkpoints quantized on load, q4 ones kept) or "float" (kept float:
    float32 computes on a CPU; q4 checkpoints dequantized); ``layers``: use only the first N layers (tests,
    quick looks).  Reads the config and the tensors' index now, each tensor when the decoder uploads it."""
    from .arch import architecture

    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, not {weights!r}")
    kind = detect(path)
    if kind == "gguf" and os.path.isdir(path):
        path = os.path.join(path, next(f for f in sorted(os.listdir(path)) if f.endswith(".gguf")))
    if kind == "hf":
        from .hf import HFReader as reader_type
    elif kind == "mlc":
        from .mlc import MLCReader as reader_type
    else:
        from .gguf_file import GGUFReader as reader_type
    reader = reader_type(str(path))
    a = reader.cfg
    keep = "q4" if weights == "q4" else "float32"
    cfg = architecture(a["hidden"], a["heads"], a["mlp"], a["vocab"], a["partial_rotary_factor"], a["eps"],
                       a["rope_base"], embed="table", lm_bias=a["lm_bias"], weights=keep,
                       max_positions=a["max_positions"], name=f"{kind}:{os.path.basename(str(path).rstrip('/'))}")
    n = reader.layers if layers is None else int(layers)
    if not 1 <= n <= reader.layers:
        raise ValueError(f"layers must be from 1 to the checkpoint's {reader.layers}, not {layers}")
    return Checkpoint(str(path), kind, cfg, n, Source(reader, keep), reader.tokenizer(), reader.stored)
