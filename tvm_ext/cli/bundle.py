"""``tvm-ext bundle``: build here, time on a device machine that has only TVM's runtime, import the results."""
from __future__ import annotations

import json
import os

from tvm_ext.cli.common import log


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bundle", help="build every candidate here, time them on a device with TVM's runtime only, import",
        description="Tuning where the compiler and the device cannot talk (an air-gapped GPU box, a lent "
                    "machine with no package index). 'build' samples and compiles, per task and rule set, the "
                    "untuned schedule and N candidates (N sized to the device time by a time model), computes "
                    "references and packs DIR/bundle.tar.xz with a runner needing only TVM's runtime and NumPy; "
                    "'runtime' packs TVM's runtime (no compiler library) for the device's Python; on the device: "
                    "python3 bundle/runner.py bundle --results R.jsonl --deadline S --supervise; 'import' turns "
                    "the measured candidates into tuning records that tune, report and bench --from-logs read; "
                    "'plan' prints a bundle's time model.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    b = verbs.add_parser("build", help="sample, build and pack the candidates and references")
    b.add_argument("--out", default=".bundle/cuda-seeds", help="bundle directory (default .bundle/cuda-seeds)")
    b.add_argument("--target", default="cuda-sm90", help="target preset or JSON (default cuda-sm90: H100/H200)")
    b.add_argument("--resnet", default="resnet50-int8-s8", help="network workload, or 'none'")
    b.add_argument("--batch", type=int, default=16, help="network batch (default 16, the seed's)")
    b.add_argument("--image", type=int, default=224, help="network image size (default 224)")
    b.add_argument("--phi2", default="full", help="Phi-2 decode kernels: full, reduced, or 'none'")
    b.add_argument("--context", type=int, default=512, help="Phi-2 cached positions (default 512)")
    b.add_argument("--rulesets", default="plugin,no-inline-const,upstream", help="comma-separated rule sets")
    b.add_argument("--candidates", type=int, default=None,
                   help="candidates per task and rule set (default: as many as the time model fits)")
    b.add_argument("--budget", type=float, default=600.0, help="device seconds of one command (default 600)")
    b.add_argument("--tasks", type=int, default=None, help="only the first N network tasks (quick runs)")
    b.add_argument("--kernels", type=int, default=None, help="only the first N Phi-2 kernels a fusion mode")
    b.add_argument("--no-peers", action="store_true", help="leave the PyTorch rows out")
    b.add_argument("--plan-only", action="store_true",
                   help="sample and build nothing: print the time model of the full bundle (nominal counts)")
    b.set_defaults(func=run_build)
    r = verbs.add_parser("runtime", help="pack TVM's runtime alone (no 259 MB compiler) for the device's Python")
    r.add_argument("--out", default=".bundle/tvm-runtime.tar.xz", help="archive to write")
    r.add_argument("--python", default="3.12", help="the device machine's Python (default 3.12); 'here' "
                                                      "copies this Python's installed TVM")
    r.add_argument("--wheels", default=None, help="directory of already downloaded wheels")
    r.set_defaults(func=run_runtime)
    i = verbs.add_parser("import", help="measured candidates of a results file become tuning records")
    i.add_argument("results", help="the runner's results file (JSON lines)")
    i.add_argument("--bundle", default=".bundle/cuda-seeds", help="the bundle directory it was built into")
    i.add_argument("--work-dir", default="tvm_ext_work", help="root of the work dirs (default tvm_ext_work)")
    i.set_defaults(func=run_import)
    t = verbs.add_parser("table", help="the seed tables of a results file (ResNet-50 per rule set, Phi-2 per schedule)")
    t.add_argument("results", help="the runner's results file (JSON lines)")
    t.add_argument("--bundle", default=".bundle/cuda-seeds", help="the bundle directory it was built into")
    t.add_argument("--json", default=None, metavar="FILE", help="also write the tables as JSON")
    t.set_defaults(func=run_table)
    pl = verbs.add_parser("plan", help="print a bundle's time model (items, estimated seconds, margin)")
    pl.add_argument("bundle", help="bundle directory")
    pl.add_argument("--limit", type=float, default=600.0, help="one command's limit in seconds (default 600)")
    pl.set_defaults(func=run_plan)


def _none(value: str):
    return None if value.strip().lower() in ("", "none", "no") else value


def run_build(args) -> int:
    from tvm_ext import bundle

    resnet = _none(args.resnet) and {"workload": args.resnet, "batch": args.batch, "image": args.image}
    phi2 = _none(args.phi2) and {"config": args.phi2, "context": args.context}
    if args.candidates is not None and args.candidates < 0:
        raise ValueError("--candidates must be >= 0")
    summary = bundle.build(args.out, args.target, resnet=resnet, phi2=phi2, rulesets=args.rulesets.split(","),
                           candidates=args.candidates, budget_s=args.budget, tasks=args.tasks,
                           kernels=args.kernels, peers=() if args.no_peers else bundle.PEERS,
                           plan_only=args.plan_only, log=log)
    if args.plan_only:
        print(bundle.table(summary["estimate"]))
        print(f"{summary['candidates']} candidates per task and rule set; "
              f"{len(summary['manifest']['items'])} items")
        return 0
    with open(os.path.join(args.out, "ship", "manifest.json"), encoding="utf-8") as f:
        est = bundle.estimate(json.load(f), args.budget)
    print(bundle.table(est))
    print(json.dumps(summary))
    return 0


def run_runtime(args) -> int:
    import tempfile

    from tvm_ext.bundle import runtime

    with tempfile.TemporaryDirectory() as tmp:
        site = os.path.join(tmp, "site")
        if args.python == "here":
            runtime.runtime_site(site)
        else:
            wheels = args.wheels or os.path.join(tmp, "wheels")
            found = [os.path.join(wheels, f) for f in os.listdir(wheels)] if args.wheels else \
                runtime.download_wheels(wheels, args.python)
            runtime.runtime_from_wheels([w for w in found if w.endswith(".whl")], site)
        sizes = runtime.site_bytes(site)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        size = runtime.pack_site(site, args.out)
    print(f"{args.out}: {size / 2**20:.1f} MiB compressed, {sizes['total'] / 2**20:.1f} MiB unpacked "
          f"(libtvm_runtime {sizes.get('libtvm_runtime.so', 0) / 2**20:.1f} MiB, no libtvm_compiler)")
    return 0


def run_import(args) -> int:
    from tvm_ext.bundle import import_results

    import_results(args.results, args.bundle, args.work_dir, log=log)
    return 0


def run_table(args) -> int:
    from tvm_ext.bundle import tables
    from tvm_ext.bundle.importer import read_rows

    path = os.path.join(args.bundle, "ship", "manifest.json")
    if not os.path.isfile(path) or not os.path.isfile(args.results):
        raise ValueError(f"need {path} and {args.results}")
    with open(path, encoding="utf-8") as f:
        t = tables.tables(json.load(f), read_rows(args.results))
    print(tables.text(t))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(t, f, indent=1)
    return 0


def run_plan(args) -> int:
    from tvm_ext import bundle

    path = os.path.join(args.bundle, "ship", "manifest.json") if os.path.isdir(args.bundle) else args.bundle
    if not os.path.isfile(path):
        raise ValueError(f"no manifest at {path}")
    with open(path, encoding="utf-8") as f:
        print(bundle.table(bundle.estimate(json.load(f), args.limit)))
    return 0
