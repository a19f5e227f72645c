"""``tvm-ext bench-cluster``: how cluster tuning scales, 1 and 2 single-core nodes and the local run."""
from __future__ import annotations

from tvm_ext.cli.common import count, log


def add_parser(sub) -> None:
    p = sub.add_parser("bench-cluster", help="wall time of tuning one workload on 1 and 2 single-core cluster "
                                             "nodes and locally on one core",
                       description="Tune the same workload and budget, from an empty work dir each time: the plain "
                                   "local command pinned to one core, then a local Dask cluster (TLS, loopback) of "
                                   "1 and of 2 worker nodes, each pinned to its own core with one builder process "
                                   "and TVM's thread pool at 1. Prints wall seconds and the speed-up, checks every "
                                   "run ends with the same tasks at the same budget, fits the scaling model and "
                                   "writes JSON (default tvm_ext_work/bench-cluster-<workload>-llvm.json). Needs "
                                   "the [cluster] extra, taskset, and a quiet machine: it takes ~20 min for "
                                   "resnet50-int8 at 8 trials on 2 cores.")
    p.add_argument("workload", nargs="?", default="resnet50-int8", help="a built-in workload (default resnet50-int8)")
    p.add_argument("--trials", type=count, default=8, help="trials per task (default 8)")
    p.add_argument("--nodes", default="1,2", help="comma-separated node counts (default 1,2)")
    p.add_argument("--no-local", action="store_true", help="skip the local run")
    p.add_argument("--out", default=None, help="JSON path")
    p.set_defaults(func=run)


def run(args) -> int:
    import os
    import shutil

    from tvm_ext.bench.cluster import run as bench
    from tvm_ext.cli.common import check_workload_name
    from tvm_ext.cli.table import render
    from tvm_ext.tune.database import WORK_ROOT

    check_workload_name(args.workload)
    nodes = [int(n) for n in args.nodes.split(",") if n.strip()]
    if 1 not in nodes or any(n < 1 for n in nodes):
        raise ValueError(f"--nodes must include 1 (the baseline) and be positive, not {args.nodes!r}")
    if shutil.which("taskset") is None:
        raise ValueError("bench-cluster pins every node to one core with taskset (util-linux), which is missing")
    out = args.out or os.path.join(WORK_ROOT, f"bench-cluster-{args.workload}-llvm.json")
    result = bench(args.workload, args.trials, nodes, not args.no_local, out, log=log)
    rows = [[r["run"], r["nodes"], f"{r['wall_s']:.0f}", f"{r['speedup_vs_1_node']:.2f}", f"{r['task_s_sum']:.0f}",
             f"{r['longest_task_s']:.0f}", r["trials"], r["e2e_estimate_ms"]] for r in result["rows"]]
    print(f"{result['workload']}, {result['tasks']} tasks x {result['trials_per_task']} trials, target "
          f"{result['target']}; task extraction {result['extract_s']} s")
    print(render(["run", "nodes", "wall s", "speed-up", "task s", "longest", "trials", "est. ms"], rows))
    m = result["model"]
    print(f"model {m['formula']}: serial {m['serial_s']} s; predicted wall s "
          + ", ".join(f"{n} nodes {s}" for n, s in m["predicted_wall_s"].items()))
    return 0
