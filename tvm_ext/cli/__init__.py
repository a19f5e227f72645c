"""``tvm-ext``: argument parsing and all printing; one module per command."""
from tvm_ext.cli.main import main

__all__ = ["main"]
