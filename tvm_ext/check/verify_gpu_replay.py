"""``tvm-ext verify-gpu --replay FILE``: does the staged VerifyGPUCode decide as the whole one?

The postproc's ``apply`` is staged (cheap checks first, ``tvm.compile``'s lowering only
where it can change the verdict; see ``postprocs/verify_gpu_code.py``).  This replays
the candidates a verify-gpu run checked with nvcc -- FILE, a verify-gpu JSON document --
and judges each one twice:

* unstaged -- ``verify`` with the vthread policy of the time: every check, the full
              lowering (what verify-gpu recorded);
* staged   -- what our postprocs do during a search now (without the vthread policy:
              ``VerifyGPUCode``'s doc): ThreadExtentPrecheck on the candidate as sampled,
              before any postproc (``check_module_threads``), then ``verify_staged`` on the
              finished candidate.

The candidates are drawn again exactly as verify-gpu drew them (same workload, task,
seed and number of samples, same sampling code), and the unstaged reasons are compared
with the committed ones per task (``same_candidates_as_committed``, ``same_reasons``):
equal counts show that the same candidates came back.  A candidate whose accept/reject decision moved is
compiled with nvcc (its CUDA source as TVM generates it): the replay passes when no
decision moved, or nvcc agrees with every staged decision that did.  Reasons that
changed while the decision stayed (e.g. ``builtin_rejected``) are counted apart.

Public API
----------
replay(path, tasks=None, out=None, progress=None) -> dict   the JSON document
"""
from __future__ import annotations

import json
import time
from collections import Counter
from typing import Callable, Optional

from tvm_ext.jsonio import write_json


