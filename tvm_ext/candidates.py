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
compile_cuda(source, arch, timeout=600) -> (ok, error_line)
compile_many(sources, arch, jobs=None) -> list[(ok, error_line)]
CompilePool(arch, jobs)                      (submit(source) -> Future of (ok, error_line))
count_kernels(mod_or_sch, target=None) -> int
"""
from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterable, Optional

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Schedule, Trace

# Flags TVM's own nvcc path passes; the half/bfloat operator macros matter for fp16 kernels.
NVCC_FLAGS = (
    "-O3",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT162_OPERATORS__",
    "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--use_fast_math",
    "-w",  # unused-variable warnings of generated code are noise here
)


# --------------------------------------------------------------------------- sampling
def tune_context(mod, target, space, task_name: str = "main") -> ms.TuneContext:
    """A TuneContext that initializes ``space`` (its rules and postprocs) for ``target``.

    The first one in a process costs ~40 s (TVM parses its tensor intrinsics).
    """
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


# --------------------------------------------------------------------------- nvcc
def nvcc_path() -> Optional[str]:
    return shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None
    )


def _error_line(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for ln in lines:
        if re.search(r"\berror\b", ln, re.IGNORECASE):
            # drop the temp file path, keep "(line): error: ..."
            return re.sub(r"^\S*?kernels\.cu", "kernels.cu", ln)[:300]
    return (lines[-1] if lines else "nvcc failed without output")[:300]


def compile_cuda(source: str, arch: str, timeout: float = 600) -> tuple[bool, str]:
    """Compile ``source`` with nvcc to a cubin for ``arch`` (e.g. "sm_80").

    Goes through ptxas (not only to PTX), so resource errors such as too much static
    shared memory are caught too.  Returns (ok, first error line; "" when ok).
    """
    exe = nvcc_path()
    if exe is None:
        raise FileNotFoundError("nvcc not found on PATH")
    with tempfile.TemporaryDirectory(prefix="tvm_ext_nvcc_") as tmp:
        src = os.path.join(tmp, "kernels.cu")
        with open(src, "w", encoding="utf-8") as f:
            f.write(source)
        cmd = [exe, "--cubin", f"-arch={arch}", *NVCC_FLAGS, "-o", os.path.join(tmp, "kernels.cubin"), src]
        # own process group: on timeout nvcc's children (cicc, ptxas) die too, or they
        # would keep the pipes open and the wait would never end
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            return False, f"nvcc timed out after {timeout:.0f} s"
    if proc.returncode == 0:
        return True, ""
    return False, _error_line(out + "\n" + err)


def default_jobs() -> int:
    """nvcc processes to run at once: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover
        return max(1, os.cpu_count() or 1)


class CompilePool:
    """nvcc compiles in background threads (subprocesses), with a cache by source.

    ``submit(source)`` returns a Future of (ok, error_line); identical sources are
    compiled once.  Use as a context manager or call ``shutdown()``.
    """

    def __init__(self, arch: str, jobs: Optional[int] = None, timeout: float = 600) -> None:
        self.arch = arch
        self.timeout = timeout
        self.pool = ThreadPoolExecutor(max_workers=jobs or default_jobs(), thread_name_prefix="nvcc")
        self.cache: dict = {}
        self.lock = threading.Lock()

    def submit(self, source: str) -> Future:
        key = hashlib.sha1(source.encode("utf-8", "replace")).hexdigest()
        with self.lock:
            fut = self.cache.get(key)
            if fut is None:
                fut = self.pool.submit(compile_cuda, source, self.arch, self.timeout)
                self.cache[key] = fut
        return fut

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def compile_many(sources: list, arch: str, jobs: Optional[int] = None) -> list:
    """compile_cuda over many sources on ``jobs`` processes at once; results in order."""
    with CompilePool(arch, jobs) as pool:
        futures = [pool.submit(s) for s in sources]
        return [f.result() for f in futures]


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
