"""A prompt's causal attention in one x86 CPU kernel: scores, mask, softmax and values per block of queries.

``softmax(q k^T / sqrt(head_dim)) v`` for ``tokens`` new queries at positions ``past .. past + tokens - 1``
(``past = pos[0]``) over the cache's keys ``0 .. past + tokens - 1``, query ``i`` seeing keys ``j <= past + i``;
(1, tokens, heads * head_dim) float32, as ``layers.attention`` with ``mask_past`` computes it.

Why one kernel: as three (``attn_score``, ``softmax``, ``attn_value``) the prefill computes and stores the whole
(heads, tokens, capacity) score square -- 35 MB a layer at 512 tokens, 0.5 GB at 2048 -- though the causal mask
zeroes half of it, and reads it back three times.  Here each head (one task each, in parallel) goes through
its queries a block (``QUERY_BLOCK``) at a time, and a block stops at its last query's key: the masked
half is never computed, and a block's scores (at most 4 x capacity floats) stay in cache between the steps:

1. the head's keys, scaled by ``1/sqrt(head_dim)`` (and an int8 cache's key scales), copied once into
   ``KEY_TILE``-key tiles with the keys innermost, and its values (times an int8 cache's value scales) into
   rows, both float32 (a float16 or int8 cache is widened here, once per head);
2. scores of a block: register tiles of the block's queries x ``KEY_TILE`` keys over ``head_dim``
   (broadcast query element x 2 vectors of keys);
3. softmax per query, 8 lanes at a time: the mask as a select (later keys get the lowest float, whose
   exponential is exactly 0: ``layers.exp_nonpositive``, the unfused softmax's polynomial), max, exp, sum;
4. values: 2 queries x ``value_chunk`` dims of float32 accumulators over the block's keys, scaled by
   1 / sum at the end.

A hand-scheduled kernel (``tirx.is_scheduled``, as ``q4_int8_gemm.quantize_tokens``): the prefill of the int8
prompt path, which runs on x86 CPUs only (``q4_int8_gemm.check_target``).  ``supported`` says which shapes
it takes (tokens even, head_dim a multiple of 8); ``attention_np`` is the float64 reference of the tests.
"""
from __future__ import annotations

import math

import numpy as np

LANES = 8  # float32 lanes of a 256-bit vector
KEY_TILE = 16  # keys per score register tile: 2 vectors
KV_DTYPES = ("float32", "float16", "int8")


def query_block(tokens: int) -> int:
    """Queries per block: 4 (4 x 2 vector accumulators of scores), 2 where 4 does not divide ``tokens``."""
    return 4 if tokens % 4 == 0 else 2


def value_chunk(head_dim: int) -> int:
    """Dims per value accumulator row: the largest of 40, 32, 24, 16, 8 dividing ``head_dim`` (2 x 5
    vectors for Phi-2's 80: ten accumulators, the values' row and a broadcast in 16 registers)."""
    return next(c for c in (40, 32, 24, 16, LANES) if head_dim % c == 0)


def supported(tokens: int, head_dim: int) -> bool:
    return tokens >= 2 and tokens % 2 == 0 and head_dim % LANES == 0


