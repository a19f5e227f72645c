"""Phi-2 q4f16_1 kernels bench: fused vs unfused x dlight / metaschedule / seeded (/ rule),
with ONNX Runtime / PyTorch peers per projection.

Entry point for ``tvm-ext bench phi2-decode|phi2-prefill`` (wired by the CLI):

    run(workload, target="llvm", trials=None, from_logs=False, build_only=False,
        out_json=None, threads=None, log=print, config="full", context=512, tokens=128,
        tuning_dir=None, rounds=5, repeat=3, peers=None, schedules=None) -> dict

workload    "phi2-decode" or "phi2-prefill".
target      "llvm", "cuda", a JSON dict / Target (resolved by tvm_ext.targets when present).
trials      MetaSchedule trials *per kernel* for the "metaschedule" and "seeded" databases;
            None = DEFAULT_TRIALS[workload].  0 = do not tune (use what the logs hold).
from_logs   do not tune; read tuning_logs/phi2-<kind>-<target>-<fused|unfused>/{metaschedule,seeded}.
tuning_dir  where those databases are (default tuning_logs with from_logs, else tvm_ext_work,
            git-ignored, where tuning writes; ``tvm-ext save`` copies a result into tuning_logs).
build_only  build every kernel of every schedule, run nothing (the path for cuda without a GPU:
            nvcc compiles each kernel; metaschedule/seeded without cuda logs use a design-space
            sample / the dlight seed).  Returns {"built": n, "kernels": [...]}.
out_json    where to write the JSON (default tvm_ext_work/bench-<workload>-<target kind>.json).
threads     TVM (and peer) thread-pool size (default: all cores TVM sees).
peers       ["ort", "torch"]: per projection, ORT MatMulNBits at accuracy_level 0 and 4 and
            torch bf16/fp32 linear on the same weights (``tvm_ext.bench.phi2.peers``).
int8        also time tvm_ext's int8-activation projections (``int8``; phi2-decode on an
            AVX2 CPU): a different computation, with its error against the float reference.
schedules   which of SCHEDULES (+ "rule" where rules/dequant_gemv.py exists) to run; dlight
            always runs (every other schedule is checked against it).

Tuning goes through ``tvm_ext.tune`` (``tune_kernels``: the stack's builder, cache-flushing
runner, search strategy and databases, ``tvm_ext.space``); the seeded database starts from our
rules' untuned schedule where one applies (the "rule" row's; CPU) and dlight's elsewhere, each
measured by that same runner first (``kernels.runner_seconds``), so a record ranks above the
seed only when the runner measured it faster, and then only if it also wins measured beside the seed
(``seeds.confirm_picks``): seeded is the rule row tuned.  Schedules, builds and checks are in
``kernels``; timing (DRAM-honest: weights cycled through copies exceeding the LLC)
in ``measure``; the table is printed by the CLI (``tvm_ext.cli.phi2_table``).

The returned dict (= the JSON) is
{"workload", "target", "device": {"name", "flags"}, "llc_bytes", "llc_source", "copy_plan": {"cycle_bytes", "sweep"},
 "weight_copies": {kernel: C}, "bandwidth_gbs", "compute_dtype", "trials_per_kernel", "schedules",
 "rows": [{"fusion": "on"|"off", "schedule", "layer_ms", "head_ms", "tok_s", "bound_layer_ms",
           "vs_dlight_off", "kernels": [{"name", "ms", "bound_ms", "floor_ms", "calls", "part", "copies",
                                         "ms_cache_hot", "projection", ...}]}],
 "peers": [{"peer": "ort-acc0"|"ort-acc4"|"torch-bf16"|"torch-fp32", "projection", "ms",
            "bound_ms", "copies", "max_abs_err"}],
 "int8": [{"schedule": "rule-int8", "projection", "ms", "bound_ms", "copies", "max_abs_err",
           "max_abs_ref"}] (with ``int8``),
 "fusion_losses": [...], "targets": {...}}
Kernel "ms" and "bound_ms" are per layer (per call x calls); "ms" is the DRAM figure
(see ``measure``), "ms_cache_hot" the labelled cache-hot one; "bound_ms" = bytes the
kernel moves / the copy bandwidth measured in the same run; "floor_ms" (fused kernels) that of its
touch kernel (``bench.touch``: the same bytes read and written, no compute, on the same copies).
Peers' "ms" is per call.
All times come from one process, interleaved round by round.
"""
from __future__ import annotations

