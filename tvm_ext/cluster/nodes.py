"""Which nodes of a cluster may tune a target: every node says what it is, the driver decides.

A node's timings belong to its CPU. Each worker reports its CPU (LLVM host CPU, the LLVM features
in effect, the cores it may use) and its GPU (``describe_node``, run on the node); ``refusal``
says in one line why a node cannot tune a target, or None:

* a node without a feature the target's code uses (its records would all fail, 1e10 each, and
  still count toward the task's budget): never;
* a CPU other than the target's ``mcpu``: its timings would land as this target's; only with
  ``allow_mixed`` (``--allow-mixed-cpus``), and each record's node is kept in the work dir;
* fewer cores than the target's ``num-cores`` (the thread count its kernels are timed with);
* cuda: a node without a GPU, or a GPU of another architecture than the target's, unless the
  timing goes through an RPC tracker.
"""
from __future__ import annotations

import os


def describe_node() -> dict:
    """What this node is (run on a worker): mcpu, llvm_host_cpu, cpu_name, features, cores (the
    CPUs this process may run on), gpu (name or None) and gpu_arch ("sm_90" or None)."""
    import tvm

    from tvm_ext.targets import describe_host

    host = describe_host()
    gpu = arch = None
    try:
        dev = tvm.cuda(0)
        if dev.exist:
            gpu, arch = str(dev.device_name), "sm_" + str(dev.compute_version).replace(".", "")
    except Exception:  # noqa: BLE001 -- no CUDA runtime in this TVM: no GPU
        pass
    return {"mcpu": host["mcpu"], "llvm_host_cpu": host["llvm_host_cpu"], "cpu_name": host["cpu_name"],
            "features": sorted(host["features"]), "cores": len(os.sched_getaffinity(0)), "gpu": gpu,
            "gpu_arch": arch}


def target_needs(target) -> dict:
    """What a node must have to tune ``target``: kind, mcpu, features, threads, arch."""
    from tvm_ext.targets import ISA_FEATURES, x86_features

    attrs = target.attrs
    kind = str(target.kind.name)
    return {"kind": kind, "mcpu": str(attrs["mcpu"]) if "mcpu" in attrs else None,
            "features": sorted(x86_features(target) & ISA_FEATURES) if kind == "llvm" else [],
            "threads": int(attrs["num-cores"]) if "num-cores" in attrs else None,
            "arch": str(attrs["arch"]) if "arch" in attrs else None}


def refusal(node: dict, needs: dict, allow_mixed: bool = False, rpc: bool = False) -> str | None:
    """Why ``node`` (``describe_node``) cannot tune a target with ``needs`` (``target_needs``), or None."""
    if "error" in node:
        return f"it could not say what it is ({node['error']})"
    if needs["kind"] == "cuda":
        if rpc:
            return None  # built here, timed on the tracker's devices
        if not node.get("gpu"):
            return "has no GPU for the cuda target (start workers on GPU machines, or pass --rpc-tracker)"
        if needs["arch"] and node.get("gpu_arch") != needs["arch"] and not allow_mixed:
            return (f"its GPU {node['gpu']} is {node.get('gpu_arch')}, the target {needs['arch']} "
                    "(--allow-mixed-cpus to time there anyway)")
        return None
    missing = sorted(set(needs["features"]) - set(node.get("features", ())))
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        return f"its CPU {node.get('mcpu')} lacks {shown}, which the target's code uses"
    if needs["mcpu"] and node.get("mcpu") != needs["mcpu"] and not allow_mixed:
        return (f"its CPU {node.get('mcpu')} is not the target's {needs['mcpu']}: its timings would be taken as "
                "that CPU's (--allow-mixed-cpus to use it anyway)")
    if needs["threads"] and node.get("cores", 0) < needs["threads"]:
        return (f"it may use {node.get('cores')} cores and the target's kernels are timed on {needs['threads']} "
                "threads (give the worker more cores, or tune for a target with fewer num-cores)")
    return None


def survey(client, addresses=None, describe=describe_node) -> dict:
    """{worker address: describe_node() there} for the cluster's workers (or ``addresses``); a node
    that could not answer gets {"error": its one-line error}, which ``refusal`` turns into a refusal."""
    if addresses is not None and not addresses:
        return {}
    answers = client.run(describe, workers=list(addresses) if addresses is not None else None, on_error="return")
    return {addr: ({"error": _last_line(a)} if isinstance(a, BaseException) else a) for addr, a in answers.items()}


def _last_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[-1]}" if lines else type(err).__name__


def choose(nodes: dict, names: dict, needs: dict, allow_mixed: bool, rpc: bool, log) -> tuple[dict, dict]:
    """(the nodes of ``nodes`` ({address: description}) that may tune, {node name: why not} of the
    others); one line per node refused."""
    ok, why = {}, {}
    for addr, node in nodes.items():
        reason = refusal(node, needs, allow_mixed, rpc)
        if reason is None:
            ok[addr] = node
        else:
            why[names.get(addr, addr)] = reason
            log(f"node {names.get(addr, addr)} not used: {reason}")
    return ok, why


def none_can(why: dict) -> ValueError:
    """The one-line error where every node of a cluster was refused (``choose``'s second result)."""
    name, reason = sorted(why.items())[0]
    return ValueError(f"no node of the cluster can tune this target: {len(why)} refused (node {name}: {reason})")


__all__ = ["choose", "describe_node", "none_can", "refusal", "survey", "target_needs"]
