"""``tvm-ext import``: import an int8 ONNX model into integer Relax and check it against ONNX Runtime."""
from __future__ import annotations

import numpy as np

from tvm_ext.cli.common import log
from tvm_ext.int8_path import LAYOUTS


def add_parser(sub) -> None:
    p = sub.add_parser(
        "import", help="import an int8 ONNX model (QDQ or QOperator) and check it against ONNX Runtime",
        description="Import an int8 ONNX model quantized by ONNX Runtime (QDQ or QOperator format) into "
                    "integer Relax (the quantized ops and requantize epilogues tvm_ext's rules tune), "
                    "print the ops found, the fused tasks and the parameters, then build the module "
                    "with TVM's default schedules (no tuning) and compare it with ONNX Runtime on the "
                    "same file and seeded random inputs: largest difference in output quantization "
                    "steps, fraction of outputs that differ, top-1 agreement, and per layer (each "
                    "layer fed ORT's own inputs). Nothing is written.")
    p.add_argument("model", metavar="MODEL.onnx", help="the quantized ONNX model")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=1x3x224x224",
                   help="static shape of an input (needed where the model's is dynamic)")
    p.add_argument("--layout", default="auto", choices=LAYOUTS,
                   help="activation layout of the integer module: nhwc; nchwc, the packed "
                        "NCHW[x]c layout the VNNI / AVX2 int8 rules tensorize (plain or depthwise convs, no "
                        "concat); amx, the same with 64-channel blocks that the AMX rule tiles; s8, NHWC with the "
                        "convs on signed activations (CUDA int8 tensor cores); default "
                        "auto: amx on --target with AMX int8, nchwc where it "
                        "tensorizes on --target (VNNI or AVX2), else nhwc")
    p.add_argument("--target", default="llvm", help="target of the check build (default llvm: this CPU)")
    p.add_argument("--images", type=int, default=3, help="random inputs compared with ORT (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--no-check", action="store_true", help="only import and list; build and compare nothing")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def ort_outputs(path: str, imported, inputs, layers: bool = False) -> list[dict]:
    """ORT's outputs on ``inputs`` (name -> array); with ``layers`` every imported
    integer tensor of the model is an output too."""
    import onnx  # pylint: disable=import-outside-toplevel
    from onnx import TensorProto, helper  # pylint: disable=import-outside-toplevel

    from tvm_ext.bench.onnx_export import ort_session  # pylint: disable=import-outside-toplevel

    model = onnx.load(path)
    if layers:
        known = {o.name for o in model.graph.output}
        for name, (_, signed) in imported.layers.items():
            if name not in known:
                model.graph.output.append(
                    helper.make_tensor_value_info(name, TensorProto.INT8 if signed else TensorProto.UINT8, None))
    sess = ort_session(model, threads=1)
    names = [o.name for o in sess.get_outputs()]
    return [dict(zip(names, sess.run(None, {imported.input_name: x}))) for x in inputs]


def per_layer(imported, x, ort: dict) -> dict:
    """Per imported layer: ``diff_steps`` of our step (the graph's own arithmetic: fixed point or,
    in the packed layouts, float32 requantize) run on ORT's own inputs vs ORT's output."""
    from tvm_ext.bench.onnx_export import diff_steps  # pylint: disable=import-outside-toplevel

    g = imported.graph
    ref = g.reference
    by_index = {idx: (name, signed) for name, (idx, signed) in imported.layers.items()}
    values = [x]
    result = {}
    for i, step in enumerate(g.steps):
        out = getattr(ref, step.op)(*(values[j] for j in step.inputs), *step.consts, **step.attrs)
        idx = len(g.input_specs) + i
        if idx in by_index:
            name, signed = by_index[idx]
            theirs = ort[name].astype(np.int32) + (128 if signed else 0)
            theirs = (theirs.transpose(0, 2, 3, 1) if theirs.ndim == 4 else theirs).astype(np.uint8)
            result[name] = diff_steps(out.reshape(theirs.shape), theirs)
            out = theirs.reshape(out.shape)  # the next layers start from ORT's values
        values.append(out)
    return result


