"""Database-backed tuning of a workload, task by task, resumable and interrupt-safe.

A work dir holds a MetaSchedule JSONDatabase (``database_workload.json``,
``database_tuning_record.json``), one file per extracted task under ``tasks/`` and
``tvm_ext.json`` recording workload, options, target and rule set. Running again
tunes each task only up to its trial budget, so a stopped run resumes where it was.
A process killed in the middle of a database write leaves at most one partial line,
which ``repair_database`` drops before the database is opened.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Callable

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from tvm_ext.jsonio import write_json
from tvm_ext.rulesets import check_ruleset, space
from tvm_ext.targets import target_mismatch, target_to_json
from tvm_ext.tir_utils import top_level_nests

META_FILE = "tvm_ext.json"
DB_FILES = ("database_workload.json", "database_tuning_record.json")


class DatabaseMismatch(ValueError):
    """A work dir that is not a database, or one made for another workload or target."""


@dataclass
class Task:
    name: str
    weight: int
    mod: tvm.IRModule


# ----------------------------------------------------------------------------- work dir
def default_work_dir(workload: str, target, ruleset: str, root: str = "tuning_logs") -> str:
    from tvm_ext.targets import target_key

    return os.path.join(root, f"{workload}-{target_key(target)}-{ruleset}")


def read_meta(work_dir: str) -> dict:
    """The work dir's metadata; DatabaseMismatch if it is not a tvm_ext database."""
    path = os.path.join(work_dir, META_FILE)
    if not os.path.isfile(path):
        raise DatabaseMismatch(f"{work_dir} is not a tvm_ext tuning database (no {META_FILE})")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise DatabaseMismatch(f"{path} is corrupt: {err.msg}") from None


def prepare_work_dir(work_dir: str, workload, target, ruleset: str, log=print) -> dict:
    """Create or reopen a work dir for this workload/target/ruleset; refuse a foreign one."""
    check_ruleset(ruleset)
    wanted = {"workload": workload.name, "options": workload.options, "ruleset": ruleset,
              "target": target_to_json(target)}
    if os.path.isdir(work_dir) and os.listdir(work_dir):
        meta = read_meta(work_dir)
        for key in ("workload", "options", "ruleset"):
            if meta.get(key) != wanted[key]:
                raise DatabaseMismatch(
                    f"{work_dir} was made for {key} {meta.get(key)!r}, not {wanted[key]!r}")
        if meta["target"].get("kind") != wanted["target"].get("kind"):
            raise DatabaseMismatch(f"{work_dir} was made for target kind "
                                   f"{meta['target'].get('kind')!r}, not {wanted['target'].get('kind')!r}")
        warning = target_mismatch(meta["target"], target)
        if warning:
            log(f"warning: {work_dir}: {warning}")
        repair_database(work_dir, log)
        return meta
    os.makedirs(os.path.join(work_dir, "tasks"), exist_ok=True)
    meta = dict(wanted, tasks=[], created=time.strftime("%Y-%m-%d %H:%M:%S"))
    write_meta(work_dir, meta)
    return meta


def write_meta(work_dir: str, meta: dict) -> None:
    """Write metadata atomically (a kill never leaves half a file)."""
    write_json(os.path.join(work_dir, META_FILE), meta, sort_keys=True)


def repair_database(work_dir: str, log=print) -> int:
    """Drop unparsable (partially written) lines of the database files; returns how many."""
    dropped = 0
    for name in DB_FILES:
        path = os.path.join(work_dir, name)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        good = []
        for line in lines:
            if not line.strip():
                continue
            try:
                json.loads(line)
                good.append(line)
            except json.JSONDecodeError:
                dropped += 1
        if dropped:
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in good))
            os.replace(path + ".tmp", path)
    if dropped:
        log(f"note: dropped {dropped} partially written line(s) from the database in {work_dir}")
    return dropped


def open_database(work_dir: str) -> ms.database.JSONDatabase:
    from tvm_ext.rules.vnni_tensorize import register_intrinsics

    register_intrinsics()  # records of VNNI-tensorized schedules name our intrinsics
    return ms.database.JSONDatabase(work_dir=work_dir, module_equality="structural")


# ----------------------------------------------------------------------------- tasks
def extract_tasks(workload, target) -> list[Task]:
    """The tunable tasks of a workload's Relax module, largest weight first."""
    extracted = ms.relax_integration.extract_tasks(workload.mod, target)
    tasks = [Task(t.task_name, int(t.weight), t.dispatched[0]) for t in extracted]
    return sorted(tasks, key=lambda t: (-t.weight, t.name))


