"""ONNX Runtime and OpenVINO as peers of the tuned int8 networks: end to end (both) and per conv layer (ORT).

End to end: the workload's recorded QuantGraph is exported to ONNX (same weights and
quantization parameters, see ``onnx_export``) and timed in the same interleaved rounds
as the TVM networks. ORT rounds differently, so its row reports how far its output is
from the exact reference in uint8 steps instead of claiming a match.

Per layer: every conv task of a tuning database is built from its best record and
timed against one ORT ``QLinearConv`` of the same shape (NCHW, ORT's own layout),
alternating the two in each round. A task that also fuses a residual add is timed
against the QLinearConv followed by ORT's ``QLinearAdd`` (its row's ``epilogue`` says
``requantize+add``).
"""
from __future__ import annotations

import math

import numpy as np

from tvm_ext import tune as tuning
from tvm_ext.arrays import random_arrays
from tvm_ext.bench.timing import time_interleaved

PEERS = ("ort", "ov", "tvm-onnx", "torch")  # ov: OpenVINO's CPU plugin; tvm-onnx: TVM's own from_onnx on an
# imported .onnx; torch: PyTorch's fp16 ResNet-50 on a GPU (``torch_peers``)


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
def peer_model(workload, what: str = "ort"):
    """The workload's network as ONNX for a peer runtime: (ModelProto, input name, output name or
    None for the only one, diff(out) -> {"max_step", "frac_differ"} against the exact reference,
    weights label, source label).

    An imported .onnx is that very file (its float output compared in output quantization steps).
    A built-in network is its recorded QuantGraph exported (same weights and quantization
    parameters): for ORT as QLinearConv with residual adds as ``com.microsoft.QLinearAdd``, for
    OpenVINO (which reads neither) in QDQ form; weights int8 on VNNI hosts and uint8 elsewhere,
    where ORT's int8 kernels saturate (``onnx_export.weight_inputs``); its uint8 output compared
    in uint8 steps. One-step rounding differences of single layers grow through a deep network
    (a random-weight ResNet-50 ends up most outputs off in either form)."""
    import onnx

    from tvm_ext.bench import onnx_export

    src = getattr(workload, "onnx_source", None)
    ref = workload.reference(workload.inputs)
    if src:
        def diff_file(out):
            steps = np.rint(np.abs(out.astype(np.float64) - ref) / src["out_scale"])
            return {"max_step": int(steps.max()), "frac_differ": float(np.mean(steps > 0))}

        return onnx.load(src["path"]), src["input"], src["output"], diff_file, "file", f" ({src['path']})"
    graph = workload.reference
    if not hasattr(graph, "steps"):
        raise ValueError(f"--peers {what}: workload {workload.name!r} has no quantized graph to export")
    weights = onnx_export.exact_weights_for_host()
    model, _ = onnx_export.export_quant_graph(graph, workload.inputs[0].shape[0], exact_add=False, weights=weights,
                                              form="qdq" if what == "ov" else "qoperator")
    # the exported graph is NCHW inside; a network ending in a conv returns NCHW
    return model, "images", None, lambda out: onnx_export.diff_steps(onnx_export.to_nhwc(out), ref), weights, ""


def _said(name: str, source: str, diff: dict, log) -> None:
    log(f"{name}{source}: output differs from the exact reference by up to {diff['max_step']} "
        f"steps in {100 * diff['frac_differ']:.1f}% of the outputs")


def ort_network(workload, threads: int, log=print):
    """(callable running the workload's network in ORT, diff of its output vs the reference,
    weight type used): see ``peer_model``."""
    from tvm_ext.bench import onnx_export

    model, input_name, output, diff_of, weights, source = peer_model(workload, "ort")
    sess = onnx_export.ort_session(model, threads)
    feed = {input_name: workload.inputs[0]}
    out = sess.run([output] if output else None, feed)[0]
    diff = diff_of(out)
    _said("ort", source, diff, log)
    return (lambda: sess.run(None, feed)), diff, weights


