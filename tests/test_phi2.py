"""Phi-2 q4f16_1 workload on the reduced config (hidden 256, 4 heads x 64, MLP 1024,
vocab 1024, context 16): both fusion modes x {dlight, metaschedule, seeded} compile on llvm
and match the NumPy float64 reference (float32 compute: rtol = atol = 2e-3 on the logits);
the cuda build-only path compiles with nvcc.  No test asserts a timing."""
import shutil

import pytest

tvm = pytest.importorskip("tvm")

from tvm_ext.bench.phi2 import layer_bench as phi2_bench  # noqa: E402
from tvm_ext.bench.phi2 import kernels as pk  # noqa: E402
from tvm_ext.targets import cuda_target, resolve_target  # noqa: E402
from tvm_ext.tune.database import best_record, open_database, record_seconds, records_of  # noqa: E402
from tvm_ext.tune.kernels import kernel_database, measure_order, trials_to_beat, tune_kernels  # noqa: E402
from tvm_ext.tune.runner import make_runner  # noqa: E402
from tvm_ext import scheduling  # noqa: E402
from tvm_ext.tune import seeds  # noqa: E402
from tvm_ext.workloads.phi2 import kernels as phi2  # noqa: E402

CTX = 16


def _run(wl, pairs):
    """``pk.verify`` on ``wl``, which must leave ``wl.mod`` as it was (the module fixtures share it: a
    kernel substituted by one test would be what the next one checks)."""
    import tvm_ffi

    before = tvm_ffi.structural_hash(wl.mod)
    result = pk.verify(wl, pairs, "llvm", tvm.cpu(0))
    assert tvm_ffi.structural_hash(wl.mod) == before, "verify changed the workload's module"
    return result


@pytest.fixture(scope="module", params=[False, True], ids=["unfused", "fused"])
def decode(request):
    wl = phi2.build_decode(context=CTX, config="reduced", fusion=request.param)
    return wl, phi2.kernels(wl)


def test_registry_names():
    from tvm_ext import workloads

    assert "phi2-decode" in workloads.names() and "phi2-prefill" in workloads.names()


def test_fused_module_fuses_dequantize_with_epilogues():
    ks = phi2.kernels(phi2.build_decode(context=CTX, config="reduced", fusion=True))
    groups = {k.name: k.parts for k in ks.kernels if len(k.parts) > 1}
    # each of the 4 layer projections + lm_head is one kernel: dequantize + matmul + epilogues
    dq = [g for g in groups.values() if any(p.startswith("dequantize") for p in g)]
    assert len(dq) >= 4
    assert any("gelu_tanh" in g for g in dq)
    assert not any(k.name.startswith("dequantize") for k in ks.kernels)
    unfused = phi2.kernels(phi2.build_decode(context=CTX, config="reduced", fusion=False))
    names = {k.name for k in unfused.kernels}
    assert all(p in names for g in groups.values() for p in g)


def test_reference_unscheduled(decode):
    wl, _ = decode
    ok, msg = _run(wl, [])
    assert ok, msg


# the fused module is -m slow: dlight's GEMV schedules of its dequantize kernels take ~12 s of LLVM (as in
# test_phi2_model's scheduled generate, slow too); by default dlight's schedules are checked against the
# reference on the unfused decode module here and on both prefill modules (test_prefill_both_fusions_match_reference),
# the schedule each fused kernel gets in test_scheduling, our rules' fused kernels in test_dequant_gemv.
@pytest.mark.parametrize("fusion", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["unfused", "fused"])
def test_dlight(fusion):
    wl = phi2.build_decode(context=CTX, config="reduced", fusion=fusion)  # not the fixture's: its fused case is slow
    ks = phi2.kernels(wl)
    target = resolve_target("llvm")
    pairs, rules = [], set()
    for k in ks.kernels:
        m = pk.normalize(k.func)
        rule, sch = scheduling.dlight_schedule(m, target)
        rules.add(rule)
        if sch is not None:
            pairs.append((m, sch.mod))
    assert pairs, "no dlight rule applied to any kernel"
    ok, msg = _run(wl, pairs)
    assert ok, msg


def _small_kernels(ks, n=1):
    """The kernels with the fewest bytes moved (fast to tune)."""
    return sorted(ks.kernels, key=lambda k: pk.nbytes(k.func))[:n]


