"""Whole-model Phi-2 prompt processing (prefill) on the Relax VM: prompt tok/s, time to first token,
the decode that follows, and the GEMMs against the host's measured int8 peak.

The model (``model.build_model(compute="int8", prompt=M)``) runs the prompt's M tokens through
each layer at once: activations quantized per token and group to int8, the projections as the
q4 x int8 GEMM of ``workloads.q4_int8_gemm`` (rules/q4_int8_gemm.py, ``vpdpbusd``), attention over
the KV cache with the causal mask; then greedy decode continues from the cache the prefill wrote.

Rows (``SCHEDULES``): ``int8`` -- every kernel as our rules schedule it untuned (dlight for the
rest); ``tuned`` -- the best record of a tuning database for each kernel it holds, ``int8`` for
the others (``tune.seeds.tune_from_rules`` on ``model_kernels(model, PROMPT_FUNCS)`` fills such a
database through ``tvm_ext.space``: the GEMM's sketches,
MetaSchedule's rules for attention and the rest).  A float reference runs the same prompt token by
token through the float decode step (``rule``): the first token after the prompt and the tokens
after it are compared with each row's.

``int8_peak`` measures the host's rate of the GEMM's product step (``vpdpbusd``, or AVX2's
``vpmaddubsw`` into int16 sums): independent accumulator chains, all threads, no memory traffic (the
ceiling a GEMM's int8 work can reach).
"""
from __future__ import annotations

import time

import numpy as np

from tvm_ext.bench.phi2.decode import decoder, model_kernels
from tvm_ext.bench.timing import set_threads
from tvm_ext.rulesets import PROMPT_SCHEDULES as SCHEDULES
from tvm_ext.rulesets import check_schedules
PROMPT_FUNCS = ("embed_prompt", "prefill", "head_prompt")


def int8_peak(threads: int, form: str = "avx512vnni", chains: int | None = None, steps: int = 200_000) -> float:
    """int8 ops per second (2 per multiply-add) of ``threads`` threads each running ``chains``
    independent chains of the q4 x int8 GEMM's product step in ``form`` (``q4_vnni.FORMS``: two
    ``vpdpbusd``, or on AVX2 two ``vpmaddubsw`` added to int16 sums; registers only): the ceiling the
    GEMM's int8 work can reach with its instructions (AVX2's once-per-group ``vpmaddwd`` left out, so the
    ceiling is if anything high).  Each step reads its accumulator's bytes as one operand, so no step can
    be hoisted out of the loop.  ``chains``: by default as many as fit the registers with the operands
    (24 of 32 zmm; 12 of 16 ymm on the 256-bit forms: 24 spill there, and the stores become the bound)."""
    import tvm

    from tvm_ext.intrinsics.q4_vnni import FORMS, LANES
    from tvm_ext.targets import resolve_target

    lanes = FORMS[form]
    chains = chains or (24 if lanes == LANES else 12)
    func = peak_func(threads, form, chains, steps)
    lib = tvm.compile(tvm.IRModule({"main": func}), target=resolve_target("llvm"))
    dev = tvm.cpu()
    out = func.params[0]
    a = tvm.runtime.tensor(np.zeros([int(d) for d in out.shape], str(out.dtype)), dev)
    w = tvm.runtime.tensor(np.ones(8 * lanes, "int8"), dev)
    sec = min(lib.mod.time_evaluator("main", dev, number=3, repeat=5)(a, w).results)
    return threads * chains * steps * lanes * 8 * 2 / sec  # a step: 2 x 4 x lanes multiply-adds


def peak_func(threads: int, form: str, chains: int, steps: int):
    """The PrimFunc ``int8_peak`` times: out (threads, chains, lanes) of the step's accumulator (int32; on
    AVX2 int16, twice the lanes), w (8 * lanes,) int8 (the two parities' weight bytes: distinct operands,
    so the two products cannot be merged into one)."""
    from tvm import tirx
    from tvm.script import tirx as T

    from tvm_ext.intrinsics.q4_vnni import FORMS, _product

    step, dtype, lanes = _product(form), "int16" if form == "avx2" else "int32", FORMS[form]
    acc_lanes = 2 * lanes if form == "avx2" else lanes

    @T.prim_func
    def peak(out: T.Buffer((threads, chains, acc_lanes), dtype), w: T.Buffer((8 * lanes,), "int8")):
        T.func_attr({"tirx.noalias": True})
        for t in T.parallel(threads):
            acc = T.decl_buffer((chains, acc_lanes), dtype)
            for c in T.unroll(chains):
                acc[c, T.ramp(0, 1, acc_lanes)] = T.broadcast(T.Cast(dtype, c), acc_lanes)
            for _ in range(steps):
                for c in T.unroll(chains):
                    a = tirx.reinterpret(f"int8x{4 * lanes}", acc[c, T.ramp(0, 1, acc_lanes)])
                    acc[c, T.ramp(0, 1, acc_lanes)] = step(acc[c, T.ramp(0, 1, acc_lanes)], a,
                                                           w[T.ramp(0, 1, 4 * lanes)], a,
                                                           w[T.ramp(4 * lanes, 1, 4 * lanes)])
            for c in T.unroll(chains):
                out[t, c, T.ramp(0, 1, acc_lanes)] = acc[c, T.ramp(0, 1, acc_lanes)]

    return peak


