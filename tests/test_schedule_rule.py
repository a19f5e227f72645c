"""The rule contract (``tvm_ext.schedule_rule``): every rule in ``rules/`` is a ``tvm_ext.ScheduleRule``, block-level
rules too, with its MetaSchedule face from the one adapter."""
import inspect

import pytest

tvm = pytest.importorskip("tvm")

from tvm.s_tir import meta_schedule as ms  # noqa: E402

import tvm_ext  # noqa: E402
from test_inline_constant_scalars import apply_rule, zero_dim_after, zero_dim_before  # noqa: E402
from tvm_ext import rules  # noqa: E402
from tvm_ext.rules.amx_tensorize import AMXTensorize  # noqa: E402
from tvm_ext.rules.vnni_tensorize import VNNITensorize  # noqa: E402


def _rule_classes():
    found = {cls for _, cls in inspect.getmembers(rules, inspect.isclass)} | {AMXTensorize, VNNITensorize}
    return sorted((c for c in found if c.__module__.startswith("tvm_ext.rules.")), key=lambda c: c.__name__)


def test_every_rule_file_subclasses_the_one_base():
    classes = _rule_classes()
    assert {"InlineConstantScalars", "ApplyBlockAttrRule", "VNNITensorize", "AMXTensorize",
            "Int8TensorCoreCUDA", "DequantGEMV", "ContractionCPU"} <= {c.__name__ for c in classes}
    assert all(issubclass(c, tvm_ext.ScheduleRule) for c in classes)


@pytest.mark.parametrize("make", [rules.InlineConstantScalars, rules.ApplyBlockAttrRule, VNNITensorize,
                                  AMXTensorize], ids=lambda m: m.__name__)
def test_a_block_level_rule_has_its_face_and_passes_as_one(make):
    """The face is named as the rule and reads its attributes; the rule itself goes where TVM wants a
    MetaSchedule rule; a clone of a rule that keeps tune-context state has a rule of its own."""
    rule = make()
    face = rule.meta_schedule()
    assert isinstance(face, ms.ScheduleRule) and type(face).__name__ == make.__name__ and face.name == rule.name
    space = ms.space_generator.PostOrderApply(sch_rules=[rule], postprocs=[], mutator_probs={})
    assert len(space.sch_rules) == 1
    clone = face._inst.clone()._inst  # pylint: disable=protected-access
    assert (clone.rule is rule) == (make in (rules.InlineConstantScalars, rules.ApplyBlockAttrRule))


def test_dlight_face_of_a_block_level_rule():
    """InlineConstantScalars' untuned form is the inlining its MetaSchedule face does; the tensorizing rules
    have none (their tiles are sampled): None, as a dlight rule that does not match."""
    sch = rules.InlineConstantScalars().apply(zero_dim_before, tvm.target.Target("llvm"))
    untuned = sch.mod["main"].without_attr("global_symbol")
    tvm.ir.assert_structural_equal(untuned, zero_dim_after.without_attr("global_symbol"))
    tvm.ir.assert_structural_equal(apply_rule(zero_dim_before).without_attr("global_symbol"), untuned)
    assert rules.InlineConstantScalars().apply(zero_dim_after) is None
    assert VNNITensorize().apply(zero_dim_before, tvm.target.Target("llvm")) is None
