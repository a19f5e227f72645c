"""ONNX Runtime as a peer of the tuned int8 networks, end to end and per conv layer.

End to end: the workload's recorded QuantGraph is exported to ONNX (same weights and
quantization parameters, see ``onnx_export``) and timed in the same interleaved rounds
as the TVM networks. ORT rounds differently, so its row reports how far its output is
from the exact reference in uint8 steps instead of claiming a match.

Per layer: every conv task of a tuning database is built from its best record and
timed against one ORT ``QLinearConv`` of the same shape (NCHW, ORT's own layout),
alternating the two in each round. A task that also fuses a residual add is timed
against the QLinearConv followed by ORT's ``QLinearAdd`` (its row's ``epilogue`` says
``requantize+add``); until session 14 that peer was the lone QLinearConv.
"""
from __future__ import annotations

import math

import numpy as np

from tvm_ext import tune as tuning
from tvm_ext.arrays import random_arrays
from tvm_ext.bench.timing import time_interleaved

PEERS = ("ort", "tvm-onnx")  # tvm-onnx: TVM's own from_onnx on an imported .onnx workload


def parse_peers(text: str | None, known=PEERS, what: str = "peer") -> list[str]:
    """'a,b' -> ['a', 'b']; ValueError naming an unknown ``what`` and the ``known`` ones."""
    names = [s.strip() for s in (text or "").split(",") if s.strip()]
    for name in names:
        if name not in known:
            raise ValueError(f"unknown {what} {name!r}; known: {', '.join(known)}")
    return names


def threads_of(target) -> int:
    """Threads TVM uses for ``target``: its num-cores, else the physical cores."""
    from tvm_ext.targets import physical_cores

    cores = target.attrs.get("num-cores") if hasattr(target, "attrs") else None
    return int(cores) if cores else physical_cores()


# ----------------------------------------------------------------------------- end to end
def ort_network(workload, threads: int, log=print):
    """(callable running the exported network in ORT, diff of its output vs the reference,
    weight type used).

    The residual adds use ``com.microsoft.QLinearAdd`` (what ORT runs fastest); weights
    are int8 on VNNI hosts and uint8 elsewhere, where ORT's int8 kernels saturate (see
    ``onnx_export.weight_inputs``). The diff is the largest difference in uint8 steps
    and the fraction of differing outputs: one-step rounding differences of single
    layers grow through a deep network."""
    from tvm_ext.bench import onnx_export

    if getattr(workload, "onnx_source", None):  # an imported .onnx: ORT runs that very file
        return _ort_file(workload, threads, log)
    graph = workload.reference
    if not hasattr(graph, "steps"):
        raise ValueError(f"--peers ort: workload {workload.name!r} has no quantized graph to export")
    batch = workload.inputs[0].shape[0]
    weights = onnx_export.exact_weights_for_host()
    model, _ = onnx_export.export_quant_graph(graph, batch, exact_add=False, weights=weights)
    sess = onnx_export.ort_session(model, threads)
    feed = {"images": workload.inputs[0]}
    (out,) = sess.run(None, feed)
    # the exported graph is NCHW inside; a network ending in a conv returns NCHW
    diff = onnx_export.diff_steps(onnx_export.to_nhwc(out), workload.reference(workload.inputs))
    log(f"ort: output differs from the exact reference by up to {diff['max_step']} uint8 "
        f"steps in {100 * diff['frac_differ']:.1f}% of the outputs")
    return (lambda: sess.run(None, feed)), diff, weights


def _ort_file(workload, threads: int, log=print):
    """ORT on the imported model's own file; its float output compared with the exact
    reference in output quantization steps."""
    import onnx

    from tvm_ext.bench import onnx_export

    src = workload.onnx_source
    sess = onnx_export.ort_session(onnx.load(src["path"]), threads)
    feed = {src["input"]: workload.inputs[0]}
    (out,) = sess.run([src["output"]], feed)
    steps = np.rint(np.abs(out.astype(np.float64) - workload.reference(workload.inputs)) / src["out_scale"])
    diff = {"max_step": int(steps.max()), "frac_differ": float(np.mean(steps > 0))}
    log(f"ort ({src['path']}): output differs from the exact reference by up to {diff['max_step']} "
        f"steps in {100 * diff['frac_differ']:.1f}% of the outputs")
    return (lambda: sess.run(None, feed)), diff, "file"


