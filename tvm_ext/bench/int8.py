"""Rule-set benchmark of an int8 workload: tune (or reuse) each database, compile,
check bit-exactly against NumPy, and time all networks interleaved in one process.

A figure is a ratio measured side by side: every round runs each compiled network
once, in rotating order, and the median per network over the rounds is reported.
"""
from __future__ import annotations

from collections import Counter

from tvm_ext import tune as tuning
from tvm_ext.bench.timing import time_turns
from tvm_ext.jsonio import write_json


def run(workload, target, rulesets, trials: int | None, from_logs: bool, rounds: int,
        out_json: str | None, log=print, work_root: str | None = None, peers=(),
        layers: bool = False, beside=(), breakdown: int = 0, warm: int = 0) -> dict:
    """Bench ``rulesets`` on ``workload``; returns (and writes) the result dict.

    A rule set written ``RULESET@TARGET`` (``upstream@llvm-generic``) is tuned, compiled
    and timed for that target instead of ``target``, in the same rounds as the others.
    ``beside``: other workloads (built with the same options: the same network in another
    layout, e.g. ``resnet50-int8-nchwc`` beside ``resnet50-int8-amx``), each with its plugin
    database, checked against its own reference and timed in the same rounds (rows
    ``WORKLOAD:plugin``).

    ``peers=["ort"]`` adds ONNX Runtime running the same network to the interleaved
    rounds (a row with ``"ruleset": "ort"``), ``"ov"`` OpenVINO's CPU plugin, ``"torch"`` PyTorch's fp16
    ResNet-50 (``torch_peers``; on CUDA targets); ``layers`` adds
    ``"per_layer"``: every conv
    task of the first rule set's database against one ORT QLinearConv of its shape; ``breakdown`` > 0
    adds ``"breakdown"``: the first rule set's network, that many runs, each kernel inside it against
    its tuning record (``bench.breakdown``); ``warm`` > 0 times that many more runs right after each
    turn's first (``timing.time_turns``): rows gain ``warm_ms``, each network called in a loop (its
    weights in the cache, its threads awake) beside ``e2e_ms``, its first run after the others'."""
    from tvm_ext.targets import resolve_target

    if "torch" in peers:  # bad input in one line before minutes of tuning
        peer_module().check_torch_peer(workload)
    runs, rows, targets, first = {}, [], {}, None
    work_root = tuning.databases_root(from_logs, work_root)
    networks = [(workload, label, label) for label in rulesets]
    networks += [(other, "plugin", f"{other.name}:plugin") for other in beside]
    for net, label, key in networks:
        ruleset, _, target_name = label.partition("@")  # "upstream@llvm-generic": own target
        row_target = targets[key] = resolve_target(target_name) if target_name else target
        runs[key], row, parts = _network(net, ruleset, row_target, trials, from_logs, work_root, key, log)
        rows.append(row)
        first = first or parts  # the first rule set's (executable, device, inputs): --breakdown's
    threads = peer_module().threads_of(target)
    for peer, network, about in (("ort", "ort_network", "ort_weights"), ("ov", "ov_network", "ov")):
        if peer in peers:  # ONNX runtimes on the same network: its distance from the reference, in steps
            runs[peer], diff, info = getattr(peer_module(), network)(workload, threads, log)
            rows.append({"ruleset": peer, "exact_match": diff["frac_differ"] == 0, "threads": threads, about: info,
                         **diff})
    if "torch" in peers:  # a speed peer: its own random weights
        try:
            runs["torch"], info = peer_module().torch_network(workload, target, log)
            rows.append({"ruleset": "torch", "exact_match": False, **info})
        except ValueError:
            raise  # not a peer of this network, or PyTorch missing: one clear line
        except Exception as err:  # noqa: BLE001 -- the peer's own failure on this machine: our rows still count
            log(f"peer torch left out: {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}")
    if "tvm-onnx" in peers:
        runs["tvm-onnx"], diff = peer_module().tvm_onnx_network(workload, target, log)
        rows.append({"ruleset": "tvm-onnx", "exact_match": diff["frac_differ"] == 0, **diff})
    log(f"timing {len(runs)} networks interleaved, {rounds} rounds ...")
    samples = {}
    medians, warm_medians = time_turns(runs, rounds, warm=warm, log=log, samples=samples)
    _put_times(rows, medians, rulesets, "e2e_ms", "ratio_to_plugin")
    if warm:
        _put_times(rows, warm_medians, rulesets, "warm_ms", "warm_ratio_to_plugin")
    for row in rows:  # every round's time, for the spread (tvm-ext report FILE.json --html draws it)
        row["e2e_ms_rounds"] = [s * 1e3 for s in samples[row["ruleset"]]["first"]]
        if warm:
            row["warm_ms_rounds"] = [s * 1e3 for s in samples[row["ruleset"]]["warm"]]
    found = None
    if breakdown:
        from tvm_ext.bench.breakdown import breakdown as where_time_goes

        log(f"{rows[0]['ruleset']}: {breakdown} runs plain and {breakdown} with every kernel timed ...")
        found = where_time_goes(*first, workload, rows[0]["work_dir"], runs=breakdown)
    per_layer = None
    if layers:
        work_dir = rows[0]["work_dir"]
        log(f"timing every conv task of {work_dir} against ORT, {threads} threads ...")
        per_layer = peer_module().layer_rows(work_dir, targets[rows[0]["ruleset"]], threads, log=log)
        for row in per_layer:
            row["ruleset"] = rows[0]["ruleset"]
    from tvm_ext.targets import describe_host

    host = describe_host()
    result = {"workload": workload.name, "options": workload.options, "target": target.kind.name,
              "host": {"cpu": host.get("cpu_name"), "mcpu": host.get("mcpu"),
                       "cores": host.get("physical_cores"),
                       "int8_flags": sorted(f for f in ("avx2", "avx512vnni", "avxvnni", "amx-int8")
                                            if f in host.get("features", ()))},
              "trials_per_task": trials if not from_logs else min(
                  (r["trials"] for r in rows if r.get("trials") is not None), default=None),
              "rounds": rounds, **({"warm_runs": warm} if warm else {}), "rows": rows}
    if per_layer is not None:
        result["per_layer"] = per_layer
    if found is not None:
        result["breakdown"] = found
    if out_json:
        write_json(out_json, result)
        log(f"wrote {out_json}")
    return result


