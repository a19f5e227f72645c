"""Two ms.tune_tir calls in two tests of one pytest session, with pytest's log capture on.

pytest >= 9.2 attaches unnamed capture handlers to non-propagating loggers, and TVM 0.27's
create_loggers crashes on them ('NoneType' object has no attribute 'format') on the second
tuning run. tvm_ext's pytest plugin (entry point ``tvm_ext``) makes it safe; without the
plugin the same session fails, which shows the test reproduces what it guards against.
"""
import pytest

INNER = '''
import tvm
import tvm_ext
from tvm import te
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing.dummy_object import DummyBuilder, DummyRunner


def _tune(work_dir):
    a = te.placeholder((64,), "float32", name="a")
    b = te.compute((64,), lambda i: a[i] + 1.0, name="b")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b])})
    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    ms.tune_tir(mod, target, str(work_dir), max_trials_global=1, num_trials_per_iter=1,
                space=tvm_ext.space(target), strategy="replay-trace", cost_model="random",
                builder=DummyBuilder(), runner=DummyRunner(), measure_callbacks=[])  # loggers are tested


def test_first(tmp_path):
    _tune(tmp_path)


def test_second(tmp_path):
    _tune(tmp_path)
'''


# the inner sessions load no other installed plugins (hypothesis, xdist, benchmark, timeout, anyio: ~3 s of
# each process's start, nothing to do with log capture, which is pytest's own)
OTHER_PLUGINS_OFF = [arg for name in ("hypothesispytest", "xdist", "xdist.looponfail", "benchmark", "timeout", "anyio")
                     for arg in ("-p", f"no:{name}")]


def _pytest_attaches_to_non_propagating_loggers():
    import _pytest.logging as pl

    # the pytest behaviour this guards against: capture handlers on non-propagating loggers
    return "not logger.propagate" in open(pl.__file__).read()


def test_two_tune_tir_runs_in_one_session(pytester):
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-q", *OTHER_PLUGINS_OFF)  # our plugin is on by default
    result.assert_outcomes(passed=2)


# the control (TVM + this pytest still crash without our plugin): a second pytest process of
# ~8 s, in the slow set to keep the default run under CI's budget
@pytest.mark.slow
def test_without_the_plugin_the_second_run_crashes(pytester):
    if not _pytest_attaches_to_non_propagating_loggers():
        pytest.skip("this pytest does not attach handlers to non-propagating loggers")
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-q", *OTHER_PLUGINS_OFF, "-p", "no:tvm_ext")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*NoneType*format*"])
