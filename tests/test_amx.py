"""AMX tensorization (issue 17): intrinsics, rule, tile-config postproc, permission.

On every machine the kernels are cross-compiled for Sapphire Rapids through the rule and
every sampled candidate's assembly must hold the tile instructions; on a host whose
/proc/cpuinfo shows amx_tile they also run, bit for bit against NumPy. Shapes are chosen
so that the tile rows do not divide 16 (14- and 7-column convs, an 8-row dense) and a
dense with one K tile (its init is not split off by RewriteReductionBlock).
"""
import numpy as np
import pytest
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Trace

import tir_kernels  # noqa: F401  (imports TVM's tensor intrinsics the fast way)
import qnn_cases as C
from tvm_ext import amx
from tvm_ext import rulesets as R
from tvm_ext.intrinsics import amx as I
from tvm_ext.rules.amx_tensorize import AMXTensorize
from tvm_ext.targets import _cpuinfo
from tvm_ext.workloads import qnn_amx as QA
from tvm_ext.workloads import qnn_vnni as QV

SPR = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2}
# what the llvm preset gives on a Sapphire Rapids guest that LLVM names rocketlake
GUEST = {"kind": "llvm", "mcpu": "rocketlake", "mattr": ["+amx-tile", "+amx-int8", "+amx-bf16"], "num-cores": 2}
HOST_AMX = "amx_tile" in _cpuinfo().get("flags", set())
NO_AMX = "no amx_tile in /proc/cpuinfo"

CASES = {
    # name: (case factory, intrinsics the rule offers, each with its own sketches)
    "conv14": (lambda: C.conv2d_case(h=14, w=14, c_in=64, c_out=32, cb=64),
               [I.dot_intrin(14, 1, "k4t3"), I.dot_intrin(14, 1, "k4")]),
    "conv7_s2": (lambda: C.conv2d_case(h=14, w=14, c_in=128, c_out=16, cb=64, stride=2, seed=2),
                 [I.dot_intrin(7, 2, "k4c2"), I.dot_intrin(7, 2, "k4t3"), I.dot_intrin(7, 2, "k4")]),
    # 1x1 over 4 input-channel blocks: the C tile stays in tmm0 for the 4 (k4c4)
    "conv7_c4": (lambda: C.conv2d_case(h=7, w=7, c_in=256, c_out=32, kh=1, kw=1, pad=0, cb=64, seed=5),
                 [I.dot_intrin(7, 1, "k4c4"), I.dot_intrin(7, 1, "k4")]),
    "dense8": (lambda: C.dense_case(m=8, n=48, k=128), [I.dot_intrin(8, 1, "k")]),
    "dense_k64": (lambda: C.dense_case(m=12, n=32, k=64, seed=3), [I.dot_intrin(12, 1, "k")]),
}


def _block(case):
    sch = tvm.s_tir.Schedule(case.mod)
    name = "dense_int8" if "dense" in case.name else "conv2d_nchwc_int8"
    return sch, sch.get_sblock(name)


def _candidates(case, target, per_sketch: int):
    """``per_sketch`` postprocessed candidates of every sketch of the AMX space."""
    return _mod_candidates(case.mod, target, per_sketch, R.amx_space)


def _mod_candidates(mod, target, per_sketch: int, space):
    target = tvm.target.Target(target)
    ctx = ms.TuneContext(mod=mod, target=target, space_generator=space(target), task_name="amx", rand_state=1)
    sketches = ctx.generate_design_space()
    assert sketches
    out = []
    for sketch in sketches:
        trace = Trace(sketch.trace.insts, {})
        got = 0
        for seed in range(1, 4 * per_sketch + 1):
            sch = tvm.s_tir.Schedule(mod, seed=seed)
            trace.apply_to_schedule(sch, remove_postproc=True)
            if all(p.apply(sch) for p in ctx.space_generator.postprocs):
                out.append(sch)
                got += 1
                if got == per_sketch:
                    break
        assert got == per_sketch, f"only {got} valid candidates of a sketch in {4 * per_sketch} samples"
    return out