import json
import os
import time
from collections import Counter

import numpy as np
import tvm_ffi

from tvm_ext.bench.phi2 import measure as phi2_measure
from tvm_ext.bench.dram import CopyPlan, cpu_info, llc_bytes
from tvm_ext.bench.phi2.kernels import (build, combine, kernelsets, log_dir, nbytes, normalize, nvcc_build,
                                        runner_seconds, sampled_schedule, verify)
from tvm_ext.bench.phi2.peers import make_peers
from tvm_ext.bench.timing import set_threads
from tvm_ext.targets import resolve_target
from tvm_ext.tune import packed
from tvm_ext.tune.database import DB_FILES, WORK_ROOT, databases_root, open_database
from tvm_ext.tune.kernels import kernel_database, trials_to_beat, tune_kernels
from tvm_ext.tune.runner import make_runner
from tvm_ext.bench.cycled import CycledTimer
from tvm_ext.rulesets import LAYER_SCHEDULES, check_schedules
from tvm_ext.scheduling import (best_schedule, build_validator, dlight_schedule, is_gpu, rule_schedule,
                                tuned_schedule)
from tvm_ext.tune.seeds import confirm_picks, read_kept, seed_database

DEFAULT_TRIALS = {"phi2-decode": 6, "phi2-prefill": 3}
SCHEDULES = LAYER_SCHEDULES[:3]  # the rows every install has; "rule" where our rules exist for the target
N_LAYERS = 32


