"""Target presets: what ``--target llvm`` / ``--target cuda`` mean for tvm_ext.

``llvm`` is the machine we run on: LLVM's host CPU name (checked against the CPUs
this TVM's LLVM knows, else the nearest known one by features), the vector ISA
features that the OS really exposes, and ``num-cores`` = physical cores. A plain
``{"kind": "llvm"}`` (``llvm-generic``) generates baseline x86-64 code, which is
what makes untuned int8 kernels an order of magnitude slower.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from functools import lru_cache
from typing import Any, Union

from tvm.target import Target, codegen

# Fixed limits of the CUDA presets (same for the archs we support).
_CUDA_LIMITS = {
    "max_threads_per_block": 1024,
    "max_shared_memory_per_block": 49152,
    "thread_warp_size": 32,
}
CUDA_PRESETS = {"cuda-sm75": "sm_75", "cuda-sm80": "sm_80", "cuda-sm90": "sm_90"}
DEFAULT_CUDA_ARCH = "sm_80"

# LLVM feature name -> Linux /proc/cpuinfo flag, for the features that decide code
# generation for int8/fp kernels. A virtual machine may hide some of them even though
# LLVM's CPU model has them; we switch those off with mattr.
_LLVM_TO_CPUINFO = {
    "sse4.2": "sse4_2",
    "avx": "avx",
    "avx2": "avx2",
    "fma": "fma",
    "f16c": "f16c",
    "avx512f": "avx512f",
    "avx512bw": "avx512bw",
    "avx512dq": "avx512dq",
    "avx512vl": "avx512vl",
    "avx512cd": "avx512cd",
    "avx512vnni": "avx512_vnni",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2",
    "avx512ifma": "avx512ifma",
    "avxvnni": "avx_vnni",
    "avxvnniint8": "avx_vnni_int8",
    "amx-tile": "amx_tile",
    "amx-int8": "amx_int8",
    "amx-bf16": "amx_bf16",
}
# the instruction-set features whose absence makes code fail (LLVM's other "features" tune it: slow-3ops-lea)
ISA_FEATURES = frozenset(_LLVM_TO_CPUINFO)

TargetSpec = Union[str, dict, Target]


# --------------------------------------------------------------------------- host
def _cpuinfo(text: str | None = None) -> dict:
    """Model name and flags of the first CPU in /proc/cpuinfo ({} when unavailable).

    ``text``: a cpuinfo text to parse instead of /proc/cpuinfo (tests inject fake hosts).
    """
    info: dict[str, Any] = {}
    if text is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            return info
    for line in text.splitlines():
        if ":" not in line:
            if info:  # end of the first processor block
                break
            continue
        key, value = (s.strip() for s in line.split(":", 1))
        if key == "model name" and "model_name" not in info:
            info["model_name"] = value
        elif key in ("flags", "Features") and "flags" not in info:
            info["flags"] = set(value.split())
    return info


def physical_cores() -> int:
    """Number of physical cores (hyper-threads not counted), at least 1."""
    try:
        import psutil  # pylint: disable=import-outside-toplevel

        n = psutil.cpu_count(logical=False)
        if n:
            return int(n)
    except ImportError:
        pass
    cores = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            phys = core = None
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":")[1].strip()
                elif not line.strip() and core is not None:
                    cores.add((phys, core))
                    phys = core = None
    except OSError:
        pass
    return len(cores) or (os.cpu_count() or 1)


def _llvm_features(mcpu: str | None) -> set[str]:
    cfg = {"kind": "llvm"}
    if mcpu:
        cfg["mcpu"] = mcpu
    try:
        return set(codegen.llvm_get_cpu_features(Target(cfg)))
    except Exception:  # pylint: disable=broad-except
        return set()


def _known_cpus() -> list[str]:
    try:
        return list(codegen.llvm_get_cpu_archlist(Target({"kind": "llvm"})))
    except Exception:  # pylint: disable=broad-except
        return []


_AMD_PREFIXES = ("znver", "bdver", "btver", "athlon", "amdfam", "k6", "k8", "barcelona", "opteron", "geode")


def _nearest_known_cpu(host_flags: set[str], known: list[str], vendor: str = "") -> str | None:
    """The known CPU with the most features, all of which the host has (by cpuinfo).

    Only CPUs of the host's vendor are considered when the vendor is known (an Intel
    host gets an Intel model, whose scheduling model matches better).
    """
    if not host_flags:
        return None
    vendor = vendor.lower()
    if vendor in ("intel", "amd"):
        known = [c for c in known if c.startswith(_AMD_PREFIXES) == (vendor == "amd")] or known
    best, best_n = None, -1
    for cpu in known:
        feats = _llvm_features(cpu)
        mapped = {f for f in feats if f in _LLVM_TO_CPUINFO}
        if any(_LLVM_TO_CPUINFO[f] not in host_flags for f in mapped):
            continue
        if len(mapped) > best_n or (len(mapped) == best_n and len(feats) > len(_llvm_features(best))):
            best, best_n = cpu, len(mapped)
    return best


# AMX features: LLVM name -> cpuinfo flag. A VM may expose AMX while LLVM names its CPU
# after an older model without it (rocketlake on a Sapphire Rapids guest), so the preset
# adds the ones the OS shows and the CPU model lacks with mattr "+...".
_AMX_FEATURES = {"amx-tile": "amx_tile", "amx-int8": "amx_int8", "amx-bf16": "amx_bf16"}


@lru_cache(maxsize=1)
def _host() -> dict:
    triple = codegen.llvm_get_system_triple()
    is_x86 = triple.startswith(("x86_64", "i386", "i686"))
    return _describe(_cpuinfo(), triple, codegen.llvm_get_system_cpu(), _known_cpus(),
                     _safe(codegen.llvm_get_system_x86_vendor) if is_x86 else "")


def _describe(info: dict, triple: str, llvm_cpu: str, known: list[str], vendor: str) -> dict:
    """describe_host() for a host given by its cpuinfo (``_cpuinfo``) and LLVM's view of it."""
    flags = info.get("flags", set())
    is_x86 = triple.startswith(("x86_64", "i386", "i686"))
    note = ""
    if llvm_cpu and llvm_cpu != "generic" and llvm_cpu in known:
        mcpu = llvm_cpu
        note = "LLVM host CPU"
    elif is_x86:
        mcpu = _nearest_known_cpu(flags, known, vendor)
        note = f"LLVM host CPU {llvm_cpu!r} unknown to this LLVM; nearest known by features"
    else:
        mcpu = None
        note = f"LLVM host CPU {llvm_cpu!r} unknown to this LLVM; generic code"
    feats = _llvm_features(mcpu)
    # features the CPU model has but the OS/hypervisor does not expose
    disabled = sorted(
        f for f in feats if f in _LLVM_TO_CPUINFO and flags and _LLVM_TO_CPUINFO[f] not in flags
    )
    # AMX the OS exposes but the CPU model lacks (x86 only)
    added = sorted(f for f, flag in _AMX_FEATURES.items() if is_x86 and flag in flags and f not in feats)
    effective = (feats - set(disabled)) | set(added)
    return {
        "cpu_name": info.get("model_name", "unknown"),
        "vendor": vendor if is_x86 else "",
        "triple": triple,
        "llvm_host_cpu": llvm_cpu,
        "mcpu": mcpu,
        "mcpu_source": note,
        "mattr": [f"-{f}" for f in disabled] + [f"+{f}" for f in added],
        "features": sorted(effective),
        "avx512vnni": "avx512vnni" in effective,
        "avxvnni": "avxvnni" in effective,
        "amx_tile": "amx-tile" in effective,
        "amx_int8": "amx-int8" in effective,
        "amx_bf16": "amx-bf16" in effective,
        "physical_cores": physical_cores(),
        "logical_cpus": os.cpu_count() or 1,
    }


