"""Runners: local, or TVM's RPC runner through a tracker (measure on other machines).

Plain ``ms.runner.LocalRunner`` is all a CPU run needs. An older Phi-2 bench wrapped it in a
shim that renamed the device type "llvm" to "cpu" ("Unknown device: llvm"). Measured with
TVM 0.27.0.post1: ``tvm.runtime.device("llvm", 0)`` does raise "Unknown device: llvm", but the
task scheduler never passes "llvm": a spy runner under ``ms.tune_tir`` on an llvm target
saw device type "cpu" for every candidate, and plain LocalRunner committed records with real
run times (2 of 2 trials, none failed, no "Unknown device" in the task logs). The shim is gone.
"""
from __future__ import annotations

from tvm.s_tir import meta_schedule as ms


def evaluator_config(flush_cache: bool = False):
    """TVM's default evaluator config, or one that flushes the CPU cache before every run.

    With ``flush_cache`` each candidate runs once per repeat (number=1), after the cache flush,
    three times: how a kernel behaves when its weights stream from DRAM (a real model's layers
    do not fit in the cache), not how it behaves looping over cache-hot data.
    """
    if not flush_cache:
        return ms.runner.EvaluatorConfig()
    return ms.runner.EvaluatorConfig(number=1, repeat=3, min_repeat_ms=0, enable_cpu_cache_flush=True)


def make_runner(rpc_tracker: str | None = None, rpc_key: str | None = None, timeout: int = 120,
                flush_cache: bool = False):
    """Local runner, or TVM's RPC runner through a tracker ``host:port`` and device key.

    ``flush_cache``: flush the CPU cache before every measured run (see ``evaluator_config``).
    """
    config = evaluator_config(flush_cache)
    if not rpc_tracker:
        from tvm_ext.amx import make_runner_initializer  # pylint: disable=import-outside-toplevel

        # workers ask for AMX tile permission where the host has AMX (else a no-op)
        return ms.runner.LocalRunner(timeout_sec=timeout, evaluator_config=config,
                                     initializer=make_runner_initializer())
    host, _, port = rpc_tracker.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--rpc-tracker must be HOST:PORT, not {rpc_tracker!r}")
    if not rpc_key:
        raise ValueError("--rpc-tracker needs --rpc-key (the device key the servers registered)")
    rpc_config = ms.runner.RPCConfig(tracker_host=host, tracker_port=int(port), tracker_key=rpc_key,
                                     session_timeout_sec=timeout)
    return ms.runner.RPCRunner(rpc_config=rpc_config, evaluator_config=config, max_workers=1)


def runner_seconds(mods, target, runner, builder=None, strict: bool = True) -> dict:
    """{name: mean run seconds} of each scheduled ``{name: IRModule}``, built by the stack's
    builder and run by ``runner``: the seconds a tuning record of it would hold when that
    runner measured it.  RuntimeError naming the kernel if one fails to build or run; with
    ``strict`` False its seconds are None instead (e.g. an embedding lookup, whose random
    token ids index outside the table)."""
    from tvm_ext.tune.builder import make_builder  # pylint: disable=import-outside-toplevel
    from tvm_ext.tune.database import mean_run_seconds  # pylint: disable=import-outside-toplevel

    names = list(mods)
    builder = builder if builder is not None else make_builder()
    built = builder.build([ms.builder.BuilderInput(mods[n], target) for n in names])
    out, ok = {}, []
    for name, b in zip(names, built):
        if b.error_msg and strict:
            raise RuntimeError(f"building {name} for the runner failed: {b.error_msg.splitlines()[0]}")
        if b.error_msg:
            out[name] = None
        else:
            ok.append((name, b.artifact_path))
    device = "cpu" if target.kind.name == "llvm" else target.kind.name
    inputs = [ms.runner.RunnerInput(path, device, ms.arg_info.ArgInfo.from_prim_func(mods[n]["main"]))
              for n, path in ok]
    for (name, _), future in zip(ok, runner.run(inputs)):
        res = future.result()
        secs = None if res.error_msg else mean_run_seconds(res.run_secs)
        if secs is None and strict:
            raise RuntimeError(f"running {name} with the tuning runner failed: {res.error_msg}")
        out[name] = secs
    return out
