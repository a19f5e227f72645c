"""The best schedules of a database for a user's own TIR module, ready to build.

``ms.tir_integration.compile_tir(database, mod, target)`` looks the module up as given,
but ``ms.tune_tir`` stored each function the way ``TuneContext`` normalizes it (with a
``global_symbol`` and ``tirx.noalias``). A TVMScript function without ``tirx.noalias``
is then not found and ``compile_tir`` returns None without a word. ``best_module``
normalizes each PrimFunc the same way before the look-up, schedules every function the
database knows, and says which ones it does not.
"""
from __future__ import annotations

import tvm
from tvm import tirx


class NoTuningRecord(LookupError):
    """The database has no valid record for a function of the module."""


def _as_tuned(func: tirx.PrimFunc) -> tvm.IRModule:
    """``func`` as tune_tir stores it (TVM's TuneContext normalization)."""
    from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

    return _normalize_mod(func)


def best_module(database, mod, target, *, missing: str = "raise") -> tvm.IRModule:
    """``mod`` (a PrimFunc or an IRModule of PrimFuncs) with each function replaced by its
    best schedule in ``database``.

    ``missing``: "raise" (NoTuningRecord naming the functions) or "keep" (leave a function
    without a record unscheduled).
    """
    if isinstance(mod, tirx.PrimFunc):
        mod = tvm.IRModule({"main": mod})
    target = tvm.target.Target(target) if not isinstance(target, tvm.target.Target) else target
    funcs, absent = {}, []
    for gv, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            funcs[gv.name_hint] = func
            continue
        sch = database.query_schedule(_as_tuned(func), target, workload_name="main")
        if sch is None:
            absent.append(gv.name_hint)
            funcs[gv.name_hint] = func
        else:
            funcs[gv.name_hint] = sch.mod["main"].with_attr("global_symbol", gv.name_hint)
    if absent and missing == "raise":
        raise NoTuningRecord(f"no tuning record for {', '.join(absent)} in the database "
                             f"(tuned for another target, or not tuned yet)")
    return tvm.IRModule(funcs)


def compile_best(database, mod, target, **kwargs):
    """``tvm.compile`` of ``best_module(database, mod, target)``: a runnable module."""
    scheduled = best_module(database, mod, target, **kwargs)
    with tvm.transform.PassContext(opt_level=3):
        return tvm.compile(scheduled, target=target)
