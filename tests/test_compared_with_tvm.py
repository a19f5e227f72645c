"""What our pieces do that TVM 0.27's built-in ones do not, each shown side by side.

The README's "What it adds to TVM" cites these tests (and tuning_logs/ for measurements).
"""
import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms
from tvm.script import tirx as T

from tvm_ext.rules import ApplyBlockAttrRule, InlineConstantScalars
from tvm_ext.tir_utils import blocks_of

LLVM = tvm.target.Target({"kind": "llvm", "num-cores": 1})


def sketch(func, rule, target=LLVM):
    ctx = ms.TuneContext(mod=tvm.IRModule({"main": func}), target=target, task_name="t",
                         space_generator=ms.space_generator.PostOrderApply(
                             sch_rules=[rule], postprocs=[], mutator_probs={}))
    (sch,) = ctx.generate_design_space()
    return sch.mod["main"]


@T.prim_func(s_tir=True)
def one_element_constant(a: T.Buffer((1, 8, 8, 4), "int32"), b: T.Buffer((1, 8, 8, 4), "int32")):
    # the output zero point of a requantize epilogue, as a (1, 1, 1, 1) constant block
    zp = T.sblock_alloc_buffer((1, 1, 1, 1), "int32")
    for n, h, w, c in T.grid(1, 1, 1, 1):
        with T.sblock("zp"):
            vn, vh, vw, vc = T.axis.remap("SSSS", [n, h, w, c])
            T.reads()
            T.writes(zp[vn, vh, vw, vc])
            zp[vn, vh, vw, vc] = 59
    for n, h, w, c in T.grid(1, 8, 8, 4):
        with T.sblock("add"):
            vn, vh, vw, vc = T.axis.remap("SSSS", [n, h, w, c])
            b[vn, vh, vw, vc] = a[vn, vh, vw, vc] + zp[0, 0, 0, 0]


@T.prim_func(s_tir=True)
def one_element_constant_inlined(a: T.Buffer((1, 8, 8, 4), "int32"), b: T.Buffer((1, 8, 8, 4), "int32")):
    for n, h, w, c in T.grid(1, 8, 8, 4):
        with T.sblock("add"):
            vn, vh, vw, vc = T.axis.remap("SSSS", [n, h, w, c])
            b[vn, vh, vw, vc] = a[vn, vh, vw, vc] + 59


def test_single_element_constant_of_rank_4_ours_inlines_tvm_keeps():
    expected = one_element_constant_inlined.with_attr("global_symbol", "one_element_constant")
    tvm.ir.assert_structural_equal(sketch(one_element_constant, InlineConstantScalars()), expected)
    builtin = sketch(one_element_constant, ms.schedule_rule.InlineConstantScalars())
    assert tvm_ffi.structural_equal(builtin, one_element_constant)  # left as it was


@T.prim_func(s_tir=True)
def annotated_constant(a: T.Buffer((8,), "int32"), b: T.Buffer((8,), "int32")):
    c = T.sblock_alloc_buffer((8,), "int32")
    for i in range(8):
        with T.sblock("c"):
            vi = T.axis.spatial(8, i)
            T.sblock_attr({"schedule_rule": "compute_inline"})
            c[vi] = a[vi] * 3
    for i in range(8):
        with T.sblock("b"):
            vi = T.axis.spatial(8, i)
            b[vi] = c[vi] + 1


def test_annotation_for_a_target_whose_keys_tvm_does_not_know():
    # a board target with its own key (none of cpu/gpu/cuda): ours falls back to the generic key
    target = tvm.target.Target({"kind": "llvm", "keys": ["myboard"]})
    ours = sketch(annotated_constant, ApplyBlockAttrRule(), target)
    assert [b.name_hint for b in _blocks(ours)] == ["b"]
    theirs = sketch(annotated_constant, ms.schedule_rule.ApplyCustomRule(), target)
    assert [b.name_hint for b in _blocks(theirs)] == ["c", "b"]


def _blocks(func):
    return [b for b in blocks_of(func) if b.name_hint != "root"]
