"""One scheduling pass for a Relax module: tuned records, then our rules, then dlight.

``ApplySchedules(target, schedule="rule", database=None)`` is a module pass, as
``MetaScheduleApplyDatabase`` followed by ``dlight.ApplyDefaultSchedule``: for each PrimFunc, the
database's best record where ``schedule`` is ``tuned`` and it holds the kernel (same structural hash
as MetaSchedule keys it; the function marked ``tirx.is_scheduled`` as TVM marks it), else the first
of our rules that matches (``rulesets.schedule_rules``), else the first dlight rule that applies
(``rulesets.dlight_rules``; on a GPU a dlight schedule that does not compile is skipped), else the
kernel as built.  The names are
``rulesets.SCHEDULES``.  After it runs, ``pass_.used`` says what scheduled each kernel:
a dlight rule's name, one of ours (``dequant_gemv``, ...), ``tuned``, or ``hand-scheduled`` for a
function marked ``tirx.is_scheduled`` (left as it is: the mark TVM's dlight and MetaSchedule read).
A scheduled function keeps its ``global_symbol`` as it was, none for a private one (TVM's passes
add none; the build attaches every function's name).

``schedule_module`` is the same as a function returning ``(module, used)``; ``untuned_schedule`` and
``tuned_schedule`` answer for one kernel (the tuning seeds and the benches use them).
"""
from __future__ import annotations

import os

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir.transform import PassContext, module_pass

from tvm_ext.rulesets import SCHEDULES, check_schedules, dlight_rules, schedule_rules
from tvm_ext.schedule_rule import is_gpu


def normalize(func) -> tvm.IRModule:
    """The IRModule MetaSchedule keys a PrimFunc by (see TuneContext)."""
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    func = func.without_attr("global_symbol") if func.attrs and "global_symbol" in func.attrs else func
    return _normalize_mod(func.with_attr("global_symbol", "main"))


def kernel_key(mod: tvm.IRModule) -> str:
    """A kernel's key in the files beside its database: its IRModule's structural hash."""
    return f"{tvm_ffi.structural_hash(mod):016x}"


def is_scheduled(func) -> bool:
    """Whether ``func`` is marked ``tirx.is_scheduled`` (as dlight's ``ApplyDefaultSchedule`` reads it)."""
    return bool(func.attrs is not None and func.attrs.get("tirx.is_scheduled", False))


def with_symbol_of(func, scheduled):
    """``scheduled`` (a schedule of ``normalize(func)``, named ``main``) with ``func``'s ``global_symbol``,
    or none where ``func`` has none."""
    scheduled = scheduled.without_attr("global_symbol")
    symbol = func.attrs.get("global_symbol") if func.attrs is not None else None
    return scheduled if symbol is None else scheduled.with_attr("global_symbol", symbol)


# --------------------------------------------------------------------------- one kernel
def rule_schedule(mod, target):
    """(rule name, Schedule) of the first of our rules for ``target`` that schedules ``mod``'s ``main``
    untuned, or None."""
    for rule in schedule_rules(target):
        sch = rule.apply(mod["main"], target, False)
        if sch is not None:
            return rule.name, sch
    return None


def dlight_schedule(mod, target, validate=None):
    """(rule name, Schedule) for the first dlight rule that applies; ("none", None) if none does (on llvm
    the kernel then compiles unscheduled).  With ``validate`` (a callable that raises when a scheduled
    module does not build), a rule whose schedule fails is skipped and named in the result, e.g.
    "Fallback (GEMV failed)"."""
    func = mod["main"]
    failed = []
    with target:
        for rule in dlight_rules(target):
            name = type(rule).__name__
            try:
                sch = rule.apply(func, target, False)
            except Exception:  # noqa: BLE001 -- a rule that crashes counts as not applying
                sch = None
            if isinstance(sch, (list, tuple)):
                sch = sch[0] if sch else None
            if sch is None:
                continue
            if validate is not None:
                try:
                    validate(sch.mod)
                except Exception:  # noqa: BLE001
                    failed.append(name)
                    continue
            return (f"{name} ({', '.join(failed)} failed)" if failed else name), sch
    return ("none" + (f" ({', '.join(failed)} failed)" if failed else "")), None


def build_validator(target):
    """None on CPU (everything dlight makes builds); on GPU a function that builds with nvcc."""
    if not is_gpu(target):
        return None
    os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    return lambda m: tvm.compile(m, target=target)


