"""x86 tensor intrinsic for a q4 x int8 tile: one group of 32 inputs, MB tokens x NB*16 columns.

Description (``c`` int32 (MB, NB, 16), ``w`` uint32 (NB, 4, 16), ``x`` int8 (MB, 4, 2, 4)):

    c[m, nb, i] += sum over word v, parity p, byte b of
                   ((w[nb, v, i] >> (8 b + 4 p)) & 15) * x[m, v, p, b]

``w`` is the repacked weight of ``workloads.q4_int8_gemm`` (16 columns' words side by side, one
packed word = 8 nibbles = 8 consecutive inputs of a column, input 8v + j in nibble j) and ``x`` the
activations quantized to int8, stored per word as its even inputs then its odd ones
(``x[m, v, p, b]`` = input 8v + 2b + p).  Implementation, per word: one 64-byte load of the 16
columns' words, ``& 0x0F0F0F0F`` (the even inputs' nibbles, one per byte) and ``>> 4 & 0x0F0F0F0F``
(the odd ones'): unpacked once and used by all MB tokens, each one product of unsigned nibbles x the
token's 4 signed activation bytes broadcast, per parity.  The MB x NB accumulators stay in registers
for the whole group.  Forms (``FORMS``, picked per target by ``form_for``):

* ``avx512vnni``: one 512-bit ``vpdpbusd`` per 16 columns and parity;
* ``avxvnni``: two 256-bit VEX ``vpdpbusd`` (Intel client CPUs since Alder Lake, also Zen 4/5);
* ``avx2``: ``vpmaddubsw`` per parity, summed in int16 over the group's 4 words, then one ``vpmaddwd``
  by ones per 8 columns and token, on 256 bits: every x86 CPU since Haswell.  An int16 lane sums 16
  products of a nibble (<= 15) and an int8 (>= -128): |sum| <= 30720 < 2^15, so nothing saturates or
  wraps, for any activation byte.  Per 64 products that is 2 ``vpmaddubsw`` + 2 ``vpaddw`` and a
  quarter ``vpmaddwd``, where summing each word into int32 took 2 + 1 + 1 (+ 1 ``vpaddd``): the
  multiply ports, the bound on these CPUs, do 2.25 operations instead of 3.

MB = 1 or NB = 1 tiles have their own descriptions (``compute_at`` drops an extent-1 loop; the tile
must match the loops left).  ``ahead`` > 0 adds a software prefetch of each weight line that many
bytes further in its column block's stream: a one-token tile (decode) is DRAM-bound, and the
hardware prefetchers alone stop at each 4 KiB page.
"""
from __future__ import annotations

import functools

from tvm.script import tirx as T

from tvm_ext.intrinsics import register_once
from tvm_ext.intrinsics.prefetch import prefetch
from tvm_ext.intrinsics.vnni import MADDUBS, MADDWD, vpdpbusd

WORDS = 4  # packed words of a group of 32 inputs
LANES = 16  # columns of a column block (one 512-bit vector of int32)
TOKEN_TILES = (1, 2, 4, 8)  # MB choices registered
COLUMN_TILES = (1, 2, 4)  # NB choices registered (x 16 columns)
AHEAD = (0, 4096, 8192)  # prefetch distances registered (bytes)
FORMS = {"avx512vnni": 16, "avxvnni": 8, "avx2": 8}  # form -> int32 lanes of one product


def intrin_name(mb: int, nb: int, form: str = "avx512vnni", ahead: int = 0) -> str:
    return f"tvm_ext.q4_int8_group_{form}_m{mb}_n{nb}" + (f"_pf{ahead}" if ahead else "")


def _update(c, w, x, m, n, v, i, p, b):
    """The description's statement for token m, block n, column i, word v, parity p, byte b."""
    return c[m, n, i] + T.Cast("int32", T.bitwise_and(T.shift_right(w[n, v, i], T.Cast("uint32", b * 8 + p * 4)),
                                                      T.uint32(15))) * T.Cast("int32", x[m, v, p, b])


def _desc(mb: int, nb: int):
    if mb == 1:
        return _desc_one_token(nb)

    @T.macro
    def body(c, w, x):
        for m, n, i, v, p, b in T.grid(mb, nb, LANES, WORDS, 2, 4):
            with T.sblock("update"):
                vm, vn, vi, vv, vp, vb = T.axis.remap("SSSRRR", [m, n, i, v, p, b])
                c[vm, vn, vi] = _update(c, w, x, vm, vn, vv, vi, vp, vb)

    return _tile_func(mb, nb, body)


