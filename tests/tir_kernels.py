"""Small helpers the tests share: targets, the seed's requantize kernel, seeded design spaces.

Importing this module imports TVM's CPU tensor intrinsics the fast way: the first
``ms.TuneContext`` of a process imports the package anyway, which without
``tvm_ext.intrinsics.fast_import`` costs 30-50 s inside pytest (whichever test came first); a CUDA
space (``tvm_ext.space``) imports the GPU families when it is made.
"""
from __future__ import annotations

import tvm
from tvm import te, tirx
from tvm.script import tirx as T

from tvm_ext.intrinsics.fast_import import import_tensor_intrinsics

import_tensor_intrinsics(gpu=False)

CUDA = {"kind": "cuda", "arch": "sm_80", "max_threads_per_block": 1024,
        "max_shared_memory_per_block": 49152, "thread_warp_size": 32}


def cuda_target() -> tvm.target.Target:
    return tvm.target.Target(CUDA)


def llvm_target() -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "num-cores": 2})


def vector_copy(lanes: int, dtype: str = "uint8", const=None, index_dtype: str = "int32",
                n: int = 4096) -> tirx.PrimFunc:
    """b = a (+ const) over n elements: 128 threads per block, ``lanes`` vectorized."""
    it = getattr(T, index_dtype)

    @T.prim_func(s_tir=True)
    def add(a: T.Buffer((n,), dtype), b: T.Buffer((n,), dtype)):
        for bx in T.thread_binding(it(n // 128 // lanes), thread="blockIdx.x"):
            for tx in T.thread_binding(it(128), thread="threadIdx.x"):
                for v in T.vectorized(it(lanes)):
                    with T.sblock("b"):
                        vi = T.axis.spatial(it(n), (bx * it(128) + tx) * it(lanes) + v)
                        if const is None:
                            b[vi] = a[vi]
                        else:
                            b[vi] = a[vi] + getattr(T, dtype)(const)
    return add


def cross_thread_reduction(update):
    """b[i] = reduce over 32 threads of a[i, k]: ``update`` is "sum" or "decay" (not a
    reducer TVM recognizes: b * 0.5 + a)."""
    @T.prim_func(s_tir=True)
    def reduce(a: T.Buffer((64, 32), "float32"), b: T.Buffer((64,), "float32")):
        for bx in T.thread_binding(64, thread="blockIdx.x"):
            for tx in T.thread_binding(32, thread="threadIdx.x"):
                with T.sblock("b"):
                    vi, vk = T.axis.remap("SR", [bx, tx])
                    with T.init():
                        b[vi] = T.float32(0)
                    if update == "sum":
                        b[vi] = b[vi] + a[vi, vk]
                    else:
                        b[vi] = b[vi] * T.float32(0.5) + a[vi, vk]
    return reduce


def rows_over_thread_y(high):
    """blockIdx.x x threadIdx.y (4 threads) copy; the block asks MetaSchedule for
    [1, ``high``] threads, as its cross-thread-reduction and tiling rules annotate."""
    @T.prim_func(s_tir=True)
    def copy(a: T.Buffer((64, 4), "float32"), b: T.Buffer((64, 4), "float32")):
        for bx in T.thread_binding(64, thread="blockIdx.x"):
            for ty in T.thread_binding(4, thread="threadIdx.y"):
                with T.sblock("b"):
                    vi, vj = T.axis.remap("SS", [bx, ty])
                    T.sblock_attr({"meta_schedule.thread_extent_low_inclusive": 1,
                                   "meta_schedule.thread_extent_high_inclusive": high})
                    b[vi, vj] = a[vi, vj]
    return copy


def requantize_primfunc(rows: int = 256, cols: int = 64) -> tirx.PrimFunc:
    """y = q_multiply_shift_per_axis(x, m, l, r, 31, False, True), elementwise."""
    x = te.placeholder((rows, cols), "int32", name="x")
    m, left, right = (te.placeholder((cols,), "int32", name=n) for n in ("m", "l", "r"))
    y = te.compute((rows, cols), lambda i, j: tirx.q_multiply_shift_per_axis(
        x[i, j], m[j], left[j], right[j], 31, False, True), name="y")
    return te.create_prim_func([x, m, left, right, y])


def annotated(rule_name: str, block: str = "b") -> tirx.PrimFunc:
    """c = a * 2 + 1 through b; ``block`` ("b" or "c") carries ``schedule_rule: rule_name``."""
    attrs = {name: {"schedule_rule": rule_name} if name == block else {} for name in ("b", "c")}

    @T.prim_func(s_tir=True)
    def func(a: T.Buffer((16,), "float32"), c: T.Buffer((16,), "float32")):
        b = T.sblock_alloc_buffer((16,), "float32")
        for i in range(16):
            with T.sblock("b"):
                vi = T.axis.spatial(16, i)
                T.sblock_attr(attrs["b"])
                b[vi] = a[vi] * T.float32(2)
        for i in range(16):
            with T.sblock("c"):
                vi = T.axis.spatial(16, i)
                T.sblock_attr(attrs["c"])
                c[vi] = b[vi] + T.float32(1)
    return func


def design_spaces(func, target, sch_rules=None, ruleset=None):
    """Sketches of ``func`` under a rule set of tvm_ext (``ruleset``) or an explicit rule list.

    TVM's ``ms.testing.space_generation.generate_design_space`` does the same without a
    seed; the sketches sample decisions (e.g. compute locations, which change the number
    of loop nests), so tests that compare two spaces need this seeded one."""
    import tvm_ext
    from tvm.s_tir import meta_schedule as ms

    if ruleset is not None:
        sch_rules = tvm_ext.default_rules(target, ruleset)
    space = ms.space_generator.PostOrderApply(sch_rules=list(sch_rules), postprocs=[], mutator_probs={})
    ctx = ms.TuneContext(mod=tvm.IRModule({"main": func}), target=target, task_name="t",
                         space_generator=space, rand_state=0)
    return ctx.generate_design_space()


def upstream_rules_without(target, rule_name):
    """TVM's default rules for the target minus the rule named ``rule_name``."""
    from tvm.s_tir import meta_schedule as ms

    return [r for r in ms.ScheduleRule.create(target.kind.name) if type(r).__name__ != rule_name]


def as_main(func) -> tvm.IRModule:
    """``func`` alone in a module, as ``main`` with that global symbol (what tvm.compile needs)."""
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def phi2_reduced_kernels() -> dict:
    """The fused kernels of the reduced Phi-2: {"decode": [...] (8 past positions),
    "prefill": [...] (16 tokens)}."""
    from tvm_ext.workloads.phi2 import kernels as phi2

    return {"decode": phi2.kernels(phi2.build_decode(context=8, config="reduced", fusion=True)).kernels,
            "prefill": phi2.kernels(phi2.build_prefill(tokens=16, config="reduced", fusion=True)).kernels}


def ours_in_space(func, target="llvm", mine_only=True):
    """The design-space candidates of ``tvm_ext.space`` for ``func`` that one of our whole-function
    rules made (their traces mark the blocks ``schedule_rule: "None"`` for the other rules); all of
    them with ``mine_only=False``."""
    from tvm.s_tir import meta_schedule as ms

    import tvm_ext
    from tvm_ext.targets import resolve_target

    target = tvm.target.Target(dict(resolve_target(target).export(), **{"num-cores": 2}))
    ctx = ms.TuneContext(mod=as_main(func), target=target, space_generator=tvm_ext.space(target), task_name="t")
    return [s for s in ctx.generate_design_space() if 'ann_val="None"' in str(s.trace) or not mine_only]
