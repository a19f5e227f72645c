"""Numerical equivalence of our schedules: every candidate of ``tvm_ext.space(llvm)``
computes what the unscheduled function computes.

The corpus is a list of ``Case``s: PrimFuncs from TVM's operator library (topi:
conv2d NHWC/NCHW int8 and float, depthwise conv, dense, batch_matmul, pooling,
softmax, layer_norm, elementwise chains, reductions, transpose, fixed-point
requantize), tvm_ext's quantized ops (the seed's conv + requantize epilogue with
its constant-scalar block, residual add-requantize, int pooling) and tasks of the
workloads.  Shapes are drawn from a seeded generator.

For each case the unscheduled function is built for llvm and run on random inputs
(integers small enough not to overflow, requantize parameters in their valid
ranges); then candidates are sampled from the design space (random decisions, all
postprocessors), built, run on the same inputs and compared: exactly for integer
outputs, with a tolerance for floating point (reductions may be reassociated).
A mismatch or an exception is a failure; its function, inputs' seed, trace and
scheduled module are written to a ``.py`` file that reproduces it.

Public API
----------
Case(name, build, int_ranges=None, rtol=1e-4, atol=1e-4)   build(rng) -> PrimFunc
corpus(seed=0) -> list[Case]                  the full corpus (>= 30 cases)
FAST = (...)                                  names of the CI subset
check_case(case, target, candidates=2, seed=0, failure_dir=None, runner=None) -> CaseResult
CandidateRunner(timeout)                      candidates built and run in a worker, time-limited
run_corpus(cases, target, candidates, seed, failure_dir, progress, runner, on_result) -> list[CaseResult]
"""
from __future__ import annotations

import os
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

import tvm
from tvm import te, tirx, topi

from tvm_ext.arrays import param_buffers, random_arrays

DEFAULT_FAILURE_DIR = os.environ.get(
    "TVM_EXT_EQUIV_DIR", os.path.join(tempfile.gettempdir(), "tvm_ext_equivalence"))


@dataclass
class Case:
    """One corpus entry.

    build:      rng -> PrimFunc (shapes drawn from rng); the last parameter(s) are outputs
    int_ranges: {param name: (low, high)} for integer inputs that need a valid range
                (requantize multipliers and shifts); others get small random values
    """

    name: str
    build: Callable[[np.random.RandomState], tirx.PrimFunc]
    int_ranges: dict = field(default_factory=dict)
    rtol: float = 1e-4
    atol: float = 1e-4


@dataclass
class CaseResult:
    name: str
    ok: bool
    candidates: int = 0
    message: str = ""
    failure_file: Optional[str] = None
    seconds: float = 0.0
    timeouts: int = 0  # candidates not checked: no build within the runner's time limit


# --------------------------------------------------------------------------- corpus
def _pf(args) -> tirx.PrimFunc:
    return te.create_prim_func(args).with_attr("global_symbol", "main")


def _pick(rng, values):
    return values[rng.randint(len(values))]


