"""Tune a workload on a Dask cluster: whole tasks are what travels, one database on the driver.

Unit of distribution: a whole task (its search, cost model, builds and measurements on one node).
A MetaSchedule task depends on no other task, and all of a job's time is in its tasks: ResNet-50 at
8 trials spent 227 of its 231 s inside them, task extraction well under 1 s. A task travels as one
message of 16-51 KB (its module and records) and comes back as a few KB of records, where farming
out single builds would ship every candidate's module and keep every search serial on the driver.
On 2 single-core nodes that gave 1.83x one node's speed (docs/journal.md, the cluster section,
with the model for more nodes and what a 100-node job would need).

The driver (``tune_on_cluster``) extracts the tasks, keeps the work dir's one JSONDatabase, and
submits every task below its budget -- its module, the records it already has, the trials left --
largest first. A worker (``tune_remote``) tunes it into a private database with the stack's
``tune_task`` (its own builder pool sized to its cores, LocalRunner on CPU targets, the RPC
runner through a tracker for devices elsewhere) and returns only the new records. The driver
commits them as each task finishes (one appended line per record: whole or absent), with the node
and seconds in ``tvm_ext.json``. A node that dies: Dask runs its task again on another node, and
the driver says so; the records of a task in flight are what is lost. The driver killed: the
finished tasks' records are in the database, and the same command resumes the others. No task
ends above its budget: the trials left are counted from the database at submission and a worker
returns at most that many records.
"""
from __future__ import annotations

import json
import os
import time
from typing import Callable

import tvm
import tvm_ffi

from tvm_ext.targets import target_to_json
from tvm_ext.tune.database import (RECORDS, best_record, open_database, prepare_work_dir, record_seconds,
                                   record_lines, records_of)
from tvm_ext.tune.driver import _duration, add_tuning_seconds, extract_tasks, report, save_tasks
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
    """On a worker: tune one task ``job`` (see ``_job``) in a private database; returns
    {"name", "node", "seconds", "records": [record JSON of the new records], "error"}."""
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
    os.environ.setdefault("TVM_EXT_BUILD_WORKERS", str(len(os.sched_getaffinity(0))))  # this node's cores
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
    new = [json.dumps(json.loads(line)[1]) for line in lines if line.strip()][:job["trials"]]
    return {"name": job["name"], "node": node, "seconds": time.time() - start, "records": new, "error": errors.first}


def _node_name(host: str) -> str:
    try:
        from distributed import get_worker

        return get_worker().name or host
    except (ImportError, ValueError):
        return host


