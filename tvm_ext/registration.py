"""Make every rule and postproc reachable by name through TVM's global registry.

``tvm.get_global_func("tvm_ext.schedule_rule.InlineConstantScalars")()`` returns a
rule usable in PostOrderApply from any language that can call a PackedFunc.
Registration overrides earlier entries, so importing twice is safe.
"""
from __future__ import annotations

import tvm_ffi

RULE_PREFIX = "tvm_ext.schedule_rule."
POSTPROC_PREFIX = "tvm_ext.postproc."


def register_all() -> list[str]:
    """Register constructors and custom-rule functions; returns the names registered."""
    from tvm_ext import postprocs, rules

    names = []
    for cls in (rules.InlineConstantScalars, rules.ApplyBlockAttrRule):
        names.append(_register(RULE_PREFIX + cls.__name__, cls))
    names.append(_register(POSTPROC_PREFIX + "VerifyGPUCode", postprocs.VerifyGPUCode))
    rules.register_custom_rules()
    return names


def _register(name: str, cls) -> str:
    tvm_ffi.register_global_func(name, lambda: cls(), override=True)
    return name