# --------------------------------------------------------------------------- schedules
def _schedules(ks, target, kind, trials, from_logs, build_only, tuning_dir, log, schedules=SCHEDULES,
               runner=None, builder=None):
    """For one fusion mode: {schedule: {kernel name: scheduled IRModule}}, dlight rules,
    dlight seconds, the database dirs {schedule: path}.

    The dlight kernels are measured by the tuning ``runner`` (default: the stack's
    cache-flushing LocalRunner; ``builder`` the stack's builder) -- before tuning, where those
    seconds seed the seeded database, or after opening the databases of ``from_logs`` -- so
    trials-to-beat-dlight compares seconds the same runner measured (real-size prefill: minutes)."""
    mods = {}
    for k in ks.kernels:
        mods.setdefault(k.name, normalize(k.func))
    dl = {name: dlight_schedule(m, target, build_validator(target)) for name, m in mods.items()}
    scheduled = {"dlight": {n: (s.mod if s is not None else mods[n]) for n, (_, s) in dl.items()}}
    wanted = bool({"rule", "seeded"} & set(schedules))  # the rows that start from them
    ours = {n: rule_schedule(m, target) if wanted else None for n, m in mods.items()}
    # our rules' schedule where one applies, dlight's elsewhere: the "rule" row and the seeds
    start = {n: scheduled["dlight"][n] if ours[n] is None else ours[n][1].mod for n in mods}
    if "rule" in schedules:
        scheduled["rule"] = dict(start)
    dl_secs, dbs = {}, {}
    tuning = not build_only and not from_logs
    tuned = [s for s in ("metaschedule", "seeded") if s in schedules]
    if tuning and tuned:
        runner = runner if runner is not None else make_runner(flush_cache=not is_gpu(target))
        log(f"  measuring {len(mods)} dlight kernels with the tuning runner")
        dl_secs = runner_seconds(scheduled["dlight"], target, runner, builder)
    for sched in tuned:
        path = log_dir(tuning_dir, kind, target, ks.fusion, sched)
        if not tuning and not packed.exists(os.path.join(path, DB_FILES[1])):
            # no database: the seed, and for metaschedule a design-space sample when
            # only building (the kernel as it is when benching from logs)
            if sched == "seeded":
                scheduled[sched] = dict(start)
            elif build_only:
                scheduled[sched] = {n: (sampled_schedule(m, target) or m) for n, m in mods.items()}
            else:
                scheduled[sched] = dict(mods)
            log(f"  {sched}: no database in {path}")
            continue
        dbs[sched] = path
        if tuning:
            db = kernel_database(path, log)
            if sched == "seeded":  # from our rules' schedule where one applies, else dlight's
                seeds = {n: dl[n] if ours[n] is None else ours[n] for n in mods}
                secs = dict(dl_secs, **runner_seconds({n: seeds[n][1].mod for n in mods if ours[n] is not None},
                                                      target, runner, builder))
                seed_database(db, mods, seeds, target, secs)
            if trials:
                log(f"  tuning {len(mods)} kernels x {trials} trials -> {path}")
                tune_kernels(mods, target, path, trials + (1 if sched == "seeded" else 0),
                             log_dir=path + "-work", runner=runner, log=log)
            if sched == "seeded" and not is_gpu(target):  # each pick measured beside its seed
                confirm_picks(mods, target, path, runner, log, measure=CycledTimer(target))
        db = open_database(path, read_only=not tuning)  # benching from logs never writes there
        scheduled[sched] = {}
        for name, m in mods.items():
            best = tuned_schedule(db, m, target, read_kept(path)) if sched == "seeded" else best_schedule(db, m)
            if best is None:  # no record: fall back to the seed (seeded) or the plain kernel
                best = start[name] if sched == "seeded" else m
            scheduled[sched][name] = best
    if dbs and not dl_secs and not build_only:  # from logs: dlight in the records' units, for trials-to-beat
        runner = runner if runner is not None else make_runner(flush_cache=not is_gpu(target))
        log(f"  measuring {len(mods)} dlight kernels with the tuning runner (trials to beat dlight)")
        dl_secs = runner_seconds(scheduled["dlight"], target, runner, builder)
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
    tuning runner's (``_schedules``), else the bench's own median.  Counted in
    the order the candidates were measured (``tvm_ext.tune.kernels``); None where the
    database has no measurement order (not tuned by ``tune_kernels``) or nothing beat dlight."""
    mods = {k.name: normalize(k.func) for k in ks.kernels}
    return {s: {name: trials_to_beat(path, m, dl_secs.get(name, measured[name]))
                for name, m in mods.items()}
            for s, path in dbs.items()}


# --------------------------------------------------------------------------- main
def available_schedules(gpu: bool = False) -> tuple:  # pylint: disable=unused-argument
    """``rulesets.LAYER_SCHEDULES``: "rule" is our rules' untuned schedule (on CPUs the dequantize-GEMV,
    LayerNorm, attention, rope and the concatenates; on GPUs the q4 projections and the value product),
    dlight's for the others."""
    return LAYER_SCHEDULES


