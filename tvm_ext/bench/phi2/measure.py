"""Timing of the Phi-2 bench kernels and peers, DRAM-honest, interleaved round by round.

Each kernel with weights (``kernels.weight_positions``: q4 words, scales, biases,
LayerNorm parameters, the unfused dequantized matrix, the KV cache) is timed cycling
through C distinct copies of those arguments, C x their bytes >= 2 x the last-level cache
(``tvm_ext.bench.dram``): its ``ms`` is what it costs when its weights come from DRAM, as
in a decode step that streams all 32 layers.  Its ``ms_cache_hot`` (labelled) is the same
kernel looping over one copy.  A kernel without weights (rope, softmax, gelu, residual
adds) reads only activations the previous kernel just wrote: it is timed cache-hot, which
is what it costs in a decode step.

The cache flush before each run that this bench used before (``cache_flush_cpu_non_first_arg``)
is gone from it: it also flushed the activations (cold in no real step) and only evicts what
the flush walks.  It stays where it is still right: the tuning runner
(``tvm_ext.tune.runner``, ``flush_cache=True``) ranks candidates with every input cold,
a fixed condition for all candidates of a kernel, and the dlight seed is measured by that
same runner (``kernels.runner_seconds``).

Copy bandwidth (``measure_bandwidth``) is sampled in every round of the same run; the
peers (``peers``) run in every round after the TVM kernels.
"""
from __future__ import annotations

import numpy as np

from tvm_ext.bench.dram import as_plan, seconds_per_call
from tvm_ext.bench.phi2.kernels import build, measure_bandwidth, nbytes, normalize, random_args, weight_positions
from tvm_ext.bench.phi2.peers import projection_of, q4_weights, rolled
from tvm_ext.bench.timing import wait_until_idle
from tvm_ext.tune.seeds import is_gpu


MAX_CALLS = 64  # calls per DRAM sample


class KernelArgs:
    """One kernel's arguments (``func``'s parameters): NumPy base arrays and C device copies of those
    at ``positions`` (its weights; ``plan.copies``: a ``dram.CopyPlan``)."""

    def __init__(self, func, positions, plan, dev, rng):
        import tvm

        self.positions = positions
        self.plan = as_plan(plan)  # a ``dram.CopyPlan`` (or the LLC size in bytes)
        self.base = random_args(func, rng)
        self.weight_bytes = nbytes(func, positions)
        self.copies = self.plan.copies(self.weight_bytes) if positions else 1
        shared = [tvm.runtime.tensor(a, dev) for a in self.base]
        self.sets, self.cursor = [], 0
        for i in range(self.copies):
            copy = dict(zip(positions, rolled([self.base[p] for p in positions], i)))
            self.sets.append([tvm.runtime.tensor(copy[p], dev) if p in copy else t for p, t in enumerate(shared)])

    def next_sets(self, calls: int = MAX_CALLS, at_least: int = 1) -> list:
        """The next ``min(calls, max(C, at_least))`` argument sets in cycle order: a kernel with many
        small copies (LayerNorm: thousands) is sampled over a window of the cycle, each call still
        on a copy last used C calls ago; with fewer than ``at_least`` copies the window goes round
        the cycle more than once (the copies together exceed the cache: each call still reads DRAM)."""
        n = min(calls, max(self.copies, at_least))
        out = [self.sets[(self.cursor + i) % self.copies] for i in range(n)]
        self.cursor = (self.cursor + n) % self.copies
        return out

    def fresh(self, dev):
        """A separate set of device arguments with the base values (for output checks)."""
        import tvm

        return [tvm.runtime.tensor(a, dev) for a in self.base]


def _main(ex, dev):
    """The kernel as a synchronous callable (a GPU kernel waits for the device)."""
    fn = (ex.jit() if hasattr(ex, "jit") else ex)["main"]
    if dev.dlpack_device_type() == 1:  # CPU: calls return when the kernel is done
        return fn
    return lambda *a: (fn(*a), dev.sync())


def runtimes_with_weights(kss, peers, int8: bool) -> int:
    """How many runtimes of a bench hold weight copies: the kernels with weights of both fusion
    modes (their copies are shared by the schedules), 2 per projection per peer, 1 per
    projection for the int8 projections."""
    from tvm_ext.bench.phi2.peers import PROJECTIONS

    kernels = sum(1 for ks in kss.values() for pos in weight_positions(ks).values() if pos)
    return kernels + len(PROJECTIONS) * (2 * len(peers) + int(bool(int8)))


