"""Tuning on a real Dask cluster on this machine: a TLS scheduler and two worker nodes as separate
processes on loopback, each pinned to one core (tvm_ext.cluster.local). The database a cluster run
writes holds what a local run's holds (the same tasks, each at its budget, valid records); a node
killed mid-run and the job completes; the driver killed and the job resumes; a node or client
without the cluster's credentials is refused."""
import json
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


@pytest.mark.slow  # 21 s (179 s on a loaded host)
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


@pytest.mark.slow  # 85 s on 2 cores; a node leaving is checked by default in test_cluster_checks (dispatch)
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


def _nothing_ran(cluster) -> bool:
    with cluster.client() as c:
        return not c.run_on_scheduler(lambda dask_scheduler: [k for k in dask_scheduler.tasks
                                                              if str(k).startswith("stranger-")])


def test_the_scheduler_refuses_a_client_of_another_ca(cluster, tmp_path):
    """The client trusts the cluster's CA (so it accepts the scheduler): the refusal is the scheduler's."""
    from distributed import Client, Security

    ca = tls.paths(cluster.tls_dir)[0]
    _, cert, key = tls.paths(tls.make_credentials(str(tmp_path / "other")))
    sec = Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, require_encryption=True)
    with pytest.raises((OSError, TimeoutError)):
        with Client(cluster.address, security=sec, timeout=5) as stranger:
            stranger.submit(sum, [1, 2], key="stranger-sum").result(timeout=5)
    assert _nothing_ran(cluster)


def test_the_scheduler_refuses_a_connection_without_a_certificate(cluster):
    """Dask cannot even be configured for TLS without a client certificate: a plain TLS socket that
    trusts the cluster's CA and presents none is what the scheduler must refuse; the same socket with
    the client's certificate is answered (Dask's scheduler speaks first)."""
    import socket
    import ssl

    host, port = cluster.address.removeprefix("tls://").rsplit(":", 1)

    def first_reply(with_certificate: bool):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ca, cert, key = tls.paths(cluster.tls_dir)
        ctx.load_verify_locations(ca)
        if with_certificate:
            ctx.load_cert_chain(cert, key)
        with socket.create_connection((host, int(port)), timeout=3) as raw:
            try:
                with ctx.wrap_socket(raw) as conn:  # TLS 1.3: the server's verdict comes with its first record
                    return "answered" if conn.recv(1) else "closed"
            except socket.timeout:
                return "kept open"
            except (ssl.SSLError, ConnectionError) as err:
                return f"refused: {err}"

    assert first_reply(True) in ("answered", "kept open")
    assert first_reply(False).startswith(("refused", "closed"))
    assert _nothing_ran(cluster)


def test_a_node_with_an_expired_certificate_or_none_never_joins(cluster, tmp_path):
    import datetime

    expired = tls.issue(cluster.tls_dir, "expired", days=1,
                        not_before=datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=30))
    for flags in (tls.cli_flags(expired), []):
        cmd = cluster.worker_command(0, with_credentials=False) + flags
        cmd[cmd.index("--death-timeout") + 1] = "5"
        cmd[cmd.index("--name") + 1] = "intruder"
        proc = subprocess.run(cmd, capture_output=True, timeout=60, env={**os.environ, **cluster.worker_env(0)})
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


# ----------------------------------------------------------------------------- nodes that match the job
def _describe_node2_as_znver3(dask_worker=None):
    """A node that says it is another CPU (every feature kept): a mixed cluster on one machine."""
    from tvm_ext.cluster.nodes import describe_node

    info = describe_node()
    if dask_worker.name == "node2":
        info["mcpu"] = "znver3" if info["mcpu"] != "znver3" else "znver2"
    return info


