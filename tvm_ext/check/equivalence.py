"""Numerical equivalence of our schedules: every candidate of ``tvm_ext.space(llvm)``
computes what the unscheduled function computes.

The corpus is a list of ``Case``s (``tvm_ext.check.corpus``: topi operators,
tvm_ext's quantized ops, tasks of the workloads; re-exported here); shapes are drawn
from a generator seeded by (seed, case name).

For each case the unscheduled function is built for llvm and run on random inputs
(integers small enough not to overflow, requantize parameters in their valid
ranges); then candidates are sampled from the design space (random decisions, all
postprocessors), built, run on the same inputs and compared: exactly for integer
outputs, with a tolerance for floating point (reductions may be reassociated).
A mismatch or an exception is a failure; its function, inputs' seed, trace and
scheduled module are written to a ``.py`` file that reproduces it.

Public API
----------
Case(name, build, int_ranges=None, rtol=1e-4, atol=1e-4)   build(rng) -> PrimFunc
corpus(seed=0) -> list[Case]                  the full corpus (>= 30 cases)
FAST = (...)                                  names of the CI subset
check_case(case, target, candidates=2, seed=0, failure_dir=None, runner=None) -> CaseResult
CandidateRunner(timeout)                      candidates built and run in a worker, time-limited
run_corpus(cases, target, candidates, seed, failure_dir, progress, runner, on_result) -> list[CaseResult]
"""
from __future__ import annotations

import os
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

import tvm

from tvm_ext.arrays import param_buffers, random_arrays
from tvm_ext.check.corpus import FAST, Case, corpus

DEFAULT_FAILURE_DIR = os.environ.get(
    "TVM_EXT_EQUIV_DIR", os.path.join(tempfile.gettempdir(), "tvm_ext_equivalence"))


@dataclass
class CaseResult:
    name: str
    ok: bool
    candidates: int = 0
    message: str = ""
    failure_file: Optional[str] = None
    seconds: float = 0.0
    timeouts: int = 0  # candidates not checked: no build within the runner's time limit


# --------------------------------------------------------------------------- running
def run_mod(mod: tvm.IRModule, target, arrays: list) -> list:
    """Build ``mod`` for ``target``, run ``main`` on copies of ``arrays``, return all buffers."""
    with tvm.transform.PassContext(opt_level=3):
        exe = tvm.compile(mod, target=target)
    tensors = [tvm.runtime.tensor(a.copy()) for a in arrays]
    exe["main"](*tensors)
    return [t.numpy() for t in tensors]


class BuildTimeout(Exception):
    """A candidate did not build and run within the time limit (it was not checked)."""


def _worker_main(conn) -> None:  # runs in the spawned worker process
    import tvm as tvm_  # pylint: disable=import-outside-toplevel,reimported

    while True:
        job = conn.recv()
        if job is None:
            return
        mod_json, target_spec, arrays = job
        try:
            outs = run_mod(tvm_.ir.load_json(mod_json), tvm_.target.Target(target_spec), arrays)
            conn.send(("ok", outs))
        except Exception as err:  # noqa: BLE001 -- sent back and raised in the parent
            conn.send(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))


