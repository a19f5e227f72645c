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
from tvm.ir.instrument import pass_instrument
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


# Loop annotations that make TVM's UnrollLoop pass unroll (RewriteParallelVectorizeUnroll
# turns MetaSchedule's unroll decision into these).
UNROLL_PRAGMAS = ("pragma_auto_unroll_max_step", "pragma_unroll_explicit")
# Passes of TVM's pipeline that only delete statements (no-ops) or share expressions: the
# slow ones (RemoveNoOp alone is a third of the pipeline on a conv candidate).  Leaving
# them out cannot add a failure or a vector shape; it can only keep code they would delete.
FAST_SKIPPED_PASSES = ("tirx.RemoveNoOp",)
FAST_CONFIG = {"tirx.disable_cse_tir": True}  # CommonSubexprElim, by TVM's own switch


def without_unroll_pragmas(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with the unroll pragmas taken off its loops (the loops stay as they are)."""

    def strip(loop):
        ann = loop.annotations
        if not any(key in ann for key in UNROLL_PRAGMAS):
            return loop
        kept = {k: v for k, v in ann.items() if k not in UNROLL_PRAGMAS}
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, loop.body, loop.thread_binding, kept)

    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.For, strip)]))


@pass_instrument
class _SkipPasses:
    """Pass instrument: TVM's pipeline as it is, minus the passes named."""

    def __init__(self, names) -> None:
        self.names = frozenset(names)

    def should_run(self, _mod, info) -> bool:
        return info.name not in self.names


def build_lowering(func: tirx.PrimFunc, name: str, target: tvm.target.Target, *, fast: bool = False) -> list:
    """The lowering ``tvm.compile`` runs for ``target`` (TVM's own default TIR pipeline,
    host/device split, device finalisation; everything but code generation): the
    device IRModules as the CUDA codegen receives them.  Raises what TVM raises.

    ``fast=True``: the same pipeline on the candidate without its unroll pragmas
    (``without_unroll_pragmas``) and without ``FAST_SKIPPED_PASSES`` / CSE.  Unrolling
    multiplies the code every later pass walks (0.1-0.9 s per valid conv candidate
    against 25-60 ms without).  For VerifyGPUCode's build checks, which look for pipeline
    failures and for broadcast shapes, not at code size; the one failure known to need
    unrolling (a cross-thread reduction copied by explicit unrolling) is checked with
    ``fast=False`` by the caller.  Validated by replaying verify-gpu's candidates.
    """
    from tvm.tirx.build import split_host_device_mods

    if fast:
        func = without_unroll_pragmas(func)
    func = func.with_attr("global_symbol", name).with_attr("tirx.noalias", True)
    host = tvm.target.Target("llvm" if tvm.runtime.enabled("llvm") else "c")
    context = (tvm.transform.PassContext(opt_level=3, instruments=[_SkipPasses(FAST_SKIPPED_PASSES)],
                                         config=FAST_CONFIG)
               if fast else tvm.transform.PassContext(opt_level=3))
    with context:
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
