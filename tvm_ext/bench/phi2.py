"""Phi-2 q4f16_1 kernels bench: fused vs unfused x dlight / metaschedule / seeded.

Entry point for ``tvm-ext bench phi2-decode|phi2-prefill`` (wired by the CLI):

    run(workload, target="llvm", trials=None, from_logs=False, build_only=False,
        out_json=None, threads=None, log=print, config="full", context=512, tokens=128,
        tuning_dir="tuning_logs") -> dict

workload    "phi2-decode" or "phi2-prefill".
target      "llvm", "cuda", a JSON dict / Target (resolved by tvm_ext.targets when present).
trials      MetaSchedule trials *per kernel* for the "metaschedule" and "seeded" databases;
            None = DEFAULT_TRIALS[workload].  0 = do not tune (use what the logs hold).
from_logs   do not tune; read tuning_logs/phi2-<kind>-<target>-<fused|unfused>/{metaschedule,seeded}.
build_only  build every kernel of every schedule, run nothing (the path for cuda without a GPU:
            nvcc compiles each kernel; metaschedule/seeded without cuda logs use a design-space
            sample / the dlight seed).  Returns {"built": n, "kernels": [...]}.
out_json    where to write the JSON (default tuning_logs/bench-<workload>-<target kind>.json).
threads     TVM thread-pool size (default: all cores TVM sees).

Tuning goes through ``tvm_ext.tune`` (``tune_kernels``: the stack's builder, cache-flushing
runner, search strategy and databases); the kernels' schedules, builds and checks are in
``tvm_ext.bench.phi2_kernels``; the table is printed by the CLI (``tvm_ext.cli.phi2_table``).

The returned dict (= the JSON) is
{"workload", "target", "device", "bandwidth_gbs", "compute_dtype", "trials_per_kernel",
 "rows": [{"fusion": "on"|"off"|"n/a", "schedule": "dlight"|"metaschedule"|"seeded"|"torch-bf16",
           "layer_ms", "head_ms", "tok_s", "bound_layer_ms", "vs_dlight_off",
           "kernels": [{"name", "ms", "bound_ms", "calls", "part", ...}]}],
 "fusion_losses": [...], "targets": {...}}
Kernel "ms" and "bound_ms" are per layer (per call x calls).  All times come from one process,
interleaved round by round, with the CPU cache flushed before each kernel run (a real model
streams 32 layers of weights, ~1.3 GB, through the cache).
"""
from __future__ import annotations

import json
import os
import time
from collections import Counter

import numpy as np
import tvm_ffi

from tvm_ext.bench.phi2_kernels import (best_schedule, build, build_validator, combine,
                                        dlight_schedule, is_gpu, kernelsets, log_dir,
                                        measure_bandwidth, nbytes, normalize, nvcc_build,
                                        random_args, sampled_schedule, seed_database, timer, verify)
from tvm_ext.targets import resolve_target
from tvm_ext.tune.database import DB_FILES, open_database
from tvm_ext.tune.kernels import kernel_database, trials_to_beat, tune_kernels
from tvm_ext.tune.runner import make_runner

DEFAULT_TRIALS = {"phi2-decode": 6, "phi2-prefill": 3}
SCHEDULES = ("dlight", "metaschedule", "seeded")
N_LAYERS = 32


