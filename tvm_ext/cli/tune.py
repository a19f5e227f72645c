"""``tvm-ext tune``: tune every task of a workload into a resumable JSON database."""
from __future__ import annotations

import contextlib
import os
import signal
import sys

from tvm_ext.cli.common import add_workload_args, check_device, check_workload_name, count, log, workload_key

from tvm_ext.tune.database import SAVED_ROOT as COMMITTED_ROOT, WORK_ROOT


def add_parser(sub) -> None:
    p = sub.add_parser(
        "tune", help="tune a workload's tasks into a MetaSchedule JSON database",
        description="Extract the workload's fused tasks and tune each with MetaSchedule into a "
                    "JSON database in the work dir. Running the same command again resumes: "
                    "each task is tuned only up to --trials records. Ctrl-C stops after the "
                    "current measurement batch (twice: at once); Ctrl-C or a kill leaves a "
                    "valid database. A database committed in tuning_logs/ for the same workload "
                    "and rule set is the starting point when it was tuned for exactly this "
                    "target (CPU); otherwise tuning starts from scratch, and says why.")
    add_workload_args(p)
    p.add_argument("--trials", type=count, default=8,
                   help="trials per task (default 8: ResNet-50's 31 tasks took ~8 min on 2 cores; "
                        "64 or more for good schedules)")
    p.add_argument("--ruleset", default="plugin",
                   help="plugin (ours, default), no-inline-const (ours without "
                        "InlineConstantScalars) or upstream (TVM's built-in rules)")
    p.add_argument("--work-dir", default=None,
                   help=f"database directory (default {WORK_ROOT}/<workload>-<target>-<ruleset>/)")
    p.add_argument("--rpc-tracker", default=None, metavar="HOST:PORT",
                   help="measure through TVM's RPC tracker instead of locally")
    p.add_argument("--rpc-key", default=None, help="device key registered at the RPC tracker")
    p.add_argument("--cluster", default=None, metavar="tls://HOST:PORT",
                   help="tune the tasks on a Dask cluster (whole tasks per node, one database here; needs the "
                        "[cluster] extra and --cluster-credentials; see 'tvm-ext cluster --help')")
    p.add_argument("--cluster-credentials", default=os.environ.get("TVM_EXT_CLUSTER_CREDENTIALS"), metavar="DIR",
                   help="the cluster's TLS credentials ('tvm-ext cluster credentials DIR'; default "
                        "$TVM_EXT_CLUSTER_CREDENTIALS)")
    p.add_argument("--allow-mixed-cpus", action="store_true",
                   help="with --cluster: also time on nodes whose CPU is not the target's mcpu (by default they "
                        "are refused: their timings would be taken as this CPU's); each record's node is kept")
    p.add_argument("--task-deadline", type=float, default=None, metavar="SECONDS",
                   help="with --cluster: a task with no result after this long is cancelled and tuned on another "
                        "node (default 300 s + 60 s per trial)")
    p.add_argument("--build-only", action="store_true",
                   help="no device needed: generate, postprocess and compile candidates (nvcc for "
                        "cuda) and report kernels of the best-by-cost-model candidate per task")
    p.add_argument("--candidates", type=count, default=16,
                   help="candidates per task with --build-only (default 16)")
    p.add_argument("--per-iter", type=count, default=8,
                   help="candidates measured per search iteration; the database is written after "
                        "each, so it bounds what an interruption loses (default 8)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also show TVM's own INFO logging (always in WORK_DIR/logs/)")
    p.add_argument("--compare", choices=("none", "ort", "auto"), default="none",
                   help="after tuning an int8 network on llvm: compile it with the tuned schedules, "
                        "check it bit-exactly against NumPy and time it against ONNX Runtime on "
                        "the same network, interleaved ('ort' needs the [bench] extra; 'auto': "
                        "when onnxruntime is installed; default none)")
    p.add_argument("--reuse-schedules", action="store_true",
                   help="tasks whose TIR changed since the work dir was tuned (same task name: e.g. a "
                        "workload's epilogue computed another way) start from their old best schedule, "
                        "replayed on the new TIR and measured, instead of from nothing")
    p.add_argument("--in-network", type=int, default=0, metavar="K",
                   help="after tuning an int8 network on llvm: time every task's K best records inside the "
                        "running network (K compiled networks, each checked against NumPy, ~1 min each for "
                        "ResNet-50 on 2 cores), keep a lower-ranked one where it runs 5 %% faster there, and keep "
                        "the picks if the network runs faster with them, side by side; later compiles of the "
                        "work dir use them (default 0: none)")
    p.add_argument("--json", action="store_true", help="print the resulting report as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    import json

    from tvm_ext import tune as tuning
    from tvm_ext.cli.common import load_workload, target_of
    from tvm_ext.cli.report import format_report, page_command
    from tvm_ext.rulesets import check_ruleset

    check_workload_name(args.workload)
    check_ruleset(args.ruleset)
    if args.in_network:  # before minutes of tuning
        from tvm_ext.bench.in_network import check_top_k

        check_top_k(args.in_network)
    target = target_of(args)  # resolved once; builtin_name and load_workload reuse it
    if args.build_only:
        return run_build_only(args, target)
    client = None
    if args.cluster and args.reuse_schedules:
        raise ValueError("--reuse-schedules runs on this machine: use it without --cluster first, then resume on "
                         "the cluster")
    if args.cluster:
        from tvm_ext.cli.cluster import connect

        client = connect(args.cluster, args.cluster_credentials)  # one line when it cannot
    elif args.rpc_tracker is None:
        check_device(target, "tuning")
    # an RPC runner is made (and its arguments checked) before any work; the local one is started by
    # tuning.tune when a task has trials left
    runner = None if client or args.rpc_tracker is None else tuning.make_runner(args.rpc_tracker, args.rpc_key)
    work_dir = args.work_dir or tuning.default_work_dir(workload_key(args), target, args.ruleset, root=WORK_ROOT)
    fresh = not _nonempty(work_dir)
    if not fresh:
        tuning.read_meta(work_dir)  # refuse a directory that is not a database before building
    workload = load_workload(args)
    transfer_from = None
    if fresh and args.work_dir is None:
        transfer_from = start_from_committed(args, target, work_dir, workload.options, workload.name,
                                             transfer=client is None)
    log(f"tuning into {work_dir} ({args.ruleset}, {args.trials} trials per task, target "
        f"{target.kind.name})")
    # stdout carries only the result (JSON or table); TVM's loggers print to stdout
    with interrupt_guard() as interrupted, contextlib.redirect_stdout(sys.stderr):
        try:
            if client is not None:
                from tvm_ext.cluster.tune import tune_on_cluster

                result = tune_on_cluster(workload, target, work_dir, args.trials, client, args.ruleset,
                                         rpc=(args.rpc_tracker, args.rpc_key), log=log, per_iter=args.per_iter,
                                         should_stop=interrupted, allow_mixed_cpus=args.allow_mixed_cpus,
                                         task_deadline_s=args.task_deadline)
            else:
                result = tuning.tune(workload, target, work_dir, args.trials, args.ruleset, runner,
                                     log=log, per_iter=args.per_iter, should_stop=interrupted,
                                     verbose=args.verbose, reuse_schedules=args.reuse_schedules,
                                     transfer_from=transfer_from)
        except BaseException:  # the stop arrives wrapped in TVM's error types
            if not interrupted():
                raise
            tuning.repair_database(work_dir, log)
            log(f"interrupted: the database in {work_dir} is valid; run the same command to resume")
            # TVM's worker pools can re-raise the interrupt while the interpreter shuts down,
            # turning exit code 130 into death by SIGINT; the database is safe, so leave now.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
    if args.in_network:
        result["in_network"] = pick_in_network(args, workload, target, work_dir)
    comparison = compare_with_ort(args, workload, target, work_dir)
    if comparison is not None:
        result["compare"] = comparison
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(format_report(result))
        if comparison is not None:
            from tvm_ext.cli.bench import format_int8

            print(format_int8(comparison))
        print(page_command(work_dir))
    return 0


def pick_in_network(args, workload, target, work_dir: str) -> dict:
    """``--in-network K``: the picks of ``bench.in_network`` for an int8 network on llvm."""
    from tvm_ext.bench.in_network import pick_in_network as pick

    if target.kind.name != "llvm" or not workload.name.startswith(("resnet50-int8", "conv2d-int8", "onnx-")):
        raise ValueError("--in-network is for the int8 networks on llvm (resnet50-int8*, conv2d-int8, an .onnx file)")
    return pick(workload, target, work_dir, top_k=args.in_network, log=log)


def compare_with_ort(args, workload, target, work_dir: str):
    """The tuned network against ONNX Runtime on the same network (int8 workloads on llvm),
    or None when not asked for / not possible (saying why)."""
    import importlib.util

    if args.compare == "none" or not workload.name.startswith(("resnet50-int8", "conv2d-int8")):
        return None
    if target.kind.name != "llvm":
        return None
    if importlib.util.find_spec("onnxruntime") is None:
        if args.compare == "ort":
            raise ValueError("--compare ort needs onnxruntime: pip install -e '.[bench]'")
        log("no comparison with ONNX Runtime: it is not installed (pip install -e '.[bench]')")
        return None
    from tvm_ext.bench import int8 as bench_int8

    root, name = os.path.split(os.path.normpath(work_dir))
    if name != os.path.basename(tuning_default(args, workload, target)):
        log("no comparison with ONNX Runtime: --work-dir has not the default name; "
            f"use tvm-ext bench {args.workload} --from-logs --peers ort --logs-dir ...")
        return None
    return bench_int8.run(workload, target, [args.ruleset], None, True, 10, None, log=log,
                          work_root=root, peers=["ort"])


def tuning_default(args, workload, target) -> str:
    from tvm_ext import tune as tuning

    return tuning.default_work_dir(workload.name, target, args.ruleset)


@contextlib.contextmanager
def interrupt_guard():
    """First Ctrl-C: remember it, and tuning stops after the current measurement batch
    (see tuning.stop_callback). Second Ctrl-C: stop at once. Yields the flag as a callable."""
    seen = []

    def on_sigint(signum, frame):
        seen.append(signum)
        if len(seen) == 1:
            print("stopping after the current measurement batch (Ctrl-C again to stop now)",
                  file=sys.stderr, flush=True)
            return
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield lambda: bool(seen)
    finally:
        signal.signal(signal.SIGINT, previous)


def _nonempty(path: str) -> bool:
    return os.path.isdir(path) and bool(os.listdir(path))


def start_from_committed(args, target, work_dir: str, options: dict, key: str, transfer: bool = True) -> str | None:
    """The saved database for this workload and rule set (``tune.save.find_saved``): copied into
    the new work dir when it was tuned for exactly this target; returned (to transfer its best
    schedules from, each measured here) when it was tuned on the closest other CPU whose
    instructions this one has; otherwise None, saying why tuning starts from scratch."""
    import shutil

    from tvm_ext.targets import target_mismatch
    from tvm_ext.tune.database import measuring_threads
    from tvm_ext.tune.save import find_saved

    saved, exact = find_saved(key, args.ruleset, options, target, root=COMMITTED_ROOT)
    if saved is None:
        if exact != "no saved database of this workload and rule set":
            log(f"not reusing a saved database: {exact}; tuning for this machine from scratch")
        return None
    if exact:
        from tvm_ext.tune import packed

        shutil.copytree(saved, work_dir, ignore=shutil.ignore_patterns("logs"), dirs_exist_ok=True)
        packed.unpack(work_dir)  # a work dir is plain JSON: this run and later ones append to it
        log(f"starting from the records saved in {saved} (tuned for this target)")
        return None
    from tvm_ext import tune as tuning

    meta = tuning.read_meta(saved)
    mcpu = meta["target"].get("mcpu")
    if target_mismatch(meta["target"], target) is None:  # the same CPU, another thread count
        threads = meta.get("threads")
        where = f"measured on {threads or 'an unrecorded number of'} threads, this run uses {measuring_threads()}"
    else:
        where = f"tuned on another CPU ({mcpu})"
    if not transfer:
        log(f"not reusing {saved}: {where} (a cluster run tunes from scratch)")
        return None
    log(f"{saved} was {where}: its best schedules start this run, each measured here first")
    return saved


def run_build_only(args, target) -> int:
    import json

    from tvm_ext import tune as tuning
    from tvm_ext.cli.common import load_workload

    from tvm_ext.check.build_only import build_only
    workload = load_workload(args)
    tasks = tuning.extract_tasks(workload, target)
    rows = build_only([(t.name, t.mod) for t in tasks], target, args.ruleset, args.candidates, log)
    if args.json:
        print(json.dumps({"workload": args.workload, "target": target.kind.name,
                          "ruleset": args.ruleset, "tasks": rows}, indent=1))
    else:
        for row in rows:
            print("  ".join(f"{k}={v}" for k, v in row.items()))
    return 0
