"""Whole-model Phi-2 decode: tokens/s of N layers + head on the Relax VM, against the
memory-bandwidth bound measured in the same run.

``decode_e2e`` builds the model of ``tvm_ext.workloads.phi2.model`` (random q4f32_1
weights), fills every layer's KV cache with ``context`` random past positions, and times
a greedy decode of ``tokens`` tokens (one step per token: embed, every layer, head,
argmax on the host), once per round, the rows of one run interleaved round by round.
After each decode one more step, at the last position, runs with every VM call timed: each
kernel's time inside the running step, its share, and its time over its bytes at that round's
copy bandwidth.

bound_tok_s = DRAM bandwidth / bytes a token must stream: all layers' and the head's
weights (packed q4, fp16 scales, biases, LayerNorm) plus the keys and values of the cached
positions each step attends to (averaged over the steps; the attention kernels read the
whole cache capacity, context + tokens, masked), the embedding row aside.  The cache's bytes are its
dtype's (``kv_dtypes``: one row per schedule and cache dtype, each with its own bytes and bound).  The
bandwidth is ``kernels.measure_bandwidth``'s copy bandwidth (read + written bytes per
second; the fastest of TVM's parallel copy and NumPy's, measured before and after each
decode).
"""
from __future__ import annotations

import time

import numpy as np

from tvm_ext.bench.phi2.kernels import measure_bandwidth, nbytes, normalize
from tvm_ext.bench.timing import set_threads
from tvm_ext.rulesets import SCHEDULES, check_schedules
from tvm_ext.workloads.phi2.compiled import decoder
from tvm_ext.workloads.phi2.kv_cache import check_kv_dtype

INT8_ROWS = ("int8", "tuned")  # rows of the int8 model (compute="int8"): different numbers than the float rows'
DECODE_FUNCS = ("embed", "layer", "head")


def model_kernels(model, funcs=DECODE_FUNCS) -> dict:
    """{name: normalized IRModule} of the kernels the model's Relax functions ``funcs`` call that a
    schedule can change (hand-scheduled kernels and the in-place cache writes left out)."""
    from tvm import tirx

    from tvm_ext.workloads.phi2.kernels import callees

    out = {}
    for fname in funcs:
        for name in callees(model.mod[fname]):  # call_tir only: the in-place cache writes are not in it
            func = model.mod[name]
            if isinstance(func, tirx.PrimFunc) and not (func.attrs is not None and "tirx.is_scheduled" in func.attrs):
                out[name] = normalize(func)
    return out


def decode_e2e(config="full", layers=None, tokens=16, context=512, schedule="dlight", threads=None,
               log=print, target="llvm", seed=0, bandwidth_mb=512, database=None, tune_trials=0, rounds=1,
               peer=None, kv_dtype="float32") -> dict:
    """Run the decode (see the module docstring); returns {layers, tokens, context, tok_s,
    bound_tok_s, weight_bytes, kv_bytes, bandwidth_gbs, kernels: [{name, label, calls, ms, share,
    mbytes, bound_ms, x_bound}] (``_kernel_rows``), schedule, device, threads, ...}."""
    return decode_e2e_rows((schedule,), config, layers, tokens, context, threads, log, target, seed,
                           bandwidth_mb, database, tune_trials, rounds, peer, (kv_dtype,))[0]


