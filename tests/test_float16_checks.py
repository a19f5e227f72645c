"""Float16 kernels are checked against a float32 reference at a tolerance for float16 accumulation over K
(``bundle.tolerance``, ``bench.reference``), never against another float16 schedule; no CPU touch kernel
is built for a GPU target (issue 50's two Phi-2 bench defects)."""
import numpy as np
import pytest
from tvm import te

from tvm_ext.bench.phi2 import measure as pm_measure
from tvm_ext.bench.reference import float32_twin, reduction_length, reference_output
from tvm_ext.bundle.tolerance import check_output, digest, float_tolerance
from tvm_ext.targets import cuda_target, resolve_target

K = 10240  # Phi-2's fc2


def fp16_dot(x, w, order):
    """x @ w.T summed in a float16 accumulator: term by term (``serial``) or as a tree (``tree``)."""
    prod = (x.astype("float16") * w.astype("float16")).astype("float16")  # one float16 product a term
    if order == "serial":
        acc = np.zeros(w.shape[0], "float16")
        for j in range(prod.shape[1]):
            acc = (acc + prod[:, j]).astype("float16")
        return acc
    pad = (1 << (prod.shape[1] - 1).bit_length()) - prod.shape[1]
    prod = np.concatenate([prod, np.zeros((prod.shape[0], pad), "float16")], axis=1)
    while prod.shape[1] > 1:
        prod = (prod[:, 0::2] + prod[:, 1::2]).astype("float16")
    return prod[:, 0]


@pytest.fixture(scope="module")
def gemv():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, K)).astype("float16")
    w = rng.uniform(-1, 1, (256, K)).astype("float16")
    ref = (w.astype("float64") @ x[0].astype("float64"))
    return x, w, ref


def test_two_honest_float16_sums_fail_the_old_check_and_pass_the_new(gemv):
    x, w, ref = gemv
    serial, tree = fp16_dot(x, w, "serial"), fp16_dot(x, w, "tree")
    # the bench's old comparison of one schedule with another at 1e-3 rejects both orders
    assert not np.allclose(serial.astype("float64"), tree.astype("float64"), rtol=1e-3, atol=1e-3)
    for out in (serial, tree):
        ok, verdict = check_output(out, ref, K)
        assert ok, verdict
    assert float_tolerance("float16", K) < 0.25  # a wrong element (off by ~the rms) still fails


def test_wrong_unwritten_and_nan_outputs_fail(gemv):
    x, w, ref = gemv
    out = fp16_dot(x, w, "tree")
    rms = float(np.sqrt(np.mean(ref**2)))
    for bad in (lambda o: o.__setitem__(7, o[7] + np.float16(rms)),  # one element off by the rms
                lambda o: o.__setitem__(slice(128, None), 0),  # half never written (zeros)
                lambda o: o.__setitem__(3, np.nan)):
        o = out.copy()
        bad(o)
        assert not check_output(o, ref, K)[0]
    assert not check_output(out[:10], ref, K)[0]  # wrong shape


def test_integer_outputs_are_exact_and_digests_name_dtype_and_shape():
    a = np.arange(24, dtype="int8").reshape(2, 12)
    assert check_output(a, a.copy()) == (True, "exact")
    b = a.copy()
    b[1, 3] += 1
    assert check_output(b, a) == (False, "1 of 24 elements differ")
    assert check_output(a, digest(a))[0] and not check_output(b, digest(a))[0]
    assert digest(a) != digest(a.reshape(3, 8)) and digest(a) != digest(a.astype("uint8"))


def matmul_f16(n=64, k=2048):
    x = te.placeholder((1, k), "float16", name="x")
    w = te.placeholder((n, k), "float16", name="w")
    r = te.reduce_axis((0, k), name="r")
    y = te.compute((1, n), lambda i, j: te.sum(x[i, r] * w[j, r], axis=r), name="y")
    return te.create_prim_func([x, w, y])


def test_the_reference_is_the_kernel_widened_to_float32():
    func = matmul_f16()
    twin = float32_twin(func)
    assert "float16" not in twin.script() and reduction_length(func) == 2048
    rng = np.random.default_rng(1)
    x, w = rng.uniform(-1, 1, (1, 2048)).astype("float16"), rng.uniform(-1, 1, (64, 2048)).astype("float16")
    ref = reference_output(func, [x, w, np.zeros((1, 64), "float16")])
    assert ref.dtype == np.float32
    np.testing.assert_allclose(ref, x.astype("float64") @ w.astype("float64").T, rtol=1e-5, atol=1e-4)


def test_prepare_checks_each_schedule_against_the_reference_not_against_dlight():
    """``measure.check_outputs``: a float16 serial sum and a tree sum of the same kernel (which differ
    by more than 1e-3) both pass; a schedule with one wrong element is named in the error."""
    func = matmul_f16(k=4096)
    rng = np.random.default_rng(2)
    x, w = rng.uniform(-1, 1, (1, 4096)).astype("float16"), rng.uniform(-1, 1, (64, 4096)).astype("float16")
    base = [x, w, np.zeros((1, 64), "float16")]
    outs = {"dlight": fp16_dot(x, w, "serial")[None], "rule": fp16_dot(x, w, "tree")[None]}
    pm_measure.check_outputs(func, base, outs, "matmul")
    outs["rule"][0, 5] += np.float16(4.0)
    with pytest.raises(RuntimeError, match="rule kernel matmul differs from its float32 reference"):
        pm_measure.check_outputs(func, base, outs, "matmul")


def test_no_touch_kernel_is_built_for_a_gpu_target(monkeypatch):
    """The floors are CPU touch kernels (``T.parallel``, no thread binding): on cuda none is built."""
    built = []
    monkeypatch.setattr(pm_measure, "build", lambda mod, target: built.append(target) or None)
    kernel = type("K", (), {"name": "k", "func": matmul_f16(k=64)})()
    kss = {True: type("KS", (), {"kernels": [kernel]})()}
    fns = {}
    pm_measure.add_floors(fns, kss, cuda_target("sm_90"), None, 16)
    assert fns == {} and built == []
    monkeypatch.setattr(pm_measure, "_main", lambda ex, dev: ex)
    pm_measure.add_floors(fns, kss, resolve_target("llvm"), None, 2)  # on the CPU both thread counts
    assert sorted(k[1] for k in fns) == ["floor1", "floor2"] and len(built) == 2


def test_a_half_made_from_its_bits_stays_a_half_in_the_reference():
    """The CUDA q4 unpack makes each weight as ``reinterpret(float16, 0x6400 | q) - 1031``: the twin keeps
    that half and widens it after, so the reference equals NumPy's dequantize exactly."""
    from tvm_ext.bundle import sources
    from tvm_ext.bundle.inputs import make_inputs

    _, _, mod = next(k for k in sources.phi2_kernels("phi2-decode", "reduced", 16, "float16")[False]
                     if k[0] == "dequantize")
    func = mod["main"]
    assert "reinterpret" in func.script()
    specs = [{"shape": [int(x) for x in p.shape], "dtype": str(p.dtype),
              "range": [0, 2**32 - 1] if str(p.dtype) == "uint32" else [-1.0, 1.0]} for p in func.params]
    words, scale, out = make_inputs(specs, 1)
    ref = reference_output(func, [words, scale, out])
    i, j = np.arange(ref.shape[0])[:, None], np.arange(ref.shape[1])[None, :]
    q = (words[j, i // 8].astype(np.uint64) >> ((i % 8) * 4).astype(np.uint64)) & 15
    np.testing.assert_array_equal(ref, (q.astype(np.float64) - 7) * scale[j, i // 32].astype(np.float64))
