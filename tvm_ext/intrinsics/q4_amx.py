"""AMX form of the q4 x int8 tile: one group of 32 inputs, MB (2..16) tokens x NB*16 columns.

Same description as ``intrinsics.q4_vnni``'s tile (``c[m, nb, i] += nibble(w[nb, v, i], p, b) *
x[m, v, p, b]``, int8 activations), computed with one AMX ``tdpbssd`` (int8 x int8 -> int32:
``C[m, j] += sum_{r < 8, i < 4} A[m].byte[4r + i] * B[r].byte[4j + i]``) per 16 columns:

* A (tmm1) = the MB tokens' activations as they lie: token m's 32 bytes ``x[m, 0:4, 0:2, 0:4]`` (byte
  8v + 4p + b = input 8v + 2b + p), rows K bytes apart: no repacking;
* B (tmm2) row r = 2v + p = ``(w[nb, v, 0:16] >> 4p) & 0x0F0F0F0F`` (16 words, 64 bytes): byte
  4j + b is column j's nibble of input 8v + 2b + p, the k of A's byte 4r + b.  Unpacked with
  AVX-512 (4 loads, 8 and/shift) into 512 bytes of stack, then ``tileloadd``.  Nibbles 0..15 are
  valid int8, so the signed x signed ``tdpbssd`` takes the int8 activations and the nibbles
  directly (no +128 shift of the activations, no column-sum correction as ``tdpbusd`` would need);
* C (tmm0) = the int32 accumulators, MB rows of 64 bytes: per column block, C loaded, one
  ``tdpbssd``, C stored (A is loaded once a call).

Tile configuration (``amx.tile_config_bytes(MB, 32, 8)``): C MB x 64 bytes, A MB x 32, B 8 x 64 --
not the conv intrinsics' (A 64 bytes, B 16 rows).  The init intrinsic (zero the MB x NB*16 block)
loads it where the thread's differs (``amx.ensure_tile_config``); the rule tensorizes it with the
dot, both traced, so a replayed trace keeps it (``postprocs.amx_tile_config`` explains why).

Each has a plain-code twin (``emulated``, name suffix ``_emu``): the same unpacking into the
same stack buffer, tdpbssd's arithmetic written out over the tiles' addresses and strides, so
tests run the rule's AMX schedules bit-exact on hosts without AMX.  The templates are parsed on
first use (``import tvm_ext`` does not pay for them).
"""
from __future__ import annotations

import functools

from tvm.script import tirx as T

from tvm_ext.intrinsics import register_once

LANES = 16  # columns of a column block
WORDS = 4  # packed words of a group (32 inputs)
B_ROWS = 8  # B tile rows: 32 k / 4
A_COLSB = 32  # A tile row: one group's 32 activation bytes
TOKEN_TILES = tuple(range(2, 17, 2))  # MB: 16, or every M < 16 (prefill M is even)
COLUMN_TILES = (1, 2, 4)  # NB (x 16 columns), one tdpbssd each
FORMS = ("amx", "amx_emu")
_FLAT = 1 << 30  # extent of the emulation's flat views (only the indices below are read)


def intrin_name(mb: int, nb: int, emulated: bool = False) -> str:
    return f"tvm_ext.q4_int8_group_amx_m{mb}_n{nb}" + ("_emu" if emulated else "")


def init_name(mb: int, nb: int, emulated: bool = False) -> str:
    return f"tvm_ext.q4_int8_group_amx_init_m{mb}_n{nb}" + ("_emu" if emulated else "")


def _specialize(func, *values):
    return func.specialize(dict(zip(list(func.params)[-len(values):], values)))


