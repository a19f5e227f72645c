"""Tensor intrinsic: a whole q4 dequantize-GEMV in factored float arithmetic (CPU).

What it replaces (``desc``): the update of the GEMV block of a decode kernel (its init split off,
as MetaSchedule's RewriteReductionBlock does) after its dequantize is inlined, over all N output
columns and all K inputs, in the q4 format of Phi-2's kernels (``q4_weight``:
eight 4-bit values per uint32 word along K, zero point 7, one scale per 32 inputs)::

    C[.., n] = C[.., n] + X[.., k] * ((f32((P[n, k // 8] >> u32(k % 8) * 4) & 15) - 7) * f32(S[n, k // 32]))

``sch.tensorize`` compares the function's block with it structurally, so a kernel whose
dequantize is written differently does not match (TVM raises) and the caller keeps its own schedule.

How (``impl``), the same value up to float reassociation::

    C[n] = sum_g S[n, g] * (sum_{k in g} X[k] * q[n, k])  +  sum_g S[n, g] * corr[g],
    corr[g] = -7 * sum_{k in g} X[k]

* once per call, serially (K floats): ``X`` permuted so that a chunk of ``lanes`` packed bytes
  meets its inputs in two contiguous vectors (each byte holds an even input in its low nibble and
  the next odd one in its high nibble: first the even inputs of the chunk, then the odd ones),
  and ``corr``;
* rows in parallel, each walked in memory order; per chunk one zero-extending byte load
  (``vpmovzxbd``), the low nibbles masked and the high ones shifted out, both converted and
  multiplied with the permuted ``X`` (2 FMAs per 2 x ``lanes`` inputs); the scale applied once
  per group, into one of up to 4 accumulators in turn; ``corr`` dotted with the row's scales at the
  end of the row.  Per 8 inputs that is ~3.5 vector instructions where the scheduled form
  (``rules/dequant_gemv.py``'s other sketches: broadcast, shift, mask, convert, subtract 7,
  scale, FMA per input) has 6, and with ``lanes`` 16 (AVX-512) half of them again; the row's
  lanes summed as a tree (LLVM's ordered reduce is a chain of 16 dependent adds per row: 13 %
  of qkv's time from DRAM here);
* a software prefetch ``PREFETCH`` bytes ahead of the packed stream, once per cache line: the
  hardware prefetcher alone left the kernel at 4x its DRAM bound on the AVX-512 host it was
  written on (Phi-2 qkv, weights cycled from DRAM: 1.72 ms without, 0.63 ms with 8 KiB ahead).

Intrinsics are shape-specific (N, K, the activation and output ranks, the scale and index dtypes,
``lanes``): ``register`` makes one and returns its name, which encodes all of it.
"""
from __future__ import annotations

from tvm import tirx
from tvm.script import tirx as T

from tvm_ext.intrinsics import register_once
from tvm_ext.intrinsics.prefetch import PREFETCH
from tvm_ext.intrinsics.prefetch import prefetch as prefetch_line

GROUP = 32  # inputs per scale
PACK = 8  # 4-bit values per uint32 word
ZERO_POINT = 7
LANES = (8, 16)
PREFIX = "tvm_ext.q4_gemv_f32"
HALF_1024 = 0x6400  # the bits of the half 1024.0: its 10 mantissa bits hold 0..1023 exactly


