"""Subcommands of the ``tvm-ext`` CLI, one module each.

Each module defines ``add_parser(subparsers)``, which adds its subparser and sets
``func`` (called with the parsed args, returns the exit code). Modules are listed
here and imported lazily by the CLI; heavy imports (tvm) happen inside ``func``.
"""
COMMANDS = ("tune", "report", "bench", "verify_gpu", "check_rules", "targets")