def _safe(fn):
    try:
        return fn()
    except Exception:  # pylint: disable=broad-except
        return ""


def describe_host() -> dict:
    """What ``--target llvm`` detects on this machine.

    Keys: cpu_name (from the OS), vendor, triple, llvm_host_cpu (LLVM's name), mcpu (the
    one used: LLVM's if this LLVM knows it, else the nearest known), mcpu_source, mattr
    (features switched off because the OS does not expose them, "-avx512f", and AMX
    features the OS exposes but the CPU model lacks, "+amx-int8"), features (LLVM feature
    names in effect), avx512vnni, avxvnni, amx_tile, amx_int8, amx_bf16 (bools),
    physical_cores, logical_cpus.
    """
    d = dict(_host())
    d["features"] = list(d["features"])
    d["mattr"] = list(d["mattr"])
    return d


def host_target() -> Target:
    """The ``llvm`` preset: this machine's CPU and physical core count."""
    h = _host()
    cfg: dict[str, Any] = {"kind": "llvm", "num-cores": h["physical_cores"]}
    if h["mcpu"]:
        cfg["mcpu"] = h["mcpu"]
    if h["mattr"]:
        cfg["mattr"] = list(h["mattr"])
    return Target(cfg)


# --------------------------------------------------------------------------- cuda
def _nvidia_smi_arch() -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"(\d+)\.(\d+)", out)
    return f"sm_{m.group(1)}{m.group(2)}" if m else None


