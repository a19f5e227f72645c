"""Single-block contractions on CPU (decode attention: ``q . K`` and ``p . V``), read in order.

Pattern (by structure, never by name): a PrimFunc of one block that writes a function output,
reads two buffers and reduces over one axis, its last iter var.  The operands' innermost indices
decide the form:

* *dot* -- the reduction var is the larger operand's innermost index (``score[h, j] = sum_r
  q[h, r] K[j, h, r]``): the spatial axes are fused and parallel, ordered so the outer ones walk
  that operand in memory order, and the reduction is split by ``LANES`` and rfactored, so that
  each output is a vector of partial sums over contiguous elements (computed at the output),
  added at the end.  With several queries (prefill: ``score[h, i, j] = sum_r q[i, h, r] K[j, h, r]``)
  it is a GEMM per head instead: the larger operand copied once per head with the key axis innermost,
  register tiles of queries x keys (``QUERY_TILES`` x ``KEY_TILES``) over the reduction, in parallel
  over the heads;
* *axpy* -- an operand's innermost index follows the output's innermost spatial var, not the
  reduction (``value[c] = sum_r p[c // d, r] V[r, c // d, c % d]``; decided before the operands'
  sizes: with many queries the probabilities outgrow the values): the reduction moves outside the
  output's innermost axis, which is vectorized, so each step adds one contiguous row of the
  operand into a vector of outputs.  With one query (decode) the reduction is split into
  ``PARTS`` parallel ranges and rfactored: each thread streams its rows of the operand in memory
  order into its own row of partial outputs (10 KiB for Phi-2, in L1), added at the end; where no
  part count divides the reduction, the output axis is split into parallel chunks instead.  With
  several queries (prefill) the heads x d axis is split at d (no per-lane head index) and register
  tiles of queries x d accumulate over the reduction, in parallel over the heads.

Why: dlight's CPU GEMV rule takes ``attn_score`` and nothing takes ``attn_value``, which then walks
the KV cache column by column: about 20x the time the cache's bytes take at DRAM bandwidth.  Split
into row parts, decode ``attn_value`` reads the cache at the copy's bandwidth (output chunks, each
task 1 KiB of every 10 KiB row, took twice as long).  Prefill attention as register tiles beats the
rfactored dot form, 4 x 16 strips and MetaSchedule's 32-trial pick (figures: docs/journal.md).
Other functions are left as they are (``matches`` is False), the dequantize-GEMVs are DequantGEMV's.

``ContractionCPU().apply(func, target, tunable)`` is that schedule (the scheduling pass's; the first
record of a tuning); its MetaSchedule face (in ``tvm_ext.space`` for llvm) adds it beside MetaSchedule's sketches
with its tiles sampled (the one-query axpy form's part count, the several-query forms' queries per tile).
"""
from __future__ import annotations

from typing import Optional

from tvm import tirx
from tvm.ir.expr import TensorLoad

from tvm_ext.analysis.contraction_pattern import axpy_load, big_load, single_contraction, uses
from tvm_ext.schedule_rule import SKIP, ScheduleRule
from tvm_ext.tir_utils import collect, sample_choice

LANES = 8  # float32 lanes of one AVX2 register
PARTS = (16, 8, 4, 2)  # parallel ranges of the reduction in the one-query axpy form (those that divide
# it; the first is the untuned one): one range per thread or more, each streamed in memory order
CHUNKS = (256, 128, 64)  # outputs per parallel chunk where no part count divides the reduction


def _form(func) -> Optional[str]:
    """"dot", "axpy" or None (module doc)."""
    found = single_contraction(func)
    if found is None:
        return None
    block = found[2]
    reduce_var = block.iter_vars[-1].var
    if axpy_load(block) is not None:
        return "axpy" if int(block.iter_vars[-2].dom.extent) % CHUNKS[-1] == 0 else None
    load = big_load(block)
    if load is None:
        return None
    last_index = load.indices[-1]
    if isinstance(last_index, tirx.Var) and last_index.same_as(reduce_var):
        return "dot" if int(block.iter_vars[-1].dom.extent) % LANES == 0 else None
    return None


def schedule(sch, form: str, sample: bool = False, annotate: bool = False) -> None:
    """Schedule the one-block function ``sch`` works on in ``form`` ("dot" or "axpy", ``_form``).  With
    ``sample`` the tiles are sampled decisions (the untuned choice first: the one-query axpy form's part
    count, the several-query forms' queries per tile); with ``annotate`` the blocks (and the root) are
    marked for PostOrderApply's other rules to skip."""
    (block,) = sch.get_child_blocks(sch.get_sblock("root"))
    *spatial, red = sch.get_loops(block)
    roles = _dot_roles(sch.get(block)) if form == "dot" else None
    if roles is not None:
        _dot_tiles(sch, block, spatial, red, roles, sample)
    elif form == "dot":
        _dot(sch, block, _in_memory_order(sch, block, spatial), red)
    else:
        _axpy(sch, block, spatial, red, sample)
    if annotate:  # the blocks are the contraction's and, rfactored, its partial sums'
        root = sch.get_sblock("root")
        for blk in list(sch.get_child_blocks(root)) + [root]:
            sch.annotate(blk, *SKIP)


