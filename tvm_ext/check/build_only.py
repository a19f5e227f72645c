"""Build-only tuning (``tvm-ext tune --target cuda --build-only``) and the fusion evidence.

Without a GPU nothing can be measured, but everything before the measurement can
run: candidates are generated from the design space and postprocessed exactly as
MetaSchedule does (VerifyGPUCode included, so a rejected candidate is never
built), each accepted one is compiled (nvcc for CUDA, TVM's llvm build for CPU),
and the cost model picks the best.  Its kernel count is what ``tvm-ext report``
calls ``kernels``.

The cost model is MetaSchedule's XGBModel.  With no measurements it is untrained
and, like MetaSchedule's own at warm-up, scores candidates uniformly at random
(seeded here, so runs repeat).  Each row also gives the kernel counts of every
built candidate, which show whether the choice matters (for the fusion question it
does not: every plugin sketch of a quantized conv is one kernel).

Public API
----------
build_only(tasks, target, ruleset="plugin", candidates_per_task=8, log=None, *, seed=0,
           compile=True, jobs=None, max_tries_per_candidate=25) -> list[dict]
fusion_evidence(arch="sm_80", image=224, out_json=FUSION_JSON, *, candidates_per_task=2,
                compile=True, log=None, max_tries_per_candidate=200) -> dict
FUSION_JSON = "tuning_logs/fusion-resnet50-int8-cuda.json"
"""
from __future__ import annotations

import os
import sys
import time
from collections import Counter
from typing import Callable, Optional, Union

import numpy as np

from tvm_ext.jsonio import write_json

FUSION_JSON = os.path.join("tuning_logs", "fusion-resnet50-int8-cuda.json")
FUSION_RULESETS = ("plugin", "no-inline-const")

LogSpec = Union[None, Callable[[str], None], "object"]


def _logger(log: LogSpec) -> Callable[[str], None]:
    if log is None:
        return lambda _msg: None
    if callable(log):
        return log
    if hasattr(log, "write"):
        def write(msg: str) -> None:
            log.write(msg + "\n")
            if hasattr(log, "flush"):
                log.flush()
        return write
    raise TypeError("log must be None, a callable taking a string, or a file-like object")


def _task_list(tasks) -> list:
    """(name, IRModule) pairs from ExtractedTasks, (name, mod[, ...]) tuples or a dict."""
    import tvm
    from tvm import tirx

    if isinstance(tasks, dict):
        tasks = list(tasks.items())
    out = []
    for t in tasks:
        if hasattr(t, "dispatched"):
            name, mod = t.task_name, t.dispatched[0]
        else:
            name, mod = t[0], t[-1] if len(t) == 2 else t[2]
        if isinstance(mod, tirx.PrimFunc):
            mod = tvm.IRModule({"main": mod})
        out.append((str(name), mod))
    return out


def _build_cpu(sch, target) -> tuple[bool, str]:
    import tvm

    try:
        with tvm.transform.PassContext(opt_level=3):
            tvm.compile(sch.mod, target=target)
        return True, ""
    except Exception as err:  # noqa: BLE001 -- any build error is a build failure
        lines = [ln for ln in str(err).strip().splitlines() if ln.strip()] or [repr(err)]
        return False, lines[-1].strip()[:250]


def _best_index(ctx, schs: list, cost_model, seed: int) -> int:
    """Index of the candidate the cost model scores highest (ties: the first)."""
    from tvm.s_tir import meta_schedule as ms

    if len(schs) == 1:
        return 0
    cands = [ms.MeasureCandidate(s, ms.arg_info.ArgInfo.from_entry_func(s.mod, remove_preproc=True))
             for s in schs]
    state = np.random.get_state()
    np.random.seed(seed)  # an untrained XGBModel draws its scores from NumPy's global RNG
    try:
        scores = np.asarray(cost_model.predict(ctx, cands), dtype="float64")
    finally:
        np.random.set_state(state)
    return int(np.argmax(scores))


