"""InlineConstantScalars: inline every constant-scalar block of a function first.

Pattern: a block with no reads and one write of a single element (0-d buffer, or
every extent 1) whose value is a constant expression (no loads, no variables) --
e.g. the output zero point of a quantized conv, the "compile_engine_const" block
of the TVM PR this project grew from.

Why: such a block is a second producer of the requantize epilogue. While it
exists, ReverseComputeInline of the epilogue into the conv fails, so MetaSchedule
never generates the fused conv+requantize kernel. TVM's own rule of the same name
inlines a constant block only when PostOrderApply reaches it; this one inlines all
of them in the function on the first visit to any block, whatever the visiting
order, and never raises (a block it cannot inline, e.g. one that writes a function
output, is left untouched). Detection is by structure, never by block name.

A block-level rule of the contract (``tvm_ext.schedule_rule``): its MetaSchedule face inlines in
place and hands the schedule on; ``apply(func, target)`` is the same inlining as a fresh schedule
(None where the function has no such block).
"""
from __future__ import annotations

from tvm.s_tir.schedule import ScheduleError
from tvm.s_tir.stmt import SBlock
from tvm import tirx

from tvm.ir.expr import TensorLoad, Var

from tvm_ext.schedule_rule import ScheduleRule
from tvm_ext.tir_utils import blocks_of, collect, has_load_or_var, is_param, prim_funcs


def is_constant_scalar_block(block: SBlock) -> bool:
    """True for a block that only writes one constant element (see module doc)."""
    if block.reads or len(block.writes) != 1 or block.init is not None:
        return False
    if block.alloc_buffers or block.match_buffers:
        return False
    region = block.writes[0]
    if not all(_is_one(r.extent) for r in region.region):
        return False
    store = block.body
    if not isinstance(store, tirx.BufferStore):
        return False
    # Indices may only use block iterators of extent 1 (``vi = T.axis.spatial(1, 0)``).
    unit_iters = [iv.var for iv in block.iter_vars if _is_one(iv.dom.extent)]
    for index in store.indices:
        if collect(index, TensorLoad) or any(
            not any(v.same_as(u) for u in unit_iters) for v in collect(index, Var)
        ):
            return False
    return not has_load_or_var(store.value)


def _is_one(expr) -> bool:
    return isinstance(expr, tirx.IntImm) and expr.value == 1


def inline_constant_scalars(sch) -> int:
    """Compute-inline every constant-scalar block of every PrimFunc in ``sch``.

    Returns how many blocks were inlined. Blocks that cannot be inlined stay.
    """
    inlined = 0
    for func_name, func in prim_funcs(sch.mod):
        for block in blocks_of(func):
            if not is_constant_scalar_block(block) or is_param(func, block.writes[0].source):
                continue
            try:
                sch.compute_inline(sch.get_sblock(block.name_hint, func_name=func_name))
                inlined += 1
            except ScheduleError:
                pass  # e.g. a consumer that cannot take the value; leave the block
    return inlined


def _plan(func) -> list | None:
    """Names of ``func``'s constant-scalar blocks that do not write a parameter, or None where there are none."""
    names = [block.name_hint for block in blocks_of(func)
             if is_constant_scalar_block(block) and not is_param(func, block.writes[0].source)]
    return names or None


def _schedule(sch, plan, sample: bool = False, annotate: bool = False) -> None:  # pylint: disable=unused-argument
    inline_constant_scalars(sch)


class InlineConstantScalars(ScheduleRule):
    """Schedule rule: inline all constant-scalar blocks before any consumer is visited."""

    name = "inline_constant_scalars"
    gpu = None
    plan_of = staticmethod(_plan)
    schedule_with = staticmethod(_schedule)

    def candidates(self, sch, block, target):
        inline_constant_scalars(sch)
        return [sch]
