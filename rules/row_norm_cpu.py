"""Row normalizations on CPU (LayerNorm, softmax): each row statistic once, at its row.

Pattern (by structure, never by name): a PrimFunc whose last block writes the output over
``rows x D`` (all axes spatial) and whose other blocks each write one value per row (a buffer
shaped like the rows) -- reductions over the rows' trailing axis (``x_sum``, ``x_var_sum``) and
per-row scalars (``x_mean``) -- or an elementwise ``rows x D`` intermediate (softmax's ``exp``),
with at least one reduction.  Relax's ``nn.layer_norm`` and ``nn.softmax`` over the last axis
legalize to that, and so does Phi-2's own softmax (a polynomial exp, ``workloads.phi2.layers``).

Why: dlight's CPU Reduction rule computes the row statistics at the output's inner loop, so
each of Phi-2's 2560 outputs recomputes both reductions over the 2560 inputs: 7 ms per decode
LayerNorm, 40 % of a decode step with DequantGEMV, where the unscheduled kernel takes ~0.01 ms
(``tvm-ext generate``, docs/journal.md).  This schedule keeps the unscheduled kernel's
order -- each statistic computed once per row, before that row's outputs -- with the rows
fused and parallel when there are several (prefill), each statistic computed at its row, and
the output's trailing axis (and an intermediate's) vectorized.  Each reduction over D is split into
``lanes`` partial sums (``rfactor``), vectorized, then summed: serial, each of the 2560 adds of a decode
LayerNorm waited for the one before (over 10x slower than split, cache-hot).  The sum is
reassociated: results move in their last bits (4.8e-7 on that LayerNorm).

``RowNormCPU().apply(func, target, tunable)`` is that schedule (the scheduling pass's, untuned like
dlight); its MetaSchedule face (in ``tvm_ext.space`` for llvm) adds it beside MetaSchedule's sketches
with the vector width (output and partial sums) sampled (16, 8 or 4 lanes where they divide D, else
one odd width, ``_widths``).
"""
from __future__ import annotations

from typing import Optional

from tvm_ext.schedule_rule import SKIP, ScheduleRule
from tvm_ext.tir_utils import is_param, root_child_blocks, sample_choice, vectorize_row

VECTOR_LANES = (16, 8, 4)  # the first that divides D: two AVX2 vectors of float32, or one AVX-512


def _shape(buf) -> Optional[tuple]:
    try:
        return tuple(int(e) for e in buf.shape)
    except TypeError:  # a symbolic extent
        return None


def _plan(func) -> Optional[tuple]:
    """(output block name, statistics block names in order, rows extents, D) or None."""
    found = root_child_blocks(func)
    if found is None:
        return None
    sch, blocks = found
    if len(blocks) < 2:
        return None
    *stats, last = [sch.get(b) for b in blocks]
    if len(last.writes) != 1 or not is_param(func, last.writes[0].source):
        return None
    out_shape = _shape(last.writes[0].source)
    if not out_shape or len(out_shape) < 2 or any(iv.iter_type != 0 for iv in last.iter_vars):
        return None
    rows, d = out_shape[:-1], out_shape[-1]
    reductions = 0
    for block in stats:
        if len(block.writes) != 1 or is_param(func, block.writes[0].source):
            return None
        kinds = [iv.iter_type for iv in block.iter_vars]
        if _shape(block.writes[0].source) == out_shape and kinds == [0] * len(out_shape):
            continue  # an elementwise intermediate over the rows (softmax's exp): computed at its row too
        if _shape(block.writes[0].source) != rows:
            return None
        if kinds[:len(rows)] != [0] * len(rows) or len(kinds) > len(rows) + 1:
            return None
        if len(kinds) == len(rows) + 1:
            if kinds[-1] != 2 or int(block.iter_vars[-1].dom.extent) != d:
                return None
            reductions += 1
    if not reductions:
        return None
    return last.name_hint, [b.name_hint for b in stats], rows, d


