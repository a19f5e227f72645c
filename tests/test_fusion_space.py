"""The seed's claim: with constant scalars inlined, conv + requantize is one kernel."""
import pytest

from tir_kernels import cuda_target, design_spaces, llvm_target, upstream_rules_without
from tvm_ext.tir_utils import blocks_of, top_level_nests
from tvm_ext.rules import is_constant_scalar_block
from tvm_ext.workloads.conv2d_int8 import seed_conv_primfunc

SEED = seed_conv_primfunc(image=14, channels=32)


def kernels_per_sketch(spaces):
    return [top_level_nests(s.mod["main"]) for s in spaces]


def test_seed_has_a_constant_scalar_block():
    assert sum(is_constant_scalar_block(b) for b in blocks_of(SEED)) == 1


def test_cuda_plugin_space_fuses_every_sketch():
    spaces = design_spaces(SEED, cuda_target(), ruleset="plugin")
    assert len(spaces) >= 1
    assert kernels_per_sketch(spaces) == [1] * len(spaces)
    for sketch in spaces:
        assert not any(is_constant_scalar_block(b) for b in blocks_of(sketch.mod["main"]))


def test_cuda_without_inline_constant_scalars_keeps_epilogue_separate():
    rules = upstream_rules_without(cuda_target(), "InlineConstantScalars")
    spaces = design_spaces(SEED, cuda_target(), sch_rules=rules)
    assert all(k >= 2 for k in kernels_per_sketch(spaces))
    # and our own ablation rule set behaves the same
    ours = design_spaces(SEED, cuda_target(), ruleset="no-inline-const")
    assert kernels_per_sketch(ours) == kernels_per_sketch(spaces)


def test_llvm_constant_block_does_not_block_fusion():
    """On llvm TVM's AutoInline never reverse-inlines, so the constant rule does not change
    the sketches: with or without it (ours: plugin vs no-inline-const; TVM's: defaults with
    and without its InlineConstantScalars) they are the same. The write-reuse sketches of
    MultiLevelTiling put the epilogue into the conv's loop nest (1 nest), the plain sketch
    keeps it apart (2). Our VNNI rule (plugin on this x86 host) adds a sketch of its own."""
    ours = kernels_per_sketch(design_spaces(SEED, llvm_target(), ruleset="plugin"))
    ours_without = kernels_per_sketch(design_spaces(SEED, llvm_target(), ruleset="no-inline-const"))
    assert ours == ours_without
    tvm_default = kernels_per_sketch(design_spaces(SEED, llvm_target(), ruleset="upstream"))
    tvm_without = kernels_per_sketch(design_spaces(
        SEED, llvm_target(), sch_rules=upstream_rules_without(llvm_target(), "InlineConstantScalars")))
    assert tvm_default == tvm_without
    assert 1 in ours and 1 in tvm_default  # the write-reuse sketches fuse the epilogue
    for sketch in design_spaces(SEED, llvm_target(), ruleset="plugin"):
        assert not any(is_constant_scalar_block(b) for b in blocks_of(sketch.mod["main"]))


@pytest.mark.parametrize("target", [cuda_target(), llvm_target()], ids=["cuda", "llvm"])
def test_upstream_ruleset_is_tvm_default(target):
    import tvm_ext
    from tvm.s_tir import meta_schedule as ms

    names = [type(r).__name__ for r in tvm_ext.default_rules(target, "upstream")]
    assert names == [type(r).__name__ for r in ms.ScheduleRule.create(target.kind.name)]
    ours = [type(r).__name__ for r in tvm_ext.default_rules(target, "plugin")]
    assert ours[0] == "ApplyBlockAttrRule" and "InlineConstantScalars" in ours
