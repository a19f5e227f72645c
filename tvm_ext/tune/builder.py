"""The builder every tvm_ext tuning run uses: TVM's LocalBuilder with its worker processes kept between
batches and without the tensor-intrinsic import per worker, with a timeout that survives a loaded machine."""
from __future__ import annotations

import os
import weakref

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderResult, LocalBuilder
from tvm.s_tir.meta_schedule.builder.local_builder import _serialize_params, _worker_func
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

BUILD_TIMEOUT_S = 300  # a kill switch, not a measurement: busy 2-core machines need headroom
# A worker process is replaced after this many builds: TVM starts fresh workers for every batch because
# of a memory leak after some uses; a bound on the uses keeps that in check at a fraction of the starts.
WORKER_USES = 64


@derived_object
class PooledLocalBuilder(LocalBuilder._cls):  # pylint: disable=protected-access
    """LocalBuilder whose worker processes live across batches (each replaced after ``WORKER_USES`` builds).

    TVM's LocalBuilder starts a new pool for every batch and one more for its sanity check: each worker
    is a fresh ``python -m tvm.exec.popen_worker`` that imports TVM (3-6 s of CPU, more where torch is
    installed, which tvm_ffi imports with it), often longer than the batch's builds on a small task.
    Results and timeouts are reported as LocalBuilder reports them; a timed-out worker is killed and
    started again on its next build.
    """

    def __init__(self, **kwargs):
        self._pool = None
        self._stop = None  # the pool's finalizer: shuts it down once, on close(), collection or exit
        super().__init__(**kwargs)

    def _executor(self) -> PopenPoolExecutor:
        if self._pool is None:
            self._pool = PopenPoolExecutor(max_workers=self.max_workers, timeout=self.timeout_sec,
                                           initializer=self.initializer, maximum_process_uses=WORKER_USES)
            self._stop = weakref.finalize(self, self._pool.shutdown)
        return self._pool

    def _sanity_check(self) -> None:
        """LocalBuilder's check that the worker can resolve the build and export functions, on a worker
        that the first batch then reuses."""
        from tvm.s_tir.meta_schedule.utils import get_global_func_with_default_on_worker

        def check(f_build, f_export):
            get_global_func_with_default_on_worker(name=f_build, default=None)
            get_global_func_with_default_on_worker(name=f_export, default=None)

        self._executor().submit(check, self.f_build, self.f_export).result()

    def build(self, build_inputs):
        work = [(self.f_build, self.f_export, x.mod, x.target, _serialize_params(x.params)) for x in build_inputs]
        results = []
        for done in self._executor().map_with_error_catching(lambda args: _worker_func(*args), work):
            if done.status == StatusKind.COMPLETE:
                results.append(BuilderResult(done.value, None))
            elif done.status == StatusKind.TIMEOUT:
                results.append(BuilderResult(None, f"LocalBuilder: Timeout, killed after {self.timeout_sec} seconds"))
            else:
                results.append(BuilderResult(None, f"LocalBuilder: An exception occurred\n{done.value}"))
        return results

    def close(self) -> None:
        """Stop the worker processes now (they also stop when the builder is collected or Python exits)."""
        if self._pool is not None:
            self._stop()  # runs the shutdown once and detaches it
            self._pool = None


def fast_local_builder(timeout_sec: float = 120.0, max_workers: int | None = None):
    """A pooled LocalBuilder that skips ``import tvm.s_tir.tensor_intrin`` in its workers.

    TVM 0.27's default build function imports that package in every fresh worker: ~30 s of CPU
    (the CUDA intrinsics), far more than building the candidates. The candidates are already
    tensorized when they reach the builder, so the intrinsics are not needed. The build function is
    defined in a closure so that cloudpickle sends it by value (workers need not import tvm_ext).
    """

    def make_build():
        def build(mod, target, _params):
            # pylint: disable=import-outside-toplevel
            from tvm.driver import build as tvm_build
            from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

            mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
            return tvm_build(mod, target=target)

        return build

    return PooledLocalBuilder(f_build=make_build(), timeout_sec=timeout_sec, max_workers=max_workers)


def build_workers() -> int | None:
    """Builder processes: ``$TVM_EXT_BUILD_WORKERS`` when set (a cluster node or a run pinned to
    fewer cores than the machine has), else TVM's default (every CPU of the machine)."""
    value = os.environ.get("TVM_EXT_BUILD_WORKERS")
    return int(value) if value else None


def make_builder():
    """A local builder whose workers live across batches and skip importing TVM's tensor intrinsics,
    with a timeout that survives a loaded machine (TVM's default is 30 s)."""
    return fast_local_builder(timeout_sec=BUILD_TIMEOUT_S, max_workers=build_workers())
