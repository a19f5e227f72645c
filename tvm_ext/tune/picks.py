"""Schedules picked inside the network: a work dir's ``in_network_picks.json``.

The tuner ranks a task's schedules by their runs alone, weights and activations hot in the
cache; inside the network a kernel finds them where its neighbours left them, and a task's
second-best record can run faster there than its best (ResNet-50's 7x7 convs, weights of
1-2.4 MiB: 343 vs 293 us, ``docs/journal.md``).  ``bench.in_network`` times the
top records of every task inside the running network and writes here which one to use; this
module reads that file and gives the database the network is compiled with.

A pick names its record by ``trace_key`` (a hash of the trace's text) and also records the
task's best record at the time: once tuning adds a better record, the pick no longer applies
and the best is used, as without a pick.  Measured times, never rewritten, stay the records'.
"""
from __future__ import annotations

import hashlib
import json
import os

import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from tvm_ext.jsonio import write_json
from tvm_ext.tune.database import open_database, record_seconds, records_of

PICKS_FILE = "in_network_picks.json"


def trace_key(record) -> str:
    """A short stable name of a record's schedule: the hash of its trace's text (decisions included)."""
    return hashlib.sha256(str(record.trace).encode()).hexdigest()[:16]


def ranked(database, mod, k: int) -> list:
    """The ``k`` fastest records of ``mod`` with distinct schedules, fastest first."""
    out, seen = [], set()
    for record in sorted((r for r in records_of(database, mod) if record_seconds(r) is not None),
                         key=record_seconds):
        key = trace_key(record)
        if key not in seen:
            seen.add(key)
            out.append(record)
        if len(out) == k:
            break
    return out


def read_picks(work_dir: str) -> dict:
    """{task name: pick} of the work dir ({} without a picks file)."""
    path = os.path.join(work_dir, PICKS_FILE)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)["picks"]


def write_picks(work_dir: str, picks: dict, about: dict) -> str:
    """Write ``picks`` {task: {"best", "pick", ...}} with ``about`` (how they were measured)."""
    path = os.path.join(work_dir, PICKS_FILE)
    write_json(path, {**about, "picks": picks})
    return path


def chosen_records(database, picks: dict) -> list:
    """One record per module of ``database``: the picked one where a pick applies (the module's best
    record is the one it was picked against), else the best."""
    by_module = {}
    for record in database.get_all_tuning_records():
        if record_seconds(record) is not None:
            by_module.setdefault(tvm_ffi.structural_hash(record.workload.mod), []).append(record)
    wanted = {pick["best"]: pick["pick"] for pick in picks.values()}
    out = []
    for records in by_module.values():
        records.sort(key=record_seconds)
        best = trace_key(records[0])
        out.append(next((r for r in records if trace_key(r) == wanted.get(best)), records[0]))
    return out


def as_database(records) -> ms.database.MemoryDatabase:
    """A database holding exactly ``records`` (one per task): what ``apply_database`` compiles with."""
    memory = ms.database.MemoryDatabase()
    for record in records:
        workload = memory.commit_workload(record.workload.mod)
        memory.commit_tuning_record(ms.database.TuningRecord(record.trace, workload, record.run_secs,
                                                             record.target, record.args_info))
    return memory


def picked_database(work_dir: str):
    """The database a network of ``work_dir`` compiles with: its own, or, with picks, one record per
    module as ``chosen_records`` says."""
    database = open_database(work_dir, read_only=True)
    picks = read_picks(work_dir)
    if not picks:
        return database
    return as_database(chosen_records(database, picks))
