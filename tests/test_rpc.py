"""--rpc-tracker: measure through TVM's RPC tracker and RPC server, all on 127.0.0.1."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

KEY = "tvm-ext-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_server(port: int, timeout: float = 180) -> None:
    from tvm import rpc

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if KEY in rpc.connect_tracker("127.0.0.1", port).text_summary():
                return
        except Exception:  # tracker not listening yet
            pass
        time.sleep(1)
    raise TimeoutError("the RPC server did not register with the tracker")


@pytest.fixture
def tracker():
    port = free_port()
    server_port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                               "--port", str(port), "--port-end", str(port + 1), "--silent"])]
    try:
        time.sleep(2)
        procs.append(subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_server",
                                       "--host", "127.0.0.1", "--port", str(server_port),
                                       "--port-end", str(server_port + 1),
                                       "--tracker", f"127.0.0.1:{port}", "--key", KEY, "--silent"]))
        wait_for_server(port)
        yield port
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


def test_tune_through_rpc_tracker(tracker, tmp_path):
    work_dir = str(tmp_path / "rpc")
    proc = subprocess.run([sys.executable, "-m", "tvm_ext", "tune", "conv2d-int8", "--image", "8",
                           "--trials", "4", "--work-dir", work_dir, "--rpc-tracker",
                           f"127.0.0.1:{tracker}", "--rpc-key", KEY, "--json"],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (task,) = json.loads(proc.stdout)["tasks"]
    assert task["trials"] == 4
    assert task["best_us"] is not None and task["best_us"] > 0  # measured through the server
    records = open(os.path.join(work_dir, "database_tuning_record.json")).read().splitlines()
    assert len(records) == 4


def test_rpc_tracker_needs_host_port_and_key(tmp_path):
    for extra, message in ((["--rpc-tracker", "localhost"], "HOST:PORT"),
                           (["--rpc-tracker", "127.0.0.1:9190"], "--rpc-key")):
        proc = subprocess.run([sys.executable, "-m", "tvm_ext", "tune", "conv2d-int8", *extra],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and message in proc.stderr
