"""Search strategy and the measure callbacks of a tuning run."""
from __future__ import annotations

from typing import Callable

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback


def search_strategy(trials: int):
    """Evolutionary search with a population scaled to the trial budget.

    TVM's default population (512) costs tens of seconds per iteration on a 2-core
    machine; for budgets of a few dozen trials per task a population of 4x the budget
    (at least 64) explores as far as the measurements can follow.  Below 8 trials (smoke
    runs, tests) 8x the budget: a 64-candidate iteration took ~3 s to pick 1-3 of them.
    """
    population = max(min(64, 8 * trials), min(512, 4 * trials))
    return ms.search_strategy.EvolutionarySearch(population_size=population,
                                                 init_min_unmeasured=min(50, population // 2))


class TuningInterrupted(Exception):
    """Raised between measurement batches once ``should_stop`` says so."""


@derived_object
class _AfterEachBatch(PyMeasureCallback):
    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
              runner_results) -> None:
        self.fn(builder_results, runner_results)


def after_each_batch(fn: Callable) -> PyMeasureCallback:
    """A measure callback calling ``fn(builder_results, runner_results)`` once per measured
    batch. Placed after TVM's default callbacks, it runs once the batch is in the database."""
    return _AfterEachBatch(fn)


def stop_callback(should_stop: Callable[[], bool]):
    """A measure callback that ends tuning after a batch has reached the database.

    Raising here, on the task scheduler's own thread after AddToDatabase, unwinds through
    TVM cleanly; an asynchronous KeyboardInterrupt inside TVM's C++ can abort the process.
    """
    def stop(_built, _ran) -> None:
        if should_stop():
            raise TuningInterrupted("tuning stopped on request")

    return after_each_batch(stop)