def cuda_target(arch: str) -> Target:
    return Target({"kind": "cuda", "arch": arch, **_CUDA_LIMITS})


# --------------------------------------------------------------------------- public
def resolve_target(spec: TargetSpec) -> Target:
    """Turn a CLI/API target spec into a Target.

    spec: "llvm" (this host, see describe_host), "llvm-generic" (plain {"kind": "llvm"}:
    baseline x86-64 code), "cuda" (arch from nvidia-smi, else sm_80), "cuda-sm75" /
    "cuda-sm80" / "cuda-sm90", a JSON object string, a dict, or a Target (returned as is).
    An llvm spec without "num-cores" gets this machine's physical core count: MetaSchedule
    refuses to tune for an llvm target without it.
    Malformed JSON or an unknown name raises ValueError with a one-line message.
    """
    if isinstance(spec, Target):
        return spec
    if isinstance(spec, dict):
        return _from_dict(spec, json.dumps(spec))
    if not isinstance(spec, str):
        raise ValueError(f"target must be a string, dict or Target, not {type(spec).__name__}")
    s = spec.strip()
    if s == "llvm":
        return host_target()
    if s == "llvm-generic":
        return _from_dict({"kind": "llvm"}, s)  # gets num-cores like any llvm JSON spec
    if s == "cuda":
        return cuda_target(_nvidia_smi_arch() or DEFAULT_CUDA_ARCH)
    if s in CUDA_PRESETS:
        return cuda_target(CUDA_PRESETS[s])
    if s.startswith(("{", "[", '"')) or s[:1].isdigit():
        try:
            cfg = json.loads(s)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"malformed target JSON ({err.msg} at line {err.lineno} column {err.colno}): {_short(s)}"
            ) from None
        if not isinstance(cfg, dict):
            raise ValueError(f"target JSON must be an object: {_short(s)}")
        return _from_dict(cfg, s)
    known = ["llvm", "llvm-generic", "cuda", *sorted(CUDA_PRESETS)]
    raise ValueError(f"unknown target {s!r}; use one of {', '.join(known)} or a JSON object")


def _short(s: str, n: int = 80) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 3] + "..."


def _from_dict(cfg: dict, text: str) -> Target:
    if "kind" not in cfg:
        raise ValueError(f"target JSON has no 'kind': {_short(text)}")
    if cfg["kind"] == "llvm" and "num-cores" not in cfg:
        # MetaSchedule refuses an llvm target without it; default to this machine's cores
        cfg = {**cfg, "num-cores": physical_cores()}
    if cfg["kind"] == "llvm" and isinstance(cfg.get("mcpu"), str):
        _check_mcpu(cfg)
    try:
        return Target(cfg)
    except Exception as err:  # pylint: disable=broad-except
        first = str(err).strip().splitlines()
        msg = next((ln for ln in first if "Unknown" in ln or "rror" in ln), first[0] if first else "")
        raise ValueError(f"invalid target {_short(text)}: {_short(msg, 200)}") from None


