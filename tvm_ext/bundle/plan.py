"""The order of a bundle's work and what it should cost on the device: the time model.

Order (``order``): the copy bandwidth (the bound every kernel is set against) first, then the seed
tables' rows -- Phi-2's dlight and untuned-rule kernels, each network task's untuned schedule --, the
ResNet-50 peer, then the candidates in rounds: round r holds candidate r of every task and every rule
set (a deadline cut leaves each rule set with the same number of candidates per task, so the rule sets
stay comparable), grouped by task so that a task's inputs are made once per round; the Phi-2 peer (a
2.7 B-parameter model built on the device: minutes) last.

The time model (``estimate``) prices each item from what an H200 lent earlier measured
(``docs/journal.md``): copy bandwidth 4.0 TB/s; its fastest kernels 15-80 us (Phi-2 decode under dlight,
one int8 conv 16.5-54 us), so timing is the timer's floor, ``repeat`` runs of at least ``min_repeat_ms``
each (TVM's ``time_evaluator`` calibrates its inner count on the first: 1.5x), not the kernel; plus the
first checked call (inputs made with NumPy at ``NUMPY_BPS``, copied in and out over PCIe at ``PCIE_BPS``);
a library load per task; the runner's start (``STARTUP_S``: TVM's runtime imported, CUDA context made).
Peers as the earlier lent runs took them (``PEER_S``).  Every constant is a stated assumption, set
conservatively; ``bundle run`` writes each item's wall time, so the next lease replaces them with
measured figures.
"""
from __future__ import annotations

BANDWIDTH_BPS = 4.0e12  # H200 device copy (docs/journal.md)
KERNEL_FLOOR_S = 5e-6
SLACK = 16.0  # dlight's Phi-2 kernels ran 5.3-16x their DRAM bound on the H200
REPEAT, MIN_REPEAT_MS = 5, 20
CALIBRATION = 1.5
NUMPY_BPS = 1.5e8  # SplitMix64 inputs and the output check, one host core
PCIE_BPS = 1.0e10
ITEM_OVERHEAD_S = 0.02
LIB_LOAD_S = 0.2
STARTUP_S = 15.0
BANDWIDTH_ITEM_S = 3.0
PEER_S = {"resnet50": 45.0, "phi2_decode": 150.0}
LAST_PEERS = ("phi2_decode",)


def kernel_seconds(item: dict) -> float:
    return max(KERNEL_FLOOR_S, SLACK * (item["bytes"] + item["out_bytes"]) / BANDWIDTH_BPS)


def item_seconds(item: dict, new_inputs: bool, new_lib: bool, repeat: int = REPEAT,
                 min_repeat_ms: int = MIN_REPEAT_MS) -> float:
    """Estimated seconds of one kernel item (module doc)."""
    t = kernel_seconds(item)
    s = ITEM_OVERHEAD_S + CALIBRATION * repeat * max(min_repeat_ms / 1e3, t) + t
    s += item["out_bytes"] / NUMPY_BPS + item["out_bytes"] / PCIE_BPS  # the check
    if new_inputs:
        s += item["bytes"] / NUMPY_BPS + item["bytes"] / PCIE_BPS
    if new_lib:
        s += LIB_LOAD_S
    return s


def _key(item: dict):
    if item["kind"] == "bandwidth":
        return (0,)
    if item["kind"] == "peer":
        return (9,) if item["peer"] in LAST_PEERS else (3,)
    phase = 1 if item["experiment"].startswith("phi2") else 2
    if item["rank"] == 0:
        return (phase, item["task_index"], item["label"])
    return (4, item["rank"], item["task_index"], item["ruleset"])


def order(items: list, peers: list, device: str) -> dict:
    """The manifest's body: {"items": ordered, each with ``est_s``, "estimate_s": total with the start}."""
    work = [dict(i) for i in items]
    # the device's copy bandwidth: 512 MiB (10x an H200's L2); the CPU stand-in's rehearsal needs less
    work.append({"id": "bandwidth", "kind": "bandwidth", "mib": 512 if device == "cuda" else 32})
    for peer in peers:
        work.append(dict(peer, kind="peer"))
    work.sort(key=_key)
    libs, last_task, total = set(), None, STARTUP_S
    for item in work:
        if item["kind"] == "kernel":
            item["est_s"] = round(item_seconds(item, item["task_index"] != last_task, item["lib"] not in libs), 4)
            libs.add(item["lib"])
            last_task = item["task_index"]
        elif item["kind"] == "peer":
            item["est_s"] = PEER_S.get(item["peer"], 60.0)
        else:
            item["est_s"] = BANDWIDTH_ITEM_S
        total += item["est_s"]
    return {"format": 1, "items": work, "estimate_s": round(total, 1)}


def estimate(manifest: dict, limit_s: float = 600.0) -> dict:
    """The time model's table of a manifest: seconds per experiment and kind of row, and the margin."""
    rows: dict = {}
    for item in manifest["items"]:
        if item["kind"] == "kernel":
            what = "untuned rows" if item["rank"] == 0 else "candidates"
            key = (item["experiment"], what)
        else:
            key = (item["kind"], item.get("peer", ""))
        row = rows.setdefault(key, {"items": 0, "seconds": 0.0})
        row["items"] += 1
        row["seconds"] += item["est_s"]
    total = STARTUP_S + sum(r["seconds"] for r in rows.values())
    return {"rows": [{"what": " ".join(k).strip(), **v} for k, v in rows.items()], "startup_s": STARTUP_S,
            "total_s": total, "limit_s": limit_s, "margin": 1.0 - total / limit_s}


def table(est: dict) -> str:
    lines = [f"{'work':44s} {'items':>6s} {'est. s':>8s}", f"{'runner start (TVM runtime, CUDA context)':44s} "
             f"{'':>6s} {est['startup_s']:8.1f}"]
    for r in est["rows"]:
        lines.append(f"{r['what']:44s} {r['items']:6d} {r['seconds']:8.1f}")
    lines.append(f"{'total':44s} {'':>6s} {est['total_s']:8.1f}")
    lines.append(f"one command's limit {est['limit_s']:.0f} s: margin {100 * est['margin']:.0f} %"
                 + ("" if est["margin"] >= 0.2 else "  (UNDER the 20 % asked)"))
    return "\n".join(lines)
