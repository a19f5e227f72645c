"""A tuning work dir's history: every task's measured candidates in the order they were tuned.

MetaSchedule's JSONDatabase appends each measured candidate as one line of
``database_tuning_record.json`` (``[workload line, [trace, run_secs, target, args]]``) and keeps
no time: the file order is the order of measurement, per task the order of its trials.  Its
loggers write ``logs/tvm.s_tir.meta_schedule.logging.task_scheduler.log``, whose tables
(``ID | Name | ... | Trials | Done``), timestamped after each measured batch, say how many trials
each task had at that time; a ``Logging directory`` line opens each ``tune_tasks`` call (one per
task in ``tune.driver``).  Records with no logged batch (copied from a saved database, whose logs
``save`` leaves out; transferred from another CPU; tuned on a cluster node) are the task's first
ones and count as already there when the logs begin.  Only reads: no TVM database is opened.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime

from tvm_ext.tune import packed
from tvm_ext.tune.database import DB_FILES, mean_run_seconds, read_meta, record_lines
from tvm_ext.tune.driver import load_tasks

SCHEDULER_LOG = os.path.join("logs", "tvm.s_tir.meta_schedule.logging.task_scheduler.log")
_STAMP = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) \[")


@dataclass
class TaskHistory:
    """One task's records in measurement order: mean run seconds (None: the candidate failed) and,
    where the scheduler log covers it, the tuning seconds at which its batch finished."""
    name: str
    weight: int
    seconds: list = field(default_factory=list)
    times: list = field(default_factory=list)

    def best_so_far(self) -> list:
        """Best seconds after each record (None until one ran)."""
        out, best = [], None
        for s in self.seconds:
            if s is not None and (best is None or s < best):
                best = s
            out.append(best)
        return out

    def first_valid(self):
        return next((s for s in self.seconds if s is not None), None)


@dataclass
class History:
    meta: dict
    tasks: list  # TaskHistory, in the work dir's task order (largest weight first)
    logged_batches: int = 0  # scheduler-log tables that matched a task of this work dir

    def estimate_by_trials(self) -> tuple[list, list]:
        """(k = 1..most trials of a task, weighted estimate in us after each task's first k records).
        A task whose first k records all failed counts at its first record that ran; ([], []) when a
        task has none."""
        if not self.tasks or any(t.first_valid() is None for t in self.tasks):
            return [], []
        curves = [(t.weight, t.best_so_far(), t.first_valid()) for t in self.tasks]
        ks = list(range(1, max(len(c) for _, c, _ in curves) + 1))
        est = [sum(w * ((c[min(k, len(c)) - 1]) or first) for w, c, first in curves) * 1e6 for k in ks]
        return ks, est

    def estimate_over_time(self) -> tuple[list, list]:
        """(tuning seconds, weighted estimate in us) after each logged batch; the records the logs do
        not cover count from the start; tasks not measured yet count at their first record that ran.
        ([], []) without logged batches or while a task has no record that ran."""
        if not self.logged_batches or any(t.first_valid() is None for t in self.tasks):
            return [], []
        best = {t.name: None for t in self.tasks}
        events = []
        for t in self.tasks:
            for s, when in zip(t.seconds, t.times):
                if when is None:
                    best[t.name] = _better(best[t.name], s)
                else:
                    events.append((when, t.name, s))
        events.sort(key=lambda e: e[0])
        first = {t.name: t.first_valid() for t in self.tasks}
        weight = {t.name: t.weight for t in self.tasks}

        def total():
            return sum(weight[n] * (b if b is not None else first[n]) for n, b in best.items()) * 1e6

        xs, ys = [0.0], [total()]
        for when, name, s in events:
            best[name] = _better(best[name], s)
            if when == xs[-1]:
                ys[-1] = total()
            else:
                xs.append(when)
                ys.append(total())
        return xs, ys


def _better(best, s):
    return s if s is not None and (best is None or s < best) else best


def read_history(work_dir: str) -> History:
    """The work dir's tasks with their records in file order, timed from the scheduler log."""
    import tvm_ffi

    meta = read_meta(work_dir)
    tasks = load_tasks(work_dir, meta)
    by_hash = {str(tvm_ffi.structural_hash(t.mod)): TaskHistory(t.name, t.weight) for t in tasks}
    stored = all(packed.exists(os.path.join(work_dir, name)) for name in DB_FILES)  # none before a first record
    for shash, line in record_lines(work_dir) if stored else []:
        task = by_hash.get(shash)
        if task is not None:  # records of modules that are no longer a task are left out
            task.seconds.append(mean_run_seconds(json.loads(line)[1][1]))
            task.times.append(None)
    histories = list(by_hash.values())
    logged = _time_records(histories, read_scheduler_log(os.path.join(work_dir, SCHEDULER_LOG)))
    return History(meta, histories, logged)


def _time_records(histories: list, batches: list) -> int:
    """Give each task's last records the times of its logged batches (in order); returns the
    batches that matched a task."""
    by_name = {h.name: h for h in histories}
    times = {}
    matched = 0
    for when, name, added in batches:
        if name in by_name:
            times.setdefault(name, []).extend([when] * added)
            matched += 1
    for name, stamps in times.items():
        h = by_name[name]
        stamps = stamps[-len(h.seconds):] if h.seconds else []
        h.times[len(h.seconds) - len(stamps):] = stamps
    return matched


def read_scheduler_log(path: str) -> list:
    """[(tuning seconds, task name, trials added)] per measured batch of MetaSchedule's
    task-scheduler log, in order; tuning seconds count from each call's ``Logging directory``
    line, summed over the calls (the time between calls -- other runs, days apart -- left out).
    [] when there is no log."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out, elapsed, call_start, last_stamp, seen = [], 0.0, None, None, {}
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _STAMP.match(line)
        if m:
            stamp = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
            if "Logging directory:" in line:  # a new tune_tasks call: its own trial counts
                if call_start is not None and last_stamp is not None:
                    elapsed += (last_stamp - call_start).total_seconds()
                call_start, seen = stamp, {}
            last_stamp = stamp
        elif "| Trials |" in line and call_start is not None:
            head = [c.strip() for c in line.split("|")]
            i += 2  # the dashes under the header
            while i < len(lines) and "|" in lines[i]:
                cells = [c.strip() for c in lines[i].split("|")]
                if len(cells) == len(head) and cells[head.index("Trials")].isdigit():
                    name, trials = cells[head.index("Name")], int(cells[head.index("Trials")])
                    if trials > seen.get(name, 0):
                        when = elapsed + (last_stamp - call_start).total_seconds()
                        out.append((when, name, trials - seen.get(name, 0)))
                        seen[name] = trials
                i += 1
            continue
        i += 1
    return out
