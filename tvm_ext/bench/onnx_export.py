"""The int8 ResNet-50 of tvm_ext as an ONNX model, run by ONNX Runtime.

The exporter walks the recorded :class:`tvm_ext.workloads.qnn.QuantGraph` (the same
weights, zero points and fixed-point multipliers the Relax module is built from) and
emits, in NCHW (ORT's native layout for QLinearConv):

* conv + requantize  -> ``QLinearConv`` (per-channel int8 weights, int32 bias), with
  x_scale = y_scale = 1 and w_scale[c] = mult[c] * 2**-(31 + rshift[c]), so that ORT's
  effective multiplier equals our fixed-point one up to float32 rounding;
* dense + requantize -> ``QLinearConv`` 1x1 on [N, K, 1, 1] (QLinearMatMul has no bias);
* residual add       -> exact float64 elementwise ops by default (see export_quant_graph),
  or ``com.microsoft.QLinearAdd`` (per-tensor scales);
* max pool           -> ``MaxPool`` on uint8; global average pool -> exact integer
  ``(sum + hw/2) // hw`` with ReduceSum/Add/Div on int32.

Rounding differs on purpose: ``q_multiply_shift`` rounds half up in fixed point, ORT
rounds a float product half to even (and QLinearAdd rounds once where we round each
input), so single layers may differ by one uint8 step; more than one is a bug. Needs
the ``[bench]`` extra: ``onnx`` and ``onnxruntime``.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

OPSET = 17


def _onnx():
    try:
        import onnx  # pylint: disable=import-outside-toplevel
        from onnx import TensorProto, helper, numpy_helper  # pylint: disable=import-outside-toplevel
    except ImportError as err:  # pragma: no cover - depends on the extra
        raise ImportError("onnx export needs the [bench] extra: pip install onnx onnxruntime") from err
    return onnx, TensorProto, helper, numpy_helper


def fixed_to_float(mult, rshift, q: int = 31) -> np.ndarray:
    """The real scale of a fixed-point multiplier: mult * 2**-(q + rshift), as float32."""
    return (np.asarray(mult, np.float64) * np.exp2(-(q + np.asarray(rshift, np.float64)))).astype(np.float32)


class _Emitter:
    def __init__(self):
        self.onnx, self.TensorProto, self.helper, self.nh = _onnx()
        self.nodes, self.inits = [], []
        self._n = 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{hint.replace('.', '_')}_{self._n}"

    def const(self, value, hint: str) -> str:
        name = self.name(hint)
        self.inits.append(self.nh.from_array(np.asarray(value), name))
        return name

    def node(self, op, inputs, hint, domain=None, **attrs) -> str:
        out = self.name(hint)
        kw = {"domain": domain} if domain else {}
        self.nodes.append(self.helper.make_node(op, inputs, [out], name=out, **kw, **attrs))
        return out


FORMS = ("qoperator", "qdq")


def export_quant_graph(graph, batch: int = 1, keep_layers: bool = False, exact_add: bool = True,
                       weights: str = "int8", form: str = "qoperator"):
    """ONNX model of a recorded QuantGraph whose input is NHWC uint8 images.

    Returns ``(model, layer_outputs)``: ``layer_outputs`` maps each requantized layer
    name to the ONNX value holding its output (NCHW); with ``keep_layers`` they are also
    graph outputs (for per-layer comparison). ``exact_add`` emits the residual add as
    float64 elementwise ops that round like ours (each input separately, half up);
    otherwise ``com.microsoft.QLinearAdd``, which rounds once (<= 1 step per add, but
    16 adds in a row let differences grow through the network).

    ``form="qdq"``: standard ops only, as ORT's ``quantize_static`` writes a QDQ model
    (``_qdq_conv``, ``_qdq_add``; ``exact_add`` does not apply): what OpenVINO reads.
    """
    if form not in FORMS:
        raise ValueError(f"form must be one of {', '.join(FORMS)}, not {form!r}")
    e = _Emitter()
    helper, TP = e.helper, e.TensorProto
    (in_shape, in_dtype), = graph.input_specs
    assert in_dtype == "uint8", in_dtype
    in_shape = (batch,) + tuple(in_shape[1:])
    x_in = helper.make_tensor_value_info("images", TP.UINT8, list(in_shape))
    values: list[Any] = [e.node("Transpose", ["images"], "to_nchw", perm=[0, 3, 1, 2])]
    zps: list[int] = [None]  # zero point of each value, filled from the steps
    one = e.const(np.float32(1.0), "one")
    layer_outputs: dict[str, str] = {}
    steps = graph.steps
    pending = {}  # acc value index -> (step, kind)
    # zero point of the graph input: the first conv's zp_in
    first_conv = next(s for s in steps if s.op == "conv2d_nhwc")
    zps[0] = first_conv.attrs["zp_in"]
    hw: list[Any] = [tuple(in_shape[1:3])]  # spatial size of each value (None: flat)
    for step in steps:
        idx_in = [i for i in step.inputs]
        if step.op in ("conv2d_nhwc", "dense"):
            values.append(None)  # filled by the requantize that follows
            zps.append(None)
            pending[len(values) - 1] = step
            hw.append(_out_hw(hw[idx_in[0]], step))
            continue
        if step.op == "requantize":
            acc_step = pending.pop(idx_in[0])
            src = acc_step.inputs[0]
            zp_corr, bias, mult, lshift, rshift = step.consts
            assert not np.any(lshift), "left shifts are not exported"
            zp_out = step.attrs["zp_out"]
            x, zx = values[src], zps[src]
            if acc_step.op == "conv2d_nhwc":
                (w_hwio,) = acc_step.consts
                w = np.ascontiguousarray(w_hwio.transpose(3, 2, 0, 1))  # OIHW
                k, s, p = w.shape[2], acc_step.attrs["stride"], acc_step.attrs["pad"]
                attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p])
            else:
                (w_uk,) = acc_step.consts
                w = np.ascontiguousarray(w_uk[:, :, None, None])
                x = e.node("Unsqueeze", [x, e.const(np.array([2, 3], np.int64), "axes")], "fc_in")
                attrs = dict(kernel_shape=[1, 1])
            scale = fixed_to_float(mult, rshift).reshape(-1)
            w_ins = weight_inputs(e, w, step.name, scale, weights)
            bias = np.asarray(bias, np.int32).reshape(-1)
            if form == "qdq":
                y = _qdq_conv(e, x, zx, w_ins, bias, scale, step, attrs)
            else:
                ins = [x, one, e.const(np.uint8(zx), "x_zp"), *w_ins, one, e.const(np.uint8(zp_out), "y_zp"),
                       e.const(bias, "bias")]
                y = e.node("QLinearConv", ins, step.name, **attrs)
            if acc_step.op == "dense":
                y = e.node("Squeeze", [y, e.const(np.array([2, 3], np.int64), "axes")], "fc_out")
            values.append(y)
            zps.append(zp_out)
            hw.append(hw[idx_in[0]])
            layer_outputs[step.name] = y
            continue
        if step.op == "add_requantize":
            a, b = step.inputs
            mult_a, rshift_a, mult_b, rshift_b = step.consts
            for m in (mult_a, mult_b):
                assert np.all(m == m.flat[0]), "QLinearAdd needs per-tensor scales"
            if form == "qdq":
                y = _qdq_add(e, values[a], values[b], step)
            elif exact_add:
                terms = []
                for v, m, r, zk in ((a, mult_a, rshift_a, "zp_a"), (b, mult_b, rshift_b, "zp_b")):
                    # float64 holds (x - zp) * mult * 2**-(31 + r) exactly: same rounding as ours
                    scale = float(m.flat[0]) * 2.0 ** -(31 + int(r.flat[0]))
                    t = e.node("Cast", [values[v]], "add_f64", to=TP.DOUBLE)
                    t = e.node("Sub", [t, e.const(np.float64(step.attrs[zk]), "zp")], "add_sub")
                    t = e.node("Mul", [t, e.const(np.float64(scale), "scale")], "add_mul")
                    t = e.node("Add", [t, e.const(np.float64(0.5), "half")], "add_half")
                    terms.append(e.node("Floor", [t], "add_floor"))
                t = e.node("Add", terms, "add_sum")
                t = e.node("Add", [t, e.const(np.float64(step.attrs["zp_out"]), "zp_out")], "add_zp")
                t = e.node("Clip", [t, e.const(np.float64(0), "lo"), e.const(np.float64(255), "hi")], "add_clip")
                y = e.node("Cast", [t], step.name, to=TP.UINT8)
            else:
                sa = fixed_to_float(mult_a.flat[0], rshift_a.flat[0])
                sb = fixed_to_float(mult_b.flat[0], rshift_b.flat[0])
                ins = [
                    values[a], e.const(np.float32(sa), "a_scale"), e.const(np.uint8(step.attrs["zp_a"]), "a_zp"),
                    values[b], e.const(np.float32(sb), "b_scale"), e.const(np.uint8(step.attrs["zp_b"]), "b_zp"),
                    one, e.const(np.uint8(step.attrs["zp_out"]), "c_zp"),
                ]
                y = e.node("QLinearAdd", ins, step.name, domain="com.microsoft")
            hw.append(hw[a])
            values.append(y)
            zps.append(step.attrs["zp_out"])
            layer_outputs[step.name] = y
            continue
        if step.op == "max_pool2d":
            size, stride, pad = step.attrs["size"], step.attrs["stride"], step.attrs["pad"]
            y = e.node("MaxPool", [values[idx_in[0]]], step.name, kernel_shape=[size, size],
                       strides=[stride, stride], pads=[pad, pad, pad, pad])
            hw.append(_out_hw(hw[idx_in[0]], step))
            values.append(y)
            zps.append(zps[idx_in[0]])
            continue
        if step.op == "global_avg_pool":
            src = idx_in[0]
            h, w = hw[src]
            hw.append(None)
            # (sum + hw/2) // hw; in float32 for the QDQ form (exact: sums < 2**24, and a correctly
            # rounded quotient of integers floors to the integer quotient), as OpenVINO rounds an
            # integer Div to nearest (56 % of a test's pooled values one off)
            acc_t, acc_np = (TP.FLOAT, np.float32) if form == "qdq" else (TP.INT32, np.int32)
            x32 = e.node("Cast", [values[src]], "gap_acc", to=acc_t)
            s = e.node("ReduceSum", [x32, e.const(np.array([2, 3], np.int64), "axes")], "gap_sum", keepdims=0)
            s = e.node("Add", [s, e.const(acc_np((h * w) // 2), "half")], "gap_round")
            s = e.node("Div", [s, e.const(acc_np(h * w), "hw")], "gap_div")
            if form == "qdq":
                s = e.node("Floor", [s], "gap_floor")
            y = e.node("Cast", [s], step.name, to=TP.UINT8)
            values.append(y)
            zps.append(zps[src])
            continue
        raise NotImplementedError(f"op {step.op!r} of step {step.name!r} has no ONNX export")
    final = values[-1]
    outputs = [helper.make_tensor_value_info(final, TP.UINT8, None)]
    if keep_layers:
        outputs += [helper.make_tensor_value_info(v, TP.UINT8, None)
                    for v in layer_outputs.values() if v != final]
    g = helper.make_graph(e.nodes, "tvm_ext_int8", [x_in], outputs, e.inits)
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)],
        producer_name="tvm_ext",
    )
    model.ir_version = 8
    return model, layer_outputs


def _dq(e, x, scale, zp, hint, **attrs) -> str:
    return e.node("DequantizeLinear", [x, e.const(scale, hint + "_scale"), e.const(zp, hint + "_zp")], hint, **attrs)


def _quantized(e, y, step) -> str:
    """``y`` (float, in output steps: scale 1) clipped to the step's [lo, hi] as a Relu or
    Clip where they are narrower than uint8's, then QuantizeLinear with its zero point."""
    zp, lo, hi = int(step.attrs["zp_out"]), int(step.attrs.get("lo", 0)), int(step.attrs.get("hi", 255))
    if (lo, hi) == (zp, 255):
        y = e.node("Relu", [y], step.name + "_relu")
    elif (lo, hi) != (0, 255):
        y = e.node("Clip", [y, e.const(np.float32(lo - zp), "lo"), e.const(np.float32(hi - zp), "hi")],
                   step.name + "_clip")
    return e.node("QuantizeLinear", [y, e.const(np.float32(1.0), "y_scale"), e.const(np.uint8(zp), "y_zp")],
                  step.name)


