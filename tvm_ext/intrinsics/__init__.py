"""Tensor intrinsics: ours (``vnni``, ``amx``, ``q4_gemv``) and a fast import of TVM's (``fast_import``)."""
from __future__ import annotations

from typing import Callable


def register_once(name: str, make: Callable[[], tuple]) -> str:
    """Register the TensorIntrin ``name`` from ``make()`` -> (desc, impl) unless it exists;
    returns ``name``. Safe when another thread registers the same name meanwhile."""
    from tvm.s_tir import TensorIntrin  # pylint: disable=import-outside-toplevel

    try:
        TensorIntrin.get(name)
        return name
    except Exception:  # pylint: disable=broad-except
        pass
    try:
        TensorIntrin.register(name, *make())
    except Exception:  # pylint: disable=broad-except
        TensorIntrin.get(name)  # registered meanwhile under the same name
    return name
