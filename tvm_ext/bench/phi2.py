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

import numpy as np
import tvm_ffi

DEFAULT_TRIALS = {"phi2-decode": 6, "phi2-prefill": 3}
SCHEDULES = ("dlight", "metaschedule", "seeded")
N_LAYERS = 32


# --------------------------------------------------------------------------- helpers
from tvm_ext.rulesets import space  # noqa: E402  (our rules and postprocs for the target)
from tvm_ext.targets import cuda_target, resolve_target  # noqa: E402,F401  (used by tests too)


def _is_gpu(target):
    return target.kind.name in ("cuda", "rocm", "vulkan", "metal", "opencl")


def normalize(func):
    """The IRModule MetaSchedule keys a PrimFunc by (see TuneContext)."""
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    func = func.without_attr("global_symbol") if func.attrs and "global_symbol" in func.attrs else func
    return _normalize_mod(func.with_attr("global_symbol", "main"))


def dlight_rules(target):
    from tvm.s_tir import dlight as dl

    if _is_gpu(target):
        g = dl.gpu
        return [g.Matmul(), g.GEMV(), g.LowBatchGEMV(), g.Reduction(), g.GeneralReduction(), g.Fallback()]
    return [dl.cpu.GEMV(), dl.cpu.Reduction()]


def dlight_schedule(mod, target, validate=None):
    """(rule name, Schedule) for the first dlight rule that applies; ("none", None) if none
    does (on llvm the kernel then compiles unscheduled).  With ``validate`` (a callable that
    raises when a scheduled module does not build), a rule whose schedule fails is skipped
    and named in the result, e.g. "Fallback (GEMV failed)"."""
    func = mod["main"]
    failed = []
    with target:
        for rule in dlight_rules(target):
            name = type(rule).__name__
            try:
                sch = rule.apply(func, target, False)
            except Exception:  # a rule that crashes counts as not applying
                sch = None
            if isinstance(sch, (list, tuple)):
                sch = sch[0] if sch else None
            if sch is None:
                continue
            if validate is not None:
                try:
                    validate(sch.mod)
                except Exception:  # noqa: BLE001
                    failed.append(name)
                    continue
            return (f"{name} ({', '.join(failed)} failed)" if failed else name), sch
    return ("none" + (f" ({', '.join(failed)} failed)" if failed else "")), None


def _validate_build(target):
    if not _is_gpu(target):
        return None
    os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    return lambda m: _build(m, target)


def _build(mod, target):
    import tvm

    return tvm.compile(mod, target=target)


def build_cuda_with_nvcc(mod, target):
    """Build ``mod`` for a cuda target, then compile its generated CUDA source with nvcc to PTX
    (runs without a GPU).  Returns the PTX size in bytes."""
    from tvm.support import nvcc

    ex = _build(mod, target)
    rt = ex.mod if hasattr(ex, "mod") else ex
    src = "".join(m.inspect_source("") for m in rt.imports if m.kind == "cuda")
    if not src:
        raise RuntimeError("no CUDA source generated")
    arch = str(target.attrs.get("arch", "sm_80"))
    with target:  # nvcc.compile_cuda reads the compute version from the current target
        ptx = nvcc.compile_cuda(src, target_format="ptx", arch=arch, compiler="nvcc")
    return len(ptx)


def combine(named_mods):
    """One IRModule holding the "main" of each {name: IRModule}, renamed to its kernel name."""
    import tvm

    funcs = {}
    for name, mod in named_mods.items():
        funcs[name] = mod["main"].with_attr("global_symbol", name)
    return tvm.IRModule(funcs)


def _random_args(func, dev, rng):
    import tvm

    args = []
    for p in func.params:
        shape = [int(s) for s in p.shape]
        dt = str(p.dtype)
        if dt.startswith("uint"):
            a = rng.integers(0, 2**31, size=shape).astype(dt)
        elif dt.startswith("int"):
            a = rng.integers(0, 16, size=shape).astype(dt)
        else:
            a = (rng.standard_normal(shape) * 0.5).astype(dt)
        args.append(tvm.runtime.tensor(a, dev))
    return args


