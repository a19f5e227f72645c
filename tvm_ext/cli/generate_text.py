"""``tvm-ext generate --model PATH --prompt-text TEXT``: a user's Phi-2 checkpoint (Hugging Face, MLC or GGUF;
``tvm_ext.workloads.phi2.load``) continues a text, streamed token by token, then prompt and decode tok/s."""
from __future__ import annotations

import sys
import time


def add_arguments(p) -> None:
    p.add_argument("--model", metavar="PATH", default=None,
                   help="a Phi-2 checkpoint instead of random weights: a Hugging Face directory (config.json + "
                        "*.safetensors of PhiForCausalLM, F32/F16/BF16), an MLC directory (ndarray-cache.json, "
                        "q4f16_1) or a GGUF file (phi2; Q4_0 exact, Q8_0/F16/F32/K-quants through float); with "
                        "--prompt-text prints its continuation as it is generated, then prompt and decode tok/s. "
                        "Needs pip install 'tvm_ext[models]'")
    p.add_argument("--prompt-text", metavar="TEXT", default=None,
                   help="with --model: the prompt, tokenized by the checkpoint's tokenizer.json or GGUF vocabulary")
    p.add_argument("--weights", choices=("q4", "float"), default="q4",
                   help="with --model: q4 (q4f16_1; float checkpoints quantized on load as MLC does, group 32, "
                        "default) or float (kept float, computed in float32; q4 checkpoints dequantized)")
    p.add_argument("--vs-random", action="store_true",
                   help="with --model: then decode the same prompt ids with the random-weight benchmark model of the "
                        "same shape (config full where the checkpoint is Phi-2-shaped, else random q4 weights in its "
                        "architecture), same KV capacity and schedule, the two interleaved --rounds times: both "
                        "models' prompt and decode tok/s and their ratios (medians of the rounds)")


def run_model(args) -> int:
    """The ``--model`` branch of ``generate``."""
    import json
    import resource

    from tvm_ext.bench.timing import set_threads
    from tvm_ext.cli.common import check_out_dir, log
    from tvm_ext.jsonio import write_json
    from tvm_ext.rulesets import MODEL_SCHEDULES, check_schedules
    from tvm_ext.targets import describe_host, physical_cores
    from tvm_ext.workloads.phi2 import load

    if args.prompt_text is None:
        raise ValueError("--model generates from --prompt-text TEXT (--prompt N is the random-weight benchmark's)")
    if args.prompt or args.peers or args.tune or args.context:
        raise ValueError("with --model, generate takes --prompt-text, --tokens, --weights, --layers, --schedule, "
                         "--threads (not --prompt, --context, --peers or --tune: those are the benchmark's)")
    if args.target != "llvm" or args.build_only:
        raise ValueError("--model runs on this host's CPU (--target llvm) for now; on a GPU generate benchmarks "
                         "random weights")
    how = args.schedule or "dlight"
    check_schedules((how,), MODEL_SCHEDULES, "with --model")
    check_out_dir(args.out)
    quiet = (lambda msg: None) if args.quiet else log
    threads = int(args.threads or physical_cores())
    set_threads(threads)
    t0 = time.perf_counter()
    ckpt = load(args.model, weights=args.weights, layers=args.layers)
    if ckpt.tokenizer is None:
        raise ValueError(f"{args.model} has no tokenizer (no tokenizer.json beside it, no vocabulary in the GGUF): "
                         f"--prompt-text needs one")
    prompt = ckpt.tokenizer.encode(args.prompt_text)
    capacity = len(prompt) + args.tokens
    if capacity > ckpt.cfg["max_positions"]:
        raise ValueError(f"context overflow: {len(prompt)} prompt tokens + {args.tokens} exceed the model's "
                         f"{ckpt.cfg['max_positions']} positions")
    quiet(f"{ckpt.kind} checkpoint {ckpt.path}: {ckpt.layers} layers, hidden {ckpt.cfg['hidden']}, vocab "
          f"{ckpt.cfg['vocab']}, stored {ckpt.stored}, kept {ckpt.cfg['weights']}; {len(prompt)} prompt tokens")
    gen = ckpt.generator(capacity=capacity, schedule=how, log=quiet)
    load_s = time.perf_counter() - t0
    stream = not args.json
    if stream:
        sys.stdout.write(args.prompt_text)
        sys.stdout.flush()

    def piece(text):
        if stream:
            sys.stdout.write(text)
            sys.stdout.flush()

    out = gen.generate(prompt, args.tokens, on_text=piece)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before a --vs-random model is built
    vs_random = compare_random(gen, prompt, args.tokens, args.rounds, how, quiet) if args.vs_random else None
    host = describe_host()
    doc = {"model": ckpt.path, "format": ckpt.kind, "stored": ckpt.stored, "weights": ckpt.cfg["weights"],
           "layers": ckpt.layers, "schedule": how, "threads": threads, "prompt_text": args.prompt_text,
           "prompt_ids": out.prompt_ids, "generated": out.ids, "text": out.text,
           "prompt_tokens": len(out.prompt_ids), "prompt_tok_s": out.prompt_tok_s, "tokens": len(out.ids),
           "decode_tok_s": out.decode_tok_s, "load_s": load_s,
           "peak_rss_mb": peak_mb, "weight_mb": held_bytes(gen.decoder) / 2**20,
           "device": f"{host.get('cpu_name', 'cpu')} (llvm {host.get('mcpu', '?')})", "vs_random": vs_random}
    if args.out:
        write_json(args.out, doc)
    if args.json:
        print(json.dumps(doc))
    else:
        print(f"\n\nprompt: {doc['prompt_tokens']} tokens at {out.prompt_tok_s:.2f} tok/s (token by token); decode: "
              f"{doc['tokens']} tokens at {out.decode_tok_s:.2f} tok/s; load + build {load_s:.1f} s, peak RSS "
              f"{doc['peak_rss_mb']:.0f} MB ({doc['weight_mb']:.0f} MB of weights kept); {threads} threads, "
              f"{doc['device']}")
        if vs_random:
            v = vs_random
            print(f"vs the random-weight model ({v['config']}, same capacity and schedule), {len(v['rounds'])} "
                  f"rounds interleaved: decode {v['decode_tok_s']:.2f} vs {v['random_decode_tok_s']:.2f} tok/s "
                  f"({v['decode_ratio']:.3f}x), prompt {v['prompt_tok_s']:.2f} vs {v['random_prompt_tok_s']:.2f} "
                  f"tok/s ({v['prompt_ratio']:.3f}x)")
    return 0


