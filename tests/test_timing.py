"""time_interleaved and wait_until_idle: the order of turns, the pause before each turn, the
calls counted, when the threads count as idle. No timing is asserted (timings never in
tests): fake clocks and a recording pause."""
import pytest

from tvm_ext.bench.timing import time_interleaved, time_turns, wait_until_idle


def _recorder():
    events = []
    callables = {name: (lambda name=name: events.append(name)) for name in ("tvm", "ort", "peer")}
    return events, callables


def test_turns_rotate_each_after_a_pause_with_repeat_calls():
    events, callables = _recorder()
    medians = time_interleaved(callables, rounds=3, warmup=1, repeat=2,
                               settle=lambda: events.append("pause"))
    assert set(medians) == {"tvm", "ort", "peer"} and all(m >= 0 for m in medians.values())
    warm, timed = events[:3], events[3:]
    assert warm == ["tvm", "ort", "peer"]  # warmup: one call each, no pause
    turns = [timed[i:i + 3] for i in range(0, len(timed), 3)]
    assert all(turn[0] == "pause" and turn[1] == turn[2] for turn in turns)
    assert [turn[1] for turn in turns] == ["tvm", "ort", "peer", "ort", "peer", "tvm", "peer", "tvm", "ort"]


def test_no_pause_without_settle():
    events, callables = _recorder()
    time_interleaved(callables, rounds=2, warmup=0, settle=None)
    assert events == ["tvm", "ort", "peer", "ort", "peer", "tvm"]


def test_warm_calls_follow_each_turns_first_and_have_their_own_median():
    now, last = [0.0], {}

    def runtime(name, cold, hot):  # a turn's first call costs `cold` (fake seconds), a call right after it `hot`
        def call():
            now[0] += hot if last.get("name") == name else cold
            last["name"] = name
        return call

    events = []
    callables = {"tvm": runtime("tvm", 10.0, 6.0), "ort": runtime("ort", 12.0, 7.0)}
    first, warm = time_turns(callables, rounds=3, warmup=0, warm=4, clock=lambda: now[0],
                             settle=lambda: (events.append("pause"), last.clear()))
    assert first == {"tvm": 10.0, "ort": 12.0} and warm == {"tvm": 6.0, "ort": 7.0}
    assert events == ["pause"] * 6  # one pause a turn, none between a turn's calls
    assert time_turns(callables, rounds=1, warmup=0, settle=None)[1] == {}  # no warm calls: no warm medians


@pytest.mark.parametrize("rounds, repeat", [(0, 1), (2, 0)])
def test_empty_timing_is_refused(rounds, repeat):
    with pytest.raises(ValueError, match="rounds and repeat"):
        time_interleaved({"a": lambda: None}, rounds=rounds, repeat=repeat)


class FakeProcess:
    """A process whose other threads burn ``busy[i]`` CPU seconds during the i-th sleep."""

    def __init__(self, busy):
        self.busy, self.now, self.cpu_s, self.sleeps = list(busy), 0.0, 0.0, 0

    def sleep(self, seconds):
        self.now += seconds
        self.cpu_s += self.busy[self.sleeps] if self.sleeps < len(self.busy) else 0.0
        self.sleeps += 1

    def wait(self, **kw):
        return wait_until_idle(window=0.02, cpu=lambda: self.cpu_s, sleep=self.sleep,
                               clock=lambda: self.now, **kw)


def test_waits_while_other_threads_spin():
    spinning = FakeProcess([0.04, 0.03, 0.02, 0.0005])  # two threads spinning, then parked
    assert spinning.wait() is True and spinning.sleeps == 4


def test_idle_process_returns_after_one_window():
    idle = FakeProcess([])
    assert idle.wait() is True and idle.sleeps == 1


def test_gives_up_after_max_wait():
    busy = FakeProcess([0.02] * 1000)  # a thread that never parks (another job, a busy loop)
    assert busy.wait(max_wait=0.1) is False and busy.sleeps == 5


def test_busy_turns_are_reported():
    lines, results = [], iter([True, False, False, True])
    time_interleaved({"a": lambda: None, "b": lambda: None}, rounds=2, warmup=0,
                     settle=lambda: next(results), log=lines.append)
    assert len(lines) == 1 and "2 of 4 turns" in lines[0]
    quiet = []
    time_interleaved({"a": lambda: None}, rounds=2, settle=lambda: True, log=quiet.append)
    assert quiet == []


def test_cycled_timer_shares_arguments_per_signature_and_cycles_copies():
    """CycledTimer: two schedules of one kernel built apart and given the same argument copies, enough
    copies that they exceed the plan's cycle (here 1 MiB for a 64 KiB kernel: 16), each timing a
    window of them in turn; a module that does not build gets None, as runner_seconds' non-strict one."""
    tvm = pytest.importorskip("tvm")
    from tvm.script import tirx as T

    from tvm_ext.bench.cycled import CycledTimer
    from tvm_ext.bench.dram import CopyPlan

    @T.prim_func(s_tir=True)
    def scale(a: T.Buffer((8192,), "float32"), b: T.Buffer((8192,), "float32")):
        for i in range(8192):
            with T.sblock("b"):
                vi = T.axis.remap("S", [i])
                b[vi] = a[vi] * T.float32(2)

    plain = tvm.IRModule({"main": scale.with_attr("global_symbol", "main")})
    sch = tvm.s_tir.Schedule(plain)
    sch.vectorize(sch.split(sch.get_loops(sch.get_sblock("b"))[0], [None, 16])[1])
    timer = CycledTimer("llvm", plan=CopyPlan(1 << 19), window=4)
    secs = timer({"plain": plain, "vector": sch.mod, "plain again": plain})
    assert all(s is not None and s > 0 for s in secs.values())
    assert len(timer._fns) == 2 and len(timer._args) == 1  # built per module, arguments per signature
    (args,) = timer._args.values()
    assert len(args.sets) == 16 and args.cursor == 12  # 3 windows of 4 copies
    broken = tvm.IRModule({"main": scale.with_attr("global_symbol", "main").with_attr("target", 5)})
    assert timer({"broken": broken}) == {"broken": None}
