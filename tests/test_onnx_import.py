"""Importing int8 ONNX models (ORT's QDQ and QOperator formats) into integer Relax.

Small models are written with onnx.helper and quantized by ORT's own quantize_static, then
imported; every imported layer, fed ORT's own inputs, is within one uint8 step of ORT's
output; the compiled module equals the NumPy reference of the integer graph bit for bit.
Bad files get one line through the CLI, exit 2 and nothing written.
"""
import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tvm_ext.cli import import_onnx as cli_import  # noqa: E402
from tvm_ext.cli.main import main  # noqa: E402
from tvm_ext.frontend import zoo  # noqa: E402
from tvm_ext.frontend.onnx_int8 import import_onnx  # noqa: E402
from tvm_ext.workloads.qnn_float import FloatQuantGraph  # noqa: E402

RNG = np.random.RandomState(0)


def _w(*shape, scale=0.3):
    return (RNG.randn(*shape) * scale).astype(np.float32)


def _save(nodes, inits, path, in_shape=(1, 4, 9, 9), out_shape=None, opset=17, in_dims=None):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, in_dims or list(in_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    model = helper.make_model(helper.make_graph(nodes, "t", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def ops_model(path):
    """One fp32 graph with every op the importer maps: convs (padded, strided, explicit
    asymmetric pads, grouped, depthwise), Relu, Clip, residual Add, MaxPool, AveragePool,
    Concat, GlobalAveragePool, Reshape, Gemm and MatMul."""
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["a"]),
        n("Conv", ["a", "w2", "b2"], ["c2"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0], group=8),
        n("Clip", ["c2", "lo", "hi"], ["b"]),
        n("Conv", ["a", "w3"], ["c"], kernel_shape=[3, 3], strides=[2, 2], group=2),
        n("Add", ["b", "c"], ["d"]),
        n("MaxPool", ["d"], ["e"], kernel_shape=[2, 2], pads=[0, 0, 1, 1]),
        n("AveragePool", ["d"], ["f"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
        n("Concat", ["e", "f"], ["g"], axis=1),
        n("GlobalAveragePool", ["g"], ["h"]),
        n("Reshape", ["h", "shape"], ["hf"]),
        n("Gemm", ["hf", "w4", "b4"], ["i"], transB=1),
        n("MatMul", ["i", "w5"], ["y"]),
    ]
    inits = {"w1": _w(8, 4, 3, 3), "b1": _w(8), "w2": _w(8, 1, 3, 3, scale=0.5), "b2": _w(8),
             "lo": np.float32(0), "hi": np.float32(6), "w3": _w(8, 4, 3, 3), "shape": np.array([1, -1], np.int64),
             "w4": _w(10, 16), "b4": _w(10), "w5": _w(10, 6)}
    return _save(nodes, inits, path, out_shape=[1, 6])


def _quantize(fp32, out, fmt, activations, shape=(1, 4, 9, 9), reduce_range=None):
    """ORT's quantize_static as zoo.quantize calls it, calibrated on 3 random inputs of ``shape``."""
    from onnxruntime import quantization as q

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            rng = np.random.RandomState(1)
            self.it = iter([{"x": rng.randn(*shape).astype(np.float32)} for _ in range(3)])

        def get_next(self):
            return next(self.it, None)

    q.quantize_static(fp32, out, Reader(), per_channel=True, weight_type=q.QuantType.QInt8,
                      quant_format=q.QuantFormat.QDQ if fmt == "qdq" else q.QuantFormat.QOperator,
                      activation_type={"uint8": q.QuantType.QUInt8, "int8": q.QuantType.QInt8}[activations],
                      reduce_range=zoo.host_needs_reduce_range() if reduce_range is None else reduce_range)
    return str(out)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("onnx_ops")
    fp32 = ops_model(d / "ops-fp32.onnx")
    out = {"fp32": fp32}
    for fmt, act in (("qdq", "uint8"), ("qoperator", "uint8"), ("qdq", "int8")):
        out[f"{fmt}-{act}"] = _quantize(fp32, d / f"ops-{fmt}-{act}.onnx", fmt, act)
    return out


def _inputs(imported, count=2):
    rng = np.random.RandomState(5)
    return [rng.randn(*imported.input_shape).astype(np.float32) for _ in range(count)]


@pytest.mark.parametrize("name", ["qdq-uint8", "qoperator-uint8", "qdq-int8"])
def test_every_op_within_one_step_of_ort_per_layer(models, name):
    imported = import_onnx(models[name])
    ops = {s.op for s in imported.graph.steps}
    assert {"quantize", "conv2d_nhwc", "requantize", "qlinear_add", "max_pool2d", "concat", "flatten",
            "dense", "dequantize"} <= ops, ops
    n_in = len(imported.graph.input_specs)
    adds = [k for k, (i, _) in imported.layers.items() if imported.graph.steps[i - n_in].op == "qlinear_add"]
    convs = [s for s in imported.graph.steps if s.op == "conv2d_nhwc"]
    assert {s.attrs.get("groups", 1) for s in convs} >= {1, 2, 8}  # plain, grouped, depthwise (+ avg pool)
    assert any(isinstance(s.attrs["pad"], tuple) for s in convs)  # explicit asymmetric pads
    inputs = _inputs(imported)
    theirs = cli_import.ort_outputs(models[name], imported, inputs, layers=True)
    for x, ort in zip(inputs, theirs):
        layers = cli_import.per_layer(imported, x, ort)
        assert len(layers) >= 8
        worst = {k: v["max_step"] for k, v in layers.items() if v["max_step"] > 1}
        assert not worst, worst
        assert adds and all(layers[k]["max_step"] == 0 for k in adds), {k: layers[k] for k in adds}  # ORT's add
        ours = imported.graph([x])
        steps = np.abs(ours - ort["y"]) / imported.out_scale
        assert steps.max() <= 3.5, steps.max()


def test_compiled_module_equals_reference_and_tracks_ort(models):
    imported = import_onnx(models["qoperator-uint8"])
    result = cli_import.compare(models["qoperator-uint8"], imported, images=2, layers=False)
    assert result["exact_vs_reference"] == "2/2"
    assert result["max_step_vs_ort"] <= 3


def _relu_clip_qdq(path, act):
    """Hand-written QDQ: DQ -> Conv -> Relu|Clip -> Q, which ORT keeps as written."""
    n = helper.make_node
    nodes = [
        n("QuantizeLinear", ["x", "sx", "zx"], ["xq"]), n("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        n("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], axis=0),
        n("Conv", ["xd", "wd"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        (n("Relu", ["c"], ["r"]) if act == "relu" else n("Clip", ["c", "lo", "hi"], ["r"])),
        n("QuantizeLinear", ["r", "sy", "zy"], ["yq"]), n("DequantizeLinear", ["yq", "sy", "zy"], ["y"]),
    ]
    inits = {"sx": np.float32(0.02), "zx": np.uint8(128), "wq": RNG.randint(-60, 60, (8, 4, 3, 3)).astype(np.int8),
             "sw": np.full(8, 0.01, np.float32), "zw": np.zeros(8, np.int8), "sy": np.float32(0.002),
             "zy": np.uint8(100), "lo": np.float32(-0.05), "hi": np.float32(0.1)}
    return _save(nodes, inits, path, out_shape=[1, 8, 9, 9])


@pytest.mark.parametrize("act", ["relu", "clip"])
def test_relu_and_clip_fold_into_the_requantize_clip(tmp_path, act):
    path = _relu_clip_qdq(tmp_path / f"{act}.onnx", act)
    imported = import_onnx(path)
    (req,) = [s for s in imported.graph.steps if s.op == "requantize"]
    expected = {"lo": 100} if act == "relu" else {"lo": 75, "hi": 150}
    assert {k: req.attrs[k] for k in ("lo", "hi") if k in req.attrs} == expected
    x = _inputs(imported, 1)[0]
    ort = cli_import.ort_outputs(path, imported, [x])[0]["y"]
    steps = np.abs(imported.graph([x]) - ort) / 0.002
    assert steps.max() <= 1.01 and np.mean(steps > 0.5) < 0.05


# ---------------------------------------------------------------------------- bad input
def _cli(capsys, tmp_path, monkeypatch, *args):
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    code = main(["import", *args, "--no-check"])
    err = capsys.readouterr().err.strip().splitlines()
    assert sorted(os.listdir(tmp_path)) == before, "nothing may be written"
    return code, err


def _float_conv(path, in_dims=None, opset=17, op="Conv"):
    n = helper.make_node
    nodes = [n(op, ["x", "w"], ["y"], kernel_shape=[1, 1]) if op == "Conv" else n(op, ["x"], ["y"])]
    return _save(nodes, {"w": _w(2, 4, 1, 1)} if op == "Conv" else {}, path, out_shape=[1, 2, 9, 9],
                 in_dims=in_dims, opset=opset)


def _qdq_around(path, op="Sigmoid", in_dims=None, opset=17):
    n = helper.make_node
    nodes = [n("QuantizeLinear", ["x", "s", "z"], ["q"]), n("DequantizeLinear", ["q", "s", "z"], ["d"]),
             n(op, ["d"], ["o"], name="my_node"), n("QuantizeLinear", ["o", "s", "z"], ["q2"]),
             n("DequantizeLinear", ["q2", "s", "z"], ["y"])]
    return _save(nodes, {"s": np.float32(0.05), "z": np.uint8(128)}, path, out_shape=in_dims or [1, 4, 9, 9],
                 in_dims=in_dims, opset=opset)


def test_bad_inputs_get_one_line_exit_2_and_nothing_written(tmp_path, capsys, monkeypatch):
    d = tmp_path / "in"
    d.mkdir()
    cases = {
        "unsupported op Sigmoid (node 'my_node'); supported: Add, AveragePool": _qdq_around(d / "sig.onnx"),
        "the model is not quantized": _float_conv(d / "float.onnx"),
        "has a dynamic shape (Nx4x9x9): give it with --shape x=": _qdq_around(d / "dyn.onnx", "Relu",
                                                                               ["N", 4, 9, 9]),
        "opset 11 is not handled": _qdq_around(d / "old.onnx", "Relu", opset=11),
    }
    good = (d / "float.onnx").read_bytes()
    (d / "trunc.onnx").write_bytes(good[: len(good) // 2])
    (d / "text.onnx").write_text("this is not a model\n")
    cases["is not an ONNX model (or is truncated)"] = str(d / "trunc.onnx")
    cases["is not an ONNX model"] = str(d / "text.onnx")
    for expected, path in cases.items():
        code, err = _cli(capsys, d, monkeypatch, path)
        assert code == 2 and len(err) == 1, (expected, err)
        assert expected in err[0], (expected, err)
    code, err = _cli(capsys, d, monkeypatch, str(d / "float.onnx"))
    assert "tvm.relax.frontend.onnx.from_onnx" in err[0]
    code, err = _cli(capsys, d, monkeypatch, cases["has a dynamic shape (Nx4x9x9): give it with --shape x="],
                     "--shape", "x=1x4")
    assert code == 2 and len(err) == 1  # a wrong --shape is refused in one line too
    for bad in ("x", "x=1xq", "=1x2"):
        code, err = _cli(capsys, d, monkeypatch, str(d / "dyn.onnx"), "--shape", bad)
        assert code == 2 and err == [f"tvm-ext import: error: --shape {bad!r}: expected NAME=1x3x224x224"]


def test_dynamic_shape_imports_with_shape(tmp_path, capsys, monkeypatch):
    path = _qdq_around(tmp_path / "dyn.onnx", "Relu", ["N", 4, 9, 9])
    monkeypatch.chdir(tmp_path)
    assert main(["import", path, "--shape", "x=2x4x9x9", "--json", "--images", "2"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["input"] == {"x": [2, 4, 9, 9]} and out["ops"]["Relu"] == 1 and out["tasks"] == 1  # all fused
    assert out["exact_vs_reference"] == "2/2" and out["layer_max_step_vs_ort"] <= 1
    assert out["max_step_vs_ort"] <= 1 and 0 <= out["frac_differ_vs_ort"] < 0.01
    assert os.listdir(tmp_path) == ["dyn.onnx"]  # import writes nothing


# ---------------------------------------------------------------------------- packed layout
def packable_model(path, c=24):
    """A small ResNet-style fp32 graph the packed (nchwc) emission takes: a strided stem with
    asymmetric pads on 3 input channels, MaxPool, a residual block, a depthwise conv,
    GlobalAveragePool, Flatten and a Gemm of 10 classes; 24 channels, so that every packed
    tensor has a zero-padded channel block (MobileNetV2's 24 and 144 need it); with c=64 the
    amx layout's 64-channel blocks."""
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0]),
        n("Relu", ["c1"], ["a"]),
        n("MaxPool", ["a"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        n("Conv", ["p", "w2", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        n("Add", ["c2", "p"], ["r"]),
        n("Relu", ["r"], ["ra"]),
        n("Conv", ["ra", "w3", "b3"], ["c3"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=c),
        n("GlobalAveragePool", ["c3"], ["g"]),
        n("Flatten", ["g"], ["gf"]),
        n("Gemm", ["gf", "w4", "b4"], ["y"], transB=1),
    ]
    inits = {"w1": _w(c, 3, 3, 3), "b1": _w(c), "w2": _w(c, c, 3, 3, scale=0.1), "b2": _w(c),
             "w3": _w(c, 1, 3, 3, scale=0.5), "b3": _w(c), "w4": _w(10, c), "b4": _w(10)}
    return _save(nodes, inits, path, in_shape=(1, 3, 17, 17), out_shape=[1, 10])


@pytest.fixture(scope="module")
def packable(tmp_path_factory):
    d = tmp_path_factory.mktemp("onnx_packable")
    fp32 = packable_model(d / "packable-fp32.onnx")
    out = {fmt: _quantize(fp32, d / f"packable-{fmt}.onnx", fmt, "uint8", shape=(1, 3, 17, 17), reduce_range=True)
           for fmt in ("qdq", "qoperator")}  # 7-bit weights
    out["qdq-8bit"] = _quantize(fp32, d / "packable-qdq-8bit.onnx", "qdq", "uint8", shape=(1, 3, 17, 17),
                                reduce_range=False)
    out["qdq-64"] = _quantize(packable_model(d / "packable-fp32-64.onnx", c=64), d / "packable-qdq-64.onnx",
                              "qdq", "uint8", shape=(1, 3, 17, 17), reduce_range=False)
    return out


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_packed_layout_equals_the_reference_and_nhwc(packable, fmt):
    """``layout="nchwc"``: the same graph in NCHW[x]c (depthwise conv, pads, flatten, the
    float edges included), its requantize and adds in float32, compiled, bit-exact with the
    graph's float reference and within one output step of the NHWC (fixed-point) module; its
    own workload name (databases never mix layouts)."""
    import tvm

    from tvm_ext.tune.apply import compile_workload, make_vm

    packed, plain = import_onnx(packable[fmt], layout="nchwc"), import_onnx(packable[fmt], layout="nhwc")
    assert packed.layout == "nchwc" and packed.workload.name == plain.workload.name + "-nchwc"
    names = " ".join(gv.name_hint for gv in packed.workload.mod.functions)
    assert "conv2d_nchwc" in names and "depthwise_nchwc" in names and "dense_packed" in names, names
    epilogues = {gv.name_hint: f.script() for gv, f in packed.workload.mod.functions_items()
                 if "requantize" in gv.name_hint}
    # requantize in float32, the residual add's rescales in int32 lanes: no int64 multiply left
    assert any("qlinear_add" in n for n in epilogues), list(epilogues)
    assert not [n for n, s in epilogues.items() if "q_multiply_shift" in s]
    target = tvm.target.Target("llvm")
    outs = {}
    for imp in (packed, plain):
        vm = make_vm(compile_workload(imp.workload, target, None), target)
        outs[imp.layout] = [vm["main"](tvm.runtime.tensor(x)).numpy() for x in _inputs(imp)]
    assert isinstance(packed.graph, FloatQuantGraph) and not isinstance(plain.graph, FloatQuantGraph)
    for ours, theirs, x in zip(outs["nchwc"], outs["nhwc"], _inputs(packed)):
        np.testing.assert_array_equal(ours, packed.graph([x]))
        np.testing.assert_array_equal(theirs, plain.graph([x]))
        assert np.abs(ours - theirs).max() <= packed.out_scale * 1.0001


@pytest.mark.parametrize("fmt", ["qdq", "qdq-8bit", "qdq-64"])
def test_packed_layout_computes_what_ort_computes(packable, fmt):
    """The packed layouts requantize as ORT does (float32, its output scale computed as
    ``x_scale * w_scale / y_scale`` in float32) and add as ORT does (``qnn_ort``): the graph's
    reference equals ORT's output on the same file, every element, where ORT's int8 kernels are
    exact (VNNI: without it, its vpmaddubsw sums saturate on 8-bit weights)."""
    from tvm_ext.bench.onnx_export import exact_weights_for_host

    if exact_weights_for_host() != "int8":
        pytest.skip("ORT's u8 x s8 kernels saturate on this CPU (no VNNI)")
    packed = import_onnx(packable[fmt], layout="nchwc")
    inputs = _inputs(packed, 8)
    for x, ort in zip(inputs, cli_import.ort_outputs(packable[fmt], packed, inputs, layers=True)):
        np.testing.assert_array_equal(packed.graph([x]), ort[packed.output_name])
        off = {k: v for k, v in cli_import.per_layer(packed, x, ort).items() if v["max_step"]}
        assert not off, off  # every layer, on ORT's own inputs


def test_requantize_scale_is_the_one_ort_computes():
    """A conv's output scale as ORT computes it, ``float32(float32(x_scale * w_scale) / y_scale)``,
    is what the float32 requantize multiplies by (through the 31-bit multiplier, exactly): over
    4096 random channels a float64 ratio rounds to another float32 in ~1 % of them."""
    from tvm_ext.frontend.qvalues import QT, Steps, Weight
    from tvm_ext.workloads.qnn import QuantGraph
    from tvm_ext.workloads.qnn_float import requantize_consts

    rng = np.random.default_rng(0)
    c = 4096
    steps = Steps(QuantGraph(0))
    sample = rng.integers(0, 256, (1, 2, 2, 4)).astype(np.uint8)
    x = QT(steps.graph.input(sample, zp=3), float(rng.uniform(0.01, 0.1)), 3)
    w = Weight(rng.integers(-127, 128, (c, 4, 1, 1)).astype(np.int8), rng.uniform(1e-3, 1e-2, c).astype(np.float32),
               np.zeros(c, np.int8))
    y_scale = float(np.float32(rng.uniform(0.05, 0.2)))
    steps.finish(steps.conv("c", x, w, None, stride=1, pad=0, groups=1), y_scale, 0, False)
    (step,) = [s for s in steps.graph.steps if s.op == "requantize"]
    ours = requantize_consts(*step.consts, step.attrs.get("left", 0))[1]
    theirs = np.float32(x.scale) * w.scale / np.float32(y_scale)  # float32 throughout, in ORT's order
    np.testing.assert_array_equal(ours, theirs)


def test_amx_layout_equals_the_reference_and_nhwc(packable):
    """``layout="amx"``: 64-channel blocks where the channels allow (the stem and the residual
    block's conv write NCHW64c, the AMX rule's operands), the depthwise conv as in nchwc;
    compiled, bit-exact with the graph's float reference and within one output step of the NHWC
    module; its own workload name."""
    import tvm

    from tvm_ext.arrays import param_buffers
    from tvm_ext.tune.apply import compile_workload, make_vm

    amx, plain = import_onnx(packable["qdq-64"], layout="amx"), import_onnx(packable["qdq-64"], layout="nhwc")
    assert amx.layout == "amx" and amx.workload.name == plain.workload.name + "-amx"
    convs = {gv.name_hint: f for gv, f in amx.workload.mod.functions_items() if "conv2d_nchwc" in gv.name_hint}
    blocks = sorted(param_buffers(f)[-1][2][-1] for f in convs.values())
    assert blocks == [64, 64], blocks  # both convs' outputs in 64-channel blocks
    assert any("depthwise_nchwc" in gv.name_hint for gv in amx.workload.mod.functions)
    target = tvm.target.Target("llvm")
    for imp in (amx, plain):
        vm = make_vm(compile_workload(imp.workload, target, None), target)
        for x in _inputs(imp):
            got = vm["main"](tvm.runtime.tensor(x)).numpy()
            np.testing.assert_array_equal(got, imp.graph([x]))
            assert np.abs(got - amx.graph([x])).max() <= amx.out_scale * 1.0001


@pytest.mark.parametrize("name", ["qdq-uint8", "qdq-int8"])
def test_s8_layout_equals_the_reference_and_is_auto_on_cuda(models, name):
    """``layout="s8"`` (CUDA int8 tensor cores): grouped and depthwise convs, the dense, pads and
    concat of the ops model, each conv on signed activations; compiled on this CPU, bit-exact
    with the NumPy reference; ``auto`` takes it for a CUDA target from sm_72."""
    import tvm

    from tvm_ext.tune.apply import compile_workload, make_vm

    s8 = import_onnx(models[name], layout="s8")
    assert s8.layout == "s8" and s8.workload.name.endswith("-s8")
    assert "shift_s8" in s8.workload.mod.script()
    target = tvm.target.Target("llvm")
    vm = make_vm(compile_workload(s8.workload, target, None), target)
    for x in _inputs(s8):
        np.testing.assert_array_equal(vm["main"](tvm.runtime.tensor(x)).numpy(), s8.graph([x]))
    assert import_onnx(models[name], target="cuda-sm80").layout == "s8"
    assert import_onnx(models[name], target={"kind": "cuda", "arch": "sm_70"}).layout == "nhwc"


def test_auto_layout_packs_where_the_target_tensorizes(models, packable):
    """``auto``: nchwc where the u8 x s8 rule tensorizes every conv/dense on the target (VNNI;
    AVX2 with any weights: vpmaddubsw where the pairs cannot saturate, else its exact vpmaddwd
    form), nhwc otherwise and for graphs the packed emission cannot lay out."""
    haswell, cascadelake, generic = ({"kind": "llvm", "mcpu": cpu} for cpu in ("haswell", "cascadelake", "x86-64"))
    layout = {(name, cpu["mcpu"]): import_onnx(path, target=cpu).layout
              for name, path in (("7bit", packable["qdq"]), ("8bit", packable["qdq-8bit"]),
                                 ("ops", models["qdq-uint8"]))
              for cpu in (haswell, cascadelake, generic)}
    assert layout == {("7bit", "haswell"): "nchwc", ("7bit", "cascadelake"): "nchwc", ("7bit", "x86-64"): "nhwc",
                      ("8bit", "haswell"): "nchwc", ("8bit", "cascadelake"): "nchwc", ("8bit", "x86-64"): "nhwc",
                      ("ops", "haswell"): "nhwc", ("ops", "cascadelake"): "nhwc", ("ops", "x86-64"): "nhwc"}
    amx = {"kind": "llvm", "mcpu": "sapphirerapids"}  # AMX int8: the 64-channel layout the AMX rule tiles
    assert [import_onnx(packable[k], target=amx).layout for k in ("qdq", "qdq-8bit")] == ["amx", "amx"]
    assert import_onnx(models["qdq-uint8"], target=amx).layout == "nhwc"  # grouped conv: no packed layout


def test_packed_layout_refuses_what_it_cannot_lay_out(models, tmp_path, capsys, monkeypatch):
    """Grouped convs that are not depthwise: one line, pointing to layout nhwc; ``--layout``
    on a built-in workload is refused too."""
    with pytest.raises(ValueError, match=r"takes depthwise convs \(groups = channels\), not groups=2 .* layout nhwc"):
        import_onnx(models["qdq-uint8"], layout="nchwc")
    code, err = _cli(capsys, tmp_path, monkeypatch, models["qdq-uint8"], "--layout", "nchwc")
    assert code == 2 and len(err) == 1 and "use layout nhwc" in err[0], err
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "conv2d-int8", "--layout", "nchwc", "--trials", "1"]) == 2
    assert "--layout is for MODEL.onnx" in capsys.readouterr().err


# ---------------------------------------------------------------------------- real models
@pytest.mark.slow
@pytest.mark.parametrize("model", zoo.MODELS)
def test_zoo_models_end_to_end_against_ort(tmp_path, capsys, model):
    """ResNet-50 and MobileNetV2 (32x32) quantized by ORT in both formats: imported, every layer
    within one step of ORT on ORT's inputs (the packed layouts, on a VNNI host: ORT's output
    exactly), compiled module bit-exact with the reference."""
    import json

    from tvm_ext.bench.onnx_export import exact_weights_for_host

    paths = zoo.generate(str(tmp_path), image=32, models=[model])
    for fmt in zoo.FORMATS:
        assert main(["import", paths[f"{model}-{fmt}"], "--json", "--images", "2"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["exact_vs_reference"] == "2/2", out
        if out["layout"] != "nhwc" and exact_weights_for_host() == "int8":  # ORT's arithmetic, ORT's kernels exact
            assert out["layer_max_step_vs_ort"] == 0 and out["max_step_vs_ort"] == 0, out
        assert out["layer_max_step_vs_ort"] <= 1, out["layers_over_1_step"]
        # a rare 1-step rounding difference (a float32 near-tie) grows through later layers
        assert out["max_step_vs_ort"] <= 16 and out["top1_agree_vs_ort"] == "2/2", out
        assert out["ops"]["QLinearConv" if fmt == "qoperator" else "Conv"] == (53 if model == "resnet50" else 52)


# ---------------------------------------------------------------------------- new qnn ops
def test_new_qnn_ops_compiled_equal_their_numpy_twins():
    """The ops added for imported models (and the left shifts for scale ratios >= 1), compiled
    by TVM, against qnn_reference bit for bit; quantize also against ORT's QuantizeLinear,
    rounding ties (x / scale exactly k + 0.5) included."""
    import tvm
    from tvm import te

    from tvm_ext.frontend.qvalues import multiplier
    from tvm_ext.workloads import qnn, qnn_reference as ref

    rng = np.random.RandomState(3)
    u8 = rng.randint(0, 256, (2, 3, 5, 8)).astype(np.uint8)
    m_big, r_big, l_big = multiplier(np.linspace(0.3, 5.0, 8))
    assert l_big.max() >= 2 and l_big.min() == 0
    scale = np.array([0.05], np.float32)
    xf = (rng.randn(2, 8, 3, 5) * 3).astype(np.float32)
    xf.flat[:6] = [0.025, 0.075, -0.025, -0.125, 0.175, 12.0]  # ties at scale 0.05 and a clip
    acc = rng.randint(-(2**20), 2**20, (2, 3, 5, 8)).astype(np.int32)
    c4 = [np.zeros((1, 1, 1, 8), np.int32), rng.randint(-99, 99, (1, 1, 1, 8)).astype(np.int32)]
    cases = [
        ("quantize", [xf], [scale], {"zp_out": 120, "lo": 3, "hi": 250}),
        ("dequantize", [u8], [scale], {"zp_in": 100}),
        ("flatten", [u8], [], {}),
        ("concat", [u8, u8[..., :3]], [], {"axis": 3}),
        ("rescale", [u8], [m_big[2:3].repeat(8), r_big[2:3].repeat(8)], {"zp_in": 9, "zp_out": 120, "lo": 20,
                                                                        "lshift": int(l_big[2])}),
        ("requantize", [acc >> 10], [*c4, m_big, l_big, r_big], {"zp_out": 77, "left": 1, "hi": 200}),
        ("conv2d_nhwc", [u8], [rng.randint(-127, 128, (3, 2, 1, 8)).astype(np.int8)],
         {"stride": (2, 1), "pad": (1, 0, 2, 1), "zp_in": 7, "groups": 8}),
        ("max_pool2d", [u8], [], {"size": (2, 3), "stride": (1, 2), "pad": (0, 1, 1, 0)}),
    ]
    for op, acts, consts, attrs in cases:
        expected = getattr(ref, op)(*acts, *consts, **attrs)
        ph = [te.placeholder(a.shape, str(a.dtype), name=f"a{i}") for i, a in enumerate(acts + consts)]
        out = getattr(qnn, op)(*ph, **attrs)
        lib = tvm.compile(te.create_prim_func(ph + [out]), target="llvm")
        args = [tvm.runtime.tensor(a) for a in acts + consts]
        args.append(tvm.runtime.empty(expected.shape, expected.dtype))
        lib(*args)
        np.testing.assert_array_equal(args[-1].numpy(), expected, err_msg=op)
    q = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])
    g = helper.make_graph([q], "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xf.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, list(xf.shape))],
                          [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.uint8(120), "z")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    from tvm_ext.bench.onnx_export import ort_session

    theirs = ort_session(m, 1).run(None, {"x": xf})[0].transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(ref.quantize(xf, scale, zp_out=120), theirs)


# ---------------------------------------------------------------------------- tune / report
def _args(workload, **kw):
    from argparse import Namespace

    return Namespace(**{**dict(workload=workload, batch=None, image=None, seed=0, shape=[], layout="auto",
                               target="llvm"), **kw})


def _key(workload, layout="auto"):
    from tvm_ext.cli.common import workload_key

    return workload_key(_args(str(workload), layout=layout))


def test_onnx_path_is_a_workload_keyed_by_content(tmp_path, capsys, monkeypatch):
    a = _qdq_around(tmp_path / "m.onnx", "Relu")
    key_a = _key(a)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "m.onnx").write_bytes((tmp_path / "m.onnx").read_bytes())
    assert _key(tmp_path / "d" / "m.onnx") == key_a  # same bytes, same database
    _save([helper.make_node("Relu", ["x"], ["y"])], {}, tmp_path / "d" / "m.onnx", out_shape=[1, 4, 9, 9])
    assert _key(tmp_path / "d" / "m.onnx", "nhwc") != key_a  # same name, other bytes (a float model)
    assert key_a.startswith("onnx-m-") and _key("resnet50-int8", "nhwc") == "resnet50-int8"
    assert _key("conv2d-int8") == "conv2d-int8"  # resnet50-int8 with auto: the host's path (test_cli)
    assert _key(a, "nchwc") == key_a + "-nchwc" and _key(a, "nhwc") == key_a  # layouts never share
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "missing.onnx"]) == 2
    assert "missing.onnx: no such ONNX file" in capsys.readouterr().err
    from tvm_ext.cli.common import load_workload

    with pytest.raises(ValueError, match="--batch and --image do not apply to an .onnx model"):
        load_workload(_args(a, image=32))
    assert load_workload(_args(a)).name == key_a


@pytest.mark.slow
def test_tune_and_report_take_an_onnx_path(tmp_path, capsys, monkeypatch):
    import json

    path = _qdq_around(tmp_path / "m.onnx", "Relu")
    monkeypatch.chdir(tmp_path)
    assert main(["tune", path, "--trials", "1", "--work-dir", "db"]) == 0
    capsys.readouterr()
    assert main(["report", "db", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["workload"].startswith("onnx-m-") and len(report["options"]["sha256"]) == 64
    assert report["tasks"] and all(t["trials"] >= 1 for t in report["tasks"])


@pytest.mark.slow
def test_bench_takes_an_onnx_path_with_ort_on_the_same_file(tmp_path, capsys, monkeypatch):
    import json

    path = _qdq_around(tmp_path / "m.onnx", "Relu")
    monkeypatch.chdir(tmp_path)
    code = main(["bench", path, "--rulesets", "plugin", "--trials", "1", "--peers", "ort,tvm-onnx",
                 "--rounds", "3", "--logs-dir", "logs"])
    assert code == 0, capsys.readouterr().err
    out = json.loads((tmp_path / "tvm_ext_work" / f"bench-{_key(path)}-llvm.json").read_text())  # the default --out
    rows = {r["ruleset"]: r for r in out["rows"]}
    assert rows["plugin"]["exact_match"] and rows["ort"]["ort_weights"] == "file"
    assert rows["ort"]["max_step"] <= 1 and rows["ort"]["e2e_ms"] > 0
    assert rows["tvm-onnx"]["max_step"] <= 1 and rows["tvm-onnx"]["e2e_ms"] > 0  # TVM's float from_onnx
