"""Phi-2 decode bench, issue 19: DRAM-honest measurement (LLC size from the OS, weight copies
exceeding it), ORT MatMulNBits peers on our exact q4 weights, the JSON fields and table,
and the seeded database's dlight records measured by the tuning runner.  No test asserts a
timing."""
import json
import os
import shutil
from types import SimpleNamespace

import numpy as np

import pytest

tvm = pytest.importorskip("tvm")

from tvm_ext.bench import dram  # noqa: E402
from tvm_ext.bench.phi2 import layer_bench as phi2_bench  # noqa: E402
from tvm_ext.bench.phi2 import kernels as pk  # noqa: E402
from tvm_ext.bench.phi2 import measure as pm  # noqa: E402
from tvm_ext.bench.phi2 import peers as pp  # noqa: E402
from tvm_ext.targets import resolve_target  # noqa: E402
from tvm_ext.workloads.phi2 import kernels as phi2  # noqa: E402

CTX = 16
CFG = phi2.CONFIGS["reduced"]


@pytest.fixture(scope="module")
def fused():
    wl = phi2.build_decode(context=CTX, config="reduced", fusion=True)
    ks = phi2.kernels(wl)
    return ks, pk.weight_positions(ks)


# ----------------------------------------------------------------------------- LLC and copies
def _fake_cache(root, caches):
    for i, (level, kind, size) in enumerate(caches):
        d = root / "cpu0" / "cache" / f"index{i}"
        d.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (d / name).write_text(f"{value}\n")


def test_llc_read_from_sysfs(tmp_path):
    _fake_cache(tmp_path, [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "512K"),
                           (3, "Unified", "32768K")])
    assert dram.llc_bytes(str(tmp_path)) == (32 * 2**20, "sysfs")
    other = tmp_path / "l2only"
    _fake_cache(other, [(1, "Data", "48K"), (2, "Unified", "2M"), (2, "Instruction", "8M")])
    assert dram.llc_bytes(str(other)) == (2 * 2**20, "sysfs")  # instruction caches do not count


def test_llc_falls_back_when_sysfs_is_missing(tmp_path):
    llc, source = dram.llc_bytes(str(tmp_path / "none"))
    assert source in ("lscpu", "getconf", "default") and llc > 0


def test_parse_size():
    assert [dram.parse_size(t) for t in ("32768K", "32M", "32 MiB", "1024", "1.5 MiB")] == \
        [2**25, 2**25, 2**25, 1024, 3 * 2**19]
    assert dram.parse_size("lots") is None


@pytest.mark.parametrize("nbytes", [1, 150_000, 11 * 2**20, 40 * 2**20, 70 * 2**20])
def test_copies_exceed_twice_the_llc(nbytes):
    llc = 32 * 2**20
    c = dram.copies_for(nbytes, llc)
    assert c * nbytes >= 2 * llc
    assert c == 1 or (c - 1) * nbytes < 2 * llc  # no more than needed


def test_copy_plan_fits_the_memory(tmp_path):
    """A 480 MiB LLC with 23 GiB of memory (a host where 40 runtimes x 2x-LLC copies were
    killed for memory): each runtime gets a smaller cycle, the sweep is on, and all copies plus
    the sweep buffer fit in the memory share; a 32 MiB LLC keeps the full cycle, no sweep."""
    llc, avail = 480 * 2**20, 23 * 2**30
    small = dram.CopyPlan.within_memory(32 * 2**20, 40, available=avail)
    assert not small.sweep and small.cycle_bytes == 2 * 32 * 2**20
    big = dram.CopyPlan.within_memory(llc, 40, available=avail)
    assert big.sweep and big.cycle_bytes < 2 * llc
    assert 40 * big.cycle_bytes + 2 * llc <= dram.MEMORY_SHARE * avail
    assert big.copies(11 * 2**20) * 11 * 2**20 >= big.cycle_bytes
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683820 kB\nMemAvailable:   24358756 kB\n")
    assert dram.available_memory(str(meminfo)) == 24358756 * 1024
    assert dram.available_memory(str(tmp_path / "none")) is None