def decode_e2e_rows(schedules, config="full", layers=None, tokens=16, context=512, threads=None,
                    log=print, target="llvm", seed=0, bandwidth_mb=512, database=None, tune_trials=0,
                    rounds=3, peer=None, kv_dtypes=("float32",)) -> list:
    """``decode_e2e`` for each of ``schedules`` in one process: one bandwidth measurement,
    the weights generated and uploaded once per layout, the same past and first token for each.
    The ``INT8_ROWS`` run the int8 model; ``tuned`` reads ``database``, which ``tune_trials`` > 0
    first fills: the int8 decode step's kernels tuned that many trials each through the plugin
    space, each starting from our rules' schedule (``tune.seeds.tune_from_rules``).  Each row decodes
    ``tokens`` tokens once per round, the rows interleaved; its tok/s is the median round's, its
    ``of_bound`` the median of its rounds' tok/s over that round's bound (the copy bandwidth measured
    just before and after it).  ``peer``: a callable timed once per round after the rows, returning
    its tok/s (llama.cpp's decode), or {name: such a callable} for several; each row's ``vs_peers``
    {name: ratio} holds the median of the rounds' ratios to each, ``vs_peer`` the first's.
    ``kv_dtypes``: the KV cache's storage (``kv_cache.KV_DTYPES``), a row for each schedule and each of them
    (``kv_cache`` in the row), the same weights and past; a row whose cache is not float32 says how its
    decode differs from the float32 cache's row of its schedule (``_compare_caches``)."""
    from tvm_ext.tune.seeds import tuned_inputs
    from tvm_ext.workloads.phi2 import model as pm

    layers = pm.DEFAULT_LAYERS.get(config, 1) if layers is None else int(layers)
    tokens, context = int(tokens), int(context)
    if tokens < 1:
        raise ValueError(f"tokens must be at least 1, not {tokens}")
    if context < 0:
        raise ValueError(f"context must be at least 0, not {context}")
    pm.check_config(config, layers, context + tokens)
    kv_dtypes = [check_kv_dtype(kv) for kv in kv_dtypes]
    for how in check_schedules(schedules, SCHEDULES):  # one clear line before minutes of work
        if how == "tuned" and not tune_trials:
            tuned_inputs(database, target)
        if how in INT8_ROWS:
            from tvm_ext.workloads.phi2.q4_int8_gemm import check_target

            check_target(target)  # resolves it as decoder() will ("llvm": this host's CPU)
    from tvm_ext.targets import describe_host, physical_cores

    threads = int(threads or physical_cores())  # TVM alone would take half the logical CPUs on x86
    set_threads(threads)
    import tvm

    dev = tvm.cpu(0)

    def bandwidth():
        tvm_gbs, np_gbs = measure_bandwidth(dev, mb=bandwidth_mb)
        log(f"copy bandwidth: {tvm_gbs:.1f} GB/s (TVM parallel copy), {np_gbs:.1f} GB/s (numpy)")
        return tvm_gbs, np_gbs

    samples = [bandwidth()]
    models = {}  # (compute, kv dtype): the model (same weights and parameters in all)

    def model_of(compute, kv):
        if (compute, kv) not in models:
            models[compute, kv] = pm.build_model(config, layers, capacity=context + tokens, seed=seed,
                                                 compute=compute, kv_dtype=kv)
        return models[compute, kv]

    model = model_of("float", kv_dtypes[0])
    weight_bytes = model.weight_bytes()
    kv_bytes = {kv: float(np.mean([model_of("float", kv).kv_bytes(p + 1) for p in range(context, context + tokens)]))
                for kv in kv_dtypes}
    host = describe_host()
    rows, weights = [], None
    if tune_trials and "tuned" in schedules:
        from tvm_ext.bench.cycled import CycledTimer
        from tvm_ext.tune.seeds import tune_from_rules

        tune_from_rules(model_kernels(model_of("int8", kv_dtypes[0])), target, database, tune_trials, log,
                        measure=CycledTimer(target))
    decs = []  # ((schedule, kv dtype), Decoder)
    for how in schedules:
        for kv in kv_dtypes:
            dec = decoder(model_of("int8" if how in INT8_ROWS else "float", kv), target, how, dev=dev, log=log,
                          database=database, share=weights)
            weights = weights or dec
            decs.append(((how, kv), dec))
    runs, steps = {key: [] for key, _ in decs}, {key: [] for key, _ in decs}
    peers = peer if isinstance(peer, dict) else ({"peer": peer} if peer is not None else {})
    edges, peer_s = [bandwidth()], {name: [] for name in peers}  # the copy bandwidth between rounds; peers' tok/s
    for rnd in range(rounds):  # rows interleaved round by round: a shared host's bandwidth drifts by the minute
        for key, dec in decs:
            log(f"round {rnd + 1}/{rounds}: {key[0]}, {key[1]} KV cache")
            runs[key].append(_timed_decode(dec, tokens, context, seed, log))
            steps[key].append(_instrumented_step(dec, runs[key][-1][1], context))
        for name, call in peers.items():
            peer_s[name].append(call())
        edges.append(bandwidth())
    samples += edges
    # each round's bound: the fastest copy just before and after it (a loaded machine only makes a copy
    # slower); a row's share of the bound is its median round's, in that round's bound
    round_gbs = [max(*edges[r], *edges[r + 1]) for r in range(rounds)]
    # the bound takes the fastest copy seen before and after the decodes (a loaded machine
    # only makes a copy slower): the strictest bound
    bw_tvm, bw_np = max(t for t, _ in samples), max(n for _, n in samples)
    for (how, kv), dec in decs:
        secs = [r[0] for r in runs[how, kv]]
        _, ids, logits = runs[how, kv][0]
        tok_s = [tokens / t for t in secs]
        per_token = weight_bytes + kv_bytes[kv]
        round_bound = [gbs * 1e9 / per_token for gbs in round_gbs]
        row = {"schedule": how, "kv_cache": kv, "kv_bytes": int(kv_bytes[kv]),
               "bound_tok_s": max(bw_tvm, bw_np) * 1e9 / per_token, "bound_tok_s_rounds": round_bound,
               "tok_s": tokens / float(np.median(secs)), "tok_s_rounds": tok_s,
               "of_bound": float(np.median([t / b for t, b in zip(tok_s, round_bound)])),
               "kernels": _kernel_rows(dec, steps[how, kv], round_gbs), "rules": dec.rules, "generated": ids,
               "logits": logits}
        if peer_s:
            row["vs_peers"] = {name: float(np.median([t / p for t, p in zip(tok_s, rates)]))
                               for name, rates in peer_s.items()}
            row["vs_peer"] = next(iter(row["vs_peers"].values()))
        rows.append(row)
    del decs
    common = {
        "config": config, "layers": layers, "tokens": tokens, "context": context,
        "weight_bytes": int(weight_bytes), "bandwidth_gbs": max(bw_tvm, bw_np),
        "bandwidth_tvm_gbs": bw_tvm, "bandwidth_numpy_gbs": bw_np,
        "threads": threads,
        "device": f"{host.get('cpu_name', 'cpu')} (llvm {host.get('mcpu', '?')})",
    }
    if peer_s:
        common["peers_tok_s_rounds"] = peer_s
        common["peer_tok_s_rounds"] = next(iter(peer_s.values()))
    rows = [dict(common, **r) for r in rows]
    _compare_int8(rows)
    _compare_caches(rows)
    for r in rows:
        r.pop("logits")
    return rows


