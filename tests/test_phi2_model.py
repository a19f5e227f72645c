"""Whole-model Phi-2 decode (tvm_ext.workloads.phi2.model) on the reduced config (hidden 256,
4 heads x 64, MLP 1024, vocab 1024, 2 layers): greedy generation on the Relax VM, with the
KV cache written in place, matches the NumPy float64 reference of the whole model step by
step (float32 compute: rtol = atol = 2e-3 on the logits, same generated ids); the e2e bench
dict and the ``generate`` command.  Unscheduled kernels in the default run (LLVM compiles
them in a second); dlight and the dequantize-GEMV rule under -m slow.  No timing asserted."""
import json

import numpy as np
import tvm_ffi
import pytest

tvm = pytest.importorskip("tvm")

from tvm_ext.bench.phi2 import decode as phi2_e2e  # noqa: E402
from tvm_ext.cli.main import main  # noqa: E402
from tvm_ext.workloads.phi2 import compiled, model as pm  # noqa: E402
from tvm_ext.workloads.phi2.layers import rope_inv_freq  # noqa: E402

TOL = 2e-3
PAST, PROMPT, TOKENS = 3, [5, 811, 300], 3


@pytest.fixture(scope="module")
def model():
    return pm.build_model("reduced", layers=2, capacity=PAST + len(PROMPT) + TOKENS - 1, seed=1)


@pytest.fixture(scope="module")
def decoder(model):
    return pm.Decoder(model, tvm.compile(model.mod, target="llvm"))


def _check(dec, model, past, start):
    ids, logits = dec.generate(PROMPT, TOKENS, start=start)
    ref_ids, ref_logits = pm.reference_generate(model, PROMPT, TOKENS, past=past, follow=ids)
    assert ids == ref_ids
    for got, want in zip(logits, ref_logits):
        np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)
    # each step attends to a different cache: the logits move from step to step
    assert not np.allclose(logits[0], logits[1], atol=1e-2)
    return ids


def test_generate_matches_reference_with_random_past(decoder, model):
    past = decoder.fill_past(PAST, seed=2, keep=True)
    assert len(past) == model.layers and past[0][0].shape == (1, PAST, 4, 64)
    _check(decoder, model, past, PAST)
    # the cache was written in place: layer 1's key at the prompt's first position is the
    # reference's rotated key of that token
    k_cache = decoder.caches[1][0].numpy()
    np.testing.assert_array_equal(k_cache[:, :PAST], past[1][0])
    assert np.abs(k_cache[:, PAST:PAST + len(PROMPT) + TOKENS - 1]).min(axis=(2, 3)).max() > 0


def test_generate_from_empty_cache_matches_reference(decoder, model):
    decoder.fill_past(0)
    _check(decoder, model, None, 0)


def test_cache_overflow_and_empty_requests(decoder, model):
    with pytest.raises(ValueError, match="context overflow"):
        decoder.generate(PROMPT, TOKENS, start=PAST + 1)
    with pytest.raises(ValueError, match="at least 1 token"):
        decoder.generate(PROMPT, 0)
    with pytest.raises(ValueError, match="context overflow"):
        decoder.fill_past(model.capacity + 1)
    with pytest.raises(ValueError, match="layers"):
        pm.build_model("reduced", layers=0)
    with pytest.raises(ValueError, match="config"):
        pm.build_model("tiny")
    with pytest.raises(ValueError, match="context overflow"):
        pm.build_model("reduced", capacity=pm.MAX_POSITIONS + 1)


def test_one_compiled_layer_with_weights_as_parameters(model):
    layer = model.mod["layer"]
    # x, two caches, position, then 18 weights: no weight bound as a constant (the one constant is the
    # rotary frequencies' table, the same in every layer)
    assert len(layer.params) == 4 + 2 + 4 * 3
    args = [a for blk in layer.body.blocks for b in blk.bindings if isinstance(b.value, tvm.relax.Call)
            for a in (b.value.args[1].fields if len(b.value.args) > 1 else [])]
    consts = [a.value.numpy() for a in args if isinstance(a, type(tvm.relax.const(1.0)))]
    assert args and consts and all(np.array_equal(c, rope_inv_freq(pm.CONFIGS["reduced"]["rotary"])) for c in consts)
    labels = phi2_e2e.kernel_labels(model.mod)
    assert {"qkv", "dense", "fc2", "embed"} <= set(labels.values())
    assert any("fc1" in v for v in labels.values()) and any("lm_head" in v for v in labels.values())


