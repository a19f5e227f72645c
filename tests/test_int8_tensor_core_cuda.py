"""Int8TensorCoreCUDA (rules/int8_tensor_core_cuda.py): s8 x s8 convs of resnet50-int8-s8 on wmma.

No GPU here: the design space of an s8 conv has tensor-core sketches (the u8 conv, and GPUs before
sm_72, none), and the candidates our VerifyGPUCode accepts call ``wmma::mma_sync`` and compile with
nvcc.  ``tvm-ext verify-gpu resnet50-int8-s8`` checks that on 100 candidates a task
(``tuning_logs/verify-gpu-resnet50-int8-s8-sm90.json``); the numbers are checked on a lent GPU by
``tvm-ext bench resnet50-int8 --target cuda`` (the network against the NumPy reference).
"""
import shutil

import pytest

tvm = pytest.importorskip("tvm")

from tvm import te  # noqa: E402

from tir_kernels import design_spaces  # noqa: E402
from tvm_ext.rules import int8_tensor_core_cuda as rule  # noqa: E402
from tvm_ext.targets import cuda_target, resolve_target  # noqa: E402
from tvm_ext.workloads import qnn  # noqa: E402
from tvm_ext.workloads.qnn_signed import conv2d_nhwc_s8  # noqa: E402

TARGET = cuda_target("sm_80")
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


def conv(op):
    """A 3x3 conv of a batch of 2 16x16x64 images to 64 channels (ResNet's first stage, smaller)."""
    data, w = te.placeholder((2, 16, 16, 64), "uint8", name="data"), te.placeholder((3, 3, 64, 64), "int8", name="w")
    return te.create_prim_func([data, w, op(data, w, pad=1, zp_in=100)]).with_attr("global_symbol", "main")


def tensorized_with(sketch) -> set:
    return {str(inst.inputs[1]) for inst in sketch.trace.insts
            if inst.kind.name == "Annotate" and str(inst.attrs[0]) == "meta_schedule.auto_tensorize"}


def test_an_s8_conv_gets_wmma_sketches_and_a_u8_conv_none():
    s8 = [tensorized_with(s) for s in design_spaces(conv(conv2d_nhwc_s8), TARGET, ruleset="plugin")]
    assert any(any("wmma_sync_16x16x16_s8s8s32" in name for name in names) for names in s8), s8
    u8 = [tensorized_with(s) for s in design_spaces(conv(qnn.conv2d_nhwc), TARGET, ruleset="plugin")]
    assert not any(u8)  # u8 x s8: no int8 MMA takes it; TVM's tiling as before


def test_the_rule_is_in_the_space_from_sm_72_and_not_upstream():
    names = lambda target, ruleset="plugin": [type(r).__name__ for r in  # noqa: E731
                                              __import__("tvm_ext").default_rules(target, ruleset)]
    assert "Int8TensorCoreCUDA" in names(cuda_target("sm_75"))
    assert "Int8TensorCoreCUDA" not in names(resolve_target({"kind": "cuda", "arch": "sm_70"}))
    assert "Int8TensorCoreCUDA" not in names(TARGET, "upstream")
    posts = [type(p).__name__ for p in __import__("tvm_ext").default_postprocs(TARGET)]
    assert posts.index("RewriteTensorize") < posts.index("VerifyGPUCode")  # verified as compiled
    assert not rule.supported(resolve_target("llvm"))


@needs_nvcc
def test_accepted_candidates_call_the_tensor_cores_and_compile():
    import tvm_ext
    from tvm_ext.check.nvcc import compile_cuda
    from tvm_ext.lowering import cuda_source
    from tvm_ext.postprocs.verify_gpu_code import target_limits, verify
    from tvm_ext.tune.sampling import sample_candidates

    mod = tvm.IRModule({"main": conv(conv2d_nhwc_s8)})
    limits, compiled = target_limits(TARGET), 0
    for sch in sample_candidates(mod, TARGET, tvm_ext.space(TARGET), 40, seed=0):
        if "wmma" not in sch.mod.script() or verify(sch.mod, TARGET, limits) is not None:
            continue
        source = cuda_source(sch, TARGET)
        assert "wmma::mma_sync" in source and "wmma::load_matrix_sync" in source
        ok, err = compile_cuda(source, "sm_80")
        assert ok, err
        compiled += 1
        if compiled == 2:
            break
    assert compiled == 2, "fewer than 2 of 40 sampled tensor-core candidates were accepted"