def _forge_on_node1(job):
    """node1 returns records it made up (a run time of zero); the others tune for real."""
    from distributed import get_worker

    from tvm_ext.cluster.tune import tune_remote

    result = tune_remote(job)
    if get_worker().name == "node1":
        forged = [json.loads(text) for text in result["records"]]
        for rec in forged:
            rec[1] = [0.0]  # run_secs
        result["records"] = [json.dumps(rec) for rec in forged]
    return result


def _hang_on_node1(job):
    from distributed import get_worker

    from tvm_ext.cluster.tune import tune_remote

    if get_worker().name == "node1":
        time.sleep(3600)
    return tune_remote(job)


@pytest.fixture
def by_value():
    """Test doubles defined here travel to the workers by value (tests/ is not on their path)."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def measured_on(work_dir) -> dict:
    meta = tuning.read_meta(str(work_dir))
    return {e["name"]: [(m["node"], m["mcpu"], m["records"]) for m in e.get("measured_on", [])]
            for e in meta["tasks"]}


@pytest.mark.slow  # ~60 s: two tunes (the decisions themselves are checked by default in test_cluster_checks)
def test_a_node_of_another_cpu_times_nothing_unless_allowed(cluster, client, tmp_path, by_value):
    from tvm_ext.targets import describe_host

    mcpu = describe_host()["mcpu"]
    target = resolve_target({"kind": "llvm", "mcpu": mcpu, "num-cores": 1})
    lines = []
    tune_on_cluster(tiny_workload(), target, str(tmp_path / "strict"), 1, client, log=lines.append,
                    describe=_describe_node2_as_znver3)
    assert any(line.startswith("node node2 not used: its CPU znver") for line in lines), lines
    assert "3 tasks to tune on 1 nodes (node1)" in lines[1]
    assert {n for rows in measured_on(tmp_path / "strict").values() for n, _, _ in rows} == {"node1"}
    assert tuning.read_meta(str(tmp_path / "strict"))["threads"] == 1  # the nodes' thread count, not the driver's
    lines = []
    tune_on_cluster(tiny_workload(), target, str(tmp_path / "mixed"), 1, client, log=lines.append,
                    describe=_describe_node2_as_znver3, allow_mixed_cpus=True)
    rows = [r for rows in measured_on(tmp_path / "mixed").values() for r in rows]
    other = "znver3" if mcpu != "znver3" else "znver2"
    assert {(n, c) for n, c, _ in rows} == {("node1", mcpu), ("node2", other)}  # which records came from where


def test_a_cuda_target_without_gpu_nodes_is_refused_before_any_work(client, tmp_path):
    target = resolve_target("cuda-sm90")
    with pytest.raises(ValueError, match="no node of the cluster can tune this target: 2 refused .*has no GPU"):
        tune_on_cluster(tiny_workload(), target, str(tmp_path / "wd"), 1, client, log=lambda _: None)
    assert not os.path.exists(tmp_path / "wd")


@pytest.mark.slow  # 60-110 s (node1 tunes for nothing); test_cluster_checks checks each refusal by default
def test_a_forged_result_commits_nothing_and_the_task_completes_elsewhere(cluster, client, target, tmp_path,
                                                                         by_value):
    lines = []
    tune_on_cluster(tiny_workload(), target, str(tmp_path / "wd"), TRIALS, client, log=lines.append,
                    remote=lambda job: _forge_on_node1(job))  # a lambda: pickled by value
    refused = [line for line in lines if "result refused, nothing committed" in line]
    assert refused and all(" on node1: " in line and "not finite and positive" in line for line in refused), lines
    assert set(trials_per_task(tmp_path / "wd").values()) == {TRIALS}
    assert {n for rows in measured_on(tmp_path / "wd").values() for n, _, _ in rows} == {"node2"}
    db = tuning.check_database(str(tmp_path / "wd"))
    assert db.records == 3 * TRIALS


@pytest.mark.slow  # ~40 s: waits out a task's deadline
def test_a_hung_task_runs_again_after_its_deadline(cluster, client, target, tmp_path, by_value):
    lines = []
    try:
        tune_on_cluster(tiny_workload(), target, str(tmp_path / "wd"), 1, client, log=lines.append,
                        remote=lambda job: _hang_on_node1(job), task_deadline_s=25, poll_s=0.2)
    finally:
        cluster.kill_worker(0)  # its thread still sleeps
        cluster.workers[0] = cluster.start_worker(0)
        cluster.wait_for_workers(2)
    assert any("on node1: no result after 25 s (the task's deadline); cancelled" in line for line in lines), lines
    assert set(trials_per_task(tmp_path / "wd").values()) == {1}


def test_a_second_driver_on_the_same_work_dir_is_one_line(client, target, tmp_path):
    from toy_database import toy_mod, toy_work_dir

    from tvm_ext.tune.lock import WorkDirBusy, driver_lock

    work_dir = str(tmp_path / "wd")
    toy_work_dir(work_dir, {"add": toy_mod(lambda x: x + 1)})  # a work dir another driver holds
    with driver_lock(work_dir):
        with pytest.raises(WorkDirBusy, match="another tvm-ext tune is tuning into it") as err:
            tune_on_cluster(tiny_workload(), target, work_dir, 2, client, log=lambda _: None)
        assert len(str(err.value).splitlines()) == 1
        with pytest.raises(WorkDirBusy):
            tuning.tune(tiny_workload(), target, work_dir, 2, log=lambda _: None)
    assert tuning.check_database(work_dir).records == 0  # neither committed anything


@pytest.mark.slow  # ~30 s: a scheduler and a worker started as a user would, then a CLI tune through them
def test_the_dask_command_lines_of_the_help_text_run_a_tune(tmp_path, capsys):
    """``dask scheduler`` / ``dask worker`` as ``tvm-ext cluster --help`` prints them, then ``tvm-ext tune``."""
    import shutil

    dask = shutil.which("dask")
    assert dask, "the [cluster] extra installs the dask command"
    creds = str(tmp_path / "c")
    assert main(["cluster", "credentials", creds]) == 0
    assert main(["cluster", "credentials", creds, "--node", "gpu-a"]) == 0

    def flags(folder):  # the help text's f()
        return ["--tls-ca-file", f"{folder}/ca.pem", "--tls-cert", f"{folder}/cert.pem", "--tls-key",
                f"{folder}/key.pem"]

    sched_file = str(tmp_path / "scheduler.json")
    procs = [subprocess.Popen([dask, "scheduler", "--protocol", "tls", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard", "--scheduler-file", sched_file, *flags(f"{creds}/scheduler")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)]
    try:
        deadline = time.time() + 60
        while not os.path.exists(sched_file) and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.3)
        address = json.loads(Path(sched_file).read_text())["address"]
        env = {**os.environ, "TVM_NUM_THREADS": "1", "TVM_EXT_BUILD_WORKERS": "1"}
        procs.append(subprocess.Popen([dask, "worker", address, "--nthreads", "1", "--no-dashboard", "--name",
                                       "gpu-a", "--host", "127.0.0.1", *flags(f"{creds}/gpu-a")], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        with Client_of(address, creds) as c:
            c.wait_for_workers(1, timeout=60)
        code = main(["tune", "conv2d-int8", "--image", "8", "--trials", "1", "--cluster", address,
                     "--cluster-credentials", creds, "--work-dir", str(tmp_path / "wd"),
                     "--target", '{"kind": "llvm", "num-cores": 1}', "--json"])
        out = capsys.readouterr()
        assert code == 0, out.err[-800:]
        result = json.loads(out.out)
        assert result["tasks"] and all(t["trials"] == 1 and t["node"] == "gpu-a" for t in result["tasks"])
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()


def Client_of(address, creds):  # noqa: N802 -- reads as a constructor
    from distributed import Client

    return Client(address, security=tls.security(creds), timeout=30)
