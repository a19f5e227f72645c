"""Kernels timed as a model runs them: back to back, every argument cycled from DRAM.

``CycledTimer(target)(batch)`` -> {name: seconds per call} for a batch {name: IRModule}: each module
built once (its structural hash the key), its arguments drawn once per signature (two schedules of one
kernel share them) as ``bench.phi2.measure.KernelArgs`` copies them, every parameter a "weight", until
the copies together are ``dram.FACTOR`` x the last-level cache, then called over a window of those
copies in turn, after the process's threads are idle, in batch order.

Why: ``tune.seeds.confirm_picks`` measures each tuned pick beside its untuned schedule.  The tuning
runner runs a kernel once after flushing the cache, and on a 2-core host it ranked Phi-2 decode picks
(qkv, lm_head) above the untuned ones that then ran 13 % faster inside the decode step, where a kernel
follows another with its weights streaming from DRAM and the thread pool awake.  Every
argument is cycled, activations too: a projection's weights are all but all of its bytes.
"""
from __future__ import annotations

import numpy as np

from tvm_ext.arrays import param_buffers
from tvm_ext.bench.dram import CopyPlan, llc_bytes
from tvm_ext.bench.phi2.measure import KernelArgs
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
        self._fns, self._args = {}, {}

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

    def _args_of(self, func) -> KernelArgs:
        import tvm

        sig = tuple((dtype, tuple(shape)) for _, dtype, shape in param_buffers(func))
        if sig not in self._args:
            self._args[sig] = KernelArgs(func, list(range(len(sig))), self.plan, tvm.cpu(), self.rng)
        return self._args[sig]

    def __call__(self, batch: dict) -> dict:
        out = {}
        for name, mod in batch.items():
            fn = self._fn(mod)
            if fn is None:
                out[name] = None
                continue
            args = self._args_of(mod["main"])
            try:
                fn(*args.sets[0])  # warm: code, thread pool
                wait_until_idle()
                out[name] = self.plan.seconds_per_call(fn, args.next_sets(self.window, at_least=MIN_CALLS))
            except Exception:  # pylint: disable=broad-except  # e.g. an out-of-range index it reads
                out[name] = None
        return out
