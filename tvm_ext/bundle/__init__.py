"""Build here, time there: tuning and benchmarking where the compiler and the device are on machines that
cannot talk (an air-gapped GPU box, a device with only TVM's runtime; TVM's RPC needs a network).

On the build machine ``build`` samples and compiles every variant to be timed (per task and rule set:
the untuned schedule, then ``candidates`` drawn from the space, sized to the device time by the time
model of ``plan``), computes the references and packs one archive with a runner that needs only TVM's
runtime and NumPy.  On the device ``runner.py`` checks, times and writes each result at once.  Back
here ``import_results`` turns the measured variants into tuning records, so ``tvm-ext report`` and
``bench --from-logs`` read them and the next bundle can start from them.

Modules, one role each: ``sources`` (every call into the rule sets and schedules), ``jobs`` (what is
measured), ``assemble`` (libraries, references, manifest, archive), ``plan`` (order and time model),
``inputs`` and ``tolerance`` (NumPy only, shipped), ``runner`` (shipped), ``runtime`` (TVM's runtime
alone), ``importer`` (results to records).
"""
from __future__ import annotations

import os

from tvm_ext.bundle.importer import import_results  # noqa: F401
from tvm_ext.bundle.plan import estimate, table  # noqa: F401

RESNET = {"workload": "resnet50-int8-s8", "batch": 16, "image": 224}
PHI2 = {"config": "full", "context": 512}
RULESETS = ("plugin", "no-inline-const", "upstream")
PEERS = ({"id": "peer/torch-resnet50", "peer": "resnet50", "experiment": "resnet50-int8-s8",
          "args": {"batch": 16, "image": 224, "device": "cuda"}},
         {"id": "peer/torch-phi2-decode", "peer": "phi2_decode", "experiment": "phi2-decode",
          "args": {"context": 512, "device": "cuda", "config": "full"}})


def build(out_dir: str, target="cuda-sm90", *, resnet: dict | None = RESNET, phi2: dict | None = PHI2,
          rulesets=RULESETS, candidates: int | None = None, budget_s: float = 600.0, margin: float = 0.2,
          tasks: int | None = None, kernels: int | None = None, peers=PEERS, plan_only: bool = False,
          log=print) -> dict:
    """Build a bundle into ``out_dir`` (``out_dir/bundle.tar.xz`` is what travels; ``host/`` stays).

    ``resnet``: {"workload", "batch", "image"} or None; ``phi2``: {"config", "context"} or None;
    ``candidates``: per task and rule set, or None to size them so that the time model's estimate is
    ``(1 - margin) * budget_s`` (one device command's limit); ``tasks`` / ``kernels``: only the first
    that many (tests); ``peers``: the PyTorch rows (``torch_peers``), a dict each; ``plan_only``: sample and
    build nothing, return the manifest of nominal items (``assemble.nominal_items``) and its time model."""
    from tvm_ext.bundle import assemble as B
    from tvm_ext.bundle import jobs as J
    from tvm_ext.bundle import plan as P
    from tvm_ext.bundle.sources import is_gpu as sources_is_gpu
    from tvm_ext.targets import resolve_target

    target = resolve_target(target)
    rulesets = [r.strip() for r in rulesets if r.strip()]
    all_jobs, options, tunable = [], {}, []
    if resnet:
        opts = {k: v for k, v in resnet.items() if k != "workload"}
        options[resnet["workload"]] = dict(opts, seed=0)
        net = J.network_jobs(resnet["workload"], opts, target, rulesets, 0, tasks=tasks, log=log)
        all_jobs += net
        tunable += [(job, rulesets) for job in net]
    if phi2:
        kern = J.phi2_jobs(phi2["config"], phi2["context"], target, rulesets, 0, kernels=kernels, log=log)
        all_jobs += kern
        tunable += [(job, ["plugin"]) for job in kern if any(v.label == "rule" for v in job.variants)]
    if not all_jobs:
        raise ValueError("nothing to build: give --resnet and/or --phi2")
    peers = [dict(p) for p in peers if (resnet and p["experiment"] == resnet["workload"])
             or (phi2 and p["experiment"] == "phi2-decode")]
    index = {id(j): i for i, j in enumerate(all_jobs)}
    tunable_at = {index[id(j)]: sets for j, sets in tunable}
    device = "cuda" if sources_is_gpu(target) else "cpu"
    if candidates is None:
        candidates = fit_candidates(all_jobs, tunable_at, peers, device, (1 - margin) * budget_s)
        log(f"time model: {candidates} candidates per task and rule set fit {(1 - margin) * budget_s:.0f} s")
    if plan_only:
        manifest = P.order(B.nominal_items(all_jobs, tunable_at, candidates), peers, device)
        return {"manifest": manifest, "candidates": candidates, "estimate": P.estimate(manifest, budget_s)}
    for job, sets in tunable:
        J.extend(job, target, sets, candidates, log=log)
    os.makedirs(out_dir, exist_ok=True)
    return B.build_bundle(out_dir, all_jobs, target, peers=peers, budget_s=budget_s, rulesets=rulesets,
                          options=options, log=log)


def fit_candidates(jobs: list, tunable_at: dict, peers: list, device: str, limit_s: float, most: int = 200) -> int:
    """The most candidates per task and rule set whose bundle the time model prices at ``limit_s`` or less
    (every item priced as ``plan.order`` prices it: its task's bytes, the timer's floor, the peers)."""
    from tvm_ext.bundle import assemble as B
    from tvm_ext.bundle import plan as P

    n = 0
    while n < most and P.order(B.nominal_items(jobs, tunable_at, n + 1), peers, device)["estimate_s"] <= limit_s:
        n += 1
    return n


def run(bundle_dir: str, results: str, deadline: float = 540.0, log=print) -> int:
    """Run a bundle's shipped runner in this process (the device it was built for: a CPU bundle here)."""
    import importlib.util

    path = os.path.join(bundle_dir, "runner.py")
    spec = importlib.util.spec_from_file_location("bundle_runner", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main([bundle_dir, "--results", results, "--deadline", str(deadline)])
