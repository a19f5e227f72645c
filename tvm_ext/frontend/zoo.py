"""fp32 ResNet-50 and MobileNetV2 written as ONNX, quantized by ONNX Runtime.

torchvision is not needed (nor downloadable here): the architectures are written with
``onnx.helper`` -- ResNet-50 v1.5 (the stride of a bottleneck sits on its 3x3 conv) and
MobileNetV2 (inverted residuals, depthwise 3x3, ReLU6 as ``Clip(0, 6)``, linear
bottlenecks) -- with seeded random weights (He init) and BatchNorm folded into the
convolutions (a conv with bias). Each fp32 model is quantized with ONNX Runtime's
``quantize_static`` in QDQ and in QOperator format, calibrated on a few seeded random
images: these are models "made by the real tools", like the ones users bring.

    python -m tvm_ext.frontend.zoo --out DIR [--image 224] [--models resnet50,mobilenetv2]
                                   [--formats qdq,qoperator] [--activations uint8]

writes ``DIR/<model>-fp32.onnx`` and ``DIR/<model>-<format>.onnx`` (nothing is committed).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

OPSET = 17
MODELS = ("resnet50", "mobilenetv2")
FORMATS = ("qdq", "qoperator")
NUM_CLASSES = 1000
INPUT = "input"


class _Builder:
    """Nodes and initializers of an NCHW float model, with seeded He-initialized weights."""

    def __init__(self, seed: int):
        from onnx import helper, numpy_helper  # pylint: disable=import-outside-toplevel

        self.helper, self.nh = helper, numpy_helper
        self.rng = np.random.RandomState(seed)
        self.nodes, self.inits = [], []
        self.channels = {INPUT: 3}

    def _const(self, name, value):
        self.inits.append(self.nh.from_array(np.asarray(value), name))
        return name

    def conv(self, x, cout, k, stride=1, groups=1, act=None, name="conv"):
        """Conv (BatchNorm folded: weight and bias) + optional ``relu`` or ``relu6``."""
        cin = self.channels[x]
        fan_in = cin // groups * k * k
        w = (self.rng.randn(cout, cin // groups, k, k) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        b = (self.rng.randn(cout) * 0.1).astype(np.float32)
        inputs = [x, self._const(name + ".weight", w), self._const(name + ".bias", b)]
        pad = k // 2
        self.nodes.append(self.helper.make_node(
            "Conv", inputs, [name], name=name, kernel_shape=[k, k], strides=[stride, stride],
            pads=[pad] * 4, group=groups))
        self.channels[name] = cout
        return self.act(name, act)

    def act(self, x, kind):
        if kind is None:
            return x
        out = x + "." + kind
        if kind == "relu":
            self.nodes.append(self.helper.make_node("Relu", [x], [out], name=out))
        else:  # relu6
            lo, hi = self._const(out + ".min", np.float32(0)), self._const(out + ".max", np.float32(6))
            self.nodes.append(self.helper.make_node("Clip", [x, lo, hi], [out], name=out))
        self.channels[out] = self.channels[x]
        return out

    def add(self, a, b, name, act=None):
        self.nodes.append(self.helper.make_node("Add", [a, b], [name], name=name))
        self.channels[name] = self.channels[a]
        return self.act(name, act)

    def node(self, op, x, name, **attrs):
        self.nodes.append(self.helper.make_node(op, [x], [name], name=name, **attrs))
        self.channels[name] = self.channels[x]
        return name

    def classifier(self, x, name="fc"):
        x = self.node("GlobalAveragePool", x, "avgpool")
        x = self.node("Flatten", x, "flatten", axis=1)
        k = self.channels[x]
        w = (self.rng.randn(NUM_CLASSES, k) * np.sqrt(1.0 / k)).astype(np.float32)
        b = (self.rng.randn(NUM_CLASSES) * 0.01).astype(np.float32)
        inputs = [x, self._const(name + ".weight", w), self._const(name + ".bias", b)]
        self.nodes.append(self.helper.make_node("Gemm", inputs, ["logits"], name=name, transB=1))
        return "logits"

    def model(self, name, image, batch=1):
        from onnx import TensorProto  # pylint: disable=import-outside-toplevel

        h = self.helper
        graph = h.make_graph(
            self.nodes, name, [h.make_tensor_value_info(INPUT, TensorProto.FLOAT, [batch, 3, image, image])],
            [h.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, NUM_CLASSES])], self.inits)
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", OPSET)], producer_name="tvm_ext.zoo")
        model.ir_version = 8
        return model


def resnet50(image: int = 224, seed: int = 0, batch: int = 1):
    """torchvision's ResNet-50 (v1.5) as an fp32 ONNX model with folded BatchNorm."""
    b = _Builder(seed)
    x = b.conv(INPUT, 64, 7, 2, act="relu", name="conv1")
    x = b.node("MaxPool", x, "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for stage, (blocks, width) in enumerate(((3, 64), (4, 128), (6, 256), (3, 512))):
        for block in range(blocks):
            name = f"layer{stage + 1}.{block}"
            stride = 2 if block == 0 and stage > 0 else 1
            y = b.conv(x, width, 1, act="relu", name=name + ".conv1")
            y = b.conv(y, width, 3, stride, act="relu", name=name + ".conv2")  # v1.5
            y = b.conv(y, width * 4, 1, name=name + ".conv3")
            shortcut = x
            if stride != 1 or b.channels[x] != width * 4:
                shortcut = b.conv(x, width * 4, 1, stride, name=name + ".downsample")
            x = b.add(y, shortcut, name + ".add", act="relu")
    b.classifier(x)
    return b.model("resnet50", image, batch)


MOBILENET_V2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1))  # expansion t, channels c, repeats n, stride s


