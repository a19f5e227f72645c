"""Runners: local, or TVM's RPC runner through a tracker (measure on other machines)."""
from __future__ import annotations

from tvm.s_tir import meta_schedule as ms


def make_runner(rpc_tracker: str | None = None, rpc_key: str | None = None, timeout: int = 120):
    """Local runner, or TVM's RPC runner through a tracker ``host:port`` and device key."""
    if not rpc_tracker:
        return ms.runner.LocalRunner(timeout_sec=timeout)
    host, _, port = rpc_tracker.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--rpc-tracker must be HOST:PORT, not {rpc_tracker!r}")
    if not rpc_key:
        raise ValueError("--rpc-tracker needs --rpc-key (the device key the servers registered)")
    config = ms.runner.RPCConfig(tracker_host=host, tracker_port=int(port), tracker_key=rpc_key,
                                 session_timeout_sec=timeout)
    return ms.runner.RPCRunner(rpc_config=config, max_workers=1)