def _conv_nhwc(dtype, out_dtype, kernel=None, stride=None):
    def build(rng):
        n, h, c, k = 1, _pick(rng, [6, 7, 8, 10]), _pick(rng, [4, 8, 16]), _pick(rng, [4, 8, 16])
        kh = kernel or _pick(rng, [1, 3])
        s = stride or _pick(rng, [1, 2])
        data = te.placeholder((n, h, h, c), dtype, name="data")
        w = te.placeholder((kh, kh, c, k), "int8" if "int" in dtype else dtype, name="weight")
        out = topi.nn.conv2d_nhwc(data, w, s, kh // 2, 1, out_dtype=out_dtype)
        return _pf([data, w, out])
    return build


def _conv_nchw(dtype, out_dtype):
    def build(rng):
        n, h, c, k = 1, _pick(rng, [6, 8, 9]), _pick(rng, [3, 4, 8]), _pick(rng, [4, 8])
        kh, s = _pick(rng, [1, 3]), _pick(rng, [1, 2])
        data = te.placeholder((n, c, h, h), dtype, name="data")
        w = te.placeholder((k, c, kh, kh), dtype, name="weight")
        out = topi.nn.conv2d_nchw(data, w, s, kh // 2, 1, out_dtype=out_dtype)
        return _pf([data, w, out])
    return build


def _depthwise(rng):
    h, c = _pick(rng, [6, 8]), _pick(rng, [4, 8, 16])
    data = te.placeholder((1, h, h, c), "float32", name="data")
    w = te.placeholder((3, 3, c, 1), "float32", name="weight")
    out = topi.nn.depthwise_conv2d_nhwc(data, w, 1, 1, 1, kernel_layout="HWOI")
    return _pf([data, w, out])


def _dense(dtype, out_dtype, bias_relu=False):
    def build(rng):
        m, k, n = _pick(rng, [1, 4, 16]), _pick(rng, [16, 32, 64]), _pick(rng, [8, 16, 32])
        x = te.placeholder((m, k), dtype, name="x")
        w = te.placeholder((n, k), dtype, name="w")
        y = topi.nn.dense(x, w, out_dtype=out_dtype)
        args = [x, w]
        if bias_relu:
            b = te.placeholder((n,), out_dtype or dtype, name="b")
            y = topi.nn.relu(topi.add(y, b))
            args.append(b)
        return _pf(args + [y])
    return build


def _batch_matmul(dtype, out_dtype):
    def build(rng):
        b, m, k, n = _pick(rng, [1, 2, 4]), _pick(rng, [4, 8]), _pick(rng, [16, 32]), _pick(rng, [8, 16])
        x = te.placeholder((b, m, k), dtype, name="x")
        y = te.placeholder((b, n, k), dtype, name="y")
        return _pf([x, y, topi.nn.batch_matmul(x, y, out_dtype=out_dtype)])
    return build


def _pool(kind, layout):
    def build(rng):
        h, c = _pick(rng, [6, 8, 9]), _pick(rng, [4, 8])
        shape = (1, h, h, c) if layout == "NHWC" else (1, c, h, h)
        x = te.placeholder(shape, "float32", name="x")
        y = topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), kind, layout=layout,
                           count_include_pad=False)
        return _pf([x, y])
    return build


def _global_pool(rng):
    x = te.placeholder((1, _pick(rng, [4, 8]), _pick(rng, [5, 7]), _pick(rng, [5, 7])), "float32", name="x")
    return _pf([x, topi.nn.global_pool(x, "avg", layout="NCHW")])


def _adaptive_pool(rng):
    # input sizes divisible by the output's: otherwise topi's pooling windows have a
    # data-dependent extent and MetaSchedule's DisallowDynamicLoop rejects every
    # candidate of any rule set (TVM's default one too), leaving nothing to compare
    x = te.placeholder((1, 4, _pick(rng, [6, 9, 12]), 8), "float32", name="x")
    return _pf([x, topi.nn.adaptive_pool(x, (3, 2), "max", layout="NCHW")])


def _softmax(log=False):
    def build(rng):
        x = te.placeholder((_pick(rng, [2, 4, 8]), _pick(rng, [16, 33, 64])), "float32", name="x")
        return _pf([x, (topi.nn.log_softmax if log else topi.nn.softmax)(x)])
    return build


def _layer_norm(rng):
    r, c = _pick(rng, [2, 4]), _pick(rng, [16, 32, 48])
    x = te.placeholder((r, c), "float32", name="x")
    g = te.placeholder((c,), "float32", name="gamma")
    b = te.placeholder((c,), "float32", name="beta")
    return _pf([x, g, b, topi.nn.layer_norm(x, g, b, axis=[1])])


