"""nvcc for TVM-generated CUDA sources: one source per run, or many sources per run.

``compile_cuda(source, arch)`` compiles one source to a cubin (through ptxas, so
resource errors count) and returns ``(ok, first error line)``.  ``compile_batch``
returns, for every source of a list, the same ``(ok, error line)`` that
``compile_cuda`` would, with far fewer nvcc runs; ``CompilePool`` does it in
background threads while the caller generates more sources.

Why batches are needed: every nvcc run parses the CUDA headers again, seconds of
fixed cost, which is most of the time for a small candidate.  Why they are sound:

* Only sources with the *same preamble* are batched: the text before the first
  ``extern "C"`` line (includes, macros, helper functions), emitted once.  After it
  come the members' kernel sections, each between ``#define main_kernel
  tvm_ext_m<i>_main_kernel`` (one per kernel it defines) and the matching
  ``#undef``, so kernel symbols do not clash and every member sees exactly the
  preamble it sees alone, plus kernels of other members that it cannot name.
* A source is batched only if its kernel section holds nothing but ``extern "C"``
  kernels (no preprocessor line, no other top-level declaration), so one member can
  never supply a declaration another one is missing.
* A batch that compiles means every member compiles (ptxas checks each entry
  function on its own: shared memory, registers, launch bounds).  A batch that
  fails proves nothing for its members: the members the errors name (a line in
  their section, or their renamed kernel in a ptxas message) are compiled alone --
  so every failure's error text is that of its own compile -- and the rest are
  batched again; when no member is named, the batch is split in halves.  A member
  left alone is compiled from its original text, never the batched form.

Public API
----------
NVCC_FLAGS
nvcc_path() -> str | None
compile_cuda(source, arch, timeout=600) -> (ok, error_line)
split_source(source, max_bytes=...) -> (preamble, body, kernel_names) | None
batch_source(preamble, bodies) -> BatchSource
compile_batch(sources, arch, timeout=600) -> list[(ok, error_line)]
CompilePool(arch, jobs=None, timeout=600, batch=16, cache_dir=None)  (submit(source) -> Future)
compile_many(sources, arch, jobs=None, batch=16) -> list[(ok, error_line)]
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Optional

from tvm_ext.jsonio import write_json  # stdlib only

# Flags TVM's own nvcc path passes; the half/bfloat operator macros matter for fp16 kernels.
NVCC_FLAGS = (
    "-O3",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT162_OPERATORS__",
    "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    "--expt-relaxed-constexpr",
    "--expt-extended-lambda",
    "--use_fast_math",
    "-w",  # unused-variable warnings of generated code are noise here
)
DEFAULT_BATCH = 16  # sources per nvcc run at most
# Only sources up to this size are batched: nvcc's fixed cost (~2-4 s of header
# parsing) is most of a 10 KB source's compile and a third of a 150 KB one's, but
# noise next to the minutes of a fully unrolled 1-2 MB kernel, and a failing member
# makes the rest of its batch compile twice.
MAX_BATCH_MEMBER_BYTES = 256 * 1024
MAX_BATCH_BYTES = 1024 * 1024
MEMBER_PREFIX = "tvm_ext_m"
# ptxas rejects an entry with more static shared memory than this on every arch we
# support; such a source is compiled alone (see split_source).
PTXAS_STATIC_SHARED_LIMIT = 48 * 1024
_SHARED = re.compile(r"__shared__\s+(?:(?:alignas|__align__)\(\d+\)\s+)?([A-Za-z_][\w ]*?)\s+\w+\[(\d+)\]")
_TYPE_BYTES = {"char": 1, "signed char": 1, "uchar": 1, "unsigned char": 1, "int8_t": 1, "uint8_t": 1,
               "short": 2, "ushort": 2, "half": 2, "__half": 2, "nv_bfloat16": 2, "__nv_bfloat16": 2,
               "int16_t": 2, "uint16_t": 2, "half2": 4, "char4": 4, "uchar4": 4, "int": 4, "uint": 4,
               "unsigned int": 4, "float": 4, "int32_t": 4, "uint32_t": 4, "int2": 8, "uint2": 8,
               "float2": 8, "double": 8, "int64_t": 8, "uint64_t": 8, "long long": 8, "int4": 16,
               "uint4": 16, "float4": 16}

_KERNEL = re.compile(r'^extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(')


# --------------------------------------------------------------------------- one source
def nvcc_path() -> Optional[str]:
    return shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None
    )


def _error_line(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for ln in lines:
        if re.search(r"\berror\b", ln, re.IGNORECASE):
            # drop the temp file path, keep "(line): error: ..."
            return re.sub(r"^\S*?kernels\.cu", "kernels.cu", ln)[:300]
    return (lines[-1] if lines else "nvcc failed without output")[:300]


def _run_nvcc(source: str, arch: str, timeout: float) -> tuple[Optional[int], str]:
    """nvcc ``source`` (as kernels.cu) to a cubin: (return code, output); None on timeout."""
    exe = nvcc_path()
    if exe is None:
        raise FileNotFoundError("nvcc not found on PATH")
    with tempfile.TemporaryDirectory(prefix="tvm_ext_nvcc_") as tmp:
        src = os.path.join(tmp, "kernels.cu")
        with open(src, "w", encoding="utf-8") as f:
            f.write(source)
        cmd = [exe, "--cubin", f"-arch={arch}", *NVCC_FLAGS, "-o", os.path.join(tmp, "kernels.cubin"), src]
        # own process group: on timeout nvcc's children (cicc, ptxas) die too, or they
        # would keep the pipes open and the wait would never end
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            return None, ""
    return proc.returncode, out + "\n" + err


def compile_cuda(source: str, arch: str, timeout: float = 600) -> tuple[bool, str]:
    """Compile ``source`` with nvcc to a cubin for ``arch`` (e.g. "sm_80").

    Goes through ptxas (not only to PTX), so resource errors such as too much static
    shared memory are caught too.  Returns (ok, first error line; "" when ok).
    """
    code, output = _run_nvcc(source, arch, timeout)
    if code is None:
        return False, f"nvcc timed out after {timeout:.0f} s"
    if code == 0:
        return True, ""
    return False, _error_line(output)


# --------------------------------------------------------------------------- batches
def static_shared_bytes(source: str) -> int:
    """Bytes of the fixed-size ``__shared__`` arrays a source declares, all kernels
    together (an element type it does not know counts 1 byte)."""
    return sum(_TYPE_BYTES.get(ty.strip(), 1) * int(n) for ty, n in _SHARED.findall(source))


def split_source(source: str, max_bytes: Optional[int] = None):
    """(preamble, kernel section, kernel names) of a TVM CUDA source, or None when it
    may not be batched: larger than ``max_bytes``; a kernel section that holds
    anything but ``extern "C"`` kernels (preprocessor lines, other declarations); or
    more static shared memory than ptxas accepts (it would fail, and make the rest
    of its batch compile a second time).  ``max_bytes`` defaults to
    MAX_BATCH_MEMBER_BYTES."""
    max_bytes = MAX_BATCH_MEMBER_BYTES if max_bytes is None else max_bytes
    if len(source) > max_bytes or static_shared_bytes(source) > PTXAS_STATIC_SHARED_LIMIT:
        return None
    lines = source.split("\n")
    first = next((i for i, ln in enumerate(lines) if ln.startswith('extern "C"')), None)
    if first is None:
        return None
    names = []
    for ln in lines[first:]:
        if ln.startswith('extern "C"'):
            match = _KERNEL.match(ln)
            if match is None:
                return None
            names.append(match.group(1))
        elif ln.lstrip().startswith("#") or (ln[:1].strip() and ln.strip() != "}"):
            return None  # a directive or a top-level line other than a kernel's closing brace
    return "\n".join(lines[:first]), "\n".join(lines[first:]), sorted(set(names))


@dataclass
class BatchSource:
    """One translation unit for several members; ``sections[i]`` = (first, last) line."""

    text: str
    sections: list = field(default_factory=list)
    preamble_lines: int = 0


def batch_source(preamble: str, bodies: list) -> BatchSource:
    """The batched translation unit: the shared preamble once, then each member's
    kernel section with its kernels renamed ``tvm_ext_m<i>_<name>`` by macros.
    ``bodies`` are (kernel section, kernel names) pairs from ``split_source``."""
    lines = preamble.split("\n")
    batch = BatchSource("", preamble_lines=len(lines))
    for i, (body, names) in enumerate(bodies):
        start = len(lines) + 1
        lines.append(f"// ---- tvm_ext batch member {i}")
        lines += [f"#define {n} {MEMBER_PREFIX}{i}_{n}" for n in names]
        lines += body.split("\n")
        lines += [f"#undef {n}" for n in names]
        batch.sections.append((start, len(lines)))
    batch.text = "\n".join(lines) + "\n"
    return batch


def blame(output: str, batch: BatchSource) -> set:
    """Members an nvcc error output names: by a line in their section, or by their
    renamed kernel (ptxas).  An error in the shared preamble names all of them."""
    members = set()
    for match in re.finditer(r"kernels\.cu[(:](\d+)", output):
        line = int(match.group(1))
        if line <= batch.preamble_lines:
            return set(range(len(batch.sections)))
        members.update(i for i, (lo, hi) in enumerate(batch.sections) if lo <= line <= hi)
    members.update(int(m) for m in re.findall(MEMBER_PREFIX + r"(\d+)_", output))
    return {m for m in members if m < len(batch.sections)}


def compile_batch(sources: list, arch: str, timeout: float = 600,
                  stats: Optional[Counter] = None) -> list:
    """(ok, error line) for every source, as ``compile_cuda`` gives it alone, from as few
    nvcc runs as the sources allow.  The sources must share their preamble and be
    batchable (``split_source``); others are compiled alone.  ``stats`` counts runs."""
    stats = stats if stats is not None else Counter()
    parts = [split_source(s, max_bytes=len(s)) for s in sources]
    if len(sources) == 1 or any(p is None for p in parts) or len({p[0] for p in parts}) > 1:
        return [_compile_alone(s, arch, timeout, stats) for s in sources]
    batch = batch_source(parts[0][0], [(p[1], p[2]) for p in parts])
    stats["runs"] += 1
    stats["batch_runs"] += 1
    code, output = _run_nvcc(batch.text, arch, timeout)
    if code == 0:
        stats["batched_ok"] += len(sources)
        return [(True, "")] * len(sources)
    stats["batch_failures"] += 1
    named = blame(output, batch) if code is not None else set()
    if not named:  # timed out, or nothing attributable: halve
        mid = len(sources) // 2
        return (compile_batch(sources[:mid], arch, timeout, stats)
                + compile_batch(sources[mid:], arch, timeout, stats))
    results: list = [None] * len(sources)
    for i in named:
        results[i] = _compile_alone(sources[i], arch, timeout, stats)
    rest = [i for i in range(len(sources)) if i not in named]
    if rest:
        for i, res in zip(rest, compile_batch([sources[i] for i in rest], arch, timeout, stats)):
            results[i] = res
    return results


def _compile_alone(source: str, arch: str, timeout: float, stats: Counter) -> tuple[bool, str]:
    stats["runs"] += 1
    return compile_cuda(source, arch, timeout)


# --------------------------------------------------------------------------- pool
def default_jobs() -> int:
    """nvcc processes to run at once: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover
        return max(1, os.cpu_count() or 1)