def save_tasks(work_dir: str, meta: dict, tasks: list[Task]) -> None:
    """Store every task's module so that reports need not rebuild the workload."""
    entries = []
    spent = {e["name"]: e["tuning_s"] for e in meta.get("tasks", []) if "tuning_s" in e}
    for i, task in enumerate(tasks):
        file = os.path.join("tasks", f"{i:03d}_{task.name[:80]}.json")
        path = os.path.join(work_dir, file)
        if not os.path.isfile(path):
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write(tvm.ir.save_json(task.mod))
            os.replace(path + ".tmp", path)
        entry = {"name": task.name, "weight": task.weight, "file": file}
        if task.name in spent:  # kept across resumed runs
            entry["tuning_s"] = spent[task.name]
        entries.append(entry)
    meta["tasks"] = entries
    write_meta(work_dir, meta)


def load_tasks(work_dir: str, meta: dict) -> list[Task]:
    tasks = []
    for entry in meta["tasks"]:
        with open(os.path.join(work_dir, entry["file"]), encoding="utf-8") as f:
            tasks.append(Task(entry["name"], entry["weight"], tvm.ir.load_json(f.read())))
    return tasks


def records_of(database, mod: tvm.IRModule) -> list:
    """All tuning records of ``mod`` in ``database`` (measured or failed)."""
    if not database.has_workload(mod):
        return []
    workload = database.commit_workload(mod)
    shash = tvm_ffi.structural_hash(workload.mod)
    return [r for r in database.get_all_tuning_records()
            if r.workload.same_as(workload) or tvm_ffi.structural_hash(r.workload.mod) == shash]


def best_record(database, mod: tvm.IRModule):
    if not database.has_workload(mod):
        return None
    top = database.get_top_k(database.commit_workload(mod), 1)
    return top[0] if top else None


def record_seconds(record) -> float | None:
    secs = [float(s) for s in (record.run_secs or [])]
    if not secs or min(secs) >= 1e9:  # MetaSchedule marks failed runs with 1e10
        return None
    return sum(secs) / len(secs)


