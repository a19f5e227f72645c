"""Import TVM's tensor intrinsics in seconds instead of ~40 s.

``ms.TuneContext`` imports ``tvm.s_tir.tensor_intrin``, which parses ~500 TVMScript
PrimFuncs at import time. Each ``@T.prim_func`` calls ``inspect.stack()``, which resolves
the module of every frame on the stack; for frames without a module file (the
``<frozen importlib._bootstrap>`` frames of the import itself) ``inspect.getmodule``
rescans all of ``sys.modules`` every time: tens of thousands of scans of thousands of
modules, ~40 s of CPU in every process that tunes (every ``tvm-ext tune``).

Here the import runs with ``inspect.getmodule`` memoized per file name for frames and code
objects, whose module depends only on the file name. The only use of that module on this
path is to find source lines (``linecache``), which for files on disk does not need it,
so the parsed PrimFuncs are the same.
"""
from __future__ import annotations

import contextlib
import inspect
import sys

_PACKAGE = "tvm.s_tir.tensor_intrin"


@contextlib.contextmanager
def _getmodule_memoized_by_file():
    original = inspect.getmodule
    memo: dict = {}

    def getmodule(obj, _filename=None):
        if _filename is None or not (inspect.isframe(obj) or inspect.iscode(obj)):
            return original(obj, _filename)
        if _filename not in memo:
            memo[_filename] = original(obj, _filename)
        return memo[_filename]

    inspect.getmodule = getmodule
    try:
        yield
    finally:
        inspect.getmodule = original


def import_tensor_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` (once per process) the fast way."""
    if _PACKAGE in sys.modules:
        return
    with _getmodule_memoized_by_file():
        __import__(_PACKAGE)
