"""The bundle's runner: load, check, time, write each result at once; on the device machine.

Runs as a plain script from the unpacked bundle (``python3 runner.py BUNDLE --results R.jsonl``) and
imports TVM's *runtime* only (as a script it sets
``TVM_USE_RUNTIME_LIB=1``: ``libtvm_runtime`` and tvm-ffi, not the 259 MB
compiler library), NumPy, the two NumPy-only files beside it (``inputs.py``, ``tolerance.py``) and, for
the peer rows alone, PyTorch (``torch_peers.py``).

Order and safety:
* first the device: the CUDA sidecar library (``libtvm_runtime_cuda``) is loaded and ``tvm.cuda(0).exist``
  checked before anything else; a failure is the results file's first row and exit code 3;
* then the manifest's items in its order (the seed tables' rows first, extra candidates last);
* each kernel's output is checked against its reference (exact for integers, a float16-accumulation
  tolerance for floats: ``tolerance.py``) on a poisoned output buffer before it is timed; a wrong or
  failing candidate, or a peer that raises, is a row with its error, never a lost table;
* every row is one JSON line, flushed and fsync'ed as soon as it is known: a kill at any second keeps
  every row written; a rerun skips the ids the file holds (resumable), drops a torn last line, and
  gives up on an item after two attempts that never came back (a kernel that kills the process);
* ``--deadline S``: stops on its own when the next item's estimated time would pass S seconds;
* ``--supervise``: runs itself as a child again after a crash, until done or the deadline.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MARGIN_S = 5.0  # kept free before the deadline


# --------------------------------------------------------------------------- results file
class Results:
    """The append-only results file: one JSON object a line, each fsync'ed at once."""

    def __init__(self, path: str):
        self.path = path
        self.done, self.attempts = set(), {}
        if os.path.exists(path):
            with open(path, "rb") as f:
                data = f.read()
            keep = data[:data.rfind(b"\n") + 1]  # a torn last line (killed mid-write) is dropped
            if len(keep) != len(data):
                with open(path, "r+b") as f:
                    f.truncate(len(keep))
            for line in keep.splitlines():
                row = json.loads(line)
                if row.get("kind") == "attempt":
                    self.attempts[row["id"]] = self.attempts.get(row["id"], 0) + 1
                elif "id" in row:
                    self.done.add(row["id"])
        self.file = open(path, "a", encoding="utf-8")

    def write(self, row: dict) -> None:
        self.file.write(json.dumps(row, sort_keys=True) + "\n")
        self.file.flush()
        os.fsync(self.file.fileno())
        if row.get("kind") == "attempt":
            self.attempts[row["id"]] = self.attempts.get(row["id"], 0) + 1
        elif "id" in row:
            self.done.add(row["id"])


# --------------------------------------------------------------------------- the device
def open_device(kind: str):
    """(tvm module, device, name) after the checks of the module doc; RuntimeError naming what is missing."""
    import tvm

    if kind == "cpu":
        return tvm, tvm.cpu(0), "cpu (stand-in)"
    from tvm_ffi.libinfo import load_lib_ctypes

    from tvm.base import _LOADED_LIBS

    if "tvm_runtime_cuda" not in _LOADED_LIBS:
        from pathlib import Path

        runtime_dir = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent
        try:
            _LOADED_LIBS["tvm_runtime_cuda"] = load_lib_ctypes("tvm", "tvm_runtime_cuda", "RTLD_LOCAL",
                                                               extra_lib_paths=[runtime_dir])
        except (OSError, RuntimeError) as err:
            raise RuntimeError(f"TVM's CUDA runtime (libtvm_runtime_cuda) does not load: {err}; it needs the "
                               "driver's libcuda.so.1 and CUDA 13's libcudart.so.13 on the library path") from None
    dev = tvm.cuda(0)
    if not dev.exist:
        raise RuntimeError("tvm.cuda(0).exist is False: no CUDA device visible to TVM's runtime")
    return tvm, dev, f"{dev.device_name} (sm_{dev.compute_version.replace('.', '')})"


