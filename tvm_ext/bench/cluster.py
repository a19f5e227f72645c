"""Scaling of cluster tuning: the same workload and budget tuned by 1 and 2 single-core nodes and
by the plain local command on one core, one after another on this machine (``tvm-ext bench-cluster``).

Each node is its own process pinned to one core (``taskset``), with one builder process and TVM's
thread pool at 1; the local run is ``tvm-ext tune`` pinned the same way, so every row has the same
compute per node. Every run starts from an empty work dir and must end with the same tasks at the
same budget. Per run: wall seconds, the seconds its tasks took on their nodes, and the parts that
stay serial (task extraction; what the driver adds); the model ``T(N) = serial + max(sum of task
seconds / N, longest task)`` is fitted on them and evaluated for larger N (docs/journal.md).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from tvm_ext.jsonio import write_json


def _pinned_env() -> dict:
    return {**os.environ, "TVM_NUM_THREADS": "1", "TVM_EXT_BUILD_WORKERS": "1", "OMP_NUM_THREADS": "1"}


def _local(workload: str, target_json: str, trials: int, work_dir: str, log) -> float:
    cmd = ["taskset", "-c", "0", sys.executable, "-m", "tvm_ext", "tune", workload, "--target", target_json,
           "--trials", str(trials), "--work-dir", work_dir]
    start = time.time()
    proc = subprocess.run(cmd, env=_pinned_env(), capture_output=True, text=True)
    wall = time.time() - start
    if proc.returncode:
        raise RuntimeError(f"local run failed: {proc.stderr.strip().splitlines()[-1:]}")
    log(f"local (1 core): {wall:.0f} s")
    return wall


def _cluster(workload, target, trials: int, work_dir: str, nodes: int, log) -> float:
    from tvm_ext.cluster.local import LocalCluster
    from tvm_ext.cluster.tune import tune_on_cluster

    with LocalCluster(workers=nodes, cores=[[k % len(os.sched_getaffinity(0))] for k in range(nodes)]) as cluster, \
            cluster.client() as client:
        start = time.time()  # the cluster is up: its start is not tuning time
        tune_on_cluster(workload, target, work_dir, trials, client, log=lambda line: log(f"  {line}"))
        wall = time.time() - start
    log(f"{nodes} node(s): {wall:.0f} s")
    return wall


def _row(label: str, nodes: int, wall: float, work_dir: str) -> dict:
    from tvm_ext import tune as tuning

    rep = tuning.report(work_dir)
    task_s = {t["name"]: t["tuning_s"] or 0.0 for t in rep["tasks"]}
    per_node = {}
    for t in rep["tasks"]:
        per_node[t.get("node", "local")] = per_node.get(t.get("node", "local"), 0.0) + task_s[t["name"]]
    return {"run": label, "nodes": nodes, "wall_s": round(wall, 1), "tasks": len(rep["tasks"]), "task_s": task_s,
            "trials": sorted({t["trials"] for t in rep["tasks"]}), "task_s_sum": round(sum(task_s.values()), 1),
            "longest_task_s": round(max(task_s.values(), default=0.0), 1),
            "busy_s_per_node": {k: round(v, 1) for k, v in sorted(per_node.items())},
            "e2e_estimate_ms": None if rep["e2e_us"] is None else round(rep["e2e_us"] / 1e3, 3)}


def model(serial_s: float, task_s: list, nodes: int) -> float:
    """Predicted wall seconds on ``nodes`` nodes: the serial part plus the tasks spread longest
    first over the nodes (LPT), bounded below by the longest task."""
    loads = [0.0] * nodes
    for s in sorted(task_s, reverse=True):
        loads[loads.index(min(loads))] += s
    return serial_s + max(loads)


def run(workload_name: str = "resnet50-int8", trials: int = 8, nodes=(1, 2), local: bool = True,
        out_json: str | None = None, log=print) -> dict:
    from tvm_ext import tune as tuning
    from tvm_ext import workloads
    from tvm_ext.targets import describe_host, resolve_target

    host = describe_host()
    target = resolve_target({"kind": "llvm", "mcpu": host.get("mcpu") or "x86-64", "num-cores": 1})
    target_json = json.dumps({"kind": "llvm", "mcpu": str(target.attrs["mcpu"]), "num-cores": 1})
    workload = workloads.get(workload_name)
    start = time.time()
    tasks = tuning.extract_tasks(workload, target)
    extract_s = time.time() - start
    rows, tmp = [], tempfile.mkdtemp(prefix="tvm_ext_bench_cluster_")
    try:
        if local:
            work_dir = os.path.join(tmp, "local")
            rows.append(_row("local", 1, _local(workload_name, target_json, trials, work_dir, log), work_dir))
        for n in nodes:
            work_dir = os.path.join(tmp, f"nodes{n}")
            wall = _cluster(workload, target, trials, work_dir, n, log)
            rows.append(_row(f"cluster-{n}", n, wall, work_dir))
            rows[-1]["serial_s"] = round(wall - model(0.0, list(rows[-1]["task_s"].values()), n), 1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    one = next(r for r in rows if r["run"] == "cluster-1")
    for row in rows:
        row["speedup_vs_1_node"] = round(one["wall_s"] / row["wall_s"], 2)
    task_s = list(one["task_s"].values())
    predicted = {str(n): round(model(one["serial_s"], task_s, n), 1) for n in (1, 2, 4, 8, 16, 32, 100)}
    result = {"workload": workload_name, "trials_per_task": trials, "tasks": len(tasks), "target": target_json,
              "extract_s": round(extract_s, 1),
              "host": {"cpu": host.get("cpu_name"), "mcpu": host.get("mcpu"), "cores": host.get("physical_cores")},
              "rows": rows,
              "model": {"formula": "T(N) = serial + LPT makespan of the 1-node run's task seconds over N nodes",
                        "serial_s": one["serial_s"], "predicted_wall_s": predicted,
                        "checked_2_nodes": {"predicted": predicted["2"],
                                            "measured": next((r["wall_s"] for r in rows if r["nodes"] == 2
                                                              and r["run"] != "local"), None)}}}
    if out_json:
        write_json(out_json, result)
        log(f"wrote {out_json}")
    return result
