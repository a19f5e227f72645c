"""AMX tensor intrinsics: int32 tiles += uint8 rows . packed int8 (``tdpbusd``).

One AMX ``tdpbusd`` computes ``C[m, n] += sum_k A[m, k] * B[k // 4, n, k % 4]`` for an
int32 tile ``C`` of up to 16 rows x 16 outputs, a uint8 tile ``A`` of as many rows of 64
consecutive bytes (any row stride) and an int8 tile ``B`` of 16 rows of [16 outputs][4 k]:
the packed weight layouts of ``workloads.qnn_vnni`` with 64 input channels per block
(OIHW16i16o4i for a conv, the (N/16, K/4, 16, 4) dense weight) are B tiles as they lie.
tmm0 = C, tmm1 = A, tmm2 = B; every tile row is 64 bytes.

Variants, all built from ``T.call_llvm_intrin`` of ``llvm.x86.*`` (TVM 0.27 has no AMX
intrinsic of its own), named by ``dot_intrin(rows, stride, k_form)``:

* rows 1..16: C and A tiles may have fewer than 16 rows (the tile config says how many),
  so an output width of 14 or 7 (ResNet-50's) or a dense of 8 rows is tiled exactly;
* stride 1 or 2: A's rows are that many activation rows apart (strided convs);
* k_form "k" (one reduction iterator of 64: a dense) or "k4" (16 x 4: ic4, ici of a conv);
  "k4t3": that for 3 kernel columns of a 3x3 conv; "k4c2" / "k4c4": for 2 or 4 blocks of
  64 input channels.

The dot loads C, A and B (``tileloadd``), runs ``tdpbusd`` and stores C (``tilestored``):
C round-trips through memory per call (the accumulator cache the rule makes stays in
L1), once per 3 dots for "k4t3" and per 2 or 4 for the chained forms. Measured on a
Sapphire Rapids guest (``rdtsc``, one thread, 32 C tiles in turn): ~80 cycles per dot
with C loaded and stored around it, ~32 per dot in a chain of 4. The init intrinsic of the
same rows (``init_intrin``) makes sure the thread's tile configuration is this one
(``sttilecfg``, and ``ldtilecfg``, palette 1, where it is not) and zeroes C;
``postprocs.AMXTileConfig`` makes sure every AMX block's init was tensorized
with it, so the configuration is loaded before the first tile instruction of every
output tile, in every thread, and the trace records it (databases replay it).

Each variant has a plain-code twin (``emulated=True``, name suffix ``_emu``): same
description, same tile addresses and strides, tdpbusd's arithmetic written out; the rule
uses it on request, so tests run its candidates bit-exact on hosts without AMX.

The process needs the kernel's permission for tile data first: ``tvm_ext.amx.request_amx``.
"""
from __future__ import annotations

import functools

from tvm.script import tirx as T

from tvm_ext.intrinsics import register_once

DOT_PREFIX = "tvm_ext.amx_tdpbusd"
INIT_PREFIX = "tvm_ext.amx_tilecfg_zero"
COLSB = 64  # every tile row is 64 bytes: 64 uint8 of A, 16 x 4 int8 of B, 16 int32 of C
K_ROWS = 16  # rows of B: 64 k / 4
TILE_C, TILE_A, TILE_B = 0, 1, 2
STRIDES = (1, 2)  # activation row steps (conv strides) with their own intrinsic
# the reduction: one iterator of 64 (a dense), 16 x 4 (ic4, ici of a packed conv), or
# that under a loop over a 3x3 conv's 3 kernel columns ("k4t3": the C tile is loaded and
# stored once per 3 dots instead of once per dot; A moves one row per column)
# or that under a loop over input-channel blocks ("k4c2", "k4c4": the C tile stays in tmm0
# for 2 or 4 dots, A and B step to the next 64 input channels; measured on Sapphire
# Rapids, a dot with C loaded and stored around it takes ~80 cycles, one of 4 chained ~32)
K_FORMS = ("k", "k4", "k4t3", "k4c2", "k4c4")
TAPS = {"k": 1, "k4": 1, "k4t3": 3, "k4c2": 1, "k4c4": 1}
CHAIN = {"k4c2": 2, "k4c4": 4}


def dot_intrin(rows: int = 16, stride: int = 1, k_form: str = "k4", emulated: bool = False) -> str:
    """Name of the dot intrinsic for a C tile of ``rows`` (1..16) output rows whose A rows
    are ``stride`` activation rows apart, reduction written as ``k_form``; ``emulated``:
    the plain-code twin (see ``_dot_impl_emulated``)."""
    return f"{DOT_PREFIX}_m{rows}_s{stride}_{k_form}" + ("_emu" if emulated else "")


