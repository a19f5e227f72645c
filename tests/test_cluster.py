"""Tuning on a real Dask cluster on this machine: a TLS scheduler and two worker nodes as separate
processes on loopback, each pinned to one core (tvm_ext.cluster.local). The database a cluster run
writes holds what a local run's holds (the same tasks, each at its budget, valid records); a node
killed mid-run and the job completes; the driver killed and the job resumes; a node or client
without the cluster's credentials is refused."""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from toy_database import tiny_workload

from tvm_ext import tune as tuning
from tvm_ext.cli.main import main
from tvm_ext.cluster import tls
from tvm_ext.cluster.local import LocalCluster
from tvm_ext.cluster.tune import tune_on_cluster
from tvm_ext.targets import resolve_target

TRIALS = 2


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(workers=2) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    with cluster.client() as c:
        yield c


@pytest.fixture(scope="module")
def target():
    return resolve_target({"kind": "llvm", "num-cores": 1})


def trials_per_task(work_dir):
    return {t["name"]: t["trials"] for t in tuning.report(work_dir)["tasks"]}


@pytest.mark.slow  # 21 s; the node-loss and driver-kill tests below run by default
def test_cluster_database_holds_what_a_local_run_does(cluster, client, target, tmp_path, capsys):
    lines = []
    result = tune_on_cluster(tiny_workload(), target, str(tmp_path / "cluster"), TRIALS, client, log=lines.append)
    local = tuning.tune(tiny_workload(), target, str(tmp_path / "local"), TRIALS, log=lambda _: None)
    assert trials_per_task(tmp_path / "cluster") == trials_per_task(tmp_path / "local") == {
        "mm": TRIALS, "mmt": TRIALS, "rowsum": TRIALS}
    assert [t["name"] for t in result["tasks"]] == [t["name"] for t in local["tasks"]]
    assert result["e2e_us"] is not None and all(t["best_us"] > 0 for t in result["tasks"])
    assert {t["node"] for t in result["tasks"]} <= {"node1", "node2"}
    assert tuning.check_database(str(tmp_path / "cluster")).records == 3 * TRIALS
    assert lines[0] == "3 tasks, 0 of 6 trials already in the database; 3 tasks to tune on 2 nodes (node1, node2)"
    assert sum("ETA" in line and "2 nodes: node1, node2" in line for line in lines) == 3
    assert main(["report", str(tmp_path / "cluster")]) == 0  # which node tuned each task, and how long
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[-1] == "node" and all(row.split()[-1] in ("node1", "node2") for row in table[3:6])


def test_a_node_killed_mid_run_and_the_job_completes(cluster, client, target, tmp_path, capsys):
    lines, killed = [], threading.Event()
    node1 = next(a for a, info in client.scheduler_info()["workers"].items() if info["name"] == "node1")

    def kill_node1_once_busy():  # a second into one task (~4 s long): the driver has seen it there
        deadline, seen = time.time() + 60, {}
        while time.time() < deadline and not killed.is_set():
            ours = [k for k in client.processing().get(node1, ()) if str(k).startswith("tvm_ext-")]
            seen = {k: seen.get(k, time.time()) for k in ours}  # the same task, not one that just began
            if any(time.time() - since > 1.0 for since in seen.values()):
                cluster.kill_worker(0)
                killed.set()
            time.sleep(0.02)

    watcher = threading.Thread(target=kill_node1_once_busy, daemon=True)
    watcher.start()
    try:
        tune_on_cluster(tiny_workload(), target, str(tmp_path / "wd"), 4, client, log=lines.append, poll_s=0.2)
    finally:
        killed.set()
        watcher.join()
        cluster.workers[0] = cluster.start_worker(0)  # back to two nodes for the other tests
        cluster.wait_for_workers(2)
    assert set(trials_per_task(tmp_path / "wd").values()) == {4}  # every task completed, none above budget
    left = [line for line in lines if line.startswith("node node1 left the cluster")]
    assert left and "its tasks run again on another node" in left[0], lines
    assert lines[0] == "3 tasks, 0 of 12 trials already in the database; 3 tasks to tune on 2 nodes (node1, node2)"
    assert sum("tasks done, ETA" in line for line in lines) == 3
    assert main(["report", str(tmp_path / "wd")]) == 0  # which node tuned each task, and how long
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[-1] == "node" and all(row.split()[-1] in ("node1", "node2") for row in table[3:6])


class _Future:
    def __init__(self, key):
        self.key = key


class _Snapshots:
    """A client whose scheduler answers one snapshot of the nodes a call."""
    def __init__(self, *snapshots):
        self.snapshots = list(snapshots)

    def processing(self):
        return self.snapshots.pop(0)

    def scheduler_info(self):
        return {"workers": {"tcp://a": {"name": "node1"}, "tcp://b": {"name": "node2"}}}


