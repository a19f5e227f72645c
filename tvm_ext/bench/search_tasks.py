"""The tasks ``tvm-ext bench-search`` measures: one PrimFunc each, from our workloads.

Every task but ``seed`` is a task MetaSchedule extracts from one of our workloads
(``tvm_ext.tune.extract_tasks`` on ``tvm_ext.workloads.get(...)``), taken as it is: the
same PrimFunc a tuning run of that workload tunes.  The workloads are built at their
real sizes (what is tuned), batch 1:

resnet-conv-heavy      resnet50-int8 (NHWC, 224x224): the conv task with the most work
                       in the network, FLOPs (``estimate_tir_flops``) x weight (how many
                       times the network calls it).
resnet-conv-residual   resnet50-int8: the conv task with a residual add fused in (name
                       contains ``_add_``) with the most FLOPs x weight.
phi2-decode-gemv       phi2-decode (config full, context 512): the q4 dequantize-GEMV of the
                       QKV projection, ``fused_fused_dequantize_matmul_add`` (1 x 2560 x 7680).
phi2-prefill-matmul    phi2-prefill (config full, 128 tokens): the same layer's dequantize
                       matmul, ``fused_fused_dequantize_matmul_add`` (128 x 2560 x 7680).

phi2 runs in float16 on cuda and float32 on llvm (``compute_dtype``, as its cuda and CPU
tuning do), so its tasks differ by target.  A workload is built and its tasks extracted
once per process and target (``functools.lru_cache``); a ResNet or phi2 build takes a few
seconds (random weights).

Public API
----------
TARGETS, TASKS, target(name), task_names(spec) -> tuple
TASKS[name](target_name) -> tvm.tirx.PrimFunc
"""
from __future__ import annotations

import functools

TARGETS = ("cuda", "llvm")

# workload -> the options it is built with (see the module doc)
_OPTIONS = {
    "resnet50-int8": {"batch": 1, "image": 224},
    "phi2-decode": {"config": "full", "context": 512},
    "phi2-prefill": {"config": "full", "tokens": 128},
}


def target(name: str):
    """The Target of a bench-search target name: cuda sm_80 (generated on the CPU) or the host."""
    from tvm_ext.targets import cuda_target, host_target

    if name == "cuda":
        return cuda_target("sm_80")
    if name == "llvm":
        return host_target()
    raise ValueError(f"unknown target {name!r}; bench-search knows {', '.join(TARGETS)}")


@functools.lru_cache(maxsize=None)
def workload_tasks(workload: str, target_name: str) -> tuple:
    """(name, weight, flops, IRModule) of each task of ``workload`` for a target, largest
    weight first (``tvm_ext.tune.extract_tasks``'s order); cached per process."""
    from tvm.s_tir.analysis import estimate_tir_flops

    from tvm_ext import workloads
    from tvm_ext.tune import extract_tasks

    options = dict(_OPTIONS[workload])
    if workload.startswith("phi2") and target_name == "cuda":
        options["compute_dtype"] = "float16"  # what runs on CUDA
    wl = workloads.get(workload, **options)
    return tuple((t.name, t.weight, float(estimate_tir_flops(t.mod)), t.mod)
                 for t in extract_tasks(wl, target(target_name)))


def _func(mod):
    return mod["main"].with_attr("global_symbol", "main")


def _heaviest(workload: str, target_name: str, keep) -> object:
    """The task of ``workload`` with the most FLOPs x weight among those ``keep(name)`` accepts."""
    tasks = [t for t in workload_tasks(workload, target_name) if keep(t[0])]
    if not tasks:
        raise ValueError(f"{workload} has no such task for {target_name}")
    name, _weight, _flops, mod = max(tasks, key=lambda t: (t[2] * t[1], t[0]))
    return _func(mod)


def _named(workload: str, target_name: str, name: str) -> object:
    for task_name, _weight, _flops, mod in workload_tasks(workload, target_name):
        if task_name == name:
            return _func(mod)
    raise ValueError(f"{workload} has no task {name!r} for {target_name}")


def _seed(_target_name: str):
    from tvm_ext.workloads.conv2d_int8 import seed_conv_primfunc

    return seed_conv_primfunc()


def _is_conv(name: str) -> bool:
    return "conv2d" in name


# name -> builder of the PrimFunc for a target name; the search-cost tasks
TASKS: dict = {
    "seed": _seed,
    "resnet-conv-heavy": lambda t: _heaviest("resnet50-int8", t, _is_conv),
    "resnet-conv-residual": lambda t: _heaviest("resnet50-int8", t, lambda n: _is_conv(n) and "_add_" in n),
    "phi2-decode-gemv": lambda t: _named("phi2-decode", t, "fused_fused_dequantize_matmul_add"),
    "phi2-prefill-matmul": lambda t: _named("phi2-prefill", t, "fused_fused_dequantize_matmul_add"),
}


def task_names(values) -> tuple:
    """The task names asked for, ``all`` meaning every task (in TASKS order); ValueError
    (one line naming the known tasks) for an unknown one."""
    values = tuple(values)
    if not values:
        raise ValueError("no task given")
    out = []
    for v in values:
        if v == "all":
            out += [t for t in TASKS if t not in out]
        elif v in TASKS:
            if v not in out:
                out.append(v)
        else:
            raise ValueError(f"unknown task {v!r}; choose from {', '.join(TASKS)} or all")
    return tuple(out)
