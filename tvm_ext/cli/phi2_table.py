"""The text tables of a Phi-2 bench result (``tvm_ext.bench.phi2.run``'s dict)."""
from __future__ import annotations

from tvm_ext.bench.phi2.layer_bench import SCHEDULES, projection_table, row
from tvm_ext.cli.table import fmt, render

NAME_WIDTH = 44
SHORT = {"dlight": "dlight", "metaschedule": "ms", "seeded": "seeded", "rule": "rule"}


def _device(res: dict) -> str:
    dev = res["device"]
    if isinstance(dev, str):
        return dev
    flags = " ".join(dev.get("flags", []))
    return dev["name"] + (f" [{flags}]" if flags else "")


def _dram_method(res: dict) -> str:
    """How the run kept weights out of the cache (``dram.CopyPlan``; older JSON has no plan)."""
    plan = res.get("copy_plan") or {}
    if plan.get("sweep"):
        return (f"{plan['cycle_bytes'] / 2**20:.0f} MiB of weight copies per runtime (memory) "
                "and 2x the LLC read before every timed pass")
    return "weights cycled through copies >= 2x LLC"


def format_table(res: dict) -> str:
    """Rows per fusion mode x schedule, per-kernel times with trials-to-beat-dlight, the
    per-projection comparison with the peers, the fused kernels against their unfused parts,
    and the targets."""
    schedules = tuple(res.get("schedules", SCHEDULES))
    q4 = "q4f32_1" if res["compute_dtype"] == "float32" else "q4f16_1"
    llc = res.get("llc_bytes")
    tuned = set(schedules) & {"metaschedule", "seeded"}  # the only rows that read a tuning budget
    trials = f"{res['trials_per_kernel']} trials/kernel, " if tuned else "no tuned rows, "
    lines = [f"{res['workload']} on {res['target']} ({_device(res)}, {res['threads']} threads), "
             f"compute dtype {res['compute_dtype']} ({q4}), {trials}"
             f"copy bandwidth {res['bandwidth_gbs']:.1f} GB/s"
             + (f", LLC {llc / 2**20:.0f} MiB: {_dram_method(res)} (DRAM figures)" if llc else "")]
    body = [[r["fusion"], r["schedule"], f"{r['layer_ms']:.3f}", f"{r['bound_layer_ms']:.3f}",
             f"{r['layer_ms'] / r['bound_layer_ms']:.2f}", fmt(r.get("vs_dlight_off"), ".2f"),
             fmt(r["head_ms"], ".3f"), fmt(r["tok_s"], ".2f")] for r in res["rows"]]
    lines.append(render(["fusion", "schedule", "layer ms", "bound ms", "x bound", "vs dl-off", "head ms",
                         "tok/s(32L)"], body, "<<>>>>>>"))
    lines += ["", "per kernel (ms per layer, DRAM; bound = bytes moved / copy bandwidth; hot = dlight cache-hot; "
                  "floor = its touch kernel (same bytes, no compute, same copies); C = weight copies; "
                  "'=' = the same binary as a column to its left, timed once; "
                  "beat@ = trials until one beat dlight, '-' = none or not known):"]
    later = schedules[1:]
    tuned = [s for s in later if s in ("metaschedule", "seeded")]
    for fusion in ("off", "on"):
        rs = {s: row(res["rows"], fusion, s) for s in schedules}
        floors = any("floor_ms" in k for k in rs["dlight"]["kernels"])
        body = []
        for i, k in enumerate(rs["dlight"]["kernels"]):
            others = [rs[s]["kernels"][i] for s in later]
            body.append([k["name"][:NAME_WIDTH], k["calls"], k.get("copies"), f"{k['bound_ms']:.3f}"]
                        + ([fmt(k.get("floor_ms"), ".3f")] if floors else [])
                        + [fmt(k.get("ms_cache_hot"), ".3f"), f"{k['ms']:.3f}"]
                        + [f"{o['ms']:.3f}" + ("=" if o.get("same_schedule_as") else "") for o in others]
                        + [k["rule"]] + [rs[s]["kernels"][i].get("trials_to_beat_dlight") for s in tuned])
        header = (["kernel", "calls", "C", "bound"] + (["floor"] if floors else []) + ["hot", "dlight"]
                  + [SHORT.get(s, s) for s in later] + ["dl rule"]
                  + [f"beat@{SHORT.get(s, s)}" for s in tuned])
        lines += [f"fusion {fusion}:", render(header, body, "<" + ">" * (len(header) - 1)), ""]
    lines += _projection_lines(res)
    lines.append("fused kernels vs their unfused parts under dlight (the user's question):")
    for loss in res["fusion_losses"]:
        verdict = "SLOWER" if loss["slower"] else "faster"
        rest = "".join(f", {s} {loss[f'{s}_ms']:.3f}" for s in later if f"{s}_ms" in loss)
        lines.append(f"  {loss['name'][:46]:46} fused {loss['fused_ms']:8.3f} vs parts {loss['parts_ms']:8.3f} ms: "
                     f"{verdict}; dlight rule {loss['rule']}{rest}")
    t = res["targets"]
    lines.append("")
    lines.append(f"targets: best fused ({t['best_fused']}) = {t['best_fused_vs_bound']:.2f}x bound "
                 "(<=1.5, stretch 1.2); "
                 f"fused/unfused for best kind ({t['best_kind']}) = {t['fused_over_unfused_best_kind']:.2f} (<=1); "
                 f"metaschedule/dlight fused = {fmt(t['ms_over_dlight_fused'], '.2f')} (<=1); "
                 f"seeded worst kernel/dlight = {fmt(t['seeded_worst_kernel_vs_dlight'], '.2f')} (<=1); "
                 f"torch-bf16/best fused = {fmt(t['torch_bf16_over_best_fused'], '.2f')} (>=3)")
    for k in t.get("kernels_over_bound", []):
        lines.append(f"  {k['name'][:NAME_WIDTH]} ({t['best_fused']}): {k['vs_bound']:.2f}x bound (<=1.2), "
                     f"{fmt(k['vs_floor'], '.2f')}x its floor")
    for proj, p in t.get("projections", {}).items():
        line = f"  {proj}: best {p['best']} = {p['vs_bound']:.2f}x bound (<=1.5)"
        if p["vs_ort_acc0"] is not None:  # ORT only with --peers ort
            line += f", {p['vs_ort_acc0']:.2f}x ort-acc0 (<=1.0)"
        if "int8" in p:
            line += f"; rule-int8 = {p['int8']['vs_bound']:.2f}x bound (<=1.5)"
            if p["int8"]["vs_ort_acc4"] is not None:
                line += f", {p['int8']['vs_ort_acc4']:.2f}x ort-acc4 (<=1.0)"
        lines.append(line)
    return "\n".join(lines)


