"""Interleaved timing: the one way a benchmark here compares callables.

A figure is a ratio measured side by side: every round runs each callable in rotating
order, and the median per callable over all its timed calls is reported.

Runtimes with thread pools keep their workers spinning after a call returns: ONNX
Runtime's for a few ms, TVM's for 0.1-0.3 s (300000 spins, ``TVM_THREAD_POOL_SPIN_COUNT``).
Calling another runtime meanwhile makes the two pools fight for the cores. Measured: on a
16-core AMX host, TVM kernels of ~0.1 ms took 8-20 ms when each call followed an ORT call;
on the 2-core EPYC our ResNet-50 took 85 ms right after ORT (44 ms alone) and ORT 81 ms
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
    if rounds < 1 or repeat < 1:
        raise ValueError(f"rounds and repeat must be >= 1, not {rounds} and {repeat}")
    names = list(callables)
    for _ in range(warmup):
        for name in names:
            callables[name]()
    samples = {name: [] for name in names}
    busy = 0
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            if settle is not None and settle() is False:
                busy += 1
            for _ in range(repeat):
                start = time.perf_counter()
                callables[name]()
                samples[name].append(time.perf_counter() - start)
    if busy and log is not None:
        log(f"note: {busy} of {rounds * len(names)} turns began with this process's threads still busy "
            f"(another job on this machine?): these timings are noisier")
    return {name: statistics.median(values) for name, values in samples.items()}


__all__ = ["time_interleaved", "wait_until_idle"]


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
