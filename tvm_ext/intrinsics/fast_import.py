"""Import TVM's tensor intrinsics in seconds instead of ~40 s, and the GPU ones only where needed.

``ms.TuneContext`` imports ``tvm.s_tir.tensor_intrin``, which parses ~500 TVMScript
PrimFuncs at import time. Each ``@T.prim_func`` calls ``inspect.stack()``, which resolves
the module of every frame on the stack; for frames without a module file (the
``<frozen importlib._bootstrap>`` frames of the import itself) ``inspect.getmodule``
rescans all of ``sys.modules`` every time: tens of thousands of scans of thousands of
modules, ~40 s of CPU in every process that tunes (every ``tvm-ext tune``).

Here the import runs under ``tvm_ext.intrinsics.quick_parsing``, so the parsed PrimFuncs are the same.
Even so the package costs ~6.6 s on a 2-core Zen 3, ~5.5 s of it the GPU families (CUDA, ROCm,
Metal) that a CPU tuning run never names. ``gpu=False`` enters the package without running its
``__init__`` (which imports every family) and imports the CPU families only; ``TuneContext``'s own
import then finds the package in place. A later ``gpu=True`` call runs the ``__init__`` in that same
module, so the rest is imported then.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys

from tvm_ext.intrinsics import quick_parsing

_PACKAGE = "tvm.s_tir.tensor_intrin"
# what the package's __init__ imports for LLVM, less its GPU family (rocm)
CPU_FAMILIES = ("x86", "arm_cpu", "riscv_cpu", "hexagon")
_PARTIAL = "_tvm_ext_cpu_only"  # set on the package entered without its __init__


def import_tensor_intrinsics(gpu: bool = True) -> None:
    """Import ``tvm.s_tir.tensor_intrin`` (once per process) the fast way; with ``gpu=False`` only its
    CPU families (module doc)."""
    package = sys.modules.get(_PACKAGE)
    if package is not None and not getattr(package, _PARTIAL, False):
        return  # imported whole already
    with quick_parsing():
        if gpu:
            if package is None:
                importlib.import_module(_PACKAGE)
            else:
                package.__spec__.loader.exec_module(package)  # the __init__ the CPU-only import skipped
                delattr(package, _PARTIAL)
            return
        if package is None:
            package = importlib.util.module_from_spec(importlib.util.find_spec(_PACKAGE))  # __path__ only
            setattr(package, _PARTIAL, True)
            sys.modules[_PACKAGE] = package
            setattr(importlib.import_module("tvm.s_tir"), "tensor_intrin", package)
        for family in CPU_FAMILIES:
            importlib.import_module(f"{_PACKAGE}.{family}")
