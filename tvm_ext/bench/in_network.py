"""Pick each task's schedule inside the running network (``tvm-ext tune ... --in-network K``).

The tuner ranks a task's schedules alone, on cache-hot data; inside the network a kernel's
weights and inputs come from wherever its neighbours left them, and the ranking can change
(ResNet-50's 7x7 convs, 1-2.4 MiB of weights each: a second-best record 15-20 % faster there,
``docs/journal.md``).  Variant j of the network runs every task's j-th best record
(``tune.picks.ranked``: distinct schedules); the variants' per-task times inside the network
(``bench.breakdown``) are taken in alternating rounds, and a task keeps a lower-ranked record
only where its median beats the best record's by ``margin`` -- a minimum over noisy medians
would otherwise pick noise -- and the picks are kept only if the network with all of them runs
faster than with the best records, first run and warm, side by side (``timing.time_turns``).
Every network built is checked against the workload's reference before it is timed.  The picks
go to the work dir (``tune.picks``), which every later compile of it uses; the records and their
measured times are left as they are.  A run's picks were worth 0-6 % (docs/journal.md).
"""
from __future__ import annotations

import statistics

from tvm_ext.bench.breakdown import breakdown, task_records
from tvm_ext.bench.timing import time_turns


def check_top_k(top_k: int) -> None:
    """One line for a ``--in-network`` that compares nothing."""
    if top_k < 2:
        raise ValueError(f"--in-network compares each task's K best records inside the network: K >= 2, "
                         f"not {top_k}")


def choose(times: dict, margin: float) -> dict:
    """{task: rank} for the tasks whose fastest lower-ranked variant beats rank 0 by ``margin``
    (a fraction); ``times`` {task: [median time inside the network of rank 0, 1, ...]} (any unit)."""
    out = {}
    for task, per_rank in times.items():
        rank = min(range(len(per_rank)), key=per_rank.__getitem__)
        if rank and per_rank[rank] < (1 - margin) * per_rank[0]:
            out[task] = rank
    return out


def pick_in_network(workload, target, work_dir: str, top_k: int = 3, rounds: int = 8, runs: int = 8,
                    margin: float = 0.05, confirm_rounds: int = 10, log=print) -> dict:
    """Time the top ``top_k`` records of every task inside the network, write the picks (see the
    module doc) and return {"picks": {task: rank}, "network_ms": [median per variant], ...}."""
    from tvm_ext import tune as tuning
    from tvm_ext.targets import describe_host, target_key
    from tvm_ext.tune.picks import ranked, trace_key, write_picks

    check_top_k(top_k)
    tasks = tuning.load_tasks(work_dir, tuning.read_meta(work_dir))
    database = tuning.open_database(work_dir, read_only=True)
    ranks = {t.name: r for t in tasks if (r := ranked(database, t.mod, top_k))}
    network = _Network(workload, target, work_dir, task_records(workload, tasks, database))
    variants = max((len(r) for r in ranks.values()), default=0)
    executables = [network.build({name: min(j, len(r) - 1) for name, r in ranks.items()}, ranks, f"rank {j}", log)
                   for j in range(variants)]
    times, network_ms = network.task_times(executables, rounds, runs, log)
    chosen = choose({name: t[:len(ranks[name])] for name, t in times.items() if name in ranks}, margin)
    host = describe_host()
    about = {"top_k": top_k, "rounds": rounds, "runs": runs, "margin": margin, "target": target_key(target),
             "host": {"cpu": host.get("cpu_name"), "mcpu": host.get("mcpu"), "cores": host.get("physical_cores")},
             "network_ms": network_ms}
    if chosen:  # the picks together, side by side with the best records: kept only if the network gains
        picked = network.build({name: chosen.get(name, 0) for name in ranks}, ranks, "the picks", log)
        first, warm = network.side_by_side(executables[0], picked, confirm_rounds)
        about["confirm_ms"] = {"best_records": first[0], "picks": first[1], "best_records_warm": warm[0],
                               "picks_warm": warm[1]}
        log(f"in-network picks: the network with its {len(chosen)} picks {first[1]:.3f} ms (warm {warm[1]:.3f}), "
            f"with the best records {first[0]:.3f} ms (warm {warm[0]:.3f}), {confirm_rounds} rounds side by side")
        if not (first[1] < first[0] and warm[1] < warm[0]):
            log("in-network picks: not faster together; none kept")
            chosen = {}
    picks = {name: {"best": trace_key(ranks[name][0]), "pick": trace_key(ranks[name][rank]), "rank": rank,
                    "in_network_ms": times[name]} for name, rank in chosen.items()}
    path = write_picks(work_dir, picks, about)
    for name, pick in picks.items():
        ms_ = pick["in_network_ms"]
        log(f"  {name}: rank {pick['rank']} record, {ms_[pick['rank']] * 1e3:.1f} vs {ms_[0] * 1e3:.1f} us inside "
            "the network")
    log(f"in-network picks: {len(picks)} of {len(ranks)} tasks run a lower-ranked record ({path})")
    return {"picks": chosen, **about}


