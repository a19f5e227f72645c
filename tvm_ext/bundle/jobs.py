"""What a bundle measures: per task, the schedules to time (variants), its inputs and its reference kind.

A *job* is one task (a ResNet-50 layer's fused kernel, a Phi-2 decode kernel) with its *variants*: the
rule set's untuned schedule first, then ``n`` candidates sampled from each rule set's design space
(every postprocessor applied, our VerifyGPUCode included, so nothing a verifier rejects is built).
Variants whose TIR is structurally equal to an earlier one are kept once (``same_as``).  Every call into
the rule sets and schedules goes through ``bundle.sources``.

Inputs: small integer constants of the network (requantize multipliers and shifts, biases: their real
values, since random shifts would be undefined behaviour in the generated C) travel with the bundle;
everything else is drawn on the device from a seed (``bundle.inputs``) in the ranges the tuning
benchmarks use (``tvm_ext.arrays``; Phi-2's packed q4 words over all 32 bits).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from tvm_ext.bundle import sources

SMALL_CONST = 1 << 16  # elements: an integer constant up to this size travels with its real values


@dataclass
class Variant:
    label: str  # "untuned", "dlight", "rule", "<ruleset>_c<i>"
    ruleset: str  # the rule set it belongs to ("" for a row every rule set shares)
    func: object  # the scheduled PrimFunc
    trace: object = None  # its schedule's trace (None: not a tuning record)
    rank: int = 0  # 0 for untuned rows, i + 1 for candidate i: the order of the work


@dataclass
class Job:
    experiment: str  # "resnet50-int8-s8", "phi2-decode"
    group: str  # e.g. "resnet50-int8-s8" or "phi2-decode/fused"
    name: str
    weight: int  # calls per network run / decode step
    mod: object  # the task's IRModule ("main"), what MetaSchedule keys records by
    params: list  # [{"shape", "dtype", "range"} or {"shape", "dtype", "value": array}]
    variants: list = field(default_factory=list)
    same_as: dict = field(default_factory=dict)  # label -> label of the identical variant kept
    parts: dict = field(default_factory=dict)  # Phi-2: {"layer"/"head": calls a decode step}

    @property
    def seed(self) -> int:
        return zlib.crc32(f"{self.group}/{self.name}".encode()) % 2**31

    def add(self, variant: Variant) -> None:
        import tvm_ffi

        for kept in self.variants:
            if tvm_ffi.structural_equal(kept.func, variant.func):
                self.same_as[variant.label] = kept.label
                return
        self.variants.append(variant)


def _range(name: str, dtype: str, phi2: bool) -> list:
    from tvm_ext.arrays import _default_range

    if dtype.startswith("float"):
        return [-1.0, 1.0]
    if phi2:
        return [0, 2**32 - 1] if dtype == "uint32" else [0, 15]
    if dtype == "int8":
        return [-127, 127]  # the network's weights' range
    return list(_default_range(dtype))


def param_specs(func, constants: dict, phi2: bool) -> list:
    """One input spec per parameter (module doc); ``constants``: {position: real value}."""
    specs = []
    for i, p in enumerate(func.params):
        shape, dtype = [int(s) for s in p.shape], str(p.dtype)
        value = constants.get(i)
        if value is not None and not dtype.startswith("float") and value.size <= SMALL_CONST:
            specs.append({"shape": shape, "dtype": dtype, "value": value})
        else:
            specs.append({"shape": shape, "dtype": dtype, "range": _range(str(p.name), dtype, phi2)})
    return specs


def call_constants(relax_mod, task_name: str) -> dict:
    """{argument position: NumPy value} of the Relax constants the first call of ``task_name`` passes."""
    import tvm
    from tvm import relax

    for _, func in relax_mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                call = binding.value
                if (isinstance(call, relax.Call) and getattr(call.op, "name", "") == "relax.call_tir"
                        and call.args[0].name_hint == task_name):
                    return {i: a.value.numpy() for i, a in enumerate(call.args[1].fields)
                            if isinstance(a, tvm.ir.expr.Constant)}
    return {}


def sampled(mod, target, ruleset: str, n: int, seed: int, max_tries: int) -> list:
    """``n`` candidates of ``ruleset``'s space with every postprocessor applied (VerifyGPUCode too)."""
    from tvm_ext.tune.sampling import sample_candidates, tune_context

    if n <= 0:
        return []
    space = sources.space(target, ruleset)
    ctx = tune_context(mod, target, space)
    return sample_candidates(mod, target, ctx.space_generator, n, seed=seed, context=ctx,
                             postprocs=list(ctx.space_generator.postprocs), max_tries=max_tries)