def run(workload, target="llvm", trials=None, from_logs=False, build_only=False, out_json=None,
        threads=None, log=print, config="full", context=512, tokens=128, tuning_dir=None,
        rounds=5, repeat=3, peers=None, schedules=None, int8=False):
    """Run the bench (see the module docstring).  Returns the result dict."""
    set_threads(threads)
    import tvm

    target = resolve_target(target)
    gpu = is_gpu(target)
    schedules = _check_schedules(schedules, gpu)
    if peers and (gpu or workload != "phi2-decode"):
        raise ValueError("--peers is for phi2-decode on llvm (the decode projections on the CPU)")
    if int8:
        if gpu or workload != "phi2-decode":
            raise ValueError("--int8 is for phi2-decode on llvm (the decode projections on the CPU)")
        from tvm_ext.workloads.phi2.q4_int8_gemm import check_target

        check_target(target)
    if build_only and gpu:
        os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    kind = workload.replace("phi2-", "")
    tuning_dir = databases_root(from_logs, tuning_dir)
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
            kss[fusion], target, kind, trials, from_logs, build_only, tuning_dir, log, schedules)
    if from_logs:  # report what the databases hold, not the default budget
        trials = database_trials(dbs) or trials
    if build_only:
        return _build_only(sched, rules, target, t_start, workload, log, schedules)

    threads = threads or _pool_threads()
    llc, llc_source = llc_bytes()
    plan = CopyPlan.within_memory(llc, phi2_measure.runtimes_with_weights(kss, peers or [], int8))
    log(f"  last-level cache {llc / 2**20:.0f} MiB ({llc_source}): {plan.describe()}")
    verified = _verify(wls, kss, sched, target, dev, log, schedules)
    cfg = wls[False]._phi2["cfg"]
    fns, args, proj, q4, same_as = phi2_measure.prepare(kss, sched, schedules, target, dev, rng, plan, cfg, log)
    phi2_measure.add_floors(fns, kss, target, dev, threads)
    xs = {}  # one activation row per K: the peers and the int8 projections see the same inputs
    x_of = lambda k: xs.setdefault(k, rng.uniform(-1, 1, k).astype("float32"))  # noqa: E731
    peer_objs = make_peers(peers or [], q4, plan, threads, x_of, log)
    n_peers = len(peer_objs)
    if int8:
        from tvm_ext.bench.phi2.int8 import make_int8

        peer_objs += make_int8(q4, plan, target, dev, x_of)
    peer_err = phi2_measure.check_peers(peer_objs, log)
    sec, hot, peer_s, bandwidth, bw_np = phi2_measure.measure(fns, args, peer_objs, dev, rounds, repeat, log)
    floor = phi2_measure.floors(sec)
    phi2_measure.floors(hot)  # the touch kernels' cache-hot figures: taken out, not reported
    sec, hot = phi2_measure.with_twins(sec, same_as), phi2_measure.with_twins(hot, same_as)
    beat = {fusion: _trials_to_beat(dbs[fusion], kss[fusion], dl_secs[fusion],
                                    {n: t for (f, s, n), t in sec.items() if f == fusion and s == "dlight"})
            for fusion in (False, True)}
    ntok = 1 if kind == "decode" else tokens
    extra = {"hot": hot, "copies": {key: a.copies for key, a in args.items()}, "projection": proj,
             "same_as": same_as, "floor": floor}
    if "rule" in schedules:
        from tvm_ext.rules import DequantGEMV, DequantGEMVCUDA

        gemv_rule = DequantGEMVCUDA() if gpu else DequantGEMV()  # the projections the rule row changes
        extra["rule_matched"] = {(f, k.name) for f in (False, True) for k in kss[f].kernels
                                 if gemv_rule.matches(normalize(k.func)["main"])}
    rows = _rows(kss, sec, bandwidth, rules, beat, verified, ntok, schedules, extra)
    peer_rows = [dict({"peer": p.name, "projection": p.projection, "ms": t * 1e3,
                       "bound_ms": p.bytes / bandwidth / 1e6, "copies": p.copies}, **peer_err.get(i, {}))
                 for i, (p, t) in enumerate(zip(peer_objs, peer_s))]
    int8_rows = [dict({"schedule": r.pop("peer")}, **r) for r in peer_rows[n_peers:]]
    peer_rows = peer_rows[:n_peers]

    result = {
        "workload": workload, "target": str(target), "device": cpu_info() if not gpu else {"name": str(dev)},
        "threads": threads, "llc_bytes": llc, "llc_source": llc_source, "copy_plan": plan.as_json(),
        "weight_copies": {name: c for (_, name), c in extra["copies"].items()},
        "bandwidth_gbs": bandwidth, "bandwidth_numpy_gbs": bw_np,
        "compute_dtype": dtype, "config": config, "trials_per_kernel": trials, "schedules": list(schedules),
        "context": context if kind == "decode" else None, "tokens": ntok, "rows": rows, "peers": peer_rows,
    }
    if int8:
        result["int8"] = int8_rows
    result["fusion_losses"] = _fusion_losses(rows, schedules)
    result["targets"] = _targets(rows, peer_rows, schedules, result.get("int8", ()))
    if out_json is None:
        out_json = os.path.join(WORK_ROOT, f"bench-{workload}-{target.kind.name}.json")
    if out_json:
        os.makedirs(os.path.dirname(out_json) or ".", exist_ok=True)
        with open(out_json, "w") as f:
            json.dump(result, f, indent=1)
        log(f"wrote {out_json}")
    return result


