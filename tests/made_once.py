"""Expensive fixture results made once per test session, shared by the pytest-xdist workers.

Under ``-n auto`` a module's tests are dealt out to both workers, so a module-scoped fixture (a tuned
database: 15-30 s) was made in each. ``made_once`` makes it in the first worker that asks, under an
exclusive ``flock`` in the session's shared temporary directory (the parent of each worker's own, as
pytest-xdist's documentation does it); the other worker waits for it and reuses the files. A test
that writes should work on a copy (``shutil.copytree``), as each module's fixture hands out.
"""
import fcntl
import os
import shutil


def made_once(tmp_path_factory, name: str, make):
    """The directory that ``make(path)`` filled: made here or by another worker of this session.

    A ``make`` that raised leaves nothing behind, and the next worker to ask tries again (and fails
    the same way, in its own tests)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # one pytest session's
    path, done = root / f"once-{name}", root / f"once-{name}.done"
    with open(root / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            try:
                make(path)
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
            done.touch()
    return path
