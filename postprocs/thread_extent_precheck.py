"""ThreadExtentPrecheck: reject a CUDA candidate that breaks MetaSchedule's thread-extent
bounds before the costly postprocs run on it.

Pattern: a sampled CUDA candidate whose blocks carry
``meta_schedule.thread_extent_low_inclusive`` / ``..._high_inclusive`` (MultiLevelTiling
and the cross-thread-reduction rules put them on the block whose loops they bind to
``threadIdx``) and whose bound threads fall outside them, or whose thread extent is
dynamic.  That is VerifyGPUCode's first stage (``check_module_threads``), run first
in the postproc list instead of last.

Why: about 70 % of the candidates the evolutionary search samples on our CUDA tasks fail
the check, and in TVM's order they pay RewriteCooperativeFetch, RewriteReductionBlock
and the others first (~3 ms per candidate on a ResNet-50 conv) only to be rejected by the
verifier at the end.  The postprocs in between do not change the loops bound around an
annotated block (they bind the cooperative fetches, unbound blocks, and split reduction
inits, whose annotations and enclosing thread loops are those of their block), so the
verdict is the one VerifyGPUCode would give: ``tvm-ext verify-gpu --replay`` checks that
on verify-gpu's candidates (the precheck on each candidate as sampled, before any
postproc).  VerifyGPUCode still runs the same check itself: it must stand alone.

A rejection is recorded in the ``ReasonLog`` given (``rulesets.default_postprocs`` gives
it VerifyGPUCode's), so the reasons a tuning run prints include it, counted once.
"""
from __future__ import annotations

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.postproc import PyPostproc

from tvm_ext.postprocs.verify_gpu_code import ReasonLog, check_module_threads, target_limits


@derived_object
class ThreadExtentPrecheck(PyPostproc):
    """Postproc: VerifyGPUCode's thread-extent check, placed before the other postprocs.

    ``log``: where rejections are recorded (accepted candidates are not: VerifyGPUCode
    records them when it judges them); ``vthread_limit``: as in ``VerifyGPUCode``.
    """

    def __init__(self, log: ReasonLog | None = None, vthread_limit: int | None = None) -> None:
        super().__init__()
        self.log = log if log is not None else ReasonLog()
        self.vthread_limit = vthread_limit
        self.warp_size = None

    def _initialize_with_tune_context(self, context) -> None:
        if context.target is None:
            raise ValueError("ThreadExtentPrecheck: the tune context has no target")
        self.warp_size = target_limits(context.target)["thread_warp_size"]

    def apply(self, sch) -> bool:
        verdict = check_module_threads(sch.mod, self.warp_size, self.vthread_limit)
        if verdict is None:
            return True
        self.log.record(verdict)
        return False

    def clone(self):
        other = ThreadExtentPrecheck(self.log, self.vthread_limit)
        other.warp_size = self.warp_size
        return other