def _differ(r, f) -> dict:
    """How row ``r``'s decode differs from row ``f``'s: {"same_tokens": fraction of generated ids equal,
    "max_abs_logit_err": at the first step, "max_abs_logit": ``f``'s there}."""
    return {"same_tokens": float(np.mean([a == b for a, b in zip(r["generated"], f["generated"])])),
            "max_abs_logit_err": float(np.max(np.abs(r["logits"][0] - f["logits"][0]))),
            "max_abs_logit": float(np.max(np.abs(f["logits"][0])))}


def _compare_int8(rows):
    """On each int8 row (``INT8_ROWS``), how its decode differs from the float rows' of the same run with the
    same KV cache: ``vs_float`` {schedule: ``_differ``}."""
    for r in rows:
        if r["schedule"] not in INT8_ROWS:
            continue
        r["vs_float"] = {f["schedule"]: _differ(r, f) for f in rows if f["schedule"] not in INT8_ROWS
                         and f["schedule"] != "none" and f["kv_cache"] == r["kv_cache"]}


def _compare_caches(rows):
    """On each row whose KV cache is not float32, how its decode differs from the float32 cache's row of the
    same schedule: ``vs_float32_cache`` (``_differ``, plus "steps_compared" and "max_abs_logit_err_steps":
    the largest logit error over the steps before the first token that differs, where both decodes saw the
    same tokens)."""
    for r in rows:
        f = next((f for f in rows if f["kv_cache"] == "float32" and f["schedule"] == r["schedule"]), None)
        if r["kv_cache"] == "float32" or f is None:
            continue
        same = 0
        while same < len(r["generated"]) and r["generated"][same] == f["generated"][same]:
            same += 1
        steps = min(same + 1, len(r["logits"]))  # a step's logits come before its token: one more is comparable
        err = max(float(np.max(np.abs(a - b))) for a, b in zip(r["logits"][:steps], f["logits"][:steps]))
        r["vs_float32_cache"] = dict(_differ(r, f), steps_compared=steps, max_abs_logit_err_steps=err)


