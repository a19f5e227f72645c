"""Structure of a single-block contraction (the analysis behind rules/contraction_cpu.py and
rules/contraction_cuda.py): decode attention's ``score[h, j] = sum_r q[h, r] K[j, h, r]`` and
``value[c] = sum_r p[c // d, r] V[r, c // d, c % d]``.

``single_contraction(func)``: a PrimFunc of one block (under the root) that writes a function output,
reads two buffers and reduces over one axis, its last iter var, with one loop per iter var.
``axpy_load(block)``: the operand whose innermost index follows the output's innermost var and not the
reduction (attention's values); ``big_load(block)``: the larger operand's load.  By structure, never by
name; the rules add their own conditions on the extents.
"""
from __future__ import annotations

import tvm
from tvm import tirx
from tvm.ir.expr import TensorLoad

from tvm_ext.tir_utils import collect, is_param, root_child_blocks


def uses(expr, var) -> bool:
    return any(v.same_as(var) for v in collect(expr, tvm.ir.expr.Var))


def single_contraction(func):
    """(Schedule, block RV, block) of ``func``'s one contraction block (module doc), or None."""
    found = root_child_blocks(func)
    if found is None:
        return None
    sch, blocks = found
    if len(blocks) != 1:
        return None
    block = sch.get(blocks[0])
    kinds = [int(iv.iter_type) for iv in block.iter_vars]
    if (len(block.reads) != 2 or len(block.writes) != 1 or not is_param(func, block.writes[0].source)
            or kinds.count(2) != 1 or kinds[-1] != 2 or len(kinds) < 2):
        return None
    if len(sch.get_loops(blocks[0])) != len(kinds):
        return None
    return sch, blocks[0], block


def axpy_load(block):
    """The load whose innermost index follows the output's innermost var and not the reduction
    (``V[r, c // d, c % d]`` in attention's values), or None.  Checked before the size of the
    operands: with many queries the probabilities outgrow the values they weigh."""
    reduce_var, last_spatial = block.iter_vars[-1].var, block.iter_vars[-2].var
    for load in collect(block.body, TensorLoad):
        last_index = load.indices[-1]
        if uses(last_index, last_spatial) and not uses(last_index, reduce_var):
            if not load.source.same_as(block.writes[0].source):
                return load
    return None


def _size(buf) -> int:
    size = 1
    for extent in buf.shape:
        size *= int(extent) if isinstance(extent, tirx.IntImm) else 1
    return size


def big_load(block):
    """The block body's load of its larger operand, or None."""
    big = max(block.reads, key=lambda r: _size(r.source))
    return next((load for load in collect(block.body, TensorLoad) if load.source.same_as(big.source)), None)