def test_sweep_reads_twice_the_llc_only_when_on():
    """``evict`` reads all of a buffer of 2x the LLC when the plan sweeps, and allocates nothing
    when it does not; ``as_plan`` takes an LLC size as the plain plan."""
    plain = dram.as_plan(2**20)
    plain.evict()
    assert not plain.sweep and plain._buffer is None
    plan = dram.CopyPlan(2**20, cycle_bytes=2**19)
    assert dram.as_plan(plan) is plan
    plan.evict()
    assert plan._buffer.nbytes == 2 * 2**20 and plan._sum == 2 * 2**20 // 8  # every element read
    assert plan.seconds_per_call(lambda: None, [()]) >= 0


def test_cpu_info_names_the_cpu():
    info = dram.cpu_info()
    assert info["name"] and all(f.startswith(dram.FLAG_PREFIXES) for f in info["flags"])


# ----------------------------------------------------------------------------- weights and projections
def test_weight_positions_and_projections(fused):
    ks, positions = fused
    found = {}
    for k in ks.kernels:
        names = [k.func.params[i].name for i in positions[k.name]]
        proj = pp.projection_of(k.name, k.func, k.part, CFG, positions[k.name])
        if proj:
            found[proj] = k.name
            assert [str(k.func.params[i].dtype) for i in positions[k.name]] == ["uint32", "float16", "float32"]
        elif "concatenate" in k.name:
            assert names and all("cache" in n for n in names)  # the KV cache streams too
        elif k.name in ("rope", "softmax", "attn_score", "attn_value"):
            assert names == []  # activations only
    assert set(found) == set(pp.PROJECTIONS)
    assert "gelu" in found["fc1"] and found["lm_head"] != found["fc1"]  # same shape, told apart by part
    unfused = phi2.kernels(phi2.build_decode(context=CTX, config="reduced", fusion=False))
    upos = pk.weight_positions(unfused)
    uproj = {pp.projection_of(k.name, k.func, k.part, CFG, upos[k.name]) for k in unfused.kernels}
    assert uproj - {None} == set(pp.PROJECTIONS)  # the matmuls on the dequantized (constant-derived) matrix


def test_kernel_copies_are_distinct_and_exceed_llc(fused):
    ks, positions = fused
    k = next(k for k in ks.kernels if "dequantize1_matmul2" in k.name)  # o projection
    llc = 2**20
    a = pm.KernelArgs(k.func, positions[k.name], llc, tvm.cpu(0), np.random.default_rng(0))
    assert a.copies * a.weight_bytes >= 2 * llc and a.copies > 1
    first, second = a.sets[0], a.sets[1]
    for i in range(len(first)):
        if i in positions[k.name]:
            assert first[i] is not second[i]
            np.testing.assert_array_equal(np.roll(first[i].numpy(), 1, axis=0), second[i].numpy())
        else:
            assert first[i] is second[i]  # activations shared
    window = a.next_sets(a.copies - 1) + a.next_sets(2)
    assert window[-1] is a.sets[0]  # the cycle wraps


