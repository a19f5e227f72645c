"""Conv shapes read back from fused tasks, for the per-layer ORT comparison."""
import pytest
from tvm import te

from tvm_ext.bench import peers
from tvm_ext.workloads import qnn


def conv_task(h, cin, cout, k, stride, with_add=False):
    data = te.placeholder((1, h, h, cin), "uint8", name="data")
    weight = te.placeholder((k, k, cin, cout), "int8", name="weight")
    acc = qnn.conv2d_nhwc(data, weight, stride=stride, pad=k // 2, zp_in=3)
    consts = [te.placeholder(s, "int32", name=n) for n, s in
              (("zp_corr", (1, 1, 1, cout)), ("bias", (1, 1, 1, cout)), ("mult", (cout,)),
               ("lshift", (cout,)), ("rshift", (cout,)))]
    out = qnn.requantize(acc, *consts, zp_out=59)
    args = [data, weight, *consts]
    if with_add:
        other = te.placeholder(out.shape, "uint8", name="residual")
        scales = [te.placeholder((cout,), "int32", name=f"s{i}") for i in range(4)]
        out = qnn.add_requantize(out, other, *scales, zp_a=59, zp_b=60, zp_out=61)
        args += [other, *scales]
    return te.create_prim_func(args + [out])


@pytest.mark.parametrize("h,cin,cout,k,stride", [(56, 64, 64, 3, 1), (56, 256, 512, 1, 2),
                                                (224, 3, 64, 7, 2), (7, 512, 2048, 1, 1)])
def test_conv_shape_of_nhwc_tasks(h, cin, cout, k, stride):
    shape = peers.conv_shape(conv_task(h, cin, cout, k, stride))
    assert shape == {"n": 1, "h": h, "w": h, "c_in": cin, "c_out": cout, "k": k,
                     "stride": stride, "pad": k // 2, "epilogue": "requantize"}


def test_conv_shape_sees_a_fused_residual_add():
    assert peers.conv_shape(conv_task(14, 64, 256, 1, 1, with_add=True))["epilogue"] == "requantize+add"


def test_tasks_without_a_conv_have_no_shape():
    x = te.placeholder((1, 8, 8, 16), "uint8", name="x")
    pooled = qnn.max_pool2d(x)
    assert peers.conv_shape(te.create_prim_func([x, pooled])) is None


def test_unknown_peer_is_refused():
    with pytest.raises(ValueError, match="unknown peer 'trt'"):
        peers.parse_peers("ort,trt")
    assert peers.parse_peers(None) == []


@pytest.mark.parametrize("with_add", [False, True])
def test_ort_peer_of_a_task_does_the_same_work(with_add):
    """A fused conv + requantize + add + requantize task is timed against ORT's QLinearConv
    followed by its QLinearAdd (both take the conv's output shape), a plain one against the
    QLinearConv alone; the peer model runs in ORT with the feed it comes with."""
    pytest.importorskip("onnxruntime")
    from tvm_ext.bench import onnx_export

    shape = peers.conv_shape(conv_task(14, 64, 128, 3, 2, with_add=with_add))
    model, feed = onnx_export.ort_conv_model(shape)
    assert [n.op_type for n in model.graph.node] == ["QLinearConv"] + ["QLinearAdd"] * with_add
    assert sorted(feed) == (["r", "x"] if with_add else ["x"])
    (out,) = onnx_export.ort_session(model, 1).run(None, feed)
    assert out.shape == (1, 128, 7, 7) and out.dtype.name == "uint8" and len(set(out.flat)) > 10
