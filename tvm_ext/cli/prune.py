"""``tvm-ext prune``: drop the records a tuning database no longer uses."""
from __future__ import annotations

from tvm_ext.cli.common import log


def add_parser(sub) -> None:
    p = sub.add_parser("prune", help="drop the records of modules that are no longer a task of a work dir",
                       description="When a workload's code changes a task's TIR, the old module's records stay "
                                   "in the database, unused. Keep the records of the work dir's tasks (as the "
                                   "last 'tvm-ext tune' stored them) and drop the rest: the records file is "
                                   "rewritten, checked (every task keeps all its records) and replaced in one "
                                   "rename; the workload file is left as it is.")
    p.add_argument("work_dir", metavar="DIR", help="a work dir written by 'tvm-ext tune'")
    p.set_defaults(func=run)


def run(args) -> int:
    from tvm_ext import tune as tuning

    tuning.prune(args.work_dir, log=log)
    return 0
