"""The builder every tvm_ext tuning run uses: TVM's LocalBuilder without the ~30 s
tensor-intrinsic import per worker, with a timeout that survives a loaded machine."""
from __future__ import annotations

import os

BUILD_TIMEOUT_S = 300  # a kill switch, not a measurement: busy 2-core machines need headroom


def fast_local_builder(timeout_sec: float = 120.0, max_workers: int | None = None):
    """A LocalBuilder that skips ``import tvm.s_tir.tensor_intrin`` in its workers.

    TVM 0.27's default build function imports that package in every fresh worker, and
    LocalBuilder starts fresh workers for every batch: ~30 s of CPU per worker per batch
    (the CUDA intrinsics), far more than building the candidates. The candidates are
    already tensorized when they reach the builder, so the intrinsics are not needed.
    The build function is defined in a closure so that cloudpickle sends it by value
    (workers need not import tvm_ext).
    """
    from tvm.s_tir.meta_schedule.builder import LocalBuilder  # pylint: disable=import-outside-toplevel

    def make_build():
        def build(mod, target, _params):
            # pylint: disable=import-outside-toplevel
            from tvm.driver import build as tvm_build
            from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

            mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
            return tvm_build(mod, target=target)

        return build

    return LocalBuilder(f_build=make_build(), timeout_sec=timeout_sec, max_workers=max_workers)


def build_workers() -> int | None:
    """Builder processes: ``$TVM_EXT_BUILD_WORKERS`` when set (a cluster node or a run pinned to
    fewer cores than the machine has), else TVM's default (every CPU of the machine)."""
    value = os.environ.get("TVM_EXT_BUILD_WORKERS")
    return int(value) if value else None


def make_builder():
    """A local builder whose workers skip importing TVM's tensor intrinsics (~30 s each),
    with a timeout that survives a loaded machine (TVM's default is 30 s)."""
    return fast_local_builder(timeout_sec=BUILD_TIMEOUT_S, max_workers=build_workers())
