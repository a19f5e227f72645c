"""The OpenVINO side of the ``openvino`` Phi-2 peer, run as a script in its own process (``openvino_llm.py``
starts it): it imports OpenVINO (and, to export, optimum-intel with torch) and nothing of tvm_ext or TVM, so the
peer's threads start from a clean process (no TVM thread pool or CPU affinity beside them) and its memory is
returned when it ends.

``export``: a random-weight ``PhiForCausalLM`` of the given shapes (float16) through optimum-intel's OpenVINO
export with NNCF's data-free int4 weight compression (symmetric, group 32, every layer, embedding and lm_head too)
into a directory, written beside it and renamed at the end (an interruption leaves no half model).

``run``: the exported stateful model (the KV cache is OpenVINO's internal state) on the CPU plugin with the given
threads, latency hint, one stream, everything else OpenVINO's default (its KV cache precision, its dynamic int8
quantization of activations): prompt processing of N random tokens from an empty cache, and the decode of T
tokens after C cached positions (one untimed step between: the first one-token step's allocations, as
llama-bench's warm-up). The logits are computed for the last token only, as OpenVINO GenAI's pipeline
does (a slice before lm_head): the exported graph computes them for every prompt token. One JSON line on stdout.
"""
import argparse
import json
import os
import shutil
import sys
import time

import numpy as np


def export(hf_config: dict, out: str, seed: int, compression: dict) -> dict:
    import torch
    from optimum.intel import OVModelForCausalLM, OVWeightQuantizationConfig
    from transformers import PhiConfig, PhiForCausalLM

    tmp = out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.time()
    torch.manual_seed(seed)
    torch.set_default_dtype(torch.float16)  # a full-size model is built in half the memory
    PhiForCausalLM(PhiConfig(**hf_config)).save_pretrained(tmp + "/hf")
    model = OVModelForCausalLM.from_pretrained(tmp + "/hf", export=True, compile=False,
                                               quantization_config=OVWeightQuantizationConfig(**compression))
    model.save_pretrained(tmp + "/ov")
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.replace(tmp + "/ov", out)
    shutil.rmtree(tmp, ignore_errors=True)
    return {"export_s": time.time() - t0}


def _last_token_logits(model) -> None:
    """A slice of the last position before the lm_head MatMul (the one the logits Result is computed from)."""
    from openvino import opset13 as ops

    node = model.get_results()[0].input_value(0).get_node()
    while node.get_type_name() != "MatMul":
        if node.get_input_size() == 0:
            raise ValueError("no MatMul before the logits output: not an exported causal LM")
        node = node.input_value(0).get_node()
    one = lambda v: np.array([v], np.int64)  # noqa: E731
    last = ops.slice(node.input_value(0), one(-1), one(np.iinfo(np.int64).max), one(1), one(1))
    node.input(0).replace_source_output(last.output(0))
    model.validate_nodes_and_infer_types()


PROPERTIES = ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "DYNAMIC_QUANTIZATION_GROUP_SIZE",
              "INFERENCE_NUM_THREADS", "PERFORMANCE_HINT", "NUM_STREAMS")


def run(model_dir: str, threads: int, prompts, repetitions: int, decode, vocab: int, seed: int) -> dict:
    import openvino as ov

    core = ov.Core()
    model = core.read_model(os.path.join(model_dir, "openvino_model.xml"))
    weights = {}  # elements of the model's constants by element type: the compression as it is in the graph
    for op in model.get_ordered_ops():
        if op.get_type_name() == "Constant":
            kind = op.get_element_type().to_string()
            weights[kind] = weights.get(kind, 0) + int(np.prod(list(op.get_output_shape(0)), dtype=np.int64))
    _last_token_logits(model)
    t0 = time.time()
    compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                                                 "NUM_STREAMS": "1"})
    props = {}
    for p in PROPERTIES:
        try:
            value = compiled.get_property(p)
            props[p] = value.to_string() if isinstance(value, ov.Type) else str(value)
        except Exception:  # noqa: BLE001 - a property this OpenVINO does not have
            props[p] = None
    request = compiled.create_infer_request()
    rng = np.random.default_rng(seed)

    def infer(ids, start):
        n = len(ids)
        request.infer({"input_ids": np.asarray([ids], np.int64), "attention_mask": np.ones((1, start + n), np.int64),
                       "position_ids": np.arange(start, start + n, dtype=np.int64)[None],
                       "beam_idx": np.zeros(1, np.int32)})
        return request.get_tensor("logits").data

    rows = []
    infer(rng.integers(vocab, size=8), 0)  # first-run allocations
    for n in prompts:
        ids, samples = rng.integers(vocab, size=n), []
        for _ in range(repetitions + 1):  # the first is a warm-up, as llama-bench's
            request.reset_state()
            t = time.perf_counter()
            infer(ids, 0)
            samples.append(n / (time.perf_counter() - t))
        rows.append({"n_prompt": n, "n_gen": 0, "n_depth": 0, "tok_s": float(np.mean(samples[1:])),
                     "tok_s_std": float(np.std(samples[1:])), "tok_s_samples": samples[1:], "threads": threads})
    if decode:
        tokens, context = decode
        request.reset_state()
        if context:
            infer(rng.integers(vocab, size=context), 0)
        infer([int(rng.integers(vocab))], context)  # untimed: the first one-token step's allocations
        t = time.perf_counter()
        for i in range(tokens):
            logits = infer([int(rng.integers(vocab))], context + 1 + i)
        rate = tokens / (time.perf_counter() - t)
        if logits.shape[1] != 1:
            raise ValueError(f"logits of {logits.shape[1]} positions, expected the last one")
        rows.append({"n_prompt": 0, "n_gen": tokens, "n_depth": context, "tok_s": rate, "tok_s_std": 0.0,
                     "tok_s_samples": [rate], "threads": threads})
    return {"openvino": ov.get_version(), "properties": props, "weight_elements": weights,
            "compile_s": time.time() - t0, "rows": rows}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    e = sub.add_parser("export")
    e.add_argument("--hf-config", required=True, help="PhiConfig keys, JSON")
    e.add_argument("--compression", required=True, help="OVWeightQuantizationConfig keys, JSON")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("out")
    r = sub.add_parser("run")
    r.add_argument("model")
    r.add_argument("--threads", type=int, required=True)
    r.add_argument("--prompts", default="", help="comma-separated prompt lengths")
    r.add_argument("--repetitions", type=int, default=3)
    r.add_argument("--decode", default=None, help="TOKENS,CONTEXT")
    r.add_argument("--vocab", type=int, required=True)
    r.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        if args.what == "export":
            out = export(json.loads(args.hf_config), args.out, args.seed, json.loads(args.compression))
        else:
            out = run(args.model, args.threads, [int(n) for n in args.prompts.split(",") if n], args.repetitions,
                      tuple(int(v) for v in args.decode.split(",")) if args.decode else None, args.vocab, args.seed)
    except (ValueError, RuntimeError, OSError) as err:  # one line for the caller to report
        print(json.dumps({"error": f"{type(err).__name__}: {str(err).strip().splitlines()[-1]}"}))
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
