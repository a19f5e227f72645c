"""tools/lent-machine/rehearse.py: each call runs in a copy of exactly what the device tool would
carry (tracked files, untracked files git does not ignore, the carried paths), its size is
checked against the 64 MiB limit, and the machine's /tmp is shared between calls."""
import importlib.util
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def rehearse():
    spec = importlib.util.spec_from_file_location("rehearse", REPO / "tools" / "lent-machine" / "rehearse.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def repo(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    (root / "ignored").mkdir(parents=True)
    (root / ".gitignore").write_text("/ignored/\n/big/\n")
    (root / "tracked.txt").write_text("t")
    (root / "ignored" / "part").write_text("p")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "."], cwd=root, check=True)
    (root / "untracked.txt").write_text("u")
    monkeypatch.chdir(root)
    return root


def test_each_call_gets_what_would_travel_and_a_shared_tmp(rehearse, repo, capsys):
    listing = "find . -type f ! -path './.git/*' | sort > $OUT/files; cat $LENT_ROOT/stage 2>/dev/null >> $OUT/files"
    code = rehearse.main(["--call", "", listing + "; echo staged > $LENT_ROOT/stage",
                          "--call", "ignored", listing + "; cp $OUT/files " + str(repo / "second")])
    out = capsys.readouterr().out
    assert code == 0
    assert "call 1: carry []: 3 files" in out and "call 2: carry [ignored]: 4 files" in out and "(fits)" in out
    assert (repo / "second").read_text().split() == [
        "./.gitignore", "./ignored/part", "./tracked.txt", "./untracked.txt", "staged"]


def test_a_call_over_the_limit_is_refused_and_not_run(rehearse, repo, capsys, monkeypatch):
    monkeypatch.setattr(rehearse, "LIMIT", 2)
    assert rehearse.main(["--call", "", f"touch {repo / 'ran'}"]) == 1
    assert "OVER the 64 MiB limit" in capsys.readouterr().out and not (repo / "ran").exists()


def test_a_failing_command_fails_the_rehearsal(rehearse, repo):
    assert rehearse.main(["--call", "", "exit 3"]) == 1


def test_a_missing_carried_path_is_one_line(rehearse, repo):
    with pytest.raises(SystemExit, match="carried path .lent does not exist here"):
        rehearse.main(["--call", ".lent", "true"])