# tuning on top of a seeded database is the long variant (seeding itself is checked by
# test_seeded_without_tuning_is_dlight): -m slow; so is the unfused module (the same tuning
# path on other kernels, ~9 s), to keep the default run inside CI's budget
@pytest.mark.parametrize("fusion", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["fused", "unfused"])
@pytest.mark.parametrize("seeded", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["metaschedule", "seeded"])
def test_metaschedule(fusion, tmp_path, seeded):
    wl = phi2.build_decode(context=CTX, config="reduced", fusion=fusion)
    ks = phi2.kernels(wl)
    target = resolve_target("llvm")
    mods = {k.name: pk.normalize(k.func) for k in _small_kernels(ks)}
    db_dir = str(tmp_path / "db")
    trials = 2 + int(seeded)  # the seed record counts as one
    # the stack's plain LocalRunner, cache flushed before each run
    runner = make_runner(flush_cache=True)
    if seeded:  # as the bench seeds: the dlight kernels measured by the runner that then tunes
        dl = {n: scheduling.dlight_schedule(m, target) for n, m in mods.items()}
        seed_secs = pk.runner_seconds({n: (s.mod if s is not None else mods[n]) for n, (_, s) in dl.items()},
                                      target, runner)
        seeds.seed_database(kernel_database(db_dir), mods, dl, target, seed_secs)
    added = tune_kernels(mods, target, db_dir, trials, log_dir=str(tmp_path / "work"), per_iter=2,
                         runner=runner)
    db = open_database(db_dir)
    pairs = []
    for n, m in mods.items():
        assert added[n] == 2 == len(measure_order(db_dir, m))  # one entry per measured candidate
        assert len(records_of(db, m)) == trials
        # plain LocalRunner on llvm measures candidates (not "Unknown device: llvm" for every one)
        assert any(secs is not None and 0 < secs < 1.0 for secs in measure_order(db_dir, m))
        best = scheduling.best_schedule(db, m)
        assert best is not None, n
        pairs.append((m, best))
        if seeded:  # the best record is never slower than the dlight seed, both timed by one runner
            assert record_seconds(best_record(db, m)) <= seed_secs[n]
            continue
        assert trials_to_beat(db_dir, m, 1.0) in (1, 2)  # the first measured candidate beats 1 s
        assert trials_to_beat(db_dir, m, 0.0) is None  # nothing runs in no time
    # what a --from-logs bench reports as trials per kernel: the most records of any kernel
    assert phi2_bench.database_trials({False: {"metaschedule": db_dir}}) == trials
    ok, msg = _run(wl, pairs)
    assert ok, msg
    # resuming with the same budget measures nothing more
    again = tune_kernels(mods, target, db_dir, trials, log_dir=str(tmp_path / "work"))
    assert set(again.values()) == {0}
    assert all(len(records_of(open_database(db_dir), m)) == trials for m in mods.values())


def test_seeded_without_tuning_is_dlight(decode, tmp_path):
    _, ks = decode
    target = resolve_target("llvm")
    mods = {k.name: pk.normalize(k.func) for k in ks.kernels}
    dl = {n: scheduling.dlight_schedule(m, target) for n, m in mods.items()}
    db_dir = str(tmp_path / "db")
    db = kernel_database(db_dir)
    seeds.seed_database(db, mods, dl, target, {n: 1e-3 for n in mods})
    pairs = [(m, scheduling.best_schedule(db, m)) for m in mods.values()]
    assert phi2_bench.database_trials({True: {"metaschedule": db_dir}}) == 1  # one dlight record per kernel
    assert all(trials_to_beat(db_dir, m, 1.0) is None for m in mods.values())  # the seed was not measured
    for (m, best), (rule, sch) in zip(pairs, dl.values()):
        expect = sch.mod if sch is not None else m
        # the seeded database's best record replays to exactly the dlight schedule, whose numbers
        # test_dlight checks on the same module (compiling it again here took ~15 s of the default run;
        # the fused one's is -m slow)
        tvm.ir.assert_structural_equal(best["main"].body, expect["main"].body, map_free_vars=True)


def test_prefill_both_fusions_match_reference():
    for fusion in (False, True):
        wl = phi2.build_prefill(tokens=8, config="reduced", fusion=fusion)
        target = resolve_target("llvm")
        pairs = []
        for k in phi2.kernels(wl).kernels:
            m = pk.normalize(k.func)
            _, sch = scheduling.dlight_schedule(m, target)
            if sch is not None:
                pairs.append((m, sch.mod))
        ok, msg = _run(wl, pairs)
        assert ok, msg


@pytest.mark.slow  # ~2 min on 2 cores: 6 nvcc calls + MetaSchedule's 45 s tensor_intrin import
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_build_only_reduced(tmp_path):
    res = phi2_bench.run("phi2-decode", target=cuda_target("sm_80"), build_only=True,
                         config="reduced", context=CTX, tuning_dir=str(tmp_path), log=print)
    assert res["built"] > 0
    assert {k["schedule"] for k in res["kernels"]} == {"dlight", "metaschedule", "seeded"}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_dlight_fused_reduced_compiles_with_nvcc():
    """Fast part of the build-only path: every fused kernel under dlight gpu rules, one nvcc call."""
    target = cuda_target("sm_80")
    wl = phi2.build_decode(context=CTX, config="reduced", fusion=True, compute_dtype="float16")
    mods = {}
    for k in phi2.kernels(wl).kernels:
        m = pk.normalize(k.func)
        rule, sch = scheduling.dlight_schedule(m, target, scheduling.build_validator(target))
        assert sch is not None, f"{k.name}: no dlight gpu rule that builds ({rule})"
        mods[k.name] = sch.mod
    pk.nvcc_build(pk.combine(mods), target)  # raises with nvcc's error if it does not compile


