"""The figures of a bench or generate JSON (``results`` says what each kind holds): runtimes side by
side per round with the peers beside ours, kernels against their bound (bandwidth bound, the
``vpdpbusd`` peak for the prompt's GEMMs)."""
from __future__ import annotations

import statistics

from tvm_ext.report import results as R
from tvm_ext.report.draw import BOUND, OURS, PEER, Drawn, label_bars, new_figure, short

PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#17becf", "#8c564b", "#e377c2")
PEER_PALETTE = ("#ff7f0e", "#d62728", "#bcbd22", "#7f7f7f")


def result_figures(doc, kind: str) -> list:
    return {"bench-int8": int8_figures, "bench-phi2": phi2_figures, "generate": decode_figures,
            "generate-prompt": prompt_figures}[kind](doc)


def _colors(names, peers):
    """One colour per series: blues/greens for ours, oranges/reds for the peers."""
    ours, theirs, out = iter(PALETTE * 4), iter(PEER_PALETTE * 4), {}
    for name in names:
        out[name] = next(theirs) if name in peers else next(ours)
    return out


def _spread(ax, x, values, color, label=None):
    """Every sample of one series as a dot at ``x`` (slightly spread) and its median as a bar."""
    n = len(values)
    xs = [x + 0.12 * ((i / (n - 1)) - 0.5) if n > 1 else x for i in range(n)]
    ax.plot(xs, values, linestyle="none", marker="o", markersize=4, color=color, alpha=0.75, label=label)
    ax.plot([x - 0.15, x + 0.15], [statistics.median(values)] * 2, color="black", linewidth=1.5)


def int8_figures(doc) -> list:
    nets = R.int8_networks(doc)
    names = [n["name"] for n in nets]
    colors = _colors(names, [n["name"] for n in nets if n["peer"]])
    warm = any(n["warm_ms"] is not None for n in nets)
    rounds = all(n["first_rounds"] for n in nets)
    fig = new_figure(max(6, 1.5 * len(nets) + 3), 3.6)
    ax = fig.subplots()
    for i, n in enumerate(nets):
        if rounds:
            _spread(ax, i - 0.2 if warm else i, n["first_rounds"], colors[n["name"]])
            if n["warm_rounds"]:
                _spread(ax, i + 0.2, n["warm_rounds"], colors[n["name"]])
        else:
            ax.bar([i - 0.2 if warm else i], [n["first_ms"]], width=0.38, color=colors[n["name"]])
            if n["warm_ms"] is not None:
                ax.bar([i + 0.2], [n["warm_ms"]], width=0.38, color=colors[n["name"]], alpha=0.55, hatch="//")
        base = nets[0]
        ratio = n["first_ms"] / base["first_ms"]
        ax.text(i, n["first_ms"], f"{n['first_ms']:.3g}\n{ratio:.2f}x", ha="center", va="bottom", fontsize=7)
    if warm:
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color="#888888", label="first run of the turn (left)"),
                           Patch(facecolor="#cccccc", hatch="//" if not rounds else None,
                                 label=f"warm: the {doc.get('warm_runs')} runs after it (right)")],
                  fontsize=7, loc="upper left")
    ticks = [f"{n['name']}\n({'peer' if n['peer'] else 'rule set'})" for n in nets]
    ax.set_xticks(range(len(nets)), ticks, fontsize=8)
    ax.set_ylabel("network time (ms)")
    ax.set_ylim(0, max(max((n["first_rounds"] or [n["first_ms"]]) + (n["warm_rounds"] or [n["warm_ms"] or 0]))
                       for n in nets) * 1.25)
    ax.grid(alpha=0.3, axis="y")
    how = (f"each dot one of {doc['rounds']} interleaved rounds, black: the median" if rounds
           else f"medians of {doc['rounds']} interleaved rounds (this JSON holds no per-round times)")
    pair = (f"; left of each pair: the first run of its turn, right{'' if rounds else ' (hatched)'}: warm, "
            f"the {doc.get('warm_runs')} runs after it" if warm else "")
    peers = " beside the peers (orange/red)" if any(n["peer"] for n in nets) else ""
    ax.set_title(f"{doc['workload']} on {doc['target']}: tvm_ext's rule sets (blue/green){peers}", fontsize=9)
    out = [Drawn("runtimes", "Runtimes, ours beside the peers",
                 f"{how}{pair}. Labels: the first run's median and its ratio to {nets[0]['name']}.", fig)]
    if rounds:
        out.append(_rounds_figure(nets, colors, doc))
    if doc.get("breakdown"):
        out.append(_breakdown_figure(doc["breakdown"]))
    if doc.get("per_layer"):
        out.append(_per_layer_figure(doc["per_layer"]))
    return out


