"""Whole-model Phi-2 decode on a GPU: the one-function step under a CUDA graph, tok/s against the bound.

``decode_gpu_rows(schedules, ...)`` builds ``workloads.phi2.step`` (q4f16_1: fp16 activations, KV cache
and biases; random q4 weights), schedules it per row (``tvm_ext.ApplySchedules``: "dlight" = dlight's GPU rules;
"rule" = our CUDA rules -- rules/dequant_gemv_cuda for the projections, rules/contraction_cuda for the
attention's value product -- and dlight for the rest), compiles it with Relax's CUDA-graph rewriting
(``step.compile_step``) and uploads the weights once for all rows.  Each round, each row fills its KV
cache with ``context`` random positions and decodes ``tokens`` tokens greedily (one VM call a token: the
graph replayed; the first decode of a row, untimed, captures it).  ``peer``: a callable timed once per
round after the rows, returning its tok/s (``torch_peers.phi2_decode``: transformers under a CUDA graph).

bound_tok_s = the device's copy bandwidth (read + written bytes per second, measured before and after
the rounds) / the bytes a token streams (every weight, the attended keys and values).  Rows after the
first report how their tokens and first-step logits compare with the first row's (the same fp16 model,
other kernels).
"""
from __future__ import annotations

import time

import numpy as np

from tvm_ext.workloads.phi2.compiled import schedule
from tvm_ext.bench.phi2.kernels import measure_bandwidth
from tvm_ext.rulesets import GPU_SCHEDULES as SCHEDULES
from tvm_ext.rulesets import check_schedules as _check


def check_schedules(schedules) -> None:
    """ValueError (one line) for a schedule the GPU decode has no row for."""
    _check(schedules, SCHEDULES, "on a GPU")


def _timed(dec, tokens: int, context: int, seed: int):
    """(seconds, generated ids, first-step logits) of one greedy decode after a fresh random past."""
    dec.fill_past(context, seed=seed)
    start = time.perf_counter()
    ids, logits = dec.generate([1], tokens, start=context)
    return time.perf_counter() - start, ids, logits[0]


def decode_gpu_rows(schedules=SCHEDULES, config="full", layers=None, tokens=16, context=512, target="cuda",
                    seed=0, rounds=3, peer=None, log=print, bandwidth_mb=512) -> list:
    """One row per schedule (module doc): {schedule, tok_s, tok_s_rounds, of_bound, rules, generated,
    vs_first?, vs_peer?} with the shared figures (bound_tok_s, bandwidth_gbs, bytes, device);
    ``bandwidth_mb``: the size of the copy that measures the bandwidth."""
    import tvm

    from tvm_ext.targets import resolve_target
    from tvm_ext.workloads.phi2 import step as st

    check_schedules(schedules)
    tokens, context = int(tokens), int(context)
    if tokens < 1 or context < 0:
        raise ValueError(f"need tokens >= 1 and context >= 0, not {tokens} and {context}")
    target = resolve_target(target)
    gpu = target.kind.name == "cuda"  # a CPU target runs the same one-function step in float32 (tests)
    dev = tvm.cuda(0) if gpu else tvm.cpu(0)
    if not dev.exist:
        raise ValueError("no CUDA device here (--target llvm runs the same step on this CPU)")
    model = st.build_step(config, layers, capacity=context + tokens, seed=seed,
                          dtype="float16" if gpu else "float32", gpu=gpu)
    edges = [measure_bandwidth(dev, mb=bandwidth_mb)[0]]
    log(f"device copy bandwidth: {edges[0]:.0f} GB/s")
    decs, shared = [], None
    for how in schedules:
        t0 = time.time()
        mod, used = schedule(model.mod, target, how)
        dec = st.StepDecoder(model, st.compile_step(mod, target), dev=dev, log=log, share=shared)
        dec.rules, shared = used, shared or dec
        _timed(dec, 1, context, seed)  # the first call captures the CUDA graph
        log(f"{how}: built, weights up, graph captured in {time.time() - t0:.0f} s")
        decs.append((how, dec))
    runs, peer_s = {how: [] for how in schedules}, []
    for rnd in range(rounds):
        for how, dec in decs:
            runs[how].append(_timed(dec, tokens, context, seed))
        if peer is not None:
            try:
                peer_s.append(peer())
            except Exception as err:  # noqa: BLE001 -- the peer's own failure: our rows still count
                log(f"peer left out after round {rnd + 1}: {type(err).__name__}: {str(err)[:200]}")
                peer, peer_s = None, []
        log(f"round {rnd + 1}/{rounds} done")
    edges.append(measure_bandwidth(dev, mb=bandwidth_mb)[0])
    gbs = max(edges)
    weight_bytes = model.weight_bytes()  # regenerates a layer's weights: once
    kv_bytes = float(np.mean([model.kv_bytes(p + 1) for p in range(context, context + tokens)]))
    bound = gbs * 1e9 / (weight_bytes + kv_bytes)
    rows, first = [], None
    for how, dec in decs:
        tok_s = [tokens / secs for secs, _, _ in runs[how]]
        _, ids, logits = runs[how][0]
        row = {"schedule": how, "tok_s": float(np.median(tok_s)), "tok_s_rounds": tok_s,
               "of_bound": float(np.median(tok_s)) / bound, "rules": dec.rules, "generated": ids}
        if first is None:
            first = (how, ids, logits)
        else:
            row["vs_first"] = {"schedule": first[0], "same_tokens": float(np.mean(np.array(ids) == np.array(first[1]))),
                               "max_abs_logit_err": float(np.max(np.abs(logits - first[2])))}
        if peer_s:
            row["vs_peer"] = float(np.median([t / p for t, p in zip(tok_s, peer_s)]))
        rows.append(row)
    common = {"config": config, "layers": model.layers, "tokens": tokens, "context": context, "dtype": model.dtype,
              "bound_tok_s": bound, "bandwidth_gbs": gbs, "weight_bytes": int(weight_bytes), "kv_bytes": int(kv_bytes),
              "device": str(dev.device_name) if gpu else "cpu",
              "cuda_graph": gpu}
    if peer_s:
        common["peer_tok_s_rounds"] = peer_s
    return [dict(common, **r) for r in rows]


def build_only(target="cuda-sm90", config="full", capacity=528, schedules=SCHEDULES, log=print) -> dict:
    """Without a GPU: each row's step scheduled and compiled as ``decode_gpu_rows`` would, its kernels
    compiled by nvcc, and whether the VM replays the step as a CUDA graph: {schedule: {"rules",
    "cuda_graph_regions"}} (the lent-GPU command's dry run)."""
    import tvm

    from tvm_ext.bench.phi2.kernels import nvcc_build
    from tvm_ext.targets import resolve_target
    from tvm_ext.workloads.phi2 import step as st

    target = resolve_target(target)
    check_schedules(schedules)
    model = st.build_step(config, capacity=capacity)
    out = {}
    for how in schedules:
        mod, used = schedule(model.mod, target, how)
        text = st.compile_step(mod, target).as_text()
        nvcc_build(tvm.IRModule({gv: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}),
                   target)
        regions = text.count("call  vm.builtin.cuda_graph.run_or_capture")
        out[how] = {"rules": used, "cuda_graph_regions": regions}
        log(f"{how}: {config} step built, {len(used)} kernels compiled by nvcc, {regions} CUDA graph region(s)")
    return out
