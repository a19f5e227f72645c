"""DequantGEMV: CPU schedules for q4 decode kernels (dequantize + GEMV + epilogue).

Pattern (``tvm_ext.analysis.gemv_pattern``, by structure): one activation row times a weight that a
dequantize block (or its inlined expression) makes from packed integer words ``P[n, k // pack]``
and per-group scales ``S[n, k // group]``, followed by elementwise epilogues (bias, gelu,
residual adds) -- Phi-2's qkv, dense, fc1, fc2 and lm_head decode kernels, fused or with the
dequantize still a separate block.

Why: such a kernel reads each weight once, so it runs at memory (or unpack) speed only if the
dequantize never goes to memory and the unpack is vectorized. TVM's MultiLevelTiling tiles it
as a matmul (the dequantized weight cached, K walked element by element, 18x the bandwidth
bound in the committed bench) and dlight's CPU GEMV vectorizes across N, which gathers words
from N different rows. This rule builds, for the whole function:

* the dequantize inlined into the GEMV, the epilogues inlined into the last one;
* N split into ``n_o`` (parallel) x ``rows``; each row is walked to the end before the next,
  so a thread reads the packed weights in memory order (one prefetchable stream; interleaving
  the rows of a tile to share activation loads measured 1.4x slower from DRAM here);
* K walked in whole quantization groups ``g`` (one scale load per row and group), each group
  split into ``sums`` partial sums per row (an rfactor: 2 or 4 independent accumulators of 8
  lanes kept in registers), one packed word per 8 lanes (broadcast, shift by the lane vector,
  mask, convert, subtract 7, multiply by the scale, FMA), vectorized, the words unrolled;
* the partial sums added, then the epilogue, computed per ``n_o`` tile (one loop nest,
  output written once);
* split-K when N is small (fewer than ``MIN_TILES_PER_CORE`` tiles per core): K is cut into
  ``splits`` chunks of whole groups, (tile, chunk) pairs run in parallel into a partial-sum
  buffer, and a second parallel nest adds the chunks, the partial sums and the epilogue per tile.
  The rule then returns both sketches (plain and split-K).

On x86 CPUs the rule first tries a third sketch, **factored**: the whole GEMV replaced by the
tensor intrinsic ``tvm_ext.intrinsics.q4_gemv`` (one per shape; 16 float lanes with AVX-512,
8 with AVX2), which computes ``s * (sum x*q) - 7 * s * sum x`` per group with byte-wise unpack
and a software prefetch -- ~3.5 vector instructions per 8 inputs instead of 6, the difference
between 1.45x and 5.5x the DRAM bound on Phi-2's qkv on the AVX-512 host it was measured on.
Its epilogues follow in one parallel, vectorized loop.  It applies only where the dequantize
is written as Phi-2's kernels write it (``q4_weight``; tensorize checks the structure) and
reassociates the float sums (errors of the order of the other sketches' against NumPy).
The untuned schedule uses it where it applies, and the MetaSchedule rule offers it as its first sketch
(tensorized in the rule, every block then marked for the other rules to skip; it replays and passes
the llvm postprocessors), the scheduled sketches after it.

``rows``, ``sums`` and ``splits`` are sampled decisions (candidates that divide N, the group,
the number of groups; defaults ``DEFAULT_ROWS`` / ``DEFAULT_SUMS`` / ``DEFAULT_SPLITS``).
Blocks it scheduled are annotated ``schedule_rule: "None"`` so that later rules leave them
alone. Anything that does not match is returned unchanged, for TVM's other rules.

``DequantGEMV().apply(func, target)`` is the schedule with the default decisions, without tuning (like
dlight); None where the function does not match.
"""
from __future__ import annotations

import tvm
from tvm.s_tir.schedule import ScheduleError

from tvm_ext.analysis.gemv_pattern import GemvPattern, inline_around, match, match_func
from tvm_ext.schedule_rule import SKIP, ScheduleRule, fresh_schedule
from tvm_ext.tir_utils import sample_choice

ROWS = (2, 4, 8)  # output columns computed together (share the activation loads); 1 would
# change the loop count of the lane-sum block between draws, which a trace replay cannot follow
SUMS = (16, 32)  # partial sums per row: 2 or 4 independent accumulators of 8 lanes (one word
# each); with one (8 sums) every FMA of a row waits for the previous one: 1.7x slower here
SPLITS = (2, 4, 8)  # K chunks computed in parallel (split-K) when N is small
DEFAULT_ROWS = 4
DEFAULT_SUMS = 32
DEFAULT_SPLITS = 4
MIN_TILES_PER_CORE = 4  # below this many N tiles per core, split K as well


