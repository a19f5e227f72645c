"""Import int8 ONNX models (ONNX Runtime's QDQ and QOperator formats) into integer Relax.

TVM 0.27's Relax ONNX frontend runs QuantizeLinear/DequantizeLinear as float math around
float convolutions and has no QLinearConv; here each quantized op becomes a step of the
project's quantized graph builder (:class:`tvm_ext.workloads.qnn.QuantGraph`): conv2d /
dense accumulators with the seed's requantize epilogue, residual add_requantize, pools,
so the fused tasks are those the rules are made for, and the NumPy reference of the
builder gives the exact expected output of the compiled module.

* QDQ: ``DequantizeLinear -> Conv | Gemm | MatMul | Add | GlobalAveragePool | AveragePool
  | Concat [-> Relu | Clip] -> QuantizeLinear`` groups become the integer op (Relu/Clip
  folded into the requantize clip); MaxPool, Flatten and Reshape move integer tensors.
* QOperator: QLinearConv, QLinearMatMul, QuantizeLinear/DequantizeLinear at the edges,
  MaxPool on uint8, Flatten/Reshape, and from ``com.microsoft`` QLinearAdd, QGemm,
  QLinearGlobalAveragePool, QLinearAveragePool, QLinearConcat.

The module keeps the model's signature: float32 NCHW in, float32 out. Inside, activations
are NHWC uint8 (int8 tensors shifted by 128), weights int8 HWIO; with ``layout="nchwc"`` the
same graph is emitted in the packed layouts (``tvm_ext.workloads.qnn_packed``; ``"amx"``: with the
64-channel blocks of ``tvm_ext.workloads.qnn_amx``), their requantize in float32
(``tvm_ext.workloads.qnn_float``, ONNX's definition; the NHWC module's fixed point can differ from it by one
step where a value lies within a rounding error of a .5 boundary). How the rounding differs from ORT's: see
:mod:`.qvalues`.
"""
from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass

import numpy as np

from tvm_ext.int8_path import LAYOUTS
from tvm_ext.workloads.base import Workload
from tvm_ext.workloads.qnn import QuantGraph
from tvm_ext.workloads.qnn_float import FloatQuantGraph
from tvm_ext.workloads.qnn_packed import PackedEmitter

from . import onnx_nodes
from .qvalues import Steps, View

OPSETS = (13, 21)  # default-domain opsets handled (per-axis DequantizeLinear needs 13)


@dataclass
class Imported:
    """An imported model: the recorded graph, its Relax module as a Workload, and what was found."""

    workload: Workload
    graph: QuantGraph
    ops: dict  # ONNX op type -> count
    input_name: str
    input_shape: tuple
    output_name: str
    out_scale: float
    out_zp: int
    layers: dict  # ONNX tensor name -> (value index in graph.run, signed)
    layout: str
    sha256: str
    params: int  # weight elements


def workload_name(path: str, digest: str | None = None, layout: str = "nhwc") -> str:
    """``onnx-<file stem>-<first 12 hex digits of the file's sha256>``, ``-nchwc``, ``-amx`` or ``-s8``
    appended for the other layouts (their own tasks, so their own databases)."""
    if digest is None:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    suffix = f"-{layout}" if layout in ("nchwc", "amx", "s8") else ""
    return f"onnx-{os.path.splitext(os.path.basename(path))[0]}-{digest[:12]}{suffix}"


def load(path: str):
    """The ONNX model at ``path``; ValueError for a file that is not one (or truncated)."""
    import onnx  # pylint: disable=import-outside-toplevel
    from google.protobuf.message import DecodeError  # pylint: disable=import-outside-toplevel

    with open(path, "rb") as f:  # OSError for a missing file: exit 1, as for other commands
        data = f.read()
    try:
        model = onnx.load_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as err:
        raise ValueError(f"{path} is not an ONNX model (or is truncated): {str(err).strip() or 'parse error'}") from err
    if not model.graph.node or not model.graph.output:
        raise ValueError(f"{path} is not an ONNX model (or is truncated): no graph nodes")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as err:
        first = str(err).strip().splitlines()[0]
        raise ValueError(f"{path} is not a valid ONNX model (or is truncated): {first}") from err
    return model, hashlib.sha256(data).hexdigest()