def _projection_lines(res: dict) -> list:
    """Per projection: each tvm row's kernel and each peer, ms per call, x its bound, / ort-acc0."""
    table = projection_table(res["rows"], res.get("peers", []))
    if not table:
        return []
    bounds = {(p["peer"], p["projection"]): p["bound_ms"] for p in res.get("peers", [])}
    body = []
    for proj, p in table.items():
        ort, acc4 = p["peers"].get("ort-acc0"), p["peers"].get("ort-acc4")
        entries = [(name, ms, p["bound_ms"]) for name, ms in p["tvm"].items()]
        entries += [(r["schedule"], r["ms"], r["bound_ms"]) for r in res.get("int8", []) if r["projection"] == proj]
        entries += [(peer, ms, bounds.get((peer, proj))) for peer, ms in p["peers"].items()]
        if body:
            body.append(None)
        for name, ms, bound in entries:
            body.append([proj, name, f"{ms:.3f}", fmt(bound, ".3f"), fmt(ms / bound if bound else None, ".2f"),
                         fmt(ms / ort if ort else None, ".2f"), fmt(ms / acc4 if acc4 else None, ".2f")])
    return ["per projection (ms per call, DRAM; bound = the fused q4 kernel's bytes / bandwidth, also for the "
            "unfused matmul, which reads float weights; a peer's bound counts its own bytes, fp32 scales):",
            render(["proj", "source", "ms", "bound", "x bound", "/ort-acc0", "/ort-acc4"], body, "<<>>>>>"), ""]
