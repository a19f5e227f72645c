"""Work dirs and their MetaSchedule JSONDatabase: create, check, reopen, read records.

A work dir holds a JSONDatabase (``database_workload.json``, ``database_tuning_record.json``),
one file per extracted task under ``tasks/`` and ``tvm_ext.json`` recording workload,
options, target and rule set.

tvm_ext never damages a database. ``check_database`` validates every line of both files
and names the first bad one (``DatabaseCorrupt``: file, line, how to proceed); nothing is
rewritten or deleted. The one thing a killed tuning run can leave -- an incomplete last
line of the records file, or a last line whose newline was not written yet -- is repaired
by ``repair_database``, which only ``tune`` calls. A line of the workload file is never
deleted: records refer to workloads by line number. Read commands open a snapshot
(``open_database(work_dir, read_only=True)``) and never write to the work dir. A saved
database (``tuning_logs/``) holds its files gzip-compressed (``tvm_ext.tune.packed``): read
as they are, unpacked before a run appends to them.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from tvm_ext.jsonio import write_json
from tvm_ext.rulesets import check_ruleset
from tvm_ext.tune import packed
from tvm_ext.targets import (has_amx, has_avx2, physical_cores, target_key, target_mismatch, target_to_json,
                             vnni_kinds)

META_FILE = "tvm_ext.json"
WORKLOADS, RECORDS = "database_workload.json", "database_tuning_record.json"
DB_FILES = (WORKLOADS, RECORDS)
WORK_ROOT = "tvm_ext_work"  # git-ignored: where tune and bench write
SAVED_ROOT = "tuning_logs"  # the project's saved databases: written only by ``tvm-ext save``


class DatabaseMismatch(ValueError):
    """A work dir that is not a database, or one made for another workload or target."""


class DatabaseCorrupt(DatabaseMismatch):
    """A database file with a line MetaSchedule cannot load; the message names file and line."""


class WorkDirError(OSError):
    """The environment refuses a work dir (permissions, read-only file system, disk full).

    The message is one line naming the path; the CLI prints it and exits 1."""


@dataclass
class DatabaseState:
    """What ``check_database`` found: valid lines per file, and what a kill left at the end."""
    workloads: int = 0
    records: int = 0
    valid_bytes: dict = field(default_factory=dict)  # file name -> bytes up to the last good line
    partial_tail: int | None = None  # 1-based line number of an incomplete last record line
    missing_newline: list = field(default_factory=list)  # files whose good last line lacks "\n"


def default_work_dir(workload: str, target, ruleset: str, root: str = WORK_ROOT) -> str:
    return os.path.join(root, f"{workload}-{target_key(target)}-{ruleset}")


def databases_root(from_logs: bool, root: str | None = None) -> str:
    """Where a bench finds its databases: ``root`` if given, else the saved ones when it only
    reads (``--from-logs``), else the git-ignored work root it tunes into."""
    return root or (SAVED_ROOT if from_logs else WORK_ROOT)


def _env_error(action: str, path: str, err: OSError) -> WorkDirError:
    reason = err.strerror or str(err)
    return WorkDirError(f"cannot {action} {path}: {reason}")


def read_meta(work_dir: str) -> dict:
    """The work dir's metadata; DatabaseMismatch if it is not a tvm_ext database."""
    if not os.path.exists(work_dir):
        raise DatabaseMismatch(f"{work_dir}: no such directory")
    if not os.path.isdir(work_dir):
        raise DatabaseMismatch(f"{work_dir} is not a directory")
    path = os.path.join(work_dir, META_FILE)
    if not os.path.isfile(path):
        raise DatabaseMismatch(f"{work_dir} is not a tvm_ext tuning database (no {META_FILE})")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DatabaseMismatch(f"{path} is corrupt: {getattr(err, 'msg', err)}") from None
    except OSError as err:
        raise _env_error("read", path, err) from None


