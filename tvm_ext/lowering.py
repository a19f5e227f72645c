"""Lowering a scheduled GPU candidate as TVM's build does, without code generation or nvcc.

One library for everyone who needs to see what the GPU code will be: VerifyGPUCode's
checks (``lower_for_gpu``: the pipeline up to ``LowerIntrin``; ``build_lowering``: what
``tvm.compile`` hands to the CUDA codegen), kernel counting for reports, and the CUDA
source of a candidate for nvcc.
"""
from __future__ import annotations

from typing import Iterable

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import transform as stx
from tvm.s_tir.schedule import Schedule
from tvm.tirx import transform as ttx

from tvm_ext.tir_utils import prim_funcs, top_level_nests


def lowering_passes() -> list:
    """The GPU lowering pipeline up to LowerIntrin, as TVM's build runs it."""
    return [
        stx.LowerCrossThreadReduction(),
        stx.LowerInitBlock(),
        stx.PlanAndUpdateBufferAllocationLocation(),
        stx.ConvertBlocksToOpaque(),
        stx.LiftThreadBinding(),
        stx.ManifestSharedMemoryLocalStage(),
        stx.CompactBufferAllocation(),
        ttx.StmtSimplify(),
        stx.LowerAutoCopy(),
        stx.UnifyThreadBinding(),
        stx.LowerMatchBuffer(),
        stx.InjectSoftwarePipeline(),
        stx.LowerOpaqueBlock(),
        ttx.FlattenBuffer(),
        ttx.BF16ComputeLegalize(),
        ttx.NarrowDataType(32),
        ttx.StmtSimplify(),
        ttx.VectorizeLoop(True),
        stx.InjectVirtualThread(),
        stx.InjectDoubleBuffer(),
        ttx.StorageRewrite(),
        stx.MergeSharedMemoryAllocations(),
        ttx.LowerIntrin(),
    ]


def lower_for_gpu(func: tirx.PrimFunc, name: str, target: tvm.target.Target) -> tirx.PrimFunc:
    """Lower one scheduled PrimFunc far enough to see what the GPU code will do."""
    func = func.with_attr("global_symbol", name).with_attr("target", target)
    func = func.with_attr("tirx.noalias", True)
    mod = tvm.IRModule({name: func})
    with tvm.transform.PassContext(opt_level=3):
        mod = tvm.transform.Sequential(lowering_passes())(mod)
    return mod[name]


def build_lowering(func: tirx.PrimFunc, name: str, target: tvm.target.Target) -> list:
    """The lowering ``tvm.compile`` runs for ``target`` (TVM's own default TIR pipeline,
    host/device split, device finalisation; everything but code generation): the
    device IRModules as the CUDA codegen receives them.  Raises what TVM raises."""
    from tvm.tirx.build import split_host_device_mods

    func = func.with_attr("global_symbol", name).with_attr("tirx.noalias", True)
    host = tvm.target.Target("llvm" if tvm.runtime.enabled("llvm") else "c")
    with tvm.transform.PassContext(opt_level=3):
        mod = ttx.BindTarget(target.with_host(host))(tvm.IRModule({name: func}))
        pipeline, _host_passes, device_passes = tvm.tirx.get_default_tir_pipeline(target)
        _host_mod, device_mods = split_host_device_mods(pipeline(mod))
        return [device_passes()(device_mod) for device_mod in device_mods.values()]


def _as_mod(sch_or_mod) -> tvm.IRModule:
    if isinstance(sch_or_mod, Schedule):
        return sch_or_mod.mod
    if isinstance(sch_or_mod, tirx.PrimFunc):
        return tvm.IRModule({"main": sch_or_mod})
    return sch_or_mod


def cuda_source(sch_or_mod, target) -> str:
    """CUDA C source TVM generates for a scheduled candidate (no nvcc is run).

    TVM 0.27 keeps the source in the CUDA module and compiles lazily, so building
    for ``target`` runs TVM's whole lowering and code generation only.  Raises what
    TVM raises when lowering or codegen fails.
    """
    mod = _as_mod(sch_or_mod)
    mod = tvm.IRModule({gv: f.with_attr("global_symbol", gv.name_hint) if isinstance(f, tirx.PrimFunc) else f
                        for gv, f in mod.functions.items()})
    with tvm.transform.PassContext(opt_level=3):
        exe = tvm.compile(mod, target=target)
    sources = [m.inspect_source() for m in _walk_imports(exe.mod) if str(m.kind) == "cuda"]
    if not sources:
        raise RuntimeError("no CUDA module was generated")
    return "\n".join(sources)


def _walk_imports(module) -> Iterable:
    stack = list(module.imports)
    while stack:
        m = stack.pop()
        yield m
        stack.extend(m.imports)


def _outer_thread_scopes(stmt) -> int:
    count = 0

    def visit(node, visitor):
        nonlocal count
        if isinstance(node, tirx.AttrStmt) and node.attr_key == "thread_extent":
            count += 1
            return None  # nested thread scopes belong to this kernel
        return visitor.default_visit(node)

    tvm_ffi.structural_visit(stmt, [(tirx.Stmt, visit)])
    return count


def count_kernels(sch_or_mod, target=None) -> int:
    """Device kernels of a scheduled GPU candidate (summed over its PrimFuncs).

    The candidate is lowered as the GPU build lowers it and every outermost
    thread-extent scope (a launch) is counted.  Without a ``target`` -- or when
    lowering fails -- it counts top-level loop nests under the root block, which for
    a scheduled GPU candidate are each bound to blockIdx (one kernel each); for an
    llvm candidate that is the number of loop nests.
    """
    mod = _as_mod(sch_or_mod)
    total = 0
    for name, func in prim_funcs(mod):
        n = None
        if target is not None and str(target.kind.name) == "cuda":
            try:
                n = _outer_thread_scopes(lower_for_gpu(func, name, target).body)
            except Exception:  # noqa: BLE001 -- fall back to the structural count
                n = None
        total += n if n else top_level_nests(func)
    return total
