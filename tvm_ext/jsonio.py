"""JSON result files written atomically: a kill mid-write never leaves half a file
(the tuning metadata, and the documents verify-gpu and check-rules rewrite as they go)."""
from __future__ import annotations

import json
import os


def write_json(path: str, doc, **dump_options) -> None:
    """Write ``doc`` to ``path`` (indent 1, trailing newline) through ``path + ".tmp"``."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, **dump_options)
        f.write("\n")
    os.replace(tmp, path)