# --------------------------------------------------------------------------- schedules
def _schedules(ks, target, kind, trials, from_logs, build_only, tuning_dir, log, dev, rng, repeat):
    """For one fusion mode: {schedule: {kernel name: scheduled IRModule}}, dlight rules,
    dlight seconds, the database dirs {schedule: path}.

    dlight kernels are timed here only when tuning (the seeded database starts from those
    times); with ``from_logs`` that pass is skipped (real-size prefill: minutes) and the
    caller compares the records with the bench's own dlight times."""
    mods = {}
    for k in ks.kernels:
        mods.setdefault(k.name, normalize(k.func))
    dl = {name: dlight_schedule(m, target, build_validator(target)) for name, m in mods.items()}
    scheduled = {"dlight": {n: (s.mod if s is not None else mods[n]) for n, (_, s) in dl.items()}}
    dl_secs, dbs = {}, {}
    tuning = not build_only and not from_logs
    if tuning:
        for name in mods:
            rt = build(scheduled["dlight"][name], target)
            args = random_args(mods[name]["main"], dev, rng)
            dl_secs[name] = float(np.median(timer(rt, dev, repeat)(*args).results))
    for sched in ("metaschedule", "seeded"):
        path = log_dir(tuning_dir, kind, target, ks.fusion, sched)
        if not tuning and not os.path.exists(os.path.join(path, DB_FILES[1])):
            # no database: the dlight seed, and for metaschedule a design-space sample when
            # only building (the kernel as it is when benching from logs)
            if sched == "seeded":
                scheduled[sched] = dict(scheduled["dlight"])
            elif build_only:
                scheduled[sched] = {n: (sampled_schedule(m, target) or m) for n, m in mods.items()}
            else:
                scheduled[sched] = dict(mods)
            log(f"  {sched}: no database in {path}")
            continue
        dbs[sched] = path
        if tuning:
            db = kernel_database(path, log)
            if sched == "seeded":
                seed_database(db, mods, dl, target, dl_secs)
            if trials:
                log(f"  tuning {len(mods)} kernels x {trials} trials -> {path}")
                tune_kernels(mods, target, path, trials + (1 if sched == "seeded" else 0),
                             log_dir=path + "-work", runner=make_runner(flush_cache=not is_gpu(target)),
                             log=log)
        db = open_database(path, read_only=not tuning)  # benching from logs never writes there
        scheduled[sched] = {}
        for name, m in mods.items():
            best = best_schedule(db, m)
            if best is None:  # no record: fall back to dlight (seeded) or the plain kernel
                best = scheduled["dlight"][name] if sched == "seeded" else m
            scheduled[sched][name] = best
    return scheduled, {n: r for n, (r, _) in dl.items()}, dl_secs, dbs


def database_trials(dbs_by_fusion) -> int | None:
    """Trials per kernel the metaschedule databases hold (what --from-logs benches): the
    most records of any kernel, i.e. the budget; kernels with few distinct candidates
    (copies, adds) stop earlier because MetaSchedule does not measure a schedule twice.
    ``dbs_by_fusion``: {fusion: {schedule: database dir}}."""
    most = []
    for dbs in dbs_by_fusion.values():
        if "metaschedule" not in dbs:
            continue
        records = open_database(dbs["metaschedule"], read_only=True).get_all_tuning_records()
        most.append(max(Counter(tvm_ffi.structural_hash(r.workload.mod) for r in records).values(),
                        default=0))
    return max(most, default=0) or None


def _trials_to_beat(dbs, ks, dl_secs, measured):
    """{schedule: {kernel: trials to beat dlight}} for one fusion mode; dlight's time is the
    one measured before tuning when this run tuned, else the bench's own median.  Counted in
    the order the candidates were measured (``tvm_ext.tune.kernels``); None where the
    database has no measurement order (not tuned by ``tune_kernels``) or nothing beat dlight."""
    mods = {k.name: normalize(k.func) for k in ks.kernels}
    return {s: {name: trials_to_beat(path, m, dl_secs.get(name, measured[name]))
                for name, m in mods.items()}
            for s, path in dbs.items()}


