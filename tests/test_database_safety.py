"""tvm_ext never damages a tuning database.

Each case corrupts a copy of a committed database (tuning_logs/resnet50-int8-llvm-upstream)
the way a bad disk, a bad edit or a killed run would, runs the command, and compares every
byte of the work dir before and after. Read commands never write; ``tune`` repairs only
what a killed run leaves (an incomplete last record line, a missing final newline); any
other damage is one line naming file and line, and nothing is touched.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import tvm

from tvm_ext.cli.main import main
from tvm_ext.tune import database as db
from tvm_ext.tune import packed
from tvm_ext.tune.driver import report

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "tuning_logs" / "resnet50-int8-llvm-upstream"
W, R = db.WORKLOADS, db.RECORDS


def committed_databases():
    """Every database under tuning_logs/, saved (compressed) or plain."""
    found = [*(REPO / "tuning_logs").rglob(W + packed.GZ), *(REPO / "tuning_logs").rglob(W)]
    return sorted({str(p.parent.relative_to(REPO)) for p in found})


def snapshot(work_dir) -> dict:
    """Every file's bytes, and the directory's own mtime (a tmp file made and renamed
    inside it changes that even when the contents end up equal)."""
    files = {str(p.relative_to(work_dir)): p.read_bytes()
             for p in Path(work_dir).rglob("*") if p.is_file()}
    return {"files": files, "mtime": os.stat(work_dir).st_mtime_ns}


def lines_of(path) -> list:
    """The lines of a database file, plain or saved (gzip-compressed)."""
    return packed.read_bytes(str(path)).splitlines(keepends=True)


def write_lines(path, lines) -> None:
    Path(path).write_bytes(b"".join(lines))


def replace_in_line(path, number: int, old: bytes, new: bytes) -> None:
    lines = lines_of(path)
    assert old in lines[number - 1]
    lines[number - 1] = lines[number - 1].replace(old, new, 1)
    write_lines(path, lines)


@pytest.fixture
def full(tmp_path):
    """A copy of the committed database, 31 workloads and 992 records, unpacked (as a run
    that appends to it leaves it)."""
    copy = shutil.copytree(COMMITTED, tmp_path / "full")
    packed.unpack(str(copy))
    return copy


@pytest.fixture
def small(tmp_path):
    """The committed database cut to its first 3 workloads and 40 records (those of
    workloads 0 and 1): the cases that load it in TVM stay fast."""
    work_dir = tmp_path / "small"
    work_dir.mkdir()
    shutil.copy(COMMITTED / db.META_FILE, work_dir)
    shutil.copytree(COMMITTED / "tasks", work_dir / "tasks")
    packed.unpack(str(work_dir))
    write_lines(work_dir / W, lines_of(COMMITTED / W)[:3])
    write_lines(work_dir / R, lines_of(COMMITTED / R)[:40])
    assert {json.loads(line)[0] for line in lines_of(work_dir / R)} == {0, 1}
    return work_dir


def report_cli(work_dir, capsys):
    code = main(["report", str(work_dir), "--json"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


@pytest.mark.parametrize("work_dir", committed_databases())
def test_committed_databases_pass_the_check(work_dir):
    state = db.check_database(str(REPO / work_dir))
    assert state.partial_tail is None and not state.missing_newline
    assert state.workloads > 0 and state.records > 0


def test_bad_byte_in_a_middle_workload_line(full, capsys):
    """The issue's case: report crashed in TVM and its 'repair' deleted the line for good,
    shifting every later workload index."""
    lines = lines_of(full / W)
    lines[14] = lines[14][:100] + b"\xff" + lines[14][101:]
    write_lines(full / W, lines)
    before = snapshot(full)
    code, out, err = report_cli(full, capsys)
    assert code == 2 and out == "" and len(err) == 1
    assert f"{full / W}:15: not a workload (corrupt line)" in err[0]
    assert "never delete a workload line" in err[0]
    assert snapshot(full) == before


def test_corrupt_middle_record_line(full, capsys):
    replace_in_line(full / R, 500, b'"GetSBlock"', b'"GetSBlock')
    before = snapshot(full)
    code, _, err = report_cli(full, capsys)
    assert code == 2 and len(err) == 1
    assert f"{full / R}:500: not a tuning record (corrupt line)" in err[0]
    assert snapshot(full) == before


def test_tune_refuses_a_corrupt_line_and_writes_nothing(full):
    """prepare_work_dir is tune's way in: the same corrupt line stops it before any write."""
    replace_in_line(full / R, 500, b'"GetSBlock"', b'"GetSBlock')
    before = snapshot(full)
    with pytest.raises(db.DatabaseCorrupt, match=r"database_tuning_record.json:500: "):
        prepare_like_tune(full)
    assert snapshot(full) == before


