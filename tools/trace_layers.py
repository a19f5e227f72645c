"""Follow a ``tvm-ext`` command through the package's layers and count what a reader would follow.

    python tools/trace_layers.py [--json] [--list] [--follow NAME] -- generate --config reduced --schedule rule ...

Parses the command line as ``tvm-ext`` does, then runs the command's function in this process under
``sys.setprofile`` (and ``threading.setprofile`` for Python threads it starts) and counts, over the calls
whose callee lies in the package (``tvm_ext/``, ``rules/``, ``postprocs/``):

* files: distinct package files whose functions run (module bodies run by imports are left out);
* stops: distinct package functions entered (file + qualified name);
* climbs: distinct call edges (caller function -> callee function) from a lower layer into a higher
  one, the caller being the nearest package frame below the callee (a rule called back through
  TVM's C++ counts from the package frame that started it).

``--follow NAME`` (``schedule``, ``target``) counts only the calls that carry that command-line value:
an argument equal to it (or to one of its comma-separated parts), a list or tuple holding one, the
parsed ``argparse.Namespace``, or for ``target`` any ``tvm.target.Target`` (what it resolves to) --
the parameter followed through the code.

Layers, highest first: cli (``tvm_ext/cli``) > harness (``bench``, ``check``, ``cluster``, ``bundle``,
``workloads``, ``tune``, ``frontend``, ``report``) > plugin (everything else: ``rules``,
``postprocs``, ``intrinsics``, ``analysis``, the top-level modules).  Code run in other processes
(MetaSchedule's builder and runner pools) and in threads TVM's C++ starts is not seen.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading

ROOT = ""  # set by main: the project root of the imported package
HARNESS = ("bench", "check", "cluster", "bundle", "workloads", "tune", "frontend", "report")
LAYERS = {"cli": 3, "harness": 2, "plugin": 1}


def package_path(filename: str):
    """The path of ``filename`` relative to the project root where it is package code, else None."""
    path = os.path.abspath(filename)
    if not path.startswith(ROOT + os.sep):
        return None
    rel = os.path.relpath(path, ROOT)
    return rel if rel.split(os.sep)[0] in ("tvm_ext", "rules", "postprocs") else None


def layer(rel: str) -> str:
    parts = rel.split(os.sep)
    if parts[0] == "tvm_ext" and len(parts) > 1:
        if parts[1] == "cli":
            return "cli"
        if parts[1] in HARNESS:
            return "harness"
    return "plugin"


class Tracer:
    def __init__(self, carries=None):
        self.stops, self.edges, self.climbs = set(), set(), set()
        self._paths = {}
        self.carries = carries  # None: every call; else a predicate on a call's argument values
        self.errors = []

    def _rel(self, code):
        rel = self._paths.get(code.co_filename, 0)
        if rel == 0:
            rel = self._paths[code.co_filename] = package_path(code.co_filename)
        return rel

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        try:
            self._call(frame)
        except Exception as err:  # noqa: BLE001 -- an exception here would switch the profiler off
            self.errors.append(f"{type(err).__name__}: {err}")

    def _call(self, frame):
        rel = self._rel(frame.f_code)
        if rel is None or frame.f_code.co_qualname == "<module>":  # an import, not a step of the command
            return
        if self.carries is not None:
            code = frame.f_code
            n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4) + bool(code.co_flags & 8)
            values = [frame.f_locals.get(name) for name in code.co_varnames[:n]]
            if not any(self.carries(v) for v in values):
                return
        callee = (rel, frame.f_code.co_qualname)
        self.stops.add(callee)
        caller = frame.f_back
        while caller is not None and self._rel(caller.f_code) is None:
            caller = caller.f_back
        if caller is None:
            return
        src = (self._rel(caller.f_code), caller.f_code.co_qualname)
        if src[0] == rel:
            return
        self.edges.add((src, callee))
        if LAYERS[layer(src[0])] < LAYERS[layer(rel)]:
            self.climbs.add((src, callee))

    def summary(self) -> dict:
        files = sorted({f for f, _ in self.stops})
        return {"files": len(files), "stops": len(self.stops), "tracer_errors": len(self.errors),
                "cross_file_edges": len(self.edges),
                "climbs": len(self.climbs),
                "by_layer": {name: sum(1 for f in files if layer(f) == name) for name in LAYERS},
                "file_list": files,
                "climb_list": sorted(f"{a[0]}:{a[1]} -> {b[0]}:{b[1]}" for a, b in self.climbs),
                "stop_list": sorted(f"{f}:{name}" for f, name in self.stops)}


def _carrier(name: str, value):
    """A predicate: whether an argument value carries the option ``name``'s ``value`` (module doc)."""
    import argparse as ap

    import tvm

    wanted = {value} | (set(value.split(",")) if isinstance(value, str) else set())
    wanted.discard("")

    def carries(v, depth=0):
        if isinstance(v, ap.Namespace):
            return True
        if name == "target" and isinstance(v, tvm.target.Target):
            return True
        if isinstance(v, str):
            return v in wanted
        if isinstance(v, (list, tuple)) and depth == 0:
            return any(carries(x, 1) for x in v[:16])
        return False

    return carries


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the counts as one JSON object on stderr's last line")
    p.add_argument("--list", action="store_true", help="also list the files, the climbs and the stops")
    p.add_argument("--follow", metavar="NAME", help="count only the calls that carry this option's value "
                   "(schedule, target)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the tvm-ext command line, after --")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the tvm-ext command after --")
    import tvm_ext
    from tvm_ext.cli.main import build_parser, use_physical_cores

    parsed = build_parser().parse_args(command)  # untraced: argparse setup is not the command's path
    use_physical_cores()
    carries = None if not args.follow else _carrier(args.follow, getattr(parsed, args.follow))

    global ROOT  # the tree the package is imported from (an installed checkout or PYTHONPATH)
    ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tvm_ext.__file__)))

    tracer = Tracer(carries)
    threading.setprofile(tracer)
    sys.setprofile(tracer)
    try:
        rc = int(parsed.func(parsed) or 0)
    except SystemExit as stop:
        rc = stop.code
    except Exception as err:  # noqa: BLE001 -- as the CLI's main: one line
        rc = f"{type(err).__name__}: {err}"
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    out = tracer.summary()
    out["rc"] = rc
    if not args.list:
        out.pop("file_list"), out.pop("climb_list"), out.pop("stop_list")
    text = json.dumps(out) if args.json else "\n".join(
        f"{k}: {v}" if not isinstance(v, list) else f"{k}:\n  " + "\n  ".join(v) for k, v in out.items())
    print(text, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
