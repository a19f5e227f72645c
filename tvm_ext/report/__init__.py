"""Report pages: a tuning work dir, a bench JSON or a generate JSON drawn as one HTML page.

``page_for(path)`` reads a work dir (``history``: every task's records in tuning order, times from
MetaSchedule's logs; ``tune.report``: bests, weights, picks) or a result JSON (``results``: its
kind and series) and draws its figures (``tuning_figures``, ``result_figures``) with matplotlib,
the optional ``[report]`` extra; ``page.write_html`` embeds them as PNG in one self-contained
file, ``page.write_pngs`` writes them alone.  What the figures show is what the text report and
the JSON hold, nothing recomputed from another source: a test reads the plotted points back.

    from tvm_ext.report import page_for, write_html
    write_html(page_for("tvm_ext_work/resnet50-int8-nchwc-llvm-plugin"), "report.html")
"""
from __future__ import annotations

import os

from tvm_ext.report.draw import INSTALL, Drawn, PlottingMissing, require_matplotlib
from tvm_ext.report.page import Page, html_of, write_html, write_pngs
from tvm_ext.report.results import UnknownResult


def page_for(path: str) -> Page:
    """The page of a work dir or a result JSON; one-line ValueError for anything else
    (``PlottingMissing`` without matplotlib, ``UnknownResult``, ``DatabaseMismatch``)."""
    require_matplotlib()
    if os.path.isdir(path):
        return work_dir_page(path)
    if not os.path.exists(path):
        raise ValueError(f"{path}: no such work dir or JSON file")
    return result_page(path)


def work_dir_page(work_dir: str) -> Page:
    from tvm_ext import tune as tuning
    from tvm_ext.report.history import read_history
    from tvm_ext.report.tuning_figures import tuning_figures
    from tvm_ext.tune.picks import PICKS_FILE

    summary = tuning.report(work_dir)
    history = read_history(work_dir)
    picks = None
    if os.path.exists(os.path.join(work_dir, PICKS_FILE)):
        from tvm_ext.report.results import load

        picks = load(os.path.join(work_dir, PICKS_FILE))
    meta, target = history.meta, summary["target_detail"]
    e2e = summary["e2e_us"]
    facts = [("workload", f"{summary['workload']} {summary['options']}"), ("rule set", summary["ruleset"]),
             ("target", ", ".join(f"{k} {v}" for k, v in target.items() if k not in ("keys", "tag") and v != "")),
             ("tuned on", f"{target.get('mcpu') or target.get('arch') or 'this host'}, "
                          f"{meta.get('threads', '?')} measuring threads (created {meta.get('created', '?')})"),
             ("tasks", f"{len(summary['tasks'])}, {sum(t['trials'] for t in summary['tasks'])} records"),
             ("estimate", "-" if e2e is None else f"{e2e / 1e3:.3f} ms (sum of weight x best record)"),
             ("tuning time", f"{summary['tuning_s']:.0f} s (wall clock, summed over runs)")]
    header = ["task", "weight", "trials", "best us", "share %", "kernels", "tuning s", "picked rank"]
    rows = [[t["name"], t["weight"], t["trials"], _fixed(t["best_us"], 1),
             _fixed(None if e2e is None else 100 * t["weight"] * t["best_us"] / e2e, 1), t["kernels"],
             _fixed(t.get("tuning_s"), 0), t.get("picked_rank", "")] for t in summary["tasks"]]
    return Page(f"Tuning report: {work_dir}", facts, tuning_figures(history, summary, picks), (header, rows))


def result_page(path: str) -> Page:
    from tvm_ext.report import results as R
    from tvm_ext.report.result_figures import result_figures

    doc = R.load(path)
    kind = R.check_kind(doc, path)
    first = doc[0] if isinstance(doc, list) else doc
    facts = [("result", f"{os.path.basename(path)} ({kind})"), ("machine", R.machine(doc))]
    for key in ("workload", "target", "threads", "rounds", "warm_runs", "trials_per_task", "trials_per_kernel",
                "context", "prompt", "tokens", "bandwidth_gbs", "vnni_peak_tops", "int8_peak_form", "int8_peak_tops"):
        if first.get(key) is not None and not isinstance(first[key], (dict, list)):
            facts.append((key.replace("_", " "), _fact(first[key])))
    return Page(f"{kind}: {os.path.basename(path)}", facts, result_figures(doc, kind))


def _fact(value) -> str:
    """A JSON value in words: floats to 4 significant digits, a target's JSON text as its fields."""
    import json

    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str) and value.startswith("{"):
        try:
            value = json.loads(value)
        except ValueError:
            return value
        return ", ".join(f"{k} {v}" for k, v in value.items() if k not in ("keys", "tag") and v != "")
    return str(value)


def _fixed(value, digits):
    return None if value is None else f"{value:.{digits}f}"


__all__ = ["INSTALL", "Drawn", "Page", "PlottingMissing", "UnknownResult", "html_of", "page_for",
           "require_matplotlib", "result_page", "work_dir_page", "write_html", "write_pngs"]
