"""Workloads tvm_ext knows how to build, tune and check.

Each workload module exposes ``build(**options) -> Workload``. Modules are imported
lazily so that ``tvm-ext --help`` and unrelated workloads stay fast.
"""
from __future__ import annotations

import importlib

from .base import Workload

# name -> "module:function" (relative to this package)
_REGISTRY = {
    "conv2d-int8": "conv2d_int8:build",
    "resnet50-int8": "resnet50_int8:build",
    "resnet50-int8-nchwc": "resnet50_int8:build_nchwc",
    "resnet50-int8-amx": "qnn_amx:build_resnet50",
    "resnet50-int8-s8": "resnet50_int8:build_s8",
    "phi2-decode": "phi2.kernels:build_decode",
    "phi2-prefill": "phi2.kernels:build_prefill",
}


def names() -> list[str]:
    """Names of all known workloads."""
    return sorted(_REGISTRY)


def get(name: str, **options) -> Workload:
    """Build workload ``name`` with the given options (batch, image size, seed, ...)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(names())}")
    module_name, func_name = _REGISTRY[name].split(":")
    module = importlib.import_module(f"{__name__}.{module_name}")
    return getattr(module, func_name)(**options)


__all__ = ["Workload", "get", "names"]
