"""``tvm-ext verify-gpu WORKLOAD``: our VerifyGPUCode vs nvcc vs TVM's built-in, per task."""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "verify-gpu", help="check VerifyGPUCode against nvcc on sampled CUDA candidates",
        description="For every task of WORKLOAD, sample candidates from tvm_ext.space(cuda target) "
                    "(random decisions, all postprocessors but VerifyGPUCode), run our VerifyGPUCode "
                    "and TVM's built-in one, compile each candidate's CUDA source with nvcc, and print "
                    "the confusion matrix per task and in total (accepted/rejected x compiles/fails), "
                    "the rejection reasons and the agreement with the built-in. No GPU needed.")
    p.add_argument("workload", help="conv2d-int8, resnet50-int8, phi2-decode or phi2-prefill")
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

    from tvm_ext.check import verify_gpu

    doc = verify_gpu.run(args.workload, samples=args.samples, arch=args.arch, tasks=args.tasks,
                         seed=args.seed, jobs=args.jobs, image=args.image, config=args.config,
                         batch=args.batch, nvcc_cache=args.nvcc_cache, out=args.out, resume=args.resume,
                         progress=None if args.quiet else verify_gpu._progress_to_stderr)  # pylint: disable=protected-access
    if args.json:
        print(json.dumps(doc))
    else:
        print(verify_gpu.format_table(doc))
    return 1 if doc["total"]["accepted_fails"] else 0
