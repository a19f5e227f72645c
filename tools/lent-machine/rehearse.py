"""Rehearse lent-machine calls here: each call's command runs in a copy of exactly what would travel.

A call of the device tool carries the tracked files, the untracked files git does not ignore and
the paths named in ``carry``, at most 64 MiB together, into a fresh copy of the working tree; the
machine's /tmp stays between calls while it is warm. This script makes that copy for each call
(its own temporary directory), prints its size against the limit, and runs the call's command
there with ``OUT`` set to an empty folder and ``LENT_ROOT`` to one directory shared by the calls
(the warm machine's /tmp). It fails when a copy is over the limit or a command fails.

    python tools/lent-machine/rehearse.py \\
        --call .lent  "bash tools/lent-machine/cuda-seeds.sh stage --dry-run" \\
        --call .lent2 "LENT_DRY=1 source tools/lent-machine/setup.sh"

(the CUDA seed experiments no longer stage TVM's compiler: their bundle is rehearsed by
``tests/test_bundle.py``, see cuda-seeds.sh)

CARRY is a comma-separated list of ignored paths ('' for none).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

LIMIT = 64 * 2**20


def travelling_files(repo: str, carry: list[str]) -> list[str]:
    """Relative paths of every file a call with ``carry`` would take along."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=repo, capture_output=True, check=True).stdout.decode()
    files = {p for p in listed.split("\0") if p and os.path.isfile(os.path.join(repo, p))}
    for path in carry:
        full = os.path.join(repo, path)
        if not os.path.exists(full):
            raise SystemExit(f"rehearse: carried path {path} does not exist here (run pack.sh first?)")
        if os.path.isfile(full):
            files.add(path)
        for here, _, names in os.walk(full):
            files.update(os.path.relpath(os.path.join(here, n), repo) for n in names)
    return sorted(files)


def copy_tree(repo: str, files: list[str], dest: str) -> int:
    size = 0
    for rel in files:
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(repo, rel), target, follow_symlinks=False)
        size += os.lstat(target).st_size
    return size


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--call", nargs=2, action="append", metavar=("CARRY", "COMMAND"), required=True,
                        help="one device call: its carried paths (comma-separated) and its command")
    args = parser.parse_args(argv)
    repo = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, check=True,
                          text=True).stdout.strip()
    warm = tempfile.mkdtemp(prefix="rehearse-tmp-")  # the machine's /tmp, kept between calls
    failed = False
    try:
        for i, (carry, command) in enumerate(args.call, 1):
            paths = [p for p in carry.split(",") if p]
            files = travelling_files(repo, paths)
            with tempfile.TemporaryDirectory(prefix=f"rehearse-call{i}-") as copy, \
                    tempfile.TemporaryDirectory(prefix="rehearse-out-") as out:
                size = copy_tree(repo, files, copy)
                verdict = "fits" if size <= LIMIT else "OVER the 64 MiB limit: the call would be refused"
                print(f"call {i}: carry [{', '.join(paths)}]: {len(files)} files, {size / 2**20:.1f} MiB "
                      f"travel ({verdict})", flush=True)
                if size > LIMIT:
                    failed = True
                    continue
                start = time.time()
                env = dict(os.environ, OUT=out, LENT_ROOT=warm)
                code = subprocess.run(command, shell=True, cwd=copy, env=env).returncode
                back = sorted(os.listdir(out))
                print(f"call {i}: exit {code} after {time.time() - start:.0f} s; $OUT holds: {', '.join(back) or '-'}",
                      flush=True)
                failed |= code != 0
    finally:
        shutil.rmtree(warm, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
