"""``tvm-ext verify-gpu``: is our VerifyGPUCode sound?  Measured against nvcc.

For every task of a workload, candidates are sampled from ``tvm_ext.space(cuda
target)`` (random decisions, every postprocessor but VerifyGPUCode applied).  Each
candidate gets three verdicts:

* ours     -- ``tvm_ext.postprocs.verify_gpu_code.verify`` (accept, or a reason)
* built-in -- TVM's ``meta_schedule.postproc.VerifyGPUCode``
* nvcc     -- TVM generates the CUDA source, nvcc compiles it to a cubin for the arch
              (a TVM codegen error counts as a failure to compile too)

and lands in one cell of the confusion matrix: accepted_compiles,
accepted_fails (must be 0), rejected_compiles (over-strict unless the reason fails
at run time), rejected_fails.  No GPU is needed; nvcc runs on every CPU we may use
while the main thread generates the next candidates, many candidates per nvcc run
(``tvm_ext.check.nvcc``: same outcome and error text per candidate as alone).  Each task's
document has ``timing`` (seconds per stage: sample, verify_ours, verify_builtin,
codegen) and the run's has ``nvcc`` (runs, batches, seconds in nvcc).

Public API
----------
WORKLOADS                                       names verify-gpu accepts
workload_tasks(name, target, **options) -> list[(task_name, weight, IRModule)]
select_tasks(tasks, spec) -> list               "all", "N" (N spread over the list) or "i,j,k" / names
verify_task(name, mod, target, samples, ...) -> TaskRun   (call .result() for the dict)
run(workload, samples=100, arch="sm_80", ...) -> dict     the JSON document (out=: written per task)
The document's pieces (cells, reason notes, totals, resume, merge of several runs)
are in ``verify_gpu_doc``; the text table in ``tvm_ext.cli.verify_gpu``.
"""
from __future__ import annotations

import sys
import time
import traceback
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Optional

from tvm_ext.jsonio import write_json
from tvm_ext.check.nvcc import DEFAULT_BATCH  # stdlib only: the CLI stays light
from tvm_ext.check.verify_gpu_doc import CELLS, reason_notes, resumed, total_of

WORKLOADS = ("conv2d-int8", "resnet50-int8", "resnet50-int8-s8", "phi2-decode", "phi2-prefill")
ARCHS = ("sm_75", "sm_80", "sm_90")

MAX_EXAMPLES = 5
# Tasks sampled but not yet through nvcc: enough to keep nvcc busy while the next
# task samples; few enough that tasks finish (and are written to --out) in order.
MAX_PENDING_TASKS = 2


def _progress_to_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- tasks
def _workload(name: str, target, **options):
    import tvm_ext.workloads as workloads

    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; verify-gpu knows {', '.join(WORKLOADS)}")
    opts = {k: v for k, v in options.items() if v is not None}
    if name.startswith("phi2"):
        opts.setdefault("compute_dtype", "float16")  # what runs on CUDA
        opts.pop("image", None)
    elif name.startswith("resnet50-int8") or name == "conv2d-int8":
        opts.pop("config", None)
    return workloads.get(name, **opts)


def workload_tasks(name: str, target, **options) -> list:
    """Tuning tasks of a workload for ``target``: [(task_name, weight, IRModule)]."""
    from tvm.s_tir.meta_schedule.relax_integration import extract_tasks

    wl = _workload(name, target, **options)
    return [(t.task_name, int(t.weight), t.dispatched[0]) for t in extract_tasks(wl.mod, target)]


def select_tasks(tasks: list, spec: Optional[str]) -> list:
    """Pick tasks: None/"all" -> all; "N" -> N spread evenly over the list (first and
    last included); "i,j,k" -> those indices ("i," for one); names (comma-separated) also work."""
    if spec in (None, "", "all"):
        return list(tasks)
    spec = str(spec)
    if spec.isdigit():
        k = int(spec)
        if k <= 0:
            raise ValueError("--tasks N (a count) needs N >= 1; for task index 0 alone write '0,' or its name")
        if k >= len(tasks):
            return list(tasks)
        if k == 1:
            return [tasks[0]]
        idx = sorted({round(i * (len(tasks) - 1) / (k - 1)) for i in range(k)})
        return [tasks[i] for i in idx]
    picked = []
    names = [t[0] for t in tasks]
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part.lstrip("-").isdigit():
            i = int(part)
            if not -len(tasks) <= i < len(tasks):
                raise ValueError(f"task index {i} out of range (0..{len(tasks) - 1})")
            picked.append(tasks[i])
        elif part in names:
            picked.append(tasks[names.index(part)])
        else:
            raise ValueError(f"no task {part!r}; tasks: {', '.join(names)}")
    return picked


