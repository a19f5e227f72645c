"""Phi-2 checkpoints written locally (no model can be downloaded here): random weights in the forms users
hold, for the loaders' tests and the full-size load benchmark.

``write_hf``       Hugging Face ``PhiForCausalLM``: config.json + safetensors (written with
                   ``safetensors.numpy``, one shard per ``layers_per_shard`` layers: a full-size fp16 model is
                   never in RAM whole), any size, F32 / F16 / BF16, tied or separate embedding
``write_gguf``     a GGUF of llama.cpp's phi2 from such a checkpoint (``gguf``'s writer and quantizers: Q4_0,
                   Q8_0, F16, F32 matrices; norms and biases F32), with the tokenizer's vocabulary and merges
``train_tokenizer`` a tiny byte-level BPE trained by ``tokenizers`` on a few sentences, saved as
                   tokenizer.json
``llama_cpp_convert`` llama.cpp's own ``convert_hf_to_gguf.py`` (from the llama-cpp-python sdist the peer
                   benchmark pins) run on a Hugging Face checkpoint
"""
from __future__ import annotations

import json
import os

import numpy as np

CORPUS = ["the quick brown fox jumps over the lazy dog", "def fibonacci(n): return n if n < 2 else n",
          "hello world, hello phi", "print('hello')", "a tokenizer trained in the test"]


def hf_config(hidden, heads, mlp, vocab, layers, partial_rotary_factor=0.5, tied=False, dtype="float32",
              eps=1e-5, max_positions=2048, **extra) -> dict:
    """A ``PhiForCausalLM`` config.json as transformers 5 writes it."""
    return dict({"architectures": ["PhiForCausalLM"], "model_type": "phi", "hidden_size": hidden,
                 "num_attention_heads": heads, "num_key_value_heads": heads, "intermediate_size": mlp,
                 "vocab_size": vocab, "num_hidden_layers": layers, "layer_norm_eps": eps, "hidden_act": "gelu_new",
                 "max_position_embeddings": max_positions, "qk_layernorm": False, "tie_word_embeddings": tied,
                 "rope_parameters": {"partial_rotary_factor": partial_rotary_factor, "rope_theta": 10000.0,
                                     "rope_type": "default"}, "dtype": dtype}, **extra)


def _cast(a, dtype):
    if dtype == "bfloat16":  # stored as uint16 (the top half of the float32), named BF16 in the header
        return (a.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    return a.astype(dtype)


def _layer(rng, i, hidden, mlp):
    def lin(n, k):
        return rng.standard_normal((n, k), dtype=np.float32) / np.float32(np.sqrt(k)), \
            (0.02 * rng.standard_normal(n)).astype(np.float32)

    p = f"model.layers.{i}."
    out = {p + "input_layernorm.weight": (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32),
           p + "input_layernorm.bias": (0.02 * rng.standard_normal(hidden)).astype(np.float32)}
    for name, (n, k) in (("self_attn.q_proj", (hidden, hidden)), ("self_attn.k_proj", (hidden, hidden)),
                         ("self_attn.v_proj", (hidden, hidden)), ("self_attn.dense", (hidden, hidden)),
                         ("mlp.fc1", (mlp, hidden)), ("mlp.fc2", (hidden, mlp))):
        out[p + name + ".weight"], out[p + name + ".bias"] = lin(n, k)
    return out


def write_hf(directory, hidden=64, heads=4, mlp=256, vocab=320, layers=2, partial_rotary_factor=0.5, tied=False,
             dtype="float32", seed=0, layers_per_shard=None, **config):
    """A random ``PhiForCausalLM`` checkpoint in ``directory`` (returns it); ``config``: more config.json keys."""
    from safetensors.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    per = layers_per_shard or layers
    groups = [list(range(s, min(s + per, layers))) for s in range(0, layers, per)]
    head = {"model.embed_tokens.weight": rng.standard_normal((vocab, hidden), dtype=np.float32),
            "model.final_layernorm.weight": (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32),
            "model.final_layernorm.bias": (0.02 * rng.standard_normal(hidden)).astype(np.float32),
            "lm_head.bias": (0.02 * rng.standard_normal(vocab)).astype(np.float32)}
    if not tied:
        head["lm_head.weight"] = rng.standard_normal((vocab, hidden), dtype=np.float32) / np.float32(np.sqrt(hidden))
    if layers_per_shard is None:  # one file
        shards = [(head, groups[0])]
    else:  # a shard per group of layers, the rest in a last one
        shards = [({}, g) for g in groups] + [(head, [])]
    weight_map = {}
    for s, (tensors, group) in enumerate(shards):
        name = "model.safetensors" if len(shards) == 1 else f"model-{s + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = dict(tensors)
        for i in group:  # generated shard by shard: a full-size model is never in RAM whole
            tensors.update(_layer(rng, i, hidden, mlp))
        (_save_bf16 if dtype == "bfloat16" else save_file)({k: _cast(v, dtype) for k, v in tensors.items()},
                                                           os.path.join(directory, name))
        weight_map.update({k: name for k in tensors})
    if len(shards) > 1:
        with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf_config(hidden, heads, mlp, vocab, layers, partial_rotary_factor, tied, dtype, **config), f,
                  indent=1)
    return directory


