"""``tvm-ext generate --prompt N``: whole-model Phi-2 prompt processing, its table and JSON."""
from __future__ import annotations

import os

INT8_DATABASE = "tvm_ext_work/phi2-int8-llvm"  # where --tune writes (git-ignored)
SAVED_INT8_DATABASE = "tuning_logs/phi2-int8-llvm"  # what tvm-ext save kept (the prompt's and decode's kernels)
PEERS = ("llama.cpp", "ort", "openvino")


def peer_module(name: str):
    """The module of a whole-model peer (llama.cpp, openvino): prepare_peer, prefill_peer, peer_record."""
    from tvm_ext.bench.phi2 import llama_cpp, openvino_llm

    return {"llama.cpp": llama_cpp, "openvino": openvino_llm}[name]


def int8_database(args) -> str:
    """--database, else the work dir when tuning or when nothing is saved, else the saved one."""
    if args.database:
        return args.database
    return INT8_DATABASE if args.tune or not os.path.isdir(SAVED_INT8_DATABASE) else SAVED_INT8_DATABASE


def run_prompt(args, note: str | None = None) -> int:
    """``generate --prompt N`` (also ``bench phi2-prefill`` on the CPU, which passes its ``note``)."""
    import json

    from tvm_ext.bench.phi2.prompt import prompt_rows
    from tvm_ext.cli.common import check_out_dir, contexts, log, target_of
    from tvm_ext.jsonio import write_json
    from tvm_ext.rulesets import PROMPT_SCHEDULES, check_schedules

    if args.prompt % 2:
        raise ValueError(f"--prompt must be even (the GEMM's token tiles are 2, 4 or 8 tokens), not {args.prompt}")
    schedules = check_schedules(args.schedule or PROMPT_SCHEDULES, PROMPT_SCHEDULES, "with --prompt")
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for p in peers:
        if p not in PEERS:
            raise ValueError(f"unknown peer {p!r}; known: {', '.join(PEERS)}")
    if "openvino" in peers:  # before the run, not after our rows
        from tvm_ext.bench.phi2.openvino_llm import check_installed

        check_installed()
    (context,) = contexts(args.context, 0)
    database = int8_database(args)
    check_out_dir(args.out)
    quiet = (lambda msg: None) if args.quiet else log
    out = prompt_rows(schedules, config=args.config, layers=args.layers, prompt=args.prompt, tokens=args.tokens,
                      context=context, threads=args.threads, log=quiet, seed=args.seed, database=database,
                      tune_trials=args.tune, ort="ort" in peers, repeat=args.rounds, target=target_of(args),
                      prefill_attention=args.prefill_attention)
    out["database"] = database if "tuned" in schedules else None
    if note:
        out["note"] = note
    for name in (p for p in peers if p != "ort"):  # the whole-model peers, each in a process of its own
        out.setdefault("peers", []).append(peer_module(name).prefill_peer(
            prompts=(args.prompt,), threads=out["threads"], log=quiet, config=out["config"], layers=out["layers"]))
    if args.out:
        write_json(args.out, out)
    print(json.dumps(out) if args.json else format_prompt_table(out))
    return 0


def format_prompt_table(d, top: int = 6) -> str:
    from tvm_ext.cli.table import fmt, render

    host = d["device"]
    rows = d["rows"]
    head = (f"phi2 prompt processing, {d['config']}: {d['layers']} layers, {d['prompt']} prompt tokens after "
            f"{d['context']} past positions, then {d['tokens']} decoded, attention "
            f"{d.get('prefill_attention', 'unfused')}; {d['threads']} threads, "
            f"{host.get('cpu_name', 'cpu')} (llvm {host.get('mcpu', '?')})")
    peer_rows = [(p["peer"], r) for p in d.get("peers", []) for r in p["rows"] if r["n_prompt"] == d["prompt"]]
    best = max(r["tok_s"] for r in rows)
    lines = [head, render([""] + [r["schedule"] for r in rows] + [p for p, _ in peer_rows], [
        ["prompt tok/s (fastest)"] + [f"{r['tok_s']:.1f}" for r in rows]
        + [f"{max(r.get('tok_s_samples') or [r['tok_s']]):.1f}" for _, r in peer_rows],
        ["first token after (s)"] + [f"{r['ttft_s']:.2f}" for r in rows] + ["" for _ in peer_rows],
        ["decode tok/s after"] + [fmt(r["decode_tok_s"], ".2f") for r in rows] + ["" for _ in peer_rows],
        ["first token = float path's"] + [_yes(r.get("vs_float", {}).get("first_token_same")) for r in rows]
        + ["" for _ in peer_rows]])]
    for name, r in peer_rows:  # best repeat against best sample: our rows' tok/s is their fastest repeat's
        peer_best = max(r.get("tok_s_samples") or [r["tok_s"]])
        lines.append(f"best tvm_ext row vs {name}: {best / peer_best:.2f}x its prompt tok/s (fastest repeat of each, "
                     f"same run; {best / r['tok_s']:.2f}x its mean)")
    lines += [f"{p['peer']}: {p['summary']}" for p in d.get("peers", []) if p.get("summary")]
    from tvm_ext.report.results import int8_peak_tops, peak_instructions

    peak = int8_peak_tops(d)
    if peak:
        what = peak_instructions(d)
        lines.append(f"host int8 peak ({what}, {d['threads']} threads, registers only): {peak:.2f} TOPS")
    for r in rows:
        if r.get("gemm_tops"):
            parts = ", ".join(f"{n} {t:.2f}" for n, t in sorted(r["gemm_tops"].items()))
            tops = r["gemm_tops"].values()
            share = f" ({100 * min(tops) / peak:.0f}-{100 * max(tops) / peak:.0f}% of the peak)" if peak else ""
            lines.append(f"{r['schedule']} GEMMs, int8 TOPS: {parts}{share}")
        if r.get("gemm_vs_ort"):
            lines.append(f"{r['schedule']} GEMMs vs ORT MatMulNBits (accuracy_level 4), time ratio: " + ", ".join(
                f"{p} {v:.2f}" for p, v in r["gemm_vs_ort"].items()))
        cmp = r.get("vs_float")
        if cmp:
            lines.append(f"{r['schedule']} vs the float path: {100 * cmp['same_tokens']:.0f}% same tokens, first "
                         f"logits differ by up to {cmp['max_abs_logit_err']:.3g} "
                         f"(|logits| up to {cmp['max_abs_logit']:.3g})")
    for r in rows:
        total = sum(r["kernel_s"].values()) or 1.0
        top_k = sorted(r["kernel_s"].items(), key=lambda kv: -kv[1])[:top]
        lines += ["", f"{r['schedule']}: kernels by share of one prefill",
                  render(["kernel", "schedule", "%"], [[n, r["rules"].get(n, ""), f"{100 * t / total:.1f}"]
                                                       for n, t in top_k], "<<>")]
    if d.get("note"):
        lines.append(f"note: {d['note']}")
    return "\n".join(lines)


def _yes(v) -> str:
    return "" if v is None else ("yes" if v else "NO")

