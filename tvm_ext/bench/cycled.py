"""Kernels timed as a model runs them: back to back, every argument cycled from DRAM.

``CycledTimer(target)(batch)`` -> {name: seconds per call} for a batch {name: IRModule}: each module
built once (its structural hash the key), its arguments drawn once per signature (two schedules of one
kernel share them) and copied until the copies together are ``dram.FACTOR`` x the last-level cache,
then called over a window of those copies in turn, after the process's threads are idle, in batch order.

Why: ``tune.seeds.confirm_picks`` measures each tuned pick beside its untuned schedule.  The tuning
runner runs a kernel once after flushing the cache, and on the 2-core EPYC it ranked Phi-2 decode picks
(qkv, lm_head) above the untuned ones that then ran 13 % faster inside the decode step, where a kernel
follows another with its weights streaming from DRAM and the thread pool awake (session 22).  Every
argument is cycled, activations too: a projection's weights are all but all of its bytes.
"""
from __future__ import annotations

import numpy as np

from tvm_ext.arrays import param_buffers, random_arrays
from tvm_ext.bench.dram import CopyPlan, llc_bytes
from tvm_ext.bench.timing import wait_until_idle

WINDOW = 64  # calls per timing, copies used in turn: fewer when there are fewer copies, but at least
MIN_CALLS = 8  # (a copy as large as the cycle, lm_head's 65 MB, comes from DRAM again the next call)


class CycledTimer:
    """Callable ``{name: IRModule} -> {name: seconds per call}`` (module doc); a module that fails to
    build or run gets None, as ``runner_seconds(strict=False)`` gives."""

    def __init__(self, target, plan: CopyPlan | None = None, seed: int = 0, window: int = WINDOW):
        from tvm_ext.targets import resolve_target

        self.target = resolve_target(target)  # "llvm": this host's CPU, as tuning resolves it
        self.plan = plan if plan is not None else CopyPlan(llc_bytes()[0])
        self.rng = np.random.default_rng(seed)
        self.window = int(window)
        self._fns, self._sets, self._cursor = {}, {}, {}

    def _fn(self, mod):
        import tvm
        import tvm_ffi

        key = tvm_ffi.structural_hash(mod)
        if key not in self._fns:
            try:
                self._fns[key] = tvm.compile(mod, target=self.target)["main"]
            except Exception:  # pylint: disable=broad-except  # a candidate that does not build
                self._fns[key] = None
        return self._fns[key]

    def _arg_sets(self, func):
        import tvm

        sig = tuple((dtype, tuple(shape)) for _, dtype, shape in param_buffers(func))
        if sig not in self._sets:
            base = random_arrays(func, self.rng, {"uint32": (0, 2**32 - 1)}, int_range=(0, 15))
            copies = self.plan.copies(sum(a.nbytes for a in base))
            self._sets[sig] = [[tvm.runtime.tensor(a, tvm.cpu()) for a in base] for _ in range(copies)]
            self._cursor[sig] = 0
        return sig, self._sets[sig]

    def _window(self, sig, sets):
        n = min(self.window, max(len(sets), MIN_CALLS))
        start = self._cursor[sig]
        self._cursor[sig] = (start + n) % len(sets)
        return [sets[(start + i) % len(sets)] for i in range(n)]

    def __call__(self, batch: dict) -> dict:
        out = {}
        for name, mod in batch.items():
            fn = self._fn(mod)
            if fn is None:
                out[name] = None
                continue
            sig, sets = self._arg_sets(mod["main"])
            try:
                fn(*sets[0])  # warm: code, thread pool
                wait_until_idle()
                out[name] = self.plan.seconds_per_call(fn, self._window(sig, sets))
            except Exception:  # pylint: disable=broad-except  # e.g. an out-of-range index it reads
                out[name] = None
        return out