def init_intrin(rows: int = 16, emulated: bool = False) -> str:
    """Name of the config + zero intrinsic for a C tile of ``rows`` rows."""
    return f"{INIT_PREFIX}_m{rows}" + ("_emu" if emulated else "")


def k_form_of(dot_name: str) -> str:
    """The reduction form of a dot intrinsic's name (``dot_intrin``'s ``k_form``)."""
    return dot_name.removesuffix("_emu").split("_")[-1]


def init_for_dot(dot_name: str) -> str:
    """The init intrinsic that goes with a dot intrinsic (same rows: same tile config)."""
    rows = int(dot_name[len(DOT_PREFIX) + 2:].split("_")[0])
    return init_intrin(rows, dot_name.endswith("_emu"))


def tile_config_bytes(rows: int = 16, a_colsb: int = COLSB, b_rows: int = K_ROWS) -> list[int]:
    """The 64-byte ``ldtilecfg`` operand: palette 1; a C tile of ``rows`` x 64 bytes, an A
    tile of ``rows`` x ``a_colsb`` bytes, a B tile of ``b_rows`` x 64 bytes (defaults: this
    module's tiles, 64 k a dot; ``intrinsics.q4_amx``: 32 k, A 32 bytes, B 8 rows).

    Layout (Intel SDM): byte 0 palette, byte 1 start_row, bytes 16..47 colsb of tiles
    0..15 (uint16 little endian), bytes 48..63 rows of tiles 0..15.
    """
    cfg = [0] * 64
    cfg[0] = 1
    for tile, nrows, colsb in ((TILE_C, rows, COLSB), (TILE_A, rows, a_colsb), (TILE_B, b_rows, COLSB)):
        cfg[16 + 2 * tile] = colsb & 0xFF
        cfg[17 + 2 * tile] = colsb >> 8
        cfg[48 + tile] = nrows
    return cfg


# The intrinsics are written once as templates over (rows, stride) and specialized per
# variant: parsing TVMScript costs ~0.1 s per function, 80 variants would cost 8 s in
# every process that opens a database (each variant is needed to replay its traces).
@T.prim_func(s_tir=True)
def _dot_desc_k(a: T.handle, b: T.handle, c: T.handle, rows: T.int32, stride: T.int32) -> None:
    A = T.match_buffer(a, ((rows - 1) * stride + 1, 64), "uint8", offset_factor=1)
    B = T.match_buffer(b, (16, 16, 4), "int8", offset_factor=1)
    C = T.match_buffer(c, (rows, 16), "int32", offset_factor=1)
    with T.sblock("root"):
        T.reads(C[0:rows, 0:16], A[0:(rows - 1) * stride + 1, 0:64], B[0:16, 0:16, 0:4])
        T.writes(C[0:rows, 0:16])
        for m, n, k in T.grid(rows, 16, 64):
            with T.sblock("update"):
                vm, vn, vk = T.axis.remap("SSR", [m, n, k])
                C[vm, vn] = C[vm, vn] + T.cast(A[vm * stride, vk], "int32") * \
                    T.cast(B[vk // 4, vn, vk % 4], "int32")


@T.prim_func(s_tir=True)
def _dot_desc_k4(a: T.handle, b: T.handle, c: T.handle, rows: T.int32, stride: T.int32) -> None:
    A = T.match_buffer(a, ((rows - 1) * stride + 1, 64), "uint8", offset_factor=1)
    B = T.match_buffer(b, (16, 16, 4), "int8", offset_factor=1)
    C = T.match_buffer(c, (rows, 16), "int32", offset_factor=1)
    with T.sblock("root"):
        T.reads(C[0:rows, 0:16], A[0:(rows - 1) * stride + 1, 0:64], B[0:16, 0:16, 0:4])
        T.writes(C[0:rows, 0:16])
        for m, n, k4, ki in T.grid(rows, 16, 16, 4):
            with T.sblock("update"):
                vm, vn, vk4, vki = T.axis.remap("SSRR", [m, n, k4, ki])
                C[vm, vn] = C[vm, vn] + T.cast(A[vm * stride, vk4 * 4 + vki], "int32") * \
                    T.cast(B[vk4, vn, vki], "int32")


@T.prim_func(s_tir=True)
def _dot_impl(a: T.handle, b: T.handle, c: T.handle, rows: T.int32, stride: T.int32) -> None:
    sa = T.int32()
    sb = T.int32()
    sc = T.int32()
    # B's two inner strides are fixed: 16 outputs x 4 bytes per row, rows sb bytes apart
    A = T.match_buffer(a, ((rows - 1) * stride + 1, 64), "uint8", offset_factor=1, strides=[sa, 1])
    B = T.match_buffer(b, (16, 16, 4), "int8", offset_factor=1, strides=[sb, 4, 1])
    C = T.match_buffer(c, (rows, 16), "int32", offset_factor=1, strides=[sc, 1])
    with T.sblock("root"):
        T.reads(C[0:rows, 0:16], A[0:(rows - 1) * stride + 1, 0:64], B[0:16, 0:16, 0:4])
        T.writes(C[0:rows, 0:16])
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(TILE_C),
                                      C.access_ptr("r"), T.int64(sc) * T.int64(4)))
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(TILE_A),
                                      A.access_ptr("r"), T.int64(sa) * T.int64(stride)))
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(TILE_B),
                                      B.access_ptr("r"), T.int64(sb)))
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbusd", T.int8(TILE_C), T.int8(TILE_A),
                                      T.int8(TILE_B)))
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(TILE_C),
                                      C.access_ptr("w"), T.int64(sc) * T.int64(4)))


