"""The seed tables from a bundle's results: what ``collect.sh`` prints and commits after a lease.

ResNet-50 (each network experiment): per rule set, each task's best time among its untuned schedule and
its first R candidates, R the same for every task and rule set (the most that every one of them got
measured: a deadline cut leaves the rule sets comparable), weighted by the task's calls per network run,
beside the PyTorch peer.  Phi-2 decode: per fusion mode and schedule (dlight; our rules untuned; tuned =
the best of the rule and its candidates), the layer's time (its kernels x their calls) and the head's,
the layer's DRAM bound at the measured copy bandwidth, and the step (32 layers + head) beside the peer.
The sums are of kernels timed one by one (cache-warm inputs, no launch gaps): an estimate, not a
network run.
"""
from __future__ import annotations

N_LAYERS = 32


def _results(rows: list) -> dict:
    return {r["id"]: r for r in rows if "id" in r and r.get("kind") != "attempt"}


def _time(res: dict, item: dict):
    r = res.get(item["id"])
    return r["seconds"] if r and r.get("ok") and r.get("seconds") is not None else None


def _expanded(items: list) -> list:
    """Each item once per label it stands for: a candidate structurally equal to another rule set's is
    built and timed once (``same_as``) and counts for both rule sets, at its own rank in each."""
    out = []
    for i in items:
        out.append(i)
        for label in i.get("same_as", ()):
            if "_c" in label:
                ruleset, rank = label.rsplit("_c", 1)
                out.append(dict(i, label=label, ruleset=ruleset, rank=int(rank) + 1))
    return out


def resnet_table(manifest: dict, rows: list) -> list:
    """[{experiment, ruleset, candidates, ms, untuned_ms, tasks_measured, tasks}] (module doc)."""
    res, out = _results(rows), []
    for exp in sorted({i["experiment"] for i in manifest["items"] if i["kind"] == "kernel"
                       and not i["experiment"].startswith("phi2")}):
        items = _expanded([i for i in manifest["items"] if i.get("experiment") == exp and i["kind"] == "kernel"])
        tasks = sorted({i["task_index"] for i in items})
        weight = {i["task_index"]: i["weight"] for i in items}
        untuned = {i["task_index"]: _time(res, i) for i in items if i["rank"] == 0}
        rulesets = sorted({i["ruleset"] for i in items if i["ruleset"]})
        # R: candidates measured (or failed: a row) for every task and rule set
        got = {(t, r): max([i["rank"] for i in items if i["task_index"] == t and i["ruleset"] == r
                            and i["id"] in res] + [0]) for t in tasks for r in rulesets}
        depth = min(got.values()) if got else 0
        for r in rulesets:
            total, measured = 0.0, 0
            for t in tasks:
                times = [x for x in [untuned.get(t)] + [_time(res, i) for i in items if i["task_index"] == t
                                                        and i["ruleset"] == r and i["rank"] <= depth] if x]
                if times:
                    total += weight[t] * min(times)
                    measured += 1
            out.append({"experiment": exp, "ruleset": r, "candidates": depth, "ms": total * 1e3,
                        "untuned_ms": sum(weight[t] * untuned[t] for t in tasks if untuned.get(t)) * 1e3,
                        "tasks_measured": measured, "tasks": len(tasks)})
    return out


def phi2_table(manifest: dict, rows: list, bandwidth_gbs: float | None) -> list:
    """[{fusion, schedule, layer_ms, head_ms, step_ms, bound_layer_ms, kernels_missing}] (module doc)."""
    res, out = _results(rows), []
    items = [i for i in manifest["items"] if i["kind"] == "kernel" and i["experiment"].startswith("phi2")]
    for group in sorted({i["group"] for i in items}):
        mine = [i for i in items if i["group"] == group]
        for schedule in ("dlight", "rule", "tuned"):
            layer = head = bound = 0.0
            missing = 0
            for t in sorted({i["task_index"] for i in mine}):
                ks = [i for i in mine if i["task_index"] == t]
                pick = {"dlight": [i for i in ks if i["label"] == "dlight" or "dlight" in i.get("same_as", ())],
                        "rule": [i for i in ks if i["label"] == "rule" or "rule" in i.get("same_as", ())],
                        "tuned": [i for i in ks if i["label"] != "dlight" or "rule" in i.get("same_as", ())]}
                times = [x for x in (_time(res, i) for i in pick[schedule]) if x is not None]
                if not times:
                    missing += 1
                    continue
                parts = ks[0].get("parts") or {"layer": ks[0]["weight"]}
                layer += parts.get("layer", 0) * min(times)
                head += parts.get("head", 0) * min(times)
                if bandwidth_gbs:
                    bound += parts.get("layer", 0) * (ks[0]["bytes"] + ks[0]["out_bytes"]) / (bandwidth_gbs * 1e9)
            out.append({"fusion": group.split("/")[-1], "schedule": schedule, "layer_ms": layer * 1e3,
                        "head_ms": head * 1e3, "step_ms": (N_LAYERS * layer + head) * 1e3,
                        "bound_layer_ms": bound * 1e3 if bandwidth_gbs else None, "kernels_missing": missing})
    return out


def tables(manifest: dict, rows: list) -> dict:
    res = _results(rows)
    device = next((r for r in rows if r.get("kind") == "device" and r.get("ok")), {})
    bw = res.get("bandwidth", {}).get("gbs")
    peers = {r["id"]: (r.get("seconds") * 1e3 if r.get("ok") else r.get("error"))
             for r in rows if r.get("kind") == "peer"}
    return {"device": device.get("name"), "bandwidth_gbs": bw, "resnet": resnet_table(manifest, rows),
            "phi2": phi2_table(manifest, rows, bw), "peers_ms": peers,
            "rows": sum(1 for r in res.values()), "failed": sum(1 for r in res.values() if not r.get("ok"))}


def text(t: dict) -> str:
    lines = [f"device: {t['device']}; copy bandwidth {t['bandwidth_gbs'] or float('nan'):.0f} GB/s; "
             f"{t['rows']} rows, {t['failed']} failed"]
    for r in t["resnet"]:
        lines.append(f"{r['experiment']} {r['ruleset']:16s} {r['candidates']:3d} candidates/task  "
                     f"{r['ms']:8.3f} ms (untuned {r['untuned_ms']:.3f} ms, {r['tasks_measured']}/{r['tasks']} tasks)")
    for r in t["phi2"]:
        bound = f", bound {r['bound_layer_ms']:.4f}" if r["bound_layer_ms"] else ""
        lines.append(f"phi2-decode {r['fusion']:8s} {r['schedule']:7s} layer {r['layer_ms']:.4f} ms{bound}, "
                     f"head {r['head_ms']:.4f} ms, step {r['step_ms']:.3f} ms"
                     + (f" ({r['kernels_missing']} kernels unmeasured)" if r["kernels_missing"] else ""))
    for k, v in t["peers_ms"].items():
        lines.append(f"{k}: {v:.3f} ms" if isinstance(v, float) else f"{k}: error {v}")
    return "\n".join(lines)
