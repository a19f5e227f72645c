"""Phi-2 q4f16_1 workload on the reduced config (hidden 256, 4 heads x 64, MLP 1024,
vocab 1024, context 16): both fusion modes x {dlight, metaschedule, seeded} compile on llvm
and match the NumPy float64 reference (float32 compute: rtol = atol = 2e-3 on the logits);
the cuda build-only path compiles with nvcc.  No test asserts a timing."""
import os
import shutil

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm_ext.bench import phi2 as phi2_bench  # noqa: E402
from tvm_ext.workloads import phi2  # noqa: E402

CTX = 16


def _run(wl, pairs):
    return phi2_bench._verify(wl, pairs, "llvm", tvm.cpu(0))


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


def test_dlight(decode):
    wl, ks = decode
    target = phi2_bench.resolve_target("llvm")
    pairs, rules = [], set()
    for k in ks.kernels:
        m = phi2_bench.normalize(k.func)
        rule, sch = phi2_bench.dlight_schedule(m, target)
        rules.add(rule)
        if sch is not None:
            pairs.append((m, sch.mod))
    assert pairs, "no dlight rule applied to any kernel"
    ok, msg = _run(wl, pairs)
    assert ok, msg


def _small_kernels(ks, n=1):
    """The kernels with the fewest bytes moved (fast to tune)."""
    return sorted(ks.kernels, key=lambda k: phi2_bench._nbytes(k.func))[:n]


@pytest.mark.parametrize("seeded", [False, True], ids=["metaschedule", "seeded"])
def test_metaschedule(decode, tmp_path, seeded):
    wl, ks = decode
    target = phi2_bench.resolve_target("llvm")
    mods = {k.name: phi2_bench.normalize(k.func) for k in _small_kernels(ks)}
    db = phi2_bench.open_db(str(tmp_path / "db"))
    dl = {n: phi2_bench.dlight_schedule(m, target) for n, m in mods.items()}
    if seeded:
        phi2_bench.seed_database(db, mods, dl, target, {n: 1.0 for n in mods})  # 1 s: any tuned beats it
    phi2_bench.tune(db, mods, target, str(tmp_path / "work"), 2 + int(seeded), print, per_iter=2)
    pairs = []
    for n, m in mods.items():
        best = phi2_bench.best_schedule(db, m, target)
        assert best is not None, n
        pairs.append((m, best))
        if seeded:
            assert phi2_bench.trials_to_beat(db, m, 1.0, True) in (1, 2)
    # what a --from-logs bench reports as trials per kernel: the most records of any kernel
    most = max(len(db.get_top_k(db.commit_workload(m), 100)) for m in mods.values())
    assert phi2_bench._database_trials({False: {"metaschedule": db}}) == most <= 2 + int(seeded) + int(seeded)
    ok, msg = _run(wl, pairs)
    assert ok, msg


def test_seeded_without_tuning_is_dlight(decode, tmp_path):
    wl, ks = decode
    target = phi2_bench.resolve_target("llvm")
    mods = {k.name: phi2_bench.normalize(k.func) for k in ks.kernels}
    dl = {n: phi2_bench.dlight_schedule(m, target) for n, m in mods.items()}
    db = phi2_bench.open_db(str(tmp_path / "db"))
    phi2_bench.seed_database(db, mods, dl, target, {n: 1e-3 for n in mods})
    pairs = [(m, phi2_bench.best_schedule(db, m, target)) for m in mods.values()]
    assert phi2_bench._database_trials({True: {"metaschedule": db}}) == 1  # one dlight record per kernel
    for (m, best), (rule, sch) in zip(pairs, dl.values()):
        expect = sch.mod if sch is not None else m
        # the seeded database's best record replays to exactly the dlight schedule
        tvm.ir.assert_structural_equal(best["main"].body, expect["main"].body, map_free_vars=True)
    ok, msg = _run(wl, pairs)
    assert ok, msg


def test_prefill_both_fusions_match_reference():
    for fusion in (False, True):
        wl = phi2.build_prefill(tokens=8, config="reduced", fusion=fusion)
        target = phi2_bench.resolve_target("llvm")
        pairs = []
        for k in phi2.kernels(wl).kernels:
            m = phi2_bench.normalize(k.func)
            _, sch = phi2_bench.dlight_schedule(m, target)
            if sch is not None:
                pairs.append((m, sch.mod))
        ok, msg = _run(wl, pairs)
        assert ok, msg


@pytest.mark.slow  # ~2 min on 2 cores: 6 nvcc calls + MetaSchedule's 45 s tensor_intrin import
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_build_only_reduced(tmp_path):
    res = phi2_bench.run("phi2-decode", target=phi2_bench.cuda_target("sm_80"), build_only=True,
                         config="reduced", context=CTX, tuning_dir=str(tmp_path), log=print)
    assert res["built"] > 0
    assert {k["schedule"] for k in res["kernels"]} == {"dlight", "metaschedule", "seeded"}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_dlight_fused_reduced_compiles_with_nvcc():
    """Fast part of the build-only path: every fused kernel under dlight gpu rules, one nvcc call."""
    target = phi2_bench.cuda_target("sm_80")
    wl = phi2.build_decode(context=CTX, config="reduced", fusion=True, compute_dtype="float16")
    mods = {}
    for k in phi2.kernels(wl).kernels:
        m = phi2_bench.normalize(k.func)
        rule, sch = phi2_bench.dlight_schedule(m, target, phi2_bench._validate_build(target))
        assert sch is not None, f"{k.name}: no dlight gpu rule that builds ({rule})"
        mods[k.name] = sch.mod
    assert phi2_bench.build_cuda_with_nvcc(phi2_bench.combine(mods), target) > 0
