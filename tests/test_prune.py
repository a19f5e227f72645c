"""tvm-ext prune: the records of modules that are no longer a task of the work dir go, every
task keeps all of its records, the workload file stays byte for byte."""
from types import SimpleNamespace

import pytest
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms

from tvm_ext.tune import database as D
from tvm_ext.tune.driver import Task, save_tasks
from tvm_ext.tune.prune import prune

LLVM = tvm.target.Target("llvm")


def _mod(body):
    a = te.placeholder((64, 64), "int32", name="a")
    out = te.compute((64, 64), lambda i, j: body(a[i, j]), name="T_out")
    return tvm.IRModule({"main": te.create_prim_func([a, out])})


def _commit(db, mod, secs):
    sch = tvm.s_tir.Schedule(mod)
    sch.parallel(sch.get_loops(sch.get_sblock("T_out"))[0])
    db.commit_tuning_record(ms.database.TuningRecord(
        sch.trace, db.commit_workload(mod), run_secs=[secs], target=LLVM,
        args_info=ms.arg_info.ArgInfo.from_prim_func(mod["main"])))


def test_prune_keeps_the_tasks_records_only(tmp_path):
    work_dir = str(tmp_path / "wd")
    old, new, same = _mod(lambda x: x + 1), _mod(lambda x: x * 3), _mod(lambda x: x - 5)
    meta = D.prepare_work_dir(work_dir, SimpleNamespace(name="toy", options={}), LLVM, "plugin")
    save_tasks(work_dir, meta, [Task("k", 1, old), Task("s", 1, same)])
    db = D.open_database(work_dir)
    for secs in (1e-3, 2e-3):
        _commit(db, old, secs)
    _commit(db, same, 1e-3)
    save_tasks(work_dir, D.read_meta(work_dir), [Task("k", 1, new), Task("s", 1, same)])  # k's TIR changed
    _commit(db, new, 3e-3)
    workloads = (tmp_path / "wd" / D.WORKLOADS).read_bytes()
    lines = []
    assert prune(work_dir, log=lines.append) == (2, 2)
    assert (tmp_path / "wd" / D.WORKLOADS).read_bytes() == workloads
    after = D.open_database(work_dir, read_only=True)
    assert [len(D.records_of(after, m)) for m in (new, same, old)] == [1, 1, 0]
    assert lines == [f"{work_dir}: kept 2 records of its 2 tasks, dropped 2"]
    assert not list((tmp_path / "wd").glob("*.tmp"))
    assert prune(work_dir, log=lines.append) == (2, 0)  # nothing left to drop


def test_prune_refuses_a_database_a_killed_run_left(tmp_path):
    work_dir = str(tmp_path / "wd")
    mod = _mod(lambda x: x + 1)
    meta = D.prepare_work_dir(work_dir, SimpleNamespace(name="toy", options={}), LLVM, "plugin")
    save_tasks(work_dir, meta, [Task("k", 1, mod)])
    _commit(D.open_database(work_dir), mod, 1e-3)
    with open(tmp_path / "wd" / D.RECORDS, "ab") as f:
        f.write(b'[0,[["partial')
    before = (tmp_path / "wd" / D.RECORDS).read_bytes()
    with pytest.raises(ValueError, match="incomplete; run 'tvm-ext tune'"):
        prune(work_dir)
    assert (tmp_path / "wd" / D.RECORDS).read_bytes() == before