def _save_bf16(tensors, path):
    """A safetensors file of BF16 tensors (given as their uint16 bits), written directly: ``safetensors.numpy``
    has no bfloat16.  The format: 8 bytes of header length, the JSON header (padded to 8 bytes), the data."""
    header, offset = {}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little") + head)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a).tobytes())


def train_tokenizer(directory, vocab=320):
    """A byte-level BPE of ``vocab`` tokens trained on ``CORPUS``, saved as ``directory``/tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(vocab_size=vocab, min_frequency=1, show_progress=False,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = os.path.join(directory, "tokenizer.json")
    tok.save(path)
    return path


def write_gguf(path, hf_directory, qtype="Q4_0", split_qkv=False):
    """llama.cpp's phi2 GGUF of the Hugging Face checkpoint ``hf_directory`` (read through our reader):
    matrices in ``qtype`` (quantized by ``gguf.quants``), norms and biases F32, the tokenizer.json beside it
    as the GGUF's vocabulary.  ``split_qkv``: attn_q / attn_k / attn_v as llama.cpp's converter writes them."""
    import gguf

    from tvm_ext.workloads.phi2.hf import HFReader

    r = HFReader(hf_directory)
    c = r.cfg
    w = gguf.GGUFWriter(path, "phi2")
    w.add_uint32("phi2.context_length", c["max_positions"])
    w.add_uint32("phi2.embedding_length", c["hidden"])
    w.add_uint32("phi2.feed_forward_length", c["mlp"])
    w.add_uint32("phi2.block_count", r.layers)
    w.add_uint32("phi2.attention.head_count", c["heads"])
    w.add_uint32("phi2.attention.head_count_kv", c["heads"])
    w.add_float32("phi2.attention.layer_norm_epsilon", c["eps"])
    w.add_uint32("phi2.rope.dimension_count", int(c["hidden"] // c["heads"] * c["partial_rotary_factor"]))
    tok = os.path.join(hf_directory, "tokenizer.json")
    if os.path.isfile(tok):
        model = json.load(open(tok))["model"]
        w.add_string("tokenizer.ggml.model", "gpt2")
        w.add_token_list([t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])])
        w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model["merges"]])
    qt = gguf.GGMLQuantizationType[qtype]

    def matrix(name, a):
        a = np.ascontiguousarray(a, dtype=np.float32)
        if qtype in ("F32", "F16"):
            w.add_tensor(name, a.astype(np.float16 if qtype == "F16" else np.float32))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qt), raw_dtype=qt)

    matrix("token_embd.weight", r.matrix("embed")[1])
    for i in range(r.layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", r.vector("ln_g", i))
        w.add_tensor(b + "attn_norm.bias", r.vector("ln_b", i))
        qkv, qkv_b = r.matrix("qkv", i)[1], r.vector("qkv_b", i)
        if split_qkv:
            for j, p in enumerate("qkv"):
                matrix(b + f"attn_{p}.weight", qkv[j * c["hidden"]:(j + 1) * c["hidden"]])
                w.add_tensor(b + f"attn_{p}.bias", qkv_b[j * c["hidden"]:(j + 1) * c["hidden"]].copy())
        else:
            matrix(b + "attn_qkv.weight", qkv)
            w.add_tensor(b + "attn_qkv.bias", qkv_b)
        for ours, theirs in (("dense", "attn_output"), ("fc1", "ffn_up"), ("fc2", "ffn_down")):
            matrix(b + theirs + ".weight", r.matrix(ours, i)[1])
            w.add_tensor(b + theirs + ".bias", r.vector(ours + "_b", i))
    w.add_tensor("output_norm.weight", r.vector("lnf_g"))
    w.add_tensor("output_norm.bias", r.vector("lnf_b"))
    matrix("output.weight", r.matrix("lm_head")[1])
    w.add_tensor("output.bias", r.vector("lm_head_b"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


CONVERT = """import runpy, sys
root = sys.argv[1]
sys.path[:0] = [root, root + "/gguf-py"]
import conversion.phi as phi
# a tokenizer trained in a test is none llama.cpp knows (its converter matches tokenizers by hash): no vocabulary,
# its size said (llama.cpp gives a "none" vocabulary that many dummy tokens, and takes no id beyond)
def no_vocab(self):
    self.gguf_writer.add_tokenizer_model("none")
    self.gguf_writer.add_vocab_size(self.hparams["vocab_size"])
