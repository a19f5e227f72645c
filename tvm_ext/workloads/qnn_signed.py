"""The NHWC int8 graph with its convolutions on signed activations: the form int8 tensor cores take.

NVIDIA's int8 tensor cores (``wmma`` / ``mma.sync``, sm_72 and later) multiply s8 x s8; our
activations are u8 with a zero point, so as recorded no MMA intrinsic matches a conv.  Here a conv
(and the classifier's dense) reads ``x - 128`` as int8 -- a ``shift_s8`` block that MetaSchedule
inlines into the shared-memory copy of its input, the padding ``zp - 128`` -- and its int32 sum is
the u8 sum minus ``128 * sum(w)`` per output channel.  The requantize that reads the sum subtracts
that much less zero-point correction (``zp_corr - 128 * sum(w)``), so every output equals the u8
graph's bit for bit (all in int32).  Activations between ops stay uint8; nothing else changes.

``SignedEmitter`` is a ``qnn.NHWCEmitter`` for ``QuantGraph.to_relax``; ``resnet50-int8-s8`` is
ResNet-50 so emitted (``tvm_ext.int8_path`` picks it for CUDA targets), with the same reference.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from tvm import relax, te

from . import qnn

SHIFT = 128  # uint8 -> int8: x - 128 keeps the order and the differences


def _shifted(data):
    return te.compute(data.shape, lambda *i: (data(*i).astype("int32") - SHIFT).astype("int8"), name="shift_s8")


def conv2d_nhwc_s8(data, weight, *, stride=1, pad=0, zp_in=0, groups=1):
    """``qnn.conv2d_nhwc`` of ``data - 128`` (int8, padded with ``zp_in - 128``): its sum minus
    ``128 * sum(w)`` per output channel."""
    return qnn.conv2d_nhwc(_shifted(data), weight, stride=stride, pad=pad, zp_in=zp_in - SHIFT, groups=groups)


def dense_s8(data, weight):
    """``qnn.dense`` of ``data - 128`` (int8)."""
    return qnn.dense(_shifted(data), weight)


SIGNED = {"conv2d_nhwc": (conv2d_nhwc_s8, (0, 1, 2)), "dense": (dense_s8, (1,))}  # op: (TE op, axes of sum(w))
CORRECTED = ("requantize", "requantize_add_requantize")  # ops whose first constant is the zero-point correction


class SignedEmitter(qnn.NHWCEmitter):
    """Emits convs and denses on shifted activations, and their requantize with the correction
    shifted to match (module doc); every other step as ``NHWCEmitter`` does."""

    def plan(self, steps, n_inputs: int) -> None:
        """Which values are shifted sums, and by how much per channel; ValueError (one line) where such a
        sum is read by anything but the first input of a requantize (nothing would correct it)."""
        self.shift = {}  # value index of a shifted sum -> 128 * sum(w) per output channel
        for i, step in enumerate(steps):
            for pos, index in enumerate(step.inputs):
                if index in self.shift and not (step.op in CORRECTED and pos == 0):
                    raise ValueError(f"layout s8: the sum of {steps[index - n_inputs].name} is read by {step.op}, "
                                     "which takes no zero-point correction; use layout nhwc")
            if step.op in SIGNED:
                axes = SIGNED[step.op][1]
                self.shift[n_inputs + i] = SHIFT * step.consts[0].astype(np.int64).sum(axis=axes)

    def step(self, bb, step, args):
        if step.op in SIGNED:
            consts = [relax.const(c) for c in step.consts]
            return bb.emit_te(SIGNED[step.op][0], *args, *consts, primfunc_name_hint=step.op, **step.attrs)
        if step.op in CORRECTED and step.inputs[0] in self.shift:
            zp_corr = step.consts[0]
            corrected = (zp_corr.astype(np.int64) - self.shift[step.inputs[0]].reshape(zp_corr.shape)).astype(np.int32)
            step = replace(step, consts=(corrected, *step.consts[1:]))
        return super().step(bb, step, args)