def prepare(kss, sched, schedules, target, dev, rng, plan, cfg, log):
    """Build every kernel of every schedule and check each against the kernel's float32 reference on
    the same inputs (``check_outputs``).  Returns ({(fusion, schedule, name): callable}, {(fusion, name): KernelArgs},
    {(fusion, name): projection or None}, {projection: q4 weights of the fused kernel},
    {(fusion, schedule, name): earlier schedule}).  A schedule whose module is structurally
    equal to an earlier row's (a tuned pick that is the untuned schedule) is not built again: it
    is the same binary, timed once (``same_as``), so the two rows differ by nothing, not by noise
    (the same fc1 timed in two rows differed by 22 % on a shared host)."""
    import tvm_ffi

    fns, args, proj, q4, same_as = {}, {}, {}, {}, {}
    for fusion in (False, True):
        positions = weight_positions(kss[fusion])
        for k in kss[fusion].kernels:
            key = (fusion, k.name)
            if key not in args:
                args[key] = KernelArgs(k.func, positions[k.name], plan, dev, rng)
            p = projection_of(k.name, k.func, k.part, cfg, positions[k.name])
            proj[(fusion, k.name, k.part)] = p
            if fusion and p is not None:
                q4[p] = q4_weights([args[key].base[i] for i in positions[k.name]])
            outs = {}
            for s in schedules:
                if (fusion, s, k.name) in fns or (fusion, s, k.name) in same_as:
                    continue
                twin = next((t for t in outs if tvm_ffi.structural_equal(sched[fusion][t][k.name],
                                                                         sched[fusion][s][k.name])), None)
                if twin is not None:
                    same_as[(fusion, s, k.name)] = twin
                    continue
                fn = _main(build(sched[fusion][s][k.name], target), dev)
                fns[(fusion, s, k.name)] = fn
                a = args[key].fresh(dev)
                fn(*a)
                outs[s] = a[-1].numpy()
            if outs:
                check_outputs(k.func, args[key].base, outs, f"{k.name} (fusion={fusion})")
        log(f"  built fusion={'on' if fusion else 'off'}: copies per kernel "
            + ", ".join(f"{n}={a.copies}" for (f, n), a in args.items() if f == fusion and a.copies > 1))
    return fns, args, proj, q4, same_as


def check_outputs(func, base, outs: dict, label: str) -> None:
    """Each schedule's output of one kernel ({schedule: array}, on the inputs ``base``) against the
    kernel's float32 reference (``bench.reference``: its unscheduled TIR widened, on the CPU) at the
    tolerance float accumulation over the kernel's K explains (``bundle.tolerance``); RuntimeError
    naming the schedule otherwise.  Never one schedule against another: two float16 schedules that
    sum K = 2560-10240 terms in different orders are both right and differ by more than 1e-3."""
    from tvm_ext.bench.reference import reduction_length, reference_output
    from tvm_ext.bundle.tolerance import check_output

    main = normalize(func)["main"]
    ref, k = reference_output(main, list(base)), reduction_length(main)
    for s, out in outs.items():
        ok, verdict = check_output(out, ref, k)
        if not ok:
            raise RuntimeError(f"{s} kernel {label} differs from its float32 reference: {verdict}")


FLOOR = "floor"  # the pseudo-schedule of the touch kernels in ``fns`` (``add_floors``)


def add_floors(fns: dict, kss, target, dev, threads: int) -> None:
    """Add to ``fns`` each fused kernel's touch kernel (``bench.touch``: its traffic, no compute) on
    1 thread and on ``threads``, as (True, "floor<n>", name): ``measure`` times them on the kernel's
    own arguments, the same cycled copies, in the same rounds (``floors`` takes them out).  On a GPU
    target nothing: the touch kernel is a CPU loop nest (``T.parallel``, no thread binding) that TVM's
    GPU memory verification rejects; there the copy bandwidth's bound is the kernel's floor."""
    from tvm_ext.bench.touch import touch_func

    if is_gpu(target):  # the touch kernel is a CPU loop nest (T.parallel, no thread binding): no floor
        return
    for k in kss[True].kernels:
        for n in sorted({1, max(1, int(threads))}):
            if (True, f"{FLOOR}{n}", k.name) not in fns:
                fns[(True, f"{FLOOR}{n}", k.name)] = _main(build(touch_func(normalize(k.func)["main"], n), target), dev)


