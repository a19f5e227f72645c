"""A user's Phi-2 checkpoint on our one decoder (tvm_ext.workloads.phi2.load): small checkpoints written here
in each form (Hugging Face safetensors with ``safetensors.numpy``, a GGUF with the ``gguf`` writer, MLC's
ndarray-cache with ``mlc.save``), loaded, and the decoder's logits over a prompt and greedy decode steps
checked against the NumPy float64 reference of the decoder on the same weights; the weights themselves
against the file's (exact where the format maps exactly); the bad inputs a user would try, each one line;
the text path through the CLI with a tokenizer trained here.  No torch (the transformers comparison:
test_phi2_reference.py)."""
import json

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")
gguf = pytest.importorskip("gguf")

from tvm_ext.cli.main import main  # noqa: E402
from tvm_ext.testing.phi2_checkpoints import train_tokenizer, write_gguf, write_hf  # noqa: E402
from tvm_ext.workloads.phi2 import load  # noqa: E402
from tvm_ext.workloads.phi2 import mlc  # noqa: E402
from tvm_ext.workloads.phi2 import model as pm  # noqa: E402
from tvm_ext.workloads.phi2.hf import HFReader  # noqa: E402
from tvm_ext.workloads.phi2.layers import dequantize_np  # noqa: E402

PROMPT, TOKENS = [5, 17, 60], 6
TOL = 1e-4  # max |ours - reference| over max |reference|, each step (float32 against float64)


def _generate_and_check(ckpt):
    """Our decoder (kernels as built: LLVM compiles them in a second) against the float64 reference of the same
    weights, prompt and greedy steps; returns the generated ids."""
    _, ids, logits = _decoder_matches_reference(ckpt.build(capacity=len(PROMPT) + TOKENS))
    assert not np.allclose(logits[0], logits[1])
    return ids


def _decoder_matches_reference(model):
    """(decoder, ids, logits) of ``model`` compiled for llvm, its greedy steps checked against the reference."""
    dec = pm.Decoder(model, tvm.compile(model.mod, target="llvm"))
    ids, logits = dec.generate(PROMPT, TOKENS)
    ref_ids, ref_logits = pm.reference_generate(model, PROMPT, TOKENS, follow=ids)
    assert ids == ref_ids
    for got, want in zip(logits, ref_logits):
        assert np.abs(got - want).max() <= TOL * np.abs(want).max()
    return dec, ids, logits


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf")
    write_hf(d, hidden=64, heads=4, mlp=256, vocab=320, layers=2, partial_rotary_factor=0.4, seed=3)
    train_tokenizer(d)
    return str(d)


@pytest.mark.parametrize("weights", ["q4", "float"])
def test_hugging_face_checkpoint_matches_reference(hf_dir, weights):
    ckpt = load(hf_dir, weights=weights)
    assert ckpt.kind == "hf" and ckpt.cfg["rotary"] == 6 and ckpt.cfg["embed"] == "table" and ckpt.cfg["lm_bias"]
    _generate_and_check(ckpt)
    file, ours = HFReader(hf_dir), ckpt.source.layer_weights(1)
    fc1 = file.matrix("fc1", 1)[1]
    if weights == "float":  # kept as stored
        np.testing.assert_array_equal(ours["fc1"][0], fc1)
    else:  # q4f16_1: each value within half a step of its group's scale
        packed, scale, _ = ours["fc1"]
        step = np.repeat(scale.astype(np.float64), 32, axis=1)
        assert np.all(np.abs(dequantize_np(packed, scale).T - fc1) <= step / 2 + 1e-6)
    np.testing.assert_array_equal(ours["qkv"][-1], np.concatenate(
        [file._tensor(f"model.layers.1.self_attn.{p}_proj.bias") for p in "qkv"]))


