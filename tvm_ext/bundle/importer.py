"""``tvm-ext bundle import RESULTS``: measured variants become MetaSchedule tuning records.

Each result row that passed its check and was timed is committed, with its measured seconds and the
bundle's target, as a record of its task's module and its variant's trace (kept in the bundle's
``host/`` directory): a network's tasks into the rule set's tuning work dir (``tvm-ext tune``'s layout,
``<root>/<workload>-<target>-<ruleset>``; the untuned rows into every rule set the bundle sampled), the
Phi-2 kernels into the bench's ``seeded`` databases (``<root>/phi2-decode-<target>-<fused|unfused>/seeded``).
``tvm-ext report`` and ``bench --from-logs --logs-dir <root>`` read them, and the next ``bundle build
--from-work-dir`` starts from them.  Idempotent and resumable: a record whose trace the database holds
for that task already is not committed again, so a second import (or one after a kill) adds only what
is missing.  Failed rows are counted, not recorded (MetaSchedule's records of failures carry no trace
worth replaying).
"""
from __future__ import annotations

import json
import os
from types import SimpleNamespace



def read_rows(path: str) -> list:
    """The complete JSON lines of a results file (a torn last line is skipped)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


class _Databases:
    """The databases an import writes, each opened once, with each task's traces already held."""

    def __init__(self, root: str, build: dict, target, log):
        self.root, self.build, self.target, self.log = root, build, target, log
        self.open, self.held = {}, {}

    def for_item(self, item: dict, ruleset: str, mod, job: dict):
        from tvm_ext.bundle import sources
        from tvm_ext.tune import database as D
        from tvm_ext.tune.driver import Task, save_tasks
        from tvm_ext.tune.kernels import kernel_database

        if item["experiment"].startswith("phi2"):
            fusion = item["group"].endswith("/fused")
            path = sources.phi2_db_dir(self.root, self.target, fusion)
            key = path
            if key not in self.open:
                self.open[key] = kernel_database(path, log=lambda _m: None)
        else:
            path = D.default_work_dir(item["experiment"], self.target, ruleset, root=self.root)
            key = path
            if key not in self.open:
                wl = SimpleNamespace(name=item["experiment"], options=self.build["options"][item["experiment"]])
                meta = D.prepare_work_dir(path, wl, self.target, ruleset, self.log)
                if not meta.get("tasks"):  # a new work dir: the bundle's tasks (an old one keeps its own)
                    tasks = [Task(j["name"], j["weight"], _task_mod(self.build["dir"], j["index"]))
                             for j in self.build["jobs"] if j["experiment"] == item["experiment"]]
                    save_tasks(path, meta, tasks)
                self.open[key] = D.open_database(path)
        return key, self.open[key]

    def holds(self, key: str, db, mod, sch) -> bool:
        """Whether ``db`` has a record of ``mod`` whose schedule gives ``sch``'s TIR (then this one is not
        committed again: imports are idempotent)."""
        import tvm_ffi

        from tvm_ext.bundle.assemble import tvm_schedule
        from tvm_ext.tune.database import records_of

        cache = self.held.get((key, id(mod)))
        if cache is None:
            cache = {tvm_ffi.structural_hash(tvm_schedule(mod, r.trace).mod) for r in records_of(db, mod)}
            self.held[(key, id(mod))] = cache
        h = tvm_ffi.structural_hash(sch.mod)
        if h in cache:
            return True
        cache.add(h)
        return False


def _task_mod(bundle_dir: str, index: int):
    import tvm

    with open(os.path.join(bundle_dir, "host", f"task_{index:03d}.json"), encoding="utf-8") as f:
        return tvm.ir.load_json(f.read())


def import_results(results: str, bundle_dir: str, root: str, log=print) -> dict:
    """Commit the measured variants of ``results`` (a runner's results file of the bundle at
    ``bundle_dir``) as tuning records under ``root``; returns the counts (module doc)."""
    from tvm.s_tir import Schedule, Trace

    from tvm_ext.targets import resolve_target
    from tvm_ext.tune.database import register_record_intrinsics
    from tvm_ext.tune.transfer import commit_measured

    host = os.path.join(bundle_dir, "host")
    if not os.path.isfile(os.path.join(host, "build.json")):
        raise ValueError(f"{bundle_dir} is not a bundle built here (no host/build.json)")
    if not os.path.isfile(results):
        raise ValueError(f"no results file {results}")
    with open(os.path.join(host, "build.json"), encoding="utf-8") as f:
        build = dict(json.load(f), dir=bundle_dir)
    with open(os.path.join(bundle_dir, "ship", "manifest.json"), encoding="utf-8") as f:
        items = {i["id"]: i for i in json.load(f)["items"]}
    target = resolve_target(build["target"])
    dbs = _Databases(root, build, target, log)
    counts = {"committed": 0, "already": 0, "failed": 0, "unknown": 0, "not_records": 0}
    traces, mods = {}, {}
    for row in read_rows(results):
        if row.get("kind") != "kernel":
            continue
        item = items.get(row.get("id"))
        if item is None:
            counts["unknown"] += 1
            continue
        if not row.get("ok") or row.get("seconds") is None:
            counts["failed"] += 1
            continue
        index = item["task_index"]
        if index not in traces:
            path = os.path.join(host, f"traces_{index:03d}.json")
            register_record_intrinsics(path)  # the tensor intrinsics its traces name
            with open(path, encoding="utf-8") as f:
                traces[index] = json.load(f)
            mods[index] = _task_mod(bundle_dir, index)
        trace_json = traces[index].get(item["label"])
        if trace_json is None:
            counts["not_records"] += 1
            continue
        rulesets = [item["ruleset"]] if item["ruleset"] else (build["rulesets"] or ["plugin"])
        for ruleset in rulesets:
            key, db = dbs.for_item(item, ruleset, mods[index], build)
            sch = Schedule(mods[index])
            Trace.apply_json_to_schedule(trace_json, sch)
            if dbs.holds(key, db, mods[index], sch):
                counts["already"] += 1
                continue
            commit_measured(db, mods[index], sch, float(row["seconds"]), target)
            counts["committed"] += 1
    log(f"imported {results}: {counts['committed']} records committed, {counts['already']} already there, "
        f"{counts['failed']} failed rows not recorded, into {len(dbs.open)} databases under {root}")
    return counts