def _qdq_conv(e, x, zx, w_ins, bias, scale, step, attrs) -> str:
    """DequantizeLinear(x) -> Conv with dequantized per-channel weights and bias -> QuantizeLinear:
    input and output scales 1, the weights' scale the requantize multiplier, so that a runtime
    fusing the pattern into an integer conv computes ``rint(float(acc) * scale) + zp`` as ours."""
    xf = _dq(e, x, np.float32(1.0), np.uint8(zx), "x_dq")
    wf = e.node("DequantizeLinear", w_ins, step.name + "_w_dq", axis=0)
    bf = _dq(e, e.const(bias, "bias"), scale, np.zeros_like(bias), "b_dq", axis=0)
    return _quantized(e, e.node("Conv", [xf, wf, bf], step.name + "_conv", **attrs), step)


def _qdq_add(e, a, b, step) -> str:
    """DequantizeLinear of both inputs with the add's float32 scales (``qnn_float.add_consts``,
    what the built-in networks' float epilogues multiply by), Add, QuantizeLinear."""
    from tvm_ext.workloads.qnn_float import add_consts  # pylint: disable=import-outside-toplevel

    sa, sb = (np.float32(v.flat[0]) for v in add_consts(*step.consts))
    af = _dq(e, a, sa, np.uint8(step.attrs["zp_a"]), "a_dq")
    bf = _dq(e, b, sb, np.uint8(step.attrs["zp_b"]), "b_dq")
    return _quantized(e, e.node("Add", [af, bf], step.name + "_sum"), step)