def _in_memory_order(sch, block, loops) -> list:
    """``loops`` (one per spatial iter var, in order) reordered as their vars index the larger
    operand, outermost first; vars it does not use go first."""
    stmt = sch.get(block)
    load = big_load(stmt)  # found: _form accepted the block

    def position(k):
        var = stmt.iter_vars[k].var
        return next((i for i, index in enumerate(load.indices) if uses(index, var)), -1)

    order = sorted(range(len(loops)), key=position)
    if order != list(range(len(loops))):
        sch.reorder(*[loops[k] for k in order])
    return [loops[k] for k in order]


def _dot(sch, block, spatial, red) -> None:
    outer = sch.fuse(*spatial)
    sch.parallel(outer)
    _ro, lanes = sch.split(red, [None, LANES])
    partial = sch.rfactor(lanes, 0)
    # the partial sums: one vector of LANES per output, over contiguous elements, computed at
    # the output (with many queries a buffer of them all would be outputs x LANES floats)
    sch.compute_at(partial, outer)
    *_, r_v, r_o = sch.get_loops(partial)  # compute_at puts the spatial lane loop first
    sch.reorder(r_o, r_v)
    sch.vectorize(r_v)
    sch.decompose_reduction(partial, r_o)


QUERY_TILES = (4, 8, 6, 2)  # queries per register tile in the several-query forms (the first untuned)
KEY_TILES = (48, 16)  # keys per register tile of the several-query dot form, the first that divides the axis
# (the first of each is the fastest measured on prefill attention; the others, docs/journal.md)


def _dot_roles(block):
    """For a dot contraction with several queries (prefill ``q . K``): (batch iter vars, query iter var,
    key iter var, the larger operand's dimension the key indexes), where every index of both operands is
    a plain var, batch vars index both, the query var only the smaller, the key var only the larger
    (a multiple of 16 long); else None."""
    loads = collect(block.body, TensorLoad)
    big = big_load(block)
    small = next((ld for ld in loads if not ld.source.same_as(big.source)
                  and not ld.source.same_as(block.writes[0].source)), None)
    if small is None or not all(isinstance(x, tirx.Var) for x in list(big.indices) + list(small.indices)):
        return None
    batch, query, key = [], [], []
    for iv in block.iter_vars[:-1]:
        in_big, in_small = _uses_any(big.indices, iv.var), _uses_any(small.indices, iv.var)
        (batch if in_big and in_small else query if in_small else key if in_big else batch).append(iv)
    if len(query) != 1 or len(key) != 1 or int(query[0].dom.extent) < 2 or int(key[0].dom.extent) % 16:
        return None
    key_dim = next(k for k, index in enumerate(big.indices) if index.same_as(key[0].var))
    return batch, query[0], key[0], key_dim


def _uses_any(indices, var) -> bool:
    return any(uses(index, var) for index in indices)


def _dot_tiles(sch, block, spatial, red, roles, sample: bool = False) -> None:
    """The several-query dot form: per batch (head), the larger operand copied once with the key axis
    innermost, then register tiles of queries x keys accumulated over the reduction (a GEMM micro-kernel:
    one broadcast query element times contiguous key vectors)."""
    batch, query, key, key_dim = roles
    stmt = sch.get(block)
    position = {iv.var: k for k, iv in enumerate(stmt.iter_vars)}
    q_loop, k_loop = spatial[position[query.var]], spatial[position[key.var]]
    outer = [spatial[position[iv.var]] for iv in batch]
    q_o, q_i = sch.split(q_loop, [None, _pick(sch, QUERY_TILES, int(query.dom.extent), sample)])
    k_o, k_i = sch.split(k_loop, [None, _pick(sch, KEY_TILES, int(key.dom.extent), False)])
    sch.reorder(*outer, q_o, k_o, red, q_i, k_i)
    head = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    big_index = next(k for k, r in enumerate(stmt.reads) if r.source.same_as(big_load(stmt).source))
    copy = sch.cache_read(block, big_index, "global")
    sch.compute_at(copy, head)
    sch.transform_layout(block, ("read", big_index),
                         lambda *dims: tuple(d for k, d in enumerate(dims) if k != key_dim) + (dims[key_dim],))
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, k_o)
    sch.parallel(head)
    _register_tile(sch, q_i, k_i)
    sch.decompose_reduction(block, red)


