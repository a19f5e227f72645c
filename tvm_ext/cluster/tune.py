"""Tune a workload on a Dask cluster: whole tasks are what travels, one database on the driver.

Unit of distribution: a whole task (its search, cost model, builds and measurements on one node).
A MetaSchedule task depends on no other task, and all of a job's time is in its tasks: ResNet-50 at
8 trials spent 227 of its 231 s inside them, task extraction well under 1 s. A task travels as one
message of 16-51 KB (its module and records) and comes back as a few KB of records, where farming
out single builds would ship every candidate's module and keep every search serial on the driver.
On 2 single-core nodes that gave 1.83x one node's speed (docs/journal.md, the cluster section,
with the model for more nodes and what a 100-node job would need).

The driver (``tune_on_cluster``) asks every node what it is and keeps those that may tune the
target (``nodes``), extracts the tasks, keeps the work dir's one JSONDatabase (one driver per work
dir: ``tvm_ext.tune.lock``), and places every task below its budget -- its module, the records it
already has, the trials left -- largest first, one per node (``dispatch``). A worker
(``tune_remote``) tunes it into a private database with the stack's ``tune_task`` (its own builder
pool sized to its cores, kernels timed on the target's ``num-cores`` threads, LocalRunner on CPU
targets, the RPC runner through a tracker for devices elsewhere) and returns the new records. The
driver checks them (``checks``) and commits them only if all hold (one appended line per record:
whole or absent), with the node, its CPU and seconds in ``tvm_ext.json``. A node that dies, errs,
sends a refused result or misses the task's deadline: the task runs again on another node. The
driver killed: the finished tasks' records are in the database, and the same command resumes the
others. No task ends above its budget: the trials left are counted at submission and a result
with more records is refused.
"""
from __future__ import annotations

import json
import os
import time
from typing import Callable

import tvm
import tvm_ffi

from tvm_ext.cluster.checks import BadResult, checked_records
from tvm_ext.cluster.dispatch import Dispatcher, _last_line
from tvm_ext.cluster.nodes import describe_node, none_can, target_needs
from tvm_ext.targets import target_to_json
from tvm_ext.tune.database import (RECORDS, best_record, open_database, prepare_work_dir, read_meta,
                                   record_lines, record_seconds, records_of, write_meta)
from tvm_ext.tune.driver import _duration, add_tuning_seconds, extract_tasks, report, save_tasks
from tvm_ext.tune.lock import driver_lock
from tvm_ext.tune.search import TuningInterrupted


def _job(task, index: int, target, ruleset: str, trials_left: int, records: list, seed: int, per_iter: int,
         rpc: tuple) -> dict:
    """What a worker needs to tune ``task``: its module, target, rule set, the trials left, and
    the JSON text of the records it has (so the node's search skips them and its cost model
    learns from them)."""
    return {"name": task.name, "weight": task.weight, "mod": tvm.ir.save_json(task.mod),
            "target": json.dumps(target_to_json(target)), "ruleset": ruleset, "trials": trials_left,
            "records": records, "seed": seed + index, "per_iter": per_iter, "rpc": list(rpc)}


def tune_remote(job: dict) -> dict:
    """On a worker: tune one task ``job`` (see ``_job``) in a private database, its kernels timed on
    the target's ``num-cores`` threads; returns {"name", "node", "cpu", "target", "seconds",
    "records": [record JSON of the new records], "error"}."""
    import socket
    import tempfile

    from tvm.s_tir import meta_schedule as ms

    import tvm_ext  # noqa: F401 -- registers the plugin's rules and postprocs in this process
    from tvm_ext.tune.builder import make_builder
    from tvm_ext.tune.database import _json_database, register_record_intrinsics
    from tvm_ext.tune.driver import FirstError, Task, tune_task
    from tvm_ext.tune.runner import make_runner

    node = _node_name(socket.gethostname())
    target = tvm.target.Target(json.loads(job["target"]))
    if target.kind.name == "cuda" and not job["rpc"][0] and not tvm.cuda(0).exist:
        raise RuntimeError(f"node {node} has no GPU for the cuda target; start workers on GPU machines or "
                           "pass --rpc-tracker")
    register_record_intrinsics()
    mod = tvm.ir.load_json(job["mod"])
    cores = len(os.sched_getaffinity(0))
    threads = int(target.attrs["num-cores"]) if target.kind.name == "llvm" and "num-cores" in target.attrs else None
    if threads is not None:
        if threads > cores:
            raise RuntimeError(f"node {node} may use {cores} cores; the target's kernels are timed on {threads}")
        os.environ["TVM_NUM_THREADS"] = str(threads)  # the runner's processes (made below) inherit it
    os.environ.setdefault("TVM_EXT_BUILD_WORKERS", str(cores))  # this node's cores
    with tempfile.TemporaryDirectory(prefix="tvm_ext_node_") as tmp:
        paths = [os.path.join(tmp, n) for n in ("database_workload.json", RECORDS)]
        db = _json_database(paths[0], paths[1], allow_missing=True)
        workload = db.commit_workload(mod)
        for text in job["records"]:
            db.commit_tuning_record(ms.database.TuningRecord.from_json(json.loads(text), workload))
        before = len(job["records"])
        errors, start = FirstError(), time.time()
        tune_task(Task(job["name"], job["weight"], mod), target, db, tmp, job["trials"], ruleset=job["ruleset"],
                  runner=make_runner(*job["rpc"]) if job["rpc"][0] else make_runner(),
                  builder=make_builder(), seed=job["seed"],
                  per_iter=job["per_iter"], callbacks=[errors.callback()])
        with open(paths[1], "rb") as f:
            lines = f.read().splitlines()[before:]
    new = [json.dumps(json.loads(line)[1]) for line in lines if line.strip()]
    return {"name": job["name"], "node": node, "cpu": describe_node()["mcpu"], "target": job["target"],
            "seconds": time.time() - start, "records": new, "error": errors.first}