def _nbytes(func):
    total = 0
    for p in func.params:
        n = 1
        for s in p.shape:
            n *= int(s)
        total += n * np.dtype(str(p.dtype)).itemsize
    return total


def _timer(rt_mod, dev, repeat):
    pre = "cache_flush_cpu_non_first_arg" if dev.dlpack_device_type() == 1 else ""
    rt_mod = rt_mod.jit() if hasattr(rt_mod, "jit") else rt_mod
    return rt_mod.time_evaluator("main", dev, number=1, repeat=repeat, f_preproc=pre)


def measure_bandwidth(dev, mb=512, repeat=3):
    """Copy bandwidth in GB/s (bytes read + written per second) of a parallel vectorized TVM
    copy of ``mb`` MiB float32, and of numpy.copyto for reference."""
    import tvm
    from tvm import te
    from tvm.s_tir import Schedule

    n = mb * 1024 * 1024 // 4
    a = te.placeholder((n,), "float32", name="a")
    b = te.compute((n,), lambda i: a[i], name="b")
    func = te.create_prim_func([a, b])
    sch = Schedule(func)
    (i,) = sch.get_loops(sch.get_sblock("b"))
    o, v = sch.split(i, [None, 16])
    sch.parallel(o)
    sch.vectorize(v)
    rt = tvm.compile(sch.mod, target="llvm").jit()
    x = tvm.runtime.tensor(np.ones(n, "float32"), dev)
    y = tvm.runtime.empty((n,), "float32", dev)
    f = rt.time_evaluator("main", dev, number=1, repeat=repeat)
    f(x, y)
    tvm_s = min(f(x, y).results)
    src, dst = np.ones(n, "float32"), np.empty(n, "float32")
    np.copyto(dst, src)
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        ts.append(time.perf_counter() - t0)
    return 2 * n * 4 / tvm_s / 1e9, 2 * n * 4 / min(ts) / 1e9


# --------------------------------------------------------------------------- databases
def log_dir(tuning_dir, kind, target, fusion, schedule):
    tname = target.kind.name
    return os.path.join(tuning_dir, f"phi2-{kind}-{tname}-{'fused' if fusion else 'unfused'}", schedule)


_DB_PATHS = {}


def open_db(path):
    from tvm.s_tir import meta_schedule as ms

    os.makedirs(path, exist_ok=True)
    db = ms.database.JSONDatabase(
        path_workload=os.path.join(path, "database_workload.json"),
        path_tuning_record=os.path.join(path, "database_tuning_record.json"),
        allow_missing=True,
    )
    _DB_PATHS[id(db)] = (db, path)  # FFI objects take no new attributes
    return db


