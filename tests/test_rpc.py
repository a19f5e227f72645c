"""--rpc-tracker: measure through TVM's RPC tracker and RPC server, all on 127.0.0.1."""
import json
import subprocess
import sys
import time

import pytest

from tvm_ext.tune.database import open_database

KEY = "tvm-ext-test"


def wait_for_server(port: int, timeout: float = 180) -> None:
    """Until the server has registered its key with the tracker (it does so asynchronously)."""
    from tvm import rpc

    deadline = time.time() + timeout
    while time.time() < deadline:
        if KEY in rpc.connect_tracker("127.0.0.1", port).text_summary():
            return
        time.sleep(1)
    raise TimeoutError("the RPC server did not register with the tracker")


@pytest.fixture
def tracker():
    """TVM's own local tracker + server pair (MetaSchedule's testing helper), on free ports."""
    from tvm.s_tir.meta_schedule.testing.local_rpc import LocalRPC

    with LocalRPC(tracker_key=KEY, silent=True) as local:
        wait_for_server(local.tracker_port)
        yield local.tracker_port


@pytest.mark.slow  # ~20 s on 2 cores (a tracker, a server and a tuning run); CI time is short
def test_tune_through_rpc_tracker(tracker, tmp_path):
    work_dir = str(tmp_path / "rpc")
    proc = subprocess.run([sys.executable, "-m", "tvm_ext", "tune", "conv2d-int8", "--image", "8",
                           "--trials", "2", "--per-iter", "2", "--work-dir", work_dir, "--rpc-tracker",
                           f"127.0.0.1:{tracker}", "--rpc-key", KEY, "--json"],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (task,) = json.loads(proc.stdout)["tasks"]
    assert task["trials"] == 2
    assert task["best_us"] is not None and task["best_us"] > 0  # measured through the server
    assert len(open_database(work_dir).get_all_tuning_records()) == 2


def test_rpc_tracker_needs_host_port_and_key(capsys):
    from tvm_ext.cli import main

    for extra, message in ((["--rpc-tracker", "localhost"], "HOST:PORT"),
                           (["--rpc-tracker", "127.0.0.1:9190"], "--rpc-key")):
        assert main(["tune", "conv2d-int8", *extra]) == 2
        assert message in capsys.readouterr().err
