"""Saved databases: their JSON files gzip-compressed, read as if they were plain.

A database saved into ``tuning_logs/`` (``tvm-ext save``) keeps its large JSON files -- the
workload and records files, one module per task under ``tasks/`` -- as ``NAME.json.gz``
beside a plain ``tvm_ext.json``: MetaSchedule JSON compresses ~18x, which keeps the clone and
every copy of the tree (a GPU lease carries at most 64 MiB) small. Readers ask for the plain
name; ``read_bytes`` finds the file or its ``.gz``. Nothing appends to a ``.gz``: a run that
adds records ``unpack``s the directory first. Packing and unpacking go one file at a time
(written beside, renamed into place, then the other form removed), so a kill leaves every file
whole in one form or both; where both exist they hold the same bytes and the plain one is read.
The gzip header holds no time and no name: saving the same records again gives the same bytes.
"""
from __future__ import annotations

import glob
import gzip
import os

GZ = ".gz"
# what a saved database compresses, relative to its directory
PATTERNS = ("database_*.json", os.path.join("tasks", "*.json"))


def resolve(path: str) -> str | None:
    """``path`` if it exists, else its ``.gz`` if that exists, else None."""
    if os.path.exists(path):
        return path
    return path + GZ if os.path.exists(path + GZ) else None


def exists(path: str) -> bool:
    return resolve(path) is not None


def read_bytes(path: str) -> bytes:
    """The contents of ``path`` or, when only that exists, of ``path.gz`` decompressed.
    FileNotFoundError (naming ``path``) when neither exists; OSError for a damaged ``.gz``."""
    found = resolve(path)
    if found is None:
        raise FileNotFoundError(2, "No such file or directory", path)
    with open(found, "rb") as f:
        data = f.read()
    if found == path:
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError; a cut file is EOFError
        raise OSError(f"{found}: not a complete gzip file ({err})") from None


def _files(directory: str, suffix: str) -> list[str]:
    return sorted(p for pattern in PATTERNS for p in glob.glob(os.path.join(directory, pattern + suffix)))


def is_packed(directory: str) -> bool:
    """True when any of the directory's database or task files is stored compressed."""
    return bool(_files(directory, GZ))


def _write_then_drop(dest: str, data: bytes, drop: str) -> None:
    tmp = dest + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, dest)
    os.remove(drop)


def pack(directory: str) -> int:
    """Compress the directory's database and task files in place; returns how many."""
    plain = _files(directory, "")
    for path in plain:
        with open(path, "rb") as f:
            data = f.read()
        _write_then_drop(path + GZ, gzip.compress(data, compresslevel=9, mtime=0), path)
    return len(plain)


def unpack(directory: str) -> int:
    """Decompress the directory's ``.gz`` database and task files in place (before records are
    appended to them); returns how many. A plain file already there wins (a killed unpack)."""
    packed = _files(directory, GZ)
    for path in packed:
        plain = path[:-len(GZ)]
        if os.path.exists(plain):
            os.remove(path)
        else:
            _write_then_drop(plain, read_bytes(plain), path)
    return len(packed)


__all__ = ["GZ", "exists", "is_packed", "pack", "read_bytes", "resolve", "unpack"]