def _desc_one_token(nb: int):
    if nb == 1:
        return _desc_one_block()

    @T.prim_func(s_tir=True)
    def desc(c: T.Buffer((1, nb, LANES), "int32", offset_factor=1),
             w: T.Buffer((nb, WORDS, LANES), "uint32", offset_factor=1),
             x: T.Buffer((1, WORDS, 2, 4), "int8", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(c[0, 0:nb, 0:LANES], w[0:nb, 0:WORDS, 0:LANES], x[0, 0:WORDS, 0:2, 0:4])
            T.writes(c[0, 0:nb, 0:LANES])
            for n, i, v, p, b in T.grid(nb, LANES, WORDS, 2, 4):
                with T.sblock("update"):
                    vn, vi, vv, vp, vb = T.axis.remap("SSRRR", [n, i, v, p, b])
                    c[0, vn, vi] = _update(c, w, x, 0, vn, vv, vi, vp, vb)

    return desc


def _desc_one_block():
    @T.prim_func(s_tir=True)
    def desc(c: T.Buffer((1, 1, LANES), "int32", offset_factor=1),
             w: T.Buffer((1, WORDS, LANES), "uint32", offset_factor=1),
             x: T.Buffer((1, WORDS, 2, 4), "int8", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(c[0, 0, 0:LANES], w[0, 0:WORDS, 0:LANES], x[0, 0:WORDS, 0:2, 0:4])
            T.writes(c[0, 0, 0:LANES])
            for i, v, p, b in T.grid(LANES, WORDS, 2, 4):
                with T.sblock("update"):
                    vi, vv, vp, vb = T.axis.remap("SRRR", [i, v, p, b])
                    c[0, 0, vi] = _update(c, w, x, 0, 0, vv, vi, vp, vb)

    return desc


def maddubs(a, b):
    """``vpmaddubsw`` (256-bit): 32 u8 x s8 products, adjacent pairs summed into 16 int16."""
    return T.call_llvm_pure_intrin("int16x16", T.llvm_lookup_intrinsic_id(MADDUBS), a, b)


def widen_pairs(sums):
    """16 int16 -> 8 int32, adjacent pairs summed (``vpmaddwd`` by ones)."""
    return T.call_llvm_pure_intrin("int32x8", T.llvm_lookup_intrinsic_id(MADDWD), sums, T.broadcast(T.int16(1), 16))


def _product(form: str):
    """``step(acc, even_nibbles, x_even, odd_nibbles, x_odd)``: one word's products added to ``acc``,
    ``FORMS[form]`` lanes (int32; on AVX2 int16, the group's sum widened once by ``widen_pairs``)."""
    if form == "avx2":
        return lambda acc, ne, xe, no, xo: acc + maddubs(ne, xe) + maddubs(no, xo)
    dot = vpdpbusd(FORMS[form])
    return lambda acc, ne, xe, no, xo: dot(dot(acc, ne, xe), no, xo)


def _loads(lanes: int, ahead: int):
    """The impls' operand reads on ``lanes`` int32 lanes: ``nibbles(w, n, v, h, p)`` (the columns of half h
    of block n, their nibbles of parity p in word v, one per byte), ``bcast(x, m, v, p)`` (token m's 4
    activation bytes of word v, parity p, in every lane) and ``ask(w, n, v)`` (a prefetch of the line
    ``ahead`` bytes further in block n's stream, or nothing)."""
    mask = T.broadcast(T.uint32(0x0F0F0F0F), lanes)
    four = T.broadcast(T.uint32(4), lanes)
    words_ahead = ahead // (LANES * 4)  # a word row of a column block (16 words) is one 64-byte line

    def nibbles(w, n, v, h, p):
        word = w.vload([n, v, h * lanes], f"uint32x{lanes}")
        return T.reinterpret(f"int8x{4 * lanes}", T.bitwise_and(T.shift_right(word, four) if p else word, mask))

    def bcast(x, m, v, p):
        return T.reinterpret(f"int8x{4 * lanes}", T.broadcast(
            T.reinterpret(x.vload([m, v, p, 0], "int8x4"), dtype="int32"), lanes))

    def ask(w, n, v):
        return prefetch(w, (n, v + words_ahead, 0)) if words_ahead else T.int32(0)

    return nibbles, bcast, ask


def _tile_func(mb: int, nb: int, body):
    """A tile PrimFunc on the whole (MB, NB) buffers (every implementation, and the description where
    MB > 1): the buffers and regions they share, ``body(c, w, x)`` (a ``T.macro``) inside."""

    @T.prim_func(s_tir=True)
    def tile(c: T.Buffer((mb, nb, LANES), "int32", offset_factor=1),
             w: T.Buffer((nb, WORDS, LANES), "uint32", offset_factor=1),
             x: T.Buffer((mb, WORDS, 2, 4), "int8", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(c[0:mb, 0:nb, 0:LANES], w[0:nb, 0:WORDS, 0:LANES], x[0:mb, 0:WORDS, 0:2, 0:4])
            T.writes(c[0:mb, 0:nb, 0:LANES])
            body(c, w, x)

    return tile


def _add_words(mb: int, nb: int, form: str, ahead: int, width: int):
    """A ``T.macro`` ``(acc, w, x)``: each of the group's words' products (``_product(form)``) added to
    ``acc``, whose [m, n] row holds ``width`` accumulator lanes per ``FORMS[form]`` columns."""
    lanes, step = FORMS[form], _product(form)
    nibbles, bcast, ask = _loads(lanes, ahead)

    @T.macro
    def add_words(acc, w, x):
        for v in T.unroll(WORDS):
            for n in T.unroll(nb):
                T.evaluate(ask(w, n, v))
                for h in T.unroll(LANES // lanes):
                    for m in T.unroll(mb):
                        acc[m, n, T.ramp(h * width, 1, width)] = step(
                            acc[m, n, T.ramp(h * width, 1, width)], nibbles(w, n, v, h, 0),
                            bcast(x, m, v, 0), nibbles(w, n, v, h, 1), bcast(x, m, v, 1))

    return add_words


def _impl(mb: int, nb: int, form: str = "avx512vnni", ahead: int = 0):
    """The VNNI forms: each word's products added to the int32 accumulators in place."""
    if form == "avx2":
        return _impl_avx2(mb, nb, ahead)
    return _tile_func(mb, nb, _add_words(mb, nb, form, ahead, FORMS[form]))


def _impl_avx2(mb: int, nb: int, ahead: int = 0):
    """The AVX2 form (module doc): int16 accumulators for the group (one per token and 8 columns),
    each word's two ``vpmaddubsw`` added to them, then widened and added to the int32 ones once."""
    lanes = FORMS["avx2"]
    halves, pairs = LANES // lanes, 2 * lanes  # pairs: int16 lanes of one vector
    add_words = _add_words(mb, nb, "avx2", ahead, pairs)

    @T.macro
    def body(c, w, x):
        acc = T.decl_buffer((mb, nb, halves * pairs), "int16")
        for n, h, m in T.grid(nb, halves, mb):
            acc[m, n, T.ramp(h * pairs, 1, pairs)] = T.broadcast(T.int16(0), pairs)
        add_words(acc, w, x)
        for n, h, m in T.grid(nb, halves, mb):
            c[m, n, T.ramp(h * lanes, 1, lanes)] = c.vload([m, n, h * lanes], f"int32x{lanes}") + widen_pairs(
                acc[m, n, T.ramp(h * pairs, 1, pairs)])

    return _tile_func(mb, nb, body)


def register(mb: int, nb: int, form: str = "avx512vnni", ahead: int = 0) -> str:
    """Register (once) and name the (MB, NB) tile intrinsic of ``form`` prefetching ``ahead`` bytes."""
    return register_once(intrin_name(mb, nb, form, ahead), lambda: (_desc(mb, nb), _impl(mb, nb, form, ahead)))


def makers() -> dict:
    """Name -> the call that registers it, for every form the rule offers: every (MB, NB) of each
    ISA form, the prefetching ones for one token (nothing is parsed here)."""
    return {intrin_name(mb, nb, form, ahead): functools.partial(register, mb, nb, form, ahead)
            for form in FORMS for mb in TOKEN_TILES for nb in COLUMN_TILES
            for ahead in (AHEAD if mb == 1 else (0,))}


def register_intrinsics() -> None:
    """Every form the rule offers, the AMX form's tiles too (``q4_amx``: the rule offers them on
    AMX hosts)."""
    from tvm_ext.intrinsics import q4_amx  # pylint: disable=import-outside-toplevel

    for make in makers().values():
        make()
    q4_amx.register_intrinsics()


def form_for(target) -> str | None:
    """The best form ``target`` runs: avx512vnni, avxvnni, avx2, or None (no AVX2)."""
    from tvm_ext.targets import has_avx2, vnni_kinds  # pylint: disable=import-outside-toplevel

    if target is None:
        return None
    kinds = vnni_kinds(target)
    return kinds[0] if kinds else ("avx2" if has_avx2(target) else None)
