"""``tvm-ext report``: what a tuning database holds, per task and end to end."""
from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="summarize a tuning database",
                       description="Print per task: name, weight, trials, best latency and "
                                   "kernels in the best schedule (device kernels on cuda, "
                                   "top-level loop nests on llvm), and the weighted end-to-end "
                                   "estimate.")
    p.add_argument("work_dir", metavar="DIR", help="a work dir written by 'tvm-ext tune'")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=run)


def run(args) -> int:
    import json

    from tvm_ext import tune as tuning

    result = tuning.report(args.work_dir)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(format_report(result))
    return 0


def _fixed(value, digits: int):
    return None if value is None else f"{value:.{digits}f}"


def format_report(result: dict) -> str:
    """A tuning database's report (``tune.report``) as text: one row per task, then the
    weighted end-to-end estimate."""
    from tvm_ext.cli.table import render

    rows = [[t["name"], t["weight"], t["trials"], _fixed(t["best_us"], 1), t["kernels"], _fixed(t.get("tuning_s"), 0)]
            for t in result["tasks"]]
    header = ["task", "weight", "trials", "best us", "kernels", "tuning s"]
    if any("node" in t for t in result["tasks"]):  # tuned on a cluster: which node tuned each task
        header.append("node")
        rows = [row + [t.get("node")] for row, t in zip(rows, result["tasks"])]
    e2e = result["e2e_us"]
    lines = [f"{result['workload']} {result['options']}  target {result['target']}  ruleset {result['ruleset']}",
             render(header, rows),
             f"weighted end-to-end estimate: {'-' if e2e is None else f'{e2e / 1000:.3f} ms'}"
             + ("" if e2e is not None else " (some task has no valid measurement)")]
    if result.get("tuning_s"):
        lines.append(f"tuning time: {result['tuning_s']:.0f} s in all (wall clock, summed over runs)")
    picked = [f"{t['name']} (rank {t['picked_rank']})" for t in result["tasks"] if "picked_rank" in t]
    if picked:
        lines.append(f"{len(picked)} tasks run a record picked inside the network (tune --in-network), not their "
                     f"best: {', '.join(picked)}")
    return "\n".join(lines)
