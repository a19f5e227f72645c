"""Carry schedules over: to tasks whose TIR changed (``tvm-ext tune --reuse-schedules``), and from
a saved database tuned on another CPU (``transfer_schedules``: the main job on a new machine).

When a workload's code changes a task's TIR but not its loops and blocks (an epilogue computed
another way: ``qnn_float``), the database has no record of the new module, and tuning would
start from nothing. Here the best record of the old module of the same task name has its trace
replayed on the new module; where that succeeds, the schedule is built and measured by the
tuning runner, like any candidate, and committed as the new module's first record. The search
then starts from it (MetaSchedule seeds its population with the database's best) and keeps it
only while nothing it measures is faster. A trace that does not replay (blocks renamed, loops
changed) is skipped with one line: that task is tuned from scratch.

A schedule tensorized with another CPU's form of the 16x4 u8 x s8 product (``vpdpbusd`` on a VNNI
host) is replayed with this target's (``retargeted``): the forms share one description and layout.
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from tvm_ext.tune.builder import make_builder
from tvm_ext.tune.database import best_record, records_of
from tvm_ext.tune.runner import runner_seconds


def retargeted(trace, mod: tvm.IRModule, target):
    """``trace`` with the 16x4 u8 x s8 intrinsic it names swapped for the form ``target``'s rule
    gives ``mod``'s block (``vnni.block_form``): all forms share one description and one packed
    layout, so a schedule tuned with ``vpdpbusd`` replays on an AVX2-only CPU with ``vpmaddwd``.
    The same trace where ``target`` has no form or the trace names none."""
    from tvm.s_tir.schedule import Instruction, Trace  # pylint: disable=import-outside-toplevel

    from tvm_ext.intrinsics.vnni import U8S8_FORMS, block_form, u8s8_intrin_name
    from tvm_ext.rules.vnni_tensorize import annotated_pairs_fit
    from tvm_ext.tir_utils import blocks_of, prim_funcs

    here = u8s8_intrin_name(target)
    if here is None:
        return trace
    fits = any(annotated_pairs_fit(b) for _, func in prim_funcs(mod) for b in blocks_of(func))
    want = block_form(here, fits)

    def other_form(value) -> bool:
        return isinstance(value, str) and value in U8S8_FORMS and value != want

    def swap(values):
        return [want if other_form(v) else v for v in values]

    if not any(other_form(v) for inst in trace.insts for v in [*inst.inputs, *inst.attrs]):
        return trace
    insts, decisions = [], {}
    for inst in trace.insts:
        new = Instruction(inst.kind, swap(inst.inputs), swap(inst.attrs), inst.outputs)
        insts.append(new)
        decision = trace.get_decision(inst)
        if decision is not None:
            decisions[new] = decision
    return Trace(insts, decisions)


def replayed(record, mod: tvm.IRModule, target=None):
    """The schedule of ``mod`` given by ``record``'s trace (postprocessors included; its u8 x s8
    form ``retargeted`` to ``target`` when given), or None where the trace does not apply to it."""
    sch = tvm.s_tir.Schedule(mod)
    trace = record.trace if target is None else retargeted(record.trace, mod, target)
    try:
        trace.apply_to_schedule(sch, remove_postproc=False)
    except (RuntimeError, ValueError, KeyError, IndexError):  # ScheduleError, TVM internal errors
        return None
    return sch


def reuse_schedules(old_tasks, new_tasks, database, target, runner, builder=None, log=print) -> int:
    """For every task of ``new_tasks`` with no record in ``database`` whose TIR differs from the
    same-named task of ``old_tasks``: commit the old best schedule replayed on it, measured by
    ``runner`` (see the module doc). Returns how many were committed."""
    old = {t.name: t for t in old_tasks}
    picked = {}
    for task in new_tasks:
        before = old.get(task.name)
        if before is None or records_of(database, task.mod) or tvm_ffi.structural_equal(before.mod, task.mod):
            continue
        record = best_record(database, before.mod)
        sch = replayed(record, task.mod) if record is not None else None
        if sch is None:
            log(f"{task.name}: its old schedule does not apply to the new TIR; tuned from scratch")
            continue
        picked[task.name] = (task, sch)
    if not picked:
        return 0
    log(f"measuring the old schedules of {len(picked)} changed tasks on their new TIR ...")
    builder = builder if builder is not None else make_builder()  # one builder (a worker pool) for all
    committed = 0
    for name, (task, sch) in picked.items():
        try:
            secs = runner_seconds({name: sch.mod}, target, runner, builder)[name]
        except RuntimeError as err:  # built or ran wrong: that task starts from nothing
            log(f"{name}: its old schedule failed on the new TIR ({str(err).splitlines()[0]}); tuned from scratch")
            continue
        commit_measured(database, task.mod, sch, secs, target)
        committed += 1
    return committed


def commit_measured(database, mod: tvm.IRModule, sch, secs: float, target) -> None:
    """Commit schedule ``sch`` of ``mod`` as a record with the ``secs`` this machine measured."""
    database.commit_tuning_record(ms.database.TuningRecord(
        sch.trace, database.commit_workload(mod), run_secs=[float(secs)], target=target,
        args_info=ms.arg_info.ArgInfo.from_prim_func(mod["main"])))


def transfer_schedules(source_dir: str, tasks, database, target, runner, top_k: int = 2, builder=None,
                       log=print) -> int:
    """For every task without a record in ``database``: the ``top_k`` fastest schedules the saved
    database ``source_dir`` holds for the same module (tuned on another CPU), replayed, built and
    measured here by ``runner`` and committed with this machine's times -- never its old ones. The
    search then starts from the best of them. A task whose schedules fail here is tuned from
    scratch, with one line. Returns how many records were committed."""
    from tvm_ext.tune.database import open_database, record_seconds  # pylint: disable=import-outside-toplevel

    source = open_database(source_dir, read_only=True)
    picked = []
    for task in tasks:
        if records_of(database, task.mod):
            continue
        ranked = sorted((r for r in records_of(source, task.mod) if record_seconds(r) is not None),
                        key=record_seconds)
        schedules = [s for s in (replayed(r, task.mod, target) for r in ranked[:top_k]) if s is not None]
        if schedules:
            picked.append((task, schedules))
    if not picked:
        return 0
    log(f"measuring here the {sum(len(s) for _, s in picked)} best schedules of {len(picked)} tasks in {source_dir} "
        f"(up to {top_k} per task) ...")
    builder = builder if builder is not None else make_builder()
    committed = 0
    for task, schedules in picked:
        mods = {f"{task.name}#{k}": sch.mod for k, sch in enumerate(schedules)}
        try:
            secs = runner_seconds(mods, target, runner, builder)
        except RuntimeError as err:
            log(f"{task.name}: a transferred schedule failed here ({str(err).splitlines()[0]}); tuned from scratch")
            continue
        for k, sch in enumerate(schedules):
            commit_measured(database, task.mod, sch, secs[f"{task.name}#{k}"], target)
            committed += 1
    return committed


__all__ = ["replayed", "retargeted", "reuse_schedules", "transfer_schedules"]
