"""DRAM-honest kernel timing: the last-level cache size, how many weight copies exceed it,
and the CPU a figure was taken on.

A decode step streams every layer's weights from DRAM (32 Phi-2 layers: ~1.5 GB of q4),
but one layer's weights of one kernel fit in the last-level cache: a loop over one kernel
with one set of weights measures the cache.  So a kernel is timed cycling through
``copies_for(bytes, llc)`` distinct copies of its weight arguments, enough that the copies
together are at least ``FACTOR`` x the LLC; by the time a copy comes round again it has
been evicted.

llc_bytes(sys_root=SYS_CPU) -> (bytes, source)   the LLC size the OS reports
copies_for(nbytes, llc, factor=FACTOR) -> int    copies whose total is >= factor x llc
CopyPlan(llc, cycle_bytes=None)                  copies per runtime, and the eviction sweep
CopyPlan.within_memory(llc, runtimes)            the plan that fits this machine's memory
cpu_info() -> {"name", "flags"}                  CPU model and the flags that matter here
seconds_per_call(fn, arg_sets) -> float          one pass over the copies, per call
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import time

SYS_CPU = "/sys/devices/system/cpu"
FACTOR = 2
MEMORY_SHARE = 0.5  # of the memory available at the start, for all of a bench's weight copies
DEFAULT_LLC = 256 * 1024 * 1024  # when the OS says nothing: large, so copies err on the cold side
# flags that decide which kernels a CPU can run fast (SIMD width, fp16 loads, int8 dot products)
FLAG_PREFIXES = ("avx", "fma", "f16c", "amx", "sse4", "bmi2")

_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}


def parse_size(text: str) -> int | None:
    """'32768K', '32M', '32 MiB', '33554432' -> bytes; None if not a size."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?\s*", text.strip(), re.IGNORECASE)
    return None if m is None else int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def _from_sys(sys_root: str) -> int | None:
    """The largest data/unified cache of cpu0 at the highest level, from sysfs."""
    base = os.path.join(sys_root, "cpu0", "cache")
    best = None
    try:
        entries = sorted(e for e in os.listdir(base) if e.startswith("index"))
    except OSError:
        return None
    for entry in entries:
        d = os.path.join(base, entry)
        level, kind, size = (_read(os.path.join(d, n)) for n in ("level", "type", "size"))
        if level is None or size is None or (kind or "").lower() == "instruction":
            continue
        nbytes = parse_size(size)
        if level.isdigit() and nbytes and (best is None or (int(level), nbytes) > best):
            best = (int(level), nbytes)
    return None if best is None else best[1]


def _from_lscpu() -> int | None:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    sizes = {}
    for line in out.splitlines():
        m = re.match(r"\s*L(\d)\s*(?:d\s*)?cache:\s*([\d.]+\s*[KMG]?i?B)", line, re.IGNORECASE)
        if m and parse_size(m.group(2)):
            sizes[int(m.group(1))] = parse_size(m.group(2))
    return sizes[max(sizes)] if sizes else None