def _widths(d: int) -> list:
    """The vector widths for rows of D: those of ``VECTOR_LANES`` that divide D, else D's largest
    divisor in [8, 32] (a decode softmax over 512 + 1 keys: 27 lanes, twice as fast as unvectorized:
    LLVM splits the odd vector over two registers), else none."""
    return [n for n in VECTOR_LANES if d % n == 0] or [n for n in range(32, 7, -1) if d % n == 0][:1]


def _elementwise(stmt, rows) -> bool:
    return len(stmt.iter_vars) == len(rows) + 1 and all(int(iv.iter_type) == 0 for iv in stmt.iter_vars)


def schedule(sch, plan, sample: bool = False, annotate: bool = False) -> None:
    """Schedule the function ``sch`` works on as ``plan`` says (module doc).  With ``sample`` the
    vector width is a sampled decision (the widest of ``VECTOR_LANES`` that divides D first); with
    ``annotate`` every block (and the root) is marked for PostOrderApply's other rules to skip."""
    out_name, stat_names, rows, d = plan
    widths = _widths(d)
    lanes = sample_choice(sch, widths, widths[0], sample and len(widths) > 1) if widths else None
    kept = []  # an elementwise intermediate read by one block only (softmax's shift) is inlined there:
    for stat in stat_names:  # one pass less over the row (decode softmax: 12 % less time)
        block = sch.get_sblock(stat)
        if _elementwise(sch.get(block), rows) and len(sch.get_consumers(block)) == 1:
            sch.compute_inline(block)
        else:
            kept.append(stat)
    order, partials = [], []  # every statistic, each reduction's partial sums (rfactor) before it
    for stat in kept:
        block = sch.get_sblock(stat)
        if widths and int(sch.get(block).iter_vars[-1].iter_type) == 2:
            sch.split(sch.get_loops(block)[-1], [None, lanes])
            partials.append(sch.rfactor(sch.get_loops(block)[-1], factor_axis=len(rows)))
            order.append(partials[-1])
        order.append(block)
    out = sch.get_sblock(out_name)
    *row_loops, inner = sch.get_loops(out)
    row = sch.fuse(*row_loops) if len(row_loops) > 1 else row_loops[0]
    for block in reversed(order):  # consumers first: each lands under the row loop
        sch.compute_at(block, row, preserve_unit_loops=True)
    if widths:
        for rf in partials:  # compute_at put the lane loop outermost: lanes innermost, vectorized
            lane, *_, k = sch.get_loops(rf)[-(len(rows) + 2):]
            sch.reorder(k, lane)
            sch.vectorize(lane)
    total_rows = 1
    for extent in rows:
        total_rows *= extent
    if total_rows > 1:
        sch.parallel(row)
    if annotate:
        for block in (out, *order, sch.get_sblock("root")):
            sch.annotate(block, *SKIP)
    # last: a partitioned loop's blocks are new ones.  An odd width (none of VECTOR_LANES divides D: 27 lanes for
    # 513 keys fill two 16-lane registers to 84 %) gives way to 16 lanes and a scalar tail: decode softmax over 513
    # keys: a quarter less time
    odd = not widths or widths[0] not in VECTOR_LANES
    vectorize_row(sch, inner, d, lanes, odd)
    for stat in kept:  # the elementwise intermediates: their row vectorized as the output's
        if _elementwise(sch.get(sch.get_sblock(stat)), rows):
            vectorize_row(sch, sch.get_loops(sch.get_sblock(stat))[-1], d, lanes, odd)


class RowNormCPU(ScheduleRule):
    """A row normalization (module doc) scheduled row by row; the vector width sampled when tunable."""

    name = "row_norm_cpu"
    plan_of = staticmethod(_plan)
    schedule_with = staticmethod(schedule)

    def blocks(self, plan):
        return (plan[0], *plan[1])
