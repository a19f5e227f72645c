"""Where a kernel's tuning starts: database seeding and side-by-side measuring.

* ``seed_rules`` / ``seed_database``: the untuned schedule (``tvm_ext.scheduling.untuned_schedule``: our
  rules', else dlight's) committed as a tuning record with the seconds the tuning runner measured, so
  the search starts from it and a tuned record ranks above it only when that same runner measured it
  faster ("tuned" never loses to "untuned");
* ``tune_from_rules``: ``seed_rules`` then ``tune_kernels`` through the plugin space, then
  ``confirm_picks``: each pick that is not the untuned schedule measured beside it;
* ``tuned_inputs``: a work dir's database and the kernels ``confirm_picks`` kept untuned, what the
  ``tuned`` schedule of ``tvm_ext.ApplySchedules`` reads.
"""
from __future__ import annotations

import os

from tvm_ext.jsonio import read_json, write_json
from tvm_ext.schedule_rule import is_gpu  # noqa: F401  (the harness asks it here)
from tvm_ext.scheduling import as_built, best_schedule, not_ours, rule_schedule, untuned_schedule
from tvm_ext.tune.database import records_of


# --------------------------------------------------------------------------- seeding a database
def seed_rules(mods: dict, target, db_dir: str, log=print, runner=None) -> int:
    """Commit, for each kernel of ``mods`` with no record in ``db_dir``, its untuned schedule -- our
    rules' (``rule_schedule``), else dlight's, else the kernel as built (what the Phi-2 ``rule`` and
    ``int8`` rows run) -- with the seconds the tuning runner (``runner``, default ``make_runner()``)
    measures: a tuned record ranks above it only when that runner measured it faster.  Returns how
    many kernels got our rules' schedule committed."""
    from tvm_ext.tune.kernels import kernel_database
    from tvm_ext.tune.runner import make_runner, runner_seconds
    from tvm_ext.tune.transfer import commit_measured

    database, picked, mine, ours = kernel_database(db_dir, log), {}, set(), 0
    for name, mod in mods.items():
        if records_of(database, mod):
            continue
        found = rule_schedule(mod, target)
        if found is not None:
            mine.add(name)
        picked[name] = (mod, found[1] if found is not None else not_ours(mod, target))
    if picked:
        log(f"measuring the untuned schedules of {len(picked)} kernels with the tuning runner ...")
        secs = runner_seconds({n: sch.mod for n, (_, sch) in picked.items()}, target, runner or make_runner(),
                              strict=False)
        for name, (mod, sch) in picked.items():
            if secs[name] is None:  # an embedding lookup: the runner's random ids index outside its table
                log(f"  {name}: the tuning runner cannot run it on random inputs; not seeded")
                continue
            commit_measured(database, mod, sch, secs[name], target)
            ours += name in mine
    return ours


def seed_database(db, mods, dlight, target, dlight_secs):
    """Commit the dlight schedule of each kernel as a tuning record (empty trace where dlight
    has no rule, i.e. the unscheduled kernel), with ``dlight_secs[name]`` as its run time
    (``runner_seconds`` of the runner that then tunes the database)."""
    from tvm.s_tir import meta_schedule as ms

    for name, mod in mods.items():
        if db.has_workload(mod) and db.get_top_k(db.commit_workload(mod), 1):
            continue
        wl = db.commit_workload(mod)
        sch = dlight[name][1] if dlight[name][1] is not None else as_built(mod)  # no dlight rule
        db.commit_tuning_record(
            ms.database.TuningRecord(
                sch.trace, wl, run_secs=[float(dlight_secs[name])], target=target,
                args_info=ms.arg_info.ArgInfo.from_prim_func(mod["main"]),
            )
        )


def tune_from_rules(mods: dict, target, db_dir: str, trials: int, log=print, flush_cache: bool = True,
                    measure=None) -> dict:
    """Tune every kernel of ``mods`` up to ``trials`` records in ``db_dir`` (resumes), each starting
    from our rules' untuned schedule (``seed_rules``): the tuned schedule never loses to it in the
    runner's eyes.  ``flush_cache`` (CPU, the default): every candidate, the seed too, runs after a cache
    flush (``runner.evaluator_config``), as a model's weights and KV cache come from DRAM (a prompt's and
    a decode step's share kernels: the head's last-token GEMM; measured one way each time); a runner
    that loops over cache-hot inputs picks schedules that lose there (Phi-2 decode at 512 positions: the
    attention-value pick of a cache-hot runner took 1.7x our rule's time a step).
    ``measure``: how ``confirm_picks`` times each pick beside its untuned schedule (default the runner)."""
    from tvm_ext.targets import resolve_target
    from tvm_ext.tune.kernels import tune_kernels
    from tvm_ext.tune.runner import make_runner

    target = resolve_target(target)
    runner = make_runner(flush_cache=flush_cache and not is_gpu(target))
    seeded = seed_rules(mods, target, db_dir, log, runner=runner)
    log(f"tuning {len(mods)} kernels, {trials} trials each, into {db_dir} (kernels new to it start from the "
        f"untuned schedule: ours for {seeded} of them, dlight's or the kernel as built for the others; the "
        "rest resume from their records)")
    added = tune_kernels(mods, target, db_dir, trials, runner=runner, log=log)
    confirm_picks(mods, target, db_dir, runner, log, measure=measure)
    return added