@functools.cache
def _desc_template(one_block: bool):
    """The description over (mb, nb); ``one_block``: NB = 1 without the n loop (``compute_at``
    drops an extent-1 loop, and the description must have the loops the tile has)."""
    def update(c, w, x, m, n, v, i, p, b):
        return c[m, n, i] + T.Cast("int32", T.bitwise_and(T.shift_right(
            w[n, v, i], T.Cast("uint32", b * 8 + p * 4)), T.uint32(15))) * T.Cast("int32", x[m, v, p, b])

    @T.prim_func(s_tir=True)
    def desc(c: T.handle, w: T.handle, x: T.handle, mb: T.int32, nb: T.int32) -> None:
        C = T.match_buffer(c, (mb, nb, LANES), "int32", offset_factor=1)
        W = T.match_buffer(w, (nb, WORDS, LANES), "uint32", offset_factor=1)
        X = T.match_buffer(x, (mb, WORDS, 2, 4), "int8", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:mb, 0:nb, 0:LANES], W[0:nb, 0:WORDS, 0:LANES], X[0:mb, 0:WORDS, 0:2, 0:4])
            T.writes(C[0:mb, 0:nb, 0:LANES])
            if one_block:
                for m, i, v, p, b in T.grid(mb, LANES, WORDS, 2, 4):
                    with T.sblock("update"):
                        vm, vi, vv, vp, vb = T.axis.remap("SSRRR", [m, i, v, p, b])
                        C[vm, 0, vi] = update(C, W, X, vm, 0, vv, vi, vp, vb)
            else:
                for m, n, i, v, p, b in T.grid(mb, nb, LANES, WORDS, 2, 4):
                    with T.sblock("update"):
                        vm, vn, vi, vv, vp, vb = T.axis.remap("SSSRRR", [m, n, i, v, p, b])
                        C[vm, vn, vi] = update(C, W, X, vm, vn, vv, vi, vp, vb)

    return desc


@functools.cache
def _impl_template(emulated: bool):
    """The dot over (mb, nb): ``tdpbssd`` per column block, or (``emulated``) its plain twin."""
    from tvm_ext.intrinsics.amx import TILE_A, TILE_B, TILE_C  # pylint: disable=import-outside-toplevel

    mask = T.broadcast(T.uint32(0x0F0F0F0F), LANES)
    four = T.broadcast(T.uint32(4), LANES)

    @T.prim_func(s_tir=True)
    def impl(c: T.handle, w: T.handle, x: T.handle, mb: T.int32, nb: T.int32) -> None:
        sm = T.int32()
        sn = T.int32()
        sw = T.int32()
        sx = T.int32()
        C = T.match_buffer(c, (mb, nb, LANES), "int32", offset_factor=1, strides=[sm, sn, 1])
        W = T.match_buffer(w, (nb, WORDS, LANES), "uint32", offset_factor=1, strides=[sw, LANES, 1])
        X = T.match_buffer(x, (mb, WORDS, 2, 4), "int8", offset_factor=1, strides=[sx, 8, 4, 1])
        with T.sblock("root"):
            T.reads(C[0:mb, 0:nb, 0:LANES], W[0:nb, 0:WORDS, 0:LANES], X[0:mb, 0:WORDS, 0:2, 0:4])
            T.writes(C[0:mb, 0:nb, 0:LANES])
            bt = T.decl_buffer((B_ROWS, LANES), "uint32", scope="local")  # the B tile, row 2v + p
            if not emulated:
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(TILE_A),
                                              X.access_ptr("r"), T.int64(sx)))
            for n in T.unroll(nb):
                for v in T.unroll(WORDS):
                    bt[2 * v, T.ramp(0, 1, LANES)] = T.bitwise_and(W.vload([n, v, 0], f"uint32x{LANES}"), mask)
                    bt[2 * v + 1, T.ramp(0, 1, LANES)] = T.bitwise_and(
                        T.shift_right(W.vload([n, v, 0], f"uint32x{LANES}"), four), mask)
                if emulated:  # tdpbssd on the tiles' memory: A rows sx bytes apart, B rows 64 bytes
                    a_tile = T.decl_buffer((_FLAT,), "int8", data=X.data)
                    c_tile = T.decl_buffer((_FLAT,), "int32", data=C.data)
                    for m, j, r, i in T.grid(mb, LANES, B_ROWS, 4):
                        c_tile[C.elem_offset + m * sm + n * sn + j] = c_tile[C.elem_offset + m * sm + n * sn + j] + \
                            T.Cast("int32", a_tile[X.elem_offset + m * sx + 4 * r + i]) * T.Cast(
                                "int32", T.Cast("int8", T.bitwise_and(T.shift_right(
                                    bt[r, j], T.Cast("uint32", 8 * i)), T.uint32(0xFF))))
                else:
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(TILE_C),
                                                  C.access_ptr("r", offset=n * sn), T.int64(sm) * T.int64(4)))
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(TILE_B),
                                                  bt.access_ptr("r"), T.int64(LANES * 4)))
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbssd", T.int8(TILE_C), T.int8(TILE_A),
                                                  T.int8(TILE_B)))
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(TILE_C),
                                                  C.access_ptr("w", offset=n * sn), T.int64(sm) * T.int64(4)))

    return impl


