"""llama.cpp's own greedy decoding of a GGUF, token ids and logits, to hold our GGUF path against.

``tvm-ext-greedy`` is a small program of ours against libllama, built with llama.cpp's tree
(``llama_cpp.find_or_build`` adds it as an example): it evaluates the prompt's ids in one batch, then takes
the argmax of the last position's logits ``steps`` times (no sampler: the first of equal logits, as
``np.argmax``), printing each id and writing every step's logits (float32, vocabulary long) to a file.  Token
ids in and out, so a GGUF without a vocabulary (``tokenizer.ggml.model`` "none" and ``<arch>.vocab_size``)
serves.  ``quantize`` runs ``llama-quantize`` (``--pure``: every matrix in the one type, no Q6_K output).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from .llama_cpp import _last_line, _run, default_cache_dir, find_or_build
from .llama_programs import GREEDY


def binary(name, cache_dir=None, log=print) -> Path:
    """The path of llama.cpp's (or our) program ``name``, built once into the cache (``find_or_build``)."""
    got = find_or_build(Path(cache_dir or default_cache_dir()), log=log, targets=(name,))
    return Path(got["source"]) / "build" / "bin" / name


def quantize(src, dst, qtype="Q4_0", pure=True, cache_dir=None, log=print):
    """``dst``: llama-quantize's ``qtype`` GGUF of ``src`` (``pure``: every matrix ``qtype``, none kept in
    another type)."""
    tool = binary("llama-quantize", cache_dir, log)
    _run([tool, *(["--pure"] if pure else []), src, dst, qtype], "llama-quantize")
    return str(dst)


def greedy(model, prompt, steps, threads=2, cache_dir=None, log=print):
    """llama.cpp's greedy continuation of the ids ``prompt`` by ``steps`` tokens on the GGUF ``model``:
    (ids, logits (steps, vocab) float32: the logits each id was picked from)."""
    tool = binary(GREEDY, cache_dir, log)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "logits.f32"
        proc = _run([tool, model, steps, threads, out, *[int(t) for t in prompt]], GREEDY)
        logits = np.fromfile(out, np.float32)
    ids = [int(v) for v in proc.stdout.split()]
    if len(ids) != steps or logits.size % steps:
        raise ValueError(f"{GREEDY} gave {len(ids)} ids for {steps} steps: {_last_line(proc.stderr)}")
    return ids, logits.reshape(steps, -1)

