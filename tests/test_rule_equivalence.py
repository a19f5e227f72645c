"""Our rules never change what a kernel computes: candidates of tvm_ext.space(llvm)
against the unscheduled function, on random inputs (exact for ints, tolerance for floats).

Default run: the FAST subset, one candidate each. ``pytest -m slow``: the whole
corpus (>= 30 PrimFuncs), three candidates each. A failure names the file with the
function, the trace and the scheduled module (under $TVM_EXT_EQUIV_DIR).
"""
import numpy as np
import pytest
import tvm

from tvm_ext.arrays import random_arrays
from tvm_ext.check import equivalence as eq
from tvm_ext.targets import resolve_target

CORPUS = {c.name: c for c in eq.corpus()}


@pytest.fixture(scope="module")
def target():
    return resolve_target("llvm")


def test_corpus_is_large_and_named_uniquely():
    assert len(CORPUS) >= 30
    assert len(CORPUS) == len(eq.corpus())
    assert set(eq.FAST) <= set(CORPUS)


def test_shapes_are_drawn_from_the_seed():
    case = CORPUS["dense_f32"]
    a = case.build(np.random.RandomState(1)).script()
    assert a == case.build(np.random.RandomState(1)).script()


def _check(case, target, candidates, tmp_path, runner=None):
    res = eq.check_case(case, target, candidates=candidates, seed=0, failure_dir=str(tmp_path), runner=runner)
    assert res.ok, f"{case.name}: {res.message} (reproduce from {res.failure_file})"
    assert res.candidates >= 1


@pytest.mark.parametrize("name", eq.FAST)
def test_fast_subset(name, target, tmp_path):
    _check(CORPUS[name], target, 1, tmp_path)


def test_mismatch_is_saved_for_reproduction(target, tmp_path, monkeypatch):
    real = eq.run_mod
    calls = []

    def corrupt_second(mod, tgt, arrays):
        out = real(mod, tgt, arrays)
        calls.append(1)
        if len(calls) == 2:  # the first candidate: flip one output element
            out[-1].flat[0] += 1
        return out

    monkeypatch.setattr(eq, "run_mod", corrupt_second)
    res = eq.check_case(CORPUS["q_multiply_shift_per_axis"], target, candidates=1, failure_dir=str(tmp_path))
    assert not res.ok and "differ" in res.message
    text = open(res.failure_file).read()
    assert "q_multiply_shift_per_axis" in text and "T.prim_func" in text and "sch." in text


@pytest.fixture(scope="module")
def runner():
    with eq.CandidateRunner(timeout=120) as r:
        yield r


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_full_corpus(name, target, tmp_path, runner):
    _check(CORPUS[name], target, 3, tmp_path, runner)


def test_runner_gives_up_on_a_slow_candidate_and_recovers(target):
    """A candidate over the time limit raises BuildTimeout (the worker is killed); the
    next one gets a fresh worker and the same outputs as a build in this process."""
    func = CORPUS["dense_int8"].build(np.random.RandomState(0))
    mod = tvm.IRModule({"main": func})
    arrays = random_arrays(func, 1)
    with eq.CandidateRunner(timeout=0.01) as runner:  # a worker cannot even import TVM in 10 ms
        with pytest.raises(eq.BuildTimeout):
            runner.run(mod, target, arrays)
        runner.timeout = 120
        got = runner.run(mod, target, arrays)
    for g, e in zip(got, eq.run_mod(mod, target, arrays)):
        np.testing.assert_array_equal(g, e)


def test_check_rules_command_writes_json_and_exits_by_result(tmp_path, monkeypatch):
    """``tvm-ext check-rules``: the slow test's work as a command; its exit code and
    JSON follow the cases' results (one real case, then the same case corrupted)."""
    import json

    from tvm_ext import cli

    out = tmp_path / "ok.json"
    assert cli.main(["check-rules", "--cases", "softmax", "--candidates", "1", "--out", str(out),
                     "--failure-dir", str(tmp_path)]) == 0
    doc = json.loads(out.read_text())
    assert doc["total"] == {**doc["total"], "planned": 1, "checked": 1, "ok": 1, "failed": 0}
    assert doc["cases"][0]["name"] == "softmax" and doc["cases"][0]["candidates"] == 1

    real = eq.run_mod
    calls = []

    def corrupt_candidates(mod, tgt, arrays):
        out = real(mod, tgt, arrays)
        calls.append(1)
        if len(calls) > 1:
            out[-1].flat[0] += 1
        return out

    monkeypatch.setattr(eq, "run_mod", corrupt_candidates)
    bad = tmp_path / "bad.json"
    assert cli.main(["check-rules", "--cases", "softmax", "--candidates", "1", "--out", str(bad),
                     "--build-timeout", "0",
                     "--failure-dir", str(tmp_path)]) == 1
    case = json.loads(bad.read_text())["cases"][0]
    assert not case["ok"] and "max abs error" in case["message"] and case["failure_file"].startswith(str(tmp_path))


def _func(*params):
    from tvm import te

    args = [te.placeholder(shape, dtype, name=name) for name, dtype, shape in params]
    out = te.compute((4,), lambda i: args[0][i].astype("float32"), name="out")
    return te.create_prim_func(args + [out])


def test_random_arrays_ranges_by_name_then_dtype_then_default():
    func = _func(("x", "uint8", (64,)), ("mult", "int32", (64,)), ("shift", "int32", (64,)),
                 ("w", "int8", (64,)), ("flag", "bool", (64,)))
    x, mult, shift, w, flag, out = random_arrays(func, 0, {"mult": (1 << 30, (1 << 31) - 1), "int32": (-3, -1)})
    assert [a.dtype.name for a in (x, mult, shift, w, flag, out)] == [
        "uint8", "int32", "int32", "int8", "bool", "float32"]
    assert mult.min() >= 1 << 30  # by name
    assert shift.min() >= -3 and shift.max() <= -1  # by dtype
    assert w.min() >= -8 and w.max() <= 8 and w.min() < 0  # signed default
    assert out.min() >= -1 and out.max() <= 1
    assert set(np.unique(flag)) <= {False, True}
    # the same seed draws the same arrays
    ranges = {"mult": (1 << 30, (1 << 31) - 1), "int32": (-3, -1)}
    for a, b in zip(random_arrays(func, 0, ranges), (x, mult, shift, w, flag, out)):
        np.testing.assert_array_equal(a, b)


def test_random_arrays_clips_to_the_dtype_and_rejects_empty_ranges():
    func = _func(("x", "uint8", (256,)), ("y", "int8", (256,)))
    x, y, _ = random_arrays(func, np.random.default_rng(3), int_range=(-1000, 1000))
    assert x.min() >= 0 and x.max() > 200  # -1000..1000 clipped to 0..255
    assert y.min() < -100 and y.max() > 100
    with pytest.raises(ValueError, match="empty range"):
        random_arrays(func, 0, {"x": (300, 400)})


def test_random_arrays_rejects_a_scalar_parameter():
    from tvm.script import tirx as T

    @T.prim_func
    def scaled(a: T.Buffer((4,), "float32"), n: T.int32):
        for i in range(4):
            a[i] = a[i] * T.Cast("float32", n)

    with pytest.raises(ValueError, match="'n' is a scalar"):
        random_arrays(scaled, 0)
