"""Rule sets: TVM's defaults for a target with ours in place of the built-in pieces.

``plugin``           TVM's default rules/postprocs, with our ApplyBlockAttrRule in front
                     of TVM's ApplyCustomRule, our InlineConstantScalars in place of
                     TVM's, our VerifyGPUCode in place of TVM's (cuda; its thread-extent
                     check also runs first, as ThreadExtentPrecheck), and on x86 with
                     VNNI our VNNI tensorization rule + RewriteTensorize (llvm) -- on x86
                     with AVX2 but no VNNI the same rule with the AVX2 intrinsic, which
                     only takes blocks annotated as safe for it (``u8s8_intrin_name``) --
                     and on x86 with AMX int8 our AMX rule + AMXTileConfig in front of those;
                     on llvm our CPU rules before MultiLevelTiling: DequantGEMV (float q4 GEMV kernels),
                     Q4Int8GEMM (q4 x int8 GEMMs and GEMVs), RowNormCPU (LayerNorm), ContractionCPU
                     (decode/prefill attention); on cuda DequantGEMVCUDA and ContractionCUDA
                     before MultiLevelTiling, and where the GPU has int8 tensor cores
                     Int8TensorCoreCUDA (+ RewriteTensorize before VerifyGPUCode).
``no-inline-const``  ``plugin`` without any InlineConstantScalars (the ablation).
``upstream``         TVM's built-in defaults, untouched.

Schedules (``SCHEDULES``: what ``tvm_ext.ApplySchedules`` applies to a module, without tuning):

``dlight``  dlight's default rules for the target (``dlight_rules``);
``rule``    our rules where they match (``schedule_rules``: on CPUs the q4 x int8 GEMM, the
            dequantize-GEMV, row normalizations, contractions, injective kernels; on GPUs the
            dequantize-GEMV and attention's value product), dlight for the rest;
``int8``    as ``rule`` (the name of a module built with int8 projections);
``tuned``   a tuning database's best record where it holds the kernel, else as ``rule``;
``none``    every kernel as built.
"""
from __future__ import annotations

from typing import List

import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.postproc import Postproc, RewriteTensorize
from tvm.s_tir.meta_schedule.schedule_rule import ScheduleRule

from tvm_ext.intrinsics.fast_import import import_tensor_intrinsics
from tvm_ext.intrinsics.vnni import u8s8_intrin_name
from tvm_ext.schedule_rule import is_gpu

RULESETS = ("plugin", "no-inline-const", "upstream")
SCHEDULES = ("dlight", "rule", "int8", "tuned", "none")
GPU_SCHEDULES = ("dlight", "rule")  # the GPU decode's rows
PROMPT_SCHEDULES = ("int8", "tuned")  # the int8 prompt's rows
MODEL_SCHEDULES = ("dlight", "rule", "none")  # a loaded checkpoint's decoder (float projections, no database)
LAYER_SCHEDULES = ("dlight", "metaschedule", "seeded", "rule")  # the layer bench's rows: tuned from scratch,
# tuned from our rules' seeds (``tuned`` on the database it fills), ``rule`` where our rules exist for the target


def target_kind(target: tvm.target.Target) -> str:
    """The MetaSchedule default-rule kind for a target: ``llvm`` or ``cuda``."""
    kind = target.kind.name
    if kind not in ("llvm", "cuda"):
        raise ValueError(f"tvm_ext supports llvm and cuda targets, not {kind!r}")
    return kind


def check_ruleset(ruleset: str) -> str:
    if ruleset not in RULESETS:
        raise ValueError(f"unknown ruleset {ruleset!r}; choose one of {', '.join(RULESETS)}")
    return ruleset


def check_schedules(names, allowed=SCHEDULES, where: str = "") -> tuple:
    """``names`` (a comma-separated string or a sequence) as a tuple, each one of ``allowed``; ValueError
    (one line) otherwise.  ``where``: the context the allowed names are for ("on a GPU")."""
    names = tuple(x.strip() for x in (names.split(",") if isinstance(names, str) else names) if x.strip())
    if not names:
        raise ValueError("no schedule given")
    for name in names:
        if name not in allowed:
            raise ValueError(f"unknown schedule {name!r}; {where + ' ' if where else ''}the schedules are "
                             f"{', '.join(allowed)}")
    return names


