"""The cluster driver's decisions without a cluster: which nodes may tune a target, which results
are committed, where a task goes when its node fails, hangs or leaves (test doubles of Dask)."""
import json

import pytest
import tvm
from toy_database import toy_mod
from tvm.s_tir import meta_schedule as ms

from tvm_ext.cluster.checks import BadResult, checked_records
from tvm_ext.cluster.dispatch import Dispatcher
from tvm_ext.cluster.nodes import choose, none_can, refusal, target_needs
from tvm_ext.targets import target_to_json

ZEN4 = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})


def node(mcpu="znver4", cores=2, gpu=None, arch=None, features=None):
    return {"mcpu": mcpu, "cores": cores, "gpu": gpu, "gpu_arch": arch,
            "features": sorted(target_needs(ZEN4)["features"]) if features is None else features}


# ----------------------------------------------------------------------------- nodes
def test_a_node_of_another_cpu_is_refused_unless_mixed_cpus_are_allowed():
    needs = target_needs(ZEN4)
    assert refusal(node(), needs) is None
    other = node(mcpu="znver5")  # has every feature znver4 code uses: only its timings would be another CPU's
    assert "is not the target's znver4" in refusal(other, needs)
    assert refusal(other, needs, allow_mixed=True) is None


def test_a_node_missing_an_instruction_is_refused_even_with_mixed_cpus():
    needs = target_needs(ZEN4)
    lacking = node(mcpu="znver2", features=[f for f in needs["features"] if not f.startswith("avx512")])
    for allow in (False, True):
        assert "lacks avx512" in refusal(lacking, needs, allow_mixed=allow)


def test_a_node_that_cannot_say_what_it_is_is_refused():
    assert refusal({"error": "ImportError: no module named tvm"}, target_needs(ZEN4)) == \
        "it could not say what it is (ImportError: no module named tvm)"


def test_threads_and_gpus():
    assert "timed on 2" in refusal(node(cores=1), target_needs(ZEN4))
    cuda = target_needs(tvm.target.Target({"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 1024,
                                           "max_shared_memory_per_block": 49152, "thread_warp_size": 32}))
    assert "has no GPU" in refusal(node(), cuda)
    assert refusal(node(), cuda, rpc=True) is None  # timed through a tracker's devices
    assert "is sm_80" in refusal(node(gpu="A100", arch="sm_80"), cuda)
    assert refusal(node(gpu="H100", arch="sm_90"), cuda) is None


def test_no_node_that_can_tune_is_one_line():
    lines = []
    ok, why = choose({"a": node(cores=1), "b": node(mcpu="znver3")}, {"a": "n1", "b": "n2"}, target_needs(ZEN4),
                     False, False, lines.append)
    err = str(none_can(why))
    assert not ok and err.startswith("no node of the cluster can tune this target: 2 refused (node n1: it may use 1")
    assert len(err.splitlines()) == 1 and len(lines) == 2 and lines[0].startswith("node n1 not used")


def test_only_instruction_sets_count_not_llvm_tuning_flags():
    """A generic x86-64 target's LLVM features include tuning flags (slow-3ops-lea) no CPU model lists."""
    generic = target_needs(tvm.target.Target({"kind": "llvm", "num-cores": 1}))
    assert not [f for f in generic["features"] if f.startswith(("slow", "fast", "tuning"))]
    assert refusal(node(mcpu="znver3", features=["avx", "avx2", "sse4.2", "fma", "f16c"]), generic) is None


# ----------------------------------------------------------------------------- checks
LLVM1 = tvm.target.Target({"kind": "llvm", "num-cores": 1})


def record_text(mod, secs=(1e-5,), target=LLVM1, block="T_out"):
    sch = tvm.s_tir.Schedule(mod)
    sch.parallel(sch.get_loops(sch.get_sblock(block))[0])
    db = ms.database.MemoryDatabase()
    rec = ms.database.TuningRecord(sch.trace, db.commit_workload(mod), run_secs=list(secs), target=target,
                                   args_info=ms.arg_info.ArgInfo.from_prim_func(mod["main"]))
    return json.dumps(rec.as_json())


@pytest.fixture
def task():
    mod = toy_mod(lambda x: x + 1)
    job = {"name": "add", "target": json.dumps(target_to_json(LLVM1)), "trials": 2}
    return mod, job, ms.database.MemoryDatabase().commit_workload(mod)


def result(job, records, **over):
    return {"name": job["name"], "target": job["target"], "records": records, "node": "n", "seconds": 1.0, **over}


def test_a_good_result_gives_its_records(task):
    mod, job, wl = task
    recs = checked_records(result(job, [record_text(mod), record_text(mod, (2e-5, 3e-5))]), job, mod, wl)
    assert [list(map(float, r.run_secs)) for r in recs] == [[1e-5], [2e-5, 3e-5]]


