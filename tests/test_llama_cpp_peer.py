"""llama.cpp as the Phi-2 prefill peer (tvm_ext/bench/phi2/llama_cpp.py): Q4_0 packing, the GGUF the phi2 loader
expects, llama-bench's JSON and the one-line errors. The default run builds nothing; the slow test builds (or
reuses) llama-bench and runs it on the reduced model. No test asserts a timing."""
import stat
import json
import subprocess
import sys

import numpy as np
import pytest

from tvm_ext.bench.phi2 import llama_cpp as lc

# `llama-bench -m phi2-reduced-L1.gguf -p 128,512 -n 0 -t 2 -r 3 -o json -fa 0`, llama.cpp 0c1e570 (sdist
# llama-cpp-python 0.3.36) on the 2-core AMD EPYC build VM: the keys we read and a few beside them, values verbatim.
SAMPLE = """[
 {
  "build_commit": "0c1e570",
  "cpu_info": "AMD EPYC",
  "model_type": "phi2 ?B Q4_0",
  "n_threads": 2,
  "flash_attn": 0,
  "n_prompt": 128,
  "n_gen": 0,
  "n_depth": 0,
  "avg_ns": 342648482,
  "stddev_ns": 7484892,
  "avg_ts": 373.680931,
  "stddev_ts": 8.257491,
  "samples_ns": [
   348009646,
   334097035,
   345838765
  ],
  "samples_ts": [
   367.806,
   383.122,
   370.115
  ]
 },
 {
  "build_commit": "0c1e570",
  "cpu_info": "AMD EPYC",
  "model_type": "phi2 ?B Q4_0",
  "n_threads": 2,
  "flash_attn": 0,
  "n_prompt": 512,
  "n_gen": 0,
  "n_depth": 0,
  "avg_ns": 358642139,
  "stddev_ns": 13007817,
  "avg_ts": 1428.842105,
  "stddev_ts": 51.089452,
  "samples_ns": [
   373141832,
   354786668,
   347997919
  ],
  "samples_ts": [
   1372.13,
   1443.12,
   1471.27
  ]
 }
]"""


def decode_q4_0(raw, k):
    """NumPy reading of Q4_0 bytes (rows, k/32*18) -> float32 (rows, k): (nibble - 8) * d."""
    blocks = raw.reshape(raw.shape[0], k // 32, 18)
    d = blocks[..., :2].copy().view("<f2")[..., 0].astype(np.float32)
    qs = blocks[..., 2:]
    q = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.float32)  # elements j, then j + 16
    return ((q - 8) * d[..., None]).reshape(raw.shape[0], k)


def test_q4_0_pack_round_trip():
    rng = np.random.default_rng(1)
    q = rng.integers(0, 16, size=(3, 96), dtype=np.uint8)
    d = rng.uniform(0.5, 1.5, size=(3, 3)).astype(np.float16)
    raw = lc.q4_0_pack(q, d)
    assert raw.shape == (3, 3 * 18) and raw.dtype == np.uint8
    want = (q.astype(np.float32) - 8) * np.repeat(d.astype(np.float32), 32, axis=1)
    np.testing.assert_array_equal(decode_q4_0(raw, 96), want)
    # byte layout of one block: fp16 d little-endian, element j low nibble / j + 16 high nibble of byte 2 + j
    assert raw[0, :2].tobytes() == d[0, 0].astype("<f2").tobytes()
    assert raw[0, 2 + 5] == q[0, 5] | (q[0, 21] << 4)
    with pytest.raises(ValueError, match="multiple of 32"):
        lc.q4_0_pack(q[:, :40], d[:, :2])


def test_random_q4_weights_are_small_and_finite():
    raw = lc._random_tensor(np.random.default_rng(0), (64, 2560), "q4")
    w = decode_q4_0(raw, 2560)
    assert np.isfinite(w).all()
    assert 0.3 < float(np.sqrt((w.astype(np.float64) ** 2).sum(axis=1).mean())) < 2.0  # rows of norm ~1


def _gguf_or_skip():
    try:
        return lc.import_gguf()
    except ValueError as e:
        pytest.skip(f"no gguf package anywhere (vendored gguf-py under {lc.default_cache_dir()} or PyPI): {e}")


