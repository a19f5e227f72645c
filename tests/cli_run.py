"""Run ``tvm-ext`` commands in the test's own process (the console script's entry point), shared by the
command-line tests."""
import contextlib
import io

from tvm_ext.cli import main

SMALL = ["--image", "8", "--batch", "1"]


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
