"""x86 tensor intrinsics for the 16x4 uint8 x int8 -> int32 dot product.

All forms share one description (that of TVM's ``dot_16x4_vnni``: 16 int32 lanes, each
adding the 4 products of 4 uint8 activations with its 4 int8 weights), so one packed
weight layout serves them all:

* ``tvm_ext.dot_16x4_avx512vnni``: one 512-bit ``vpdpbusd`` (AVX-512 VNNI);
* ``tvm_ext.dot_16x4_avxvnni``: two 256-bit (VEX-encoded) ``vpdpbusd`` (AVX-VNNI only,
  Alder Lake and later client CPUs);
* ``tvm_ext.dot_16x4_avx2``: per 8 lanes, ``vpmaddubsw`` (u8 x s8 products, adjacent
  pairs summed to int16) then ``vpmaddwd`` by ones (the two pairs of a lane to int32),
  as ONNX Runtime does on AVX2 CPUs without VNNI. ``vpmaddubsw`` saturates its pair
  sums, so this form is exact only when every weight pair (bytes 0-1 and 2-3 of each
  4-byte group) has 255 * (|w0| + |w1|) <= 32767 (7-bit weights always do). Workloads
  that know this of their constant weights set the block annotation
  ``PAIRS_FIT_INT16_ATTR``; only such blocks may use it (``u8s8_intrin_name`` says which
  form a target gets, ``rules/vnni_tensorize.py`` checks the annotation).

TVM's own ``dot_16x4_vnni`` implementation cannot be used with the LLVM the 0.27 wheel
bundles (see ``_operand_style``). Each form is registered on first use;
``register_intrinsics`` registers all of them (a database whose traces name them can
only be loaded once they exist).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

from tvm import tirx
from tvm.script import tirx as T

from tvm_ext.intrinsics import register_once

AVX512_VNNI_INTRIN = "tvm_ext.dot_16x4_avx512vnni"
AVX_VNNI_INTRIN = "tvm_ext.dot_16x4_avxvnni"
AVX2_INTRIN = "tvm_ext.dot_16x4_avx2"
AVX2_EXACT_INTRIN = "tvm_ext.dot_16x4_avx2_exact"
# Block annotation a workload sets on a u8 x s8 reduction whose every weight pair (bytes 0-1
# and 2-3 of each 4-byte group) has 255 * (|w0| + |w1|) <= 32767: vpmaddubsw's saturating
# int16 pair sums are then exact, so the AVX2 form of the 16x4 product may be used.
PAIRS_FIT_INT16_ATTR = "tvm_ext.u8s8_pairs_fit_int16"
# The LLVM intrinsics of the AVX2 u8 x s8 products (also used by intrinsics/q4_vnni.py, as is
# ``vpdpbusd``)
MADDUBS = "llvm.x86.avx2.pmadd.ub.sw"  # 32 u8 x s8 -> 16 int16 (adjacent pairs, saturating)
MADDWD = "llvm.x86.avx2.pmadd.wd"  # 16 x 16 int16 -> 8 int32 (adjacent pairs)


# LLVM 21+ declares vpdpbusd on byte vectors, e.g. llvm.x86.avx512.vpdpbusd.512(<16 x i32>,
# <64 x i8>, <64 x i8>); older LLVM on int32 vectors. TVM 0.27's own "dot_16x4_vnni"
# passes int32 vectors and fails LLVM verification with the LLVM 22 that the wheel
# bundles ("Call parameter type does not match function signature"), so we register our
# own implementations for the operand style this LLVM wants (probed once, see
# _operand_style), under the same 16x4 description.


def _vpdpbusd(instr_lanes: int, byte_operands: bool):
    """``update(acc, a, b)``: acc + per int32 lane the 4 products of unsigned ``a`` and signed
    ``b`` bytes, as one vpdpbusd of ``instr_lanes`` lanes; ``a`` and ``b`` any vectors of
    4 * instr_lanes bytes (reinterpreted as this LLVM declares the operands)."""
    name = f"llvm.x86.avx512.vpdpbusd.{instr_lanes * 32}"
    acc_t, u8_t = f"int32x{instr_lanes}", f"uint8x{4 * instr_lanes}"

    def update(acc, a, b_bytes):
        if not byte_operands:  # older LLVM: the byte operands as int32 vectors
            return T.call_llvm_pure_intrin(acc_t, T.llvm_lookup_intrinsic_id(name), acc,
                                           tirx.reinterpret(acc_t, a), tirx.reinterpret(acc_t, b_bytes))
        return T.call_llvm_pure_intrin(acc_t, T.llvm_lookup_intrinsic_id(name), acc,
                                       tirx.reinterpret(u8_t, a), b_bytes)

    return update


def vpdpbusd(instr_lanes: int):
    """``_vpdpbusd`` in the operand style of this LLVM (probed once by compiling)."""
    return _vpdpbusd(instr_lanes, _operand_style())


def _pmadd(acc, a4, b_bytes):
    """acc + a . b on 8 int32 lanes with AVX2: vpmaddubsw (u8 x s8, adjacent pairs summed
    with int16 saturation), then vpmaddwd by ones (the lane's two pairs summed in int32)."""
    pairs = T.call_llvm_pure_intrin("int16x16", T.llvm_lookup_intrinsic_id(MADDUBS),
                                    tirx.reinterpret("uint8x32", a4), b_bytes)
    return acc + T.call_llvm_pure_intrin("int32x8", T.llvm_lookup_intrinsic_id(MADDWD), pairs,
                                         T.broadcast(T.int16(1), 16))


def _pmadd_exact(acc, a4, b_bytes):
    """acc + a . b on 8 int32 lanes with AVX2, exact for any int8 weights: vpmaddwd on int16
    pairs. Seen as int16 pairs, a lane's bytes (w0 w1 w2 w3) give (w1, w3) by an arithmetic
    shift right by 8 and (w0, w2) by a shift left then right; the activation's (a1, a3) by a
    logical shift right and (a0, a2) by a mask. Two vpmaddwd then sum the four products in
    int32 (no int16 sum, so nothing saturates). The weight shifts depend on the weights only:
    LLVM shares them between the unrolled calls that read the same tile."""
    w16 = tirx.reinterpret("int16x16", b_bytes)
    eight = T.broadcast(T.int16(8), 16)
    w_odd = T.shift_right(w16, eight)
    w_even = T.shift_right(T.shift_left(w16, eight), eight)
    a16 = tirx.reinterpret("uint16x16", a4)
    a_odd = tirx.reinterpret("int16x16", T.shift_right(a16, T.broadcast(T.uint16(8), 16)))
    a_even = tirx.reinterpret("int16x16", T.bitwise_and(a16, T.broadcast(T.uint16(255), 16)))
    maddwd = T.llvm_lookup_intrinsic_id(MADDWD)
    return (acc + T.call_llvm_pure_intrin("int32x8", maddwd, w_even, a_even)
            + T.call_llvm_pure_intrin("int32x8", maddwd, w_odd, a_odd))


def _make_impl(instr_lanes: int, update):
    """The 16x4 product as 16 // instr_lanes steps ``c[lanes] = update(c[lanes], a4, b[lanes])``:
    ``a4`` the 4 activation bytes as an int32 broadcast to every lane, ``b`` the lanes'
    4 * instr_lanes weight bytes ([lane][4])."""
    n_calls = 16 // instr_lanes
    acc_t, i8_t = f"int32x{instr_lanes}", f"int8x{4 * instr_lanes}"

    @T.prim_func(s_tir=True)
    def impl(
        a: T.Buffer((4,), "uint8", offset_factor=1),
        b: T.Buffer((16, 4), "int8", offset_factor=1),
        c: T.Buffer((16,), "int32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(c[0:16], a[0:4], b[0:16, 0:4])
            T.writes(c[0:16])
            a4 = T.broadcast(T.reinterpret(a.vload([0], "uint8x4"), dtype="int32"), instr_lanes)
            for h in T.unroll(n_calls):
                c[T.ramp(h * instr_lanes, 1, instr_lanes)] = update(
                    c.vload([h * instr_lanes], dtype=acc_t), a4,
                    b.vload([h * instr_lanes, 0], dtype=i8_t))

    return impl


@lru_cache(maxsize=1)
def _operand_style() -> bool:
    """True when this LLVM wants byte-vector operands for vpdpbusd (probed by compiling)."""
    import tvm  # pylint: disable=import-outside-toplevel
    from tvm.target import codegen  # pylint: disable=import-outside-toplevel

    first = codegen.llvm_version_major() >= 21
    for style in (first, not first):
        func = _make_impl(16, _vpdpbusd(16, style)).with_attr("global_symbol", "probe")
        try:
            tvm.compile(
                tvm.IRModule({"probe": func}),
                target=tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake"}),
            )
            return style
        except Exception:  # pylint: disable=broad-except
            continue
    return first


# Importing tvm.s_tir.tensor_intrin (even .x86) runs its package __init__, which builds
# every CUDA intrinsic: ~30 s of CPU. So the description is written here, not imported. It is
# parsed on first use (``_desc``): parsed at import, it cost every process 0.5-0.7 s.
@lru_cache(maxsize=1)
def _desc() -> tirx.PrimFunc:
    """The 16x4 description every form shares."""
    @T.prim_func(s_tir=True)
    def _dot_16x4_desc(
        a: T.Buffer((4,), "uint8", offset_factor=1),
        b: T.Buffer((16, 4), "int8", offset_factor=1),
        c: T.Buffer((16,), "int32", offset_factor=1),
    ) -> None:
        # c[lane] += sum over 4 bytes of a[byte] * b[lane, byte]
        with T.sblock("root"):
            T.reads(c[0:16], a[0:4], b[0:16, 0:4])
            T.writes(c[0:16])
            for lane, byte in T.grid(16, 4):
                with T.sblock("update"):
                    v_lane, v_byte = T.axis.remap("SR", [lane, byte])
                    c[v_lane] = c[v_lane] + T.cast(a[v_byte], "int32") * T.cast(b[v_lane, v_byte], "int32")

    return _dot_16x4_desc


def _register(name: str, instr_lanes: int, update) -> str:
    """Register ``name`` (once): the 16x4 description, ``_make_impl(instr_lanes, update())``."""
    return register_once(name, lambda: (_desc(), _make_impl(instr_lanes, update())))


def avx512_vnni_intrin() -> str:
    """Register (once) and name the 16x4 intrinsic as one 512-bit vpdpbusd."""
    return _register(AVX512_VNNI_INTRIN, 16, lambda: vpdpbusd(16))


def avx_vnni_intrin() -> str:
    """Register (once) and name the 16x4 intrinsic as two 256-bit (VEX) vpdpbusd."""
    return _register(AVX_VNNI_INTRIN, 8, lambda: vpdpbusd(8))


def avx2_intrin() -> str:
    """Register (once) and name the 16x4 intrinsic as AVX2 vpmaddubsw + vpmaddwd (exact only
    on blocks annotated ``PAIRS_FIT_INT16_ATTR``, see the module doc)."""
    return _register(AVX2_INTRIN, 8, lambda: _pmadd)


def avx2_exact_intrin() -> str:
    """Register (once) and name the 16x4 intrinsic as AVX2 vpmaddwd on int16 pairs, exact for
    any int8 weights (``_pmadd_exact``)."""
    return _register(AVX2_EXACT_INTRIN, 8, lambda: _pmadd_exact)


U8S8_FORMS = (AVX512_VNNI_INTRIN, AVX_VNNI_INTRIN, AVX2_INTRIN, AVX2_EXACT_INTRIN)  # one description, one layout


def block_form(intrin: str, pairs_fit: bool) -> str:
    """The form a packed block gets from a rule built with ``intrin`` (``u8s8_intrin_name``):
    an AVX2 rule's block whose weights are not vouched for (``PAIRS_FIT_INT16_ATTR``) gets the
    exact one."""
    if intrin == AVX2_INTRIN and not pairs_fit:
        return avx2_exact_intrin()
    return intrin


def makers() -> dict:
    """Name -> the call that registers it, for every form (nothing is parsed here)."""
    return {AVX512_VNNI_INTRIN: avx512_vnni_intrin, AVX_VNNI_INTRIN: avx_vnni_intrin, AVX2_INTRIN: avx2_intrin,
            AVX2_EXACT_INTRIN: avx2_exact_intrin}


def register_intrinsics() -> None:
    """Register every form: a database whose traces tensorize with them can only be
    loaded (JSONDatabase replays every trace) once they exist in this process."""
    for make in makers().values():
        make()


def vnni_intrin_name(target) -> Optional[str]:
    """Name of the tensor intrinsic for ``target``: AVX-512 VNNI first, then AVX-VNNI."""
    from tvm_ext.targets import vnni_kinds  # pylint: disable=import-outside-toplevel

    kinds = vnni_kinds(target)
    if "avx512vnni" in kinds:
        return avx512_vnni_intrin()
    if "avxvnni" in kinds:
        return avx_vnni_intrin()
    return None


def u8s8_intrin_name(target) -> Optional[str]:
    """The 16x4 intrinsic a packed u8 x s8 block gets on ``target``: the VNNI form when the
    target has VNNI (``vnni_intrin_name``), else the AVX2 form on x86 with AVX2 (only for
    blocks annotated ``PAIRS_FIT_INT16_ATTR``), else None."""
    from tvm_ext.targets import has_avx2  # pylint: disable=import-outside-toplevel

    return vnni_intrin_name(target) or (avx2_intrin() if has_avx2(target) else None)
