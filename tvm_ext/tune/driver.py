"""Database-backed tuning of a workload, task by task, resumable and interrupt-safe.

Running again tunes each task only up to its trial budget, so a stopped run resumes
where it was (the work dir and its database: ``tvm_ext.tune.database``).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

import tvm
from tvm.s_tir import meta_schedule as ms

from tvm_ext.rulesets import default_postprocs, space
from tvm_ext.tune import packed
from tvm_ext.tune.apply import kernels_of
from tvm_ext.tune.builder import make_builder
from tvm_ext.tune.lock import driver_lock
from tvm_ext.tune.logs import loggers_for
from tvm_ext.tune.picks import read_picks, trace_key
from tvm_ext.tune.database import (best_record, open_database, prepare_work_dir, read_meta,
                                   record_seconds, records_of, write_meta)
from tvm_ext.tune.runner import make_runner
from tvm_ext.tune.transfer import reuse_schedules as reuse_schedules_of
from tvm_ext.tune.transfer import transfer_schedules
from tvm_ext.tune.search import (TuningInterrupted, after_each_batch, search_strategy,
                                 stop_callback)


@dataclass
class Task:
    name: str
    weight: int
    mod: tvm.IRModule


def extract_tasks(workload, target) -> list[Task]:
    """The tunable tasks of a workload's Relax module, largest weight first."""
    extracted = ms.relax_integration.extract_tasks(workload.mod, target)
    tasks = [Task(t.task_name, int(t.weight), t.dispatched[0]) for t in extracted]
    return sorted(tasks, key=lambda t: (-t.weight, t.name))


def save_tasks(work_dir: str, meta: dict, tasks: list[Task]) -> None:
    """Store every task's module so that reports need not rebuild the workload.

    A stored module that differs from the task's (the workload's code changed a task's TIR,
    its name staying the same) is replaced: reports, the per-layer bench and the estimate
    must look up the records of the module that is tuned and compiled now, not the old one's
    (whose records stay in the database, unused). The file of a task that is gone (renamed by a
    change of the workload's code) is removed: saved, it would only be carried along."""
    entries = []
    kept = {e["name"]: {k: e[k] for k in ("tuning_s", "node", "measured_on") if k in e}
            for e in meta.get("tasks", [])}
    for i, task in enumerate(tasks):
        file = os.path.join("tasks", f"{i:03d}_{task.name[:80]}.json")
        path = os.path.join(work_dir, file)
        text = tvm.ir.save_json(task.mod)
        stored = None
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                stored = f.read()
        if stored != text:
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(path + ".tmp", path)
        entry = {"name": task.name, "weight": task.weight, "file": file}
        entry.update(kept.get(task.name, {}))  # seconds and nodes kept across resumed runs
        entries.append(entry)
    meta["tasks"] = entries
    write_meta(work_dir, meta)
    listed = {os.path.basename(e["file"]) for e in entries}
    stored = os.path.join(work_dir, "tasks")
    for name in os.listdir(stored) if os.path.isdir(stored) else []:  # modules of tasks no longer the workload's
        if name.removesuffix(packed.GZ) not in listed:
            os.remove(os.path.join(stored, name))


def load_tasks(work_dir: str, meta: dict) -> list[Task]:
    tasks = []
    for entry in meta["tasks"]:  # plain, or gzip-compressed in a saved database
        text = packed.read_bytes(os.path.join(work_dir, entry["file"])).decode("utf-8")
        tasks.append(Task(entry["name"], entry["weight"], tvm.ir.load_json(text)))
    return tasks


def task_logger(work_dir: str, task_name: str, verbose: bool = False):
    """MetaSchedule's per-task log file under ``<work_dir>/logs/`` (search, build errors);
    TVM's console output stays at warnings unless ``verbose``."""
    return loggers_for(work_dir, [task_name], verbose=verbose)[0]


def tune_task(task: Task, target, database, log_dir: str, trials: int, *, ruleset: str = "plugin",
              runner=None, builder=None, seed: int = 0, per_iter: int = 16,
              callbacks: list | None = None, verbose: bool = False) -> Rejections:
    """Measure ``trials`` more candidates of one task into ``database``: the stack's space,
    builder (default ``make_builder()``), runner (default ``make_runner()``), search strategy
    and per-task log file under ``<log_dir>/logs/``.  ``callbacks`` run after TVM's default
    measure callbacks (so after AddToDatabase), once per batch of at most ``per_iter``
    candidates.  Returns what our postprocs rejected while searching this task (a new space
    per call: the counts are this task's and this run's only)."""
    measure = list(ms.measure_callback.MeasureCallback.create("default")) + list(callbacks or [])
    postprocs = default_postprocs(target, ruleset)
    context = ms.TuneContext(mod=task.mod, target=target, space_generator=space(target, ruleset, postprocs),
                             search_strategy=search_strategy(trials), task_name=task.name,
                             rand_state=seed, num_threads="physical",
                             logger=task_logger(log_dir, task.name, verbose)).clone()
    ms.tune_tasks(tasks=[context], task_weights=[float(task.weight)], work_dir=log_dir,
                  max_trials_global=trials, max_trials_per_task=trials,
                  num_trials_per_iter=min(per_iter, trials), database=database,
                  runner=runner if runner is not None else make_runner(),
                  builder=builder if builder is not None else make_builder(),
                  measure_callbacks=measure)
    return Rejections.of(postprocs)


