"""VerifyGPUCode: reject GPU candidates that would not compile or run, and say why.

Pattern: any scheduled candidate for a CUDA target. The candidate is lowered as
TVM's GPU build lowers it -- including ``LowerIntrin``, which expands
``q_multiply_shift`` / ``q_multiply_shift_per_axis`` into int64 arithmetic -- and
then checked for: threads per block, shared memory per block, virtual threads,
thread-extent annotations of MetaSchedule, and the byte width of every vector it
finds in loads, stores *and Cast nodes*.  Last, the candidate must pass the lowering
``tvm.compile`` itself runs, which has passes the short pipeline lacks, and the code
it hands to the CUDA codegen must have no broadcast wider than 16 bytes (the index
vectors of gathers), none of narrow integers with more than 4 lanes, and no gather of
narrow integers wider than 32 bits: TVM 0.27's CUDA codegen emits all three in a form nvcc
rejects (``check_build_pipeline``, ``check_lane_packing``).  A
requantize loop vectorized by 4 casts to ``int64x4`` (32 bytes) after lowering; a
check that looks only at loads and stores accepts it and the candidate then fails in
codegen.

Staged, because it sits on the hottest path of tuning (evolutionary search applies it to thousands
of candidates a measured batch): ``apply`` runs ``verify_staged``, cheap checks first and one lowering
at most for most candidates; ``verify`` is the whole, unstaged verdict the staged one is checked against
(``tvm-ext verify-gpu --replay``).  The stages: ``docs/verify_gpu_code.md``.

Why our own: TVM's built-in postproc returns a bare bool. This one keeps a counter
of rejection reasons (``reason_counts()``) that a tuning run can print, and the
last detailed message per reason. Differences from the built-in are deliberate and
listed in tests/test_verify_gpu_code.py.
"""
from __future__ import annotations

import threading
from collections import Counter

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir.expr import TensorLoad
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.postproc import PyPostproc
from tvm.s_tir.analysis import verify_gpu_code
from tvm.s_tir.stmt import SBlock

from tvm_ext.codegen_risk import has_cross_thread_reduction, wide_vectors
from tvm_ext.lowering import build_lowering, lower_for_gpu
from tvm_ext.tir_utils import collect, dtype_bytes, dtype_lanes, prim_funcs

REQUIRED_TARGET_ATTRS = ("max_threads_per_block", "max_shared_memory_per_block", "thread_warp_size")
MAX_VTHREAD = 8  # the built-in's max_vthread (GPUCodeVerifier)
VTHREAD_POLICY = 8  # the opt-in limit on the product of vthread extents (docs/verify_gpu_code.md)
MAX_VECTOR_BYTES = 16

# Reasons, as counted keys.
THREADS = "threads_per_block"
SHARED = "shared_memory"
VTHREAD = "vthread"
VECTOR_LOAD = "vector_width:load"
VECTOR_STORE = "vector_width:store"
VECTOR_CAST = "vector_width:cast"
VECTOR_BROADCAST = "vector_width:broadcast"
# TVM 0.27's CUDA codegen emits a broadcast of 8- or 16-bit integers with more lanes than
# this as make_uint2/4(...) with one argument per lane: "too many arguments" in nvcc.
# (int8x4 packs into one int and compiles; int8x8, int8x16, int16x8 do not.)
MAX_NARROW_INT_BROADCAST_LANES = 4
# A gather (a vector load whose index is not a contiguous ramp) of 8- or 16-bit integers wider
# than 32 bits: the codegen packs its lanes into one 64-bit integer expression and assigns it to
# an int2 ("no operator = matches these operands" in nvcc; int8x8 weight gathers of int8 tensor-core
# convs in resnet50-int8-s8).  Up to 32 bits it packs into an int and compiles.
VECTOR_GATHER = "vector_width:gather"
MAX_NARROW_INT_GATHER_BITS = 32
THREAD_ANNOTATION = "thread_extent_annotation"
LOWERING = "lowering_failed"
BUILD_PIPELINE = "build_pipeline_failed"
# TVM's GPUCodeVerifier (the built-in's) rejects the lowered code and none of our checks names why
BUILTIN_REJECTED = "builtin_rejected"


