"""Use a database: the best schedule of a task, a workload compiled with the database's
schedules, and running it."""
from __future__ import annotations

import tvm

from tvm_ext.tir_utils import top_level_nests


def scheduled_mod(record, mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with the record's trace (postprocessors included) applied."""
    sch = tvm.s_tir.Schedule(mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod


def kernels_of(record, mod: tvm.IRModule) -> int:
    """Top-level loop nests (llvm) / kernels (cuda) of a record's schedule of ``mod``."""
    return top_level_nests(scheduled_mod(record, mod)["main"])


def apply_database(workload, target, work_dir: str) -> tvm.IRModule:
    """The workload's fused module with every function found in the work dir's database scheduled
    (each task's best record, or the one picked inside the network: ``tune.picks``)."""
    from tvm_ext.tune.picks import picked_database  # pylint: disable=import-outside-toplevel

    return apply_with(workload, target, picked_database(work_dir))


def apply_with(workload, target, database) -> tvm.IRModule:
    """The workload's fused module scheduled by ``tvm_ext.ApplySchedules``: every function ``database``
    holds by its best record (marked ``tirx.is_scheduled``, as TVM's ``MetaScheduleApplyDatabase`` marks
    it), the others by our rules where they match, else dlight; without a database, ``rule``.

    Applied to the fused module as it is: TVM's ``compile_relax`` re-runs LegalizeOps /
    AnnotateTIROpPattern / FuseOps first, which adds attributes to the fused PrimFuncs,
    and then only 2 of ResNet-50's 31 functions still matched their tuned workloads (the
    rest ran untuned, ~30x slower end to end).
    """
    from tvm_ext.scheduling import ApplySchedules

    with target, tvm.transform.PassContext(opt_level=3):
        return ApplySchedules(target, "rule" if database is None else "tuned", database=database)(workload.mod)


def compile_workload(workload, target, work_dir: str | None, database=None):
    """Build the workload scheduled by ``apply_with``: with ``database`` where given, else the work dir's
    (``apply_database``), else none (our rules, dlight for the rest)."""
    from tvm import relax

    if database is None and work_dir is not None:
        mod = apply_database(workload, target, work_dir)
    else:
        mod = apply_with(workload, target, database)
    with target, tvm.transform.PassContext(opt_level=3):
        return relax.build(mod, target=target)


def device_for(target):
    return tvm.cuda(0) if target.kind.name == "cuda" else tvm.cpu(0)


def make_vm(executable, target):
    """A Relax VM for ``executable`` in this process; on an AMX target it first asks the
    kernel for tile permission (``tvm_ext.amx.request_amx``: one clear error if refused)."""
    from tvm import relax

    from tvm_ext.amx import request_amx  # pylint: disable=import-outside-toplevel
    from tvm_ext.targets import has_amx  # pylint: disable=import-outside-toplevel

    if has_amx(target):
        request_amx()
    return relax.VirtualMachine(executable, device_for(target))


def run_workload(vm, workload, target):
    """Run ``main`` on the workload's inputs; returns the output as NumPy."""
    dev = device_for(target)
    args = [tvm.runtime.tensor(x, dev) for x in workload.inputs]
    return vm["main"](*args).numpy()
