"""Structure of a decode dequantize-GEMV kernel (the analysis behind ``rules/dequant_gemv.py`` and
``rules/dequant_gemv_cuda.py``; ``inline_around`` is both rules' first schedule step).

A PrimFunc is a *dequantize-GEMV* when its blocks are, in program order:

1. optionally a dequantize block ``W[k, n] = f(P[n, k // pack], S[n, k // group])``: spatial only,
   reading one packed integer buffer ``P`` (``pack`` values per word along K) and one float scale
   buffer ``S`` (one scale per ``group`` values along K), writing an intermediate buffer;
2. the GEMV: one reduction block ``C[.., n] = C[.., n] + X[.., k] * W[k, n]`` (either operand order)
   whose only non-unit spatial iterator is ``n`` and whose only reduction iterator is ``k``, with
   ``n`` and ``k`` its two innermost loops; ``W`` is either the dequantize block's output or the
   dequantize expression already inlined (MetaSchedule's AutoInline may have done it);
3. zero or more epilogue blocks (spatial only: bias, gelu, residual adds), the last one writing the
   function's output.

Nothing else may be in the function. Detection is by structure (dtypes, shapes, index
expressions), never by block or buffer name. ``match(sch, block)`` answers for one block of a
schedule (a MetaSchedule rule's view); ``match_func(func)`` for a whole PrimFunc.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import tirx
from tvm.ir.expr import TensorLoad
from tvm.s_tir.stmt import SBlockRealize

from tvm_ext.tir_utils import blocks_of, collect, is_param


@dataclass
class GemvPattern:
    """What ``match`` found. Block names are those of the analysed function."""

    gemv: str  # the reduction block
    dequantize: str | None  # the dequantize block, None when already inlined into the GEMV
    epilogues: list = field(default_factory=list)  # spatial blocks after the GEMV, in order
    n: int = 0  # output columns
    k: int = 0  # reduction length
    pack: int = 8  # values per packed word
    group: int = 32  # values per scale


def _dtype(node) -> str:
    """dtype of a buffer or an expression (TVM 0.27 expressions carry ``ty``, buffers ``dtype``)."""
    dt = getattr(node, "dtype", None)
    return str(dt if dt is not None else node.ty)


def _int(expr):
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None


def _is_var(expr, var) -> bool:
    return isinstance(expr, tirx.Var) and expr.same_as(var)


def _div_of(expr, var):
    """c when ``expr`` is ``var // c`` (FloorDiv by a constant), 1 when it is ``var``, else None."""
    if _is_var(expr, var):
        return 1
    if isinstance(expr, tirx.FloorDiv) and _is_var(expr.a, var):
        return _int(expr.b)
    return None


def _is_reduction(block) -> bool:
    return any(int(iv.iter_type) == tirx.IterVar.CommReduce for iv in block.iter_vars)


def _is_spatial(block) -> bool:
    return block.init is None and all(int(iv.iter_type) == tirx.IterVar.DataPar for iv in block.iter_vars)


def _product_operands(block):
    """(a, b) when the block's body is ``C[idx] = C[idx] + a * b`` in a float dtype, else None."""
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not _dtype(store.value).startswith("float"):
        return None
    value = store.value
    if not isinstance(value, tirx.Add):
        return None
    for acc, prod in ((value.a, value.b), (value.b, value.a)):
        if isinstance(acc, TensorLoad) and acc.source.same_as(store.buffer) and isinstance(prod, tirx.Mul):
            return prod.a, prod.b
    return None


def _weight_loads(expr):
    """(packed load, scale load) when ``expr`` reads exactly one integer and one float 2-D buffer."""
    loads = collect(expr, TensorLoad)
    bufs = {}
    for load in loads:
        bufs.setdefault(load.source, []).append(load)
    ints = [ls for b, ls in bufs.items() if _dtype(b).startswith(("int", "uint"))]
    floats = [ls for b, ls in bufs.items() if _dtype(b).startswith("float")]
    if len(bufs) != 2 or len(ints) != 1 or len(floats) != 1:
        return None
    packed, scale = ints[0], floats[0]
    if any(len(ld.indices) != 2 for ld in packed + scale):
        return None
    return packed, scale


