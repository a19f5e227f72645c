"""What our pieces do that TVM 0.27's built-in ones do not, each shown side by side.

docs/guide.md's "What it adds to TVM" cites these tests (and tuning_logs/ for measurements).
"""
import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms
from tvm.script import tirx as T

from tir_kernels import annotated, design_spaces
from tvm_ext.rules import ApplyBlockAttrRule, InlineConstantScalars
from tvm_ext.tir_utils import blocks_of

LLVM = tvm.target.Target({"kind": "llvm", "num-cores": 1})


def sketch(func, rule, target=LLVM):
    (sch,) = design_spaces(func, target, sch_rules=[rule])
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


def test_annotation_for_a_target_whose_keys_tvm_does_not_know():
    # a board target with its own key (none of cpu/gpu/cuda): ours falls back to the generic key
    target = tvm.target.Target({"kind": "llvm", "keys": ["myboard"]})
    func = annotated("compute_inline", block="b")
    assert [b.name_hint for b in _blocks(sketch(func, ApplyBlockAttrRule(), target))] == ["c"]
    theirs = sketch(func, ms.schedule_rule.ApplyCustomRule(), target)
    assert [b.name_hint for b in _blocks(theirs)] == ["b", "c"]


def _blocks(func):
    return [b for b in blocks_of(func) if b.name_hint != "root"]
