"""Where an int8 network's time goes: its kernels inside the running network against the same
kernels' tuning records (what the "sum of its tuned kernels" estimate adds up), and the rest.

``breakdown(executable, dev, args, workload, work_dir, runs)`` runs the compiled network ``runs``
times plain and ``runs`` times with every VM call timed (``tvm_ext.vm_calls``), alternating, and
returns, per tuning task (kernels are matched to tasks by their structure, as the tuner
extracted them), its time per network run inside the network (median over the runs, all its
calls) beside its record's (best run seconds x calls) and their ratio; then the totals:

* ``network_ms``: one plain run (median);
* ``kernels_ms``: the kernels' own time inside the network (summed per run, median);
* ``estimate_ms``: the records' sum (``tvm-ext report``'s estimate);
* ``outside_ms`` = network - kernels: the VM between the kernels (dispatch, allocation) and the
  thread pool waking for the first kernel;
* ``inside_ms`` = kernels - estimate: the kernels running slower in the network than alone
  (cold caches after their neighbours, a pool that has to wake), or faster.

Why: the network ran at 1.21-1.26x the sum of its tuned kernels on one host and 2.1-2.4x on another
(docs/journal.md); which of the two parts holds the gap decides what to fix.
"""
from __future__ import annotations

import statistics
import time

import tvm
import tvm_ffi


def _task_of(workload, tasks) -> dict:
    """{PrimFunc name in the workload's module: task name} by structural hash (the tuner's
    tasks are the module's PrimFuncs as ``main``, deduplicated)."""
    by_hash = {tvm_ffi.structural_hash(t.mod): t.name for t in tasks}
    out = {}
    for gv, func in workload.mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
            out[gv.name_hint] = by_hash.get(tvm_ffi.structural_hash(mod), gv.name_hint)
    return out


def task_records(workload, tasks, database) -> tuple[dict, dict]:
    """({task name: its best record's seconds}, {PrimFunc name in the workload: task name}): what
    ``breakdown`` matches the network's kernels against, from the work dir's ``tasks`` and
    ``database`` (opening a large database takes seconds: a caller timing many networks of one work
    dir reads it once and passes this as ``known``)."""
    from tvm_ext.tune.database import best_record, record_seconds

    best_s = {t.name: record_seconds(r) for t in tasks if (r := best_record(database, t.mod)) is not None}
    return best_s, _task_of(workload, tasks)


def breakdown(executable, dev, args, workload, work_dir: str, runs: int = 20, known=None) -> dict:
    """See the module doc.  ``args``: the network's inputs on ``dev``; ``known``: ``task_records``
    of the work dir, read from it when not given."""
    from tvm import relax

    from tvm_ext.tune.database import open_database
    from tvm_ext.tune.driver import load_tasks, read_meta
    from tvm_ext.vm_calls import timed_calls

    if known is None:
        tasks = load_tasks(work_dir, read_meta(work_dir))
        known = task_records(workload, tasks, open_database(work_dir, read_only=True))
    best_s, task_of = known
    plain_vm = relax.VirtualMachine(executable, dev)
    plain_vm["main"](*args)  # warm: weights paged in, the pool started
    plain, per_run = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        plain_vm["main"](*args)
        dev.sync()
        plain.append(time.perf_counter() - t0)
        per_run.append(timed_calls(executable, dev, lambda vm: vm["main"](*args)))
    rows = {}
    for name in per_run[0]:
        task = task_of.get(name, name)
        row = rows.setdefault(task, {"task": task, "calls": 0, "kernels": []})
        row["calls"] += per_run[0][name][1]
        row["kernels"].append(name)
    for row in rows.values():
        secs = [sum(r[k][0] for k in row["kernels"] if k in r) for r in per_run]
        row["in_network_ms"] = 1e3 * statistics.median(secs)
        rec = best_s.get(row["task"])
        row["record_ms"] = None if rec is None else 1e3 * rec * row["calls"]
        row["ratio"] = None if rec is None else row["in_network_ms"] / row["record_ms"]
    kernels = statistics.median(sum(s for s, _ in r.values()) for r in per_run) * 1e3
    network = statistics.median(plain) * 1e3
    estimate = sum(r["record_ms"] for r in rows.values() if r["record_ms"] is not None)
    return {"runs": runs, "network_ms": network, "kernels_ms": kernels, "estimate_ms": estimate,
            "outside_ms": network - kernels, "inside_ms": kernels - estimate,
            "untuned_tasks": sorted(r["task"] for r in rows.values() if r["record_ms"] is None),
            "tasks": sorted(rows.values(), key=lambda r: -r["in_network_ms"])}
