"""Small helpers the tests share: targets, the seed's requantize kernel, seeded design spaces.

Importing this module imports TVM's tensor intrinsics the fast way: the first
``ms.TuneContext`` of a process imports them anyway, which without
``tvm_ext.intrinsics.fast_import`` costs 30-50 s inside pytest (whichever test came first).
"""
from __future__ import annotations

import tvm
from tvm import te, tirx
from tvm.script import tirx as T

from tvm_ext.intrinsics.fast_import import import_tensor_intrinsics

import_tensor_intrinsics()

CUDA = {"kind": "cuda", "arch": "sm_80", "max_threads_per_block": 1024,
        "max_shared_memory_per_block": 49152, "thread_warp_size": 32}


def cuda_target() -> tvm.target.Target:
    return tvm.target.Target(CUDA)


def llvm_target() -> tvm.target.Target:
    return tvm.target.Target({"kind": "llvm", "num-cores": 2})


def requantize_primfunc(rows: int = 256, cols: int = 64) -> tirx.PrimFunc:
    """y = q_multiply_shift_per_axis(x, m, l, r, 31, False, True), elementwise."""
    x = te.placeholder((rows, cols), "int32", name="x")
    m, l, r = (te.placeholder((cols,), "int32", name=n) for n in ("m", "l", "r"))
    y = te.compute((rows, cols), lambda i, j: tirx.q_multiply_shift_per_axis(
        x[i, j], m[j], l[j], r[j], 31, False, True), name="y")
    return te.create_prim_func([x, m, l, r, y])


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