def check_build_pipeline(func: tirx.PrimFunc, name: str, target: tvm.target.Target, *, fast: bool = False,
                         limits: dict | None = None):
    """(reason, message) if ``build_lowering`` raises or leaves a broadcast the CUDA
    codegen cannot write (``check_lane_packing``), else None.  ``fast``: its fast form.
    ``limits``: also run the checks of the short pipeline on the same code (ours,
    ``check_lowered``, then TVM's GPUCodeVerifier with the built-in's constraints), so
    that one lowering serves every check.

    The checks of ``check_lowered`` look at a shorter pipeline (the built-in's).
    Passes it leaves out can fail on their own: with ``pragma_unroll_explicit``
    UnrollLoop copies a cross-thread reduction inside a serial loop, and
    LowerThreadAllreduce then meets its buffer twice ("load_remap_"); verify-gpu found
    such candidates of resnet50's global_avg_pool accepted by both postprocs.
    """
    try:
        device_mods = build_lowering(func, name, target, fast=fast)
    except Exception as err:  # noqa: BLE001 -- tvm.compile would raise the same
        lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
        return BUILD_PIPELINE, (lines[-1] if lines else repr(err))[:200]
    for device_mod in device_mods:
        for _gv, device_func in device_mod.functions.items():
            verdict = ((check_lowered(device_func, limits) or check_gpu_code(device_func, limits))
                       if limits is not None else None) or check_lane_packing(device_func.body)
            if verdict is not None:
                return verdict
    return None


def builtin_constraints(limits: dict) -> dict:
    """The constraints TVM's built-in VerifyGPUCode gives its GPUCodeVerifier."""
    return {"max_shared_memory_per_block": limits["max_shared_memory_per_block"],
            "max_threads_per_block": limits["max_threads_per_block"],
            "max_vthread": MAX_VTHREAD, "max_vector_bytes": MAX_VECTOR_BYTES}


def check_gpu_code(func: tirx.PrimFunc, limits: dict):
    """TVM's GPUCodeVerifier (C++, the built-in's verifier) on lowered code."""
    if verify_gpu_code(func, builtin_constraints(limits)):
        return None
    return BUILTIN_REJECTED, "TVM's GPUCodeVerifier rejects the lowered code; our checks name no reason"


def target_limits(target: tvm.target.Target) -> dict:
    """The limits checked, read from the target; a missing attribute is a ValueError."""
    limits = {}
    for attr in REQUIRED_TARGET_ATTRS:
        value = target.attrs.get(attr)
        if value is None:
            raise ValueError(
                f"VerifyGPUCode: target {target.kind.name!r} has no {attr!r}; give it in the target, "
                f'e.g. {{"kind": "cuda", "arch": "sm_80", "max_threads_per_block": 1024, '
                f'"max_shared_memory_per_block": 49152, "thread_warp_size": 32}}'
            )
        limits[attr] = int(value)
    return limits


def _thread_tag(loop: tirx.For):
    binding = loop.thread_binding
    return None if binding is None else str(binding.thread_tag)


