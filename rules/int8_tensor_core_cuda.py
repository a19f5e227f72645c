"""Int8TensorCoreCUDA: s8 x s8 -> s32 convolutions and GEMMs on NVIDIA int8 tensor cores (wmma).

Pattern: a block ``C[...] += int32(A[...]) * int32(B[...])`` with int8 A and B that MetaSchedule's
auto-tensorize mapping can lay out as a GEMM -- the convs and the dense of ``resnet50-int8-s8``
(``workloads.qnn_signed``: u8 activations read as ``x - 128``), NHWC convs of any kernel size.

Why: TVM's default ``cuda`` rules tile such a block as scalar int32 multiply-adds; an int8 tensor
core does 16x16x16 per warp instruction.  This is TVM's own ``MultiLevelTilingTensorCore`` with
int8 ``wmma`` intrinsic groups (B as stored, or transposed), configured so that it builds with TVM
0.27: inputs staged in static ``shared`` memory, the int32 tile written back through
``shared.dyn``.  With one scope for both (TVM's ``cuda-tensorcore`` preset: ``shared.dyn``; or
``shared``) the int8 and int32 tiles end up in one merged allocation and the candidates fail in
code generation (``tvm_access_ptr element type must match the source buffer``: 11 of 12 and 21 of
24 sampled on a ResNet-50 conv, the others for other reasons); in two scopes they stay apart.
Its ``mma.sync`` int8 intrinsics are not an option there: the rule's ``mma`` path (``is_mma``) is
written for fp16 ``m16n8k8`` fragments only.
The input's shift and padding are inlined into the shared-memory copy, the requantize epilogue
reads the tile from shared memory in the same kernel.  Needs ``RewriteTensorize`` among the
postprocessors; sm_72 and later.  A block-level rule of the contract (``tvm_ext.schedule_rule``):
MetaSchedule's face only, TVM's tiling answering for each block.
"""
from __future__ import annotations

import copy

from tvm.s_tir import meta_schedule as ms

from tvm_ext.schedule_rule import ScheduleRule

MIN_ARCH = 72  # int8 wmma fragments: Turing (sm_72/sm_75) and later


def int8_groups() -> list:
    """The wmma int8 intrinsic groups: B as stored (K x N) and transposed (N x K)."""
    from tvm_ext.intrinsics.fast_import import import_tensor_intrinsics

    import_tensor_intrinsics()  # registers TVM's wmma intrinsics (in seconds, not ~40 s)
    from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group

    return [get_wmma_intrin_group(load_scope="shared", store_scope="shared.dyn", in_dtype="int8", out_dtype="int32",
                                  trans_b=trans_b) for trans_b in (True, False)]


def supported(target) -> bool:
    """Whether ``target`` (cuda) has int8 tensor cores."""
    arch = str(target.attrs.get("arch", "")) if target.kind.name == "cuda" else ""
    return arch.startswith("sm_") and int(arch[3:]) >= MIN_ARCH


class Int8TensorCoreCUDA(ScheduleRule):
    """The rule (module doc): TVM's tiling for tensor cores with our int8 groups and scopes."""

    name = "int8_tensor_core_cuda"
    gpu = True

    def __init__(self) -> None:
        reuse = ms.schedule_rule.ReuseType
        self._mlt = ms.schedule_rule.MultiLevelTilingTensorCore(
            intrin_groups=int8_groups(),
            structure="SSSRRSRS",
            tile_binds=["blockIdx.y", "blockIdx.x", "threadIdx.y"],
            max_innermost_factor=4,
            vector_load_lens=[1, 2, 4, 8, 16],
            reuse_read=reuse(req="must", levels=[4], scope="shared"),
            reuse_write=reuse(req="must", levels=[2], scope="shared.dyn"),
            use_software_pipeline=False,
        )

    def is_target_available(self, target) -> bool:
        return supported(target)

    def initialize(self, context) -> None:
        self._mlt._initialize_with_tune_context(context)  # pylint: disable=protected-access

    def candidates(self, sch, block, target):
        return list(self._mlt.apply(sch, block))

    def clone(self) -> "Int8TensorCoreCUDA":
        other = copy.copy(self)
        other._mlt = self._mlt.clone()  # TVM's clone keeps what the tune context set
        return other
