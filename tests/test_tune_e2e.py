"""ms.tune_tir with tvm_ext.space and the stack's builder and runner on the seed conv task,
then bit-exact against NumPy (slow); tune_task's per-task VerifyGPUCode rejection counts (slow)."""
import os
import tempfile

import numpy as np
import pytest
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder

import tvm_ext
import tvm_ext.tune
from tir_kernels import llvm_target, requantize_primfunc
from tvm_ext.tune.database import record_seconds
from tvm_ext.workloads import qnn_reference as ref
from tvm_ext.workloads.conv2d_int8 import ZP_IN, ZP_OUT, seed_conv_primfunc

IMAGE, CIN, COUT, K = 8, 16, 16, 3


def random_args(rng):
    data = rng.randint(0, 256, (1, IMAGE, IMAGE, CIN)).astype("uint8")
    weight = rng.randint(-127, 128, (K, K, CIN, COUT)).astype("int8")
    zp_corr = rng.randint(-2000, 2000, (1, 1, 1, COUT)).astype("int32")
    bias = rng.randint(-5000, 5000, (1, 1, 1, COUT)).astype("int32")
    mult = rng.randint(1 << 30, (1 << 31) - 1, (COUT,)).astype("int32")
    lshift = np.zeros((COUT,), "int32")
    rshift = rng.randint(6, 10, (COUT,)).astype("int32")
    return [data, weight, zp_corr, bias, mult, lshift, rshift]


def numpy_reference(data, weight, zp_corr, bias, mult, lshift, rshift):
    acc = ref.conv2d_nhwc(data, weight, stride=1, pad=K // 2, zp_in=ZP_IN)
    return ref.requantize(acc, zp_corr, bias, mult, lshift, rshift, zp_out=ZP_OUT)


@pytest.mark.slow
def test_tune_tir_with_plugin_space_is_bit_exact(tmp_path):
    """Slow (~20-30 s of the default run, a fresh builder and runner and an evolutionary search): the
    default run covers each piece faster -- ``ms.tune_tir`` with ``tvm_ext.space`` and the stack's builder
    (test_best.py's database), the stack's search, builder and runner on this seed conv, its records
    measured, and the tuned network bit-exact against the NumPy reference (test_cli.py: ``tuned``,
    ``test_bench_checks_exactness_and_writes_json``)."""
    target = llvm_target()
    mod = tvm.IRModule({"main": seed_conv_primfunc(image=IMAGE, channels=CIN, out_channels=COUT)})
    database = ms.tune_tir(mod, target, str(tmp_path), max_trials_global=4, num_trials_per_iter=4,
                           space=tvm_ext.space(target),
                           builder=tvm_ext.tune.make_builder(), runner=tvm_ext.tune.make_runner(),
                           strategy=tvm_ext.tune.search_strategy(4),
                           database=ms.database.JSONDatabase(work_dir=str(tmp_path)))
    records = database.get_all_tuning_records()
    assert len(records) == 4
    # plain LocalRunner on llvm measures candidates (no "Unknown device: llvm" for every one)
    assert any(record_seconds(r) is not None for r in records)
    sch = ms.tir_integration.compile_tir(database, mod, target)
    assert sch is not None, "no valid schedule was found in 4 trials"
    # the chosen schedule is really from the database: the constant block is gone
    assert "compile_engine_const" not in sch.mod["main"].script()
    lib = tvm.compile(sch.mod, target=target)
    args = random_args(np.random.RandomState(0))
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros((1, IMAGE, IMAGE, COUT), "uint8"), dev)
    lib["main"](*[tvm.runtime.tensor(a, dev) for a in args], out)
    expected = numpy_reference(*args)
    assert 0 < np.count_nonzero(expected) < expected.size  # not all clipped
    np.testing.assert_array_equal(out.numpy(), expected)



@pytest.mark.slow
def test_tune_task_reports_its_own_verify_gpu_rejections(tmp_path):
    """On cuda, tune_task returns what VerifyGPUCode rejected while searching that task only
    (a fresh postproc per call; `tvm-ext tune` prints it per task): a conv on a target with
    64 threads per block gets rejections, an elementwise kernel searched before and after it
    gets none, so nothing carries over from one task to the next."""
    from tvm.s_tir.meta_schedule.testing.dummy_object import DummyRunner

    from tir_kernels import CUDA
    from tvm_ext.tune.driver import Task, tune_task

    target = tvm.target.Target(dict(CUDA, max_threads_per_block=64))
    database = ms.database.MemoryDatabase()
    conv = Task("conv", 1, tvm.IRModule({"main": seed_conv_primfunc(image=IMAGE, channels=CIN,
                                                                     out_channels=COUT)}))
    elementwise = Task("requantize", 1, tvm.IRModule({"main": requantize_primfunc(64, 64)}))
    runs = [tune_task(task, target, database, str(tmp_path), 1, builder=FileBuilder(tmp_path),
                      runner=DummyRunner()) for task in (elementwise, conv, elementwise)]
    assert all(r.checked > 0 for r in runs)
    assert runs[0].reasons == {} and runs[2].reasons == {}
    assert sum(runs[1].reasons.values()) > 0 and "VerifyGPUCode rejected" in runs[1].line()


@derived_object
class FileBuilder(PyBuilder):
    """Builds nothing: one empty artifact file per candidate (MetaSchedule deletes them)."""

    def __init__(self, tmp_path):
        super().__init__()
        self.dir = str(tmp_path)

    def build(self, build_inputs):
        results = []
        for _ in build_inputs:
            fd, path = tempfile.mkstemp(dir=self.dir, suffix=".so")
            os.close(fd)
            results.append(BuilderResult(path, None))
        return results


def test_saved_task_follows_a_changed_workload(tmp_path):
    """A task whose TIR changed under the same name (the workload's code changed) replaces
    the stored module, so report and bench look up the records of what is compiled now; an
    unchanged one is not rewritten."""
    from tvm_ext.tune.driver import Task, load_tasks, save_tasks

    (tmp_path / "tasks").mkdir()
    (tmp_path / "tvm_ext.json").write_text("{}")
    old, new, other = (tvm.IRModule({"main": requantize_primfunc(rows)}) for rows in (8, 16, 4))
    meta = {"tasks": []}
    save_tasks(str(tmp_path), meta, [Task("t", 1, old), Task("u", 2, other)])
    kept = tmp_path / meta["tasks"][1]["file"]
    stamp = kept.stat().st_mtime_ns
    save_tasks(str(tmp_path), meta, [Task("t", 1, new), Task("u", 2, other)])
    t, u = load_tasks(str(tmp_path), meta)
    tvm.ir.assert_structural_equal(t.mod, new)
    tvm.ir.assert_structural_equal(u.mod, other)
    assert kept.stat().st_mtime_ns == stamp
