"""The linter runs with the tests (and so in CI): ``ruff check .`` with the project's ruff.toml
(pycodestyle errors and warnings, pyflakes; 120 columns) finds nothing."""
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff")
    command = [ruff] if ruff else [sys.executable, "-m", "ruff"]
    proc = subprocess.run([*command, "check", "--output-format", "concise", "."], cwd=REPO,
                          capture_output=True, text=True)
    assert "No module named ruff" not in proc.stderr, "ruff is missing: pip install -e '.[test]'"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-1000:]
