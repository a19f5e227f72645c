"""Everything is reachable by name through TVM's global registry after import, and importing changes
nothing else; what ``tvm_ext.install()`` registers in TVM's own namespace can be undone and refused."""
import importlib
import subprocess
import sys

import pytest
import tvm
import tvm_ffi
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms

import tvm_ext
from tir_kernels import annotated, cuda_target, design_spaces, llvm_target
from tvm_ext import registration
from tvm_ext.tir_utils import top_level_nests
from tvm_ext.workloads.conv2d_int8 import seed_conv_primfunc

KEYS = ("cpu", "gpu", "cuda", "generic")
RULES = ("compute_inline", "reverse_compute_inline")
TVM_NAMES = [f"s_tir.meta_schedule.{key}.{rule}" for key in KEYS for rule in RULES]
OWN_NAMES = ["tvm_ext.schedule_rule.InlineConstantScalars", "tvm_ext.schedule_rule.ApplyBlockAttrRule",
             "tvm_ext.schedule_rule.DequantGEMVCUDA", "tvm_ext.schedule_rule.InjectiveCPU",
             "tvm_ext.schedule_rule.Int8TensorCoreCUDA",
             "tvm_ext.postproc.VerifyGPUCode", "tvm_ext.postproc.ThreadExtentPrecheck"]
CPU_INLINE = "s_tir.meta_schedule.cpu.compute_inline"


def by_name(name):
    return tvm.get_global_func(name)()


def registered(name):
    return tvm.get_global_func(name, allow_missing=True) is not None


def inlines_block_b(name) -> bool:
    """Call the function registered under ``name`` as ApplyCustomRule would."""
    sch = Schedule(annotated("compute_inline"))
    result = tvm.get_global_func(name)(sch, sch.get_sblock("b"))
    return 'T.sblock("b")' not in result[0].mod["main"].script()


def test_constructors_by_name_are_usable_in_post_order_apply():
    rules = [by_name("tvm_ext.schedule_rule.ApplyBlockAttrRule"),
             by_name("tvm_ext.schedule_rule.InlineConstantScalars")]
    assert all(isinstance(r, ms.ScheduleRule) for r in rules)
    rest = [r for r in ms.ScheduleRule.create("cuda")
            if type(r).__name__ not in ("ApplyCustomRule", "InlineConstantScalars")]
    spaces = design_spaces(seed_conv_primfunc(image=8, channels=16), cuda_target(), sch_rules=rules + rest)
    assert spaces and all(top_level_nests(s.mod["main"]) == 1 for s in spaces)


