"""``tvm-ext save``: copy a result into the project's tuning_logs/, pruned and compressed."""
from __future__ import annotations

from tvm_ext.cli.common import log


def add_parser(sub) -> None:
    p = sub.add_parser("save", help="save a work dir or bench JSON into tuning_logs/ (pruned, compressed)",
                       description="tune and bench write into git-ignored work dirs (tvm_ext_work/); saving a "
                                   "result into the project's tuning_logs/ is a step of its own. A tuning work "
                                   "dir is copied, checked (one left half-written by a killed run is refused), "
                                   "pruned of records of modules that are no longer its tasks and gzip-"
                                   "compressed (every reader -- tune, bench --from-logs, report, prune, "
                                   "generate -- reads it as it is); a directory of Phi-2 kernel databases is "
                                   "copied and compressed; a bench JSON is copied. An older save of the same "
                                   "name is replaced.")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="a work dir (e.g. tvm_ext_work/resnet50-int8-llvm-plugin), a directory of databases "
                        "(tvm_ext_work/phi2-decode-llvm-fused) or a bench JSON")
    p.add_argument("--to", default=None, metavar="DIR", help="where to save (default tuning_logs)")
    p.add_argument("--name", default=None,
                   help="save one PATH under this name, e.g. WORKLOAD-CPU-llvm-plugin (CPU: the LLVM CPU name) "
                        "beside the database of another CPU (tune starts from the saved database of the closest CPU)")
    p.set_defaults(func=run)


def run(args) -> int:
    from tvm_ext.tune.database import SAVED_ROOT
    from tvm_ext.tune.save import save

    if args.name and len(args.paths) > 1:
        raise ValueError("--name saves one PATH")
    for path in args.paths:
        save(path, root=args.to or SAVED_ROOT, log=log, name=args.name)
    return 0
