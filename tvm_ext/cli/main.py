"""``tvm-ext``: tune, report, benchmark and verify quantized models with tvm_ext's rules.

One clear line and a non-zero exit for bad input; progress on stderr for long work.
"""
from __future__ import annotations

import argparse
import importlib
import sys



# one module of this package per command, each with add_parser(sub) and run(args)
COMMANDS = ("tune", "report", "bench", "verify_gpu", "check_rules", "targets")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tvm-ext",
        description="MetaSchedule tuning of quantized models (int8 ResNet-50, Phi-2 q4f16_1) "
                    "with tvm_ext's schedule rules and postprocessors.",
        epilog="Run 'tvm-ext COMMAND --help' for the options of each command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"tvm_ext.cli.{name}").add_parser(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as err:
        print(f"tvm-ext {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tvm-ext {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
