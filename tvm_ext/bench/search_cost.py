"""``tvm-ext bench-search``: what a space costs MetaSchedule's search, plugin vs upstream.

For each task, target (cuda, llvm), thread count and space (``tvm_ext.space(target,
"plugin")`` and ``"upstream"``, TVM's own rules and postprocs), one batch of measure
candidates is generated as a tuning run's first iteration does: a fresh ``TuneContext``
with ``EvolutionarySearch`` (the same population, init_min_unmeasured, genetic
iterations and seed for both spaces), ``RandomModel`` and an empty ``MemoryDatabase``;
only ``generate_measure_candidates()`` is timed (sampling the initial population, the
genetic iterations, every postproc on every candidate they try).  The candidates the search
tried are counted (``sampled``) by a thin Python postproc around the space's first one, in
both spaces: a space whose postprocs reject more makes the search sample more for the same
batch, so seconds = sampled x ms per sample, and the ratio of the spaces is the product of
those two ratios (``sampled_ratio``, ``ms_per_sample_ratio``).  Rounds are
interleaved (round r measures every configuration once, spaces alternating) and the
median of the rounds is reported.  Round r searches with seed ``seed + r`` in both
spaces (``same_seed=True``: ``seed`` in every round): a search's path depends on its seed
and on every verdict it meets, so two spaces that differ in a few verdicts follow
different paths and try different numbers of candidates for the same batch (TVM's own
space alone tries 383-480 on one conv task over seeds 1-3); one seed times one path.

Per-postproc cost is measured apart, single-threaded, outside the search: candidates
are re-sampled from the space's sketches (random decisions, no postproc), then each
postproc of the space is applied in order and timed, as the search applies them; a
candidate one rejects is not passed to the next (``applications`` counts how many
each saw).  On cuda the CUDA candidates are generated and verified on the CPU: nothing
runs on a GPU.

Design-space generation is measured apart too (``space_generation_cost``): the median
milliseconds of one ``generate_design_space`` and, per Python schedule rule of ours, the
milliseconds spent in its ``apply`` during one (the function's doc says how).

The tasks (``seed``, ResNet-50 int8 convs, phi2 dequantize GEMV / matmul) are in
``tvm_ext.bench.search_tasks``; ``all`` asks for every one.

Public API
----------
TASKS, SPACES, TARGETS
run(tasks=("seed",), targets=("cuda", "llvm"), threads=(1, 2), rounds=3, ...) -> dict
    {"target": [...], "settings": {...}, "host": {...}, "rows": [{task, target, space,
    threads, seconds, seconds_all, candidates, sampled, sampled_all, ms_per_sample,
    per_postproc_ms, postproc_applications, space_generation_ms, sketches, rule_ms,
    rule_calls}]}; ``out``: written there.  ``ms_per_sample``: all rounds' seconds over all
    rounds' sampled candidates.
    The last four are per task, target and space (the same in every thread count's row).
space_generation_cost(mod, target, ruleset, reps=...) -> {ms, sketches, rule_ms, rule_calls}
ratios(doc) -> list of {task, target, threads, plugin, upstream, ratio, sampled_ratio,
    ms_per_sample_ratio}
"""
from __future__ import annotations

import statistics
import threading
import time
from typing import Callable, Optional

from tvm_ext.bench.search_tasks import TARGETS, TASKS, task_names
from tvm_ext.bench.search_tasks import target as _target
from tvm_ext.jsonio import write_json

SPACES = ("plugin", "upstream")


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
    """(seconds, number of candidates, candidates sampled) of one
    ``generate_measure_candidates()`` call; *sampled*: how many candidates the search passed
    to the space's postprocs (counted by a wrapper around the first: module doc)."""
    import tvm_ext
    from tvm.s_tir import meta_schedule as ms

    strategy = ms.search_strategy.EvolutionarySearch(
        population_size=population, init_min_unmeasured=init_min_unmeasured,
        genetic_num_iters=genetic_num_iters)
    posts = tvm_ext.default_postprocs(target, ruleset)
    counter = _SampleCounter()
    posts[0] = counter.wrap(posts[0])
    ctx = ms.TuneContext(mod, target=target, space_generator=tvm_ext.space(target, ruleset, postprocs=posts),
                         search_strategy=strategy, num_threads=threads, rand_state=seed,
                         task_name="bench_search")
    design_spaces = ctx.generate_design_space()
    ctx.pre_tuning(max_trials=candidates, num_trials_per_iter=candidates, design_spaces=design_spaces,
                   database=ms.database.MemoryDatabase(), cost_model=ms.cost_model.RandomModel(seed=seed))
    start = time.perf_counter()
    batch = ctx.generate_measure_candidates()
    seconds = time.perf_counter() - start
    ctx.post_tuning()
    return seconds, len(batch or []), counter.count


