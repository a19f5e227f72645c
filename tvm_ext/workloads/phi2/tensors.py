"""What the checkpoint readers (``hf``, ``mlc``, ``gguf_file``) and ``checkpoint`` share: our decoder's tensor
shapes, the one-line errors for a missing tensor or a wrong shape, MLC's q4f16_1 quantizer and nibble packing,
and the optional packages' import (one line naming the extra that brings them)."""
from __future__ import annotations

import numpy as np

from .arch import GROUP

MODELS_EXTRA = "pip install 'tvm_ext[models]' (safetensors, tokenizers, gguf)"


def quantize_q4(w, rows=4096):
    """q4f16_1 of a float (out, in) weight as MLC quantizes it: per group of 32 inputs one fp16 scale
    ``max|w| / 7``, ``q = clip(round(w / scale) + 7, 0, 14)``, eight 4-bit values per uint32 along the input
    (value ``(q - 7) * scale``: ``layers.dequantize_np``).  Returns (packed (out, in/8) uint32, scale (out,
    in/32) float16); converts ``rows`` rows at a time (a float32 copy of a block, not of the whole weight)."""
    n, k = w.shape
    if k % GROUP:
        raise ValueError(f"q4f16_1 needs inputs in whole groups of {GROUP}, not {k}")
    packed = np.empty((n, k // 8), np.uint32)
    scale = np.empty((n, k // GROUP), np.float16)
    for r in range(0, n, rows):
        block = np.asarray(w[r:r + rows], dtype=np.float32).reshape(-1, k // GROUP, GROUP)
        s = (np.maximum(np.abs(block).max(-1), 1e-4) / 7.0).astype(np.float16)
        q = np.clip(np.rint(block / s.astype(np.float32)[..., None]) + 7, 0, 14)
        packed[r:r + rows], scale[r:r + rows] = pack_nibbles(q.reshape(-1, k)), s
    return packed, scale


def pack_nibbles(q):
    """(n, k) values 0..15 -> (n, k/8) uint32 words, value j of a word in bits 4j (the q4f16_1 layout)."""
    q = np.asarray(q).astype(np.uint32).reshape(q.shape[0], -1, 8)
    words = q[..., 0].copy()
    for j in range(1, 8):
        words |= q[..., j] << np.uint32(4 * j)
    return words


def shape_of(cfg, name):
    """The (out, in) shape of our decoder's matrix ``name`` (a vector's: ``<matrix>_b``, LayerNorm's (hidden,))."""
    d, m, v = cfg["hidden"], cfg["mlp"], cfg["vocab"]
    out_in = {"qkv": (3 * d, d), "dense": (d, d), "fc1": (m, d), "fc2": (d, m), "lm_head": (v, d), "embed": (v, d)}
    if name.endswith("_b") and name[:-2] in out_in:
        return out_in[name[:-2]][:1]
    return out_in.get(name, (d,))  # LayerNorm's ln_g, ln_b, lnf_g, lnf_b


def check_shape(what, array, shape):
    """``array``, or one line naming the tensor (``what``) whose shape is not ``shape``."""
    if tuple(array.shape) != tuple(shape):
        raise ValueError(f"{what}: shape {tuple(array.shape)}, expected {tuple(shape)}")
    return array


def missing(where, name):
    return ValueError(f"{where}: tensor {name} missing")


def import_optional(module, what):
    """``import module`` or one line naming the extra that brings it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(f"{what} needs the {module} package: {MODELS_EXTRA}") from None
