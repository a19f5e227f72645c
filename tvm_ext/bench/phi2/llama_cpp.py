"""llama.cpp as the CPU peer for Phi-2 prompt processing (prefill), measured on the same host.

`prefill_peer` builds llama.cpp's `llama-bench` from a pinned source release, writes a Phi-2-shaped GGUF with
random weights and every matrix in Q4_0 (the format of tvm_ext's q4 path: blocks of 32, one fp16 scale), and
returns llama-bench's prompt-processing tokens/s. Random weights: the Q4_0 kernels' speed does not depend on the
values, and no model download is needed. ``tvm-ext generate --prompt N --peers llama.cpp`` runs it in the same
process as tvm_ext's prefill (DESIGN.md "Measuring"); the build, the sdist and the GGUFs are cached in
``default_cache_dir()`` (~1.8 GB).  The same build makes llama-quantize and our greedy-decoding program
(``llama_greedy``: llama.cpp's own tokens and logits on a GGUF, for the reference tests).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

# The llama-cpp-python sdist vendors llama.cpp (vendor/llama.cpp, with gguf-py) and pip fetches it by exact
# version: pinning it pins the peer to a known llama.cpp (0.3.36 vendors ggml-org/llama.cpp@0c1e57098), so a
# figure can be reproduced and a change in the peer is a deliberate edit here, not whatever is newest.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_SERVER=OFF", "-DBUILD_SHARED_LIBS=OFF")
BUILT = ("llama-bench", "llama-quantize", "tvm-ext-greedy")  # what a build makes (llama_programs: the last)
MARKER = "tvm_ext_build.json"  # written next to the built tree: version and commit of the vendored llama.cpp

Q4_0_TYPE, MOSTLY_Q4_0, F32_TYPE = 2, 2, 0  # ggml_type Q4_0, llama_ftype MOSTLY_Q4_0, ggml_type F32
QK4_0 = 32


def phi2_config(config: str = "full") -> dict:
    """The shapes of tvm_ext's Phi-2 model (``workloads.phi2.layers.CONFIGS``: "full" is Phi-2, "reduced" is
    for tests), its LayerNorm epsilon and context window: the peer's GGUF has the same shapes as our model."""
    from tvm_ext.workloads.phi2.layers import CONFIGS, EPS
    from tvm_ext.workloads.phi2.model import MAX_POSITIONS

    if config not in CONFIGS:
        raise ValueError(f"config must be one of {sorted(CONFIGS)}, not {config!r}")
    return dict(CONFIGS[config], eps=EPS, ctx=MAX_POSITIONS)