def _put_times(rows, seconds: dict, rulesets, ms_key: str, ratio_key: str) -> None:
    """Each row's median in ms and its ratio to the plugin row's (else the first rule set's)."""
    base = seconds.get("plugin", seconds[rulesets[0]])
    for row in rows:
        row[ms_key] = seconds[row["ruleset"]] * 1e3
        row[ratio_key] = seconds[row["ruleset"]] / base


def _network(workload, ruleset, target, trials, from_logs, work_root, label, log):
    """(callable running the compiled network, its row, (executable, device, inputs)) for one database
    of ``workload``:
    tuned first unless ``from_logs``, checked bit-exactly against the workload's reference."""
    import tvm

    from tvm_ext.targets import target_key, target_mismatch
    from tvm_ext.tune.save import saved_for

    work_dir = tuning.default_work_dir(workload.name, target, ruleset, work_root)
    if from_logs and work_root == tuning.SAVED_ROOT:  # the one saved for this CPU, where there is one
        work_dir = saved_for(workload.name, ruleset, workload.options, target, work_root) or work_dir
    if not from_logs:
        tuning.tune(workload, target, work_dir, trials, ruleset, log=log)
    meta = tuning.read_meta(work_dir)  # a clear error when a committed database is missing
    mismatch = target_mismatch(meta["target"], target) if from_logs else None
    if mismatch:
        log(f"note: {work_dir}: {mismatch}")
    tuning.check_instructions(work_dir, target)  # not an LLVM abort on a host without VNNI/AMX
    if meta["options"] != workload.options:
        raise tuning.DatabaseMismatch(f"{work_dir} was tuned for {meta['options']}, not {workload.options}")
    log(f"compiling {workload.name} with the {label} database ...")
    executable = tuning.compile_workload(workload, target, work_dir)
    vm = tuning.make_vm(executable, target)
    ok, summary = workload.check(tuning.run_workload(vm, workload, target))
    log(f"{label}: {'exact match' if ok else 'MISMATCH'} with the NumPy reference ({summary})")
    dev = tuning.device_for(target)
    args = [tvm.runtime.tensor(x, dev) for x in workload.inputs]
    summary = tuning.report(work_dir)
    untuned = [t["name"] for t in summary["tasks"] if t["trials"] == 0]
    if untuned:  # a database cut short: its e2e row is not a figure of the tuned path
        log(f"{label}: {len(untuned)} of {len(summary['tasks'])} tasks have no record in "
            f"{work_dir} and run untuned (resume with tvm-ext tune)")
    row = {"ruleset": label, "exact_match": bool(ok), "work_dir": work_dir, "untuned_tasks": len(untuned),
           "target": target_key(target), "tuned_for": meta["target"].get("mcpu"),
           "e2e_estimate_ms": None if summary["e2e_us"] is None else summary["e2e_us"] / 1e3,
           "non_conv_estimate_ms": non_conv_ms(summary), "trials": tuned_trials(summary["tasks"]),
           "picked_in_network": sum("picked_rank" in t for t in summary["tasks"])}
    return (lambda: (vm["main"](*args), dev.sync())), row, (executable, dev, args)


def non_conv_ms(summary) -> float | None:
    """The weighted runner bests of the tasks that are not convolutions (stem layout change,
    pooling, dense, reshape): what the network spends outside the tensorized convs, by the
    tuner's figures. None while a task has no record."""
    if summary["e2e_us"] is None:
        return None
    return sum(t["weight"] * t["best_us"] for t in summary["tasks"] if "conv" not in t["name"]) / 1e3


def tuned_trials(tasks) -> int | None:
    """The trial count most tuned tasks reached (the larger one on a tie): the budget the
    database was tuned to. Not the fewest: a task with a small space (a pooling, a reshape, a
    layout change) stops at its handful of distinct candidates at any budget, and the fewest
    said '3' of a database tuned to 64. Untuned tasks are counted apart (untuned_tasks)."""
    counts = Counter(t["trials"] for t in tasks if t["trials"] > 0)
    return max(counts, key=lambda n: (counts[n], n)) if counts else None


def peer_module():
    from tvm_ext.bench import peers  # needs onnx / onnxruntime only when a peer is asked for

    return peers
