import os
import sys

import pytest

# tests import small shared helpers (tir_kernels.py) by plain name
sys.path.insert(0, os.path.dirname(__file__))

# pytester runs inner pytest sessions (tests/test_pytest_logging.py)
pytest_plugins = ["pytester"]

# Under pytest-xdist (pytest.ini: -n auto) each worker process runs on one core's share, as a
# single-core cluster node does (bench.cluster): TVM's thread pool takes one thread, the tuning
# builder one process, OpenMP one thread. Two workers then never oversubscribe the cores: a test
# comparing two kernels' times (confirm_picks' side-by-side test, ratio ~6.5) measured 0.64-1.2 in 3
# of 8 runs while its worker's pool ran two threads beside the other worker's test.
XDIST_WORKER = bool(os.environ.get("PYTEST_XDIST_WORKER"))
if XDIST_WORKER:
    for _name in ("TVM_NUM_THREADS", "TVM_EXT_BUILD_WORKERS", "OMP_NUM_THREADS"):
        os.environ.setdefault(_name, "1")


@pytest.fixture(autouse=XDIST_WORKER)
def _one_thread_after_each_test():
    """Under xdist: a test that ran generate or a Phi-2 bench (``set_threads``: the physical cores)
    leaves this worker's pool at two threads; the next test gets its one thread back."""
    yield
    if os.environ.get("TVM_NUM_THREADS") != "1":
        from tvm_ext.bench.timing import set_threads

        set_threads(1)


# TVMScript's ``@T.prim_func`` calls ``inspect.stack()``, which under pytest's deep stacks resolves the
# module of every frame by rescanning ``sys.modules`` (``tvm_ext.intrinsics.quick_parsing``): the
# test modules' and helpers' PrimFuncs made collecting 30 s of each worker's time. The whole test
# session parses with that lookup memoized per file name, as the plugin parses its own intrinsics.
from tvm_ext.intrinsics import quick_parsing  # noqa: E402

_QUICK_PARSING = quick_parsing()  # kept: a dropped generator would restore the lookup at once
_QUICK_PARSING.__enter__()
