"""The rule contract: one base for every rule in ``rules/``, with dlight's face and MetaSchedule's.

dlight's face, per function: ``apply(func, target, tunable)`` is a Schedule of ``func`` (as ``main``)
or None where the rule does not match; ``tunable=False`` is the deterministic schedule (good
untuned), ``tunable=True`` the same schedule with its decisions sampled.  A whole-function rule
gives its pattern (``plan``), the blocks the plan covers (``blocks``) and the schedule
(``schedule``).

MetaSchedule's face, per block (as ``PyScheduleRule.apply(sch, block)``): ``candidates(sch, block,
target)``.  For a whole-function rule it is, by default, its schedule with sampled decisions beside
the other rules' sketches, its blocks marked for them to skip.  A block-level rule (tensorization,
inlining: the work of one block, with MetaSchedule's own tiling inside) overrides ``candidates``;
where it keeps state from the tune context it also gives ``initialize(context)`` and ``clone()``.
Such a rule has no untuned form unless it gives ``plan`` and ``schedule`` too (its ``apply`` is None).

``rule.meta_schedule()`` is the one adapter that gives a rule its ``PyScheduleRule`` face for
``PostOrderApply`` (named as the rule: ``type(r).__name__ == "RowNormCPU"``; the rule's attributes
read through it); the tune context's target reaches ``candidates``.  A rule given where TVM wants a
MetaSchedule rule (``PostOrderApply(sch_rules=[InlineConstantScalars()])``) becomes its face.
"""
from __future__ import annotations

from typing import Optional

import tvm
from tvm import tirx
from tvm.ir.utils import derived_object
from tvm.s_tir import Schedule
from tvm.s_tir import dlight
from tvm.s_tir.meta_schedule.schedule_rule import PyScheduleRule
from tvm.s_tir.schedule import ScheduleError

SKIP = ("schedule_rule", "None")  # PostOrderApply's other rules skip blocks annotated so
GPU_KINDS = ("cuda", "rocm", "vulkan", "metal", "opencl")


def is_gpu(target) -> bool:
    return target.kind.name in GPU_KINDS


