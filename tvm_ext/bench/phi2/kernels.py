"""Phi-2 bench kernels: which kernels a workload has, how they are built, checked and timed.

How each is scheduled (dlight, our rules, a database's best) is ``tvm_ext.scheduling``; tuning,
databases and candidate sampling go through ``tvm_ext.tune``; CUDA source and nvcc through
``tvm_ext.lowering`` and ``tvm_ext.check.nvcc``.
"""
from __future__ import annotations

import os
import time

import numpy as np
import tvm_ffi

from tvm_ext.arrays import random_arrays
from tvm_ext.rulesets import space
from tvm_ext.scheduling import build_validator, normalize  # noqa: F401  (the benches' kernels are keyed so)
from tvm_ext.tir_utils import shape_bytes
from tvm_ext.tune.runner import runner_seconds  # noqa: F401  (phi2 and its tests measure seeds with it)



def kernelsets(workload, config, context, tokens, dtype):
    """({fusion: Workload}, {fusion: KernelSet}) for fusion off (False) and on (True)."""
    from tvm_ext.workloads.phi2 import kernels as phi2

    out, wls = {}, {}
    for fusion in (False, True):
        if workload == "phi2-decode":
            wl = phi2.build_decode(context=context, config=config, fusion=fusion, compute_dtype=dtype)
        elif workload == "phi2-prefill":
            wl = phi2.build_prefill(tokens=tokens, config=config, fusion=fusion, compute_dtype=dtype)
        else:
            raise ValueError(f"unknown phi2 workload {workload!r}")
        wls[fusion] = wl
        out[fusion] = phi2.kernels(wl)
    return wls, out


# --------------------------------------------------------------------------- build
def build(mod, target):
    import tvm

    return tvm.compile(mod, target=target)


def nvcc_build(mod, target) -> None:
    """Generate ``mod``'s CUDA source and compile it with nvcc for the target's arch (no GPU
    needed); RuntimeError with nvcc's first error line if it does not compile."""
    from tvm_ext.check.nvcc import compile_cuda
    from tvm_ext.lowering import cuda_source

    ok, error = compile_cuda(cuda_source(mod, target), str(target.attrs.get("arch", "sm_80")))
    if not ok:
        raise RuntimeError(f"nvcc: {error}")


def combine(named_mods):
    """One IRModule holding the "main" of each {name: IRModule}, renamed to its kernel name."""
    import tvm

    return tvm.IRModule({name: mod["main"].with_attr("global_symbol", name)
                         for name, mod in named_mods.items()})


def sampled_schedule(mod, target, seed: int = 0):
    """One candidate of MetaSchedule's design space with every postprocessor applied
    (VerifyGPUCode included), as an IRModule; None if no draw passes."""
    from tvm_ext.tune.sampling import sample_candidates, tune_context

    ctx = tune_context(mod, target, space(target))
    schs = sample_candidates(mod, target, ctx.space_generator, 1, seed=seed, context=ctx,
                             postprocs=list(ctx.space_generator.postprocs))
    return schs[0].mod if schs else None


# --------------------------------------------------------------------------- run
def random_args(func, rng):
    """Random NumPy arguments for ``func``: every nibble of the packed uint32 weights random,
    other integers in [0, 15], floats in [-1, 1]."""
    return random_arrays(func, rng, {"uint32": (0, 2**32 - 1)}, int_range=(0, 15))


SHARED_BYTES = 256


def _const_bytes(const) -> int:
    """Bytes of a Relax constant, from its shape and dtype (not a copy of its data)."""
    return shape_bytes(const.value.dtype, const.value.shape)