def dlight_rules(target) -> list:
    """dlight's default rules for ``target``, in order (``dlight``)."""
    from tvm.s_tir import dlight as dl

    if is_gpu(target):
        g = dl.gpu
        return [g.Matmul(), g.GEMV(), g.LowBatchGEMV(), g.Reduction(), g.GeneralReduction(), g.Fallback()]
    return [dl.cpu.GEMV(), dl.cpu.Reduction()]


def schedule_rules(target) -> list:
    """Our rules (``tvm_ext.schedule_rule.ScheduleRule``) for ``target``, the first that matches a kernel
    schedules it (``rule``)."""
    from tvm_ext import rules as r

    if is_gpu(target):
        return [r.DequantGEMVCUDA(), r.ContractionCUDA()]
    return [r.Q4Int8GEMM(), r.DequantGEMV(), r.RowNormCPU(), r.ContractionCPU(), r.InjectiveCPU()]


def _name(obj) -> str:
    return type(obj).__name__


def default_rules(target: tvm.target.Target, ruleset: str = "plugin") -> list:
    """Schedule rules for ``target`` under ``ruleset`` (see module doc)."""
    from tvm_ext.rules import ApplyBlockAttrRule, InlineConstantScalars

    kind = target_kind(target)
    upstream = list(ms.ScheduleRule.create(kind))
    if check_ruleset(ruleset) == "upstream":
        return upstream
    from tvm_ext.registration import install

    install()  # ApplyBlockAttrRule and TVM's ApplyCustomRule look the inline functions up by name
    rules = []
    for rule in upstream:
        name = _name(rule)
        if name == "ApplyCustomRule":
            rules += [ApplyBlockAttrRule().meta_schedule(), rule]
        elif name == "InlineConstantScalars":
            if ruleset == "plugin":
                rules.append(InlineConstantScalars().meta_schedule())
        else:
            rules.append(rule)
    if kind == "llvm":
        rules = with_cpu_rules(rules)
    else:
        rules = with_cuda_rules(rules, target)
    add_vnni = _vnni(target, ruleset)
    return add_vnni(rules, [], target)[0] if add_vnni else rules


def _before_tiling(rules: list, ours: list) -> list:
    """A copy of ``rules`` with ``ours`` right before MultiLevelTiling, else at the end: our whole-function
    rules see each block first and mark what they schedule, so that TVM's tiling skips it."""
    rules = list(rules)
    names = [_name(r) for r in rules]
    idx = names.index("MultiLevelTiling") if "MultiLevelTiling" in names else len(rules)
    rules[idx:idx] = ours
    return rules


def with_cpu_rules(rules: list) -> list:
    """A copy of ``rules`` with our CPU rules right before MultiLevelTiling, else at the end (llvm
    rule sets other than ``upstream``): DequantGEMV (float q4 GEMV kernels), Q4Int8GEMM (q4 x int8
    GEMMs and GEMVs; nothing on targets without AVX2), RowNormCPU (row normalizations: LayerNorm),
    ContractionCPU (single-block contractions: attention) and InjectiveCPU (kernels without a
    reduction: rope, concatenates).  Each matches by structure and passes every other block."""
    # pylint: disable=import-outside-toplevel
    from tvm_ext.rules.contraction_cpu import ContractionCPU
    from tvm_ext.rules.dequant_gemv import DequantGEMV
    from tvm_ext.rules.injective_cpu import InjectiveCPU
    from tvm_ext.rules.q4_int8_gemm import Q4Int8GEMM
    from tvm_ext.rules.row_norm_cpu import RowNormCPU

    ours = [DequantGEMV(), Q4Int8GEMM(), RowNormCPU(), ContractionCPU(), InjectiveCPU()]
    return _before_tiling(rules, [rule.meta_schedule() for rule in ours])