# --------------------------------------------------------------------------- main
def run(workload, target="llvm", trials=None, from_logs=False, build_only=False, out_json=None,
        threads=None, log=print, config="full", context=512, tokens=128, tuning_dir="tuning_logs",
        rounds=5, repeat=3):
    """Run the bench (see the module docstring).  Returns the result dict."""
    if threads:
        os.environ["TVM_NUM_THREADS"] = str(threads)
    import tvm

    if threads:
        cfg_pool = tvm.get_global_func("runtime.config_threadpool", allow_missing=True)
        if cfg_pool is not None:
            cfg_pool(1, int(threads))
    target = resolve_target(target)
    gpu = is_gpu(target)
    if build_only and gpu:
        os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    kind = workload.replace("phi2-", "")
    trials = DEFAULT_TRIALS.get(workload, 4) if trials is None else int(trials)
    dtype = "float16" if gpu else "float32"
    dev = None if build_only else (tvm.cuda(0) if gpu else tvm.cpu(0))
    rng = np.random.default_rng(0)
    wls, kss = kernelsets(workload, config, context, tokens, dtype)
    t_start = time.time()

    # ---- schedules and tuning
    sched, rules, dl_secs, dbs = {}, {}, {}, {}
    for fusion in (False, True):
        log(f"[{workload}] fusion {'on' if fusion else 'off'}: {len(kss[fusion].kernels)} kernels")
        sched[fusion], rules[fusion], dl_secs[fusion], dbs[fusion] = _schedules(
            kss[fusion], target, kind, trials, from_logs, build_only, tuning_dir, log, dev, rng, repeat
        )
    if from_logs:  # report what the databases hold, not the default budget
        trials = database_trials(dbs) or trials
    if build_only:
        return _build_only(sched, rules, target, t_start, workload, log)

    verified = _verify_dlight(wls, kss, sched, target, dev, log)
    sec, bandwidth, bw_np = _measure(kss, sched, target, dev, rng, rounds, repeat, log)
    beat = {fusion: _trials_to_beat(dbs[fusion], kss[fusion], dl_secs[fusion],
                                    {n: t for (f, s, n), t in sec.items() if f == fusion and s == "dlight"})
            for fusion in (False, True)}
    ntok = 1 if kind == "decode" else tokens
    rows = _rows(kss, sec, bandwidth, rules, beat, verified, ntok)
    ks_off = kss[False]
    ks_off.cfg, ks_off.n = wls[False]._phi2["cfg"], wls[False]._phi2["n"]
    trow = _torch_row(ks_off, threads, bandwidth * 1e9, rounds, log)
    if trow:
        rows.append(trow)

    result = {
        "workload": workload, "target": str(target), "device": _cpu_model() if not gpu else str(dev),
        "threads": threads or _pool_threads(), "bandwidth_gbs": bandwidth, "bandwidth_numpy_gbs": bw_np,
        "compute_dtype": dtype, "config": config, "trials_per_kernel": trials,
        "context": context if kind == "decode" else None, "tokens": ntok, "rows": rows,
    }
    result["fusion_losses"] = _fusion_losses(rows)
    result["targets"] = _targets(rows, trow)
    if out_json is None:
        out_json = os.path.join(tuning_dir, f"bench-{workload}-{target.kind.name}.json")
    if out_json:
        os.makedirs(os.path.dirname(out_json) or ".", exist_ok=True)
        with open(out_json, "w") as f:
            json.dump(result, f, indent=1)
        log(f"wrote {out_json}")
    return result


def _verify_dlight(wls, kss, sched, target, dev, log):
    """dlight end to end against NumPy (one VM build per fusion mode); the metaschedule and
    seeded kernels are checked against their dlight kernel on the timing inputs (``_measure``)."""
    verified = {}
    for fusion in (False, True):
        pairs = [(normalize(k.func), sched[fusion]["dlight"][k.name]) for k in kss[fusion].kernels]
        ok, msg = verify(wls[fusion], pairs, target, dev)
        log(f"  verify fusion={'on' if fusion else 'off'} dlight vs NumPy: {'ok' if ok else 'MISMATCH'} {msg}")
        if not ok:
            raise RuntimeError(f"phi2 dlight fusion={fusion} does not match NumPy: {msg}")
        for s in SCHEDULES:
            verified[(fusion, s)] = msg if s == "dlight" else "kernels match dlight"
    return verified