def weight_positions(ks) -> dict:
    """{kernel name: sorted parameter positions that a decode step streams from DRAM}: the
    weights (arguments bound to Relax constants, or computed from constants only, like the
    unfused dequantized matrix) and the KV cache (the layer's parameters after the hidden
    state).  The other inputs are activations the previous kernel just wrote (cache-hot), and so
    are constants of at most ``SHARED_BYTES`` (the rotary frequencies, 64 bytes: one table that every
    layer reads, not a layer's weight)."""
    import tvm
    from tvm import relax

    out = {}
    for part in ("layer", "head"):
        func = ks.mod[part]
        cold = set(func.params[1:])  # KV cache
        derived = set()  # values computed from constants only
        for block in func.body.blocks:
            for b in block.bindings:
                val = b.value
                if not (isinstance(val, relax.Call) and getattr(val.op, "name", None) == "relax.call_tir"):
                    continue
                args = list(val.args[1].fields)
                const = [(isinstance(a, tvm.ir.expr.Constant) and _const_bytes(a) > SHARED_BYTES)
                         or a in derived for a in args]
                if all(const):
                    derived.add(b.var)
                pos = out.setdefault(val.args[0].name_hint, set())
                pos.update(i for i, (c, a) in enumerate(zip(const, args)) if c or a in cold)
    return {name: sorted(p) for name, p in out.items()}


def nbytes(func, positions=None) -> int:
    """Bytes of all parameters of ``func`` (what one call moves at least), or of those at
    ``positions``."""
    return sum(shape_bytes(p.dtype, p.shape) for i, p in enumerate(func.params)
               if positions is None or i in positions)


def measure_bandwidth(dev, mb=512, repeat=3):
    """Copy bandwidth in GB/s (bytes read + written per second) of a parallel vectorized TVM
    copy of ``mb`` MiB float32, and of numpy.copyto for reference.  On a GPU ``dev`` the first
    figure is a device-to-device copy of ``mb`` MiB on it."""
    import tvm
    from tvm import te
    from tvm.s_tir import Schedule

    n = mb * 1024 * 1024 // 4
    if dev.dlpack_device_type() != 1:  # not the CPU: time the device's own copy
        x, y = tvm.runtime.tensor(np.ones(n, "float32"), dev), tvm.runtime.empty((n,), "float32", dev)
        y.copyfrom(x)
        dev.sync()
        ts = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            y.copyfrom(x)
            dev.sync()
            ts.append(time.perf_counter() - t0)
        return 2 * n * 4 / min(ts) / 1e9, 0.0
    a = te.placeholder((n,), "float32", name="a")
    b = te.compute((n,), lambda i: a[i], name="b")
    sch = Schedule(te.create_prim_func([a, b]))
    (i,) = sch.get_loops(sch.get_sblock("b"))
    o, v = sch.split(i, [None, 16])
    sch.parallel(o)
    sch.vectorize(v)
    rt = tvm.compile(sch.mod, target="llvm").jit()
    x = tvm.runtime.tensor(np.ones(n, "float32"), dev)
    y = tvm.runtime.empty((n,), "float32", dev)
    f = rt.time_evaluator("main", dev, number=1, repeat=repeat)
    f(x, y)
    tvm_s = min(f(x, y).results)
    src, dst = np.ones(n, "float32"), np.empty(n, "float32")
    np.copyto(dst, src)
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        ts.append(time.perf_counter() - t0)
    return 2 * n * 4 / tvm_s / 1e9, 2 * n * 4 / min(ts) / 1e9


def verify(wl, pairs, target, dev):
    """Substitute the scheduled kernels ``[(normalized kernel, scheduled IRModule)]`` into the
    workload's Relax module, run it on the VM and compare with the NumPy reference:
    (ok, message).  The workload's own module is left as it was (a copy takes the kernels)."""
    import tvm
    from tvm import relax

    mod = wl.mod.clone()
    repl = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            key = normalize(func)
            for orig, sch_mod in pairs:
                if tvm_ffi.structural_equal(orig, key):
                    repl[gv] = sch_mod["main"].with_attr("global_symbol", gv.name_hint)
                    break
    for gv, f in repl.items():
        mod[gv] = f
    ex = tvm.compile(mod, target=target)
    vm = relax.VirtualMachine(ex, dev)
    out = vm["main"](*[tvm.runtime.tensor(a, dev) for a in wl.inputs]).numpy()
    return wl.check(out)


# --------------------------------------------------------------------------- databases
def log_dir(tuning_dir, kind, target, fusion, schedule):
    """tuning_logs/phi2-<kind>-<target kind>-<fused|unfused>/<schedule>."""
    tname = target.kind.name
    return os.path.join(tuning_dir, f"phi2-{kind}-{tname}-{'fused' if fusion else 'unfused'}", schedule)