def q4_weight(packed, scale, row, col, dtype, zero_point: int = ZERO_POINT):
    """Element (row, col) of a q4 weight stored as (rows, cols/8) uint32 words + (rows,
    cols/32) scales: (q - 7) * scale, as the decode kernels (and ``desc``) compute it (another
    ``zero_point``: a format the intrinsic does not cover, for tests).  In float16 (the GPU's
    q4f16_1) q becomes a half without an int-to-float conversion: the bits ``0x6400 | q`` are the
    half 1024 + q, exact for q < 1024, and 1024 + 7 is subtracted instead -- the same values,
    where a GPU converts 16 integers a clock per SM (Hopper) against 128 lanes of logic and FMA."""
    q = (packed[row, col // PACK] >> (tirx.Cast("uint32", col % PACK) * tirx.const(4, "uint32"))) \
        & tirx.const(15, "uint32")
    if str(dtype) == "float16":
        biased = tirx.reinterpret("float16", tirx.Cast("uint16", q | tirx.const(HALF_1024, "uint32")))
        return (biased - tirx.const(1024 + zero_point, dtype)) * tirx.Cast(dtype, scale[row, col // GROUP])
    return (tirx.Cast(dtype, q) - tirx.const(zero_point, dtype)) * tirx.Cast(dtype, scale[row, col // GROUP])


def name(x_rank: int, c_rank: int, n: int, k: int, scale_dtype: str, index_dtype: str, lanes: int) -> str:
    return f"{PREFIX}.x{x_rank}.c{c_rank}.n{n}.k{k}.{scale_dtype}.{index_dtype}.l{lanes}"


def supported(n: int, k: int, lanes: int) -> bool:
    """Whether ``impl`` covers this shape: K in whole groups, N >= 1, lanes 8 or 16."""
    return n >= 1 and k >= GROUP and k % GROUP == 0 and lanes in LANES


def _shapes(x_rank, c_rank, n, k, index_dtype):
    one = lambda v: tirx.IntImm(index_dtype, v)  # noqa: E731
    return ((one(1),) * (x_rank - 1) + (one(k),), (one(n), one(k // PACK)), (one(n), one(k // GROUP)),
            (one(1),) * (c_rank - 1) + (one(n),))


def _full(buf, shape):
    return buf[tuple(slice(0, d) for d in shape)]


def _at(rank: int, last):
    """Index of element ``last`` of a (1, .., 1, L) buffer."""
    return tuple([0] * (rank - 1) + [last])


def make_desc(x_rank, c_rank, n, k, scale_dtype, index_dtype):
    xs, ps, ss, cs = _shapes(x_rank, c_rank, n, k, index_dtype)

    @T.prim_func(s_tir=True)
    def desc(x: T.Buffer(xs, "float32", offset_factor=1), packed: T.Buffer(ps, "uint32", offset_factor=1),
             scale: T.Buffer(ss, scale_dtype, offset_factor=1), y: T.Buffer(cs, "float32", offset_factor=1)):
        with T.sblock("root"):
            T.reads(_full(y, cs), _full(x, xs), _full(packed, ps), _full(scale, ss))
            T.writes(_full(y, cs))
            for i, j in T.grid(cs[-1], xs[-1]):
                with T.sblock("gemv"):
                    v_n, v_k = T.axis.remap("SR", [i, j])
                    T.reads(y[_at(c_rank, v_n)], x[_at(x_rank, v_k)], packed[v_n, v_k // PACK],
                            scale[v_n, v_k // GROUP])
                    T.writes(y[_at(c_rank, v_n)])
                    y[_at(c_rank, v_n)] = y[_at(c_rank, v_n)] + x[_at(x_rank, v_k)] * q4_weight(
                        packed, scale, v_n, v_k, "float32")

    return desc


def make_impl(x_rank, c_rank, n, k, scale_dtype, index_dtype, lanes, prefetch=PREFETCH):
    """The factored kernel (module doc) for these shapes; ``lanes`` 8 (AVX2) or 16 (AVX-512)."""
    xs, ps, ss, cs = _shapes(x_rank, c_rank, n, k, index_dtype)
    words, groups = k // PACK, k // GROUP
    chunk = 2 * lanes  # inputs per byte load
    per_group = GROUP // chunk  # byte loads per group
    nbytes = n * words * 4
    acc_n = next(u for u in (4, 2, 1) if groups % u == 0)  # groups in turn into this many accumulators
    corr_lanes = next(c for c in (16, 8, 4, 2, 1) if c <= lanes and groups % c == 0)
    f32v = f"float32x{lanes}"
    mask = T.broadcast(T.int32(15), lanes)
    four = T.broadcast(T.int32(4), lanes)

    def group_sum(pb, xp, row, g):
        """sum over group ``g`` of row ``row`` of x * q, in ``lanes`` float lanes."""
        out = None
        for c in range(per_group):
            ch = g * per_group + c
            v = T.Cast(f"int32x{lanes}", pb[T.ramp(row * words * 4 + ch * lanes, 1, lanes)])
            t = T.Cast(f32v, T.bitwise_and(v, mask)) * xp[T.ramp(ch * chunk, 1, lanes)] \
                + T.Cast(f32v, T.shift_right(v, four)) * xp[T.ramp(ch * chunk + lanes, 1, lanes)]
            out = t if out is None else out + t
        return out

    corr_t = "float32" if corr_lanes == 1 else f"float32x{corr_lanes}"

    def span(start, lanes_):  # ``lanes_`` consecutive elements (a scalar index for one)
        return start if lanes_ == 1 else T.ramp(start, 1, lanes_)

    def splat(value, lanes_):
        return value if lanes_ == 1 else T.broadcast(value, lanes_)

    def halves(v, width):  # a tree sum of a vector's lanes (the ordered reduce is a serial chain)
        while width > 1:
            width //= 2
            lo = T.Shuffle([v], list(range(width)))
            hi = T.Shuffle([v], list(range(width, 2 * width)))
            v = lo + hi
        return v

    def row_total(acc, cv):
        v = acc[T.ramp(0, 1, lanes)]
        for h in range(1, acc_n):
            v = v + acc[T.ramp(h * lanes, 1, lanes)]
        c = cv[span(0, corr_lanes)]
        if corr_lanes == lanes:
            return halves(v + c, lanes)
        return halves(v, lanes) + (halves(c, corr_lanes) if corr_lanes > 1 else c)

    def prefetch_at(pb, row, step):
        return prefetch_line(pb, T.min(row * words * 4 + step * acc_n * lanes + prefetch, nbytes - 1))

    @T.prim_func(s_tir=True)
    def impl(x: T.Buffer(xs, "float32", offset_factor=1), packed: T.Buffer(ps, "uint32", offset_factor=1),
             scale: T.Buffer(ss, scale_dtype, offset_factor=1), y: T.Buffer(cs, "float32", offset_factor=1)):
        with T.sblock("root"):
            T.reads(_full(y, cs), _full(x, xs), _full(packed, ps), _full(scale, ss))
            T.writes(_full(y, cs))
            xp = T.decl_buffer((k,), "float32")
            corr = T.decl_buffer((groups,), "float32")
            pb = T.decl_buffer((nbytes,), "uint8", data=packed.data)
            for c in range(k // chunk):
                for t in range(lanes):
                    xp[c * chunk + t] = x[_at(x_rank, c * chunk + 2 * t)]
                    xp[c * chunk + lanes + t] = x[_at(x_rank, c * chunk + 2 * t + 1)]
            for g in range(groups):
                corr[g] = T.float32(0)
                for j in range(GROUP):
                    corr[g] = corr[g] + x[_at(x_rank, g * GROUP + j)]
                corr[g] = corr[g] * T.float32(-ZERO_POINT)
            for row in T.parallel(n):
                # stack arrays (default scope) that LLVM keeps in registers; a name bound to an
                # expression would become a buffer allocated per row, hence the helper functions
                acc = T.decl_buffer((acc_n * lanes,), "float32")
                acc[T.ramp(0, 1, acc_n * lanes)] = T.broadcast(T.float32(0), acc_n * lanes)
                for step in range(groups // acc_n):
                    T.evaluate(prefetch_at(pb, row, step))
                    for h in T.unroll(acc_n):
                        acc[T.ramp(h * lanes, 1, lanes)] = acc[T.ramp(h * lanes, 1, lanes)] + T.broadcast(
                            T.Cast("float32", scale[row, step * acc_n + h]), lanes) * group_sum(
                            pb, xp, row, step * acc_n + h)
                cv = T.decl_buffer((corr_lanes,), "float32")
                cv[span(0, corr_lanes)] = splat(T.float32(0), corr_lanes)
                for gv in range(groups // corr_lanes):
                    cv[span(0, corr_lanes)] = cv[span(0, corr_lanes)] + T.Cast(
                        corr_t, scale[row, span(gv * corr_lanes, corr_lanes)]) * corr[span(gv * corr_lanes, corr_lanes)]
                y[_at(c_rank, row)] = y[_at(c_rank, row)] + row_total(acc, cv)

    return impl


def register(x_rank: int, c_rank: int, n: int, k: int, scale_dtype: str, index_dtype: str, lanes: int) -> str:
    """Register (once) the intrinsic for these shapes; returns its name. ValueError for a shape
    ``impl`` does not cover."""
    if not supported(n, k, lanes) or scale_dtype not in ("float16", "float32") \
            or index_dtype not in ("int32", "int64") or min(x_rank, c_rank) < 1:
        raise ValueError(f"no q4 GEMV intrinsic for n={n} k={k} lanes={lanes} scale {scale_dtype}")
    args = (x_rank, c_rank, n, k, scale_dtype, index_dtype)
    return register_once(name(*args, lanes), lambda: (make_desc(*args), make_impl(*args, lanes)))