def tune_on_cluster(workload, target, work_dir: str, trials: int, client, ruleset: str = "plugin",
                    rpc: tuple = (None, None), log: Callable[[str], None] = print, seed: int = 0,
                    per_iter: int = 16, should_stop: Callable[[], bool] = lambda: False, poll_s: float = 1.0) -> dict:
    """Tune every task of ``workload`` up to ``trials`` records on the cluster of ``client``
    (a ``distributed.Client``); resumable like ``tvm_ext.tune.tune``. Returns the report."""
    from distributed import wait
    from tvm.s_tir import meta_schedule as ms

    if trials < 1:
        raise ValueError(f"--trials must be at least 1, not {trials}")
    meta = prepare_work_dir(work_dir, workload, target, ruleset, log)
    tasks = extract_tasks(workload, target)
    save_tasks(work_dir, meta, tasks)
    database = open_database(work_dir)
    by_name = {t.name: (i, t) for i, t in enumerate(tasks, 1)}
    texts = {}  # the records each module has, as JSON text, from one read of the records file
    for shash, line in record_lines(work_dir):
        texts.setdefault(shash, []).append(json.dumps(json.loads(line)[1]))
    pending, jobs = {}, {}
    for i, task in enumerate(tasks, 1):
        done = records_of(database, task.mod)
        if len(done) < trials:
            jobs[task.name] = _job(task, i, target, ruleset, trials - len(done),
                                   texts.get(str(tvm_ffi.structural_hash(task.mod)), []), seed, per_iter, rpc)
    left = sum(j["trials"] for j in jobs.values())
    log(f"{len(tasks)} tasks, {trials * len(tasks) - left} of {trials * len(tasks)} trials already in the "
        f"database; {len(jobs)} tasks to tune on {_describe(client)}")
    for name, job in jobs.items():  # largest weight first (extract_tasks' order): long tasks start early
        pending[client.submit(tune_remote, job, key=f"tvm_ext-{name}-{os.getpid()}-{time.time_ns()}",
                              pure=False, retries=1)] = name
    start, measured, finished, where = time.time(), 0, 0, {}
    workers = _workers(client)
    try:
        while pending:
            if should_stop():
                raise TuningInterrupted("tuning stopped on request")
            try:
                done, _ = wait(list(pending), timeout=poll_s, return_when="FIRST_COMPLETED")
            except TimeoutError:  # nothing finished in poll_s: look at the nodes, then wait again
                done = []
            where, workers = _watch_nodes(client, pending, where, workers, log)
            for future in done:
                name = pending.pop(future)
                i, task = by_name[name]
                head = f"[{i}/{len(tasks)}] {name} (x{task.weight})"
                try:
                    result = future.result()
                except Exception as err:  # noqa: BLE001 - one task's failure is one line, the rest go on
                    log(f"{head}: failed on the cluster ({_last_line(err)}); run the same command again to retry")
                    continue
                workload_entry = database.commit_workload(task.mod)
                for text in result["records"]:
                    database.commit_tuning_record(ms.database.TuningRecord.from_json(json.loads(text), workload_entry))
                add_tuning_seconds(work_dir, name, result["seconds"], node=result["node"])
                finished += 1
                measured += jobs[name]["trials"]
                left -= jobs[name]["trials"]
                best = best_record(database, task.mod)
                secs = record_seconds(best) if best is not None else None
                what = (f"best {secs * 1e6:.1f} us" if secs is not None
                        else f"no candidate ran ({result['error'] or 'no error message'})")
                eta = (time.time() - start) * left / measured if measured else 0.0
                log(f"{head} on {result['node']}: {what}, {len(result['records'])} trials in "
                    f"{result['seconds']:.0f} s; {finished}/{len(jobs)} tasks done, ETA {_duration(eta)} "
                    f"({len(workers)} nodes: {', '.join(sorted(workers.values()))})")
    finally:
        for future in pending:
            future.cancel()
    return report(work_dir, database)


def _describe(client) -> str:
    names = sorted(_workers(client).values())
    return f"{len(names)} nodes ({', '.join(names)})" if names else "a cluster with no nodes yet"


def _workers(client) -> dict:
    """{worker address: node name} of the cluster now."""
    return {addr: str(info.get("name") or addr) for addr, info in client.scheduler_info()["workers"].items()}


def _watch_nodes(client, pending: dict, where: dict, before: dict, log) -> tuple[dict, dict]:
    """Say which nodes joined or left since the last look; for a node that left, which of our
    tasks it was running (Dask runs them again elsewhere). Returns (task -> node now, nodes now).
    The nodes and what each runs come from one call (``processing``): the scheduler drops a dead
    node and moves its tasks in one step, so two calls could see the tasks moved and the node
    still there, and a later look would no longer know what the node ran."""
    processing = client.processing()
    joined = processing.keys() - before.keys()
    names = _workers(client) if joined else {}  # a node that joined: its name (the scheduler knows it by then)
    now = {addr: before.get(addr) or names.get(addr, addr) for addr in processing}
    ours = set(pending.values())
    for addr in before.keys() - now.keys():
        lost = sorted(name for name, node in where.items() if node == addr and name in ours)
        log(f"node {before[addr]} left the cluster" + (f"; its tasks run again on another node: {', '.join(lost)}"
                                                        if lost else ""))
    for addr in now.keys() - before.keys():
        log(f"node {now[addr]} joined the cluster")
    if before and not now:
        log("no node left in the cluster: waiting for one to join (Ctrl-C stops; the same command resumes)")
    keys = {f.key: name for f, name in pending.items()}
    running = {keys[key]: addr for addr, running_keys in processing.items() for key in running_keys if key in keys}
    return running, now


def _last_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else type(err).__name__


__all__ = ["tune_on_cluster", "tune_remote"]
