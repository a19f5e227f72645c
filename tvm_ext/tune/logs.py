"""MetaSchedule's loggers, made safe to create more than once in a process.

TVM 0.27's ``create_loggers`` (run by every ``ms.tune_tir`` / ``tune_tasks`` through
``get_loggers_from_work_dir``) builds a ``logging.config.dictConfig`` whose handler list
for the ``tvm.s_tir.meta_schedule`` logger is made of the names of the handlers that
logger already has. A handler without a name gives ``None`` there and the call crashes
(``'NoneType' object has no attribute 'format'``). pytest >= 9.2 attaches an unnamed
capture handler to every non-propagating logger at the start of each test phase, and
after the first tuning run that logger is non-propagating: the second tuning run in a
pytest process crashes. ``unnamed_handlers_detached`` takes such handlers off for the
duration of the call and puts them back afterwards (dictConfig replaces the logger's
handlers, so they would otherwise be lost too).

Quiet by default: TVM's console handler takes its level from the MetaSchedule logger's
level at the time the loggers are made, so ``loggers_for(..., verbose=False)`` sets that
to WARNING first; everything (DEBUG included) still goes to ``<work_dir>/logs/``.
"""
from __future__ import annotations

import contextlib
import logging

MS_LOGGER = "tvm.s_tir.meta_schedule"


@contextlib.contextmanager
def unnamed_handlers_detached(name: str = MS_LOGGER):
    """Detach the unnamed handlers of logger ``name`` for the block; re-attach them after."""
    logger = logging.getLogger(name)
    foreign = [h for h in logger.handlers if h.get_name() is None]
    for handler in foreign:
        logger.removeHandler(handler)
    try:
        yield
    finally:
        for handler in foreign:
            if handler not in logger.handlers:
                logger.addHandler(handler)


def loggers_for(work_dir: str, task_names: list[str], verbose: bool = False) -> list[logging.Logger]:
    """MetaSchedule's per-task loggers writing to ``<work_dir>/logs/`` (safe to call again).

    The console shows TVM's warnings and errors only, unless ``verbose`` (then its INFO too).
    """
    from tvm.s_tir import meta_schedule as ms

    logging.getLogger(MS_LOGGER).setLevel(logging.INFO if verbose else logging.WARNING)
    with unnamed_handlers_detached():
        return ms.logging.get_loggers_from_work_dir(work_dir, task_names)


@contextlib.contextmanager
def robust_create_loggers():
    """Make TVM's own ``create_loggers`` safe while the block runs (for ``ms.tune_tir``
    calls that do not go through tvm_ext); restores TVM's function afterwards."""
    from tvm.s_tir.meta_schedule import logging as ms_logging

    original = ms_logging.create_loggers

    def create_loggers(*args, **kwargs):
        with unnamed_handlers_detached():
            return original(*args, **kwargs)

    ms_logging.create_loggers = create_loggers
    try:
        yield
    finally:
        ms_logging.create_loggers = original
