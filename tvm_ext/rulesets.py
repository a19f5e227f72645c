"""Rule sets: TVM's defaults for a target with ours in place of the built-in pieces.

``plugin``           TVM's default rules/postprocs, with our ApplyBlockAttrRule in front
                     of TVM's ApplyCustomRule, our InlineConstantScalars in place of
                     TVM's, our VerifyGPUCode in place of TVM's (cuda), and on x86 with
                     VNNI our VNNI tensorization rule + RewriteTensorize (llvm).
``no-inline-const``  ``plugin`` without any InlineConstantScalars (the ablation).
``upstream``         TVM's built-in defaults, untouched.
"""
from __future__ import annotations

import tvm
from tvm.s_tir import meta_schedule as ms

from tvm_ext.intrin_import import import_tensor_intrinsics

RULESETS = ("plugin", "no-inline-const", "upstream")


def target_kind(target: tvm.target.Target) -> str:
    """The MetaSchedule default-rule kind for a target: ``llvm`` or ``cuda``."""
    kind = target.kind.name
    if kind not in ("llvm", "cuda"):
        raise ValueError(f"tvm_ext supports llvm and cuda targets, not {kind!r}")
    return kind


def check_ruleset(ruleset: str) -> str:
    if ruleset not in RULESETS:
        raise ValueError(f"unknown ruleset {ruleset!r}; choose one of {', '.join(RULESETS)}")
    return ruleset


def _name(obj) -> str:
    return type(obj).__name__


def default_rules(target: tvm.target.Target, ruleset: str = "plugin") -> list:
    """Schedule rules for ``target`` under ``ruleset`` (see module doc)."""
    from tvm_ext.rules import ApplyBlockAttrRule, InlineConstantScalars

    kind = target_kind(target)
    upstream = list(ms.ScheduleRule.create(kind))
    if check_ruleset(ruleset) == "upstream":
        return upstream
    rules = []
    for rule in upstream:
        name = _name(rule)
        if name == "ApplyCustomRule":
            rules += [ApplyBlockAttrRule(), rule]
        elif name == "InlineConstantScalars":
            if ruleset == "plugin":
                rules.append(InlineConstantScalars())
        else:
            rules.append(rule)
    add_vnni = _vnni(target, ruleset)
    return add_vnni(rules, [], target)[0] if add_vnni else rules


def _vnni(target, ruleset: str):
    """(extra rules, extra postprocs) of the VNNI tensorization for our llvm rule sets.

    Empty for ``upstream``, cuda, and x86 targets without AVX-512 VNNI / AVX-VNNI.
    """
    if ruleset == "upstream" or target_kind(target) != "llvm":
        return None
    from tvm_ext.rules.vnni_tensorize import with_vnni

    return with_vnni


def default_postprocs(target: tvm.target.Target, ruleset: str = "plugin") -> list:
    """Postprocessors for ``target`` under ``ruleset`` (ours replace VerifyGPUCode)."""
    from tvm_ext.postprocs import VerifyGPUCode

    upstream = list(ms.Postproc.create(target_kind(target)))
    if check_ruleset(ruleset) == "upstream":
        return upstream
    posts = [VerifyGPUCode() if _name(p) == "VerifyGPUCode" else p for p in upstream]
    add_vnni = _vnni(target, ruleset)
    return add_vnni([], posts, target)[1] if add_vnni else posts


def space(target: tvm.target.Target, ruleset: str = "plugin") -> ms.space_generator.PostOrderApply:
    """A PostOrderApply design-space generator with the rule set's rules and postprocs.

    Also imports TVM's tensor intrinsics the fast way (see ``tvm_ext.intrin_import``), so
    that the ``ms.TuneContext`` this space goes into does not spend ~40 s importing them.
    """
    import_tensor_intrinsics()
    return ms.space_generator.PostOrderApply(
        sch_rules=default_rules(target, ruleset),
        postprocs=default_postprocs(target, ruleset),
        mutator_probs=target_kind(target),
    )
