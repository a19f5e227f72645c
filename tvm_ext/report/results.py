"""What a result JSON holds, for drawing: its kind, told from its keys, and the series to plot.

Kinds (the commands that write them):
``bench-int8``     ``tvm-ext bench`` on an int8 network (``bench.int8.run``): one row per network, ours
                   (rule sets) and peers (ort, ov, torch, tvm-onnx), median first and warm runs, per round
                   where the JSON has them (``e2e_ms_rounds``; older JSONs hold medians only)
``bench-phi2``     ``tvm-ext bench phi2-decode|phi2-prefill`` (``bench.phi2.layer_bench``): per kernel and
                   projection from DRAM against its bandwidth bound, peers per projection
``generate``       ``tvm-ext generate`` (decode): tok/s per round per schedule, the peer's rounds, the
                   bound per round; each kernel inside the running step against its bound
``generate-prompt`` ``tvm-ext generate --prompt N``: prompt tok/s per repeat, the peer's samples, each
                   GEMM's int8 TOPS against the host's ``vpdpbusd`` peak, each against ONNX Runtime
Only reads: a JSON of another kind is a one-line ValueError.
"""
from __future__ import annotations

import json

PEERS = ("ort", "ov", "torch", "tvm-onnx")  # bench-int8 rows that are other runtimes, not ours


class UnknownResult(ValueError):
    """A JSON file that is not one of the kinds above."""


def load(path: str):
    """The parsed JSON of ``path``: UnknownResult (one line) when it is not JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UnknownResult(f"{path} is not a JSON file ({getattr(err, 'msg', err)})") from None


def kind_of(doc) -> str | None:
    """The kind of a parsed result JSON, or None."""
    rows = doc if isinstance(doc, list) else [doc]
    if rows and all(isinstance(r, dict) and {"schedule", "tok_s", "bound_tok_s"} <= set(r) for r in rows):
        return "generate"
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list) or not doc["rows"]:
        return None
    first = doc["rows"][0]
    if not isinstance(first, dict):
        return None
    if "prompt" in doc and {"schedule", "prefill_s_all"} <= set(first):
        return "generate-prompt"
    if {"ruleset", "e2e_ms"} <= set(first):
        return "bench-int8"
    if {"fusion", "schedule", "kernels", "layer_ms"} <= set(first):
        return "bench-phi2"
    return None


def check_kind(doc, path: str) -> str:
    kind = kind_of(doc)
    if kind is None:
        raise UnknownResult(f"{path}: not a result report draws (a JSON of tvm-ext bench or tvm-ext generate)")
    return kind


def machine(doc) -> str:
    """The machine a result was measured on, in words (CPU model, LLVM name, cores)."""
    first = doc[0] if isinstance(doc, list) else doc
    host, device = first.get("host"), first.get("device")
    if isinstance(host, dict):
        flags = ", ".join(host.get("int8_flags", []))
        return f"{host.get('cpu')} (LLVM {host.get('mcpu')}, {host.get('cores')} cores, {flags})"
    if isinstance(device, dict) and "cpu_name" in device:
        return (f"{device['cpu_name']} (LLVM {device.get('mcpu')}, {device.get('physical_cores')} cores"
                + (", AMX" if device.get("amx_int8") else ", AVX-512 VNNI" if device.get("avx512vnni") else "") + ")")
    if isinstance(device, dict):
        return f"{device.get('name')} ({len(device.get('flags', []))} ISA flags)"
    return str(device or first.get("target", "?"))


def int8_networks(doc) -> list:
    """bench-int8: per network {name, peer, first_ms, warm_ms, first_rounds, warm_rounds} in row order."""
    return [{"name": r["ruleset"], "peer": r["ruleset"] in PEERS, "first_ms": r["e2e_ms"], "warm_ms": r.get("warm_ms"),
             "first_rounds": r.get("e2e_ms_rounds"), "warm_rounds": r.get("warm_ms_rounds")} for r in doc["rows"]]


def phi2_layers(doc) -> list:
    """bench-phi2: (fusion/schedule, layer ms, bound ms) per row."""
    return [(f"{r['schedule']} fusion {r['fusion']}", r["layer_ms"], r["bound_layer_ms"]) for r in doc["rows"]]


def phi2_kernels(doc, fusion: str = "on") -> tuple[list, dict]:
    """bench-phi2: (kernel names, {schedule: [(ms, bound ms)] per kernel}) of the rows with ``fusion``."""
    rows = [r for r in doc["rows"] if r["fusion"] == fusion]
    names = [k["name"] for k in rows[0]["kernels"]] if rows else []
    return names, {r["schedule"]: [(k["ms"], k["bound_ms"]) for k in r["kernels"]] for r in rows}


def phi2_projections(doc) -> dict:
    """bench-phi2: {projection: [(source, ms per call, bound ms, is a peer)]}: our fused kernels, the int8
    rows, the peers."""
    out = {}
    for r in doc["rows"]:
        if r["fusion"] != "on":
            continue
        for k in r["kernels"]:
            if k.get("projection"):
                out.setdefault(k["projection"], []).append((r["schedule"], k["ms"] / k.get("calls", 1),
                                                            k["bound_ms"] / k.get("calls", 1), False))
    for r in doc.get("int8", []):
        out.setdefault(r["projection"], []).append((r["schedule"], r["ms"], r["bound_ms"], False))
    for p in doc.get("peers", []):
        out.setdefault(p["projection"], []).append((p["peer"], p["ms"], p.get("bound_ms"), True))
    return out


def _row_names(rows) -> list:
    """Each decode row's name: its schedule, with its KV cache where the rows hold several."""
    several = len({r.get("kv_cache", "float32") for r in rows}) > 1
    return [f"{r['schedule']} kv {r.get('kv_cache', 'float32')}" if several else r["schedule"] for r in rows]


