"""tvm-ext verify-gpu and build-only on tiny tasks (needs nvcc, no GPU)."""
import json
import shutil

import pytest

from tvm_ext.check import verify_gpu
from tvm_ext.cli import main
from tvm_ext.targets import cuda_target

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")

# TVM 0.27's CUDA codegen writes an int8/uint8 broadcast of 8 or 16 lanes (and int16x8)
# as make_uint4(...) with one argument per lane, which nvcc rejects; the vector is 16
# bytes, so a width check accepts it. Reported to the owner of VerifyGPUCode.
KNOWN_CODEGEN_BUG = "too many arguments in function call"


def test_select_tasks():
    tasks = [(f"t{i}", 1, None) for i in range(10)]
    assert verify_gpu.select_tasks(tasks, None) == tasks
    assert [t[0] for t in verify_gpu.select_tasks(tasks, "3")] == ["t0", "t4", "t9"] or \
        [t[0] for t in verify_gpu.select_tasks(tasks, "3")] == ["t0", "t5", "t9"]
    assert [t[0] for t in verify_gpu.select_tasks(tasks, "1,t7")] == ["t1", "t7"]
    with pytest.raises(ValueError):
        verify_gpu.select_tasks(tasks, "nope")


def test_unknown_workload_is_one_line(capsys):
    assert main(["verify-gpu", "no-such-workload", "--samples", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown workload" in err[0]


def test_resume_without_out_is_one_line(capsys):
    assert main(["verify-gpu", "conv2d-int8", "--resume"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--resume needs --out" in err[0]


@needs_nvcc
def test_verify_gpu_conv2d_int8(tmp_path, capsys):
    out = tmp_path / "v.json"
    rc = main(["verify-gpu", "conv2d-int8", "--samples", "4", "--image", "8", "--json", "--out", str(out)])
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(out.read_text())
    assert {"arch", "samples_per_task", "total", "tasks"} <= set(doc)
    cells = {"accepted_compiles", "accepted_fails", "rejected_compiles", "rejected_fails", "agree_with_builtin"}
    assert cells <= set(doc["total"])
    assert doc["arch"] == "sm_80" and doc["samples_per_task"] == 4
    task = doc["tasks"][0]
    assert cells <= set(task) and task["samples"] == sum(task[c] for c in verify_gpu.CELLS)
    assert 0 <= doc["total"]["agree_with_builtin"] <= doc["total"]["samples"]
    assert set(task["timing"]["per_candidate"]) == {"sample", "verify_ours", "verify_builtin", "codegen"}
    assert doc["nvcc"]["done"] == doc["nvcc"]["distinct_sources"] <= doc["total"]["samples"]
    # runs are added to the committed (merged) document; a task twice is refused
    merged = verify_gpu.merge([doc])
    assert merged["tasks"][0]["workload"] == "conv2d-int8" and merged["total"] == doc["total"]
    assert verify_gpu.merge([merged])["total"] == doc["total"]
    with pytest.raises(ValueError, match="more than one document"):
        verify_gpu.merge([merged, doc])
    if doc["total"]["accepted_fails"]:
        errors = [e["nvcc"] for e in task["examples"]["accepted_fails"]]
        assert rc == 1
        if all(KNOWN_CODEGEN_BUG in e for e in errors):
            pytest.xfail(f"known TVM codegen bug (int8 broadcast > 4 lanes) accepted: {errors[0]}")
        pytest.fail(f"accepted but nvcc fails: {errors}")
    assert rc == 0


@needs_nvcc
def test_out_is_kept_per_task_and_resume_runs_only_the_missing_tasks(tmp_path, monkeypatch):
    """--out holds every finished task; --resume keeps them and runs the rest; task i
    samples with seed + i whichever tasks are selected, so the candidates are the same."""
    (name, weight, mod), = verify_gpu.workload_tasks("conv2d-int8", cuda_target("sm_80"), image=8)
    monkeypatch.setattr(verify_gpu, "workload_tasks", lambda *a, **k: [("a", weight, mod), ("b", weight, mod)])
    out, fresh, cache = tmp_path / "run.json", tmp_path / "fresh.json", str(tmp_path / "nvcc")
    opts = {"samples": 3, "nvcc_cache": cache}

    only_b = verify_gpu.run("conv2d-int8", tasks="1,", out=str(out), progress=None, **opts)
    assert json.loads(out.read_text()) == only_b
    assert only_b["complete"] and [t["task"] for t in only_b["tasks"]] == ["b"]
    assert only_b["tasks"][0]["seed"] == 1

    lines = []
    resumed = verify_gpu.run("conv2d-int8", out=str(out), resume=True, progress=lines.append, **opts)
    assert "1 resumed" in lines[0] and not any(ln.startswith("[") and " b" in ln for ln in lines)
    assert [t["task"] for t in resumed["tasks"]] == ["a", "b"] and resumed["complete"]
    assert resumed["tasks"][1] == only_b["tasks"][0]  # taken from the file, not rerun
    assert resumed["total"]["samples"] == 6 and json.loads(out.read_text()) == resumed

    def verdicts(task):
        return {k: v for k, v in task.items() if k not in ("timing", "seconds")}
    whole = verify_gpu.run("conv2d-int8", out=str(fresh), progress=None, **opts)
    assert [verdicts(t) for t in whole["tasks"]] == [verdicts(t) for t in resumed["tasks"]]

    with pytest.raises(ValueError, match="other settings"):
        verify_gpu.run("conv2d-int8", out=str(out), resume=True, progress=None, samples=4, nvcc_cache=cache)


@needs_nvcc
@pytest.mark.slow
def test_verify_gpu_batched_nvcc_gives_the_same_document_as_one_run_per_candidate():
    """Every cell, reason, error count and example (with nvcc's error text) is the same
    whether candidates are compiled one per nvcc run or batched."""
    def outcomes(batch):
        doc = verify_gpu.run("conv2d-int8", samples=12, image=8, batch=batch, progress=None)
        assert doc["nvcc"]["batch"] == batch
        return [{k: v for k, v in t.items() if k not in ("timing", "seconds")} for t in doc["tasks"]], doc
    one, _ = outcomes(1)
    batched, doc = outcomes(16)
    assert batched == one
    assert doc["nvcc"]["batch_runs"] >= 1, doc["nvcc"]  # the batched path was taken


def _requantize_func():
    from kernels import requantize_primfunc

    return requantize_primfunc(64, 32)


def test_build_only_llvm_tiny_task():
    from tvm_ext.check.build_only import build_only
    from tvm_ext.targets import resolve_target

    rows = build_only([("requantize", _requantize_func())], resolve_target("llvm"), "plugin", 2)
    assert len(rows) == 1
    row = rows[0]
    assert {"task", "kernels", "candidates", "build_failures"} <= set(row)
    assert row["task"] == "requantize" and row["candidates"] >= 1
    assert row["build_failures"] == 0 and row["kernels"] == 1


@needs_nvcc
def test_build_only_cuda_tiny_task():
    from tvm_ext.check.build_only import build_only
    from tvm_ext.targets import resolve_target

    logged = []
    rows = build_only({"requantize": _requantize_func()}, resolve_target("cuda-sm80"), "plugin", 1, logged.append)
    row = rows[0]
    assert row["candidates"] == 1 and row["build_failures"] == 0
    assert row["kernels"] == 1
    assert logged and "requantize" in logged[0]
