"""``tvm-ext``: tune, report, benchmark and verify quantized models with tvm_ext's rules.

One clear line and a non-zero exit for bad input, no traceback unless ``--debug``:
exit 2 for what the user asked wrongly (ValueError: unknown names, bad values, a work dir
of another workload), exit 1 for what the environment refused (OSError: permissions,
missing files) or what failed inside TVM. Progress goes to stderr, results to stdout.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# one module of this package per command, each with add_parser(sub) and run(args)
COMMANDS = ("tune", "report", "prune", "save", "cluster", "bench", "bench_search", "bench_cluster", "verify_gpu",
            "check_rules", "targets", "generate", "import_onnx", "bundle")


class OneLineParser(argparse.ArgumentParser):
    """argparse without the usage block on errors: one line, exit 2 (``--help`` shows usage)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="tvm-ext",
        description="MetaSchedule tuning of quantized models (int8 ResNet-50, Phi-2 q4f16_1) "
                    "with tvm_ext's schedule rules and postprocessors.",
        epilog="Run 'tvm-ext COMMAND --help' for the options of each command.",
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error instead of one line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"tvm_ext.cli.{name}").add_parser(sub)
    return parser


def use_physical_cores() -> None:
    """TVM's thread pool (and the tuning runner's, which inherits the environment) takes
    ``TVM_NUM_THREADS``, else half the logical CPUs on x86 (it assumes two hyper-threads per
    core): 1 thread on a 2-vCPU VM whose vCPUs are cores, where the peers run on 2.  Every
    command uses the physical cores unless the user set ``TVM_NUM_THREADS``."""
    import os

    from tvm_ext.targets import physical_cores

    os.environ.setdefault("TVM_NUM_THREADS", str(physical_cores()))


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    use_physical_cores()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"tvm-ext {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `tvm-ext report DIR | head`: the reader left, not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as err:  # noqa: BLE001 -- every error becomes one line (or --debug)
        if args.debug:
            raise
        code = 2 if isinstance(err, ValueError) else 1
        print(f"tvm-ext {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return code


def _one_line(err: BaseException) -> str:
    """The message of ``err`` on one line: TVM's errors carry a traceback of their own,
    whose last line is the message."""
    if isinstance(err, OSError) and err.filename and err.strerror:
        return f"{err.filename}: {err.strerror}"
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else type(err).__name__
    if not isinstance(err, (ValueError, OSError)):
        text = f"{text} ({type(err).__name__}; --debug shows the traceback)"
    return text


if __name__ == "__main__":
    sys.exit(main())
