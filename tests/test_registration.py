"""Everything is reachable by name through TVM's global registry after import."""
import importlib

import tvm
from tvm.s_tir import meta_schedule as ms

import tvm_ext
from kernels import cuda_target, design_spaces, llvm_target
from tvm_ext.workloads.conv2d_int8 import seed_conv_primfunc
from tvm_ext.tir_utils import top_level_nests


def by_name(name):
    return tvm.get_global_func(name)()


def test_constructors_by_name_are_usable_in_post_order_apply():
    rules = [by_name("tvm_ext.schedule_rule.ApplyBlockAttrRule"),
             by_name("tvm_ext.schedule_rule.InlineConstantScalars")]
    assert all(isinstance(r, ms.ScheduleRule) for r in rules)
    rest = [r for r in ms.ScheduleRule.create("cuda")
            if type(r).__name__ not in ("ApplyCustomRule", "InlineConstantScalars")]
    post = by_name("tvm_ext.postproc.VerifyGPUCode")
    assert isinstance(post, ms.Postproc)
    spaces = design_spaces(seed_conv_primfunc(image=8, channels=16), cuda_target(),
                           sch_rules=rules + rest, postprocs=[post])
    assert spaces and all(top_level_nests(s.mod["main"]) == 1 for s in spaces)


def test_importing_twice_is_safe():
    importlib.reload(tvm_ext)
    importlib.reload(tvm_ext)
    assert isinstance(by_name("tvm_ext.schedule_rule.InlineConstantScalars"), ms.ScheduleRule)


def test_space_for_llvm_and_cuda():
    for target in (llvm_target(), cuda_target()):
        space = tvm_ext.space(target)
        assert isinstance(space, ms.space_generator.PostOrderApply)
        posts = [type(p).__name__ for p in tvm_ext.default_postprocs(target)]
        upstream = [type(p).__name__ for p in ms.Postproc.create(target.kind.name)]
        assert posts == upstream  # same pieces, same order
        if target.kind.name == "cuda":
            ours = [p for p in tvm_ext.default_postprocs(target) if type(p).__name__ == "VerifyGPUCode"]
            assert len(ours) == 1 and hasattr(ours[0], "reason_counts")  # ours, not TVM's