def _timed_decode(dec, tokens, context, seed, log):
    """(seconds, generated ids, logits) of a greedy decode of ``tokens`` tokens after ``context``
    random past positions (the same past and first token on every call)."""
    dec.fill_past(context, seed=seed)
    first = int(np.random.default_rng(seed).integers(dec.model.cfg["vocab"]))
    t0 = time.perf_counter()

    def progress(done):
        spent = time.perf_counter() - t0
        log(f"token {done}/{tokens}: {done / spent:.2f} tok/s, ETA {spent / done * (tokens - done):.0f} s")

    ids, logits = dec.generate([first], tokens, start=context, on_token=progress)
    return time.perf_counter() - t0, ids, logits


def _instrumented_step(dec, ids, context):
    """{kernel: (seconds, calls)} of one more step, every VM call timed: the last position again."""
    token, pos = (ids[-2], context + len(ids) - 1) if len(ids) > 1 else (ids[0], context)
    return dec.timed_calls(lambda call: dec.step(token, pos, call=call))


UNBOUNDED = ("kv_write", "embed")  # kernels that touch a sliver of their buffers (one cache slot, one table row)


def _kernel_rows(dec, steps, round_gbs):
    """Each kernel of the decode step inside the running model, largest share first: {name, label,
    share (median over rounds of its part of the instrumented step), ms (median, all its calls in
    one step), calls}, and where it reads its buffers whole (not ``UNBOUNDED``) {mbytes, bound_ms,
    x_bound}: ``bound_ms`` those bytes at the fastest round's copy bandwidth, ``x_bound`` the
    median over rounds of its time over its bytes at that round's bandwidth."""
    labels = kernel_labels(dec.model.mod)
    funcs = {gv.name_hint for gv in dec.model.mod.get_global_vars()}
    out = []
    for name in steps[0]:
        secs = [st[name][0] for st in steps]
        calls = steps[0][name][1]
        label = labels.get(name, name)
        row = {"name": name, "label": label, "calls": calls, "ms": 1e3 * float(np.median(secs)),
               "share": float(np.median([st[name][0] / (sum(s for s, _ in st.values()) or 1.0) for st in steps]))}
        if name not in UNBOUNDED and label not in UNBOUNDED and name in funcs:
            moved = calls * nbytes(dec.model.mod[name])
            row.update(mbytes=moved / 1e6, bound_ms=1e3 * moved / (max(round_gbs) * 1e9),
                       x_bound=float(np.median([t / (moved / (g * 1e9)) for t, g in zip(secs, round_gbs)])))
        out.append(row)
    return sorted(out, key=lambda k: -k["share"])


def kernel_labels(mod) -> dict:
    """{kernel name: short label}: a kernel given a q4 weight is named after it (qkv, dense,
    fc1, fc2, lm_head; "fc1/lm_head" where one kernel serves both), the embedding lookup
    "embed"; others are not in the map."""
    from tvm import relax

    out = {}
    for fname in ("embed", "layer", "head"):
        for block in mod[fname].body.blocks:
            for b in block.bindings:
                val = b.value
                if not (isinstance(val, relax.Call) and getattr(val.op, "name", "").startswith("relax.call_tir")):
                    continue
                weights = [a.name[:-2] for a in val.args[1].fields  # packed words: _q, repacked: _wq
                           if isinstance(a, relax.Var) and a.name.endswith("_q") and not a.name.endswith("_wq")]
                weights += [a.name[:-3] for a in val.args[1].fields
                            if isinstance(a, relax.Var) and a.name.endswith("_wq")]
                if weights:
                    label = "embed" if fname == "embed" else weights[0]
                    names = out.setdefault(val.args[0].name_hint, [])
                    names += [label] if label not in names else []
    return {name: "/".join(labels) for name, labels in out.items()}
