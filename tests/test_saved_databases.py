"""Saved databases (gzip-compressed, tvm_ext.tune.packed) and ``tvm-ext save``: read as they
are everywhere, nothing lost, reproducible bytes, unpacked before a run appends, a damaged
file refused in one line; and the tracked tree stays small enough to travel."""
import gzip
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from toy_database import LLVM, commit, toy_mod, toy_work_dir

from tvm_ext.cli.main import main
from tvm_ext.tune import database as D
from tvm_ext.tune import packed
from tvm_ext.tune.driver import Task, load_tasks, report, save_tasks
from tvm_ext.tune.save import save

REPO = Path(__file__).resolve().parents[1]


def files_of(directory) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes() for p in Path(directory).rglob("*") if p.is_file()}


@pytest.fixture
def work_dir(tmp_path):
    """Two tasks with three records, plus one record of a module that is no longer a task."""
    path = str(tmp_path / "toy-llvm-plugin")
    old, k, s = toy_mod(lambda x: x + 1), toy_mod(lambda x: x * 3), toy_mod(lambda x: x - 5)
    toy_work_dir(path, {"k": old, "s": s})
    db = D.open_database(path)
    commit(db, old, 1e-3)
    save_tasks(path, D.read_meta(path), [Task("k", 1, k), Task("s", 1, s)])  # k's TIR changed
    for secs in (4e-3, 2e-3):
        commit(db, k, secs)
    commit(db, s, 5e-3)
    return path


def summary(path) -> dict:
    """What report gives, without the work dir's path-dependent parts."""
    return {key: value for key, value in report(path).items() if key != "tuning_s"}


def test_pack_is_lossless_reproducible_and_read_as_plain(work_dir):
    plain = files_of(work_dir)
    before = summary(work_dir)
    assert packed.pack(work_dir) == 4  # two database files, two task files
    now = files_of(work_dir)
    assert sorted(now) == sorted(name + ".gz" if name != D.META_FILE else name for name in plain)
    for name, data in plain.items():  # every byte kept
        assert packed.read_bytes(os.path.join(work_dir, name)) == data
    assert summary(work_dir) == before  # same records, bests and estimate
    assert D.check_database(work_dir).records == 4
    assert [t.name for t in load_tasks(work_dir, D.read_meta(work_dir))] == ["k", "s"]
    assert not list(Path(work_dir).rglob("*.tmp"))
    assert packed.unpack(work_dir) == 4 and files_of(work_dir) == plain
    packed.pack(work_dir)
    assert files_of(work_dir) == now  # no time or name in the gzip header: the same bytes again


def test_a_run_appends_to_a_saved_database_after_unpacking_it(work_dir):
    packed.pack(work_dir)
    lines = []
    meta = D.prepare_work_dir(work_dir, SimpleNamespace(name="toy", options={}), LLVM, "plugin", log=lines.append)
    assert any("was a saved (compressed) database; unpacked" in line for line in lines)
    assert not packed.is_packed(work_dir)
    db = D.open_database(work_dir)
    commit(db, load_tasks(work_dir, meta)[1].mod, 1e-4)
    assert D.check_database(work_dir).records == 5
    assert summary(work_dir)["tasks"][1]["best_us"] == pytest.approx(100.0)


def test_a_killed_pack_or_unpack_leaves_both_forms_and_the_plain_one_wins(work_dir):
    records = os.path.join(work_dir, D.RECORDS)
    data = Path(records).read_bytes()
    Path(records + ".gz").write_bytes(gzip.compress(data))  # killed after writing .gz, before removing
    assert packed.read_bytes(records) == data and D.check_database(work_dir).records == 4
    packed.unpack(work_dir)
    assert not os.path.exists(records + ".gz") and Path(records).read_bytes() == data
    Path(records + ".gz").write_bytes(gzip.compress(data))
    packed.pack(work_dir)
    assert not os.path.exists(records) and packed.read_bytes(records) == data


