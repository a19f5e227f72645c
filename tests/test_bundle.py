"""tvm_ext.bundle: build here, time there (issue 50).

The rehearsal builds a real bundle (the CPU stand-in: the same code path for llvm), unpacks the archive
as it travels, runs the shipped runner in a fresh Python that can import TVM's runtime only, SIGKILLs it
at random moments, resumes it, and imports the results twice.  The fast one is small (one conv task, two
Phi-2 kernels, two candidates per rule set); the slow one is larger and, where this host has Python 3.12
and its wheels (``TVM_EXT_WHEELS312``: TVM, tvm-ffi, NumPy), runs under the lent machine's Python.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tvm_ext.bundle import inputs, plan, rehearse, runner
from tvm_ext.bundle.tolerance import check_output


def check_rehearsal(out: dict) -> None:
    assert out["exit"] == 0, out["stderr"]  # (a runner that cannot start: its first row says why)
    assert out["tvm_libraries"] == ["tvm_runtime"]  # the compiler library was never loaded
    assert out["snapshots_lost"] == 0 and out["duplicates"] == 0  # a kill loses and repeats nothing
    assert not out["missing"], out["missing"]
    assert not out["failed"], out["failed"]  # every variant matched its reference on the stand-in
    assert out["imported"]["committed"] > 0 and out["imported"]["failed"] == 0
    assert out["imported_again"]["committed"] == 0  # idempotent


def test_rehearsal_small(tmp_path):
    out = rehearse.rehearse(str(tmp_path / "b"), resnet={"workload": "conv2d-int8", "image": 8, "channels": 16},
                            phi2={"config": "reduced", "context": 16}, kernels=1, candidates=2, kills=1,
                            log=lambda m: None)
    check_rehearsal(out)
    assert out["items"] >= 6 and min(out["lines_at_kills"]) > 0  # killed while it worked


@pytest.mark.slow
def test_rehearsal_resnet_s8_and_phi2_reduced(tmp_path):
    """Four ResNet-50 (s8) tasks at 32x32, every reduced Phi-2 kernel, three rule sets, five kills; under
    Python 3.12 from wheels where ``TVM_EXT_WHEELS312`` names a folder holding them."""
    wheels, python = os.environ.get("TVM_EXT_WHEELS312"), sys.executable
    if wheels:  # TVM_EXT_PYTHON312: the interpreter (a pyenv shim of an inactive version does not run)
        python = os.environ.get("TVM_EXT_PYTHON312") or shutil.which("python3.12")
        if not python or subprocess.run([python, "-c", "pass"]).returncode != 0:
            pytest.fail("TVM_EXT_WHEELS312 is set but no runnable python3.12 (set TVM_EXT_PYTHON312)")
    out = rehearse.rehearse(str(tmp_path / "b"), resnet={"workload": "resnet50-int8-s8", "batch": 1, "image": 32},
                            phi2={"config": "reduced", "context": 16}, rulesets=("plugin", "no-inline-const",
                                                                                  "upstream"),
                            tasks=4, candidates=3, kills=5, python=python, wheels=wheels,
                            log=print)
    check_rehearsal(out)
    if wheels:
        assert out["python"].startswith("3.12")


def test_inputs_are_the_same_bits_everywhere():
    a = inputs.make_array((3, 4), "uint32", 7, 0, 2**32 - 1)
    assert a.dtype == np.uint32 and a[0, 0] == inputs.make_array((1,), "uint32", 7, 0, 2**32 - 1)[0]
    # SplitMix64 of state 7 + golden ratio, as its reference implementation gives it
    z = (7 + 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    assert int(inputs.splitmix64(1, 7)[0]) == z ^ (z >> 31)
    s8 = inputs.make_array((1000,), "int8", 1, -127, 127)
    assert s8.min() >= -127 and s8.max() <= 127 and len(set(s8.tolist())) > 200
    f = inputs.make_array((1000,), "float16", 2, -1.0, 1.0)
    assert f.dtype == np.float16 and f.min() >= -1 and f.max() <= 1


def test_a_torn_last_line_is_dropped_and_attempts_are_counted(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"kind": "attempt", "id": "a"}\n{"id": "b", "kind": "kernel", "ok": true}\n'
                    '{"kind": "attempt", "id": "a"}\n{"id": "a", "ki')
    res = runner.Results(str(path))
    assert res.done == {"b"} and res.attempts == {"a": 2}
    res.write({"id": "c", "kind": "kernel", "ok": False, "error": "x"})
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[-1])["id"] == "c"


def test_the_runner_stops_before_its_deadline_and_says_so(tmp_path):
    """A manifest whose first item would run past the deadline: one 'stopped' row, exit 0, nothing run."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    for name in ("inputs.py", "tolerance.py"):
        shutil.copy(os.path.join(os.path.dirname(runner.__file__), name), bundle / name)
    (bundle / "manifest.json").write_text(json.dumps({"name": "t", "device": "cpu", "items": [
        {"id": "k", "kind": "bandwidth", "est_s": 1000.0}]}))
    results = tmp_path / "r.jsonl"
    assert runner.main([str(bundle), "--results", str(results), "--deadline", "60"]) == 0
    rows = [json.loads(x) for x in results.read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["device", "stopped"]


def test_a_missing_cuda_runtime_is_the_first_row_and_exit_3(tmp_path, monkeypatch):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text(json.dumps({"name": "t", "device": "cuda", "items": []}))
    monkeypatch.setattr(runner, "open_device", lambda kind: (_ for _ in ()).throw(
        RuntimeError("TVM's CUDA runtime (libtvm_runtime_cuda) does not load: libcuda.so.1")))
    results = tmp_path / "r.jsonl"
    assert runner.run(str(bundle), str(results), until=1e12, log=lambda m: None) == 3
    row = json.loads(results.read_text().splitlines()[0])
    assert row["kind"] == "device" and not row["ok"] and "libtvm_runtime_cuda" in row["error"]


@pytest.mark.skipif(__import__("ctypes.util").util.find_library("cuda") is not None, reason="a CUDA driver is here")
def test_without_a_cuda_driver_the_runner_says_so_first(tmp_path):
    """The real device check (no stub): TVM's CUDA sidecar cannot load without libcuda.so.1."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text(json.dumps({"name": "t", "device": "cuda", "items": []}))
    results = tmp_path / "r.jsonl"
    assert runner.run(str(bundle), str(results), until=1e12, log=lambda m: None) == 3
    row = json.loads(results.read_text().splitlines()[0])
    assert not row["ok"] and "libcuda.so.1" in row["error"], row


def test_the_order_puts_the_seed_rows_first_and_rounds_of_candidates_after():
    def k(task, label, rank, ruleset="", exp="resnet50-int8-s8"):
        return {"id": f"{exp}/{task}/{label}", "kind": "kernel", "experiment": exp, "task_index": task,
                "label": label, "rank": rank, "ruleset": ruleset, "lib": f"libs/{task}.so", "bytes": 10**6,
                "out_bytes": 10**5}
    items = [k(0, "plugin_c1", 2, "plugin"), k(1, "upstream_c0", 1, "upstream"), k(0, "untuned", 0),
             k(1, "untuned", 0), k(0, "plugin_c0", 1, "plugin"), k(5, "dlight", 0, exp="phi2-decode")]
    peers = [{"id": "peer/a", "peer": "resnet50"}, {"id": "peer/b", "peer": "phi2_decode"}]
    m = plan.order(items, peers, "cuda")
    assert [i["id"].split("/", 1)[-1] for i in m["items"]] == [
        "bandwidth", "5/dlight", "0/untuned", "1/untuned", "a", "0/plugin_c0", "1/upstream_c0", "0/plugin_c1", "b"]
    est = plan.estimate(m)
    assert abs(est["total_s"] - m["estimate_s"]) < 0.1 and est["margin"] > 0
    assert "margin" in plan.table(est)


def test_cli_bad_input_is_one_line(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "tvm_ext", "bundle", "import", str(tmp_path / "none.jsonl"),
                          "--bundle", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert "not a bundle built here" in bad.stderr.strip().splitlines()[-1]


def test_float_and_exact_checks_used_by_the_runner():
    ref = np.linspace(-1, 1, 64).astype("float32")
    assert check_output(ref.astype("float16"), ref, 64)[0]
    assert not check_output(np.full(64, np.nan, "float16"), ref, 64)[0]  # a poisoned, never written output