@T.prim_func(s_tir=True)
def _init_desc(c: T.handle, rows: T.int32) -> None:
    C = T.match_buffer(c, (rows, 16), "int32", offset_factor=1)
    with T.sblock("root"):
        T.reads()
        T.writes(C[0:rows, 0:16])
        for m, n in T.grid(rows, 16):
            with T.sblock("init"):
                vm, vn = T.axis.remap("SS", [m, n])
                C[vm, vn] = T.int32(0)


# tile_config_bytes(rows, a_colsb, b_rows) as 8 little-endian uint64 words: word 0 =
# palette 1, word 2 = colsb of tiles 0..2 (64, a_colsb, 64), word 6 = rows of tiles 0..2
# (rows, rows, b_rows); the rest 0
_CFG_W0 = 1


def _cfg_w2(a_colsb: int) -> int:
    return COLSB | (a_colsb << 16) | (COLSB << 32)


@T.macro
def ensure_tile_config(rows, a_colsb, b_rows):
    """Make the thread's tile configuration ``tile_config_bytes(rows, a_colsb, b_rows)``
    (``a_colsb``, ``b_rows``: Python ints; ``rows``: an int or a template's parameter).
    ldtilecfg costs ~290 cycles (measured on Sapphire Rapids: 301 cycles for config + zero
    + store of a tile vs 12 without it), sttilecfg and a compare ~14: the thread's
    configuration is read back and loaded only when the words of tiles 0..2 differ (a
    fresh thread's config reads as zeros; another kernel's tile shape differs)."""
    cur = T.decl_buffer((8,), "uint64", scope="local")
    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.sttilecfg", cur.access_ptr("w")))
    w6 = T.Cast("uint64", rows) | T.shift_left(T.Cast("uint64", rows), T.uint64(8)) | T.uint64(b_rows << 16)
    if cur[0] != T.uint64(_CFG_W0) or cur[2] != T.uint64(_cfg_w2(a_colsb)) or cur[6] != w6:
        cfg = T.decl_buffer((8,), "uint64", scope="local")
        for w in T.unroll(8):
            cfg[w] = T.Select(w == 0, T.uint64(_CFG_W0), T.Select(w == 2, T.uint64(_cfg_w2(a_colsb)), T.Select(
                w == 6, w6, T.uint64(0))))
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.ldtilecfg", cfg.access_ptr("r")))


@T.prim_func(s_tir=True)
def _init_impl(c: T.handle, rows: T.int32) -> None:
    sc = T.int32()
    C = T.match_buffer(c, (rows, 16), "int32", offset_factor=1, strides=[sc, 1])
    with T.sblock("root"):
        T.reads()
        T.writes(C[0:rows, 0:16])
        ensure_tile_config(rows, COLSB, K_ROWS)
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilezero", T.int8(TILE_C)))
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(TILE_C),
                                      C.access_ptr("w"), T.int64(sc) * T.int64(4)))


