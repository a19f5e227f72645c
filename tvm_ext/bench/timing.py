"""Interleaved timing: the one way a benchmark here compares callables.

A figure is a ratio measured side by side: every round runs each callable once, in
rotating order, and the median per callable over the rounds is reported."""
from __future__ import annotations

import statistics
import time


def time_interleaved(callables: dict, rounds: int, warmup: int = 1) -> dict:
    """Median seconds per call of each callable, calls interleaved round by round."""
    names = list(callables)
    for _ in range(warmup):
        for name in names:
            callables[name]()
    samples = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            start = time.perf_counter()
            callables[name]()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


__all__ = ["time_interleaved"]
