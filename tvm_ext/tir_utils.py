"""Small TIR queries shared by the rules, postprocs and reports.

TVM 0.27 has no ``tirx.stmt_functor.post_order_visit``; traversal goes through
``tvm_ffi.structural_walk`` / ``structural_visit`` instead.
"""
from __future__ import annotations

from typing import Iterator, Optional

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir.expr import TensorLoad
from tvm.s_tir.stmt import SBlock, SBlockRealize


def collect(node, node_type) -> list:
    """All sub-nodes of ``node`` of ``node_type``, in post order."""
    found = []
    tvm_ffi.structural_walk(node, [(node_type, found.append)])
    return found


def has_load_or_var(expr) -> bool:
    """True when ``expr`` reads a buffer or mentions any variable."""
    return bool(collect(expr, TensorLoad) or collect(expr, tvm.ir.expr.Var))


def prim_funcs(mod: tvm.IRModule) -> Iterator[tuple[str, tirx.PrimFunc]]:
    """(name, PrimFunc) pairs of an IRModule."""
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            yield gv.name_hint, func


def blocks_of(func: tirx.PrimFunc) -> list[SBlock]:
    """Every SBlock of ``func`` except the implicit root block."""
    realizes = collect(func.body, SBlockRealize)
    root = func.body.block if isinstance(func.body, SBlockRealize) else None
    return [r.block for r in realizes if root is None or not r.block.same_as(root)]


def block_realize(sch, block, func_name: Optional[str] = None) -> Optional[SBlockRealize]:
    """The SBlockRealize of ``block`` (a block RV of ``sch``): its iterators' bindings, which
    a Schedule does not hand out. ``func_name``: the function it lies in (default: the one the
    schedule works on, else ``main``); None when it is not found once."""
    if func_name is None:
        func_name = sch.func_working_on if sch.func_working_on is not None else "main"
    stmt = sch.get(block)
    found = [r for r in collect(sch.mod[func_name].body, SBlockRealize) if r.block.same_as(stmt)]
    return found[0] if len(found) == 1 else None


def root_child_blocks(func) -> Optional[tuple]:
    """(a Schedule of ``func`` as ``main``, the block RVs right under its root block), or None
    when ``func`` is not a PrimFunc with a root block."""
    from tvm.s_tir import Schedule  # pylint: disable=import-outside-toplevel
    from tvm.s_tir.schedule import ScheduleError  # pylint: disable=import-outside-toplevel

    if not isinstance(func, tirx.PrimFunc):
        return None
    sch = Schedule(tvm.IRModule({"main": func}))
    try:
        return sch, list(sch.get_child_blocks(sch.get_sblock("root")))
    except ScheduleError:
        return None


def is_param(func: tirx.PrimFunc, source) -> bool:
    """True when a block region's ``source`` is one of the function's parameters.

    In TVM 0.27 parameters are buffer-typed Vars (there is no ``buffer_map``) and a
    region's ``source`` is that Var; a write to it is visible outside the function.
    """
    return any(param.same_as(source) for param in func.params)


def top_level_nests(func: tirx.PrimFunc) -> int:
    """Number of top-level statements (loop nests or blocks) under the root block.

    For an llvm candidate this is the number of loop nests; for a scheduled GPU
    candidate every top-level nest is bound to blockIdx and becomes one kernel.
    """
    body = func.body.block.body if isinstance(func.body, SBlockRealize) else func.body
    stmts = body.seq if isinstance(body, tirx.SeqStmt) else [body]
    return sum(1 for s in stmts if not isinstance(s, (tirx.stmt.Evaluate,)))


def dtype_bytes(dtype) -> int:
    """Bytes occupied by a (possibly vector) dtype, e.g. int64x4 -> 32."""
    dt = tvm.DataType(str(dtype))
    return dt.bits * dt.lanes // 8


def shape_bytes(dtype, shape) -> int:
    """Bytes of a buffer of ``shape`` (static extents) and ``dtype``: a parameter, a block's buffer, a constant."""
    n = dtype_bytes(dtype)
    for extent in shape:
        n *= int(extent)
    return n


def dtype_lanes(dtype) -> int:
    return tvm.DataType(str(dtype)).lanes


def sample_choice(sch, candidates, default, sample: bool):
    """A rule's decision over ``candidates``: sampled (uniform) when ``sample``, else ``default``'s (the
    nearest candidate not above it, which is also the sampled decision's first draw)."""
    fixed = max([c for c in candidates if c <= default] or candidates[:1])
    if not sample:
        return fixed
    return sch.sample_categorical(candidates, [1.0 / len(candidates)] * len(candidates),
                                  decision=candidates.index(fixed))


def vectorize_row(sch, loop, extent: int, lanes, odd: bool, full: int = 16) -> None:
    """Vectorize the innermost ``loop`` (of ``extent``) ``lanes`` wide (an int or a sampled ExprRV), except
    where ``odd`` (no usual width divides it) on a loop of at least ``full``: then its first
    ``full * (extent // full)`` iterations ``full`` wide and the rest scalar (``loop_partition``), not one
    ragged vector LLVM splits over registers; ``lanes`` None and not that long: left as it is."""
    if lanes is not None and (not odd or extent < full):
        sch.vectorize(sch.split(loop, [None, lanes])[1])
    elif extent >= full:
        head = sch.loop_partition(loop, [full * (extent // full), None])[0]
        sch.vectorize(sch.split(head, [None, full])[1])
