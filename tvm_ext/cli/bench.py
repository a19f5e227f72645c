"""``tvm-ext bench``: compare rule sets (int8) or schedules and fusion (Phi-2) in one run."""
from __future__ import annotations

from tvm_ext.cli.common import add_workload_args, check_device, check_workload_name, log, workload_key
from tvm_ext.cli.table import fmt, render


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help="side-by-side timing of rule sets / schedules, checked against NumPy",
        description="int8 workloads: tune (or reuse with --from-logs) one database per rule set, "
                    "compile each network, check it bit-exactly against the NumPy reference and "
                    "time all of them interleaved in one process; writes "
                    "tvm_ext_work/bench-<workload>-<target>.json (git-ignored, like the databases it "
                    "tunes there; 'tvm-ext save' copies a result into tuning_logs/). phi2-decode / phi2-prefill: "
                    "fusion on/off x dlight / metaschedule / seeded (/ rule: the DequantGEMV rule "
                    "untuned) per kernel with the memory-bandwidth bound, timed with the weights "
                    "cycled through copies that exceed the last-level cache (DRAM figures; "
                    "cache-hot ones labelled), and with --peers ort[,torch] per projection.")
    add_workload_args(p)
    p.add_argument("--rulesets", default="plugin,no-inline-const,upstream",
                   help="comma-separated rule sets for int8 workloads (default all three); "
                        "RULESET@TARGET (e.g. upstream@llvm-generic) tunes and times that row "
                        "for another target preset in the same rounds")
    p.add_argument("--trials", type=int, default=None,
                   help="trials per task (int8 default 32) or per kernel (phi2)")
    p.add_argument("--from-logs", action="store_true",
                   help="reuse saved databases (tuning_logs/, or --logs-dir) instead of tuning")
    p.add_argument("--peers", default=None,
                   help="int8: also time these runtimes on the same network in the same rounds; "
                        "'ort' = ONNX Runtime (needs the [bench] extra; on an .onnx model it runs that "
                        "file; a built-in network exported with QLinearConv), 'ov' = OpenVINO's CPU "
                        "plugin (a built-in network exported in QDQ form), 'tvm-onnx' = TVM's own "
                        "from_onnx on an .onnx model with default schedules, 'torch' = PyTorch's "
                        "ResNet-50 (torchvision, random weights; on cuda fp16 channels_last under a CUDA "
                        "graph). phi2-decode: 'ort[,torch]' times ORT MatMulNBits (accuracy_level 0 "
                        "and 4) and torch bf16/fp32 linear on every projection, same q4 weights, same "
                        "DRAM cycling")
    p.add_argument("--int8", action="store_true",
                   help="phi2-decode on an AVX2 CPU: also time tvm_ext's int8-activation projections "
                        "(activations quantized per group of 32, integer dot products: a different "
                        "computation, as ORT's accuracy_level 4; its error against the float reference "
                        "is reported) on the same weights, in the same rounds")
    p.add_argument("--schedules", default=None,
                   help="phi2: comma-separated schedules to run (default all: dlight,metaschedule,seeded,rule); "
                        "dlight always runs. phi2-prefill on llvm without --schedules is the int8 prefill "
                        "(generate --prompt 128: rows int8 and tuned, --trials tunes, --peers ort,llama.cpp)")
    p.add_argument("--beside", default=None, metavar="WORKLOAD[,WORKLOAD]",
                   help="int8: also time these built-in workloads (same --batch/--image/--seed: the "
                        "same network in another layout, e.g. resnet50-int8-nchwc beside "
                        "resnet50-int8-amx) with their plugin databases in the same rounds, each "
                        "checked against its own NumPy reference")
    p.add_argument("--layers", action="store_true",
                   help="int8: also time every conv task of the first rule set's database "
                        "against one ONNX Runtime QLinearConv of the same shape")
    p.add_argument("--breakdown", type=int, default=0, metavar="RUNS",
                   help="int8: also run the first rule set's network RUNS times with every kernel timed: "
                        "each tuning task inside the network against its record, and the time between "
                        "the kernels (where the network's gap to the sum of its tuned kernels is)")
    p.add_argument("--warm", type=int, default=0, metavar="RUNS",
                   help="int8: in every turn, RUNS more runs right after the timed one, reported apart "
                        "('warm ms'): each network called in a loop, its weights in the cache and its "
                        "threads awake, where 'e2e ms' is its first run after the other networks'")
    p.add_argument("--rounds", type=int, default=None,
                   help="interleaved timing rounds (default 20 for int8, 5 for phi2; one phi2-prefill "
                        "round at real size takes minutes on a few cores)")
    p.add_argument("--build-only", action="store_true",
                   help="phi2: build every kernel of every schedule (nvcc for cuda), run nothing")
    p.add_argument("--config", default="full", help="phi2: full (real size) or reduced")
    p.add_argument("--logs-dir", default=None,
                   help="where the per-rule-set databases are read and tuned (default: tuning_logs "
                        "with --from-logs, else tvm_ext_work)")
    p.add_argument("--out", default=None, help="JSON path (default tvm_ext_work/bench-<workload>-<target>.json)")
    p.set_defaults(func=run)


