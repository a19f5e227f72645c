"""The one-function Phi-2 decode step (tvm_ext.workloads.phi2.step) and its GPU decode (bench.phi2.decode_gpu).

On the CPU: the step computes what the per-layer decoder computes (same logits, same tokens), its kernels
are the per-layer model's (one PrimFunc per distinct kernel, not one per layer), and decode_gpu's rows run
end to end on llvm.  For CUDA (nvcc, no GPU): the full step builds with every kernel scheduled and the VM
replays all of it but the last kernel as one CUDA graph."""
import json
import shutil

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm_ext.bench.phi2 import decode_gpu  # noqa: E402
from tvm_ext.workloads.phi2.compiled import decoder, schedule  # noqa: E402
from tvm_ext.targets import resolve_target  # noqa: E402
from tvm_ext.workloads.phi2 import model as pm  # noqa: E402
from tvm_ext.workloads.phi2 import step as st  # noqa: E402

CPU = resolve_target("llvm")


def _prim_names(mod):
    return sorted(gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc))


def test_the_step_computes_what_the_layer_by_layer_decoder_computes():
    step_model = st.build_step("reduced", capacity=12, dtype="float32", gpu=False)
    layer_model = pm.build_model("reduced", capacity=12)
    assert len(_prim_names(step_model.mod)) == len(_prim_names(layer_model.mod))  # one kernel per kind, not per layer
    mod, _ = schedule(step_model.mod, CPU, "rule")
    one = st.StepDecoder(step_model, st.compile_step(mod, CPU))
    per_layer = decoder(layer_model, CPU, "rule")
    one.fill_past(5, seed=3)
    per_layer.fill_past(5, seed=3)
    for pos, token in ((5, 3), (6, 17), (7, 250)):
        np.testing.assert_allclose(one.step(token, pos), per_layer.step(token, pos), rtol=1e-5, atol=1e-5)
    assert one.generate([9], 3, start=8)[0] == per_layer.generate([9], 3, start=8)[0]
    with pytest.raises(ValueError, match="no compiled prefill"):
        one.prefill([1, 2])


def test_the_fp16_step_generates_the_float32_steps_tokens():
    """The GPU's model (q4f16_1: fp16 activations, caches, biases) run on this CPU, kernels as built: the
    same greedy tokens as the float32 model from the same weights and past, logits within fp16's error."""
    out = {}
    for dtype in ("float32", "float16"):
        model = st.build_step("reduced", capacity=24, dtype=dtype, gpu=False)
        dec = st.StepDecoder(model, st.compile_step(schedule(model.mod, CPU, "none")[0], CPU))
        dec.fill_past(8, seed=1)
        out[dtype] = dec.generate([5], 12, start=8)
    assert out["float16"][0] == out["float32"][0]
    first32, first16 = out["float32"][1][0], out["float16"][1][0]
    assert np.abs(first16 - first32).max() < 0.05 * np.abs(first32).max()


def test_decode_rows_run_on_the_cpu():
    rows = decode_gpu.decode_gpu_rows(("rule",), config="reduced", tokens=3, context=6, target="llvm", rounds=2,
                                      log=lambda msg: None, bandwidth_mb=16, peer=lambda: 10.0)
    (row,) = rows
    assert row["schedule"] == "rule" and len(row["generated"]) == 3 and len(row["tok_s_rounds"]) == 2
    assert 0 < row["of_bound"] and row["dtype"] == "float32" and row["cuda_graph"] is False
    assert row["peer_tok_s_rounds"] == [10.0, 10.0] and row["vs_peer"] > 0

    def broken_peer():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    said = []
    (row,) = decode_gpu.decode_gpu_rows(("rule",), config="reduced", tokens=2, context=6, target="llvm", rounds=1,
                                        log=said.append, bandwidth_mb=16, peer=broken_peer)
    assert "vs_peer" not in row and any("peer left out" in s for s in said)  # our row still counts
    with pytest.raises(ValueError, match="on a GPU the schedules are"):
        decode_gpu.decode_gpu_rows(("int8",), config="reduced", target="llvm")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_the_cuda_step_builds_as_one_graph(capsys):
    from tvm_ext.cli.main import main

    assert main(["generate", "--target", "cuda-sm80", "--build-only", "--config", "reduced", "--tokens", "8",
                 "--context", "8", "--json", "--quiet"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert {how: b["cuda_graph_regions"] for how, b in built.items()} == {"dlight": 1, "rule": 1}
    assert built["rule"]["rules"]["attn_value"] == "contraction_cuda"
    assert sum(r == "dequant_gemv_cuda" for r in built["rule"]["rules"].values()) == 5  # qkv, o, fc1, fc2, lm_head


def test_generate_on_a_gpu_target_without_one_says_so_in_one_line(capsys):
    from tvm_ext.cli.main import main

    if tvm.cuda(0).exist:
        pytest.skip("a GPU is here")
    for extra, said in (([], "no CUDA device here"), (["--peers", "llama.cpp"], "on a GPU --peers takes torch"),
                        (["--prompt", "8"], "no --prompt or --tune yet"),
                        (["--target", "llvm", "--build-only"], "--build-only is for a GPU --target")):
        assert main(["generate", "--target", "cuda", "--config", "reduced", *extra]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1