def check_thread_annotations(func: tirx.PrimFunc, warp_size: int, vthread_limit: int | None = None):
    """Check MetaSchedule's thread-extent bounds on blocks (as the built-in does) and,
    with ``vthread_limit``, the product of vthread extents (``VerifyGPUCode``'s doc).

    Works on the scheduled (unlowered) function, where loops still carry their
    thread bindings. Returns (reason, message) or None.
    """
    extents: dict = {}  # thread tag -> extent of the enclosing bound loop
    problems: list = []

    def scoped(updates: dict, node, visitor):
        saved = dict(extents)
        extents.update(updates)
        result = visitor.default_visit(node)
        extents.clear()
        extents.update(saved)
        return result

    def on_loop(loop, visitor):
        tag = _thread_tag(loop)
        if tag is None or not (tag.startswith("threadIdx") or tag.startswith("vthread")):
            return visitor.default_visit(loop)
        if not isinstance(loop.extent, tirx.IntImm):
            problems.append((THREAD_ANNOTATION, f"dynamic extent of {tag}"))
            return None
        extent = int(loop.extent.value)
        if tag.startswith("vthread") and vthread_limit is not None:
            others = [v for k, v in extents.items() if k.startswith("vthread") and k != tag]
            vthreads = _product(others + [extent])
            if vthreads > vthread_limit:
                problems.append((VTHREAD, f"{vthreads} virtual threads > {vthread_limit}"))
        return scoped({tag: extent}, loop, visitor)

    def on_block(block, visitor):
        inner = dict(extents)
        if "warp_execution" in block.annotations:
            inner["threadIdx.x"] = warp_size
        low = block.annotations.get("meta_schedule.thread_extent_low_inclusive")
        high = block.annotations.get("meta_schedule.thread_extent_high_inclusive")
        if low is not None and high is not None:
            count = _product(inner.get(k, 1) for k in ("threadIdx.x", "threadIdx.y", "threadIdx.z"))
            if not int(low) <= count <= int(high):
                problems.append((THREAD_ANNOTATION,
                                 f"{count} threads outside [{int(low)}, {int(high)}] "
                                 f"required by block {block.name_hint!r}"))
        return scoped(inner, block, visitor)

    tvm_ffi.structural_visit(func.body, [(tirx.For, on_loop), (SBlock, on_block)])
    return problems[0] if problems else None


def _product(values) -> int:
    result = 1
    for value in values:
        result *= value
    return result


def check_lowered(func: tirx.PrimFunc, limits: dict) -> tuple[str, str] | None:
    """Check a lowered function; returns (reason, message) or None when it passes."""
    # Threads per block: each kernel is an outermost thread_extent scope.
    for kernel in _kernels(func.body):
        threads = {}
        for attr in [kernel] + collect(kernel.body, tirx.AttrStmt):
            if attr.attr_key != "thread_extent":
                continue
            tag = str(attr.node.thread_tag)
            if tag.startswith("threadIdx") and isinstance(attr.value, tirx.IntImm):
                threads[tag] = max(threads.get(tag, 1), int(attr.value.value))
        total = 1
        for ext in threads.values():
            total *= ext
        if total > limits["max_threads_per_block"]:
            return THREADS, f"{total} threads per block > {limits['max_threads_per_block']}"
        shared = 0
        for alloc in collect(kernel, tirx.stmt.AllocBuffer):
            buf = alloc.buffer
            if buf.scope() in ("shared", "shared.dyn"):
                size = dtype_bytes(buf.dtype)
                for ext in buf.shape:
                    size *= int(ext) if isinstance(ext, tirx.IntImm) else 1
                shared += size
        if shared > limits["max_shared_memory_per_block"]:
            return SHARED, f"{shared} bytes of shared memory > {limits['max_shared_memory_per_block']}"
    for load in collect(func.body, TensorLoad):
        if dtype_lanes(load.ty) > 1 and dtype_bytes(load.ty) > MAX_VECTOR_BYTES:
            return VECTOR_LOAD, f"vector load {load.ty} of {dtype_bytes(load.ty)} bytes > {MAX_VECTOR_BYTES}"
    for store in collect(func.body, tirx.BufferStore):
        ty = store.value.ty
        if dtype_lanes(ty) > 1 and dtype_bytes(ty) > MAX_VECTOR_BYTES:
            return VECTOR_STORE, f"vector store {ty} of {dtype_bytes(ty)} bytes > {MAX_VECTOR_BYTES}"
    for cast in collect(func.body, tirx.Cast):
        for ty in (cast.ty, cast.value.ty):
            if dtype_lanes(ty) > 1 and dtype_bytes(ty) > MAX_VECTOR_BYTES:
                return VECTOR_CAST, (f"vector cast {cast.value.ty} -> {cast.ty}: {ty} is {dtype_bytes(ty)} bytes "
                                     f"> {MAX_VECTOR_BYTES}")
    return None


def _contiguous(index) -> bool:
    return isinstance(index, tirx.Ramp) and isinstance(index.stride, tirx.IntImm) and int(index.stride.value) == 1


