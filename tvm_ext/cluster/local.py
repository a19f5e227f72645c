"""A Dask cluster of separate processes on this machine: one scheduler, N workers (nodes).

For the tests, the scaling benchmark and trying ``tune --cluster`` out. Every process listens on
loopback only, with the cluster's TLS credentials and no dashboard; each worker is its own node
(``--name nodeK``), confined to its cores (``taskset``), with one task at a time, TVM's thread
pool and MetaSchedule's builder pool sized to those cores. ``stop`` ends only the processes this
object started, by their ids.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from tvm_ext.cluster import tls


class LocalCluster:
    """``with LocalCluster(workers=2, tls_dir=...) as cluster: cluster.address ...``

    ``cores``: the CPU ids of each worker (default: worker k gets core k mod the cores there are);
    ``env``: extra environment for the workers."""

    def __init__(self, workers: int = 2, tls_dir: str | None = None, cores: list | None = None,
                 env: dict | None = None, log=lambda _: None):
        self.n, self.log = workers, log
        self._tmp = tempfile.mkdtemp(prefix="tvm_ext_cluster_")
        self.tls_dir = tls_dir or tls.make_credentials(os.path.join(self._tmp, "tls"))
        ncpu = len(os.sched_getaffinity(0))
        self.cores = cores or [[k % ncpu] for k in range(workers)]
        self.env = env or {}
        self.scheduler: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen | None] = []
        self.address: str | None = None

    # ------------------------------------------------------------------ processes
    def _spawn(self, args: list[str], log_name: str, env: dict | None = None) -> subprocess.Popen:
        out = open(os.path.join(self._tmp, log_name), "wb")  # pylint: disable=consider-using-with
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                start_new_session=True)

    def start(self, timeout: float = 90.0) -> "LocalCluster":
        sched_file = os.path.join(self._tmp, "scheduler.json")
        self.scheduler = self._spawn(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
             "--protocol", "tls", "--no-dashboard", "--scheduler-file", sched_file,
             *tls.cli_flags(self.tls_dir, "scheduler")],
            "scheduler.log")
        deadline = time.time() + timeout
        while not os.path.exists(sched_file):
            self._check_alive(self.scheduler, "scheduler.log")
            if time.time() > deadline:
                raise RuntimeError(f"the Dask scheduler did not start in {timeout:.0f} s")
            time.sleep(0.1)
        time.sleep(0.2)  # the file is written once; let the writer finish
        with open(sched_file, encoding="utf-8") as f:
            self.address = json.load(f)["address"]
        for k in range(self.n):
            self.workers.append(self.start_worker(k))
        self.wait_for_workers(self.n, deadline - time.time())
        self.log(f"local cluster at {self.address}: {self.n} nodes, cores {self.cores}")
        return self

    def node_credentials(self, k: int) -> str:
        """Node k+1's certificate folder (issued by the cluster's CA the first time it is asked for)."""
        folder = os.path.join(self.tls_dir, f"node{k + 1}")
        return folder if os.path.isfile(os.path.join(folder, tls.CERT)) else tls.issue(self.tls_dir, f"node{k + 1}")

    def worker_command(self, k: int, with_credentials: bool = True) -> list[str]:
        taskset = ["taskset", "-c", ",".join(map(str, self.cores[k]))] if shutil.which("taskset") else []
        flags = tls.cli_flags(self.node_credentials(k)) if with_credentials else []
        return [*taskset, sys.executable, "-m", "distributed.cli.dask_worker", self.address, "--name", f"node{k + 1}",
                "--host", "127.0.0.1", "--nthreads", "1", "--no-nanny", "--no-dashboard", "--death-timeout", "30",
                *flags]

    def worker_env(self, k: int) -> dict:
        threads = str(len(self.cores[k]))
        return {"TVM_NUM_THREADS": threads, "TVM_EXT_BUILD_WORKERS": threads, "OMP_NUM_THREADS": threads,
                **self.env}

    def start_worker(self, k: int) -> subprocess.Popen:
        return self._spawn(self.worker_command(k), f"worker{k + 1}.log", self.worker_env(k))

    def _check_alive(self, proc, log_name: str) -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"a cluster process exited ({proc.returncode}): {self.log_tail(log_name)}")

    def log_tail(self, log_name: str, lines: int = 5) -> str:
        try:
            with open(os.path.join(self._tmp, log_name), encoding="utf-8", errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def client(self, **kwargs):
        from distributed import Client

        return Client(self.address, security=tls.security(self.tls_dir), **kwargs)

    def wait_for_workers(self, n: int, timeout: float = 60.0) -> None:
        with self.client(timeout=max(timeout, 1)) as client:
            deadline = time.time() + timeout
            while len(client.scheduler_info()["workers"]) < n:
                for k, proc in enumerate(self.workers):
                    if proc is not None:
                        self._check_alive(proc, f"worker{k + 1}.log")
                if time.time() > deadline:
                    raise RuntimeError(f"only {len(client.scheduler_info()['workers'])} of {n} workers joined "
                                       f"in {timeout:.0f} s")
                time.sleep(0.2)

    def kill_worker(self, k: int) -> None:
        """SIGKILL node k+1 (a node that dies: no goodbye to the scheduler)."""
        proc = self.workers[k]
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        """The workers first (they say goodbye to the scheduler), then the scheduler; a process
        still there after 3 s is killed."""
        for group in (self.workers, [self.scheduler]):
            for proc in group:
                if proc is not None and proc.poll() is None:
                    proc.terminate()
            for proc in group:
                if proc is not None:
                    try:
                        proc.wait(timeout=3)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()


__all__ = ["LocalCluster"]