# --------------------------------------------------------------------------- one task
class Stopwatch:
    """Seconds spent per named stage: ``with clock.stage("codegen"): ...``."""

    STAGES = ("sample", "verify_ours", "verify_builtin", "codegen")

    def __init__(self) -> None:
        self.seconds: Counter = Counter()

    @contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def as_dict(self, candidates: int) -> dict:
        """Seconds per stage, in all and per candidate."""
        total = {k: round(self.seconds.get(k, 0.0), 2) for k in self.STAGES}
        per = {k: round(self.seconds.get(k, 0.0) / candidates, 3) if candidates else None for k in self.STAGES}
        return {"seconds": total, "per_candidate": per}


class TaskRun:
    """Verdicts of one task's candidates; nvcc results arrive asynchronously."""

    def __init__(self, name: str, weight: int, seed: Optional[int] = None) -> None:
        self.name = name
        self.weight = weight
        self.seed = seed
        self.records: list = []  # dicts: ours, reason, message, builtin, future | (ok, err)
        self.seconds = 0.0
        self.sampling: dict = {}
        self.timing = Stopwatch()

    def futures(self) -> list:
        """nvcc's Futures for this task's candidates (codegen failures have none)."""
        return [rec["nvcc"] for rec in self.records if hasattr(rec["nvcc"], "done")]

    def finished(self) -> bool:
        """Whether nvcc has answered for every candidate (result() will not wait)."""
        return all(f.done() for f in self.futures())

    def result(self) -> dict:
        """Wait for nvcc and tally this task's cells (see module doc)."""
        cells = Counter({c: 0 for c in CELLS})
        reasons: Counter = Counter()
        rc_reasons: Counter = Counter()
        agree = 0
        disagree: Counter = Counter()
        builtin_cells = Counter({c: 0 for c in CELLS})
        examples: dict = {c: [] for c in ("accepted_fails", "rejected_compiles", "disagreements")}
        nvcc_errors: Counter = Counter()
        for rec in self.records:
            ok, err = rec["nvcc"].result() if hasattr(rec["nvcc"], "result") else rec["nvcc"]
            rec["nvcc"] = (ok, err)
            ours = rec["ours"]
            cell = ("accepted_" if ours else "rejected_") + ("compiles" if ok else "fails")
            cells[cell] += 1
            bcell = ("accepted_" if rec["builtin"] else "rejected_") + ("compiles" if ok else "fails")
            builtin_cells[bcell] += 1
            if not ok:
                nvcc_errors[_error_kind(err)] += 1
            if not ours:
                reasons[rec["reason"]] += 1
                if ok:
                    rc_reasons[rec["reason"]] += 1
            if ours == rec["builtin"]:
                agree += 1
            else:
                key = (f"ours rejects ({rec['reason']}), built-in accepts" if not ours
                       else "ours accepts, built-in rejects")
                disagree[key] += 1
                _example(examples["disagreements"], rec, ok, err)
            if cell in ("accepted_fails", "rejected_compiles"):
                _example(examples[cell], rec, ok, err)
        n = len(self.records)
        return {
            "task": self.name,
            "weight": self.weight,
            "seed": self.seed,
            "samples": n,
            **{c: cells[c] for c in CELLS},
            "agree_with_builtin": agree,
            "agreement": round(agree / n, 4) if n else None,
            "reasons": dict(reasons.most_common()),
            "rejected_compiles_reasons": dict(rc_reasons.most_common()),
            "builtin": {c: builtin_cells[c] for c in CELLS},
            "disagreements": dict(disagree.most_common()),
            "nvcc_errors": dict(nvcc_errors.most_common()),
            "examples": {k: v for k, v in examples.items() if v},
            "sampling": self.sampling,
            "timing": self.timing.as_dict(n),
            "seconds": round(self.seconds, 1),
        }