@functools.cache
def _init_desc_template(one_block: bool):
    @T.prim_func(s_tir=True)
    def desc(c: T.handle, mb: T.int32, nb: T.int32) -> None:
        C = T.match_buffer(c, (mb, nb, LANES), "int32", offset_factor=1)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:mb, 0:nb, 0:LANES])
            if one_block:
                for m, i in T.grid(mb, LANES):
                    with T.sblock("init"):
                        vm, vi = T.axis.remap("SS", [m, i])
                        C[vm, 0, vi] = T.int32(0)
            else:
                for m, n, i in T.grid(mb, nb, LANES):
                    with T.sblock("init"):
                        vm, vn, vi = T.axis.remap("SSS", [m, n, i])
                        C[vm, vn, vi] = T.int32(0)

    return desc


@functools.cache
def _init_impl_template(emulated: bool):
    """Zero the block; the real one first makes the thread's tile config this form's."""
    from tvm_ext.intrinsics.amx import TILE_C, ensure_tile_config  # pylint: disable=import-outside-toplevel

    @T.prim_func(s_tir=True)
    def impl(c: T.handle, mb: T.int32, nb: T.int32) -> None:
        sm = T.int32()
        sn = T.int32()
        C = T.match_buffer(c, (mb, nb, LANES), "int32", offset_factor=1, strides=[sm, sn, 1])
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:mb, 0:nb, 0:LANES])
            if emulated:
                c_tile = T.decl_buffer((_FLAT,), "int32", data=C.data)
                for m, n, i in T.grid(mb, nb, LANES):
                    c_tile[C.elem_offset + m * sm + n * sn + i] = 0
            else:
                ensure_tile_config(mb, A_COLSB, B_ROWS)
                T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilezero", T.int8(TILE_C)))
                for n in T.unroll(nb):
                    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(TILE_C),
                                                  C.access_ptr("w", offset=n * sn), T.int64(sm) * T.int64(4)))

    return impl


def tile_config(mb: int) -> list[int]:
    """The ``ldtilecfg`` bytes of the (MB, any NB) tile: C MB x 64, A MB x 32, B 8 x 64."""
    from tvm_ext.intrinsics.amx import tile_config_bytes  # pylint: disable=import-outside-toplevel

    return tile_config_bytes(mb, A_COLSB, B_ROWS)


def register(mb: int, nb: int, emulated: bool = False) -> tuple[str, str]:
    """Register (once) the (MB, NB) dot and its init; returns (dot name, init name)."""
    if mb not in TOKEN_TILES or nb not in COLUMN_TILES:
        raise ValueError(f"no q4 AMX tile of {mb} tokens x {nb} column blocks (MB in {TOKEN_TILES}, "
                         f"NB in {COLUMN_TILES})")
    one = nb == 1
    init = register_once(init_name(mb, nb, emulated), lambda: (
        _specialize(_init_desc_template(one), mb, nb), _specialize(_init_impl_template(emulated), mb, nb)))
    dot = register_once(intrin_name(mb, nb, emulated), lambda: (
        _specialize(_desc_template(one), mb, nb), _specialize(_impl_template(emulated), mb, nb)))
    return dot, init


def makers() -> dict:
    """Name -> the call that registers it (the dot and its init together), for every (MB, NB) tile,
    real and emulated (nothing is parsed here)."""
    out = {}
    for emulated in (False, True):
        for mb in TOKEN_TILES:
            for nb in COLUMN_TILES:
                make = functools.partial(register, mb, nb, emulated)
                out[intrin_name(mb, nb, emulated)] = out[init_name(mb, nb, emulated)] = make
    return out


def register_intrinsics() -> None:
    """Every (MB, NB) tile, real and emulated (a database whose traces name them loads only once
    they exist); called by ``q4_vnni.register_intrinsics``."""
    for emulated in (False, True):
        for mb in TOKEN_TILES:
            for nb in COLUMN_TILES:
                register(mb, nb, emulated)


def form_for(target, emulated: bool = False) -> str | None:
    """"amx" where ``target`` has AMX int8; else "amx_emu" if ``emulated`` (tests), else None."""
    from tvm_ext.targets import has_amx  # pylint: disable=import-outside-toplevel

    if target is not None and has_amx(target):
        return "amx"
    return "amx_emu" if emulated else None


def token_tile(tokens: int) -> int | None:
    """The AMX tile's MB for a GEMM of ``tokens`` tokens: 16 where 16 divides it, all of them
    below 16 (an even M), else None (the rule offers only its VNNI sketches then)."""
    if tokens % 16 == 0:
        return 16
    return tokens if tokens in TOKEN_TILES else None
