"""``tvm-ext verify-gpu --replay FILE``: the staged postproc against the verdicts a
verify-gpu document recorded, on the same candidates drawn again."""
import json

import pytest

from tvm_ext.check.verify_gpu_replay import same_reasons
from tvm_ext.cli import main


def _document(tmp_path, reasons, samples=6):
    doc = {"arch": "sm_80", "tasks": [{"workload": "conv2d-int8", "task": "fused_conv2d_nhwc_requantize",
                                       "seed": 0, "samples": samples, "reasons": reasons,
                                       "rejected_compiles_reasons": {}}]}
    path = tmp_path / "verify-gpu.json"
    path.write_text(json.dumps(doc))
    return path


def _recorded_reasons(samples=6):
    """What verify-gpu (the unstaged verdict, vthread policy on) says of the same draw."""
    import tvm_ext
    from tvm_ext.check.verify_gpu import workload_tasks
    from tvm_ext.postprocs.verify_gpu_code import VTHREAD_POLICY, target_limits, verify
    from tvm_ext.targets import cuda_target
    from tvm_ext.tune.sampling import sample_candidates, tune_context

    target = cuda_target("sm_80")
    (name, _w, mod), = workload_tasks("conv2d-int8", target)
    space = tvm_ext.space(target, "plugin")
    schs = sample_candidates(mod, target, space, samples, seed=0, context=tune_context(mod, target, space, name))
    reasons = {}
    for sch in schs:
        v = verify(sch.mod, target, target_limits(target), vthread_limit=VTHREAD_POLICY)
        if v is not None:
            reasons[v[0]] = reasons.get(v[0], 0) + 1
    return reasons


def test_replay_finds_the_same_candidates_and_compares_every_decision(tmp_path, capsys):
    path = _document(tmp_path, _recorded_reasons())
    out = tmp_path / "replay.json"
    assert main(["verify-gpu", "--replay", str(path), "--out", str(out), "--quiet", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(out.read_text()) and doc["complete"]
    (task,) = doc["tasks"]
    assert task["samples"] == 6 and task["same_candidates_as_committed"] and doc["same_candidates_as_committed"]
    rejected_staged = sum(task["reasons_staged"].values())
    assert rejected_staged + task["accepted_staged"] == 6
    # every moved decision was put to nvcc (none expected on this draw without a GPU-side change)
    assert doc["verdicts_moved"] == len(task["moved"]) and doc["accepted_and_fails"] == 0


def test_a_document_with_other_reasons_is_not_the_same_candidates(tmp_path, capsys):
    path = _document(tmp_path, {"shared_memory": 6})
    assert main(["verify-gpu", "--replay", str(path), "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["same_candidates_as_committed"] is False


@pytest.mark.parametrize("content, message", [
    (None, "no file"),
    ("{", "is not JSON"),
    ("[]", "is not a verify-gpu document"),
])
def test_bad_replay_files_are_one_line(tmp_path, capsys, content, message):
    path = tmp_path / "x.json"
    if content is not None:
        path.write_text(content)
    assert main(["verify-gpu", "--replay", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_replay_takes_no_workload(capsys):
    assert main(["verify-gpu", "resnet50-int8", "--replay", "x.json"]) == 2
    assert "give no WORKLOAD" in capsys.readouterr().err


def test_same_reasons_allows_only_the_audited_broadcast_change():
    committed = {"reasons": {"vthread": 3, "vector_width:broadcast": 2},
                 "rejected_compiles_reasons": {"vector_width:broadcast": 1}}
    assert same_reasons({"vthread": 3, "vector_width:broadcast": 2}, committed)
    assert same_reasons({"vthread": 3, "vector_width:broadcast": 1}, committed)  # one fixed, it compiled
    assert not same_reasons({"vthread": 3}, committed)  # two fixed, only one compiled
    assert not same_reasons({"vthread": 2, "vector_width:broadcast": 2}, committed)
    assert not same_reasons({"vthread": 3, "vector_width:broadcast": 3}, committed)


def test_resume_keeps_the_finished_tasks(tmp_path, capsys, monkeypatch):
    """An interrupted replay written to --out is not drawn again with --resume."""
    import tvm_ext.check.verify_gpu_replay as replay_mod

    path = _document(tmp_path, {"shared_memory": 6}, samples=2)
    out = tmp_path / "replay.json"
    assert main(["verify-gpu", "--replay", str(path), "--out", str(out), "--quiet", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)

    def fail(*_args, **_kwargs):
        raise AssertionError("a finished task was replayed again")

    monkeypatch.setattr(replay_mod, "replay_task", fail)
    assert main(["verify-gpu", "--replay", str(path), "--out", str(out), "--resume", "--quiet", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["tasks"] == first["tasks"] and again["complete"]
    assert main(["verify-gpu", "--replay", str(path), "--resume"]) == 2  # --resume needs --out
    assert "--resume needs --out" in capsys.readouterr().err
