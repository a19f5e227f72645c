"""``tvm-ext generate``: whole-model Phi-2 q4 decode on the Relax VM, tokens/s against the
memory-bandwidth bound measured in the same run."""


def add_parser(sub) -> None:
    from tvm_ext.cli.common import count
    from tvm_ext.cli.generate_prompt import INT8_DATABASE, SAVED_INT8_DATABASE
    from tvm_ext.cli.generate_text import add_arguments as add_model_arguments

    p = sub.add_parser(
        "generate", help="whole-model Phi-2 q4 decode: tokens/s vs the bandwidth bound; text from a checkpoint "
                         "(--model PATH --prompt-text TEXT)",
        description="Build the Phi-2 decoder (random q4f32_1 weights passed as parameters, one compiled "
                    "layer called per layer, KV cache of CONTEXT random past positions + TOKENS), "
                    "generate TOKENS tokens greedily on the Relax VM and print tokens/s, the bound "
                    "(measured copy bandwidth / bytes of all weights and the attended KV per token), "
                    "the percentage of the bound reached and the kernels' shares of one step. On 2 cores the "
                    "full model's weights (1.5 GB) take 1-2 minutes to generate and a dlight step "
                    "about 10 s (--tokens 8: about 4 minutes in all); progress goes to stderr.")
    p.add_argument("--config", default="full", choices=("full", "reduced"),
                   help="full: Phi-2 (hidden 2560, 32 heads x 80, MLP 10240, vocab 51200); reduced: "
                        "hidden 256, 4 heads x 64, MLP 1024, vocab 1024 (default full)")
    p.add_argument("--layers", type=count, default=None, help="decoder layers (default 32 full, 2 reduced)")
    p.add_argument("--tokens", type=count, default=16, help="tokens to generate (default 16)")
    p.add_argument("--context", default=None,
                   help="past positions already in the KV cache (random; default 512, with --prompt 0); the decode "
                        "on the CPU takes several, comma-separated (e.g. 128,512,2032): one run, with its peer, "
                        "per context")
    p.add_argument("--schedule", default=None,
                   help="comma-separated, each a row of the same run (weights built once per layout): "
                        "dlight (default); rule: tvm_ext's CPU schedules (dequantize-GEMV, LayerNorm, "
                        "attention) for the kernels they match, dlight for the rest; int8: as rule, but "
                        "the projections quantize their activations per group of 32 to int8 (the q4 x int8 "
                        "GEMM rule: integer dot products, AVX2 or VNNI; as ONNX Runtime's accuracy_level 4): "
                        "different numbers, so the row reports its tokens and first-step logits against "
                        "the float rows'; tuned: the int8 model with the best records of --database for "
                        "the kernels it holds, as int8 for the rest (tuned at 0 trials is int8); none: "
                        "unscheduled kernels (quick checks)")
    p.add_argument("--kv-cache", metavar="LIST", default=None,
                   help="the KV cache's storage, comma-separated, each a row for each --schedule (same weights and "
                        "past): float32 (default), float16 (half the bytes; the attention computes in float32) or "
                        "int8 (a quarter, plus one float32 scale per position and head); rows other than float32 "
                        "report their tokens and logits against the float32 cache's row of their schedule. Decode "
                        "only (not with --prompt, --model or a GPU --target)")
    p.add_argument("--database", metavar="DIR", default=None,
                   help=f"tuning work dir for --schedule tuned (default: with --tune {INT8_DATABASE}, "
                        f"else the saved {SAVED_INT8_DATABASE} where it exists)")
    p.add_argument("--prompt", type=count, default=0, metavar="N",
                   help="prompt processing: N prompt tokens (even) through every layer at once (int8 activations, "
                        "the q4 x int8 GEMM rule: AVX-512 VNNI, AVX-VNNI or AVX2), then TOKENS decoded from the "
                        "cache it wrote; prints prompt tok/s, time to first token, the GEMMs' int8 TOPS against the "
                        "host's measured peak of their instructions, and the float path's tokens (the prompt fed "
                        "token by token) "
                        "beside the rows'. --schedule then takes int8 (our rules untuned) and tuned "
                        "(default both)")
    p.add_argument("--prefill-attention", default="fused", choices=("fused", "unfused"),
                   help="with --prompt: fused (default): the prompt's causal attention as one kernel that computes "
                        "only the unmasked half, a block of queries at a time; unfused: scores, softmax and values "
                        "as three kernels over the whole square, masked (what it was before; for comparison)")
    p.add_argument("--tune", type=count, default=0, metavar="TRIALS",
                   help="first tune the int8 model's kernels TRIALS trials each (resumable) into --database "
                        f"(default {INT8_DATABASE}) through tvm_ext.space, each starting from our rules' "
                        "schedule: the decode step's kernels, with --prompt the prompt's (32 trials: ~4 "
                        "minutes for a prompt size on 2 cores); then --schedule tuned reads them")
    p.add_argument("--peers", default="", metavar="LIST",
                   help="comma-separated peers measured in the same run, same threads, after our rows. "
                        "Without --prompt: llama.cpp (llama-bench's decode of TOKENS after CONTEXT cached "
                        "positions, the better of flash attention off and on in each round) and openvino "
                        "(OpenVINO's int4 LLM path, below: the same decode). With --prompt: "
                        "llama.cpp (its prompt processing), openvino (OpenVINO's int4 LLM path: the same shapes "
                        "exported with optimum-intel, NNCF int4 symmetric group 32, run in a process of its own; the "
                        "[openvino-llm] extra, exported once to ~/.cache/tvm_ext/openvino or "
                        "$TVM_EXT_OPENVINO_CACHE) and ort (ONNX Runtime's "
                        "MatMulNBits, accuracy_level 4, on each projection's shape beside our GEMMs). "
                        "llama-bench is built from the llama-cpp-python sdist on first use (~6 minutes on 2 "
                        "cores, cached in ~/.cache/tvm_ext/llama_cpp or $TVM_EXT_LLAMA_CPP_CACHE) and runs a "
                        "Phi-2-shaped Q4_0 GGUF with random weights")
    p.add_argument("--rounds", type=count, default=3,
                   help="timing rounds, the rows interleaved in each (a shared host's bandwidth drifts by the "
                        "minute); a row's tok/s is its median round's (default 3; with --prompt: prefill "
                        "repeats per row)")
    p.add_argument("--threads", type=count, default=None,
                   help="TVM worker threads (default: the physical cores; TVM's own default on x86 is half the "
                        "logical CPUs, 1 on a 2-vCPU VM)")
    p.add_argument("--target", default="llvm",
                   help="llvm (default: this host's CPU) or cuda / cuda-sm80 / cuda-sm90: on a GPU the whole step is "
                        "one Relax function in fp16 (q4f16_1) replayed as one CUDA graph; --schedule takes dlight and "
                        "rule (our CUDA rules for the projections and the attention's value product; default both), "
                        "--peers takes torch (transformers' Phi-2 in fp16 with a static cache under a CUDA graph, "
                        "once per round after our rows)")
    p.add_argument("--build-only", action="store_true",
                   help="with a GPU --target: build the step for each --schedule row and compile its kernels with "
                        "nvcc, no GPU needed; prints which rule scheduled each kernel and the CUDA graph regions")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and the past (default 0)")
    add_model_arguments(p)  # --model, --prompt-text, --weights: a user's checkpoint (generate_text)
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--out", metavar="FILE", help="also write the JSON result to FILE")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def run(args) -> int:
    import json

    from tvm_ext.bench.phi2.decode import decode_e2e_rows
    from tvm_ext.cli.common import check_out_dir, contexts, log, target_of
    from tvm_ext.cli.generate_prompt import int8_database, run_prompt
    from tvm_ext.jsonio import write_json
    from tvm_ext.rulesets import check_schedules

    from tvm_ext.schedule_rule import is_gpu
    from tvm_ext.workloads.phi2.model import check_config

    if args.prefill_attention != "fused" and not args.prompt:
        raise ValueError("--prefill-attention is the prompt's: add --prompt N")
    kv = kv_caches(args)
    if kv != ["float32"] and (args.model is not None or args.prompt or args.target != "llvm"):
        raise ValueError("--kv-cache float16 / int8 is the CPU decode benchmark's for now (not with --prompt, --model "
                         "or a GPU --target)")
    if args.model is not None:  # a user's checkpoint: text in, text out
        from tvm_ext.cli.generate_text import run_model

        return run_model(args)
    if args.prompt_text is not None:
        raise ValueError("--prompt-text needs --model PATH (a checkpoint with a tokenizer)")
    if is_gpu(target_of(args)):  # the one resolution of --target: a Target below
        return run_gpu(args)
    if args.target != "llvm":
        raise ValueError(f"--target {args.target}: the CPU decode runs on this host's CPU (llvm) or a GPU (cuda)")
    if args.build_only:
        raise ValueError("--build-only is for a GPU --target (cuda): on this CPU generate just runs")
    if args.prompt:
        return run_prompt(args)
    peers = list(dict.fromkeys(p.strip() for p in args.peers.split(",") if p.strip()))
    if any(p not in DECODE_PEERS for p in peers):
        raise ValueError(f"without --prompt, --peers takes {' and '.join(DECODE_PEERS)} (their decode), "
                         f"not {args.peers!r}")
    if "openvino" in peers:
        from tvm_ext.bench.phi2.openvino_llm import check_installed

        check_installed()
    schedules = check_schedules(args.schedule or ("tuned" if args.tune else "dlight"))
    if args.tune and "tuned" not in schedules:
        raise ValueError("--tune fills the database of --schedule tuned: add tuned to --schedule")
    past = contexts(args.context, 512, many=True)
    for context in past:  # every context fits, before the first run
        check_config(args.config, args.layers or 1, context + args.tokens)
    check_out_dir(args.out)
    quiet = (lambda msg: None) if args.quiet else log
    prepared = {p: _prepare(p, args, quiet) for p in peers}  # built, written or exported once, for every context
    database, target = int8_database(args), target_of(args)
    rows, tables = [], []
    for context in past:  # one run per context, its peers' rounds among ours
        timed = {p: _decode_peer(p, prepared[p], args, context, quiet) for p in peers}
        got = decode_e2e_rows(schedules, config=args.config, layers=args.layers, tokens=args.tokens,
                              context=context, threads=args.threads, seed=args.seed,
                              database=database, tune_trials=args.tune if not rows else None,
                              rounds=args.rounds, peer={p: call for p, (call, _) in timed.items()} or None,
                              log=quiet, target=target, kv_dtypes=kv)
        if timed:  # the peers' rows, filled round by round, are their records' rows
            for r in got:
                r["peers"] = [record for _, record in timed.values()]
        rows += got
        tables.append(format_table(got))
    doc = rows[0] if len(rows) == 1 else rows
    if args.out:
        write_json(args.out, doc)
    print(json.dumps(doc) if args.json else "\n\n".join(tables))
    return 0