def test_reduced_gguf_has_the_tensors_phi2_loads(tmp_path):
    gguf = _gguf_or_skip()
    path = lc.write_phi2_gguf(tmp_path / "m.gguf", layers=1, seed=3, config="reduced")
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]  # no temporary left behind
    r = gguf.GGUFReader(path)
    c = lc.phi2_config("reduced")
    h, f, v = c["hidden"], c["mlp"], c["vocab"]
    # ggml order (ne0 first), as src/models/phi2.cpp creates them
    want = {"token_embd.weight": ([h, v], "Q4_0"), "output_norm.weight": ([h], "F32"),
            "output_norm.bias": ([h], "F32"), "output.weight": ([h, v], "Q4_0"), "output.bias": ([v], "F32"),
            "blk.0.attn_norm.weight": ([h], "F32"), "blk.0.attn_norm.bias": ([h], "F32"),
            "blk.0.attn_qkv.weight": ([h, 3 * h], "Q4_0"), "blk.0.attn_qkv.bias": ([3 * h], "F32"),
            "blk.0.attn_output.weight": ([h, h], "Q4_0"), "blk.0.attn_output.bias": ([h], "F32"),
            "blk.0.ffn_up.weight": ([h, f], "Q4_0"), "blk.0.ffn_up.bias": ([f], "F32"),
            "blk.0.ffn_down.weight": ([f, h], "Q4_0"), "blk.0.ffn_down.bias": ([h], "F32")}
    got = {t.name: ([int(x) for x in t.shape], t.tensor_type.name) for t in r.tensors}
    assert got == want

    def field(key):
        fl = r.fields[key]
        val = fl.parts[fl.data[0]]
        return bytes(val).decode() if fl.types[0] == gguf.GGUFValueType.STRING else val[0].item()

    assert field("general.architecture") == "phi2"
    assert field("tokenizer.ggml.model") == "none"
    assert (field("phi2.embedding_length"), field("phi2.attention.head_count"), field("phi2.feed_forward_length"),
            field("phi2.vocab_size"), field("phi2.block_count"), field("phi2.rope.dimension_count")) == \
        (h, c["heads"], f, v, 1, 32)
    assert field("phi2.attention.head_count_kv") == c["heads"]
    assert abs(field("phi2.attention.layer_norm_epsilon") - 1e-5) < 1e-9
    # our NumPy reading of the stored bytes agrees with gguf-py's Q4_0 dequantizer
    t = next(t for t in r.tensors if t.name == "blk.0.ffn_down.weight")
    raw = np.asarray(t.data, dtype=np.uint8).reshape(h, f // 32 * 18)
    np.testing.assert_array_equal(decode_q4_0(raw, f), gguf.quants.dequantize(raw, t.tensor_type).reshape(h, f))
    assert lc.write_phi2_gguf(tmp_path / "again.gguf", layers=1, seed=3, config="reduced").read_bytes() == \
        path.read_bytes()  # seeded: the cache key (config, seed) names one file


def test_gguf_import_without_yaml():
    _gguf_or_skip()
    # the module file alone (importing tvm_ext would import TVM: seconds), with yaml made unimportable
    code = ("import importlib.util, sys; sys.modules['yaml'] = None\n"
            f"spec = importlib.util.spec_from_file_location('llama_cpp', {lc.__file__!r})\n"
            "lc = importlib.util.module_from_spec(spec); spec.loader.exec_module(lc)\n"
            "g = lc.import_gguf(); print(g.GGMLQuantizationType.Q4_0.value, 'yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "False"]


def test_parse_captured_bench_json():
    rows = lc.parse_bench_json(SAMPLE)
    assert [r["n_prompt"] for r in rows] == [128, 512]
    assert rows[0]["tok_s"] == pytest.approx(373.680931) and rows[0]["tok_s_std"] == pytest.approx(8.257491)
    assert rows[1]["tok_s_samples"] == [1372.13, 1443.12, 1471.27]
    assert {(r["threads"], r["build_commit"], r["cpu_info"], r["flash_attn"]) for r in rows} == \
        {(2, "0c1e570", "AMD EPYC", 0)}
    with pytest.raises(ValueError, match="not JSON") as e:
        lc.parse_bench_json("error: failed to load model\n")
    assert "\n" not in str(e.value)


def _script(path, body):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.parametrize("case,match", [
    ("missing", "llama-bench not found at .*find_or_build"),
    ("not_executable", "is not executable"),
    ("not_a_binary", "does not run"),
    ("fails", r"llama-bench failed \(exit 3\): cannot load model"),
    ("no_json", "not JSON"),
])
def test_bad_binary_one_line_errors(tmp_path, case, match):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    bench = tmp_path / "llama-bench"
    if case == "not_executable":
        bench.write_text("")
    elif case == "not_a_binary":
        bench.write_bytes(b"\x7fELF garbage")
        bench.chmod(0o755)
    elif case == "fails":
        _script(bench, 'echo "  -fa, --flash-attn <on|off|auto>"\necho "error:" >&2\n'
                       'echo cannot load model >&2\nexit 3')
    elif case == "no_json":
        _script(bench, "echo '| model | size |'")
    with pytest.raises(ValueError, match=match) as e:
        lc.run_llama_bench(bench, model, log=lambda s: None)
    assert "\n" not in str(e.value)


def test_bench_command_flash_attn_only_where_supported(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    old = _script(tmp_path / "old-bench", "echo usage")
    new = _script(tmp_path / "new-bench", 'echo "  -fa, --flash-attn <on|off|auto>   (default: auto)"')
    assert lc.bench_command(old, model, (128, 512), 2, 3)[1:] == \
        ["-m", str(model), "-p", "128,512", "-n", "0", "-t", "2", "-r", "3", "-o", "json"]
    assert lc.bench_command(new, model, (128,), 4, 1)[-2:] == ["-fa", "0"]
    assert lc.bench_command(new, model, (), 4, 1, decode=(16, 512), flash=(0, 1))[-2:] == ["-fa", "0,1"]


def test_decode_command_and_rows(tmp_path):
    """Token generation after a cached context: -p 0 -n TOKENS -d CONTEXT, and only the tg rows read."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    bench = _script(tmp_path / "bench", "echo usage")
    assert lc.bench_command(bench, model, (), 2, 3, decode=(16, 512))[1:] == \
        ["-m", str(model), "-p", "0", "-n", "16", "-d", "512", "-t", "2", "-r", "3", "-o", "json"]
    tg = dict(json.loads(SAMPLE)[0], n_prompt=0, n_gen=16, n_depth=512, avg_ts=21.5)
    rows = lc.parse_bench_json(json.dumps(json.loads(SAMPLE) + [tg]), decode=True)
    assert [(r["n_gen"], r["n_depth"], r["tok_s"]) for r in rows] == [(16, 512, 21.5)]
    assert len(lc.parse_bench_json(json.dumps(json.loads(SAMPLE) + [tg]))) == 2  # the pp rows only


def test_model_missing_is_one_line(tmp_path):
    bench = _script(tmp_path / "llama-bench", "echo usage")
    with pytest.raises(ValueError, match="model not found"):
        lc.run_llama_bench(bench, tmp_path / "absent.gguf")


def test_find_or_build_reuses_and_explains_missing_tools(tmp_path, monkeypatch):
    bin_dir = tmp_path / "llama.cpp" / "build" / "bin"
    bin_dir.mkdir(parents=True)
    _script(bin_dir / "llama-bench", "echo usage")
    (tmp_path / "llama.cpp" / lc.MARKER).write_text('{"commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f"}')
    got = lc.find_or_build(tmp_path, log=lambda s: pytest.fail(f"reuse should not build: {s}"))
    assert got == {"bench": str(bin_dir / "llama-bench"), "source": str(tmp_path / "llama.cpp"),
                   "commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f"}
    monkeypatch.setattr(lc.shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match=r"^cmake not found: install cmake to build llama.cpp's llama-bench$"):
        lc.find_or_build(tmp_path / "empty", log=lambda s: None)
    assert not (tmp_path / "empty").exists()


def test_sdist_commit_from_git_head_or_changelog(tmp_path):
    head = tmp_path / ".git" / "modules" / "vendor" / "llama.cpp" / "HEAD"
    (tmp_path / "CHANGELOG.md").write_text(
        f"## [Unreleased]\n\n## [{lc.LLAMA_CPP_PYTHON_VERSION}]\n\n- feat: update llama.cpp to "
        "ggml-org/llama.cpp@0c1e57098\n\n## [0.3.35]\n\n- feat: update llama.cpp to ggml-org/llama.cpp@4df29be4f\n")
    assert lc._sdist_commit(tmp_path) == "0c1e57098"
    head.parent.mkdir(parents=True)
    head.write_text("0c1e57098bba43ac29e6e3b677cdceebdd22334f\n")
    assert lc._sdist_commit(tmp_path) == "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


@pytest.mark.slow
def test_llama_bench_end_to_end_reduced(tmp_path):
    """Builds llama-bench into the default cache (minutes, once) or reuses it; runs the reduced model."""
    cache = lc.default_cache_dir()
    lines = []
    res = lc.prefill_peer(cache, prompts=(32, 64), threads=2, log=lines.append, config="reduced", layers=1,
                          repetitions=1)
    assert res["peer"] == "llama.cpp" and res["commit"].startswith("0c1e570")
    assert [r["n_prompt"] for r in res["rows"]] == [32, 64]
    assert all(r["tok_s"] > 0 and r["flash_attn"] == 0 and r["threads"] == 2 for r in res["rows"])
    assert res["rows"][0]["build_commit"] in (res["commit"][:7], "unknown")  # "unknown": built without git
    assert any("llama-bench" in ln for ln in lines)