def test_the_tasks_of_a_node_that_died_are_named_from_one_snapshot():
    from tvm_ext.cluster.tune import _watch_nodes
    pending = {_Future("k-mm"): "mm", _Future("k-rowsum"): "rowsum"}
    # the scheduler dropped node1 and moved its task to node2 in one step: the driver sees both at once
    client = _Snapshots({"tcp://a": ["k-mm"], "tcp://b": ["k-rowsum"]}, {"tcp://b": ["k-rowsum", "k-mm"]})
    lines = []
    where, nodes = _watch_nodes(client, pending, {}, {"tcp://a": "node1", "tcp://b": "node2"}, lines.append)
    assert (where, lines) == ({"mm": "tcp://a", "rowsum": "tcp://b"}, [])
    where, nodes = _watch_nodes(client, pending, where, nodes, lines.append)
    assert lines == ["node node1 left the cluster; its tasks run again on another node: mm"]
    assert (where, nodes) == ({"mm": "tcp://b", "rowsum": "tcp://b"}, {"tcp://b": "node2"})
    client.snapshots.append({"tcp://b": [], "tcp://a": []})  # node1 back: named by the scheduler
    _watch_nodes(client, {}, where, nodes, lines.append)
    assert lines[-1] == "node node1 joined the cluster"


DRIVER = """
import sys
sys.path.insert(0, {tests!r})
from toy_database import tiny_workload
from tvm_ext.cluster.local import LocalCluster
from tvm_ext.cluster.tls import security
from tvm_ext.cluster.tune import tune_on_cluster
from tvm_ext.targets import resolve_target
from distributed import Client
client = Client({address!r}, security=security({tls_dir!r}))
tune_on_cluster(tiny_workload(), resolve_target({{"kind": "llvm", "num-cores": 1}}), {work_dir!r}, 2, client,
                log=lambda line: print(line, flush=True))
"""


@pytest.mark.slow  # 16 s; resuming a killed tune is checked by default on one host (test_cli's Ctrl-C test)
def test_the_driver_killed_and_the_job_resumed(cluster, client, target, tmp_path):
    work_dir = str(tmp_path / "wd")
    script = DRIVER.format(tests=str(Path(__file__).parent), address=cluster.address, tls_dir=cluster.tls_dir,
                           work_dir=work_dir)
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    records = os.path.join(work_dir, tuning.DB_FILES[1])
    deadline = time.time() + 120
    while time.time() < deadline and driver.poll() is None:
        if os.path.exists(records) and tuning.check_database(work_dir).records >= 2:  # one task committed
            os.killpg(driver.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    driver.wait()
    assert driver.returncode == -signal.SIGKILL, "the driver finished before it could be killed"
    before = Path(records).read_bytes()
    done_before = sum(1 for n in trials_per_task(work_dir).values() if n == 2)
    assert 1 <= done_before < 3
    lines = []
    tune_on_cluster(tiny_workload(), target, work_dir, 2, client, log=lines.append)
    assert Path(records).read_bytes().startswith(before)  # nothing committed before the kill was lost
    assert set(trials_per_task(work_dir).values()) == {2}  # resumed; no task above its budget
    assert f"{2 * done_before} of 6 trials already in the database" in lines[0]


def test_a_node_or_client_without_the_credentials_is_refused(cluster, tmp_path):
    from distributed import Client

    stranger = tls.make_credentials(str(tmp_path / "other"))  # a CA the cluster does not know
    with pytest.raises((OSError, TimeoutError)):
        Client(cluster.address, security=tls.security(stranger), timeout=5)
    plain = cluster.worker_command(0, with_credentials=False)
    plain[plain.index("--death-timeout") + 1] = "5"
    proc = subprocess.run(plain, capture_output=True, timeout=60, env={**os.environ, **cluster.worker_env(0)})
    assert proc.returncode != 0  # it never joined
    with cluster.client() as c:
        assert sorted(info["name"] for info in c.scheduler_info()["workers"].values()) == ["node1", "node2"]


@pytest.mark.parametrize("extra, message", [
    (["--cluster", "tcp://127.0.0.1:8786", "--cluster-credentials", "x"], "use a tls:// address"),
    (["--cluster", "tls://127.0.0.1:8786"], "needs --cluster-credentials DIR"),
    (["--cluster", "tls://127.0.0.1:8786", "--cluster-credentials", "/nonexistent"], "no cluster credentials"),
    (["--cluster", "tls://127.0.0.1:8786", "--cluster-credentials", "x", "--reuse-schedules"],
     "--reuse-schedules runs on this machine"),
])
def test_bad_cluster_arguments_are_one_line(extra, message, capsys, monkeypatch):
    monkeypatch.delenv("TVM_EXT_CLUSTER_CREDENTIALS", raising=False)
    assert main(["tune", "conv2d-int8", "--image", "8", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_an_unreachable_cluster_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TVM_EXT_CLUSTER_CONNECT_S", "2")
    creds = tls.make_credentials(str(tmp_path / "c"))
    start = time.time()
    assert main(["tune", "conv2d-int8", "--image", "8", "--cluster", "tls://127.0.0.1:9",
                 "--cluster-credentials", creds]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot reach the cluster at tls://127.0.0.1:9" in err
    assert time.time() - start < 10
