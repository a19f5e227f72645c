import os
import sys

# tests import small shared helpers (kernels.py) by plain name
sys.path.insert(0, os.path.dirname(__file__))

# pytester runs inner pytest sessions (tests/test_pytest_logging.py)
pytest_plugins = ["pytester"]
