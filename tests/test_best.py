"""tvm_ext.tune.best: the best schedule of a user's TVMScript function, compiled and run."""
import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms
from tvm.script import tirx as T

import tvm_ext
from tvm_ext.tune import NoTuningRecord, best_module, compile_best, make_builder


@T.prim_func(s_tir=True)
def add_one(a: T.Buffer((128,), "float32"), b: T.Buffer((128,), "float32")):
    # no tirx.noalias: what a user writes; tune_tir stores the function with it
    for i in range(128):
        with T.sblock("b"):
            vi = T.axis.spatial(128, i)
            b[vi] = a[vi] + T.float32(1)


TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 1})


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    work_dir = str(tmp_path_factory.mktemp("best"))
    return ms.tune_tir(tvm.IRModule({"main": add_one}), TARGET, work_dir, max_trials_global=2,
                       num_trials_per_iter=2, space=tvm_ext.space(TARGET), builder=make_builder(),
                       strategy="replay-trace")


def test_tvm_compile_tir_misses_the_function_without_noalias(database):
    # the pitfall best_module exists for (if TVM fixes it, this test says so)
    assert ms.tir_integration.compile_tir(database, tvm.IRModule({"main": add_one}), TARGET) is None


def test_best_module_finds_and_schedules_it(database):
    scheduled = best_module(database, tvm.IRModule({"main": add_one}), TARGET)
    # the recorded schedule was applied (the body changed), and the function kept its name
    assert not tvm_ffi.structural_equal(scheduled["main"].body, add_one.body)
    assert scheduled["main"].attrs["global_symbol"] == "main"


def test_compiled_best_schedule_computes_a_plus_one(database):
    lib = compile_best(database, add_one, TARGET)
    a = np.random.default_rng(0).standard_normal(128).astype("float32")
    b = tvm.runtime.tensor(np.zeros(128, "float32"))
    lib["main"](tvm.runtime.tensor(a), b)
    np.testing.assert_allclose(b.numpy(), a + 1, rtol=0, atol=0)


def test_a_function_never_tuned_is_named(database):
    @T.prim_func(s_tir=True)
    def other(a: T.Buffer((8,), "int32"), b: T.Buffer((8,), "int32")):
        for i in range(8):
            with T.sblock("b"):
                vi = T.axis.spatial(8, i)
                b[vi] = a[vi] * 2

    with pytest.raises(NoTuningRecord, match="other"):
        best_module(database, tvm.IRModule({"main": add_one, "other": other}), TARGET)
    kept = best_module(database, tvm.IRModule({"main": add_one, "other": other}), TARGET, missing="keep")
    tvm.ir.assert_structural_equal(kept["other"], other)
