"""schedule_rule block annotations, through TVM's ApplyCustomRule (after ``tvm_ext.install()``) and through ours."""

import pytest
import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing.space_generation import generate_design_space
from tvm.script import tirx as T

import tvm_ext
from tir_kernels import annotated, cuda_target, design_spaces, llvm_target
from tvm_ext.rules import ApplyBlockAttrRule


@pytest.fixture(autouse=True, scope="module")
def installed():
    """TVM's own ApplyCustomRule finds the inline functions once ``tvm_ext.install()`` registered them."""
    tvm_ext.install()


@T.prim_func(s_tir=True)
def inlined(a: T.Buffer((16,), "float32"), c: T.Buffer((16,), "float32")):
    for i in range(16):
        with T.sblock("c"):
            vi = T.axis.spatial(16, i)
            c[vi] = a[vi] * T.float32(2) + T.float32(1)


@T.prim_func(s_tir=True)
def reverse_inlined(a: T.Buffer((16,), "float32"), c: T.Buffer((16,), "float32")):
    for i in range(16):
        with T.sblock("b"):
            vi = T.axis.spatial(16, i)
            c[vi] = a[vi] * T.float32(2) + T.float32(1)


TARGETS = [llvm_target(), cuda_target()]
RULES = {"tvm ApplyCustomRule": ms.schedule_rule.ApplyCustomRule, "tvm_ext ApplyBlockAttrRule": ApplyBlockAttrRule}


def only_sketch(func, target, rule):
    (sketch,) = generate_design_space(target.kind.name, tvm.IRModule({"main": func}), target, None,
                                      sch_rules=[rule()])
    return sketch.mod["main"]


def same(actual, expected, like):
    tvm.ir.assert_structural_equal(actual, expected.with_attr("global_symbol", like.attrs["global_symbol"]))


@pytest.mark.parametrize("target", TARGETS, ids=["llvm", "cuda"])
@pytest.mark.parametrize("rule", RULES.values(), ids=RULES.keys())
def test_compute_inline_annotation(target, rule):
    before = annotated("compute_inline")
    same(only_sketch(before, target, rule), inlined, before)


@pytest.mark.parametrize("target", TARGETS, ids=["llvm", "cuda"])
@pytest.mark.parametrize("rule", RULES.values(), ids=RULES.keys())
def test_reverse_compute_inline_annotation(target, rule):
    before = annotated("reverse_compute_inline", block="c")
    same(only_sketch(before, target, rule), reverse_inlined, before)


def test_install_registers_every_key():
    for key in ("cpu", "gpu", "cuda", "generic"):
        for rule in ("compute_inline", "reverse_compute_inline"):
            assert tvm.get_global_func(f"s_tir.meta_schedule.{key}.{rule}", allow_missing=True)


def test_unknown_rule_name_warns_and_leaves_block():
    before = annotated("no_such_rule")
    with pytest.warns(UserWarning) as record:
        after = only_sketch(before, llvm_target(), ApplyBlockAttrRule)
    message = str(record[0].message)
    assert "no_such_rule" in message
    for key in ("cpu", "generic"):
        assert f"s_tir.meta_schedule.{key}.no_such_rule" in message
    # the block is still there, only its annotation is gone
    assert "with T.sblock(\"b\")" in after.script() and "no_such_rule" not in after.script()


def test_plugin_space_honours_annotations_end_to_end():
    before = annotated("compute_inline")
    sketches = design_spaces(before, llvm_target(), ruleset="plugin")
    assert sketches
    for sketch in sketches:
        assert 'T.sblock("b")' not in sketch.mod["main"].script()
