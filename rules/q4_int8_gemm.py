"""Q4Int8GEMM: prefill GEMMs of q4 weights x int8 activations on x86 CPUs with VNNI.

Pattern (by structure, see ``match``): an int32 block ``dot[g, t, nb, i] = sum_{v, p, b} ((W[nb, g*4+v, i]
>> (8b + 4p)) & 15) * X[t, g*4+v, p, b]`` (uint32 words of 16 columns side by side, int8 activations
per word as even then odd inputs) read by one float reduction over the groups ``g`` that scales each
group's integer sum -- ``workloads.q4_int8_gemm``, the form Phi-2's int8 prefill projections take.

Why: prompt processing is matrix-unit work (tens of tokens share every weight), and these kernels
as written run scalar; a float GEMM on dequantized weights leaves the int8 units idle.  The schedule:

* output tiles of MB tokens x NB*16 columns, in parallel; the token tiles cut into chunks, each chunk
  passing over every column tile: one chunk (the default) keeps a column tile's weights (NB*16 x K/2
  bytes) in L2 while every token tile uses them, M/MB chunks keep a token tile's activations instead;
* per group of 32 inputs, the integer block computed at the group (``compute_at``): MB x NB int32
  accumulators, tensorized with ``intrinsics.q4_vnni`` (each packed word unpacked once for all MB
  tokens, two ``vpdpbusd`` per token and word: 512-bit with AVX-512 VNNI, twice 256-bit with AVX-VNNI);
* the group's float step vectorized over the 16 columns (zero-point term, convert, both scales, FMA
  into the tile's float accumulators), the bias / gelu epilogue at the tile.

Choices: MB (``TOKEN_TILES`` dividing M) and NB (``COLUMN_TILES`` dividing N/16) are one sketch each
(the tile intrinsic is fixed per trace); the number of token chunks is a sampled decision (a perfect
tile, mutated by evolutionary search).  ``untuned(mod, target)`` applies the first sketch with one
chunk; blocks the rule scheduled are annotated ``schedule_rule: "None"`` for PostOrderApply's other rules.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import Schedule
from tvm.s_tir.meta_schedule.schedule_rule import PyScheduleRule
from tvm.s_tir.schedule import ScheduleError

from tvm_ext.intrinsics import q4_vnni
from tvm_ext.tir_utils import root_child_blocks, schedule_each

DEFAULT_MB = 4
DEFAULT_NB = 2
SKIP = ("schedule_rule", "None")


@dataclass
class Q4GemmPattern:
    dot: str  # name of the int32 block
    scale: str  # name of the float block over the groups
    tokens: int  # M
    column_blocks: int  # N / 16
    epilogues: tuple  # names of the elementwise blocks after ``scale``


def _extents(block):
    return [int(iv.dom.extent) for iv in block.iter_vars]


def _is_dot(block) -> bool:
    """The int32 block of the pattern (module doc): 4 spatial iters (g, t, nb, 16) and 3 reduction
    iters (4 words, 2 parities, 4 bytes), a uint32 [.., .., 16] and an int8 [.., .., 2, 4] operand."""
    if len(block.writes) != 1 or str(block.writes[0].source.dtype) != "int32" or len(block.iter_vars) != 7:
        return False
    kinds = [int(iv.iter_type) for iv in block.iter_vars]
    if kinds != [0, 0, 0, 0, 2, 2, 2] or _extents(block)[3:] != [16, q4_vnni.WORDS, 2, 4]:
        return False
    dtypes = {str(r.source.dtype): [int(d) for d in r.source.shape] for r in block.reads}
    return (len(block.reads) == 2 and dtypes.get("uint32", [0])[-1:] == [16]
            and dtypes.get("int8", [0, 0])[-2:] == [2, 4])


def match(sch, block) -> Optional[Q4GemmPattern]:
    """The pattern around ``block`` (its dot or its scale block), or None."""
    try:
        stmt = sch.get(block)
        if _is_dot(stmt):
            dot = block
        else:
            producers = [p for p in sch.get_producers(block) if _is_dot(sch.get(p))]
            if len(producers) != 1:
                return None
            dot = producers[0]
        consumers = sch.get_consumers(dot)
        if len(consumers) != 1:
            return None
        scale = consumers[0]
        sstmt = sch.get(scale)
        if str(sstmt.writes[0].source.dtype) != "float32" or [int(iv.iter_type) for iv in sstmt.iter_vars][-1] != 2:
            return None
        groups, tokens, column_blocks = _extents(sch.get(dot))[:3]
        if _extents(sstmt)[-1] != groups:
            return None
        epilogues, cur = [], scale
        while True:
            nxt = sch.get_consumers(cur)
            if len(nxt) != 1:
                break
            epilogues.append(sch.get(nxt[0]).name_hint)
            cur = nxt[0]
        return Q4GemmPattern(sch.get(dot).name_hint, sstmt.name_hint, tokens, column_blocks, tuple(epilogues))
    except (ScheduleError, RuntimeError, AttributeError, IndexError, ValueError):
        return None


def token_tiles(p: Q4GemmPattern) -> list:
    return [m for m in q4_vnni.TOKEN_TILES if p.tokens % m == 0]


def column_tiles(p: Q4GemmPattern) -> list:
    return [n for n in q4_vnni.COLUMN_TILES if p.column_blocks % n == 0]


def sketches(p: Q4GemmPattern, lanes: int = q4_vnni.LANES) -> list:
    """Every (MB, NB) the rule offers for ``p``, the defaults first: 4 x 2 with 512-bit vpdpbusd, 2 x 2
    with 256-bit (16 vector registers without AVX-512: 4 x 2 tiles spill, 0.46 vs 0.80 TOPS on Zen 4)."""
    mbs, nbs = token_tiles(p), column_tiles(p)
    default_mb = DEFAULT_MB if lanes == q4_vnni.LANES else 2
    first = (max(m for m in mbs if m <= default_mb), max(n for n in nbs if n <= DEFAULT_NB))
    return [first] + [(m, n) for m in mbs for n in nbs if (m, n) != first]


def schedule(sch, p: Q4GemmPattern, mb: int, nb: int, chunks=1, sample: bool = False,
             annotate: bool = False, lanes: int = q4_vnni.LANES) -> None:
    """Schedule the matched GEMM in place with MB x NB*16 tiles (module doc).  The token tiles are
    cut into ``chunks`` chunks, each passing over all column tiles in turn: 1 = columns outer (a
    column tile's weights stay in cache while every token tile uses them), M / MB = tokens outer.
    With ``sample`` that cut is a sampled decision (a perfect tile, first draw ``chunks``).  ``lanes``:
    the tile intrinsic's vpdpbusd width (16: AVX-512 VNNI, 8: AVX-VNNI; ``q4_vnni.lanes_for``)."""
    dot, scale = sch.get_sblock(p.dot), sch.get_sblock(p.scale)
    *outer, t, j, g = sch.get_loops(scale)
    t_o, t_i = sch.split(t, [None, mb])
    j_o, j_b, j_i = sch.split(j, [None, nb, 16])
    token_tiles_ = p.tokens // mb
    factors = [chunks, token_tiles_ // chunks]
    if sample:
        factors = sch.sample_perfect_tile(t_o, n=2, max_innermost_factor=token_tiles_, decision=factors)
    t_c, t_o = sch.split(t_o, factors)
    sch.reorder(t_c, j_o, t_o, g, t_i, j_b, j_i)
    tiles = sch.fuse(t_c, j_o, t_o)
    sch.parallel(tiles)
    for name in p.epilogues:
        blk = sch.get_sblock(name)
        sch.reverse_compute_at(blk, tiles)
        *_, last = sch.get_loops(blk)
        sch.vectorize(sch.split(last, [None, 16])[1])
    sch.compute_at(dot, g)
    inner = sch.get_loops(dot)[len(outer) + 2:]  # below ``tiles`` and ``g``
    sch.decompose_reduction(dot, inner[0])
    sch.tensorize(inner[0], q4_vnni.register(mb, nb, lanes))
    sch.vectorize(j_i)
    if annotate:  # the root too: its parallel/vectorize annotations would be rewritten onto loops that
        # are parallel already, around the tensorized block (RewriteParallelVectorizeUnroll fails there)
        for name in (p.scale, *p.epilogues, "root"):
            sch.annotate(sch.get_sblock(name), *SKIP)


def supported(target) -> bool:
    """Whether ``target`` has AVX-512 VNNI or AVX-VNNI (the tile intrinsic's vpdpbusd)."""
    return target is not None and q4_vnni.lanes_for(target) is not None


def untuned(mod: tvm.IRModule, target) -> tvm.IRModule:
    """Every PrimFunc of ``mod`` holding the pattern scheduled with the first sketch; the others
    unchanged (all of them where ``target`` has neither VNNI form)."""
    target = tvm.target.Target(target)
    if not supported(target):
        return mod
    return schedule_each(mod, lambda func, name: schedule_of(func, name, target))


def schedule_of(func, name: str = "main", target=None):
    """A Schedule of ``func`` (as ``name``) with the first sketch applied for ``target``'s VNNI form
    (AVX-512 VNNI when no target is given; its trace can seed a tuning database), or None where it
    does not hold the pattern or ``target`` has no VNNI."""
    lanes = q4_vnni.LANES if target is None else q4_vnni.lanes_for(tvm.target.Target(target))
    if lanes is None:
        return None
    found = root_child_blocks(func)
    if found is None:
        return None
    sch, blocks = found
    p = next((m for m in (match(sch, b) for b in blocks) if m is not None), None)
    if p is None:
        return None
    sch = Schedule(tvm.IRModule({name: func}))
    sch.work_on(name)
    try:
        schedule(sch, p, *sketches(p, lanes)[0], lanes=lanes)
    except ScheduleError:
        return None
    return sch


@derived_object
class Q4Int8GEMM(PyScheduleRule):
    """Schedule rule: one sketch per (MB, NB) for the q4 x int8 GEMM (module doc); other
    blocks pass.  Offers nothing where the target has neither AVX-512 VNNI nor AVX-VNNI."""

    def __init__(self) -> None:
        super().__init__()
        self.lanes = q4_vnni.LANES

    def _initialize_with_tune_context(self, context) -> None:
        self.lanes = q4_vnni.lanes_for(context.target)

    def apply(self, sch, block):
        p = match(sch, block) if self.lanes else None
        if p is None:
            return [sch]
        out = []
        for mb, nb in sketches(p, self.lanes):
            cand = sch.copy()
            try:
                schedule(cand, p, mb, nb, sample=True, annotate=True, lanes=self.lanes)
            except ScheduleError:
                continue
            out.append(cand)
        return out or [sch]

    def clone(self):
        other = Q4Int8GEMM()
        other.lanes = self.lanes
        return other
