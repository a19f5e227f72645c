"""An imported model's residual add computed as ONNX Runtime computes it: bit for bit.

ORT runs a QDQ ``DequantizeLinear -> Add -> QuantizeLinear`` (and QLinearAdd) on x86 with MLAS's
AVX2 kernel, in float32: with ``r_a = s_a / s_c`` and ``r_b = s_b / s_c`` (float32 divisions) and
``F = z_c - fma(r_a, z_a, r_b * z_b)`` once per call, each output is
``saturate(rint(fma(a, r_a, fma(b, r_b, F))))`` on the raw (not zero-point-shifted) inputs,
rounded half to even. Compared with ORT 1.32 on 1.3 M outputs of random scales and zero points
(``docs/journal.md``): this form 0 off, the same without the FMA in ``F`` 4 off, the exact real sum 9.

Here ``qlinear_add_consts`` computes ``r_a``, ``r_b`` and ``F`` (NumPy, as ORT does) once at
import, ``qlinear_add`` is the TE op (two ``tirx.fma``: LLVM emits ``vfmadd``, 16 lanes; 2
multiplies and no int64 where the fixed-point add needs 4 to 8) and ``qnn_reference.qlinear_add``
its NumPy twin. Inputs held as uint8 that are int8 in the model (``shift`` 128) are computed on
their int8 values, as ORT's int8 kernel does.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import te

from .qnn_reference import fma32
from .qnn_te import _per_channel, _rint_clipped


def qlinear_add_consts(scale_a: float, zp_a: int, scale_b: float, zp_b: int, scale_out: float, zp_out: int,
                       channels: int, shift: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(r_a, r_b, F) per channel (float32 ``(channels,)``) of an add of per-tensor quantized
    inputs; zero points as held (uint8), ``shift`` 128 where the model's tensors are int8."""
    f32 = np.float32
    r_a, r_b = f32(f32(scale_a) / f32(scale_out)), f32(f32(scale_b) / f32(scale_out))
    za, zb, zc = (f32(int(z) - shift) for z in (zp_a, zp_b, zp_out))
    fixed = f32(zc - fma32(r_a, za, f32(r_b * zb)))
    return tuple(np.full(channels, v, np.float32) for v in (r_a, r_b, fixed))


def qlinear_add(a, b, ratio_a, ratio_b, fixed, *, lo=0, hi=255, shift=0, channel_axes=None):
    """uint8 ``clip(rint(fma(a', r_a, fma(b', r_b, F))) + shift, lo, hi)`` with ``x' = x - shift``;
    per-channel constants as ``qnn.requantize``'s (``(C,)`` on the last axis by default)."""
    axes = channel_axes or (len(a.shape) - 1,)

    def _body(*idx):
        at = lambda c: _per_channel(c, idx, axes)  # noqa: E731
        fa, fb = ((x(*idx).astype("int32") - shift).astype("float32") for x in (a, b))
        inner = tvm.tirx.call_intrin("float32", "tirx.fma", fb, at(ratio_b), at(fixed))
        x = tvm.tirx.call_intrin("float32", "tirx.fma", fa, at(ratio_a), inner)
        return (_rint_clipped(x, lo, hi, shift) + shift).astype("uint8")

    return te.compute(a.shape, _body, name="T_add")


__all__ = ["qlinear_add", "qlinear_add_consts"]
