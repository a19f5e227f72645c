"""Tensor intrinsics: ours (``vnni``, ``amx``, ``q4_vnni``, ``q4_amx``, ``q4_gemv``) and a fast import
of TVM's (``fast_import``).

Each of ours is parsed from TVMScript when first registered. ``@T.prim_func`` calls
``inspect.stack()``, which resolves the module of every frame on the stack; for frames without a
module file (``<frozen importlib._bootstrap>``, ``<string>``) ``inspect.getmodule`` rescans all of
``sys.modules`` each time, which made registering the q4 tiles ~7 s of every process that opened a
database (more under pytest's deep stacks). ``quick_parsing`` memoizes that lookup per file name;
``register_once`` parses under it.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Callable


@contextlib.contextmanager
def quick_parsing():
    """``inspect.getmodule`` memoized per file name for frames and code objects, whose module
    depends only on the file name. TVMScript's parser uses that module only to find source lines
    (``linecache``), which for files on disk does not need it, so what is parsed is the same."""
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


def register_once(name: str, make: Callable[[], tuple]) -> str:
    """Register the TensorIntrin ``name`` from ``make()`` -> (desc, impl) unless it exists;
    returns ``name``. Safe when another thread registers the same name meanwhile."""
    from tvm.s_tir import TensorIntrin  # pylint: disable=import-outside-toplevel

    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    with quick_parsing():
        desc, impl = make()
    try:
        TensorIntrin.register(name, desc, impl)
    except Exception:  # pylint: disable=broad-except
        TensorIntrin.get(name)  # registered meanwhile under the same name
    return name


def makers() -> dict[str, Callable[[], object]]:
    """Name -> the call that registers it, for every intrinsic of ours with a fixed set of shapes
    (VNNI, AMX, the q4 x int8 tiles; names only, nothing is parsed). The q4 GEMV's are made per
    shape, from what their names encode (``tune.database.register_record_intrinsics``)."""
    # pylint: disable=import-outside-toplevel
    from tvm_ext.intrinsics import amx, q4_amx, q4_vnni, vnni

    return {**vnni.makers(), **amx.makers(), **q4_vnni.makers(), **q4_amx.makers()}