def weight_inputs(e, w: np.ndarray, name: str, scale, weights: str) -> list:
    """QLinearConv's (w, w_scale, w_zero_point) inputs for int8 weights ``w``.

    ``weights="int8"``: as they are, zero point 0 (ORT's u8s8 kernels). ``"uint8"``: the
    same values shifted by 128 with zero point 128 (ORT's u8u8 kernels). On x86 without
    VNNI, ORT's u8s8 kernels multiply with vpmaddubsw, whose int16 pair sums saturate
    (255 * 127 * 2 > 32767): measured up to 29 uint8 steps off after one 3x3 conv with
    64 input channels on an AVX2-only host. u8u8 does not saturate. The same holds for
    ``form="qdq"``: ORT fuses DequantizeLinear -> Conv -> QuantizeLinear into QLinearConv
    (at ORT_ENABLE_EXTENDED and above), so its weights' type picks the kernel there too."""
    if weights not in ("int8", "uint8"):
        raise ValueError(f"weights must be 'int8' or 'uint8', not {weights!r}")
    cout = w.shape[0]
    if weights == "uint8":
        shifted = (w.astype(np.int16) + 128).astype(np.uint8)
        return [e.const(shifted, name + "_w"), e.const(scale, "w_scale"),
                e.const(np.full(cout, 128, np.uint8), "w_zp")]
    return [e.const(w.astype(np.int8), name + "_w"), e.const(scale, "w_scale"),
            e.const(np.zeros(cout, np.int8), "w_zp")]