def tvm_onnx_network(workload, target, log=print):
    """(callable, diff): the imported .onnx built by TVM's own Relax frontend (``from_onnx``:
    QDQ as float math around float convolutions) with TVM's default schedules -- what a
    TVM user gets without tvm_ext; its output compared with the exact reference in steps."""
    import onnx
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    src = getattr(workload, "onnx_source", None)
    if not src:
        raise ValueError(f"--peers tvm-onnx: workload {workload.name!r} is not an imported .onnx file")
    x = workload.inputs[0]
    mod = from_onnx(onnx.load(src["path"]), shape_dict={src["input"]: list(x.shape)}, keep_params_in_input=False)
    mod = relax.transform.DecomposeOpsForInference()(mod)
    log("building TVM's from_onnx module (default schedules) ...")
    with target:
        vm = tuning.make_vm(relax.build(mod, target=target), target)
    dev = tuning.device_for(target)
    arg = tvm.runtime.tensor(x, dev)
    out = vm["main"](arg)
    out = (out if hasattr(out, "numpy") else out[0]).numpy()
    steps = np.rint(np.abs(out.astype(np.float64) - workload.reference(workload.inputs)) / src["out_scale"])
    diff = {"max_step": int(steps.max()), "frac_differ": float(np.mean(steps > 0))}
    return (lambda: (vm["main"](arg), dev.sync())), diff


# ----------------------------------------------------------------------------- per layer
def conv_shape(func) -> dict | None:
    """The conv shape of a fused conv task, read from its argument shapes, or None.

    Handles NHWC (data [n, h, w, c], weights HWIO) and packed NCHWc (data
    [n, c/b, h, w, b], weights packed with any blocking): channels come from the data and
    output tensors, the kernel size from the weight's element count, the stride from the
    spatial sizes; padding is ``k // 2`` as in every conv of the int8 workloads.
    """
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    infos = [(str(a.dtype), [int(d) for d in a.shape]) for a in ArgInfo.from_prim_func(func)]
    at = next((i for i, (d, s) in enumerate(infos) if d == "uint8" and len(s) in (4, 5)), None)
    data = None if at is None else infos[at][1]
    weight = next((s for d, s in infos if d == "int8" and len(s) >= 4), None)
    out_dtype, out = infos[-1]
    if data is None or weight is None or out_dtype != "uint8" or len(out) != len(data):
        return None

    def split(shape):  # (spatial h, spatial w, channels)
        return (shape[1], shape[2], shape[3]) if len(shape) == 4 else (shape[2], shape[3], shape[1] * shape[4])

    (h, w, c_in), (ho, _, c_out) = split(data), split(out)
    k = math.isqrt(math.prod(weight) // (c_in * c_out))
    stride = next((s for s in (1, 2, 4) if (h + 2 * (k // 2) - k) // s + 1 == ho), None)
    if k * k * c_in * c_out != math.prod(weight) or stride is None:
        return None
    residual = sum(1 for d, s in infos[at + 1:-1] if d == "uint8" and s == out)
    return {"n": data[0], "h": h, "w": w, "c_in": c_in, "c_out": c_out, "k": k,
            "stride": stride, "pad": k // 2, "epilogue": "requantize+add" if residual else "requantize"}


def shape_label(shape: dict) -> str:
    return (f"{shape['n']}x{shape['h']}x{shape['w']}x{shape['c_in']}->{shape['c_out']} "
            f"k{shape['k']}s{shape['stride']}")


def layer_rows(work_dir: str, target, threads: int, rounds: int = 10, repeat: int = 5,
               log=print) -> list[dict]:
    """Per conv task of the database at ``work_dir``: TVM (best record) vs ORT microseconds,
    medians of ``rounds`` x ``repeat`` calls each: the two take turns, ``repeat`` calls a
    turn after a pause (``timing.time_interleaved``)."""
    import tvm

    from tvm_ext.bench import onnx_export

    meta = tuning.read_meta(work_dir)
    database = tuning.open_database(work_dir, read_only=True)
    dev = tuning.device_for(target)
    rng = np.random.default_rng(0)
    rows = []
    tasks = tuning.load_tasks(work_dir, meta)
    for i, task in enumerate(tasks, 1):
        shape = conv_shape(task.mod["main"])
        record = tuning.best_record(database, task.mod)
        if shape is None or record is None or tuning.record_seconds(record) is None:
            continue
        lib = tvm.compile(tuning.scheduled_mod(record, task.mod), target=target)
        args = [tvm.runtime.tensor(a, dev) for a in random_arrays(task.mod["main"], rng, int_range=(-100, 100))]
        model, feed = onnx_export.ort_conv_model(shape)
        sess = onnx_export.ort_session(model, threads)
        secs = time_interleaved({"tvm": lambda: (lib["main"](*args), dev.sync()),
                                 "ort": lambda: sess.run(None, feed)}, rounds, repeat=repeat, log=log)
        row = {"shape": shape_label(shape), "task": task.name, "count": task.weight,
               "epilogue": shape["epilogue"], "tvm_us": secs["tvm"] * 1e6, "ort_us": secs["ort"] * 1e6}
        log(f"[{i}/{len(tasks)}] {row['shape']} ({row['epilogue']}, x{row['count']}): "
            f"tvm {row['tvm_us']:.0f} us, ort {row['ort_us']:.0f} us")
        rows.append(row)
    return rows
