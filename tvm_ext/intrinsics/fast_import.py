"""Import TVM's tensor intrinsics in seconds instead of ~40 s.

``ms.TuneContext`` imports ``tvm.s_tir.tensor_intrin``, which parses ~500 TVMScript
PrimFuncs at import time. Each ``@T.prim_func`` calls ``inspect.stack()``, which resolves
the module of every frame on the stack; for frames without a module file (the
``<frozen importlib._bootstrap>`` frames of the import itself) ``inspect.getmodule``
rescans all of ``sys.modules`` every time: tens of thousands of scans of thousands of
modules, ~40 s of CPU in every process that tunes (every ``tvm-ext tune``).

Here the import runs under ``tvm_ext.intrinsics.quick_parsing``, so the parsed PrimFuncs are the same.
"""
from __future__ import annotations

import sys

from tvm_ext.intrinsics import quick_parsing

_PACKAGE = "tvm.s_tir.tensor_intrin"


def import_tensor_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` (once per process) the fast way."""
    if _PACKAGE in sys.modules:
        return
    with quick_parsing():
        __import__(_PACKAGE)