@lru_cache(maxsize=None)
def nvcc_version() -> str:
    """``nvcc --version`` output (part of the disk cache key)."""
    exe = nvcc_path()
    if exe is None:
        raise FileNotFoundError("nvcc not found on PATH")
    return subprocess.run([exe, "--version"], capture_output=True, text=True, check=False).stdout


def source_key(source: str) -> str:
    return hashlib.sha1(source.encode("utf-8", "replace")).hexdigest()


class DiskCache:
    """Outcomes by (nvcc version, arch, flags, source) in ``root``: a rerun, or a run
    resumed after an interruption, does not run nvcc for a source twice.  Timeouts are
    not stored (they depend on the machine's load)."""

    def __init__(self, root: str, arch: str) -> None:
        self.root = root
        self.salt = "\n".join([nvcc_version(), arch, *NVCC_FLAGS, ""])

    def _path(self, key: str) -> str:
        full = source_key(self.salt + key)
        return os.path.join(self.root, full[:2], full + ".json")

    def get(self, key: str) -> Optional[tuple[bool, str]]:
        try:
            with open(self._path(key), encoding="utf-8") as f:
                doc = json.load(f)
            return bool(doc["ok"]), str(doc["error"])
        except (OSError, ValueError, KeyError):
            return None

    def put(self, key: str, result: tuple[bool, str]) -> None:
        if result[1].startswith("nvcc timed out"):
            return
        write_json(self._path(key), {"ok": result[0], "error": result[1]}, indent=None)


