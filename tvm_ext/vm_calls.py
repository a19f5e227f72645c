"""Each kernel's time inside a running Relax VM program: every call the VM makes, timed.

``timed_calls(executable, dev, run)`` opens a VM of its own with an instrument that notes the
time before and after each call to a compiled kernel (the VM's builtins left out), lets
``run(vm)`` drive it, and returns {kernel name: (seconds, calls)}.  The instrument runs in
Python between the kernels, so the program as a whole runs slower than uninstrumented (a few
microseconds a call); each kernel's own time is what it takes where it runs: after the kernels
before it, with the caches and the thread pool as they left them.  Phi-2's decode step and the
int8 networks' breakdown (``bench.breakdown``) both read their kernels this way.
"""
from __future__ import annotations

import time


def timed_calls(executable, dev, run) -> dict:
    """{kernel name: (seconds, calls)} of ``run(vm)`` on a VM of ``executable`` on ``dev``."""
    from tvm import relax

    vm, times, start = relax.VirtualMachine(executable, dev), {}, {}

    def instrument(func, name, before, ret, *args):  # pylint: disable=unused-argument
        if before:
            start[name] = time.perf_counter()
        elif not name.startswith("vm.builtin"):
            secs, calls = times.get(name, (0.0, 0))
            times[name] = (secs + time.perf_counter() - start[name], calls + 1)
        return 0

    vm.set_instrument(instrument)
    run(vm)
    return times