def test_incomplete_last_workload_line_that_records_refer_to(full, capsys):
    data = (full / W).read_bytes()
    (full / W).write_bytes(data[:-5000])  # cut inside line 31, which records refer to
    before = snapshot(full)
    code, _, err = report_cli(full, capsys)
    assert code == 2 and len(err) == 1
    first = next(i for i, line in enumerate(lines_of(full / R), 1) if json.loads(line)[0] == 30)
    assert (f"{full / R}:{first}: refers to workload 30 (line 31 of {W}, an incomplete last "
            f"line)") in err[0]
    assert snapshot(full) == before


def test_incomplete_last_workload_line_no_record_refers_to(small):
    data = (small / W).read_bytes()
    (small / W).write_bytes(data[:-3000])  # line 3: no record of the cut database uses it
    before = snapshot(small)
    with pytest.raises(db.DatabaseCorrupt) as err:
        report(str(small))
    assert f"{small / W}:3: incomplete last line" in str(err.value)
    assert "delete that last line by hand" in str(err.value)
    with pytest.raises(db.DatabaseCorrupt):
        prepare_like_tune(small)  # tune does not delete workload lines either
    assert snapshot(small) == before


def test_record_of_a_deleted_workload(full, capsys):
    """What the old repair left: a workload line gone, every later index shifted."""
    lines = lines_of(full / W)
    write_lines(full / W, lines[:14] + lines[15:])
    before = snapshot(full)
    code, _, err = report_cli(full, capsys)
    assert code == 2 and len(err) == 1
    assert f"refers to workload 30 (but {W} has 30 line(s))" in err[0]
    assert snapshot(full) == before


def test_json_lines_that_tvm_cannot_load_are_named(small, capsys):
    """Valid JSON, wrong content: TVM's own load fails; the message still names the line."""
    replace_in_line(small / R, 7, b'"GetSBlock"', b'"GetSBlocj"')  # no such instruction
    before = snapshot(small)
    code, _, err = report_cli(small, capsys)
    assert code == 2 and len(err) == 1
    assert f"{small / R}:7: TVM cannot load this tuning record" in err[0]
    assert snapshot(small) == before
    write_lines(small / R, lines_of(COMMITTED / R)[:40])  # good records again; break workload 2
    lines = lines_of(small / W)
    payload = json.loads(lines[1])[1]
    broken = payload[:40] + ("A" if payload[40] != "A" else "B") + payload[41:]
    lines[1] = (json.dumps([json.loads(lines[1])[0], broken]) + "\n").encode()
    write_lines(small / W, lines)
    before = snapshot(small)
    code, _, err = report_cli(small, capsys)
    assert code == 2 and len(err) == 1
    assert f"{small / W}:2: TVM cannot load this workload" in err[0]
    assert snapshot(small) == before


PARTIAL = b'[0,[[[["GetSBlock",[],["conv2d_nhwc","main"],["b0"]],["GetSBl'


def test_incomplete_last_record_line_report_reads_without_writing(small):
    """A killed (or still running) tune leaves this; report shows the complete records."""
    with open(small / R, "ab") as f:
        f.write(PARTIAL)
    before = snapshot(small)
    result = report(str(small))
    assert sum(t["trials"] for t in result["tasks"]) == 40
    assert snapshot(small) == before


def test_incomplete_last_record_line_is_repaired_by_tune_only(full):
    committed = (full / R).read_bytes()
    with open(full / R, "ab") as f:
        f.write(PARTIAL)
    before = snapshot(full)
    with pytest.raises(db.DatabaseCorrupt, match=r":993: incomplete last line.*tvm-ext tune"):
        db.open_database(str(full))  # a writable open appends: it must not glue lines
    assert snapshot(full) == before
    notes = []
    prepare_like_tune(full, log=notes.append)
    assert (full / R).read_bytes() == committed  # exactly the partial line is gone
    assert (full / W).read_bytes() == before["files"][W]
    assert len(notes) == 1 and "dropped the incomplete last line 993" in notes[0]