# ----------------------------------------------------------------------------- ORT on identical weights
def test_ort_peer_on_our_weights_matches_numpy(fused):
    """Each projection's ORT node (accuracy_level 0) runs on the weight arrays our fused kernel
    is called with (found among its arguments) and gives NumPy's dequantized GEMV + bias; the
    TVM kernels are checked against NumPy by the bench (``verify``) and tests/test_phi2.py."""
    pytest.importorskip("onnxruntime")
    ks, positions = fused
    rng = np.random.default_rng(1)
    checked = set()
    for k in ks.kernels:
        proj = pp.projection_of(k.name, k.func, k.part, CFG, positions[k.name])
        if proj is None:
            continue
        base = pk.random_args(k.func, rng)
        packed, scale, bias = pp.q4_weights([base[i] for i in positions[k.name]])
        x = next(a for i, a in enumerate(base[:-1]) if i not in positions[k.name])
        peer = pp.OrtPeer(proj, (packed, scale, bias), 2**20, 0, 2, x)
        assert peer.copies * peer.bytes >= 2 * 2**20 and peer.copies > 1
        ref = pp.reference(x, packed, scale, bias)
        np.testing.assert_allclose(peer.output(), ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
        checked.add(proj)
    assert checked == set(pp.PROJECTIONS)


@pytest.mark.skipif(not __import__("tvm_ext.targets").targets.has_avx2("llvm"), reason="no AVX2 here")
def test_int8_projection_on_our_weights(fused):
    """The bench's int8-activation projection (quantize + int8 GEMV, bias epilogue) on the weight
    arrays of each fused projection kernel gives q4_int8_gemm.reference_np's result, from copy 0."""
    from tvm_ext.bench.phi2.int8 import Int8Projection
    from tvm_ext.workloads.phi2.q4_int8_gemm import reference_np

    ks, positions = fused
    rng = np.random.default_rng(2)
    for k in ks.kernels:
        proj = pp.projection_of(k.name, k.func, k.part, CFG, positions[k.name])
        if proj is None:
            continue
        base = pk.random_args(k.func, rng)
        weights = pp.q4_weights([base[i] for i in positions[k.name]])
        x = rng.uniform(-1, 1, weights[0].shape[1] * 8).astype("float32")
        p = Int8Projection(proj, weights, 2**20, "llvm", __import__("tvm").cpu(), x)
        assert p.copies * p.bytes >= 2 * 2**20 and p.copies > 1 and p.name == "rule-int8"
        want = reference_np(x[None], *weights)[0]
        np.testing.assert_allclose(p.output(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
        assert p.seconds(1) > 0


@pytest.mark.parametrize("bias_dtype", ["float32", "float16"])  # CPU kernels compute in fp32, GPU ones in fp16
def test_q4_weights_found_by_dtype_and_rank(bias_dtype):
    packed, scale = np.zeros((8, 4), np.uint32), np.zeros((8, 1), np.float16)
    bias, x = np.zeros(8, bias_dtype), np.zeros((1, 1, 32), bias_dtype)
    got = pp.q4_weights([x, scale, packed, bias])
    assert got[0] is packed and got[1] is scale and got[2] is bias


def test_matmulnbits_layout():
    """Our word w holds K elements 8w..8w+7, low nibble first; ORT's byte b of block g holds
    elements 32g+2b (low) and 32g+2b+1 (high); zero point 7 in both nibbles."""
    n, k = 3, 64
    q = np.arange(n * k).reshape(n, k) % 16
    packed = np.zeros((n, k // 8), np.uint32)
    for j in range(8):
        packed |= q[:, j::8].astype(np.uint32) << np.uint32(4 * j)
    b, s, zp = pp.to_matmulnbits(packed, np.ones((n, k // 32), "float16"))
    assert b.shape == (n, 2, 16) and s.shape == (n * 2,) and zp.tolist() == [0x77] * n
    np.testing.assert_array_equal(b & 15, q.reshape(n, 2, 16, 2)[..., 0])
    np.testing.assert_array_equal(b >> 4, q.reshape(n, 2, 16, 2)[..., 1])


def test_parse_peers():
    assert pp.parse("ort, torch") == ["ort", "torch"] and pp.parse(None) == []
    with pytest.raises(ValueError, match="unknown phi2 peer 'tensorrt'"):
        pp.parse("ort,tensorrt")


def test_peers_only_for_decode_on_llvm():
    with pytest.raises(ValueError, match="--peers is for phi2-decode"):
        phi2_bench.run("phi2-prefill", peers=["ort"], config="reduced", out_json="")


def test_int8_only_for_decode_on_llvm():
    with pytest.raises(ValueError, match="--int8 is for phi2-decode"):
        phi2_bench.run("phi2-prefill", int8=True, config="reduced", out_json="")


def test_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="unknown schedule 'fast'"):
        phi2_bench.run("phi2-decode", schedules=["dlight", "fast"], config="reduced", out_json="")


@pytest.mark.slow  # 3.5 s of nvcc; the rules' own tests and the lent-machine rehearsal build these kernels too
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_the_rule_row_builds_for_a_gpu_target():
    """On a GPU target "rule" is rules/dequant_gemv_cuda.py's schedule for the q4 projections, dlight's
    for the others: every kernel of both rows compiles with nvcc."""
    from tir_kernels import cuda_target

    res = phi2_bench.run("phi2-decode", target=cuda_target(), schedules=["dlight", "rule"], build_only=True,
                         config="reduced", out_json="")
    assert {k["schedule"] for k in res["kernels"]} == {"dlight", "rule"}
    assert res["built"] == len(res["kernels"]) > 0


# ----------------------------------------------------------------------------- seeded database
def _column_sum_kernel():
    """A kernel none of our CPU rules takes (a sum over the rows: dlight's Reduction does)."""
    from tvm import te

    from tvm_ext.workloads.phi2.kernels import Kernel

    x = te.placeholder((64, 32), "float32", name="x")
    r = te.reduce_axis((0, 64), name="r")
    out = te.compute((32,), lambda j: te.sum(x[r, j], axis=r), name="column_sum")
    return Kernel("column_sum", te.create_prim_func([x, out]), 1, "layer", ["column_sum"])


def test_seed_run_secs_come_from_the_tuning_runner(tmp_path, fused):
    """The seeded database's records -- our rules' schedule where one applies (LayerNorm, qkv), dlight's
    elsewhere (a column sum) -- hold what the runner handed to ``_schedules`` measured (the runner that then
    tunes), not a time taken another way."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    from tvm_ext.tune.database import open_database, records_of

    @derived_object
    class FakeBuilder(ms.builder.PyBuilder):
        def build(self, build_inputs):
            return [ms.builder.BuilderResult("artifact", None) for _ in build_inputs]

    @derived_object
    class SpyRunner(ms.runner.PyRunner):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def run(self, runner_inputs):
            self.calls += 1
            return [ms.runner.LocalRunnerFuture([1e-3 * (i + 1)] * 3) for i in range(len(runner_inputs))]

    ks, _ = fused
    ks = SimpleNamespace(kernels=ks.kernels[:2] + [_column_sum_kernel()], fusion=ks.fusion)  # LayerNorm, qkv, one of
    # dlight's (every Phi-2 kernel has a rule of ours now)
    spy = SpyRunner()
    target = resolve_target("llvm")
    sched, _, dl_secs, dbs = phi2_bench._schedules(ks, target, "decode", 0, False, False, str(tmp_path), print,
                                                    ("dlight", "seeded"), runner=spy, builder=FakeBuilder())
    from tvm_ext.scheduling import rule_schedule

    names = list(dict.fromkeys(k.name for k in ks.kernels))
    funcs = {n: pk.normalize(next(k.func for k in ks.kernels if k.name == n)) for n in names}
    ours = [n for n in names if rule_schedule(funcs[n], target) is not None]
    assert 0 < len(ours) < len(names)
    assert spy.calls == 2 and dl_secs == {n: pytest.approx(1e-3 * (i + 1)) for i, n in enumerate(names)}
    db = open_database(dbs["seeded"])
    for i, name in enumerate(names):
        (record,) = records_of(db, funcs[name])
        want = 1e-3 * (ours.index(name) + 1 if name in ours else i + 1)  # the second call measured our seeds
        assert [float(s) for s in record.run_secs] == [pytest.approx(want)]
    # benching from those logs: dlight measured by the runner too (trials to beat in one unit)
    again = SpyRunner()
    _, _, dl_secs, _ = phi2_bench._schedules(ks, target, "decode", 0, True, False, str(tmp_path), print,
                                             ("dlight", "seeded"), runner=again, builder=FakeBuilder())
    assert again.calls == 1 and len(dl_secs) == len(names)


# ----------------------------------------------------------------------------- JSON and table
def _given_result():
    """A result dict from made-up kernel and peer times (the arithmetic, not a measurement)."""
    _, kss = pk.kernelsets("phi2-decode", "reduced", CTX, 8, "float32")
    sec, rules, beat, verified, proj, hot, copies = {}, {}, {}, {}, {}, {}, {}
    schedules = ("dlight", "seeded")
    for fusion in (False, True):
        positions = pk.weight_positions(kss[fusion])
        rules[fusion] = {k.name: "GEMV" for k in kss[fusion].kernels}
        beat[fusion] = {"seeded": {}}
        for i, k in enumerate(kss[fusion].kernels):
            proj[(fusion, k.name, k.part)] = pp.projection_of(k.name, k.func, k.part, CFG, positions[k.name])
            copies[(fusion, k.name)] = dram.copies_for(pk.nbytes(k.func, positions[k.name]), 2**25)
            for s in schedules:
                sec[(fusion, s, k.name)] = 1e-4 * (i + 1)
                hot[(fusion, s, k.name)] = 0.5e-4 * (i + 1)
        for s in schedules:
            verified[(fusion, s)] = "ok"
    floor = {k.name: 0.25e-4 * (i + 1) for i, k in enumerate(kss[True].kernels)}  # touch kernels: 1/4 of "ms"
    extra = {"hot": hot, "copies": copies, "projection": proj, "floor": floor}
    rows = phi2_bench._rows(kss, sec, 10.0, rules, beat, verified, 1, schedules, extra)
    peers = [{"peer": f"ort-acc{a}", "projection": p, "ms": 0.05 * (1 + a), "bound_ms": 0.01, "copies": 4}
             for p in pp.PROJECTIONS for a in (0, 4)]
    int8 = [{"schedule": "rule-int8", "projection": p, "ms": 0.2, "bound_ms": 0.1, "copies": 4} for p in pp.PROJECTIONS]
    return {"workload": "phi2-decode", "target": "llvm", "device": dram.cpu_info(), "threads": 2,
            "llc_bytes": 2**25, "bandwidth_gbs": 10.0, "compute_dtype": "float32", "trials_per_kernel": 0,
            "schedules": list(schedules), "rows": rows, "peers": peers, "int8": int8,
            "fusion_losses": phi2_bench._fusion_losses(rows, schedules),
            "targets": phi2_bench._targets(rows, peers, schedules, int8)}


def test_json_fields_and_projection_table():
    from tvm_ext.cli.phi2_table import format_table

    res = _given_result()
    for r in res["rows"]:
        projs = [k["projection"] for k in r["kernels"] if "projection" in k]
        assert sorted(projs) == sorted(pp.PROJECTIONS)
        assert all("ms_cache_hot" in k and k["copies"] >= 1 for k in r["kernels"])
        assert all(("floor_ms" in k) == (r["fusion"] == "on") for k in r["kernels"])  # fused kernels only
    t = res["targets"]["projections"]
    assert set(t) == set(pp.PROJECTIONS)
    best = phi2_bench.row(res["rows"], "on", res["targets"]["best_fused"])["kernels"]
    over = res["targets"]["kernels_over_bound"]  # those above 1.2x their bound, each also against its floor
    assert [k["name"] for k in over] == [k["name"] for k in best if k["ms"] > 1.2 * k["bound_ms"]] and over
    assert all(k["vs_floor"] == pytest.approx(4.0) for k in over)
    fused = phi2_bench.row(res["rows"], "on", "dlight")
    qkv = next(k for k in fused["kernels"] if k.get("projection") == "qkv")
    assert t["qkv"]["vs_ort_acc0"] == pytest.approx(qkv["ms"] / 0.05)
    assert t["qkv"]["vs_bound"] == pytest.approx(qkv["ms"] / qkv["bound_ms"])
    assert t["qkv"]["int8"] == {"ms": 0.2, "vs_bound": pytest.approx(2.0), "vs_ort_acc4": pytest.approx(0.8)}
    assert res["targets"]["ms_over_dlight_fused"] is None  # no metaschedule row in this run
    text = format_table(res)
    assert "per projection" in text and "rule-int8 = 2.00x bound" in text
    assert "4.00x its floor" in text
    fused_header = text.split("fusion on:")[1].splitlines()[1].split()
    assert fused_header[:5] == ["kernel", "calls", "C", "bound", "floor"]
    assert "floor" not in text.split("fusion off:")[1].split("fusion on:")[0].splitlines()[1].split()
    lines = [line.split() for line in text.splitlines()]
    ort4 = [c for c in lines if len(c) == 7 and c[1] == "ort-acc4"]
    assert len(ort4) == 5 and all(c[-2:] == ["5.00", "1.00"] for c in ort4)  # ratio vs ort-acc0, ort-acc4
    int8 = [c for c in lines if len(c) == 7 and c[1] == "rule-int8"]
    assert len(int8) == 5 and all(c[-3:] == ["2.00", "4.00", "0.80"] for c in int8)
    # without --peers (a GPU run, say) the targets name no ORT ratio rather than "None"
    alone = dict(res, peers=[], int8=[], targets=phi2_bench._targets(res["rows"], [], res["schedules"]))
    text = format_table(alone)
    assert "None" not in text.split("targets:")[1].split("\n", 1)[1] and "x bound (<=1.5)" in text
    # the header says how the weights were kept cold: cycled copies, or (memory-bound) a read sweep
    assert "weights cycled through copies >= 2x LLC" in text.splitlines()[0]
    swept = format_table(dict(res, copy_plan={"cycle_bytes": 266 * 2**20, "sweep": True})).splitlines()[0]
    assert "266 MiB of weight copies per runtime" in swept and "read before every timed pass" in swept


@pytest.mark.slow  # a whole reduced bench through the CLI: builds every kernel (~2-4 min on 2 cores)
def test_cli_reduced_run_with_ort_peers(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    from tvm_ext.cli.main import main

    out = tmp_path / "bench.json"
    rc = main(["bench", "phi2-decode", "--config", "reduced", "--trials", "0", "--schedules", "dlight",
               "--peers", "ort", "--int8", "--rounds", "1", "--logs-dir", str(tmp_path), "--out", str(out)])
    assert rc == 0 and os.path.exists(out)
    res = json.loads(out.read_text())
    assert res["llc_bytes"] > 0 and res["device"]["name"] and res["schedules"] == ["dlight"]
    assert {(p["peer"], p["projection"]) for p in res["peers"]} == \
        {(f"ort-acc{a}", p) for p in pp.PROJECTIONS for a in (0, 4)}
    for p in res["peers"]:
        assert p["copies"] >= 1 and p["bound_ms"] > 0
        if p["peer"] == "ort-acc0":  # same weights: rounding only
            assert p["max_abs_err"] <= 1e-4 * p["max_abs_ref"]
    for r in res["rows"]:
        assert sorted(k["projection"] for k in r["kernels"] if "projection" in k) == sorted(pp.PROJECTIONS)
    assert all(res["weight_copies"][k["name"]] == k["copies"] for r in res["rows"] for k in r["kernels"])
    assert sorted(r["projection"] for r in res["int8"]) == sorted(pp.PROJECTIONS)
    for r in res["int8"]:  # a different computation, with its error against the float reference
        assert r["schedule"] == "rule-int8" and r["bound_ms"] > 0 and 0 < r["max_abs_err"] < 0.05 * r["max_abs_ref"]
        assert "vs_ort_acc4" in res["targets"]["projections"][r["projection"]]["int8"]
    assert "per projection" in capsys.readouterr().out