# --------------------------------------------------------------------------- items
class Kernels:
    """Loaded libraries and made inputs, each once."""

    def __init__(self, tvm, dev, root: str):
        self.tvm, self.dev, self.root = tvm, dev, root
        self.libs, self.inputs = {}, {}

    def lib(self, name: str):
        if name not in self.libs:
            self.libs[name] = self.tvm.runtime.load_module(os.path.join(self.root, name))
        return self.libs[name]

    def tensors(self, item: dict) -> tuple[list, int]:
        """The item's device arguments, its output overwritten with ``poison`` before each use; the
        inputs of one task are made once (items come grouped by task)."""
        from inputs import make_inputs

        key = json.dumps([item["params"], item["seed"]])
        out_i = item["output"] % len(item["params"])
        if key not in self.inputs:
            arrays = make_inputs(item["params"], item["seed"], self.root)
            arrays[out_i] = poison(arrays[out_i])
            self.inputs = {key: ([self.tvm.runtime.tensor(a, self.dev) for a in arrays], arrays[out_i])}
        tensors, bad = self.inputs[key]
        tensors[out_i].copyfrom(bad)
        return tensors, out_i


def poison(array):
    """A buffer the kernel must overwrite: NaN for floats, a byte pattern for integers."""
    import numpy as np

    out = np.empty_like(array)
    if np.issubdtype(out.dtype, np.floating):
        out.fill(np.nan)
    else:
        out.view(np.uint8).fill(0x5A)
    return out


def reference(root: str, check: dict):
    import numpy as np

    if check["kind"] == "digest":
        return check["value"]
    return np.load(os.path.join(root, check["file"]))


