"""The prompt's fused causal attention (workloads/phi2/prefill_attention.py) against NumPy, and in the model."""
import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm_ext.targets import resolve_target  # noqa: E402
from tvm_ext.workloads.phi2 import model as pm  # noqa: E402
from tvm_ext.workloads.phi2.kv_cache import quantize_np  # noqa: E402
from tvm_ext.workloads.phi2.prefill_attention import attention_np, prefill_attention  # noqa: E402


def _run(tokens, capacity, heads, head_dim, kv_dtype, past, poison=False, seed=0):
    """(fused kernel's output, float64 reference) on random queries and caches; with ``poison``, NaN in every
    cache slot after the prompt's last position (a kernel reading them would return NaN)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, tokens, heads, head_dim)).astype("float32")
    k, v = (rng.standard_normal((1, capacity, heads, head_dim)).astype("float32") for _ in range(2))
    if kv_dtype == "int8":
        (k, ks), (v, vs) = quantize_np(k), quantize_np(v)
        ks, vs = (np.ascontiguousarray(s.transpose(0, 2, 1)) for s in (ks, vs))
        ref = attention_np(q, k, v, past, ks, vs)
        if poison:
            ks[:, :, past + tokens:] = vs[:, :, past + tokens:] = np.nan
        arrays = [q, k, v, ks, vs]
    else:
        k, v = k.astype(kv_dtype), v.astype(kv_dtype)
        ref = attention_np(q, k, v, past)
        if poison:
            k[:, past + tokens:] = v[:, past + tokens:] = np.nan
        arrays = [q, k, v]
    func = prefill_attention(tokens, capacity, heads, head_dim, kv_dtype).with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": func}), target=resolve_target("llvm"))
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in arrays] + [tvm.runtime.tensor(np.array([past], "int32"), dev)]
    out = tvm.runtime.tensor(np.zeros((1, tokens, heads * head_dim), "float32"), dev)
    lib["main"](*args, out)
    return out.numpy(), ref


@pytest.mark.parametrize("tokens, capacity, heads, head_dim, kv_dtype, past", [
    (8, 8, 2, 16, "float32", 0),  # the whole cache is the prompt
    (6, 13, 3, 80, "float16", 5),  # 2-query blocks, a capacity off the 16-key tiles, Phi-2's head size
    (12, 40, 2, 24, "int8", 7),  # the int8 cache's scales; value rows of 3 vectors
    (4, 37, 1, 8, "float32", 33),  # one block after a long past
])
def test_fused_attention_equals_numpy(tokens, capacity, heads, head_dim, kv_dtype, past):
    got, want = _run(tokens, capacity, heads, head_dim, kv_dtype, past)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("kv_dtype", ["float32", "int8"])
def test_keys_after_the_prompt_are_never_read(kv_dtype):
    """The masked part of the cache (and any capacity after the prompt) is not computed: NaN there changes
    nothing (the unfused kernels compute the whole square and mask it)."""
    got, want = _run(8, 29, 2, 16, kv_dtype, 9, poison=True)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * max(1.0, np.abs(want).max()))


def test_bad_shapes_and_dtypes_say_what_in_one_line():
    with pytest.raises(ValueError, match="even number of tokens and head_dim a multiple of 8, not 5 and 16"):
        prefill_attention(5, 8, 1, 16)
    with pytest.raises(ValueError, match="not 4 and 12"):
        prefill_attention(4, 8, 1, 12)
    with pytest.raises(ValueError, match="the KV cache is one of float32, float16, int8, not 'bfloat16'"):
        prefill_attention(4, 8, 1, 16, "bfloat16")


def _calls(model, func="prefill"):
    from tvm import relax

    return [b.value.args[0].name_hint for blk in model.mod[func].body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", None) == "relax.call_tir"]


def test_the_int8_prefill_calls_the_fused_kernel_and_unfused_keeps_three():
    fused = pm.build_model("reduced", 1, capacity=12, compute="int8", prompt=8)
    assert fused.prefill_attention == "fused"
    calls = _calls(fused)
    assert sum(n.startswith("prefill_attention") for n in calls) == 1
    assert not any(n.startswith(("attn_score", "softmax", "attn_value")) for n in calls), calls
    assert any(n.startswith("attn_score") for n in _calls(fused, "layer"))  # the decode step is not changed
    unfused = pm.build_model("reduced", 1, capacity=12, compute="int8", prompt=8, prefill_attention="unfused")
    assert unfused.prefill_attention == "unfused"
    assert not any(n.startswith("prefill_attention") for n in _calls(unfused))
    float_prompt = pm.build_model("reduced", 1, capacity=12, prompt=8)  # any target: the three kernels
    assert float_prompt.prefill_attention == "unfused"
    with pytest.raises(ValueError, match="prefill_attention must be one of fused, unfused, not 'flash'"):
        pm.build_model("reduced", 1, capacity=12, compute="int8", prompt=8, prefill_attention="flash")


def test_a_prompt_as_long_as_the_window_and_its_next_token_fit():
    """The cache holds context + prompt + tokens - 1 positions (the last token is never fed back): a prompt
    filling the whole window still gives its next token, the float path's; one more token overflows."""
    from tvm_ext.bench.phi2.prompt import prompt_rows
    from tvm_ext.workloads.phi2.layers import CONFIGS

    cfg = dict(CONFIGS["reduced"], max_positions=16)
    out = prompt_rows(("int8",), config=cfg, layers=1, prompt=16, tokens=1, repeat=1, log=lambda m: None)
    assert out["capacity"] == 16 and out["prefill_attention"] == "fused"
    assert len(out["rows"][0]["generated"]) == 1 and out["rows"][0]["vs_float"]["first_token_same"]
    with pytest.raises(ValueError, match="context overflow: 17 positions"):
        prompt_rows(("int8",), config=cfg, layers=1, prompt=16, tokens=2, repeat=1, log=lambda m: None)
