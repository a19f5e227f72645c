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


# --------------------------------------------------------------------------- u8 x s8 forms
def _vnni_record_of(case):
    """A candidate of the plugin's space for a VNNI CPU (cascadelake) on ``case``, committed to
    a MemoryDatabase as another machine's tuning would have: its record."""
    import tvm_ext
    from tvm_ext.tune.sampling import sample_candidates, tune_context

    vnni = tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2})
    ctx = tune_context(case.mod, vnni, tvm_ext.space(vnni))
    (sch,) = sample_candidates(case.mod, vnni, tvm_ext.space(vnni), 1, seed=2, context=ctx,
                               postprocs=list(ctx.space_generator.postprocs))
    db = ms.database.MemoryDatabase()
    _commit(db, sch, case.mod, 1e-3)
    return best_record(db, case.mod)


def test_a_vnni_schedule_is_retargeted_to_the_avx2_forms(tmp_path, monkeypatch):
    """A schedule tuned with vpdpbusd replays on an AVX2-only CPU with the form its rule would
    give the block (exact vpmaddwd for 8-bit weights, vpmaddubsw for annotated 7-bit ones), and
    the network it builds is exact; the main job's transfer goes through it."""
    import numpy as np
    import qnn_cases as C

    from tvm_ext.intrinsics import vnni as I
    from tvm_ext.targets import has_avx2, host_target
    from tvm_ext.tune.database import open_database

    avx2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
    full = C.conv2d_case(h=6, w=6, c_in=16, c_out=32, seed=4)  # 8-bit weights
    fit = C.annotated(C.conv2d_case(h=6, w=6, c_in=16, c_out=32, w_max=64))  # 7-bit, vouched for
    for case, form in ((full, I.AVX2_EXACT_INTRIN), (fit, I.AVX2_INTRIN)):
        record = _vnni_record_of(case)
        assert f'"{I.AVX512_VNNI_INTRIN}"' in str(record.trace)
        for same in ("cascadelake", "x86-64"):  # its own form; no form at all
            assert transfer.retargeted(record.trace, case.mod, {"kind": "llvm", "mcpu": same}).same_as(record.trace)
        moved = transfer.replayed(record, case.mod, avx2)
        assert f'"{form}"' in str(moved.trace) and I.AVX512_VNNI_INTRIN not in str(moved.trace)
        lib = tvm.compile(moved.mod, target=avx2)
        assert "vpdpbusd" not in lib.mod.inspect_source("asm")
        if has_avx2(host_target()):
            np.testing.assert_array_equal(C.run_case(case, lib), case.reference())

    # transfer_schedules: the saved (VNNI) database's best, retargeted, measured, committed here
    record = _vnni_record_of(full)
    source = tmp_path / "saved"
    source.mkdir()
    target_db = open_database(str(source))
    _commit(target_db, transfer.replayed(record, full.mod), full.mod, 1e-3)
    measured = {}
    monkeypatch.setattr(transfer, "runner_seconds",
                        lambda mods, target, runner, builder=None: measured.update(mods) or {m: 2e-3 for m in mods})
    here = ms.database.MemoryDatabase()
    assert transfer.transfer_schedules(str(source), [Task("conv", 1, full.mod)], here, avx2, runner=None,
                                       log=lambda _: None) == 1
    (mod,) = measured.values()
    assert f'"{I.AVX2_EXACT_INTRIN}"' in str(best_record(here, full.mod).trace)
    assert "vpdpbusd" not in tvm.compile(mod, target=avx2).mod.inspect_source("asm")
