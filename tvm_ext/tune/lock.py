"""One driver per work dir: a second ``tune`` into the same database is refused in one line.

Two drivers appending to one records file would both commit (tasks tuned twice, budgets
exceeded). The lock is an exclusive ``flock`` on the work dir itself, held while the driver runs
and released by the kernel when the process ends, however it ends (a kill leaves no stale lock).
"""
from __future__ import annotations

import contextlib
import fcntl
import os


class WorkDirBusy(ValueError):
    """Another process is tuning into the work dir."""


@contextlib.contextmanager
def driver_lock(work_dir: str):
    """Hold the work dir's driver lock inside the ``with``; WorkDirBusy where another process holds it.
    A work dir that does not exist yet is locked once it does (``lock_now``)."""
    held = {}

    def lock_now() -> None:
        if "fd" in held or not os.path.isdir(work_dir):
            return
        fd = os.open(work_dir, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise WorkDirBusy(f"{work_dir}: another tvm-ext tune is tuning into it; wait for it to end "
                              "or use another --work-dir") from None
        held["fd"] = fd

    lock_now()
    try:
        yield lock_now
    finally:
        if "fd" in held:
            os.close(held["fd"])  # closing the descriptor releases the lock


__all__ = ["WorkDirBusy", "driver_lock"]