def measuring_threads() -> int:
    """Threads a kernel measured now runs on: TVM's pool size (``TVM_NUM_THREADS``, which every
    ``tvm-ext`` command sets and the runner's workers inherit), else this host's physical cores."""
    return int(os.environ.get("TVM_NUM_THREADS") or physical_cores())


def prepare_work_dir(work_dir: str, workload, target, ruleset: str, log=print) -> dict:
    """Create or reopen a work dir for ``tune``: refuse a foreign, corrupt or read-only one;
    repair what a killed run left (``repair_database``)."""
    check_ruleset(ruleset)
    wanted = {"workload": workload.name, "options": workload.options, "ruleset": ruleset,
              "target": target_to_json(target)}
    if os.path.isdir(work_dir) and os.listdir(work_dir):
        meta = read_meta(work_dir)
        for key in ("workload", "options", "ruleset"):
            if meta.get(key) != wanted[key]:
                raise DatabaseMismatch(
                    f"{work_dir} was made for {key} {meta.get(key)!r}, not {wanted[key]!r}")
        if meta["target"].get("kind") != wanted["target"].get("kind"):
            raise DatabaseMismatch(f"{work_dir} was made for target kind "
                                   f"{meta['target'].get('kind')!r}, not {wanted['target'].get('kind')!r}")
        warning = target_mismatch(meta["target"], target)
        if warning:
            log(f"warning: {work_dir}: {warning}")
        check_writable(work_dir)
        if _unpack(work_dir):
            log(f"note: {work_dir} was a saved (compressed) database; unpacked to add records to it "
                f"(tvm-ext save packs a work dir again)")
        repair_database(work_dir, log)
        return meta
    meta = dict(wanted, tasks=[], created=time.strftime("%Y-%m-%d %H:%M:%S"), threads=measuring_threads())
    _create_work_dir(work_dir, meta)
    return meta


def _create_work_dir(work_dir: str, meta: dict) -> None:
    """Make the work dir with its metadata in one step: built as ``<work_dir>.new`` and
    renamed, so a kill never leaves a directory without ``tvm_ext.json`` (which the next
    run would refuse as "not a tvm_ext tuning database")."""
    staging = work_dir.rstrip("/\\") + ".new"
    try:
        parent = os.path.dirname(os.path.abspath(work_dir))
        os.makedirs(parent, exist_ok=True)
        if os.path.isdir(staging):  # left by a run killed while creating this work dir
            shutil.rmtree(staging)
        os.makedirs(os.path.join(staging, "tasks"))
        write_json(os.path.join(staging, META_FILE), meta, sort_keys=True)
        os.replace(staging, work_dir)  # also over an empty directory made by the user
    except OSError as err:
        raise _env_error("create the work dir", work_dir, err) from None


def check_writable(work_dir: str) -> None:
    """WorkDirError unless ``tune`` can write its records and metadata in ``work_dir``."""
    targets = [work_dir] + [os.path.join(work_dir, n) for n in (META_FILE, *DB_FILES)
                            if os.path.exists(os.path.join(work_dir, n))]
    for path in targets:
        if not os.access(path, os.W_OK):
            raise WorkDirError(f"{path} is not writable: tune adds records to the database there "
                               f"(tune into a copy with --work-dir, or fix the permissions)")
    for name in DB_FILES:  # os.access ignores read-only mounts; opening for append does not
        path = os.path.join(work_dir, name)
        if os.path.exists(path):
            try:
                with open(path, "ab"):
                    pass
            except OSError as err:
                raise _env_error("write to", path, err) from None


