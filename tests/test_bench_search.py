"""``tvm-ext bench-search``: the JSON document of a tiny run, and one line for bad flags.

No timing is asserted here (timings never in tests): only that every configuration was
measured, with candidates, per-postproc costs and the ratios the table in docs/guide.md reads."""
import json

import pytest

from tvm_ext.cli import main

TINY = ["--rounds", "1", "--population", "4", "--init-min-unmeasured", "4", "--candidates", "2",
        "--postproc-samples", "2", "--threads", "1", "--space-reps", "1", "--quiet"]


def test_tiny_run_writes_one_row_per_configuration(tmp_path, capsys):
    out = tmp_path / "search-cost.json"
    assert main(["bench-search", "--targets", "cuda,llvm", *TINY, "--json", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == doc
    assert [t["kind"] for t in doc["target"]] == ["cuda", "llvm"]
    assert doc["settings"]["population"] == 4 and doc["settings"]["rounds"] == 1
    keys = {(r["task"], r["target"], r["space"], r["threads"]) for r in doc["rows"]}
    assert keys == {("seed", t, s, 1) for t in ("cuda", "llvm") for s in ("plugin", "upstream")}
    for row in doc["rows"]:
        assert len(row["seconds_all"]) == 1 and row["seconds"] > 0
        # a population of 4 may find no valid CUDA candidate ("cannot sample enough initial
        # population"): that is a batch of 0, counted as such
        assert row["candidates"] >= (1 if row["target"] == "llvm" else 0)
        # the search tried at least the batch it returned (and at least a population)
        assert row["sampled_all"][0] >= max(row["candidates"], 4) and row["ms_per_sample"] > 0
        assert row["per_postproc_ms"] and all(v is None or v >= 0 for v in row["per_postproc_ms"].values())
    cuda_posts = {r["space"]: set(r["per_postproc_ms"]) for r in doc["rows"] if r["target"] == "cuda"}
    assert "VerifyGPUCode(tvm_ext)" in cuda_posts["plugin"] and "VerifyGPUCode" in cuda_posts["upstream"]
    assert {(r["target"], r["threads"]) for r in doc["ratios"]} == {("cuda", 1), ("llvm", 1)}
    for ratio in doc["ratios"]:  # the two factors of the ratio: sampled x ms per sample
        assert ratio["sampled_ratio"] > 0 and ratio["ms_per_sample_ratio"] > 0
    assert doc["settings"]["space_reps"] == 1
    for row in doc["rows"]:
        assert row["space_generation_ms"] > 0 and row["sketches"] >= 1
        # our Python rules are timed in the plugin space; TVM's own space has none
        assert bool(row["rule_ms"]) == (row["space"] == "plugin")
        assert set(row["rule_ms"]) == set(row["rule_calls"])


def test_new_task_times_our_rules_per_design_space_generation(capsys):
    # phi2's q4 decode GEMV on llvm: our block-attr, constant-scalar and DequantGEMV rules
    assert main(["bench-search", "--tasks", "phi2-decode-gemv", "--targets", "llvm", *TINY,
                 "--postproc-samples", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["space"]: r for r in doc["rows"]}
    assert set(rows) == {"plugin", "upstream"} and all(r["task"] == "phi2-decode-gemv" for r in rows.values())
    plugin = rows["plugin"]
    assert {"ApplyBlockAttrRule", "InlineConstantScalars", "DequantGEMV"} <= set(plugin["rule_ms"])
    assert all(ms >= 0 for ms in plugin["rule_ms"].values())
    # every block of the GEMV went through our rules at least once
    assert all(n >= 1 for n in plugin["rule_calls"].values())
    assert plugin["space_generation_ms"] > 0 and rows["upstream"]["rule_ms"] == {}
    assert plugin["candidates"] >= 1


def test_task_list_names_every_task():
    from tvm_ext.bench.search_tasks import TASKS, task_names

    assert set(TASKS) == {"seed", "resnet-conv-heavy", "resnet-conv-residual", "phi2-decode-gemv",
                          "phi2-prefill-matmul"}
    assert task_names(["all"]) == tuple(TASKS)
    assert task_names(["seed", "all", "seed"]) == tuple(TASKS)


def test_table_names_the_ratio(capsys):
    assert main(["bench-search", "--targets", "llvm", *TINY, "--postproc-samples", "0"]) == 0
    text = capsys.readouterr().out
    assert "plugin/upstream" in text and "seed" in text


@pytest.mark.parametrize("flags, message", [
    (["--targets", "rocm"], "unknown target 'rocm'"),
    (["--tasks", "nope"], "unknown task 'nope'; choose from seed, resnet-conv-heavy, resnet-conv-residual, "
                          "phi2-decode-gemv, phi2-prefill-matmul or all"),
    (["--space-reps", "-1"], "--space-reps must be 0 or more"),
    (["--threads", "x"], "--threads takes comma-separated integers"),
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["--threads", "0"], "--threads must be positive"),
])
def test_bad_flags_are_one_line(flags, message, capsys):
    assert main(["bench-search", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


@pytest.mark.parametrize("flags, seeds", [([], [5, 6]), (["--same-seed"], [5, 5])])
def test_round_r_searches_with_seed_plus_r_unless_same_seed(monkeypatch, capsys, flags, seeds):
    """Both spaces get the same seed in a round; rounds differ unless --same-seed."""
    from tvm_ext.bench import search_cost

    used = []

    def fake(mod, target, ruleset, **kw):
        used.append((ruleset, kw["seed"]))
        return 1.0, 2, 10

    monkeypatch.setattr(search_cost, "generate_once", fake)
    args = ["bench-search", "--targets", "llvm", "--rounds", "2", "--seed", "5", "--threads", "1",
            "--postproc-samples", "0", "--space-reps", "0", "--quiet", "--json", *flags]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["settings"]["seeds"] == seeds
    assert sorted(used) == sorted((s, seed) for seed in seeds for s in ("plugin", "upstream"))