def run(args) -> int:
    import os

    from tvm_ext import workloads
    from tvm_ext.tune.database import WORK_ROOT
    from tvm_ext.cli.common import load_workload, parse_rulesets, resolve_target, workload_options

    check_workload_name(args.workload)
    if args.rounds is not None and args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, not {args.rounds}")
    target = resolve_target(args.target)
    if not args.build_only:
        check_device(target, "timing", remote_ok=False)
    key = workload_key(args)
    out = args.out or os.path.join(WORK_ROOT, f"bench-{key}-{target.kind.name}.json")
    if args.workload == "phi2-prefill" and target.kind.name == "llvm" and not (args.schedules or args.build_only):
        return _prefill_on_cpu(args, out)
    if args.workload.startswith("phi2"):
        if args.beside:
            raise ValueError("--beside is for the int8 networks")
        from tvm_ext.bench.phi2 import layer_bench as phi2_bench
        from tvm_ext.bench.phi2.peers import parse as parse_phi2_peers

        peers = parse_phi2_peers(args.peers)
        schedules = args.schedules.split(",") if args.schedules else None
        result = phi2_bench.run(args.workload, target=target, trials=args.trials,
                                from_logs=args.from_logs, build_only=args.build_only, out_json=out,
                                log=log, config=args.config, peers=peers, schedules=schedules, int8=args.int8,
                                tuning_dir=args.logs_dir,
                                **({} if args.rounds is None else {"rounds": args.rounds}))
        from tvm_ext.cli.phi2_table import format_table

        print(format_table(result) if not args.build_only else result)
        return 0
    if args.int8:
        raise ValueError("--int8 is for phi2-decode (the decode projections on the CPU)")
    from tvm_ext.bench import int8 as bench_int8

    from tvm_ext.bench.peers import parse_peers

    rulesets = parse_rulesets(args.rulesets)
    peers = parse_peers(args.peers)
    if args.trials is not None and args.trials < 1:
        raise ValueError(f"--trials must be at least 1, not {args.trials}")
    if args.breakdown < 0:
        raise ValueError(f"--breakdown must be a number of runs (0: none), not {args.breakdown}")
    if args.warm < 0:
        raise ValueError(f"--warm must be a number of runs (0: none), not {args.warm}")
    beside = _beside(args)
    workload = load_workload(args)
    beside = [workloads.get(name, **workload_options(args)) for name in beside]
    result = bench_int8.run(workload, target, rulesets, args.trials or 32, args.from_logs,
                            args.rounds or 20, out, log=log, work_root=args.logs_dir, peers=peers,
                            layers=args.layers, beside=beside, breakdown=args.breakdown, warm=args.warm)
    print(format_int8(result))
    return 0 if all(row["exact_match"] for row in result["rows"] if row["ruleset"] not in peers) else 1


def _beside(args) -> list[str]:
    """The --beside workload names, checked before anything is built (one line for a bad one)."""
    names = [n for n in (args.beside or "").split(",") if n]
    for name in names:
        check_workload_name(name)
        if name.endswith(".onnx") or name.startswith("phi2") or args.workload.endswith(".onnx"):
            raise ValueError(f"--beside takes the built-in int8 networks, not {name!r} beside {args.workload!r}")
    return names


def _trials_text(result: dict) -> str:
    counts = sorted({r["trials"] for r in result["rows"] if r.get("trials") is not None})
    return f"{counts[0]}-{counts[-1]}" if len(counts) > 1 else str(result["trials_per_task"])


def _exact_text(row: dict) -> str:
    if "max_step" in row and row["frac_differ"]:  # a peer that rounds differently: say by how much
        return f"no: <= {row['max_step']} steps in {100 * row['frac_differ']:.1f}%"
    return "yes" if row["exact_match"] else "NO"


