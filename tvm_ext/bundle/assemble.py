"""``tvm-ext bundle build``: every variant of every job built here, one library per task, references and a
manifest beside the runner, packed into one compressed archive for a device machine with TVM's runtime only.

Layout of a bundle directory::

    ship/                what travels (``bundle.tar.xz``: ship/ compressed)
      manifest.json      the items in order of value (``bundle.plan``), each with its estimated seconds
      runner.py inputs.py tolerance.py torch_peers.py
      libs/NNN.so        one library a task: a PrimFunc per variant, named by its label
      refs/NNN.npy       float references (float32); integer outputs are checked by digest
      consts/NNN_P.npy   the network's small integer constants (real values)
    host/                what stays: the build's settings, each task's module and each variant's trace
                         (``bundle import`` turns measured variants into tuning records from these)

Many variants in one library keep it small: one host module, one fatbin a task (nvcc sees one file);
xz compresses the SASS about 15x.
"""
from __future__ import annotations

import json
import os
import shutil
import tarfile
import time

import numpy as np

from tvm_ext.bundle import jobs as J
from tvm_ext.bundle import plan as P
from tvm_ext.bundle import sources
from tvm_ext.bundle.inputs import make_inputs
from tvm_ext.bundle.tolerance import digest
from tvm_ext.targets import target_to_json

SHIPPED = ("runner.py", "inputs.py", "tolerance.py")
ARCHIVE = "bundle.tar.xz"


def _compile(funcs: dict, target):
    """One library of {symbol: PrimFunc}; (module, {symbol: error}) with failing variants left out."""
    import tvm

    def build(named):
        mod = tvm.IRModule({k: f.with_attr("global_symbol", k) for k, f in named.items()})
        with tvm.transform.PassContext(opt_level=3):
            return tvm.compile(mod, target=target)

    try:
        return build(funcs), {}
    except Exception:  # noqa: BLE001 -- find the variants that fail, keep the others
        errors, good = {}, {}
        for k, f in funcs.items():
            try:
                build({k: f})
                good[k] = f
            except Exception as err:  # noqa: BLE001
                lines = [ln for ln in str(err).strip().splitlines() if ln.strip()] or [repr(err)]
                errors[k] = lines[-1][:300]
        return (build(good) if good else None), errors


def _inputs(job: J.Job, root: str, index: int) -> tuple[list, list]:
    """(manifest param specs, the NumPy inputs) of a job: its constants saved under consts/, the rest
    drawn exactly as the runner draws them (``inputs.make_inputs``)."""
    specs = []
    for pos, p in enumerate(job.params):
        if "value" in p:
            rel = f"consts/{index:03d}_{pos}.npy"
            np.save(os.path.join(root, rel), p["value"])
            specs.append({"shape": p["shape"], "dtype": p["dtype"], "file": rel})
        else:
            specs.append(dict(p))
    return specs, make_inputs(specs, job.seed, root)


