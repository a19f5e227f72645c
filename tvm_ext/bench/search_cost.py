"""``tvm-ext bench-search``: what a space costs MetaSchedule's search, plugin vs upstream.

For each task, target (cuda, llvm), thread count and space (``tvm_ext.space(target,
"plugin")`` and ``"upstream"``, TVM's own rules and postprocs), one batch of measure
candidates is generated as a tuning run's first iteration does: a fresh ``TuneContext``
with ``EvolutionarySearch`` (the same population, init_min_unmeasured, genetic
iterations and seed for both spaces), ``RandomModel`` and an empty ``MemoryDatabase``;
only ``generate_measure_candidates()`` is timed (sampling the initial population, the
genetic iterations, every postproc on every candidate they try).  Rounds are
interleaved (round r measures every configuration once, spaces alternating) and the
median of the rounds is reported.

Per-postproc cost is measured apart, single-threaded, outside the search: candidates
are re-sampled from the space's sketches (random decisions, no postproc), then each
postproc of the space is applied in order and timed, as the search applies them; a
candidate one rejects is not passed to the next (``applications`` counts how many
each saw).  On cuda the CUDA candidates are generated and verified on the CPU: nothing
runs on a GPU.

Public API
----------
TASKS, SPACES, TARGETS
run(tasks=("seed",), targets=("cuda", "llvm"), threads=(1, 2), rounds=3, ...) -> dict
    {"target": [...], "settings": {...}, "host": {...}, "rows": [{task, target, space,
    threads, seconds, seconds_all, candidates, per_postproc_ms}]}; ``out``: written there.
ratios(doc) -> list of {task, target, threads, plugin, upstream, ratio}
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

from tvm_ext.jsonio import write_json

SPACES = ("plugin", "upstream")
TARGETS = ("cuda", "llvm")


def _seed_conv():
    from tvm_ext.workloads.conv2d_int8 import seed_conv_primfunc

    return seed_conv_primfunc()


# name -> builder of the PrimFunc; measured tasks of issue 16's list
TASKS: dict = {"seed": _seed_conv}


def _target(name: str):
    from tvm_ext.targets import cuda_target, host_target

    if name == "cuda":
        return cuda_target("sm_80")
    if name == "llvm":
        return host_target()
    raise ValueError(f"unknown target {name!r}; bench-search knows {', '.join(TARGETS)}")


def _check(values, known, what: str) -> tuple:
    values = tuple(values)
    if not values:
        raise ValueError(f"no {what} given")
    for v in values:
        if v not in known:
            raise ValueError(f"unknown {what} {v!r}; choose from {', '.join(known)}")
    return values


def generate_once(mod, target, ruleset: str, *, population: int, init_min_unmeasured: int,
                  genetic_num_iters: int, candidates: int, threads: int, seed: int) -> tuple:
    """(seconds, number of candidates) of one ``generate_measure_candidates()`` call."""
    import tvm_ext
    from tvm.s_tir import meta_schedule as ms

    strategy = ms.search_strategy.EvolutionarySearch(
        population_size=population, init_min_unmeasured=init_min_unmeasured,
        genetic_num_iters=genetic_num_iters)
    ctx = ms.TuneContext(mod, target=target, space_generator=tvm_ext.space(target, ruleset),
                         search_strategy=strategy, num_threads=threads, rand_state=seed,
                         task_name="bench_search")
    design_spaces = ctx.generate_design_space()
    ctx.pre_tuning(max_trials=candidates, num_trials_per_iter=candidates, design_spaces=design_spaces,
                   database=ms.database.MemoryDatabase(), cost_model=ms.cost_model.RandomModel(seed=seed))
    start = time.perf_counter()
    batch = ctx.generate_measure_candidates()
    seconds = time.perf_counter() - start
    ctx.post_tuning()
    return seconds, len(batch or [])


def postproc_cost(mod, target, ruleset: str, *, samples: int, seed: int) -> dict:
    """Milliseconds per application of each postproc of the space (module doc)."""
    import tvm_ext
    from tvm_ext.tune.sampling import sample_candidates, tune_context

    space = tvm_ext.space(target, ruleset)
    ctx = tune_context(mod, target, space, "bench_search")
    postprocs = list(ctx.space_generator.postprocs)
    raw = sample_candidates(mod, target, space, samples, seed=seed, context=ctx, postprocs=[])
    seconds = [0.0] * len(postprocs)
    applied = [0] * len(postprocs)
    accepted = 0
    for sch in raw:
        for i, post in enumerate(postprocs):
            start = time.perf_counter()
            try:
                ok = bool(post.apply(sch))
            except Exception:  # noqa: BLE001 -- as in MetaSchedule: a raising postproc rejects
                ok = False
            seconds[i] += time.perf_counter() - start
            applied[i] += 1
            if not ok:
                break
        else:
            accepted += 1
    out = {}
    for i, post in enumerate(postprocs):
        name = _postproc_name(post)
        out[name] = {"ms": round(1000 * seconds[i] / applied[i], 3) if applied[i] else None,
                     "applications": applied[i]}
    return {"samples": len(raw), "accepted": accepted, "postprocs": out}


def _postproc_name(post) -> str:
    name = type(post).__name__
    if name in ("_PyPostproc", "PyPostproc"):
        # Python postprocs come back from the FFI as bare PyPostproc objects; in tvm_ext's
        # spaces the only one is our VerifyGPUCode (as tune.sampling assumes too)
        return "VerifyGPUCode(tvm_ext)"
    return name


def run(tasks=("seed",), targets=TARGETS, threads=(1, 2), rounds: int = 3, *, population: int = 32,
        init_min_unmeasured: int = 32, genetic_num_iters: int = 2, candidates: int = 32,
        postproc_samples: int = 20, seed: int = 0, spaces=SPACES, out: Optional[str] = None,
        progress: Optional[Callable[[str], None]] = None) -> dict:
    """Time one batch of measure candidates per configuration (module doc); the JSON document."""
    tasks = _check(tasks, tuple(TASKS), "task")
    targets = _check(targets, TARGETS, "target")
    spaces = _check(spaces, SPACES, "space")
    threads = tuple(int(t) for t in threads)
    for name, value in (("rounds", rounds), ("population", population), ("candidates", candidates),
                        ("init-min-unmeasured", init_min_unmeasured), ("genetic-iters", genetic_num_iters)):
        if value < 1:
            raise ValueError(f"--{name} must be at least 1")
    if not threads or min(threads) < 1:
        raise ValueError("--threads must be positive integers")
    if postproc_samples < 0:
        raise ValueError("--postproc-samples must be 0 or more")
    progress = progress or (lambda _msg: None)
    from tvm_ext.targets import describe_host, target_to_json

    tgt = {name: _target(name) for name in targets}
    mods = {name: TASKS[name]() for name in tasks}
    settings = {"population": population, "init_min_unmeasured": init_min_unmeasured,
                "genetic_num_iters": genetic_num_iters, "candidates": candidates, "rounds": rounds,
                "seed": seed, "postproc_samples": postproc_samples}
    times: dict = {}
    counts: dict = {}
    configs = [(task, t, n, s) for t in targets for task in tasks for n in threads for s in spaces]
    for r in range(rounds):
        # interleaved: every configuration once per round, the order of the spaces reversed
        # every other round so that neither always runs first
        order = [(task, t, n, s) for t in targets for task in tasks for n in threads
                 for s in (spaces if r % 2 == 0 else spaces[::-1])]
        for task, t, n, s in order:
            secs, got = generate_once(mods[task], tgt[t], s, population=population,
                                      init_min_unmeasured=init_min_unmeasured,
                                      genetic_num_iters=genetic_num_iters, candidates=candidates,
                                      threads=n, seed=seed)
            times.setdefault((task, t, n, s), []).append(secs)
            counts.setdefault((task, t, n, s), []).append(got)
            progress(f"round {r + 1}/{rounds}: {task} {t} {s} threads {n}: {secs:.1f} s, {got} candidates")
    post = {}
    if postproc_samples:
        for task in tasks:
            for t in targets:
                for s in spaces:
                    post[(task, t, s)] = postproc_cost(mods[task], tgt[t], s, samples=postproc_samples, seed=seed)
                    progress(f"postprocs {task} {t} {s}: {post[(task, t, s)]['postprocs']}")
    rows = []
    for task, t, n, s in configs:
        key = (task, t, n, s)
        pc = post.get((task, t, s))
        rows.append({"task": task, "target": t, "space": s, "threads": n,
                     "seconds": round(statistics.median(times[key]), 2),
                     "seconds_all": [round(x, 2) for x in times[key]],
                     "candidates": min(counts[key]),
                     "per_postproc_ms": {k: v["ms"] for k, v in pc["postprocs"].items()} if pc else None,
                     "postproc_applications": {k: v["applications"] for k, v in pc["postprocs"].items()} if pc else None})
    doc = {"target": [target_to_json(tgt[t]) for t in targets], "settings": settings,
           "host": describe_host(), "rows": rows}
    doc["ratios"] = ratios(doc)
    if out:
        write_json(out, doc)
    return doc


def ratios(doc: dict) -> list:
    """Plugin seconds / upstream seconds per task, target and thread count."""
    by = {(r["task"], r["target"], r["threads"], r["space"]): r["seconds"] for r in doc["rows"]}
    out = []
    for (task, t, n, s), secs in by.items():
        if s != "plugin" or (task, t, n, "upstream") not in by:
            continue
        up = by[(task, t, n, "upstream")]
        out.append({"task": task, "target": t, "threads": n, "plugin": secs, "upstream": up,
                    "ratio": round(secs / up, 2) if up else None})
    return out