def _load(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"--replay: no file {path!r}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"--replay: {path} is not JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tasks"), list) or "arch" not in doc:
        raise ValueError(f"--replay: {path} is not a verify-gpu document (no 'arch' and 'tasks')")
    return doc


def _workload_of(doc: dict, task: dict) -> str:
    name = task.get("workload") or doc.get("workload")
    if not name:
        raise ValueError("--replay: a task names no workload")
    return name


BROADCAST = "vector_width:broadcast"


def same_reasons(unstaged: dict, committed: dict) -> bool:
    """True when today's unstaged reasons are the committed ones, allowing for the one
    audited change since verify-gpu.json was written (docs/journal.md: broadcasts are
    checked on the code the CUDA codegen receives, commit 8eb36e4): some candidates it
    rejected for a broadcast although they compile are accepted now, nothing else moved."""
    before = dict(committed.get("reasons", {}))
    now = dict(unstaged)
    fixed = before.pop(BROADCAST, 0) - now.pop(BROADCAST, 0)
    allowed = committed.get("rejected_compiles_reasons", {}).get(BROADCAST, 0)
    return before == now and 0 <= fixed <= allowed


def _nvcc_agrees(sch, target, arch: str, staged_accepts: bool) -> tuple:
    """(nvcc compiles, agrees with the staged decision, error line)."""
    from tvm_ext.check.nvcc import compile_cuda
    from tvm_ext.check.verify_gpu import codegen_error
    from tvm_ext.lowering import cuda_source

    try:
        ok, err = compile_cuda(cuda_source(sch, target), arch)
    except Exception as exc:  # noqa: BLE001 -- TVM could not generate CUDA: does not compile
        ok, err = False, codegen_error(exc)
    return ok, ok == staged_accepts, err[:200]


def replay_task(workload: str, name: str, mod, target, arch: str, samples: int, seed: int,
                committed: dict) -> dict:
    """Draw ``samples`` candidates of one task as verify-gpu did and judge each twice."""
    import tvm_ext
    from tvm_ext.postprocs.verify_gpu_code import (VTHREAD_POLICY, check_module_threads, target_limits,
                                                   verify, verify_staged)
    from tvm_ext.tune.sampling import sample_candidates, tune_context

    space = tvm_ext.space(target, "plugin")
    ctx = tune_context(mod, target, space, name)
    unprocessed: list = []
    schs = sample_candidates(mod, target, space, samples, seed=seed, context=ctx, before_postprocs=unprocessed)
    limits = target_limits(target)
    prechecked = 0
    unstaged_reasons: Counter = Counter()
    staged_reasons: Counter = Counter()
    moved, reasons_changed = [], 0
    seconds = {"unstaged": 0.0, "staged": 0.0}
    for i, sch in enumerate(schs):
        start = time.perf_counter()
        whole = verify(sch.mod, target, limits, vthread_limit=VTHREAD_POLICY)
        seconds["unstaged"] += time.perf_counter() - start
        start = time.perf_counter()
        # as in a search: ThreadExtentPrecheck on the candidate before the other postprocs,
        # then VerifyGPUCode on the finished one
        staged = check_module_threads(unprocessed[i], limits["thread_warp_size"])
        prechecked += staged is not None
        staged = staged or verify_staged(sch.mod, target, limits)
        seconds["staged"] += time.perf_counter() - start
        if whole is not None:
            unstaged_reasons[whole[0]] += 1
        if staged is not None:
            staged_reasons[staged[0]] += 1
        if (whole is None) != (staged is None):
            compiles, agrees, err = _nvcc_agrees(sch, target, arch, staged is None)
            moved.append({"sample": i, "unstaged": "accept" if whole is None else f"reject: {whole[0]}",
                          "staged": "accept" if staged is None else f"reject: {staged[0]}",
                          "nvcc_compiles": compiles, "nvcc_agrees_with_staged": agrees, "nvcc": err})
        elif whole is not None and whole[0] != staged[0]:
            reasons_changed += 1
    n = max(len(schs), 1)
    return {
        "workload": workload, "task": name, "seed": seed, "samples": len(schs),
        "accepted_staged": len(schs) - sum(staged_reasons.values()),
        "rejected_by_precheck": prechecked,
        "verdicts_moved": len(moved), "moved": moved, "reasons_changed": reasons_changed,
        "reasons_unstaged": dict(unstaged_reasons), "reasons_staged": dict(staged_reasons),
        "reasons_committed": committed.get("reasons", {}),
        "same_candidates_as_committed": (len(schs) == committed.get("samples")
                                         and same_reasons(dict(unstaged_reasons), committed)),
        "ms_per_candidate": {k: round(1000 * v / n, 2) for k, v in seconds.items()},
    }


def _finished(out: Optional[str], path: str) -> dict:
    """Tasks an interrupted replay of the same document already wrote to ``out``."""
    if not out:
        raise ValueError("--resume needs --out FILE: the replay whose finished tasks it keeps")
    try:
        with open(out, encoding="utf-8") as f:
            old = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    if old.get("replayed") != path:
        return {}
    return {(r["workload"], r["task"]): r for r in old.get("tasks", [])}


def replay(path: str, tasks: Optional[str] = None, out: Optional[str] = None,
           progress: Optional[Callable[[str], None]] = None, resume: bool = False) -> dict:
    """Replay every (selected) task of the verify-gpu document at ``path`` (module doc);
    ``resume``: keep the tasks an earlier replay of the same document wrote to ``out``."""
    from tvm_ext.check.verify_gpu import select_tasks, workload_tasks
    from tvm_ext.targets import cuda_target

    doc = _load(path)
    progress = progress or (lambda _msg: None)
    arch = doc["arch"]
    target = cuda_target(arch)
    recorded = [(_workload_of(doc, t), t) for t in doc["tasks"]]
    position: Counter = Counter()
    for workload, task in recorded:
        if "seed" not in task:
            # runs before seeds were recorded: task k of the run sampled with seed k (all
            # tasks chosen, in the document's order); same_candidates_as_committed confirms it
            task.setdefault("seed", position[workload])
        position[workload] += 1
    chosen = select_tasks([(f"{w}:{t['task']}", 0, (w, t)) for w, t in recorded], tasks)
    extracted: dict = {}
    results = list(_finished(out, path).values()) if resume else []
    done = {(r["workload"], r["task"]) for r in results}
    start = time.time()

    def document(complete: bool) -> dict:
        moved = [m for r in results for m in r["moved"]]
        return {
            "replayed": path, "arch": arch, "complete": complete,
            "tasks_replayed": len(results), "samples": sum(r["samples"] for r in results),
            "verdicts_moved": len(moved),
            "moved_where_nvcc_disagrees": sum(not m["nvcc_agrees_with_staged"] for m in moved),
            "accepted_and_fails": sum(m["staged"] == "accept" and not m["nvcc_compiles"] for m in moved),
            "reasons_changed": sum(r["reasons_changed"] for r in results),
            "rejected_by_precheck": sum(r.get("rejected_by_precheck", 0) for r in results),
            "same_candidates_as_committed": all(r["same_candidates_as_committed"] for r in results),
            "ms_per_candidate": {k: round(sum(r["ms_per_candidate"][k] * r["samples"] for r in results)
                                          / max(1, sum(r["samples"] for r in results)), 2)
                                 for k in ("unstaged", "staged")},
            "seconds": round(time.time() - start, 1),
            "tasks": results,
        }

    for k, (_label, _w, (workload, task)) in enumerate(chosen):
        if (workload, task["task"]) in done:
            continue
        if workload not in extracted:
            extracted[workload] = {n: m for n, _wt, m in workload_tasks(workload, target)}
        mod = extracted[workload].get(task["task"])
        if mod is None:
            raise ValueError(f"--replay: {workload} has no task {task['task']!r} any more")
        res = replay_task(workload, task["task"], mod, target, arch, task["samples"], task["seed"], task)
        results.append(res)
        progress(f"[{k + 1}/{len(chosen)}] {workload}:{task['task']}: moved {res['verdicts_moved']}, "
                 f"reasons changed {res['reasons_changed']}, same candidates "
                 f"{res['same_candidates_as_committed']}, ms/candidate {res['ms_per_candidate']}")
        if out:
            write_json(out, document(complete=False))
    doc_out = document(complete=True)
    if out:
        write_json(out, doc_out)
    return doc_out


__all__ = ["replay", "replay_task", "same_reasons"]
