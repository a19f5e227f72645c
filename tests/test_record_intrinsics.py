"""A database whose records name TVM's wmma intrinsics opens in a fresh process (issue 50): TVM replays
each trace as it loads it, and before, only ``tvm_ext.space()`` registered those intrinsics, so
``bench --from-logs`` could not load the plugin's int8 tensor-core records."""
import subprocess
import sys

import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms

import tvm_ext
from tvm_ext.targets import cuda_target
from tvm_ext.tune import database as D
from tvm_ext.tune.sampling import sample_candidates
from tvm_ext.workloads.qnn_signed import conv2d_nhwc_s8

TARGET = cuda_target("sm_80")


def test_tensorize_names_are_read_from_a_records_file(tmp_path):
    path = tmp_path / "database_tuning_record.json"
    path.write_bytes(b'[0, [[[["Tensorize", ["b1"], ["wmma_sync_16x16x16_s8s8s32", true], []],'
                     b' ["Tensorize",["b2"],["tvm_ext.amx_dot", 1],[]]], []]]]\n')
    assert D.record_intrinsics(str(path), str(tmp_path / "missing")) == {"wmma_sync_16x16x16_s8s8s32",
                                                                         "tvm_ext.amx_dot"}


def test_a_database_of_wmma_records_opens_in_a_fresh_process(tmp_path):
    data = te.placeholder((1, 8, 8, 64), "uint8", name="data")
    w = te.placeholder((3, 3, 64, 64), "int8", name="w")
    func = te.create_prim_func([data, w, conv2d_nhwc_s8(data, w, pad=1, zp_in=100)]).with_attr("global_symbol", "main")
    mod = tvm.IRModule({"main": func})
    schs = [s for s in sample_candidates(mod, TARGET, tvm_ext.space(TARGET), 8, seed=0) if "wmma" in s.mod.script()]
    assert schs, "no tensor-core candidate sampled"
    work = tmp_path / "work"
    work.mkdir()
    db = ms.database.JSONDatabase(str(work / D.DB_FILES[0]), str(work / D.DB_FILES[1]), allow_missing=True)
    db.commit_tuning_record(ms.database.TuningRecord(schs[0].trace, db.commit_workload(mod), run_secs=[1e-5],
                                                     target=TARGET, args_info=ms.arg_info.ArgInfo.from_prim_func(func)))
    assert any(n.startswith("wmma_") for n in D.record_intrinsics(str(work / D.DB_FILES[1])))
    code = ("import sys; from tvm_ext.tune.database import open_database; "
            "print(len(open_database(sys.argv[1], read_only=True).get_all_tuning_records()))")
    run = subprocess.run([sys.executable, "-c", code, str(work)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "1"