def test_postproc_by_name_judges_candidates():
    from tvm import te

    post = by_name("tvm_ext.postproc.VerifyGPUCode")
    assert isinstance(post, ms.Postproc)
    post._initialize_with_tune_context(ms.TuneContext(target=cuda_target()))

    def copy(threads):
        a = te.placeholder((4096,), "float32", name="a")
        sch = Schedule(te.create_prim_func([a, te.compute((4096,), lambda i: a[i], name="b")]))
        bx, tx = sch.split(sch.get_loops(sch.get_sblock("b"))[0], [None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        return sch

    assert post.apply(copy(threads=128))
    assert not post.apply(copy(threads=2048))  # over the target's 1024 threads per block


def test_import_registers_our_names_only_and_a_plugin_rule_set_installs_the_inliners():
    """In a fresh process: after ``import tvm_ext`` every ``tvm_ext.*`` name is there and none of TVM's
    ``s_tir.meta_schedule.<key>.compute_inline`` names; building the ``plugin`` rule set (whose
    ApplyBlockAttrRule needs them) or ``tvm_ext.install()`` registers them; ``upstream`` does not."""
    code = (
        "import tvm, tvm_ext\n"
        "from tvm_ext.targets import resolve_target\n"
        f"tvm_names, own = {TVM_NAMES!r}, {OWN_NAMES!r}\n"
        "has = lambda n: tvm.get_global_func(n, allow_missing=True) is not None\n"
        "assert all(has(n) for n in own) and not any(has(n) for n in tvm_names)\n"
        "tvm_ext.default_rules(resolve_target('llvm-generic'), 'upstream')\n"
        "assert not any(has(n) for n in tvm_names)\n"
        "tvm_ext.default_rules(resolve_target('llvm-generic'))\n"
        "assert all(has(n) for n in tvm_names)\n"
        "tvm_ext.registration.restore_tvm_functions()\n"
        "assert not any(has(n) for n in tvm_names)\n"
        "assert sorted(tvm_ext.install()) == sorted(tvm_names)\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_custom_rule_functions_are_ours_after_install():
    registration.install()
    for name in TVM_NAMES:
        assert registered(name), name
    assert inlines_block_b(CPU_INLINE)


def test_importing_twice_is_safe_and_remembers_tvms_functions_not_ours():
    importlib.reload(tvm_ext)
    tvm_ext.install()
    importlib.reload(tvm_ext)
    tvm_ext.install()
    try:
        assert isinstance(by_name("tvm_ext.schedule_rule.InlineConstantScalars"), ms.ScheduleRule)
        assert inlines_block_b(CPU_INLINE)
        registration.restore_tvm_functions()
        # TVM 0.27 has none of these names: a restore removes them, it does not bring back
        # the functions an earlier install registered
        assert [name for name in TVM_NAMES if registered(name)] == []
    finally:
        registration.register_all()
        registration.install()


@pytest.fixture
def tvm_has_its_own():
    """Pretend TVM defines s_tir.meta_schedule.cpu.compute_inline (a function that answers
    "theirs"); afterwards the registry is as ``import tvm_ext`` leaves it."""
    registration.restore_tvm_functions()
    original = tvm.get_global_func(CPU_INLINE, allow_missing=True)
    tvm_ffi.register_global_func(CPU_INLINE, lambda sch, block: "theirs", override=True)
    yield
    registration.unregister()
    if original is None:
        tvm_ffi.registry.remove_global_func(CPU_INLINE)
    else:
        tvm_ffi.register_global_func(CPU_INLINE, original, override=True)
    registration.register_all()
    registration.install()


def test_override_of_a_tvm_function_is_reversible(tvm_has_its_own):
    names = registration.install()
    assert set(TVM_NAMES) <= set(names)
    assert inlines_block_b(CPU_INLINE)  # ours now
    registration.install()  # again: must still remember TVM's, not ours
    registration.restore_tvm_functions()
    assert tvm.get_global_func(CPU_INLINE)(None, None) == "theirs"
    assert [name for name in TVM_NAMES if registered(name)] == [CPU_INLINE]  # ours removed
    assert all(registered(name) for name in OWN_NAMES)  # our own namespace stays


def test_no_override_env_keeps_tvms_function(tvm_has_its_own, monkeypatch):
    monkeypatch.setenv("TVM_EXT_NO_OVERRIDE", "1")
    names = registration.install()
    assert CPU_INLINE not in names
    assert tvm.get_global_func(CPU_INLINE)(None, None) == "theirs"
    # where TVM has nothing, ours is still registered: nothing is overridden
    assert inlines_block_b("s_tir.meta_schedule.generic.compute_inline")
    assert all(registered(name) for name in TVM_NAMES)


def test_unregister_removes_our_names_and_restores_tvms(tvm_has_its_own):
    registration.register_all()
    registration.install()
    registration.unregister()
    assert [name for name in OWN_NAMES + TVM_NAMES if registered(name)] == [CPU_INLINE]
    assert tvm.get_global_func(CPU_INLINE)(None, None) == "theirs"
    registration.register_all()
    registration.install()
    assert all(registered(name) for name in OWN_NAMES + TVM_NAMES)
    assert inlines_block_b(CPU_INLINE)


def test_space_for_llvm_and_cuda():
    for target in (llvm_target(), cuda_target()):
        space = tvm_ext.space(target)
        assert isinstance(space, ms.space_generator.PostOrderApply)
        posts = [type(p).__name__ for p in tvm_ext.default_postprocs(target)]
        upstream = [type(p).__name__ for p in ms.Postproc.create(target.kind.name)]
        if target.kind.name == "cuda":
            # the same pieces in the same order, VerifyGPUCode's first check also in front, and the
            # int8 tensor-core rule's tensorization before the verdict (sm_80: int8 tensor cores)
            verify = upstream.index("VerifyGPUCode")
            assert posts == ["ThreadExtentPrecheck"] + upstream[:verify] + ["RewriteTensorize"] + upstream[verify:]
        else:
            assert posts == upstream  # same pieces, same order
        if target.kind.name == "cuda":
            ours = [p for p in tvm_ext.default_postprocs(target) if type(p).__name__ == "VerifyGPUCode"]
            assert len(ours) == 1 and hasattr(ours[0], "reason_counts")  # ours, not TVM's