def as_built(mod):
    """A Schedule of ``mod`` left as built whose trace is not empty: JSONDatabase writes a record with
    an empty trace but never returns it, so the trace holds one lookup."""
    from tvm.s_tir import Schedule

    sch = Schedule(mod)
    sch.get_child_blocks(sch.get_sblock("root", func_name="main"))
    return sch


def untuned_schedule(mod, target):
    """The untuned Schedule of ``mod``: our rules', else dlight's, else the kernel as built."""
    found = rule_schedule(mod, target)
    return found[1] if found is not None else not_ours(mod, target)


def not_ours(mod, target):
    """The untuned Schedule of a kernel no rule of ours matches: dlight's, else as built."""
    sch = dlight_schedule(mod, target)[1]
    return sch if sch is not None else as_built(mod)


def best_schedule(database, mod):
    """The best scheduled IRModule in ``database`` (a MetaSchedule Database) for ``mod``, or None."""
    if not database.has_workload(mod):
        return None
    top = database.get_top_k(database.commit_workload(mod), 1)
    if not top:
        return None
    sch = tvm.s_tir.Schedule(mod)
    top[0].trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod


def tuned_schedule(database, mod, target, keep_untuned=()):
    """What ``tuned`` runs for ``mod``: the best record of ``database``, unless ``kernel_key(mod)`` is in
    ``keep_untuned`` (a side-by-side check kept the untuned schedule); None without a record."""
    best = best_schedule(database, mod)
    if best is not None and kernel_key(mod) in keep_untuned:
        return untuned_schedule(mod, target).mod
    return best


# --------------------------------------------------------------------------- a module
def schedule_module(mod, target, schedule: str = "rule", database=None, keep_untuned=(), skip=()):
    """``(mod with every PrimFunc scheduled, {kernel: what scheduled it})`` (module doc); ``skip``: names of
    functions left as written and unreported (the in-place KV-cache writes of ``workloads.phi2``)."""
    check_schedules((schedule,), SCHEDULES)
    if schedule == "tuned" and database is None:
        raise ValueError("schedule 'tuned' needs a tuning database")
    target = tvm.target.Target(target) if not isinstance(target, tvm.target.Target) else target
    mod = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    used = {}
    if schedule == "none":
        return mod, used
    validate = build_validator(target)
    for gv, func in list(mod.functions_items()):
        if not isinstance(func, tirx.PrimFunc) or gv.name_hint in skip:
            continue
        if is_scheduled(func):  # hand-written schedules
            used[gv.name_hint] = "hand-scheduled"
            continue
        m = normalize(func)
        best = tuned_schedule(database, m, target, keep_untuned) if schedule == "tuned" else None
        ours = rule_schedule(m, target) if schedule != "dlight" and best is None else None
        if best is not None:
            sch_mod, used[gv.name_hint] = best, "tuned"
        elif ours is not None:
            used[gv.name_hint], sch_mod = ours[0], ours[1].mod
        else:
            name, sch = dlight_schedule(m, target, validate)
            used[gv.name_hint] = name
            sch_mod = None if sch is None else sch.mod
        if sch_mod is not None:
            mod[gv] = with_symbol_of(func, sch_mod["main"])
        if best is not None and not (keep_untuned and kernel_key(m) in keep_untuned):
            mod[gv] = mod[gv].with_attr("tirx.is_scheduled", True)  # a record's, marked as TVM marks it
    return mod, used


@module_pass(opt_level=0, name="tvm_ext.ApplySchedules")
class ApplySchedules:  # pylint: disable=too-few-public-methods
    """Schedule every PrimFunc of a module (module doc): ``schedule`` one of ``rulesets.SCHEDULES``;
    ``database``: a MetaSchedule Database (``tuned``); ``keep_untuned``: kernel keys whose untuned
    schedule a side-by-side check kept over the record; ``skip``: function names left as written."""

    def __init__(self, target, schedule: str = "rule", database=None, keep_untuned=(), skip=()):
        check_schedules((schedule,), SCHEDULES)
        if schedule == "tuned" and database is None:
            raise ValueError("schedule 'tuned' needs a tuning database")
        self.target, self.schedule, self.database = target, schedule, database
        self.keep_untuned, self.skip = frozenset(keep_untuned), tuple(skip)
        self.used = {}

    def transform_module(self, mod: tvm.IRModule, _: PassContext) -> tvm.IRModule:
        out, self.used = schedule_module(mod, self.target, self.schedule, self.database, self.keep_untuned,
                                         self.skip)
        return out