def check_lane_packing(stmt) -> tuple[str, str] | None:
    """Broadcasts and narrow-integer gathers TVM 0.27's CUDA codegen writes in a form nvcc rejects, in code as
    codegen receives it (after tvm.compile's lowering: its simplifications turn many
    vector indices of the shorter pipeline, e.g. ``Ramp(8 t, 1, 8) // 128`` with its
    broadcast, into plain ramps; checked earlier, they rejected candidates that compile)."""
    for broadcast in collect(stmt, tirx.Broadcast):
        dt = tvm.DataType(str(broadcast.ty))
        if dt.lanes > 1 and dtype_bytes(broadcast.ty) > MAX_VECTOR_BYTES:
            # e.g. the int32x8 index vector of a gather vectorized by 8: codegen writes
            # make_longlong4 with 8 arguments ("too many arguments" in nvcc); found by
            # verify-gpu on phi2-prefill attn_value, accepted by TVM's built-in too
            return VECTOR_BROADCAST, (f"broadcast {broadcast.ty}: {dtype_bytes(broadcast.ty)} bytes > "
                                      f"{MAX_VECTOR_BYTES}; TVM's CUDA codegen writes it as make_longlong4 "
                                      f"with one argument per lane, which nvcc rejects")
        if dt.type_code in (0, 1) and dt.bits <= 16 and dt.lanes > MAX_NARROW_INT_BROADCAST_LANES:
            return VECTOR_BROADCAST, (f"broadcast {broadcast.ty}: TVM's CUDA codegen writes it as "
                                      f"make_uintN with one argument per lane, which nvcc rejects")
    for load in collect(stmt, TensorLoad):
        dt = tvm.DataType(str(load.ty))
        narrow_and_wide = dt.type_code in (0, 1) and dt.bits <= 16 and dt.bits * dt.lanes > MAX_NARROW_INT_GATHER_BITS
        if narrow_and_wide and load.indices and not _contiguous(load.indices[-1]):
            return VECTOR_GATHER, (f"gather of {load.ty} from {load.source.name}: TVM's CUDA codegen packs its "
                                   f"lanes into a 64-bit integer assigned to an int2, which nvcc rejects")
    return None


def _kernels(stmt) -> list:
    """Outermost thread_extent AttrStmts: one per kernel launch."""
    found = []

    def visit(node, visitor):
        if isinstance(node, tirx.AttrStmt) and node.attr_key == "thread_extent":
            found.append(node)
            return None  # prune: nested ones belong to this kernel
        return visitor.default_visit(node)

    tvm_ffi.structural_visit(stmt, [(tirx.Stmt, visit)])
    return found


