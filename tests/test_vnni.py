"""VNNI tensorization of packed quantized conv2d / dense (rules/vnni_tensorize.py).

Fast tests schedule with the rule (design space + postprocessors, no measurement),
compile and compare bit for bit with NumPy; the slow one tunes with ms.tune_tir.
"""
import tempfile

import numpy as np
import pytest
import tvm
from tvm import te, tirx
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Trace

from tvm_ext import rulesets as R
from tvm_ext.intrinsics import vnni as I
from tvm_ext.rules import vnni_tensorize as V
from tvm_ext.tune.builder import fast_local_builder
from tvm_ext.targets import _cpuinfo
from tvm_ext.workloads import qnn_vnni as Q

import qnn_cases as C

AVX512 = {"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2}
AVXVNNI = {"kind": "llvm", "mcpu": "alderlake", "num-cores": 2}
_FLAGS = _cpuinfo().get("flags", set())
HOST_AVX512_VNNI = {"avx512_vnni", "avx512bw", "avx512f"} <= _FLAGS
HOST_AVX_VNNI = "avx_vnni" in _FLAGS


def _space(case, target):
    target = tvm.target.Target(target)
    ctx = ms.TuneContext(mod=case.mod, target=target, space_generator=R.vnni_space(target),
                         task_name=case.name, rand_state=1)
    return ctx, ctx.generate_design_space()


def _scheduled(case, target, seed=1):
    """One candidate of the first sketch with fresh random decisions, postprocessed."""
    ctx, sketches = _space(case, target)
    trace = Trace(sketches[0].trace.insts, {})
    for s in range(seed, seed + 20):
        sch = tvm.s_tir.Schedule(case.mod, seed=s)
        trace.apply_to_schedule(sch, remove_postproc=True)
        if all(p.apply(sch) for p in ctx.space_generator.postprocs):
            return sch
    raise AssertionError("no valid candidate in 20 samples")


def _asm(lib):
    return lib.mod.inspect_source("asm")


def test_packing_roundtrip_and_reference_in_range():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (1, 5, 6, 3)).astype(np.uint8)
    xp = Q.pack_activation(x, 4)
    assert xp.shape == (1, 1, 5, 6, 4) and not xp[..., 3].any()
    np.testing.assert_array_equal(Q.unpack_activation(xp, 3), x)
    w = rng.integers(-127, 128, (32, 3, 3, 32)).astype(np.int8)
    wp = Q.pack_conv_weight(w, 16)
    assert wp.shape == (2, 2, 3, 3, 4, 16, 4)
    # element (o, kh, kw, i) lands at [o//16, i//16, kh, kw, (i%16)//4, o%16, i%4]
    assert wp[1, 1, 2, 0, 3, 5, 2] == w[16 + 5, 2, 0, 16 + 3 * 4 + 2]
    ref = C.conv2d_case().reference()
    clipped = np.mean((ref == 0) | (ref == 255))
    assert clipped < 0.2 and ref.std() > 10  # activations neither saturated nor constant


@pytest.mark.parametrize("make", [C.conv2d_case, C.dense_case], ids=["conv", "dense"])
def test_case_reference_equals_the_unscheduled_kernel(make):
    """The fixtures' NumPy reference is what the kernel computes before any schedule
    (on every host: plain llvm), so the bit-exact VNNI tests compare with the truth."""
    case = make()
    np.testing.assert_array_equal(C.run_case(case, tvm.compile(case.mod, target="llvm")), case.reference())