def _elementwise_chain(rng):
    shape = (_pick(rng, [3, 8, 16]), _pick(rng, [5, 16, 31]))
    a, b, c = (te.placeholder(shape, "float32", name=n) for n in "abc")
    y = topi.multiply(topi.exp(topi.add(a, b)), topi.nn.relu(c))
    return _pf([a, b, c, y])


def _activation_chain(rng):
    shape = (_pick(rng, [4, 16]), _pick(rng, [7, 32]))
    a = te.placeholder(shape, "float32", name="a")
    return _pf([a, topi.sigmoid(topi.tanh(topi.multiply(a, topi.sigmoid(a))))])


def _int_chain(rng):
    shape = (_pick(rng, [4, 16]), _pick(rng, [8, 33]))
    a = te.placeholder(shape, "int32", name="a")
    b = te.placeholder(shape, "int32", name="b")
    y = topi.cast(topi.clip(topi.add(topi.multiply(a, b), a), 0, 255), "uint8")
    return _pf([a, b, y])


def _reduce(op, dtype="float32"):
    def build(rng):
        x = te.placeholder((_pick(rng, [3, 8]), _pick(rng, [16, 40]), _pick(rng, [4, 6])), dtype, name="x")
        return _pf([x, op(x, axis=1)])
    return build


def _argmax(rng):
    x = te.placeholder((_pick(rng, [4, 8]), _pick(rng, [17, 32])), "float32", name="x")
    return _pf([x, topi.argmax(x, axis=1)])


def _transpose(rng):
    x = te.placeholder((_pick(rng, [2, 4]), _pick(rng, [8, 16]), _pick(rng, [3, 8])), "float32", name="x")
    return _pf([x, topi.transpose(x, (2, 0, 1))])


def _transpose_add(rng):
    m, n = _pick(rng, [8, 16]), _pick(rng, [4, 12])
    x = te.placeholder((m, n), "int32", name="x")
    y = te.placeholder((n, m), "int32", name="y")
    return _pf([x, y, topi.add(topi.transpose(x), y)])


def _fixed_point_multiply(rng):
    x = te.placeholder((_pick(rng, [4, 16]), _pick(rng, [8, 32])), "int32", name="x")
    return _pf([x, topi.fixed_point_multiply(x, int(rng.randint(1 << 30, (1 << 31) - 1)), -int(rng.randint(1, 8)))])


def _qmsa_requantize(rng):
    rows, cols = _pick(rng, [4, 16, 32]), _pick(rng, [8, 16, 64])
    x = te.placeholder((rows, cols), "int32", name="x")
    m, lsh, rsh = (te.placeholder((cols,), "int32", name=n) for n in ("mult", "lshift", "rshift"))
    y = te.compute((rows, cols), lambda i, j: tirx.q_multiply_shift_per_axis(
        x[i, j], m[j], lsh[j], rsh[j], 31, False, True), name="y")
    return _pf([x, m, lsh, rsh, y])


_QNN_RANGES = {"p4": (1 << 30, (1 << 31) - 1), "p5": (0, 1), "p6": (1, 12),
               "mult": (1 << 30, (1 << 31) - 1), "lshift": (0, 1), "rshift": (1, 12),
               "mult_a": (1 << 30, (1 << 31) - 1), "mult_b": (1 << 30, (1 << 31) - 1),
               "rshift_a": (1, 12), "rshift_b": (1, 12)}
# fused requantize tasks of the int8 workloads: weight, zp correction, bias, multiplier, shifts
_TASK_RANGES = {"param_3": (1 << 30, (1 << 31) - 1), "param_4": (0, 1), "param_5": (1, 12)}


def _seed_conv(kernel):
    def build(rng):
        from tvm_ext.workloads.conv2d_int8 import seed_conv_primfunc

        return seed_conv_primfunc(image=_pick(rng, [5, 7, 8]), channels=_pick(rng, [4, 8, 16]),
                                  out_channels=_pick(rng, [8, 16]), kernel=kernel, stride=_pick(rng, [1, 2]))
    return build