def check_supported(model) -> Counter:
    """Op types by count; ValueError for an unhandled opset, a float model or an unsupported op."""
    ops = Counter(n.op_type for n in model.graph.node)
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx") and not OPSETS[0] <= imp.version <= OPSETS[1]:
            raise ValueError(f"opset {imp.version} is not handled (default domain opsets "
                             f"{OPSETS[0]}-{OPSETS[1]}); convert it with onnx.version_converter")
    quantized = {"QuantizeLinear", "DequantizeLinear"} | set(onnx_nodes.QOPERATOR)
    if not quantized & set(ops):
        raise ValueError("the model is not quantized (float: no QuantizeLinear, DequantizeLinear or "
                         "QLinear* ops): import float models with tvm.relax.frontend.onnx.from_onnx, "
                         "or quantize it first (onnxruntime.quantization.quantize_static)")
    for node in model.graph.node:
        if node.op_type not in onnx_nodes.SUPPORTED or node.domain not in ("", "ai.onnx", "com.microsoft"):
            raise ValueError(f"unsupported op {node.op_type} (node {node.name!r}); supported: "
                             f"{', '.join(sorted(onnx_nodes.SUPPORTED))}")
    return ops


def parse_shapes(items) -> dict:
    """``["NAME=1x3x224x224", ...]`` (the --shape arguments) as {NAME: shape}."""
    shapes = {}
    for item in items:
        name, sep, dims = item.rpartition("=")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            shape = ()
        if not sep or not name or not shape or min(shape) < 1:
            raise ValueError(f"--shape {item!r}: expected NAME=1x3x224x224")
        shapes[name] = shape
    return shapes