def write_meta(work_dir: str, meta: dict) -> None:
    """Write metadata atomically (a kill never leaves half a file), and only when its content
    changed: a committed database stays byte-identical when a run adds nothing."""
    path = os.path.join(work_dir, META_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            if json.load(f) == json.loads(json.dumps(meta)):
                return
    except (OSError, ValueError):
        pass  # missing or unreadable: write it
    try:
        write_json(path, meta, sort_keys=True)
    except OSError as err:
        raise _env_error("write", path, err) from None


def _read_bytes(path: str) -> bytes:
    """``path``'s bytes, or its saved ``.gz``'s decompressed; WorkDirError naming it otherwise."""
    try:
        return packed.read_bytes(path)
    except OSError as err:
        raise _env_error("read", path, err) from None


def _unpack(work_dir: str) -> int:
    try:
        return packed.unpack(work_dir)
    except OSError as err:
        raise _env_error("unpack the saved database", work_dir, err) from None


RESTORE = "nothing was changed; restore the file from a backup or version control"
KEEP_WORKLOADS = RESTORE + " (never delete a workload line: records refer to workloads by line number)"


def _bad_line(path: str, number: int, problem: str, advice: str = RESTORE) -> DatabaseCorrupt:
    return DatabaseCorrupt(f"{path}:{number}: {problem}; {advice}")


def _parse_lines(data: bytes):
    """(line number, parsed JSON or None, byte end incl. newline, has newline) per line."""
    start, number = 0, 0
    while start < len(data):
        end = data.find(b"\n", start)
        terminated = end >= 0
        end = end if terminated else len(data)
        number += 1
        raw = data[start:end]
        try:
            value = json.loads(raw.decode("utf-8")) if raw.strip() else None
        except (UnicodeDecodeError, ValueError):
            value = None
        yield number, value, (end + 1 if terminated else end), terminated
        start = end + 1


def check_database(work_dir: str) -> DatabaseState:
    """Validate every line of both database files; nothing is written.

    Raises DatabaseCorrupt naming file and line for a line MetaSchedule could not load
    (not JSON, empty, the wrong shape, a record of a workload the workload file lacks).
    The one exception, what a run killed while appending a record leaves: an incomplete
    last line of the records file, returned as ``partial_tail`` (``repair_database`` drops
    it, read-only opens ignore it)."""
    return _check(work_dir)[0]


def _check(work_dir: str) -> tuple[DatabaseState, dict]:
    """``check_database``, plus the checked bytes of each file (None: the file is missing)."""
    state, contents = DatabaseState(), {}
    partial_workload = None  # 1-based line of an incomplete last workload line
    for name in DB_FILES:
        path = os.path.join(work_dir, name)
        if not packed.exists(path):
            state.valid_bytes[name], contents[name] = 0, None
            continue
        data = contents[name] = _read_bytes(path)
        lines = list(_parse_lines(data))
        good_end = 0
        for number, value, end, terminated in lines:
            last = number == len(lines)
            if name == WORKLOADS:
                ok = (isinstance(value, list) and len(value) == 2
                      and all(isinstance(v, str) for v in value))
                if not ok:
                    if last and not terminated and value is None:
                        partial_workload = number
                        break
                    raise _bad_line(path, number, "not a workload (corrupt line)", KEEP_WORKLOADS)
                state.workloads += 1
            else:
                ok = (isinstance(value, list) and len(value) == 2 and isinstance(value[0], int)
                      and not isinstance(value[0], bool) and isinstance(value[1], list))
                if not ok:
                    if last and not terminated and value is None:
                        state.partial_tail = number
                        break
                    raise _bad_line(path, number, "not a tuning record (corrupt line)",
                                    RESTORE + ", or delete that line by hand to lose only "
                                    "that record")
                if not 0 <= value[0] < state.workloads:
                    what = (f"line {partial_workload} of {WORKLOADS}, an incomplete last line"
                            if value[0] + 1 == partial_workload
                            else f"but {WORKLOADS} has {state.workloads} line(s)")
                    raise _bad_line(path, number, f"refers to workload {value[0]} ({what})",
                                    f"nothing was changed; restore {WORKLOADS} from a backup or "
                                    f"version control")
                state.records += 1
            good_end = end
            if last and not terminated:
                state.missing_newline.append(name)
        state.valid_bytes[name] = good_end
    if partial_workload is not None:  # the records do not refer to it
        raise _bad_line(os.path.join(work_dir, WORKLOADS), partial_workload,
                        "incomplete last line (a run killed while writing it?)",
                        "nothing was changed; no record refers to it: delete that last line by "
                        "hand (e.g. sed -i '$d' FILE) and run again")
    return state, contents


def repair_database(work_dir: str, log=print) -> int:
    """For ``tune`` only: finish what a killed run left. An incomplete last record line (the
    record was never committed) is cut off, a missing final newline is added; any other
    damage raises DatabaseCorrupt and nothing is written. Returns the lines dropped (0 or 1).
    A saved (compressed) database is unpacked first: records are appended to plain files."""
    _unpack(work_dir)
    state = check_database(work_dir)
    try:
        if state.partial_tail is not None:
            path = os.path.join(work_dir, RECORDS)
            os.truncate(path, state.valid_bytes[RECORDS])
            log(f"note: dropped the incomplete last line {state.partial_tail} of {path} "
                f"(a record a killed run was writing)")
        for name in state.missing_newline:
            with open(os.path.join(work_dir, name), "ab") as f:
                f.write(b"\n")
    except OSError as err:
        raise _env_error("repair", os.path.join(work_dir, RECORDS), err) from None
    return 0 if state.partial_tail is None else 1


def _json_database(path_workload: str, path_records: str, allow_missing: bool):
    return ms.database.JSONDatabase(path_workload, path_records, allow_missing=allow_missing,
                                    module_equality="structural")


_Q4_GEMV = re.compile(r"tvm_ext\.q4_gemv_f32\.x(\d+)\.c(\d+)\.n(\d+)\.k(\d+)\.(\w+)\.(\w+)\.l(\d+)$")
_TENSORIZE = re.compile(rb'"Tensorize",\s*\[[^\]]*\],\s*\["([^"]+)"')


def record_intrinsics(*record_paths: str) -> set:
    """Names of the tensor intrinsics the ``Tensorize`` instructions of these records files name."""
    names: set = set()
    for path in record_paths:
        if path and os.path.exists(path):
            names.update(m.decode() for m in _TENSORIZE.findall(_read_bytes(path)))
    return names


def register_record_intrinsics(*record_paths: str) -> None:
    """Register the tensor intrinsics that records name before a database holding them is opened (TVM
    replays each trace as it loads it, and a trace naming an unknown intrinsic does not load): those
    of ours a ``Tensorize`` of ``record_paths`` names (``tvm_ext.intrinsics.makers``; the per-shape
    q4 GEMV ones from their names), then TVM's own (wmma, mma, dp4a: ``tvm.s_tir.tensor_intrin``,
    imported the fast way, seconds) if one named is still unknown: the plugin's int8 tensor-core
    sketches name them, and in a fresh process only ``tvm_ext.space()`` had imported them.
    Only what is named is parsed: registering every q4 tile took ~7 s of each process."""
    from tvm.s_tir import TensorIntrin

    from tvm_ext.intrinsics import makers
    from tvm_ext.intrinsics.fast_import import import_tensor_intrinsics
    from tvm_ext.intrinsics.q4_gemv import register as register_q4_gemv

    missing = [n for n in record_intrinsics(*record_paths) if TensorIntrin.get(n, allow_missing=True) is None]
    ours = makers() if missing else {}
    for n in missing:
        if n in ours:
            ours[n]()
        elif found := _Q4_GEMV.match(n):  # the q4 GEMV's intrinsics are made per shape; the name encodes it
            x, c, rows, k, scale, index, lanes = found.groups()
            register_q4_gemv(int(x), int(c), int(rows), int(k), scale, index, int(lanes))
    if any(TensorIntrin.get(n, allow_missing=True) is None for n in missing):
        import_tensor_intrinsics()


def _load(path_workload: str, path_records: str, allow_missing: bool,
          shown: list | None = None) -> ms.database.JSONDatabase:
    """JSONDatabase of two checked files; DatabaseCorrupt naming the line TVM cannot load
    (``shown``: the paths to name, when these are a snapshot's)."""
    register_record_intrinsics(path_records)
    try:
        return _json_database(path_workload, path_records, allow_missing)
    except Exception as err:  # noqa: BLE001 - TVM's FATAL errors: JSON lines that do not load
        shown = shown or [path_workload, path_records]
        found = _unloadable_line(path_workload, path_records)
        if found is None:
            last = (str(err).strip().splitlines() or [type(err).__name__])[-1]
            raise DatabaseCorrupt(f"{os.path.dirname(shown[0])}: TVM cannot load the database "
                                  f"({last}); {RESTORE}") from None
        file, line = found
        raise _bad_line(shown[file], line, "TVM cannot load this "
                        + ("workload" if file == 0 else "tuning record"),
                        KEEP_WORKLOADS if file == 0 else RESTORE) from None


def _unloadable_line(path_workload: str, path_records: str) -> tuple[int, int] | None:
    """(file index, 1-based line) of the first line TVM fails to load, line by line as
    JSONDatabase does (the lines are valid JSON: ``check_database`` passed)."""
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    workloads = []
    with open(path_workload, "rb") as f:
        for number, line in enumerate(f.read().splitlines(), 1):
            try:
                workloads.append(Workload.from_json(json.loads(line)))
            except Exception:  # noqa: BLE001 - any failure names the line
                return 0, number
    with open(path_records, "rb") as f:
        for number, line in enumerate(f.read().splitlines(), 1):
            index, record = json.loads(line)
            try:
                TuningRecord.from_json(record, workloads[index])
            except Exception:  # noqa: BLE001
                return 1, number
    return None  # every line loads alone


def open_database(work_dir: str, read_only: bool = False) -> ms.database.JSONDatabase:
    """The work dir's JSONDatabase, every line checked first (DatabaseCorrupt names a bad one).

    ``read_only=True`` (report, bench from logs): never writes to the work dir. The checked
    lines are loaded from a private snapshot, so a run appending at the same time or an
    incomplete last record line is no obstacle; committing to it does not reach the work dir.
    Otherwise (tuning): a saved database is unpacked, missing files are created, and an
    incomplete last record line is refused -- ``tune`` repairs it before opening."""
    if not read_only:
        _unpack(work_dir)
    state, contents = _check(work_dir)
    paths = [os.path.join(work_dir, name) for name in DB_FILES]
    if not read_only:
        if state.partial_tail is not None:
            raise _bad_line(paths[1], state.partial_tail, "incomplete last line (a run killed "
                            "while writing it)", "run 'tvm-ext tune' with the same arguments: "
                            "it drops that line and resumes")
        if state.missing_newline:
            repair_database(work_dir, log=lambda _: None)  # adds the newline; appends stay lines
        return _load(paths[0], paths[1], allow_missing=True)
    with tempfile.TemporaryDirectory(prefix="tvm_ext_db_") as snapshot:
        copies = [os.path.join(snapshot, name) for name in DB_FILES]
        for name, copy in zip(DB_FILES, copies):
            with open(copy, "wb") as f:  # exactly the lines checked, complete ones only
                f.write((contents[name] or b"")[:state.valid_bytes[name]])
        return _load(copies[0], copies[1], allow_missing=False, shown=paths)


# what the records' tensor intrinsics (tvm_ext.intrinsics) need of the CPU, by name prefix
_INTRIN_NEEDS = (("tvm_ext.dot_16x4_avx512vnni", "AVX-512 VNNI", lambda t: "avx512vnni" in vnni_kinds(t)),
                 ("tvm_ext.q4_int8_group_avx512vnni", "AVX-512 VNNI", lambda t: "avx512vnni" in vnni_kinds(t)),
                 ("tvm_ext.dot_16x4_avxvnni", "AVX-VNNI", lambda t: "avxvnni" in vnni_kinds(t)),
                 ("tvm_ext.q4_int8_group_avxvnni", "AVX-VNNI", lambda t: "avxvnni" in vnni_kinds(t)),
                 ("tvm_ext.dot_16x4_avx2", "AVX2", has_avx2),
                 ("tvm_ext.q4_int8_group_avx2", "AVX2", has_avx2),
                 ("tvm_ext.amx_", "AMX", has_amx))
_RECORD_MCPU = re.compile(r'"mcpu":\s*"([^"]+)"')


def check_instructions(work_dir: str, target, advice: str = "bench it on a host that has them, "
                                                             "or tune for this one", retarget: bool = False) -> None:
    """One-line DatabaseMismatch when the database's records tensorize with instructions
    ``target`` lacks (a VNNI database benched on an AVX2-only host): compiling them makes
    LLVM abort the whole process ("Do not know how to split the result of this operator!").
    The line names the CPU(s) the records were tuned for and ends with ``advice``. ``retarget``:
    the records' 16x4 u8 x s8 forms pass where ``target`` has one (``transfer.retargeted``)."""
    text = _read_bytes(os.path.join(work_dir, RECORDS)).decode("utf-8", "replace")
    for prefix, name, target_has in _INTRIN_NEEDS:
        if retarget and prefix.startswith("tvm_ext.dot_16x4_") and has_avx2(target):
            continue
        if prefix in text and not target_has(target):
            mcpu = target.attrs.get("mcpu", "no mcpu") if hasattr(target, "attrs") else target
            tuned_for = sorted(set(_RECORD_MCPU.findall(text)))
            raise DatabaseMismatch(
                f"{work_dir}" + (f" (tuned for {', '.join(tuned_for)})" if tuned_for else "")
                + f" holds schedules with {name} instructions ({prefix}...), which this target "
                f"({mcpu}) lacks: {advice}")


def records_of(database, mod: tvm.IRModule) -> list:
    """All tuning records of ``mod`` in ``database`` (measured or failed)."""
    if not database.has_workload(mod):
        return []
    workload = database.commit_workload(mod)
    shash = tvm_ffi.structural_hash(workload.mod)
    return [r for r in database.get_all_tuning_records()
            if r.workload.same_as(workload) or tvm_ffi.structural_hash(r.workload.mod) == shash]


def record_lines(work_dir: str) -> list[tuple[str, bytes]]:
    """(structural hash of its module, the line as written, newline included) of every complete
    record line of the work dir, in file order: records by module read without TVM (``prune``
    keeps lines by it; a cluster job sends a task's records as they are, which
    ``TuningRecord.as_json`` cannot always give back: an IndexMap fails)."""
    # line i of the workload file is workload i (check_database refuses a blank or broken one)
    hashes = [json.loads(line)[0] for line in _read_bytes(os.path.join(work_dir, WORKLOADS)).splitlines()]
    out = []
    for line in _read_bytes(os.path.join(work_dir, RECORDS)).splitlines(keepends=True):
        try:
            index = json.loads(line)[0]
        except ValueError:  # an incomplete last line a kill left: not a record
            continue
        out.append((hashes[index], line))
    return out


def best_record(database, mod: tvm.IRModule):
    if not database.has_workload(mod):
        return None
    top = database.get_top_k(database.commit_workload(mod), 1)
    return top[0] if top else None


def mean_run_seconds(run_secs) -> float | None:
    """Mean of a candidate's run times; None when there are none or the run failed."""
    secs = [float(s) for s in (run_secs or [])]
    if not secs or min(secs) >= 1e9:  # MetaSchedule marks failed runs with 1e10
        return None
    return sum(secs) / len(secs)


def record_seconds(record) -> float | None:
    return mean_run_seconds(record.run_secs)