def extend(job: Job, target, rulesets, n: int, tries: int = 25, log=print) -> None:
    """Add ``n`` candidates of each rule set's space to ``job`` (after its untuned rows)."""
    for ruleset in rulesets:
        schs = sampled(job.mod, target, ruleset, n, job.seed, tries * max(n, 1))
        for i, sch in enumerate(schs):
            job.add(Variant(f"{ruleset}_c{i}", ruleset, sch.mod["main"], sch.trace, rank=i + 1))
        if len(schs) < n:
            log(f"  {job.name} ({ruleset}): {len(schs)} of {n} candidates passed the postprocs")


def network_jobs(workload: str, options: dict, target, rulesets, n: int, tasks: int | None = None,
                 tries: int = 25, log=print) -> list:
    """Jobs of a network's tasks (``tvm-ext tune``'s tasks, largest weight first; ``tasks``: the first
    that many): the untuned schedule, then ``n`` candidates per rule set."""
    wl = sources.workload(workload, **options)
    found = sources.tasks(wl, target)[:tasks] if tasks else sources.tasks(wl, target)
    jobs = []
    for k, (name, weight, mod) in enumerate(found):
        func = mod["main"]
        job = Job(workload, workload, name, weight, mod, param_specs(func, call_constants(wl.mod, name), False))
        untuned = sources.untuned_schedule(mod, target)
        job.add(Variant("untuned", "", untuned.mod["main"], untuned.trace))
        extend(job, target, rulesets, n, tries, log)
        log(f"[{k + 1}/{len(found)}] {name}: {len(job.variants)} variants")
        jobs.append(job)
    return jobs


def phi2_jobs(config: str, context: int, target, rulesets, n: int, kernels: int | None = None,
              tries: int = 25, log=print) -> list:
    """Jobs of the Phi-2 decode kernels, fused and unfused: dlight's schedule, our rules' untuned one
    (``rule``), then ``n`` candidates per rule set of the kernels our rules schedule."""
    dtype = "float16" if sources.is_gpu(target) else "float32"
    jobs = []
    for fusion, rows in sorted(sources.phi2_kernels("phi2-decode", config, context, dtype).items()):
        group = f"phi2-decode/{'fused' if fusion else 'unfused'}"
        for name, parts, mod in rows[:kernels] if kernels else rows:
            job = Job("phi2-decode", group, name, sum(parts.values()), mod, param_specs(mod["main"], {}, True),
                      parts=parts)
            dl, ours = sources.dlight_schedule(mod, target), sources.rule_schedule(mod, target)
            # no dlight rule applies: the bench's dlight row runs the kernel as built
            dl = dl if dl is not None else sources.untuned_schedule(mod, target)
            job.add(Variant("dlight", "", dl.mod["main"], dl.trace))
            if ours is None:
                job.same_as["rule"] = "dlight"  # no rule of ours takes it: the rule row runs dlight's
            else:
                job.add(Variant("rule", "", ours.mod["main"], ours.trace))
                extend(job, target, rulesets, n, tries, log)  # our rules' kernels are tuned
            jobs.append(job)
        log(f"{group}: {len(rows)} kernels")
    return jobs


def reference(job: Job, arrays: list) -> np.ndarray:
    """The task's output on ``arrays`` computed on the CPU from its unscheduled TIR (float kernels: widened
    to float32, ``bench.reference``)."""
    from tvm_ext.bench.reference import reference_output

    return reference_output(job.mod["main"], arrays)


def reduction_length(job: Job) -> int:
    from tvm_ext.bench.reference import reduction_length as k_of

    return k_of(job.mod["main"])