def test_missing_final_newline_is_added_by_tune_and_ignored_by_report(small):
    """A kill between a record and its newline: the record is complete and kept; the next
    append must not glue a second record onto its line."""
    complete = (small / R).read_bytes()
    (small / R).write_bytes(complete[:-1])
    before = snapshot(small)
    assert sum(t["trials"] for t in report(str(small))["tasks"]) == 40
    assert snapshot(small) == before
    prepare_like_tune(small)
    assert (small / R).read_bytes() == complete


def test_empty_line_in_the_middle_is_corrupt(small):
    lines = lines_of(small / R)
    write_lines(small / R, lines[:10] + [b"\n"] + lines[10:])
    with pytest.raises(db.DatabaseCorrupt, match=r"database_tuning_record.json:11: "):
        db.check_database(str(small))


def test_missing_directory_is_named(tmp_path, capsys):
    code, _, err = report_cli(tmp_path / "nope", capsys)
    assert code == 2 and len(err) == 1 and f"{tmp_path / 'nope'}: no such directory" in err[0]


def test_write_meta_is_byte_stable(full):
    """The committed tvm_ext.json has no final newline: rewriting equal content would dirty
    the clone."""
    before = snapshot(full)
    db.write_meta(str(full), db.read_meta(str(full)))
    assert snapshot(full) == before
    meta = db.read_meta(str(full))
    meta["tasks"][0]["tuning_s"] += 1.0
    db.write_meta(str(full), meta)
    assert db.read_meta(str(full)) == meta


def test_killed_creation_leaves_no_half_made_work_dir(tmp_path):
    """A work dir appears with its tvm_ext.json or not at all; a staging dir a kill left
    behind is cleared by the next run."""
    work_dir = tmp_path / "new"
    stale = tmp_path / "new.new"
    (stale / "tasks").mkdir(parents=True)
    (stale / "tvm_ext.json.tmp").write_text('{"workl')
    prepare_like_tune(work_dir, meta=json.loads((COMMITTED / db.META_FILE).read_text()))
    assert not stale.exists()
    assert sorted(os.listdir(work_dir)) == ["tasks", "tvm_ext.json"]
    assert db.read_meta(str(work_dir))["workload"] == "resnet50-int8"


def test_permission_errors_are_one_line(full, monkeypatch):
    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path) + ".tmp")

    monkeypatch.setattr(db, "write_json", refuse)
    meta = db.read_meta(str(full))
    meta["note"] = "changed"
    with pytest.raises(db.WorkDirError) as err:
        db.write_meta(str(full), meta)
    assert str(err.value) == f"cannot write {full / db.META_FILE}: Permission denied"
    with pytest.raises(db.WorkDirError, match="cannot create the work dir .*: Permission denied"):
        prepare_like_tune(full.parent / "fresh", meta=meta)


# -- a really read-only database --------------------------------------------------------------

def as_unprivileged(code: str, *args) -> subprocess.CompletedProcess:
    """Run Python ``code`` without the right to ignore file permissions: as root, with
    CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH dropped (the interpreter lives under /root)."""
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot drop the permission override")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    return subprocess.run([*prefix, sys.executable, "-c", code, *map(str, args)],
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def read_only_root(tmp_path):
    """A directory made read-only by ``make_read_only``; writable again for the cleanup."""
    root = tmp_path / "ro"
    root.mkdir()
    yield root
    for path in [root, *root.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)


def make_read_only(root: Path) -> None:
    for path in [*root.rglob("*"), root]:
        path.chmod(0o555 if path.is_dir() else 0o444)


# One unprivileged interpreter (a fresh TVM import costs seconds) runs the three calls in turn and
# prints, a line each, the call's result or the error it raised.
UNPRIVILEGED_CALLS = """\
import json, sys
from types import SimpleNamespace
from tvm_ext.tune import database as db, driver

work_dir, new_dir, meta = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
workload = SimpleNamespace(name=meta["workload"], options=meta["options"])
calls = [lambda: sum(t["trials"] for t in driver.report(work_dir)["tasks"]),
         lambda: db.prepare_work_dir(work_dir, workload, meta["target"], meta["ruleset"], log=lambda _: None),
         lambda: db.prepare_work_dir(new_dir, workload, meta["target"], meta["ruleset"], log=lambda _: None)]
for call in calls:
    try:
        print(call())
    except (ValueError, OSError) as err:
        print(type(err).__name__, err)
"""


