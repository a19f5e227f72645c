"""ONNX export of the int8 ResNet-50 and comparison with ONNX Runtime ([bench] extra)."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from tvm_ext.bench import onnx_export as OE  # noqa: E402


def test_fixed_point_scale_roundtrip():
    mult = np.array([2**30, 2**31 - 1, 1518500250], np.int32)
    rshift = np.array([0, 5, 12], np.int32)
    s = OE.fixed_to_float(mult, rshift).astype(np.float64)
    exact = mult.astype(np.float64) * 2.0 ** -(31 + rshift.astype(np.float64))
    assert np.all(np.abs(s - exact) <= exact * 2**-23)


def test_resnet50_int8_ort_within_one_step_per_layer():
    r = OE.compare_resnet50_int8(image=32, threads=2)
    layers = r["layers"]
    assert len(layers) == 53 + 16 + 1  # convs, residual adds, classifier
    names = list(layers)
    first = r["first_differing_layer"]
    # every layer before the first difference is bit-exact, and the first one differs
    # by one uint8 step at most (rounding of the float multiplier: ORT vs q_multiply_shift)
    stop = names.index(first) if first else len(names)
    assert all(layers[n]["max_step"] == 0 for n in names[:stop])
    if first:
        assert layers[first]["max_step"] == 1 and layers[first]["frac_differ"] < 0.01
    final = r["final"]
    assert (final["max_step"] == 0) == (final["frac_differ"] == 0)
    if not first:  # every layer exact: so is the output
        assert final["max_step"] == 0


def test_diff_steps_counts_uint8_steps_both_ways():
    a = np.array([[0, 255, 10, 10]], np.uint8)
    b = np.array([[1, 250, 10, 10]], np.uint8)  # no uint8 wrap-around: 255 vs 250 is 5 steps
    assert OE.diff_steps(a, b) == {"max_step": 5, "frac_differ": 0.5}
    assert OE.diff_steps(b, a) == {"max_step": 5, "frac_differ": 0.5}
    assert OE.diff_steps(a, a) == {"max_step": 0, "frac_differ": 0.0}


@pytest.mark.parametrize("weights", ["uint8", OE.exact_weights_for_host()])
def test_single_conv_within_one_step(weights):
    """uint8 weights (zero point 128) run ORT's non-saturating kernels on every x86 CPU;
    int8 weights are exact only with VNNI, so the host default must be too."""
    from tvm_ext.workloads import conv2d_int8

    graph, inputs = conv2d_int8.network(image=14)
    model, _ = OE.export_quant_graph(graph, 1, exact_add=False, weights=weights)
    (out,) = OE.ort_session(model, 2).run(None, {"images": inputs[0]})
    assert OE.diff_steps(OE.to_nhwc(out), graph(inputs))["max_step"] <= 1


def test_unknown_weight_type_is_refused():
    with pytest.raises(ValueError, match="'int4'"):
        OE.weight_inputs(None, np.zeros((1, 1, 1, 1), np.int8), "w", np.ones(1, np.float32), "int4")


def _residual_graph():
    """A small recorded network with everything the QDQ form emits: a strided 3x3 conv, max
    pool, a residual add, global average pool and a dense; float32 epilogues (the built-in
    packed networks' reference)."""
    from tvm_ext.workloads.qnn import QuantGraph
    from tvm_ext.workloads.qnn_float import FloatQuantGraph

    rng = np.random.RandomState(0)
    g = QuantGraph(0)
    image = rng.randint(0, 256, (1, 16, 16, 3)).astype(np.uint8)
    x = g.input(image, zp=100)
    c1 = g.max_pool(g.conv(x, 32, 3, stride=2, zp_out=0, name="c1"))
    c2 = g.conv(c1, 32, 3, zp_out=20, name="c2")
    r = g.add(c2, c1, zp_out=0, name="add")
    g.dense(g.global_avg_pool(r), 10, name="fc")
    return FloatQuantGraph.of(g), image


@pytest.mark.parametrize("weights", sorted({"uint8", OE.exact_weights_for_host()}))
def test_qdq_form_runs_in_ort_and_openvino_within_one_step(weights):
    """form="qdq": standard-domain ops only (OpenVINO reads no QLinearConv nor com.microsoft ops);
    ORT and OpenVINO both run it, every output within one uint8 step of the reference.

    Weights as ``--peers`` gives them (``exact_weights_for_host``): ORT fuses DequantizeLinear ->
    Conv -> QuantizeLinear back into QLinearConv, so int8 weights take the u8s8 kernels that
    saturate without VNNI (on an AVX2-only EPYC: 11 steps at the output, 25 after the stem)."""
    import os
    import tempfile

    import onnx

    from tvm_ext.bench.peers import _openvino

    graph, image = _residual_graph()
    ref = graph([image])
    model, _ = OE.export_quant_graph(graph, 1, weights=weights, form="qdq")
    ops = {n.op_type for n in model.graph.node}
    assert {"DequantizeLinear", "QuantizeLinear", "Conv", "Add"} <= ops and not any(n.domain for n in model.graph.node)
    assert not {o for o in ops if o.startswith("QLinear")}, ops
    ort_out = OE.ort_session(model, 2).run(None, {"images": image})[0]
    assert OE.diff_steps(ort_out, ref)["max_step"] <= 1 and len(np.unique(ref)) > 3
    ov = _openvino()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.onnx")
        onnx.save(model, path)
        compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    ov_out = np.asarray(compiled.create_infer_request().infer({"images": image})[compiled.output(0)])
    assert OE.diff_steps(ov_out, ref)["max_step"] <= 1
    with pytest.raises(ValueError, match="form must be one of qoperator, qdq"):
        OE.export_quant_graph(graph, 1, form="qlinear")
