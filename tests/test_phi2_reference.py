"""Our decoder against the reference, transformers' ``PhiForCausalLM`` in float32, on small random-init models
saved with ``save_pretrained`` (several configs: hidden sizes, heads, ``partial_rotary_factor``, tied and
separate embeddings; qk_layernorm off, as Phi-2).  For the same weights:

* the float path (``load(dir, weights="float")``) against transformers' forward: a prompt, then 32 greedy
  steps; each step's logits within 1e-4 of transformers' largest |logit| (max |ours - theirs| / max |theirs|);
* the q4 path (quantized on load as MLC does) against transformers run on the dequantized weights, same bound;
* the int8-activation path (q4 weights, activations quantized per token and group of 32): its top-1
  agreement with transformers on the dequantized weights and its largest logit error, reported and bounded.

Needs torch and transformers: ``pip install -e '.[reference]'`` (setup.py says why that extra is apart);
slow: a torch import and 12 builds, ~1 minute on 2 cores."""

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
torch = transformers = None  # imported by the fixture: collecting this file in the default run costs nothing


def _import_transformers():
    try:
        import transformers
        from transformers.models.phi import modeling_phi  # noqa: F401
    except ImportError:
        pytest.skip("transformers not installed: pip install -e '.[reference]'")
    return transformers


@pytest.fixture(scope="module")
def reference():
    global torch, transformers
    torch = pytest.importorskip("torch", reason="pip install -e '.[reference]'")
    transformers = _import_transformers()

from tvm_ext.workloads.phi2 import load  # noqa: E402
from tvm_ext.workloads.phi2 import model as pm  # noqa: E402
from tvm_ext.workloads.phi2.layers import weight_np  # noqa: E402

pytestmark = pytest.mark.slow