def _from_getconf() -> int | None:
    for name in ("LEVEL4_CACHE_SIZE", "LEVEL3_CACHE_SIZE", "LEVEL2_CACHE_SIZE"):
        try:
            out = subprocess.run(["getconf", name], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
        if out.isdigit() and int(out) > 0:
            return int(out)
    return None


def llc_bytes(sys_root: str = SYS_CPU) -> tuple[int, str]:
    """(last-level cache bytes, where it was read): sysfs, else lscpu, else getconf, else
    ``DEFAULT_LLC``.  sysfs first: on this VM getconf says 256 MiB for a 32 MiB L3."""
    for source, read in (("sysfs", lambda: _from_sys(sys_root)), ("lscpu", _from_lscpu),
                         ("getconf", _from_getconf)):
        value = read()
        if value:
            return value, source
    return DEFAULT_LLC, "default"


def copies_for(nbytes: int, llc: int, factor: int = FACTOR) -> int:
    """Copies of ``nbytes`` of weights that together are at least ``factor`` x ``llc``
    (1 when one copy already is)."""
    if nbytes <= 0:
        return 1
    return max(1, math.ceil(factor * llc / nbytes))


def available_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable in bytes, or None where the OS does not say."""
    m = re.search(r"^MemAvailable:\s*(\d+)\s*kB", _read(meminfo) or "", re.MULTILINE)
    return None if m is None else int(m.group(1)) * 1024


class CopyPlan:
    """How a bench keeps each runtime's weights out of the cache.

    Normally (``sweep`` False) every runtime cycles through copies that together are
    ``FACTOR`` x the LLC: by the time a copy comes round again it has been evicted.  On a
    machine whose LLC is large against its memory (a 480 MiB L3 with 23 GiB of RAM: 40
    runtimes x 960 MiB of copies do not fit) ``within_memory`` gives each runtime a smaller
    ``cycle_bytes``, and ``evict()`` -- which the bench calls before every timed pass or window
    of distinct copies -- reads a buffer of ``FACTOR`` x the LLC, so that each call of the
    pass still finds its weights in DRAM.  Without ``sweep``, ``evict()`` does nothing."""

    def __init__(self, llc: int, cycle_bytes: int | None = None):
        self.llc = int(llc)
        self.cycle_bytes = FACTOR * self.llc if cycle_bytes is None else int(cycle_bytes)
        self.sweep = self.cycle_bytes < FACTOR * self.llc
        self._buffer = None
        self._sum = 0

    @classmethod
    def within_memory(cls, llc: int, runtimes: int, available: int | None = None,
                      share: float = MEMORY_SHARE) -> "CopyPlan":
        """The plan for ``runtimes`` runtimes with weights: full cycles when their copies (and
        nothing else) fit in ``share`` of the ``available`` memory, else an equal smaller
        share each (at least 64 MiB) and the eviction sweep (whose buffer is counted too)."""
        available = available_memory() if available is None else available
        full = FACTOR * llc
        if available is None or runtimes * full <= share * available:
            return cls(llc)
        each = (share * available - full) / max(1, runtimes)
        return cls(llc, max(64 * 2**20, min(full - 1, int(each))))

    def copies(self, nbytes: int) -> int:
        """Copies of ``nbytes`` that together are at least ``cycle_bytes``."""
        return copies_for(nbytes, self.cycle_bytes, factor=1)

    def evict(self) -> None:
        """Read ``FACTOR`` x the LLC of other data (only when the copies alone fall short).
        Read, not written: a decode step's other layers are read, and dirty lines left by a
        write would cost the timed kernel their write-back."""
        if not self.sweep:
            return
        import numpy as np  # pylint: disable=import-outside-toplevel

        if self._buffer is None:
            self._buffer = np.ones(FACTOR * self.llc // 8, dtype=np.int64)
        self._sum = int(self._buffer.sum())

    def seconds_per_call(self, fn, arg_sets) -> float:
        """``seconds_per_call`` of one pass, after ``evict()``."""
        self.evict()
        return seconds_per_call(fn, arg_sets)

    def describe(self) -> str:
        if not self.sweep:
            return f"weights cycled through copies >= {FACTOR}x the LLC"
        return (f"memory too small for {FACTOR}x-LLC copies per runtime: {self.cycle_bytes / 2**20:.0f} MiB of "
                f"copies each, and {FACTOR}x the LLC read before every timed pass")

    def as_json(self) -> dict:
        return {"cycle_bytes": self.cycle_bytes, "sweep": self.sweep}


def as_plan(plan_or_llc) -> CopyPlan:
    """A ``CopyPlan`` as is; an LLC size in bytes as the plain plan for it."""
    return plan_or_llc if isinstance(plan_or_llc, CopyPlan) else CopyPlan(plan_or_llc)


def cpu_info() -> dict:
    """{"name": CPU model, "flags": the SIMD / fp16 / int8-dot flags /proc/cpuinfo lists}."""
    name, flags = "cpu", []
    text = _read("/proc/cpuinfo") or ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and name == "cpu":
            name = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = sorted(f for f in value.split() if f.startswith(FLAG_PREFIXES))
    return {"name": name, "flags": flags}


def seconds_per_call(fn, arg_sets) -> float:
    """Seconds per call of ``fn`` over one pass through ``arg_sets`` (each a tuple of args),
    synchronous callables only (CPU kernels, ORT sessions)."""
    start = time.perf_counter()
    for args in arg_sets:
        fn(*args)
    return (time.perf_counter() - start) / len(arg_sets)
