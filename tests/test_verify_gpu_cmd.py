"""tvm-ext verify-gpu and build-only on tiny tasks (needs nvcc, no GPU)."""
import json
import shutil

import pytest

from tvm_ext.check import verify_gpu
from tvm_ext.check.verify_gpu_doc import CELLS, merge
from tvm_ext.cli import main
from tvm_ext.targets import cuda_target

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")

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
    rc = main(["verify-gpu", "conv2d-int8", "--samples", "3", "--image", "8", "--json", "--out", str(out)])
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(out.read_text())
    assert {"arch", "samples_per_task", "total", "tasks"} <= set(doc)
    cells = {"accepted_compiles", "accepted_fails", "rejected_compiles", "rejected_fails", "agree_with_builtin"}
    assert cells <= set(doc["total"])
    assert doc["arch"] == "sm_80" and doc["samples_per_task"] == 3
    task = doc["tasks"][0]
    assert cells <= set(task) and task["samples"] == sum(task[c] for c in CELLS)
    for r in (task, doc["total"]):  # agreement is what the two verdicts' tallies say
        assert r["agree_with_builtin"] == r["samples"] - sum(r["disagreements"].values())
        ours_accepts = r["accepted_compiles"] + r["accepted_fails"]
        builtin_accepts = r["builtin"]["accepted_compiles"] + r["builtin"]["accepted_fails"]
        only_ours = r["disagreements"].get("ours accepts, built-in rejects", 0)
        assert ours_accepts - builtin_accepts == 2 * only_ours - sum(r["disagreements"].values())
        assert r["builtin"]["accepted_compiles"] + r["builtin"]["rejected_compiles"] == \
            r["accepted_compiles"] + r["rejected_compiles"]  # same nvcc outcome per candidate
    assert set(task["timing"]["per_candidate"]) == {"sample", "verify_ours", "verify_builtin", "codegen"}
    assert doc["nvcc"]["done"] == doc["nvcc"]["distinct_sources"] <= doc["total"]["samples"]
    # runs are added to the committed (merged) document; a task twice is refused
    merged = merge([doc])
    assert merged["tasks"][0]["workload"] == "conv2d-int8" and merged["total"] == doc["total"]
    assert merge([merged])["total"] == doc["total"]
    with pytest.raises(ValueError, match="more than one document"):
        merge([merged, doc])
    # nothing we accept fails nvcc, including TVM's narrow-integer broadcasts (int8x8,
    # int8x16, int16x8 written as make_*4 with one argument per lane, which nvcc rejects):
    # VerifyGPUCode rejects those as vector_width:broadcast
    errors = [e["nvcc"] for e in task.get("examples", {}).get("accepted_fails", [])]
    assert doc["total"]["accepted_fails"] == 0, errors
    assert rc == 0


@needs_nvcc
@pytest.mark.slow  # three verify-gpu runs with nvcc: ~45 s
def test_out_is_kept_per_task_and_resume_runs_only_the_missing_tasks(tmp_path, monkeypatch):
    """--out holds every finished task; --resume keeps them and runs the rest; task i
    samples with seed + i whichever tasks are selected, so the candidates are the same."""
    (name, weight, mod), = verify_gpu.workload_tasks("conv2d-int8", cuda_target("sm_80"), image=8)
    monkeypatch.setattr(verify_gpu, "workload_tasks", lambda *a, **k: [("a", weight, mod), ("b", weight, mod)])
    out, fresh, cache = tmp_path / "run.json", tmp_path / "fresh.json", str(tmp_path / "nvcc")
    opts = {"samples": 2, "nvcc_cache": cache}

    only_b = verify_gpu.run("conv2d-int8", tasks="1,", out=str(out), progress=None, **opts)
    assert json.loads(out.read_text()) == only_b
    assert only_b["complete"] and [t["task"] for t in only_b["tasks"]] == ["b"]
    assert only_b["tasks"][0]["seed"] == 1

    lines = []
    resumed = verify_gpu.run("conv2d-int8", out=str(out), resume=True, progress=lines.append, **opts)
    assert "1 resumed" in lines[0] and not any(ln.startswith("[") and " b" in ln for ln in lines)
    assert [t["task"] for t in resumed["tasks"]] == ["a", "b"] and resumed["complete"]
    assert resumed["tasks"][1] == only_b["tasks"][0]  # taken from the file, not rerun
    assert resumed["total"]["samples"] == 4 and json.loads(out.read_text()) == resumed

    def verdicts(task):
        return {k: v for k, v in task.items() if k not in ("timing", "seconds")}
    whole = verify_gpu.run("conv2d-int8", out=str(fresh), progress=None, **opts)
    assert [verdicts(t) for t in whole["tasks"]] == [verdicts(t) for t in resumed["tasks"]]

    with pytest.raises(ValueError, match="other settings"):
        verify_gpu.run("conv2d-int8", out=str(out), resume=True, progress=None, samples=3, nvcc_cache=cache)


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
    from tir_kernels import requantize_primfunc

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


def _doc():
    task = {"task": "fused_conv2d_add", "samples": 4, "accepted_compiles": 2, "accepted_fails": 0,
            "rejected_compiles": 1, "rejected_fails": 1, "agree_with_builtin": 3, "agreement": 0.75}
    total = {**task, "reasons": {"vthread": 1, "shared_memory": 1}, "rejected_compiles_reasons": {"vthread": 1},
             "disagreements": {"ours rejects (vthread), built-in accepts": 1},
             "builtin": {"accepted_compiles": 3, "accepted_fails": 0, "rejected_compiles": 0, "rejected_fails": 1}}
    return {"workload": "conv2d-int8", "arch": "sm_80", "samples_per_task": 4, "tasks": [task], "total": total}


def test_verify_gpu_table_columns_line_up():
    from tvm_ext.cli.verify_gpu import format_table

    lines = format_table(_doc()).splitlines()
    header, rule, row, _, total = lines[1:6]
    assert header.split() == ["task", "n", "acc+ok", "acc+FAIL", "rej+ok", "rej+fail", "agree"]
    assert set(rule) == {"-"} and len(rule) >= len(row)
    assert row.split() == ["fused_conv2d_add", "4", "2", "0", "1", "1", "75.0%"]
    assert total.split()[0] == "total" and len(total) == len(row)  # right-aligned to the same width
    assert "vthread" in lines[9] and "policy" in lines[9]  # the reason's note
    assert "agreement with TVM's built-in VerifyGPUCode: 3/4 (75.0%)" in lines


def test_table_rejects_rows_of_the_wrong_width():
    from tvm_ext.cli.table import render

    assert render(["a", "b"], [["x", None]]).splitlines()[2] == "x  -"
    with pytest.raises(ValueError, match="2 cells, the header 3"):
        render(["a", "b", "c"], [["x", 1]])
    with pytest.raises(ValueError, match="align"):
        render(["a", "b"], [], align="<")


def test_json_written_atomically(tmp_path):
    """A document that cannot be written leaves the previous file whole and no temp file."""
    from tvm_ext.jsonio import write_json

    path = tmp_path / "sub" / "doc.json"
    write_json(str(path), {"tasks": [1]})
    assert json.loads(path.read_text()) == {"tasks": [1]}
    with pytest.raises(TypeError):
        write_json(str(path), {"tasks": [1, object()]})
    assert json.loads(path.read_text()) == {"tasks": [1]}
    assert [p.name for p in path.parent.iterdir()] == ["doc.json"]
