"""Phi-2 prompt processing (prefill): the whole prompt through each layer at once, int8 activations
and the q4 x int8 GEMM, then decode from the cache the prefill wrote.

The reduced model's prefill + decode runs against the float64 NumPy reference (teacher-forced on
our ids): logits within the int8 quantization's error, the same greedy tokens, and the decode
after the prompt reads the keys and values the prefill wrote (a wrong cache changes every step).
``tvm-ext generate --prompt`` gives its table / JSON, and one line for bad input.
"""
import json

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm_ext.workloads.phi2.compiled import decoder, schedule  # noqa: E402
from tvm_ext.cli.main import main  # noqa: E402
from tvm_ext.intrinsics.q4_vnni import form_for  # noqa: E402
from tvm_ext.targets import resolve_target  # noqa: E402
from tvm_ext.workloads.phi2 import model as pm  # noqa: E402

needs_gemm = pytest.mark.skipif(form_for(resolve_target("llvm")) is None,
                                reason="this host has no AVX2 (the prefill GEMM's instructions)")
# the longer runs (tuning, the command) where the GEMM is the form the project's results come from
needs_vnni = pytest.mark.skipif(form_for(resolve_target("llvm")) != "avx512vnni",
                                reason="this host has no AVX-512 VNNI")
PROMPT = [3, 900, 17, 17, 250, 4, 1000, 42]


@pytest.fixture(scope="module")
def model():
    return pm.build_model("reduced", 2, capacity=len(PROMPT) + 6, seed=5, compute="int8", prompt=len(PROMPT))


