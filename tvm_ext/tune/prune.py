"""Drop the records a work dir no longer uses (``tvm-ext prune DIR``).

When a workload's code changes a task's TIR, ``save_tasks`` stores the new module and the old
module's records stay in the database, unused: nothing looks them up again, but they are kept,
copied and committed (the AMX ResNet-50 database held 4558 records, 2112 of them its tasks').
Pruning keeps the records of the work dir's stored tasks and drops the rest. The workload file
is left as it is (record lines name their workload by its line number there); the records file
is rewritten beside itself, checked -- every task keeps every record it had -- and moved into
place in one rename, so an interruption leaves the old file or the new one, never a mix.
A saved (compressed) database is unpacked for this and packed again after.
"""
from __future__ import annotations

import os

import tvm_ffi

from tvm_ext.tune import packed
from tvm_ext.tune.database import (RECORDS, WORKLOADS, _env_error, _load, _unpack, check_database, check_writable,
                                   read_meta, record_lines, records_of)
from tvm_ext.tune.driver import load_tasks


def prune(work_dir: str, log=print) -> tuple[int, int]:
    """Keep the records of ``work_dir``'s tasks, drop the others; returns (kept, dropped).
    DatabaseCorrupt (nothing written) for a damaged database: run ``tvm-ext tune`` first."""
    meta = read_meta(work_dir)
    check_writable(work_dir)
    state = check_database(work_dir)
    if state.partial_tail is not None or state.missing_newline:
        raise ValueError(f"{work_dir}: a run left its last line incomplete; run 'tvm-ext tune' with the "
                         "same arguments (it repairs the database) before pruning")
    was_packed = packed.is_packed(work_dir)
    _unpack(work_dir)
    try:
        kept, dropped = _prune(work_dir, meta)
    finally:
        if was_packed:
            packed.pack(work_dir)
    log(f"{work_dir}: kept {kept} records of its {len(meta['tasks'])} tasks, dropped {dropped}")
    return kept, dropped


def _prune(work_dir: str, meta: dict) -> tuple[int, int]:
    mods = [task.mod for task in load_tasks(work_dir, meta)]
    paths = {name: os.path.join(work_dir, name) for name in (WORKLOADS, RECORDS)}
    wanted = {str(tvm_ffi.structural_hash(mod)) for mod in mods}
    lines = record_lines(work_dir)
    kept = [line for shash, line in lines if shash in wanted]
    tmp = paths[RECORDS] + ".prune.tmp"
    try:
        with open(tmp, "wb") as f:
            f.writelines(kept)
        before = _load(paths[WORKLOADS], paths[RECORDS], allow_missing=False)
        after = _load(paths[WORKLOADS], tmp, allow_missing=False)
        lost = [i for i, mod in enumerate(mods) if len(records_of(after, mod)) != len(records_of(before, mod))]
        if lost:  # a task whose records were not all found by hash: write nothing
            raise ValueError(f"{work_dir}: pruning would lose records of {len(lost)} tasks; nothing changed")
        os.replace(tmp, paths[RECORDS])
    except OSError as err:
        raise _env_error("prune", paths[RECORDS], err) from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return len(kept), len(lines) - len(kept)


__all__ = ["prune"]
