"""TVM's runtime alone, for a device machine that has Python and NumPy but no package index.

What the runner needs of the ``apache-tvm`` wheel: the ``tvm`` Python package with ``libtvm_runtime.so``
and the CUDA sidecar ``libtvm_runtime_cuda.so`` (plus ``libtvm_runtime_extra.so``), and ``tvm_ffi``;
not ``libtvm_compiler.so`` (259 MB), nor the headers, sources and third-party trees (``tvm/include``,
``tvm/src``, ``tvm/3rdparty``); tvm-ffi needs ``typing_extensions``, which travels too (a Python 3.12
with only NumPy failed without it in the rehearsal).  With ``TVM_USE_RUNTIME_LIB=1`` (the runner sets it) ``import tvm``
loads only the runtime library.  ``RUNTIME_DROP`` says what is left out.

``runtime_site(dest)``: that subset of the TVM installed here (this Python's; the rehearsal).
``runtime_from_wheels(wheels, dest)``: the same subset from downloaded wheels (the device machine's
Python: ``download_wheels``), so TVM's runtime travels with the bundle in one call of the device tool.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

TVM, TVM_FFI = "apache-tvm==0.27.0.post1", "apache-tvm-ffi==0.1.14.post1"
RUNTIME_DROP = ("tvm/lib/libtvm_compiler.so", "tvm/include/", "tvm/src/", "tvm/3rdparty/",
                "tvm_ffi/include/", "tvm_ffi/src/", "tvm_ffi/3rdparty/", "tvm_ffi/cython/", "/__pycache__/")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def _kept(name: str) -> bool:
    if not name.startswith(("tvm/", "tvm_ffi/")):
        return False
    return not any(d in name or name.startswith(d) for d in RUNTIME_DROP)


def _typing_extensions(dest: str) -> None:
    """tvm-ffi imports ``typing_extensions`` (one pure-Python file), which a bare Python lacks: it travels."""
    import typing_extensions

    os.makedirs(dest, exist_ok=True)
    shutil.copy2(typing_extensions.__file__, os.path.join(dest, "typing_extensions.py"))


def runtime_site(dest: str) -> str:
    """Copy the installed ``tvm`` and ``tvm_ffi`` packages, runtime only, into ``dest``; returns ``dest``."""
    import tvm
    import tvm_ffi

    _typing_extensions(dest)
    for package in (tvm, tvm_ffi):
        src = os.path.dirname(package.__file__)
        base = os.path.dirname(src)
        for folder, dirs, files in os.walk(src):
            rel_dir = os.path.relpath(folder, base)
            dirs[:] = [d for d in dirs if _kept(f"{rel_dir}/{d}/".replace(os.sep, "/"))]
            for f in files:
                rel = f"{rel_dir}/{f}".replace(os.sep, "/")
                if _kept(rel):
                    os.makedirs(os.path.join(dest, rel_dir), exist_ok=True)
                    shutil.copy2(os.path.join(folder, f), os.path.join(dest, rel))
    return dest


def download_wheels(dest: str, python: str = "3.12") -> list:
    """pip download TVM's and tvm-ffi's wheels for ``python`` (the device machine's) into ``dest``."""
    os.makedirs(dest, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", python, "--implementation", "cp", "-d", dest, TVM, TVM_FFI]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd, check=True)
    return sorted(os.path.join(dest, f) for f in os.listdir(dest) if f.endswith(".whl"))


def runtime_from_wheels(wheels: list, dest: str) -> str:
    """Unpack the runtime subset of TVM's and tvm-ffi's wheels into ``dest``."""
    _typing_extensions(dest)
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                if _kept(info.filename) and not info.is_dir():
                    z.extract(info, dest)
                    path = os.path.join(dest, info.filename)
                    if info.filename.endswith(".so"):
                        os.chmod(path, 0o755)
    return dest


def pack_site(site: str, archive: str) -> int:
    """``site`` as an xz tarball (``site/`` inside); its size in bytes."""
    with tarfile.open(archive + ".tmp", "w:xz", preset=9) as tar:
        tar.add(site, arcname="site")
    os.replace(archive + ".tmp", archive)
    return os.path.getsize(archive)


def site_bytes(site: str) -> dict:
    """Bytes of each shared library of a runtime site and of everything."""
    out, total = {}, 0
    for folder, _, files in os.walk(site):
        for f in files:
            n = os.path.getsize(os.path.join(folder, f))
            total += n
            if f.endswith(".so"):
                out[f] = n
    out["total"] = total
    return out
