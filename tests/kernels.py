"""TE kernels the tests schedule: the seed's quantized conv + requantize pattern."""
from __future__ import annotations

import tvm
from tvm import te, tirx

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


def design_spaces(func, target, sch_rules=None, ruleset=None, postprocs=()):
    """Sketches of ``func`` under a rule set of tvm_ext or an explicit rule list."""
    import tvm_ext
    from tvm.s_tir import meta_schedule as ms

    if ruleset is not None:
        sch_rules = tvm_ext.default_rules(target, ruleset)
    space = ms.space_generator.PostOrderApply(sch_rules=list(sch_rules), postprocs=list(postprocs),
                                              mutator_probs={})
    ctx = ms.TuneContext(mod=tvm.IRModule({"main": func}), target=target, task_name="t",
                         space_generator=space, rand_state=0)  # sketches sample decisions
    return ctx.generate_design_space()


def upstream_rules_without(target, rule_name):
    """TVM's default rules for the target minus the rule named ``rule_name``."""
    from tvm.s_tir import meta_schedule as ms

    kind = target.kind.name
    return [r for r in ms.ScheduleRule.create(kind) if type(r).__name__ != rule_name]