def by_context(doc) -> list:
    """generate: the rows of each context in the order they ran (``generate --context A,B`` writes one list)."""
    rows = doc if isinstance(doc, list) else [doc]
    contexts = list(dict.fromkeys(r["context"] for r in rows))
    return [[r for r in rows if r["context"] == c] for c in contexts]


def decode_rounds(doc) -> dict:
    """generate: {rows: {schedule: tok/s per round}, peers: [(name, tok/s per round)], bound: per round}."""
    rows = doc if isinstance(doc, list) else [doc]
    first = rows[0]
    peers = first.get("peers_tok_s_rounds")  # by name; older results hold one peer's rounds
    if peers is None and first.get("peer_tok_s_rounds"):
        peers = {(first.get("peers") or [{"peer": "peer"}])[0]["peer"]: first["peer_tok_s_rounds"]}
    return {"rows": {n: r.get("tok_s_rounds") or [r["tok_s"]] for n, r in zip(_row_names(rows), rows)},
            "peers": list((peers or {}).items()),
            "bound": first.get("bound_tok_s_rounds") or [first["bound_tok_s"]]}


def decode_kernels(doc) -> tuple[list, dict]:
    """generate: (kernel labels, largest share of the last row first; {schedule: {label: (ms, bound ms)}})."""
    rows = doc if isinstance(doc, list) else [doc]
    labels = [k["label"] for k in rows[-1].get("kernels", [])]
    for r in rows:
        labels += [k["label"] for k in r.get("kernels", []) if k["label"] not in labels]
    return labels, {n: {k["label"]: (k["ms"], k.get("bound_ms")) for k in r.get("kernels", [])}
                    for n, r in zip(_row_names(rows), rows)}


def prompt_rates(doc) -> dict:
    """generate-prompt: {rows: {schedule: prompt tok/s per repeat}, peers: [(name, tok/s samples)]}."""
    rates = {r["schedule"]: [doc["prompt"] / s for s in r["prefill_s_all"]] for r in doc["rows"]}
    peers = []
    for p in doc.get("peers", []):
        samples = [s for row in p.get("rows", []) if row.get("n_prompt") == doc["prompt"]
                   for s in (row.get("tok_s_samples") or [row["tok_s"]])]
        if samples:
            peers.append((p["peer"], samples))
    return {"rows": rates, "peers": peers}


def prompt_gemms(doc) -> tuple[list, dict, float | None]:
    """generate-prompt: (GEMM names, {schedule: [int8 TOPS per GEMM]}, the host's int8 peak or None)."""
    names = []
    for r in doc["rows"]:
        names += [n for n in r.get("gemm_tops", {}) if n not in names]
    tops = {r["schedule"]: [r.get("gemm_tops", {}).get(n) for n in names] for r in doc["rows"]}
    return names, tops, int8_peak_tops(doc)


def int8_peak_tops(doc) -> float | None:
    """The prompt result's int8 peak (older results hold only ``vnni_peak_tops``, measured on VNNI hosts)."""
    return doc.get("int8_peak_tops", doc.get("vnni_peak_tops"))


PEAK_INSTRUCTIONS = {"avx512vnni": "vpdpbusd", "avxvnni": "vpdpbusd on 256 bits", "avx2": "vpmaddubsw into int16 sums"}


def peak_instructions(doc) -> str:
    """The instructions of the prompt result's int8 peak (older results name none: vpdpbusd)."""
    return PEAK_INSTRUCTIONS[doc.get("int8_peak_form") or "avx512vnni"]


def prompt_vs_ort(doc) -> dict:
    """generate-prompt: {schedule: {projection: our GEMM's time / ORT MatMulNBits' (accuracy_level 4)}}."""
    return {r["schedule"]: r["gemm_vs_ort"] for r in doc["rows"] if r.get("gemm_vs_ort")}