def _row_length(block, var) -> Optional[int]:
    """D when the larger operand is indexed by ``var % D`` (a fused heads x head_dim output axis)."""
    for index in axpy_load(block).indices:
        if isinstance(index, tirx.FloorMod) and isinstance(index.a, tirx.Var) and index.a.same_as(var) \
                and isinstance(index.b, tirx.IntImm):
            return int(index.b.value)
    return None


def _axpy_rows(sch, block, spatial, red, length: int, sample: bool = False) -> None:
    """The axpy form over an output axis fused of heads x ``length`` with several queries: split at
    ``length`` (no per-lane head index), then register tiles of queries x ``length`` accumulated over the
    reduction (each step one broadcast probability times a contiguous row of the operand), in parallel
    over the heads."""
    *rows, last = spatial
    head, lane = sch.split(last, [None, length])
    q_o, q_i = sch.split(rows[-1], [None, _pick(sch, QUERY_TILES, int(sch.get(rows[-1]).extent), sample)])
    sch.reorder(*rows[:-1], head, q_o, red, q_i, lane)
    acc = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(acc, q_o)
    sch.parallel(sch.fuse(*rows[:-1], head) if rows[:-1] else head)
    _register_tile(sch, q_i, lane)
    sch.decompose_reduction(block, red)


def _register_tile(sch, rows, lanes) -> None:
    """A register tile: its ``rows`` unrolled, its ``lanes`` in unrolled vectors of ``2 * LANES``."""
    sch.unroll(rows)
    vectors, lane = sch.split(lanes, [None, 2 * LANES])
    sch.unroll(vectors)
    sch.vectorize(lane)


def _pick(sch, candidates, extent: int, sample: bool) -> int:
    """The first of ``candidates`` that divides ``extent`` (1 where none does); with ``sample`` a
    decision among those that do, that one its first draw."""
    fits = [c for c in candidates if extent % c == 0] or [1]
    return sample_choice(sch, fits, fits[0], sample and len(fits) > 1)


def _axpy_parts(sch, block, red, length: int, parts: int) -> None:
    """The one-query axpy form over rows of ``length`` (module doc): the reduction in ``parts``
    parallel ranges, each accumulated in memory order into its own row of partial outputs."""
    r_o, _r_i = sch.split(red, [parts, None])
    partial = sch.rfactor(r_o, 0)
    r_o, r_i, *_rows, last = _loops_first(sch, partial, 2)
    _head, lane = sch.split(last, [None, length])
    width = 2 * LANES if length % (2 * LANES) == 0 else LANES
    _lane_o, lane_v = sch.split(lane, [None, width])
    sch.parallel(r_o)
    sch.vectorize(lane_v)
    sch.decompose_reduction(partial, r_i)
    # the final sum over the parts: a vector of outputs at a time, the parts inside
    *rows, last, r_o = sch.get_loops(block)
    out_o, out_v = sch.split(last, [None, width])
    sch.reorder(*rows, out_o, r_o, out_v)
    sch.vectorize(out_v)
    sch.decompose_reduction(block, r_o)


def _loops_first(sch, block, count: int) -> list:
    """``block``'s loops with its last ``count`` moved outermost (in order)."""
    loops = sch.get_loops(block)
    order = loops[-count:] + loops[:-count]
    sch.reorder(*order)
    return order


def _axpy(sch, block, spatial, red, sample: bool = False) -> None:
    length = _row_length(sch.get(block), sch.get(block).iter_vars[-2].var)
    queries = int(sch.get(spatial[-2]).extent) if len(spatial) > 1 else 1
    if length is not None and length % (2 * LANES) == 0 and queries > 1:
        _axpy_rows(sch, block, spatial, red, length, sample)
        return
    reduced = int(sch.get(red).extent)
    if length is not None and length % LANES == 0 and queries == 1 and any(reduced % p == 0 for p in PARTS):
        _axpy_parts(sch, block, red, length, _pick(sch, PARTS, reduced, sample))
        return
    *rows, last = spatial
    chunk, inner = sch.split(last, [None, _pick(sch, CHUNKS, int(sch.get(last).extent), sample)])
    outer = sch.fuse(*rows, chunk) if rows else chunk
    sch.parallel(outer)
    sch.reorder(red, inner)
    _inner_o, inner_v = sch.split(inner, [None, LANES])
    sch.vectorize(inner_v)
    sch.decompose_reduction(block, red)


class ContractionCPU(ScheduleRule):
    """A single-block contraction (module doc), read in memory order; the tiles sampled when tunable
    (a 512-token prefill's attn_score: ours 41.5 ms a layer, a MetaSchedule one 13.1 ms)."""

    name = "contraction_cpu"
    plan_of = staticmethod(_form)
    schedule_with = staticmethod(schedule)
