"""The verify-gpu document: its confusion-matrix cells, what each rejection reason
means, per-run totals, resuming from a partial document and merging several runs
(tuning_logs/verify-gpu.json holds the merge of the three workloads' runs).

CELLS, REASON_NOTES
reason_notes(total) -> {reason: note}            for the reasons a total counts
total_of(task_results) -> dict                   sums of the cells, reasons, agreement
resumed(out, head) -> {task: result}             finished tasks of an earlier run of the same settings
merge(docs) -> dict                              one document over several runs
"""
from __future__ import annotations

import json
import os
from collections import Counter
from typing import Optional

CELLS = ("accepted_compiles", "accepted_fails", "rejected_compiles", "rejected_fails")

# What a rejection reason means when nvcc compiles the candidate anyway.
REASON_NOTES = {
    "threads_per_block": "run time: a launch with more than max_threads_per_block threads fails "
                         "(cudaErrorInvalidConfiguration / launch-bounds mismatch)",
    "shared_memory": "run time: more shared memory than the per-block limit fails to launch "
                     "(ptxas only catches static allocations over 48 KiB)",
    "vthread": "policy, opt-in (VerifyGPUCode(vthread_limit=8); tuning_logs/verify-gpu.json "
               "was judged with it): at most 8 as the product of vthread extents of the scheduled loops (a "
               "register-pressure heuristic); the built-in's max_vthread=8 looks after InjectVirtualThread "
               "removed them; compiles and runs",
    "thread_extent_annotation": "policy, shared with TVM's built-in: the sketch's "
                                "meta_schedule.thread_extent_{low,high}_inclusive bounds "
                                "(e.g. at least a warp); compiles and runs",
    "vector_width:load": "codegen: vectors over 16 bytes have no CUDA type",
    "vector_width:store": "codegen: vectors over 16 bytes have no CUDA type",
    "vector_width:cast": "codegen: vectors over 16 bytes have no CUDA type (e.g. int64x4 from "
                         "q_multiply_shift after LowerIntrin)",
    "vector_width:broadcast": "codegen: a broadcast over 16 bytes, or of 8/16-bit integers over 4 lanes, "
                              "is written as make_*4 with one argument per lane, which nvcc rejects",
    "lowering_failed": "TVM's GPU lowering raised",
    "build_pipeline_failed": "codegen: tvm.compile's own lowering raises (e.g. LowerThreadAllreduce "
                             "on a cross-thread reduction that UnrollLoop copied)",
    "builtin_rejected": "the staged postproc (apply): TVM's GPUCodeVerifier, with the built-in "
                        "VerifyGPUCode's constraints, rejects the lowered code and our checks name no reason",
}


def reason_notes(total: dict) -> dict:
    return {r: REASON_NOTES.get(r, "") for r in total["reasons"]}


def resumed(out: Optional[str], head: dict) -> dict:
    """Finished tasks (by name) of an earlier run of the same settings written to ``out``."""
    if not out or not os.path.exists(out):
        return {}
    with open(out, encoding="utf-8") as f:
        prev = json.load(f)
    same = ("workload", "arch", "samples_per_task", "seed")
    differ = [k for k in same if prev.get(k) != head[k]]
    for k in ("image", "config"):
        if prev.get("options", {}).get(k) != head["options"].get(k):
            differ.append(k)
    if differ:
        raise ValueError(f"--resume: {out} is a run with other settings ({', '.join(differ)}); "
                         "choose another --out or the same settings")
    return {t["task"]: t for t in prev["tasks"]}


def total_of(results: list) -> dict:
    total = {c: sum(r[c] for r in results) for c in CELLS}
    n = sum(r["samples"] for r in results)
    agree = sum(r["agree_with_builtin"] for r in results)
    reasons, rc, dis, bcells = Counter(), Counter(), Counter(), Counter({c: 0 for c in CELLS})
    for r in results:
        reasons.update(r["reasons"])
        rc.update(r["rejected_compiles_reasons"])
        dis.update(r["disagreements"])
        bcells.update(r["builtin"])
    return {
        "samples": n,
        **total,
        "agree_with_builtin": agree,
        "agreement": round(agree / n, 4) if n else None,
        "reasons": dict(reasons.most_common()),
        "rejected_compiles_reasons": dict(rc.most_common()),
        "builtin": dict(bcells),
        "disagreements": dict(dis.most_common()),
    }


def merge(docs: list) -> dict:
    """One document over several workloads' runs (for tuning_logs/verify-gpu.json).

    A document may itself be merged (the committed file), so runs can be added to it;
    a task checked twice (same workload and name) is an error, not double-counted."""
    if not docs:
        raise ValueError("nothing to merge")
    arch = {d["arch"] for d in docs}
    if len(arch) != 1:
        raise ValueError(f"runs for different archs: {sorted(arch)}")
    tasks, workloads = [], []
    for d in docs:
        if "workloads" in d:  # already merged
            tasks.extend(d["tasks"])
            workloads.extend(d["workloads"])
            continue
        tasks.extend({"workload": d["workload"], **t} for t in d["tasks"])
        workloads.append({k: d[k] for k in ("workload", "tasks_total", "tasks_checked", "options", "seconds")})
    seen = Counter((t["workload"], t["task"]) for t in tasks)
    twice = [f"{w}:{n}" for (w, n), c in seen.items() if c > 1]
    if twice:
        raise ValueError(f"tasks in more than one document: {', '.join(twice)}")
    total = total_of(tasks)
    return {
        "arch": docs[0]["arch"],
        "samples_per_task": min(d["samples_per_task"] for d in docs),
        "workloads": workloads,
        "total": total,
        "tasks": tasks,
        "reason_notes": reason_notes(total),
    }


__all__ = ["CELLS", "REASON_NOTES", "merge", "reason_notes", "resumed", "total_of"]
