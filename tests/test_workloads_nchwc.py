"""resnet50-int8-nchwc: the network of resnet50-int8 emitted in the packed layouts that the
x86 VNNI rule tensorizes (tvm_ext/workloads/qnn_packed.py).

Untuned it equals the NumPy reference bit for bit; every conv task is one PrimFunc with
its requantize (and, where the NHWC network fuses it, the residual add); on a VNNI target
(cross-compiled only: this host need not have VNNI) the plugin's design space tensorizes
conv and dense tasks and their candidates assemble to vpdpbusd; on the host target the
plain rules schedule the same tasks and the network stays exact.
"""
import math

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms

import tvm_ext
from tvm_ext import tune as tuning, workloads
from tvm_ext.tune.sampling import sample_candidates
from tvm_ext.intrinsics.vnni import block_form, u8s8_intrin_name
from tvm_ext.rules import vnni_tensorize as V
from tvm_ext.targets import resolve_target
from tvm_ext.tir_utils import blocks_of, prim_funcs
from tvm_ext.workloads import resnet50_int8

IMAGE = 32
LLVM = tvm.target.Target("llvm")
VNNI = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})  # compiled, never run
KINDS = ("stem", "3x3", "residual", "dense")


@pytest.fixture(scope="module")
def packed():
    return workloads.get("resnet50-int8-nchwc", batch=1, image=IMAGE, seed=0)


@pytest.fixture(scope="module")
def vnni_tasks(packed):
    return tuning.extract_tasks(packed, VNNI)


def _func(task):
    (func,) = [f for _, f in prim_funcs(task.mod)]
    return func


def _block_names(task):
    return [b.name_hint for b in blocks_of(_func(task))]


def _shape(param):
    return [int(d) for d in param.shape]


def _conv_tasks(tasks):
    return [t for t in tasks if "conv2d_nchwc" in t.name]


def _pick(tasks, kind):
    """A task of each kind the VNNI rule must handle: the stem (NCHW4c input, 7x7/2 with
    padding), a padded 3x3 conv, a 1x1 conv with the residual add fused, the classifier."""
    def cb(t):
        return _shape(_func(t).params[0])[-1]

    convs = _conv_tasks(tasks)
    found = {
        "stem": [t for t in convs if cb(t) == 4],
        "3x3": [t for t in convs if cb(t) == 16 and "pad" in _block_names(t)],
        "residual": [t for t in convs if "T_add" in _block_names(t)],
        "dense": [t for t in tasks if "dense_packed" in t.name],
    }[kind]
    assert found, kind
    return found[0]


def _space(task, target):
    ctx = ms.TuneContext(mod=task.mod, target=target, space_generator=tvm_ext.space(target),
                         task_name=task.name, rand_state=1)
    return ctx, ctx.generate_design_space()


def _candidates(ctx, target, n):
    """``n`` candidates as the search samples them (fresh decisions, all postprocessors)."""
    schs = sample_candidates(ctx.mod, target, ctx.space_generator, n, seed=1, context=ctx,
                             postprocs=list(ctx.space_generator.postprocs))
    assert len(schs) == n, f"{len(schs)} of {n} candidates valid"
    return schs


def test_untuned_exact(packed):
    graph, inputs = resnet50_int8.network(batch=1, image=IMAGE, seed=0)
    assert packed.options == {"batch": 1, "image": IMAGE, "seed": 0}
    np.testing.assert_array_equal(packed.inputs[0], inputs[0])
    (x,) = packed.mod["main"].params
    assert [int(d) for d in x.ty.shape.values] == [1, IMAGE, IMAGE, 3]  # NHWC in; packed inside
    exe = relax.build(packed.mod, target=LLVM)
    vm = relax.VirtualMachine(exe, tvm.cpu())
    out = vm["main"](*(tvm.runtime.tensor(a) for a in packed.inputs)).numpy()
    assert out.shape == (1, 1000) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, packed.reference(inputs))  # resnet50-int8's graph, float32 epilogues
    assert 0 < np.abs(out.astype(int) - graph(inputs)).max() <= 40  # vs its fixed point: rounding drift
    ok, summary = packed.check(out)
    assert ok, summary
    assert len(np.unique(out)) > 10