def input_shape(model, shapes: dict | None) -> tuple[str, tuple]:
    """Name and static shape of the one float input; ``shapes`` overrides, required for dynamic dims."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if len(inputs) != 1 or len(model.graph.output) != 1:
        raise ValueError(f"models with one input and one output are supported, not {len(inputs)} and "
                         f"{len(model.graph.output)}")
    (inp,) = inputs
    shapes = shapes or {}
    unknown = set(shapes) - {inp.name}
    if unknown:
        raise ValueError(f"--shape names {', '.join(sorted(unknown))}, but the model's input is {inp.name!r}")
    if inp.type.tensor_type.elem_type != 1:
        raise ValueError(f"input {inp.name!r} is not float32 (the quantized models of ORT take float input)")
    dims = inp.type.tensor_type.shape.dim
    shape = tuple(d.dim_value if d.HasField("dim_value") else 0 for d in dims)
    if inp.name in shapes:
        given = tuple(int(d) for d in shapes[inp.name])
        if len(given) != len(shape) or any(d and d != g for d, g in zip(shape, given)):
            shown = "x".join(d.dim_param or str(d.dim_value) for d in dims)
            raise ValueError(f"--shape {inp.name}={'x'.join(map(str, given))} does not fit the model's input "
                             f"({shown})")
        return inp.name, given
    if not dims or not all(shape):
        shown = "x".join(d.dim_param or (str(d.dim_value) if d.dim_value else "?") for d in dims)
        raise ValueError(f"input {inp.name!r} has a dynamic shape ({shown}): give it with "
                         f"--shape {inp.name}=1x3x224x224")
    return inp.name, shape


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    return layout


def emit(graph: QuantGraph, layout: str, target=None):
    """(Relax module, layout, reference graph) of ``graph``: ``nhwc`` is the recorded graph as it
    is; ``nchwc`` the packed NCHW[x]c layouts of ``qnn_packed.PackedEmitter``, which the u8 x s8
    tensorization rule matches (ValueError, one line, for a graph it cannot lay out: grouped
    convs that are not depthwise, concat or rescale steps, an output that is not flat); ``amx``
    the same with 64-channel blocks where the channels allow (``qnn_amx.AMXEmitter``), which
    the AMX rule tiles; ``s8`` NHWC with the convs on signed activations (``qnn_signed``), which int8
    tensor cores take. ``auto`` follows ``tvm_ext.int8_path.best_layout`` for ``target``
    (default: this host), the policy the built-in ResNet-50 follows too, and falls back to the
    next layout where the graph cannot be laid out so.

    The packed layouts requantize in float32 as ONNX defines QLinearConv and ORT computes it
    (``qnn_float``: 16 lanes a vector where the fixed point's int64 multiplies run 8); their
    reference is then the graph's ``qnn_float.FloatQuantGraph`` view. ``nhwc`` and ``s8`` keep the
    fixed-point requantize. Every layout adds as ORT does (``qnn_ort``)."""
    from tvm_ext.int8_path import best_layout  # pylint: disable=import-outside-toplevel
    from tvm_ext.targets import host_target  # pylint: disable=import-outside-toplevel
    from tvm_ext.workloads.qnn_amx import AMXEmitter  # pylint: disable=import-outside-toplevel
    from tvm_ext.workloads.qnn_signed import SignedEmitter  # pylint: disable=import-outside-toplevel

    check_layout(layout)
    target = target if target is not None else host_target()
    auto = layout == "auto"
    if auto:  # the packed layout's AVX2 form is exact with any weights: they need not be checked
        layout = best_layout(target, weights_fit_int16=True)[0]
    floats = FloatQuantGraph.of(graph)  # an imported graph's adds are qnn_ort's: only its requantize changes
    emitters = {"amx": lambda: AMXEmitter.for_graph(floats), "nchwc": lambda: PackedEmitter.for_graph(floats),
                "s8": SignedEmitter}
    fallback = {"amx": "nchwc", "nchwc": "nhwc", "s8": "nhwc"}  # where auto goes when a layout cannot be emitted
    while layout != "nhwc":
        emitter = emitters[layout]()
        reference = floats if getattr(emitter, "float_epilogues", False) else graph
        try:
            mod = reference.to_relax(emitter=emitter)
        except ValueError:
            if not auto:
                raise
            layout = fallback[layout]
            continue
        return mod, layout, reference
    return graph.to_relax(), "nhwc", graph


def import_onnx(path: str, shapes: dict | None = None, layout: str = "auto", target=None,
                seed: int = 0, log=None) -> Imported:
    """Import the int8 ONNX model at ``path`` (see the module doc); ``log`` is told once the
    model is imported (a few seconds for ResNet-50), so that bad input gets its one line only."""
    model, digest = load(path)
    ops = check_supported(model)
    name, shape = input_shape(model, shapes)
    check_layout(layout)
    sample = np.random.RandomState(seed).randn(*shape).astype(np.float32)
    graph = QuantGraph(seed)
    conv = onnx_nodes.Converter(Steps(graph), model, name, sample)
    out = conv.run()
    if not isinstance(out, View):
        raise ValueError(f"output {model.graph.output[0].name!r} must be a DequantizeLinear (float) output")
    steps = conv.steps
    steps.output(out)
    n_in = len(graph.input_specs)
    layers = {k: (v.value.index, v.signed) for k, v in steps.layers.items() if v.value.index >= n_in}
    mod, layout, graph = emit(graph, layout, target)
    options = {"onnx": os.path.basename(path), "sha256": digest, "input_shape": list(shape), "layout": layout}
    wl = Workload(workload_name(path, digest, layout), mod, [sample], graph, exact=True, options=options)
    if log:
        log(f"imported {path} ({len(model.graph.node)} nodes -> {len(graph.steps)} steps, input {name} "
            f"{'x'.join(map(str, shape))}, layout {layout})")
    # what an ORT peer needs to run the same file (bench --peers ort); not part of the options,
    # so that a database follows the file's content, not where it lies
    wl.onnx_source = {"path": os.path.abspath(path), "input": name, "output": model.graph.output[0].name,
                      "out_scale": out.q.scale}
    params = sum(int(np.prod(i.dims)) for i in model.graph.initializer if len(i.dims) >= 2)  # weights
    return Imported(wl, graph, dict(ops), name, shape, model.graph.output[0].name, out.q.scale, out.q.zp,
                    layers, layout, digest, params)


__all__ = ["Imported", "import_onnx", "workload_name", "parse_shapes", "load", "check_supported", "input_shape",
           "check_layout", "emit"]
