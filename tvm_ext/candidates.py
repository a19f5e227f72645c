"""Candidates of a design space, their CUDA source, and nvcc: shared by verify-gpu,
build-only tuning and the equivalence corpus.

A *candidate* is what MetaSchedule would measure: a sketch of the space generator
whose random decisions are re-sampled (as ReplayTrace / the evolutionary search's
initial population do), with the space's postprocessors applied.  Our
VerifyGPUCode (and TVM's) is *not* applied here: the callers run it themselves so
that they can compare its verdict with what nvcc says.

Public API
----------
tune_context(mod, target, space, task_name="main") -> ms.TuneContext
sample_candidates(mod, target, space, n, seed=0, ...) -> list[Schedule]
non_verify_postprocs(space) -> list[Postproc]
cuda_source(sch_or_mod, target) -> str
compile_cuda, compile_many, CompilePool     re-exported from tvm_ext.nvcc (nvcc, batched)
count_kernels(mod_or_sch, target=None) -> int
"""
from __future__ import annotations

import random
from typing import Iterable, Optional

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Schedule, Trace

# nvcc moved to tvm_ext.nvcc (batched compiles); re-exported for existing callers
from tvm_ext.nvcc import (NVCC_FLAGS, CompilePool, compile_cuda, compile_many,  # noqa: F401
                          default_jobs, nvcc_path)


# --------------------------------------------------------------------------- sampling
def tune_context(mod, target, space, task_name: str = "main") -> ms.TuneContext:
    """A TuneContext that initializes ``space`` (its rules and postprocs) for ``target``."""
    if isinstance(mod, tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod})
    return ms.TuneContext(mod=mod, target=target, space_generator=space, task_name=task_name,
                          num_threads=1)


def _is_verify(postproc) -> bool:
    # TVM's built-in one by type; Python postprocs come back from the FFI as bare
    # PyPostproc objects, and in tvm_ext's spaces the only one is our VerifyGPUCode.
    name = type(postproc).__name__
    return "VerifyGPUCode" in name or name in ("_PyPostproc", "PyPostproc")


def non_verify_postprocs(space) -> list:
    """The space's postprocessors without any VerifyGPUCode (ours or TVM's)."""
    return [p for p in space.postprocs if not _is_verify(p)]


def sample_candidates(mod, target, space, n: int, seed: int = 0, *, context=None,
                      postprocs: Optional[list] = None, max_tries: Optional[int] = None,
                      stats: Optional[dict] = None) -> list:
    """``n`` schedules with random decisions over the design space of ``space``.

    Sketches come from the space generator; for each candidate one sketch is picked
    at random and its trace replayed on a fresh schedule with a new random state,
    decisions dropped, so every sampling instruction draws again.  Then the
    postprocessors are applied (``postprocs``, default: the space's without
    VerifyGPUCode).  A candidate whose replay or postprocessing fails is dropped and
    another drawn, up to ``max_tries`` (default 4 n) draws; fewer than ``n`` may come
    back.  ``stats`` (a dict), when given, receives sketches / tries / dropped counts.
    Deterministic for a given ``seed``.
    """
    if isinstance(mod, tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod})
    ctx = context if context is not None else tune_context(mod, target, space)
    sketches = list(ctx.space_generator.generate_design_space(mod))
    if postprocs is None:
        postprocs = non_verify_postprocs(ctx.space_generator)
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
            ok = all(p.apply(sch) for p in postprocs)
        except Exception:  # noqa: BLE001 -- a bad draw is a dropped candidate, as in MetaSchedule
            ok = False
        if ok:
            out.append(sch)
        else:
            dropped += 1
    if stats is not None:
        stats.update(sketches=len(sketches), tries=tries, dropped=dropped)
    return out


# --------------------------------------------------------------------------- CUDA source
def _as_mod(sch_or_mod) -> tvm.IRModule:
    if isinstance(sch_or_mod, Schedule):
        return sch_or_mod.mod
    if isinstance(sch_or_mod, tirx.PrimFunc):
        return tvm.IRModule({"main": sch_or_mod})
    return sch_or_mod


def cuda_source(sch_or_mod, target) -> str:
    """CUDA C source TVM generates for a scheduled candidate (no nvcc is run).

    TVM 0.27 keeps the source in the CUDA module and compiles lazily, so building
    for ``target`` runs TVM's whole lowering and code generation only.  Raises what
    TVM raises when lowering or codegen fails.
    """
    mod = _as_mod(sch_or_mod)
    mod = tvm.IRModule({gv: f.with_attr("global_symbol", gv.name_hint) if isinstance(f, tirx.PrimFunc) else f
                        for gv, f in mod.functions.items()})
    with tvm.transform.PassContext(opt_level=3):
        exe = tvm.compile(mod, target=target)
    sources = [m.inspect_source() for m in _walk_imports(exe.mod) if str(m.kind) == "cuda"]
    if not sources:
        raise RuntimeError("no CUDA module was generated")
    return "\n".join(sources)


def _walk_imports(module) -> Iterable:
    stack = list(module.imports)
    while stack:
        m = stack.pop()
        yield m
        stack.extend(m.imports)


# --------------------------------------------------------------------------- kernels
def _outer_thread_scopes(stmt) -> int:
    count = 0

    def visit(node, visitor):
        nonlocal count
        if isinstance(node, tirx.AttrStmt) and node.attr_key == "thread_extent":
            count += 1
            return None  # nested thread scopes belong to this kernel
        return visitor.default_visit(node)

    tvm_ffi.structural_visit(stmt, [(tirx.Stmt, visit)])
    return count


def count_kernels(sch_or_mod, target=None) -> int:
    """Device kernels of a scheduled GPU candidate (summed over its PrimFuncs).

    The candidate is lowered as the GPU build lowers it and every outermost
    thread-extent scope (a launch) is counted.  Without a ``target`` -- or when
    lowering fails -- it counts top-level loop nests under the root block, which for
    a scheduled GPU candidate are each bound to blockIdx (one kernel each); for an
    llvm candidate that is the number of loop nests.
    """
    from tvm_ext.tir_utils import prim_funcs, top_level_nests

    mod = _as_mod(sch_or_mod)
    total = 0
    for name, func in prim_funcs(mod):
        n = None
        if target is not None and str(target.kind.name) == "cuda":
            try:
                from tvm_ext.postprocs.verify_gpu_code import lower_for_gpu

                n = _outer_thread_scopes(lower_for_gpu(func, name, target).body)
            except Exception:  # noqa: BLE001 -- fall back to the structural count
                n = None
        total += n if n else top_level_nests(func)
    return total


__all__ = [
    "CompilePool",
    "compile_cuda",
    "compile_many",
    "count_kernels",
    "cuda_source",
    "non_verify_postprocs",
    "sample_candidates",
    "tune_context",
]