def _error_kind(err: str) -> str:
    """A short class of an nvcc / codegen error line, for counting."""
    if err.startswith("tvm codegen:"):
        return "tvm codegen"
    if "too much shared data" in err:
        return "ptxas: too much shared data"
    if "launch_bounds" in err or "maxntid" in err:
        return "launch bounds"
    if "error:" in err:
        return "nvcc: " + err.split("error:", 1)[1].strip()[:60]
    return err[:60]


def _example(bucket: list, rec: dict, ok: bool, err: str) -> None:
    if len(bucket) < MAX_EXAMPLES:
        bucket.append({
            "sample": rec["index"],
            "ours": "accept" if rec["ours"] else f"reject: {rec['reason']}: {rec['message']}",
            "builtin": "accept" if rec["builtin"] else "reject",
            "nvcc": "ok" if ok else err,
        })


def _builtin_accepts(builtin, sch) -> bool:
    try:
        return bool(builtin.apply(sch))
    except Exception:  # noqa: BLE001 -- the built-in raising counts as a rejection
        return False


def _submit_source(pool, sch, target):
    """A Future of nvcc's (ok, error) for the candidate's CUDA source, or (False, error)
    at once when TVM cannot generate it (that does not compile either)."""
    from tvm_ext.lowering import cuda_source

    try:
        return pool.submit(cuda_source(sch, target))
    except Exception as err:  # noqa: BLE001 -- TVM could not generate CUDA: does not compile
        return (False, codegen_error(err))


def codegen_error(err: Exception) -> str:
    """The nvcc-style outcome text of a candidate TVM could not generate CUDA for."""
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()] or [repr(err)]
    return "tvm codegen: " + lines[-1].strip()[:250]


def verify_task(name: str, weight: int, mod, target, samples: int, *, pool, seed: int = 0,
                progress: Optional[Callable[[str], None]] = None, context=None,
                ruleset: str = "plugin") -> TaskRun:
    """Sample, verify (ours and built-in) and submit to nvcc ``samples`` candidates."""
    import tvm_ext
    from tvm.s_tir import meta_schedule as ms
    from tvm_ext.tune.sampling import sample_candidates, tune_context
    from tvm_ext.postprocs.verify_gpu_code import target_limits, verify

    start = time.time()
    run = TaskRun(name, weight, seed)
    clock = run.timing
    space = tvm_ext.space(target, ruleset)
    ctx = context or tune_context(mod, target, space, name)
    builtin = ms.postproc.VerifyGPUCode()
    builtin._initialize_with_tune_context(ctx)  # pylint: disable=protected-access
    limits = target_limits(target)
    with clock.stage("sample"):
        schs = sample_candidates(mod, target, space, samples, seed=seed, context=ctx, stats=run.sampling)
    for i, sch in enumerate(schs):
        with clock.stage("verify_ours"):
            verdict = verify(sch.mod, target, limits)
        with clock.stage("verify_builtin"):
            b_ok = _builtin_accepts(builtin, sch)
        with clock.stage("codegen"):
            outcome = _submit_source(pool, sch, target)
        run.records.append({
            "index": i,
            "ours": verdict is None,
            "reason": None if verdict is None else verdict[0],
            "message": None if verdict is None else verdict[1][:200],
            "builtin": b_ok,
            "nvcc": outcome,
        })
        if progress and ((i + 1) % 10 == 0 or i + 1 == len(schs)):
            progress(f"  {name}: {i + 1}/{len(schs)} candidates generated ({time.time() - start:.0f} s); "
                     + pool.progress_line())
    run.seconds = time.time() - start
    if progress:
        per = run.timing.as_dict(len(schs))["per_candidate"]
        progress(f"  {name}: seconds per candidate: " + ", ".join(f"{k} {v}" for k, v in per.items()))
    return run