def _qnn_requantize(rng):
    from tvm_ext.workloads import qnn

    shape = (1, _pick(rng, [3, 5]), _pick(rng, [3, 5]), _pick(rng, [8, 16]))
    c = shape[-1]
    acc = te.placeholder(shape, "int32", name="acc")
    zp = te.placeholder((1, 1, 1, c), "int32", name="zp_corr")
    bias = te.placeholder((1, 1, 1, c), "int32", name="bias")
    mult, lsh, rsh = (te.placeholder((c,), "int32", name=n) for n in ("mult", "lshift", "rshift"))
    out = qnn.requantize(acc, zp, bias, mult, lsh, rsh, zp_out=int(rng.randint(0, 100)))
    return _pf([acc, zp, bias, mult, lsh, rsh, out])


def _qnn_add_requantize(rng):
    from tvm_ext.workloads import qnn

    shape = (1, _pick(rng, [3, 4]), _pick(rng, [3, 4]), _pick(rng, [8, 16]))
    c = shape[-1]
    a = te.placeholder(shape, "uint8", name="a")
    b = te.placeholder(shape, "uint8", name="b")
    ma, ra, mb, rb = (te.placeholder((c,), "int32", name=n) for n in ("mult_a", "rshift_a", "mult_b", "rshift_b"))
    out = qnn.add_requantize(a, b, ma, ra, mb, rb, zp_a=3, zp_b=5, zp_out=7)
    return _pf([a, b, ma, ra, mb, rb, out])


def _qnn_pool(kind):
    def build(rng):
        from tvm_ext.workloads import qnn

        x = te.placeholder((1, _pick(rng, [6, 8]), _pick(rng, [6, 8]), _pick(rng, [4, 8])), "uint8", name="x")
        out = qnn.max_pool2d(x) if kind == "max" else qnn.global_avg_pool(x)
        return _pf([x, out])
    return build


def _qnn_dense(rng):
    from tvm_ext.workloads import qnn

    x = te.placeholder((1, _pick(rng, [16, 32])), "uint8", name="x")
    w = te.placeholder((_pick(rng, [8, 16]), int(x.shape[1])), "int8", name="w")
    return _pf([x, w, qnn.dense(x, w)])


def _workload_task(name, index=0, **options):
    def build(_rng):
        from tvm.s_tir.meta_schedule.relax_integration import extract_tasks
        import tvm_ext.workloads as workloads

        wl = workloads.get(name, **options)
        tasks = extract_tasks(wl.mod, tvm.target.Target({"kind": "llvm"}))
        convs = [t for t in tasks if "conv" in t.task_name or "matmul" in t.task_name] or tasks
        func = convs[index % len(convs)].dispatched[0]["main"]
        return func.with_attr("global_symbol", "main")
    return build


