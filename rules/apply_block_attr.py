"""ApplyBlockAttrRule: honour ``T.sblock_attr({"schedule_rule": NAME})`` annotations.

Pattern: a block annotated with a schedule_rule name, e.g. a constant block that a
frontend marked ``"compute_inline"`` instead of relying on its name.

Why: TVM's ApplyCustomRule looks the name up as ``s_tir.meta_schedule.<key>.<name>``
for the target's keys only (``cpu`` for llvm, ``cuda``/``gpu`` for cuda) and TVM 0.27
registers no ``compute_inline`` function at all. ``register_custom_rules`` registers
``compute_inline`` and ``reverse_compute_inline`` for the ``cpu``, ``gpu``, ``cuda``
and ``generic`` keys (so TVM's own ApplyCustomRule finds them), and this module provides
a rule that also tries the ``generic`` key. An unknown name gives a warning naming every
function looked up and leaves the block as is.

Those names are in TVM's namespace: a later TVM (or another plugin) may define them.
``register_custom_rules`` remembers what each name held before and
``restore_custom_rules`` puts it back (or removes ours where there was nothing);
``register_custom_rules(override=False)`` leaves a name that already holds someone
else's function alone. ``tvm_ext.install()`` drives both; this rule itself needs no registration
(a name with nothing registered falls back to our inliner).

PostOrderApply skips annotated blocks for every rule except TVM's ApplyCustomRule,
so this rule handles all annotated blocks of the function whenever it is applied
to any block; `tvm_ext.space` keeps TVM's ApplyCustomRule after it for functions
whose blocks are all annotated.  A block-level rule of the contract (``tvm_ext.schedule_rule``),
MetaSchedule's face only: the functions it calls take MetaSchedule schedules and may sample.
"""
from __future__ import annotations

import warnings

import tvm
import tvm_ffi
from tvm.s_tir.schedule import ScheduleError

from tvm_ext.schedule_rule import ScheduleRule
from tvm_ext.tir_utils import blocks_of, prim_funcs

ANNOTATION = "schedule_rule"
CUSTOM_RULE_KEYS = ("cpu", "gpu", "cuda", "generic")
CUSTOM_RULES = ("compute_inline", "reverse_compute_inline")


def custom_rule_name(key: str, rule: str) -> str:
    """Global-registry name TVM's ApplyCustomRule looks up for ``rule`` under ``key``."""
    return f"s_tir.meta_schedule.{key}.{rule}"


def _inliner(primitive: str):
    def apply_inline(sch, block):
        try:
            getattr(sch, primitive)(block)
        except ScheduleError as err:
            warnings.warn(f"tvm_ext: {primitive} of block {sch.get(block).name_hint!r} failed; "
                          f"left as is ({str(err).splitlines()[0]})")
            sch.unannotate(block, ANNOTATION)
        return [sch]

    return apply_inline


def custom_rule_functions() -> dict:
    """Global-registry name -> function, for every custom rule and key this module provides."""
    return {custom_rule_name(key, rule): _inliner(rule)
            for rule in CUSTOM_RULES for key in CUSTOM_RULE_KEYS}


# name -> what the registry held there before register_custom_rules replaced it (None: nothing)
_REPLACED: dict = {}


def register_custom_rules(override: bool = True) -> list[str]:
    """Register compute_inline / reverse_compute_inline for every key; returns the names.

    ``override=False`` skips a name that already holds a function not registered here.
    Calling again is safe: it first restores the registry (``restore_custom_rules``), so
    what was there before the first call is what a restore puts back."""
    restore_custom_rules()
    registered = []
    for name, func in custom_rule_functions().items():
        previous = tvm.get_global_func(name, allow_missing=True)
        if previous is not None and not override:
            continue
        _REPLACED[name] = previous
        tvm_ffi.register_global_func(name, func, override=True)
        registered.append(name)
    return registered


def restore_custom_rules() -> None:
    """Undo ``register_custom_rules``: every name gets back the function it held before, and
    a name that held none is removed from the registry."""
    for name, previous in list(_REPLACED.items()):
        if previous is None:
            tvm_ffi.registry.remove_global_func(name)
        else:
            tvm_ffi.register_global_func(name, previous, override=True)
        del _REPLACED[name]


def _lookup(rule: str, keys) -> tuple:
    """The function registered for ``rule`` under the first of ``keys`` that has one, else ours for the
    rules this module provides (the rule works whether or not ``register_custom_rules`` ran)."""
    names = [custom_rule_name(key, rule) for key in keys]
    for name in names:
        func = tvm.get_global_func(name, allow_missing=True)
        if func is not None:
            return func, names
    return (_inliner(rule) if rule in CUSTOM_RULES else None), names


def _first_annotated(sch):
    for func_name, func in prim_funcs(sch.mod):
        for block in blocks_of(func):
            rule = block.annotations.get(ANNOTATION)
            if rule is not None and str(rule) != "None":
                return sch.get_sblock(block.name_hint, func_name=func_name), str(rule)
    return None, None


def apply_block_attr_rules(sch, keys) -> list:
    """Apply the custom rule of every annotated block; returns the resulting schedules."""
    block, rule = _first_annotated(sch)
    if block is None:
        return [sch]
    func, looked_up = _lookup(rule, keys)
    if func is None:
        warnings.warn(f"tvm_ext: unknown schedule rule {rule!r} on block "
                      f"{sch.get(block).name_hint!r}; looked up: {', '.join(looked_up)}")
        sch.unannotate(block, ANNOTATION)
        results = [sch]
    else:
        results = list(func(sch, block))
    done = []
    for result in results:
        if result.mod is not None and _still_annotated(result, block):
            result.unannotate(block, ANNOTATION)  # guarantee progress
        done.extend(apply_block_attr_rules(result, keys))
    return done


def _still_annotated(sch, block) -> bool:
    try:
        return ANNOTATION in sch.get(block).annotations
    except Exception:  # the block was inlined away: its RV no longer resolves
        return False


def lookup_keys(target) -> tuple:
    """The keys a custom rule is looked up under for ``target``: the target's own, then ``generic``."""
    return (tuple(str(k) for k in target.keys) if target is not None else ()) + ("generic",)


class ApplyBlockAttrRule(ScheduleRule):
    """Schedule rule: run the custom rule named by each block's schedule_rule annotation."""

    name = "apply_block_attr"
    gpu = None

    def candidates(self, sch, block, target):
        return apply_block_attr_rules(sch, lookup_keys(target))
