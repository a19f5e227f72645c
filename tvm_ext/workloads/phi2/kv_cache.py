"""The decoder's KV cache: its storage dtype apart from the activations', the in-place writes and what a
token reads of it.

Per layer, keys and values each in a fixed-capacity array (1, capacity, heads, head_dim) of ``kv_dtype``:

* ``float32``: the activations' dtype on CPU (the benchmark model's default);
* ``float16``: half the bytes; the write rounds to float16, the attention kernels load float16 and compute in
  float32 (the cast is part of each load: no float32 copy of the cache);
* ``int8``: a quarter of the bytes plus one float32 scale per (position, head) in an array (1, heads,
  capacity) beside each cache: ``scale = max|x| / 127`` over that head's ``head_dim`` values, ``q =
  nearbyint(x * 127 / max|x|)``.  Per (position, head), not per head: the writer quantizes each new token
  as it comes, from its own values (a per-head scale fixed in advance would need calibration, and a growing
  one would re-quantize the past); heads' ranges differ, so one scale per position would lose the small
  heads.  4 bytes per 80 values (Phi-2) is 5 % over the int8 values.  The scales stay outside the
  contractions: softmax multiplies the scores by the key scales and the probabilities by the value scales
  (``layers._te_softmax``), so ``q . K`` and ``p . V`` read only the int8 cache; the (heads, capacity)
  layout gives softmax one contiguous row of scales per head.

Cache arrays of a layer, in the order the compiled ``layer`` takes and returns them: ``[k, v]``, and for
int8 ``[k, v, k_scale, v_scale]`` (``cache_types``).  ``writer`` makes the in-place write of ``tokens`` new
positions from ``pos`` (``call_tir_inplace``: the cache, and for int8 its scales, are outputs that alias the
inputs); ``quantize_np`` is the same int8 rule in NumPy (a synthetic past, the tests).
"""
from __future__ import annotations

import numpy as np

KV_DTYPES = ("float32", "float16", "int8")
SCALE_DTYPE = "float32"


def check_kv_dtype(kv_dtype) -> str:
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"the KV cache is one of {', '.join(KV_DTYPES)}, not {kv_dtype!r}")
    return kv_dtype


def cache_types(capacity, heads, head_dim, kv_dtype) -> list:
    """[(shape, dtype)] of one layer's cache arrays (module doc)."""
    data = [((1, capacity, heads, head_dim), kv_dtype)] * 2
    return data + [((1, heads, capacity), SCALE_DTYPE)] * 2 if kv_dtype == "int8" else data


def kv_bytes(layers, positions, heads, head_dim, kv_dtype) -> float:
    """Bytes of keys + values (and int8's scales) of ``positions`` cached tokens over ``layers`` layers."""
    per_head = head_dim * np.dtype(kv_dtype).itemsize + (np.dtype(SCALE_DTYPE).itemsize if kv_dtype == "int8" else 0)
    return 2 * layers * positions * heads * per_head


def quantize_np(x):
    """(int8 values, float32 scales) of ``x`` (..., positions, heads, head_dim): one scale per (position, head),
    the rule of the int8 writer; scales shaped (..., positions, heads)."""
    x = np.asarray(x, "float32")
    peak = np.abs(x).max(axis=-1)
    inv = np.where(peak > 0, np.float32(127) / np.where(peak > 0, peak, 1), 0).astype("float32")
    return np.rint(x * inv[..., None]).astype("int8"), (peak * np.float32(1.0 / 127)).astype("float32")


def writer(capacity, tokens, heads, head_dim, dtype, kv_dtype):
    """The in-place write of ``tokens`` new keys (or values) (1, tokens, heads, head_dim) in ``dtype`` at
    ``pos[0]`` onward into a ``kv_dtype`` cache (int8: and their scales)."""
    if kv_dtype == "int8":
        return _write_int8(capacity, tokens, heads, head_dim, dtype)
    if tokens == 1:
        return _write(capacity, heads, head_dim, dtype, kv_dtype)
    return _write_prompt(capacity, tokens, heads, head_dim, dtype, kv_dtype)


def _write(capacity, heads, head_dim, dtype, kv_dtype):
    """cache[0, pos[0]] = new[0, 0], in place (called through call_tir_inplace); a cache in the activations'
    dtype gets the write without a cast (the float32 model's kernels as they always were)."""
    from tvm.script import tirx as T

    if kv_dtype == dtype:
        @T.prim_func(private=True)
        def kv_write(cache: T.Buffer((1, capacity, heads, head_dim), dtype),
                     new: T.Buffer((1, 1, heads, head_dim), dtype), pos: T.Buffer((1,), "int32")):
            T.func_attr({"op_pattern": 8, "tirx.noalias": True})  # opaque: never fused
            for h, d in T.grid(heads, head_dim):
                cache[0, pos[0], h, d] = new[0, 0, h, d]

        return kv_write

    @T.prim_func(private=True)
    def kv_write_cast(cache: T.Buffer((1, capacity, heads, head_dim), kv_dtype),
                      new: T.Buffer((1, 1, heads, head_dim), dtype), pos: T.Buffer((1,), "int32")):
        T.func_attr({"op_pattern": 8, "tirx.noalias": True})
        for h, d in T.grid(heads, head_dim):
            cache[0, pos[0], h, d] = T.Cast(kv_dtype, new[0, 0, h, d])

    return kv_write_cast


