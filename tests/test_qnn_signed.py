"""The int8 graph with its convs on signed activations (workloads/qnn_signed.py): the u8 graph's outputs
bit for bit, each conv an s8 x s8 product (its input shifted by 128, padded with zp - 128), and the
requantize's zero-point correction moved by 128 x sum(w) to match."""
import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm import relax, te  # noqa: E402
from tvm.script import tirx as T  # noqa: E402

from tvm_ext.workloads import qnn  # noqa: E402
from tvm_ext.workloads.qnn_signed import SHIFT, SignedEmitter, conv2d_nhwc_s8  # noqa: E402


def small_graph():
    """conv 3x3 (padded), conv 1x1, a shortcut conv, residual add, average pool, dense: every op
    the emitter changes or passes, at 10x10 with 8-16 channels."""
    rng = np.random.RandomState(3)
    images = rng.randint(0, 256, (2, 10, 10, 8)).astype("uint8")
    g = qnn.QuantGraph(seed=1)
    x = g.input(images[:1], zp=121, batch=2)
    y = g.conv(x, 16, 3, zp_out=40, name="c1")
    z = g.conv(y, 16, 1, zp_out=130, name="c2")
    s = g.conv(x, 16, 1, zp_out=128, name="sc")
    a = g.add(z, s, zp_out=50)
    p = g.global_avg_pool(a)
    g.dense(p, 10, zp_out=128)
    return g, images


def run(mod, images):
    exe = tvm.compile(mod, target="llvm")
    return relax.VirtualMachine(exe, tvm.cpu())["main"](tvm.runtime.tensor(images)).numpy()


def test_the_signed_graph_computes_the_u8_graphs_outputs_bit_for_bit():
    g, images = small_graph()
    expected = g([images])
    signed = run(g.to_relax(emitter=SignedEmitter()), images)
    assert signed.dtype == np.uint8 and np.array_equal(signed, expected)  # the reference is the u8 graph's


@T.prim_func(s_tir=True)
def conv_3x3_s8(data: T.Buffer((1, 4, 4, 8), "uint8"), w: T.Buffer((3, 3, 8, 4), "int8"),
                conv2d_nhwc: T.Buffer((1, 4, 4, 4), "int32")):
    T.func_attr({"tirx.noalias": True})
    shift_s8 = T.sblock_alloc_buffer((1, 4, 4, 8), "int8")
    pad_temp = T.sblock_alloc_buffer((1, 6, 6, 8), "int8")
    for i0, i1, i2, i3 in T.grid(1, 4, 4, 8):
        with T.sblock("shift_s8"):
            v_i0, v_i1, v_i2, v_i3 = T.axis.remap("SSSS", [i0, i1, i2, i3])
            shift_s8[v_i0, v_i1, v_i2, v_i3] = T.Cast("int8", T.Cast("int32", data[v_i0, v_i1, v_i2, v_i3]) - 128)
    for i0, i1, i2, i3 in T.grid(1, 6, 6, 8):
        with T.sblock("pad_temp"):
            v_i0, v_i1, v_i2, v_i3 = T.axis.remap("SSSS", [i0, i1, i2, i3])
            pad_temp[v_i0, v_i1, v_i2, v_i3] = T.if_then_else(  # the input's zero point 121, shifted
                1 <= v_i1 and v_i1 < 5 and 1 <= v_i2 and v_i2 < 5, shift_s8[v_i0, v_i1 - 1, v_i2 - 1, v_i3],
                T.int8(-7))
    for b, y, x, o, rh, rw, rc in T.grid(1, 4, 4, 4, 3, 3, 8):
        with T.sblock("conv2d_nhwc"):
            v_b, v_y, v_x, v_o, v_rh, v_rw, v_rc = T.axis.remap("SSSSRRR", [b, y, x, o, rh, rw, rc])
            with T.init():
                conv2d_nhwc[v_b, v_y, v_x, v_o] = 0
            conv2d_nhwc[v_b, v_y, v_x, v_o] = conv2d_nhwc[v_b, v_y, v_x, v_o] + T.Cast(
                "int32", pad_temp[v_b, v_y + v_rh, v_x + v_rw, v_rc]) * T.Cast("int32", w[v_rh, v_rw, v_rc, v_o])


def test_a_conv_reads_its_input_shifted_to_int8_padded_with_the_shifted_zero_point():
    data, w = te.placeholder((1, 4, 4, 8), "uint8", name="data"), te.placeholder((3, 3, 8, 4), "int8", name="w")
    func = te.create_prim_func([data, w, conv2d_nhwc_s8(data, w, pad=1, zp_in=121)])
    tvm.ir.assert_structural_equal(func, conv_3x3_s8.with_attr("global_symbol", "main"))


def test_the_requantize_correction_moves_by_128_times_the_weight_sums():
    g, _ = small_graph()
    mod = g.to_relax(emitter=SignedEmitter(), fused=False)
    consts = []
    relax.analysis.post_order_visit(mod["main"].body, lambda e: consts.append(e.value.numpy()) if type(
        e).__name__ == "GenericConst" else None)  # Relax's tensor constants
    for name, zp in (("c1", 121), ("c2", 40), ("sc", 121)):  # each conv's input zero point
        acc, req = (next(s for s in g.steps if s.name == n) for n in (name + ".acc", name))
        w_sum = acc.consts[0].astype(np.int64).sum(axis=(0, 1, 2))
        assert np.array_equal(req.consts[0].reshape(-1), zp * w_sum)  # as recorded (u8)
        assert any(c.shape == req.consts[0].shape and np.array_equal(c.reshape(-1), (zp - SHIFT) * w_sum)
                   for c in consts)


def test_the_s8_layout_is_what_resnet50_int8_takes_on_cuda_and_the_reference_stays():
    from tvm_ext import workloads
    from tvm_ext.int8_path import RESNET50, best_layout
    from tvm_ext.targets import cuda_target

    assert RESNET50[best_layout(cuda_target("sm_90"), weights_fit_int16=False)[0]] == "resnet50-int8-s8"
    s8, u8 = workloads.get("resnet50-int8-s8", image=32), workloads.get("resnet50-int8", image=32)
    assert np.array_equal(s8.reference(s8.inputs), u8.reference(u8.inputs))


def test_a_sum_read_by_anything_but_a_requantize_is_refused():
    """Nothing would correct it: one line naming the step and the reader, pointing to layout nhwc."""
    g = qnn.QuantGraph(seed=1)
    x = g.input(np.full((1, 4, 4, 8), 130, "uint8"), zp=128)
    acc = g.step("c.acc", "conv2d_nhwc", [x], [np.ones((1, 1, 8, 8), "int8")], zp_in=128)
    g.step("pool", "global_avg_pool", [acc])
    with pytest.raises(ValueError, match=r"^layout s8: the sum of c.acc is read by global_avg_pool, .* layout nhwc$"):
        g.to_relax(emitter=SignedEmitter())