def test_read_only_database(small, read_only_root):
    work_dir = read_only_root / "db"
    shutil.copytree(small, work_dir)
    with open(work_dir / R, "ab") as f:
        f.write(PARTIAL)  # and a partial line: report used to repair it in place
    meta = (work_dir / db.META_FILE).read_text()
    make_read_only(read_only_root)
    before = snapshot(work_dir)
    got = as_unprivileged(UNPRIVILEGED_CALLS, work_dir, read_only_root / "new", meta)
    assert got.stdout.splitlines() == [
        "40",  # report reads the database as it is
        f"WorkDirError {work_dir} is not writable: tune adds records to the database there "
        f"(tune into a copy with --work-dir, or fix the permissions)",
        f"WorkDirError cannot create the work dir {read_only_root / 'new'}: Permission denied",
    ], got.stderr[-2000:]
    assert snapshot(work_dir) == before


def prepare_like_tune(work_dir, log=lambda _: None, meta=None):
    """What ``tune`` does to a work dir before tuning (the same workload, target, rule set)."""
    meta = meta or db.read_meta(str(work_dir))
    workload = SimpleNamespace(name=meta["workload"], options=meta["options"])
    return db.prepare_work_dir(str(work_dir), workload, tvm.target.Target(meta["target"]),
                               meta["ruleset"], log=log)


# --------------------------------------------------------------------------- instructions
LOGS = REPO / "tuning_logs"


@pytest.mark.parametrize("work_dir, lacking, having, needs", [
    ("resnet50-int8-nchwc-llvm-plugin", "haswell", "cascadelake", "AVX-512 VNNI"),
    ("resnet50-int8-amx-emeraldrapids16-llvm-plugin", "cascadelake", "sapphirerapids", "AMX"),
    ("onnx-resnet50-qdq-01b1b2e64a61-nchwc-llvm-plugin", "x86-64", "haswell", "AVX2"),
])
def test_database_needing_instructions_the_target_lacks_is_one_line(work_dir, lacking, having, needs):
    """A tensorized database benched on a host without its instructions: one line naming them,
    not LLVM aborting the process mid-compile (seen with the VNNI database on the AVX2 EPYC)."""
    from tvm_ext.targets import resolve_target

    path = str(LOGS / work_dir)
    with pytest.raises(db.DatabaseMismatch, match=f"{needs} instructions .* lacks"):
        db.check_instructions(path, resolve_target({"kind": "llvm", "mcpu": lacking}))
    db.check_instructions(path, resolve_target({"kind": "llvm", "mcpu": having}))


def test_a_vnni_database_transfers_to_an_avx2_cpu_but_amx_does_not():
    """The main job on an AVX2-only CPU may start from a VNNI host's database (its u8 x s8 form is
    swapped for this CPU's, ``transfer.retargeted``); AMX tiles and a CPU without AVX2 cannot."""
    from tvm_ext.targets import resolve_target

    vnni, amx = str(LOGS / "resnet50-int8-nchwc-znver5-llvm-plugin"), str(LOGS / "resnet50-int8-amx-llvm-plugin")
    db.check_instructions(vnni, resolve_target({"kind": "llvm", "mcpu": "znver3"}), retarget=True)
    with pytest.raises(db.DatabaseMismatch, match="AVX-512 VNNI instructions"):
        db.check_instructions(vnni, resolve_target({"kind": "llvm", "mcpu": "x86-64"}), retarget=True)
    with pytest.raises(db.DatabaseMismatch, match="AMX instructions"):
        db.check_instructions(amx, resolve_target({"kind": "llvm", "mcpu": "znver3"}), retarget=True)


def test_untensorized_database_runs_anywhere():
    from tvm_ext.targets import resolve_target

    db.check_instructions(str(COMMITTED), resolve_target({"kind": "llvm", "mcpu": "x86-64"}))
