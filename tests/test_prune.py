"""tvm-ext prune: the records of modules that are no longer a task of the work dir go, every
task keeps all of its records, the workload file stays byte for byte."""
import pytest
from toy_database import commit as _commit
from toy_database import toy_mod as _mod
from toy_database import toy_work_dir

from tvm_ext.tune import database as D
from tvm_ext.tune.driver import Task, save_tasks
from tvm_ext.tune.prune import prune


def test_prune_keeps_the_tasks_records_only(tmp_path):
    work_dir = str(tmp_path / "wd")
    old, new, same = _mod(lambda x: x + 1), _mod(lambda x: x * 3), _mod(lambda x: x - 5)
    toy_work_dir(work_dir, {"k": old, "s": same})
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
    toy_work_dir(work_dir, {"k": mod})
    _commit(D.open_database(work_dir), mod, 1e-3)
    with open(tmp_path / "wd" / D.RECORDS, "ab") as f:
        f.write(b'[0,[["partial')
    before = (tmp_path / "wd" / D.RECORDS).read_bytes()
    with pytest.raises(ValueError, match="incomplete; run 'tvm-ext tune'"):
        prune(work_dir)
    assert (tmp_path / "wd" / D.RECORDS).read_bytes() == before


def test_a_task_the_workload_no_longer_has_leaves_no_module_file(tmp_path):
    """A change of the workload's code that renames a task (``..._add_requantize4`` became
    ``..._qlinear_add2``): the old task's stored module goes, the records stay for prune."""
    work_dir = str(tmp_path / "wd")
    toy_work_dir(work_dir, {"old": _mod(lambda x: x + 1), "kept": _mod(lambda x: x - 5)})
    tasks = [Task("kept", 1, _mod(lambda x: x - 5)), Task("new", 1, _mod(lambda x: x * 3))]
    save_tasks(work_dir, D.read_meta(work_dir), tasks)
    files = sorted(p.name for p in (tmp_path / "wd" / "tasks").iterdir())
    assert files == ["000_kept.json", "001_new.json"], files