def mobilenetv2(image: int = 224, seed: int = 0, batch: int = 1):
    """torchvision's MobileNetV2 (width 1.0) as an fp32 ONNX model with folded BatchNorm."""
    b = _Builder(seed)
    x = b.conv(INPUT, 32, 3, 2, act="relu6", name="features.0")
    index = 1
    for t, c, n, s in MOBILENET_V2:
        for i in range(n):
            name, stride, cin = f"features.{index}", s if i == 0 else 1, b.channels[x]
            hidden = cin * t
            y = x
            if t != 1:
                y = b.conv(y, hidden, 1, act="relu6", name=name + ".expand")
            y = b.conv(y, hidden, 3, stride, groups=hidden, act="relu6", name=name + ".dw")
            y = b.conv(y, c, 1, name=name + ".project")  # linear bottleneck
            x = b.add(x, y, name + ".add") if stride == 1 and cin == c else y
            index += 1
    x = b.conv(x, 1280, 1, act="relu6", name=f"features.{index}")
    b.classifier(x)
    return b.model("mobilenetv2", image, batch)


BUILDERS = {"resnet50": resnet50, "mobilenetv2": mobilenetv2}


def random_images(count: int, image: int, seed: int = 0) -> list[np.ndarray]:
    """``count`` float32 NCHW images, standard normal (like normalized ImageNet input)."""
    rng = np.random.RandomState(seed + 1000)
    return [rng.randn(1, 3, image, image).astype(np.float32) for _ in range(count)]


def host_needs_reduce_range() -> bool:
    """True on x86 hosts without VNNI: ORT's u8s8 kernels there multiply with vpmaddubsw,
    whose int16 pair sums saturate with 8-bit weights (measured: up to 50 uint8 steps off
    in 3% of a ResNet-50 stem's outputs on an AVX2 host); 7-bit weights (``reduce_range``,
    ORT's own advice for such hosts) do not."""
    from tvm_ext.targets import describe_host  # pylint: disable=import-outside-toplevel

    host = describe_host()
    return not (host.get("avx512vnni") or host.get("avxvnni"))


def quantize(fp32_path: str, out_path: str, fmt: str, image: int, calib: int = 4, seed: int = 0,
             activations: str = "uint8", per_channel: bool = True, reduce_range: bool | None = None) -> str:
    """``quantize_static`` of the fp32 model in ``fmt`` (qdq|qoperator), calibrated (MinMax)
    on ``calib`` seeded random images; int8 weights (symmetric, per channel by default),
    7-bit (``reduce_range``) by default where :func:`host_needs_reduce_range`."""
    from onnxruntime import quantization as q  # pylint: disable=import-outside-toplevel

    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")

    class _Reader(q.CalibrationDataReader):
        def __init__(self):
            self._it = iter([{INPUT: x} for x in random_images(calib, image, seed)])

        def get_next(self):
            return next(self._it, None)

    act = {"uint8": q.QuantType.QUInt8, "int8": q.QuantType.QInt8}[activations]
    q.quantize_static(fp32_path, out_path, _Reader(),
                      quant_format=q.QuantFormat.QDQ if fmt == "qdq" else q.QuantFormat.QOperator,
                      per_channel=per_channel, activation_type=act, weight_type=q.QuantType.QInt8,
                      reduce_range=host_needs_reduce_range() if reduce_range is None else reduce_range)
    return out_path


def generate(out_dir: str, image: int = 224, models=MODELS, formats=FORMATS, seed: int = 0,
             activations: str = "uint8", reduce_range: bool | None = None, log=None) -> dict[str, str]:
    """Write the fp32 and quantized models into ``out_dir``; returns {"<model>-<fmt>": path}."""
    import onnx  # pylint: disable=import-outside-toplevel

    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for name in models:
        if name not in BUILDERS:
            raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
        fp32 = os.path.join(out_dir, f"{name}-fp32.onnx")
        onnx.save(BUILDERS[name](image, seed), fp32)
        paths[f"{name}-fp32"] = fp32
        for fmt in formats:
            path = os.path.join(out_dir, f"{name}-{fmt}.onnx")
            if log:
                log(f"quantizing {name} ({fmt}, {image}x{image})")
            paths[f"{name}-{fmt}"] = quantize(fp32, path, fmt, image, seed=seed, activations=activations,
                                              reduce_range=reduce_range)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tvm_ext.frontend.zoo", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--image", type=int, default=224, help="image size (default 224)")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated: " + ", ".join(FORMATS))
    p.add_argument("--activations", choices=("uint8", "int8"), default="uint8",
                   help="activation type of the quantized models (default uint8)")
    p.add_argument("--reduce-range", choices=("auto", "on", "off"), default="auto",
                   help="7-bit weights: auto (default) where ORT's kernels would saturate (x86 without VNNI)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    reduce = {"auto": None, "on": True, "off": False}[args.reduce_range]
    paths = generate(args.out, args.image, args.models.split(","), args.formats.split(","), args.seed,
                     args.activations, reduce, log=lambda m: print(m, file=sys.stderr))
    for path in paths.values():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
