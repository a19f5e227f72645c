"""pytest plugin: MetaSchedule tuning in several tests of one pytest session.

pytest >= 9.2 attaches an unnamed log-capture handler to every non-propagating logger,
which makes TVM 0.27's ``create_loggers`` crash on the second ``ms.tune_tir`` of a
session (see ``tvm_ext.tune.logs``). While this plugin is active TVM's function runs
with those handlers detached. Active by default once tvm_ext is installed (entry point
``pytest11: tvm_ext``); ``pytest -p no:tvm_ext`` turns it off.

Nothing is imported until a test runs with MetaSchedule already imported, so a
session that never uses TVM pays nothing for it.
"""
from __future__ import annotations

import sys

_MS_LOGGING = "tvm.s_tir.meta_schedule.logging"
_GUARDS = []


def _protect() -> None:
    if _GUARDS or _MS_LOGGING not in sys.modules:
        return
    from tvm_ext.tune.logs import robust_create_loggers

    guard = robust_create_loggers()
    guard.__enter__()
    _GUARDS.append(guard)


def pytest_collection_finish(session):
    _protect()


def pytest_runtest_setup(item):
    _protect()


def pytest_unconfigure(config):
    while _GUARDS:
        _GUARDS.pop().__exit__(None, None, None)
