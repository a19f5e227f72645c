"""``tvm-ext targets``: what ``--target llvm`` and the other presets resolve to here."""
from __future__ import annotations

import json
import re

from tvm_ext.targets import CUDA_PRESETS, describe_host, target_to_json


def add_parser(sub) -> None:
    p = sub.add_parser("targets", help="print the detected host CPU and the target presets",
                       description="Print the host CPU that '--target llvm' is built for "
                                   "(LLVM mcpu, vector features, VNNI and AMX, physical cores) and the presets. "
                                   "On a host whose OS shows AMX the llvm preset adds +amx-* to mattr "
                                   "when LLVM's CPU model lacks them.")
    p.set_defaults(func=run)


def run(args) -> int:
    print(format_host())
    return 0


def format_host(desc: dict | None = None) -> str:
    """describe_host() as the lines ``tvm-ext targets`` prints."""
    d = desc or describe_host()
    lines = [
        f"cpu:            {d['cpu_name']}" + (f" ({d['vendor']})" if d.get("vendor") else ""),
        f"triple:         {d['triple']}",
        f"llvm host cpu:  {d['llvm_host_cpu']}",
        f"mcpu:           {d['mcpu'] or '(none: generic)'}  [{d['mcpu_source']}]",
        f"physical cores: {d['physical_cores']} (logical {d['logical_cpus']})",
        f"avx512vnni:     {'yes' if d['avx512vnni'] else 'no'}",
        f"avxvnni:        {'yes' if d['avxvnni'] else 'no'}",
        "amx:            " + " ".join(f"{k}={'yes' if d.get(k) else 'no'}"
                                      for k in ("amx_tile", "amx_int8", "amx_bf16")),
    ]
    if d["mattr"]:
        hidden = [f for f in d["mattr"] if f.startswith("-")]
        added = [f for f in d["mattr"] if f.startswith("+")]
        if hidden:
            lines.append(f"mattr:          {','.join(hidden)}  (in the CPU model, hidden by the OS)")
        if added:
            lines.append(f"mattr:          {','.join(added)}  (shown by the OS, not in the CPU model)")
    simd = [f for f in d["features"] if re.match(r"(avx|amx|sse4|fma|f16c)", f)]
    lines.append(f"simd features:  {' '.join(simd)}")
    lines.append("")
    lines.append("presets:")
    lines.append(f"  llvm          {json.dumps(target_to_json('llvm'))}")
    lines.append(f"  llvm-generic  {json.dumps(target_to_json('llvm-generic'))}")
    for name in ["cuda", *sorted(CUDA_PRESETS)]:
        lines.append(f"  {name:<13} {json.dumps(target_to_json(name))}")
    return "\n".join(lines)
