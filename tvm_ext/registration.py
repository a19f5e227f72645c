"""Make every rule and postproc reachable by name through TVM's global registry.

``import tvm_ext`` calls ``register_all()``, which registers our own names only; afterwards

* ``tvm_ext.schedule_rule.InlineConstantScalars``, ``tvm_ext.schedule_rule.ApplyBlockAttrRule``,
  ``tvm_ext.schedule_rule.DequantGEMV``, ``tvm_ext.schedule_rule.DequantGEMVCUDA``,
  ``tvm_ext.schedule_rule.Q4Int8GEMM``, ``tvm_ext.schedule_rule.RowNormCPU``, ``tvm_ext.schedule_rule.ContractionCPU``,
  ``tvm_ext.schedule_rule.ContractionCUDA``,
  ``tvm_ext.schedule_rule.InjectiveCPU``, ``tvm_ext.schedule_rule.Int8TensorCoreCUDA``,
  ``tvm_ext.postproc.VerifyGPUCode`` and
  ``tvm_ext.postproc.ThreadExtentPrecheck`` construct our objects
  (``tvm.get_global_func("tvm_ext.schedule_rule.InlineConstantScalars")()``), usable in
  PostOrderApply from any language that can call a PackedFunc.

``install()`` (``tvm_ext.install()``; ``rulesets.default_rules`` calls it for the rule sets whose
ApplyBlockAttrRule / ApplyCustomRule need it) also registers
``s_tir.meta_schedule.<key>.compute_inline`` and ``...reverse_compute_inline`` for the keys ``cpu``,
``gpu``, ``cuda`` and ``generic``, so that TVM's own ApplyCustomRule honours
``T.sblock_attr({"schedule_rule": "compute_inline"})`` (see ``tvm_ext.rules.apply_block_attr``).

Those names live in TVM's namespace. TVM 0.27 defines none of them, but a later TVM or another
plugin may, and then ``install()`` **overrides** their function.
That is reversible and can be refused:

* ``restore_tvm_functions()`` puts back whatever each of those names held before tvm_ext
  registered it, and removes ours where there was nothing;
* ``unregister()`` does that and also removes the ``tvm_ext.*`` names;
* ``TVM_EXT_NO_OVERRIDE=1`` in the environment (or ``install(override=False)``) registers a
  TVM-namespace name only where nothing is registered yet.

Importing twice (or calling ``install`` again) is safe: it restores first, so the functions
remembered are always those that were there before tvm_ext.
"""
from __future__ import annotations

import os

import tvm_ffi

RULE_PREFIX = "tvm_ext.schedule_rule."
POSTPROC_PREFIX = "tvm_ext.postproc."
NO_OVERRIDE_ENV = "TVM_EXT_NO_OVERRIDE"

_OWN: list[str] = []  # tvm_ext.* names registered by register_all


def register_all() -> list[str]:
    """Register the constructors of our rules and postprocs under our own names; returns the names."""
    from tvm_ext import postprocs, rules

    names = []
    for cls in (rules.InlineConstantScalars, rules.ApplyBlockAttrRule, rules.DequantGEMV, rules.DequantGEMVCUDA,
                rules.Q4Int8GEMM, rules.RowNormCPU, rules.ContractionCPU, rules.ContractionCUDA, rules.InjectiveCPU,
                rules.Int8TensorCoreCUDA):
        names.append(_register(RULE_PREFIX + cls.__name__, cls))
    for cls in (postprocs.VerifyGPUCode, postprocs.ThreadExtentPrecheck):
        names.append(_register(POSTPROC_PREFIX + cls.__name__, cls))
    return names


def install(override: bool | None = None) -> list[str]:
    """Register the custom-rule functions in TVM's namespace (module doc); returns their names.

    ``override`` (default: True unless ``TVM_EXT_NO_OVERRIDE=1``): whether a name in TVM's
    namespace that already holds a function is given ours."""
    from tvm_ext.rules import apply_block_attr

    if override is None:
        override = os.environ.get(NO_OVERRIDE_ENV, "") in ("", "0")
    return apply_block_attr.register_custom_rules(override=override)


def restore_tvm_functions() -> None:
    """Give every name in TVM's namespace back what it held before tvm_ext registered it."""
    from tvm_ext.rules import apply_block_attr

    apply_block_attr.restore_custom_rules()


def unregister() -> None:
    """Undo ``register_all``: TVM's namespace restored, the ``tvm_ext.*`` names removed."""
    restore_tvm_functions()
    while _OWN:
        tvm_ffi.registry.remove_global_func(_OWN.pop())


def _register(name: str, cls) -> str:
    """``name`` constructs ``cls``: a rule's MetaSchedule face (every rule is a ``tvm_ext.ScheduleRule``), a
    postproc as it is."""
    from tvm_ext.schedule_rule import ScheduleRule

    make = (lambda: cls().meta_schedule()) if issubclass(cls, ScheduleRule) else cls
    tvm_ffi.register_global_func(name, lambda: make(), override=True)
    if name not in _OWN:
        _OWN.append(name)
    return name