def prefill_attention(tokens: int, capacity: int, heads: int, head_dim: int, kv_dtype: str = "float32"):
    """The PrimFunc (q (1, tokens, heads, head_dim) float32, k and v caches (1, capacity, heads, head_dim)
    ``kv_dtype``, [int8: key and value scales (1, heads, capacity) float32], pos (1,) int32) -> (1, tokens,
    heads * head_dim) float32 (module doc)."""
    from tvm import tirx
    from tvm.script import tirx as T

    from .layers import exp_nonpositive

    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"the KV cache is one of {', '.join(KV_DTYPES)}, not {kv_dtype!r}")
    if not supported(tokens, head_dim):
        raise ValueError(f"the fused prefill attention needs an even number of tokens and head_dim a multiple of "
                         f"{LANES}, not {tokens} and {head_dim}")
    n, hh, d = tokens, heads, head_dim
    qb_n, dv = query_block(n), value_chunk(d)
    tiles = -(-capacity // KEY_TILE)
    padded = tiles * KEY_TILE
    scale = tirx.const(1.0 / math.sqrt(d), "float32")
    lowest = tirx.min_value("float32")
    kt_ramp, v_ramp = T.ramp(0, 1, KEY_TILE), T.ramp(0, 1, LANES)

    def widen(x):
        return x if kv_dtype == "float32" else T.Cast("float32", x)

    def key(k, ks, j, h, r):
        x = widen(k[0, j, h, r]) * scale
        return x if ks is None else x * ks[0, h, j]

    def value(v, vs, j, h, r):
        x = widen(v[0, j, h, r])
        return x if vs is None else x * vs[0, h, j]

    def block_keys(pos, b):
        """Keys the last query of block ``b`` sees (the block's scores and values stop there)."""
        return pos[0] + b * qb_n + qb_n

    def block_vectors(pos, b):
        """8-lane vectors of a score row of block ``b``: its keys rounded up to whole key tiles."""
        return (block_keys(pos, b) + KEY_TILE - 1) // KEY_TILE * (KEY_TILE // LANES)

    def lanes_at(c):
        return T.ramp(c * LANES, 1, LANES)

    @T.macro
    def body(q, k, v, ks, vs, pos, out):
        with T.sblock("root"):
            for h in T.parallel(hh):
                kt = T.decl_buffer((tiles, d, KEY_TILE), "float32")
                vh = T.decl_buffer((capacity, d), "float32")
                s = T.decl_buffer((qb_n, padded), "float32")
                acc = T.decl_buffer((qb_n, KEY_TILE), "float32", scope="local")
                vacc = T.decl_buffer((2, dv // LANES, LANES), "float32", scope="local")
                red = T.decl_buffer((2, LANES), "float32", scope="local")
                peak = T.decl_buffer((1,), "float32", scope="local")
                inv = T.decl_buffer((qb_n,), "float32", scope="local")
                for j in range(pos[0] + n):  # 1. the head's keys (tiled, keys innermost) and values
                    for r in range(d):
                        kt[j // KEY_TILE, r, j % KEY_TILE] = key(k, ks, j, h, r)
                    for r in T.vectorized(d):
                        vh[j, r] = value(v, vs, j, h, r)
                for b in range(n // qb_n):
                    for jt in range(block_vectors(pos, b) // (KEY_TILE // LANES)):  # 2. scores
                        for i in T.unroll(qb_n):
                            acc[i, kt_ramp] = T.broadcast(T.float32(0), KEY_TILE)
                        for r in range(d):
                            for i in T.unroll(qb_n):
                                acc[i, kt_ramp] = acc[i, kt_ramp] + T.broadcast(
                                    q[0, b * qb_n + i, h, r], KEY_TILE) * kt[jt, r, kt_ramp]
                        for i in T.unroll(qb_n):
                            s[i, T.ramp(jt * KEY_TILE, 1, KEY_TILE)] = acc[i, kt_ramp]
                    for i in range(qb_n):  # 3. softmax of query b * qb_n + i: keys after past + its index masked
                        red[0, v_ramp] = T.broadcast(lowest, LANES)
                        red[1, v_ramp] = T.broadcast(T.float32(0), LANES)
                        for c in range(block_vectors(pos, b)):  # mask (written back), max
                            s[i, lanes_at(c)] = T.Select(lanes_at(c) > T.broadcast(pos[0] + b * qb_n + i, LANES),
                                                         T.broadcast(lowest, LANES), s[i, lanes_at(c)])
                            red[0, v_ramp] = T.max(red[0, v_ramp], s[i, lanes_at(c)])
                        peak[0] = lowest
                        for lane in range(LANES):
                            peak[0] = T.max(peak[0], red[0, lane])
                        for c in range(block_vectors(pos, b)):  # exp (exactly 0 where masked), sum
                            s[i, lanes_at(c)] = exp_nonpositive(s[i, lanes_at(c)] - T.broadcast(peak[0], LANES), LANES)
                            red[1, v_ramp] = red[1, v_ramp] + s[i, lanes_at(c)]
                        inv[i] = T.float32(0)
                        for lane in range(LANES):
                            inv[i] = inv[i] + red[1, lane]
                        inv[i] = T.float32(1) / inv[i]
                    for pair, chunk in T.grid(qb_n // 2, d // dv):  # 4. values, two queries at a time
                        for i, c in T.grid(2, dv // LANES):  # 8-lane vectors: LLVM scalarizes 40 lanes
                            vacc[i, c, v_ramp] = T.broadcast(T.float32(0), LANES)
                        for j in range(block_keys(pos, b)):
                            for c in T.unroll(dv // LANES):
                                for i in T.unroll(2):
                                    vacc[i, c, v_ramp] = vacc[i, c, v_ramp] + T.broadcast(
                                        s[pair * 2 + i, j], LANES) * vh[j, T.ramp(chunk * dv + c * LANES, 1, LANES)]
                        for i, c in T.grid(2, dv // LANES):
                            out[0, b * qb_n + pair * 2 + i, T.ramp(h * d + chunk * dv + c * LANES, 1, LANES)] = \
                                vacc[i, c, v_ramp] * T.broadcast(inv[pair * 2 + i], LANES)

    q_shape, kv_shape, scale_shape, out_shape = (1, n, hh, d), (1, capacity, hh, d), (1, hh, capacity), (1, n, hh * d)
    attrs = {"op_pattern": 8, "tirx.noalias": True, "tirx.is_scheduled": True}
    if kv_dtype == "int8":
        @T.prim_func(private=True, s_tir=True)
        def fused(q: T.Buffer(q_shape, "float32"), k: T.Buffer(kv_shape, "int8"), v: T.Buffer(kv_shape, "int8"),
                  ks: T.Buffer(scale_shape, "float32"), vs: T.Buffer(scale_shape, "float32"),
                  pos: T.Buffer((1,), "int32"), out: T.Buffer(out_shape, "float32")):
            T.func_attr(attrs)
            body(q, k, v, ks, vs, pos, out)

        return fused

    @T.prim_func(private=True, s_tir=True)
    def fused_plain(q: T.Buffer(q_shape, "float32"), k: T.Buffer(kv_shape, kv_dtype),
                    v: T.Buffer(kv_shape, kv_dtype), pos: T.Buffer((1,), "int32"),
                    out: T.Buffer(out_shape, "float32")):
        T.func_attr(attrs)
        body(q, k, v, None, None, pos, out)

    return fused_plain


def attention_np(q, k, v, past: int, k_scale=None, v_scale=None):
    """float64 reference: q (1, n, heads, d), k and v (1, capacity, heads, d) as stored (int8 with its
    scales (1, heads, capacity)), query i seeing keys 0 .. past + i; (1, n, heads * d)."""
    n, d = q.shape[1], q.shape[3]
    kf, vf = k.astype("float64"), v.astype("float64")
    if k_scale is not None:
        kf = kf * k_scale.transpose(0, 2, 1)[..., None]
        vf = vf * v_scale.transpose(0, 2, 1)[..., None]
    kf, vf = kf[:, :past + n], vf[:, :past + n]
    s = np.einsum("bihd,bjhd->bhij", q.astype("float64"), kf) / math.sqrt(d)
    s = np.where(np.arange(past + n)[None, :] > np.arange(n)[:, None] + past, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhij,bjhd->bihd", p, vf).reshape(1, n, -1)