def _trace_json(job: J.Job, target, host: str) -> dict:
    """{label: the variant's trace as MetaSchedule's JSON database writes it (plain lists)}, by committing
    them to a scratch JSONDatabase and reading its lines back (TVM's own serialization)."""
    import tempfile

    from tvm.s_tir import meta_schedule as ms

    from tvm_ext.tune.transfer import commit_measured

    with tempfile.TemporaryDirectory(dir=host) as tmp:
        db = ms.database.JSONDatabase(os.path.join(tmp, "w.json"), os.path.join(tmp, "r.json"), allow_missing=True)
        labels = []
        for v in job.variants:
            if v.trace is not None:
                sch = tvm_schedule(job.mod, v.trace)
                commit_measured(db, job.mod, sch, 1.0, target)
                labels.append(v.label)
        with open(os.path.join(tmp, "r.json"), encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
    out = {v.label: None for v in job.variants}
    out.update({label: line[1][0] for label, line in zip(labels, lines)})
    return out


def tvm_schedule(mod, trace):
    """A Schedule of ``mod`` with ``trace`` replayed (postprocessing steps included)."""
    from tvm.s_tir import Schedule

    sch = Schedule(mod)
    trace.apply_to_schedule(sch, remove_postproc=False)
    return sch


def write_job(job: J.Job, index: int, target, ship: str, host: str, log=print) -> list:
    """Build one job's library, reference and host files; returns its manifest items (unordered)."""
    import tvm

    funcs = {v.label: v.func for v in job.variants}
    lib, errors = _compile(funcs, target)
    for label, err in errors.items():
        log(f"  {job.name} {label}: build failed: {err}")
    lib_rel = f"libs/{index:03d}.so"
    if lib is not None:
        lib.export_library(os.path.join(ship, lib_rel))
    specs, arrays = _inputs(job, ship, index)
    ref = J.reference(job, arrays)
    if np.issubdtype(ref.dtype, np.floating):
        ref_rel = f"refs/{index:03d}.npy"
        np.save(os.path.join(ship, ref_rel), ref.astype("float32"))
        out_dtype = str(job.mod["main"].params[-1].dtype)
        check = {"kind": "float", "file": ref_rel, "k": J.reduction_length(job), "dtype": out_dtype}
    else:
        check = {"kind": "digest", "value": digest(ref)}
    with open(os.path.join(host, f"task_{index:03d}.json"), "w", encoding="utf-8") as f:
        f.write(tvm.ir.save_json(job.mod))
    traces = _trace_json(job, target, host)
    with open(os.path.join(host, f"traces_{index:03d}.json"), "w", encoding="utf-8") as f:
        json.dump(traces, f)
    out_bytes = int(ref.size * np.dtype(str(job.mod["main"].params[-1].dtype)).itemsize)
    in_bytes = sum(int(np.prod(p["shape"])) * np.dtype(p["dtype"]).itemsize for p in specs)
    items = []
    for v in job.variants:
        if v.label in errors:
            continue
        items.append({
            "id": f"{job.group}/{job.name}/{v.label}", "kind": "kernel", "lib": lib_rel, "func": v.label,
            "params": specs, "seed": job.seed, "output": -1, "check": check, "experiment": job.experiment,
            "group": job.group, "task": job.name, "task_index": index, "weight": job.weight,
            "ruleset": v.ruleset, "label": v.label, "rank": v.rank, "bytes": in_bytes, "out_bytes": out_bytes,
            "parts": job.parts,
            "same_as": sorted(k for k, kept in job.same_as.items() if kept == v.label)})
    return items


def nominal_items(jobs: list, tunable: list, n: int) -> list:
    """Manifest items without building anything: each job's untuned rows and ``n`` nominal candidates per
    tunable job and rule set ({job: rulesets}), each priced by its task's bytes (``plan_only`` builds: the
    time model of a full-size bundle in seconds instead of the hours its sampling takes on 2 cores)."""
    items = []
    for index, job in enumerate(jobs):
        in_bytes = sum(int(np.prod(p["shape"])) * np.dtype(p["dtype"]).itemsize for p in job.params)
        last = job.mod["main"].params[-1]
        out_bytes = int(np.prod([int(x) for x in last.shape])) * np.dtype(str(last.dtype)).itemsize
        base = {"kind": "kernel", "lib": f"libs/{index:03d}.so", "experiment": job.experiment, "group": job.group,
                "task": job.name, "task_index": index, "weight": job.weight, "bytes": in_bytes,
                "out_bytes": out_bytes, "parts": job.parts}
        for v in job.variants:
            items.append(dict(base, id=f"{job.group}/{job.name}/{v.label}", label=v.label, ruleset="", rank=0))
        for ruleset in tunable.get(index, ()):
            for i in range(n):
                items.append(dict(base, id=f"{job.group}/{job.name}/{ruleset}_c{i}", label=f"{ruleset}_c{i}",
                                  ruleset=ruleset, rank=i + 1))
    return items


def build_bundle(out_dir: str, jobs: list, target, *, peers: list = (), budget_s: float = 540.0,
                 rulesets: list = (), options: dict | None = None, log=print) -> dict:
    """Build ``jobs`` (``bundle.jobs``) for ``target`` into ``out_dir`` (ship/ + host/), order the items
    (``plan.order``), write the manifest and the archive; returns the manifest's summary.  ``rulesets``
    and ``options`` ({workload: its options}) are kept in host/ for ``bundle import``."""
    if sources.is_gpu(target):
        os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    ship, host = os.path.join(out_dir, "ship"), os.path.join(out_dir, "host")
    if os.path.exists(ship):
        shutil.rmtree(ship)
    for d in (os.path.join(ship, "libs"), os.path.join(ship, "refs"), os.path.join(ship, "consts"), host):
        os.makedirs(d, exist_ok=True)
    start, items = time.time(), []
    for i, job in enumerate(jobs):
        t = time.time()
        items += write_job(job, i, target, ship, host, log)
        eta = (time.time() - start) / (i + 1) * (len(jobs) - i - 1)
        log(f"[{i + 1}/{len(jobs)}] built {job.group}/{job.name}: {len(job.variants)} variants, "
            f"{time.time() - t:.1f} s, ETA {eta:.0f} s")
    here = os.path.dirname(os.path.abspath(__file__))
    for name in SHIPPED:
        shutil.copy(os.path.join(here, name), os.path.join(ship, name))
    if peers:
        peers_py = os.path.join(os.path.dirname(here), "bench", "torch_peers.py")
        shutil.copy(peers_py, os.path.join(ship, "torch_peers.py"))
    device = "cuda" if sources.is_gpu(target) else "cpu"
    manifest = P.order(items, list(peers), device)
    manifest.update(name=os.path.basename(os.path.abspath(out_dir)), device=device, target=str(target.kind.name),
                    arch=str(target.attrs.get("arch", "")), built=time.strftime("%Y-%m-%d %H:%M:%S"),
                    budget_s=budget_s)
    with open(os.path.join(ship, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=0)
    with open(os.path.join(host, "build.json"), "w", encoding="utf-8") as f:
        json.dump({"target": target_to_json(target), "rulesets": list(rulesets), "options": options or {},
                   "jobs": [{"index": i, "experiment": j.experiment, "group": j.group, "name": j.name,
                             "weight": j.weight} for i, j in enumerate(jobs)]}, f, indent=1)
    size = pack(out_dir)
    summary = {"items": len(manifest["items"]), "libraries": len(jobs), "archive_bytes": size,
               "build_s": round(time.time() - start, 1), "estimate_s": manifest["estimate_s"]}
    log(f"bundle {out_dir}: {summary['items']} items in {len(jobs)} libraries, archive "
        f"{size / 2**20:.1f} MiB, built in {summary['build_s']:.0f} s, "
        f"estimated {manifest['estimate_s']:.0f} s on the device")
    return summary


def pack(out_dir: str) -> int:
    """ship/ as ``bundle.tar.xz`` (what travels); its size in bytes."""
    path = os.path.join(out_dir, ARCHIVE)
    with tarfile.open(path + ".tmp", "w:xz", preset=9) as tar:
        tar.add(os.path.join(out_dir, "ship"), arcname="bundle")
    os.replace(path + ".tmp", path)
    return os.path.getsize(path)


def unpack(archive: str, dest: str) -> str:
    """Unpack a bundle archive into ``dest``; the bundle directory."""
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(dest, filter="data")
    return os.path.join(dest, "bundle")
