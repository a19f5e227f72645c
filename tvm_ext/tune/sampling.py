"""Candidates of a design space: shared by verify-gpu, build-only tuning, the equivalence
corpus and the benchmarks.

A *candidate* is what MetaSchedule would measure: a sketch of the space generator
whose random decisions are re-sampled (as ReplayTrace / the evolutionary search's
initial population do), with the space's postprocessors applied.  Our
VerifyGPUCode and its first check, ThreadExtentPrecheck (and TVM's VerifyGPUCode), are
*not* applied here: the callers run it themselves so
that they can compare its verdict with what nvcc says.

Public API
----------
tune_context(mod, target, space, task_name="main") -> ms.TuneContext
sample_candidates(mod, target, space, n, seed=0, ...) -> list[Schedule]
non_verify_postprocs(space, target) -> list[Postproc]
cuda_source(sch_or_mod, target) -> str
compile_cuda, compile_many, CompilePool     re-exported from tvm_ext.nvcc (nvcc, batched)
count_kernels(mod_or_sch, target=None) -> int
"""
from __future__ import annotations

import random
from typing import Optional

import tvm
from tvm import tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Schedule, Trace


# --------------------------------------------------------------------------- sampling
def tune_context(mod, target, space, task_name: str = "main") -> ms.TuneContext:
    """A TuneContext that initializes ``space`` (its rules and postprocs) for ``target``."""
    if isinstance(mod, tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod})
    return ms.TuneContext(mod=mod, target=target, space_generator=space, task_name=task_name,
                          num_threads=1)


def _is_verify(postproc, target) -> bool:
    # TVM's built-in one by type; Python postprocs come back from the FFI as bare
    # PyPostproc objects: on cuda those of tvm_ext's spaces are our VerifyGPUCode and its
    # first check (ThreadExtentPrecheck), on llvm they are needed ones (AMXTileConfig
    # tensorizes the AMX blocks).
    name = type(postproc).__name__
    python = name in ("_PyPostproc", "PyPostproc")
    return "VerifyGPUCode" in name or (python and target.kind.name == "cuda")


def non_verify_postprocs(space, target) -> list:
    """The space's postprocessors for ``target`` without any VerifyGPUCode (ours or TVM's)."""
    return [p for p in space.postprocs if not _is_verify(p, target)]


def sample_candidates(mod, target, space, n: int, seed: int = 0, *, context=None,
                      postprocs: Optional[list] = None, max_tries: Optional[int] = None,
                      stats: Optional[dict] = None, before_postprocs: Optional[list] = None) -> list:
    """``n`` schedules with random decisions over the design space of ``space``.

    Sketches come from the space generator; for each candidate one sketch is picked
    at random and its trace replayed on a fresh schedule with a new random state,
    decisions dropped, so every sampling instruction draws again.  Then the
    postprocessors are applied (``postprocs``, default: the space's without
    VerifyGPUCode).  A candidate whose replay or postprocessing fails is dropped and
    another drawn, up to ``max_tries`` (default 4 n) draws; fewer than ``n`` may come
    back.  ``stats`` (a dict), when given, receives sketches / tries / dropped counts;
    ``before_postprocs`` (a list), the IRModule of each candidate returned as it was before
    the postprocessors ran (what a postproc placed first sees), in the same order.
    Deterministic for a given ``seed``.
    """
    if isinstance(mod, tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod})
    ctx = context if context is not None else tune_context(mod, target, space)
    sketches = list(ctx.space_generator.generate_design_space(mod))
    if postprocs is None:
        postprocs = non_verify_postprocs(ctx.space_generator, ctx.target)
    rng = random.Random(seed)
    out: list = []
    tries = dropped = 0
    limit = max_tries if max_tries is not None else 4 * n
    while sketches and len(out) < n and tries < limit:
        tries += 1
        sketch = sketches[rng.randrange(len(sketches))]
        sch = Schedule(mod, seed=rng.randrange(1, 2**30), error_render_level="none")
        try:
            Trace(sketch.trace.insts, {}).apply_to_schedule(sch, remove_postproc=True)
            before = sch.mod  # postprocs replace the schedule's module, never change this one
            ok = all(p.apply(sch) for p in postprocs)
        except Exception:  # noqa: BLE001 -- a bad draw is a dropped candidate, as in MetaSchedule
            ok = False
        if ok:
            out.append(sch)
            if before_postprocs is not None:
                before_postprocs.append(before)
        else:
            dropped += 1
    if stats is not None:
        stats.update(sketches=len(sketches), tries=tries, dropped=dropped)
    return out


# --------------------------------------------------------------------------- CUDA source


# --------------------------------------------------------------------------- kernels
