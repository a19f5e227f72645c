"""Per conv task of a database: the tuning runner's record, TVM alone, TVM and ORT's QLinearConv
alternating call by call, and the bench's method (turns after the threads are idle), in us.

    python3 tools/lent-machine/diag.py tuning_logs/resnet50-int8-amx-emeraldrapids16-llvm-plugin 3

Session 13 ran it (with a fixed 50 ms pause for the last column) when tuned AMX kernels timed at
8-20 ms in the bench and 0.04-0.25 ms in the tuning runner: the call-by-call alternation was why."""
import gc
import sys
import time
import numpy as np
import tvm
from tvm_ext import tune as tuning
from tvm_ext.bench import onnx_export, peers
from tvm_ext.bench.timing import time_interleaved
from tvm_ext.targets import resolve_target, has_amx
from tvm_ext.amx import request_amx

wd, ntasks = sys.argv[1], int(sys.argv[2])
target = resolve_target("llvm")
if has_amx(target):
    request_amx()
threads = peers.threads_of(target)
meta = tuning.read_meta(wd)
db = tuning.open_database(wd, read_only=True)
dev = tvm.cpu(0)
rng = np.random.default_rng(0)
print(f"{'task':<48} {'runner':>8} {'alone':>8} {'old tvm':>8} {'old ort':>8} {'new tvm':>8} {'new ort':>8}  "
      f"(us, {threads} threads)")
done = 0
for task in tuning.load_tasks(wd, meta):
    shape = peers.conv_shape(task.mod["main"])
    rec = tuning.best_record(db, task.mod)
    if shape is None or rec is None or tuning.record_seconds(rec) is None:
        continue
    lib = tvm.compile(tuning.scheduled_mod(rec, task.mod), target=target)
    args = [tvm.runtime.tensor(a, dev) for a in peers.random_arrays(task.mod["main"], rng, int_range=(-100, 100))]

    def f():
        lib["main"](*args)
        dev.sync()

    gc.collect()
    time.sleep(0.2)
    alone = time_interleaved({"tvm": f}, 10, repeat=5)["tvm"]
    model, feed = onnx_export.ort_conv_model(shape)
    sess = onnx_export.ort_session(model, threads)

    def g():
        return sess.run(None, feed)

    old = time_interleaved({"tvm": f, "ort": g}, 50, settle=None)
    new = time_interleaved({"tvm": f, "ort": g}, 10, repeat=5)
    print(f"{task.name:<48} {tuning.record_seconds(rec)*1e6:8.1f} {alone*1e6:8.1f} {old['tvm']*1e6:8.1f} "
          f"{old['ort']*1e6:8.1f} {new['tvm']*1e6:8.1f} {new['ort']*1e6:8.1f}", flush=True)
    sess = None  # release ORT's thread pool before the next task's session
    done += 1
    if done >= ntasks:
        break
