"""Arguments and helpers shared by the subcommands."""
from __future__ import annotations

import argparse
import os
import sys

from tvm_ext.int8_path import LAYOUTS

WORKLOAD_HELP = ("conv2d-int8, resnet50-int8, resnet50-int8-nchwc, resnet50-int8-amx, resnet50-int8-s8, phi2-decode, "
                 "phi2-prefill, "
                 "or the path of an "
                 "int8 MODEL.onnx (see tvm-ext import; its databases are keyed by the file's content hash)")
TARGET_HELP = ("llvm (this CPU, the default), llvm-generic, cuda, cuda-sm75, cuda-sm80, cuda-sm90, "
               "or a JSON object of target options, '{\"kind\": \"llvm\", \"mcpu\": \"CPU\"}' (CPU: an LLVM CPU "
               "name, as 'llc -mcpu=help' lists them)")


def count(text: str) -> int:
    """argparse type: a whole number of at least 1 (checked before any work starts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def check_device(target, what: str, remote_ok: bool = True) -> None:
    """ValueError (one line, before any work) when ``target`` needs a GPU this machine lacks:
    every candidate would fail to load, one task after another, for minutes."""
    import tvm

    if target.kind.name != "cuda" or tvm.cuda(0).exist:
        return
    ways = ("--build-only (compile every candidate with nvcc, run nothing) or --rpc-tracker HOST:PORT --rpc-key KEY "
            "(measure on a GPU machine)" if remote_ok
            else "--build-only (phi2-decode/phi2-prefill: compile every kernel with nvcc)")
    raise ValueError(f"{what} for cuda needs a GPU, and this machine has none; use {ways}")


def check_out_dir(path) -> None:
    """ValueError (one line) when ``path`` is given and its folder does not exist: before minutes of work."""
    import os

    if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise ValueError(f"--out: no directory {os.path.dirname(os.path.abspath(path))}")


def log(message: str) -> None:
    """Progress lines go to stderr so that --json output stays clean."""
    print(message, file=sys.stderr, flush=True)


def add_workload_args(p, batch_default=None) -> None:
    p.add_argument("workload", help=WORKLOAD_HELP)
    p.add_argument("--target", default="llvm", help=TARGET_HELP)
    p.add_argument("--batch", type=count, default=batch_default,
                   help="batch size (resnet50-int8[-nchwc], conv2d-int8; default 1)")
    p.add_argument("--image", type=count, default=None,
                   help="image height = width (resnet50-int8[-nchwc] default 224, conv2d-int8 default 14)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and inputs (default 0)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=1x3x224x224",
                   help="MODEL.onnx only: static shape of a dynamic input (see tvm-ext import)")
    p.add_argument("--layout", default="auto", choices=LAYOUTS,
                   help="MODEL.onnx and resnet50-int8: activation layout of the integer network; auto "
                        "(default) is the host's best int8 path on llvm: amx with AMX, nchwc (packed, "
                        "vpdpbusd) with VNNI, else nhwc; on cuda s8 (the convs on signed activations: int8 "
                        "tensor cores) from sm_72; resnet50-int8 --layout nhwc is the seed's NHWC "
                        "network; each layout has its own databases")


def workload_options(args) -> dict:
    options = {"seed": args.seed}
    if args.batch is not None:
        options["batch"] = args.batch
    if args.image is not None:
        options["image"] = args.image
    return options


def check_workload_name(name: str) -> str:
    from tvm_ext import workloads

    if name.endswith(".onnx"):  # a user's int8 ONNX model (tvm-ext import)
        if not os.path.isfile(name):
            raise ValueError(f"{name}: no such ONNX file")
        return name
    if name not in workloads.names():
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(workloads.names())}")
    return name


def workload_key(args) -> str:
    """The name databases are kept under: the workload's, or for an .onnx file
    ``onnx-<stem>-<content hash>[-nchwc]`` (two different files, or layouts, never share a
    database; ``--layout auto`` imports the model to know which it is)."""
    if not args.workload.endswith(".onnx"):
        return builtin_name(args)
    from tvm_ext.frontend.onnx_int8 import check_layout, workload_name

    layout = check_layout(getattr(args, "layout", "auto"))
    return load_workload(args).name if layout == "auto" else workload_name(args.workload, layout=layout)


_IMPORTED = {}  # one import per model and options in a process (workload_key, then load_workload)
_SAID = set()  # int8 path choices already told (workload_key, then load_workload)


def builtin_name(args) -> str:
    """The built-in workload to build: ``resnet50-int8`` is the int8 ResNet-50 in the layout of
    ``--layout`` -- with ``auto`` (the default), the one this target runs best
    (``tvm_ext.int8_path``), said in one line; other built-ins take no ``--layout``."""
    from tvm_ext.int8_path import RESNET50, best_layout

    layout = getattr(args, "layout", "auto")
    if args.workload != "resnet50-int8":
        if layout != "auto":
            raise ValueError(f"--layout is for MODEL.onnx and resnet50-int8, not {args.workload}")
        return args.workload
    if layout != "auto":
        return RESNET50[layout]
    layout, why = best_layout(target_of(args), weights_fit_int16=False)  # full 8-bit weights
    if (args.target, layout) not in _SAID:
        _SAID.add((args.target, layout))
        log(f"int8 path: {RESNET50[layout]} ({why}; --layout {'|'.join(LAYOUTS[1:])} picks another)")
    return RESNET50[layout]


def load_workload(args):
    """Build the workload named on the command line (one clear error for a bad name)."""
    from tvm_ext import workloads

    check_workload_name(args.workload)
    layout = getattr(args, "layout", "auto")
    if args.workload.endswith(".onnx"):
        from tvm_ext.frontend.onnx_int8 import import_onnx, parse_shapes

        if args.batch is not None or args.image is not None:
            raise ValueError("--batch and --image do not apply to an .onnx model (its input shape is "
                             "the model's, or --shape NAME=1x3x224x224)")
        stat = os.stat(args.workload)
        key = (os.path.abspath(args.workload), stat.st_mtime_ns, stat.st_size, tuple(getattr(args, "shape", [])),
               layout, args.target, args.seed)
        if key not in _IMPORTED:
            _IMPORTED[key] = import_onnx(args.workload, parse_shapes(getattr(args, "shape", [])), layout=layout,
                                         target=target_of(args), seed=args.seed, log=log)
        return _IMPORTED[key].workload
    name = builtin_name(args)
    log(f"building {name} {workload_options(args)} ...")
    return workloads.get(name, **workload_options(args))


def resolve_target(spec: str):
    from tvm_ext.targets import resolve_target as resolve

    return resolve(spec)


def target_of(args):
    """The command's ``--target`` as a ``tvm.target.Target``, resolved once, here at the command line's edge:
    every layer below is handed this object."""
    resolved = getattr(args, "resolved_target", None)
    if resolved is None:
        resolved = args.resolved_target = resolve_target(args.target)
    return resolved


def parse_rulesets(text: str) -> list[str]:
    """Bench rows: ``RULESET`` or ``RULESET@TARGET`` (a target preset name such as
    ``upstream@llvm-generic``: that row is tuned and compiled for its own target)."""
    from tvm_ext.rulesets import check_ruleset

    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise ValueError("--rulesets is empty")
    for name in names:
        ruleset, _, target = name.partition("@")
        check_ruleset(ruleset)
        if target:
            resolve_target(target)  # one clear line for an unknown target name
    return names


def contexts(text, default: int, many: bool = False) -> list:
    """``--context``: past positions, as given (a string) or ``default`` when absent; several, comma-separated,
    where ``many`` (the CPU decode runs once per context). ValueError, one line, for a bad value."""
    if text is None:
        return [default]
    try:
        values = [int(p) for p in str(text).split(",") if p.strip()]
    except ValueError:
        values = []
    if not values:
        raise ValueError(f"--context takes past positions{' (comma-separated)' if many else ''}, not {text!r}")
    if min(values) < 0:
        raise ValueError(f"--context must be at least 0, not {min(values)}")
    if len(values) > 1 and not many:
        raise ValueError(f"--context takes one value here (several are for the CPU decode), not {text!r}")
    return list(dict.fromkeys(values))