def _measure(kss, sched, target, dev, rng, rounds, repeat, log):
    """Median seconds {(fusion, schedule, kernel): s} of every kernel, timed interleaved round
    by round, plus the copy bandwidth bound (GB/s) and numpy's copy bandwidth."""
    import tvm

    bw_tvm, bw_np = measure_bandwidth(dev)
    log(f"  copy bandwidth: {bw_tvm:.1f} GB/s (TVM parallel copy), {bw_np:.1f} GB/s (numpy)")
    timers, args = {}, {}
    for fusion in (False, True):
        for k in kss[fusion].kernels:
            key = (fusion, k.name)
            if key not in args:
                args[key] = random_args(k.func, dev, rng)
            outs = {}
            for s in SCHEDULES:
                if (fusion, s, k.name) not in timers:
                    ex = build(sched[fusion][s][k.name], target)
                    timers[(fusion, s, k.name)] = timer(ex, dev, repeat)
                    a = [tvm.runtime.tensor(x.numpy(), dev) for x in args[key]]
                    ex.jit()["main"](*a) if hasattr(ex, "jit") else ex["main"](*a)
                    outs[s] = a[-1].numpy().astype("float64")
            if "dlight" in outs:
                for s in ("metaschedule", "seeded"):
                    if s in outs and not np.allclose(outs[s], outs["dlight"], rtol=1e-3, atol=1e-3):
                        err = float(np.max(np.abs(outs[s] - outs["dlight"])))
                        raise RuntimeError(f"{s} kernel {k.name} (fusion={fusion}) differs from dlight: {err:.3g}")
    samples = {key: [] for key in timers}
    bw_samples = []
    for r in range(rounds):
        for key, f in timers.items():
            samples[key].append(float(np.median(f(*args[(key[0], key[2])]).results)))
        bw_samples.append(measure_bandwidth(dev, repeat=1)[0])
        log(f"  round {r + 1}/{rounds} done")
    # the bound uses the faster of the two copies (on a loaded 2-core box numpy's
    # single-thread copy can beat TVM's 2-thread one): the stricter bound
    bandwidth = max(float(np.median(bw_samples + [bw_tvm])), bw_np)
    return {key: float(np.median(v)) for key, v in samples.items()}, bandwidth, bw_np


def _rows(kss, sec, bandwidth, rules, beat, verified, ntok):
    rows = []
    for fusion in (False, True):
        for s in SCHEDULES:
            ks_, layer, head, bound_layer = [], 0.0, 0.0, 0.0
            for k in kss[fusion].kernels:
                ms_ = sec[(fusion, s, k.name)] * 1e3 * k.calls
                b = nbytes(k.func) / bandwidth / 1e6 * k.calls
                e = {"name": k.name, "ms": ms_, "bound_ms": b, "calls": k.calls, "part": k.part}
                if s == "dlight":
                    e["rule"] = rules[fusion][k.name]
                else:
                    e["trials_to_beat_dlight"] = beat[fusion].get(s, {}).get(k.name)
                if fusion:
                    e["parts"] = k.parts
                ks_.append(e)
                if k.part == "layer":
                    layer += ms_
                    bound_layer += b
                else:
                    head += ms_
            rows.append({"fusion": "on" if fusion else "off", "schedule": s, "layer_ms": layer, "head_ms": head,
                         "tok_s": ntok * 1e3 / (N_LAYERS * layer + head), "bound_layer_ms": bound_layer,
                         "verified": verified[(fusion, s)], "kernels": ks_})
    base = next(r for r in rows if r["fusion"] == "off" and r["schedule"] == "dlight")
    for r in rows:
        r["vs_dlight_off"] = base["layer_ms"] / r["layer_ms"]
    return rows


def _build_only(sched, rules, target, t_start, workload, log):
    built = []
    for fusion in (False, True):
        for s in SCHEDULES:
            # one module (one nvcc call) per fusion mode and schedule kind
            batch = combine(sched[fusion][s])
            if is_gpu(target):
                nvcc_build(batch, target)
            else:
                build(batch, target)
            for name in sched[fusion][s]:
                built.append({"fusion": "on" if fusion else "off", "schedule": s, "name": name,
                              "rule": rules[fusion][name] if s == "dlight" else None})
            log(f"  built fusion={'on' if fusion else 'off'} {s}: {len(sched[fusion][s])} kernels")
    log(f"built {len(built)} kernels for {target.kind.name} in {time.time() - t_start:.0f} s")
    return {"workload": workload, "target": str(target.kind.name), "built": len(built), "kernels": built}


