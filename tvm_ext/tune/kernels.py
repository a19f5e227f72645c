"""Tune named kernels (single-function IRModules) into one database, and the order in which
their candidates were measured.

A JSONDatabase returns records sorted by run time, so it cannot say how many trials a
kernel needed to get below some time. ``tune_kernels`` therefore keeps, next to the
database, ``measure_order.json``: per kernel (by structural hash of its IRModule) the mean
run seconds of each measured candidate in measurement order (``null`` for one that failed
to build or run), written after every batch by a measure callback once the batch reached
the database. A kill between the two writes loses at most the last batch from the order,
never from the database. Records committed by other means (a seed) are not in the order.
"""
from __future__ import annotations

import os
from typing import Callable

import tvm

from tvm_ext.jsonio import read_json, write_json
from tvm_ext.scheduling import kernel_key  # noqa: F401  (the files beside a database are keyed by it)
from tvm_ext.tune.builder import make_builder
from tvm_ext.tune.database import mean_run_seconds, open_database, records_of, repair_database
from tvm_ext.tune.driver import Task, tune_task
from tvm_ext.tune.runner import make_runner
from tvm_ext.tune.search import after_each_batch

ORDER_FILE = "measure_order.json"


def kernel_database(db_dir: str, log: Callable[[str], None] = print):
    """The JSONDatabase in ``db_dir`` (a bare database directory, no tvm_ext.json), created
    if missing; lines a killed process left half written are dropped first."""
    os.makedirs(db_dir, exist_ok=True)
    repair_database(db_dir, log)
    return open_database(db_dir)


def _read_order(db_dir: str) -> dict:
    return read_json(os.path.join(db_dir, ORDER_FILE), {})


def measure_order(db_dir: str, mod: tvm.IRModule) -> list:
    """Mean run seconds (None = failed) of ``mod``'s tuned candidates in measurement order;
    [] when ``tune_kernels`` never measured it in ``db_dir``."""
    return list(_read_order(db_dir).get(kernel_key(mod), []))


def trials_to_beat(db_dir: str, mod: tvm.IRModule, seconds: float) -> int | None:
    """1-based index of the first tuned candidate of ``mod`` faster than ``seconds``; None if none."""
    for i, secs in enumerate(measure_order(db_dir, mod), 1):
        if secs is not None and secs < seconds:
            return i
    return None


def order_callback(db_dir: str, mod: tvm.IRModule):
    """A measure callback appending each batch's mean run seconds to ``db_dir``'s order file."""
    key = kernel_key(mod)

    def record_order(builder_results, runner_results) -> None:
        batch = [None if built.error_msg or ran.error_msg else mean_run_seconds(ran.run_secs)
                 for built, ran in zip(builder_results, runner_results)]
        order = _read_order(db_dir)
        order[key] = order.get(key, []) + batch
        write_json(os.path.join(db_dir, ORDER_FILE), order, sort_keys=True)

    return after_each_batch(record_order)


def tune_kernels(mods: dict, target, db_dir: str, trials: int, *, log_dir: str | None = None,
                 ruleset: str = "plugin", runner=None, per_iter: int = 8, seed: int = 0,
                 log: Callable[[str], None] = print) -> dict:
    """Tune each ``{name: IRModule}`` kernel up to ``trials`` records in the database in
    ``db_dir``; resumes by counting the records already there (a seed record counts).

    One kernel at a time with the stack's builder, search strategy and space; ``runner``
    defaults to ``make_runner()``. MetaSchedule's logs go to ``<log_dir>/logs/`` (default
    ``db_dir``). Returns ``{name: records added}``.
    """
    if trials < 1:
        raise ValueError(f"trials must be at least 1, not {trials}")
    database = kernel_database(db_dir, log)  # created / repaired and opened once
    added, builder = {}, None
    for i, (name, mod) in enumerate(mods.items()):
        done = len(records_of(database, mod))
        if done >= trials:
            added[name] = 0
            continue
        # started for the first kernel with trials left (a finished database starts none), then shared
        runner = runner if runner is not None else make_runner()
        builder = builder if builder is not None else make_builder()
        log(f"  tuning {name}: {trials - done} trials ({done} in {db_dir})")
        tune_task(Task(name, 1, mod), target, database, log_dir or db_dir, trials - done,
                  ruleset=ruleset, runner=runner, builder=builder, seed=seed + i, per_iter=per_iter,
                  callbacks=[order_callback(db_dir, mod)])
        added[name] = len(records_of(database, mod)) - done
    return added
