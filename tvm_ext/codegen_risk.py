"""Which scheduled GPU functions need ``tvm.compile``'s own lowering to be judged.

VerifyGPUCode's last stage lowers a candidate as ``tvm.compile`` does and looks for two
things the short pipeline (TVM's built-in check) cannot see: a pipeline failure, and a
broadcast TVM 0.27's CUDA codegen writes in a form nvcc rejects (over 16 bytes, or an
8/16-bit integer of over 4 lanes).  That lowering is the expensive part of the search
(25-60 ms per valid conv candidate), so it runs only where it can change the verdict:

* a cross-thread reduction: explicit unrolling copies its allreduce and
  LowerThreadAllreduce fails (the only pipeline failure verify-gpu found in 5800
  nvcc-checked candidates; it needs the full, unrolled pipeline);
* a vector of over ``SAFE_LANES`` lanes, or of over ``SAFE_LANES_64BIT`` with a 64-bit
  value in reach (``q_multiply_shift`` becomes int64 arithmetic in LowerIntrin): only
  those can hold a broadcast over the limits.  Vectors come from vectorized loops
  (lanes: the product of the nested vectorized extents) or are already in the function
  (tensor intrinsics); a dynamic vectorized extent counts as unbounded.

The two questions are ``has_cross_thread_reduction`` and ``wide_vectors``; everything
else keeps the verdict of the cheaper stages.  For the second kind,
VerifyGPUCode looks first at the broadcasts of the short code it has anyway, and runs
``tvm.compile``'s pipeline only when one is there (the pipeline's simplifier may remove
it); ``tvm-ext verify-gpu --replay`` checks both steps on verify-gpu's 5800 candidates.
"""
from __future__ import annotations

from typing import Optional

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir.expr import TensorLoad
from tvm.s_tir.stmt import SBlock, SBlockRealize

from tvm_ext.tir_utils import collect

# 32-bit (or narrower) vectors of up to 4 lanes are <= 16 bytes, and narrow integers of
# up to 4 lanes are what the codegen packs into one int; 64-bit ones reach 16 bytes at 2.
SAFE_LANES = 4
SAFE_LANES_64BIT = 2
_Q_MULTIPLY = ("tirx.q_multiply_shift", "tirx.q_multiply_shift_per_axis")


def has_cross_thread_reduction(func: tirx.PrimFunc) -> bool:
    """True when a reduction iterator of some block is bound to a thread-bound loop
    (LowerCrossThreadReduction turns it into ``tvm_thread_allreduce``)."""
    thread_vars = set()
    found = False

    def on_loop(loop, visitor):
        if loop.thread_binding is not None and str(loop.thread_binding.thread_tag).startswith("threadIdx"):
            thread_vars.add(loop.loop_var)
        return visitor.default_visit(loop)

    def on_realize(realize, visitor):
        nonlocal found
        for iv, value in zip(realize.block.iter_vars, realize.iter_values):
            if iv.iter_type == tirx.IterVar.CommReduce and any(
                    v in thread_vars for v in collect(value, tvm.ir.expr.Var)):
                found = True
        return visitor.default_visit(realize)

    tvm_ffi.structural_visit(func.body, [(tirx.For, on_loop), (SBlockRealize, on_realize)])
    return found


def _bits(ty) -> int:
    try:
        return tvm.DataType(str(ty)).bits
    except Exception:  # noqa: BLE001 -- not a primitive type (a handle's pointer type): no vector
        return 0


def _shape(param) -> tuple:
    try:
        return tuple(param.shape)
    except Exception:  # noqa: BLE001 -- a scalar parameter: no buffer
        return ()


def _wide_indices(func: tirx.PrimFunc) -> bool:
    """True when some buffer may hold 2**31 elements or more: then NarrowDataType(32) can
    leave int64 index vectors in place.  Otherwise int64 index arithmetic (TVM's default
    index type for Relax-extracted tasks) is narrowed to int32 before vectorized code is
    generated, and only 64-bit *values* can make a vector 64-bit wide."""
    shapes = [_shape(param) for param in func.params]  # TVM 0.27: buffer-typed parameters
    shapes += [alloc.buffer.shape for alloc in collect(func.body, tirx.stmt.AllocBuffer)]
    shapes += [buf.shape for block in collect(func.body, SBlock) for buf in block.alloc_buffers]
    for shape in shapes:
        size = 1
        for ext in shape:
            if not isinstance(ext, tirx.IntImm):
                return True
            size *= int(ext.value)
        if size >= 2**31:
            return True
    return False


def _has_64bit(stmt, wide_indices: bool) -> bool:
    """A 64-bit value in ``stmt``: a 64-bit buffer read or written, a read widened to 64
    bits, a float64 constant, ``q_multiply_shift`` (int64 arithmetic after LowerIntrin);
    any 64-bit expression at all when ``wide_indices``."""
    if any(_bits(store.buffer.dtype) == 64 for store in collect(stmt, tirx.BufferStore)):
        return True
    for expr in collect(stmt, tvm.ir.expr.Expr):
        if isinstance(expr, tvm.ir.expr.Call) and getattr(expr.op, "name", "") in _Q_MULTIPLY:
            return True
        if _bits(expr.ty) != 64:
            continue
        if wide_indices or isinstance(expr, TensorLoad) or "float" in str(expr.ty):
            return True
        if isinstance(expr, tirx.Cast) and collect(expr.value, TensorLoad):
            return True
    return False


def _vector_exprs(stmt) -> list:
    """Vector-typed expressions already in the (unlowered) function: intrinsic bodies."""
    found = collect(stmt, tirx.Ramp) + collect(stmt, tirx.Broadcast)
    return found + [e for e in collect(stmt, TensorLoad) if tvm.DataType(str(e.ty)).lanes > 1]


def wide_vectors(func: tirx.PrimFunc) -> Optional[str]:
    """Why ``func`` may hold a broadcast over the codegen's limits (the second kind of the
    module doc), or None when it cannot."""
    why: list = []
    wide = None  # _wide_indices(func), computed once if a loop needs it

    def has_64bit(body) -> bool:
        nonlocal wide
        if wide is None:
            wide = _wide_indices(func)
        return _has_64bit(body, wide)

    # nested vectorized loops multiply their lanes: visit the inner ones with the product
    stack: list = []

    def visit(loop, visitor):
        if loop.kind != tirx.ForKind.VECTORIZED:
            return visitor.default_visit(loop)
        if not isinstance(loop.extent, tirx.IntImm):
            why.append("dynamic vectorized extent")
            return None
        lanes = (stack[-1] if stack else 1) * int(loop.extent.value)
        if lanes > SAFE_LANES:
            why.append(f"{lanes} lanes")
            return None
        if lanes > SAFE_LANES_64BIT and has_64bit(loop.body):
            why.append(f"{lanes} lanes with 64-bit values")
            return None
        stack.append(lanes)
        try:
            return visitor.default_visit(loop)
        finally:
            stack.pop()

    tvm_ffi.structural_visit(func.body, [(tirx.For, visit)])
    if why:
        return why[0]
    return "vector expressions before lowering" if _vector_exprs(func.body) else None
