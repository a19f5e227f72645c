"""Q4Int8GEMM: prefill GEMMs of q4 weights x int8 activations on x86 CPUs with VNNI (and AMX).

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
  tokens, two ``vpdpbusd`` per token and word: 512-bit with AVX-512 VNNI, twice 256-bit with AVX-VNNI;
  with AVX2 only, ``vpmaddubsw`` summed in int16 over the group, one ``vpmaddwd`` per group);
* on hosts with AMX int8, first: MB = 16 tokens (all of them below 16)
  with ``intrinsics.q4_amx``, one ``tdpbssd`` per column block and group (its init loads the tile
  config); not for one token, nor where 16 does not divide M > 16 (the VNNI sketches only then);
* the group's float step vectorized over the 16 columns (zero-point term, convert, both scales, FMA
  into the tile's float accumulators), the bias / gelu epilogue at the tile.

One token (M = 1, the decode's GEMV) is DRAM-bound: its tiles are 1 x 16 columns by default, so each
thread reads one long contiguous stream (faster from DRAM than 2 blocks a tile; docs/journal.md), with a
software prefetch 8 KiB ahead in it.

Choices: the form (``forms``: AMX, then the host's VNNI / AVX2 form), MB (``TOKEN_TILES`` dividing M),
NB (``COLUMN_TILES`` dividing N/16) and, for one token, the prefetch distance are one sketch each (the
tile intrinsic is fixed per trace); the number of token chunks is a sampled decision (a perfect tile,
mutated by evolutionary search).  ``Q4Int8GEMM().apply(func, target)`` is the first sketch with one chunk;
blocks the rule scheduled are annotated ``schedule_rule: "None"`` for PostOrderApply's other rules.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import tvm
from tvm.s_tir.schedule import ScheduleError

from tvm_ext.intrinsics import q4_amx, q4_vnni
from tvm_ext.schedule_rule import SKIP, ScheduleRule, fresh_schedule
from tvm_ext.tir_utils import root_child_blocks

DEFAULT_MB = 4
DEFAULT_NB = 2
DEFAULT_AHEAD = 8192  # one token: prefetch distance in bytes
DEFAULT_AMX_NB = 4  # AMX: tdpbssd calls per tile (one A load, one config check for all)


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
    return [m for m in q4_vnni.TOKEN_TILES if p.tokens % m == 0 and (m > 1 or p.tokens == 1)]


def column_tiles(p: Q4GemmPattern) -> list:
    return [n for n in q4_vnni.COLUMN_TILES if p.column_blocks % n == 0 and (n > 1 or p.tokens == 1)]


def sketches(p: Q4GemmPattern, form: str = "avx512vnni") -> list:
    """Every (MB, NB, prefetch bytes) the rule offers for ``p``, the default first.  Many tokens: 4 x 2
    with 512-bit vpdpbusd, 2 x 2 with 256-bit forms (16 vector registers without AVX-512: 4 x 2 tiles
    spill; on Zen 3 the AVX2 form's 4 x 2 ran level with 2 x 2 on float32 scales and up to 1.2x its
    time on the model's float16 ones), no prefetch.  One token: 1 x 1 prefetching 8 KiB ahead, then the
    other distances and wider tiles.  AMX forms:
    16 tokens (all of them below 16) x 4, 2, 1 column blocks; none where 16 does not divide M > 16
    (``q4_amx.token_tile``) or M = 1."""
    if form in q4_amx.FORMS:
        mb = q4_amx.token_tile(p.tokens)
        nbs = sorted((n for n in q4_amx.COLUMN_TILES if p.column_blocks % n == 0),
                     key=lambda n: (n != DEFAULT_AMX_NB, -n))
        return [(mb, n, 0) for n in nbs] if mb else []
    mbs, nbs = token_tiles(p), column_tiles(p)
    if p.tokens == 1:
        return [(1, n, a) for n in nbs for a in sorted(q4_vnni.AHEAD, reverse=True) if n == 1 or a]
    default_mb = DEFAULT_MB if q4_vnni.FORMS[form] == q4_vnni.LANES else 2
    first = (max(m for m in mbs if m <= default_mb), max(n for n in nbs if n <= DEFAULT_NB), 0)
    return [first] + [(m, n, 0) for m in mbs for n in nbs if (m, n, 0) != first]


def schedule(sch, p: Q4GemmPattern, mb: int, nb: int, ahead: int = 0, chunks=1, sample: bool = False,
             annotate: bool = False, form: str = "avx512vnni") -> None:
    """Schedule the matched GEMM in place with MB x NB*16 tiles (module doc).  The token tiles are
    cut into ``chunks`` chunks, each passing over all column tiles in turn: 1 = columns outer (a
    column tile's weights stay in cache while every token tile uses them), M / MB = tokens outer.
    With ``sample`` that cut is a sampled decision (a perfect tile, first draw ``chunks``).  ``form``:
    the tile intrinsic's instructions (``q4_vnni.form_for``, or "amx" / "amx_emu": ``q4_amx``, its init
    tensorized too: the tile config is loaded there); ``ahead``: its prefetch distance."""
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
    init = sch.decompose_reduction(dot, inner[0])
    if form in q4_amx.FORMS:
        dot_intrin, init_intrin = q4_amx.register(mb, nb, emulated=form == "amx_emu")
        sch.tensorize(sch.get_loops(init)[len(outer) + 2], init_intrin)
        sch.tensorize(inner[0], dot_intrin)
    else:
        sch.tensorize(inner[0], q4_vnni.register(mb, nb, form, ahead))
    sch.vectorize(j_i)
    if annotate:  # the root too: its parallel/vectorize annotations would be rewritten onto loops that
        # are parallel already, around the tensorized block (RewriteParallelVectorizeUnroll fails there)
        for name in (p.scale, *p.epilogues, "root"):
            sch.annotate(sch.get_sblock(name), *SKIP)


def supported(target) -> bool:
    """Whether ``target`` runs one of the tile intrinsic's forms (AVX-512 VNNI, AVX-VNNI, AVX2)."""
    return q4_vnni.form_for(target) is not None


def forms(target, emulated: bool = False) -> list:
    """The tile forms the rule offers on ``target``, best first: AMX where it has AMX int8 (the
    emulated twin instead where it has not and ``emulated``), then the VNNI / AVX2 form; empty
    where it has no AVX2."""
    vnni = q4_vnni.form_for(target)
    amx = q4_amx.form_for(target, emulated) if vnni else None
    return [f for f in (amx, vnni) if f]


class Q4Int8GEMM(ScheduleRule):
    """One sketch per (form, MB, NB, prefetch) for the q4 x int8 GEMM (module doc); untuned, the first
    sketch of the target's best form (``forms``; AVX-512 VNNI when no target is given).  Offers nothing
    where the target has no AVX2.  ``emulated``: the AMX sketches with the plain-code twins of the AMX
    tile on targets without AMX (tests)."""

    name = "q4_int8_gemm"

    def __init__(self, emulated: bool = False) -> None:
        self.emulated = emulated

    def forms(self, target) -> list:
        offered = ["avx512vnni"] if target is None else forms(tvm.target.Target(target), self.emulated)
        if "amx" in offered:  # the process's tile permission, before a tile instruction runs here
            from tvm_ext.amx import request_amx_if_host_has_it  # pylint: disable=import-outside-toplevel

            request_amx_if_host_has_it()
        return offered

    def plan(self, func, target):
        offered = self.forms(target)
        found = root_child_blocks(func) if offered else None
        if found is None:
            return None
        sch, blocks = found
        p = next((m for m in (match(sch, b) for b in blocks) if m is not None), None)
        return None if p is None else (p, offered)

    def schedule_as(self, func, name, target, tunable=False):
        plan = self.plan(func, target) if isinstance(func, tvm.tirx.PrimFunc) else None
        if plan is None:
            return None
        p, offered = plan
        for form in offered:  # AMX offers no sketch for M = 1 or M > 16 not a multiple of 16
            for first in sketches(p, form)[:1]:
                sch = fresh_schedule(func, name, lambda s: schedule(s, p, *first, form=form, sample=tunable))
                if sch is not None:
                    return sch
        return None

    def candidates(self, sch, block, target):
        offered = self.forms(target)
        p = match(sch, block) if offered else None
        if p is None:
            return [sch]
        out = []
        for form in offered:
            for sketch in sketches(p, form):
                cand = sch.copy()
                try:
                    schedule(cand, p, *sketch, sample=True, annotate=True, form=form)
                except ScheduleError:
                    continue
                out.append(cand)
        return out or [sch]