def scheduled_mod(record, mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with the record's trace (postprocessors included) applied."""
    sch = tvm.s_tir.Schedule(mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod


def kernels_of(record, mod: tvm.IRModule) -> int:
    """Top-level loop nests (llvm) / kernels (cuda) of a record's schedule of ``mod``."""
    return top_level_nests(scheduled_mod(record, mod)["main"])


# ----------------------------------------------------------------------------- tuning
BUILD_TIMEOUT_S = 300  # a kill switch, not a measurement: busy 2-core machines need headroom


def make_builder():
    """A local builder whose workers skip importing TVM's tensor intrinsics (~30 s each),
    with a timeout that survives a loaded machine (TVM's default is 30 s)."""
    from tvm_ext.rules.vnni_tensorize import fast_local_builder

    return fast_local_builder(timeout_sec=BUILD_TIMEOUT_S)


def task_logger(work_dir: str, task_name: str):
    """MetaSchedule's per-task log file under ``<work_dir>/logs/`` (search, build errors)."""
    return ms.logging.get_loggers_from_work_dir(work_dir, [task_name])[0]


def search_strategy(trials: int):
    """Evolutionary search with a population scaled to the trial budget.

    TVM's default population (512) costs tens of seconds per iteration on a 2-core
    machine; for budgets of a few dozen trials per task a population of 4x the budget
    (at least 64) explores as far as the measurements can follow.
    """
    population = max(64, min(512, 4 * trials))
    return ms.search_strategy.EvolutionarySearch(population_size=population,
                                                 init_min_unmeasured=min(50, population // 2))


def make_runner(rpc_tracker: str | None = None, rpc_key: str | None = None, timeout: int = 120):
    """Local runner, or TVM's RPC runner through a tracker ``host:port`` and device key."""
    if not rpc_tracker:
        return ms.runner.LocalRunner(timeout_sec=timeout)
    host, _, port = rpc_tracker.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--rpc-tracker must be HOST:PORT, not {rpc_tracker!r}")
    if not rpc_key:
        raise ValueError("--rpc-tracker needs --rpc-key (the device key the servers registered)")
    config = ms.runner.RPCConfig(tracker_host=host, tracker_port=int(port), tracker_key=rpc_key,
                                 session_timeout_sec=timeout)
    return ms.runner.RPCRunner(rpc_config=config, max_workers=1)


class TuningInterrupted(Exception):
    """Raised between measurement batches once ``should_stop`` says so."""


def stop_callback(should_stop: Callable[[], bool]):
    """A measure callback that ends tuning after a batch has reached the database.

    Raising here, on the task scheduler's own thread after AddToDatabase, unwinds through
    TVM cleanly; an asynchronous KeyboardInterrupt inside TVM's C++ can abort the process.
    """
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

    @derived_object
    class StopWhenAsked(PyMeasureCallback):
        def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
                  runner_results) -> None:
            if should_stop():
                raise TuningInterrupted("tuning stopped on request")

    return StopWhenAsked()


def tune(workload, target, work_dir: str, trials: int, ruleset: str = "plugin", runner=None,
         log: Callable[[str], None] = print, seed: int = 0, per_iter: int = 16,
         should_stop: Callable[[], bool] = lambda: False) -> dict:
    """Tune every task of ``workload`` up to ``trials`` records each; resumable.

    ``per_iter`` candidates are measured per search iteration; records reach the database
    after each iteration, so that is also how much an interruption can lose.

    Returns the report (see ``report``) of the work dir after tuning.
    """
    if trials < 1:
        raise ValueError(f"--trials must be at least 1, not {trials}")
    meta = prepare_work_dir(work_dir, workload, target, ruleset, log)
    tasks = extract_tasks(workload, target)
    save_tasks(work_dir, meta, tasks)
    runner = runner if runner is not None else make_runner()
    callbacks = list(ms.measure_callback.MeasureCallback.create("default"))
    callbacks.append(stop_callback(should_stop))  # after AddToDatabase
    for i, task in enumerate(tasks, 1):
        if should_stop():
            raise TuningInterrupted("tuning stopped on request")
        database = open_database(work_dir)
        done = len(records_of(database, task.mod))
        head = f"[{i}/{len(tasks)}] {task.name} (x{task.weight})"
        if done >= trials:
            log(f"{head}: {done}/{trials} trials already in the database")
            continue
        log(f"{head}: tuning {trials - done} trials ({done} done)")
        start = time.time()
        context = ms.TuneContext(mod=task.mod, target=target, space_generator=space(target, ruleset),
                                 search_strategy=search_strategy(trials), task_name=task.name,
                                 rand_state=seed + i, num_threads="physical",
                                 logger=task_logger(work_dir, task.name)).clone()
        try:
            ms.tune_tasks(tasks=[context], task_weights=[float(task.weight)], work_dir=work_dir,
                          max_trials_global=trials - done, max_trials_per_task=trials - done,
                          num_trials_per_iter=min(per_iter, trials - done), database=database,
                          runner=runner, builder=make_builder(), measure_callbacks=callbacks)
        finally:  # also when stopped: the records it wrote were paid for
            elapsed = time.time() - start
            add_tuning_seconds(work_dir, task.name, elapsed)
        best = best_record(database, task.mod)
        secs = record_seconds(best) if best is not None else None
        shown = f"{secs * 1e6:.1f} us" if secs is not None else "no valid run"
        log(f"{head}: best {shown} after {elapsed:.0f} s")
    return report(work_dir)


def add_tuning_seconds(work_dir: str, task_name: str, seconds: float) -> None:
    """Add wall seconds spent tuning ``task_name`` to the work dir's metadata: what a user
    pays for the schedules (summed over resumed and interrupted runs; lost on a kill)."""
    meta = read_meta(work_dir)
    for entry in meta["tasks"]:
        if entry["name"] == task_name:
            entry["tuning_s"] = round(entry.get("tuning_s", 0.0) + seconds, 1)
    write_meta(work_dir, meta)


def report(work_dir: str) -> dict:
    """Per-task best latency, trials and kernels, plus the weighted end-to-end estimate."""
    meta = read_meta(work_dir)
    repair_database(work_dir, log=lambda _: None)
    database = open_database(work_dir)
    rows, total, complete = [], 0.0, True
    tuning_s = {e["name"]: e.get("tuning_s") for e in meta["tasks"]}
    for task in load_tasks(work_dir, meta):
        best = best_record(database, task.mod)
        secs = record_seconds(best) if best is not None else None
        row = {"name": task.name, "weight": task.weight,
               "trials": len(records_of(database, task.mod)),
               "best_us": None if secs is None else secs * 1e6,
               "kernels": None if best is None else kernels_of(best, task.mod),
               "tuning_s": tuning_s.get(task.name)}
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


# ----------------------------------------------------------------------------- compile/run
def apply_database(workload, target, work_dir: str) -> tvm.IRModule:
    """The workload's fused module with every function found in the database scheduled.

    Applied to the fused module as it is: TVM's ``compile_relax`` re-runs LegalizeOps /
    AnnotateTIROpPattern / FuseOps first, which adds attributes to the fused PrimFuncs,
    and then only 2 of ResNet-50's 31 functions still matched their tuned workloads (the
    rest ran untuned, ~30x slower end to end).
    """
    from tvm import relax

    with target, tvm.transform.PassContext(opt_level=3), open_database(work_dir):
        return relax.transform.MetaScheduleApplyDatabase()(workload.mod)


def compile_workload(workload, target, work_dir: str | None):
    """Build the workload with the database's schedules (TVM's defaults for the rest)."""
    from tvm import relax

    mod = workload.mod if work_dir is None else apply_database(workload, target, work_dir)
    with target, tvm.transform.PassContext(opt_level=3):
        return relax.build(mod, target=target)


def device_for(target):
    return tvm.cuda(0) if target.kind.name == "cuda" else tvm.cpu(0)


def make_vm(executable, target):
    from tvm import relax

    return relax.VirtualMachine(executable, device_for(target))


def run_workload(vm, workload, target):
    """Run ``main`` on the workload's inputs; returns the output as NumPy."""
    dev = device_for(target)
    args = [tvm.runtime.tensor(x, dev) for x in workload.inputs]
    return vm["main"](*args).numpy()
