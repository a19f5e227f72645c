"""ThreadExtentPrecheck: VerifyGPUCode's thread-extent check, first in the plugin's CUDA
postprocs, so that most sampled candidates are rejected before the costly postprocs.

Its verdicts must be VerifyGPUCode's: what it rejects on a candidate as sampled, the
thread-extent check rejects on the finished candidate too, and the reasons it records go
to VerifyGPUCode's log, counted once in what `tvm-ext tune` prints.
"""
import tvm
import tvm_ffi
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms

import tvm_ext
from tir_kernels import cuda_target, rows_over_thread_y
from tvm_ext.postprocs import ThreadExtentPrecheck, VerifyGPUCode
from tvm_ext.postprocs.verify_gpu_code import check_module_threads


def initialized(post):
    post._initialize_with_tune_context(ms.TuneContext(target=cuda_target()))
    return post


def test_threads_outside_the_block_bounds_are_rejected_and_the_reason_kept():
    verify = initialized(VerifyGPUCode())
    pre = initialized(ThreadExtentPrecheck(verify.log))
    assert pre.apply(Schedule(rows_over_thread_y(high=4)))  # 4 threads within [1, 4]
    assert verify.checked() == 0  # an accepted candidate is VerifyGPUCode's to record
    assert not pre.apply(Schedule(rows_over_thread_y(high=2)))
    assert verify.reason_counts() == {"thread_extent_annotation": 1}
    assert "4 threads outside [1, 2]" in verify.reason_examples()["thread_extent_annotation"]


def test_clones_record_into_the_same_log():
    verify = initialized(VerifyGPUCode())
    pre = initialized(ThreadExtentPrecheck(verify.log))
    twin = pre.clone()
    assert not twin.apply(Schedule(rows_over_thread_y(high=1)))
    assert not pre.apply(Schedule(rows_over_thread_y(high=2)))
    assert verify.reason_counts() == {"thread_extent_annotation": 2}


def test_the_plugin_cuda_space_runs_it_first_and_tune_counts_each_candidate_once():
    from tvm_ext.tune.driver import Rejections

    posts = tvm_ext.default_postprocs(cuda_target())
    assert type(posts[0]).__name__ == "ThreadExtentPrecheck"
    ctx = ms.TuneContext(mod=tvm.IRModule({"main": rows_over_thread_y(high=2)}), target=cuda_target(),
                         space_generator=tvm_ext.space(cuda_target(), postprocs=posts), task_name="t")
    for post in ctx.space_generator.postprocs:  # what the search does, in the space's order
        if not post.apply(Schedule(ctx.mod)):
            break
    else:
        raise AssertionError("a candidate with 4 threads for a block bound to [1, 2] was accepted")
    rejections = Rejections.of(posts)
    assert (rejections.checked, rejections.reasons) == (1, {"thread_extent_annotation": 1})
    assert not any(type(p).__name__ == "ThreadExtentPrecheck" for p in tvm_ext.default_postprocs(
        tvm.target.Target({"kind": "llvm", "num-cores": 2})))


def test_its_verdict_before_the_postprocs_is_the_verdict_after_them_on_sampled_candidates():
    """The seed conv's sampled CUDA candidates: the check on each candidate as sampled (what
    the precheck sees) and on the same candidate after the other postprocs (what
    VerifyGPUCode sees) agree; both verdicts occur.  ``tvm-ext verify-gpu --replay`` does the
    same on verify-gpu's 5800 candidates, with nvcc wherever a decision moves."""
    from tvm_ext.tune.sampling import sample_candidates
    from tvm_ext.workloads.conv2d_int8 import seed_conv_primfunc

    target = cuda_target()
    mod = tvm.IRModule({"main": seed_conv_primfunc(image=14, channels=32)})
    before: list = []
    candidates = sample_candidates(mod, target, tvm_ext.space(target), 64, seed=3, before_postprocs=before)
    assert len(before) == len(candidates) == 64
    early = [check_module_threads(m, 32) is None for m in before]
    late = [check_module_threads(sch.mod, 32) is None for sch in candidates]
    assert early == late
    assert 0 < sum(early) < len(early)
    # the modules before are not those after: the postprocs ran on the candidates
    assert any(not tvm_ffi.structural_equal(m, sch.mod) for m, sch in zip(before, candidates))
