"""Injective kernels on CPU (rope, the head split, the KV-cache concatenate): loops vectorized, parallel when big.

Pattern (by structure, never by name): a PrimFunc whose blocks, right under the root, are all
spatial (no reduction), the last one writing a parameter, none already scheduled (every loop
serial, no ``tirx.is_scheduled`` attribute).  Each block's innermost loop is vectorized (16, 8 or 4
lanes where they divide it, else 16 lanes and a scalar tail, ``tir_utils.vectorize_row``) and its
other loops fused; the fused loop runs in parallel where the block writes at least
``PARALLEL_BYTES``.

Why: dlight has no CPU rule for these kernels, so they compiled unscheduled: scalar loops.  Phi-2's
decode rope (32 heads x 80) runs 4-5x faster with its 80-element rows 16 lanes wide (cache-hot);
serial, since waking the second thread costs more than such a kernel.  A block that writes megabytes
(the KV-cache concatenate, 5.2 MB a layer) is worth both cores.

``InjectiveCPU().apply(func, target, tunable)`` is that schedule (the scheduling pass's, after the other
CPU rules; the first record of a tuning); its MetaSchedule face (in ``tvm_ext.space`` for llvm) adds it
beside MetaSchedule's own sketches.
"""
from __future__ import annotations

from typing import Optional

from tvm_ext.schedule_rule import SKIP, ScheduleRule
from tvm_ext.tir_utils import is_param, root_child_blocks, shape_bytes, vectorize_row

VECTOR_LANES = (16, 8, 4)
PARALLEL_BYTES = 256 * 1024  # a block writing less runs on one thread (the pool's wake-up costs more)


def _plan(func) -> Optional[list]:
    """The names of the blocks right under the root, in order, or None where ``func`` does not match."""
    if func.attrs and "tirx.is_scheduled" in func.attrs:
        return None
    found = root_child_blocks(func)
    if found is None:
        return None
    sch, blocks = found
    stmts = [sch.get(b) for b in blocks]
    if not stmts or len(stmts[-1].writes) != 1 or not is_param(func, stmts[-1].writes[0].source):
        return None
    for block, stmt in zip(blocks, stmts):
        if any(int(iv.iter_type) != 0 for iv in stmt.iter_vars) or stmt.init is not None:
            return None
        loops = [sch.get(loop) for loop in sch.get_loops(block)]
        if not loops or any(int(loop.kind) != 0 or loop.annotations for loop in loops):
            return None
    return [stmt.name_hint for stmt in stmts]


def schedule(sch, plan, sample: bool = False, annotate: bool = False) -> None:  # pylint: disable=unused-argument
    """Schedule the function ``sch`` works on as the module doc says (nothing to ``sample``); with
    ``annotate`` every block (and the root) is marked for PostOrderApply's other rules to skip."""
    for name in plan:
        block = sch.get_sblock(name)
        written = sch.get(block).writes[0].source
        *outer, inner = sch.get_loops(block)
        extent = int(sch.get(inner).extent)
        lanes = next((n for n in VECTOR_LANES if extent % n == 0), None)
        if outer and shape_bytes(written.dtype, written.shape) >= PARALLEL_BYTES:
            sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])
        if annotate:
            sch.annotate(block, *SKIP)
        vectorize_row(sch, inner, extent, lanes, odd=lanes is None)  # last: a partition makes new blocks
    if annotate:
        sch.annotate(sch.get_sblock("root"), *SKIP)


class InjectiveCPU(ScheduleRule):
    """An injective kernel (module doc): loops vectorized, parallel when big; nothing sampled."""

    name = "injective_cpu"
    plan_of = staticmethod(_plan)
    schedule_with = staticmethod(schedule)

    def blocks(self, plan):
        return tuple(plan)
