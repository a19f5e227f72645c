"""The rules never raise on odd input: no blocks, dynamic shapes, opaque blocks."""
import pytest
import tvm
from tvm.s_tir.meta_schedule.testing.space_generation import generate_design_space
from tvm.script import tirx as T

from tir_kernels import cuda_target, design_spaces, llvm_target
from tvm_ext.rules import ApplyBlockAttrRule, InlineConstantScalars


@T.prim_func(s_tir=True)
def no_blocks(a: T.Buffer((4,), "int32")):
    T.evaluate(0)


@T.prim_func(s_tir=True)
def dynamic(a: T.handle, b: T.handle):
    n = T.int32()
    A = T.match_buffer(a, (n,), "int32")
    B = T.match_buffer(b, (n,), "int32")
    c = T.sblock_alloc_buffer((), "int32")
    with T.sblock("const"):
        vi = T.axis.spatial(1, 0)
        T.reads()
        T.writes(c[()])
        c[()] = 3
    for i in range(n):
        with T.sblock("add"):
            vi = T.axis.spatial(n, i)
            B[vi] = A[vi] + c[()]


@T.prim_func(s_tir=True)
def opaque(a: T.Buffer((8,), "int32"), b: T.Buffer((8,), "int32")):
    for i in range(8):
        with T.sblock("opaque"):
            T.reads(a[0:8])
            T.writes(b[0:8])
            if a[i] > 0:
                b[i] = a[i]
            else:
                b[i] = 0


RULES = [InlineConstantScalars, ApplyBlockAttrRule]


@pytest.mark.parametrize("func", [no_blocks, dynamic, opaque], ids=["no-blocks", "dynamic", "opaque"])
@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_rule_does_not_raise(func, rule):
    spaces = generate_design_space("llvm", tvm.IRModule({"main": func}), llvm_target(), None,
                                   sch_rules=[rule()])
    assert len(spaces) == 1


def test_dynamic_shape_constant_is_still_inlined():
    (sketch,) = design_spaces(dynamic, llvm_target(), sch_rules=[InlineConstantScalars()])
    assert 'T.sblock("const")' not in sketch.mod["main"].script()


@pytest.mark.parametrize("func", [no_blocks, opaque], ids=["no-blocks", "opaque"])
@pytest.mark.parametrize("target", [llvm_target(), cuda_target()], ids=["llvm", "cuda"])
def test_full_plugin_space_does_not_raise(func, target):
    assert design_spaces(func, target, ruleset="plugin")
