"""GGUF files of llama.cpp's ``phi2`` architecture, read with the ``gguf`` package (memory-mapped).

Q4_0 maps onto our q4f16_1 layout exactly: a block is one fp16 ``d`` and 32 values ``(q - 8) * d`` (element
j in the low nibble of byte j, element j + 16 in the high one); ours is ``(q' - 7) * s``, so ``q' = 15 - q``
and ``s = -d`` give the same value for every q in 0..15 (negating a half is exact), and the nibbles are
repacked eight to a uint32 word.  Every other type (Q8_0, F16, F32, BF16, and what ``gguf.quants``
dequantizes: Q4_1, Q5_0/1, the K-quants, ...) comes through float: kept float, or quantized as MLC does
(``checkpoint.quantize_q4``).  A "Q4_0" file from ``llama-quantize`` usually keeps ``output.weight`` in Q6_K:
that tensor is requantized, the rest are exact.
"""
from __future__ import annotations

import numpy as np

from .tensors import check_shape, import_optional, missing, release, shape_of, whole

ARCH = "phi2"
PER_LAYER = {"ln_g": ("attn_norm.weight",), "ln_b": ("attn_norm.bias",), "dense": ("attn_output.weight",),
             "dense_b": ("attn_output.bias",), "fc1": ("ffn_up.weight",), "fc1_b": ("ffn_up.bias",),
             "fc2": ("ffn_down.weight",), "fc2_b": ("ffn_down.bias",)}
GLOBAL = {"lnf_g": "output_norm.weight", "lnf_b": "output_norm.bias", "lm_head": "output.weight",
          "lm_head_b": "output.bias", "embed": "token_embd.weight"}
QK = 32  # Q4_0 block


