"""DequantGEMVCUDA: CUDA schedules for q4 decode kernels (dequantize + GEMV + epilogue).

Pattern: the one rules/dequant_gemv.py schedules for CPUs (``tvm_ext.analysis.gemv_pattern``, by structure):
one activation row times a weight dequantized from packed words ``P[n, k // 8]`` and per-group scales
``S[n, k // 32]``, then elementwise epilogues -- Phi-2's q4f16_1 qkv, dense + residuals, fc1 + gelu,
fc2 and lm_head decode kernels, fused or with the dequantize a separate block.

Why: a decode GEMV reads each weight byte once, so on a GPU it runs at HBM speed only if the packed
words arrive in wide, coalesced loads with many in flight and the unpack stays in registers.  dlight's
GEMV left the fused Phi-2 layer at 16x its bandwidth bound on an H200, and MetaSchedule's own rules
tile it as a matmul.  This rule builds, for the whole function:

* the dequantize and all but the last epilogue inlined into the GEMV;
* ``rows`` output rows per thread block (``threadIdx.y``), each row's K shared by ``threads`` threads
  (``threadIdx.x``); per step thread t of a row reads ``words`` consecutive packed words (4 words: one
  128-bit load, one quantization group), consecutive threads consecutive words (coalesced), and its
  ``8 * words`` activations as 128-bit loads; the unpack, scale and FMA in registers;
* each thread's partial sum in a register (rfactor), the ``threads`` sums of a row added across
  threads (TVM lowers that to warp shuffles), the row sums in shared memory, the epilogue over the
  block's rows on ``threadIdx.x``;
* the step loop unrolled up to ``unroll`` steps (more loads in flight per thread).

One sketch per ``threads`` count whose steps tile K exactly with some ``words`` (``thread_counts``);
``rows``, ``words`` and ``unroll`` are sampled decisions (defaults ``DEFAULT_ROWS``, the widest
``words``, ``DEFAULT_UNROLL``).  The accumulator keeps the GEMV's dtype (fp16 for q4f16_1, as the
workload defines it).  Blocks it scheduled are annotated ``schedule_rule: "None"`` so that later
rules leave them alone; anything that does not match is returned unchanged, for TVM's other rules.

``DequantGEMVCUDA().apply(func, target)`` is the first sketch with its defaults (untuned, like dlight).
"""
from __future__ import annotations

from tvm.s_tir.schedule import ScheduleError

from tvm_ext.analysis.gemv_pattern import GemvPattern, inline_around, match, match_func
from tvm_ext.schedule_rule import SKIP, ScheduleRule
from tvm_ext.tir_utils import sample_choice

THREADS = (32, 16, 64, 128)  # threads per row, preferred first: one warp a row, then half a warp
WORDS = (1, 2, 4)  # packed words per thread and step (4 x 32 bits: one 128-bit load)
ROWS = (1, 2, 4, 8)  # rows per thread block
UNROLL = (0, 16, 64, 256)  # pragma_auto_unroll_max_step of the step loop
DEFAULT_ROWS = 4
DEFAULT_UNROLL = 256
VECTOR_HALVES = 8  # activations per 128-bit load (fp16)


def word_candidates(pattern: GemvPattern, threads: int) -> list:
    """``words`` values whose steps (``threads * words`` packed words a row) tile a row exactly."""
    row_words = pattern.k // pattern.pack
    return [w for w in WORDS if row_words % (threads * w) == 0]


def thread_counts(pattern: GemvPattern) -> list:
    """The ``threads`` of the rule's sketches, the first sketch's first: those that tile a row with
    some ``words``, preferring the ones that allow 128-bit loads."""
    fits = [t for t in THREADS if word_candidates(pattern, t)]
    return sorted(fits, key=lambda t: -max(word_candidates(pattern, t)))


def row_candidates(pattern: GemvPattern) -> list:
    return [r for r in ROWS if pattern.n % r == 0]


def _read_index(sch, block, keep) -> int:
    return next(i for i, r in enumerate(sch.get(block).reads) if keep(r.source))


