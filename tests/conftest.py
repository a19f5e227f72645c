import os
import sys

# tests import small shared helpers (kernels.py) by plain name
sys.path.insert(0, os.path.dirname(__file__))

# pytester runs inner pytest sessions (tests/test_pytest_logging.py)
pytest_plugins = ["pytester"]

# Under pytest-xdist (pytest.ini: -n auto) each worker process runs on one core's share: TVM's
# thread pool takes one thread there, so two workers' pools never spin against each other (a
# test that compares two kernels' times would otherwise see one of them starved)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("TVM_NUM_THREADS", "1")