def _check_weight(expr, k_var, n_var, k: int, n: int):
    """(pack, group) when ``expr`` dequantizes ``P[n, k // pack]`` with ``S[n, k // group]``."""
    found = _weight_loads(expr)
    if found is None:
        return None
    packed, scale = found
    pack = _div_of(packed[0].indices[1], k_var)
    group = _div_of(scale[0].indices[1], k_var)
    for loads, c in ((packed, pack), (scale, group)):
        if c is None or any(not _is_var(ld.indices[0], n_var) or _div_of(ld.indices[1], k_var) != c
                            for ld in loads):
            return None
        shape = [_int(s) for s in loads[0].source.shape]
        if shape != [n, k // c]:
            return None
    bits = tvm.DataType(_dtype(packed[0].source)).bits
    if pack < 2 or bits % pack or k % group or group % pack:
        return None
    return pack, group


def _gemv_iters(block):
    """(k var, n var, k extent, n extent) of a 1-row GEMV reduction block, else None."""
    reduce = [iv for iv in block.iter_vars if int(iv.iter_type) == tirx.IterVar.CommReduce]
    spatial = [iv for iv in block.iter_vars if int(iv.iter_type) == tirx.IterVar.DataPar]
    if len(reduce) != 1 or len(spatial) + 1 != len(block.iter_vars):
        return None
    big = [iv for iv in spatial if _int(iv.dom.extent) != 1]
    if len(big) != 1 or any(_int(iv.dom.extent) is None for iv in block.iter_vars):
        return None  # several rows (prefill) or dynamic shapes: not a decode GEMV
    return reduce[0].var, big[0].var, _int(reduce[0].dom.extent), _int(big[0].dom.extent)


def _activation(expr, k_var, n_var) -> bool:
    """Whether ``expr`` is ``X[.., k]``: a float load indexed by ``k`` last, never by ``n``."""
    if not isinstance(expr, TensorLoad) or not _dtype(expr).startswith("float"):
        return False
    *head, last = expr.indices
    if not _is_var(last, k_var):
        return False
    used = [v for i in head for v in collect(i, tirx.Var)]
    return not any(v.same_as(k_var) or v.same_as(n_var) for v in used)


def _dequantize_source(load, blocks, k_var, n_var):
    """The dequantize block producing the buffer of ``load`` (``W[k, n]`` read by the GEMV), and the
    (k, n) variables its body uses in place of the GEMV's, or None."""
    writers = [b for b in blocks if any(w.source.same_as(load.source) for w in b.writes)]
    if len(writers) != 1 or not _is_spatial(writers[0]) or len(load.indices) != 2:
        return None
    deq = writers[0]
    store = deq.body
    if not isinstance(store, tirx.BufferStore) or len(store.indices) != 2:
        return None
    if not all(isinstance(i, tirx.Var) for i in store.indices):
        return None
    # the GEMV reads W[k, n] or W[n, k]; the dequantize block writes W[d0, d1]
    roles = {}
    for gemv_index, deq_index in zip(load.indices, store.indices):
        if _is_var(gemv_index, k_var):
            roles["k"] = deq_index
        elif _is_var(gemv_index, n_var):
            roles["n"] = deq_index
    if len(roles) != 2:
        return None
    return deq, roles["k"], roles["n"]


def match_func(func) -> GemvPattern | None:
    """The dequantize-GEMV structure of ``func`` (see module doc), or None."""
    blocks = blocks_of(func)
    reductions = [b for b in blocks if _is_reduction(b)]
    if len(reductions) != 1:
        return None
    gemv = reductions[0]
    iters = _gemv_iters(gemv)
    operands = _product_operands(gemv)
    if iters is None or operands is None:
        return None
    k_var, n_var, k, n = iters
    a, b = operands
    weight = b if _activation(a, k_var, n_var) else a if _activation(b, k_var, n_var) else None
    if weight is None:
        return None
    deq = None
    if isinstance(weight, TensorLoad) and not is_param(func, weight.source):
        source = _dequantize_source(weight, blocks, k_var, n_var)
        if source is None:
            return None
        deq, dk, dn = source
        pg = _check_weight(deq.body.value, dk, dn, k, n)
    else:
        pg = _check_weight(weight, k_var, n_var, k, n)
    if pg is None:
        return None
    order = [b.name_hint for b in blocks]
    pos = order.index(gemv.name_hint)
    before = [x for x in order[:pos] if deq is None or x != deq.name_hint]
    epilogues = blocks[pos + 1:]
    if before or not all(_is_spatial(e) for e in epilogues):
        return None
    if epilogues and not any(is_param(func, w.source) for w in epilogues[-1].writes):
        return None
    return GemvPattern(gemv.name_hint, deq.name_hint if deq is not None else None,
                       [e.name_hint for e in epilogues], n, k, pg[0], pg[1])


def match(sch, block) -> GemvPattern | None:
    """``match_func`` of the function holding ``block`` in ``sch``, when ``block`` is its GEMV
    and the GEMV's two innermost loops are plain loops over n then k (as TE makes them)."""
    target = sch.get(block)
    for _, func in sch.mod.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        realizes = [r for r in collect(func.body, SBlockRealize) if r.block.same_as(target)]
        if not realizes:
            continue
        found = match_func(func)
        if found is None or found.gemv != target.name_hint:
            return None
        return found if _loops_fit(sch, block, realizes[0]) else None
    return None


def _loops_fit(sch, block, realize) -> bool:
    loops = sch.get_loops(block)
    iters = _gemv_iters(realize.block)
    if len(loops) < 2 or iters is None:
        return False
    binds = dict(zip([iv.var for iv in realize.block.iter_vars], realize.iter_values))
    k_bind = next(v for var, v in binds.items() if var.same_as(iters[0]))
    n_bind = next(v for var, v in binds.items() if var.same_as(iters[1]))
    n_loop, k_loop = (sch.get(lp) for lp in loops[-2:])
    return (_is_var(k_bind, k_loop.loop_var) and _is_var(n_bind, n_loop.loop_var)
            and _int(k_loop.min) == 0 and _int(n_loop.min) == 0
            and _int(k_loop.extent) == iters[2] and _int(n_loop.extent) == iters[3])


def inline_around(sch, pattern: GemvPattern):
    """The first step of every schedule of the pattern: the dequantize (where it is a block) inlined into
    the GEMV and all epilogues but the last inlined into it; returns the last epilogue's block (None
    without epilogues), where the rules compute the output."""
    if pattern.dequantize is not None:
        sch.compute_inline(sch.get_sblock(pattern.dequantize))
    for name in pattern.epilogues[:-1]:
        sch.compute_inline(sch.get_sblock(name))
    return sch.get_sblock(pattern.epilogues[-1]) if pattern.epilogues else None