def _rounds_figure(nets, colors, doc) -> Drawn:
    fig = new_figure(8, 3.2)
    ax = fig.subplots()
    for n in nets:
        ax.plot(range(1, len(n["first_rounds"]) + 1), n["first_rounds"], marker="o", markersize=3,
                color=colors[n["name"]], label=n["name"])
    ax.set_xlabel("round")
    ax.set_ylabel("first run of the turn (ms)")
    ax.set_ylim(bottom=0)
    outside_legend(ax)
    ax.grid(alpha=0.3)
    return Drawn("rounds", "Every round", "Each network's first run in each interleaved round: a host's slow "
                 "phase moves every line together, a lead that holds in every round is a lead.", fig)


def _breakdown_figure(found) -> Drawn:
    tasks = sorted(found["tasks"], key=lambda t: -t["in_network_ms"])
    fig = new_figure(10, 0.22 * len(tasks) + 1.2)
    ax = fig.subplots()
    y = range(len(tasks))
    ax.barh([i + 0.2 for i in y], [t["record_ms"] or 0 for t in tasks], height=0.4, color="#aaaaaa",
            label="its tuning record x calls")
    bars = ax.barh([i - 0.2 for i in y], [t["in_network_ms"] for t in tasks], height=0.4, color=OURS,
                   label="inside the network")
    label_bars(ax, bars, [f"{t['ratio']:.2f}x" if t.get("ratio") else "" for t in tasks])
    ax.set_yticks(list(y), [f"{short(t['task'], 44)} x{t['calls']}" for t in tasks], fontsize=7)
    ax.set_xlabel("ms per network run")
    ax.invert_yaxis()
    outside_legend(ax)
    ax.set_title(f"network {found['network_ms']:.3f} ms = kernels {found['kernels_ms']:.3f} + between "
                 f"{found['outside_ms']:.3f}; records sum to {found['estimate_ms']:.3f}", fontsize=9)
    return Drawn("breakdown", "Each kernel inside the network against its record",
                 f"{found['runs']} runs with every kernel timed (medians): blue, the task's kernels inside the "
                 "running network; grey, its tuning record times its calls; label: the ratio.", fig)


def _per_layer_figure(rows) -> Drawn:
    rows = sorted(rows, key=lambda r: -r["tvm_us"] * r["count"])
    fig = new_figure(10, 0.24 * len(rows) + 1.2)
    ax = fig.subplots()
    y = range(len(rows))
    bars = ax.barh([i - 0.2 for i in y], [r["tvm_us"] for r in rows], height=0.4, color=OURS, label="tvm_ext")
    ax.barh([i + 0.2 for i in y], [r["ort_us"] for r in rows], height=0.4, color=PEER, label="ORT QLinearConv")
    label_bars(ax, bars, [f"{r['tvm_us'] / r['ort_us']:.2f}x" for r in rows])
    ax.set_yticks(list(y), [f"{r['shape']} x{r['count']}" for r in rows], fontsize=7)
    ax.set_xlabel("us per call")
    ax.invert_yaxis()
    outside_legend(ax)
    return Drawn("per_layer", "Every conv shape against one ONNX Runtime QLinearConv",
                 "Per conv task of the first rule set's database: ours (blue) and ORT's QLinearConv of the same "
                 "shape (orange), same threads; label: ours / ORT.", fig)