DECODE_PEERS = ("llama.cpp", "openvino")


def _prepare(name: str, args, log) -> dict:
    """A peer of the same model shape as our rows (--config, --layers): llama-bench and the Q4_0 GGUF, or
    OpenVINO's int4 export."""
    from tvm_ext.cli.generate_prompt import peer_module
    from tvm_ext.workloads.phi2.model import DEFAULT_LAYERS

    layers = args.layers or DEFAULT_LAYERS[args.config]
    return peer_module(name).prepare_peer(log=log, config=args.config, layers=layers)


def _decode_peer(name: str, prepared: dict, args, context: int, log):
    """(a call timing the peer's decode of --tokens after ``context`` positions, same threads, returning its
    tok/s; the record that collects its rows)."""
    from tvm_ext.bench.phi2 import llama_cpp as lc
    from tvm_ext.bench.phi2 import openvino_llm as ovl
    from tvm_ext.targets import physical_cores

    work = dict(prompts=(), threads=args.threads or physical_cores(), repetitions=1, decode=(args.tokens, context))
    peer_rows = []
    if name == "openvino":
        command = f"{ovl.WORKER.name} run --decode {args.tokens},{context} --threads {work['threads']}"
        record = ovl.peer_record(prepared, peer_rows, command)

        def peer():
            peer_rows.extend(ovl.run_peer(prepared, log=log, **work))
            record.update(ovl.peer_record(prepared, peer_rows, command))  # with what the run read off OpenVINO
            return peer_rows[-1]["tok_s"]

        return peer, record

    work["flash"] = (0, 1)  # its best of flash attention off and on: on was the slower at long contexts on Zen 4

    def peer():
        rows = lc.run_llama_bench(prepared["bench"], prepared["gguf"], log=log, **work)
        peer_rows.extend(rows)
        return max(r["tok_s"] for r in rows)

    return peer, lc.peer_record(prepared, lc.bench_command(prepared["bench"], prepared["gguf"], **work), peer_rows)


