"""InlineConstantScalars: which blocks it inlines, by structure only, never raising."""
import pytest
import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.meta_schedule.testing.space_generation import generate_design_space
from tvm.script import tirx as T

from tir_kernels import llvm_target
from tvm_ext.rules import InlineConstantScalars, is_constant_scalar_block
from tvm_ext.rules.inline_constant_scalars import inline_constant_scalars


def apply_rule(func):
    """Run the rule through PostOrderApply, as MetaSchedule does; return the one sketch."""
    (sketch,) = generate_design_space("llvm", tvm.IRModule({"main": func}), llvm_target(), None,
                                      sch_rules=[InlineConstantScalars()])
    return sketch.mod["main"]


@T.prim_func(s_tir=True)
def zero_dim_before(a: T.Buffer((8,), "int32"), b: T.Buffer((8,), "int32")):
    c = T.sblock_alloc_buffer((), "int32")
    with T.sblock("compile_engine_const"):
        vi = T.axis.spatial(1, 0)
        T.reads()
        T.writes(c[()])
        c[()] = 59
    for i in range(8):
        with T.sblock("add"):
            vi = T.axis.spatial(8, i)
            b[vi] = a[vi] + c[()]


@T.prim_func(s_tir=True)
def zero_dim_after(a: T.Buffer((8,), "int32"), b: T.Buffer((8,), "int32")):
    for i in range(8):
        with T.sblock("add"):
            vi = T.axis.spatial(8, i)
            b[vi] = a[vi] + 59


@T.prim_func(s_tir=True)
def renamed_before(a: T.Buffer((8,), "int32"), b: T.Buffer((8,), "int32")):
    c = T.sblock_alloc_buffer((), "int32")
    with T.sblock("zp_out"):
        vi = T.axis.spatial(1, 0)
        T.reads()
        T.writes(c[()])
        c[()] = 59
    for i in range(8):
        with T.sblock("add"):
            vi = T.axis.spatial(8, i)
            b[vi] = a[vi] + c[()]


@T.prim_func(s_tir=True)
def all_ones_before(a: T.Buffer((8,), "float32"), b: T.Buffer((8,), "float32")):
    c = T.sblock_alloc_buffer((1, 1), "float32")
    with T.sblock("scale"):
        vi = T.axis.spatial(1, 0)
        vj = T.axis.spatial(1, 0)
        T.reads()
        T.writes(c[vi, vj])
        c[vi, vj] = T.float32(0.5) * T.float32(3)
    for i in range(8):
        with T.sblock("mul"):
            vi = T.axis.spatial(8, i)
            b[vi] = a[vi] * c[0, 0]


@T.prim_func(s_tir=True)
def all_ones_after(a: T.Buffer((8,), "float32"), b: T.Buffer((8,), "float32")):
    for i in range(8):
        with T.sblock("mul"):
            vi = T.axis.spatial(8, i)
            b[vi] = a[vi] * (T.float32(0.5) * T.float32(3))


@T.prim_func(s_tir=True)
def reads_buffer(a: T.Buffer((8,), "int32"), b: T.Buffer((8,), "int32")):
    c = T.sblock_alloc_buffer((), "int32")
    with T.sblock("first"):
        vi = T.axis.spatial(1, 0)
        c[()] = a[0] + 1
    for i in range(8):
        with T.sblock("add"):
            vi = T.axis.spatial(8, i)
            b[vi] = a[vi] + c[()]


@T.prim_func(s_tir=True)
def depends_on_loop_var(a: T.Buffer((8,), "int32"), b: T.Buffer((8, 4), "int32")):
    c = T.sblock_alloc_buffer((4,), "int32")
    for j in range(4):
        with T.sblock("iota"):
            vj = T.axis.spatial(4, j)
            T.reads()
            T.writes(c[vj])
            c[vj] = vj * 3
    for i, j in T.grid(8, 4):
        with T.sblock("add"):
            vi, vj = T.axis.remap("SS", [i, j])
            b[vi, vj] = a[vi] + c[vj]


@T.prim_func(s_tir=True)
def writes_output(a: T.Buffer((8,), "int32"), b: T.Buffer((8,), "int32"), zp: T.Buffer((), "int32")):
    with T.sblock("zp"):
        vi = T.axis.spatial(1, 0)
        T.reads()
        T.writes(zp[()])
        zp[()] = 7
    for i in range(8):
        with T.sblock("add"):
            vi = T.axis.spatial(8, i)
            b[vi] = a[vi] + zp[()]


@pytest.mark.parametrize("before,after", [(zero_dim_before, zero_dim_after),
                                          (renamed_before, zero_dim_after),
                                          (all_ones_before, all_ones_after)])
def test_constant_scalar_blocks_are_inlined(before, after):
    expected = after.with_attr("global_symbol", before.attrs["global_symbol"])
    tvm.ir.assert_structural_equal(apply_rule(before), expected)


@pytest.mark.parametrize("func", [reads_buffer, depends_on_loop_var, writes_output])
def test_other_blocks_are_left_alone(func):
    tvm.ir.assert_structural_equal(apply_rule(func), func)


def test_detection_is_structural_not_by_name():
    sch = Schedule(renamed_before)
    assert is_constant_scalar_block(sch.get(sch.get_sblock("zp_out")))
    assert not is_constant_scalar_block(sch.get(sch.get_sblock("add")))
    sch = Schedule(depends_on_loop_var)
    assert not is_constant_scalar_block(sch.get(sch.get_sblock("iota")))


def test_counts_what_it_inlined_and_is_idempotent():
    sch = Schedule(zero_dim_before)
    assert inline_constant_scalars(sch) == 1
    assert inline_constant_scalars(sch) == 0