def schedule_gemv(sch, block, pattern: GemvPattern, threads: int, sample: bool = False,
                  annotate: bool = False) -> None:
    """Schedule the matched function in place with ``threads`` threads per row (module doc);
    ``sample``: rows / words / unroll as sampled decisions instead of the defaults; ``annotate``:
    mark the blocks done for PostOrderApply's other rules."""
    words = sample_choice(sch, word_candidates(pattern, threads), max(WORDS), sample)
    rows = sample_choice(sch, row_candidates(pattern), DEFAULT_ROWS, sample)
    unroll = sample_choice(sch, list(UNROLL), DEFAULT_UNROLL, sample)
    last = inline_around(sch, pattern)
    *_, n_loop, k_loop = sch.get_loops(block)
    sch.split(n_loop, [None, rows])
    _, tx, _, _ = sch.split(k_loop, [None, threads, words, pattern.pack])
    rf = sch.rfactor(tx, factor_axis=len(sch.get(block).writes[0].region) - 1)
    *_, bx, ty, step, tx, word, lane = sch.get_loops(rf)
    sch.reorder(bx, ty, tx, step, word, lane)
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.set_scope(rf, 0, "local")
    packed = sch.cache_read(rf, _read_index(sch, rf, lambda b: "int" in str(b.dtype)), "local")
    sch.compute_at(packed, step, preserve_unit_loops=True)
    sch.vectorize(sch.get_loops(packed)[-1])  # ``words`` words: one load of up to 128 bits
    acts = sch.cache_read(rf, _read_index(sch, rf, lambda b: int(b.shape[-1]) == pattern.k and len(b.shape) != 2),
                          "local")
    sch.compute_at(acts, step, preserve_unit_loops=True)
    sch.vectorize(sch.split(sch.get_loops(acts)[-1], [None, VECTOR_HALVES])[1])
    sch.unroll(word)
    sch.unroll(lane)
    sch.annotate(step, "pragma_auto_unroll_max_step", unroll)
    sch.annotate(step, "pragma_unroll_explicit", 1)
    sch.reverse_compute_at(block, ty, preserve_unit_loops=True)
    done = [rf, packed, acts, block]
    if last is not None:
        sch.set_scope(block, 0, "shared")
        sch.reverse_compute_at(last, bx, preserve_unit_loops=True)
        sch.bind(sch.split(sch.get_loops(last)[-1], [None, threads])[1], "threadIdx.x")
        done.append(last)
    # the cross-thread sum of a row: the one loop below ``ty`` that is not a unit loop, moved innermost
    # (TVM's cross-thread reduction needs it there); the loops kept there do not depend on the
    # decisions, so a trace replays this by position
    below = sch.get_loops(block)[len(sch.get_loops(rf)) - 4:]
    sums = next(lp for lp in below if int(sch.get(lp).extent) != 1)
    units = [lp for lp in below if not lp.same_as(sums)]
    if units:
        sch.reorder(*units, sums)
    sch.bind(sums, "threadIdx.x")
    if annotate:
        for blk in done:
            sch.annotate(blk, *SKIP)


class DequantGEMVCUDA(ScheduleRule):
    """The CUDA dequantize-GEMV (module doc): the first thread count's sketch untuned; as a MetaSchedule
    rule one sketch per thread count, rows / words / unroll sampled."""

    name = "dequant_gemv_cuda"
    gpu = True

    def plan(self, func, target):
        pattern = match_func(func)
        counts = thread_counts(pattern) if pattern is not None else []
        return (pattern, counts[0]) if counts else None

    def schedule(self, sch, plan, target, sample=False, annotate=False):
        pattern, threads = plan
        schedule_gemv(sch, sch.get_sblock(pattern.gemv), pattern, threads, sample=sample, annotate=annotate)

    def candidates(self, sch, block, target):
        pattern = match(sch, block)
        if pattern is None:
            return [sch]
        out = []
        for threads in thread_counts(pattern):
            cand = sch.copy()
            try:
                schedule_gemv(cand, block, pattern, threads, sample=True, annotate=True)
            except ScheduleError:
                continue
            out.append(cand)
        return out or [sch]