def check_torch_peer(workload) -> None:
    """ValueError (one line) where ``workload`` has no PyTorch peer or PyTorch / torchvision is missing."""
    from tvm_ext.bench import torch_peers

    if not workload.name.startswith("resnet50") or getattr(workload, "onnx_source", None):
        raise ValueError(f"peer 'torch' times torchvision's ResNet-50: not a peer of {workload.name}")
    torch_peers.check_available("torchvision")


def torch_network(workload, target, log=print):
    """(callable, info) of PyTorch's ResNet-50 at the workload's batch and image size on ``target``'s device
    (``torch_peers.resnet50``: fp16, channels_last, a CUDA graph on CUDA; random weights, so a speed peer
    whose output is not compared); ValueError for a network other than the built-in ResNet-50s."""
    from tvm_ext.bench import torch_peers

    check_torch_peer(workload)
    opts = workload.options
    device = "cuda" if target.kind.name == "cuda" else "cpu"
    fn, info = torch_peers.resnet50(opts.get("batch", 1), opts.get("image", 224), device)
    log(f"torch: {info['model']}, {info['dtype']} {info['layout']} on {info['device']}, "
        f"CUDA graph: {info['cuda_graph']}")
    return fn, info


def _openvino():
    """``import openvino`` without its telemetry. OpenVINO imports its converter, which imports
    ``openvino_telemetry``; that sends usage data to Google Analytics without asking, from a thread
    that forks a process (that fork once deadlocked in OpenBLAS's fork handler in the middle
    of a bench). With the module blocked before the first import, the converter falls back to its
    own no-op stub. Too late when the process imported OpenVINO before: then it is left as it is."""
    import sys

    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino_telemetry", None)  # its import raises ImportError: the stub is used
    import openvino

    return openvino


def ov_network(workload, threads: int, log=print):
    """(callable running the workload's network in OpenVINO's CPU plugin, diff of its output vs the
    reference, settings): the same ONNX model ORT runs (``peer_model``), compiled with the latency
    hint, ``threads`` inference threads and its float parts in f32. OpenVINO's default on CPUs
    with bf16 (AVX512-BF16, AMX) is bf16. Measured (OpenVINO 2026.4, an AVX-512 host):
    on a user's QDQ file (the zoo's MobileNetV2) within 13 steps of the exact reference where ORT
    is within 1; on the exported QLinearConv of the built-in networks up to 122 steps off, in f32
    and bf16 alike and whatever its scales and zero points, where ORT is exact: so a built-in
    network reaches OpenVINO in QDQ form (``peer_model``); read its row's steps before its time."""
    import importlib.util
    import os
    import tempfile

    import onnx

    if importlib.util.find_spec("openvino") is None:
        raise ValueError("--peers ov needs OpenVINO: pip install -e '.[bench]'")
    ov = _openvino()

    model, input_name, output, diff_of, weights, source = peer_model(workload, "ov")
    core = ov.Core()
    with tempfile.TemporaryDirectory(prefix="tvm_ext_ov_") as tmp:
        path = os.path.join(tmp, "model.onnx")
        onnx.save(model, path)
        try:
            read = core.read_model(path)
        except RuntimeError as err:  # e.g. com.microsoft ops in a user's QOperator file
            last = [ln.strip() for ln in str(err).splitlines() if ln.strip()][-1:]
            raise ValueError(f"--peers ov: OpenVINO cannot read {workload.name}'s ONNX model "
                             f"({last[0] if last else err}); it runs ONNX files with standard ops, "
                             "e.g. a QDQ model") from None
        compiled = core.compile_model(read, "CPU",
                                      {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": int(threads),
                                       "INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    feed = {input_name: workload.inputs[0]}
    out = np.asarray(request.infer(feed)[compiled.output(output) if output else compiled.output(0)])
    diff = diff_of(out)
    _said("ov", source, diff, log)
    settings = {"version": ov.get_version(), "weights": weights,
                "inference_precision": str(compiled.get_property("INFERENCE_PRECISION_HINT"))}
    return (lambda: request.infer(feed)), diff, settings


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
