"""One quantized conv2d + requantize: the seed's fused kernel, as a Relax workload
and as a single TIR PrimFunc for schedule-level tests."""
from __future__ import annotations

import tvm
from tvm import te

from . import qnn
from .base import Workload
from .qnn import QuantGraph, random_images

ZP_IN, ZP_OUT = 3, 59  # default zero points of seed_conv_primfunc (the seed shows 59)


def network(batch=1, image=14, channels=64, out_channels=None, kernel=3, stride=1, seed=0):
    """The recorded graph (one conv layer) and its example inputs ``[images]``."""
    images = random_images(batch, image, channels, seed)
    g = QuantGraph(seed)
    x = g.input(images[:1], zp=int(g.rng.randint(100, 140)), batch=batch)
    g.conv(x, out_channels or channels, kernel, stride, zp_out=int(g.rng.randint(32, 96)), name="conv")
    return g, [images]


def build(batch=1, image=14, channels=64, out_channels=None, kernel=3, stride=1, seed=0) -> Workload:
    """uint8 [batch, image, image, channels] -> conv kernel x kernel / stride -> uint8."""
    out_channels = out_channels or channels
    g, inputs = network(batch, image, channels, out_channels, kernel, stride, seed)
    options = {
        "batch": batch,
        "image": image,
        "channels": channels,
        "out_channels": out_channels,
        "kernel": kernel,
        "stride": stride,
        "seed": seed,
    }
    return Workload("conv2d-int8", g.to_relax(), inputs, g, exact=True, options=options)


def seed_conv_primfunc(
    batch=1, image=14, channels=64, out_channels=None, kernel=3, stride=1, zp_in=ZP_IN, zp_out=ZP_OUT
) -> tvm.tirx.PrimFunc:
    """The fused conv + requantize PrimFunc (pad, conv, constant-scalar block, epilogue).

    Parameters as in the seed: ``p0`` data, ``p1`` weights, ``p2`` zero-point correction,
    ``p3`` bias, ``p4``/``p5``/``p6`` multiplier/left shift/right shift, then the output.
    """
    cout = out_channels or channels
    data = te.placeholder((batch, image, image, channels), "uint8", name="p0")
    weight = te.placeholder((kernel, kernel, channels, cout), "int8", name="p1")
    zp_corr = te.placeholder((1, 1, 1, cout), "int32", name="p2")
    bias = te.placeholder((1, 1, 1, cout), "int32", name="p3")
    mult, lshift, rshift = (te.placeholder((cout,), "int32", name=f"p{i}") for i in (4, 5, 6))
    acc = qnn.conv2d_nhwc(data, weight, stride=stride, pad=kernel // 2, zp_in=zp_in)
    out = qnn.requantize(acc, zp_corr, bias, mult, lshift, rshift, zp_out=zp_out)
    args = [data, weight, zp_corr, bias, mult, lshift, rshift, out]
    return te.create_prim_func(args).with_attr("global_symbol", "main")