def test_rows_and_table_from_given_times():
    """The bench's rows, fusion losses, targets and the CLI table, from made-up kernel times
    (metaschedule = half of dlight, seeded = dlight): the arithmetic, not a measurement."""
    from tvm_ext.cli.phi2_table import format_table

    _, kss = pk.kernelsets("phi2-decode", "reduced", CTX, 8, "float32")
    sec, rules, beat, verified = {}, {}, {}, {}
    for fusion in (False, True):
        rules[fusion] = {k.name: "GEMV" for k in kss[fusion].kernels}
        beat[fusion] = {"metaschedule": {k.name: 3 for k in kss[fusion].kernels}, "seeded": {}}
        for i, k in enumerate(kss[fusion].kernels):
            for s, scale in (("dlight", 1.0), ("metaschedule", 0.5), ("seeded", 1.0)):
                sec[(fusion, s, k.name)] = 1e-4 * (i + 1) * scale
        for s in phi2_bench.SCHEDULES:
            verified[(fusion, s)] = "ok"
    rows = phi2_bench._rows(kss, sec, 10.0, rules, beat, verified, ntok=1)
    assert len(rows) == 6
    off_dl = phi2_bench.row(rows, "off", "dlight")
    layer = [k for k in kss[False].kernels if k.part == "layer"]
    assert off_dl["layer_ms"] == pytest.approx(sum(sec[(False, "dlight", k.name)] * 1e3 * k.calls for k in layer))
    assert off_dl["bound_layer_ms"] == pytest.approx(sum(pk.nbytes(k.func) / 10.0 / 1e6 * k.calls for k in layer))
    assert off_dl["vs_dlight_off"] == 1.0
    assert phi2_bench.row(rows, "off", "metaschedule")["vs_dlight_off"] == pytest.approx(2.0)
    assert {k["trials_to_beat_dlight"] for k in phi2_bench.row(rows, "on", "metaschedule")["kernels"]} == {3}
    assert {k["trials_to_beat_dlight"] for k in phi2_bench.row(rows, "on", "seeded")["kernels"]} == {None}
    losses = phi2_bench._fusion_losses(rows)
    assert losses and all(len(loss["parts"]) >= 2 for loss in losses)
    assert all(loss["slower"] == (loss["fused_ms"] > loss["parts_ms"]) for loss in losses)
    targets = phi2_bench._targets(rows)
    assert targets["ms_over_dlight_fused"] == pytest.approx(0.5)
    assert targets["seeded_worst_kernel_vs_dlight"] == pytest.approx(1.0)
    assert targets["best_fused"] == "metaschedule" and targets["torch_bf16_over_best_fused"] is None
    result = {"workload": "phi2-decode", "target": "llvm", "device": "cpu", "threads": 2,
              "bandwidth_gbs": 10.0, "compute_dtype": "float32", "trials_per_kernel": 3, "rows": rows,
              "fusion_losses": losses, "targets": targets}
    lines = format_table(result).splitlines()
    assert lines[0].startswith("phi2-decode on llvm (cpu, 2 threads), compute dtype float32 (q4f32_1)")
    names = {k.name[:44] for ks in kss.values() for k in ks.kernels}
    # per-kernel rows: name, calls, copies, bound, hot, dlight, ms, seeded, dl rule, beat@ms, beat@seeded
    kernel_lines = [cells for cells in map(str.split, lines) if len(cells) == 11 and cells[0] in names]
    assert len(kernel_lines) == len(kss[False].kernels) + len(kss[True].kernels)
    assert all(cells[-2:] == ["3", "-"] for cells in kernel_lines)  # beat@ms, beat@sd