def _torch_row(ks_unfused, threads, bandwidth, rounds, log):
    try:
        import torch
    except ImportError:
        log("torch not importable: no torch-bf16 row")
        return None
    if threads:
        torch.set_num_threads(threads)
    cfg = ks_unfused.cfg
    n = ks_unfused.n
    d, m = cfg["hidden"], cfg["mlp"]
    shapes = {"qkv": (d, 3 * d), "dense": (d, d), "fc1": (d, m), "fc2": (m, d)}
    res = []
    for name, (k, nout) in shapes.items():
        x = torch.randn(1, n, k, dtype=torch.bfloat16)
        w = torch.randn(nout, k, dtype=torch.bfloat16)
        b = torch.randn(nout, dtype=torch.bfloat16)
        torch.nn.functional.linear(x, w, b)
        ts = []
        for _ in range(rounds * 3):
            t0 = time.perf_counter()
            torch.nn.functional.linear(x, w, b)
            ts.append(time.perf_counter() - t0)
        ms_ = float(np.median(ts)) * 1e3
        moved = 2 * (n * k + nout * k + nout + n * nout)
        res.append({"name": name, "ms": ms_, "bound_ms": moved / bandwidth / 1e6, "calls": 1, "part": "layer"})
    layer = sum(r["ms"] for r in res)
    return {"fusion": "n/a", "schedule": "torch-bf16", "layer_ms": layer, "head_ms": None, "tok_s": None,
            "bound_layer_ms": sum(r["bound_ms"] for r in res), "kernels": res}


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def _pool_threads():
    return int(os.environ.get("TVM_NUM_THREADS", os.cpu_count() or 1))


def row(rows, fusion, s):
    """The row of ``rows`` for fusion "on"/"off" and schedule ``s``."""
    return next(r for r in rows if r["fusion"] == fusion and r["schedule"] == s)


def _fusion_losses(rows):
    """Fused kernels slower under dlight than the sum of their unfused parts under dlight."""
    on, off = row(rows, "on", "dlight"), row(rows, "off", "dlight")
    off_ms = {}
    for k in off["kernels"]:
        off_ms[k["name"]] = k["ms"] / k["calls"]
    out = []
    for k in on["kernels"]:
        if len(k["parts"]) < 2:
            continue
        parts_ms = sum(off_ms[p] for p in k["parts"]) * k["calls"]
        ms_k = {s: next(x for x in row(rows, "on", s)["kernels"] if x["name"] == k["name"])["ms"]
                for s in SCHEDULES}
        out.append({"name": k["name"], "parts": k["parts"], "rule": k["rule"], "fused_ms": k["ms"],
                    "parts_ms": parts_ms, "slower": k["ms"] > parts_ms,
                    "metaschedule_ms": ms_k["metaschedule"], "seeded_ms": ms_k["seeded"]})
    return out


def _targets(rows, trow):
    fused = [r for r in rows if r["fusion"] == "on"]
    best = min(fused, key=lambda r: r["layer_ms"])
    t = {"best_fused": best["schedule"], "best_fused_vs_bound": best["layer_ms"] / best["bound_layer_ms"]}
    best_kind = min(SCHEDULES, key=lambda s: min(row(rows, f, s)["layer_ms"] for f in ("on", "off")))
    t["best_kind"] = best_kind
    t["fused_over_unfused_best_kind"] = row(rows, "on", best_kind)["layer_ms"] / row(rows, "off", best_kind)["layer_ms"]
    t["ms_over_dlight_fused"] = row(rows, "on", "metaschedule")["layer_ms"] / row(rows, "on", "dlight")["layer_ms"]
    worst = 0.0
    for f in ("on", "off"):
        d = {k["name"]: k["ms"] for k in row(rows, f, "dlight")["kernels"]}
        for k in row(rows, f, "seeded")["kernels"]:
            worst = max(worst, k["ms"] / d[k["name"]])
    t["seeded_worst_kernel_vs_dlight"] = worst
    t["torch_bf16_over_best_fused"] = trow["layer_ms"] / best["layer_ms"] if trow else None
    return t