def test_conv_tasks_are_packed_and_fuse_requantize_like_nhwc(vnni_tasks):
    convs = _conv_tasks(vnni_tasks)
    assert sum(t.weight for t in convs) == 53
    for task in convs:
        func, names = _func(task), _block_names(task)
        data, weight = _shape(func.params[0]), _shape(func.params[1])
        assert len(data) == 5 and data[-1] in (4, 16), (task.name, data)  # NCHW[x]c
        assert len(weight) == 7 and weight[-3:] == [data[-1] // 4, 16, 4], (task.name, weight)  # OIHW[x/4]i16o4i
        # conv, requantize (T_cast) and its constant-scalar zero point in this one PrimFunc
        assert "conv2d_nchwc_int8" in names and "T_cast" in names, (task.name, names)
        scalars = [b for b in blocks_of(func)
                   if not b.reads and len(b.writes) == 1 and math.prod(_shape(b.writes[0].source)) == 1]
        assert len(scalars) == (2 if "T_add" in names else 1), (task.name, names)
    nhwc = tuning.extract_tasks(resnet50_int8.build(batch=1, image=IMAGE, seed=0), VNNI)
    expected = {(t.name.replace("conv2d_nhwc", "conv2d_nchwc"), t.weight) for t in nhwc if "conv2d_nhwc" in t.name}
    assert {(t.name, t.weight) for t in convs} == expected  # same fusion groups, residual adds included
    assert sum(t.weight for t in convs if "T_add" in _block_names(t)) == 16


@pytest.mark.parametrize("kind", KINDS)
def test_vnni_space_tensorizes_and_assembles_to_vpdpbusd(vnni_tasks, kind):
    task = _pick(vnni_tasks, kind)
    ctx, sketches = _space(task, VNNI)
    assert sketches
    for sketch in sketches:
        text = sketch.mod.script()
        assert f'"meta_schedule.auto_tensorize": "{V.AVX512_VNNI_INTRIN}"' in text
        # requantize (and residual add) folded into the accumulator write-back
        assert 'sblock("T_cast")' not in text and 'sblock("T_add")' not in text
    # each sampled candidate, not just one: a padding inlined into the conv or a vector
    # loop around the intrinsic once undid the tensorization in about half of them
    for sch in _candidates(ctx, VNNI, 3):
        assert f'tensor_intrin="{V.AVX512_VNNI_INTRIN}"' in str(sch.trace)
        asm = tvm.compile(sch.mod, target=VNNI).mod.inspect_source("asm")
        assert "vpdpbusd" in asm and "zmm" in asm


@pytest.mark.slow  # ~10 s: tunes every packed task kind; test_untuned_exact checks the network by default
def test_host_plain_rules_schedule_exact(packed, tmp_path):
    """On the host (an AMD znver3 without VNNI where this was written) the plugin's rule
    set tensorizes every packed conv/dense: with vpmaddubsw the blocks annotated as safe for
    it, with the exact vpmaddwd form the others; candidates for each kind of task, applied
    through a tuning database, give the exact network."""
    host = resolve_target("llvm")
    rules = [type(r).__name__ for r in tvm_ext.default_rules(host)]
    assert ("VNNITensorize" in rules) == bool(u8s8_intrin_name(host))
    tasks = tuning.extract_tasks(packed, host)
    database = tuning.open_database(str(tmp_path))
    chosen = [_pick(tasks, kind) for kind in KINDS]
    for task in chosen:
        ctx, sketches = _space(task, host)
        annotated = any(V.annotated_pairs_fit(b) for b in blocks_of(_func(task)))
        intrin = u8s8_intrin_name(host)
        intrin = intrin and block_form(intrin, annotated)
        assert all(("auto_tensorize" in s.mod.script()) == (intrin is not None) for s in sketches)
        assert intrin is None or all(f'"{intrin}"' in s.mod.script() for s in sketches)
        (sch,) = _candidates(ctx, host, 1)
        workload = database.commit_workload(task.mod)
        args = ms.arg_info.ArgInfo.from_prim_func(task.mod["main"])
        database.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, [1e-3], host, args))
    scheduled = tuning.apply_database(packed, host, str(tmp_path))
    assert {name for name, f in prim_funcs(scheduled) if f.attrs and f.attrs.get("tirx.is_scheduled")} \
        == {t.name for t in chosen}
    vm = tuning.make_vm(tuning.compile_workload(packed, host, str(tmp_path)), host)
    ok, summary = packed.check(tuning.run_workload(vm, packed, host))
    assert ok, summary