def test_prefill_module_uses_the_gemm_on_repacked_weights(model):
    """Prefill and decode step read the same repacked weights (one copy); every projection of both,
    and lm_head, is the q4 x int8 GEMM (the dense one with the residual adds fused after it)."""
    names = {gv.name_hint for gv, _ in model.mod.functions_items()}
    assert {"embed_prompt", "prefill", "head_prompt", "kv_write_prompt"} <= names
    d, m = model.cfg["hidden"], model.cfg["mlp"]
    for func in ("prefill", "layer"):
        params = {p.name: [int(x) for x in p.ty.shape.values] for p in model.mod[func].params}
        assert params["qkv_wq"] == [3 * d // 16, d // 8, 16] and params["fc2_ws"] == [d // 16, m // 32, 16]
    _, used = schedule(model.mod, resolve_target({"kind": "llvm", "mcpu": "cascadelake"}), "int8")
    gemms = [n for n in names if "q4_int8_gemm" in n]
    assert len(gemms) == 4 + 4 + 1 and all(used[n] == "q4_int8_gemm" for n in gemms), used


@needs_gemm
@pytest.mark.parametrize("context", [0, 3])
def test_prefill_then_decode_matches_reference(model, context):
    dec = decoder(model, "llvm", "int8")
    past = dec.fill_past(context, seed=1, keep=True) if context else None
    ids, logits = dec.generate(PROMPT, 4, start=context)
    ref_ids, ref_logits = pm.reference_generate(model, PROMPT, 4, past=past, follow=ids)
    for got, want in zip(logits, ref_logits):
        err = np.abs(got - want).max() / np.abs(want).max()
        assert 1e-6 < err < 0.05, err  # the quantization's error: small, not zero
    assert ids == ref_ids


@needs_gemm
def test_prefill_writes_the_cache_the_decode_reads(model):
    """Decode after the prefill equals decode after feeding the prompt token by token (both int8)."""
    dec = decoder(model, "llvm", "int8")
    ids, logits = dec.generate(PROMPT, 3)
    stepwise = decoder(pm.build_model("reduced", 2, capacity=len(PROMPT) + 6, seed=5, compute="int8"), "llvm",
                       "int8", share=dec)
    ids2, logits2 = stepwise.generate(PROMPT, 3)
    assert ids == ids2
    np.testing.assert_allclose(logits[1], logits2[1], rtol=0, atol=0.05 * np.abs(logits2[1]).max())


def test_prefill_bad_inputs(model):
    for prompt, capacity, message in ((7, 16, "even number of tokens"), (20, 16, "even number of tokens")):
        with pytest.raises(ValueError, match=message):
            pm.build_model("reduced", 1, capacity=capacity, compute="int8", prompt=prompt)
    dec = decoder(model, "llvm", "none")
    with pytest.raises(ValueError, match="compiled for 8 tokens, not 3"):
        dec.prefill([1, 2, 3])
    with pytest.raises(ValueError, match="context overflow"):
        dec.prefill(PROMPT, start=10)


@needs_vnni
def test_cli_generate_prompt_json(tmp_path, capsys):
    out = tmp_path / "prompt.json"
    assert main(["generate", "--config", "reduced", "--layers", "1", "--prompt", "8", "--tokens", "2",
                 "--schedule", "int8", "--out", str(out), "--quiet"]) == 0
    table = capsys.readouterr().out
    assert "prompt tok/s" in table and "first token = float path's" in table and "host int8 peak (vpdpbusd" in table
    doc = json.loads(out.read_text())
    row = doc["rows"][0]
    assert doc["prompt"] == 8 and doc["context"] == 0 and row["schedule"] == "int8"
    assert row["vs_float"]["first_token_same"] and len(row["generated"]) == 2
    gemms = {n for n in row["kernel_s"] if "q4_int8_gemm" in n}  # the prompt's 4 and the head's one-token GEMV
    assert set(row["gemm_tops"]) < gemms and len(row["gemm_tops"]) == 4 == len(gemms) - 1
    assert doc["vnni_peak_tops"] > 0


@pytest.mark.parametrize("argv, message", [
    (["--prompt", "7"], "--prompt must be even"),
    (["--peers", "ort"], "without --prompt, --peers takes llama.cpp"),
    (["--tune", "4", "--schedule", "rule"], "--tune fills the database of --schedule tuned"),
    (["--prompt", "8", "--schedule", "dlight"],
     "unknown schedule 'dlight'; with --prompt the schedules are int8, tuned"),
    (["--prompt", "8", "--peers", "torch"], "unknown peer 'torch'"),
    (["--prompt", "8", "--schedule", "tuned", "--database", "/nonexistent/db"], "no tuning database"),
    (["--prefill-attention", "unfused"], "--prefill-attention is the prompt's: add --prompt N"),
])
def test_cli_prompt_bad_input(argv, message, capsys):
    assert main(["generate", "--config", "reduced", "--layers", "1"] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.slow  # 14 s; seed_rules and the tuned row's use of its records run by default in the pick tests below
@needs_vnni
def test_tuning_starts_from_our_rules(model, tmp_path):
    """seed_rules commits the untuned schedule of every kernel -- ours where a rule matches, dlight's
    or the kernel as built elsewhere -- measured by the tuning runner; the tuned row then uses those
    records (so tuning can only keep or beat the untuned row)."""
    from tvm_ext.bench.phi2.decode import model_kernels
    from tvm_ext.bench.phi2.prompt import PROMPT_FUNCS
    from tvm_ext.tune.database import open_database, records_of
    from tvm_ext.scheduling import best_schedule, dlight_schedule, rule_schedule
    from tvm_ext.tune.seeds import seed_rules

    mods = model_kernels(model, PROMPT_FUNCS)
    target = resolve_target("llvm")
    ours = {n for n, m in mods.items() if rule_schedule(m, target) is not None}
    assert {n for n in ours if "q4_int8_gemm" in n} and {n for n in ours if "attn" in n}
    # all but the embedding lookup, which the runner cannot run on random token ids
    measurable = {n for n in mods if not n.startswith("embed")}
    assert seed_rules(mods, target, str(tmp_path), log=lambda m: None) == len(ours & measurable)
    assert seed_rules(mods, target, str(tmp_path), log=lambda m: None) == 0  # resumed: nothing twice
    db = open_database(str(tmp_path), read_only=True)
    assert {n for n, m in mods.items() if records_of(db, m)} == measurable
    _, used = schedule(model.mod, target, "tuned", str(tmp_path))
    assert all(used[n] == "tuned" for n in measurable)
    others = [n for n in measurable if n not in ours]  # dlight's schedule, or the kernel as built (none in
    for name in others:  # Phi-2 since rules/injective_cpu took rope and the head split)
        sch = dlight_schedule(mods[name], target)[1]
        tvm.ir.assert_structural_equal(best_schedule(db, mods[name]), sch.mod if sch is not None else mods[name])


@needs_vnni
# the runner's measure is the long variant (7 s): -m slow; the cycled one, what generate uses, stays
@pytest.mark.parametrize("how", [pytest.param("runner", marks=pytest.mark.slow), "cycled"])
def test_a_pick_that_loses_side_by_side_leaves_the_untuned_schedule(tmp_path, how):
    """confirm_picks measures a best record that is not the untuned schedule beside it (by the tuning
    runner, or back to back on DRAM-cycled arguments: ``bench.cycled.CycledTimer``, what generate and the
    benches pass): here a record claiming 1 ns for Phi-2's fc1 GEMV (one token, 10240 x 2560) left
    unscheduled (scalar code) against our tensorized one; it loses, the kernel is kept in
    untuned_kept.json and the tuned row runs ours.  (At the reduced config's sizes the unscheduled serial
    kernel wins: no thread pool to wake.)"""
    from tvm_ext.bench.cycled import CycledTimer
    from tvm.s_tir import Schedule

    from tvm_ext.bench.phi2.decode import model_kernels
    from tvm_ext.tune.database import open_database
    from tvm_ext.tune.runner import make_runner
    from tvm_ext.scheduling import rule_schedule, tuned_schedule
    from tvm_ext.tune.seeds import KEPT_FILE, confirm_picks, read_kept, seed_rules
    from tvm_ext.tune.transfer import commit_measured

    target = resolve_target("llvm")
    full = pm.build_model("full", 1, capacity=4, seed=0, compute="int8")
    name, mod = next((n, m) for n, m in model_kernels(full).items()
                     if n.startswith("q4_int8_gemm") and int(m["main"].params[-1].shape[-1]) == 10240)
    mods = {name: mod}
    seed_rules(mods, target, str(tmp_path), log=lambda m: None)
    sch = Schedule(mod)
    sch.get_child_blocks(sch.get_sblock("root", func_name="main"))  # a trace that is not empty: as built
    db = open_database(str(tmp_path))
    commit_measured(db, mod, sch, 1e-9, target)
    ours = rule_schedule(mod, target)[1].mod
    kept = read_kept(str(tmp_path))
    tvm.ir.assert_structural_equal(tuned_schedule(db, mod, target, kept), mod)  # the claim, unchecked
    measure = CycledTimer(target) if how == "cycled" else None
    ratios = confirm_picks(mods, target, str(tmp_path), make_runner(), log=lambda m: None, rounds=1,
                           measure=measure)
    assert ratios[name] > 1.0
    assert name in json.dumps(json.loads((tmp_path / KEPT_FILE).read_text()))
    tvm.ir.assert_structural_equal(tuned_schedule(db, mod, target, read_kept(str(tmp_path))), ours)


@needs_vnni
@pytest.mark.parametrize("tuned_s, taken", [(0.98, False), (0.90, True)])
def test_a_pick_within_the_margin_leaves_the_untuned_schedule(tmp_path, tuned_s, taken):
    """A pick measured 2 % faster than the untuned schedule side by side is within ``PICK_MARGIN`` (5 %): the
    untuned schedule stays (the rule row's binary); 10 % faster: the pick is taken."""
    from tvm.s_tir import Schedule

    from tvm_ext.bench.phi2.decode import model_kernels
    from tvm_ext.tune.database import open_database
    from tvm_ext.scheduling import rule_schedule, tuned_schedule
    from tvm_ext.tune.seeds import PICK_MARGIN, confirm_picks, read_kept, seed_rules
    from tvm_ext.tune.transfer import commit_measured

    assert PICK_MARGIN == pytest.approx(0.05)
    target = resolve_target("llvm")
    full = pm.build_model("reduced", 1, capacity=4, seed=0, compute="int8")
    name, mod = next((n, m) for n, m in model_kernels(full).items() if n.startswith("q4_int8_gemm"))
    seed_rules({name: mod}, target, str(tmp_path), log=lambda m: None)
    sch = Schedule(mod)
    sch.get_child_blocks(sch.get_sblock("root", func_name="main"))
    db = open_database(str(tmp_path))
    commit_measured(db, mod, sch, 1e-9, target)  # the pick: the kernel as built

    def measure(batch):
        return {key: (tuned_s if key.endswith("/tuned") else 1.0) for key in batch}

    ratios = confirm_picks({name: mod}, target, str(tmp_path), None, log=lambda m: None, rounds=1, measure=measure)
    assert ratios[name] == pytest.approx(tuned_s)
    want = mod if taken else rule_schedule(mod, target)[1].mod
    tvm.ir.assert_structural_equal(tuned_schedule(db, mod, target, read_kept(str(tmp_path))), want)


@pytest.mark.slow  # 35 s on 2 cores (tuning)
@needs_vnni
def test_cli_decode_tune_then_tuned(tmp_path, capsys):
    """generate --tune (no prompt): the int8 decode step's kernels seeded with our rules and tuned into
    --database; the tuned row reads them (every projection "tuned"), the int8 row is its untuned start,
    and both report their tokens against the float row's."""
    from tvm_ext.tune.database import open_database

    db, out = tmp_path / "db", tmp_path / "gen.json"
    assert main(["generate", "--config", "reduced", "--layers", "1", "--context", "4", "--tokens", "2",
                 "--schedule", "rule,int8,tuned", "--tune", "1", "--database", str(db), "--out", str(out),
                 "--quiet"]) == 0
    assert "tuned vs rule:" in capsys.readouterr().out
    rows = {r["schedule"]: r for r in json.loads(out.read_text())}
    tuned, untuned = rows["tuned"]["rules"], rows["int8"]["rules"]
    gemms = [n for n in tuned if "q4_int8_gemm" in n]
    assert gemms and all(tuned[n] == "tuned" and untuned[n] == "q4_int8_gemm" for n in gemms)
    assert set(rows["tuned"]["vs_float"]) == {"rule"} and len(rows["tuned"]["generated"]) == 2
    assert len(open_database(str(db), read_only=True).get_all_tuning_records()) >= len(gemms)


@pytest.mark.slow  # ~40 s on 2 cores (a 128-token prompt, its float reference, the vpdpbusd peak)
@needs_vnni
def test_bench_phi2_prefill_on_cpu_is_the_int8_prefill(tmp_path, capsys):
    """bench phi2-prefill on llvm (no --schedules) runs the whole-model int8 prefill of generate --prompt
    128 and says what it skipped (the float-kernel table, whose dlight GEMMs run unscheduled)."""
    out = tmp_path / "prefill.json"
    assert main(["bench", "phi2-prefill", "--config", "reduced", "--rounds", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "prompt tok/s" in text and "note: phi2-prefill on the CPU is the int8 prefill" in text
    doc = json.loads(out.read_text())
    assert doc["prompt"] == 128 and [r["schedule"] for r in doc["rows"]][0] == "int8"
    assert "float-kernel table" in doc["note"] and doc["rows"][0]["vs_float"]["first_token_same"]


@pytest.mark.parametrize("form, mcpu, instructions", [("avx2", "znver3", ("vpmaddubsw", "vpaddw", "vpmaddwd")),
                                                       ("avx512vnni", "znver5", ("vpdpbusd",))])
def test_the_int8_peak_loop_runs_the_gemms_instructions_for_every_chain(form, mcpu, instructions):
    """The peak's loop body is the GEMM's product step for each chain (nothing hoisted or merged): per chain
    two products of distinct weight bytes, as the tile intrinsic computes them."""
    import re

    from tvm_ext.bench.phi2.prompt import peak_func

    chains = 3
    lib = tvm.compile(tvm.IRModule({"main": peak_func(1, form, chains, steps=1000)}),
                      target=tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
    asm = lib.mod.inspect_source("asm")
    counts = [len(re.findall(rf"\b{ins}\b", asm)) for ins in instructions]
    # LLVM unrolls the steps: a whole number of steps, each 2 products (maddubs or vpdpbusd) per chain
    assert counts[0] > 0 and counts[0] % (2 * chains) == 0, counts
    if form == "avx2":  # each vpmaddubsw added to the chain's int16 sums, widened once per group (not here)
        assert counts[1] == counts[0] and counts[2] == 0, counts


def test_the_int8_peak_runs_on_this_host():
    from tvm_ext.bench.phi2.prompt import int8_peak

    form = form_for(resolve_target("llvm"))
    if form is None:
        pytest.skip("no AVX2 on this host")
    assert int8_peak(1, form, chains=2, steps=1000) > 0