def _gemm_shapes(model) -> dict:
    """{kernel name: (M, N, K)} of the prefill's GEMMs (the prompt's tokens at once; the head's
    one-token lm_head is a GEMV)."""
    from tvm_ext.tir_utils import blocks_of
    from tvm_ext.workloads.phi2.q4_int8_gemm import DOT_BLOCK

    out = {}
    for name, mod in model_kernels(model, PROMPT_FUNCS).items():
        blocks = [b for b in blocks_of(mod["main"]) if b.name_hint == DOT_BLOCK]
        if blocks:
            ext = [int(iv.dom.extent) for iv in blocks[0].iter_vars]  # g, t, nb, 16, 4, 2, 4
            if ext[1] > 1:
                out[name] = (ext[1], ext[2] * 16, ext[0] * 32)
    return out


PROJECTIONS = (("qkv", "qkv"), ("o", "dense"), ("fc1", "fc1"), ("fc2", "fc2"))  # (peer name, weight name)


def ort_gemms(model, tokens: int, threads: int, repeat: int = 5, log=print) -> dict:
    """{projection: {"M", "N", "K", "ms"}}: ONNX Runtime's MatMulNBits at accuracy_level 4 (int8
    activations, as ours) on layer 0's weights and ``tokens`` random activation rows, one node per
    session, the median of ``repeat`` runs after a warm-up (weights in cache: at prompt sizes the
    GEMM is compute-bound, ~0.1 int8 op per weight byte read per token)."""
    from tvm_ext.bench.phi2.peers import ort_model, ort_session
    from tvm_ext.bench.timing import wait_until_idle

    weights, rng, out = model.layer_weights(0), np.random.default_rng(0), {}
    for proj, wname in PROJECTIONS:
        packed, scale, bias = weights[wname]
        n, k = packed.shape[0], packed.shape[1] * 8
        x = {"x": rng.standard_normal((tokens, k)).astype("float32")}
        sess = ort_session(ort_model([(packed, scale, bias)], 4, tokens), threads)
        sess.run(None, x)
        times = []
        for _ in range(repeat):
            wait_until_idle()
            t0 = time.perf_counter()
            sess.run(None, x)
            times.append(time.perf_counter() - t0)
        sess = None  # its spinning pool gone before the next one
        out[proj] = {"M": tokens, "N": n, "K": k, "ms": 1e3 * float(np.median(times))}
        log(f"ORT MatMulNBits (accuracy_level 4) {proj} {tokens}x{k}x{n}: {out[proj]['ms']:.2f} ms")
    return out


def _timed_prompt(dec, prompt, context, tokens, repeat, log):
    """{ttft_s, prefill_s, tok_s, decode_tok_s, generated, first_logits, kernel_s} of ``dec``."""
    dec.fill_past(context)
    t0 = time.perf_counter()
    first = dec.prefill(prompt, context)
    ttft = time.perf_counter() - t0
    first_id = int(np.argmax(first))
    times = [ttft]
    for i in range(repeat):
        t0 = time.perf_counter()
        dec.prefill(prompt, context)
        times.append(time.perf_counter() - t0)
        log(f"prefill {i + 1}/{repeat}: {len(prompt) / times[-1]:.1f} tok/s")
    kernel_s = dec.timed_kernels(lambda call: dec.prefill(prompt, context, call=call))
    stamps = []  # when each token was out: the first comes from the prefill, the others from decode steps
    ids, _ = dec.generate(prompt, tokens, start=context, on_token=lambda n: stamps.append(time.perf_counter()))
    decode_s = stamps[-1] - stamps[0]
    return {"ttft_s": ttft, "prefill_s": min(times), "prefill_s_all": times, "tok_s": len(prompt) / min(times),
            "decode_tok_s": (tokens - 1) / decode_s if tokens > 1 else None, "generated": ids, "first_id": first_id,
            "first_logits": first, "kernel_s": kernel_s}