# --------------------------------------------------------------------------- intrinsics
def test_tile_config_layout_and_init_words():
    """The config bytes follow the SDM layout; the init intrinsic stores exactly them."""
    cfg = I.tile_config_bytes(14)
    assert len(cfg) == 64 and cfg[0] == 1 and cfg[1] == 0
    # colsb (uint16 LE) of tiles 0, 1, 2 = 64 bytes; rows: C and A 14, B 16; all else 0
    assert cfg[16:22] == [64, 0, 64, 0, 64, 0] and cfg[48:51] == [14, 14, 16]
    assert not any(cfg[2:16]) and not any(cfg[22:48]) and not any(cfg[51:])
    words = [int.from_bytes(bytes(cfg[8 * w: 8 * w + 8]), "little") for w in range(8)]
    impl = I._make_init(14)[1]
    text = impl.script()
    assert [w for w in range(8) if words[w]] == [0, 2, 6]
    assert f"T.uint64({words[0]})" in text and f"T.uint64({words[2]})" in text
    # the rows word is an expression of rows in the template: LLVM folds it to the constant
    lib = tvm.compile(tvm.IRModule({"main": impl.with_attr("global_symbol", "main")}),
                      target=tvm.target.Target(SPR))
    asm = lib.mod.inspect_source("asm")
    assert str(words[6]) in asm or hex(words[6]) in asm, "rows word not in the config stores"
    assert "ldtilecfg" in asm and "tilezero" in asm and "tilestored" in asm
    # the thread's config is read back first: ldtilecfg (~290 cycles) only where it differs
    assert "sttilecfg" in asm


def test_intrinsic_names_and_bad_variants():
    name = I.register_dot(14, 2, "k4")
    assert name == I.dot_intrin(14, 2, "k4") and tvm.s_tir.TensorIntrin.get(name) is not None
    assert I.init_for_dot(name) == I.init_intrin(14)
    assert tvm.s_tir.TensorIntrin.get(I.init_intrin(14)) is not None
    for bad in ((0, 1, "k"), (17, 1, "k"), (16, 3, "k"), (16, 1, "kk")):
        with pytest.raises(ValueError):
            I.register_dot(*bad)


# --------------------------------------------------------------------------- rule choice
@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_picks_the_tile_shape(name):
    make, intrins = CASES[name]
    sch, block = _block(make())
    assert AMXTensorize().choose_intrins(sch, block) == intrins
    assert AMXTensorize().choose_intrin(sch, block) == intrins[-1]  # the one-dot variant


def test_rule_leaves_what_it_cannot_tile():
    rule = AMXTensorize()
    # VNNI's NCHW16c layout (16 input channels per block: 16 k per row, AMX wants 64)
    for case in (C.conv2d_case(c_in=32, c_out=32), C.conv2d_case(h=9, w=9, c_in=3, c_out=16, stride=2),
                 C.dense_case(m=1, n=32, k=128),    # one row: a GEMV, VNNI does better
                 C.dense_case(m=8, n=32, k=96)):    # K not a multiple of 64
        sch, block = _block(case)
        assert rule.choose_intrin(sch, block) is None, case.name
    # NHWC/HWIO conv: the weight is not in a packed layout at all
    data = te.placeholder((1, 8, 16, 64), "uint8", name="data")
    weight = te.placeholder((3, 3, 64, 32), "int8", name="weight")
    rc, rh, rw = te.reduce_axis((0, 64)), te.reduce_axis((0, 3)), te.reduce_axis((0, 3))
    conv = te.compute((1, 6, 14, 32), lambda n, h, w, o: te.sum(
        data[n, h + rh, w + rw, rc].astype("int32") * weight[rh, rw, rc, o].astype("int32"),
        axis=[rh, rw, rc]), name="conv")
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([data, weight, conv])}))
    assert rule.choose_intrin(sch, sch.get_sblock("conv")) is None
    target = tvm.target.Target(SPR)
    ctx = ms.TuneContext(mod=sch.mod, target=target, space_generator=R.amx_space(target), task_name="nhwc")
    sketches = ctx.generate_design_space()
    assert sketches and all("amx_tdpbusd" not in s.mod.script() for s in sketches)


