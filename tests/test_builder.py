"""tune.builder.PooledLocalBuilder: worker processes kept across batches, results and failures reported
as TVM's LocalBuilder reports them, a timed-out worker replaced."""
import tvm
from tvm.s_tir.meta_schedule.builder import BuilderInput

from tir_kernels import requantize_primfunc
from tvm_ext.tune.builder import PooledLocalBuilder


def make_build():
    """A build function that sleeps for a module whose function is named 'slow' and raises for 'bad'
    (sent by value: a closure)."""
    def build(mod, target, _params):
        import time  # pylint: disable=import-outside-toplevel

        from tvm.driver import build as tvm_build  # pylint: disable=import-outside-toplevel

        name = mod.get_global_vars()[0].name_hint
        if name == "bad":
            raise RuntimeError("this build fails")
        if name == "slow":
            time.sleep(60)
        return tvm_build(mod, target=target)

    return build


def module(name):
    return tvm.IRModule({name: requantize_primfunc(8, 8).with_attr("global_symbol", name)})


def worker_pids(builder):
    return sorted(w._proc.pid for w in builder._pool._worker_map.values() if w._proc is not None)


def test_workers_live_across_batches_and_failures_are_reported():
    builder = PooledLocalBuilder(f_build=make_build(), timeout_sec=3, max_workers=1)
    target = tvm.target.Target("llvm")
    try:
        good, bad = builder.build([BuilderInput(module("main"), target), BuilderInput(module("bad"), target)])
        assert good.error_msg is None and good.artifact_path.endswith(".tar")
        assert bad.artifact_path is None
        assert bad.error_msg.startswith("LocalBuilder: An exception occurred") and "this build fails" in bad.error_msg
        first = worker_pids(builder)
        assert len(first) == 1
        (again,) = builder.build([BuilderInput(module("main"), target)])
        assert again.error_msg is None and worker_pids(builder) == first  # the same process built it
        (slow,) = builder.build([BuilderInput(module("slow"), target)])
        assert slow.error_msg == "LocalBuilder: Timeout, killed after 3 seconds"
        (after,) = builder.build([BuilderInput(module("main"), target)])
        assert after.error_msg is None and worker_pids(builder) != first  # a new worker after the kill
    finally:
        builder.close()
    assert builder._pool is None