def test_rules_only_on_vnni_targets():
    assert R.vnni_rules({"kind": "llvm"}) == []
    # AVX2 without VNNI: the AVX2 form, for annotated blocks only (test_avx2_u8s8.py)
    assert [r.intrin_name for r in R.vnni_rules({"kind": "llvm", "mcpu": "skylake-avx512"})] == [I.AVX2_INTRIN]
    assert R.vnni_rules({"kind": "cuda", "arch": "sm_80"}) == []
    assert R.vnni_postprocs({"kind": "llvm"}) == []
    assert I.vnni_intrin_name(AVX512) == I.AVX512_VNNI_INTRIN
    assert I.vnni_intrin_name(AVXVNNI) == I.AVX_VNNI_INTRIN
    assert I.vnni_intrin_name({"kind": "llvm", "mcpu": "znver4"}) == I.AVX512_VNNI_INTRIN
    (rule,) = R.vnni_rules(AVX512)
    assert isinstance(rule, V.VNNITensorize)
    rules, posts = R.with_vnni(ms.schedule_rule.ScheduleRule.create("llvm"),
                               ms.postproc.Postproc.create("llvm"), AVX512)
    names = [type(r).__name__ for r in rules]
    assert names.index("VNNITensorize") + 1 == names.index("MultiLevelTiling")
    pnames = [type(p).__name__ for p in posts]
    assert pnames.index("RewriteTensorize") == pnames.index("RewriteReductionBlock") + 1


@pytest.mark.parametrize("make", [C.conv2d_case, C.dense_case], ids=["conv", "dense"])
def test_every_sketch_tensorized_and_epilogue_fused(make):
    case = make()
    _, sketches = _space(case, AVX512)
    assert sketches
    for sch in sketches:
        func = sch.mod["main"]
        text = func.script()
        assert f'"meta_schedule.auto_tensorize": "{I.AVX512_VNNI_INTRIN}"' in text
        # the requantize block was folded into the accumulator write-back
        assert 'sblock("requantize")' not in text
        # one top-level loop nest holds the reduction and the epilogue
        root = func.body.block.body
        nests = list(root.seq) if isinstance(root, tirx.SeqStmt) else [root]
        writers = [s for s in nests if "requantize[" in str(s)]
        assert len(writers) == 1 and "auto_tensorize" in str(writers[0])


def test_nhwc_conv_is_left_to_plain_tiling():
    """The NHWC/HWIO conv of the seed cannot match the intrinsic: the rule steps aside."""
    data = te.placeholder((1, 8, 8, 32), "uint8", name="data")
    weight = te.placeholder((3, 3, 32, 32), "int8", name="weight")
    rc, rh, rw = te.reduce_axis((0, 32)), te.reduce_axis((0, 3)), te.reduce_axis((0, 3))
    conv = te.compute((1, 6, 6, 32), lambda n, h, w, o: te.sum(
        data[n, h + rh, w + rw, rc].astype("int32") * weight[rh, rw, rc, o].astype("int32"),
        axis=[rh, rw, rc]), name="conv")
    mod = tvm.IRModule({"main": te.create_prim_func([data, weight, conv])})
    target = tvm.target.Target(AVX512)
    ctx = ms.TuneContext(mod=mod, target=target, space_generator=R.vnni_space(target), task_name="nhwc")
    sketches = ctx.generate_design_space()
    assert sketches and all("auto_tensorize" not in s.mod.script() for s in sketches)
    assert all("meta_schedule.tiling_structure" in s.mod.script() for s in sketches)


def test_plain_dense_weight_is_left_to_plain_tiling():
    """A dense over an unpacked [N][K] int8 weight maps onto the 16x4 intrinsic by its
    iterators, but the weight tile is strided (row stride K): tensorizing it computed
    wrong sums (15 of 16 outputs, found by the equivalence corpus on a VNNI host). The
    rule must step aside; the packed layouts of qnn_vnni still qualify."""
    x = te.placeholder((1, 32), "uint8", name="x")
    w = te.placeholder((16, 32), "int8", name="w")
    k = te.reduce_axis((0, 32), name="k")
    dense = te.compute((1, 16), lambda i, j: te.sum(x[i, k].astype("int32") * w[j, k].astype("int32"), axis=k),
                       name="dense")
    mod = tvm.IRModule({"main": te.create_prim_func([x, w, dense])})
    sch = tvm.s_tir.Schedule(mod)
    assert not V.operands_packed(sch.get(sch.get_sblock("dense")))
    target = tvm.target.Target(AVX512)
    ctx = ms.TuneContext(mod=mod, target=target, space_generator=R.vnni_space(target), task_name="plain_dense")
    sketches = ctx.generate_design_space()
    assert sketches and all("auto_tensorize" not in s.mod.script() for s in sketches)
    for make, name in ((C.conv2d_case, "conv2d_nchwc_int8"), (C.dense_case, "dense_int8")):
        packed = tvm.s_tir.Schedule(make().mod)
        assert V.operands_packed(packed.get(packed.get_sblock(name))), name