@dataclass
class Rejections:
    """Candidates our postprocs checked and rejected during one task's search, by reason
    (VerifyGPUCode on cuda; on llvm nothing of ours rejects, and ``checked`` stays 0)."""
    checked: int
    reasons: dict

    @classmethod
    def of(cls, postprocs) -> "Rejections":
        checked, reasons = 0, {}
        for post in postprocs:
            if hasattr(post, "reason_counts"):
                checked += post.checked()
                for reason, count in post.reason_counts().items():
                    reasons[reason] = reasons.get(reason, 0) + count
        return cls(checked, dict(sorted(reasons.items(), key=lambda kv: -kv[1])))

    def line(self) -> str:
        """'' when nothing was checked, else e.g. 'VerifyGPUCode rejected 12 of 300 candidates
        (lowering 9, shared_memory 3)'."""
        if not self.checked:
            return ""
        rejected = sum(self.reasons.values())
        why = ", ".join(f"{k} {v}" for k, v in self.reasons.items())
        return (f"VerifyGPUCode rejected {rejected} of {self.checked} candidates"
                + (f" ({why})" if why else ""))


def tune(workload, target, work_dir: str, trials: int, ruleset: str = "plugin", runner=None,
         log: Callable[[str], None] = print, seed: int = 0, per_iter: int = 16,
         should_stop: Callable[[], bool] = lambda: False, verbose: bool = False,
         reuse_schedules: bool = False, transfer_from: str | None = None) -> dict:
    """Tune every task of ``workload`` up to ``trials`` records each; resumable.

    ``per_iter`` candidates are measured per search iteration; records reach the database
    after each iteration, so that is also how much an interruption can lose. One progress
    line per task (trials done / total, ETA from this run's seconds per trial); a task whose
    candidates all fail shows the first error. The database is opened once.

    ``reuse_schedules``: tasks whose TIR changed start from their old best schedule
    (``tvm_ext.tune.transfer``). ``transfer_from``: a saved database of the same workload tuned
    on another CPU; tasks without records start from its best schedules, measured here first.

    Returns the report (see ``report``) of the work dir after tuning.
    """
    if trials < 1:
        raise ValueError(f"--trials must be at least 1, not {trials}")
    with driver_lock(work_dir) as lock_now:  # one driver per work dir
        return _tune(workload, target, work_dir, trials, ruleset, runner, log, seed, per_iter, should_stop,
                     verbose, reuse_schedules, transfer_from, lock_now)