def row_candidates(pattern: GemvPattern) -> list:
    return [r for r in ROWS if pattern.n % r == 0]


def sum_candidates(pattern: GemvPattern) -> list:
    return [v for v in SUMS if pattern.group % v == 0 and v % pattern.pack == 0]


def split_candidates(pattern: GemvPattern) -> list:
    return [c for c in SPLITS if (pattern.k // pattern.group) % c == 0]


def schedule_gemv(sch, block, pattern: GemvPattern, sample: bool = False, annotate: bool = False,
                  split_k: bool = False):
    """Schedule the matched function in place (see module doc); returns the block whose
    reduction init the untuned schedule separates (the per-lane partial sums).

    ``block``: the GEMV block of ``sch``. ``sample``: rows/sums(/splits) as sampled decisions
    (a MetaSchedule design space) instead of the defaults. ``annotate``: mark the blocks done.
    ``split_k``: also split K into parallel chunks (for small N, see ``wants_split_k``)."""
    rows = sample_choice(sch, row_candidates(pattern), DEFAULT_ROWS, sample)
    sums = sample_choice(sch, sum_candidates(pattern), DEFAULT_SUMS, sample)
    splits = sample_choice(sch, split_candidates(pattern), DEFAULT_SPLITS, sample) if split_k else None
    last = inline_around(sch, pattern)
    *_, n_loop, k_loop = sch.get_loops(block)
    sch.split(n_loop, [None, rows])
    if split_k:
        _, _, kw = sch.split(k_loop, [splits, None, pattern.group])
    else:
        _, kw = sch.split(k_loop, [None, pattern.group])
    _, k_s = sch.split(kw, [None, sums])
    rf = sch.rfactor(k_s, factor_axis=len(sch.get(block).writes[0].region))
    if split_k:
        *_, n_o, n_i, k_p, g, w, k_s = sch.get_loops(rf)
        part = sch.rfactor(k_p, factor_axis=0)  # [splits, .., n, sums], summed by ``rf``
        *_, n_o, n_i, k_p, g, w, k_s = sch.get_loops(part)
        k_u, k_i = sch.split(k_s, [None, pattern.pack])
        sch.reorder(n_o, k_p, n_i, g, w, k_u, k_i)
        sch.parallel(sch.fuse(n_o, k_p))
        lane_sums, tile = part, sch.get_loops(rf)[-4]  # rf: [.., n_o, n_i, k_p, sums]
        sch.set_scope(rf, 0, "local")
        sch.parallel(tile)
    else:
        *_, n_o, n_i, g, w, k_s = sch.get_loops(rf)
        k_u, k_i = sch.split(k_s, [None, pattern.pack])
        sch.reorder(n_o, n_i, g, w, k_u, k_i)
        sch.set_scope(rf, 0, "local")
        lane_sums, tile = rf, n_o
        sch.parallel(n_o)
    sch.vectorize(k_i)
    sch.unroll(k_u)
    sch.unroll(w)
    sch.unroll(n_i)  # constant indices into the partial sums, which LLVM then keeps in registers
    sch.reverse_compute_at(block, tile)
    red_k, red_n = sch.get_loops(block)[-2:]
    sch.reorder(red_n, red_k)
    if last is not None:
        sch.reverse_compute_at(last, tile)
    if annotate:
        extra = (rf,) if split_k else ()
        for blk in (lane_sums, block) + extra + ((last,) if last is not None else ()):
            sch.annotate(blk, *SKIP)
    return lane_sums


def factored_lanes(target) -> int | None:
    """Float lanes of the factored sketch on ``target``: 16 with AVX-512, 8 with AVX2, None
    elsewhere (no x86 vector unit it was written for)."""
    from tvm_ext.targets import x86_features  # pylint: disable=import-outside-toplevel

    feats = x86_features(target) if target is not None else set()
    return 16 if "avx512f" in feats else 8 if "avx2" in feats else None


def schedule_factored(sch, block, pattern: GemvPattern, lanes: int) -> None:
    """The factored sketch (module doc) in place: the GEMV blockized over all N and K, its init
    split off before its loops and the update tensorized with the shape's intrinsic, the
    epilogue as one parallel vector loop.  ValueError where the format is not the intrinsic's,
    ScheduleError where the expression is not (tensorize compares it)."""
    from tvm_ext.intrinsics import q4_gemv  # pylint: disable=import-outside-toplevel

    if pattern.pack != q4_gemv.PACK or pattern.group != q4_gemv.GROUP:
        raise ValueError("not the q4 format of the factored intrinsic")
    inline_around(sch, pattern)
    gemv = sch.get(block)
    x_buf = next(r.source for r in gemv.reads if str(r.source.dtype) == "float32"
                 and not r.source.same_as(gemv.writes[0].source))
    scale = next(r.source for r in gemv.reads if str(r.source.dtype).startswith("float")
                 and len(r.source.shape) == 2 and int(r.source.shape[1]) == pattern.k // pattern.group)
    out = gemv.writes[0].source
    index_dtype = str(out.shape[-1].ty)
    intrin = q4_gemv.register(len(x_buf.shape), len(out.shape), pattern.n, pattern.k, str(scale.dtype),
                              index_dtype, lanes)
    whole = sch.blockize(sch.get_loops(block)[-2])
    sch.decompose_reduction(whole, sch.get_loops(whole)[0])  # the intrinsic adds to C: init first
    sch.tensorize(whole, intrin)
    if pattern.epilogues:
        last = sch.get_sblock(pattern.epilogues[-1])
        tiles, lanes_loop = sch.split(sch.fuse(*sch.get_loops(last)), [None, lanes])
        sch.parallel(tiles)
        sch.vectorize(lanes_loop)


def wants_split_k(pattern: GemvPattern, cores: int) -> bool:
    """Whether N gives too few tiles of ``DEFAULT_ROWS`` to keep ``cores`` busy (and K has
    groups to split)."""
    return pattern.n // DEFAULT_ROWS < MIN_TILES_PER_CORE * cores and bool(split_candidates(pattern))


def _cores(target) -> int:
    cores = target.attrs.get("num-cores") if target is not None and hasattr(target, "attrs") else None
    if cores:
        return int(cores)
    from tvm_ext.targets import physical_cores  # pylint: disable=import-outside-toplevel

    return physical_cores()


class DequantGEMV(ScheduleRule):
    """The dequantize-GEMV design space (module doc): untuned, the factored sketch where the target has
    its vector unit, else the scheduled one with the defaults (split-K when N is small for the target's
    ``num-cores``); as a MetaSchedule rule every sketch, the decisions sampled."""

    name = "dequant_gemv"

    def plan(self, func, target):
        return match_func(func)

    def schedule(self, sch, plan, target, sample=False, annotate=False):
        split_k = wants_split_k(plan, _cores(tvm.target.Target(target) if target is not None else None))
        lane_sums = schedule_gemv(sch, sch.get_sblock(plan.gemv), plan, sample=sample, annotate=annotate,
                                  split_k=split_k)
        if not annotate:
            sch.decompose_reduction(lane_sums, sch.get_loops(lane_sums)[-4])  # init before the group loop

    def schedule_as(self, func, name, target, tunable=False):
        """Or None where it does not match (or an epilogue cannot follow the GEMV's tiles, e.g. one
        that is not elementwise over N)."""
        pattern = match_func(func) if isinstance(func, tvm.tirx.PrimFunc) else None
        if pattern is None:
            return None
        lanes = factored_lanes(target)
        factored = None if lanes is None else fresh_schedule(  # None: not the intrinsic's form
            func, name, lambda sch: schedule_factored(sch, sch.get_sblock(pattern.gemv), pattern, lanes),
            (ScheduleError, ValueError, StopIteration))
        if factored is not None:
            return factored
        return fresh_schedule(func, name, lambda sch: self.schedule(sch, pattern, target, sample=tunable))

    def candidates(self, sch, block, target):
        pattern = match(sch, block)
        if pattern is None:
            return [sch]
        out = []
        lanes = factored_lanes(target)
        if lanes is not None:  # the factored sketch first, where the target has its vector unit
            cand = sch.copy()
            try:
                schedule_factored(cand, cand.get_sblock(sch.get(block).name_hint), pattern, lanes)
                for blk in cand.get_child_blocks(cand.get_sblock("root")) + [cand.get_sblock("root")]:
                    cand.annotate(blk, *SKIP)
                out.append(cand)
            except (ScheduleError, ValueError, StopIteration):
                pass  # not the intrinsic's form: the sampled sketches below
        cores = _cores(target) if target is not None else 1
        for split_k in [False] + ([True] if wants_split_k(pattern, cores) else []):
            cand = sch.copy()
            try:
                schedule_gemv(cand, block, pattern, sample=True, annotate=True, split_k=split_k)
            except ScheduleError:
                continue
            out.append(cand)
        return out or [sch]
