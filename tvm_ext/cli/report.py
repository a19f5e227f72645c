"""``tvm-ext report``: what a tuning database holds, per task and end to end."""
from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="summarize a tuning database; draw it, or a bench/generate JSON, as a page",
                       description="Print per task: name, weight, trials, best latency and "
                                   "kernels in the best schedule (device kernels on cuda, "
                                   "top-level loop nests on llvm), and the weighted end-to-end "
                                   "estimate. With --html/--png (the [report] extra: matplotlib): draw the "
                                   "work dir (the estimate over trials and tuning time, every task's tuning "
                                   "curve with its weight, the tasks' shares, the in-network picks, target and "
                                   "CPU) or a JSON of 'tvm-ext bench' or 'tvm-ext generate' (runtimes per round "
                                   "beside the peers, kernels against their bandwidth bound or vpdpbusd peak) "
                                   "as one self-contained HTML page, figures embedded, no network needed.")
    p.add_argument("work_dir", metavar="DIR|FILE.json",
                   help="a work dir written by 'tvm-ext tune', or (with --html/--png) a JSON written by "
                        "'tvm-ext bench' or 'tvm-ext generate'")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--html", metavar="OUT.html", default=None, help="write the page with every figure to OUT.html")
    p.add_argument("--png", metavar="DIR", default=None,
                   help="write every figure as DIR/<name>-<figure>.png (<name>: the work dir's or JSON's)")
    p.set_defaults(func=run)


def run(args) -> int:
    import json
    import os

    from tvm_ext import tune as tuning

    if args.html or args.png:
        if args.json:
            raise ValueError("--json prints the text report's data; draw with --html/--png without it")
        return draw(args.work_dir, args.html, args.png)
    if os.path.isfile(args.work_dir):
        raise ValueError(f"{args.work_dir} is a file: a JSON of bench or generate is drawn, add --html OUT.html "
                         "or --png DIR")

    result = tuning.report(args.work_dir)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(format_report(result))
    return 0


def draw(path: str, html: str | None, png_dir: str | None) -> int:
    """``--html``/``--png``: the page of a work dir or a result JSON (``tvm_ext.report``)."""
    import os

    from tvm_ext.cli.common import log
    from tvm_ext.report import page_for, require_matplotlib, write_html, write_pngs

    require_matplotlib()  # one line before any work when the [report] extra is missing
    page = page_for(path)
    if html:
        log(f"wrote {write_html(page, html)} ({len(page.figures)} figures)")
    if png_dir:
        name = os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
        for written in write_pngs(page, png_dir, name):
            log(f"wrote {written}")
    return 0


def page_command(path: str) -> str:
    """The line naming the command that draws ``path``'s page (``tvm-ext tune`` ends with it)."""
    import importlib.util
    import os

    name = os.path.basename(os.path.normpath(path))
    extra = "" if importlib.util.find_spec("matplotlib") else ' (first: pip install "tvm_ext[report]")'
    return f"tuning curves, shares and estimate as a page: tvm-ext report {path} --html {name}.html{extra}"


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
