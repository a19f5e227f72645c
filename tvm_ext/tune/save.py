"""Save a result into the project's ``tuning_logs/`` (``tvm-ext save``): the one step that writes there.

``tune`` and ``bench`` work in git-ignored work dirs (``tvm_ext_work/``); a result worth keeping
is saved on purpose. A tuning work dir is copied, checked (a database a killed run left
half-written is refused in one line), pruned of the records of modules that are no longer its
tasks (``prune``) and compressed (``packed``); a directory of bare kernel databases (the Phi-2
bench's ``phi2-<kind>-<target>-<fused|unfused>/``) is copied, checked and compressed; a bench
JSON is copied. The copy is built beside its destination and renamed into place, so an
interruption leaves the old saved result or the new one; MetaSchedule's text logs stay behind.
"""
from __future__ import annotations

import os
import shutil

from tvm_ext.tune import packed
from tvm_ext.tune.database import (DB_FILES, META_FILE, SAVED_ROOT, DatabaseMismatch, _env_error, check_database,
                                   read_meta)
from tvm_ext.tune.prune import prune

SKIP = shutil.ignore_patterns("logs", "*-work", "*.tmp", "*.new")


def _database_dirs(root: str) -> list[str]:
    """Every directory under ``root`` (itself included) that holds a database file."""
    found = []
    for here, dirs, _ in os.walk(root):
        dirs[:] = [d for d in dirs if d != "logs" and not d.endswith("-work")]
        if any(packed.exists(os.path.join(here, name)) for name in DB_FILES):
            found.append(here)
    return sorted(found)


def _check_complete(directory: str, shown: str) -> None:
    state = check_database(directory)
    if state.partial_tail is not None or state.missing_newline:
        raise DatabaseMismatch(f"{shown}: a run left its last line incomplete (killed, or still running?); "
                               "resume it with the same tune/bench command, then save")


def save(source: str, root: str = SAVED_ROOT, log=print, name: str | None = None) -> str:
    """Save ``source`` (a work dir, a directory of kernel databases or a bench JSON) as
    ``root/<name>`` (default: its own name), replacing an older save of that name; returns it."""
    source = os.path.normpath(source)
    if not os.path.exists(source):
        raise DatabaseMismatch(f"{source}: no such file or directory")
    if name is not None and (not name or os.sep in name or name in (".", "..")):
        raise DatabaseMismatch(f"--name {name!r}: a plain file or directory name")
    dest = os.path.join(root, name or os.path.basename(source))
    try:
        os.makedirs(root, exist_ok=True)
        if os.path.isfile(source):
            if not source.endswith(".json"):
                raise DatabaseMismatch(f"{source}: save takes a work dir, a directory of databases or a bench JSON")
            if os.path.abspath(source) != os.path.abspath(dest):
                shutil.copyfile(source, dest + ".tmp")
                os.replace(dest + ".tmp", dest)
            log(f"saved {source} as {dest}")
            return dest
        return _save_dir(source, dest, log)
    except OSError as err:
        raise _env_error("save into", dest, err) from None


def _save_dir(source: str, dest: str, log) -> str:
    is_work_dir = os.path.isfile(os.path.join(source, META_FILE))
    if is_work_dir:
        read_meta(source)  # one line for a corrupt tvm_ext.json
    databases = _database_dirs(source)
    if not databases:
        raise DatabaseMismatch(f"{source} holds no tuning database (no {DB_FILES[0]})")
    for directory in databases:  # refuse before copying anything
        _check_complete(directory, directory)
    staging = dest.rstrip("/\\") + ".new"
    if os.path.isdir(staging):  # left by a save that was killed
        shutil.rmtree(staging)
    shutil.copytree(source, staging, ignore=SKIP)
    try:
        if is_work_dir:
            prune(staging, log=lambda line: log(line.replace(staging, dest)))
        count = sum(packed.pack(directory) for directory in _database_dirs(staging))
        _replace(staging, dest)
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(dest) for f in files)
    log(f"saved {source} as {dest} ({count} files compressed, {size / 2**20:.2f} MiB)")
    return dest


def _replace(staging: str, dest: str) -> None:
    """Move ``staging`` to ``dest``; an older ``dest`` is moved aside first and removed after."""
    old = None
    if os.path.exists(dest):
        old = dest.rstrip("/\\") + f".old-{os.getpid()}"
        os.replace(dest, old)
    os.replace(staging, dest)
    if old is not None:
        shutil.rmtree(old)


def _vendor(mcpu) -> str:
    return "amd" if str(mcpu or "").startswith(("znver", "bdver", "btver", "amdfam")) else "intel"


def _saved_of(workload: str, ruleset: str, options: dict, kind: str, root: str):
    """(path, meta) of every saved work dir of ``workload`` with these options and rule set, for
    target kind ``kind``, under any name."""
    import glob

    for meta_path in sorted(glob.glob(os.path.join(root, "*", META_FILE))):
        path = os.path.dirname(meta_path)
        try:
            meta = read_meta(path)
        except ValueError:
            continue
        if (meta.get("workload"), meta.get("ruleset"), meta.get("options")) == (workload, ruleset, options) \
                and meta["target"].get("kind") == kind:
            yield path, meta


def saved_for(workload: str, ruleset: str, options: dict, target, root: str = SAVED_ROOT) -> str | None:
    """The saved database of ``workload`` tuned for exactly ``target`` (on any number of threads),
    under any name (``resnet50-int8-nchwc-znver5-llvm-plugin``): what ``bench --from-logs`` reads
    on this machine rather than the default name's, tuned for another CPU. None if there is none."""
    from tvm_ext.targets import target_mismatch, target_to_json

    kind = target_to_json(target).get("kind")
    return next((path for path, meta in _saved_of(workload, ruleset, options, kind, root)
                 if target_mismatch(meta["target"], target) is None), None)


def find_saved(workload: str, ruleset: str, options: dict, target, root: str = SAVED_ROOT) -> tuple:
    """The saved database a new tuning run of ``workload`` should start from: ``(path, exact)``.

    Among the saved work dirs of the same workload, options, rule set and target kind (any name:
    ``resnet50-int8-nchwc-llvm-plugin``, ``resnet50-int8-nchwc-znver5-llvm-plugin``, ...): one tuned
    for exactly this target and measured on as many threads as this run's (``exact``: copy it), else
    the closest CPU whose instructions this one has -- the same mcpu, then the same vendor, then the
    one with the most records (its schedules are measured here before they are trusted: a record's
    seconds on one thread rank a 2-thread run's candidates wrongly, and summed they are no estimate
    of the network). ``(None, why)`` when there is none."""
    from tvm_ext.targets import target_mismatch, target_to_json
    from tvm_ext.tune.database import check_instructions, measuring_threads

    here = target_to_json(target)
    found, refused = [], []
    for path, meta in _saved_of(workload, ruleset, options, here.get("kind"), root):
        if target_mismatch(meta["target"], target) is None and meta.get("threads") == measuring_threads():
            return path, True
        try:
            check_instructions(path, target, retarget=True)  # its u8 x s8 form is swapped for ours
        except DatabaseMismatch as err:
            refused.append(str(err))
            continue
        mcpu = meta["target"].get("mcpu")
        records = check_database(path).records
        found.append(((mcpu == here.get("mcpu"), _vendor(mcpu) == _vendor(here.get("mcpu")), records), path))
    if found:
        return max(found)[1], False
    return None, (refused[0] if refused else "no saved database of this workload and rule set")


__all__ = ["find_saved", "save", "saved_for"]
