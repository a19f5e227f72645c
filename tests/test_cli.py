"""tvm-ext tune / report / bench: bad input, resume, interruption, exactness.

Every command runs in-process through ``tvm_ext.cli.main`` (the console script's entry
point; ``cli_run.cli``); the Ctrl-C test is test_cli_interrupt.py.  One
database is tuned per module (``tuned``) and shared by the tests that only read it; it
sits where ``bench --logs-dir`` looks for the plugin row, so the bench test reuses it.
"""
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import tvm

from cli_run import SMALL, TUNED, cli, one_error_line, tuned_conv2d
from tvm_ext.tune.packed import read_bytes


@pytest.mark.parametrize("args,message", [
    (["tune", "resnet18-int8"], "unknown workload 'resnet18-int8'"),
    (["tune", "conv2d-int8", "--ruleset", "fastest"], "unknown ruleset 'fastest'"),
    (["tune", "conv2d-int8", "--target", '{"kind": "llvm"'], "malformed target JSON"),
    (["bench", "conv2d-int8", "--rulesets", "plugin,nope"], "unknown ruleset 'nope'"),
    (["bench", "conv2d-int8", "--rulesets", "plugin,upstream@tpu"], "unknown target 'tpu'"),
    (["bench", "conv2d-int8", "--peers", "tensorrt"], "unknown peer 'tensorrt'"),
    (["bench", "conv2d-int8", "--beside", "nope"], "unknown workload 'nope'"),
    (["prune", "/nonexistent-work-dir"], "/nonexistent-work-dir: no such directory"),
    (["bench", "conv2d-int8", "--beside", "phi2-decode"], "--beside takes the built-in int8 networks"),
    (["bench", "phi2-decode", "--beside", "conv2d-int8"], "--beside is for the int8 networks"),
    (["bench", "phi2-decode", "--rounds", "0"], "--rounds must be at least 1"),
    (["bench", "conv2d-int8", "--breakdown", "-1"], "--breakdown must be a number of runs"),
    (["bench", "conv2d-int8", "--warm", "-2"], "--warm must be a number of runs"),
    (["report", "/nonexistent/dir"], "/nonexistent/dir"),
    (["check-rules", "--cases", "softmax,nope"], "unknown case(s) nope"),
    (["check-rules", "--cases", "softmax", "--target", "cuda"], "needs an llvm target"),
])
def test_bad_input_is_one_clear_line(args, message):
    one_error_line(args, message)


@pytest.mark.parametrize("args,message", [
    (["tune", "conv2d-int8", "--trials", "many"], "tvm-ext tune: error: argument --trials: "),
    (["tune", "conv2d-int8", "--trials", "0"], "tvm-ext tune: error: argument --trials: "),
    (["frobnicate"], "tvm-ext: error: argument COMMAND: invalid choice: 'frobnicate'"),
    (["tune"], "tvm-ext tune: error: the following arguments are required: workload"),
])
def test_argparse_errors_end_with_one_clear_line(args, message):
    """argparse's own errors: exit code 2 and one line (no usage block) that names the
    refused value and points to --help."""
    code, out, err = cli(*args, check=False)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith(message) and "--help" in line, err
    if "--trials" in args:
        assert repr(args[args.index("--trials") + 1]) in line or f" {args[-1]} (" in line, err