@T.macro
def _dots(C, sc, n, A, a_step, a_row, B, b_step, sb):
    """C loaded once, ``n`` dots of A and B tiles ``a_step`` / ``b_step`` elements apart
    (A's rows ``a_row`` bytes apart), C stored once: the multi-dot impls' body."""
    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(TILE_C),
                                  C.access_ptr("r"), T.int64(sc) * T.int64(4)))
    for r in T.unroll(n):
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(TILE_A),
                                      A.access_ptr("r", offset=r * a_step), T.int64(a_row)))
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tileloadd64", T.int8(TILE_B),
                                      B.access_ptr("r", offset=r * b_step), T.int64(sb)))
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tdpbusd", T.int8(TILE_C), T.int8(TILE_A),
                                      T.int8(TILE_B)))
    T.evaluate(T.call_llvm_intrin("void", "llvm.x86.tilestored64", T.int8(TILE_C),
                                  C.access_ptr("w"), T.int64(sc) * T.int64(4)))


@T.prim_func(s_tir=True)
def _dot_desc_taps(a: T.handle, b: T.handle, c: T.handle, rows: T.int32, stride: T.int32,
                   taps: T.int32) -> None:
    A = T.match_buffer(a, ((rows - 1) * stride + taps, 64), "uint8", offset_factor=1)
    B = T.match_buffer(b, (taps, 16, 16, 4), "int8", offset_factor=1)
    C = T.match_buffer(c, (rows, 16), "int32", offset_factor=1)
    with T.sblock("root"):
        T.reads(C[0:rows, 0:16], A[0:(rows - 1) * stride + taps, 0:64], B[0:taps, 0:16, 0:16, 0:4])
        T.writes(C[0:rows, 0:16])
        for m, n, r, k4, ki in T.grid(rows, 16, taps, 16, 4):
            with T.sblock("update"):
                vm, vn, vr, vk4, vki = T.axis.remap("SSRRR", [m, n, r, k4, ki])
                C[vm, vn] = C[vm, vn] + T.cast(A[vm * stride + vr, vk4 * 4 + vki], "int32") * \
                    T.cast(B[vr, vk4, vn, vki], "int32")


@T.prim_func(s_tir=True)
def _dot_impl_taps(a: T.handle, b: T.handle, c: T.handle, rows: T.int32, stride: T.int32,
                   taps: T.int32) -> None:
    sa = T.int32()
    sr = T.int32()
    sb = T.int32()
    sc = T.int32()
    A = T.match_buffer(a, ((rows - 1) * stride + taps, 64), "uint8", offset_factor=1, strides=[sa, 1])
    B = T.match_buffer(b, (taps, 16, 16, 4), "int8", offset_factor=1, strides=[sr, sb, 4, 1])
    C = T.match_buffer(c, (rows, 16), "int32", offset_factor=1, strides=[sc, 1])
    with T.sblock("root"):
        T.reads(C[0:rows, 0:16], A[0:(rows - 1) * stride + taps, 0:64], B[0:taps, 0:16, 0:16, 0:4])
        T.writes(C[0:rows, 0:16])
        _dots(C, sc, taps, A, sa, sa * stride, B, sr, sb)


# The chained variant's A and B keep the unit dimensions the conv's operands have between
# the input-channel block and the tile (A: the kernel row; B: kernel row and column), so
# that they have the shape of the operand regions the rule's tile reads. (TVM's
# tile_with_tensor_intrin maps neither this form nor the one without them onto a conv: the
# rule tiles the chained form itself, rules.amx_tensorize.tile_chained.)
@T.prim_func(s_tir=True)
def _dot_desc_chain(a: T.handle, b: T.handle, c: T.handle, rows: T.int32, stride: T.int32,
                    chain: T.int32) -> None:
    A = T.match_buffer(a, (chain, 1, (rows - 1) * stride + 1, 64), "uint8", offset_factor=1)
    B = T.match_buffer(b, (chain, 1, 1, 16, 16, 4), "int8", offset_factor=1)
    C = T.match_buffer(c, (rows, 16), "int32", offset_factor=1)
    with T.sblock("root"):
        T.reads(C[0:rows, 0:16], A[0:chain, 0:1, 0:(rows - 1) * stride + 1, 0:64],
                B[0:chain, 0:1, 0:1, 0:16, 0:16, 0:4])
        T.writes(C[0:rows, 0:16])
        for m, n, r, k4, ki in T.grid(rows, 16, chain, 16, 4):
            with T.sblock("update"):
                vm, vn, vr, vk4, vki = T.axis.remap("SSRRR", [m, n, r, k4, ki])
                C[vm, vn] = C[vm, vn] + T.cast(A[vr, 0, vm * stride, vk4 * 4 + vki], "int32") * \
                    T.cast(B[vr, 0, 0, vk4, vn, vki], "int32")


