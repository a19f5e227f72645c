"""A tiny tuning work dir made in a test: 64x64 element-wise tasks, records committed by hand
(no tuning), so database tests run in milliseconds."""
from types import SimpleNamespace

import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms

from tvm_ext.tune import database as D
from tvm_ext.tune.driver import Task, save_tasks

LLVM = tvm.target.Target("llvm")


def toy_mod(body):
    """``out[i, j] = body(a[i, j])`` over int32 64x64, as an IRModule."""
    a = te.placeholder((64, 64), "int32", name="a")
    out = te.compute((64, 64), lambda i, j: body(a[i, j]), name="T_out")
    return tvm.IRModule({"main": te.create_prim_func([a, out])})


def commit(db, mod, secs):
    """A record of ``mod`` (its outer loop parallel) measured at ``secs``."""
    sch = tvm.s_tir.Schedule(mod)
    sch.parallel(sch.get_loops(sch.get_sblock("T_out"))[0])
    db.commit_tuning_record(ms.database.TuningRecord(
        sch.trace, db.commit_workload(mod), run_secs=[secs], target=LLVM,
        args_info=ms.arg_info.ArgInfo.from_prim_func(mod["main"])))


def toy_work_dir(work_dir: str, tasks: dict) -> dict:
    """A work dir of workload "toy" whose tasks are ``{name: mod}``; returns its metadata."""
    meta = D.prepare_work_dir(work_dir, SimpleNamespace(name="toy", options={}), LLVM, "plugin")
    save_tasks(work_dir, meta, [Task(name, 1, mod) for name, mod in tasks.items()])
    return D.read_meta(work_dir)


def tiny_workload():
    """A Relax workload of three small tasks (matmul, matmul with the second operand transposed,
    row sum; 32x32 float32) that tune in about a second per trial, each with a design space of
    many distinct candidates (an element-wise task may offer one): for tests of the drivers."""
    from tvm import relax, topi

    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((32, 32), "float32"))
    with bb.function("main", [a]):
        with bb.dataflow():
            m = bb.emit_te(lambda x: topi.nn.matmul(x, x), a, primfunc_name_hint="mm")
            r = bb.emit_te(lambda x: topi.nn.matmul(x, x, transpose_b=True), m, primfunc_name_hint="mmt")
            out = bb.emit_output(bb.emit_te(lambda x: topi.sum(x, axis=1), r, primfunc_name_hint="rowsum"))
        bb.emit_func_output(out)
    return SimpleNamespace(name="tiny", options={}, mod=bb.get())