def with_cuda_rules(rules: list, target) -> list:
    """A copy of ``rules`` with our CUDA rules right before MultiLevelTiling (cuda rule sets other than
    ``upstream``): DequantGEMVCUDA (q4 decode GEMV kernels), ContractionCUDA (decode attention's value
    product) and, where ``target`` has int8 tensor cores, Int8TensorCoreCUDA (s8 x s8 convs and GEMMs
    on wmma).  Each matches by structure and passes every other block."""
    # pylint: disable=import-outside-toplevel
    from tvm_ext.rules import int8_tensor_core_cuda as int8_tc
    from tvm_ext.rules.contraction_cuda import ContractionCUDA
    from tvm_ext.rules.dequant_gemv_cuda import DequantGEMVCUDA

    ours = [DequantGEMVCUDA().meta_schedule(), ContractionCUDA().meta_schedule()]
    if int8_tc.supported(target):
        ours.append(int8_tc.Int8TensorCoreCUDA().meta_schedule())
    return _before_tiling(rules, ours)


def _vnni(target, ruleset: str):
    """``with_vnni`` for our llvm rule sets; None for ``upstream`` and cuda (it adds
    nothing on targets without VNNI or AVX2)."""
    if ruleset == "upstream" or target_kind(target) != "llvm":
        return None
    return with_cpu_tensorization


def default_postprocs(target: tvm.target.Target, ruleset: str = "plugin") -> list:
    """Postprocessors for ``target`` under ``ruleset`` (ours replace VerifyGPUCode)."""
    from tvm_ext.postprocs import ThreadExtentPrecheck, VerifyGPUCode
    from tvm_ext.rules.int8_tensor_core_cuda import supported as int8_tensor_cores

    kind = target_kind(target)
    upstream = list(ms.Postproc.create(kind))
    if check_ruleset(ruleset) == "upstream":
        return upstream
    verify = VerifyGPUCode()
    posts = [verify if _name(p) == "VerifyGPUCode" else p for p in upstream]
    if kind == "cuda" and int8_tensor_cores(target):  # tensorized before verified: the verdict is on what is compiled
        posts.insert(posts.index(verify), RewriteTensorize())
    if any(p is verify for p in posts):
        # its first check, before the postprocs that most candidates would pay for nothing
        posts.insert(0, ThreadExtentPrecheck(verify.log))
    add_vnni = _vnni(target, ruleset)
    return add_vnni([], posts, target)[1] if add_vnni else posts


def space(target: tvm.target.Target, ruleset: str = "plugin",
          postprocs: list | None = None) -> ms.space_generator.PostOrderApply:
    """A PostOrderApply design-space generator with the rule set's rules and postprocs.

    ``postprocs``: the list ``default_postprocs(target, ruleset)`` made by the caller, who
    keeps the Python objects (the space hands back TVM's wrappers, without our methods such
    as ``VerifyGPUCode.reason_counts``).  Also imports TVM's tensor intrinsics the fast way
    (see ``tvm_ext.intrinsics.fast_import``; for an llvm target its CPU families only), so that
    the ``ms.TuneContext`` this space goes into does not spend ~40 s importing them.
    """
    import_tensor_intrinsics(gpu=target_kind(target) != "llvm")
    return ms.space_generator.PostOrderApply(
        sch_rules=default_rules(target, ruleset),
        postprocs=default_postprocs(target, ruleset) if postprocs is None else postprocs,
        mutator_probs=target_kind(target),
    )


# ----------------------------------------------------------------------------- VNNI presets
def vnni_rules(target) -> list:
    """Our rules to insert **before** MultiLevelTiling in an llvm rule list (``with_vnni`` inserts their
    MetaSchedule faces): VNNITensorize with the target's 16x4 intrinsic (``u8s8_intrin_name``: VNNI,
    else AVX2 for annotated blocks).

    Empty when the target has neither (non-x86, x86 without AVX2, cuda).
    """
    intrin = u8s8_intrin_name(target)
    from tvm_ext.rules.vnni_tensorize import VNNITensorize

    return [VNNITensorize(intrin)] if intrin else []


def vnni_postprocs(target) -> List[Postproc]:
    """Postprocessors the rule needs (RewriteTensorize); empty when ``vnni_rules`` is."""
    return [RewriteTensorize(vectorize_init_loop=True)] if u8s8_intrin_name(target) else []