class _Network:
    """The workload compiled with chosen records, checked, and timed as ``pick_in_network`` needs."""

    def __init__(self, workload, target, work_dir: str, known):
        import tvm

        from tvm_ext import tune as tuning

        self.workload, self.target, self.work_dir, self.known = workload, target, work_dir, known
        self.dev = tuning.device_for(target)
        self.args = [tvm.runtime.tensor(x, self.dev) for x in workload.inputs]

    def build(self, rank_of: dict, ranks: dict, label: str, log):
        """The network with each task's record of rank ``rank_of[task]``, checked against the reference."""
        from tvm_ext import tune as tuning
        from tvm_ext.tune.picks import as_database

        log(f"in-network picks: compiling the network with {label} ...")
        chosen = as_database([ranks[name][rank] for name, rank in rank_of.items()])
        executable = tuning.compile_workload(self.workload, self.target, None, database=chosen)
        vm = tuning.make_vm(executable, self.target)
        ok, summary = self.workload.check(tuning.run_workload(vm, self.workload, self.target))
        if not ok:
            raise RuntimeError(f"the network with {label} differs from the reference ({summary})")
        return executable

    def task_times(self, executables, rounds: int, runs: int, log) -> tuple[dict, list]:
        """({task: [median ms inside the network per executable]}, [median network ms per executable]):
        ``bench.breakdown`` of each executable, in ``rounds`` alternating rounds."""
        samples, network = {}, [[] for _ in executables]
        for i in range(rounds):
            log(f"in-network picks: round {i + 1}/{rounds}, {len(executables)} networks x {runs} runs ...")
            for j, executable in enumerate(executables):
                found = breakdown(executable, self.dev, self.args, self.workload, self.work_dir, runs=runs,
                                  known=self.known)
                network[j].append(found["network_ms"])
                for row in found["tasks"]:
                    samples.setdefault(row["task"], [[] for _ in executables])[j].append(row["in_network_ms"])
        times = {name: [statistics.median(s) if s else float("inf") for s in per] for name, per in samples.items()}
        return times, [statistics.median(n) for n in network]

    def side_by_side(self, a, b, rounds: int) -> tuple[list, list]:
        """([first-run ms of a, b], [warm ms of a, b]): interleaved rounds (``timing.time_turns``)."""
        from tvm import relax

        vms = [relax.VirtualMachine(e, self.dev) for e in (a, b)]
        calls = {i: (lambda vm=vm: (vm["main"](*self.args), self.dev.sync())) for i, vm in enumerate(vms)}
        first, warm = time_turns(calls, rounds, warm=3)
        return [first[i] * 1e3 for i in (0, 1)], [warm[i] * 1e3 for i in (0, 1)]
