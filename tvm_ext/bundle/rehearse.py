"""A faithful rehearsal of a bundle's device run on this machine, only the device replaced.

The same ``bundle.build`` code builds the same kinds of variants for ``llvm`` instead of CUDA (the CPU
stand-in: its libraries load and run on the CPU), packs the same archive, which is unpacked into a
fresh directory and run by the *shipped* ``runner.py`` in a fresh Python process that can import TVM's
runtime only (a runtime site made by ``bundle.runtime``, first on its path: ``libtvm_compiler`` is not
there to load; the runner's first row names the libraries it loaded).  With ``python`` and ``wheels``
that Python is another one (the lent machine's 3.12: TVM, tvm-ffi and NumPy from wheels).

The kill test: the runner is started ``kills`` times and SIGKILLed at a random moment of its work each
time (``kill_test``), then run to the end; every complete line written before a kill must
still be in the final file, in order, and every item must have exactly one result row.  Then the
results are imported twice (the second adds nothing).
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time


def runner_env(site: str, extra_path: str | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site, extra_path) if p)
    env["TVM_USE_RUNTIME_LIB"] = "1"
    env.pop("PYTHONHOME", None)
    return env


def complete_lines(path: str) -> list:
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        data = f.read()
    return data[:data.rfind(b"\n") + 1].splitlines()


def kill_test(cmd: list, env: dict, results: str, kills: int, items: int, seed: int = 0, log=print) -> dict:
    """Run ``cmd`` (the runner) ``kills`` times, each SIGKILLed at a random moment of its work: once the
    results file has grown by a random number of lines (up to its share of ``items``), after a random
    further delay of up to 0.3 s (mid-item, mid-write); then once more to the end."""
    rng, snapshots = random.Random(seed), []
    for k in range(kills):
        before = len(complete_lines(results))
        target = before + rng.randint(1, max(1, 2 * items // (kills + 1)))
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and len(complete_lines(results)) < target:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.3))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        snapshots.append(complete_lines(results))
        log(f"kill {k + 1}/{kills}: {len(snapshots[-1])} lines written so far")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 and os.path.exists(results):
        done.stderr += "\n" + "".join(line.decode() + "\n" for line in complete_lines(results)[:1])
    final = complete_lines(results)
    lost = sum(1 for snap in snapshots if final[:len(snap)] != snap)
    rows = [json.loads(line) for line in final]
    ids = [r["id"] for r in rows if "id" in r and r.get("kind") not in ("attempt",)]
    dup = len(ids) - len(set(ids))
    return {"exit": done.returncode, "stderr": done.stderr[-2000:], "lines": len(final), "kills": kills,
            "lines_at_kills": [len(s) for s in snapshots], "snapshots_lost": lost, "duplicates": dup,
            "rows": rows}


def rehearse(out_dir: str, *, resnet=None, phi2=None, rulesets=("plugin", "upstream"), candidates: int = 2,
             tasks: int | None = None, kernels: int | None = None, kills: int = 2,
             python: str = sys.executable, wheels: str | None = None, seed: int = 0, log=print) -> dict:
    """Build a CPU-stand-in bundle into ``out_dir`` and rehearse its device run (module doc); a summary."""
    from tvm_ext import bundle
    from tvm_ext.bundle import assemble, runtime

    start = time.time()
    summary = bundle.build(out_dir, "llvm", resnet=resnet, phi2=phi2, rulesets=rulesets, candidates=candidates,
                           tasks=tasks, kernels=kernels, peers=(), log=log)
    work = tempfile.mkdtemp(prefix="bundle_rehearsal_", dir=out_dir)
    unpacked = assemble.unpack(os.path.join(out_dir, assemble.ARCHIVE), work)  # exactly what travels
    site = os.path.join(work, "site")
    if wheels:
        found = [os.path.join(wheels, f) for f in os.listdir(wheels) if f.endswith(".whl")]
        runtime.runtime_from_wheels([w for w in found if "tvm" in os.path.basename(w)], site)
        numpy_site = os.path.join(work, "numpy")
        for w in found:
            if os.path.basename(w).startswith("numpy"):
                import zipfile

                zipfile.ZipFile(w).extractall(numpy_site)
    else:
        runtime.runtime_site(site)
        numpy_site = None
    env = runner_env(site, numpy_site)
    results = os.path.join(work, "results.jsonl")
    cmd = [python, "-s", os.path.join(unpacked, "runner.py"), unpacked, "--results", results, "--deadline", "600"]
    with open(os.path.join(unpacked, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    killed = kill_test(cmd, env, results, kills, len(manifest["items"]), seed, log)
    rows = killed.pop("rows")
    device = next((r for r in rows if r.get("kind") == "device"), {})
    results_by_id = {r["id"]: r for r in rows if "id" in r and r.get("kind") != "attempt"}
    missing = [i["id"] for i in manifest["items"] if i["id"] not in results_by_id]
    failed = {k: r.get("error") or r.get("check") for k, r in results_by_id.items() if not r.get("ok")}
    first = second = None
    if killed["exit"] == 0:
        first = bundle.import_results(results, out_dir, os.path.join(work, "work"), log=log)
        second = bundle.import_results(results, out_dir, os.path.join(work, "work"), log=log)
    return dict(summary, **killed, python=device.get("python"), tvm_libraries=device.get("tvm_libraries"),
                items=len(manifest["items"]), missing=missing, failed=failed, imported=first,
                imported_again=second, results=results, seconds=round(time.time() - start, 1))