def floors(times: dict) -> dict:
    """Take the touch kernels' entries out of ``times`` ({(fusion, schedule, name): s}); returns
    {name: the faster thread count's seconds}."""
    out = {}
    for key in [key for key in times if key[1].startswith(FLOOR)]:
        s = times.pop(key)
        out[key[2]] = min(out.get(key[2], s), s)
    return out


def with_twins(times: dict, same_as: dict) -> dict:
    """``times`` ({(fusion, schedule, name): s}) with each twin of ``prepare`` given its original's."""
    out = dict(times)
    for (fusion, s, name), twin in same_as.items():
        if (fusion, twin, name) in times:
            out[(fusion, s, name)] = times[(fusion, twin, name)]
    return out


def check_peers(peers, log) -> dict:
    """{peer index: max abs error of node 0 vs the NumPy reference, and that reference's
    max abs value}: ORT's output on our weights (acc 0: rounding only; acc 4: int8 activations),
    and the int8-activation projections' (every peer with an ``output()``)."""
    from tvm_ext.bench.phi2.peers import reference

    out, refs = {}, {}
    for i, peer in enumerate(peers):
        if not hasattr(peer, "output"):
            continue
        key = peer.projection
        if key not in refs:
            refs[key] = reference(peer.feed["x"], *peer.base)
        y = peer.output()
        err = float(np.max(np.abs(y - refs[key])))
        out[i] = {"max_abs_err": err, "max_abs_ref": float(np.max(np.abs(refs[key])))}
        log(f"  {peer.name} {peer.projection}: max |ort - numpy| = {err:.3g} "
            f"(outputs up to {out[i]['max_abs_ref']:.3g})")
    return out


def measure(fns, args, peers, dev, rounds, repeat, log):
    """Median seconds per call, interleaved round by round, each runtime's turn after the
    process's threads are idle (``timing.wait_until_idle``): ({(fusion, schedule, name): s}
    DRAM-cycled (cache-hot for kernels without weights), {same key: s} cache-hot for kernels
    with weights, [peer seconds]), plus the copy bandwidth (GB/s) and numpy's."""
    bw_tvm, bw_np = measure_bandwidth(dev)
    log(f"  copy bandwidth: {bw_tvm:.1f} GB/s (TVM parallel copy), {bw_np:.1f} GB/s (numpy)")
    dram, hot = {key: [] for key in fns}, {key: [] for key in fns}
    peer_s = [[] for _ in peers]
    bw_samples = []
    for key, fn in fns.items():  # warm-up
        seconds_per_call(fn, args[(key[0], key[2])].next_sets())
    for r in range(rounds):
        wait_until_idle()  # the last peer's threads parked (see timing): TVM's kernels run alone
        for key, fn in fns.items():
            a = args[(key[0], key[2])]
            if a.positions:  # calls on copies not used for C calls: weights not in the cache
                # (after an eviction sweep where memory allowed fewer copies than 2x the LLC)
                dram[key].append(a.plan.seconds_per_call(fn, a.next_sets()))
            # then the same kernel looping over one copy, as many calls: cache-hot
            fn(*a.sets[0])
            hot[key].append(float(np.median([seconds_per_call(fn, a.sets[:1] * min(MAX_CALLS, a.copies))
                                             for _ in range(repeat)])))
        for i, peer in enumerate(peers):
            wait_until_idle()  # TVM's workers spin ~0.2 s after a kernel: not into a peer's time
            peer_s[i].append(peer.seconds(repeat))
        bw_samples.append(measure_bandwidth(dev, repeat=1)[0])
        log(f"  round {r + 1}/{rounds} done")
    # the bound uses the faster of the two copies (on a loaded 2-core box numpy's
    # single-thread copy can beat TVM's 2-thread one): the stricter bound
    bandwidth = max(float(np.median(bw_samples + [bw_tvm])), bw_np)
    med = {key: float(np.median(v)) for key, v in hot.items()}
    sec = {key: (float(np.median(dram[key])) if dram[key] else med[key]) for key in fns}
    hot_s = {key: med[key] for key in fns if dram[key]}
    return sec, hot_s, [float(np.median(v)) for v in peer_s], bandwidth, bw_np