def held_bytes(dec) -> int:
    """Bytes of the weights a decoder holds on its device (layers, head, embedding table; in the layouts
    uploaded)."""
    import numpy as np

    arrays = [a for w in dec.layer_w for a in w] + list(dec.head_w) + list(dec.table)
    return int(sum(np.prod(a.shape) * np.dtype(str(a.dtype)).itemsize for a in arrays))


def compare_random(gen, prompt, tokens, rounds, how, log) -> dict:
    """The checkpoint's decoder and the random-weight benchmark model of the same shape, same capacity and
    schedule, each generating from ``prompt`` once untimed, then once per round, interleaved in
    alternating order: medians of their tok/s and of the rounds' ratios (checkpoint over random)."""
    import numpy as np

    from tvm_ext.workloads.phi2.compiled import decoder
    from tvm_ext.workloads.phi2.layers import CONFIGS
    from tvm_ext.workloads.phi2.model import build_model
    from tvm_ext.workloads.phi2.text import timed_generate

    cfg = gen.model.cfg
    config = next((name for name, c in CONFIGS.items() if all(cfg[k] == v for k, v in c.items())), None)
    random = decoder(build_model(config or dict(cfg, weights="q4", name="random"), gen.model.layers,
                                 capacity=gen.model.capacity), "llvm", how, log=log)
    decoders, names = (gen.decoder, random), ("checkpoint", "random")
    for d in decoders:  # untimed: the first steps after an upload ran slower (181 vs 142-147 ms
        # a step, 32 layers, in one check on an idle host)
        timed_generate(d, prompt, min(tokens, 8))
    runs = []
    for r in range(rounds):  # the order alternates: a drift during the run favours neither
        order = (0, 1) if r % 2 == 0 else (1, 0)
        log(f"round {r + 1}/{rounds}: " + ", ".join(names[i] for i in order))
        got = {i: timed_generate(decoders[i], prompt, tokens) for i in order}
        runs.append([got[0], got[1]])
    med = lambda xs: float(np.median(xs))  # noqa: E731
    return {"config": config or "random weights in the checkpoint's architecture",
            "rounds": [{"decode_tok_s": [a.decode_tok_s, b.decode_tok_s], "prompt_tok_s": [a.prompt_tok_s,
                                                                                           b.prompt_tok_s]}
                       for a, b in runs],
            "decode_tok_s": med([a.decode_tok_s for a, _ in runs]),
            "random_decode_tok_s": med([b.decode_tok_s for _, b in runs]),
            "prompt_tok_s": med([a.prompt_tok_s for a, _ in runs]),
            "random_prompt_tok_s": med([b.prompt_tok_s for _, b in runs]),
            "decode_ratio": med([a.decode_tok_s / b.decode_tok_s for a, b in runs]),
            "prompt_ratio": med([a.prompt_tok_s / b.prompt_tok_s for a, b in runs])}