def corpus(seed: int = 0) -> list:
    """The full corpus (shapes are drawn from ``seed`` when each case is built)."""
    del seed  # shapes are drawn in check_case from (seed, name)
    f32, i8 = "float32", "int8"
    cases = [
        Case("conv2d_nhwc_f32", _conv_nhwc(f32, f32), rtol=1e-4, atol=1e-3),
        Case("conv2d_nhwc_f32_3x3_s1", _conv_nhwc(f32, f32, kernel=3, stride=1), rtol=1e-4, atol=1e-3),
        Case("conv2d_nchw_f32", _conv_nchw(f32, f32), rtol=1e-4, atol=1e-3),
        Case("conv2d_nhwc_int8", _conv_nhwc(i8, "int32")),
        Case("conv2d_nhwc_uint8", _conv_nhwc("uint8", "int32", kernel=3)),
        Case("conv2d_nchw_int8", _conv_nchw(i8, "int32")),
        Case("depthwise_conv2d_nhwc_f32", _depthwise, atol=1e-3),
        Case("dense_f32", _dense(f32, f32), atol=1e-3),
        Case("dense_int8", _dense(i8, "int32")),
        Case("dense_bias_relu_f32", _dense(f32, f32, bias_relu=True), atol=1e-3),
        Case("batch_matmul_f32", _batch_matmul(f32, f32), atol=1e-3),
        Case("batch_matmul_int8", _batch_matmul(i8, "int32")),
        Case("max_pool2d_nhwc", _pool("max", "NHWC")),
        Case("avg_pool2d_nchw", _pool("avg", "NCHW")),
        Case("global_avg_pool_nchw", _global_pool),
        Case("adaptive_max_pool", _adaptive_pool),
        Case("softmax", _softmax()),
        Case("log_softmax", _softmax(log=True)),
        Case("layer_norm", _layer_norm, atol=1e-3),
        Case("elementwise_chain_f32", _elementwise_chain),
        Case("activation_chain_f32", _activation_chain),
        Case("elementwise_chain_int", _int_chain),
        Case("sum_f32", _reduce(topi.sum), atol=1e-3),
        Case("max_f32", _reduce(topi.max)),
        Case("sum_int32", _reduce(topi.sum, "int32")),
        Case("argmax", _argmax),
        Case("transpose", _transpose),
        Case("transpose_add_int", _transpose_add),
        Case("fixed_point_multiply", _fixed_point_multiply),
        Case("q_multiply_shift_per_axis", _qmsa_requantize, int_ranges=_QNN_RANGES),
        Case("qnn_requantize_const_scalar", _qnn_requantize, int_ranges=_QNN_RANGES),
        Case("qnn_conv3x3_requantize_seed", _seed_conv(3), int_ranges=_QNN_RANGES),
        Case("qnn_conv1x1_requantize_seed", _seed_conv(1), int_ranges=_QNN_RANGES),
        Case("qnn_add_requantize", _qnn_add_requantize, int_ranges=_QNN_RANGES),
        Case("qnn_max_pool2d", _qnn_pool("max")),
        Case("qnn_global_avg_pool", _qnn_pool("avg")),
        Case("qnn_dense", _qnn_dense),
        Case("task_conv2d_int8", _workload_task("conv2d-int8", image=6, channels=8), int_ranges=_TASK_RANGES),
        Case("task_resnet50_int8_conv", _workload_task("resnet50-int8", index=3, image=32),
             int_ranges=_TASK_RANGES),
        Case("task_phi2_decode_matmul", _workload_task("phi2-decode", config="reduced", context=8),
             rtol=1e-3, atol=1e-3),
    ]
    return cases


# the CI subset: the seed pattern, an int8 conv, a float reduction chain, a requantize op,
# and the u8 x s8 dense that VNNI tensorization once got wrong (on VNNI hosts)
FAST = ("qnn_conv3x3_requantize_seed", "dense_int8", "softmax", "q_multiply_shift_per_axis", "qnn_dense")


# --------------------------------------------------------------------------- running
def run_mod(mod: tvm.IRModule, target, arrays: list) -> list:
    """Build ``mod`` for ``target``, run ``main`` on copies of ``arrays``, return all buffers."""
    with tvm.transform.PassContext(opt_level=3):
        exe = tvm.compile(mod, target=target)
    tensors = [tvm.runtime.tensor(a.copy()) for a in arrays]
    exe["main"](*tensors)
    return [t.numpy() for t in tensors]


class BuildTimeout(Exception):
    """A candidate did not build and run within the time limit (it was not checked)."""


def _worker_main(conn) -> None:  # runs in the spawned worker process
    import tvm as tvm_  # pylint: disable=import-outside-toplevel,reimported

    while True:
        job = conn.recv()
        if job is None:
            return
        mod_json, target_spec, arrays = job
        try:
            outs = run_mod(tvm_.ir.load_json(mod_json), tvm_.target.Target(target_spec), arrays)
            conn.send(("ok", outs))
        except Exception as err:  # noqa: BLE001 -- sent back and raised in the parent
            conn.send(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))