def test_decode_e2e_dict():
    doc = phi2_e2e.decode_e2e("reduced", layers=1, tokens=2, context=4, schedule="none", log=lambda m: None,
                              bandwidth_mb=64)
    assert doc["layers"] == 1 and doc["tokens"] == 2 and len(doc["generated"]) == 2
    assert doc["tok_s"] > 0 and doc["bound_tok_s"] > 0 and doc["bandwidth_gbs"] > 0
    cfg = pm.CONFIGS["reduced"]
    one_layer = (cfg["hidden"] * (3 + 1) * cfg["hidden"] + 2 * cfg["hidden"] * cfg["mlp"]) // 2  # q4 bytes
    assert one_layer < doc["weight_bytes"] < 2 * (one_layer + cfg["hidden"] * cfg["vocab"] // 2)
    assert doc["kv_bytes"] == pm.build_model("reduced", layers=1, capacity=6).kv_bytes(5.5)
    assert abs(sum(k["share"] for k in doc["kernels"]) - 1.0) < 1e-9
    assert {"qkv", "fc2", "embed"} <= {k["label"] for k in doc["kernels"]}


def test_rounds_interleave_the_rows_and_the_peers():
    """Each round times every row, then each peer; a row's share of the bound is in each round's own
    bound, its ratio to each peer the median of the rounds' ratios; the table names both peers' ratios."""
    from tvm_ext.cli.generate import format_table

    calls = []
    peers = {"llama.cpp": lambda: calls.append("llama.cpp") or 50.0, "openvino": lambda: calls.append("ov") or 25.0}
    rows = phi2_e2e.decode_e2e_rows(("none", "rule"), "reduced", layers=1, tokens=2, context=4, rounds=3,
                                    log=lambda m: None, bandwidth_mb=64, peer=peers)
    assert calls == ["llama.cpp", "ov"] * 3 and rows[0]["peers_tok_s_rounds"]["openvino"] == [25.0] * 3
    assert rows[0]["peer_tok_s_rounds"] == [50.0] * 3  # the first peer's, as with one
    for r in rows:
        assert len(r["tok_s_rounds"]) == 3 == len(r["bound_tok_s_rounds"])
        assert r["of_bound"] == pytest.approx(float(np.median(
            [t / b for t, b in zip(r["tok_s_rounds"], r["bound_tok_s_rounds"])])))
        median = float(np.median(r["tok_s_rounds"]))
        assert r["vs_peers"] == pytest.approx({"llama.cpp": median / 50.0, "openvino": median / 25.0})
        assert r["vs_peer"] == r["vs_peers"]["llama.cpp"]
        both = [{"tok_s": 50.0, "flash_attn": 0}, {"tok_s": 40.0, "flash_attn": 1}]  # a round: its best counts
        r["peers"] = [{"peer": "llama.cpp", "commit": "0c1e57098", "rows": both * 3},
                      {"peer": "openvino", "commit": "2026.4.1-1", "versions": {"openvino": "2026.4.1"},
                       "summary": "KV cache u8", "rows": [{"tok_s": 25.0}] * 3}]
    table = format_table(rows).splitlines()
    ov_line = next(ln for ln in table if ln.startswith("openvino (int4, OpenVINO 2026.4.1"))
    assert f"rule {rows[1]['vs_peers']['openvino']:.2f}x" in ov_line and ov_line.endswith("; KV cache u8")
    llama = next(ln for ln in table if ln.startswith("llama.cpp (Q4_0, commit 0c1e570, best of flash attention 0/1"))
    assert f"rule {rows[1]['vs_peer']:.2f}x" in llama and "50.00 tok/s" in llama and "(rounds: 50.0 50.0 50.0)" in llama


@pytest.mark.parametrize("argv, message", [
    (["--layers", "0"], "--layers: must be at least 1"),
    (["--tokens", "0"], "--tokens: must be at least 1"),
    (["--context", "2040", "--tokens", "16"], "context overflow"),
    (["--context", "-1"], "--context must be at least 0"),
    (["--context", "128,x"], "--context takes past positions (comma-separated), not '128,x'"),
    (["--context", "16,2040", "--tokens", "16"], "context overflow"),  # before the first context's run
    (["--context", "16,32", "--prompt", "8"], "--context takes one value here"),
])
def test_cli_bad_input(argv, message, capsys, tmp_path):
    out = tmp_path / "e2e.json"
    try:
        code = main(["generate", "--config", "reduced", "--out", str(out)] + argv)
    except SystemExit as exit_:  # argparse's own checks
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


@pytest.mark.slow  # dlight's GEMV schedules take ~30 s of LLVM on 2 cores at the reduced size
@pytest.mark.parametrize("how", ["dlight", "rule"])
def test_scheduled_generate_matches_reference(model, how):
    if how == "rule":
        pytest.importorskip("tvm_ext.rules.dequant_gemv")
    dec = phi2_e2e.decoder(model, "llvm", how)
    used = set(dec.rules.values())
    assert ("dequant_gemv" in used) == (how == "rule")
    assert "GEMV" in used or how == "rule"
    past = dec.fill_past(PAST, seed=2, keep=True)
    _check(dec, model, past, PAST)


@pytest.mark.slow  # ~15 s: two bandwidth measurements (512 MiB) and three builds
def test_cli_generate_json(tmp_path, capsys):
    out = tmp_path / "e2e.json"
    assert main(["generate", "--config", "reduced", "--layers", "1", "--tokens", "2", "--context", "3",
                 "--schedule", "none", "--json", "--out", str(out), "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(out.read_text())
    assert {"layers", "tokens", "tok_s", "bound_tok_s", "kernels", "schedule", "device"} <= set(doc)
    # two rows of one run: the second decoder shares the first one's weights and past
    assert main(["generate", "--config", "reduced", "--layers", "1", "--tokens", "2", "--context", "3",
                 "--schedule", "none,none", "--quiet", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "tokens/s" in table and "% of bound" in table and "qkv" in table
    one, two = json.loads(out.read_text())
    assert one["generated"] == two["generated"] == doc["generated"]
    assert main(["generate", "--config", "reduced", "--schedule", "none,bogus"]) == 2


def test_rule_schedules_gemv_layer_norm_attention_and_dlight_the_rest(model):
    pytest.importorskip("tvm_ext.rules.dequant_gemv")
    from tvm_ext.targets import resolve_target

    mod, used = compiled.schedule(model.mod, resolve_target("llvm"), "rule")
    labels = phi2_e2e.kernel_labels(model.mod)
    assert {n for n, how in used.items() if how == "dequant_gemv"} == set(labels) - {"embed_lookup"}
    # LayerNorm and softmax by our row-normalization schedule (dlight's CPU Reduction recomputes
    # LayerNorm's statistics per output), attention by our contraction schedule
    assert used["layer_norm"] == used["softmax"] == "row_norm_cpu" and "kv_write" not in used
    assert used["attn_score"] == used["attn_value"] == "contraction_cpu"
    for name in labels:
        if name != "embed_lookup":
            assert not tvm_ffi.structural_equal(mod[name], model.mod[name])


def test_tuned_takes_database_records_and_our_rules_elsewhere(model, tmp_path):
    from tvm_ext.bench.phi2 import kernels as pk
    from tvm_ext.targets import resolve_target
    from tvm_ext.tune.kernels import kernel_database
    from tvm_ext.tune.seeds import seed_database

    target = resolve_target("llvm")
    # a database holding one record: the unscheduled layer_norm (the empty-trace seed)
    m = pk.normalize(model.mod["layer_norm"])
    seed_database(kernel_database(str(tmp_path)), {"layer_norm": m}, {"layer_norm": ("none", None)},
                  target, {"layer_norm": 1e-3})
    mod, used = compiled.schedule(model.mod, target, "tuned", database=str(tmp_path))
    assert used["layer_norm"] == "tuned" and used["softmax"] == "row_norm_cpu" and used["rope"] == "injective_cpu"
    tvm.ir.assert_structural_equal(mod["layer_norm"].body, model.mod["layer_norm"].body)
    with pytest.raises(ValueError, match="no tuning database"):
        compiled.schedule(model.mod, target, "tuned", database=str(tmp_path / "missing"))


@pytest.mark.slow  # ~25 s: a bandwidth measurement and a build per context
def test_cli_generate_runs_each_context(tmp_path, capsys):
    """``--context 3,5``: one run per context in one command, the rows of both in the JSON, a table each."""
    out = tmp_path / "e2e.json"
    assert main(["generate", "--config", "reduced", "--layers", "1", "--tokens", "2", "--context", "3,5",
                 "--schedule", "none", "--quiet", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "16 tokens" not in table and "2 tokens after 3 past positions" in table
    assert "2 tokens after 5 past positions" in table
    rows = json.loads(out.read_text())
    assert [r["context"] for r in rows] == [3, 5] and all(r["tok_s"] > 0 for r in rows)