def test_a_tuned_pick_equal_to_the_untuned_schedule_is_one_binary_timed_once():
    """``measure.prepare`` builds a schedule structurally equal to an earlier row's once (``same_as``),
    ``with_twins`` gives it that row's seconds and the row says so: identical code in two rows differs
    by nothing, not by the host's noise."""
    import dataclasses

    import numpy as np

    from tvm_ext.bench.dram import CopyPlan
    from tvm_ext.bench.phi2 import measure as pm_measure

    _, kss = pk.kernelsets("phi2-decode", "reduced", CTX, 8, "float32")
    # the first 3 kernels of each module (one changed, two twins): every kernel more is built and checked
    # the same way (all 38 took ~12 s of the default run)
    kss = {fusion: dataclasses.replace(ks, kernels=ks.kernels[:3]) for fusion, ks in kss.items()}
    sched = {}
    for fusion in (False, True):
        mods = {k.name: tvm.IRModule({"main": k.func.with_attr("global_symbol", "main")}) for k in kss[fusion].kernels}
        other = dict(mods)
        name = kss[fusion].kernels[0].name
        other[name] = tvm.IRModule({"main": mods[name]["main"].with_attr("tirx.noalias", False)})  # a change
        sched[fusion] = {"dlight": mods, "rule": dict(mods), "seeded": other}
    from tvm_ext.workloads.phi2.layers import CONFIGS

    cfg = CONFIGS["reduced"]
    fns, _, _, _, same = pm_measure.prepare(kss, sched, ("dlight", "rule", "seeded"), resolve_target("llvm"),
                                            tvm.cpu(0), np.random.default_rng(0), CopyPlan(1 << 20), cfg,
                                            lambda m: None)
    for fusion in (False, True):
        first, *rest = dict.fromkeys(k.name for k in kss[fusion].kernels)
        assert (fusion, "seeded", first) in fns and (fusion, "seeded", first) not in same
        for name in rest:
            assert same[(fusion, "rule", name)] == "dlight" and same[(fusion, "seeded", name)] == "dlight"
            assert (fusion, "rule", name) not in fns
    times = {key: float(i) for i, key in enumerate(fns)}
    filled = pm_measure.with_twins(times, same)
    assert all(filled[key] == times[(f, twin, n)] for key, twin in same.items() for f, n in [(key[0], key[2])])


def test_rope_tables_survive_the_search_space():
    """The rope's cos/sin tables (one entry per token and frequency, shared by every head) are blocks of
    their own in MetaSchedule's design space, a static position (the kernel bench's) and a position tensor
    (the whole model's) both: AutoInline would put the trigonometry back into each of the heads x
    head_dim elements of every candidate (RandomComputeLocation may still inline them in a sampled one:
    a sampled choice, which the search measures)."""
    from tvm.s_tir import meta_schedule as ms

    from tvm_ext.rulesets import space
    from tvm_ext.tir_utils import blocks_of
    from tvm_ext.workloads.phi2 import model as pm

    target = resolve_target("llvm")
    ropes = [k.func for k in phi2.kernels(phi2.build_decode(context=4, config="reduced")).kernels
             if k.name == "rope"]
    layer = pm.build_model("reduced", layers=1, capacity=4).mod
    ropes += [f for gv, f in layer.functions_items() if gv.name_hint.startswith("rope")]
    assert len(ropes) >= 2
    for func in ropes:
        mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        kept = []
        for seed in range(4):
            ctx = ms.TuneContext(mod=mod, target=target, space_generator=space(target), task_name="rope",
                                 rand_state=seed)
            kept += [{"rope_cos", "rope_sin"} <= {b.name_hint for b in blocks_of(c.mod["main"])}
                     for c in ctx.generate_design_space()]
        assert any(kept)


def test_softmax_exp_accuracy_and_exact_zeros():
    """Phi-2's softmax exp (``layers._te_exp_nonpositive``) on x <= 0: within 2.5e-6 of NumPy's relative to the
    value over [-20, 0] and 5e-6 over [-87.6, -20], under 1.2e-38 below (subnormal results flushed), exactly 1
    at 0, exactly 0 below -88.02 and for the causal mask's -FLT_MAX."""
    import numpy as np
    from tvm import te

    from tvm_ext.workloads.phi2.layers import _te_exp_nonpositive

    x = te.placeholder((4096,), "float32", name="x")
    func = te.create_prim_func([x, _te_exp_nonpositive(x)])
    run = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target="llvm")["main"]
    xs = np.concatenate([np.linspace(-87.6, 0.0, 3990), np.linspace(-88.0, -87.7, 10),
                         [0.0, -88.03, -100.0, np.finfo("float32").min], np.zeros(92)]).astype("float32")
    out = tvm.runtime.tensor(np.zeros_like(xs))
    run(tvm.runtime.tensor(xs), out)
    got, want = out.numpy().astype("float64"), np.exp(xs.astype("float64"))
    rel = np.abs(got[:3990] - want[:3990]) / want[:3990]
    near = xs[:3990] >= -20
    assert np.max(rel[near]) < 2.5e-6 and np.max(rel[~near]) < 5e-6
    assert np.max(got[3990:4000]) < 1.2e-38
    assert got[4000] == 1.0 and (got[4001:4004] == 0.0).all()
