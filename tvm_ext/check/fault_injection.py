"""Fault injection: kill ``tvm-ext tune`` with SIGKILL at random moments, check the database.

Each cycle starts ``tvm-ext tune`` on one work dir (a budget a few trials above what the
database holds, so there is always work) and kills its whole process group, either after a
random delay (start-up, task extraction, search, building, measuring) or the moment a
database file changes size (during or just after a database write). After every kill:

- the work dir is either absent or a tvm_ext database (``tvm_ext.json`` readable);
- every line of both database files passes ``check_database`` (an incomplete last record
  line, what a kill mid-append leaves, is allowed and counted);
- the database opens read-only in TVM and holds as many records as the check counted;
- every record line complete before the kill is still there, byte for byte (records lost);
- the next run resumes: it reports the records already in the database as done.

A last run without a kill must finish its budget. ``run`` returns the figures;
``python -m tvm_ext.check.fault_injection --kills 20 --out FILE`` writes them as JSON.
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from tvm_ext.tune import database as db

SMALL = ("conv2d-int8", "--image", "8", "--batch", "1")
RESUME = re.compile(r"tuning (\d+) trials \((\d+) done\)")
ALREADY = re.compile(r"(\d+)/(\d+) trials already in the database")


def _complete_record_lines(work_dir: str) -> list[bytes]:
    """Record lines that are complete (newline-terminated) right now."""
    path = os.path.join(work_dir, db.RECORDS)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    return data[:data.rfind(b"\n") + 1].splitlines(keepends=True)


def _missing(reference: list[bytes], now: list[bytes]) -> int:
    """Lines of ``reference`` not found unchanged at the same place in ``now``."""
    return sum(1 for i, line in enumerate(reference) if i >= len(now) or now[i] != line)


def _sizes(work_dir: str) -> tuple:
    out = []
    for name in (*db.DB_FILES, db.META_FILE):
        try:
            out.append(os.stat(os.path.join(work_dir, name)).st_size)
        except FileNotFoundError:
            out.append(-1)
    return tuple(out)


def _records_in_database(work_dir: str) -> tuple[int, dict]:
    """(records, facts) of the work dir as a reader finds it; raises on any damage."""
    if not os.path.isdir(work_dir) or not os.listdir(work_dir):
        return 0, {"work_dir": "absent"}
    db.read_meta(work_dir)
    state = db.check_database(work_dir)
    database = db.open_database(work_dir, read_only=True)
    loaded = len(database.get_all_tuning_records())
    if loaded != state.records:
        raise AssertionError(f"TVM loaded {loaded} records, the check counted {state.records}")
    return state.records, {"partial_tail": state.partial_tail is not None,
                           "missing_newline": bool(state.missing_newline)}


def _tune_command(work_dir: str, trials: int, per_iter: int, target: str) -> list[str]:
    return [sys.executable, "-m", "tvm_ext", "tune", *SMALL, "--target", target,
            "--trials", str(trials), "--per-iter", str(per_iter), "--work-dir", work_dir]


def _check_resume(log_text: str, expected_done: int) -> bool | None:
    """Whether the run said it resumed from ``expected_done`` records (None: it was
    killed before saying anything about the task)."""
    match = RESUME.search(log_text) or ALREADY.search(log_text)
    if match is None:
        return None
    done = int(match.group(2) if match.re is RESUME else match.group(1))
    return done == expected_done


def run(kills: int = 20, work_dir: str | None = None, seed: int = 0, per_iter: int = 2,
        target: str = "llvm", max_delay_s: float = 40.0, extra_trials: int = 4,
        log=print) -> dict:
    """Kill ``kills`` tuning runs; returns {kills, survived, records_lost, ...}."""
    rng = random.Random(seed)
    scratch = tempfile.mkdtemp(prefix="tvm_ext_fault_")
    work_dir = work_dir or os.path.join(scratch, "db")
    start = time.time()
    cycles, lost_total, survived, resumes_checked, resumes_ok = [], 0, 0, 0, 0
    records = _records_in_database(work_dir)[0]
    known = _complete_record_lines(work_dir)
    attempts = 0
    while len(cycles) < kills:
        attempts += 1
        if attempts > 3 * kills:
            raise RuntimeError(f"only {len(cycles)} of {kills} runs could be killed")
        mode = "on-write" if attempts % 2 == 0 else "random"
        cmd = _tune_command(work_dir, records + extra_trials, per_iter, target)
        log_path = os.path.join(scratch, f"run{attempts:03d}.log")
        with open(log_path, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            t0, sizes0 = time.time(), _sizes(work_dir)
            delay = rng.uniform(1.0, max_delay_s)
            while proc.poll() is None:
                elapsed = time.time() - t0
                if mode == "random" and elapsed >= delay:
                    break
                if mode == "on-write" and (_sizes(work_dir) != sizes0 or elapsed > 4 * max_delay_s):
                    break
                time.sleep(0.002 if mode == "on-write" else 0.05)
            before = _complete_record_lines(work_dir)
            if proc.poll() is not None:  # finished (or failed) before the kill
                with open(log_path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                if proc.returncode != 0:
                    raise RuntimeError(f"tune failed without a kill (exit {proc.returncode}):\n"
                                       f"{text[-3000:]}")
                records = _records_in_database(work_dir)[0]
                known = _complete_record_lines(work_dir)
                log(f"run {attempts}: finished before the kill ({records} records)")
                continue
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            at = time.time() - t0
        with open(log_path, encoding="utf-8", errors="replace") as f:
            resumed = _check_resume(f.read(), records)
        cycle = {"mode": mode, "killed_after_s": round(at, 2), "records_before": len(before),
                 "resumed_from_database": resumed}
        try:
            records, facts = _records_in_database(work_dir)
            after = _complete_record_lines(work_dir)
            # lines complete at the last check must still lead the file (a repair by this
            # run must not have touched them), and so must the lines complete at the kill
            lost = _missing(known, before) + _missing(before, after)
            known = after
            cycle.update(facts, opens=True, records_after=records, records_lost=lost)
        except Exception as err:  # noqa: BLE001 - the finding is the report
            lost = len(before)
            cycle.update(opens=False, error=str(err).splitlines()[0] if str(err) else
                         type(err).__name__, records_lost=lost)
            records = 0
        if resumed is not None:
            resumes_checked += 1
            resumes_ok += bool(resumed)
        lost_total += lost
        ok = cycle["opens"] and lost == 0 and resumed is not False
        survived += ok
        cycles.append(cycle)
        log(f"kill {len(cycles)}/{kills} ({mode}, after {at:.1f} s): "
            + (f"opens, {records} records, {lost} lost" if cycle["opens"] else
               f"DOES NOT OPEN: {cycle['error']}")
            + ("" if resumed is None else f", resumed {'ok' if resumed else 'WRONG'}")
            + (", incomplete last line" if cycle.get("partial_tail") else ""))
        if not cycle["opens"]:
            break
    final = _final_run(work_dir, records, per_iter, target, scratch, log)
    result = {
        "kills": len(cycles), "survived": survived, "records_lost": lost_total,
        "resumes_checked": resumes_checked, "resumes_ok": resumes_ok,
        "kills_leaving_incomplete_last_line": sum(bool(c.get("partial_tail")) for c in cycles),
        "kills_leaving_missing_newline": sum(bool(c.get("missing_newline")) for c in cycles),
        "kills_by_mode": {m: sum(c["mode"] == m for c in cycles) for m in ("random", "on-write")},
        "final_run": final,
        "seconds": round(time.time() - start, 1),
        "setup": {"command": " ".join(["tvm-ext tune", *SMALL, "--target", target,
                                       "--trials", f"<records+{extra_trials}>",
                                       "--per-iter", str(per_iter), "--work-dir", "<dir>"]),
                  "seed": seed, "max_delay_s": max_delay_s, "machine": _machine()},
        "cycles": cycles,
    }
    if result["survived"] == result["kills"] and final["ok"]:
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        result["logs"] = scratch  # each run's output, kept for a look
    return result


def _final_run(work_dir: str, records: int, per_iter: int, target: str, scratch: str, log) -> dict:
    """One more run, not killed: it must resume and reach its budget."""
    before = _complete_record_lines(work_dir)
    budget = records + per_iter
    proc = subprocess.run(_tune_command(work_dir, budget, per_iter, target), capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        return {"ok": False, "exit": proc.returncode, "error": proc.stderr.strip()[-500:]}
    after_records = _records_in_database(work_dir)[0]
    after = _complete_record_lines(work_dir)
    kept = after[:len(before)] == before
    resumed = _check_resume(proc.stderr, records)
    ok = after_records == budget and kept and resumed is True
    log(f"final run: {after_records}/{budget} records, earlier records "
        f"{'kept' if kept else 'CHANGED'}, resumed from {records}: {resumed}")
    return {"ok": ok, "budget": budget, "records": after_records, "earlier_kept": kept,
            "resumed_from_database": resumed}


def _machine() -> str:
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} logical CPUs"


def main(argv=None) -> int:
    from tvm_ext.jsonio import write_json

    p = argparse.ArgumentParser(prog="python -m tvm_ext.check.fault_injection",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=20, help="runs to kill (default 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill moments (default 0)")
    p.add_argument("--work-dir", default=None, help="database to use (default: a new temp dir)")
    p.add_argument("--max-delay", type=float, default=40.0,
                   help="longest random delay before a kill, seconds (default 40)")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    if args.kills < 1:
        p.error("--kills must be at least 1")
    result = run(args.kills, args.work_dir, args.seed, max_delay_s=args.max_delay,
                 log=lambda m: print(m, file=sys.stderr, flush=True))
    if args.out:
        write_json(args.out, result)
    print(f"{result['kills']} kills, {result['survived']} survived, {result['records_lost']} "
          f"records lost, resumes {result['resumes_ok']}/{result['resumes_checked']}, final run "
          f"{'ok' if result['final_run']['ok'] else 'FAILED'} ({result['seconds']:.0f} s)")
    ok = result["survived"] == result["kills"] and result["final_run"]["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