@pytest.mark.parametrize("dtype, tied, shards", [("float16", True, 1), ("bfloat16", False, None)])
def test_half_precision_tied_and_sharded_checkpoints(tmp_path, dtype, tied, shards):
    write_hf(tmp_path, hidden=64, heads=2, mlp=128, vocab=96, layers=2, partial_rotary_factor=1.0, tied=tied,
             dtype=dtype, layers_per_shard=shards, seed=4)
    ckpt = load(tmp_path, weights="float")
    assert ckpt.stored == {"float16": "F16", "bfloat16": "BF16"}[dtype] and ckpt.cfg["rotary"] == 32
    if tied:  # lm_head reads the embedding table
        np.testing.assert_array_equal(ckpt.source.head_weights()["lm_head"][0], ckpt.source.embed_weights()[0])
    _generate_and_check(ckpt)


def test_mlc_q4f16_1_checkpoint_is_the_hf_one_quantized(hf_dir, tmp_path):
    hf = load(hf_dir, weights="q4")
    mlc.save(tmp_path, hf, shard_bytes=64 << 10)
    assert len(list(tmp_path.glob("params_shard_*.bin"))) > 1
    ckpt = load(tmp_path)
    assert ckpt.kind == "mlc" and ckpt.stored == "q4f16_1"
    a, b = ckpt.source.layer_weights(1), hf.source.layer_weights(1)
    for name in ("qkv", "fc2"):
        np.testing.assert_array_equal(a[name][0], b[name][0])
        np.testing.assert_array_equal(a[name][1], b[name][1])
        np.testing.assert_array_equal(a[name][2], b[name][2].astype(np.float16))  # MLC keeps biases in fp16
    _generate_and_check(ckpt)


def test_gguf_q4_0_maps_exactly_and_other_types_through_float(hf_dir, tmp_path):
    path = write_gguf(str(tmp_path / "m.gguf"), hf_dir, "Q4_0", split_qkv=True)
    ckpt = load(path)
    assert ckpt.kind == "gguf" and ckpt.stored == "F32/Q4_0"
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    ours = ckpt.source.layer_weights(0)
    for name, theirs in (("fc1", ["blk.0.ffn_up.weight"]), ("qkv", [f"blk.0.attn_{p}.weight" for p in "qkv"])):
        want = np.concatenate([gguf.quants.dequantize(tensors[t].data, tensors[t].tensor_type) for t in theirs])
        np.testing.assert_array_equal(dequantize_np(*ours[name][:2]).T, want)  # (q - 8) d == (15 - q - 7) (-d)
    _generate_and_check(ckpt)
    assert ckpt.tokenizer.encode("hello world") == load(hf_dir).tokenizer.encode("hello world")
    q8 = load(write_gguf(str(tmp_path / "q8.gguf"), hf_dir, "Q8_0"), weights="float")
    t = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "q8.gguf")).tensors}["blk.1.ffn_down.weight"]
    np.testing.assert_array_equal(q8.source.layer_weights(1)["fc2"][0], gguf.quants.dequantize(t.data, t.tensor_type))
    _generate_and_check(q8)


def test_matrices_converted_a_slice_of_rows_at_a_time_as_whole(hf_dir, tmp_path, monkeypatch):
    """``checkpoint.Source`` reads, converts and writes a matrix ``CHUNK`` bytes of rows at a time (the file's
    pages given back between two): the q4 weights are those of the whole matrix quantized at once (HF: q, k and
    v tensors apart, slices ending inside each), a GGUF's Q4_0 rows repack as the whole does."""
    from tvm_ext.workloads.phi2 import checkpoint
    from tvm_ext.workloads.phi2.tensors import quantize_q4

    gg = write_gguf(str(tmp_path / "m.gguf"), hf_dir, "Q4_0", split_qkv=True)
    for path in (hf_dir, gg):
        monkeypatch.setattr(checkpoint, "CHUNK", 10 * 2 * 64)  # 10 rows of the 64-input matrices, 2 of fc2
        sliced = load(path).source
        got = [sliced.layer_weights(1), sliced.head_weights()["lm_head"], sliced.embed_weights()]
        monkeypatch.setattr(checkpoint, "CHUNK", 1 << 30)
        src = load(path).source
        want = [src.layer_weights(1), src.head_weights()["lm_head"], src.embed_weights()]
        for name in ("qkv", "dense", "fc1", "fc2"):
            for a, b in zip(got[0][name], want[0][name]):
                np.testing.assert_array_equal(a, b)
        for a, b in zip(got[1:], want[1:]):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
        if path == hf_dir:  # and the file's matrices quantized whole
            for name in ("qkv", "fc2"):
                for a, b in zip(got[0][name][:2], quantize_q4(HFReader(hf_dir).matrix(name, 1)[1])):
                    np.testing.assert_array_equal(a, b)