def prompt_rows(schedules=SCHEDULES, config="full", layers=None, prompt=128, tokens=16, context=0, threads=None,
                log=print, target="llvm", seed=0, database=None, repeat=3, reference=True, tune_trials=0,
                ort=False, prefill_attention="fused") -> dict:
    """Run each of ``schedules`` on the same prompt (see the module doc); one JSON-able dict.
    ``tune_trials``: first tune the model's prompt kernels that many trials each into ``database``
    (the kernels depend on prompt, context + prompt + tokens and config: tune with the same).  The cache holds
    context + prompt + tokens - 1 positions: the last token generated is never fed back, so a 2048-token
    prompt and its next token fit Phi-2's window.
    ``ort``: also ONNX Runtime's MatMulNBits on each projection's shape (``ort_gemms``), each row's
    GEMMs compared with it (``gemm_vs_ort``: our ms / ORT's, per projection).  ``prefill_attention``:
    ``model.build_model``'s (fused or unfused)."""
    import tvm

    from tvm_ext.targets import describe_host, physical_cores
    from tvm_ext.workloads.phi2 import model as pm
    from tvm_ext.workloads.phi2.q4_int8_gemm import check_target

    schedules = check_schedules(schedules, SCHEDULES, "for a prompt")
    check_target(target)
    if "tuned" in schedules and not tune_trials:
        from tvm_ext.tune.seeds import tuned_inputs

        tuned_inputs(database, target)
    threads = int(threads or physical_cores())
    set_threads(threads)
    layers = pm.DEFAULT_LAYERS.get(config, 1) if layers is None else int(layers)
    capacity = context + prompt + tokens - 1
    model = pm.build_model(config, layers, capacity=capacity, seed=seed, compute="int8", prompt=prompt,
                           prefill_attention=prefill_attention)
    ids = [int(t) for t in np.random.default_rng([seed, 7]).integers(model.cfg["vocab"], size=prompt)]
    if tune_trials:
        from tvm_ext.bench.cycled import CycledTimer
        from tvm_ext.tune.seeds import tune_from_rules

        tune_from_rules(model_kernels(model, PROMPT_FUNCS), target, database, tune_trials, log,
                        measure=CycledTimer(target))
    shapes = _gemm_shapes(model)
    dev, rows, shared = tvm.cpu(0), [], None
    for how in schedules:
        dec = decoder(model, target, how, dev=dev, log=log, database=database, share=shared)
        shared = shared or dec
        row = {"schedule": how, "rules": dec.rules, **_timed_prompt(dec, ids, context, tokens, repeat, log)}
        calls = layers  # each prefill kernel runs once per layer
        row["gemm_ms"] = {n: 1e3 * row["kernel_s"][n] / calls for n in shapes if row["kernel_s"].get(n)}
        row["gemm_tops"] = {n: 2 * m * nn * k / (row["gemm_ms"][n] / 1e3) / 1e12
                            for n, (m, nn, k) in shapes.items() if n in row["gemm_ms"]}
        rows.append(row)
        log(f"{how}: prefill {row['tok_s']:.1f} tok/s, first token after {row['ttft_s']:.2f} s")
    out = {"config": config, "layers": layers, "prompt": prompt, "context": context, "tokens": tokens,
           "capacity": capacity,
           "prefill_attention": model.prefill_attention,
           "threads": threads, "device": describe_host(), "rows": rows}
    if ort:
        out["ort_gemms"] = ort_gemms(model, prompt, threads, log=log)
        by_shape = {(g["M"], g["N"], g["K"]): proj for proj, g in out["ort_gemms"].items()}
        for r in rows:
            r["gemm_vs_ort"] = {by_shape[shapes[n]]: ms / out["ort_gemms"][by_shape[shapes[n]]]["ms"]
                                for n, ms in r["gemm_ms"].items() if shapes[n] in by_shape}
    if reference:
        fmodel = pm.build_model(config, layers, capacity=capacity, seed=seed, compute="float")
        fdec = decoder(fmodel, target, "rule", dev=dev, log=log, share=shared)
        fdec.fill_past(context)
        t0 = time.perf_counter()
        fids, flogits = fdec.generate(ids, tokens, start=context)
        out["float"] = {"schedule": "rule (token by token)", "generated": fids, "seconds": time.perf_counter() - t0}
        for r in rows:
            r["vs_float"] = {"first_token_same": r["generated"][0] == fids[0],
                             "same_tokens": float(np.mean([a == b for a, b in zip(r["generated"], fids)])),
                             "max_abs_logit_err": float(np.max(np.abs(r["first_logits"] - flogits[0]))),
                             "max_abs_logit": float(np.max(np.abs(flogits[0]))),
                             "top1_same": int(np.argmax(r["first_logits"])) == int(np.argmax(flogits[0]))}
    from tvm_ext.intrinsics.q4_vnni import form_for
    from tvm_ext.targets import resolve_target

    form = form_for(resolve_target(target))  # the GEMM's instructions here, and their peak
    out["int8_peak_form"], out["int8_peak_tops"] = form, int8_peak(threads, form) / 1e12
    out["vnni_peak_tops"] = out["int8_peak_tops"] if form == "avx512vnni" else None  # as older results name it
    for r in rows:
        r.pop("first_logits")
    return out