def _node_name(host: str) -> str:
    try:
        from distributed import get_worker

        return get_worker().name or host
    except (ImportError, ValueError):
        return host


def tune_on_cluster(workload, target, work_dir: str, trials: int, client, ruleset: str = "plugin",
                    rpc: tuple = (None, None), log: Callable[[str], None] = print, seed: int = 0,
                    per_iter: int = 16, should_stop: Callable[[], bool] = lambda: False, poll_s: float = 1.0,
                    allow_mixed_cpus: bool = False, task_deadline_s: float | None = None,
                    remote: Callable = tune_remote, describe: Callable | None = None) -> dict:
    """Tune every task of ``workload`` up to ``trials`` records on the cluster of ``client``
    (a ``distributed.Client``); resumable like ``tvm_ext.tune.tune``. Returns the report.

    ``allow_mixed_cpus``: use nodes whose CPU is not the target's ``mcpu`` (each record's node and
    CPU are kept in the work dir). ``task_deadline_s``: a task with no result after that long is
    cancelled and runs again elsewhere (default: from its trials, ``deadline_for``). ``remote`` and
    ``describe``: what runs on a node (the tuning, and the question what it is)."""
    if trials < 1:
        raise ValueError(f"--trials must be at least 1, not {trials}")
    if task_deadline_s is not None and task_deadline_s <= 0:
        raise ValueError(f"--task-deadline must be positive, not {task_deadline_s}")
    dispatch = Dispatcher(client, {}, remote, target_needs(target), log, allow_mixed_cpus, bool(rpc[0]),
                          describe=describe)
    dispatch.refresh_nodes()  # before any work: one line where no node can tune this target
    if dispatch.refused and not dispatch.eligible:
        raise none_can(dispatch.refused)
    with driver_lock(work_dir) as lock_now:
        meta = prepare_work_dir(work_dir, workload, target, ruleset, log)
        lock_now()
        _record_threads(work_dir, meta, dispatch.needs["threads"], log)
        tasks = extract_tasks(workload, target)
        save_tasks(work_dir, meta, tasks)
        database = open_database(work_dir)
        texts = {}  # the records each module has, as JSON text, from one read of the records file
        for shash, line in record_lines(work_dir):
            texts.setdefault(shash, []).append(json.dumps(json.loads(line)[1]))
        for i, task in enumerate(tasks, 1):
            done = records_of(database, task.mod)
            if len(done) < trials:
                dispatch.jobs[task.name] = _job(task, i, target, ruleset, trials - len(done),
                                                texts.get(str(tvm_ffi.structural_hash(task.mod)), []), seed,
                                                per_iter, rpc)
        dispatch.queue = list(dispatch.jobs)
        dispatch.deadline_s = task_deadline_s or deadline_for(max((j["trials"] for j in dispatch.jobs.values()),
                                                                  default=1))
        left = sum(j["trials"] for j in dispatch.jobs.values())
        names = dispatch.node_names()
        log(f"{len(tasks)} tasks, {trials * len(tasks) - left} of {trials * len(tasks)} trials already in the "
            f"database; {len(dispatch.jobs)} tasks to tune on "
            + (f"{len(names)} nodes ({', '.join(names)})" if names else "a cluster with no nodes yet"))
        _run(dispatch, tasks, database, work_dir, left, should_stop, poll_s, log)
        return report(work_dir, database)


