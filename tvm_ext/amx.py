"""Permission to use AMX tiles: once per process, before the first tile instruction.

Linux (5.16+) keeps AMX tile data off for a process until it asks with
``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``; the first tile instruction
without it raises #NM/#UD and the process dies (SIGILL), with no Python traceback. TVM
0.27's wheel lacks the ``runtime.amx_init`` that older TVMs had, so the request is made
here through ctypes: ``syscall(SYS_arch_prctl=158, 0x1023, 18)``.

* ``request_amx()``: ask (once per process; later calls return or raise the same way);
  raises ``AMXUnavailable`` with a one-line reason where the kernel refuses or the
  platform cannot have AMX. Call it in any process that runs an AMX-tensorized module.
* ``request_amx_if_host_has_it()``: the same where /proc/cpuinfo shows ``amx_tile``, a
  no-op elsewhere; returns the refusal message instead of raising.
* ``make_runner_initializer()``: that, for local runner workers (``tune.runner``): a
  plain tuning run on a host without AMX must not fail.
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys

SYS_ARCH_PRCTL = 158  # x86_64
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

_state: dict = {}  # "ok": True, or "error": message, once asked


class AMXUnavailable(ValueError):
    """The kernel or the platform does not allow AMX tiles in this process (a ValueError:
    the CLI reports it as one line, like any target this host cannot run)."""


def _refusal(err: int) -> str:
    reason = {
        22: "the kernel does not know the request (EINVAL): a kernel older than 5.16",
        95: "this CPU or VM has no AMX tile data (EOPNOTSUPP)",
        38: "the kernel has no arch_prctl (ENOSYS)",
        1: "the kernel refused (EPERM: a seccomp or sigaltstack limit?)",
    }.get(err, os.strerror(err) if err else "unknown error")
    return (f"AMX unavailable: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) failed: {reason}; "
            "AMX-tensorized modules cannot run here (use a target without AMX)")


def _ask(syscall=None) -> str | None:
    """One request to the kernel; None when granted, else the one-line reason."""
    if not sys.platform.startswith("linux"):
        return f"AMX unavailable: needs Linux, not {sys.platform}"
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return f"AMX unavailable: needs an x86_64 CPU, not {machine}"
    if syscall is None:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
        syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    rc = syscall(ctypes.c_long(SYS_ARCH_PRCTL), ctypes.c_long(ARCH_REQ_XCOMP_PERM),
                 ctypes.c_long(XFEATURE_XTILEDATA))
    return None if rc == 0 else _refusal(ctypes.get_errno())


def request_amx() -> None:
    """Ask the kernel for AMX tile data, once per process; ``AMXUnavailable`` if refused."""
    if not _state:
        err = _ask()
        _state.update({"ok": True} if err is None else {"error": err})
    if "error" in _state:
        raise AMXUnavailable(_state["error"])


def request_amx_if_host_has_it() -> str | None:
    """``request_amx()`` where /proc/cpuinfo shows amx_tile; None when granted or not
    applicable, else the refusal message (never raises)."""
    from tvm_ext.targets import _cpuinfo  # pylint: disable=import-outside-toplevel

    if "amx_tile" not in _cpuinfo().get("flags", set()):
        return None
    try:
        request_amx()
    except AMXUnavailable as err:
        return str(err)
    return None


def make_runner_initializer():
    """The initializer of local runner workers: ask for AMX where /proc/cpuinfo shows
    amx_tile (else nothing); a refusal goes to the worker's stderr (which TVM discards unless
    its log level is DEBUG): AMX candidates then fail to run, the others are measured as usual.

    A closure over nothing of tvm_ext, so that cloudpickle sends it by value and workers
    need not import tvm_ext (as ``tune.builder.fast_local_builder`` does).
    """
    numbers = (SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)

    def initializer() -> None:
        # pylint: disable=import-outside-toplevel,redefined-outer-name,reimported
        import ctypes
        import os
        import sys

        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                if "amx_tile" not in f.read(1 << 16).split():
                    return
        except OSError:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        if libc.syscall(*(ctypes.c_long(n) for n in numbers)) != 0:
            err = ctypes.get_errno()
            print(f"tvm_ext: AMX unavailable in the runner: arch_prctl(ARCH_REQ_XCOMP_PERM, "
                  f"XFEATURE_XTILEDATA) failed: {os.strerror(err)}", file=sys.stderr)

    return initializer
