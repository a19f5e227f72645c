"""``tvm-ext verify-gpu WORKLOAD``: our VerifyGPUCode vs nvcc vs TVM's built-in, per task."""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "verify-gpu", help="check VerifyGPUCode against nvcc on sampled CUDA candidates",
        description="For every task of WORKLOAD, sample candidates from tvm_ext.space(cuda target) "
                    "(random decisions, all postprocessors but VerifyGPUCode), run our VerifyGPUCode "
                    "and TVM's built-in one, compile each candidate's CUDA source with nvcc, and print "
                    "the confusion matrix per task and in total (accepted/rejected x compiles/fails), "
                    "the rejection reasons and the agreement with the built-in. No GPU needed.")
    p.add_argument("workload", nargs="?", help="conv2d-int8, resnet50-int8, phi2-decode or phi2-prefill")
    p.add_argument("--replay", metavar="FILE",
                   help="instead of a new run: draw again the candidates of the verify-gpu document FILE "
                        "(e.g. tuning_logs/verify-gpu.json) and compare the staged postproc's decisions "
                        "(what a search runs) with the whole verdict; nvcc settles any that moved "
                        "(--tasks, --out, --json, --quiet apply)")
    p.add_argument("--samples", type=int, default=100, help="candidates per task (default 100)")
    p.add_argument("--arch", default="sm_80", choices=("sm_75", "sm_80", "sm_90"), help="nvcc arch (default sm_80)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--out", metavar="FILE",
                   help="also write the JSON result to FILE, rewritten as each task finishes "
                        "(\"complete\": false until the last), so an interrupted run keeps its finished tasks")
    p.add_argument("--resume", action="store_true",
                   help="keep the tasks already in --out FILE (same workload, arch, samples, seed) and run the rest")
    p.add_argument("--tasks", metavar="SPEC",
                   help="which tasks: all (default); N alone = N tasks spread over the list; or indices "
                        "and/or names, comma-separated (one index alone: 'I,', e.g. '0,')")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--jobs", type=int, default=None, help="nvcc processes at once (default: usable CPUs)")
    p.add_argument("--batch", type=int, default=16,
                   help="candidate sources per nvcc run at most (default 16; 1 = one run per candidate, "
                        "same outcomes, slower)")
    p.add_argument("--nvcc-cache", metavar="DIR", default=None,
                   help="keep nvcc outcomes in DIR by source, so that a rerun or resumed run skips them")
    p.add_argument("--image", type=int, default=None, help="image size for conv2d-int8 / resnet50-int8")
    p.add_argument("--config", default=None, help="phi2 config: full (default) or reduced")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def run(args) -> int:
    import json

    if args.replay:
        return _replay(args)
    if not args.workload:
        raise ValueError("verify-gpu needs a WORKLOAD (conv2d-int8, resnet50-int8, phi2-decode, phi2-prefill) "
                         "or --replay FILE")
    from tvm_ext.check import verify_gpu

    doc = verify_gpu.run(args.workload, samples=args.samples, arch=args.arch, tasks=args.tasks,
                         seed=args.seed, jobs=args.jobs, image=args.image, config=args.config,
                         batch=args.batch, nvcc_cache=args.nvcc_cache, out=args.out, resume=args.resume,
                         progress=None if args.quiet else verify_gpu._progress_to_stderr)  # pylint: disable=protected-access
    if args.json:
        print(json.dumps(doc))
    else:
        print(format_table(doc))
    return 1 if doc["total"]["accepted_fails"] else 0


def format_table(doc: dict) -> str:
    """The confusion matrix per task and in total, reasons and agreement, as text."""
    from tvm_ext.check.verify_gpu_doc import REASON_NOTES
    from tvm_ext.cli.table import render

    def row(name, r):
        agree = f"{100 * r['agreement']:.1f}%" if r.get("agreement") is not None else None
        return [name[:44], r["samples"], r["accepted_compiles"], r["accepted_fails"], r["rejected_compiles"],
                r["rejected_fails"], agree]

    rows = [row(t["task"] if "workload" not in t else f"{t['workload']}:{t['task']}", t) for t in doc["tasks"]]
    tot = doc["total"]
    lines = [f"verify-gpu {doc.get('workload', '(merged)')}  arch {doc['arch']}  "
             f"{doc['samples_per_task']} samples per task",
             render(["task", "n", "acc+ok", "acc+FAIL", "rej+ok", "rej+fail", "agree"],
                    rows + [None, row("total", tot)]),
             "",
             "rejection reasons (ours): " + (", ".join(f"{k} {v}" for k, v in tot["reasons"].items()) or "none")]
    if tot["rejected_compiles_reasons"]:
        lines.append("rejected but compiles, by reason:")
        for k, v in tot["rejected_compiles_reasons"].items():
            lines.append(f"  {k:<26} {v:>5}  {REASON_NOTES.get(k, '')}")
    lines.append(f"agreement with TVM's built-in VerifyGPUCode: {tot['agree_with_builtin']}/{tot['samples']}"
                 + (f" ({100 * tot['agreement']:.1f}%)" if tot.get("agreement") is not None else ""))
    for k, v in tot["disagreements"].items():
        lines.append(f"  {k}: {v}")
    b = tot["builtin"]
    lines.append(f"built-in alone: accepted+compiles {b['accepted_compiles']}, accepted+fails {b['accepted_fails']}, "
                 f"rejected+compiles {b['rejected_compiles']}, rejected+fails {b['rejected_fails']}")
    return "\n".join(lines)


def _replay(args) -> int:
    import json
    import sys

    from tvm_ext.check.verify_gpu_replay import replay

    if args.workload:
        raise ValueError("--replay FILE takes its workloads from FILE; give no WORKLOAD with it")
    doc = replay(args.replay, tasks=args.tasks, out=args.out, resume=args.resume,
                 progress=None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True)))
    print(json.dumps(doc) if args.json else format_replay(doc))
    return 1 if doc["moved_where_nvcc_disagrees"] else 0


def format_replay(doc: dict) -> str:
    """Per task: decisions moved, reasons changed, same candidates, ms per candidate."""
    from tvm_ext.cli.table import render

    rows = [[f"{t['workload']}:{t['task']}"[:48], t["samples"], t["verdicts_moved"], t["reasons_changed"],
             "yes" if t["same_candidates_as_committed"] else "NO",
             t["ms_per_candidate"]["unstaged"], t["ms_per_candidate"]["staged"]] for t in doc["tasks"]]
    ms = doc["ms_per_candidate"]
    lines = [f"verify-gpu --replay {doc['replayed']}  arch {doc['arch']}",
             render(["task", "n", "moved", "reasons", "same", "ms whole", "ms staged"], rows, "<>>>>>>"),
             "",
             f"{doc['samples']} candidates of {doc['tasks_replayed']} tasks: {doc['verdicts_moved']} decisions moved "
             f"({doc['moved_where_nvcc_disagrees']} where nvcc disagrees with the staged one, "
             f"{doc['accepted_and_fails']} accepted-and-fails), {doc['reasons_changed']} reasons changed; "
             f"same candidates as committed: {'yes' if doc['same_candidates_as_committed'] else 'NO'}; "
             f"ms per candidate: whole {ms['unstaged']}, staged {ms['staged']}"]
    for t in doc["tasks"]:
        for m in t["moved"]:
            lines.append(f"  moved {t['task']} #{m['sample']}: whole {m['unstaged']}, staged {m['staged']}, "
                         f"nvcc {'compiles' if m['nvcc_compiles'] else 'fails'}")
    return "\n".join(lines)