def deadline_for(trials: int) -> float:
    """A task's default deadline: generous for what ``trials`` candidates cost on a slow node
    (builds of 1-2 s each, a few seconds of timing, the search's start), so only a hung task meets it."""
    return 300.0 + 60.0 * trials


def _run(dispatch: Dispatcher, tasks, database, work_dir: str, left: int, should_stop, poll_s: float, log) -> None:
    from distributed import wait
    from distributed.comm.core import CommClosedError

    by_name = {t.name: (i, t) for i, t in enumerate(tasks, 1)}
    start, measured, finished, total, waiting = time.time(), 0, 0, len(dispatch.jobs), False
    try:
        while dispatch.queue or dispatch.running:
            if should_stop():
                raise TuningInterrupted("tuning stopped on request")
            dispatch.refresh_nodes()
            dispatch.place()
            for name in dispatch.stalled():
                log(f"{name}: no node it has not failed on is left; run the same command again to retry")
            if not dispatch.running:
                if dispatch.queue and not dispatch.eligible and not waiting:
                    log("no node left in the cluster that can tune: waiting for one to join "
                        "(Ctrl-C stops; the same command resumes)")
                waiting = not dispatch.eligible
                time.sleep(poll_s)
                continue
            waiting = False
            try:
                done, _ = wait(list(dispatch.running), timeout=poll_s, return_when="FIRST_COMPLETED")
            except TimeoutError:  # nothing finished in poll_s: deadlines, then wait again
                done = []
            for future in done:
                name = dispatch.running[future].name
                i, task = by_name[name]
                job = dispatch.jobs[name]
                head = f"[{i}/{len(tasks)}] {name} (x{task.weight})"
                try:
                    result = future.result()
                    records = checked_records(result, job, task.mod, database.commit_workload(task.mod))
                except BadResult as err:
                    dispatch.failed(future, f"result refused, nothing committed ({err})")
                    continue
                except Exception as err:  # noqa: BLE001 -- one node's failure: the task runs elsewhere
                    dispatch.failed(future, f"failed ({_last_line(err)})")
                    continue
                placed = dispatch.running.pop(future)
                for record in records:
                    database.commit_tuning_record(record)
                node = dispatch.names.get(placed.addr, result.get("node"))
                add_tuning_seconds(work_dir, name, result["seconds"], node=node)
                _record_node(work_dir, name, node, dispatch.eligible.get(placed.addr, {}), len(records))
                finished += 1
                measured += job["trials"]
                left -= job["trials"]
                best = best_record(database, task.mod)
                secs = record_seconds(best) if best is not None else None
                what = (f"best {secs * 1e6:.1f} us" if secs is not None
                        else f"no candidate ran ({result['error'] or 'no error message'})")
                eta = (time.time() - start) * left / measured if measured else 0.0
                names = dispatch.node_names()
                log(f"{head} on {node}: {what}, {len(records)} trials in {result['seconds']:.0f} s; "
                    f"{finished}/{total} tasks done, ETA {_duration(eta)} ({len(names)} nodes: {', '.join(names)})")
            dispatch.cancel_overdue()
    except CommClosedError as err:
        raise OSError(f"lost the connection to the cluster ({_last_line(err)}); what finished is committed in "
                      f"{work_dir}: run the same command to resume") from None
    finally:
        for future in dispatch.running:
            future.cancel()


def _record_threads(work_dir: str, meta: dict, threads, log) -> None:
    """The work dir's ``threads`` is what its records are timed on: the target's num-cores on the nodes,
    not the driver's pool (a database is later found "tuned for this host" by it)."""
    if threads is None or meta.get("threads") == threads:
        return
    if meta.get("tasks") and any(e.get("tuning_s") for e in meta["tasks"]):
        log(f"note: {work_dir}'s records so far were timed on {meta.get('threads')} threads; the cluster's "
            f"nodes time on {threads} (the target's num-cores)")
    meta["threads"] = threads  # the caller's meta: what it writes back next (save_tasks) keeps it
    write_meta(work_dir, meta)


def _record_node(work_dir: str, name: str, node: str, info: dict, count: int) -> None:
    """Keep which node, on which CPU, measured how many of ``name``'s records (``measured_on``)."""
    meta = read_meta(work_dir)
    for entry in meta["tasks"]:
        if entry["name"] == name:
            entry.setdefault("measured_on", []).append(
                {"node": node, "mcpu": info.get("mcpu"), "gpu": info.get("gpu"), "records": count})
    write_meta(work_dir, meta)


__all__ = ["deadline_for", "tune_on_cluster", "tune_remote"]