def compare(path: str, imported, images: int = 3, seed: int = 0, target=None, layers: bool = True) -> dict:
    """Build the module (default schedules), run it on ``images`` seeded random inputs and
    compare with ORT and with the exact NumPy reference of the integer graph."""
    import tvm  # pylint: disable=import-outside-toplevel

    from tvm_ext.tune.apply import compile_workload, make_vm  # pylint: disable=import-outside-toplevel

    target = target or tvm.target.Target("llvm")
    rng = np.random.RandomState(seed + 7)
    inputs = [rng.randn(*imported.input_shape).astype(np.float32) for _ in range(images)]
    vm = make_vm(compile_workload(imported.workload, target, None), target)
    theirs = ort_outputs(path, imported, inputs, layers=layers)
    steps, agree, exact, worst = [], 0, 0, {}
    for x, ort in zip(inputs, theirs):
        ours = vm["main"](tvm.runtime.tensor(x)).numpy()
        exact += int(np.array_equal(ours, imported.graph([x])))
        ref = ort[imported.output_name]
        d = np.rint(np.abs(ours.astype(np.float64) - ref) / imported.out_scale)
        steps.append(d)
        top_ours = np.argmax(ours.reshape(ours.shape[0], -1), 1).tolist()
        agree += int(top_ours == np.argmax(ref.reshape(ref.shape[0], -1), 1).tolist())
        if layers:
            for name, diff in per_layer(imported, x, ort).items():
                if diff["max_step"] >= worst.get(name, {"max_step": -1})["max_step"]:
                    worst[name] = diff
    d = np.stack(steps)
    out = {"max_step_vs_ort": int(d.max()), "frac_differ_vs_ort": float(np.mean(d > 0)),
           "top1_agree_vs_ort": f"{agree}/{images}", "images": images,
           "exact_vs_reference": f"{exact}/{images}"}
    if layers and worst:
        out["layer_max_step_vs_ort"] = max(v["max_step"] for v in worst.values())
        out["layers_over_1_step"] = sorted(k for k, v in worst.items() if v["max_step"] > 1)
    return out


def run(args) -> int:
    import json
    import os

    from tvm_ext.cli.common import resolve_target
    from tvm_ext.frontend.onnx_int8 import import_onnx, parse_shapes

    shapes = parse_shapes(args.shape)
    if args.images < 1:
        raise ValueError(f"--images must be at least 1, not {args.images}")
    if not os.path.isfile(args.model):
        raise ValueError(f"{args.model}: no such file")
    target = resolve_target(args.target)
    imported = import_onnx(args.model, shapes, args.layout, target, seed=args.seed, log=log)
    from tvm_ext.tune import extract_tasks  # pylint: disable=import-outside-toplevel

    tasks = extract_tasks(imported.workload, target)
    result = {"model": args.model, "sha256": imported.sha256, "workload": imported.workload.name,
              "input": {imported.input_name: list(imported.input_shape)}, "layout": imported.layout,
              "ops": dict(sorted(imported.ops.items())), "steps": len(imported.graph.steps),
              "tasks": len(tasks), "task_list": [{"name": t.name, "weight": t.weight} for t in tasks],
              "parameters": imported.params}
    if not args.no_check:
        log(f"building with default schedules and comparing with ONNX Runtime on {args.images} inputs ...")
        result.update(compare(args.model, imported, args.images, args.seed, target))
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{args.model}: {imported.workload.name}, input {imported.input_name} {list(imported.input_shape)}, "
          f"layout {imported.layout}")
    print("ops: " + ", ".join(f"{k} {v}" for k, v in result["ops"].items()))
    print(f"tasks: {len(tasks)} ({sum(t.weight for t in tasks)} calls); parameters: {imported.params:,}")
    for t in tasks:
        print(f"  {t.weight:3d} x {t.name}")
    if not args.no_check:
        print(f"vs ONNX Runtime: max {result['max_step_vs_ort']} steps, {result['frac_differ_vs_ort']:.2%} of "
              f"outputs differ, top-1 agrees {result['top1_agree_vs_ort']}; per layer (ORT's inputs): max "
              f"{result.get('layer_max_step_vs_ort')} steps; compiled == NumPy reference: "
              f"{result['exact_vs_reference']}")
    return 0