class CandidateRunner:
    """``run_mod`` in a worker process with a time limit.

    Some valid candidates take LLVM minutes to compile (explicit unroll 512 over a loop
    nest with a dequantize computed inside: seen at 12 s and at over 5 min on the
    reduced Phi-2 matmul). MetaSchedule's builder drops those by its timeout; here the
    worker is killed after ``timeout`` seconds, the candidate is counted as not checked
    (``BuildTimeout``) and a fresh worker takes the next one. One worker serves all
    candidates, so TVM is imported once.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._proc = self._conn = None

    def _start(self) -> None:
        import multiprocessing  # pylint: disable=import-outside-toplevel

        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_worker_main, args=(child,), daemon=True)
        self._proc.start()
        child.close()

    def run(self, mod: tvm.IRModule, target, arrays: list) -> list:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        self._conn.send((tvm.ir.save_json(mod), dict(target.export()), arrays))
        if not self._conn.poll(self.timeout):
            self.close(kill=True)
            raise BuildTimeout(f"not built and run within {self.timeout:g} s")
        status, payload = self._conn.recv()
        if status == "error":
            raise RuntimeError(payload)
        return payload

    def close(self, kill: bool = False) -> None:
        if self._proc is None:
            return
        try:
            if kill:
                self._proc.kill()
            else:
                self._conn.send(None)
            self._proc.join(5)
        except (OSError, EOFError, BrokenPipeError):
            pass
        self._proc = self._conn = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def compare(expected: list, got: list, names: list, case: Case) -> Optional[str]:
    """None when equal (exact for integers, tolerance for floats), else a one-line diff."""
    for name, e, g in zip(names, expected, got):
        if e.dtype.kind in "f":
            if not np.allclose(g, e, rtol=case.rtol, atol=case.atol, equal_nan=True):
                err = float(np.nanmax(np.abs(g.astype("float64") - e.astype("float64"))))
                return f"{name}: max abs error {err:.3g} > rtol {case.rtol} / atol {case.atol}"
        elif not np.array_equal(g, e):
            n = int(np.count_nonzero(g != e))
            return f"{name}: {n} of {e.size} elements differ (exact compare)"
    return None


def _write_failure(failure_dir: str, case: Case, seed: int, func, sch, message: str, tb: str) -> str:
    os.makedirs(failure_dir, exist_ok=True)
    path = os.path.join(failure_dir, f"{case.name}-seed{seed}-{int(time.time() * 1000) % 10**8}.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"# tvm_ext equivalence failure: case {case.name!r}, seed {seed}\n")
        f.write("# " + message.replace("\n", "\n# ") + "\n")
        if tb:
            f.write("# traceback:\n# " + tb.strip().replace("\n", "\n# ") + "\n")
        f.write("# Reproduce: python -c \"from tvm_ext.check.equivalence import corpus, check_case; "
                "from tvm_ext.targets import resolve_target; "
                f"print(check_case([c for c in corpus() if c.name == '{case.name}'][0], "
                f"resolve_target('llvm'), seed={seed}))\"\n\n")
        f.write("import tvm\nfrom tvm.script import tirx as T\nfrom tvm.s_tir import Schedule\n\n")
        f.write("# ---- the unscheduled function\n")
        f.write(func.script() if hasattr(func, "script") else str(func))
        f.write("\n\n# ---- the schedule trace (apply to Schedule(main))\n")
        if sch is not None:
            f.write("\n".join(f"# {ln}" for ln in str(sch.trace).splitlines()))
            f.write("\n\n# ---- the scheduled module\n")
            f.write("\n".join(f"# {ln}" for ln in sch.mod.script().splitlines()))
        f.write("\n")
    return path


def check_case(case: Case, target, candidates: int = 2, seed: int = 0, *, space=None,
               failure_dir: Optional[str] = None, runner: Optional[CandidateRunner] = None) -> CaseResult:
    """Sample ``candidates`` schedules of ``case`` from ``tvm_ext.space(target)`` and
    compare each with the unscheduled function on random inputs.

    ``runner``: build and run the candidates in its worker with a time limit (a candidate
    over it is counted in ``timeouts``, not checked); None: in this process, no limit.
    The case is ok when no candidate differs and at least one was compared."""
    import zlib

    import tvm_ext
    from tvm_ext.tune.sampling import sample_candidates

    start = time.time()
    failure_dir = failure_dir or DEFAULT_FAILURE_DIR
    case_seed = (seed * 1000003 + zlib.crc32(case.name.encode())) % (2**31)
    rng = np.random.RandomState(case_seed)
    func = sch = None
    try:
        func = case.build(rng)
        mod = tvm.IRModule({"main": func})
        arrays = random_arrays(func, np.random.default_rng(case_seed), case.int_ranges)
        names = [name for name, _, _ in param_buffers(func)]
        expected = run_mod(mod, target, arrays)
        space = space or tvm_ext.space(target)
        schs = sample_candidates(mod, target, space, candidates, seed=case_seed, postprocs=list(space.postprocs))
        if not schs:
            return CaseResult(case.name, False, 0, "no candidate could be sampled",
                              _write_failure(failure_dir, case, seed, func, None, "no candidate sampled", ""),
                              time.time() - start)
        timeouts = 0
        for sch in schs:
            try:
                got = runner.run(sch.mod, target, arrays) if runner else run_mod(sch.mod, target, arrays)
            except BuildTimeout:
                timeouts += 1
                continue
            diff = compare(expected, got, names, case)
            if diff is not None:
                path = _write_failure(failure_dir, case, seed, func, sch, diff, "")
                return CaseResult(case.name, False, len(schs) - timeouts, diff, path, time.time() - start, timeouts)
        checked = len(schs) - timeouts
        note = f"{timeouts} of {len(schs)} candidates not built within {runner.timeout:g} s" if timeouts else ""
        return CaseResult(case.name, checked > 0, checked, note, None, time.time() - start, timeouts)
    except Exception as err:  # noqa: BLE001 -- any exception is a failing case, saved
        tb = traceback.format_exc()
        line = (str(err).strip().splitlines() or [repr(err)])[-1][:300]
        path = _write_failure(failure_dir, case, seed, func, sch, f"exception: {line}", tb) if func is not None else None
        return CaseResult(case.name, False, 0, f"exception: {line}", path, time.time() - start)


def describe(res: CaseResult) -> str:
    """One progress line for a checked case."""
    return (f"{res.name}: {res.candidates} candidates, {res.seconds:.1f} s, " + ("ok" if res.ok else "FAIL")
            + (f" {res.message}" if res.message else "") + (f" -> {res.failure_file}" if res.failure_file else ""))


def run_corpus(cases: list, target, candidates: int = 2, seed: int = 0, failure_dir: Optional[str] = None,
               progress: Optional[Callable[[str], None]] = None, runner: Optional[CandidateRunner] = None,
               on_result: Optional[Callable[[list], None]] = None) -> list:
    """check_case over ``cases``; returns the CaseResults. ``on_result`` gets the results so
    far after every case (to save them as they come)."""
    results = []
    for i, case in enumerate(cases):
        results.append(check_case(case, target, candidates, seed, failure_dir=failure_dir, runner=runner))
        if progress:
            progress(f"[{i + 1}/{len(cases)}] " + describe(results[-1]))
        if on_result:
            on_result(results)
    return results


__all__ = ["BuildTimeout", "Case", "CaseResult", "CandidateRunner", "FAST", "check_case", "corpus", "describe", "run_corpus"]
