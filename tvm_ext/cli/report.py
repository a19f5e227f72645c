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
        print_report(result)
    return 0


def _us(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def _s(value) -> str:
    return "-" if value is None else f"{value:.0f}"


def print_report(result: dict) -> None:
    print(f"{result['workload']} {result['options']}  target {result['target']}  "
          f"ruleset {result['ruleset']}")
    width = max([len(t["name"]) for t in result["tasks"]] + [4])
    print(f"{'task':<{width}}  {'weight':>6}  {'trials':>6}  {'best us':>10}  {'kernels':>7}  {'tuning s':>8}")
    for t in result["tasks"]:
        kernels = "-" if t["kernels"] is None else t["kernels"]
        print(f"{t['name']:<{width}}  {t['weight']:>6}  {t['trials']:>6}  {_us(t['best_us']):>10}  "
              f"{kernels:>7}  {_s(t.get('tuning_s')):>8}")
    e2e = result["e2e_us"]
    print(f"weighted end-to-end estimate: {'-' if e2e is None else f'{e2e / 1000:.3f} ms'}"
          + ("" if e2e is not None else " (some task has no valid measurement)"))
    if result.get("tuning_s"):
        print(f"tuning time: {result['tuning_s']:.0f} s in all (wall clock, summed over runs)")