def _chain_impl(emulated: bool):
    """The chained dot's impl, or (``emulated``) its plain-code twin (see below): one
    template, the branch taken when it is parsed."""

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle, rows: T.int32, stride: T.int32, chain: T.int32) -> None:
        ra = T.int32()
        ya = T.int32()
        sa = T.int32()
        rb = T.int32()
        hb = T.int32()
        wb = T.int32()
        sb = T.int32()
        sc = T.int32()
        A = T.match_buffer(a, (chain, 1, (rows - 1) * stride + 1, 64), "uint8", offset_factor=1,
                           strides=[ra, ya, sa, 1])
        B = T.match_buffer(b, (chain, 1, 1, 16, 16, 4), "int8", offset_factor=1, strides=[rb, hb, wb, sb, 4, 1])
        C = T.match_buffer(c, (rows, 16), "int32", offset_factor=1, strides=[sc, 1])
        with T.sblock("root"):
            T.reads(C[0:rows, 0:16], A[0:chain, 0:1, 0:(rows - 1) * stride + 1, 0:64],
                    B[0:chain, 0:1, 0:1, 0:16, 0:16, 0:4])
            T.writes(C[0:rows, 0:16])
            if emulated:
                _dots_emulated(C, sc, rows, chain, A, ra, sa * stride, B, rb, sb)
            else:
                _dots(C, sc, chain, A, ra, sa * stride, B, rb, sb)

    return impl


# Plain-code twins of the impls, for hosts without AMX: the same buffers, base
# addresses (``elem_offset``) and row strides as the tileloadd/tilestored operands above,
# each tile read through a flat view of its memory, and tdpbusd's arithmetic as the
# Intel SDM gives it (C[m][n] += sum over k4, i of zx(A[m].byte[4 k4 + i]) *
# sx(B[k4].byte[4 n + i])). Tests run the rule's candidates with them bit for bit against
# NumPy, which checks every address and layout the real instructions would use.
_FLAT = 1 << 30  # extent of the flat views (unchecked; only the indices below are read)


@T.macro
def _dots_emulated(C, sc, rows, n, A, a_step, a_row, B, b_step, sb):
    """``_dots`` in plain code (see above): the same addresses, tdpbusd's arithmetic."""
    a_tile = T.decl_buffer((_FLAT,), "uint8", data=A.data)
    b_tile = T.decl_buffer((_FLAT,), "int8", data=B.data)
    c_tile = T.decl_buffer((_FLAT,), "int32", data=C.data)
    for r, m, j, k4, i in T.grid(n, rows, 16, 16, 4):
        c_tile[C.elem_offset + m * sc + j] = c_tile[C.elem_offset + m * sc + j] + T.Cast(
            "int32", a_tile[A.elem_offset + r * a_step + m * a_row + k4 * 4 + i]) * T.Cast(
            "int32", b_tile[B.elem_offset + r * b_step + k4 * sb + j * 4 + i])


@T.prim_func(s_tir=True)
def _dot_impl_emulated(a: T.handle, b: T.handle, c: T.handle, rows: T.int32, stride: T.int32) -> None:
    sa = T.int32()
    sb = T.int32()
    sc = T.int32()
    A = T.match_buffer(a, ((rows - 1) * stride + 1, 64), "uint8", offset_factor=1, strides=[sa, 1])
    B = T.match_buffer(b, (16, 16, 4), "int8", offset_factor=1, strides=[sb, 4, 1])
    C = T.match_buffer(c, (rows, 16), "int32", offset_factor=1, strides=[sc, 1])
    with T.sblock("root"):
        T.reads(C[0:rows, 0:16], A[0:(rows - 1) * stride + 1, 0:64], B[0:16, 0:16, 0:4])
        T.writes(C[0:rows, 0:16])
        a_tile = T.decl_buffer((_FLAT,), "uint8", data=A.data)
        b_tile = T.decl_buffer((_FLAT,), "int8", data=B.data)
        c_tile = T.decl_buffer((_FLAT,), "int32", data=C.data)
        for m, n, k4, i in T.grid(rows, 16, 16, 4):
            c_tile[C.elem_offset + m * sc + n] = c_tile[C.elem_offset + m * sc + n] + T.Cast(
                "int32", a_tile[A.elem_offset + m * (sa * stride) + k4 * 4 + i]) * T.Cast(
                "int32", b_tile[B.elem_offset + k4 * sb + n * 4 + i])


