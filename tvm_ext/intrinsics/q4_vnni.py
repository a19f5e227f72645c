"""x86 tensor intrinsic for a q4 x int8 tile: one group of 32 inputs, MB tokens x NB*16 columns.

Description (``c`` int32 (MB, NB, 16), ``w`` uint32 (NB, 4, 16), ``x`` int8 (MB, 4, 2, 4)):

    c[m, nb, i] += sum over word v, parity p, byte b of
                   ((w[nb, v, i] >> (8 b + 4 p)) & 15) * x[m, v, p, b]

``w`` is the repacked weight of ``workloads.q4_int8_gemm`` (16 columns' words side by side, one
packed word = 8 nibbles = 8 consecutive inputs of a column, input 8v + j in nibble j) and ``x`` the
activations quantized to int8, stored per word as its even inputs then its odd ones
(``x[m, v, p, b]`` = input 8v + 2b + p).  Implementation, per word: one 64-byte load of the 16
columns' words, ``& 0x0F0F0F0F`` (the even inputs' nibbles, one per byte) and ``>> 4 & 0x0F0F0F0F``
(the odd ones'): unpacked once and used by all MB tokens, each one ``vpdpbusd`` (unsigned nibbles x
the token's 4 signed activation bytes broadcast) per parity.  The MB x NB accumulators stay in
registers for the whole group.  ``lanes=16``: one 512-bit ``vpdpbusd`` per 16 columns (AVX-512 VNNI);
``lanes=8``: two 256-bit VEX ``vpdpbusd`` (AVX-VNNI: Intel client CPUs since Alder Lake, also Zen 4/5).
"""
from __future__ import annotations

from tvm.script import tirx as T

from tvm_ext.intrinsics import register_once
from tvm_ext.intrinsics.vnni import vpdpbusd

WORDS = 4  # packed words of a group of 32 inputs
LANES = 16  # columns of one 512-bit vector
TOKEN_TILES = (2, 4, 8)  # MB choices registered (an extent-1 loop is dropped by compute_at, the
# description would not match it)
COLUMN_TILES = (2, 4)  # NB choices registered (x 16 columns)


FORMS = {16: "avx512vnni", 8: "avxvnni"}  # int32 lanes of one vpdpbusd -> the ISA it needs


def intrin_name(mb: int, nb: int, lanes: int = LANES) -> str:
    return f"tvm_ext.q4_int8_group_{FORMS[lanes]}_m{mb}_n{nb}"


def _desc(mb: int, nb: int):
    @T.prim_func(s_tir=True)
    def desc(c: T.Buffer((mb, nb, LANES), "int32", offset_factor=1),
             w: T.Buffer((nb, WORDS, LANES), "uint32", offset_factor=1),
             x: T.Buffer((mb, WORDS, 2, 4), "int8", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(c[0:mb, 0:nb, 0:LANES], w[0:nb, 0:WORDS, 0:LANES], x[0:mb, 0:WORDS, 0:2, 0:4])
            T.writes(c[0:mb, 0:nb, 0:LANES])
            for m, n, i, v, p, b in T.grid(mb, nb, LANES, WORDS, 2, 4):
                with T.sblock("update"):
                    vm, vn, vi, vv, vp, vb = T.axis.remap("SSSRRR", [m, n, i, v, p, b])
                    c[vm, vn, vi] = c[vm, vn, vi] + T.Cast("int32", T.bitwise_and(
                        T.shift_right(w[vn, vv, vi], T.Cast("uint32", vb * 8 + vp * 4)), T.uint32(15))) * T.Cast(
                        "int32", x[vm, vv, vp, vb])

    return desc


def _impl(mb: int, nb: int, lanes: int = LANES):
    dot = vpdpbusd(lanes)
    mask = T.broadcast(T.uint32(0x0F0F0F0F), lanes)
    four = T.broadcast(T.uint32(4), lanes)
    halves = LANES // lanes

    def nibbles(w, n, v, h, p):  # ``lanes`` columns' nibbles of parity p in word v, one per byte
        word = w.vload([n, v, h * lanes], f"uint32x{lanes}")
        return T.reinterpret(f"int8x{4 * lanes}", T.bitwise_and(T.shift_right(word, four) if p else word, mask))

    def bcast(x, m, v, p):  # the token's 4 activation bytes of word v, parity p, in every lane
        return T.reinterpret(f"int8x{4 * lanes}", T.broadcast(
            T.reinterpret(x.vload([m, v, p, 0], "int8x4"), dtype="int32"), lanes))

    @T.prim_func(s_tir=True)
    def impl(c: T.Buffer((mb, nb, LANES), "int32", offset_factor=1),
             w: T.Buffer((nb, WORDS, LANES), "uint32", offset_factor=1),
             x: T.Buffer((mb, WORDS, 2, 4), "int8", offset_factor=1)) -> None:
        with T.sblock("root"):
            T.reads(c[0:mb, 0:nb, 0:LANES], w[0:nb, 0:WORDS, 0:LANES], x[0:mb, 0:WORDS, 0:2, 0:4])
            T.writes(c[0:mb, 0:nb, 0:LANES])
            for v in T.unroll(WORDS):
                for n in T.unroll(nb):
                    for h in T.unroll(halves):
                        for m in T.unroll(mb):
                            c[m, n, T.ramp(h * lanes, 1, lanes)] = dot(dot(
                                c.vload([m, n, h * lanes], f"int32x{lanes}"), nibbles(w, n, v, h, 0),
                                bcast(x, m, v, 0)), nibbles(w, n, v, h, 1), bcast(x, m, v, 1))

    return impl


def register(mb: int, nb: int, lanes: int = LANES) -> str:
    """Register (once) and name the (MB, NB) intrinsic with ``lanes``-lane vpdpbusd."""
    return register_once(intrin_name(mb, nb, lanes), lambda: (_desc(mb, nb), _impl(mb, nb, lanes)))


def register_intrinsics() -> None:
    """Every (MB, NB, lanes) form (a database whose traces name them loads only once they exist)."""
    for lanes in FORMS:
        for mb in TOKEN_TILES:
            for nb in COLUMN_TILES:
                register(mb, nb, lanes)


def lanes_for(target) -> int | None:
    """16 where ``target`` has AVX-512 VNNI, 8 where it has AVX-VNNI only, else None."""
    from tvm_ext.targets import vnni_kinds  # pylint: disable=import-outside-toplevel

    kinds = vnni_kinds(target) if target is not None else []
    return next((lanes for lanes, kind in FORMS.items() if kind in kinds), None)
