"""The driver's side of a cluster run: which node tunes which task, and what to do when it goes wrong.

The driver places every task itself: on a node that may tune the target (``nodes``), one task per
node at a time (a node started with several threads would otherwise time several tasks at once),
and never again on a node that failed it. A task goes back to the queue, for another node, when
its node errs, sends a result the checks refuse (``checks``), misses the task's deadline (cancelled;
that node gets nothing more in this run: its thread may still be busy) or leaves the cluster; after
``max_attempts`` such ends, or when no node it has not failed on is left, it is given up in one
line and the same command retries it later. Nodes that join during the run are asked what they
are and used if they may.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

from tvm_ext.cluster.nodes import choose, survey


@dataclass
class Placed:
    name: str
    addr: str
    started: float


@dataclass
class Dispatcher:
    """Places the tasks of ``jobs`` ({name: job}, in order) on ``client``'s nodes with ``remote``."""
    client: object
    jobs: dict
    remote: Callable
    needs: dict
    log: Callable[[str], None]
    allow_mixed: bool = False
    rpc: bool = False
    deadline_s: float = 600.0
    max_attempts: int = 3
    describe: Callable | None = None
    eligible: dict = field(default_factory=dict)  # address -> description
    names: dict = field(default_factory=dict)  # address -> node name
    running: dict = field(default_factory=dict)  # future -> Placed
    failed_on: dict = field(default_factory=dict)  # task -> addresses it failed on
    hung: set = field(default_factory=set)
    seen: set = field(default_factory=set)  # addresses asked already
    refused: dict = field(default_factory=dict)  # node name -> why it may not tune

    def __post_init__(self):
        self.queue = list(self.jobs)

    # ------------------------------------------------------------------ nodes
    def refresh_nodes(self) -> None:
        """Nodes now: ask new ones what they are, drop those that left (their tasks go back to the queue)."""
        # the nodes from one direct call (``processing``); the scheduler's identity can come back from a
        # cache without its workers, which would read as every node gone
        addrs = list(self.client.processing())
        new = [a for a in addrs if a not in self.seen]
        info = self.client.scheduler_info()["workers"] if any(a not in self.names for a in addrs) else {}
        now = {a: self.names.get(a) or str(info.get(a, {}).get("name") or a) for a in addrs}
        if new:
            self.seen.update(new)
            kwargs = {"describe": self.describe} if self.describe is not None else {}
            described = survey(self.client, new, **kwargs)
            if self.eligible or self.names:
                for addr in described:
                    self.log(f"node {now[addr]} joined the cluster")
            ok, why = choose(described, now, self.needs, self.allow_mixed, self.rpc, self.log)
            self.eligible.update(ok)
            self.refused.update(why)
        for addr in [a for a in self.eligible if a not in now]:
            del self.eligible[addr]
            lost = sorted(p.name for p in self.running.values() if p.addr == addr)
            self.log(f"node {self.names.get(addr, addr)} left the cluster"
                     + (f"; its tasks run again on another node: {', '.join(lost)}" if lost else ""))
            for future, placed in list(self.running.items()):
                if placed.addr == addr:
                    future.cancel()
                    del self.running[future]
                    self.queue.insert(0, placed.name)
        self.names.update(now)

    def node_names(self) -> list[str]:
        return sorted(self.names.get(a, a) for a in self.eligible)

    # ------------------------------------------------------------------ placing
    def place(self) -> None:
        busy = {p.addr for p in self.running.values()} | self.hung
        for name in list(self.queue):
            free = [a for a in self.eligible if a not in busy and a not in self.failed_on.get(name, ())]
            if not free:
                continue
            addr = free[0]
            future = self.client.submit(self.remote, self.jobs[name], key=f"tvm_ext-{name}-{os.getpid()}-"
                                        f"{time.time_ns()}", workers=[addr], allow_other_workers=False, pure=False)
            self.running[future] = Placed(name, addr, time.time())
            self.queue.remove(name)
            busy.add(addr)

    def stalled(self) -> list[str]:
        """Tasks queued that no node they have not failed on can take, with no task running: given up."""
        if self.running:
            return []
        usable = set(self.eligible) - self.hung
        gone = [n for n in self.queue if self.failed_on.get(n) and not usable - self.failed_on[n]]
        for name in gone:
            self.queue.remove(name)
        return gone

    def failed(self, future, why: str) -> bool:
        """Task of ``future`` ended without records on its node: back to the queue unless it has had
        ``max_attempts``; returns whether it will run again."""
        placed = self.running.pop(future)
        tried = self.failed_on.setdefault(placed.name, set())
        tried.add(placed.addr)
        node = self.names.get(placed.addr, placed.addr)
        again = len(tried) < self.max_attempts and bool(set(self.eligible) - self.hung - tried)
        self.log(f"{placed.name} on {node}: {why}; " + ("it runs again on another node" if again else
                 f"given up after {len(tried)} nodes (run the same command again to retry)"))
        if again:
            self.queue.append(placed.name)
        return again

    def overdue(self) -> list:
        now = time.time()
        return [f for f, p in self.running.items() if now - p.started > self.deadline_s]

    def cancel_overdue(self) -> None:
        for future in self.overdue():
            placed = self.running[future]
            future.cancel()
            self.hung.add(placed.addr)
            self.failed(future, f"no result after {self.deadline_s:.0f} s (the task's deadline); cancelled, and "
                                "its node gets no more tasks in this run")


def _last_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else type(err).__name__


__all__ = ["Dispatcher"]