PROMPT, STEPS, TOL = [3, 17, 42, 99, 7], 32, 1e-4
CONFIGS = {  # hidden, heads, intermediate, vocab, layers, partial_rotary_factor, tied
    "h64-4heads-half-rotary": (64, 4, 256, 128, 2, 0.5, False),
    "h96-3heads-quarter-rotary-tied": (96, 3, 192, 160, 2, 0.25, True),
    "h128-8heads-full-rotary": (128, 8, 256, 128, 3, 1.0, False),
    "h160-2heads-phi2-heads": (160, 2, 640, 256, 2, 0.4, False),  # head_dim 80, 32 rotary dims: Phi-2's heads
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def saved(request, tmp_path_factory, reference):
    hidden, heads, mlp, vocab, layers, prf, tied = CONFIGS[request.param]
    torch.manual_seed(sum(map(ord, request.param)))
    config = transformers.PhiConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp,
                                    num_hidden_layers=layers, num_attention_heads=heads, partial_rotary_factor=prf,
                                    tie_word_embeddings=tied, qk_layernorm=False, attn_implementation="eager")
    model = _widened(transformers.PhiForCausalLM(config).eval())
    d = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(d)
    model.rotary_dims = int(hidden // heads * prf)  # transformers' rule, what ours must take from config.json
    return str(d), model


def _widened(model):
    """transformers' init (std 0.02, zero biases) leaves every logit near 0: weights of unit gain instead."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.02)
            elif p.dim() == 2 and "embed" not in name:
                p.normal_(0.0, 1.0 / np.sqrt(p.shape[1]))
            elif "embed" in name:
                p.normal_(0.0, 1.0)
    return model


def _ours(ckpt, compute="float"):
    """Our greedy ids and each step's logits over PROMPT then STEPS tokens."""
    model = ckpt.build(capacity=len(PROMPT) + STEPS, compute=compute)
    if compute == "int8":
        from tvm_ext.bench.phi2.decode import decoder

        dec = decoder(model, "llvm", "int8")
    else:
        dec = pm.Decoder(model, tvm.compile(model.mod, target="llvm"))
    return dec.generate(PROMPT, STEPS)


def _theirs(model, ids):
    """transformers' float32 logits at the positions our steps predicted from (one forward, teacher-forced)."""
    with torch.no_grad():
        out = model(torch.tensor([PROMPT + ids])).logits[0].double().numpy()
    return out[len(PROMPT) - 1:len(PROMPT) - 1 + len(ids)]


def _worst(ours, theirs):
    return max(float(np.abs(a - b).max() / np.abs(b).max()) for a, b in zip(ours, theirs))


def _dequantized(model, ckpt):
    """transformers' model with the weights our q4 path computes with (every matrix dequantized)."""
    src, h = ckpt.source, ckpt.cfg["hidden"]
    deq = transformers.PhiForCausalLM(model.config).eval()
    deq.load_state_dict(model.state_dict())
    t = lambda a: torch.tensor(np.asarray(a, dtype=np.float32))  # noqa: E731
    with torch.no_grad():
        for i, layer in enumerate(deq.model.layers):
            w = src.layer_weights(i)
            qkv = weight_np(w["qkv"]).T
            for j, proj in enumerate((layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)):
                proj.weight.copy_(t(qkv[j * h:(j + 1) * h]))
            layer.self_attn.dense.weight.copy_(t(weight_np(w["dense"]).T))
            layer.mlp.fc1.weight.copy_(t(weight_np(w["fc1"]).T))
            layer.mlp.fc2.weight.copy_(t(weight_np(w["fc2"]).T))
        deq.model.embed_tokens.weight.copy_(t(weight_np((*src.embed_weights()[:2], None)).T))
        deq.lm_head.weight.copy_(t(weight_np(src.head_weights()["lm_head"]).T))
    return deq


def _say(capsys, path, what, worst):
    with capsys.disabled():
        print(f"\n{path.rsplit('/', 1)[-1]}: {what}: max error {worst:.2e} of the largest |logit|, "
              f"{STEPS} greedy steps after a {len(PROMPT)}-token prompt")


def test_float_path_matches_transformers(saved, capsys):
    path, model = saved
    ckpt = load(path, weights="float")
    assert ckpt.cfg["embed"] == "table" and ckpt.cfg["rotary"] == model.rotary_dims
    ids, logits = _ours(ckpt)
    theirs = _theirs(model, ids)
    assert ids == [int(np.argmax(x)) for x in theirs]
    _say(capsys, path, "float path vs transformers", _worst(logits, theirs))
    assert _worst(logits, theirs) <= TOL
    assert not np.allclose(logits[0], logits[-1], atol=1e-3)  # each step attends to a longer past


def test_q4_path_matches_transformers_on_the_dequantized_weights(saved, capsys):
    path, model = saved
    ckpt = load(path, weights="q4")
    ids, logits = _ours(ckpt)
    theirs = _theirs(_dequantized(model, ckpt), ids)
    assert ids == [int(np.argmax(x)) for x in theirs]
    _say(capsys, path, "q4 path vs transformers on the dequantized weights", _worst(logits, theirs))
    assert _worst(logits, theirs) <= TOL
    # and the quantization moved the logits (the check above is not the float path's again)
    assert _worst(logits, _theirs(model, ids)) > 10 * TOL


def test_int8_activation_path_top1_and_error(saved, capsys):
    pytest.importorskip("tvm_ext.rules.q4_int8_gemm")
    from tvm_ext.workloads.phi2.q4_int8_gemm import check_target

    try:
        check_target("llvm")
    except ValueError as err:
        pytest.skip(f"no int8 GEMM on this host: {err}")
    path, model = saved
    ckpt = load(path, weights="q4")
    ids, logits = _ours(ckpt, "int8")
    theirs = _theirs(_dequantized(model, ckpt), ids)  # teacher-forced on our own ids
    top1 = float(np.mean([int(np.argmax(a)) == int(np.argmax(b)) for a, b in zip(logits, theirs)]))
    worst = _worst(logits, theirs)
    _say(capsys, path, f"int8 activations vs transformers on the dequantized weights, top-1 {100 * top1:.0f}% of "
         f"{STEPS} steps", worst)
    assert top1 >= 0.9 and worst < 0.05


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_llama_cpp_converters_gguf_is_read_as_the_checkpoint(reference, tmp_path, outtype, capsys):
    """llama.cpp's own converter (convert_hf_to_gguf.py of the pinned sdist; downloaded once, not built) on a
    transformers model: our GGUF reader takes its names and layout (attn_q/k/v apart, F32 norms); its F32 file
    gives transformers' logits to the same bound, its Q8_0 file exactly gguf's dequantized values.  (Q4_0 and
    llama.cpp's own greedy tokens on the file take a llama.cpp build: not here.)"""
    from tvm_ext.testing.phi2_checkpoints import llama_cpp_convert

    torch.manual_seed(11)
    config = transformers.PhiConfig(vocab_size=128, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                                    num_attention_heads=4, partial_rotary_factor=0.5, tie_word_embeddings=False,
                                    attn_implementation="eager")  # the converter writes 4 x hidden as the MLP
    model = transformers.PhiForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "hf")
    try:
        path = llama_cpp_convert(tmp_path / "hf", tmp_path / f"m-{outtype}.gguf", outtype, log=lambda m: None)
    except ValueError as err:  # no package index reachable: said, not passed
        pytest.skip(str(err))
    ckpt = load(path, weights="float")
    hf = load(str(tmp_path / "hf"), weights="float")
    tensors = {t.name: t for t in gguf_reader(path).tensors}
    assert "blk.0.attn_q.weight" in tensors and ckpt.cfg["rotary"] == hf.cfg["rotary"]
    if outtype == "f32":
        for a, b in zip(ckpt.source.layer_weights(1).values(), hf.source.layer_weights(1).values()):
            np.testing.assert_array_equal(a[0] if isinstance(a, tuple) else a, b[0] if isinstance(b, tuple) else b)
        ids, logits = _ours(ckpt)
        theirs = _theirs(model, ids)
        _say(capsys, path, "llama.cpp converter's F32 GGUF vs transformers", _worst(logits, theirs))
        assert ids == [int(np.argmax(x)) for x in theirs] and _worst(logits, theirs) <= TOL
    else:
        t = tensors["blk.1.ffn_down.weight"]
        import gguf

        np.testing.assert_array_equal(ckpt.source.layer_weights(1)["fc2"][0], gguf.quants.dequantize(t.data,
                                                                                                     t.tensor_type))
        ids, logits = _ours(ckpt)
        ref = pm.reference_generate(ckpt.build(capacity=len(PROMPT) + STEPS), PROMPT, STEPS, follow=ids)[1]
        assert _worst(logits, ref) <= TOL


