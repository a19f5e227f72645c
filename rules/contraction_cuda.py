"""ContractionCUDA: decode attention's value product on GPUs, read row by row with coalesced loads.

Pattern (``tvm_ext.analysis.contraction_pattern``, by structure): a one-block contraction whose operand's
innermost index follows the output's innermost var and not the reduction -- the decode
``value[c] = sum_r p[c // d, r] V[r, c // d, c % d]`` over the KV cache's positions ``r``.

Why: dlight's GPU Reduction rule fails to build it (its cross-thread reduction needs the reduction
loops innermost) and falls back to ``Fallback``: one thread per output walking all positions, so a
warp reads 32 scattered cache rows at once.  At context 2048 the values are 10 MB per Phi-2 layer,
a third of a decode step's bytes.  This rule builds:

* ``columns`` consecutive outputs per thread block on ``threadIdx.x`` (a warp reads 64-256
  contiguous bytes of one cache row), the blocks over the output on ``blockIdx.x``;
* the positions split into ``parts`` contiguous ranges on ``threadIdx.y``, each thread summing its
  range into a register (rfactor), the ``parts`` sums of an output added across threads (TVM's
  cross-thread reduction over ``threadIdx.y``), the position loop unrolled up to ``UNROLL`` steps.

``columns`` and ``parts`` are sampled decisions (column counts that divide the output, part counts
with 4 or more positions a part, the last part shorter where they do not divide; the defaults
first).  The score product (``q . K``, reduced over the contiguous head dim) is left to dlight's GEMV
rule, which builds it; other functions pass unchanged.
"""
from __future__ import annotations

from typing import Optional

from tvm_ext.analysis.contraction_pattern import axpy_load, single_contraction
from tvm_ext.schedule_rule import SKIP, ScheduleRule
from tvm_ext.tir_utils import sample_choice

COLUMNS = (64, 32, 128)  # outputs per block (threadIdx.x)
PARTS = (8, 4, 16, 2)  # position ranges per output (threadIdx.y)
UNROLL = 16


def _plan(func) -> Optional[tuple]:
    """(columns candidates, parts candidates) where ``func`` is a one-query axpy contraction whose output
    some column count divides, with at least 8 positions, else None."""
    found = single_contraction(func)
    if found is None or axpy_load(found[2]) is None:
        return None
    block = found[2]
    spatial = [int(iv.dom.extent) for iv in block.iter_vars[:-1]]
    if any(extent != 1 for extent in spatial[:-1]):  # one query: the output is one row
        return None
    columns = [c for c in COLUMNS if spatial[-1] % c == 0]
    parts = [p for p in PARTS if int(block.iter_vars[-1].dom.extent) >= 4 * p]  # ranges of 4+ positions;
    # one that does not divide them gets a predicate (decode attends over 513 positions at context 512)
    return (columns, parts) if columns and parts else None


def schedule(sch, plan, sample: bool = False, annotate: bool = False) -> None:
    """Schedule the one-block function ``sch`` works on (module doc); ``sample``: columns / parts as
    sampled decisions; ``annotate``: mark the blocks (and the root) for PostOrderApply's other rules."""
    columns_c, parts_c = plan
    columns = sample_choice(sch, sorted(columns_c), COLUMNS[0], sample)
    parts = sample_choice(sch, sorted(parts_c), PARTS[0], sample)
    (block,) = sch.get_child_blocks(sch.get_sblock("root"))
    *units, col, pos = sch.get_loops(block)
    bx, tx = sch.split(col, [None, columns])
    ty, steps = sch.split(pos, [parts, None])
    rf = sch.rfactor(ty, factor_axis=0)
    *_, bx, tx, ty, steps = sch.get_loops(rf)
    sch.reorder(bx, ty, tx, steps)
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.set_scope(rf, 0, "local")
    sch.decompose_reduction(rf, steps)  # the zero before the range: a part past the end still adds 0
    sch.annotate(steps, "pragma_auto_unroll_max_step", UNROLL)
    sch.annotate(steps, "pragma_unroll_explicit", 1)
    # the sum of the parts: its loops below ``bx`` are (parts, columns) -- the rfactored iter var comes
    # first, the unit ones are dropped (parts and columns are never 1, so a trace replays this by
    # position) -- reordered so that the reduction is innermost, as TVM's cross-thread reduction needs
    sch.reverse_compute_at(block, bx)
    out_ty, out_tx = sch.get_loops(block)[-2:]
    sch.reorder(out_tx, out_ty)
    sch.bind(out_tx, "threadIdx.x")
    sch.bind(out_ty, "threadIdx.y")
    if annotate:
        root = sch.get_sblock("root")
        for blk in list(sch.get_child_blocks(root)) + [root]:
            sch.annotate(blk, *SKIP)


class ContractionCUDA(ScheduleRule):
    """Decode attention's value product (module doc); columns and parts sampled when tunable."""

    name = "contraction_cuda"
    plan_of = staticmethod(_plan)
    schedule_with = staticmethod(schedule)
    gpu = True