def default_cache_dir() -> Path:
    return Path(os.environ.get("TVM_EXT_LLAMA_CPP_CACHE") or Path.home() / ".cache" / "tvm_ext" / "llama_cpp")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def _run(cmd, what, log_file=None, cwd=None):
    """Run cmd; output goes to log_file (appended) if given. Failure -> one-line ValueError."""
    try:
        proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    except OSError as e:
        raise ValueError(f"{what} could not start: {e}") from None
    if log_file is not None:
        with open(log_file, "a") as f:
            f.write(f"$ {' '.join(map(str, cmd))}\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        where = f" (full log: {log_file})" if log_file else ""
        raise ValueError(f"{what} failed (exit {proc.returncode}): {_last_line(proc.stderr or proc.stdout)}{where}")
    return proc


def _sdist_commit(root: Path) -> str:
    """The vendored llama.cpp's commit as the sdist records it: the submodule's git HEAD, else the CHANGELOG."""
    head = root / ".git" / "modules" / "vendor" / "llama.cpp" / "HEAD"
    if head.is_file() and re.fullmatch(r"[0-9a-f]{40}", head.read_text().strip()):
        return head.read_text().strip()
    log = root / "CHANGELOG.md"
    section = log.read_text().split(f"## [{LLAMA_CPP_PYTHON_VERSION}]", 1) if log.is_file() else []
    m = re.search(r"llama\.cpp@([0-9a-f]{7,40})", section[1].split("\n## [", 1)[0]) if len(section) == 2 else None
    return m.group(1) if m else "unknown"


def _bench_commit(bench: Path) -> str:
    proc = subprocess.run([str(bench), "--version"], capture_output=True, text=True)
    m = re.search(r"commit ([0-9a-f]+)", proc.stdout + proc.stderr)
    return m.group(1) if m else "unknown"


def find_or_build(cache_dir, log=print, targets=("llama-bench",)) -> dict:
    """llama.cpp's ``targets`` under cache_dir/llama.cpp/build/bin (``BUILT``: llama-bench, llama-quantize and
    our ``llama_greedy`` program), built from the pinned sdist where one is absent.  A build makes all of
    ``BUILT`` in a fresh tree (CMake's cache names the tree's path, so a finished tree, once moved into place, is
    not built in again) and replaces an older tree that lacked some.  One build at a time per cache: a lock file
    in it, so a second process asking waits, then finds the binaries."""
    cache_dir = Path(cache_dir)
    source = cache_dir / "llama.cpp"
    bench = source / "build" / "bin" / "llama-bench"
    if all((source / "build" / "bin" / t).is_file() for t in targets):
        return _found(source, bench)
    what = ", ".join(targets)
    if shutil.which("cmake") is None:
        raise ValueError(f"cmake not found: install cmake to build llama.cpp's {what}")
    if not (os.environ.get("CXX") or any(shutil.which(c) for c in ("c++", "g++", "clang++"))):
        raise ValueError(f"C++ compiler not found: install g++ (or set CXX) to build llama.cpp's {what}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    import fcntl

    with open(cache_dir / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, however the process ends
        if not all((source / "build" / "bin" / t).is_file() for t in targets):
            _build(cache_dir, source, log)
    return _found(source, bench)


def _found(source: Path, bench: Path) -> dict:
    marker = source / MARKER
    commit = json.loads(marker.read_text())["commit"] if marker.is_file() else _bench_commit(bench)
    return {"bench": str(bench), "source": str(source), "commit": commit}


def _add_programs(src: Path):
    """Our own small programs against libllama (``llama_programs.PROGRAMS``) as examples of the tree."""
    from .llama_programs import PROGRAMS

    listing = src / "examples" / "CMakeLists.txt"
    for name, code in PROGRAMS.items():
        d = src / "examples" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "main.cpp").write_text(code)
        (d / "CMakeLists.txt").write_text(f"add_executable({name} main.cpp)\n"
                                          f"target_link_libraries({name} PRIVATE llama ${{CMAKE_THREAD_LIBS_INIT}})\n"
                                          f"target_compile_features({name} PRIVATE cxx_std_17)\n")
        listing.write_text(listing.read_text() + f"\nadd_subdirectory({name})\n")


def _build(cache_dir: Path, source: Path, log):
    """All of ``BUILT`` in a tree extracted from the sdist, then moved to ``source``."""
    build_log = cache_dir / "build.log"
    build_log.write_text("")
    name = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
    sdist = cache_dir / f"{name}.tar.gz"
    if not sdist.is_file():
        log(f"llama.cpp: downloading llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} sdist into {cache_dir}")
        _run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
              "--no-binary", ":all:", "--no-deps", "-d", cache_dir], "pip download of llama-cpp-python", build_log)
        if not sdist.is_file():
            raise ValueError(f"pip download did not produce {sdist}")
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=cache_dir))
    try:
        log(f"llama.cpp: extracting {sdist.name}")
        with tarfile.open(sdist) as tar:
            kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(tmp, **kw)
        root = tmp / name
        src = root / "vendor" / "llama.cpp"
        if not (src / "CMakeLists.txt").is_file():
            raise ValueError(f"{sdist.name} has no vendor/llama.cpp/CMakeLists.txt")
        _add_programs(src)
        commit = _sdist_commit(root)
        jobs = os.cpu_count() or 1
        log(f"llama.cpp: configuring {commit[:9]} with cmake (log: {build_log})")
        _run(["cmake", "-S", src, "-B", src / "build", *CMAKE_FLAGS], "cmake configure of llama.cpp", build_log)
        log(f"llama.cpp: building {', '.join(BUILT)} with -j{jobs} (several minutes on 2 cores)")
        t0 = time.time()
        _run(["cmake", "--build", src / "build", "--target", *BUILT, "-j", jobs],
             f"cmake build of {', '.join(BUILT)}", build_log)
        for target in BUILT:
            if not (src / "build" / "bin" / target).is_file():
                raise ValueError(f"build finished but made no build/bin/{target} (log: {build_log})")
        (src / MARKER).write_text(json.dumps({"llama_cpp_python": LLAMA_CPP_PYTHON_VERSION, "commit": commit}))
        if source.exists():  # an older tree without some of the binaries
            shutil.rmtree(source)
        os.replace(src, source)
        log(f"llama.cpp: built {source / 'build' / 'bin'} in {time.time() - t0:.0f} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def import_gguf(cache_dir=None):
    """The gguf-py package vendored with the built llama.cpp (cache_dir, then the default cache), else PyPI's."""
    for base in ([Path(cache_dir)] if cache_dir else []) + [default_cache_dir()]:
        pkg = base / "llama.cpp" / "gguf-py"
        if (pkg / "gguf" / "__init__.py").is_file() and str(pkg) not in sys.path:
            sys.path.insert(0, str(pkg))
            break
    try:
        import gguf
    except ModuleNotFoundError as e:
        if e.name != "yaml":
            raise ValueError("gguf package not found: run find_or_build(cache_dir) once (it brings llama.cpp's "
                             "gguf-py) or pip install gguf") from None
        # gguf-py imports yaml only to read model cards (gguf/metadata.py), which nothing here does
        for mod in [m for m in sys.modules if m == "gguf" or m.startswith("gguf.")]:
            del sys.modules[mod]
        sys.modules["yaml"] = type(sys)("yaml")
        try:
            import gguf
        finally:
            del sys.modules["yaml"]
    return gguf


def q4_0_pack(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Q4_0 blocks of rows of q (uint8 0..15, shape (..., K)) with scales d (fp16, shape (..., K/32)).

    Bytes (..., K/32*18): per block fp16 d, then 16 bytes: element j in the low nibble of byte j, element j+16 in
    the high nibble. Element value = (q - 8) * d.
    """
    *lead, k = q.shape
    if k % QK4_0:
        raise ValueError(f"Q4_0 needs rows that are a multiple of {QK4_0} long, got {k}")
    qb = q.reshape(*lead, k // QK4_0, QK4_0)
    out = np.empty((*lead, k // QK4_0, 18), np.uint8)
    out[..., :2] = np.ascontiguousarray(d, dtype="<f2").view(np.uint8).reshape(*lead, k // QK4_0, 2)
    out[..., 2:] = (qb[..., :16] & 15) | (qb[..., 16:] << 4)
    return out.reshape(*lead, k // QK4_0 * 18)


def phi2_tensors(layers=32, config="full"):
    """(name, numpy shape, 'q4' | 'f32' | 'one') for every tensor llama.cpp's phi2 loads (src/models/phi2.cpp).

    Numpy shape = ggml's ne reversed: the last axis is the contiguous one (ne0), the one Q4_0 blocks run along.
    """
    c = phi2_config(config)
    h, f, v = c["hidden"], c["mlp"], c["vocab"]
    if c["heads"] * c["head_dim"] != h:
        raise ValueError(f"config {config}: heads x head_dim != hidden")
    specs = [("token_embd.weight", (v, h), "q4")]
    for i in range(layers):
        b = f"blk.{i}."
        specs += [(b + "attn_norm.weight", (h,), "one"), (b + "attn_norm.bias", (h,), "f32"),
                  (b + "attn_qkv.weight", (3 * h, h), "q4"), (b + "attn_qkv.bias", (3 * h,), "f32"),
                  (b + "attn_output.weight", (h, h), "q4"), (b + "attn_output.bias", (h,), "f32"),
                  (b + "ffn_up.weight", (f, h), "q4"), (b + "ffn_up.bias", (f,), "f32"),
                  (b + "ffn_down.weight", (h, f), "q4"), (b + "ffn_down.bias", (h,), "f32")]
    specs += [("output_norm.weight", (h,), "one"), ("output_norm.bias", (h,), "f32"),
              ("output.weight", (v, h), "q4"), ("output.bias", (v,), "f32")]
    return specs


def _random_tensor(rng, shape, kind):
    if kind == "one":
        return np.ones(shape, np.float32)
    if kind == "f32":
        return rng.uniform(-0.02, 0.02, shape).astype(np.float32)
    rows, k = shape
    q = rng.integers(0, 16, size=shape, dtype=np.uint8)
    # (q - 8) has mean square 21.5: d ~ 1/sqrt(21 K) keeps each output's variance near the input's
    d = (rng.uniform(0.5, 1.5, (rows, k // QK4_0)) / np.sqrt(21.0 * k)).astype(np.float16)
    return q4_0_pack(q, d)


def write_phi2_gguf(path, layers=32, seed=0, config="full", cache_dir=None):
    """A Phi-2-shaped GGUF (arch phi2) with random weights: matrices Q4_0, norms and biases F32.

    Tensors are generated and written one at a time (the largest, token_embd/output, is 74 MB in Q4_0), to a
    temporary name renamed into place at the end. Tokenizer: "none" with phi2.vocab_size, which llama.cpp
    fills with dummy tokens; llama-bench feeds random token ids and never tokenizes text.
    """
    gguf = import_gguf(cache_dir)
    c = phi2_config(config)
    path = Path(path)
    specs = phi2_tensors(layers, config)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    w = gguf.GGUFWriter(tmp, "phi2")
    try:
        w.add_name(f"phi2-{config}-random-q4_0")
        w.add_uint32("phi2.context_length", c["ctx"])
        w.add_uint32("phi2.embedding_length", c["hidden"])
        w.add_uint32("phi2.feed_forward_length", c["mlp"])
        w.add_uint32("phi2.block_count", layers)
        w.add_uint32("phi2.attention.head_count", c["heads"])
        w.add_uint32("phi2.attention.head_count_kv", c["heads"])
        w.add_float32("phi2.attention.layer_norm_epsilon", c["eps"])
        w.add_uint32("phi2.rope.dimension_count", c["rotary"])
        w.add_uint32("phi2.vocab_size", c["vocab"])
        w.add_uint32("general.file_type", MOSTLY_Q4_0)
        w.add_uint32("general.quantization_version", 2)
        w.add_string("tokenizer.ggml.model", "none")
        for name, shape, kind in specs:
            if kind == "q4":
                nbytes = shape[0] * shape[1] // QK4_0 * 18
                w.add_tensor_info(name, (shape[0], nbytes // shape[0]), np.dtype(np.uint8), nbytes,
                                  raw_dtype=gguf.GGMLQuantizationType.Q4_0)
            else:
                w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        rng = np.random.default_rng(seed)
        for name, shape, kind in specs:
            w.write_tensor_data(_random_tensor(rng, shape, kind))
        w.close()
        os.replace(tmp, path)
    finally:
        w.close()
        if tmp.exists():
            tmp.unlink()
    return path


def parse_bench_json(text: str, decode: bool = False) -> list:
    """Prompt-processing rows (``decode``: token-generation rows) of `llama-bench -o json` output."""
    try:
        tests = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"llama-bench output is not JSON ({e}): {_last_line(text)[:200]}") from None
    return [{"n_prompt": t["n_prompt"], "tok_s": t["avg_ts"], "tok_s_std": t["stddev_ts"],
             "tok_s_samples": t.get("samples_ts"), "threads": t["n_threads"], "build_commit": t["build_commit"],
             "cpu_info": t["cpu_info"], "flash_attn": t.get("flash_attn"), "n_gen": t.get("n_gen", 0),
             "n_depth": t.get("n_depth", 0)}
            for t in tests if (t.get("n_gen", 0) > 0 and t.get("n_prompt", 0) == 0 if decode
                               else t.get("n_gen", 0) == 0 and t.get("n_prompt", 0) > 0)]


def bench_command(bench, gguf, prompts=(128, 512), threads=2, repetitions=3, decode=None, flash=(0,)) -> list:
    """The llama-bench command line; flash attention ``flash`` (off, or (0, 1): a row for each, llama-bench
    runs both) where the build has -fa (its default is auto).
    ``decode`` = (tokens, context): token generation after that many cached positions instead."""
    bench = Path(bench)
    if not bench.is_file():
        raise ValueError(f"llama-bench not found at {bench}: run find_or_build(cache_dir) to build it")
    if not os.access(bench, os.X_OK):
        raise ValueError(f"llama-bench at {bench} is not executable")
    if not Path(gguf).is_file():
        raise ValueError(f"model not found: {gguf}")
    try:
        helptext = subprocess.run([str(bench), "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ValueError(f"llama-bench at {bench} does not run: {e}") from None
    work = (["-p", "0", "-n", str(decode[0]), "-d", str(decode[1])] if decode
            else ["-p", ",".join(map(str, prompts)), "-n", "0"])
    cmd = [str(bench), "-m", str(gguf), *work, "-t", str(threads), "-r", str(repetitions), "-o", "json"]
    if re.search(r"-fa\b|--flash-attn", helptext.stdout + helptext.stderr):
        cmd += ["-fa", ",".join(str(int(f)) for f in flash)]
    return cmd


def run_llama_bench(bench, gguf, prompts=(128, 512), threads=2, repetitions=3, log=print, decode=None,
                    flash=(0,)) -> list:
    """Prompt-processing tokens/s of llama-bench on gguf, one row per prompt length (``decode``:
    token-generation tokens/s; ``flash``: a row per flash-attention setting; see ``bench_command``)."""
    cmd = bench_command(bench, gguf, prompts, threads, repetitions, decode, flash)
    log("llama.cpp: " + " ".join(cmd))
    out = _run(cmd, "llama-bench").stdout
    rows = parse_bench_json(out, decode=bool(decode))
    if not rows:
        raise ValueError(f"llama-bench printed no {'token-generation' if decode else 'prompt-processing'} rows: "
                         f"{_last_line(out)[:200]}")
    return rows


def prepare_peer(cache_dir=None, log=print, config="full", seed=0, layers=32) -> dict:
    """llama-bench (built or reused) and the Phi-2 Q4_0 GGUF (written or reused) on this host:
    {"bench", "commit", "gguf", "gguf_write_s", "host_cpu"}."""
    cache_dir = Path(cache_dir or default_cache_dir())
    paths = find_or_build(cache_dir, log=log)
    model = cache_dir / f"phi2-{config}-L{layers}-seed{seed}-q4_0.gguf"
    write_s = None
    if not model.is_file():
        log(f"llama.cpp: writing {model.name}")
        t0 = time.time()
        write_phi2_gguf(model, layers=layers, seed=seed, config=config, cache_dir=cache_dir)
        write_s = time.time() - t0
        log(f"llama.cpp: wrote {model} ({model.stat().st_size / 2**20:.0f} MiB) in {write_s:.1f} s")
    from tvm_ext.bench.dram import cpu_info  # pylint: disable=import-outside-toplevel

    host = cpu_info()  # llama-bench itself reports only a model name
    log(f"llama.cpp: host CPU {host['name']}: {' '.join(host['flags'])}")
    return {"bench": paths["bench"], "commit": paths["commit"], "gguf": model, "gguf_write_s": write_s,
            "host_cpu": host}


def peer_record(prepared: dict, command: list, rows: list) -> dict:
    """The JSON record of a llama.cpp measurement."""
    return {"peer": "llama.cpp", "commit": prepared["commit"], "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
            "host_cpu": prepared["host_cpu"], "gguf": str(prepared["gguf"]),
            "gguf_write_s": prepared["gguf_write_s"], "command": command, "rows": rows}


def prefill_peer(cache_dir=None, prompts=(128, 512), threads=2, log=print, config="full", seed=0, layers=32,
                 repetitions=3) -> dict:
    """llama.cpp's Phi-2 Q4_0 prefill tokens/s on this host: builds (or reuses) llama-bench and the GGUF
    (its decode: ``prepare_peer`` and ``run_llama_bench(..., decode=...)``, as ``tvm-ext generate`` does)."""
    prepared = prepare_peer(cache_dir, log, config, seed, layers)
    command = bench_command(prepared["bench"], prepared["gguf"], prompts, threads, repetitions)
    return peer_record(prepared, command, run_llama_bench(prepared["bench"], prepared["gguf"], prompts, threads,
                                                          repetitions, log=log))