def build_only(tasks, target, ruleset: str = "plugin", candidates_per_task: int = 8, log: LogSpec = None,
               *, seed: int = 0, compile: bool = True, jobs: Optional[int] = None,  # noqa: A002
               max_tries_per_candidate: int = 25, cost_model=None) -> list:
    """Generate, postprocess and build candidates of every task; no measurement.

    tasks: ExtractedTasks (``extract_tasks``), (name, mod) pairs, or {name: mod}.
    Returns one dict per task: ``task``, ``kernels`` (of the best-by-cost-model
    candidate; None when no candidate survived), ``candidates`` (candidates that
    passed every postprocessor and were built), ``build_failures`` (of those, how
    many failed to compile: TVM codegen or nvcc), plus ``rejected`` (draws dropped by
    a postprocessor), ``kernels_all`` (kernel count -> candidates), ``errors``
    (first lines of the build failures) and ``seconds``.
    """
    import tvm_ext
    from tvm.s_tir import meta_schedule as ms
    from tvm_ext.check.nvcc import CompilePool
    from tvm_ext.lowering import count_kernels, cuda_source
    from tvm_ext.tune.sampling import sample_candidates, tune_context
    from tvm_ext.rulesets import check_ruleset

    check_ruleset(ruleset)
    say = _logger(log)
    is_cuda = str(target.kind.name) == "cuda"
    arch = str(target.attrs.get("arch", "sm_80")) if is_cuda else None
    rows = []
    pool = CompilePool(arch, jobs) if (is_cuda and compile) else None
    try:
        for k, (name, mod) in enumerate(_task_list(tasks)):
            start = time.time()
            space = tvm_ext.space(target, ruleset)
            ctx = tune_context(mod, target, space, name)
            stats: dict = {}
            # every postprocessor, VerifyGPUCode included: a rejected candidate is never built
            schs = sample_candidates(mod, target, space, candidates_per_task, seed=seed + k, context=ctx,
                                     postprocs=list(space.postprocs),
                                     max_tries=max_tries_per_candidate * candidates_per_task, stats=stats)
            results: list = []
            for sch in schs:
                if not compile:
                    results.append((True, ""))
                elif is_cuda:
                    try:
                        results.append(pool.submit(cuda_source(sch, target)))
                    except Exception as err:  # noqa: BLE001 -- codegen failed: a build failure
                        lines = [ln for ln in str(err).strip().splitlines() if ln.strip()] or [repr(err)]
                        results.append((False, "tvm codegen: " + lines[-1].strip()[:250]))
                else:
                    results.append(_build_cpu(sch, target))
            results = [r.result() if hasattr(r, "result") else r for r in results]
            built = [s for s, (ok, _) in zip(schs, results) if ok]
            kernels_all = Counter(count_kernels(s, target) for s in schs)
            best_kernels = None
            if built:
                model = cost_model or ms.cost_model.XGBModel(adaptive_training=False)
                best = built[_best_index(ctx, built, model, seed + k)]
                best_kernels = count_kernels(best, target)
            failures = [err for ok, err in results if not ok]
            row = {
                "task": name,
                "kernels": best_kernels,
                "candidates": len(schs),
                "build_failures": len(failures),
                "rejected": stats.get("dropped", 0),
                "kernels_all": {str(kk): v for kk, v in sorted(kernels_all.items())},
                "errors": sorted(set(failures))[:3],
                "seconds": round(time.time() - start, 1),
            }
            rows.append(row)
            say(f"[{k + 1}] {name} ({ruleset}): kernels {best_kernels}, {len(schs)} candidates, "
                f"{len(failures)} build failures, {row['rejected']} rejected by postprocs, {row['seconds']} s")
    finally:
        if pool is not None:
            pool.shutdown()
    return rows


def _conv_tasks(image: int, target) -> list:
    from tvm.s_tir.meta_schedule.relax_integration import extract_tasks

    import tvm_ext.workloads as workloads

    wl = workloads.get("resnet50-int8", image=image)
    tasks = [t for t in extract_tasks(wl.mod, target) if "conv2d" in t.task_name]
    return sorted(tasks, key=lambda t: _natural(t.task_name))


def _natural(name: str):
    import re

    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def fusion_evidence(arch: str = "sm_80", image: int = 224, out_json: str = FUSION_JSON, *,
                    candidates_per_task: int = 2, compile: bool = True, log: LogSpec = None,  # noqa: A002
                    seed: int = 0, tasks: Optional[int] = None, max_tries_per_candidate: int = 200) -> dict:
    """Kernels of the best build-only candidate per conv task of resnet50-int8 under
    ``plugin`` and ``no-inline-const``; writes ``out_json`` as
    ``{"arch", "rows": [{"task", "plugin_kernels", "no_inline_const_kernels"}]}``
    (plus the settings used) and returns it.  ``tasks`` limits the number of conv
    tasks (first ``tasks`` in name order) for quick runs."""
    from tvm_ext.targets import cuda_target

    say = _logger(log if log is not None else (lambda m: print(m, file=sys.stderr, flush=True)))
    target = cuda_target(arch)
    conv = _conv_tasks(image, target)
    if tasks is not None:
        conv = conv[:tasks]
    per_ruleset = {}
    for ruleset in FUSION_RULESETS:
        say(f"fusion evidence: {ruleset}, {len(conv)} conv tasks, image {image}, {arch}")
        per_ruleset[ruleset] = build_only(conv, target, ruleset, candidates_per_task, say, seed=seed,
                                          compile=compile, max_tries_per_candidate=max_tries_per_candidate)
    rows = []
    for a, b in zip(per_ruleset["plugin"], per_ruleset["no-inline-const"]):
        rows.append({
            "task": a["task"],
            "plugin_kernels": a["kernels"],
            "no_inline_const_kernels": b["kernels"],
            "plugin_kernels_all": a["kernels_all"],
            "no_inline_const_kernels_all": b["kernels_all"],
            "build_failures": {"plugin": a["build_failures"], "no-inline-const": b["build_failures"]},
        })
    doc = {
        "arch": arch,
        "workload": "resnet50-int8",
        "image": image,
        "candidates_per_task": candidates_per_task,
        "compiled_with_nvcc": bool(compile),
        "max_tries_per_candidate": max_tries_per_candidate,
        "command": f"python -c \"from tvm_ext.check.build_only import fusion_evidence; "
                   f"fusion_evidence('{arch}', {image}, candidates_per_task={candidates_per_task})\"",
        "rows": rows,
    }
    if out_json:
        write_json(out_json, doc)
    return doc


__all__ = ["FUSION_JSON", "build_only", "fusion_evidence"]