def format_int8(result: dict) -> str:
    """The int8 rule-set benchmark (``bench.int8.run``'s result) as text."""
    est = [r.get("e2e_estimate_ms") for r in result["rows"]]
    warm = result.get("warm_runs", 0)
    rows = [[r["ruleset"], f"{r['e2e_ms']:.3f}", f"{r['ratio_to_plugin']:.2f}"]
            + ([f"{r['warm_ms']:.3f}", f"{r['warm_ratio_to_plugin']:.2f}"] if warm else [])
            + [None if e is None else f"{e:.3f}", _exact_text(r)] for r, e in zip(result["rows"], est)]
    head = ["ruleset", "e2e ms", "vs plugin"] + (["warm ms", "vs plugin"] if warm else []) + ["est. ms", "exact"]
    lines = [f"{result['workload']} {result['options']} on {result['target']}, "
             f"{_trials_text(result)} trials per task, median of {result['rounds']} interleaved rounds"
             + (f" (warm: the {warm} runs after each first run)" if warm else ""),
             render(head, rows, "<>>" + (">>" if warm else "") + "><")]
    shares = [f"{r['ruleset']} {r['non_conv_estimate_ms']:.3f} of {r['e2e_estimate_ms']:.3f}"
              for r in result["rows"] if r.get("non_conv_estimate_ms") is not None]
    if shares:
        lines.append("est. ms outside the convs (pooling, dense, layout, reshape): " + "; ".join(shares))
    if "breakdown" in result:
        lines += ["", format_breakdown(result["breakdown"], result["rows"][0]["ruleset"])]
    if "per_layer" in result:
        layers = result["per_layer"]
        lines += ["", f"per conv task ({layers[0]['ruleset'] if layers else '-'} database) vs one ORT "
                      "QLinearConv, same threads:", format_layers(layers)]
    return "\n".join(lines)


def format_breakdown(found: dict, ruleset: str, top: int = 12) -> str:
    """``bench.breakdown``'s result: the totals, then the tasks taking the most time in the network."""
    head = (f"{ruleset}: where the network's time goes ({found['runs']} runs, medians): network "
            f"{found['network_ms']:.3f} ms = kernels inside it {found['kernels_ms']:.3f} + between them "
            f"{found['outside_ms']:.3f}; the kernels' records sum to {found['estimate_ms']:.3f} ms (inside the "
            f"network {found['inside_ms']:+.3f}); network / records {found['network_ms'] / found['estimate_ms']:.2f}x")
    body = [[t["task"][:60], t["calls"], f"{t['in_network_ms']:.3f}", fmt(t["record_ms"], ".3f"),
             fmt(t["ratio"], ".2f")] for t in found["tasks"][:top]]
    rest = found["tasks"][top:]
    if rest:
        body.append([f"({len(rest)} more tasks)", sum(t["calls"] for t in rest),
                     f"{sum(t['in_network_ms'] for t in rest):.3f}",
                     f"{sum(t['record_ms'] or 0 for t in rest):.3f}", ""])
    return head + "\n" + render(["task", "calls", "in network ms", "record ms", "ratio"], body, "<>>>>")


def format_layers(rows: list) -> str:
    """Per conv task: TVM vs ORT microseconds and their ratio, plus the weighted sum."""
    body = [[r["shape"], r["epilogue"], r["count"], f"{r['tvm_us']:.0f}", f"{r['ort_us']:.0f}",
             f"{r['tvm_us'] / r['ort_us']:.2f}"] for r in rows]
    if rows:
        tvm_total = sum(r["tvm_us"] * r["count"] for r in rows)
        ort_total = sum(r["ort_us"] * r["count"] for r in rows)
        body += [None, ["weighted sum", "", "", f"{tvm_total:.0f}", f"{ort_total:.0f}",
                        f"{tvm_total / ort_total:.2f}"]]
    return render(["conv shape", "epilogue", "x", "tvm us", "ort us", "tvm/ort"], body, "<<>>>>")


PREFILL_CPU_NOTE = (
    "phi2-prefill on the CPU is the int8 prefill (tvm-ext generate --prompt 128): its projections are the q4 x "
    "int8 GEMM rule's; the float-kernel table (dlight / metaschedule / seeded / rule per kernel, fused vs "
    "unfused) was skipped: dlight has no CPU matmul rule, so its prefill GEMMs run unscheduled, minutes per "
    "call at 128 tokens; --schedules dlight,... runs that table anyway")


def _prefill_on_cpu(args, out) -> int:
    """``bench phi2-prefill`` on llvm without --schedules: the whole-model int8 prefill of
    ``generate --prompt 128`` (rows int8 and, where a database exists or --trials tunes one, tuned),
    per-GEMM int8 TOPS against the host's vpdpbusd peak, the peers (ort, llama.cpp) in the same run."""
    import os
    from argparse import Namespace

    from tvm_ext.cli.common import log
    from tvm_ext.cli.generate_prompt import int8_database, run_prompt

    log(PREFILL_CPU_NOTE)
    ns = Namespace(prompt=128, tokens=4, context=0, config=args.config, layers=None, seed=args.seed, threads=None,
                   peers=args.peers or "", database=args.logs_dir, tune=0 if args.from_logs else (args.trials or 0),
                   rounds=args.rounds or 3, out=out, json=False, quiet=False, schedule=None, prefill_attention="fused")
    if not ns.tune and not os.path.isdir(int8_database(ns)):
        ns.schedule = "int8"  # no tuning database here: the untuned rules only
    return run_prompt(ns, note=PREFILL_CPU_NOTE)

