"""tvm_ext: MetaSchedule schedule rules and postprocessors for quantized workloads.

Quick use::

    import tvm_ext
    from tvm.s_tir import meta_schedule as ms
    ms.tune_tir(mod, target, work_dir, max_trials_global=64, space=tvm_ext.space(target))

Importing registers the rules and postprocs in TVM's global registry, including
``s_tir.meta_schedule.<key>.compute_inline`` functions in TVM's namespace; see
``tvm_ext.registration`` for what that overrides, how to undo it
(``tvm_ext.registration.restore_tvm_functions()``) and how to refuse it
(``TVM_EXT_NO_OVERRIDE=1``).
"""
from __future__ import annotations

from . import postprocs, rules
from .registration import register_all
from .rulesets import RULESETS, SCHEDULES, default_postprocs, default_rules, space
from .schedule_rule import ScheduleRule
from .scheduling import ApplySchedules

__version__ = "0.1.0"

REGISTERED = register_all()

# AMX tile data must be granted by the kernel before the first tile instruction of the
# process: where /proc/cpuinfo shows amx_tile, ask now (a refusal is kept, not raised:
# tvm_ext.amx.request_amx() raises it where an AMX module is about to run).
from .amx import request_amx_if_host_has_it  # noqa: E402

AMX_REFUSED = request_amx_if_host_has_it()

__all__ = ["RULESETS", "SCHEDULES", "ApplySchedules", "ScheduleRule", "default_postprocs", "default_rules", "postprocs",
           "rules", "space"]


def __getattr__(name):  # lazy: workloads and tuning pull in relax
    if name in ("workloads", "tuning"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(name)
