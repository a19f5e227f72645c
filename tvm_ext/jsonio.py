"""JSON result files written atomically: a kill mid-write never leaves half a file.

Every JSON file tvm_ext writes goes through ``write_json``: the tuning metadata, the
bench results, the documents verify-gpu and check-rules rewrite as they go, the fusion
evidence and the nvcc outcome cache (written by several threads at once)."""
from __future__ import annotations

import json
import os
import threading


def write_json(path: str, doc, *, indent=1, **dump_options) -> None:
    """Write ``doc`` to ``path`` (trailing newline) through a temporary file beside it,
    named per process and thread so that concurrent writers never share one; creates
    the parent folder."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=indent, **dump_options)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def read_json(path: str, default=None):
    """The JSON document at ``path``, or ``default`` where there is no such file."""
    if not os.path.isfile(path):
        return default
    with open(path, encoding="utf-8") as f:
        return json.load(f)