def test_damaged_saved_database_is_one_line(work_dir, capsys):
    packed.pack(work_dir)
    gz = Path(work_dir, D.RECORDS + ".gz")
    gz.write_bytes(gz.read_bytes()[:-12])  # cut short, as a broken copy leaves it
    assert main(["report", work_dir]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a complete gzip file" in err and D.RECORDS in err


def test_save_prunes_packs_and_keeps_the_source(work_dir, tmp_path):
    source = files_of(work_dir)
    before = summary(work_dir)
    lines = []
    dest = save(work_dir, root=str(tmp_path / "logs"), log=lines.append)
    assert dest == str(tmp_path / "logs" / "toy-llvm-plugin")
    assert files_of(work_dir) == source  # the work dir is left as it was
    assert packed.is_packed(dest) and not os.path.exists(os.path.join(dest, D.RECORDS))
    assert summary(dest) == before
    assert D.check_database(dest).records == 3  # the old module's record is pruned
    assert lines[0] == f"{dest}: kept 3 records of its 2 tasks, dropped 1"
    assert lines[-1].startswith(f"saved {work_dir} as {dest} (4 files compressed")
    commit(D.open_database(work_dir), toy_mod(lambda x: x - 5), 1e-5)  # tuned further, saved again
    save(work_dir, root=str(tmp_path / "logs"), log=lines.append)
    assert D.check_database(dest).records == 4 and summary(dest)["tasks"][1]["best_us"] == pytest.approx(10.0)
    assert sorted(os.listdir(tmp_path / "logs")) == ["toy-llvm-plugin"]  # replaced, nothing left beside


def test_save_refuses_a_half_written_database_in_one_line(work_dir, tmp_path, capsys):
    with open(os.path.join(work_dir, D.RECORDS), "ab") as f:
        f.write(b'[0,[["partial')
    assert main(["save", work_dir, "--to", str(tmp_path / "logs")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "last line incomplete" in err
    assert not (tmp_path / "logs" / "toy-llvm-plugin").exists()
    assert main(["save", str(tmp_path / "nowhere"), "--to", str(tmp_path / "logs")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_save_packs_a_directory_of_kernel_databases_and_copies_a_bench_json(tmp_path):
    """The Phi-2 bench's layout: phi2-<kind>-<target>-<fusion>/<schedule>/, bare databases."""
    tree = tmp_path / "work" / "phi2-decode-llvm-fused"
    mod = toy_mod(lambda x: x + 2)
    for schedule in ("metaschedule", "seeded"):
        path = str(tree / schedule)
        os.makedirs(path)
        commit(D.open_database(path), mod, 1e-3)
        Path(path, "measure_order.json").write_text("{}\n")
    (tree / "metaschedule-work" / "logs").mkdir(parents=True)  # MetaSchedule's logs stay behind
    bench = tmp_path / "work" / "bench-phi2-decode-llvm.json"
    bench.write_text('{"rows": []}\n')
    logs = tmp_path / "logs"
    assert main(["save", str(tree), str(bench), "--to", str(logs)]) == 0
    saved = files_of(logs)
    assert sorted(saved) == sorted(
        [f"phi2-decode-llvm-fused/{s}/{n}" for s in ("metaschedule", "seeded")
         for n in ("database_workload.json.gz", "database_tuning_record.json.gz", "measure_order.json")]
        + ["bench-phi2-decode-llvm.json"])
    db = D.open_database(str(logs / "phi2-decode-llvm-fused" / "seeded"), read_only=True)
    assert len(db.get_all_tuning_records()) == 1


def _tracked_sizes():
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no tracked files to measure")
    paths = [n for n in names.decode().split("\0") if n]
    return {p: os.path.getsize(REPO / p) for p in paths if (REPO / p).is_file()}


def test_tracked_tree_fits_the_budget():
    """A GPU lease carries at most 64 MiB per call; the tree keeps 48 MiB of it for TVM's runtime,
    built kernels and inputs (docs/journal.md, 'Saved databases')."""
    sizes = _tracked_sizes()
    total = sum(sizes.values())
    largest = ", ".join(f"{p} {n / 2**20:.2f} MiB" for p, n in sorted(sizes.items(), key=lambda x: -x[1])[:5])
    assert total <= 16 * 2**20, f"tracked files {total / 2**20:.1f} MiB > 16 MiB; largest: {largest}"


def test_saved_databases_are_compressed():
    """A database file saved plain (copied by hand instead of 'tvm-ext save') is 10-20x larger."""
    plain = [p for p in _tracked_sizes() if p.startswith("tuning_logs/")
             and any(Path(p).match(pattern) for pattern in ("*/database_*.json", "*/tasks/*.json"))]
    assert not plain, f"save these with 'tvm-ext save' (compressed): {plain[:5]}"


def test_a_run_starts_from_the_saved_database_of_the_closest_cpu(tmp_path):
    """find_saved: the database tuned for exactly this target, else the same vendor's (issue 35:
    a newcomer's first run starts from the closest machine's schedules, measured there first)."""
    import json

    from tvm_ext.targets import resolve_target
    from tvm_ext.tune.save import find_saved

    root = tmp_path / "logs"
    for name, mcpu in (("toy-llvm-plugin", "cascadelake"), ("toy-znver4-llvm-plugin", "znver4"),
                       ("toy-sapphire-llvm-plugin", "sapphirerapids")):
        path = str(root / name)
        toy_work_dir(path, {"k": toy_mod(lambda x: x + 1)})
        commit(D.open_database(path), toy_mod(lambda x: x + 1), 1e-3)
        meta = D.read_meta(path)
        meta["target"] = {"kind": "llvm", "mcpu": mcpu, "num-cores": 2}
        Path(path, D.META_FILE).write_text(json.dumps(meta))
        packed.pack(path)
    znver5 = resolve_target({"kind": "llvm", "mcpu": "znver5", "num-cores": 2})
    assert find_saved("toy", "plugin", {}, znver5, root=str(root)) == (str(root / "toy-znver4-llvm-plugin"), False)
    icelake = resolve_target({"kind": "llvm", "mcpu": "icelake-server", "num-cores": 2})
    assert find_saved("toy", "plugin", {}, icelake, root=str(root))[0].endswith(("toy-llvm-plugin",
                                                                                 "toy-sapphire-llvm-plugin"))
    cascade = resolve_target({"kind": "llvm", "mcpu": "cascadelake", "num-cores": 2})
    assert find_saved("toy", "plugin", {}, cascade, root=str(root)) == (str(root / "toy-llvm-plugin"), True)
    assert find_saved("toy", "upstream", {}, cascade, root=str(root)) == (
        None, "no saved database of this workload and rule set")
    # the same CPU, its records measured on another number of threads (or not said): measured here first
    meta = D.read_meta(str(root / "toy-llvm-plugin"))
    assert meta["threads"] == D.measuring_threads()
    for threads in (meta["threads"] + 1, None):
        Path(root, "toy-llvm-plugin", D.META_FILE).write_text(json.dumps(dict(meta, threads=threads)))
        assert find_saved("toy", "plugin", {}, cascade, root=str(root)) == (str(root / "toy-llvm-plugin"), False)
    # bench --from-logs reads the database tuned for exactly this CPU, whatever its name and thread count
    from tvm_ext.tune.save import saved_for

    assert saved_for("toy", "plugin", {}, znver5, root=str(root)) is None  # no znver5 one: the default name's
    sapphire = resolve_target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2})
    assert saved_for("toy", "plugin", {}, sapphire, root=str(root)) == str(root / "toy-sapphire-llvm-plugin")
    assert saved_for("toy", "plugin", {}, cascade, root=str(root)) == str(root / "toy-llvm-plugin")
    assert saved_for("toy", "upstream", {}, sapphire, root=str(root)) is None