def _check_schedules(schedules, gpu: bool = False) -> tuple:
    """The schedules to run, in SCHEDULES order, dlight always first; ValueError for an unknown one."""
    known = available_schedules(gpu)
    names = check_schedules(schedules, known, "in the layer bench") if schedules else known
    return tuple(s for s in known if s in names or s == "dlight")


def _verify(wls, kss, sched, target, dev, log, schedules=SCHEDULES):
    """dlight and rule end to end against NumPy (one VM build per fusion mode and schedule);
    the tuned schedules' kernels are checked against their dlight kernel on the timing inputs
    (``measure``)."""
    verified = {}
    for fusion in (False, True):
        for s in schedules:
            if s not in ("dlight", "rule"):
                verified[(fusion, s)] = "kernels match dlight"
                continue
            pairs = [(normalize(k.func), sched[fusion][s][k.name]) for k in kss[fusion].kernels]
            ok, msg = verify(wls[fusion], pairs, target, dev)
            log(f"  verify fusion={'on' if fusion else 'off'} {s} vs NumPy: {'ok' if ok else 'MISMATCH'} {msg}")
            if not ok:
                raise RuntimeError(f"phi2 {s} fusion={fusion} does not match NumPy: {msg}")
            verified[(fusion, s)] = msg
    return verified


def _rows(kss, sec, bandwidth, rules, beat, verified, ntok, schedules=SCHEDULES, extra=None):
    """One row per fusion mode x schedule.  ``extra`` (from a measured run): {"hot":
    {(fusion, schedule, name): cache-hot s}, "copies": {(fusion, name): C}, "projection":
    {(fusion, name, part): projection or None}, "same_as": {(fusion, schedule, name): the earlier
    schedule whose binary it is (``measure.prepare``)}, "floor": {fused kernel name: touch s}}."""
    extra = extra or {}
    hot, copies, proj = extra.get("hot", {}), extra.get("copies", {}), extra.get("projection", {})
    rows = []
    for fusion in (False, True):
        for s in schedules:
            ks_, layer, head, bound_layer = [], 0.0, 0.0, 0.0
            for k in kss[fusion].kernels:
                ms_ = sec[(fusion, s, k.name)] * 1e3 * k.calls
                b = nbytes(k.func) / bandwidth / 1e6 * k.calls
                e = {"name": k.name, "ms": ms_, "bound_ms": b, "calls": k.calls, "part": k.part}
                if (fusion, k.name) in copies:
                    e["copies"] = copies[(fusion, k.name)]
                if (fusion, s, k.name) in hot:
                    e["ms_cache_hot"] = hot[(fusion, s, k.name)] * 1e3 * k.calls
                if proj.get((fusion, k.name, k.part)):
                    e["projection"] = proj[(fusion, k.name, k.part)]
                if fusion and k.name in extra.get("floor", {}):
                    e["floor_ms"] = extra["floor"][k.name] * 1e3 * k.calls
                if (fusion, s, k.name) in extra.get("same_as", {}):  # the same binary, timed once
                    e["same_schedule_as"] = extra["same_as"][(fusion, s, k.name)]
                if s == "dlight":
                    e["rule"] = rules[fusion][k.name]
                elif s == "rule":
                    matched = (fusion, k.name) in extra.get("rule_matched", ())
                    e["scheduled_by"] = "DequantGEMV" if matched else f"dlight {rules[fusion][k.name]}"
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


def _build_only(sched, rules, target, t_start, workload, log, schedules=SCHEDULES):
    built = []
    for fusion in (False, True):
        for s in schedules:
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


def _pool_threads():
    return int(os.environ.get("TVM_NUM_THREADS", os.cpu_count() or 1))


def row(rows, fusion, s):
    """The row of ``rows`` for fusion "on"/"off" and schedule ``s``."""
    return next(r for r in rows if r["fusion"] == fusion and r["schedule"] == s)


def _fusion_losses(rows, schedules=SCHEDULES):
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
        loss = {"name": k["name"], "parts": k["parts"], "rule": k["rule"], "fused_ms": k["ms"],
                "parts_ms": parts_ms, "slower": k["ms"] > parts_ms}
        for s in schedules[1:]:
            loss[f"{s}_ms"] = next(x for x in row(rows, "on", s)["kernels"] if x["name"] == k["name"])["ms"]
        out.append(loss)
    return out


