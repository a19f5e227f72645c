"""tvm-ext tune --reuse-schedules: a task whose TIR changed (same blocks and loops, another
epilogue) gets its old best schedule replayed on the new TIR as its first record; one whose
blocks changed is left to the search."""
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms

from tvm_ext.tune import transfer
from tvm_ext.tune.database import best_record, records_of
from tvm_ext.tune.driver import Task

LLVM = tvm.target.Target("llvm")


def _mod(body, name="T_out"):
    a = te.placeholder((64, 256), "int32", name="a")
    out = te.compute((64, 256), lambda i, j: body(a[i, j]), name=name)
    return tvm.IRModule({"main": te.create_prim_func([a, out])})


def _scheduled(mod, block="T_out"):
    sch = tvm.s_tir.Schedule(mod)
    i, j = sch.get_loops(sch.get_sblock(block))
    _, lanes = sch.split(j, [None, 16])
    sch.parallel(i)
    sch.vectorize(lanes)
    return sch


def _commit(db, sch, mod, secs):
    db.commit_tuning_record(ms.database.TuningRecord(
        sch.trace, db.commit_workload(mod), run_secs=[secs], target=LLVM,
        args_info=ms.arg_info.ArgInfo.from_prim_func(mod["main"])))


def test_old_schedule_replayed_on_the_changed_task(monkeypatch):
    old, new = _mod(lambda x: x + 1), _mod(lambda x: (x * 3).astype("float32").astype("int32"))
    renamed_old, renamed_new = _mod(lambda x: x - 1, "T_a"), _mod(lambda x: x - 2, "T_b")
    same = _mod(lambda x: x * 5)
    db = ms.database.MemoryDatabase()
    _commit(db, _scheduled(old), old, 1.0)
    _commit(db, _scheduled(renamed_old, "T_a"), renamed_old, 1.0)
    _commit(db, _scheduled(same), same, 1.0)
    measured = []

    def fake_seconds(mods, target, runner, builder=None):
        measured.extend(mods)
        return {name: 2e-6 for name in mods}

    monkeypatch.setattr(transfer, "runner_seconds", fake_seconds)
    lines = []
    n = transfer.reuse_schedules([Task("k", 1, old), Task("r", 1, renamed_old), Task("s", 1, same)],
                                 [Task("k", 1, new), Task("r", 1, renamed_new), Task("s", 1, same)],
                                 db, LLVM, runner=None, log=lines.append)
    assert n == 1 and measured == ["k"]
    record = best_record(db, new)
    assert record is not None and float(record.run_secs[0]) == 2e-6
    tvm.ir.assert_structural_equal(transfer.replayed(record, new).mod, _scheduled(new).mod)
    assert not records_of(db, renamed_new)  # its blocks changed: left to the search, said in one line
    assert any(line.startswith("r: its old schedule does not apply") for line in lines)
    assert len(records_of(db, same)) == 1  # unchanged TIR: nothing to carry over
    # a task that already has a record of its new TIR is left alone
    assert transfer.reuse_schedules([Task("k", 1, old)], [Task("k", 1, new)], db, LLVM, None, log=lines.append) == 0


def test_a_schedule_failing_on_the_new_tir_is_skipped(monkeypatch):
    old, new = _mod(lambda x: x + 1), _mod(lambda x: x + 7)
    db = ms.database.MemoryDatabase()
    _commit(db, _scheduled(old), old, 1.0)

    def failing(mods, target, runner, builder=None):
        raise RuntimeError("running k with the tuning runner failed: boom\nmore")

    monkeypatch.setattr(transfer, "runner_seconds", failing)
    lines = []
    assert transfer.reuse_schedules([Task("k", 1, old)], [Task("k", 1, new)], db, LLVM, None, log=lines.append) == 0
    assert not records_of(db, new)
    assert any("failed on the new TIR (running k with the tuning runner failed: boom)" in line for line in lines)