def q4_0_to_q4(blocks, rows, k):
    """Q4_0 bytes (rows, k/32*18) -> our (packed (rows, k/8) uint32, scale (rows, k/32) fp16), exactly: per
    block, the low nibbles (elements 0-15) then the high ones (16-31) paired two a byte, both nibbles of a byte
    inverted at once (``^ 0xFF``: 15 - q), four bytes a little-endian word."""
    b = np.asarray(blocks, dtype=np.uint8).reshape(rows, k // QK, 18)
    d = np.ascontiguousarray(b[..., :2]).view(np.float16)[..., 0]
    qs = b[..., 2:]
    lo, hi = qs & np.uint8(15), qs >> np.uint8(4)
    out = np.empty((rows, k // QK, 16), np.uint8)
    out[..., :8] = lo[..., 0::2] | (lo[..., 1::2] << np.uint8(4))
    out[..., 8:] = hi[..., 0::2] | (hi[..., 1::2] << np.uint8(4))
    out ^= np.uint8(0xFF)
    return out.reshape(rows, k // 2).view("<u4"), -d


class GGUFReader:
    """``checkpoint``'s reader protocol over a GGUF file."""

    def __init__(self, path):
        gguf = import_optional("gguf", "reading a GGUF file")
        self.path, self.gguf = path, gguf
        try:
            self.file = gguf.GGUFReader(path, "r")
        except Exception as err:  # noqa: BLE001 -- the package's parse error, in one line
            raise ValueError(f"{path}: not a GGUF file gguf reads ({str(err).splitlines()[0][:200]})") from None
        self.tensors = {t.name: t for t in self.file.tensors}
        arch = self.field("general.architecture")
        if arch != ARCH:
            raise ValueError(f"{path}: architecture {arch}, not {ARCH} (Phi-2)")
        hidden, heads = int(self.field(f"{ARCH}.embedding_length")), int(self.field(f"{ARCH}.attention.head_count"))
        kv = self.field(f"{ARCH}.attention.head_count_kv", heads)
        if int(kv) != heads:
            raise ValueError(f"{path}: {kv} key/value heads for {heads} heads: our Phi decoder has no grouped "
                             f"attention")
        if "token_embd.weight" not in self.tensors:
            raise missing(path, "token_embd.weight")
        vocab = int(self.tensors["token_embd.weight"].shape[1])  # ggml's ne: (hidden, vocab)
        self.layers = int(self.field(f"{ARCH}.block_count"))
        self.cfg = dict(hidden=hidden, heads=heads, mlp=int(self.field(f"{ARCH}.feed_forward_length")), vocab=vocab,
                        eps=float(self.field(f"{ARCH}.attention.layer_norm_epsilon", 1e-5)),
                        partial_rotary_factor=int(self.field(f"{ARCH}.rope.dimension_count")) / (hidden // heads),
                        rope_base=float(self.field(f"{ARCH}.rope.freq_base", 10000.0)),
                        max_positions=int(self.field(f"{ARCH}.context_length", 2048)),
                        lm_bias="output.bias" in self.tensors)
        self.stored = "/".join(sorted({t.tensor_type.name for t in self.file.tensors}))

    def field(self, key, default=None):
        f = self.file.fields.get(key)
        if f is None:
            if default is None:
                raise ValueError(f"{self.path}: metadata {key} missing")
            return default
        return f.contents()

    def _names(self, name, layer):
        if layer is None:
            if name == "lm_head" and "output.weight" not in self.tensors:
                return ("token_embd.weight",)  # llama.cpp ties the output to the embedding where it has none
            return (GLOBAL[name],)
        if name in ("qkv", "qkv_b"):
            kind = "weight" if name == "qkv" else "bias"
            fused = f"blk.{layer}.attn_qkv.{kind}"
            return (fused,) if fused in self.tensors else tuple(f"blk.{layer}.attn_{p}.{kind}" for p in "qkv")
        return tuple(f"blk.{layer}.{p}" for p in PER_LAYER[name])

    def _one(self, tname, shape):
        """A row part (``tensors.whole``) of the tensor ``tname``, ``shape`` its numpy (out, in): a Q4_0
        matrix's rows as ("q4", packed, scale), exactly, else ("float", rows)."""
        t = self.tensors.get(tname)
        if t is None:
            raise missing(self.path, tname)
        got = tuple(int(v) for v in reversed(t.shape.tolist()))  # ggml's ne is innermost first
        check_shape(f"{self.path}: {tname}", _Shape(got), shape)
        kind = t.tensor_type
        q = self.gguf.GGMLQuantizationType
        rows = shape[0]
        data = np.asarray(t.data).reshape(rows, -1)  # a view of the file; a row of blocks per output
        if kind == q.Q4_0 and len(shape) == 2:
            return rows, lambda r0, r1: ("q4", *q4_0_to_q4(data[r0:r1], r1 - r0, shape[1]))
        if kind in (q.F32, q.F16):
            return rows, lambda r0, r1: ("float", data[r0:r1].reshape((r1 - r0,) + tuple(shape[1:])))
        try:
            self.gguf.quants.dequantize(data[:1], kind)
        except NotImplementedError:
            raise ValueError(f"{self.path}: {tname} is {kind.name}, a type gguf cannot dequantize") from None
        return rows, lambda r0, r1: ("float", self.gguf.quants.dequantize(data[r0:r1], kind).reshape(
            (r1 - r0,) + tuple(shape[1:])))

    def parts(self, name, layer=None):
        """The matrix or vector ``name`` as row parts (``tensors.whole``): one per tensor of the file
        (attn_qkv, or attn_q, attn_k and attn_v apart), rows read at a time."""
        names = self._names(name, layer)
        want = shape_of(self.cfg, name)
        return [self._one(n, (want[0] // len(names),) + tuple(want[1:])) for n in names]

    def matrix(self, name, layer=None):
        return whole(self.parts(name, layer))

    def vector(self, name, layer=None):
        got = self.matrix(name, layer)
        return np.asarray(got[1], dtype=np.float32)

    def release(self):
        release([self.file.data])

    def tokenizer(self):
        from .tokenizer import from_gguf

        get = lambda key: self.field(key, None) if key in self.file.fields else None  # noqa: E731
        return from_gguf(get("tokenizer.ggml.tokens"), get("tokenizer.ggml.merges"), get("tokenizer.ggml.model"),
                         self.path)


class _Shape:
    """Something with a ``shape``, for ``check_shape`` on a tensor not yet read."""

    def __init__(self, shape):
        self.shape = shape
