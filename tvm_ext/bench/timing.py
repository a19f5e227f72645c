"""Interleaved timing: the one way a benchmark here compares callables.

A figure is a ratio measured side by side: every round runs each callable in rotating
order, and the median per callable over all its timed calls is reported.

Runtimes with thread pools keep their workers spinning after a call returns: ONNX
Runtime's for a few ms, TVM's for 0.1-0.3 s (300000 spins, ``TVM_THREAD_POOL_SPIN_COUNT``).
Calling another runtime meanwhile makes the two pools fight for the cores. Measured: on a
16-core AMX host, TVM kernels of ~0.1 ms took 8-20 ms when each call followed an ORT call;
on a 2-core host our ResNet-50 took 85 ms right after ORT (44 ms alone) and ORT 81 ms
50 ms after ours (32 ms alone). So before each callable's turn the timer waits, untimed,
until the process's threads are idle (``wait_until_idle``), and then times ``repeat``
back-to-back calls: what each runtime gets when it runs by itself.
"""
from __future__ import annotations

import os
import statistics
import time


def wait_until_idle(window: float = 0.02, max_wait: float = 2.0, cpu=time.process_time,
                    sleep=time.sleep, clock=time.monotonic) -> bool:
    """Sleep until this process's threads (all of them: ``process_time``) use less than 5 %
    of one core over ``window`` seconds, at most ``max_wait`` s; False if they never did."""
    deadline = clock() + max_wait
    while clock() < deadline:
        before = cpu()
        sleep(window)
        if cpu() - before < 0.05 * window:
            return True
    return False


def time_interleaved(callables: dict, rounds: int, warmup: int = 1, repeat: int = 1,
                     settle=wait_until_idle, log=None) -> dict:
    """Median seconds per call of each callable: ``rounds`` rounds, each giving every
    callable (in rotating order) ``settle()`` (untimed; None: no pause) and then ``repeat``
    timed calls. ``log`` hears of turns that began with the threads still busy."""
    return time_turns(callables, rounds, warmup, repeat, settle=settle, log=log)[0]


def time_turns(callables: dict, rounds: int, warmup: int = 1, repeat: int = 1, warm: int = 0,
               settle=wait_until_idle, log=None, clock=time.perf_counter,
               samples: dict | None = None) -> tuple[dict, dict]:
    """``time_interleaved``'s medians, and the medians of ``warm`` more calls timed right after
    each turn's ``repeat`` ({} for ``warm`` 0).  A turn's first call finds the caches holding
    the other runtimes' data (a network's weights come from DRAM) and its threads asleep; the
    ``warm`` calls find its own weights in the cache and its threads spinning: a runtime
    called in a loop.  ``samples``, when given, receives every timed call's seconds in round
    order: {name: {"first": [...], "warm": [...]}} (the spread a report draws)."""
    if rounds < 1 or repeat < 1 or warm < 0:
        raise ValueError(f"rounds and repeat must be >= 1 and warm >= 0, not {rounds}, {repeat} and {warm}")
    names = list(callables)
    for _ in range(warmup):
        for name in names:
            callables[name]()
    timed = {name: [] for name in names}
    warm_samples = {name: [] for name in names}
    busy = 0
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            if settle is not None and settle() is False:
                busy += 1
            for i in range(repeat + warm):
                start = clock()
                callables[name]()
                (timed if i < repeat else warm_samples)[name].append(clock() - start)
    if busy and log is not None:
        log(f"note: {busy} of {rounds * len(names)} turns began with this process's threads still busy "
            f"(another job on this machine?): these timings are noisier")
    if samples is not None:
        samples.update({name: {"first": first, "warm": warm_samples[name]} for name, first in timed.items()})
    medians = {name: statistics.median(values) for name, values in timed.items()}
    return medians, ({name: statistics.median(v) for name, v in warm_samples.items()} if warm else {})


__all__ = ["time_interleaved", "time_turns", "wait_until_idle"]


def set_threads(threads) -> None:
    """Give TVM's thread pool ``threads`` workers (nothing for None/0): ``TVM_NUM_THREADS`` for the
    pool and the processes started later (the tuning runner's), and the running pool resized."""
    if not threads:
        return
    os.environ["TVM_NUM_THREADS"] = str(int(threads))
    import tvm  # pylint: disable=import-outside-toplevel

    cfg_pool = tvm.get_global_func("runtime.config_threadpool", allow_missing=True)
    if cfg_pool is not None:
        cfg_pool(1, int(threads))