def _tune(workload, target, work_dir, trials, ruleset, runner, log, seed, per_iter, should_stop, verbose,
          reuse_schedules, transfer_from, lock_now) -> dict:
    """``tune`` with the work dir's driver lock held (``lock_now`` takes it once a new work dir exists)."""
    meta = prepare_work_dir(work_dir, workload, target, ruleset, log)
    lock_now()
    tasks = extract_tasks(workload, target)
    old_tasks = load_tasks(work_dir, meta) if reuse_schedules and meta.get("tasks") else []
    save_tasks(work_dir, meta, tasks)
    database = open_database(work_dir)
    builder = None
    if old_tasks or transfer_from:  # both measure schedules here, with the runner and builder that then tune
        runner = runner if runner is not None else make_runner()
        builder = make_builder()
    if old_tasks:
        reused = reuse_schedules_of(old_tasks, tasks, database, target, runner, builder=builder, log=log)
        log(f"{reused} changed tasks start from their old schedule")
    if transfer_from:  # a new work dir
        moved = transfer_schedules(transfer_from, tasks, database, target, runner, builder=builder, log=log)
        log(f"{moved} schedules transferred from {transfer_from}, each measured on this machine")
    todo = {task.name: max(0, trials - len(records_of(database, task.mod))) for task in tasks}
    left, spent, measured = sum(todo.values()), 0.0, 0
    log(f"{len(tasks)} tasks, {sum(trials - n for n in todo.values())} of {trials * len(tasks)} "
        f"trials already in the database")
    for i, task in enumerate(tasks, 1):
        if should_stop():
            raise TuningInterrupted("tuning stopped on request")
        head = f"[{i}/{len(tasks)}] {task.name} (x{task.weight})"
        if not todo[task.name]:
            continue
        # started for the first task with trials left (a resumed, finished run starts none: ~5 s each),
        # then shared by the tasks after it (a builder per task started its worker processes again)
        runner = runner if runner is not None else make_runner()
        builder = builder if builder is not None else make_builder()
        errors = FirstError()
        eta = f", ETA {_duration(left * spent / measured)}" if measured else ""
        log(f"{head}: {trials - todo[task.name]}/{trials} trials, tuning {todo[task.name]}{eta}")
        start = time.time()
        try:
            rejections = tune_task(task, target, database, work_dir, todo[task.name],
                                   ruleset=ruleset, runner=runner, builder=builder, seed=seed + i,
                                   per_iter=per_iter, verbose=verbose,
                                   callbacks=[errors.callback(), stop_callback(should_stop)])
        finally:  # also when stopped: the records it wrote were paid for
            elapsed = time.time() - start
            add_tuning_seconds(work_dir, task.name, elapsed)
        spent, measured, left = spent + elapsed, measured + todo[task.name], left - todo[task.name]
        best = best_record(database, task.mod)
        secs = record_seconds(best) if best is not None else None
        if secs is None:
            log(f"{head}: no candidate ran ({errors.first or 'no error message'}); "
                f"details in {os.path.join(work_dir, 'logs')}")
        else:
            log(f"{head}: best {secs * 1e6:.1f} us after {elapsed:.0f} s")
        if rejections.line():
            log(f"{head}: {rejections.line()}")
    return report(work_dir, database)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class FirstError:
    """Keeps the first build or run error of a task, to show on the console."""

    def __init__(self):
        self.first = None

    def keep(self, builder_results, runner_results) -> None:
        if self.first is not None:
            return
        for result in list(builder_results) + list(runner_results):
            if result.error_msg:
                lines = [ln for ln in str(result.error_msg).splitlines() if ln.strip()]
                self.first = lines[-1].strip()[:300] if lines else "unknown error"
                return

    def callback(self):
        return after_each_batch(self.keep)


def add_tuning_seconds(work_dir: str, task_name: str, seconds: float, node: str | None = None) -> None:
    """Add wall seconds spent tuning ``task_name`` to the work dir's metadata: what a user
    pays for the schedules (summed over resumed and interrupted runs; lost on a kill), and
    ``node``: the cluster node that tuned it last (``tvm_ext.cluster``)."""
    meta = read_meta(work_dir)
    for entry in meta["tasks"]:
        if entry["name"] == task_name:
            entry["tuning_s"] = round(entry.get("tuning_s", 0.0) + seconds, 1)
            if node is not None:
                entry["node"] = node
    write_meta(work_dir, meta)


def report(work_dir: str, database=None) -> dict:
    """Per-task best latency, trials and kernels, plus the weighted end-to-end estimate.

    Reads only: a corrupt line is a one-line DatabaseCorrupt, an incomplete last record
    line (a run killed, or still writing) is left out, and the work dir is never written.
    ``database``: the work dir's database already open (``tune`` passes the one it wrote)."""
    meta = read_meta(work_dir)
    if database is None:
        database = open_database(work_dir, read_only=True)
    rows, total, complete = [], 0.0, True
    picks = read_picks(work_dir)
    tuning_s = {e["name"]: e.get("tuning_s") for e in meta["tasks"]}
    nodes = {e["name"]: e["node"] for e in meta["tasks"] if "node" in e}
    for task in load_tasks(work_dir, meta):
        best = best_record(database, task.mod)
        secs = record_seconds(best) if best is not None else None
        row = {"name": task.name, "weight": task.weight,
               "trials": len(records_of(database, task.mod)),
               "best_us": None if secs is None else secs * 1e6,
               "kernels": None if best is None else kernels_of(best, task.mod),
               "tuning_s": tuning_s.get(task.name)}
        if task.name in nodes:  # tuned on a cluster node
            row["node"] = nodes[task.name]
        if task.name in picks and best is not None and picks[task.name]["best"] == trace_key(best):
            row["picked_rank"] = picks[task.name]["rank"]  # the network runs this record, not the best
        if secs is None:
            complete = False
        else:
            total += task.weight * secs * 1e6
        rows.append(row)
    return {"workload": meta["workload"], "options": meta["options"],
            "target": meta["target"].get("kind"), "target_detail": meta["target"],
            "ruleset": meta["ruleset"], "tasks": rows,
            "e2e_us": total if complete and rows else None,
            "tuning_s": sum(t["tuning_s"] or 0.0 for t in rows)}
