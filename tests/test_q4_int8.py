"""The int8-activation q4 GEMV (tvm_ext/workloads/q4_int8.py) and the ``int8`` compute option
of the Phi-2 decode built on it.

The kernels run against ``reference_np`` (the same arithmetic in NumPy: an exact integer dot
product per group) on every block-step width they have (K/64 = 1, 2, 4 and 6 blocks), with
and without gelu, including an all-zero activation group; the error against the float
reference is checked to be the quantization's (small, not zero).  A reduced Phi-2 decode with
``compute="int8"`` is compared with the float64 reference.  Bad shapes and targets get one
ValueError.
"""
import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm_ext.targets import has_avx2, resolve_target  # noqa: E402
from tvm_ext.workloads import q4_int8 as q  # noqa: E402
from tvm_ext.workloads.phi2_layers import _quantized_linear, dequantize_np  # noqa: E402

TARGET = resolve_target("llvm")
needs_avx2 = pytest.mark.skipif(not has_avx2(TARGET), reason="this host has no AVX2")


def _build(func):
    return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=TARGET)["main"]


def _quantize(x):
    k = x.size
    dev = tvm.cpu()
    outs = [tvm.runtime.tensor(np.zeros(s, dt), dev) for s, dt in (((k,), "int8"), ((k // 8,), "int32"),
                                                                   ((k // 8,), "float32"))]
    _build(q.quantize_activations(k))(tvm.runtime.tensor(x.reshape(1, 1, k), dev), *outs)
    return [o.numpy() for o in outs]


def _activations(rng, k):
    x = rng.uniform(-3, 3, k).astype("float32")
    x[32:64] = 0.0  # a group of zeros: scale 0, no division by zero
    x[5] = 40.0  # an outlier sets its group's scale
    return x


@needs_avx2
@pytest.mark.parametrize("k", [64, 128, 256, 384])
def test_quantize_activations(k):
    x = _activations(np.random.default_rng(k), k)
    xq, corr, x_scale = _quantize(x)
    want_q, want_s = q.quantize_np(x)
    np.testing.assert_array_equal(xq, want_q[q.permutation(k)])
    np.testing.assert_array_equal(corr, -7 * want_q.reshape(-1, 8).astype("int32").sum(axis=1))
    np.testing.assert_array_equal(x_scale, np.repeat(want_s, 4))
    natural = np.empty_like(xq)
    natural[q.permutation(k)] = xq
    assert not natural[32:64].any() and x_scale[4:8].tolist() == [0.0] * 4
    assert np.abs(want_q).max() == 127


@needs_avx2
@pytest.mark.parametrize("k,n,epilogue", [(64, 40, "bias"), (128, 48, "bias_gelu"), (256, 64, "bias"),
                                          (384, 24, "bias_gelu")])
def test_gemv_matches_int8_reference(k, n, epilogue):
    rng = np.random.default_rng(k + n)
    packed, scale, bias = _quantized_linear(rng, k, n)
    x = _activations(rng, k)
    dev = tvm.cpu()
    acts = [tvm.runtime.tensor(a, dev) for a in _quantize(x)]
    y = tvm.runtime.tensor(np.zeros((1, 1, n), "float32"), dev)
    _build(q.q4_int8_gemv(n, k, "float16", epilogue))(*acts,
                                                      *(tvm.runtime.tensor(a, dev) for a in (packed, scale, bias)),
                                                       y)
    got = y.numpy().reshape(-1)
    want = q.reference_np(x, packed, scale, bias, epilogue)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # against the float computation the difference is the activations' quantization: there,
    # and small (per-group int8: well under 2 % of the output range on these inputs)
    exact = x.astype("float64") @ dequantize_np(packed, scale) + bias
    if epilogue == "bias_gelu":
        exact = q.gelu_tanh_np(exact)
    err = np.abs(got - exact).max() / np.abs(exact).max()
    assert 1e-6 < err < 0.02


def test_gemv_prefetches_its_weight_stream():
    """The GEMV asks for the packed stream ``PREFETCH`` bytes ahead (once per cache line: 2
    per step of 4 blocks); ``prefetch=0`` builds it without. The results above are the
    prefetching kernel's, on shapes whose stream is shorter than the distance (clamped)."""
    def asm(func):
        return tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                           target=resolve_target({"kind": "llvm", "mcpu": "haswell"})).mod.inspect_source("asm")

    assert asm(q.q4_int8_gemv(16, 256)).count("prefetcht0") == 2
    assert "prefetch" not in asm(q.q4_int8_gemv(16, 256, prefetch=0))


VNNI_TARGETS = {"avx512vnni": {"kind": "llvm", "mcpu": "cascadelake"}, "avxvnni": {"kind": "llvm", "mcpu": "alderlake"}}


@pytest.mark.parametrize("kind", sorted(VNNI_TARGETS))
def test_vnni_form_assembles_to_vpdpbusd(kind):
    """On VNNI targets the module's AVX2 GEMV is rebuilt (``for_target``) with vpdpbusd in place of
    vpmaddubsw/vpmaddwd; compiled here, run only where the host has VNNI (next test)."""
    target = resolve_target(VNNI_TARGETS[kind])
    assert q.isa_for(target) == "vnni"
    avx2 = q.q4_int8_gemv(16, 256).with_attr("global_symbol", "main")
    func = q.for_target(avx2, target)
    assert list(func.attrs["tvm_ext.q4_int8_gemv"])[-1] == "vnni" and func.attrs["global_symbol"] == "main"
    asm = tvm.compile(tvm.IRModule({"main": func}), target=target).mod.inspect_source("asm")
    assert "vpdpbusd" in asm and "vpmaddubsw" not in asm
    assert q.for_target(func, resolve_target({"kind": "llvm", "mcpu": "znver3"})).attrs[
        "tvm_ext.q4_int8_gemv"][-1] == "avx2"


@pytest.mark.skipif(q.isa_for(TARGET) != "vnni", reason="this host has no VNNI")
@pytest.mark.parametrize("epilogue", ["bias", "bias_gelu"])
def test_vnni_form_matches_int8_reference(epilogue):
    k, n = 256, 48
    rng = np.random.default_rng(7)
    packed, scale, bias = _quantized_linear(rng, k, n)
    x = _activations(rng, k)
    dev = tvm.cpu()
    acts = [tvm.runtime.tensor(a, dev) for a in _quantize(x)]
    y = tvm.runtime.tensor(np.zeros((1, 1, n), "float32"), dev)
    _build(q.q4_int8_gemv(n, k, "float16", epilogue, isa="vnni"))(
        *acts, *(tvm.runtime.tensor(a, dev) for a in (packed, scale, bias)), y)
    want = q.reference_np(x, packed, scale, bias, epilogue)
    np.testing.assert_allclose(y.numpy().reshape(-1), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("k,n", [(96, 8), (32, 8), (64, 0)])
def test_bad_shapes(k, n):
    with pytest.raises(ValueError, match="multiple of 64"):
        q.q4_int8_gemv(n, k)


def test_bad_epilogue_and_targets():
    with pytest.raises(ValueError, match="epilogue"):
        q.q4_int8_gemv(8, 64, epilogue="relu")
    with pytest.raises(ValueError, match="isa"):
        q.q4_int8_gemv(8, 64, isa="avx512")
    for spec in ({"kind": "llvm", "mcpu": "nehalem"}, {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, "cuda"):
        with pytest.raises(ValueError, match="AVX2"):
            q.check_target(spec)


@needs_avx2
def test_reduced_decode_int8_against_reference():
    """One decode step of the reduced Phi-2 (2 layers) with compute="int8": logits within the
    quantization's error of the float64 reference, and the same greedy token."""
    from tvm_ext.bench.phi2_e2e import decoder
    from tvm_ext.workloads import phi2_model as pm

    model = pm.build_model("reduced", 2, capacity=8, seed=3, compute="int8")
    names = {gv.name_hint for gv, _ in model.mod.functions_items()}
    assert any(nm.startswith("q4_int8_gemv") for nm in names) and not any("dequantize" in nm for nm in names
                                                                           if nm != "embed_lookup")
    dec = decoder(model, "llvm", "none")
    past = dec.fill_past(4, seed=1, keep=True)
    ids, logits = dec.generate([5], 2, start=4)
    ref_ids, ref_logits = pm.reference_generate(model, [5], 2, past=past, follow=ids)
    for got, want in zip(logits, ref_logits):
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 0.05, err
    assert ids[0] == ref_ids[0]


def test_int8_compute_bad_inputs():
    from tvm import relax

    from tvm_ext.workloads.phi2_layers import projector

    bb = relax.BlockBuilder()
    with pytest.raises(ValueError, match="compute must be one of"):
        projector(bb, "float32", "int4")
    with pytest.raises(ValueError, match="float32"):
        projector(bb, "float16", "int8")