def test_work_dir_that_is_not_a_database(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    one_error_line(["tune", "conv2d-int8", *SMALL, "--work-dir", str(tmp_path)],
                   "not a tvm_ext tuning database")
    assert os.listdir(tmp_path) == ["notes.txt"]  # refused before writing anything


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """conv2d-int8 tuned for 2 trials, in the directory bench --logs-dir uses for 'plugin': this module's
    copy of the session's database (``cli_run.tuned_conv2d``, tuned once for every xdist worker)."""
    made = tuned_conv2d(tmp_path_factory)
    work_dir = str(tmp_path_factory.mktemp("logs") / TUNED)
    shutil.copytree(made / TUNED, work_dir)
    return work_dir, json.loads((made / "out.json").read_text()), (made / "err.txt").read_text()


def test_tune_writes_a_database_and_report(tuned):
    work_dir, result, progress = tuned
    assert "[1/1]" in progress and "0/2 trials, tuning 2" in progress
    assert result["workload"] == "conv2d-int8" and result["ruleset"] == "plugin"
    (task,) = result["tasks"]
    assert task["trials"] == 2 and task["weight"] == 1
    assert task["best_us"] > 0 and task["kernels"] >= 1
    assert result["e2e_us"] == pytest.approx(task["best_us"])
    assert task["tuning_s"] > 0 and result["tuning_s"] == task["tuning_s"]
    records = os.path.join(work_dir, "database_tuning_record.json")
    with open(records) as f:
        assert len([line for line in f if line.strip()]) == 2  # the report counts the file
    report = json.loads(cli("report", work_dir, "--json")[1])
    assert report == result
    assert {"workload", "target", "ruleset", "tasks", "e2e_us"} <= set(report)


def test_rerun_resumes_without_new_trials(tuned, monkeypatch):
    work_dir, result, _ = tuned

    def no_pool(*args, **kwargs):
        raise AssertionError("a runner or builder was started with nothing to tune")

    for name in ("make_runner", "make_builder"):  # started only for trials left (~5 s each)
        monkeypatch.setattr(f"tvm_ext.tune.driver.{name}", no_pool)
    _, out, err = cli("tune", "conv2d-int8", *SMALL, "--trials", "2", "--work-dir", work_dir, "--json")
    assert "already in the database" in err
    again = json.loads(out)
    assert again["tasks"][0]["trials"] == 2
    assert again["tuning_s"] == result["tuning_s"]  # kept, nothing added


def test_database_for_another_workload_is_refused(tuned, monkeypatch):
    work_dir, _, _ = tuned
    code, _, err = cli("tune", "conv2d-int8", "--image", "10", "--work-dir", work_dir, check=False)
    assert code == 2 and "was made for options" in err
    monkeypatch.setattr("tvm_ext.cli.tune.check_device", lambda *a, **k: None)  # as on a GPU machine
    code, _, err = cli("tune", "conv2d-int8", *SMALL, "--target", "cuda-sm80", "--work-dir", work_dir,
                       check=False)
    assert code == 2 and "target kind" in err


@pytest.mark.skipif(tvm.cuda(0).exist, reason="this machine has a GPU")
@pytest.mark.parametrize("args, ways", [
    (["tune", "conv2d-int8", "--target", "cuda"], "--build-only (compile every candidate with nvcc, run nothing) "
                                                  "or --rpc-tracker HOST:PORT"),
    (["bench", "conv2d-int8", "--target", "cuda-sm90", "--from-logs"], "--build-only"),
])
def test_cuda_without_a_gpu_is_refused_at_once(args, ways, tmp_path, monkeypatch):
    """Not minutes of tuning whose every candidate fails to load (issue 37)."""
    monkeypatch.chdir(tmp_path)
    one_error_line(args, f"for cuda needs a GPU, and this machine has none; use {ways}")
    assert os.listdir(tmp_path) == []  # refused before anything was written


@pytest.mark.parametrize("mcpu, hint", [("bogus", "unknown mcpu 'bogus'"), ("znver", "did you mean znver5, znver4")])
def test_unknown_mcpu_is_refused(mcpu, hint):
    """LLVM only logs an error and compiles for a generic CPU: a typo would cost a whole run (issue 37)."""
    one_error_line(["tune", "conv2d-int8", "--target", json.dumps({"kind": "llvm", "mcpu": mcpu})], hint)


def test_partial_write_is_repaired(tuned, tmp_path):
    work_dir, _, _ = tuned
    copy = str(tmp_path / "copy")
    shutil.copytree(work_dir, copy)
    with open(os.path.join(copy, "database_tuning_record.json"), "a") as f:
        f.write('[0, [[["GetSBlock", [], ["conv')  # what a kill in mid-write leaves
    report = json.loads(cli("report", copy, "--json")[1])
    assert report["tasks"][0]["trials"] == 2


def test_database_schedules_every_tuned_function(tuned):
    """The compiled network uses the database: every tuned PrimFunc comes out scheduled."""
    from tvm_ext import tune as tuning, workloads
    from tvm_ext.targets import resolve_target

    work_dir, _, _ = tuned
    workload = workloads.get("conv2d-int8", image=8, batch=1, seed=0)
    mod = tuning.apply_database(workload, resolve_target("llvm"), work_dir)
    funcs = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert funcs and all(f.attrs.get("tirx.is_scheduled") for f in funcs)


def test_bench_checks_exactness_and_writes_json(tuned, tmp_path):
    work_dir, tuned_result, _ = tuned
    logs_dir = os.path.dirname(work_dir)
    out = tmp_path / "bench.json"
    _, stdout, _ = cli("bench", "conv2d-int8", *SMALL, "--rulesets", "plugin,upstream@llvm-generic",
                       "--trials", "2", "--rounds", "1", "--logs-dir", logs_dir, "--out", str(out),
                       "--peers", "ort", "--layers")
    result = json.loads(out.read_text())
    assert {"workload", "target", "trials_per_task", "rows", "per_layer"} <= set(result)
    assert [r["ruleset"] for r in result["rows"]] == ["plugin", "upstream@llvm-generic", "ort"]
    # the plugin row resumed the module's database (no new trials); the @llvm-generic row is
    # tuned for plain {"kind": "llvm"} into its own directory
    assert result["rows"][0]["work_dir"] == work_dir
    assert json.loads(cli("report", work_dir, "--json")[1]) == tuned_result
    assert [r["target"] for r in result["rows"][:2]] == ["llvm", "llvm-generic"]
    assert result["rows"][1]["work_dir"].endswith("conv2d-int8-llvm-generic-upstream")
    generic = json.loads(cli("report", result["rows"][1]["work_dir"], "--json")[1])
    assert generic["target_detail"]["kind"] == "llvm" and "mcpu" not in generic["target_detail"]
    assert generic["ruleset"] == "upstream" and generic["tasks"][0]["trials"] == 2
    for row in result["rows"][:2]:
        assert row["exact_match"] is True and row["e2e_ms"] > 0 and row["untuned_tasks"] == 0
        # the conv2d workload is one conv task and nothing else: no time outside the convs
        assert row["non_conv_estimate_ms"] == 0.0 and row["e2e_estimate_ms"] > 0
    assert result["rows"][0]["ratio_to_plugin"] == 1.0
    ort = result["rows"][2]
    # ORT rounds its float multiplier differently: at most one uint8 step on one layer
    assert ort["e2e_ms"] > 0 and ort["exact_match"] == (ort["frac_differ"] == 0) and ort["max_step"] <= 1
    (layer,) = result["per_layer"]  # the one conv task, timed against one QLinearConv
    assert layer["shape"] == "1x8x8x64->64 k3s1" and layer["epilogue"] == "requantize"
    assert layer["tvm_us"] > 0 and layer["ort_us"] > 0 and layer["ruleset"] == "plugin"
    assert "vs plugin" in stdout and "tvm/ort" in stdout
    _, again, _ = cli("bench", "conv2d-int8", *SMALL, "--rulesets", "plugin", "--from-logs",
                      "--rounds", "1", "--logs-dir", logs_dir, "--out", str(out), "--peers", "ort")
    result = json.loads(out.read_text())  # the databases' budget, the peer row has none
    assert result["trials_per_task"] == 2 and [r["ruleset"] for r in result["rows"]] == ["plugin", "ort"]
    assert "ort" in again


def test_bench_and_tune_write_into_the_work_root_and_save_copies_out(tuned, tmp_path, monkeypatch):
    """A user's bench (tuning first) leaves tuning_logs/ alone: databases and JSON go to the
    git-ignored tvm_ext_work/; 'tvm-ext save' is the step that copies a result into
    tuning_logs/, compressed, and bench --from-logs reads it from there as it is."""
    work_dir, tuned_result, _ = tuned
    monkeypatch.chdir(tmp_path)
    os.makedirs("tuning_logs")
    shutil.copytree(work_dir, os.path.join("tvm_ext_work", "conv2d-int8-llvm-plugin"))  # tuned before
    cli("bench", "conv2d-int8", *SMALL, "--rulesets", "plugin", "--trials", "2", "--rounds", "1")
    assert os.listdir("tuning_logs") == []
    assert sorted(os.listdir("tvm_ext_work")) == ["bench-conv2d-int8-llvm.json", "conv2d-int8-llvm-plugin"]
    _, _, err = cli("save", os.path.join("tvm_ext_work", "conv2d-int8-llvm-plugin"),
                    os.path.join("tvm_ext_work", "bench-conv2d-int8-llvm.json"))
    saved = os.path.join("tuning_logs", "conv2d-int8-llvm-plugin")
    assert f"saved {os.path.join('tvm_ext_work', 'conv2d-int8-llvm-plugin')} as {saved}" in err
    assert sorted(os.listdir("tuning_logs")) == ["bench-conv2d-int8-llvm.json", "conv2d-int8-llvm-plugin"]
    assert "database_tuning_record.json.gz" in os.listdir(saved)
    assert json.loads(cli("report", saved, "--json")[1])["tasks"] == tuned_result["tasks"]
    out = tmp_path / "from-logs.json"
    cli("bench", "conv2d-int8", *SMALL, "--rulesets", "plugin", "--from-logs", "--rounds", "1", "--out", str(out))
    row = json.loads(out.read_text())["rows"][0]
    assert row["work_dir"] == saved and row["exact_match"] is True


def test_bench_times_another_workload_beside(tuned, tmp_path):
    """--beside: another built-in network (here the same one, through its own row) compiled with
    its plugin database, checked against its own reference, timed in the same rounds."""
    work_dir, _, _ = tuned
    out = tmp_path / "beside.json"
    _, stdout, _ = cli("bench", "conv2d-int8", *SMALL, "--rulesets", "plugin", "--from-logs", "--rounds", "1",
                       "--logs-dir", os.path.dirname(work_dir), "--out", str(out), "--beside", "conv2d-int8")
    rows = json.loads(out.read_text())["rows"]
    assert [r["ruleset"] for r in rows] == ["plugin", "conv2d-int8:plugin"]
    assert all(r["exact_match"] and r["e2e_ms"] > 0 and r["work_dir"] == work_dir for r in rows)
    assert "conv2d-int8:plugin" in stdout


def test_bench_warm_runs_have_their_own_column(tuned, tmp_path):
    """--warm: the runs right after each turn's first, timed apart: every row (ours and the peer's)
    gains warm_ms and its ratio to ours, and the table shows both."""
    work_dir, _, _ = tuned
    out = tmp_path / "warm.json"
    _, stdout, _ = cli("bench", "conv2d-int8", *SMALL, "--rulesets", "plugin", "--from-logs", "--rounds", "2",
                       "--logs-dir", os.path.dirname(work_dir), "--out", str(out), "--warm", "2", "--peers", "ort")
    result = json.loads(out.read_text())
    plugin, ort = result["rows"]
    assert result["warm_runs"] == 2 and plugin["warm_ratio_to_plugin"] == 1.0
    assert ort["warm_ratio_to_plugin"] == pytest.approx(ort["warm_ms"] / plugin["warm_ms"])
    assert all(r["warm_ms"] > 0 and r["e2e_ms"] > 0 for r in result["rows"])
    assert "warm ms" in stdout.splitlines()[1] and "the 2 runs after each first run" in stdout


def test_bench_breakdown_accounts_for_the_network(tuned, tmp_path):
    """--breakdown: the network's kernels timed inside it, matched to the tuning tasks, each beside
    its record; network = kernels inside + time between them, and the records sum to the estimate."""
    work_dir, tuned_result, _ = tuned
    out = tmp_path / "breakdown.json"
    _, stdout, _ = cli("bench", "conv2d-int8", *SMALL, "--rulesets", "plugin", "--from-logs", "--rounds", "1",
                       "--logs-dir", os.path.dirname(work_dir), "--out", str(out), "--breakdown", "3")
    found = json.loads(out.read_text())["breakdown"]
    (task,) = found["tasks"]  # the one conv task (conv + requantize, one kernel), called once
    assert task["task"] == tuned_result["tasks"][0]["name"] and task["calls"] == 1
    assert task["record_ms"] == pytest.approx(tuned_result["tasks"][0]["best_us"] / 1e3)
    assert task["in_network_ms"] > 0 and task["ratio"] == pytest.approx(task["in_network_ms"] / task["record_ms"])
    assert found["estimate_ms"] == pytest.approx(tuned_result["e2e_us"] / 1e3)
    assert found["kernels_ms"] == pytest.approx(task["in_network_ms"])
    assert found["outside_ms"] == pytest.approx(found["network_ms"] - found["kernels_ms"])
    assert found["runs"] == 3 and found["untuned_tasks"] == []
    assert "where the network's time goes" in stdout


def test_cuda_build_only_without_a_gpu():
    _, out, _ = cli("tune", "conv2d-int8", *SMALL, "--target", "cuda-sm80", "--build-only",
                    "--candidates", "2", "--json")
    result = json.loads(out)
    (row,) = result["tasks"]
    assert result["target"] == "cuda"
    assert row["kernels"] == 1  # conv + requantize epilogue in one kernel under plugin
    assert row["build_failures"] == 0


def test_bench_states_the_budget_a_database_was_tuned_to():
    """A database tuned to 64 trials holds 3 records on its pooling, reshape and layout tasks
    (their spaces have no more); the bench row says 64, and a cut-short database says what most
    of its tuned tasks reached."""
    from collections import Counter

    from tvm_ext.bench.int8 import tuned_trials

    # records per workload of a committed database, read as JSON lines (report() loads every
    # task through TVM: 20 s for this one)
    committed = Path(__file__).resolve().parents[1] / "tuning_logs"
    lines = read_bytes(str(committed / "onnx-resnet50-qdq-01b1b2e64a61-nchwc-llvm-plugin"
                           / "database_tuning_record.json"))
    counts = Counter(json.loads(line)[0] for line in lines.splitlines() if line.strip())
    tasks = [{"trials": n} for n in counts.values()]
    assert len(tasks) == 41 and min(t["trials"] for t in tasks) == 3 and tuned_trials(tasks) == 64
    assert tuned_trials([{"trials": 0}] * 20 + [{"trials": 8}] * 13 + [{"trials": 1}]) == 8
    assert tuned_trials([{"trials": 0}]) is None


@pytest.mark.parametrize("target, workload, why", [
    ({"kind": "llvm", "mcpu": "sapphirerapids"}, "resnet50-int8-amx", "AMX int8 tiles"),
    ({"kind": "llvm", "mcpu": "cascadelake"}, "resnet50-int8-nchwc", "VNNI (vpdpbusd) and no AMX"),
    ({"kind": "llvm", "mcpu": "haswell"}, "resnet50-int8-nchwc", "AVX2 without VNNI: vpmaddwd on int16 pairs"),
    ("cuda-sm80", "resnet50-int8-s8", "int8 tensor cores, which multiply s8 x s8"),
    ({"kind": "cuda", "arch": "sm_70"}, "resnet50-int8", "no int8 tensor cores before sm_72"),
])
def test_resnet50_int8_runs_the_hosts_int8_path(target, workload, why, capsys):
    """The main job's workload: --layout auto (the default) picks the int8 path the target runs
    best (issue 35) and says which and why; --layout nhwc is the seed's NHWC network."""
    from argparse import Namespace

    from tvm_ext.cli.common import builtin_name

    spec = target if isinstance(target, str) else json.dumps(target)
    assert builtin_name(Namespace(workload="resnet50-int8", layout="auto", target=spec)) == workload
    assert f"int8 path: {workload} (" in (err := capsys.readouterr().err) and why in err
    assert builtin_name(Namespace(workload="resnet50-int8", layout="nhwc", target=spec)) == "resnet50-int8"
    with pytest.raises(ValueError, match="--layout is for MODEL.onnx and resnet50-int8, not conv2d-int8"):
        builtin_name(Namespace(workload="conv2d-int8", layout="nchwc", target=spec))


# "another CPU" (transferred, re-measured) covers the path "this CPU" takes and more: the latter is -m slow
@pytest.mark.parametrize("tuned_for", [pytest.param("this CPU", marks=pytest.mark.slow), "another CPU"])
def test_tune_starts_from_the_saved_database(tuned_for, tuned, tmp_path, monkeypatch):
    """A saved database for this workload and rule set: copied when it was tuned for this CPU;
    from another CPU, its best schedules are measured here first (never trusted blindly) and the
    search goes on from them."""
    work_dir, _, _ = tuned
    monkeypatch.chdir(tmp_path)
    saved = os.path.join("tuning_logs", "conv2d-int8-llvm-plugin")
    shutil.copytree(work_dir, saved)
    if tuned_for == "another CPU":
        meta = json.loads(Path(saved, "tvm_ext.json").read_text())
        meta["target"]["mcpu"] = "cascadelake" if meta["target"].get("mcpu") != "cascadelake" else "icelake-server"
        Path(saved, "tvm_ext.json").write_text(json.dumps(meta))
    cli("save", saved)  # as the project keeps it: compressed
    _, out, err = cli("tune", "conv2d-int8", *SMALL, "--trials", "3", "--json")
    report = json.loads(out)
    assert report["tasks"][0]["trials"] == 3
    if tuned_for == "this CPU":
        assert f"starting from the records saved in {saved}" in err
        assert "1/3 trials" not in err and "2/3 trials, tuning 1" in err  # the saved two records, one more
    else:
        assert f"{saved} was tuned on another CPU" in err and "measured here first" in err
        assert "2 schedules transferred" in err and "2/3 trials, tuning 1" in err
        records = tuning_records(os.path.join("tvm_ext_work", "conv2d-int8-llvm-plugin"))
        saved_secs = {tuple(r.run_secs) for r in tuning_records(saved)}
        assert not {tuple(r.run_secs) for r in records[:2]} & saved_secs  # this machine's times, not the old
    assert os.listdir("tuning_logs") == ["conv2d-int8-llvm-plugin"]  # the saved database is left as it was


def tuning_records(work_dir):
    from tvm_ext import tune as tuning

    db = tuning.open_database(work_dir, read_only=True)
    return db.get_all_tuning_records()


def test_bench_times_openvino_beside_ort(tuned, tmp_path):
    """--peers ov: OpenVINO's CPU plugin runs the same network as ORT, exported in QDQ form (it
    reads no QLinearConv; on that it was up to 122 steps off where ORT is exact: session 18), in
    the same rounds, its output compared with the exact reference in uint8 steps (issue 35)."""
    work_dir, _, _ = tuned
    out = tmp_path / "ov.json"
    _, stdout, err = cli("bench", "conv2d-int8", *SMALL, "--rulesets", "plugin", "--from-logs", "--rounds", "2",
                         "--logs-dir", os.path.dirname(work_dir), "--out", str(out), "--peers", "ort,ov")
    rows = json.loads(out.read_text())["rows"]
    assert [r["ruleset"] for r in rows] == ["plugin", "ort", "ov"]
    ov = rows[2]
    assert ov["e2e_ms"] > 0 and ov["exact_match"] == (ov["frac_differ"] == 0) and ov["max_step"] <= 1
    assert rows[1]["max_step"] <= 1  # ORT: the same file, exact but for rounding
    assert ov["ov"]["version"] and ov["threads"] >= 1 and ov["ov"]["inference_precision"]
    assert "ov: output differs from the exact reference" in err and "\nov " in stdout
    import openvino.tools.ovc.telemetry_utils as ov_telemetry  # OpenVINO sends nothing from our process
    assert sys.modules.get("openvino_telemetry") is None and ov_telemetry.tm.__name__.endswith("telemetry_stub")
    code, _, err = cli("bench", "conv2d-int8", *SMALL, "--peers", "openvino", check=False)
    assert code == 2 and "unknown peer 'openvino'; known: ort, ov, tvm-onnx" in err
