"""The text tables of a Phi-2 bench result (``tvm_ext.bench.phi2.run``'s dict)."""
from __future__ import annotations

from tvm_ext.bench.phi2 import SCHEDULES, row
from tvm_ext.cli.table import render

NAME_WIDTH = 44


def _f(value, spec: str):
    return None if value is None else format(value, spec)


def format_table(res: dict) -> str:
    """Rows per fusion mode x schedule, per-kernel times with trials-to-beat-dlight, the
    fused kernels against their unfused parts, and the targets."""
    q4 = "q4f32_1" if res["compute_dtype"] == "float32" else "q4f16_1"
    lines = [f"{res['workload']} on {res['target']} ({res['device']}, {res['threads']} threads), "
             f"compute dtype {res['compute_dtype']} ({q4}), {res['trials_per_kernel']} trials/kernel, "
             f"copy bandwidth {res['bandwidth_gbs']:.1f} GB/s"]
    body = [[r["fusion"], r["schedule"], f"{r['layer_ms']:.3f}", f"{r['bound_layer_ms']:.3f}",
             f"{r['layer_ms'] / r['bound_layer_ms']:.2f}", _f(r.get("vs_dlight_off"), ".2f"),
             _f(r["head_ms"], ".3f"), _f(r["tok_s"], ".2f")] for r in res["rows"]]
    lines.append(render(["fusion", "schedule", "layer ms", "bound ms", "x bound", "vs dl-off", "head ms",
                         "tok/s(32L)"], body, "<<>>>>>>"))
    lines += ["", "per kernel (ms per layer; bound = bytes moved / copy bandwidth; beat@ = trials until "
                  "one beat dlight, '-' = none or not known):"]
    for fusion in ("off", "on"):
        rs = {s: row(res["rows"], fusion, s) for s in SCHEDULES}
        body = []
        for k, m, s in zip(rs["dlight"]["kernels"], rs["metaschedule"]["kernels"], rs["seeded"]["kernels"]):
            body.append([k["name"][:NAME_WIDTH], k["calls"], f"{k['bound_ms']:.3f}", f"{k['ms']:.3f}",
                         f"{m['ms']:.3f}", f"{s['ms']:.3f}", k["rule"], m.get("trials_to_beat_dlight"),
                         s.get("trials_to_beat_dlight")])
        lines += [f"fusion {fusion}:", render(["kernel", "calls", "bound", "dlight", "ms", "seeded", "dl rule",
                                               "beat@ms", "beat@sd"], body, "<>>>>>>>>"), ""]
    lines.append("fused kernels vs their unfused parts under dlight (the user's question):")
    for loss in res["fusion_losses"]:
        verdict = "SLOWER" if loss["slower"] else "faster"
        lines.append(f"  {loss['name'][:46]:46} fused {loss['fused_ms']:8.3f} vs parts {loss['parts_ms']:8.3f} ms: "
                     f"{verdict}; dlight rule {loss['rule']}; metaschedule {loss['metaschedule_ms']:.3f}, "
                     f"seeded {loss['seeded_ms']:.3f}")
    t = res["targets"]
    torch_ratio = _f(t["torch_bf16_over_best_fused"], ".2f")
    lines.append("")
    lines.append(f"targets: best fused ({t['best_fused']}) = {t['best_fused_vs_bound']:.2f}x bound (<=1.5, stretch 1.2); "
                 f"fused/unfused for best kind ({t['best_kind']}) = {t['fused_over_unfused_best_kind']:.2f} (<=1); "
                 f"metaschedule/dlight fused = {t['ms_over_dlight_fused']:.2f} (<=1); "
                 f"seeded worst kernel/dlight = {t['seeded_worst_kernel_vs_dlight']:.2f} (<=1); "
                 f"torch-bf16/best fused = {torch_ratio} (>=3)")
    return "\n".join(lines)
