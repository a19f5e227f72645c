"""An imported model's residual add (qnn_ort): ONNX Runtime's own arithmetic, bit for bit -- the
NumPy twin against ORT's QLinearAdd on random scales and zero points (uint8 and int8), the
compiled TE op (scalar and in 16-lane vectors) against the twin."""
import numpy as np
import pytest
import tvm
from tvm import te
from tvm.s_tir import Schedule

from tvm_ext.workloads import qnn_ort, qnn_reference

N = 4096


def _ort_add(a, b, sa, za, sb, zb, sc, zc, dtype):
    """ORT's QLinearAdd (com.microsoft) on ``a`` and ``b`` as ``dtype`` tensors."""
    from onnx import TensorProto, helper, numpy_helper

    from tvm_ext.bench.onnx_export import ort_session

    kind = TensorProto.UINT8 if dtype == np.uint8 else TensorProto.INT8
    consts = [numpy_helper.from_array(v, n) for v, n in (
        (np.float32(sa), "sa"), (dtype(za), "za"), (np.float32(sb), "sb"), (dtype(zb), "zb"),
        (np.float32(sc), "sc"), (dtype(zc), "zc"))]
    node = helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "add", [helper.make_tensor_value_info(n, kind, [N]) for n in "ab"],
                              [helper.make_tensor_value_info("y", kind, [N])], consts)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return ort_session(model, 1).run(None, {"a": a, "b": b})[0]


@pytest.mark.parametrize("signed", [False, True])
def test_the_numpy_twin_is_ort_bit_for_bit(signed):
    pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(1 + signed)
    shift, dtype = (128, np.int8) if signed else (0, np.uint8)
    differ = 0
    for trial in range(8):
        sa, sb, sc = (np.float32(rng.uniform(0.005, 0.3)) for _ in range(3))
        za, zb, zc = (int(rng.integers(0, 256)) for _ in range(3))  # as held: uint8
        if trial == 0:  # ratios of exactly 1/2: every odd a + b - za - zb a tie, rounded half to even
            sa, sb, sc, zc = np.float32(0.25), np.float32(0.25), np.float32(0.5), 128
        a, b = (rng.integers(0, 256, N).astype(np.uint8) for _ in range(2))
        consts = qnn_ort.qlinear_add_consts(sa, za, sb, zb, sc, zc, 1, shift)
        ours = qnn_reference.qlinear_add(a[:, None], b[:, None], *consts, shift=shift)[:, 0]
        held = lambda x: (x.astype(np.int16) - shift).astype(dtype)  # noqa: E731 - the model's own values
        theirs = _ort_add(held(a), held(b), sa, za - shift, sb, zb - shift, sc, zc - shift, dtype)
        differ += int(np.count_nonzero(held(ours) != theirs))
        assert len(np.unique(ours)) > 50
    assert differ == 0


@pytest.mark.parametrize("lanes", [None, 16])
@pytest.mark.parametrize("shift,lo,hi", [(0, 0, 255), (0, 37, 200), (128, 0, 255)])
def test_the_compiled_op_equals_its_twin(lanes, shift, lo, hi):
    rng = np.random.default_rng(3)
    c = 32
    a, b = (rng.integers(0, 256, (N // c, c)).astype(np.uint8) for _ in range(2))
    consts = [np.concatenate(parts) for parts in zip(*(
        qnn_ort.qlinear_add_consts(*rng.uniform(0.01, 0.2, 1), 120, *rng.uniform(0.01, 0.2, 1), 7,
                                   *rng.uniform(0.01, 0.2, 1), 131, 1, shift) for _ in range(c)))]
    args = [a, b, *consts]
    holders = [te.placeholder(x.shape, str(x.dtype), name=f"p{i}") for i, x in enumerate(args)]
    out = qnn_ort.qlinear_add(*holders, lo=lo, hi=hi, shift=shift)
    func = te.create_prim_func([*holders, out])
    if lanes:
        sch = Schedule(func)
        *_, inner = sch.get_loops(sch.get_sblock(out.op.name))
        sch.vectorize(sch.split(inner, [None, lanes])[1])
        func = sch.mod["main"]
    lib = tvm.compile(func, target="llvm")
    got = tvm.runtime.tensor(np.zeros(a.shape, "uint8"))
    lib(*(tvm.runtime.tensor(x) for x in args), got)
    expected = qnn_reference.qlinear_add(a, b, *consts, lo=lo, hi=hi, shift=shift)
    np.testing.assert_array_equal(got.numpy(), expected)
    assert expected.min() == lo and expected.max() == hi
