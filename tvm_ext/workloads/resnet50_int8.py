"""int8 ResNet-50 v1.5 (NHWC) as a fused Relax module with an exact NumPy reference.

53 convolutions (stem, 16 bottlenecks of three convs, 4 downsample convs), each with
the seed's requantize epilogue; residual adds, max pool, global average pool and the
1000-class classifier in integers. Weights and quantization parameters come from
``seed`` and are calibrated on image 0 of the inputs, so the network does not depend
on the batch size. ReLU is the clip at 0 after a low output zero point.

``build`` emits it in NHWC (workload ``resnet50-int8``); ``build_nchwc`` emits the same
graph in the packed NCHW[x]c / OIHW[x]i16o4i layouts that the x86 VNNI rule tensorizes
(workload ``resnet50-int8-nchwc``, same reference); ``build_s8`` in NHWC with the convs on
signed activations for int8 tensor cores (``resnet50-int8-s8``, same reference).
"""
from __future__ import annotations

from . import qnn_float, qnn_packed
from .base import Workload
from .qnn import QuantGraph, Value, random_images

STAGES = ((3, 64), (4, 128), (6, 256), (3, 512))  # (bottlenecks, width)
EXPANSION = 4
NUM_CLASSES = 1000


class _ZeroPoints:
    """Output zero points, drawn once per network so that equal layers give equal tasks:
    low where ResNet has a ReLU (the clip at 0 is the ReLU), mid-range elsewhere."""

    def __init__(self, g: QuantGraph):
        self.input = int(g.rng.randint(100, 140))
        self.relu = int(g.rng.randint(32, 80))
        self.linear = int(g.rng.randint(110, 146))


def _bottleneck(g: QuantGraph, x: Value, width: int, stride: int, zp: _ZeroPoints, name: str) -> Value:
    out = width * EXPANSION
    y = g.conv(x, width, 1, zp_out=zp.relu, name=f"{name}.conv1")
    y = g.conv(y, width, 3, stride, zp_out=zp.relu, name=f"{name}.conv2")  # v1.5: stride here
    y = g.conv(y, out, 1, zp_out=zp.linear, name=f"{name}.conv3")
    shortcut = x
    if stride != 1 or x.shape[-1] != out:
        shortcut = g.conv(x, out, 1, stride, zp_out=zp.linear, name=f"{name}.downsample")
    return g.add(y, shortcut, zp_out=zp.relu, name=f"{name}.add")


def network(batch: int = 1, image: int = 224, seed: int = 0):
    """The recorded graph and its example inputs ``[images]``."""
    images = random_images(batch, image, 3, seed)
    g = QuantGraph(seed)
    zp = _ZeroPoints(g)
    x = g.input(images[:1], zp=zp.input, batch=batch)
    x = g.conv(x, 64, 7, 2, zp_out=zp.relu, name="conv1")
    x = g.max_pool(x, name="maxpool")
    for stage, (blocks, width) in enumerate(STAGES):
        for block in range(blocks):
            stride = 2 if block == 0 and stage > 0 else 1
            x = _bottleneck(g, x, width, stride, zp, f"layer{stage + 1}.{block}")
    x = g.global_avg_pool(x, name="avgpool")
    g.dense(x, NUM_CLASSES, zp_out=zp.linear, name="fc")
    return g, [images]


def build(batch: int = 1, image: int = 224, seed: int = 0) -> Workload:
    """int8 ResNet-50 on ``batch`` x ``image`` x ``image`` x 3 uint8 images."""
    g, inputs = network(batch, image, seed)
    options = {"batch": batch, "image": image, "seed": seed}
    return Workload("resnet50-int8", g.to_relax(), inputs, g, exact=True, options=options)


def build_nchwc(batch: int = 1, image: int = 224, seed: int = 0) -> Workload:
    """The same network (graph, weights) in the packed layouts the x86 VNNI rule matches:
    NCHW16c activations (stem input NCHW4c, transformed inside the module), OIHW[x]i16o4i
    weights packed at build time (see :mod:`.qnn_packed`), with float32 epilogues as
    ``resnet50-int8-amx`` (``qnn_float``): its reference is the graph's float view."""
    g, inputs = network(batch, image, seed)
    g = qnn_float.FloatQuantGraph.of(g)
    options = {"batch": batch, "image": image, "seed": seed}
    return Workload("resnet50-int8-nchwc", qnn_packed.to_relax(g), inputs, g, exact=True, options=options)


def build_s8(batch: int = 1, image: int = 224, seed: int = 0) -> Workload:
    """The same network in NHWC with its convs on signed activations (``qnn_signed``), the s8 x s8
    form of NVIDIA's int8 tensor cores; every output equals ``resnet50-int8``'s (same reference)."""
    from .qnn_signed import SignedEmitter

    g, inputs = network(batch, image, seed)
    options = {"batch": batch, "image": image, "seed": seed}
    return Workload("resnet50-int8-s8", g.to_relax(emitter=SignedEmitter()), inputs, g, exact=True, options=options)


def clip_fractions(batch: int = 1, image: int = 224, seed: int = 0) -> dict[str, float]:
    """Per requantized layer, the fraction of outputs at 0 or 255 on the example inputs."""
    g, inputs = network(batch, image, seed)
    return g.clip_fractions(inputs)
