"""Single-block contractions on CPU (decode attention: ``q . K`` and ``p . V``), read in order.

Pattern (by structure, never by name): a PrimFunc of one block that writes a function output,
reads two buffers and reduces over one axis, its last iter var.  The larger operand (the KV
cache in Phi-2's ``attn_score`` and ``attn_value``) decides the form:

* *dot* -- the reduction var is its innermost index (``score[h, j] = sum_r q[h, r] K[j, h, r]``):
  the spatial axes are fused and parallel, ordered so the outer ones walk the operand in memory
  order, and the reduction is split by ``LANES`` and rfactored, so that each output is a vector
  of partial sums over contiguous elements, added at the end;
* *axpy* -- the output's innermost spatial var is (a function of) its innermost index
  (``value[c] = sum_r p[c // d, r] V[r, c // d, c % d]``): the reduction moves outside the
  output's innermost axis, which is split into parallel chunks and vectorized, so each step
  adds one contiguous row of the operand into a vector of outputs.

Why: dlight's CPU GEMV rule takes ``attn_score`` (2.7 ms a decode layer at 512 past positions)
and nothing takes ``attn_value``, which then walks the KV cache column by column (3.4 ms); the
cache is 5.2 MB per layer, 0.16 ms at this machine's bandwidth.  Other functions are left as they
are (``matches`` is False), the dequantize-GEMVs are DequantGEMV's.

Used untuned (``untuned(mod, target)``) by the Phi-2 ``rule`` schedules; not a MetaSchedule rule.
"""
from __future__ import annotations

from typing import Optional

import tvm
from tvm import tirx
from tvm.ir.expr import TensorLoad
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import ScheduleError

from tvm_ext.tir_utils import collect, is_param, root_child_blocks

LANES = 8  # float32 lanes of one AVX2 register
CHUNK = 64  # outputs per parallel chunk in the axpy form


def _uses(expr, var) -> bool:
    return any(v.same_as(var) for v in collect(expr, tvm.ir.expr.Var))


def _form(func) -> Optional[str]:
    """"dot", "axpy" or None (module doc)."""
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
    loops = sch.get_loops(blocks[0])
    if len(loops) != len(kinds):
        return None
    reduce_var, last_spatial = block.iter_vars[-1].var, block.iter_vars[-2].var
    load = _big_load(block)
    if load is None:
        return None
    last_index = load.indices[-1]
    if isinstance(last_index, tirx.Var) and last_index.same_as(reduce_var):
        return "dot" if int(block.iter_vars[-1].dom.extent) % LANES == 0 else None
    if _uses(last_index, last_spatial) and not _uses(last_index, reduce_var):
        return "axpy" if int(block.iter_vars[-2].dom.extent) % CHUNK == 0 else None
    return None


def _size(buf) -> int:
    size = 1
    for extent in buf.shape:
        size *= int(extent) if isinstance(extent, tirx.IntImm) else 1
    return size


def _big_load(block):
    """The block body's load of its larger operand (module doc), or None."""
    big = max(block.reads, key=lambda r: _size(r.source))
    return next((load for load in collect(block.body, TensorLoad) if load.source.same_as(big.source)), None)


def _schedule(name: str, func):
    form = _form(func)
    if form is None:
        return None
    sch = Schedule(tvm.IRModule({name: func}))
    sch.work_on(name)
    try:
        (block,) = sch.get_child_blocks(sch.get_sblock("root"))
        *spatial, red = sch.get_loops(block)
        if form == "dot":
            spatial = _in_memory_order(sch, block, spatial)
            _dot(sch, block, spatial, red)
        else:
            _axpy(sch, block, spatial, red)
    except ScheduleError:
        return None
    return sch.mod[name]


def _in_memory_order(sch, block, loops) -> list:
    """``loops`` (one per spatial iter var, in order) reordered as their vars index the larger
    operand, outermost first; vars it does not use go first."""
    stmt = sch.get(block)
    load = _big_load(stmt)  # found: _form accepted the block

    def position(k):
        var = stmt.iter_vars[k].var
        return next((i for i, index in enumerate(load.indices) if _uses(index, var)), -1)

    order = sorted(range(len(loops)), key=position)
    if order != list(range(len(loops))):
        sch.reorder(*[loops[k] for k in order])
    return [loops[k] for k in order]


def _dot(sch, block, spatial, red) -> None:
    outer = sch.fuse(*spatial)
    sch.parallel(outer)
    _ro, lanes = sch.split(red, [None, LANES])
    partial = sch.rfactor(lanes, 0)
    # the partial sums: one vector of LANES per output, over contiguous elements
    *_, r_o, r_v = sch.get_loops(partial)
    sch.vectorize(r_v)
    sch.decompose_reduction(partial, r_o)


def _axpy(sch, block, spatial, red) -> None:
    *rows, last = spatial
    chunk, inner = sch.split(last, [None, CHUNK])
    outer = sch.fuse(*rows, chunk) if rows else chunk
    sch.parallel(outer)
    sch.reorder(red, inner)
    _inner_o, inner_v = sch.split(inner, [None, LANES])
    sch.vectorize(inner_v)
    sch.decompose_reduction(block, red)


def untuned(mod: tvm.IRModule, target=None) -> tvm.IRModule:  # pylint: disable=unused-argument
    """Every PrimFunc of ``mod`` that ``matches`` scheduled (module doc); the others unchanged."""
    out = {}
    for gv, func in mod.functions.items():
        scheduled = _schedule(gv.name_hint, func) if isinstance(func, tirx.PrimFunc) else None
        out[gv] = func if scheduled is None else scheduled
    return tvm.IRModule(out, attrs=mod.attrs)


def matches(func) -> bool:
    """Whether ``untuned`` schedules ``func`` (a contraction this rule handles)."""
    return _schedule("main", func) is not None
