"""The decoder's KV cache stored narrower than the activations (tvm_ext.workloads.phi2.kv_cache): float16, and
int8 with one scale per (position, head), on the reduced config (2 layers, 4 heads x 64), kernels unscheduled.

Fed the same tokens after the same past, the float16 and int8 caches' logits follow the float32 cache's
within their dtype's rounding; layer 0's written keys and values are the float32 cache's rounded (its input
is the embedding alone, the same for all three); the bytes per token count what the arrays hold; our CPU
attention rules still take the attention kernels, which read the narrow cache with the cast in the load (no
float32 copy of it; float16 widened by vcvtph2ps).  No timing asserted."""
import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm_ext.bench.phi2 import decode as phi2_e2e  # noqa: E402
from tvm_ext.cli.main import main  # noqa: E402
from tvm.ir.expr import TensorLoad  # noqa: E402
from tvm.s_tir.stmt import SBlock  # noqa: E402

from tvm_ext.scheduling import schedule_module  # noqa: E402
from tvm_ext.targets import resolve_target  # noqa: E402
from tvm_ext.tir_utils import collect  # noqa: E402
from tvm_ext.workloads.phi2 import kv_cache as kvc  # noqa: E402
from tvm_ext.workloads.phi2 import model as pm  # noqa: E402

PAST, TOKENS = 5, [7, 300, 811, 5, 42, 1000]
CAPACITY = 32  # a multiple of the attention rule's 16 parts (its one-query value form, the one decode runs), and
# twice them: the parts' partial outputs (16 x heads x head_dim) are half the cache, a copy of it would be all
# The logits' largest error against the float32 cache's, over their largest |logit|.  A float16 cache element is
# off by up to 2^-11 of itself (4.9e-4 relative), an int8 one by up to half a step, 1/254 = 3.9e-3 of its
# (position, head)'s largest |value|; each attention output averages such errors, and two layers and lm_head
# carry them on: 8x each dtype's per-element bound (measured: up to 2.4e-4 and 5.3e-3 over these 6 steps).
TOL = {"float16": 8 * 2.0 ** -11, "int8": 8 / 254}


@pytest.fixture(scope="module")
def decoders():
    out, share = {}, None
    for kv in kvc.KV_DTYPES:
        model = pm.build_model("reduced", layers=2, capacity=CAPACITY, seed=1, kv_dtype=kv)
        out[kv] = pm.Decoder(model, tvm.compile(model.mod, target="llvm"), share=share)
        share = share or out[kv]
    return out


@pytest.fixture(scope="module")
def decoded(decoders):
    """{kv dtype: (the past as stored, [logits of each step])}, the same tokens fed to each."""
    out = {}
    for kv, dec in decoders.items():
        past = dec.fill_past(PAST, seed=2, keep=True)
        out[kv] = past, [dec.step(t, PAST + i) for i, t in enumerate(TOKENS)]
    return out


def test_narrow_caches_follow_the_float32_cache(decoded):
    ref = np.array(decoded["float32"][1])
    scale = np.abs(ref).max()
    errs = {}
    for kv in ("float16", "int8"):
        errs[kv] = np.abs(np.array(decoded[kv][1]) - ref).max(axis=1) / scale
        assert errs[kv].max() < TOL[kv], (kv, errs[kv])
        assert (errs[kv] > 0).all()  # each step read a cache that is not the float32 one
    assert errs["int8"].mean() > errs["float16"].mean()
    # each step attends to a different cache: the logits move from step to step
    assert not np.allclose(ref[0], ref[1], atol=1e-2)


def test_the_past_and_the_written_positions_are_the_float32_cache_rounded(decoders, decoded):
    past32 = decoded["float32"][0]
    for kv in ("float16", "int8"):
        for (k, v), (k32, v32) in zip(decoded[kv][0], past32):
            for got, want in ((k, k32), (v, v32)):
                if kv == "float16":
                    np.testing.assert_array_equal(got, want.astype("float16"))
                else:
                    q, s = kvc.quantize_np(want)
                    np.testing.assert_array_equal(got, q * s[..., None])
    new = slice(PAST, PAST + len(TOKENS))
    k32, v32 = (a.numpy()[:, new] for a in decoders["float32"].caches[0][:2])
    k16, v16 = (a.numpy()[:, new] for a in decoders["float16"].caches[0][:2])
    assert k16.dtype == np.float16
    np.testing.assert_array_equal(k16, k32.astype("float16"))
    np.testing.assert_array_equal(v16, v32.astype("float16"))
    k8, v8, ks, vs = (a.numpy() for a in decoders["int8"].caches[0])
    for q, s, want in ((k8, ks, k32), (v8, vs, v32)):
        wq, ws = kvc.quantize_np(want)
        assert q.dtype == np.int8 and s.shape == (1, 4, CAPACITY)
        assert np.abs(q[:, new].astype(int) - wq).max() <= 1  # the same rule, rounding aside
        np.testing.assert_allclose(s[:, :, new], ws.transpose(0, 2, 1), rtol=1e-6)


