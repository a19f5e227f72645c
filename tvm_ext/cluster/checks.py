"""What a node sends back is checked before one line of it reaches the database.

A worker returns the records of one task. The driver commits them only if all of them hold:
the result is the task's and names the target the task was sent with; there are no more records
than the trials the task had left; each record parses, names that target, has run times that are
finite and positive, and its trace replays on the driver's own module of the task. A result that
fails is refused whole (``BadResult``: one line naming what), so a node that is broken or forged
commits nothing, and the task runs again elsewhere.
"""
from __future__ import annotations

import json
import math


class BadResult(ValueError):
    """A node's result that is not committed (the message is one line)."""


def checked_records(result, job: dict, mod, workload) -> list:
    """The ``TuningRecord``s of ``result`` (what ``tune_remote`` returns for ``job``), each checked
    against ``mod`` (the driver's module of the task) and ``workload`` (its database entry);
    BadResult where anything fails."""
    from tvm.s_tir import meta_schedule as ms

    from tvm_ext.targets import target_to_json
    from tvm_ext.tune.transfer import replayed

    if not isinstance(result, dict) or not isinstance(result.get("records"), list):
        raise BadResult(f"not a result: {type(result).__name__}")
    if result.get("name") != job["name"]:
        raise BadResult(f"the result of task {result.get('name')!r}, sent {job['name']!r}")
    want = json.loads(job["target"])
    if result.get("target") is None or json.loads(result["target"]) != want:
        raise BadResult(f"tuned for another target than the one sent ({_short(result.get('target'))})")
    texts = result["records"]
    if len(texts) > job["trials"]:
        raise BadResult(f"{len(texts)} records for the {job['trials']} trials the task had left")
    records = []
    for k, text in enumerate(texts, 1):
        try:
            record = ms.database.TuningRecord.from_json(json.loads(text), workload)
        except Exception as err:  # noqa: BLE001 -- anything malformed: this result is refused
            # parsing replays the trace on the workload's module: a trace naming blocks it lacks fails here
            lines = [ln for ln in str(err).strip().splitlines() if ln.strip() and "not rendered" not in ln]
            raise BadResult(f"record {k} is malformed or its trace does not replay on the task's module"
                            + (f" ({_short(lines[-1])})" if lines else "")) from None
        if record.target is None or target_to_json(record.target) != want:
            raise BadResult(f"record {k} names another target")
        secs = [float(s) for s in (record.run_secs or [])]
        if not secs or not all(math.isfinite(s) and s > 0 for s in secs):
            raise BadResult(f"record {k} has run times that are not finite and positive: {secs[:4]}")
        if replayed(record, mod) is None:
            raise BadResult(f"record {k}'s schedule does not replay on the task's module")
        records.append(record)
    return records


def _short(text, n: int = 80) -> str:
    text = str(text)
    return text if len(text) <= n else text[:n - 3] + "..."


__all__ = ["BadResult", "checked_records"]