class ScheduleRule(dlight.ScheduleRule):
    """Base of tvm_ext's rules (module doc).  ``name``: what the scheduling pass reports for a kernel
    it scheduled; ``gpu``: whether the rule is for GPU targets (False: CPU ones, None: any).  A rule
    whose pattern and schedule need no target gives them as ``plan_of(func)`` and ``schedule_with(sch,
    plan, sample, annotate)`` (staticmethods) instead of overriding ``plan`` and ``schedule``."""

    name = ""
    gpu = False
    plan_of = None
    schedule_with = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        face = type(cls.__name__, (_MetaScheduleFace,), {"__module__": cls.__module__,
                                                          "__doc__": f"MetaSchedule face of {cls.__name__}."})
        cls._face = derived_object(face)

    # -- what a subclass gives
    def plan(self, func: tirx.PrimFunc, target) -> Optional[object]:
        """The pattern's plan for ``func`` (``target`` may be None), or None where it does not match (or
        the rule has no untuned form)."""
        plan_of = type(self).plan_of
        return None if plan_of is None else plan_of(func)

    def blocks(self, plan) -> Optional[tuple]:
        """Names of the blocks ``plan`` schedules (MetaSchedule applies the rule at one of them);
        None: any block."""
        return None

    def schedule(self, sch: Schedule, plan, target, sample: bool = False, annotate: bool = False) -> None:
        """Schedule the function ``sch`` works on as ``plan`` says: ``sample``: the decisions sampled;
        ``annotate``: every block it scheduled marked ``SKIP``.  Raises ScheduleError where it cannot."""
        type(self).schedule_with(sch, plan, sample=sample, annotate=annotate)

    # -- dlight's face
    def is_target_available(self, target) -> bool:
        return self.gpu is None or is_gpu(target) == self.gpu

    def apply(self, func, target=None, tunable: bool = False):
        """A Schedule of ``func`` as ``main`` with this rule's schedule (its decisions sampled where
        ``tunable``), or None where the rule does not match."""
        return self.schedule_as(func, "main", target, tunable)

    def schedule_as(self, func, name: str, target, tunable: bool = False):
        """``apply`` with the function named ``name`` in the schedule's module."""
        if not isinstance(func, tirx.PrimFunc):
            return None
        plan = self.plan(func, target)
        if plan is None:
            return None
        return fresh_schedule(func, name, lambda sch: self.schedule(sch, plan, target, sample=tunable))

    def apply_to_module(self, mod: tvm.IRModule, target=None) -> tvm.IRModule:
        """``mod`` with every PrimFunc this rule matches scheduled deterministically, the others
        unchanged (the rule alone, untuned: for tests and tools)."""
        out = {}
        for gv, func in mod.functions.items():
            sch = self.schedule_as(func, gv.name_hint, target) if isinstance(func, tirx.PrimFunc) else None
            out[gv] = func if sch is None else sch.mod[gv.name_hint]
        return tvm.IRModule(out, attrs=mod.attrs)

    def matches(self, func, target=None) -> bool:
        """Whether the deterministic schedule applies to ``func``."""
        return self.apply(func, target) is not None

    # -- MetaSchedule's face
    def candidates(self, sch: Schedule, block, target) -> list:
        """The rule's MetaSchedule answer at ``block`` of ``sch``: its schedule with sampled decisions
        on a copy (blocks marked ``SKIP``) beside ``sch`` unchanged, or ``[sch]`` where it does not
        match (``target``: the tune context's, None outside one)."""
        plan = self.plan(working_func(sch), target)
        names = None if plan is None else self.blocks(plan)
        if plan is None or (names is not None and sch.get(block).name_hint not in names):
            return [sch]
        return one_candidate(sch, lambda cand: self.schedule(cand, plan, target, sample=True, annotate=True))

    def initialize(self, context) -> None:
        """MetaSchedule's tune context reached the rule's face (nothing to keep by default)."""

    def clone(self) -> "ScheduleRule":
        """The rule behind a clone of its face: the rule itself where it keeps no state, else a copy."""
        return self

    def meta_schedule(self, target=None) -> PyScheduleRule:
        """This rule as a MetaSchedule ``ScheduleRule`` (for ``PostOrderApply``); ``target`` until a tune
        context gives its own."""
        return self._face(self, target)

    def __tvm_ffi_object__(self):
        """The face, where the rule is passed to TVM (tvm-ffi's conversion protocol)."""
        return self.meta_schedule()


class _MetaScheduleFace(PyScheduleRule):
    """The adapter: MetaSchedule calls ``apply(sch, block)``; the rule answers ``candidates``."""

    def __init__(self, rule: ScheduleRule, target=None) -> None:
        super().__init__()
        self.rule, self.target = rule, target

    def __getattribute__(self, name):  # the rule's own attributes (``intrin_name``, ...) read through its face
        try:
            return object.__getattribute__(self, name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "rule"), name)

    def _initialize_with_tune_context(self, context) -> None:
        self.target = context.target
        self.rule.initialize(context)

    def apply(self, sch, block):
        return self.rule.candidates(sch, block, self.target)

    def clone(self):
        return self.rule.clone().meta_schedule(self.target)


def fresh_schedule(func, name: str, schedule_fn, errors=(ScheduleError,)):
    """A Schedule of ``func`` (as ``name``) with ``schedule_fn(sch)`` applied, or None where that raises one
    of ``errors``."""
    sch = Schedule(tvm.IRModule({name: func}))
    sch.work_on(name)
    try:
        schedule_fn(sch)
    except errors:
        return None
    return sch


def working_func(sch) -> tirx.PrimFunc:
    """The PrimFunc a (MetaSchedule) Schedule works on, as it is now."""
    return sch.mod[sch.func_working_on.name_hint] if sch.func_working_on is not None else sch.mod["main"]


def one_candidate(sch, schedule_fn) -> list:
    """``[copy, sch]`` with ``schedule_fn(copy)`` applied to the copy and ``sch`` unchanged for the other
    rules' sketches, or ``[sch]`` where it raises ScheduleError."""
    cand = sch.copy()
    try:
        schedule_fn(cand)
    except ScheduleError:
        return [sch]
    return [cand, sch]

