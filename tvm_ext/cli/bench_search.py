"""``tvm-ext bench-search``: seconds MetaSchedule's search spends per batch, plugin vs upstream space."""


def _csv(text: str) -> tuple:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _ints(text: str) -> tuple:
    try:
        return tuple(int(p) for p in _csv(text))
    except ValueError:
        raise ValueError(f"--threads takes comma-separated integers, not {text!r}") from None


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench-search", help="time one batch of measure candidates: plugin vs upstream space",
        description="For each task, target, thread count and space (tvm_ext.space plugin / upstream), "
                    "generate one batch of measure candidates with EvolutionarySearch (same settings and "
                    "seed, RandomModel, empty MemoryDatabase), in interleaved rounds; print the median "
                    "seconds, the ratio plugin/upstream (and its two factors: candidates the search sampled, "
                    "milliseconds per sampled candidate), the milliseconds per postproc per candidate and per "
                    "design-space generation (with the part spent in each of our Python rules). "
                    "CUDA candidates are generated and verified on the CPU: no GPU needed. "
                    "The search-cost study's settings (docs/journal.md): --population 256 "
                    "--init-min-unmeasured 256 --candidates 64.")
    from tvm_ext.bench.search_tasks import TASKS

    p.add_argument("--tasks", default="seed",
                   help=f"comma-separated tasks, or all (known: {', '.join(TASKS)}; default seed)")
    p.add_argument("--targets", default="cuda,llvm", help="comma-separated: cuda, llvm (default both)")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is kept (default 3)")
    p.add_argument("--population", type=int, default=32, help="EvolutionarySearch population_size (default 32)")
    p.add_argument("--init-min-unmeasured", type=int, default=32, help="init_min_unmeasured (default 32)")
    p.add_argument("--genetic-iters", type=int, default=2, help="genetic_num_iters (default 2)")
    p.add_argument("--candidates", type=int, default=32, help="measure candidates per batch (default 32)")
    p.add_argument("--postproc-samples", type=int, default=20,
                   help="candidates for the per-postproc timing (default 20; 0 = skip it)")
    p.add_argument("--space-reps", type=int, default=5,
                   help="design-space generations timed per task, target and space, with the time in our "
                        "Python rules (default 5, the median is kept; 0 = skip it)")
    p.add_argument("--seed", type=int, default=0,
                   help="search seed of the first round; round r uses seed + r in both spaces (default 0)")
    p.add_argument("--same-seed", action="store_true",
                   help="every round with --seed: times one search path again instead of one per round")
    p.add_argument("--out", metavar="FILE", help="also write the JSON result to FILE")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def run(args) -> int:
    import json
    import sys

    from tvm_ext.bench import search_cost

    progress = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    doc = search_cost.run(
        _csv(args.tasks), _csv(args.targets), _ints(args.threads), args.rounds,
        population=args.population, init_min_unmeasured=args.init_min_unmeasured,
        genetic_num_iters=args.genetic_iters, candidates=args.candidates,
        postproc_samples=args.postproc_samples, space_reps=args.space_reps, seed=args.seed,
        same_seed=args.same_seed, out=args.out,
        progress=progress)
    print(json.dumps(doc) if args.json else format_table(doc))
    return 0


def format_table(doc: dict) -> str:
    """Median seconds per configuration, the ratios, and the slowest postprocs."""
    from tvm_ext.cli.table import render

    s = doc["settings"]
    rows = [[r["task"], r["target"], r["threads"], r["space"], f"{r['seconds']:.2f}", r["candidates"],
             r.get("sampled"), r.get("ms_per_sample")] for r in doc["rows"]]
    lines = [f"bench-search: population {s['population']}, init_min_unmeasured {s['init_min_unmeasured']}, "
             f"genetic iters {s['genetic_num_iters']}, {s['candidates']} candidates, "
             f"median of {s['rounds']} rounds",
             render(["task", "target", "threads", "space", "seconds", "candidates", "sampled", "ms/sample"],
                    rows, "<<><>>>>"), ""]

    def times(value):
        return f"{value:.2f}x" if value else None

    ratio_rows = [[r["task"], r["target"], r["threads"], times(r["ratio"]), times(r.get("sampled_ratio")),
                   times(r.get("ms_per_sample_ratio"))] for r in doc["ratios"]]
    lines.append(render(["task", "target", "threads", "plugin/upstream", "sampled", "ms/sample"],
                        ratio_rows, "<<>>>>"))
    post_rows = []
    for r in doc["rows"]:
        if r["threads"] == doc["rows"][0]["threads"] and r["per_postproc_ms"]:
            for name, ms in r["per_postproc_ms"].items():
                post_rows.append([r["task"], r["target"], r["space"], name, ms])
    if post_rows:
        lines += ["", "ms per postproc per candidate (single thread, outside the search):",
                  render(["task", "target", "space", "postproc", "ms"], post_rows, "<<<<>")]
    gen_rows = []
    for r in doc["rows"]:
        if r["threads"] == doc["rows"][0]["threads"] and r.get("space_generation_ms") is not None:
            rules = r["rule_ms"] or {"-": None}
            for i, (name, ms) in enumerate(rules.items()):
                first = i == 0
                gen_rows.append([r["task"] if first else "", r["target"] if first else "",
                                 r["space"] if first else "", r["sketches"] if first else "",
                                 r["space_generation_ms"] if first else "", name, ms,
                                 (r["rule_calls"] or {}).get(name)])
    if gen_rows:
        lines += ["", f"ms per design-space generation (median of {s.get('space_reps')}) and in each of our "
                      "Python rules during one:",
                  render(["task", "target", "space", "sketches", "generation ms", "rule", "rule ms", "calls"],
                         gen_rows, "<<<>><>>")]
    return "\n".join(lines)