class CandidateRunner:
    """``run_mod`` in a worker process with a time limit.

    Some valid candidates take LLVM minutes to compile (explicit unroll 512 over a loop
    nest with a dequantize computed inside: seen at 12 s and at over 5 min on the
    reduced Phi-2 matmul). MetaSchedule's builder drops those by its timeout; here the
    worker is killed after ``timeout`` seconds, the candidate is counted as not checked
    (``BuildTimeout``) and a fresh worker takes the next one. One worker serves all
    candidates, so TVM is imported once.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._proc = self._conn = None

    def _start(self) -> None:
        import multiprocessing  # pylint: disable=import-outside-toplevel

        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_worker_main, args=(child,), daemon=True)
        self._proc.start()
        child.close()

    def run(self, mod: tvm.IRModule, target, arrays: list) -> list:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        self._conn.send((tvm.ir.save_json(mod), dict(target.export()), arrays))
        if not self._conn.poll(self.timeout):
            self.close(kill=True)
            raise BuildTimeout(f"not built and run within {self.timeout:g} s")
        status, payload = self._conn.recv()
        if status == "error":
            raise RuntimeError(payload)
        return payload

    def close(self, kill: bool = False) -> None:
        if self._proc is None:
            return
        try:
            if kill:
                self._proc.kill()
            else:
                self._conn.send(None)
            self._proc.join(5)
        except (OSError, EOFError, BrokenPipeError):
            pass
        self._proc = self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def compare(expected: list, got: list, names: list, case: Case) -> Optional[str]:
    """None when equal (exact for integers, tolerance for floats), else a one-line diff."""
    for name, e, g in zip(names, expected, got):
        if e.dtype.kind in "f":
            if not np.allclose(g, e, rtol=case.rtol, atol=case.atol, equal_nan=True):
                err = float(np.nanmax(np.abs(g.astype("float64") - e.astype("float64"))))
                return f"{name}: max abs error {err:.3g} > rtol {case.rtol} / atol {case.atol}"
        elif not np.array_equal(g, e):
            n = int(np.count_nonzero(g != e))
            return f"{name}: {n} of {e.size} elements differ (exact compare)"
    return None


def _write_failure(failure_dir: str, case: Case, seed: int, func, sch, message: str, tb: str) -> str:
    os.makedirs(failure_dir, exist_ok=True)
    path = os.path.join(failure_dir, f"{case.name}-seed{seed}-{int(time.time() * 1000) % 10**8}.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"# tvm_ext equivalence failure: case {case.name!r}, seed {seed}\n")
        f.write("# " + message.replace("\n", "\n# ") + "\n")
        if tb:
            f.write("# traceback:\n# " + tb.strip().replace("\n", "\n# ") + "\n")
        f.write("# Reproduce: python -c \"from tvm_ext.check.equivalence import corpus, check_case; "
                "from tvm_ext.targets import resolve_target; "
                f"print(check_case([c for c in corpus() if c.name == '{case.name}'][0], "
                f"resolve_target('llvm'), seed={seed}))\"\n\n")
        f.write("import tvm\nfrom tvm.script import tirx as T\nfrom tvm.s_tir import Schedule\n\n")
        f.write("# ---- the unscheduled function\n")
        f.write(func.script() if hasattr(func, "script") else str(func))
        f.write("\n\n# ---- the schedule trace (apply to Schedule(main))\n")
        if sch is not None:
            f.write("\n".join(f"# {ln}" for ln in str(sch.trace).splitlines()))
            f.write("\n\n# ---- the scheduled module\n")
            f.write("\n".join(f"# {ln}" for ln in sch.mod.script().splitlines()))
        f.write("\n")
    return path


def check_case(case: Case, target, candidates: int = 2, seed: int = 0, *, space=None,
               failure_dir: Optional[str] = None, runner: Optional[CandidateRunner] = None) -> CaseResult:
    """Sample ``candidates`` schedules of ``case`` from ``tvm_ext.space(target)`` and
    compare each with the unscheduled function on random inputs.

    ``runner``: build and run the candidates in its worker with a time limit (a candidate
    over it is counted in ``timeouts``, not checked); None: in this process, no limit.
    The case is ok when no candidate differs and at least one was compared."""
    import zlib

    import tvm_ext
    from tvm_ext.tune.sampling import sample_candidates

    start = time.time()
    failure_dir = failure_dir or DEFAULT_FAILURE_DIR
    case_seed = (seed * 1000003 + zlib.crc32(case.name.encode())) % (2**31)
    rng = np.random.RandomState(case_seed)
    func = sch = None
    try:
        func = case.build(rng)
        mod = tvm.IRModule({"main": func})
        arrays = random_arrays(func, np.random.default_rng(case_seed), case.int_ranges)
        names = [name for name, _, _ in param_buffers(func)]
        expected = run_mod(mod, target, arrays)
        space = space or tvm_ext.space(target)
        schs = sample_candidates(mod, target, space, candidates, seed=case_seed, postprocs=list(space.postprocs))
        if not schs:
            return CaseResult(case.name, False, 0, "no candidate could be sampled",
                              _write_failure(failure_dir, case, seed, func, None, "no candidate sampled", ""),
                              time.time() - start)
        timeouts = 0
        for sch in schs:
            try:
                got = runner.run(sch.mod, target, arrays) if runner else run_mod(sch.mod, target, arrays)
            except BuildTimeout:
                timeouts += 1
                continue
            diff = compare(expected, got, names, case)
            if diff is not None:
                path = _write_failure(failure_dir, case, seed, func, sch, diff, "")
                return CaseResult(case.name, False, len(schs) - timeouts, diff, path, time.time() - start, timeouts)
        checked = len(schs) - timeouts
        note = f"{timeouts} of {len(schs)} candidates not built within {runner.timeout:g} s" if timeouts else ""
        return CaseResult(case.name, checked > 0, checked, note, None, time.time() - start, timeouts)
    except Exception as err:  # noqa: BLE001 -- any exception is a failing case, saved
        tb = traceback.format_exc()
        line = (str(err).strip().splitlines() or [repr(err)])[-1][:300]
        path = (_write_failure(failure_dir, case, seed, func, sch, f"exception: {line}", tb)
                if func is not None else None)
        return CaseResult(case.name, False, 0, f"exception: {line}", path, time.time() - start)


def describe(res: CaseResult) -> str:
    """One progress line for a checked case."""
    return (f"{res.name}: {res.candidates} candidates, {res.seconds:.1f} s, " + ("ok" if res.ok else "FAIL")
            + (f" {res.message}" if res.message else "") + (f" -> {res.failure_file}" if res.failure_file else ""))


def run_corpus(cases: list, target, candidates: int = 2, seed: int = 0, failure_dir: Optional[str] = None,
               progress: Optional[Callable[[str], None]] = None, runner: Optional[CandidateRunner] = None,
               on_result: Optional[Callable[[list], None]] = None) -> list:
    """check_case over ``cases``; returns the CaseResults. ``on_result`` gets the results so
    far after every case (to save them as they come)."""
    results = []
    for i, case in enumerate(cases):
        results.append(check_case(case, target, candidates, seed, failure_dir=failure_dir, runner=runner))
        if progress:
            progress(f"[{i + 1}/{len(cases)}] " + describe(results[-1]))
        if on_result:
            on_result(results)
    return results


__all__ = ["BuildTimeout", "Case", "CaseResult", "CandidateRunner", "FAST", "check_case", "corpus", "describe",
           "run_corpus"]
