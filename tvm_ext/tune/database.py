"""Work dirs and their MetaSchedule JSONDatabase: create, reopen, repair, read records.

A work dir holds a JSONDatabase (``database_workload.json``, ``database_tuning_record.json``),
one file per extracted task under ``tasks/`` and ``tvm_ext.json`` recording workload,
options, target and rule set. A process killed in the middle of a database write leaves
at most one partial line, which ``repair_database`` drops before the database is opened.
"""
from __future__ import annotations

import json
import os
import time

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from tvm_ext.jsonio import write_json
from tvm_ext.rulesets import check_ruleset
from tvm_ext.targets import target_key, target_mismatch, target_to_json

META_FILE = "tvm_ext.json"


DB_FILES = ("database_workload.json", "database_tuning_record.json")


class DatabaseMismatch(ValueError):
    """A work dir that is not a database, or one made for another workload or target."""


def default_work_dir(workload: str, target, ruleset: str, root: str = "tuning_logs") -> str:
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
    from tvm_ext.intrinsics.vnni import register_intrinsics

    register_intrinsics()  # records of VNNI-tensorized schedules name our intrinsics
    return ms.database.JSONDatabase(work_dir=work_dir, module_equality="structural")


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
