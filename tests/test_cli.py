"""tvm-ext tune / report / bench from the shell: bad input, resume, interruption, exactness."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import tvm

SMALL = ["--image", "8", "--batch", "1"]


def cli(*args, check=True, timeout=900):
    proc = subprocess.run([sys.executable, "-m", "tvm_ext", *args], capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"tvm-ext {' '.join(args)} -> {proc.returncode}\n{proc.stderr[-3000:]}")
    return proc


@pytest.mark.parametrize("args,message", [
    (["tune", "resnet18-int8"], "unknown workload 'resnet18-int8'"),
    (["tune", "conv2d-int8", "--ruleset", "fastest"], "unknown ruleset 'fastest'"),
    (["tune", "conv2d-int8", "--target", '{"kind": "llvm"'], "malformed target JSON"),
    (["bench", "conv2d-int8", "--rulesets", "plugin,nope"], "unknown ruleset 'nope'"),
    (["bench", "conv2d-int8", "--rulesets", "plugin,upstream@tpu"], "unknown target 'tpu'"),
    (["bench", "conv2d-int8", "--peers", "tensorrt"], "unknown peer 'tensorrt'"),
    (["bench", "phi2-decode", "--rounds", "0"], "--rounds must be at least 1"),
    (["report", "/nonexistent/dir"], "not a tvm_ext tuning database"),
    (["check-rules", "--cases", "softmax,nope"], "unknown case(s) nope"),
    (["check-rules", "--cases", "softmax", "--target", "cuda"], "needs an llvm target"),
])
def test_bad_input_is_one_clear_line(args, message):
    proc = cli(*args, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_work_dir_that_is_not_a_database(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    proc = cli("tune", "conv2d-int8", *SMALL, "--work-dir", str(tmp_path), check=False)
    assert proc.returncode == 2 and "not a tvm_ext tuning database" in proc.stderr


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    work_dir = str(tmp_path_factory.mktemp("db") / "conv")
    first = cli("tune", "conv2d-int8", *SMALL, "--trials", "2", "--work-dir", work_dir, "--json")
    return work_dir, json.loads(first.stdout), first.stderr


def test_tune_writes_a_database_and_report(tuned):
    work_dir, result, progress = tuned
    assert "[1/1]" in progress and "tuning 2 trials" in progress
    assert result["workload"] == "conv2d-int8" and result["ruleset"] == "plugin"
    (task,) = result["tasks"]
    assert task["trials"] == 2 and task["weight"] == 1
    assert task["best_us"] > 0 and task["kernels"] >= 1
    assert result["e2e_us"] == pytest.approx(task["best_us"])
    assert task["tuning_s"] > 0 and result["tuning_s"] == task["tuning_s"]
    report = json.loads(cli("report", work_dir, "--json").stdout)
    assert report == result
    assert {"workload", "target", "ruleset", "tasks", "e2e_us"} <= set(report)


def test_rerun_resumes_without_new_trials(tuned):
    work_dir, result, _ = tuned
    again = cli("tune", "conv2d-int8", *SMALL, "--trials", "2", "--work-dir", work_dir, "--json")
    assert "already in the database" in again.stderr
    assert json.loads(again.stdout)["tasks"][0]["trials"] == 2
    assert json.loads(again.stdout)["tuning_s"] == result["tuning_s"]  # kept, nothing added


def test_database_for_another_workload_is_refused(tuned):
    work_dir, _, _ = tuned
    proc = cli("tune", "conv2d-int8", "--image", "10", "--work-dir", work_dir, check=False)
    assert proc.returncode == 2 and "was made for options" in proc.stderr
    proc = cli("tune", "conv2d-int8", *SMALL, "--target", "cuda-sm80", "--work-dir", work_dir,
               check=False)
    assert proc.returncode == 2 and "target kind" in proc.stderr


def test_partial_write_is_repaired(tuned, tmp_path):
    import shutil

    work_dir, _, _ = tuned
    copy = str(tmp_path / "copy")
    shutil.copytree(work_dir, copy)
    with open(os.path.join(copy, "database_tuning_record.json"), "a") as f:
        f.write('[0, [[["GetSBlock", [], ["conv')  # what a kill in mid-write leaves
    report = json.loads(cli("report", copy, "--json").stdout)
    assert report["tasks"][0]["trials"] == 2


def test_ctrl_c_leaves_a_valid_database_and_resume_finishes(tmp_path):
    work_dir = str(tmp_path / "interrupted")
    proc = subprocess.Popen([sys.executable, "-m", "tvm_ext", "tune", "conv2d-int8", *SMALL,
                             "--trials", "6", "--per-iter", "2", "--work-dir", work_dir],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    records = os.path.join(work_dir, "database_tuning_record.json")
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(records) and os.path.getsize(records) > 0:
            break
        time.sleep(1)
    assert proc.poll() is None, "tuning finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    assert "resume" in err
    partial = json.loads(cli("report", work_dir, "--json").stdout)["tasks"][0]
    assert 1 <= partial["trials"] < 6
    assert partial["tuning_s"] > 0  # the interrupted run's time is counted
    done = json.loads(cli("tune", "conv2d-int8", *SMALL, "--trials", "6", "--work-dir", work_dir,
                          "--json").stdout)
    assert done["tasks"][0]["trials"] == 6


def test_bench_checks_exactness_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = cli("bench", "conv2d-int8", *SMALL, "--rulesets", "plugin,upstream@llvm-generic", "--trials", "2",
               "--rounds", "3", "--logs-dir", str(tmp_path), "--out", str(out),
               "--peers", "ort", "--layers")
    result = json.loads(out.read_text())
    assert {"workload", "target", "trials_per_task", "rows", "per_layer"} <= set(result)
    assert [r["ruleset"] for r in result["rows"]] == ["plugin", "upstream@llvm-generic", "ort"]
    # the @llvm-generic row is tuned for plain {"kind": "llvm"} into its own directory
    assert [r["target"] for r in result["rows"][:2]] == ["llvm", "llvm-generic"]
    assert result["rows"][1]["work_dir"].endswith("conv2d-int8-llvm-generic-upstream")
    generic = json.loads(cli("report", result["rows"][1]["work_dir"], "--json").stdout)["target_detail"]
    assert generic["kind"] == "llvm" and "mcpu" not in generic
    for row in result["rows"][:2]:
        assert row["exact_match"] is True and row["e2e_ms"] > 0
    assert result["rows"][0]["ratio_to_plugin"] == 1.0
    ort = result["rows"][2]
    # ORT rounds its float multiplier differently: at most one uint8 step on one layer
    assert ort["e2e_ms"] > 0 and ort["exact_match"] is False and ort["max_step"] <= 1
    (layer,) = result["per_layer"]  # the one conv task, timed against one QLinearConv
    assert layer["shape"] == "1x8x8x64->64 k3s1" and layer["epilogue"] == "requantize"
    assert layer["tvm_us"] > 0 and layer["ort_us"] > 0 and layer["ruleset"] == "plugin"
    assert "vs plugin" in proc.stdout and "tvm/ort" in proc.stdout
    again = cli("bench", "conv2d-int8", *SMALL, "--rulesets", "plugin", "--from-logs", "--rounds", "2",
                "--logs-dir", str(tmp_path), "--out", str(out), "--peers", "ort")
    result = json.loads(out.read_text())  # the databases' budget, the peer row has none
    assert result["trials_per_task"] == 2 and [r["ruleset"] for r in result["rows"]] == ["plugin", "ort"]
    assert "ort" in again.stdout


def test_cuda_build_only_without_a_gpu():
    proc = cli("tune", "conv2d-int8", *SMALL, "--target", "cuda-sm80", "--build-only",
               "--candidates", "2", "--json")
    result = json.loads(proc.stdout)
    (row,) = result["tasks"]
    assert result["target"] == "cuda"
    assert row["kernels"] == 1  # conv + requantize epilogue in one kernel under plugin
    assert row["build_failures"] == 0


def test_database_schedules_every_tuned_function(tuned):
    """The compiled network uses the database: every tuned PrimFunc comes out scheduled."""
    from tvm_ext import tune as tuning, workloads
    from tvm_ext.targets import resolve_target

    work_dir, _, _ = tuned
    workload = workloads.get("conv2d-int8", image=8, batch=1, seed=0)
    mod = tuning.apply_database(workload, resolve_target("llvm"), work_dir)
    funcs = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    assert funcs and all(f.attrs.get("tirx.is_scheduled") for f in funcs)