def kv_caches(args) -> list:
    """The --kv-cache list, float32 unless given (float16 was not faster in every run: docs/journal.md); one
    clear line for a bad one."""
    from tvm_ext.workloads.phi2.kv_cache import KV_DTYPES

    names = list(dict.fromkeys(k.strip() for k in (args.kv_cache or "float32").split(",") if k.strip()))
    if not names or any(k not in KV_DTYPES for k in names):
        raise ValueError(f"--kv-cache takes {', '.join(KV_DTYPES)} (comma-separated), not {args.kv_cache!r}")
    return names


def run_gpu(args) -> int:
    """``generate --target cuda``: ``bench.phi2.decode_gpu`` (rows dlight and rule, the torch peer)."""
    import json

    from tvm_ext.bench.phi2.decode_gpu import build_only, decode_gpu_rows
    from tvm_ext.cli.common import check_out_dir, contexts, log, target_of
    from tvm_ext.jsonio import write_json
    from tvm_ext.rulesets import GPU_SCHEDULES, check_schedules

    if args.prompt or args.tune:
        raise ValueError("on a GPU generate decodes only: no --prompt or --tune yet")
    schedules = check_schedules(args.schedule or GPU_SCHEDULES, GPU_SCHEDULES, "on a GPU")  # before the peer's model
    (context,) = contexts(args.context, 512)
    quiet = (lambda msg: None) if args.quiet else log
    if args.build_only:
        built = build_only(target_of(args), config=args.config, capacity=context + args.tokens, schedules=schedules,
                           log=quiet)
        print(json.dumps(built) if args.json else "\n".join(
            f"{how}: " + ", ".join(f"{k} {r}" for k, r in sorted(b["rules"].items()))
            + f"; {b['cuda_graph_regions']} CUDA graph region(s)" for how, b in built.items()))
        return 0
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    if any(p != "torch" for p in peers):
        raise ValueError(f"on a GPU --peers takes torch, not {args.peers!r}")
    check_out_dir(args.out)
    peer, info = None, {}
    if peers:
        from tvm_ext.bench.torch_peers import phi2_decode, time_calls

        try:  # at the middle of our rows' positions; a peer that fails here leaves our rows to run alone
            step, info = phi2_decode(context + args.tokens // 2, device="cuda", config=args.config)
            peer = lambda: 1.0 / time_calls(step, calls=args.tokens, rounds=1)  # noqa: E731
            quiet(f"peer torch: {info['model']}, CUDA graph: {info['cuda_graph']}")
        except ValueError:
            raise  # PyTorch or transformers missing: one clear line
        except Exception as err:  # noqa: BLE001 -- the peer's own failure on this machine
            quiet(f"peer torch left out: {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}")
    rows = decode_gpu_rows(schedules, config=args.config, layers=args.layers, tokens=args.tokens, context=context,
                           target=target_of(args), seed=args.seed, rounds=args.rounds, peer=peer, log=quiet)
    if peers:
        for r in rows:
            r["peer"] = info
    doc = rows[0] if len(rows) == 1 else rows
    if args.out:
        write_json(args.out, doc)
    if args.json:
        print(json.dumps(doc))
    else:
        d = rows[0]
        print(f"phi2 decode on {d['device']}, {d['config']}: {d['layers']} layers, {d['tokens']} tokens after "
              f"{d['context']} positions, {d['dtype']}, CUDA graph: {d['cuda_graph']}; bound {d['bound_tok_s']:.0f} "
              f"tok/s ({(d['weight_bytes'] + d['kv_bytes']) / 1e6:.0f} MB a token at {d['bandwidth_gbs']:.0f} GB/s)")
        for r in rows:
            extra = f", {r['vs_peer']:.2f}x torch" if "vs_peer" in r else ""
            same = (f", {100 * r['vs_first']['same_tokens']:.0f}% of {r['vs_first']['schedule']}'s tokens"
                    if "vs_first" in r else "")
            print(f"  {r['schedule']:8s} {r['tok_s']:9.1f} tok/s  {100 * r['of_bound']:5.1f}% of bound{extra}{same}")
    return 0


def format_table(rows) -> str:
    """One column per schedule: tokens/s, the bound, % of it; then the kernels (``kernel_table``)."""
    import numpy as np

    from tvm_ext.cli.table import fmt, render

    d = rows[0]
    caches = {r.get("kv_cache", "float32") for r in rows}
    name = (lambda r: r["schedule"]) if len(caches) == 1 else (lambda r: f"{r['schedule']} kv {r['kv_cache']}")
    per_token = ("" if len(caches) > 1 else f"{(d['weight_bytes'] + d['kv_bytes']) / 1e6:.1f} MB per token "
                 f"({d.get('kv_cache', 'float32')} KV cache), ")
    head = (f"phi2 decode, {d['config']}: {d['layers']} layers, {d['tokens']} tokens after {d['context']} past "
            f"positions, {d['threads']} threads, {d['device']}; {per_token}bandwidth {d['bandwidth_gbs']:.1f} GB/s")
    by_cache = [["MB per token (KV)"] + [f"{(r['weight_bytes'] + r['kv_bytes']) / 1e6:.1f} "
                                         f"({r['kv_bytes'] / 1e6:.1f})" for r in rows]] if len(caches) > 1 else []
    table = render([""] + [name(r) for r in rows], by_cache + [
        ["tokens/s"] + [f"{r['tok_s']:.2f}" for r in rows],
        ["bound tokens/s"] + [f"{r['bound_tok_s']:.2f}" for r in rows],
        ["% of bound"] + [f"{100 * r['tok_s'] / r['bound_tok_s']:.1f}" for r in rows],
        ["% of its round's bound"] + [fmt(100 * r["of_bound"] if "of_bound" in r else None, ".1f") for r in rows],
        ["rounds' tok/s"] + [" ".join(f"{t:.1f}" for t in r.get("tok_s_rounds", [])) for r in rows]])
    lines = [head, table]
    for peer in d.get("peers", []):
        rates = d["peers_tok_s_rounds"][peer["peer"]]  # what each round's call returned (llama.cpp: its best)
        flash = sorted({str(r["flash_attn"]) for r in peer["rows"] if r.get("flash_attn") is not None})
        what = (f"Q4_0, commit {peer['commit'][:7]}" + (", best of flash attention " + "/".join(flash)
                                                          if len(flash) > 1 else "") if peer["peer"] == "llama.cpp"
                else f"int4, OpenVINO {peer.get('versions', {}).get('openvino', '?')}")
        ratio = lambda r: r.get("vs_peers", {}).get(peer["peer"])  # noqa: E731
        lines.append(f"{peer['peer']} ({what}, once per round after our rows): "
                     f"{float(np.median(rates)):.2f} tok/s after {d['context']} positions (rounds: "
                     + " ".join(f"{t:.1f}" for t in rates) + "); each row's median ratio to it in the same round: "
                     + ", ".join(f"{name(r)} {ratio(r):.2f}x" for r in rows if ratio(r) is not None)
                     + (f"; {peer['summary']}" if peer.get("summary") else ""))
    for r in rows:
        for other, cmp in r.get("vs_float", {}).items():
            lines.append(f"{name(r)} vs {other}: {100 * cmp['same_tokens']:.0f}% same tokens, first-step "
                         f"logits differ by up to {cmp['max_abs_logit_err']:.3g} (|logits| up to "
                         f"{cmp['max_abs_logit']:.3g})")
        if "vs_float32_cache" in r:
            cmp = r["vs_float32_cache"]
            lines.append(f"{name(r)} vs its float32 cache: {100 * cmp['same_tokens']:.0f}% same tokens, logits differ "
                         f"by up to {cmp['max_abs_logit_err_steps']:.3g} over the {cmp['steps_compared']} steps "
                         f"before the first other token (|logits| up to {cmp['max_abs_logit']:.3g})")
    lines += ["", "kernels inside the running step (one instrumented step per round, medians): ms per step "
              "(all layers), x = that time over the kernel's bytes at its round's copy bandwidth",
              kernel_table(rows, name)]
    return "\n".join(lines)


def kernel_table(rows, name=lambda r: r["schedule"]) -> str:
    """One line per kernel (joined by label across the rows: qkv is one line for the float and int8
    models), largest share of the last row first: each row's ms, share and x its bound."""
    from tvm_ext.cli.table import fmt, render

    by_row = [{k["label"]: k for k in r["kernels"]} for r in rows]
    order = [k["label"] for k in rows[-1]["kernels"]]
    order += list(dict.fromkeys(label for kernels in by_row for label in kernels if label not in order))
    lines = []
    for label in order:
        line = [label]
        for kernels in by_row:
            k = kernels.get(label)
            line += [fmt(k and k["ms"], ".3f"), fmt(k and 100 * k["share"], ".1f"), fmt(k and k.get("x_bound"), ".2f")]
        lines.append(line)
    head = ["kernel"] + [c for r in rows for c in (f"{name(r)} ms", "%", "x")]
    return render(head, lines, "<" + ">" * (len(head) - 1))

