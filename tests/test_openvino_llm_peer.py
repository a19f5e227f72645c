"""OpenVINO's int4 LLM path as the Phi-2 peer (tvm_ext/bench/phi2/openvino_llm.py, openvino_worker.py): the
slice that makes the exported graph compute the last token's logits only, its one-line errors, and (-m slow, with
the [openvino-llm] extra) the export and the run on the reduced model. No test asserts a timing."""
import numpy as np
import pytest

from tvm_ext.bench.phi2 import openvino_llm as ovl
from tvm_ext.bench.phi2 import openvino_worker as worker
from tvm_ext.cli import main


def _head_model(ov, tokens_dim=-1):
    """x [1, T, 8] -> MatMul by W [16, 8]^T -> Add bias -> logits [1, T, 16]: the tail of an exported LM."""
    from openvino import opset13 as ops

    rng = np.random.default_rng(0)
    x = ops.parameter([1, tokens_dim, 8], np.float32, name="x")
    w, b = rng.standard_normal((16, 8)).astype("float32"), rng.standard_normal(16).astype("float32")
    logits = ops.add(ops.matmul(x, ops.constant(w), False, True), ops.constant(b))
    return ov.Model([ops.result(logits)], [x]), w, b


def test_last_token_slice_gives_the_last_rows_logits():
    ov = pytest.importorskip("openvino")
    model, w, b = _head_model(ov)
    worker._last_token_logits(model)
    x = np.random.default_rng(1).standard_normal((1, 5, 8)).astype("float32")
    got = ov.Core().compile_model(model, "CPU")({"x": x})[0]
    assert got.shape == (1, 1, 16)
    np.testing.assert_allclose(got[0, 0], x[0, -1] @ w.T + b, rtol=1e-5, atol=1e-5)


def test_a_graph_without_a_matmul_before_its_output_is_refused():
    ov = pytest.importorskip("openvino")
    from openvino import opset13 as ops

    x = ops.parameter([1, 4], np.float32, name="x")
    with pytest.raises(ValueError, match="no MatMul before the logits output"):
        worker._last_token_logits(ov.Model([ops.result(ops.relu(x))], [x]))


def test_the_peers_shapes_are_our_models():
    cfg = ovl.hf_config("full")
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"], cfg["vocab_size"]) == \
        (2560, 10240, 32, 51200)
    assert cfg["partial_rotary_factor"] * 80 == 32 and not cfg["tie_word_embeddings"]
    with pytest.raises(ValueError, match="config must be one of"):
        ovl.hf_config("huge")


def test_missing_extra_is_one_line_before_the_run(monkeypatch, capsys):
    monkeypatch.setattr(ovl, "NEEDS", ("openvino", "no_such_package_xyz.sub"))
    assert main(["generate", "--config", "reduced", "--layers", "1", "--prompt", "8", "--peers", "openvino"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--peers openvino needs no_such_package_xyz.sub: pip install -e '.[openvino-llm]'" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_failing_worker_is_one_line(tmp_path):
    pytest.importorskip("openvino")
    prepared = {"model": tmp_path / "missing", "vocab": 16, "versions": {}}
    with pytest.raises(ValueError, match=r"OpenVINO run failed \(exit 1\): .*") as err:
        ovl.run_peer(prepared, prompts=(4,), threads=1, log=lambda m: None)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_export_and_run_on_the_reduced_model(tmp_path):
    for name in ovl.NEEDS:
        pytest.importorskip(name)
    logs = []
    prepared = ovl.prepare_peer(tmp_path, logs.append, config="reduced", layers=1)
    assert prepared["export_s"] > 0 and any("exporting" in m for m in logs)
    rows = ovl.run_peer(prepared, prompts=(16,), threads=1, repetitions=1, decode=(2, 8), log=logs.append)
    elements = prepared["weight_elements"]  # every projection, the embedding and lm_head in int4, a scale per 32
    d, m, v = 256, 1024, 1024
    assert elements["i4"] == 2 * v * d + 4 * d * d + 2 * d * m, elements
    assert elements["f16"] >= elements["i4"] // 32
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in rows] == [(16, 0, 0), (0, 2, 8)]
    assert all(r["tok_s"] > 0 for r in rows)
    record = ovl.peer_record(prepared, rows, "run")
    assert record["properties"]["INFERENCE_NUM_THREADS"] == "1" and "KV cache" in record["summary"]
    again = ovl.prepare_peer(tmp_path, logs.append, config="reduced", layers=1)
    assert again["export_s"] is None  # reused, not exported twice