# --------------------------------------------------------------------------- whole run
def run(workload: str, samples: int = 100, arch: str = "sm_80", *, tasks: Optional[str] = None,
        seed: int = 0, jobs: Optional[int] = None, image: Optional[int] = None,
        config: Optional[str] = None, batch: int = DEFAULT_BATCH, nvcc_cache: Optional[str] = None,
        out: Optional[str] = None, resume: bool = False,
        progress: Optional[Callable[[str], None]] = _progress_to_stderr) -> dict:
    """verify-gpu over the (selected) tasks of ``workload``; returns the JSON document.

    ``batch``: sources per nvcc run at most (1: one run per candidate; the outcomes
    are the same).  ``nvcc_cache``: a folder where nvcc outcomes are kept by source,
    so that a rerun does not compile a source twice.  ``out``: the document is
    (re)written there, atomically, each time a task's nvcc results are all in
    (``"complete": false`` until the last), so an interrupted run keeps its finished
    tasks; ``resume`` takes those from ``out`` and runs only the others.  Task ``i``
    of the workload samples with seed ``seed + i`` whatever is selected, so a task
    gets the same candidates in a full, a partial and a resumed run.
    """
    from tvm_ext.check.nvcc import CompilePool, nvcc_path
    from tvm_ext.targets import cuda_target

    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")
    if samples < 1:
        raise ValueError("--samples must be at least 1")
    if resume and not out:
        raise ValueError("--resume needs --out FILE: the run whose finished tasks it keeps")
    if nvcc_path() is None:
        raise FileNotFoundError("nvcc not found on PATH: verify-gpu compiles every candidate with it")
    progress = progress or (lambda _msg: None)
    target = cuda_target(arch)
    start = time.time()
    all_tasks = workload_tasks(workload, target, image=image, config=config)
    chosen = select_tasks(all_tasks, tasks)
    head = {
        "workload": workload,
        "arch": arch,
        "samples_per_task": samples,
        "seed": seed,
        "tasks_total": len(all_tasks),
        "options": {k: v for k, v in {"image": image, "config": config, "tasks": tasks}.items() if v is not None},
    }
    results = resumed(out, head) if resume else {}
    index = {name: i for i, (name, _w, _m) in enumerate(all_tasks)}
    todo = [t for t in chosen if t[0] not in results]
    progress(f"verify-gpu {workload}: {len(chosen)} of {len(all_tasks)} tasks"
             + (f" ({len(chosen) - len(todo)} resumed from {out})" if len(todo) < len(chosen) else "")
             + f", {samples} samples each, {arch}")

    def document(pool, complete: bool) -> dict:
        done = [results[name] for name, _w, _m in chosen if name in results]
        total = total_of(done)
        return {
            **head,
            "tasks_checked": len(done),
            "complete": complete,
            "total": total,
            "tasks": done,
            "reason_notes": reason_notes(total),
            "nvcc": {"batch": batch, **pool.summary()},
            "seconds": round(time.time() - start, 1),
        }

    def collect(pending: list, pool) -> None:
        """Tally (and write) the tasks whose nvcc results are all in."""
        for r in [r for r in pending if r.finished()]:
            pending.remove(r)
            res = results[r.name] = r.result()
            progress(f"  {r.name}: " + ", ".join(f"{c}={res[c]}" for c in CELLS)
                     + f", agree={res['agree_with_builtin']}/{res['samples']}")
            if out:
                write_json(out, document(pool, complete=False))

    pending: list = []
    with CompilePool(arch, jobs, batch=batch, cache_dir=nvcc_cache) as pool:
        for k, (name, weight, mod) in enumerate(todo):
            while len(pending) >= MAX_PENDING_TASKS:  # sample ahead, but finish tasks in order
                pool.wait(progress, futures=pending[0].futures())
                collect(pending, pool)
            progress(f"[{k + 1}/{len(todo)}] {name}")
            try:
                pending.append(verify_task(name, weight, mod, target, samples, pool=pool,
                                           seed=seed + index[name], progress=progress))
            except Exception as err:  # noqa: BLE001 -- report the task, keep going
                progress(f"  {name}: sampling failed: {err}\n{traceback.format_exc(limit=3)}")
            collect(pending, pool)
        if pending:
            progress(f"waiting for nvcc ({len(pool.cache)} distinct sources)...")
        while pending:
            pool.wait(progress, futures=pending[0].futures())
            collect(pending, pool)
        doc = document(pool, complete=len(results) == len(chosen))
    if out:
        write_json(out, doc)
    return doc


__all__ = ["WORKLOADS", "run", "select_tasks", "verify_task", "workload_tasks"]