def _write_prompt(capacity, tokens, heads, head_dim, dtype, kv_dtype):
    """cache[0, pos[0] + i] = new[0, i] for the ``tokens`` new positions, in place."""
    from tvm.script import tirx as T

    if kv_dtype == dtype:
        @T.prim_func(private=True)
        def kv_write_prompt(cache: T.Buffer((1, capacity, heads, head_dim), dtype),
                            new: T.Buffer((1, tokens, heads, head_dim), dtype), pos: T.Buffer((1,), "int32")):
            T.func_attr({"op_pattern": 8, "tirx.noalias": True})  # opaque: never fused
            for i in T.parallel(tokens):
                for h, d in T.grid(heads, head_dim):
                    cache[0, pos[0] + i, h, d] = new[0, i, h, d]

        return kv_write_prompt

    @T.prim_func(private=True)
    def kv_write_prompt_cast(cache: T.Buffer((1, capacity, heads, head_dim), kv_dtype),
                             new: T.Buffer((1, tokens, heads, head_dim), dtype), pos: T.Buffer((1,), "int32")):
        T.func_attr({"op_pattern": 8, "tirx.noalias": True})
        for i in T.parallel(tokens):
            for h, d in T.grid(heads, head_dim):
                cache[0, pos[0] + i, h, d] = T.Cast(kv_dtype, new[0, i, h, d])

    return kv_write_prompt_cast


def _write_int8(capacity, tokens, heads, head_dim, dtype):
    """Each new (position, head) quantized to int8 with its own scale (module doc), in place."""
    from tvm.script import tirx as T

    @T.prim_func(private=True)
    def kv_write_int8(cache: T.Buffer((1, capacity, heads, head_dim), "int8"),
                      scale: T.Buffer((1, heads, capacity), SCALE_DTYPE),
                      new: T.Buffer((1, tokens, heads, head_dim), dtype), pos: T.Buffer((1,), "int32")):
        T.func_attr({"op_pattern": 8, "tirx.noalias": True})
        peak = T.decl_buffer((1,), "float32", scope="local")
        for i, h in T.grid(tokens, heads):
            peak[0] = T.float32(0)
            for d in range(head_dim):
                peak[0] = T.max(peak[0], T.fabs(T.Cast("float32", new[0, i, h, d])))
            scale[0, h, pos[0] + i] = peak[0] * T.float32(1.0 / 127)
            for d in range(head_dim):
                cache[0, pos[0] + i, h, d] = T.Cast("int8", T.nearbyint(T.Select(
                    peak[0] > T.float32(0), T.Cast("float32", new[0, i, h, d]) * (T.float32(127) / peak[0]),
                    T.float32(0))))

    return kv_write_int8


def cached_attention(bb, cfg, caches, pos, write, dtype: str, written: list, fused: bool = False):
    """``layers.emit_layer``'s ``attend`` for a layer with a KV cache: rope on q and k, the new keys and values
    written into the cache arrays ``caches`` (Relax vars, ``cache_types``' order) from ``pos`` in place by
    ``write`` (the written arrays appended to ``written`` in the same order), attention over the whole cache,
    masked after ``pos``; with ``fused``, over the keys up to ``pos`` + the new tokens only, as one x86 kernel
    (``prefill_attention.py``; float32 activations)."""
    from tvm import relax

    from .layers import attention, emit_rope_qkv

    def attend(qkv):
        q, k, v = emit_rope_qkv(bb, cfg, qkv, pos, dtype)
        if len(caches) == 2:
            for cache, new in zip(caches, (k, v)):
                written.append(bb.emit(relax.call_tir_inplace(write, [cache, new, pos], 0, cache.ty)))
            scales = None
        else:
            kc, vc, ks, vs = caches
            out = [bb.emit(relax.call_tir_inplace(write, [c, s, new, pos], [0, 1], [c.ty, s.ty]))
                   for c, s, new in ((kc, ks, k), (vc, vs, v))]
            written.extend(bb.emit(relax.TupleGetItem(o, i)) for i in (0, 1) for o in out)  # k, v, k_scale, v_scale
            scales = (written[2], written[3])
        if fused:
            return _fused_attention(bb, q, written, pos)
        return attention(bb, q, written[0], written[1], cfg["head_dim"], dtype, mask_past=pos, scales=scales)

    return attend


def _fused_attention(bb, q, written, pos):
    from tvm import relax

    from .prefill_attention import prefill_attention

    _, n, heads, head_dim = (int(v) for v in q.ty.shape.values)
    capacity = int(written[0].ty.shape.values[1])
    kv_dtype = str(written[0].ty.dtype)
    func = prefill_attention(n, capacity, heads, head_dim, kv_dtype)
    gv = bb.add_func(func, f"prefill_attention_{kv_dtype}")
    return bb.emit(relax.call_tir(gv, [q, *written, pos], relax.TensorType((1, n, heads * head_dim), "float32")))
