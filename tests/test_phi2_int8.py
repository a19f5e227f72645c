"""The ``int8`` compute option of the Phi-2 model: its projections quantize their activations per
token and group of 32 and run the q4 x int8 GEMM (workloads/phi2/q4_int8_gemm.py, one token in a decode
step), scheduled by rules/q4_int8_gemm.py.

A reduced Phi-2 decode with ``compute="int8"`` is compared with the float64 reference (the error is
the quantization's: small, not zero); bad computes and targets get one ValueError.
"""
import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm_ext.targets import has_avx2, resolve_target  # noqa: E402

TARGET = resolve_target("llvm")
needs_avx2 = pytest.mark.skipif(not has_avx2(TARGET), reason="this host has no AVX2")


@needs_avx2
def test_reduced_decode_int8_against_reference():
    """One decode step of the reduced Phi-2 (2 layers) with compute="int8": every projection is the
    int8 GEMM (no dequantize), scheduled by Q4Int8GEMM; logits within the quantization's error of
    the float64 reference, and the same greedy token."""
    from tvm_ext.bench.phi2.decode import decoder
    from tvm_ext.workloads.phi2 import model as pm

    model = pm.build_model("reduced", 2, capacity=8, seed=3, compute="int8")
    names = {gv.name_hint for gv, _ in model.mod.functions_items()}
    assert any(nm.startswith("q4_int8_gemm") for nm in names) and not any("dequantize" in nm for nm in names
                                                                           if nm != "embed_lookup")
    dec = decoder(model, "llvm", "int8")
    gemms = {nm: how for nm, how in dec.rules.items() if nm.startswith("q4_int8_gemm")}
    assert gemms and set(gemms.values()) == {"q4_int8_gemm"}, dec.rules
    past = dec.fill_past(4, seed=1, keep=True)
    ids, logits = dec.generate([5], 2, start=4)
    ref_ids, ref_logits = pm.reference_generate(model, [5], 2, past=past, follow=ids)
    for got, want in zip(logits, ref_logits):
        err = np.abs(got - want).max() / np.abs(want).max()
        assert 0 < err < 0.05, err
    assert ids[0] == ref_ids[0]


def test_int8_compute_bad_inputs():
    from tvm import relax

    from tvm_ext.workloads.phi2.layers import projector
    from tvm_ext.workloads.phi2.q4_int8_gemm import check_target

    bb = relax.BlockBuilder()
    with pytest.raises(ValueError, match="compute must be one of"):
        projector(bb, "float32", "int4")
    with pytest.raises(ValueError, match="float32"):
        projector(bb, "float16", "int8")
    for spec in ({"kind": "llvm", "mcpu": "nehalem"}, {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, "cuda"):
        with pytest.raises(ValueError, match="AVX2"):
            check_target(spec)