def _against_bound(ax, names, series: dict, bounds, colors, unit="ms", ratios=None):
    """Horizontal grouped bars, one group per name (the first on top), one bar per series, the bound as a
    black tick; the last series' bars labelled with their ratio to the bound (``ratios``: their own)."""
    k = len(series)
    height = 0.8 / max(k, 1)
    bars = None
    for j, (label, values) in enumerate(series.items()):
        ys = [i - 0.4 + height * (j + 0.5) for i in range(len(names))]
        bars = ax.barh(ys, [v if v is not None else 0 for v in values], height=height, color=colors[label],
                       label=label)
    ax.plot(bounds, range(len(names)), linestyle="none", marker="|", markersize=14, markeredgewidth=2.5,
            color="black", label="bound")
    if bars is not None:
        last = list(series.values())[-1]
        ratios = ratios or [v / b if v and b else None for v, b in zip(last, bounds)]
        label_bars(ax, bars, [f"{r:.2f}x" if r else "" for r in ratios])
    ax.set_yticks(range(len(names)), [short(n, 40) for n in names], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    top = max((v for values in series.values() for v in values if v), default=1.0)
    ax.set_xlim(right=top * 3)  # room for the labels
    ax.set_xlabel(unit + " (log scale)")
    outside_legend(ax)
    ax.grid(alpha=0.3, axis="x")


def outside_legend(ax) -> None:
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def phi2_figures(doc) -> list:
    out = []
    layers = R.phi2_layers(doc)
    fig = new_figure(8, 0.3 * len(layers) + 1.2)
    ax = fig.subplots()
    bars = ax.barh(range(len(layers)), [ms for _, ms, _ in layers], color=OURS, label="layer")
    ax.plot([b for _, _, b in layers], range(len(layers)), linestyle="none", marker="|", markersize=14,
            markeredgewidth=2.5, color="black", label="bandwidth bound")
    label_bars(ax, bars, [f"{ms / b:.2f}x bound" for _, ms, b in layers])
    ax.set_yticks(range(len(layers)), [n for n, _, _ in layers], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(right=max(ms for _, ms, _ in layers) * 4)  # room for the labels
    ax.set_xlabel("ms per decoder layer, weights from DRAM (log scale)")
    ax.invert_yaxis()
    outside_legend(ax)
    out.append(Drawn("layers", "One decoder layer per schedule against its bandwidth bound",
                     f"{doc['workload']} on {doc['target']}, copy bandwidth {doc['bandwidth_gbs']:.1f} GB/s: the bound "
                     "is the layer's bytes at that bandwidth (black tick).", fig))
    names, by_schedule = R.phi2_kernels(doc, "on")
    if names:
        fig = new_figure(10, 0.28 * len(names) * max(1, len(by_schedule) / 2) + 1.2)
        ax = fig.subplots()
        colors = _colors(by_schedule, ())
        bounds = [b for _, b in next(iter(by_schedule.values()))]
        _against_bound(ax, names, {s: [ms for ms, _ in v] for s, v in by_schedule.items()}, bounds, colors)
        out.append(Drawn("kernels", "Every fused kernel against its bandwidth bound",
                         "ms per layer of each kernel (fusion on) per schedule, weights cycled through copies larger "
                         "than the last-level cache; black tick: its bytes at the copy bandwidth.", fig))
    projections = R.phi2_projections(doc)
    if projections:
        sources = []
        for entries in projections.values():
            sources += [s for s, _, _, _ in entries if s not in sources]
        peers = {s for entries in projections.values() for s, _, _, p in entries if p}
        colors = _colors(sources, peers)
        fig = new_figure(10, 0.35 * len(projections) * max(1, len(sources) / 2) + 1.2)
        ax = fig.subplots()
        series = {s: [next((ms for n, ms, _, _ in projections[p] if n == s), None) for p in projections]
                  for s in sources}
        bounds = [min(b for _, _, b, p in projections[q] if b and not p) for q in projections]
        _against_bound(ax, list(projections), series, bounds, colors)
        out.append(Drawn("projections", "Each projection, ours beside the peers",
                         "ms per call from DRAM: our schedules (blue/green) and the peers (orange/red: ONNX Runtime "
                         "MatMulNBits accuracy_level 0 / 4, PyTorch) on the same q4 weights; black tick: the q4 "
                         "kernel's bytes at the copy bandwidth.", fig))
    return out


def decode_figures(doc) -> list:
    """A decode result's figures; one set per context where it holds several (``generate --context A,B``)."""
    groups = R.by_context(doc)
    if len(groups) == 1:
        return _decode_figures(groups[0])
    out = []
    for rows in groups:
        for d in _decode_figures(rows):
            out.append(Drawn(f"{d.name}-context{rows[0]['context']}", f"{d.title} (context {rows[0]['context']})",
                             d.caption, d.figure))
    return out


def _decode_figures(doc) -> list:
    rounds = R.decode_rounds(doc)
    peer_names = [name for name, _ in rounds["peers"]]
    colors = _colors(list(rounds["rows"]) + peer_names, peer_names)
    fig = new_figure(9, 3.6)
    ax = fig.subplots()
    for name, values in rounds["rows"].items():
        ax.plot(range(1, len(values) + 1), values, marker="o", color=colors[name], label=f"tvm_ext {name}")
    for name, values in rounds["peers"]:
        ax.plot(range(1, len(values) + 1), values, marker="s", color=colors[name], label=f"{name} (peer)")
    ax.plot(range(1, len(rounds["bound"]) + 1), rounds["bound"], linestyle="--", color=BOUND,
            label="bound: bytes a token at the round's copy bandwidth")
    ax.set_xlabel("round (the rows and the peers interleaved in each)")
    ax.set_ylabel("tokens / s")
    ax.set_ylim(bottom=0)
    outside_legend(ax)
    ax.grid(alpha=0.3)
    first = doc[0] if isinstance(doc, list) else doc
    out = [Drawn("rounds", "Decode speed per round, ours beside the peers and the bound",
                 f"Phi-2 decode, {first['layers']} layers, {first['tokens']} tokens after {first['context']} past "
                 f"positions, {first['threads']} threads, {first['device']}.", fig)]
    labels, kernels = R.decode_kernels(doc)
    if labels:
        fig = new_figure(10, 0.25 * len(labels) * max(1, len(kernels) / 2) + 1.2)
        ax = fig.subplots()
        series = {s: [k.get(label, (None, None))[0] for label in labels] for s, k in kernels.items()}
        bounds = [next((k[label][1] for k in kernels.values() if label in k and k[label][1]), None)
                  for label in labels]
        last = list(kernels.values())[-1]  # its own bound: each row's kernels ran in their own rounds
        ratios = [last[label][0] / last[label][1] if label in last and last[label][1] else None for label in labels]
        _against_bound(ax, labels, series, bounds, _colors(kernels, ()), unit="ms per step, all layers",
                       ratios=ratios)
        out.append(Drawn("kernels", "Each kernel inside the running step against its bound",
                         "One instrumented step per round (medians): each kernel's time per step per schedule; "
                         "black tick: its bytes at its round's copy bandwidth.", fig))
    return out


def prompt_figures(doc) -> list:
    rates = R.prompt_rates(doc)
    peer_names = [name for name, _ in rates["peers"]]
    names = list(rates["rows"]) + peer_names
    colors = _colors(names, peer_names)
    fig = new_figure(7, 3.4)
    ax = fig.subplots()
    for i, (name, values) in enumerate(list(rates["rows"].items()) + rates["peers"]):
        _spread(ax, i, values, colors[name])
    ax.set_xticks(range(len(names)), [f"{n}\n({'peer' if n in peer_names else 'tvm_ext'})" for n in names])
    ax.set_ylabel("prompt tokens / s")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3, axis="y")
    out = [Drawn("prompt", "Prompt processing, ours beside the peers",
                 f"Phi-2, a {doc['prompt']}-token prompt through {doc['layers']} layers, {doc['threads']} threads: "
                 "each dot one repeat (ours) or one sample (a peer), black: the median.", fig)]
    gemms, tops, peak = R.prompt_gemms(doc)
    vs_ort = R.prompt_vs_ort(doc)
    what = R.peak_instructions(doc)
    if gemms:
        fig = new_figure(10 if vs_ort else 5.5, 3.4)
        axes = fig.subplots(1, 2) if vs_ort else [fig.subplots()]
        ax1 = axes[0]
        width = 0.8 / len(tops)
        for j, (s, values) in enumerate(tops.items()):
            ax1.bar([i - 0.4 + width * (j + 0.5) for i in range(len(gemms))], [v or 0 for v in values], width=width,
                    color=colors[s], label=s)
        if peak:
            ax1.axhline(peak, linestyle="--", color=BOUND, label=f"{what} peak {peak:.2f} TOPS")
        ax1.set_xticks(range(len(gemms)), [short(g, 18) for g in gemms], fontsize=7, rotation=15)
        ax1.set_ylabel("int8 TOPS")
        ax1.legend(fontsize=7)
        caption = (f"Each q4 x int8 GEMM's int8 TOPS against the host's {what} peak measured in the same run "
                   "(registers only).")
        if vs_ort:
            ax2 = axes[1]
            for j, (s, ratios) in enumerate(vs_ort.items()):
                ax2.bar([i - 0.4 + 0.8 / len(vs_ort) * (j + 0.5) for i in range(len(ratios))],
                        list(ratios.values()), width=0.8 / len(vs_ort), color=colors[s], label=s)
            ax2.set_xticks(range(len(next(iter(vs_ort.values())))), list(next(iter(vs_ort.values()))))
            ax2.axhline(1.0, linestyle="--", color=PEER, label="ONNX Runtime MatMulNBits (acc 4)")
            ax2.set_ylabel("our GEMM time / ORT's")
            ax2.legend(fontsize=7)
            caption = ("Left: " + caption[0].lower() + caption[1:] + " Right: each projection's GEMM time over "
                       "ONNX Runtime's MatMulNBits on the same shape (below 1: ours is faster).")
        for ax in axes:
            ax.grid(alpha=0.3, axis="y")
        out.append(Drawn("gemms", f"The prompt's GEMMs against the {what} peak"
                         + (" and ONNX Runtime" if vs_ort else ""), caption, fig))
    return out