def _check_mcpu(cfg: dict) -> None:
    """ValueError for an ``mcpu`` LLVM does not know: LLVM only logs an error and compiles for a
    generic CPU, so a typo would cost a whole tuning run tuned for the wrong machine."""
    import difflib

    from tvm.target import codegen

    if not hasattr(codegen, "llvm_get_cpu_archlist"):
        return
    base = {k: v for k, v in cfg.items() if k in ("kind", "mtriple")}
    known = [str(c) for c in codegen.llvm_get_cpu_archlist(Target(base))]
    if known and cfg["mcpu"] not in known:
        close = difflib.get_close_matches(cfg["mcpu"], known, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(f"unknown mcpu {cfg['mcpu']!r} for this LLVM; {hint}'tvm-ext targets' shows this host's; "
                         f"LLVM knows {', '.join(sorted(known))}")


def target_key(target: TargetSpec) -> str:
    """Short name for directory names: "llvm", "llvm-generic", "cuda".

    Targets collapse to their kind ("llvm" for the host preset and any llvm target with
    an ``mcpu`` or ``mattr``, "cuda" for any cuda target), matching
    tuning_logs/<workload>-<key>-<ruleset>/. A plain ``{"kind": "llvm"}`` is
    "llvm-generic": its baseline x86-64 code is what a user gets without naming a CPU,
    and its database must not share a directory with the host's.
    """
    t = resolve_target(target)
    kind = str(t.kind.name)
    if kind == "llvm" and not any(k in t.attrs for k in ("mcpu", "mattr")):
        return "llvm-generic"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", kind)


def _llvm_target_features(target: Target) -> set[str]:
    try:
        with target:
            return set(codegen.llvm_get_cpu_features(target))
    except Exception:  # pylint: disable=broad-except
        return set()


def has_vnni(target: TargetSpec) -> bool:
    """True for llvm x86 targets whose mcpu/mattr give AVX-512 VNNI or AVX-VNNI."""
    return bool(vnni_kinds(target))


def x86_features(target: TargetSpec) -> set[str]:
    """LLVM CPU features of an llvm x86 target (its mcpu/mattr); empty for any other target."""
    t = resolve_target(target)
    if str(t.kind.name) != "llvm":
        return set()
    triple = str(t.attrs.get("mtriple", "")) or codegen.llvm_get_system_triple()
    if not triple.startswith(("x86_64", "i386", "i686")):
        return set()
    return _llvm_target_features(t)


def vnni_kinds(target: TargetSpec) -> list[str]:
    """Which VNNI flavours the target has: subset of ["avx512vnni", "avxvnni"] in that order."""
    feats = x86_features(target)
    out = []
    if {"avx512vnni", "avx512f", "avx512bw"} <= feats:
        out.append("avx512vnni")
    if "avxvnni" in feats:
        out.append("avxvnni")
    return out


def has_amx(target: TargetSpec) -> bool:
    """True for llvm x86 targets whose mcpu/mattr give AMX tiles with int8 (amx-tile, amx-int8)."""
    return {"amx-tile", "amx-int8"} <= x86_features(target)


def has_avx2(target: TargetSpec) -> bool:
    """True for llvm x86 targets whose mcpu/mattr give AVX2 (the int8-activation q4 GEMV)."""
    return "avx2" in x86_features(target)


def target_to_json(target: TargetSpec) -> dict:
    """The target as a JSON-able dict (for databases and reports)."""
    t = resolve_target(target)
    return json.loads(json.dumps(_plain(t.export())))


def _plain(x):
    if isinstance(x, dict) or hasattr(x, "items"):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)) or (hasattr(x, "__len__") and hasattr(x, "__getitem__") and not isinstance(x, str)):
        return [_plain(v) for v in x]
    if isinstance(x, (int, float, bool)) or x is None:
        return x
    return str(x)


def target_mismatch(recorded: TargetSpec, current: TargetSpec) -> str | None:
    """A one-line warning when a database made for ``recorded`` is reused with ``current``.

    Compares kind, mcpu / arch and the VNNI flavours; None when they agree. Used when a
    tuning database written on one machine is resumed or benchmarked on another.
    """
    try:
        a, b = target_to_json(recorded), target_to_json(current)
    except ValueError as err:
        return f"cannot compare targets: {err}"
    diffs = []
    for key in ("kind", "mcpu", "arch", "mattr"):
        if a.get(key) != b.get(key):
            diffs.append(f"{key} {a.get(key)!r} -> {b.get(key)!r}")
    if not diffs:
        return None
    return (
        "database was tuned for another target ("
        + "; ".join(diffs)
        + "): its schedules and timings may not fit this machine"
    )


__all__ = [
    "resolve_target",
    "target_key",
    "describe_host",
    "has_vnni",
    "vnni_kinds",
    "has_amx",
    "host_target",
    "cuda_target",
    "physical_cores",
    "target_to_json",
    "target_mismatch",
]
