"""tvm_ext: MetaSchedule schedule rules and postprocessors for quantized workloads.

Quick use::

    import tvm_ext
    from tvm.s_tir import meta_schedule as ms
    ms.tune_tir(mod, target, work_dir, max_trials_global=64, space=tvm_ext.space(target))
    relax_mod = tvm_ext.ApplySchedules(target, "rule")(relax_mod)  # untuned: our rules, dlight for the rest

Importing registers our rules and postprocs under their own names (``tvm_ext.schedule_rule.<Name>``,
``tvm_ext.postproc.<Name>``) and changes nothing else.  ``tvm_ext.install()`` (or building a rule
set that needs them: ``plugin``, ``no-inline-const``) also registers the
``s_tir.meta_schedule.<key>.compute_inline`` functions in TVM's namespace; see
``tvm_ext.registration`` for what that overrides, how to undo it and how to refuse it.
AMX tile permission is asked when an AMX rule first runs.
"""
from __future__ import annotations

from . import postprocs, rules
from .registration import install, register_all
from .rulesets import RULESETS, SCHEDULES, default_postprocs, default_rules, space
from .schedule_rule import ScheduleRule
from .scheduling import ApplySchedules

__version__ = "0.1.0"

REGISTERED = register_all()

__all__ = ["RULESETS", "SCHEDULES", "ApplySchedules", "ScheduleRule", "default_postprocs", "default_rules", "install",
           "postprocs", "rules", "space"]


def __getattr__(name):  # lazy: workloads and tuning pull in relax
    if name in ("workloads", "tuning"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(name)
