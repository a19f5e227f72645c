"""VNNI tensor intrinsics: the 16x4 uint8 x int8 -> int32 dot product for x86.

AVX-512 VNNI targets use ``tvm_ext.dot_16x4_avx512vnni`` (one 512-bit ``vpdpbusd``);
AVX-VNNI-only targets (Alder Lake and later client CPUs) use
``tvm_ext.dot_16x4_avxvnni``, two 256-bit (VEX-encoded) ``vpdpbusd``, so one packed
weight layout serves both. The description is that of TVM's ``dot_16x4_vnni``; TVM's
own implementation cannot be used with the LLVM the 0.27 wheel bundles (see
``_operand_style``). Registered on first use; ``register_intrinsics`` registers both
(a database whose traces name them can only be loaded once they exist).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional

from tvm import tirx
from tvm.script import tirx as T

from tvm_ext.intrinsics import register_once

AVX512_VNNI_INTRIN = "tvm_ext.dot_16x4_avx512vnni"
AVX_VNNI_INTRIN = "tvm_ext.dot_16x4_avxvnni"


# LLVM 21+ declares vpdpbusd on byte vectors, e.g. llvm.x86.avx512.vpdpbusd.512(<16 x i32>,
# <64 x i8>, <64 x i8>); older LLVM on int32 vectors. TVM 0.27's own "dot_16x4_vnni"
# passes int32 vectors and fails LLVM verification with the LLVM 22 that the wheel
# bundles ("Call parameter type does not match function signature"), so we register our
# own implementations for the operand style this LLVM wants (probed once, see
# _operand_style), under the same 16x4 description.


# Importing tvm.s_tir.tensor_intrin (even .x86) runs its package __init__, which builds
# every CUDA intrinsic: ~30 s of CPU. So the description is written here, not imported.
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


def _make_impl(instr_lanes: int, byte_operands: bool):
    """16x4 u8.s8->s32 dot product as 16 // instr_lanes vpdpbusd of instr_lanes lanes."""
    n_calls = 16 // instr_lanes
    nbytes = 4 * instr_lanes
    name = f"llvm.x86.avx512.vpdpbusd.{instr_lanes * 32}"
    acc_t, u8_t, i8_t = f"int32x{instr_lanes}", f"uint8x{nbytes}", f"int8x{nbytes}"

    def a_operand(a4):  # the 4 activation bytes, as an int32, broadcast to every lane
        return tirx.reinterpret(u8_t, a4) if byte_operands else a4

    def b_operand(b_bytes):  # 4 * lanes weight bytes: [lane][4]
        return b_bytes if byte_operands else tirx.reinterpret(acc_t, b_bytes)

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
                c[T.ramp(h * instr_lanes, 1, instr_lanes)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(name),
                    c.vload([h * instr_lanes], dtype=acc_t),
                    a_operand(a4),
                    b_operand(b.vload([h * instr_lanes, 0], dtype=i8_t)),
                    dtype=acc_t,
                )

    return impl


@lru_cache(maxsize=1)
def _operand_style() -> bool:
    """True when this LLVM wants byte-vector operands for vpdpbusd (probed by compiling)."""
    import tvm  # pylint: disable=import-outside-toplevel
    from tvm.target import codegen  # pylint: disable=import-outside-toplevel

    first = codegen.llvm_version_major() >= 21
    for style in (first, not first):
        func = _make_impl(16, style).with_attr("global_symbol", "probe")
        try:
            tvm.compile(
                tvm.IRModule({"probe": func}),
                target=tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake"}),
            )
            return style
        except Exception:  # pylint: disable=broad-except
            continue
    return first


def _register(name: str, instr_lanes: int) -> str:
    return register_once(name, lambda: (_dot_16x4_desc, _make_impl(instr_lanes, _operand_style())))


def avx512_vnni_intrin() -> str:
    """Register (once) and name the 16x4 intrinsic as one 512-bit vpdpbusd."""
    return _register(AVX512_VNNI_INTRIN, 16)


def avx_vnni_intrin() -> str:
    """Register (once) and name the 16x4 intrinsic as two 256-bit (VEX) vpdpbusd."""
    return _register(AVX_VNNI_INTRIN, 8)


def register_intrinsics() -> None:
    """Register both intrinsics: a database whose traces tensorize with them can only be
    loaded (JSONDatabase replays every trace) once they exist in this process."""
    avx512_vnni_intrin()
    avx_vnni_intrin()


def vnni_intrin_name(target) -> Optional[str]:
    """Name of the tensor intrinsic for ``target``: AVX-512 VNNI first, then AVX-VNNI."""
    from tvm_ext.targets import vnni_kinds  # pylint: disable=import-outside-toplevel

    kinds = vnni_kinds(target)
    if "avx512vnni" in kinds:
        return avx512_vnni_intrin()
    if "avxvnni" in kinds:
        return avx_vnni_intrin()
    return None
