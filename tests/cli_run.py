"""Run ``tvm-ext`` commands in the test's own process (the console script's entry point), shared by the
command-line tests."""
import contextlib
import io

from made_once import made_once
from tvm_ext.cli import main

SMALL = ["--image", "8", "--batch", "1"]
TUNED = "conv2d-int8-llvm-plugin"  # the work dir's name, as bench --logs-dir looks it up


def cli(*args, check=True):
    """Run ``tvm-ext ARGS`` in this process: (exit code, stdout, stderr).

    argparse's own errors leave through SystemExit, the commands' through a return code."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code
    if check and code != 0:
        raise AssertionError(f"tvm-ext {' '.join(args)} -> {code}\n{err.getvalue()[-3000:]}")
    return code, out.getvalue(), err.getvalue()


def one_error_line(args, message):
    code, _, err = cli(*args, check=False)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], (code, err)


def tuned_conv2d(tmp_path_factory):
    """conv2d-int8 (``SMALL``) tuned for 2 trials by ``tvm-ext tune --json``, once per session for every
    module and xdist worker (``made_once``): the directory holding the work dir ``TUNED``, the command's
    stdout (``out.json``) and its stderr (``err.txt``). Copy the work dir before writing to it."""
    def tune(path):
        _, out, err = cli("tune", "conv2d-int8", *SMALL, "--trials", "2", "--work-dir", str(path / TUNED), "--json")
        (path / "out.json").write_text(out)
        (path / "err.txt").write_text(err)

    return made_once(tmp_path_factory, "conv2d-int8-2-trials", tune)