def with_vnni(rules: List[ScheduleRule], postprocs: List[Postproc], target):
    """(rules, postprocs) with the VNNI pieces inserted.

    VNNITensorize goes right before the first MultiLevelTiling (else before
    ParallelizeVectorizeUnroll, else at the end); RewriteTensorize right after
    RewriteReductionBlock (it tensorizes the update block that one splits from the
    init), else at the end. Copies of the lists, unchanged when the target has neither
    VNNI nor AVX2.
    """
    extra_rules, extra_posts = vnni_rules(target), vnni_postprocs(target)
    if not extra_rules:
        return list(rules), list(postprocs)
    rules = list(rules)
    names = [type(r).__name__ for r in rules]
    idx = next((i for i, n in enumerate(names) if n == "MultiLevelTiling"), None)
    if idx is None:
        idx = next((i for i, n in enumerate(names) if n == "ParallelizeVectorizeUnroll"), len(rules))
    rules[idx:idx] = [rule.meta_schedule() for rule in extra_rules]
    posts = list(postprocs)
    pnames = [type(p).__name__ for p in posts]
    # RewriteTensorize runs after RewriteReductionBlock (it tensorizes the update block
    # that one separates from the init) and before RewriteLayout
    pidx = next((i + 1 for i, n in enumerate(pnames) if n == "RewriteReductionBlock"), len(posts))
    posts[pidx:pidx] = extra_posts
    return rules, posts


def vnni_space(target):
    """TVM's default llvm rules and postprocs with the VNNI pieces (for tests/tools)."""
    from tvm.s_tir.meta_schedule.space_generator import PostOrderApply  # pylint: disable=import-outside-toplevel

    rules, posts = with_vnni(ScheduleRule.create("llvm"), Postproc.create("llvm"), target)
    return PostOrderApply(sch_rules=rules, postprocs=posts, mutator_probs="llvm")


# ----------------------------------------------------------------------------- AMX presets
def with_amx(rules: List[ScheduleRule], postprocs: List[Postproc], target):
    """(rules, postprocs) with the AMX pieces inserted; copies, unchanged without AMX int8.

    AMXTensorize goes right before VNNITensorize (else MultiLevelTiling, else
    ParallelizeVectorizeUnroll, else the end): AMX over VNNI over plain code, per block.
    AMXTileConfig goes right after RewriteReductionBlock (it tensorizes the tile and the
    init split off by that one, before RewriteTensorize), else at the end.
    """
    from tvm_ext.targets import has_amx  # pylint: disable=import-outside-toplevel

    rules, posts = list(rules), list(postprocs)
    if not has_amx(target):
        return rules, posts
    from tvm_ext.postprocs.amx_tile_config import AMXTileConfig  # pylint: disable=import-outside-toplevel
    from tvm_ext.rules.amx_tensorize import AMXTensorize  # pylint: disable=import-outside-toplevel

    names = [type(r).__name__ for r in rules]
    idx = next((names.index(n) for n in ("VNNITensorize", "MultiLevelTiling", "ParallelizeVectorizeUnroll")
                if n in names), len(rules))
    rules[idx:idx] = [AMXTensorize().meta_schedule()]
    pnames = [type(p).__name__ for p in posts]
    pidx = next((i + 1 for i, n in enumerate(pnames) if n == "RewriteReductionBlock"), len(posts))
    posts[pidx:pidx] = [AMXTileConfig()]
    return rules, posts


def with_cpu_tensorization(rules: List[ScheduleRule], postprocs: List[Postproc], target):
    """``with_vnni`` then ``with_amx``: what our llvm rule sets add on x86."""
    return with_amx(*with_vnni(rules, postprocs, target), target)


def amx_space(target):
    """TVM's default llvm rules and postprocs with the VNNI and AMX pieces (for tests/tools)."""
    from tvm.s_tir.meta_schedule.space_generator import PostOrderApply  # pylint: disable=import-outside-toplevel

    rules, posts = with_cpu_tensorization(ScheduleRule.create("llvm"), Postproc.create("llvm"), target)
    return PostOrderApply(sch_rules=rules, postprocs=posts, mutator_probs="llvm")