@pytest.mark.parametrize("make", [C.conv2d_case, C.dense_case], ids=["conv", "dense"])
def test_avx512_vnni_bit_exact_and_vpdpbusd(make):
    case = make()
    sch = _scheduled(case, AVX512)
    assert f'tensor_intrin="{I.AVX512_VNNI_INTRIN}"' in str(sch.trace)
    assert "llvm.x86.avx512.vpdpbusd.512" in sch.mod.script()
    lib = tvm.compile(sch.mod, target=tvm.target.Target(AVX512))
    assert "vpdpbusd" in _asm(lib) and "zmm" in _asm(lib)
    if not HOST_AVX512_VNNI:
        pytest.skip("host has no AVX-512 VNNI: compiled, not run")
    np.testing.assert_array_equal(C.run_case(case, lib), case.reference())


def test_avx_vnni_bit_exact_and_vex_vpdpbusd():
    case = C.conv2d_case(h=9, w=9, c_in=3, c_out=16, stride=2, seed=3)  # stem-like, cb=4
    sch = _scheduled(case, AVXVNNI)
    assert f'tensor_intrin="{I.AVX_VNNI_INTRIN}"' in str(sch.trace)
    lib = tvm.compile(sch.mod, target=tvm.target.Target(AVXVNNI))
    asm = _asm(lib)
    assert "{vex}" in asm and "vpdpbusd" in asm and "zmm" not in asm
    if not HOST_AVX_VNNI:
        pytest.skip("host has no AVX-VNNI: compiled, not run")
    np.testing.assert_array_equal(C.run_case(case, lib), case.reference())


@pytest.mark.slow
@pytest.mark.parametrize("make", [C.conv2d_case, C.dense_case], ids=["conv", "dense"])
def test_tuned_with_rule_bit_exact(make):
    if not HOST_AVX512_VNNI:
        pytest.skip("host has no AVX-512 VNNI")
    case = make()
    target = tvm.target.Target(AVX512)
    with tempfile.TemporaryDirectory() as work_dir:
        db = ms.tune_tir(case.mod, target, work_dir, max_trials_global=4, num_trials_per_iter=4,
                         space=R.vnni_space(target), builder=fast_local_builder(),
                         runner=ms.runner.LocalRunner(timeout_sec=60))
        sch = ms.tir_integration.compile_tir(db, case.mod, target)
    assert sch is not None
    assert f'tensor_intrin="{I.AVX512_VNNI_INTRIN}"' in str(sch.trace)
    lib = tvm.compile(sch.mod, target=target)
    assert "vpdpbusd" in _asm(lib)
    np.testing.assert_array_equal(C.run_case(case, lib), case.reference())


def test_database_with_tensorized_records_opens_in_a_fresh_process(tmp_path):
    """JSONDatabase replays every trace on load; a trace naming our intrinsic failed with
    "TensorIntrin ... is not registered" in a process that had not built the space (bench
    --from-logs). tuning.open_database registers the intrinsics first."""
    import subprocess
    import sys

    case = C.dense_case()
    sch = _scheduled(case, AVX512)
    target = tvm.target.Target(AVX512)
    db = ms.database.JSONDatabase(work_dir=str(tmp_path), module_equality="structural")
    workload = db.commit_workload(case.mod)
    db.commit_tuning_record(ms.database.TuningRecord(
        sch.trace, workload, run_secs=[1e-4], target=target,
        args_info=ms.arg_info.ArgInfo.from_prim_func(case.mod["main"])))
    code = ("import sys; from tvm_ext import tune as tuning; db = tuning.open_database(sys.argv[1]); "
            "(r,) = db.get_all_tuning_records(); print(r.trace)")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert I.AVX512_VNNI_INTRIN in proc.stdout