def seed_database(db, mods, dlight, target, dlight_secs):
    """Commit the dlight schedule of each kernel as a tuning record (empty trace where dlight
    has no rule, i.e. the unscheduled kernel), with its measured time."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    for name, mod in mods.items():
        if db.has_workload(mod) and db.get_top_k(db.commit_workload(mod), 1):
            continue
        wl = db.commit_workload(mod)
        sch = dlight[name][1]
        if sch is None:
            # no dlight rule: seed the unscheduled kernel.  A record with an empty trace is
            # written but never returned by JSONDatabase queries, so record a no-op lookup.
            sch = Schedule(mod)
            sch.get_child_blocks(sch.get_sblock("root", func_name="main"))
        trace = sch.trace
        db.commit_tuning_record(
            ms.database.TuningRecord(
                trace, wl, run_secs=[float(dlight_secs[name])], target=target,
                args_info=ms.arg_info.ArgInfo.from_prim_func(mod["main"]),
            )
        )


def builder():
    """A LocalBuilder whose workers skip ``import tvm.s_tir.tensor_intrin`` (~45 s here,
    more than LocalBuilder's default 30 s timeout, so every candidate failed)."""
    from tvm_ext.tune.builder import fast_local_builder

    return fast_local_builder(timeout_sec=120)


def runner(gpu):
    """LocalRunner (cache flushed before each CPU run) behind a shim: in TVM 0.27 MetaSchedule
    passes target.kind.name ("llvm") as the device type and the runner worker fails with
    "Unknown device: llvm" on every candidate, so nothing ever reaches the database."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    inner = ms.runner.LocalRunner(
        evaluator_config=ms.runner.EvaluatorConfig(number=1, repeat=3, min_repeat_ms=0, enable_cpu_cache_flush=not gpu)
    )

    @derived_object
    class _DeviceNameRunner(ms.runner.PyRunner):
        def __init__(self):
            super().__init__()

        def run(self, runner_inputs):
            fixed = [
                ms.runner.RunnerInput(r.artifact_path, "cpu" if str(r.device_type) == "llvm" else r.device_type, r.args_info)
                for r in runner_inputs
            ]
            return inner.run(fixed)

    return _DeviceNameRunner()


def tune(db, mods, target, work_dir, trials, log, per_iter=None):
    """Tune every kernel for ``trials`` trials into ``db`` (resumes: counts records already there)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    todo = {}
    for name, mod in mods.items():
        have = len(_records(db, mod))
        if have < trials:
            todo[name] = mod
    if not todo:
        return
    irmod = tvm.IRModule({name: mod["main"] for name, mod in todo.items()})
    log(f"  tuning {len(todo)} kernels x {trials} trials -> {work_dir}")
    strategy = ms.search_strategy.EvolutionarySearch(population_size=128, genetic_num_iters=2)
    ms.tune_tir(
        irmod, target, work_dir, max_trials_global=trials * len(todo), max_trials_per_task=trials,
        num_trials_per_iter=min(trials, 8) if per_iter is None else per_iter, builder=builder(), runner=runner(_is_gpu(target)), database=db, space=space(target),
        strategy=strategy, seed=0,
    )


def _records(db, mod):
    """Tuning records of ``mod`` in commit order.  JSONDatabase keeps records sorted by run
    time, so the order comes from its record file (one line per commit) when there is one."""
    path = _DB_PATHS.get(id(db), (None, None))[1]
    if path and os.path.exists(os.path.join(path, "database_tuning_record.json")):
        from tvm.s_tir import meta_schedule as ms

        widx = None
        with open(os.path.join(path, "database_workload.json")) as f:
            for i, line in enumerate(f):
                if tvm_ffi.structural_equal(ms.database.Workload.from_json(json.loads(line)).mod, mod):
                    widx = i
                    break
        out = []
        if widx is None:
            return out
        with open(os.path.join(path, "database_tuning_record.json")) as f:
            for line in f:
                rec = json.loads(line)
                if rec[0] == widx:
                    out.append([float(x) for x in (rec[1][1] or [])])
        return out
    h = tvm_ffi.structural_hash(mod)
    return [[float(x) for x in r.run_secs] for r in db.get_all_tuning_records()
            if tvm_ffi.structural_hash(r.workload.mod) == h and tvm_ffi.structural_equal(r.workload.mod, mod)]


def _mean(secs):
    return sum(secs) / len(secs) if secs else float("inf")


def trials_to_beat(db, mod, dlight_sec, seeded):
    """Index (1-based, in commit order) of the first tuned record faster than dlight; None if none."""
    recs = _records(db, mod)
    if seeded:
        recs = recs[1:]
    for i, r in enumerate(recs, 1):
        if _mean(r) < dlight_sec:
            return i
    return None


def best_schedule(db, mod, target):
    """Best scheduled IRModule from ``db`` for ``mod``, or None."""
    sch = db.query_schedule(mod, target, workload_name="main")
    return None if sch is None else sch.mod


def design_space_sample(mod, target):
    """A postprocessed sample of MetaSchedule's design space (build-only without logs)."""
    from tvm.s_tir import meta_schedule as ms

    ctx = ms.TuneContext(mod=mod, target=target, space_generator=space(target), task_name="main")
    for sch in ctx.generate_design_space():
        ok = True
        for p in ctx.space_generator.postprocs:
            if not p.apply(sch):
                ok = False
                break
        if ok:
            return sch.mod
    return None


# --------------------------------------------------------------------------- main
def _kernelsets(workload, config, context, tokens, dtype):
    from tvm_ext.workloads import phi2

    out, wls = {}, {}
    for fusion in (False, True):
        if workload == "phi2-decode":
            wl = phi2.build_decode(context=context, config=config, fusion=fusion, compute_dtype=dtype)
        elif workload == "phi2-prefill":
            wl = phi2.build_prefill(tokens=tokens, config=config, fusion=fusion, compute_dtype=dtype)
        else:
            raise ValueError(f"unknown phi2 workload {workload!r}")
        wls[fusion] = wl
        out[fusion] = phi2.kernels(wl)
    return wls, out


def _schedules(ks, target, kind, trials, from_logs, build_only, tuning_dir, log, dev, rng, repeat):
    """For one fusion mode: {schedule: {kernel name: scheduled IRModule}}, dlight rules,
    dlight seconds, the databases {schedule: db}.

    dlight kernels are timed here only when tuning (the seeded database starts from those
    times); with ``from_logs`` that pass is skipped (real-size prefill: minutes) and the
    caller compares the records with the bench's own dlight times."""
    mods = {}
    for k in ks.kernels:
        mods.setdefault(k.name, normalize(k.func))
    dl = {name: dlight_schedule(m, target, _validate_build(target)) for name, m in mods.items()}
    scheduled = {"dlight": {n: (s.mod if s is not None else mods[n]) for n, (_, s) in dl.items()}}
    dl_secs, dbs = {}, {}
    if not build_only and not from_logs:
        for name in mods:
            rt = _build(scheduled["dlight"][name], target)
            args = _random_args(mods[name]["main"], dev, rng)
            dl_secs[name] = float(np.median(_timer(rt, dev, repeat)(*args).results))
    for sched in ("metaschedule", "seeded"):
        path = log_dir(tuning_dir, kind, target, ks.fusion, sched)
        have_logs = os.path.exists(os.path.join(path, "database_tuning_record.json"))
        if build_only and not have_logs:
            if sched == "seeded":
                scheduled[sched] = dict(scheduled["dlight"])
            else:
                scheduled[sched] = {n: (design_space_sample(m, target) or m) for n, m in mods.items()}
            continue
        db = dbs[sched] = open_db(path)
        if not build_only and not from_logs:
            if sched == "seeded":
                seed_database(db, mods, dl, target, dl_secs)
            if trials:
                tune(db, mods, target, path + "-work", trials + (1 if sched == "seeded" else 0), log)
        scheduled[sched] = {}
        for name, m in mods.items():
            best = best_schedule(db, m, target)
            if best is None:  # no record: fall back to dlight (seeded) or the plain kernel
                best = scheduled["dlight"][name] if sched == "seeded" else m
            scheduled[sched][name] = best
    return scheduled, {n: r for n, (r, _) in dl.items()}, dl_secs, dbs


def _database_trials(dbs_by_fusion) -> int | None:
    """Trials per kernel the metaschedule databases hold (what --from-logs benches): the
    most records of any kernel, i.e. the budget; kernels with few distinct candidates
    (copies, adds) stop earlier because MetaSchedule does not measure a schedule twice."""
    from collections import Counter

    most = [max(Counter(tvm_ffi.structural_hash(r.workload.mod)
                        for r in dbs["metaschedule"].get_all_tuning_records()).values(), default=0)
            for dbs in dbs_by_fusion.values()]
    return max(most, default=0) or None


def _trials_to_beat(dbs, ks, dl_secs, measured):
    """{schedule: {kernel: trials to beat dlight}} for one fusion mode; dlight's time is the
    one measured before tuning when this run tuned, else the bench's own median."""
    mods = {k.name: normalize(k.func) for k in ks.kernels}
    return {s: {name: trials_to_beat(db, m, dl_secs.get(name, measured[name]), s == "seeded")
                for name, m in mods.items()}
            for s, db in dbs.items()}


def _verify(wl, pairs, target, dev):
    """Substitute the scheduled kernels into the workload's Relax module, run it on the VM and
    compare with the NumPy reference."""
    import tvm
    from tvm import relax

    mod = wl.mod
    repl = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            key = normalize(func)
            for orig, sch_mod in pairs:
                if tvm_ffi.structural_equal(orig, key):
                    repl[gv] = sch_mod["main"].with_attr("global_symbol", gv.name_hint)
                    break
    for gv, f in repl.items():
        mod[gv] = f
    ex = tvm.compile(mod, target=target)
    vm = relax.VirtualMachine(ex, dev)
    out = vm["main"](*[tvm.runtime.tensor(a, dev) for a in wl.inputs]).numpy()
    return wl.check(out)


def _torch_row(ks_unfused, threads, bandwidth, rounds, log):
    try:
        import torch
    except ImportError:
        log("torch not importable: no torch-bf16 row")
        return None
    from tvm_ext.workloads.phi2 import CONFIGS  # noqa: F401

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
        nbytes = 2 * (n * k + nout * k + nout + n * nout)
        res.append({"name": name, "ms": ms_, "bound_ms": nbytes / bandwidth / 1e6, "calls": 1, "part": "layer"})
    layer = sum(r["ms"] for r in res)
    return {"fusion": "n/a", "schedule": "torch-bf16", "layer_ms": layer, "head_ms": None, "tok_s": None,
            "bound_layer_ms": sum(r["bound_ms"] for r in res), "kernels": res}


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
    gpu = _is_gpu(target)
    if build_only and gpu:
        os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    kind = workload.replace("phi2-", "")
    trials = DEFAULT_TRIALS.get(workload, 4) if trials is None else int(trials)
    dtype = "float16" if gpu else "float32"
    dev = None if build_only else (tvm.cuda(0) if gpu else tvm.cpu(0))
    rng = np.random.default_rng(0)
    wls, kss = _kernelsets(workload, config, context, tokens, dtype)
    t_start = time.time()

    # ---- schedules and tuning
    sched, rules, dl_secs, dbs = {}, {}, {}, {}
    for fusion in (False, True):
        log(f"[{workload}] fusion {'on' if fusion else 'off'}: {len(kss[fusion].kernels)} kernels")
        sched[fusion], rules[fusion], dl_secs[fusion], dbs[fusion] = _schedules(
            kss[fusion], target, kind, trials, from_logs, build_only, tuning_dir, log, dev, rng, repeat
        )
    if from_logs:  # report what the databases hold, not the default budget
        trials = _database_trials(dbs) or trials
    if build_only:
        built = []
        for fusion in (False, True):
            for s in SCHEDULES:
                # one module (one nvcc call) per fusion mode and schedule kind
                batch = combine(sched[fusion][s])
                if gpu:
                    build_cuda_with_nvcc(batch, target)
                else:
                    _build(batch, target)
                for name in sched[fusion][s]:
                    built.append({"fusion": "on" if fusion else "off", "schedule": s, "name": name,
                                  "rule": rules[fusion][name] if s == "dlight" else None})
                log(f"  built fusion={'on' if fusion else 'off'} {s}: {len(sched[fusion][s])} kernels")
        log(f"built {len(built)} kernels for {target.kind.name} in {time.time() - t_start:.0f} s")
        return {"workload": workload, "target": str(target.kind.name), "built": len(built), "kernels": built}

    # ---- verify: dlight end to end against NumPy (one VM build per fusion mode); every
    # metaschedule / seeded kernel against its dlight kernel on the timing inputs (below)
    verified = {}
    for fusion in (False, True):
        pairs = [(normalize(k.func), sched[fusion]["dlight"][k.name]) for k in kss[fusion].kernels]
        ok, msg = _verify(wls[fusion], pairs, target, dev)
        log(f"  verify fusion={'on' if fusion else 'off'} dlight vs NumPy: {'ok' if ok else 'MISMATCH'} {msg}")
        if not ok:
            raise RuntimeError(f"phi2 dlight fusion={fusion} does not match NumPy: {msg}")
        for s in SCHEDULES:
            verified[(fusion, s)] = msg if s == "dlight" else "kernels match dlight"

    # ---- measure, interleaved
    bw_tvm, bw_np = measure_bandwidth(dev)
    log(f"  copy bandwidth: {bw_tvm:.1f} GB/s (TVM parallel copy), {bw_np:.1f} GB/s (numpy)")
    timers, args = {}, {}
    for fusion in (False, True):
        for k in kss[fusion].kernels:
            key = (fusion, k.name)
            if key not in args:
                args[key] = _random_args(k.func, dev, rng)
            outs = {}
            for s in SCHEDULES:
                if (fusion, s, k.name) not in timers:
                    ex = _build(sched[fusion][s][k.name], target)
                    timers[(fusion, s, k.name)] = _timer(ex, dev, repeat)
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
    sec = {key: float(np.median(v)) for key, v in samples.items()}
    beat = {fusion: _trials_to_beat(dbs[fusion], kss[fusion], dl_secs[fusion],
                                    {n: t for (f, s, n), t in sec.items() if f == fusion and s == "dlight"})
            for fusion in (False, True)}

    # ---- rows
    rows = []
    ntok = 1 if kind == "decode" else tokens
    for fusion in (False, True):
        for s in SCHEDULES:
            ks_, layer, head, bound_layer = [], 0.0, 0.0, 0.0
            for k in kss[fusion].kernels:
                ms_ = sec[(fusion, s, k.name)] * 1e3 * k.calls
                b = _nbytes(k.func) / bandwidth / 1e6 * k.calls
                e = {"name": k.name, "ms": ms_, "bound_ms": b, "calls": k.calls, "part": k.part}
                if s == "dlight":
                    e["rule"] = rules[fusion][k.name]
                else:
                    e["trials_to_beat_dlight"] = beat[fusion][s].get(k.name)
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
    text = format_table(result)
    log(text)
    if out_json is None:
        out_json = os.path.join(tuning_dir, f"bench-{workload}-{target.kind.name}.json")
    if out_json:
        os.makedirs(os.path.dirname(out_json) or ".", exist_ok=True)
        with open(out_json, "w") as f:
            json.dump(result, f, indent=1)
        log(f"wrote {out_json}")
    return result


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


def _row(rows, fusion, s):
    return next(r for r in rows if r["fusion"] == fusion and r["schedule"] == s)


def _fusion_losses(rows):
    """Fused kernels slower under dlight than the sum of their unfused parts under dlight."""
    on, off = _row(rows, "on", "dlight"), _row(rows, "off", "dlight")
    off_ms = {}
    for k in off["kernels"]:
        off_ms[k["name"]] = k["ms"] / k["calls"]
    out = []
    for k in on["kernels"]:
        if len(k["parts"]) < 2:
            continue
        parts_ms = sum(off_ms[p] for p in k["parts"]) * k["calls"]
        ms_k = {s: next(x for x in _row(rows, "on", s)["kernels"] if x["name"] == k["name"])["ms"]
                for s in SCHEDULES}
        out.append({"name": k["name"], "parts": k["parts"], "rule": k["rule"], "fused_ms": k["ms"],
                    "parts_ms": parts_ms, "slower": k["ms"] > parts_ms,
                    "metaschedule_ms": ms_k["metaschedule"], "seeded_ms": ms_k["seeded"]})
    return out


def _targets(rows, trow):
    fused = [r for r in rows if r["fusion"] == "on"]
    best = min(fused, key=lambda r: r["layer_ms"])
    t = {"best_fused": best["schedule"], "best_fused_vs_bound": best["layer_ms"] / best["bound_layer_ms"]}
    best_kind = min(SCHEDULES, key=lambda s: min(_row(rows, f, s)["layer_ms"] for f in ("on", "off")))
    t["best_kind"] = best_kind
    t["fused_over_unfused_best_kind"] = _row(rows, "on", best_kind)["layer_ms"] / _row(rows, "off", best_kind)["layer_ms"]
    t["ms_over_dlight_fused"] = _row(rows, "on", "metaschedule")["layer_ms"] / _row(rows, "on", "dlight")["layer_ms"]
    worst = 0.0
    for f in ("on", "off"):
        d = {k["name"]: k["ms"] for k in _row(rows, f, "dlight")["kernels"]}
        for k in _row(rows, f, "seeded")["kernels"]:
            worst = max(worst, k["ms"] / d[k["name"]])
    t["seeded_worst_kernel_vs_dlight"] = worst
    t["torch_bf16_over_best_fused"] = trow["layer_ms"] / best["layer_ms"] if trow else None
    return t


def format_table(res):
    lines = []
    lines.append(f"{res['workload']} on {res['target']} ({res['device']}, {res['threads']} threads), "
                 f"compute dtype {res['compute_dtype']} (q4{'f32' if res['compute_dtype'] == 'float32' else 'f16'}_1), "
                 f"{res['trials_per_kernel']} trials/kernel, copy bandwidth {res['bandwidth_gbs']:.1f} GB/s")
    lines.append(f"{'fusion':6} {'schedule':13} {'layer ms':>9} {'bound ms':>9} {'x bound':>8} {'vs dl-off':>9} "
                 f"{'head ms':>8} {'tok/s(32L)':>10}")
    for r in res["rows"]:
        hb = f"{r['head_ms']:8.3f}" if r["head_ms"] is not None else f"{'-':>8}"
        ts = f"{r['tok_s']:10.2f}" if r["tok_s"] is not None else f"{'-':>10}"
        vs = f"{r['vs_dlight_off']:9.2f}" if "vs_dlight_off" in r else f"{'-':>9}"
        lines.append(f"{r['fusion']:6} {r['schedule']:13} {r['layer_ms']:9.3f} {r['bound_layer_ms']:9.3f} "
                     f"{r['layer_ms'] / r['bound_layer_ms']:8.2f} {vs} {hb} {ts}")
    lines.append("")
    lines.append("per kernel (ms per layer; bound = bytes moved / copy bandwidth):")
    for f in ("off", "on"):
        rs = {s: _row(res["rows"], f, s) for s in SCHEDULES}
        lines.append(f"  fusion {f}: {'kernel':44} {'calls':>5} {'bound':>8} {'dlight':>8} {'ms':>8} {'seeded':>8} "
                     f"{'dl rule':>10} {'beat@ms':>7} {'beat@sd':>7}")
        for i, k in enumerate(rs["dlight"]["kernels"]):
            m, s = rs["metaschedule"]["kernels"][i], rs["seeded"]["kernels"][i]
            bm = m.get("trials_to_beat_dlight")
            bs = s.get("trials_to_beat_dlight")
            lines.append(f"  {'':10} {k['name'][:44]:44} {k['calls']:5d} {k['bound_ms']:8.3f} {k['ms']:8.3f} {m['ms']:8.3f} "
                         f"{s['ms']:8.3f} {k['rule']:>10} {('-' if bm is None else bm):>7} {('-' if bs is None else bs):>7}")
    lines.append("")
    lines.append("fused kernels vs their unfused parts under dlight (the user's question):")
    for L in res["fusion_losses"]:
        verdict = "SLOWER" if L["slower"] else "faster"
        lines.append(f"  {L['name'][:46]:46} fused {L['fused_ms']:8.3f} vs parts {L['parts_ms']:8.3f} ms: {verdict};"
                     f" dlight rule {L['rule']}; metaschedule {L['metaschedule_ms']:.3f}, seeded {L['seeded_ms']:.3f}")
    t = res["targets"]
    lines.append("")
    lines.append(f"targets: best fused ({t['best_fused']}) = {t['best_fused_vs_bound']:.2f}x bound (<=1.5, stretch 1.2); "
                 f"fused/unfused for best kind ({t['best_kind']}) = {t['fused_over_unfused_best_kind']:.2f} (<=1); "
                 f"metaschedule/dlight fused = {t['ms_over_dlight_fused']:.2f} (<=1); "
                 f"seeded worst kernel/dlight = {t['seeded_worst_kernel_vs_dlight']:.2f} (<=1); "
                 f"torch-bf16/best fused = {t['torch_bf16_over_best_fused'] if t['torch_bf16_over_best_fused'] is None else round(t['torch_bf16_over_best_fused'], 2)} (>=3)")
    return "\n".join(lines)