def test_rule_sets_put_amx_first_on_amx_targets():
    rules, posts = R.with_cpu_tensorization(ms.schedule_rule.ScheduleRule.create("llvm"),
                                            ms.postproc.Postproc.create("llvm"), SPR)
    names = [type(r).__name__ for r in rules]
    assert names.index("AMXTensorize") + 1 == names.index("VNNITensorize") < names.index("MultiLevelTiling")
    pnames = [type(p).__name__ for p in posts]
    assert pnames.index("RewriteReductionBlock") + 1 == pnames.index("AMXTileConfig") < pnames.index("RewriteTensorize")
    # the preset of an AMX guest named rocketlake gets the AMX pieces too; others do not
    assert "AMXTensorize" in [type(r).__name__ for r in R.default_rules(tvm.target.Target(GUEST))]
    assert "AMXTileConfig" in [type(p).__name__ for p in R.default_postprocs(tvm.target.Target(GUEST))]
    for other in ({"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2}, {"kind": "llvm", "num-cores": 2}):
        t = tvm.target.Target(other)
        assert "AMXTensorize" not in [type(r).__name__ for r in R.default_rules(t)]
        assert "AMXTileConfig" not in [type(p).__name__ for p in R.default_postprocs(t)]
    assert "AMXTensorize" not in [type(r).__name__ for r in R.default_rules(tvm.target.Target(SPR), "upstream")]


# --------------------------------------------------------------------------- candidates
def _used(sch, intrins) -> str:
    """The one of ``intrins`` that the candidate was tensorized with (and its init)."""
    trace = str(sch.trace)
    used = [i for i in intrins if f'tensor_intrin="{i}"' in trace]
    assert len(used) == 1, (intrins, used)
    assert f'tensor_intrin="{I.init_for_dot(used[0])}"' in trace
    return used[0]


def _check_asm(sch, target, intrins):
    _used(sch, intrins)
    lib = tvm.compile(sch.mod, target=tvm.target.Target(target))
    asm = lib.mod.inspect_source("asm")
    for instr in ("tdpbusd", "tileloadd", "tilestored", "ldtilecfg"):
        assert instr in asm, instr
    return lib


@pytest.mark.parametrize("name", ["conv14", "dense8", "dense_k64"])
def test_every_sampled_candidate_has_tile_instructions(name):
    make, intrins = CASES[name]
    case = make()
    schs = _candidates(case, SPR, per_sketch=1)
    for sch in schs:
        _check_asm(sch, SPR, intrins)
    assert {_used(sch, intrins) for sch in schs} == set(intrins)  # every variant has sketches


@pytest.mark.slow
@pytest.mark.parametrize("target", [SPR, GUEST], ids=["sapphirerapids", "rocketlake+amx"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_candidates_tile_instructions_and_bit_exact(name, target):
    """Three candidates of every sketch, both AMX targets; run where the host has AMX."""
    make, intrins = CASES[name]
    case = make()
    libs = [_check_asm(sch, target, intrins) for sch in _candidates(case, target, per_sketch=3)]
    if not HOST_AMX:
        pytest.skip(NO_AMX)
    amx.request_amx()
    for lib in libs:
        np.testing.assert_array_equal(C.run_case(case, lib), case.reference())


@pytest.mark.parametrize("name", sorted(CASES))
def test_bit_exact_on_amx_host(name):
    if not HOST_AMX:
        pytest.skip(NO_AMX)
    make, intrins = CASES[name]
    case = make()
    amx.request_amx()
    for sch in _candidates(case, SPR, per_sketch=1):
        lib = _check_asm(sch, SPR, intrins)
        np.testing.assert_array_equal(C.run_case(case, lib), case.reference())


# --------------------------------------------------------------------------- emulated, on every host
HOST = {"kind": "llvm", "num-cores": 2}


def _emulated_space(target):
    """TVM's llvm rules and postprocs with the AMX rule on the plain-code twins of the
    intrinsics (``AMXTensorize(emulated=True)``) and AMXTileConfig: runs on any x86 host."""
    from tvm.s_tir.meta_schedule.space_generator import PostOrderApply

    from tvm_ext.postprocs.amx_tile_config import AMXTileConfig

    rules = list(ms.schedule_rule.ScheduleRule.create("llvm"))
    rules.insert([type(r).__name__ for r in rules].index("MultiLevelTiling"), AMXTensorize(emulated=True))
    posts = list(ms.postproc.Postproc.create("llvm"))
    posts.insert([type(p).__name__ for p in posts].index("RewriteReductionBlock") + 1, AMXTileConfig())
    return PostOrderApply(sch_rules=rules, postprocs=posts, mutator_probs="llvm")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in ("conv7_s2", "dense_k64") else n
                                  for n in sorted(CASES)])
def test_emulated_tiles_bit_exact(name):
    """The rule's candidates with the emulated intrinsics (the tile addresses, strides and
    layouts of the real ones, tdpbusd's arithmetic in plain code) equal NumPy: what is left
    unchecked on a host without AMX is the instructions themselves."""
    make, intrins = CASES[name]
    case = make()
    emulated = [i + "_emu" for i in intrins]
    schs = _mod_candidates(case.mod, HOST, 1, _emulated_space)
    assert {_used(sch, emulated) for sch in schs} == set(emulated)  # every variant ran
    for sch in schs:
        lib = tvm.compile(sch.mod, target=tvm.target.Target(HOST))
        np.testing.assert_array_equal(C.run_case(case, lib), case.reference())


# --------------------------------------------------------------------------- the AMX network layout
def _conv64(h, w, cin, cout, k, stride, zp=5, seed=4):
    """(mod, args, reference) of qnn_amx's conv: NCHW64c in and out, OIHW16i16o4i weights."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (1, h, w, cin)).astype(np.uint8)
    wt = rng.integers(-127, 128, (cout, k, k, cin)).astype(np.int8)
    data = te.placeholder((1, cin // 64, h, w, 64), "uint8", name="data")
    weight = te.placeholder((cout // 16, cin // 64, k, k, 16, 16, 4), "int8", name="weight")
    acc = QA.conv2d_nchwc_acc_ob(data, weight, stride=stride, pad=k // 2, zp_x=zp)
    mod = tvm.IRModule({"main": te.create_prim_func([data, weight, acc])})
    pad = k // 2
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    xpad = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), constant_values=zp).astype(np.int64)
    ref = sum(np.einsum("nhwc,oc->nhwo", xpad[:, i:i + stride * oh:stride, j:j + stride * ow:stride, :],
                        wt[:, i, j, :].astype(np.int64)) for i in range(k) for j in range(k))
    args = [QV.pack_activation(x, 64), QV.pack_conv_weight(wt, 64)]
    return mod, args, [int(d) for d in acc.shape], ref


def _run_conv64(lib, args, shape):
    out = tvm.runtime.tensor(np.zeros(shape, np.int32))
    lib(*(tvm.runtime.tensor(a) for a in args), out)
    return QV.unpack_activation(out.numpy())


def test_conv_with_64_channel_output_blocks_matches_numpy():
    """qnn_amx's conv computes the plain conv: built for the host with plain code."""
    mod, args, shape, ref = _conv64(6, 5, 64, 128, 3, 1)
    assert shape == [1, 2, 6, 5, 64]
    np.testing.assert_array_equal(_run_conv64(tvm.compile(mod, target="llvm"), args, shape), ref)


def test_emulated_tiles_of_network_conv_bit_exact():
    """The network's conv layout (64-channel output blocks: C rows 256 bytes apart, two
    input-channel blocks) through the rule with the emulated intrinsics equals NumPy."""
    mod, args, shape, ref = _conv64(7, 7, 128, 64, 3, 1)
    schs = _mod_candidates(mod, HOST, 1, _emulated_space)
    forms = ("k4c2", "k4t3", "k4")  # two input-channel blocks: the chained form too
    assert {_used(sch, [I.dot_intrin(7, 1, f, emulated=True) for f in forms]) for sch in schs} == {
        I.dot_intrin(7, 1, f, emulated=True) for f in forms}
    for sch in schs:
        np.testing.assert_array_equal(_run_conv64(tvm.compile(sch.mod, target=tvm.target.Target(HOST)), args,
                                                  shape), ref)


def test_network_conv_layouts_tensorize_with_amx():
    """The convs of resnet50-int8-amx at 224 (14-column 3x3, 7-column 1x1, stride 2 with a
    64-channel output block) are picked by the rule and assemble to tile instructions."""
    rule = AMXTensorize()
    for h, cin, cout, stride, k, intrin in [(14, 256, 256, 1, 3, I.dot_intrin(14, 1, "k4")),
                                            (14, 512, 128, 2, 1, I.dot_intrin(7, 2, "k4"))]:
        data = te.placeholder((1, cin // 64, h, h, 64), "uint8", name="data")
        weight = te.placeholder((cout // 16, cin // 64, k, k, 16, 16, 4), "int8", name="weight")
        acc = QA.conv2d_nchwc_acc_ob(data, weight, stride=stride, pad=k // 2, zp_x=3)
        mod = tvm.IRModule({"main": te.create_prim_func([data, weight, acc])})
        sch = tvm.s_tir.Schedule(mod)
        assert rule.choose_intrin(sch, sch.get_sblock("conv2d_nchwc_int8")) == intrin
    for sch in _mod_candidates(mod, SPR, 1, R.amx_space):
        _check_asm(sch, SPR, [intrin, intrin.replace("_k4", "_k4t3"), intrin.replace("_k4", "_k4c4")])


@pytest.mark.slow
def test_amx_network_untuned_exact_and_tasks():
    """resnet50-int8-amx (small images) equals its NumPy reference untuned: resnet50-int8's
    graph with float32 epilogues (qnn_float), a few rounding steps from the fixed-point one;
    the rule tensorizes its 53 convs where the layout and width allow."""
    from tvm import relax

    from tvm_ext import tune as tuning
    from tvm_ext.workloads import resnet50_int8

    wl = QA.build_resnet50(batch=1, image=32, seed=0)
    graph, inputs = resnet50_int8.network(batch=1, image=32, seed=0)
    vm = relax.VirtualMachine(relax.build(wl.mod, target=tvm.target.Target("llvm")), tvm.cpu())
    out = vm["main"](*(tvm.runtime.tensor(a) for a in wl.inputs)).numpy()
    np.testing.assert_array_equal(out, wl.reference(inputs))
    assert 0 < np.abs(out.astype(int) - graph(inputs)).max() <= 40  # rounding differences grow with depth
    assert len(np.unique(out)) > 10
    tasks = [t for t in tuning.extract_tasks(wl, tvm.target.Target(SPR)) if "conv2d_nchwc" in t.name]
    assert sum(t.weight for t in tasks) == 53
    # every conv fused with its epilogue; the 16 residual adds computing their conv's requantize
    # in int32 (fold_requantize: no uint8 round trip, same values as the reference above)
    assert all(t.name.startswith("fused_") for t in tasks)
    assert sum(t.weight for t in tasks if "requantize_add_requantize" in t.name) == 16
    assert not any("_add_requantize" in t.name and "requantize_add" not in t.name for t in tasks)
    rule = AMXTensorize()
    for task in tasks:
        sch = tvm.s_tir.Schedule(task.mod)
        block = sch.get_sblock("conv2d_nchwc_int8")
        stmt = sch.get(block)
        out_width = int(stmt.writes[0].source.shape[-2])
        in_block = max(int(r.source.shape[-1]) for r in stmt.reads if str(r.source.dtype) == "uint8")
        expected = in_block == 64 and out_width >= 4  # the stem reads NCHW4c; 1- and 2-wide rows are VNNI's
        assert (rule.choose_intrin(sch, block) is not None) == expected, task.name


# --------------------------------------------------------------------------- permission
def test_permission_refused_is_one_clear_line():
    if HOST_AMX:
        amx.request_amx()  # granted: nothing raised, and again (once per process)
        amx.request_amx()
        return
    for _ in range(2):  # asked once; the same error every time
        with pytest.raises(amx.AMXUnavailable) as info:
            amx.request_amx()
        msg = str(info.value)
        assert msg.startswith("AMX unavailable") and "\n" not in msg
    assert isinstance(info.value, ValueError)  # the CLI prints it as one line, exit 2
    assert amx.request_amx_if_host_has_it() is None  # no amx_tile here: nothing asked


def test_permission_request_with_a_fake_kernel(monkeypatch):
    import ctypes

    calls = []

    def kernel(errno):
        def syscall(*args):
            calls.append(tuple(int(a.value) for a in args))
            ctypes.set_errno(errno)
            return 0 if errno == 0 else -1
        return syscall

    assert amx._ask(kernel(0)) is None
    assert calls[-1] == (158, 0x1023, 18)
    old = amx._ask(kernel(22))
    assert "older than 5.16" in old and "\n" not in old
    assert "no AMX tile data" in amx._ask(kernel(95))
    monkeypatch.setattr(amx.sys, "platform", "darwin")
    assert "needs Linux" in amx._ask(kernel(0))
    monkeypatch.setattr(amx.sys, "platform", "linux")
    monkeypatch.setattr(amx.platform, "machine", lambda: "aarch64")
    assert "x86_64" in amx._ask(kernel(0))


def test_runner_workers_ask_for_amx(monkeypatch):
    """make_runner gives LocalRunner the AMX initializer, a closure that needs nothing of
    tvm_ext in the worker (cloudpickle sends it by value) and never raises."""
    from tvm_ext.tune import runner as tune_runner

    made = {}
    monkeypatch.setattr(tune_runner.ms.runner, "LocalRunner", lambda **kw: made.update(kw) or "runner")
    assert tune_runner.make_runner() == "runner"
    init = made["initializer"]
    assert "make_runner_initializer" in init.__qualname__
    assert not any(name.startswith("tvm_ext") for name in init.__code__.co_names)
    import cloudpickle

    cloudpickle.loads(cloudpickle.dumps(init))()  # asks where the host has AMX, else a no-op


def test_modules_run_in_process_ask_first(monkeypatch):
    """make_vm (bench, tune's comparison, import-onnx) asks for AMX on AMX targets only;
    a refusal is the one-line error, before any tile instruction could run."""
    from tvm_ext.tune.apply import make_vm

    monkeypatch.setattr(amx, "_state", {"error": "AMX unavailable: refused (simulated)"})
    with pytest.raises(amx.AMXUnavailable, match="simulated"):
        make_vm(None, tvm.target.Target(SPR))
    with pytest.raises(Exception) as info:  # no AMX asked: fails on the missing executable
        make_vm(None, tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake"}))
    assert not isinstance(info.value, amx.AMXUnavailable)