class ReasonLog:
    """Thread-safe counter of rejection reasons, shared by a postproc and its clones."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter = Counter()
        self.examples: dict = {}
        self.checked = 0

    def record(self, verdict) -> None:
        with self.lock:
            self.checked += 1
            if verdict is not None:
                reason, message = verdict
                self.counts[reason] += 1
                self.examples[reason] = message


def check_short(func: tirx.PrimFunc, name: str, target: tvm.target.Target, limits: dict, *,
                gpu_code: bool = False, lane_packing: bool = False):
    """The short lowering (``lower_for_gpu``, the built-in's pipeline) and ``check_lowered``
    on it; ``gpu_code``: then TVM's GPUCodeVerifier too, with the built-in's constraints
    (what the built-in decides after its thread-extent check, which ours covers);
    ``lane_packing``: then ``check_lane_packing`` on the short code (a verdict to confirm with
    ``tvm.compile``'s lowering, which can simplify such a broadcast or gather away)."""
    try:
        lowered = lower_for_gpu(func, name, target)
    except Exception as err:  # noqa: BLE001 -- any lowering error means "won't build"
        return LOWERING, str(err).strip().splitlines()[-1][:200] if str(err).strip() else repr(err)
    return (check_lowered(lowered, limits) or (check_gpu_code(lowered, limits) if gpu_code else None)
            or (check_lane_packing(lowered.body) if lane_packing else None))


def verify(mod: tvm.IRModule, target: tvm.target.Target, limits: dict, *, build: bool = True,
           vthread_limit: int | None = None):
    """Verdict for a scheduled module: None if accepted, else (reason, message).

    Every check, unstaged, with the full ``build_lowering``: the reference verdict.
    ``build=False`` leaves out ``check_build_pipeline``: the cheap checks only, which can
    accept what the whole verdict rejects.  ``vthread_limit``: as in ``VerifyGPUCode``
    (``VTHREAD_POLICY`` reproduces the verdicts of tuning_logs/verify-gpu.json).
    """
    for name, func in prim_funcs(mod):
        verdict = (check_thread_annotations(func, limits["thread_warp_size"], vthread_limit)
                   or check_short(func, name, target, limits)
                   or (check_build_pipeline(func, name, target) if build else None))
        if verdict is not None:
            return verdict
    return None


def check_module_threads(mod: tvm.IRModule, warp_size: int, vthread_limit: int | None = None):
    """``check_thread_annotations`` on every function of ``mod``: the first verdict, or None
    (stage 1; ThreadExtentPrecheck runs it before the other postprocs)."""
    for _name, func in prim_funcs(mod):
        verdict = check_thread_annotations(func, warp_size, vthread_limit)
        if verdict is not None:
            return verdict
    return None


def verify_staged(mod: tvm.IRModule, target: tvm.target.Target, limits: dict, vthread_limit: int | None = None):
    """The verdict of ``verify``, most candidates lowered once (module doc, stages 1-3)."""
    verdict = check_module_threads(mod, limits["thread_warp_size"], vthread_limit)
    if verdict is not None:
        return verdict
    for name, func in prim_funcs(mod):
        if has_cross_thread_reduction(func):
            verdict = _check_built(func, name, target, limits, fast=False)
        else:
            verdict = check_short(func, name, target, limits, gpu_code=True,
                                  lane_packing=wide_vectors(func) is not None)
            if verdict is not None and verdict[0] in (VECTOR_BROADCAST, VECTOR_GATHER):
                verdict = _check_built(func, name, target, limits, fast=True)
        if verdict is not None:
            return verdict
    return None


def _check_built(func: tirx.PrimFunc, name: str, target: tvm.target.Target, limits: dict, fast: bool):
    """Every check on the code ``tvm.compile``'s pipeline hands the codegen."""
    verdict = check_build_pipeline(func, name, target, fast=fast, limits=limits)
    if verdict is not None and verdict[0] == BUILD_PIPELINE:
        # rare: name it as ``verify`` does where the short lowering already tells why
        verdict = check_short(func, name, target, limits) or verdict
    return verdict


@derived_object
class VerifyGPUCode(PyPostproc):
    """Postproc: accept a candidate only if its lowered GPU code fits the target.

    ``vthread_limit``: also reject a candidate whose nested vthread extents multiply to
    more than this (a register-pressure policy, not a compile check: such candidates
    compile and run).  Off by default, as in TVM's built-in, which limits vthreads only
    where its verifier still sees them.  It used to be on (8, ``VTHREAD_POLICY``); in a
    search it rejected more candidates than every other check together, so the search
    sampled ~1.6x as many candidates as with the built-in for the same accepted batch
    (resnet50 conv task, docs/journal.md).
    """

    def __init__(self, log: ReasonLog | None = None, vthread_limit: int | None = None) -> None:
        super().__init__()
        self.log = log if log is not None else ReasonLog()
        self.vthread_limit = vthread_limit
        self.target = None
        self.limits = None

    def _initialize_with_tune_context(self, context) -> None:
        if context.target is None:
            raise ValueError("VerifyGPUCode: the tune context has no target")
        self.target = context.target
        self.limits = target_limits(context.target)

    def apply(self, sch) -> bool:
        verdict = verify_staged(sch.mod, self.target, self.limits, self.vthread_limit)
        self.log.record(verdict)
        return verdict is None

    def clone(self):
        other = VerifyGPUCode(self.log, self.vthread_limit)
        other.target, other.limits = self.target, self.limits
        return other

    def checked(self) -> int:
        """Candidates checked so far (by this postproc and every clone)."""
        with self.log.lock:
            return self.log.checked

    def reason_counts(self) -> dict:
        """Rejections so far by reason (shared with every clone)."""
        with self.log.lock:
            return dict(self.log.counts)

    def reason_examples(self) -> dict:
        """The last detailed message recorded for each reason."""
        with self.log.lock:
            return dict(self.log.examples)