def projection_table(rows, peers) -> dict:
    """{projection: {"bound_ms", "tvm": {"<schedule> <fused|unfused>": ms per call}, "peers":
    {peer: ms}}}: the per-projection comparison (unfused = the matmul kernel alone)."""
    out = {}
    for r in rows:
        for k in r["kernels"]:
            if "projection" not in k:
                continue
            p = out.setdefault(k["projection"], {"bound_ms": None, "tvm": {}, "peers": {}})
            if r["fusion"] == "on":
                p["bound_ms"] = k["bound_ms"] / k["calls"]
            p["tvm"][f"{r['schedule']} {'fused' if r['fusion'] == 'on' else 'unfused'}"] = k["ms"] / k["calls"]
    for peer in peers:
        entry = out.setdefault(peer["projection"], {"bound_ms": None, "tvm": {}, "peers": {}})
        entry["peers"][peer["peer"]] = peer["ms"]
    return out


def _targets(rows, peers=(), schedules=SCHEDULES, int8=()):
    fused = [r for r in rows if r["fusion"] == "on"]
    best = min(fused, key=lambda r: r["layer_ms"])
    t = {"best_fused": best["schedule"], "best_fused_vs_bound": best["layer_ms"] / best["bound_layer_ms"]}
    best_kind = min(schedules, key=lambda s: min(row(rows, f, s)["layer_ms"] for f in ("on", "off")))
    t["best_kind"] = best_kind
    t["fused_over_unfused_best_kind"] = row(rows, "on", best_kind)["layer_ms"] / row(rows, "off", best_kind)["layer_ms"]
    t["ms_over_dlight_fused"] = (row(rows, "on", "metaschedule")["layer_ms"] / row(rows, "on", "dlight")["layer_ms"]
                                 if "metaschedule" in schedules else None)
    worst = None
    for f in ("on", "off"):
        d = {k["name"]: k["ms"] for k in row(rows, f, "dlight")["kernels"]}
        for k in (row(rows, f, "seeded")["kernels"] if "seeded" in schedules else []):
            worst = max(worst or 0.0, k["ms"] / d[k["name"]])
    t["seeded_worst_kernel_vs_dlight"] = worst
    # target: every kernel of the best fused row <= 1.2x its DRAM bound; those above, with their floor
    t["kernels_over_bound"] = [{"name": k["name"], "vs_bound": k["ms"] / k["bound_ms"],
                                "vs_floor": k["ms"] / k["floor_ms"] if k.get("floor_ms") else None}
                               for k in best["kernels"] if k["ms"] > 1.2 * k["bound_ms"]]
    torch_layer = sum(p["ms"] for p in peers if p["peer"] == "torch-bf16" and p["projection"] != "lm_head")
    t["torch_bf16_over_best_fused"] = torch_layer / best["layer_ms"] if torch_layer else None
    # target: every projection <= 1.5x its DRAM bound and <= 1.0x ORT MatMulNBits accuracy_level 0
    t["projections"] = {}
    for proj, p in projection_table(rows, peers).items():
        fused_ms = {k: v for k, v in p["tvm"].items() if k.endswith(" fused")}
        if not fused_ms or not p["bound_ms"]:
            continue
        name = min(fused_ms, key=fused_ms.get)
        ort = p["peers"].get("ort-acc0")
        t["projections"][proj] = {"best": name, "ms": fused_ms[name], "vs_bound": fused_ms[name] / p["bound_ms"],
                                  "vs_ort_acc0": fused_ms[name] / ort if ort else None}
        # the int8-activation variant against its own bound and ORT's int8 level (accuracy_level 4)
        for r in int8:
            if r["projection"] == proj:
                acc4 = p["peers"].get("ort-acc4")
                t["projections"][proj]["int8"] = {"ms": r["ms"], "vs_bound": r["ms"] / r["bound_ms"],
                                                  "vs_ort_acc4": r["ms"] / acc4 if acc4 else None}
    return t