def _one_line(capsys, argv):
    assert main(["generate", "--tokens", "2", "--quiet"] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def _edit_config(d, **changes):
    path = d / "config.json"
    c = json.loads(path.read_text())
    c.update(changes)
    path.write_text(json.dumps(c))


def test_bad_checkpoints_say_what_in_one_line(tmp_path, capsys, hf_dir):
    from safetensors.numpy import load_file, save_file

    def hf(name):
        d = tmp_path / name
        write_hf(d, hidden=32, heads=2, mlp=64, vocab=300, layers=1)
        train_tokenizer(d, vocab=300)
        return d

    d = hf("llama")
    _edit_config(d, architectures=["LlamaForCausalLM"])
    assert "architecture LlamaForCausalLM, not PhiForCausalLM" in _one_line(capsys, ["--model", str(d),
                                                                                    "--prompt-text", "hi"])
    d = hf("qk")
    _edit_config(d, qk_layernorm=True)
    assert "qk_layernorm True" in _one_line(capsys, ["--model", str(d), "--prompt-text", "hi"])
    d = hf("missing")
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.0.mlp.fc2.bias"]
    save_file(tensors, d / "model.safetensors")
    # found as the weights are uploaded, after the compile: the untuned one is the quickest (not dlight's, ~2 s)
    assert "tensor model.layers.0.mlp.fc2.bias missing" in _one_line(capsys, ["--model", str(d), "--prompt-text", "hi",
                                                                            "--schedule", "none"])
    d = hf("shape")
    tensors = load_file(d / "model.safetensors")
    tensors["model.layers.0.mlp.fc1.weight"] = tensors["model.layers.0.mlp.fc1.weight"][:, :16].copy()
    save_file(tensors, d / "model.safetensors")
    assert "model.layers.0.mlp.fc1.weight: shape (64, 16), expected (64, 32)" in _one_line(
        capsys, ["--model", str(d), "--prompt-text", "hi", "--schedule", "none"])
    d = tmp_path / "mlc"
    mlc.save(d, load(hf_dir))
    conf = json.loads((d / "mlc-chat-config.json").read_text())
    (d / "mlc-chat-config.json").write_text(json.dumps(dict(conf, quantization="q3f16_1")))
    assert "quantization 'q3f16_1'" in _one_line(capsys, ["--model", str(d), "--prompt-text", "hi"])
    g = tmp_path / "llama.gguf"
    w = gguf.GGUFWriter(str(g), "llama")
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert "architecture llama, not phi2" in _one_line(capsys, ["--model", str(g), "--prompt-text", "hi"])
    (tmp_path / "empty").mkdir()
    assert "no config.json" in _one_line(capsys, ["--model", str(tmp_path / "empty"), "--prompt-text", "hi"])
    notok = hf("notok")
    (notok / "tokenizer.json").unlink()
    assert "no tokenizer" in _one_line(capsys, ["--model", str(notok), "--prompt-text", "hi"])
    assert "--prompt-text needs --model" in _one_line(capsys, ["--prompt-text", "hi"])
    assert "--model generates from --prompt-text" in _one_line(capsys, ["--model", str(notok)])
    assert "--model runs on this host's CPU" in _one_line(capsys, ["--model", str(d), "--prompt-text", "hi",
                                                                    "--target", "cuda"])


def test_without_the_models_extra_says_how_to_install(hf_dir, tmp_path, monkeypatch, capsys):
    path = write_gguf(str(tmp_path / "m.gguf"), hf_dir, "F16")
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # import gguf now raises ImportError
    assert "pip install 'tvm_ext[models]'" in _one_line(capsys, ["--model", path, "--prompt-text", "hi"])


def test_generate_text_through_the_cli(hf_dir, capsys, tmp_path):
    out = tmp_path / "gen.json"
    assert main(["generate", "--model", hf_dir, "--prompt-text", "hello world", "--tokens", "5", "--schedule",
                 "none", "--quiet", "--json", "--out", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(out.read_text())
    ckpt = load(hf_dir)
    assert doc["prompt_ids"] == ckpt.tokenizer.encode("hello world") and doc["format"] == "hf"
    assert doc["text"] == ckpt.tokenizer.decode(doc["generated"]) and len(doc["generated"]) == 5
    assert doc["prompt_tok_s"] > 0 and doc["decode_tok_s"] > 0 and doc["peak_rss_mb"] > 0
    model = ckpt.build(capacity=len(doc["prompt_ids"]) + 5)  # the greedy ids are the reference's
    assert pm.reference_generate(model, doc["prompt_ids"], 5)[0] == doc["generated"]
    # streamed: the prompt, the continuation as it comes, then the rates
    assert main(["generate", "--model", hf_dir, "--prompt-text", "hello world", "--tokens", "5", "--schedule",
                 "none", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("hello world" + doc["text"].rstrip("\ufffd")) and "decode: 5 tokens at" in text
    # beside the random-weight model of the same architecture, same run (no figure asserted: tests time nothing)
    assert main(["generate", "--model", hf_dir, "--prompt-text", "hello world", "--tokens", "3", "--schedule",
                 "none", "--quiet", "--json", "--vs-random", "--rounds", "2"]) == 0
    v = json.loads(capsys.readouterr().out)["vs_random"]
    assert len(v["rounds"]) == 2 and v["decode_ratio"] > 0 and v["prompt_ratio"] > 0


@pytest.mark.parametrize("options", [dict(embed="table", lm_bias=False, weights="float16"),
                                     dict(embed="tied", lm_bias=True, weights="q4", eps=1e-3, rope_base=500.0)])
def test_architecture_options_on_random_weights(options):
    """The options a checkpoint's config sets, on the random-weight model: the reference follows each."""
    from tvm_ext.workloads.phi2.arch import architecture

    prf = 0.25 if options["weights"] == "q4" else 0.75
    cfg = architecture(64, 2 if options["weights"] == "q4" else 4, 96, 80, partial_rotary_factor=prf, **options)
    model = pm.build_model(cfg, layers=2, capacity=len(PROMPT) + TOKENS, seed=5)
    head = model.head_weights()
    assert (head["lm_head"][-1] is None) == (not options["lm_bias"])
    table = model.embed_weights(head)
    assert (table[0] is head["lm_head"][0]) == (options["embed"] == "tied")
    dec, _, _ = _decoder_matches_reference(model)
    if options["weights"] != "q4":  # q4 weights take compute int8: nothing to refuse there
        with pytest.raises(ValueError, match="compute int8 runs on q4 weights"):
            pm.build_model(cfg, layers=1, capacity=4, compute="int8")
    with pytest.raises(ValueError, match="token ids must be from 0"):
        dec.generate([cfg["vocab"]], 1)


def test_bad_architectures_say_what():
    from tvm_ext.workloads.phi2.arch import architecture

    with pytest.raises(ValueError, match="multiple of the 3 heads"):
        architecture(64, 3, 128, 100)
    with pytest.raises(ValueError, match="gives 5 rotary dims"):
        architecture(64, 4, 128, 100, partial_rotary_factor=0.3125)
    with pytest.raises(ValueError, match="whole groups of 32"):
        architecture(48, 3, 128, 100)


def test_stream_releases_text_once_its_bytes_decode(hf_dir):
    tok = load(hf_dir).tokenizer
    ids = tok.encode("hello é world")
    push = tok.stream()
    assert "".join(push(i) for i in ids) == "hello é world"
