"""The figures of a tuning work dir: the network estimate over trials and tuning time, every
task's tuning curve, the tasks' shares of the estimate, the in-network picks.

The estimate is the one ``tvm-ext report`` prints: the sum over tasks of weight x best record
(the tuner's cache-hot figure of each kernel, not the running network's time).  A task's tuning
curve is its best latency after each trial, its every measured candidate a dot beside it.
"""
from __future__ import annotations

import math

from tvm_ext.report.draw import BOUND, OURS, PEER, Drawn, new_figure, short

COLUMNS = 6  # tuning curves per row


def tuning_figures(history, summary: dict, picks_file: dict | None) -> list:
    """The work dir's figures (``Drawn``), from its ``history.History`` and ``tune.report`` summary."""
    out = [estimate_figure(history)]
    if history.tasks:
        out.append(curves_figure(history, summary))
    if summary["e2e_us"] is not None:
        out.append(shares_figure(summary))
    if picks_file is not None:
        out.append(picks_figure(picks_file))
    return [d for d in out if d is not None]


def estimate_figure(history) -> Drawn | None:
    from matplotlib.ticker import MaxNLocator

    ks, est = history.estimate_by_trials()
    if not ks:
        return None
    times, est_t = history.estimate_over_time()
    fig = new_figure(11 if times else 6, 3.4)
    axes = fig.subplots(1, 2 if times else 1, squeeze=False)[0]
    ax = axes[0]
    ax.plot(ks, [e / 1e3 for e in est], marker="o", color=OURS, label="estimate")
    ax.set_xlabel("trials per task (each task's best of its first k records)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("network estimate (ms)")
    ax.set_title(f"{est[0] / 1e3:.3f} ms after 1 trial per task \u2192 {est[-1] / 1e3:.3f} ms after {ks[-1]}")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    caption = ("Sum over tasks of weight x best measured latency (the tuner's figures of each kernel alone), "
               "as it stood after each task's first k trials.")
    if times:
        ax2 = axes[1]
        ax2.step([t / 60 for t in times], [e / 1e3 for e in est_t], where="post", color=OURS, marker=".")
        ax2.set_xlabel("tuning time (min; the logged calls summed)")
        ax2.set_ylabel("network estimate (ms)")
        ax2.set_title(f"over {times[-1] / 60:.1f} min of logged tuning")
        ax2.set_ylim(bottom=0)
        ax2.grid(alpha=0.3)
        caption += (" Right: the same estimate after each measured batch the scheduler log records; a task not "
                    "measured yet counts at its first candidate, records the logs do not cover at the start.")
    else:
        caption += " No MetaSchedule logs in this work dir (a saved database keeps none): no time axis."
    return Drawn("estimate", "Network estimate over tuning", caption, fig)


def curves_figure(history, summary: dict) -> Drawn:
    from matplotlib.ticker import MaxNLocator

    tasks = history.tasks
    rows = math.ceil(len(tasks) / COLUMNS)
    fig = new_figure(2.55 * COLUMNS, 1.9 * rows + 0.3)
    axes = fig.subplots(rows, COLUMNS, squeeze=False).ravel()
    picked = {t["name"]: t["picked_rank"] for t in summary["tasks"] if "picked_rank" in t}
    for ax, task in zip(axes, tasks):
        trials = list(range(1, len(task.seconds) + 1))
        ran = [(i, s * 1e6) for i, s in zip(trials, task.seconds) if s is not None]
        if ran:
            ax.plot(*zip(*ran), linestyle="none", marker=".", markersize=3, color="#aaaaaa", label="candidate")
        best = [(i, b * 1e6) for i, b in zip(trials, task.best_so_far()) if b is not None]
        if best:
            ax.plot(*zip(*best), drawstyle="steps-post", color=OURS, label="best")
            _plain_log_scale(ax)
        else:
            ax.text(0.5, 0.5, "no candidate ran", ha="center", va="center", transform=ax.transAxes)
        pick = f", pick rank {picked[task.name]}" if task.name in picked else ""
        ax.set_title(f"{short(task.name.removeprefix('fused_'), 40)} (x{task.weight}{pick})", fontsize=6.5)
        ax.tick_params(labelsize=6)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    for ax in axes[len(tasks):]:
        ax.set_visible(False)
    fig.supxlabel("trial", fontsize=8)
    fig.supylabel("latency (us, log scale)", fontsize=8)
    return Drawn("curves", "Tuning curve of every task",
                 "Each task's best latency after each trial (blue steps) and every candidate that ran (grey dots); "
                 "x N in the title: the task's weight, the calls of it in the network (names without 'fused_').", fig)


def _plain_log_scale(ax) -> None:
    """A log y axis (a few slow candidates do not flatten the curve) labelled 20, 50, 100, not 2x10^1."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.margins(y=0.12)
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def shares_figure(summary: dict) -> Drawn:
    rows = sorted(summary["tasks"], key=lambda t: t["weight"] * t["best_us"])
    total = summary["e2e_us"]
    fig = new_figure(10, 0.22 * len(rows) + 1.0)
    ax = fig.subplots()
    values = [t["weight"] * t["best_us"] / 1e3 for t in rows]
    colors = [PEER if "picked_rank" in t else OURS for t in rows]
    bars = ax.barh(range(len(rows)), values, color=colors)
    ax.set_yticks(range(len(rows)), [f"{short(t['name'], 44)} x{t['weight']}" for t in rows], fontsize=7)
    for bar, t in zip(bars, rows):
        share = 100 * t["weight"] * t["best_us"] / total
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {share:.1f}%", va="center", fontsize=7)
    ax.set_xlabel("weight x best latency (ms)")
    ax.set_title(f"shares of the {total / 1e3:.3f} ms estimate")
    ax.margins(x=0.12)
    caption = "What each task adds to the network estimate: its weight times its best record."
    if any("picked_rank" in t for t in rows):
        caption += " Orange: the network runs a record picked inside the network (tune --in-network), not the best."
    return Drawn("shares", "Tasks' shares of the estimate", caption, fig)


def picks_figure(picks_file: dict) -> Drawn:
    """``tune --in-network``: the network with every task's rank-j record, and the picks against the best."""
    fig = new_figure(9, 3.0)
    ax1, ax2 = fig.subplots(1, 2)
    ranks = picks_file.get("network_ms") or []
    ax1.bar([f"rank {j}" for j in range(len(ranks))], ranks, color=OURS)
    ax1.set_ylabel("network (ms, median)")
    ax1.set_title("every task on its rank-j record", fontsize=9)
    confirm = picks_file.get("confirm_ms") or {}
    pairs = [("first run", "best_records", "picks"), ("warm", "best_records_warm", "picks_warm")]
    pairs = [p for p in pairs if p[1] in confirm]
    for i, (label, best, pick) in enumerate(pairs):
        ax2.bar([i - 0.2], [confirm[best]], width=0.4, color=OURS, label="best records" if i == 0 else None)
        ax2.bar([i + 0.2], [confirm[pick]], width=0.4, color=PEER, label="with the picks" if i == 0 else None)
    ax2.set_xticks(range(len(pairs)), [p[0] for p in pairs])
    ax2.set_ylabel("network (ms)")
    ax2.set_title("picks together, side by side" if pairs else "no pick tried together", fontsize=9)
    if pairs:
        ax2.legend(fontsize=7)
    kept = picks_file.get("picks") or {}
    caption = (f"tune --in-network {picks_file.get('top_k', '')}: the network run with each task's rank-j record "
               f"(left) and the candidate picks against the best records (right); {len(kept)} pick(s) kept"
               + (": " + ", ".join(f"{n} rank {p['rank']}" for n, p in kept.items()) if kept else "") + ".")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3, axis="y")
        ax.axhline(0, color=BOUND, linewidth=0.5)
    return Drawn("picks", "In-network picks", caption, fig)