# --------------------------------------------------------------------------- a pick confirmed side by side
KEPT_FILE = "untuned_kept.json"  # beside the database: kernels whose tuned pick lost the side-by-side check
PAIRED_ROUNDS = 3
PICK_MARGIN = 0.05  # a pick replaces the untuned schedule only when it is this much faster side by side


def confirm_picks(mods: dict, target, db_dir: str, runner, log=print, rounds: int = PAIRED_ROUNDS,
                  measure=None) -> dict:
    """For each kernel of ``mods`` whose best record in ``db_dir`` is not its untuned schedule: both
    measured side by side (one batch, adjacent runs), ``rounds`` times, by ``measure`` ({name: IRModule}
    -> {name: seconds or None}; default: ``runner``, as ``runner_seconds`` does, a failure None;
    ``bench.cycled.CycledTimer``: back to back on DRAM-cycled arguments, as a model runs); where the pick
    was not ``PICK_MARGIN`` faster in the median of those rounds' ratios, the kernel goes into ``KEPT_FILE``
    and ``tuned_schedule`` gives its untuned schedule.  Why: records are measured minutes apart, and on a
    shared host the runner's figure for one schedule moved by 30-63 % between measurements (Phi-2's
    decode GEMMs on a 2-core host) while the sketches it ranks differ by a few %; and a pick
    confirmed 1-4 % faster could run 6 % slower in the bench's rounds right after (a KV-cache
    concatenate): within the margin the untuned schedule, the same binary as the rule row, stays.
    Returns {kernel: median ratio tuned / untuned}."""
    import statistics

    import tvm_ffi

    from tvm_ext.tune.database import open_database
    from tvm_ext.tune.kernels import kernel_key
    from tvm_ext.tune.runner import runner_seconds

    db, pairs = open_database(db_dir, read_only=True), {}
    for name, mod in mods.items():
        best = best_schedule(db, mod)
        ours = untuned_schedule(mod, target).mod
        if best is not None and not tvm_ffi.structural_equal(best, ours):
            pairs[name] = (mod, ours, best)
    if not pairs:
        return {}
    if measure is None:
        measure = lambda batch: runner_seconds(batch, target, runner, strict=False)  # noqa: E731
    log(f"confirming {len(pairs)} tuned picks against the untuned schedules, side by side, {rounds} rounds ...")
    ratios = {name: [] for name in pairs}
    for _ in range(rounds):
        batch = {}
        for name, (_, ours, best) in pairs.items():
            batch[f"{name}/untuned"], batch[f"{name}/tuned"] = ours, best
        secs = measure(batch)
        for name in pairs:
            untuned, tuned = secs[f"{name}/untuned"], secs[f"{name}/tuned"]
            if untuned and tuned:
                ratios[name].append(tuned / untuned)
    kept, out, lost = read_kept(db_dir), {}, []
    for name, (mod, _, _) in pairs.items():
        if not ratios[name]:
            continue
        out[name] = statistics.median(ratios[name])
        if out[name] > 1.0 - PICK_MARGIN:
            kept[kernel_key(mod)] = {"kernel": name, "tuned_over_untuned": out[name]}
            lost.append(name)
        else:
            kept.pop(kernel_key(mod), None)
    write_json(os.path.join(db_dir, KEPT_FILE), kept, sort_keys=True)
    lost.sort()
    log(f"  tuned picks {PICK_MARGIN:.0%} faster side by side: {len(out) - len(lost)} of {len(out)}"
        + (f"; the untuned schedule stays for {', '.join(lost)}" if lost else ""))
    return out


def read_kept(db_dir: str) -> dict:
    """{kernel key: {kernel, tuned_over_untuned}} of the kernels ``confirm_picks`` kept untuned."""
    return read_json(os.path.join(db_dir, KEPT_FILE), {})


# --------------------------------------------------------------------------- what ``tuned`` reads
def tuned_inputs(db_dir: str, target=None) -> tuple:
    """(the work dir's database, read only; the keys of the kernels ``confirm_picks`` kept untuned): the
    ``database`` and ``keep_untuned`` of ``tvm_ext.ApplySchedules(target, "tuned", ...)``.  With ``target``:
    one-line ``DatabaseMismatch`` first where the records tensorize with instructions it lacks
    (``check_instructions``; a database tuned on an AVX-512 host would make LLVM abort the process)."""
    from tvm_ext.targets import resolve_target
    from tvm_ext.tune.database import check_instructions, open_database

    if not db_dir or not os.path.isdir(db_dir):
        raise ValueError(f"schedule 'tuned': no tuning database {db_dir}")
    if target is not None:
        check_instructions(db_dir, resolve_target(target), "run schedule int8 here (our rules, untuned), "
                           "or tune a database for this CPU (generate --tune TRIALS)")
    return open_database(db_dir, read_only=True), frozenset(read_kept(db_dir))