@T.prim_func(s_tir=True)
def _dot_impl_taps_emulated(a: T.handle, b: T.handle, c: T.handle, rows: T.int32, stride: T.int32,
                            taps: T.int32) -> None:
    sa = T.int32()
    sr = T.int32()
    sb = T.int32()
    sc = T.int32()
    A = T.match_buffer(a, ((rows - 1) * stride + taps, 64), "uint8", offset_factor=1, strides=[sa, 1])
    B = T.match_buffer(b, (taps, 16, 16, 4), "int8", offset_factor=1, strides=[sr, sb, 4, 1])
    C = T.match_buffer(c, (rows, 16), "int32", offset_factor=1, strides=[sc, 1])
    with T.sblock("root"):
        T.reads(C[0:rows, 0:16], A[0:(rows - 1) * stride + taps, 0:64], B[0:taps, 0:16, 0:16, 0:4])
        T.writes(C[0:rows, 0:16])
        _dots_emulated(C, sc, rows, taps, A, sa, sa * stride, B, sr, sb)


@T.prim_func(s_tir=True)
def _init_impl_emulated(c: T.handle, rows: T.int32) -> None:
    sc = T.int32()
    C = T.match_buffer(c, (rows, 16), "int32", offset_factor=1, strides=[sc, 1])
    with T.sblock("root"):
        T.reads()
        T.writes(C[0:rows, 0:16])
        c_tile = T.decl_buffer((_FLAT,), "int32", data=C.data)
        for m, n in T.grid(rows, 16):
            c_tile[C.elem_offset + m * sc + n] = 0


_dot_impl_chain, _dot_impl_chain_emulated = _chain_impl(False), _chain_impl(True)


def _specialize(func, *values):
    """``func`` with its trailing scalar parameters (rows, stride) bound to ``values``."""
    params = list(func.params)[-len(values):]
    return func.specialize(dict(zip(params, values)))


def _make_dot(rows: int, stride: int, k_form: str, emulated: bool = False):
    if k_form in CHAIN:
        impl = _dot_impl_chain_emulated if emulated else _dot_impl_chain
        return (_specialize(_dot_desc_chain, rows, stride, CHAIN[k_form]),
                _specialize(impl, rows, stride, CHAIN[k_form]))
    if TAPS[k_form] > 1:
        impl = _dot_impl_taps_emulated if emulated else _dot_impl_taps
        return (_specialize(_dot_desc_taps, rows, stride, TAPS[k_form]),
                _specialize(impl, rows, stride, TAPS[k_form]))
    desc = _dot_desc_k if k_form == "k" else _dot_desc_k4
    impl = _dot_impl_emulated if emulated else _dot_impl
    return _specialize(desc, rows, stride), _specialize(impl, rows, stride)


def _make_init(rows: int, emulated: bool = False):
    return _specialize(_init_desc, rows), _specialize(_init_impl_emulated if emulated else _init_impl, rows)


def register_init(rows: int, emulated: bool = False) -> str:
    """Register (once) the config + zero intrinsic of a ``rows``-row C tile; returns its name."""
    return register_once(init_intrin(rows, emulated), lambda: _make_init(rows, emulated))


def register_dot(rows: int, stride: int = 1, k_form: str = "k4", emulated: bool = False) -> str:
    """Register (once) the dot intrinsic and its init; returns the dot's name."""
    if not (1 <= rows <= 16 and stride in STRIDES and k_form in K_FORMS):
        raise ValueError(f"no AMX intrinsic for rows={rows} stride={stride} k_form={k_form!r}")
    register_init(rows, emulated)
    return register_once(dot_intrin(rows, stride, k_form, emulated),
                         lambda: _make_dot(rows, stride, k_form, emulated))


def makers() -> dict:
    """Name -> the call that registers it, for every dot and init, real and emulated (nothing is
    parsed here)."""
    out = {}
    for emulated in (False, True):
        for rows in range(1, 17):
            out[init_intrin(rows, emulated)] = functools.partial(register_init, rows, emulated)
            for stride in STRIDES:
                for k_form in K_FORMS:
                    out[dot_intrin(rows, stride, k_form, emulated)] = functools.partial(
                        register_dot, rows, stride, k_form, emulated)
    return out


def register_intrinsics() -> None:
    """Register every AMX intrinsic (a database whose traces name them can only be loaded
    once they exist in this process)."""
    for rows in range(1, 17):
        for stride in STRIDES:
            for k_form in K_FORMS:
                register_dot(rows, stride, k_form)