def gguf_reader(path):
    import gguf

    return gguf.GGUFReader(path)


def test_gguf_q4_0_greedy_tokens_equal_llama_cpps(reference, tmp_path, capsys):
    """llama.cpp's own greedy tokens on a Q4_0 file against our GGUF path's, 32 steps after a prompt: a
    Phi-2-shaped transformers model (head 80, 32 rotary dims, 4 layers), written F32 by llama.cpp's converter,
    quantized by llama-quantize (``--pure``: every matrix Q4_0, which our reader maps exactly), run by
    llama.cpp (``bench.phi2.llama_greedy``; built from the pinned sdist once, minutes) and by us.  llama.cpp's
    Q4_0 products quantize the activations to Q8_0 (blocks of 32, 8 bits), ours keep them float32: a step
    may pick another id only where llama.cpp's own logits of the two ids lie within that step's error
    (max |ours - llama.cpp|, ours teacher-forced on llama.cpp's ids); such steps are printed."""
    from tvm_ext.bench.phi2 import llama_greedy
    from tvm_ext.testing.phi2_checkpoints import llama_cpp_convert

    torch.manual_seed(52)
    config = transformers.PhiConfig(vocab_size=512, hidden_size=320, intermediate_size=1280, num_hidden_layers=4,
                                    num_attention_heads=4, partial_rotary_factor=0.4, tie_word_embeddings=False,
                                    attn_implementation="eager")
    _widened(transformers.PhiForCausalLM(config).eval()).save_pretrained(tmp_path / "hf")
    quiet = lambda m: None  # noqa: E731
    try:
        f32 = llama_cpp_convert(tmp_path / "hf", tmp_path / "m-f32.gguf", "f32", log=quiet)
        q4 = llama_greedy.quantize(f32, tmp_path / "m-q4_0.gguf", "Q4_0", log=quiet)
        theirs, their_logits = llama_greedy.greedy(q4, PROMPT, STEPS, log=quiet)
    except ValueError as err:  # no cmake / compiler / package index: said, not passed
        pytest.skip(f"llama.cpp cannot be built or run here: {err}")
    ckpt = load(q4)
    assert ckpt.stored == "F32/Q4_0"  # every matrix Q4_0: our q4 weights are llama.cpp's exactly
    model = ckpt.build(capacity=len(PROMPT) + STEPS)
    dec = pm.Decoder(model, tvm.compile(model.mod, target="llvm"))
    ours = dec.generate(PROMPT, STEPS)[0]
    for i, t in enumerate(PROMPT[:-1]):  # the prompt again, then llama.cpp's ids
        dec.step(t, i)
    forced = [dec.step(t, len(PROMPT) - 1 + i) for i, t in enumerate([PROMPT[-1]] + theirs[:-1])]
    err = [float(np.abs(a - b).max()) for a, b in zip(forced, their_logits)]
    scale = max(float(np.abs(b).max()) for b in their_logits)
    near = []  # (step, llama.cpp's id, ours, llama.cpp's gap between them, the step's error)
    for s, (a, b, t) in enumerate(zip(forced, their_logits, theirs)):
        mine = int(np.argmax(a))
        if mine != t:
            near.append((s, t, mine, float(b[t] - b[mine]), err[s]))
    first = next((s for s, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    with capsys.disabled():
        print(f"\nllama.cpp vs our GGUF path (Q4_0), {STEPS} greedy steps: ids "
              f"{'equal' if first is None else f'differ from step {first}'}; logits' error (ours teacher-forced) "
              f"max {max(err):.3g}, {max(err) / scale:.2e} of the largest |logit|; steps picking another id "
              f"(step, llama.cpp's, ours, llama.cpp's gap, error): {near or 'none'}")
    assert max(err) / scale < 0.05  # the same model: only the activations' 8-bit rounding between the two
    assert all(gap <= e for _, _, _, gap, e in near)
    assert first is None or first in [s for s, *_ in near]