@dataclass
class _Job:
    key: str
    source: str
    future: Future
    group: Optional[str]  # hash of the preamble when batchable, else None


class CompilePool:
    """nvcc in ``jobs`` background threads, batched, with a cache by source.

    ``submit(source)`` returns a Future of (ok, error_line); identical sources are
    compiled once (and not at all when ``cache_dir`` already has them).  An idle
    worker takes a full batch of one preamble if there is one, else the largest
    source that is not batched (long compiles first, so the run does not end on
    one), else the largest group.  ``batch=1`` compiles every source on its own.
    Use as a context manager or call ``shutdown()``.
    """

    def __init__(self, arch: str, jobs: Optional[int] = None, timeout: float = 600,
                 batch: int = DEFAULT_BATCH, cache_dir: Optional[str] = None) -> None:
        if batch < 1:
            raise ValueError("batch must be at least 1")
        self.arch = arch
        self.timeout = timeout
        self.batch = batch
        self.disk = DiskCache(cache_dir, arch) if cache_dir else None
        self.cache: dict = {}
        self.stats: Counter = Counter()
        self._pending: list = []
        self._closed = False
        self._cond = threading.Condition()
        self._threads = [threading.Thread(target=self._work, name=f"nvcc-{i}", daemon=True)
                         for i in range(jobs or default_jobs())]
        for t in self._threads:
            t.start()

    def submit(self, source: str) -> Future:
        key = source_key(source)
        with self._cond:
            fut = self.cache.get(key)
            if fut is not None:
                self.stats["cache_hits"] += 1
                return fut
            fut = self.cache[key] = Future()
            cached = self.disk.get(key) if self.disk else None
            if cached is not None:
                self.stats["disk_hits"] += 1
                self.stats["done"] += 1
                fut.set_result(cached)
                return fut
            parts = split_source(source) if self.batch > 1 else None
            group = source_key(parts[0]) if parts else None
            self._pending.append(_Job(key, source, fut, group))
            self._cond.notify()
        return fut

    def _take(self) -> list:
        """Next jobs for a worker (see the class doc); [] once shut down and drained."""
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if not self._pending:
                return []
            groups = defaultdict(list)
            for job in self._pending:
                if job.group is not None:
                    groups[job.group].append(job)
            full = [g for g in groups.values() if len(g) >= self.batch]
            singles = [j for j in self._pending if j.group is None]
            if full:
                taken = _fit(full[0], self.batch)
            elif singles:
                taken = [max(singles, key=lambda j: len(j.source))]
            else:
                taken = _fit(max(groups.values(), key=len), self.batch)
            ids = {id(j) for j in taken}
            self._pending = [j for j in self._pending if id(j) not in ids]
            return taken

    def _work(self) -> None:
        while True:
            jobs = self._take()
            if not jobs:
                return
            stats: Counter = Counter()
            start = time.time()
            try:
                results = compile_batch([j.source for j in jobs], self.arch, self.timeout, stats)
            except Exception as err:  # noqa: BLE001 -- never leave a future unresolved
                results = [(False, f"nvcc could not run: {err}")] * len(jobs)
            for job, res in zip(jobs, results):
                if self.disk:
                    self.disk.put(job.key, res)
                job.future.set_result(res)
            with self._cond:
                self.stats.update(stats)
                self.stats["done"] += len(jobs)
                self.stats["nvcc_seconds"] += time.time() - start

    def summary(self) -> dict:
        """Counters so far: done, distinct sources, nvcc runs (batch_runs of them
        batched), batch_failures, cache hits, summed worker seconds in nvcc."""
        with self._cond:
            out = {k: self.stats.get(k, 0) for k in ("done", "runs", "batch_runs", "batched_ok",
                                                     "batch_failures", "cache_hits", "disk_hits")}
            out["distinct_sources"] = len(self.cache)
            out["nvcc_seconds"] = round(self.stats.get("nvcc_seconds", 0.0), 1)
        return out

    def progress_line(self) -> str:
        s = self.summary()
        return (f"nvcc {s['done']}/{s['distinct_sources']} sources done, {s['runs']} runs "
                f"({s['batch_runs']} batched), {s['nvcc_seconds']:.0f} s in nvcc")

    def wait(self, progress: Optional[Callable[[str], None]] = None, every: float = 30.0,
             futures: Optional[list] = None) -> None:
        """Block until every submitted source (or every one of ``futures``) is compiled,
        reporting every ``every`` s."""
        futures = list(self.cache.values()) if futures is None else list(futures)
        last = time.time()
        for fut in futures:
            while not fut.done():
                try:
                    fut.result(timeout=min(every, 5.0))
                except TimeoutError:
                    pass
                if progress and time.time() - last >= every:
                    progress("  " + self.progress_line())
                    last = time.time()

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for t in self._threads:
            t.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _fit(jobs: list, batch: int) -> list:
    """The first jobs of a group, at most ``batch`` of them and MAX_BATCH_BYTES in all
    (the first one always)."""
    taken, size = [], 0
    for job in jobs[:batch]:
        if taken and size + len(job.source) > MAX_BATCH_BYTES:
            break
        taken.append(job)
        size += len(job.source)
    return taken


def compile_many(sources: list, arch: str, jobs: Optional[int] = None, batch: int = DEFAULT_BATCH) -> list:
    """nvcc over many sources on ``jobs`` threads at once, batched; results in order."""
    with CompilePool(arch, jobs, batch=batch) as pool:
        futures = [pool.submit(s) for s in sources]
        return [f.result() for f in futures]


__all__ = ["NVCC_FLAGS", "BatchSource", "CompilePool", "batch_source", "blame", "compile_batch",
           "compile_cuda", "compile_many", "default_jobs", "nvcc_path", "split_source"]