def run_kernel(kernels: Kernels, item: dict, number: int, repeat: int, min_repeat_ms: int) -> dict:
    from tolerance import check_output

    dev = kernels.dev
    lib = kernels.lib(item["lib"])
    tensors, out_i = kernels.tensors(item)
    lib[item["func"]](*tensors)
    dev.sync()
    ok, verdict = check_output(tensors[out_i].numpy(), reference(kernels.root, item["check"]),
                               item["check"].get("k", 1), item["check"].get("dtype"))
    row = {"ok": ok, "check": verdict}
    if ok:
        timer = lib.time_evaluator(item["func"], dev, number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)
        runs = sorted(float(r) for r in timer(*tensors).results)
        row.update(seconds=runs[len(runs) // 2], runs=runs)
    return row


def run_peer(item: dict) -> dict:
    import torch_peers

    fn, info = getattr(torch_peers, item["peer"])(**item.get("args", {}))
    seconds = torch_peers.time_calls(fn, calls=item.get("calls", 20), rounds=item.get("rounds", 5))
    return {"ok": True, "seconds": seconds, "info": info}


def run_bandwidth(tvm, dev, mib: int = 512, repeat: int = 5) -> dict:
    """Device-to-device copy of ``mib`` MiB: bytes read + written per second (the DRAM bound)."""
    import numpy as np

    n = mib * 2**20 // 4
    x, y = tvm.runtime.tensor(np.ones(n, "float32"), dev), tvm.runtime.empty((n,), "float32", dev)
    ts = []
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        y.copyfrom(x)
        dev.sync()
        ts.append(time.perf_counter() - t0)
    return {"ok": True, "gbs": 2 * n * 4 / min(ts[1:]) / 1e9}


# --------------------------------------------------------------------------- main loop
def run(root: str, results_path: str, until: float, number: int = 0, repeat: int = 5, min_repeat_ms: int = 20,
        only: str = "", log=print) -> int:
    """Work through the bundle at ``root`` into ``results_path`` until the epoch ``until``; exit code."""
    sys.path.insert(0, root)  # inputs.py, tolerance.py, torch_peers.py travel beside the runner
    with open(os.path.join(root, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    results = Results(results_path)
    try:
        tvm, dev, name = open_device(manifest["device"])
    except Exception as err:  # noqa: BLE001 -- the first row says why nothing ran
        results.write({"kind": "device", "ok": False, "error": str(err), "t": time.time()})
        log(f"runner: {err}")
        return 3
    from tvm.base import _LOADED_LIBS

    results.write({"kind": "device", "ok": True, "name": name, "bundle": manifest["name"], "t": time.time(),
                   "tvm_libraries": sorted(_LOADED_LIBS), "python": sys.version.split()[0]})
    kernels, items = Kernels(tvm, dev, root), [i for i in manifest["items"] if i["id"].startswith(only)]
    todo = [i for i in items if i["id"] not in results.done]
    log(f"runner: {name}: {len(items) - len(todo)} of {len(items)} items already measured")
    t0, done = time.time(), 0
    for item in todo:
        left = until - time.time()
        if left < item.get("est_s", 1.0) + MARGIN_S:
            results.write({"kind": "stopped", "reason": f"deadline: {left:.0f} s left", "t": time.time()})
            log(f"runner: stopped before the deadline with {len(todo) - done} items left")
            return 0
        base = {"id": item["id"], "kind": item["kind"], "device": name}
        if results.attempts.get(item["id"], 0) >= 2:
            results.write(dict(base, ok=False, error="the runner died twice while running it"))
            continue
        results.write({"kind": "attempt", "id": item["id"], "t": time.time()})
        start = time.time()
        try:
            if item["kind"] == "kernel":
                row = run_kernel(kernels, item, number or 1, repeat, min_repeat_ms)
            elif item["kind"] == "peer":
                row = run_peer(item)
            elif item["kind"] == "bandwidth":
                row = run_bandwidth(tvm, dev, int(item.get("mib", 512)))
            else:
                row = {"ok": False, "error": f"unknown item kind {item['kind']!r}"}
        except Exception as err:  # noqa: BLE001 -- a failing candidate or peer is a row, not a lost table
            lines = [ln for ln in str(err).strip().splitlines() if ln.strip()] or [type(err).__name__]
            row = {"ok": False, "error": f"{type(err).__name__}: {lines[-1][:300]}"}
        results.write(dict(base, wall_s=round(time.time() - start, 3), **row))
        done += 1
        if done % 25 == 0 or done == len(todo):
            rate = (time.time() - t0) / done
            log(f"runner: {done}/{len(todo)} items, ETA {rate * (len(todo) - done):.0f} s")
    return 0


def supervise(argv: list, until: float, log=print) -> int:
    """Run the runner as a child until it exits 0 or 3, or the deadline is near: a kernel that kills
    its process (an illegal address, a segfault) costs one restart, not the lease."""
    code = 1
    while time.time() < until - MARGIN_S:
        code = subprocess.call([sys.executable, os.path.abspath(__file__), *argv, "--until", str(until)])
        if code in (0, 3):
            return code
        log(f"runner: child exited with {code}; resuming")
    return code


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", help="the unpacked bundle directory (manifest.json, libs/, refs/)")
    p.add_argument("--results", required=True, help="JSON-lines results file (appended; resumable)")
    p.add_argument("--deadline", type=float, default=540.0, help="seconds from now to stop by (default 540)")
    p.add_argument("--until", type=float, default=None, help=argparse.SUPPRESS)  # absolute, for children
    p.add_argument("--repeat", type=int, default=5, help="timed repeats a kernel (median reported)")
    p.add_argument("--min-repeat-ms", type=int, default=20, help="each repeat runs at least this long")
    p.add_argument("--only", default="", help="only items whose id starts with this")
    p.add_argument("--supervise", action="store_true", help="restart after a crash until done or the deadline")
    args = p.parse_args(argv)
    until = args.until if args.until is not None else time.time() + args.deadline
    if args.supervise:
        child = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--supervise"]
        return supervise(child, until)
    return run(args.bundle, args.results, until, 0, args.repeat, args.min_repeat_ms, args.only)


if __name__ == "__main__":
    # TVM's runtime library alone (as a script only: in a process that also compiles, this would leak
    # into its children through the environment)
    os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")
    sys.exit(main())
