"""``tvm-ext check-rules``: the equivalence corpus as a command (the slow test's work).

Every case of ``tvm_ext.equivalence.corpus()`` is built, run unscheduled on random
inputs, then ``--candidates`` schedules sampled from ``tvm_ext.space(target)`` are
built, run and compared (exact for integers, tolerance for floats).  A failing case
is written to ``--failure-dir`` with its function and trace; the JSON document is
rewritten after every case, so an interrupted run keeps what it checked.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "check-rules", help="numerical equivalence of tvm_ext's schedules on the operator corpus",
        description="For each PrimFunc of the equivalence corpus (topi conv2d/dense/batch_matmul/pooling/"
                    "softmax/layer_norm/elementwise/reductions/transpose/requantize, qnn ops and workload "
                    "tasks, shapes drawn from --seed), sample candidates from tvm_ext.space(target), build "
                    "and run them on random inputs and compare with the unscheduled function. Exit code 1 "
                    "when any case fails; each failure is saved as a .py file that reproduces it.")
    p.add_argument("--cases", default="all",
                   help="all (default), fast (the CI subset), or case names, comma-separated (see --list)")
    p.add_argument("--candidates", type=int, default=3, help="sampled schedules per case (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of shapes, inputs and sampling (default 0)")
    p.add_argument("--target", default="llvm", help="an llvm target preset or JSON (default: this CPU)")
    p.add_argument("--failure-dir", metavar="DIR", default=None,
                   help="where failing cases are written (default $TVM_EXT_EQUIV_DIR or a temp folder)")
    p.add_argument("--out", metavar="FILE", help="write the JSON result to FILE (rewritten after every case)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--build-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="build and run each candidate in a worker process and give up on it after SECONDS "
                        "(counted as not checked; some valid candidates take LLVM minutes); 0 = in this "
                        "process, no limit (default 120)")
    p.add_argument("--list", action="store_true", help="list the corpus and exit")
    p.set_defaults(func=run)


def select_cases(corpus: list, spec: str, fast: tuple) -> list:
    """The cases named by ``spec`` (all, fast or names), in corpus order; unknown names are an error."""
    if spec == "all":
        return list(corpus)
    names = list(fast) if spec == "fast" else [s.strip() for s in spec.split(",") if s.strip()]
    known = {c.name: c for c in corpus}
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"unknown case(s) {', '.join(unknown) or '(none given)'}; "
                         f"see 'tvm-ext check-rules --list'")
    return [c for c in corpus if c.name in set(names)]


def document(target, candidates: int, seed: int, results: list, planned: int) -> dict:
    cases = [{"name": r.name, "ok": r.ok, "candidates": r.candidates, "timeouts": r.timeouts,
              "seconds": round(r.seconds, 2), "message": r.message, "failure_file": r.failure_file}
             for r in results]
    return {"target": str(target), "candidates_per_case": candidates, "seed": seed,
            "total": {"planned": planned, "checked": len(results), "ok": sum(r.ok for r in results),
                      "failed": sum(not r.ok for r in results),
                      "candidates": sum(r.candidates for r in results),
                      "timeouts": sum(r.timeouts for r in results),
                      "seconds": round(sum(r.seconds for r in results), 1)},
            "cases": cases}


def format_table(doc: dict) -> str:
    from tvm_ext.cli.table import render

    def result(c):
        if c["ok"]:
            return "ok" + (f" ({c['message']})" if c["message"] else "")
        return f"FAIL {c['message']}" + (f" -> {c['failure_file']}" if c["failure_file"] else "")

    rows = [[c["name"], c["candidates"], f"{c['seconds']:.1f}", result(c)] for c in doc["cases"]]
    t = doc["total"]
    return "\n".join([
        f"check-rules on {doc['target']}: {doc['candidates_per_case']} candidates per case, seed {doc['seed']}",
        render(["case", "cand", "s", "result"], rows, "<>><"),
        f"total: {t['ok']}/{t['checked']} cases equal ({t['candidates']} candidates compared, "
        f"{t['timeouts']} not built in time, {t['seconds']} s)"
        + (f"; {t['planned'] - t['checked']} not checked" if t["checked"] < t["planned"] else "")])


def run(args) -> int:
    import json

    from tvm_ext.check import equivalence as eq
    from tvm_ext.jsonio import write_json
    from tvm_ext.cli.common import log, resolve_target

    corpus = eq.corpus()
    if args.list:
        for case in corpus:
            print(case.name + ("  (fast)" if case.name in eq.FAST else ""))
        return 0
    if args.candidates < 1:
        raise ValueError("--candidates must be at least 1")
    if args.build_timeout < 0:
        raise ValueError("--build-timeout must be 0 (no limit) or more")
    cases = select_cases(corpus, args.cases, eq.FAST)
    target = resolve_target(args.target)
    if str(target.kind.name) != "llvm":
        raise ValueError(f"check-rules runs the kernels here: it needs an llvm target, not {target.kind.name}")
    results = []

    def write(done):
        results[:] = done
        if args.out:
            write_json(args.out, document(target, args.candidates, args.seed, done, len(cases)))

    log(f"checking {len(cases)} cases, {args.candidates} candidates each, on {target}")
    runner = eq.CandidateRunner(args.build_timeout) if args.build_timeout else None
    try:
        eq.run_corpus(cases, target, args.candidates, args.seed, args.failure_dir, progress=log, runner=runner,
                      on_result=write)
    finally:
        if runner:
            runner.close()
        doc = document(target, args.candidates, args.seed, results, len(cases))
        print(json.dumps(doc) if args.json else format_table(doc))
    return 0 if doc["total"]["failed"] == 0 else 1