_COUNTED_POSTPROC = None


class _SampleCounter:
    """Counts the candidates a search hands to a space: ``wrap(first postproc)``."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def add(self) -> None:
        with self.lock:
            self.count += 1

    def wrap(self, post):
        global _COUNTED_POSTPROC  # pylint: disable=global-statement -- the class is made once, lazily
        if _COUNTED_POSTPROC is None:
            from tvm.ir.utils import derived_object
            from tvm.s_tir.meta_schedule.postproc import PyPostproc

            @derived_object
            class CountedPostproc(PyPostproc):
                def __init__(self, inner, counter):
                    super().__init__()
                    self.inner, self.counter = inner, counter

                def _initialize_with_tune_context(self, context) -> None:
                    self.inner._initialize_with_tune_context(context)  # pylint: disable=protected-access

                def apply(self, sch) -> bool:
                    self.counter.add()
                    return bool(self.inner.apply(sch))

                def clone(self):
                    return CountedPostproc(self.inner.clone(), self.counter)

            _COUNTED_POSTPROC = CountedPostproc
        return _COUNTED_POSTPROC(post, self)


def postproc_cost(mod, target, ruleset: str, *, samples: int, seed: int) -> dict:
    """Milliseconds per application of each postproc of the space (module doc)."""
    import tvm_ext
    from tvm_ext.tune.sampling import sample_candidates, tune_context

    postprocs = tvm_ext.default_postprocs(target, ruleset)  # the Python objects, for their names
    space = tvm_ext.space(target, ruleset, postprocs=postprocs)
    ctx = tune_context(mod, target, space, "bench_search")
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
    """The class name; ``(tvm_ext)`` added for ours (VerifyGPUCode is also TVM's name)."""
    name = type(post).__name__
    return f"{name}(tvm_ext)" if _is_python_rule(post) else name


def space_generation_cost(mod, target, ruleset: str, *, reps: int) -> dict:
    """Milliseconds of one design-space generation, and of our Python rules within it.

    ``ms``: the median over ``reps`` calls of ``generate_design_space(mod)`` on the space
    ``tvm_ext.space(target, ruleset)`` initialized by a ``TuneContext`` (after one call not
    counted: first-call imports and caches); ``sketches``: how many it returns.

    ``rule_ms`` / ``rule_calls``: per Python schedule rule of the space (ours:
    ApplyBlockAttrRule, InlineConstantScalars, DequantGEMV and, on x86 with VNNI/AMX, the
    tensorization rules with their checks), the median milliseconds per generation spent
    in its ``apply`` and how many blocks it was applied to.  They are measured on a second
    space with the same rules and postprocs in the same order, each Python rule wrapped in
    a timing ``PyScheduleRule`` that calls the rule's Python ``apply`` directly; its design
    space must be the same (same number of sketches) or this raises.  What is not counted:
    the C++ -> Python call and argument / result conversion of each application (the
    wrapper pays it in place of the rule), so ``rule_ms`` is the time in our Python code.
    Removing a rule instead would change the space the other rules see, so it is not done.
    Empty for ``upstream`` (no Python rules).
    """
    import tvm_ext
    from tvm.s_tir.meta_schedule.space_generator import PostOrderApply
    from tvm_ext.rulesets import default_postprocs, default_rules, target_kind
    from tvm_ext.tune.sampling import tune_context

    def generate(gen, irmod) -> tuple:
        start = time.perf_counter()
        n = len(gen.generate_design_space(irmod))
        return 1000 * (time.perf_counter() - start), n

    ctx = tune_context(mod, target, tvm_ext.space(target, ruleset), "bench_search")
    _ms, sketches = generate(ctx.space_generator, ctx.mod)
    times = [generate(ctx.space_generator, ctx.mod)[0] for _ in range(reps)]
    out = {"ms": round(statistics.median(times), 3), "sketches": sketches, "rule_ms": {}, "rule_calls": {}}
    totals: dict = {}
    calls: dict = {}
    rules = [_timed(r, totals, calls) if _is_python_rule(r) else r for r in default_rules(target, ruleset)]
    if not totals:
        return out
    space = PostOrderApply(sch_rules=rules, postprocs=default_postprocs(target, ruleset),
                           mutator_probs=target_kind(target))
    tctx = tune_context(mod, target, space, "bench_search")
    _ms, timed_sketches = generate(tctx.space_generator, tctx.mod)
    if timed_sketches != sketches:
        raise RuntimeError(f"the rule-timing space gave {timed_sketches} sketches, the {ruleset} space {sketches}")
    per_rep: dict = {name: [] for name in totals}
    for _ in range(reps):
        for name in totals:
            totals[name] = 0.0
            calls[name] = 0
        generate(tctx.space_generator, tctx.mod)
        for name, secs in totals.items():
            per_rep[name].append(1000 * secs)
    out["rule_ms"] = {name: round(statistics.median(v), 3) for name, v in per_rep.items()}
    out["rule_calls"] = dict(calls)
    return out


def _is_python_rule(rule) -> bool:
    # a rule or postproc made by a @derived_object class (ours), not one of TVM's C++ ones
    return getattr(type(rule), "_type", None) == "TVMDerivedObject"


_TIMED_RULE = None


def _timed(rule, totals: dict, calls: dict):
    """``rule`` (a Python rule) wrapped so that its ``apply`` time and calls are added up in
    ``totals`` / ``calls`` under its class name (clones add to the same entries)."""
    global _TIMED_RULE  # pylint: disable=global-statement -- the class is made once, lazily
    if _TIMED_RULE is None:
        from tvm.ir.utils import derived_object
        from tvm.s_tir.meta_schedule.schedule_rule import PyScheduleRule

        @derived_object
        class TimedRule(PyScheduleRule):
            def __init__(self, inner, name, totals, calls):
                super().__init__()
                self.inner, self.name, self.totals, self.calls = inner, name, totals, calls

            def _initialize_with_tune_context(self, context) -> None:
                self.inner._inst._initialize_with_tune_context(context)  # pylint: disable=protected-access

            def apply(self, sch, block):
                start = time.perf_counter()
                try:
                    return self.inner._inst.apply(sch, block)  # pylint: disable=protected-access
                finally:
                    self.totals[self.name] += time.perf_counter() - start
                    self.calls[self.name] += 1

            def clone(self):
                inner = self.inner._inst.clone()  # pylint: disable=protected-access
                return TimedRule(inner, self.name, self.totals, self.calls)

        _TIMED_RULE = TimedRule
    name = type(rule).__name__
    totals.setdefault(name, 0.0)
    calls.setdefault(name, 0)
    return _TIMED_RULE(rule, name, totals, calls)


def run(tasks=("seed",), targets=TARGETS, threads=(1, 2), rounds: int = 3, *, population: int = 32,
        init_min_unmeasured: int = 32, genetic_num_iters: int = 2, candidates: int = 32,
        postproc_samples: int = 20, space_reps: int = 5, seed: int = 0, spaces=SPACES,
        same_seed: bool = False, out: Optional[str] = None,
        progress: Optional[Callable[[str], None]] = None) -> dict:
    """Time one batch of measure candidates per configuration (module doc); the JSON document."""
    tasks = task_names(tasks)
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
    if space_reps < 0:
        raise ValueError("--space-reps must be 0 or more")
    progress = progress or (lambda _msg: None)
    from tvm_ext.targets import describe_host, target_to_json

    tgt = {name: _target(name) for name in targets}
    mods = {}
    for t in targets:
        for name in tasks:
            progress(f"task {name} {t}: building")
            mods[(name, t)] = TASKS[name](t)
    seeds = [seed if same_seed else seed + r for r in range(rounds)]  # one per round, both spaces
    settings = {"population": population, "init_min_unmeasured": init_min_unmeasured,
                "genetic_num_iters": genetic_num_iters, "candidates": candidates, "rounds": rounds,
                "seed": seed, "seeds": seeds,
                "postproc_samples": postproc_samples, "space_reps": space_reps}
    times: dict = {}
    counts: dict = {}
    samples: dict = {}
    configs = [(task, t, n, s) for t in targets for task in tasks for n in threads for s in spaces]
    for r in range(rounds):
        # interleaved: every configuration once per round, the order of the spaces reversed
        # every other round so that neither always runs first
        order = [(task, t, n, s) for t in targets for task in tasks for n in threads
                 for s in (spaces if r % 2 == 0 else spaces[::-1])]
        for task, t, n, s in order:
            secs, got, sampled = generate_once(mods[(task, t)], tgt[t], s, population=population,
                                      init_min_unmeasured=init_min_unmeasured,
                                      genetic_num_iters=genetic_num_iters, candidates=candidates,
                                      threads=n, seed=seeds[r])
            times.setdefault((task, t, n, s), []).append(secs)
            counts.setdefault((task, t, n, s), []).append(got)
            samples.setdefault((task, t, n, s), []).append(sampled)
            progress(f"round {r + 1}/{rounds}: {task} {t} {s} threads {n}: {secs:.1f} s, {got} candidates, "
                     f"{sampled} sampled")
    post = {}
    if postproc_samples:
        for task in tasks:
            for t in targets:
                for s in spaces:
                    post[(task, t, s)] = postproc_cost(mods[(task, t)], tgt[t], s, samples=postproc_samples,
                                                       seed=seed)
                    progress(f"postprocs {task} {t} {s}: {post[(task, t, s)]['postprocs']}")
    gen = {}
    if space_reps:
        for task in tasks:
            for t in targets:
                for s in spaces:
                    gen[(task, t, s)] = g = space_generation_cost(mods[(task, t)], tgt[t], s, reps=space_reps)
                    progress(f"space generation {task} {t} {s}: {g['ms']} ms, {g['sketches']} sketches, "
                             f"rules {g['rule_ms']}")
    rows = []
    for task, t, n, s in configs:
        key = (task, t, n, s)
        pc = post.get((task, t, s))
        posts = pc["postprocs"] if pc else {}
        rows.append({"task": task, "target": t, "space": s, "threads": n,
                     "seconds": round(statistics.median(times[key]), 2),
                     "seconds_all": [round(x, 2) for x in times[key]],
                     "candidates": min(counts[key]),
                     "sampled": statistics.median(samples[key]), "sampled_all": samples[key],
                     "ms_per_sample": round(1000 * sum(times[key]) / max(1, sum(samples[key])), 2),
                     "per_postproc_ms": {k: v["ms"] for k, v in posts.items()} if pc else None,
                     "postproc_applications": {k: v["applications"] for k, v in posts.items()} if pc else None,
                     **_generation_fields(gen.get((task, t, s)))})
    doc = {"target": [target_to_json(tgt[t]) for t in targets], "settings": settings,
           "host": describe_host(), "rows": rows}
    doc["ratios"] = ratios(doc)
    if out:
        write_json(out, doc)
    return doc


def _generation_fields(g: Optional[dict]) -> dict:
    if g is None:
        return {"space_generation_ms": None, "sketches": None, "rule_ms": None, "rule_calls": None}
    return {"space_generation_ms": g["ms"], "sketches": g["sketches"], "rule_ms": g["rule_ms"],
            "rule_calls": g["rule_calls"]}


def ratios(doc: dict) -> list:
    """Plugin seconds / upstream seconds per task, target and thread count."""
    by = {(r["task"], r["target"], r["threads"], r["space"]): r["seconds"] for r in doc["rows"]}
    out = []
    for (task, t, n, s), secs in by.items():
        if s != "plugin" or (task, t, n, "upstream") not in by:
            continue
        up = by[(task, t, n, "upstream")]
        rows = {(r["space"]): r for r in doc["rows"]
                if (r["task"], r["target"], r["threads"]) == (task, t, n)}
        sampled = {s_: rows[s_].get("sampled") for s_ in ("plugin", "upstream")}
        per = {s_: rows[s_].get("ms_per_sample") for s_ in ("plugin", "upstream")}
        out.append({"task": task, "target": t, "threads": n, "plugin": secs, "upstream": up,
                    "ratio": round(secs / up, 2) if up else None,
                    "sampled_ratio": (round(sampled["plugin"] / sampled["upstream"], 2)
                                      if sampled["plugin"] and sampled["upstream"] else None),
                    "ms_per_sample_ratio": (round(per["plugin"] / per["upstream"], 2)
                                            if per["plugin"] and per["upstream"] else None)})
    return out
