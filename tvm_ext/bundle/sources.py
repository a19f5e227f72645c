"""Every call the bundle makes into the rule sets, the scheduling policy and the workloads, in one place.

Nothing else in ``tvm_ext.bundle`` imports ``tvm_ext.rulesets``, ``tvm_ext.scheduling`` or the Phi-2
bench's kernel sets: a rename there is a one-line change here.
"""
from __future__ import annotations


def _policy():
    """The module holding the one-kernel scheduling policy."""
    from tvm_ext import scheduling

    return scheduling


def is_gpu(target) -> bool:
    from tvm_ext.schedule_rule import is_gpu as gpu

    return gpu(target)


def space(target, ruleset: str):
    """The rule set's design space (rules + postprocs, our VerifyGPUCode included on GPUs)."""
    from tvm_ext.rulesets import check_ruleset, space as make_space

    check_ruleset(ruleset)
    return make_space(target, ruleset)


def untuned_schedule(mod, target):
    """The untuned row's Schedule of a task: our rules' where one matches, else the first dlight rule whose
    schedule builds (on GPUs each is built with nvcc first: at batch 16 on sm_90 dlight's first choice for
    the s8 convs, a wmma matmul, fails TVM's lowering, ``fragment_info_``), else as built."""
    policy = _policy()
    found = policy.rule_schedule(mod, target)
    if found is not None:
        return found[1]
    validate = policy.build_validator(target)
    sch = policy.dlight_schedule(mod, target, validate)[1]
    if sch is not None:
        return sch
    return policy.untuned_schedule(mod, target) if validate is None else policy.as_built(mod)


def rule_schedule(mod, target):
    """Our rules' untuned Schedule of a kernel, or None where none of them takes it."""
    found = _policy().rule_schedule(mod, target)
    return found[1] if found is not None else None


def dlight_schedule(mod, target):
    """dlight's Schedule of a kernel, or None (the Phi-2 table's peer row)."""
    return _policy().dlight_schedule(mod, target)[1]


def workload(name: str, **options):
    import tvm_ext.workloads as workloads

    return workloads.get(name, **options)


def tasks(wl, target) -> list:
    """[(name, weight, IRModule)] of a workload, largest weight first (what ``tvm-ext tune`` tunes)."""
    from tvm_ext.tune.driver import extract_tasks

    return [(t.name, t.weight, t.mod) for t in extract_tasks(wl, target)]


def phi2_kernels(workload_name: str, config: str, context: int, dtype: str) -> dict:
    """{fusion (bool): [(kernel name, {part ("layer"/"head"): calls}, normalized IRModule)]} of the Phi-2
    bench (a decode step runs the layer's kernels 32 times, the head's once)."""
    from tvm_ext.bench.phi2.kernels import kernelsets

    normalize = _policy().normalize
    _, kss = kernelsets(workload_name, config, context, 1, dtype)
    out = {}
    for fusion, ks in kss.items():
        rows: dict = {}
        for k in ks.kernels:
            name, parts, mod = rows.setdefault(k.name, (k.name, {}, normalize(k.func)))
            parts[k.part] = parts.get(k.part, 0) + k.calls
        out[fusion] = list(rows.values())
    return out


def phi2_db_dir(root: str, target, fusion: bool) -> str:
    """The Phi-2 bench's tuned (``seeded``) kernel database under ``root``."""
    from tvm_ext.bench.phi2.kernels import log_dir

    return log_dir(root, "decode", target, fusion, "seeded")