def test_bytes_per_token_count_the_cache_arrays(decoders):
    f32 = decoders["float32"].model.kv_bytes(10)
    assert decoders["float16"].model.kv_bytes(10) == f32 / 2
    heads = pm.CONFIGS["reduced"]["heads"]
    assert decoders["int8"].model.kv_bytes(10) == f32 / 4 + 2 * 2 * 10 * heads * 4  # + a float32 scale per head
    for dec in decoders.values():  # the whole capacity's bytes are what the arrays hold
        held = sum(a.numpy().nbytes for arrays in dec.caches for a in arrays)
        assert dec.model.kv_bytes(CAPACITY) == held


def test_decode_rows_per_cache_dtype():
    rows = phi2_e2e.decode_e2e_rows(("none",), "reduced", layers=1, tokens=2, context=4, rounds=1,
                                    log=lambda m: None, bandwidth_mb=16, kv_dtypes=("float32", "int8"))
    assert [r["kv_cache"] for r in rows] == ["float32", "int8"]
    f32, i8 = rows
    assert i8["kv_bytes"] < f32["kv_bytes"] / 3 and i8["bound_tok_s"] > f32["bound_tok_s"]
    assert "vs_float32_cache" not in f32
    cmp = i8["vs_float32_cache"]
    assert cmp["steps_compared"] >= 1 and 0 < cmp["max_abs_logit_err_steps"] < TOL["int8"] * cmp["max_abs_logit"]


@pytest.mark.parametrize("kv", ["float16", "int8"])
def test_our_attention_rules_read_the_narrow_cache_in_place(decoders, kv):
    """The rule set's CPU schedules take the attention (contraction_cpu) and softmax (row_norm_cpu); the
    scheduled attention kernels read the cache as stored and allocate nothing the size of it."""
    model = decoders[kv].model
    mod, used = schedule_module(model.mod, resolve_target("llvm"), "rule", skip=("kv_write",))
    assert used["attn_score"] == used["attn_value"] == "contraction_cpu" and used["softmax"] == "row_norm_cpu"
    cache = CAPACITY * 4 * 64
    for name in ("attn_score", "attn_value"):
        func = mod[name]
        assert kv in {str(load.source.dtype) for load in collect(func.body, TensorLoad)}  # the cache as stored
        allocated = [b for block in collect(func.body, SBlock) for b in block.alloc_buffers]
        assert all(int(np.prod([int(e) for e in b.shape])) < cache for b in allocated), (name, allocated)
    if kv == "float16":  # the widening is a vector instruction on the loaded halves
        znver3 = tvm.target.Target({"kind": "llvm", "mcpu": "znver3"})
        for name in ("attn_score", "attn_value"):
            func = mod[name].with_attr("global_symbol", name)  # a kernel of the module compiled alone
            asm = tvm.compile(tvm.IRModule({name: func}), target=znver3).mod.inspect_source("asm")
            assert "vcvtph2ps" in asm, name


def test_bad_cache_dtype(capsys):
    with pytest.raises(ValueError, match="KV cache is one of float32, float16, int8"):
        pm.build_model("reduced", kv_dtype="bfloat16")
    for argv in (["--kv-cache", "fp8"], ["--kv-cache", "float16,", "--prompt", "2"]):
        assert main(["generate", "--config", "reduced"] + argv) == 2
        err = capsys.readouterr().err.strip()
        assert "--kv-cache" in err and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.slow  # ~8 s each on 2 cores: a prefill model scheduled by our rules
@pytest.mark.parametrize("kv", ["float16", "int8"])
def test_prefill_writes_the_cache_the_steps_write(kv):
    """A compiled prefill (several queries: contraction_cpu's tiled forms, the cache copied per head as stored)
    gives the logits of the same tokens stepped one by one, on the narrow cache."""
    model = pm.build_model("reduced", layers=2, capacity=CAPACITY, seed=1, prompt=4, kv_dtype=kv)
    mod, used = schedule_module(model.mod, resolve_target("llvm"), "rule", skip=("kv_write", "kv_write_prompt"))
    assert {used[k] for k in used if k.startswith(("attn_score", "attn_value"))} == {"contraction_cpu"}
    dec = pm.Decoder(model, tvm.compile(mod, target="llvm"))
    dec.fill_past(PAST, seed=2)
    at_once = dec.prefill(TOKENS[:4], start=PAST)
    dec.fill_past(PAST, seed=2)
    for i, t in enumerate(TOKENS[:4]):
        stepped = dec.step(t, PAST + i)
    np.testing.assert_allclose(at_once, stepped, rtol=0, atol=1e-4 * np.abs(stepped).max())
