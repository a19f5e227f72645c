"""OpenVINO's int4 LLM path as a CPU peer of the Phi-2 prompt processing and decode (``--peers openvino``).

What a user would pick instead of us on an Intel-supported CPU: the model exported with optimum-intel, its weights
compressed by NNCF to int4 (symmetric, group 32, data-free; ``COMPRESSION``: every layer, the embedding and
lm_head too, so the peer reads the bytes our q4 model reads), run on OpenVINO's CPU plugin with the same threads.
Random weights of the same shapes as our model (``workloads.phi2.layers.CONFIGS``), as the llama.cpp peer:
the speed does not depend on the values, and no download is needed.

The export (~1 minute for a reduced model, several for the full one) is made once per shape and cached in
``default_cache_dir()``; the timing runs in a process of its own (``openvino_worker.py``) started once per call,
like llama-bench. Rows have llama.cpp's keys (``n_prompt``, ``n_gen``, ``n_depth``, ``tok_s``), so the tables
read both peers alike.  Needs the ``[openvino-llm]`` extra (optimum-intel, NNCF, torch); its absence is one line.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

WORKER = Path(__file__).with_name("openvino_worker.py")
COMPRESSION = dict(bits=4, sym=True, group_size=32, ratio=1.0, all_layers=True)
NEEDS = ("openvino", "optimum.intel", "nncf", "torch", "transformers")


def default_cache_dir() -> Path:
    return Path(os.environ.get("TVM_EXT_OPENVINO_CACHE") or Path.home() / ".cache" / "tvm_ext" / "openvino")


def check_installed() -> None:
    """One line (ValueError) naming what is missing for the peer."""
    missing = []
    for name in NEEDS:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # the parent package of a dotted name is missing
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise ValueError(f"--peers openvino needs {', '.join(missing)}: pip install -e '.[openvino-llm]'")


def hf_config(config: str) -> dict:
    """PhiConfig keys of our model's shapes (``config``: "full" or "reduced")."""
    from tvm_ext.workloads.phi2.layers import CONFIGS, EPS
    from tvm_ext.workloads.phi2.model import MAX_POSITIONS

    if config not in CONFIGS:
        raise ValueError(f"config must be one of {sorted(CONFIGS)}, not {config!r}")
    c = CONFIGS[config]
    return dict(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["mlp"],
                num_attention_heads=c["heads"], partial_rotary_factor=c["rotary"] / c["head_dim"],
                layer_norm_eps=EPS, max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=False)


def _worker(args: list, what: str) -> dict:
    """Run the worker; its JSON line, or one line (ValueError) with its error."""
    try:
        proc = subprocess.run([sys.executable, str(WORKER), *map(str, args)], capture_output=True, text=True)
    except OSError as err:
        raise ValueError(f"OpenVINO {what} could not start: {err}") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    out = json.loads(lines[-1]) if lines else {}
    if proc.returncode or "error" in out or not lines:
        tail = out.get("error") or next((ln for ln in reversed(proc.stderr.splitlines()) if ln.strip()), "no output")
        raise ValueError(f"OpenVINO {what} failed (exit {proc.returncode}): {tail.strip()[:300]}")
    return out


def prepare_peer(cache_dir=None, log=print, config="full", seed=0, layers=32) -> dict:
    """The exported int4 model of our shapes (made once, then reused): {"model", "export_s", "versions"}."""
    check_installed()
    cfg = dict(hf_config(config), num_hidden_layers=int(layers))
    model = Path(cache_dir or default_cache_dir()) / f"phi2-{config}-L{layers}-seed{seed}-int4-sym-g32"
    export_s = None
    if not (model / "openvino_model.xml").is_file():
        log(f"OpenVINO: exporting a random-weight Phi-2 ({config}, {layers} layers) to int4 with optimum-intel "
            f"into {model} (once; the full model takes several minutes)")
        model.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        _worker(["export", "--hf-config", json.dumps(cfg), "--compression", json.dumps(COMPRESSION),
                 "--seed", seed, model], "export")
        export_s = time.time() - t0
        log(f"OpenVINO: exported in {export_s:.0f} s")
    from importlib.metadata import version

    return {"model": model, "export_s": export_s, "vocab": cfg["vocab_size"],
            "versions": {p: version(p) for p in ("openvino", "optimum-intel", "nncf", "transformers")}}


def run_peer(prepared: dict, prompts=(), threads=2, repetitions=3, decode=None, seed=0, log=print) -> list:
    """The worker's rows: prompt processing of each of ``prompts`` tokens (the mean of ``repetitions`` after a
    warm-up), and with ``decode`` = (tokens, context) the decode of that many tokens after that many positions."""
    args = ["run", prepared["model"], "--threads", threads, "--prompts", ",".join(map(str, prompts)),
            "--repetitions", repetitions, "--vocab", prepared["vocab"], "--seed", seed]
    if decode:
        args += ["--decode", f"{decode[0]},{decode[1]}"]
    out = _worker(args, "run")
    prepared.setdefault("properties", out["properties"])
    prepared.setdefault("weight_elements", out["weight_elements"])
    prepared["openvino"] = out["openvino"]
    for r in out["rows"]:
        log(f"OpenVINO int4: {r['tok_s']:.1f} tok/s " + (f"prompt {r['n_prompt']}" if r["n_prompt"] else
                                                          f"decode {r['n_gen']} after {r['n_depth']}"))
    return out["rows"]


def peer_record(prepared: dict, rows: list, command: str) -> dict:
    """The JSON record of an OpenVINO measurement (``commit``: its build, as llama.cpp's)."""
    props = prepared.get("properties") or {}
    summary = (f"OpenVINO {prepared['versions']['openvino']} CPU plugin, weights int4 symmetric group 32 (NNCF, "
               f"every layer), KV cache {props.get('KV_CACHE_PRECISION')}, activations quantized per "
               f"{props.get('DYNAMIC_QUANTIZATION_GROUP_SIZE')} (dynamic quantization; 0 = off), "
               f"{props.get('INFERENCE_PRECISION_HINT')} elsewhere")
    return {"peer": "openvino", "commit": prepared.get("openvino", "?"), "versions": prepared["versions"],
            "summary": summary,
            "compression": COMPRESSION, "properties": prepared.get("properties"),
            "weight_elements": prepared.get("weight_elements"), "model": str(prepared["model"]),
            "export_s": prepared["export_s"], "command": command, "rows": rows}


def prefill_peer(cache_dir=None, prompts=(128, 512), threads=2, log=print, config="full", seed=0, layers=32,
                 repetitions=3) -> dict:
    """OpenVINO's int4 Phi-2 prompt processing tokens/s on this host (see the module doc)."""
    prepared = prepare_peer(cache_dir, log, config, seed, layers)
    rows = run_peer(prepared, prompts, threads, repetitions, seed=seed, log=log)
    return peer_record(prepared, rows, f"{WORKER.name} run --prompts {','.join(map(str, prompts))} "
                                       f"--threads {threads} --repetitions {repetitions}")
