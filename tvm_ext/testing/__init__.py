"""Helpers for tests written against tvm_ext and MetaSchedule.

``pytest_plugin``  loaded automatically by pytest once tvm_ext is installed (entry point
                   ``tvm_ext``; ``-p no:tvm_ext`` turns it off): makes ``ms.tune_tir`` safe to
                   call in more than one test of a session under pytest >= 9.2
                   (see ``tvm_ext.tune.logs``).
"""
from tvm_ext.tune.logs import robust_create_loggers, unnamed_handlers_detached

__all__ = ["robust_create_loggers", "unnamed_handlers_detached"]