@pytest.mark.parametrize("case, message", [
    ("malformed", "record 2 is malformed"),
    ("nan", "not finite and positive"),
    ("zero", "not finite and positive"),
    ("negative", "not finite and positive"),
    ("other target", "record 1 names another target"),
    ("result target", "tuned for another target"),
    ("too many", "3 records for the 2 trials"),
    ("other task", "the result of task 'mul'"),
    ("no replay", "record 1 is malformed or its trace does not replay"),
    ("not a dict", "not a result"),
])
def test_a_bad_result_is_refused_whole(task, case, message):
    mod, job, wl = task
    good = record_text(mod)
    zen3 = tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 1})
    bad = {
        "malformed": lambda: result(job, [good, "{not json"]),
        "nan": lambda: result(job, [record_text(mod, (float("nan"),))]),
        "zero": lambda: result(job, [record_text(mod, (0.0,))]),
        "negative": lambda: result(job, [good, record_text(mod, (-1e-5,))]),
        "other target": lambda: result(job, [record_text(mod, target=zen3)]),
        "result target": lambda: result(job, [good], target=json.dumps(target_to_json(zen3))),
        "too many": lambda: result(job, [good] * 3),
        "other task": lambda: result(job, [good], name="mul"),
        "no replay": lambda: result(job, [record_text(_other_block(), block="T_other")]),
        "not a dict": lambda: [good],
    }[case]()
    with pytest.raises(BadResult, match=message) as err:
        checked_records(bad, job, mod, wl)
    assert len(str(err.value).splitlines()) == 1


def _other_block():
    """A module whose block the task's module does not have: its records' traces cannot replay there."""
    from tvm import te

    a = te.placeholder((64, 64), "int32", name="a")
    return tvm.IRModule({"main": te.create_prim_func([a, te.compute((64, 64), lambda i, j: a[i, j] * 2,
                                                                     name="T_other")])})


# ----------------------------------------------------------------------------- dispatch
class FakeFuture:
    def __init__(self, job, addr):
        self.job, self.addr, self.cancelled = job, addr, False

    def cancel(self):
        self.cancelled = True


class FakeClient:
    def __init__(self, nodes):
        self.nodes = dict(nodes)  # addr -> (name, description)
        self.submitted = []

    def scheduler_info(self):
        return {"workers": {a: {"name": n} for a, (n, _) in self.nodes.items()}}

    def processing(self):
        return {a: () for a in self.nodes}

    def run(self, describe, workers=None, on_error="raise"):  # pylint: disable=unused-argument
        assert on_error == "return"
        return {a: self.nodes[a][1] for a in workers}

    def submit(self, fn, job, key, workers, allow_other_workers, pure):  # pylint: disable=unused-argument
        assert allow_other_workers is False and len(workers) == 1
        future = FakeFuture(job, workers[0])
        self.submitted.append((job["name"], self.nodes[workers[0]][0]))
        return future


def dispatcher(nodes, tasks=("a", "b", "c"), **kw):
    client = FakeClient(nodes)
    lines = []
    d = Dispatcher(client, {t: {"name": t} for t in tasks}, None, target_needs(ZEN4), lines.append, **kw)
    d.refresh_nodes()
    return d, client, lines


def test_one_task_per_node_and_only_on_nodes_that_may():
    d, client, lines = dispatcher({"x": ("n1", node()), "y": ("n2", node()), "z": ("n3", node(mcpu="znver3"))})
    d.place()
    assert client.submitted == [("a", "n1"), ("b", "n2")] and d.queue == ["c"]
    assert lines == ["node n3 not used: its CPU znver3 is not the target's znver4: its timings would be taken as "
                     "that CPU's (--allow-mixed-cpus to use it anyway)"]


def test_a_failed_task_runs_again_on_another_node_never_the_same():
    d, client, lines = dispatcher({"x": ("n1", node()), "y": ("n2", node())}, tasks=("a",))
    d.place()
    (future,) = d.running
    assert d.failed(future, "result refused") and d.queue == ["a"]
    d.place()
    assert client.submitted == [("a", "n1"), ("a", "n2")]
    (future,) = d.running
    assert not d.failed(future, "failed (boom)")  # no node left that it has not failed on
    assert lines[-1] == "a on n2: failed (boom); given up after 2 nodes (run the same command again to retry)"


def test_a_task_past_its_deadline_is_cancelled_and_its_node_gets_nothing_more():
    d, client, lines = dispatcher({"x": ("n1", node()), "y": ("n2", node())}, tasks=("a", "b"), deadline_s=0.0)
    d.place()
    futures = list(d.running)
    d.deadline_s = 1e9
    d.running[futures[0]].started -= 10  # only a's node is overdue
    d.deadline_s = 5.0
    d.cancel_overdue()
    assert futures[0].cancelled and d.hung == {"x"} and d.queue == ["a"]
    assert "no result after 5 s (the task's deadline); cancelled" in lines[-1]
    d.running.pop(futures[1])  # b finished on n2
    d.place()
    assert client.submitted[-1] == ("a", "n2")


def test_a_node_that_leaves_gives_its_task_back():
    d, client, lines = dispatcher({"x": ("n1", node()), "y": ("n2", node())}, tasks=("a", "b", "c"))
    d.place()
    gone = next(f for f, p in d.running.items() if p.addr == "x")
    del client.nodes["x"]
    d.refresh_nodes()
    assert gone.cancelled and d.queue == ["a", "c"]
    assert lines[-1] == "node n1 left the cluster; its tasks run again on another node: a"
    client.nodes["w"] = ("n4", node())
    d.refresh_nodes()
    assert lines[-1] == "node n4 joined the cluster" and "w" in d.eligible
