"""What the checkpoint readers (``hf``, ``mlc``, ``gguf_file``) and ``checkpoint`` share: our decoder's tensor
shapes, the one-line errors for a missing tensor or a wrong shape, MLC's q4f16_1 quantizer and nibble packing,
a matrix's row parts read whole, and the optional packages' import (one line naming the extra that brings
them)."""
from __future__ import annotations

import os

import numpy as np

from .arch import GROUP

MODELS_EXTRA = "pip install 'tvm_ext[models]' (safetensors, tokenizers, gguf)"


def quantize_q4(w, out=None, block=1 << 20, threads=None):
    """q4f16_1 of a float (out, in) weight as MLC quantizes it: per group of 32 inputs one fp16 scale
    ``max|w| / 7``, ``q = clip(round(w / scale) + 7, 0, 14)``, eight 4-bit values per uint32 along the input
    (value ``(q - 7) * scale``: ``layers.dequantize_np``).  Returns (packed (out, in/8) uint32, scale (out,
    in/32) float16), written into ``out`` (such a pair) where given.  Blocks of about ``block`` values (a
    float32 copy of a block, never of the whole weight) on ``threads`` threads (default: the CPUs; NumPy
    releases the GIL in each operation): Phi-2's 2.7 G weights are quantized at load time."""
    import concurrent.futures

    n, k = w.shape
    if k % GROUP:
        raise ValueError(f"q4f16_1 needs inputs in whole groups of {GROUP}, not {k}")
    packed, scale = out if out is not None else (np.empty((n, k // 8), np.uint32), np.empty((n, k // GROUP),
                                                                                           np.float16))
    threads = threads or os.cpu_count() or 1
    rows = max(1, min(block // k, -(-n // threads)))

    def one(r):
        x = np.array(w[r:r + rows], dtype=np.float32).reshape(-1, k // GROUP, GROUP)  # a copy, written in place
        s = (np.maximum(np.abs(x).max(-1), 1e-4) / 7.0).astype(np.float16)
        x *= (1.0 / s.astype(np.float32))[..., None]
        np.rint(x, out=x)
        np.clip(x, -7, 7, out=x)
        x += 7
        packed[r:r + rows], scale[r:r + rows] = pack_nibbles(x.reshape(-1, k)), s

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(0, n, rows)))
    return packed, scale


def whole(parts):
    """A matrix given as row parts (``[(rows, read)]``, ``read(r0, r1)`` -> ("float", w) or ("q4", packed,
    scale) of those rows: the readers' ``parts``) read whole: q4 parts concatenated as they are, else float."""
    got = [read(0, rows) for rows, read in parts]
    if len(got) == 1:
        return got[0]
    if all(g[0] == "q4" for g in got):
        return ("q4", np.concatenate([g[1] for g in got]), np.concatenate([g[2] for g in got]))
    from .layers import dequantize_np

    return ("float", np.concatenate([g[1] if g[0] == "float" else dequantize_np(*g[1:]).T for g in got]))


def pack_nibbles(q):
    """(n, k) values 0..15 -> (n, k/8) uint32 words, value j of a word in bits 4j (the q4f16_1 layout): two
    values a byte (the even one low), four bytes a little-endian word."""
    q = np.asarray(q).astype(np.uint8)
    pairs = q[:, 0::2] | (q[:, 1::2] << np.uint8(4))
    return np.ascontiguousarray(pairs).view("<u4")


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


def release(maps):
    """Give the pages of memory-mapped files (np.memmap) back, and the heap's free pages: a tensor read from a
    mapping stays in the process's RSS as long as the mapping holds its pages, so a reader that kept every
    shard mapped would end the load with the whole file resident beside the converted weights; and glibc
    keeps freed blocks of a few MB (the conversion's temporaries, once its mmap threshold has risen) in its
    heaps, resident, until ``malloc_trim``.  The data are untouched (read-only file mappings: a page read
    again comes from the file)."""
    import mmap

    for m in maps:
        raw = getattr(m, "_mmap", None)
        if raw is not None and not raw.closed and hasattr(mmap, "MADV_DONTNEED"):
            raw.madvise(mmap.MADV_DONTNEED)
    if _LIBC.get("trim") is None:
        import ctypes

        try:
            _LIBC["trim"] = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc: nothing to trim
            _LIBC["trim"] = lambda pad: 0
    _LIBC["trim"](0)


_LIBC = {}


def missing(where, name):
    return ValueError(f"{where}: tensor {name} missing")


def import_optional(module, what):
    """``import module`` or one line naming the extra that brings it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(f"{what} needs the {module} package: {MODELS_EXTRA}") from None