def exact_weights_for_host() -> str:
    """The weight type with which ORT computes exactly on this CPU (see weight_inputs)."""
    from tvm_ext.targets import describe_host

    host = describe_host()
    return "int8" if host.get("avx512vnni") or host.get("avxvnni") else "uint8"


def _out_hw(hw_in, step):
    """Spatial size after a conv / dense / pool step (None for flat values)."""
    if hw_in is None or step.op == "dense":
        return None
    if step.op == "conv2d_nhwc":
        k = step.consts[0].shape[0]
    else:
        k = step.attrs["size"]
    s, p = step.attrs["stride"], step.attrs["pad"]
    return tuple((d + 2 * p - k) // s + 1 for d in hw_in)


# --------------------------------------------------------------------------- running
def ort_session(model, threads: Optional[int] = None):
    """An onnxruntime InferenceSession (CPU) with ``threads`` intra-op threads."""
    import onnxruntime as ort  # pylint: disable=import-outside-toplevel

    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def diff_steps(a: np.ndarray, b: np.ndarray) -> dict:
    """Largest difference in uint8 steps and the fraction of elements that differ."""
    d = np.abs(a.astype(np.int32) - b.astype(np.int32))
    return {"max_step": int(d.max()) if d.size else 0, "frac_differ": float(np.count_nonzero(d)) / max(d.size, 1)}


def to_nhwc(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if x.ndim == 4 else x


def compare_resnet50_int8(batch: int = 1, image: int = 224, seed: int = 0, threads: Optional[int] = None,
                          per_layer: bool = True, exact_add: bool = True, weights: Optional[str] = None) -> dict:
    """Run the exported network in ORT and compare with the exact integer reference.

    Returns ``{"final": {max_step, frac_differ}, "layers": {name: {...}},
    "first_differing_layer", "worst_layer"}``. Each layer's ORT output is taken from
    the full network, so its difference includes what earlier layers propagated; the
    first differing layer shows the per-layer rounding difference on its own.
    """
    from tvm_ext.workloads.resnet50_int8 import network  # pylint: disable=import-outside-toplevel

    graph, inputs = network(batch, image, seed)
    model, layers = export_quant_graph(graph, batch, keep_layers=per_layer, exact_add=exact_add,
                                       weights=weights or exact_weights_for_host())
    sess = ort_session(model, threads)
    names = [o.name for o in sess.get_outputs()]
    outs = dict(zip(names, sess.run(None, {"images": inputs[0]})))
    ref_values = graph.run(inputs)
    n_in = len(graph.input_specs)
    by_name = {s.name: ref_values[n_in + i] for i, s in enumerate(graph.steps)}
    result = {"final": diff_steps(outs[names[0]], ref_values[-1]), "layers": {}}
    if per_layer:
        for lname, vname in layers.items():
            if vname in outs:
                result["layers"][lname] = diff_steps(to_nhwc(outs[vname]), by_name[lname])
        first = next((k for k, v in result["layers"].items() if v["max_step"]), None)
        result["first_differing_layer"] = first
        if result["layers"]:
            result["worst_layer"] = max(result["layers"], key=lambda k: result["layers"][k]["max_step"])
    return result


__all__ = [
    "FORMS",
    "export_quant_graph",
    "fixed_to_float",
    "ort_session",
    "diff_steps",
    "compare_resnet50_int8",
]


# --------------------------------------------------------------------------- per layer
def ort_conv_model(shape: dict, seed: int = 0, weights: Optional[str] = None):
    """One ORT QLinearConv (NCHW, per-channel weights, bias) of ``shape`` and its feed (a
    random input ``x``); ``weights`` as in weight_inputs (default: the exact kind for this
    host). A ``requantize+add`` shape (a conv task with the residual add fused) gets the
    add too, as ORT runs it in a network: ``com.microsoft.QLinearAdd`` of the conv's output
    and a second random uint8 input ``r``, so that both sides do the same work."""
    _, TP, helper, nh = _onnx()
    rng = np.random.default_rng(seed)
    n, h, w, ci, co, k, s, p = (shape[x] for x in ("n", "h", "w", "c_in", "c_out", "k", "stride", "pad"))
    inits = [
        nh.from_array(np.float32(1.0), "one"), nh.from_array(np.uint8(7), "x_zp"),
        nh.from_array(np.uint8(100), "y_zp"),
        nh.from_array(rng.integers(-2000, 2000, co).astype(np.int32), "bias"),
    ]
    e = _Emitter()
    w_oihw = rng.integers(-127, 128, (co, ci, k, k)).astype(np.int8)
    scale = (rng.uniform(1, 2, co) * 2.0**-12).astype(np.float32)
    w_inputs = weight_inputs(e, w_oihw, "w", scale, weights or exact_weights_for_host())
    inits += e.inits
    nodes = [helper.make_node("QLinearConv", ["x", "one", "x_zp", *w_inputs, "one", "y_zp", "bias"],
                              ["y"], kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p])]
    inputs = [helper.make_tensor_value_info("x", TP.UINT8, [n, ci, h, w])]
    feed = {"x": rng.integers(0, 256, (n, ci, h, w)).astype(np.uint8)}
    opsets = [helper.make_opsetid("", OPSET)]
    if shape.get("epilogue") == "requantize+add":
        ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        inits += [nh.from_array(np.float32(0.5), "half"), nh.from_array(np.uint8(90), "r_zp"),
                  nh.from_array(np.uint8(110), "z_zp")]
        nodes.append(helper.make_node("QLinearAdd", ["y", "one", "y_zp", "r", "half", "r_zp", "one", "z_zp"],
                                      ["z"], domain="com.microsoft"))
        inputs.append(helper.make_tensor_value_info("r", TP.UINT8, [n, co, ho, wo]))
        feed["r"] = rng.integers(0, 256, (n, co, ho, wo)).astype(np.uint8)
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    out = nodes[-1].output[0]
    g = helper.make_graph(nodes, "conv", inputs, [helper.make_tensor_value_info(out, TP.UINT8, None)], inits)
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 8
    return m, feed


__all__ += ["ort_conv_model"]