phi.Phi2Model.set_vocab = no_vocab
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[2:]
runpy.run_path(root + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def llama_cpp_converter(cache_dir=None, log=print):
    """The directory of llama.cpp's Python converter (convert_hf_to_gguf.py, conversion/, gguf-py/) of the pinned
    llama-cpp-python sdist (``bench.phi2.llama_cpp``): the built peer's tree where there is one, else extracted
    from the sdist (downloaded by pip once) into the same cache, no build."""
    import subprocess
    import sys
    import tarfile
    from pathlib import Path

    from tvm_ext.bench.phi2.llama_cpp import LLAMA_CPP_PYTHON_VERSION, default_cache_dir

    cache = Path(cache_dir or default_cache_dir())
    for root in (cache / "llama.cpp", cache / f"converter-{LLAMA_CPP_PYTHON_VERSION}"):
        if (root / "convert_hf_to_gguf.py").is_file() and (root / "conversion").is_dir():
            return str(root)
    name = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
    sdist = cache / f"{name}.tar.gz"
    cache.mkdir(parents=True, exist_ok=True)
    if not sdist.is_file():
        log(f"downloading the {name} sdist (llama.cpp's converter)")
        proc = subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                               "--no-binary", ":all:", "--no-deps", "-d", str(cache)], capture_output=True, text=True)
        if proc.returncode != 0 or not sdist.is_file():
            raise ValueError(f"pip download of llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} failed: "
                             f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    root = cache / f"converter-{LLAMA_CPP_PYTHON_VERSION}"
    prefix = f"{name}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile() and (
            m.name == prefix + "convert_hf_to_gguf.py" or m.name.startswith((prefix + "conversion/",
                                                                             prefix + "gguf-py/")))]
        for m in members:
            m.name = m.name[len(prefix):]
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(root, members=members, **kw)
    return str(root)


def llama_cpp_convert(hf_directory, out, outtype="f32", cache_dir=None, log=print):
    """``out``: llama.cpp's converter's GGUF of ``hf_directory`` (``outtype`` f32, f16, bf16 or q8_0: what the
    converter writes; Q4_0 takes llama-quantize, a build).  Needs torch, as the converter does."""
    import subprocess
    import sys

    root = llama_cpp_converter(cache_dir, log)
    proc = subprocess.run([sys.executable, "-c", CONVERT, root, str(hf_directory), "--outfile", str(out),
                           "--outtype", outtype], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ValueError(f"llama.cpp's converter failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return str(out)
