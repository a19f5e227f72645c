"""TE building blocks of the quantized (uint8 x int8 -> int32) networks.

Each op has a NumPy twin with the same name and signature in ``qnn_reference``
(activations, then constant arrays, then keyword attributes). The requantize
epilogues hold their output zero point in a constant-scalar block: a 0-d
``te.compute`` with no inputs, like Relay's ``compile_engine_const``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, te, topi

from . import qnn_ort, qnn_reference as ref
from .qnn_te import _per_channel, _shl

Q = 31  # fractional bits of the fixed-point multipliers


def const_scalar(value: int, dtype: str = "int32", name: str = "compile_engine_const"):
    """A 0-d tensor computed by a block with no reads that stores a constant."""
    return te.compute((), lambda: tvm.tirx.const(int(value), dtype), name=name)


def _qmsa(x, mult, lshift, rshift, lshift_required=False):
    """``q_multiply_shift_per_axis(x, mult, lshift, rshift, 31, False, True)`` as in the seed
    (``lshift_required``: ``True`` there, for multipliers >= 1)."""
    return tvm.tirx.q_multiply_shift_per_axis(
        x,
        mult,
        lshift,
        rshift,
        tvm.tirx.const(Q, "int32"),
        tvm.tirx.const(bool(lshift_required), "bool"),
        tvm.tirx.const(True, "bool"),
    )


def _clip(x, lo=0, hi=255):
    return tvm.tirx.max(tvm.tirx.min(x, int(hi)), int(lo))


def _clip_u8(x, lo=0, hi=255):
    return _clip(x, lo, hi).astype("uint8")


NHWC_SPATIAL = (1, 2)  # axes of H and W in NHWC; NCHW[x]c has them at (2, 3)


def _pair(value) -> tuple[int, int]:
    """An int or an (h, w) pair as (h, w)."""
    return (int(value),) * 2 if np.ndim(value) == 0 else tuple(int(v) for v in value)


def _pads(pad) -> tuple[int, int, int, int]:
    """An int or ONNX-ordered (top, left, bottom, right) pads as a 4-tuple."""
    return (int(pad),) * 4 if np.ndim(pad) == 0 else tuple(int(p) for p in pad)


def _pad_hw(data, pad, value, name, spatial=NHWC_SPATIAL):
    top, left, bottom, right = _pads(pad)
    if not any((top, left, bottom, right)):
        return data
    before, after = [0] * len(data.shape), [0] * len(data.shape)
    (before[spatial[0]], before[spatial[1]]), (after[spatial[0]], after[spatial[1]]) = (top, left), (bottom, right)
    return topi.nn.pad(data, before, after, pad_value=value, name=name)


def conv2d_nhwc(data, weight, *, stride=1, pad=0, zp_in=0, groups=1):
    """Raw int32 accumulator of uint8 NHWC data x int8 HWIO weights; pads with ``zp_in``.

    ``stride``: int or (h, w); ``pad``: int or (top, left, bottom, right); ``groups``:
    weights are ``(KH, KW, C_in / groups, C_out)`` (depthwise: ``groups`` = C_in)."""
    n, h, w, _ = (int(d) for d in data.shape)
    kh, kw, cin, cout = (int(d) for d in weight.shape)
    (sh, sw), (top, left, bottom, right) = _pair(stride), _pads(pad)
    padded = _pad_hw(data, pad, tvm.tirx.const(int(zp_in), data.dtype), "pad_temp")
    ho, wo = (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1
    rh = te.reduce_axis((0, kh), name="rh")
    rw = te.reduce_axis((0, kw), name="rw")
    rc = te.reduce_axis((0, cin), name="rc")
    per_group = cout // groups

    def channel(o):
        return rc if groups == 1 else o // per_group * cin + rc

    return te.compute(
        (n, ho, wo, cout),
        lambda b, y, x, o: te.sum(
            padded[b, y * sh + rh, x * sw + rw, channel(o)].astype("int32")
            * weight[rh, rw, rc, o].astype("int32"),
            axis=[rh, rw, rc],
        ),
        name="conv2d_nhwc",
    )


def dense(data, weight):
    """Raw int32 accumulator of uint8 [N, K] data x int8 [units, K] weights."""
    n, k = (int(d) for d in data.shape)
    units = int(weight.shape[0])
    rk = te.reduce_axis((0, k), name="rk")
    return te.compute(
        (n, units),
        lambda b, u: te.sum(data[b, rk].astype("int32") * weight[u, rk].astype("int32"), axis=rk),
        name="dense",
    )


def requantize(acc, zp_corr, bias, mult, lshift, rshift, *, zp_out, lo=0, hi=255, left=0, channel_axes=None):
    """The seed's epilogue: ``clip(qmsa(acc - zp_corr + bias) + zp_out, lo, hi)`` as uint8
    (``lo``/``hi`` narrower than 0/255 hold a folded ReLU or Clip; ``left``: apply ``lshift``,
    for multipliers >= 1).

    By default the channel is the last axis of ``acc``: ``zp_corr`` and ``bias`` are
    shaped ``(1, ..., 1, C)``, ``mult``, ``lshift`` and ``rshift`` ``(C,)``. A packed
    layout names its channel axes (NCHW[cb]c: ``(1, 4)``) and passes the constants
    reshaped to them (``(1, C/cb, 1, 1, cb)`` and ``(C/cb, cb)``).
    """
    axes = channel_axes or (len(acc.shape) - 1,)

    def _body(*idx):
        return _requantized(acc, idx, axes, zp_corr, bias, mult, lshift, rshift, zp_out, left, lo, hi).astype("uint8")

    return te.compute(acc.shape, _body, name="T_cast")


def _requantized(acc, idx, axes, zp_corr, bias, mult, lshift, rshift, zp_out, left, lo=0, hi=255):
    """:func:`requantize`'s value at ``idx`` before its cast to uint8: int32 in [lo, hi]."""
    def at(const):
        return _per_channel(const, idx, axes)

    x = acc(*idx) - at(zp_corr) + at(bias)
    return _clip(_qmsa(x, at(mult), at(lshift), at(rshift), left) + const_scalar(zp_out)[()], lo, hi)


def add_requantize(a, b, mult_a, rshift_a, mult_b, rshift_b, *, zp_a, zp_b, zp_out, lo=0, hi=255,
                   channel_axes=None):
    """Residual add of two uint8 tensors, each requantized to the output scale (the seed's:
    each term rounded, half up). Per-channel constants as in :func:`requantize` (``(C,)`` on
    the last axis by default). An imported model adds as ORT does instead (``qnn_ort``)."""
    axes = channel_axes or (len(a.shape) - 1,)
    rescale = (mult_a, rshift_a, mult_b, rshift_b, zp_out, lo, hi)

    def _body(*idx):
        da, db = a(*idx).astype("int32") - int(zp_a), b(*idx).astype("int32") - int(zp_b)
        return _added(da, db, lambda c: _per_channel(c, idx, axes), *rescale)

    return te.compute(a.shape, _body, name="T_add")


def requantize_add_requantize(acc, zp_corr, bias, mult, lshift, rshift, b, mult_a, rshift_a, mult_b, rshift_b, *,
                              zp_req, lo_req=0, hi_req=255, left_req=0, zp_a, zp_b, zp_out, lo=0, hi=255,
                              channel_axes=None):
    """:func:`add_requantize` whose input ``a`` is :func:`requantize` of ``acc`` (its
    ``zp_out``, ``lo``, ``hi``, ``left`` given as ``zp_req``, ``lo_req``, ``hi_req``,
    ``left_req``), with that uint8 value kept in int32: the same numbers
    (``int32(uint8(clip(x, lo, hi)))`` is ``clip(x, lo, hi)`` for 0 <= lo <= hi <= 255), without
    the uint8 round trip a fused requantize -> add otherwise has (measured on the AMX layout's
    residual tasks: 5-13 % of the task)."""
    axes = channel_axes or (len(acc.shape) - 1,)
    rescale = (mult_a, rshift_a, mult_b, rshift_b, zp_out, lo, hi)

    def _body(*idx):
        u = _requantized(acc, idx, axes, zp_corr, bias, mult, lshift, rshift, zp_req, left_req, lo_req, hi_req)
        da, db = u - int(zp_a), b(*idx).astype("int32") - int(zp_b)
        return _added(da, db, lambda c: _per_channel(c, idx, axes), *rescale)

    return te.compute(acc.shape, _body, name="T_add")


def _added(da, db, at, mult_a, rshift_a, mult_b, rshift_b, zp_out, lo, hi):
    """The residual add of the two inputs' offsets ``da``, ``db`` (int32), as uint8."""
    zero = tvm.tirx.const(0, "int32")
    total = _qmsa(da, at(mult_a), zero, at(rshift_a)) + _qmsa(db, at(mult_b), zero, at(rshift_b))
    return _clip_u8(total + const_scalar(zp_out)[()], lo, hi)


def max_pool2d(data, *, size=3, stride=2, pad=1, spatial=NHWC_SPATIAL):
    """Max pool over H and W of uint8 data, padding with 0 (the uint8 minimum).

    ``size``/``stride``: int or (h, w); ``pad``: int or (top, left, bottom, right);
    ``spatial`` are the axes of H and W: NHWC by default, ``(2, 3)`` for NCHW[x]c.
    """
    ax_h, ax_w = spatial
    (kh, kw), (sh, sw), pads = _pair(size), _pair(stride), _pads(pad)
    padded = _pad_hw(data, pad, tvm.tirx.const(0, data.dtype), "pad_temp", spatial)
    shape = [int(d) for d in data.shape]
    for axis, k, s, p0, p1 in ((ax_h, kh, sh, pads[0], pads[2]), (ax_w, kw, sw, pads[1], pads[3])):
        shape[axis] = (shape[axis] + p0 + p1 - k) // s + 1
    rh = te.reduce_axis((0, kh), name="rh")
    rw = te.reduce_axis((0, kw), name="rw")

    def _body(*idx):
        at = list(idx)
        at[ax_h], at[ax_w] = idx[ax_h] * sh + rh, idx[ax_w] * sw + rw
        return te.max(padded(*at), axis=[rh, rw])

    return te.compute(shape, _body, name="pool_max")


def global_avg_pool(data, *, spatial=NHWC_SPATIAL):
    """Mean over H and W of uint8 data, rounded half up: ``(sum + hw/2) // hw``.

    The output drops the ``spatial`` axes: NHWC gives ``(N, C)``, NCHW[x]c ``(N, C/x, x)``.
    """
    h, w = (int(data.shape[axis]) for axis in spatial)
    shape = [int(d) for a, d in enumerate(data.shape) if a not in spatial]
    rh = te.reduce_axis((0, h), name="rh")
    rw = te.reduce_axis((0, w), name="rw")

    def _sum(*idx):
        at = list(idx)
        at[spatial[0]:spatial[0]] = [rh, rw]  # H and W are adjacent
        return te.sum(data(*at).astype("int32"), axis=[rh, rw])

    total = te.compute(shape, _sum, name="pool_sum")
    hw = h * w
    return te.compute(
        shape,
        lambda *idx: tvm.tirx.floordiv(total(*idx) + hw // 2, hw).astype("uint8"),
        name="pool_avg",
    )


def rescale(x, mult, rshift, *, zp_in, zp_out, lo=0, hi=255, lshift=0):
    """uint8 to another scale: ``clip(qmsa((x - zp_in) << lshift) + zp_out, lo, hi)``, per channel (last axis)."""
    zero = tvm.tirx.const(0, "int32")
    return te.compute(x.shape, lambda *i: _clip_u8(_qmsa(
        _shl(x(*i).astype("int32") - int(zp_in), lshift), mult[i[-1]], zero, rshift[i[-1]]) + int(zp_out), lo, hi),
        name="T_rescale")


def quantize(data, scale, *, zp_out, lo=0, hi=255):
    """float32 (NCHW, or 2-d) -> uint8 (NHWC): ``clip(round_half_even(x / scale) + zp_out, lo, hi)``,
    in float32 like ONNX QuantizeLinear; ``scale`` is a (1,) float32 tensor."""
    nchw = len(data.shape) == 4
    shape = [data.shape[i] for i in ((0, 2, 3, 1) if nchw else range(len(data.shape)))]

    def _body(*i):
        x = data(i[0], i[3], i[1], i[2]) if nchw else data(*i)
        q = tvm.tirx.nearbyint(x / scale[0]) + tvm.tirx.const(float(zp_out), "float32")
        return tvm.tirx.max(tvm.tirx.min(q, float(hi)), float(lo)).astype("uint8")

    return te.compute(shape, _body, name="quantize")


def dequantize(data, scale, *, zp_in):
    """uint8 (NHWC, or 2-d) -> float32 (NCHW): ``(x - zp_in) * scale`` like ONNX DequantizeLinear."""
    nchw = len(data.shape) == 4
    shape = [data.shape[i] for i in ((0, 3, 1, 2) if nchw else range(len(data.shape)))]

    def _body(*i):
        x = data(i[0], i[2], i[3], i[1]) if nchw else data(*i)
        return (x.astype("int32") - int(zp_in)).astype("float32") * scale[0]

    return te.compute(shape, _body, name="dequantize")


def flatten(data):
    """NHWC -> ``(N, C*H*W)`` in NCHW order (ONNX Flatten of the NCHW tensor)."""
    n, h, w, c = (int(d) for d in data.shape)
    return te.compute((n, c * h * w), lambda b, i: data[b, i // w % h, i % w, i // (h * w)], name="flatten")


def concat(*data, axis):
    """Concatenation of uint8 tensors of one scale along ``axis``."""
    return topi.concatenate(data, axis=axis)


# --------------------------------------------------------------------------------------
# QuantGraph: records a quantized network once (weights and quantization parameters drawn from a
# seed, calibrated on a sample input); emits it as a fused Relax module or runs it in NumPy.
# --------------------------------------------------------------------------------------

TARGET_RMS = 40.0  # calibrated spread of every requantized output around its zero point


@dataclass
class Value:
    """A tensor of the graph being recorded: its id, zero point and sample value."""

    index: int
    sample: np.ndarray
    zp: int = 0

    @property
    def shape(self):
        return self.sample.shape


@dataclass
class _Step:
    name: str
    op: str  # function name, the same in this module and in qnn_reference
    inputs: tuple
    consts: tuple
    attrs: dict


def fixed_point(scale) -> tuple[np.ndarray, np.ndarray]:
    """Real scales in [0, 1) as (multiplier < 2**31, right shift in [0, 31]) with
    ``scale ~= multiplier * 2**-(31 + shift)``; the multiplier is >= 2**30 unless the
    shift saturates."""
    scale = np.asarray(scale, np.float64)
    _, exp = np.frexp(scale)  # scale = frac * 2**exp, frac in [0.5, 1)
    rshift = np.clip(-exp, 0, 31)
    mult = np.minimum(np.round(scale * 2.0 ** (Q + rshift)), 2**31 - 1)
    return mult.astype(np.int32), rshift.astype(np.int32)


def random_images(batch: int, size: int, channels: int, seed: int) -> np.ndarray:
    """uint8 NHWC images from ``seed + 1``; image 0 is the same for every batch size."""
    rng = np.random.RandomState(seed + 1)
    return rng.randint(0, 256, (batch, size, size, channels)).astype(np.uint8)


def fuse(mod: tvm.IRModule) -> tvm.IRModule:
    """The Relax passes that turn one-PrimFunc-per-op into fused tasks."""
    seq = tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
            relax.transform.DeadCodeElimination(),
        ]
    )
    return seq(mod)


class QuantGraph:
    """Quantized network recorder. Call it on inputs to run the NumPy reference."""

    reference = ref  # the NumPy twins ``run`` evaluates the steps with (qnn_float: float epilogues)

    def __init__(self, seed: int = 0):
        self.rng = np.random.RandomState(seed)
        self.input_specs: list[tuple[tuple, str]] = []
        self.steps: list[_Step] = []

    # -- recording -------------------------------------------------------------------
    def input(self, sample: np.ndarray, zp: int, batch: int | None = None) -> Value:
        """A graph input; ``sample`` (e.g. one image) drives calibration."""
        shape = ((batch or sample.shape[0]),) + tuple(sample.shape[1:])
        self.input_specs.append((shape, str(sample.dtype)))
        return Value(len(self.input_specs) - 1, sample, int(zp))

    def step(self, name, op, inputs, consts=(), zp=0, **attrs) -> Value:
        """Record op ``op`` of this module on ``inputs`` with the given constant arrays and
        int (or int tuple) attributes; ``zp`` is the zero point of the result."""
        consts = tuple(np.ascontiguousarray(c) for c in consts)
        attrs = {k: int(v) if np.ndim(v) == 0 else tuple(int(x) for x in v) for k, v in attrs.items()}
        self.steps.append(_Step(name, op, tuple(v.index for v in inputs), consts, attrs))
        sample = getattr(ref, op)(*(v.sample for v in inputs), *consts, **attrs)
        return Value(len(self.input_specs) + len(self.steps) - 1, sample, int(zp))

    def _weights(self, shape) -> np.ndarray:
        """Symmetric int8 weights with a different amplitude per output channel (last axis)."""
        amp = self.rng.uniform(24, 127, shape[-1])
        return np.round(self.rng.uniform(-1, 1, shape) * amp).astype(np.int8)

    def _requantize(self, name, x, acc, w_mat, zp_out) -> Value:
        """Calibrated requantize of ``acc`` = x (zp ``x.zp``) times ``w_mat`` [K, C]."""
        w = w_mat.astype(np.int64)
        cout = w.shape[1]
        lead = (1,) * (acc.sample.ndim - 1) + (cout,)
        zp_corr = (x.zp * w.sum(axis=0)).astype(np.int32).reshape(lead)
        x_mean = float(np.mean(x.sample.astype(np.float64) - x.zp))
        bias = np.round(-x_mean * w.sum(axis=0)).astype(np.int32).reshape(lead)
        centered = acc.sample.astype(np.float64) - zp_corr + bias
        norm = np.sqrt((w.astype(np.float64) ** 2).sum(axis=0))
        norm = norm / norm.mean()
        rms = max(float(np.sqrt(np.mean((centered / norm) ** 2))), 1.0)
        mult, rshift = fixed_point(TARGET_RMS / (rms * norm))
        lshift = np.zeros(cout, np.int32)
        consts = (zp_corr, bias, mult, lshift, rshift)
        return self.step(name, "requantize", [acc], consts, zp=zp_out, zp_out=zp_out)

    def conv(self, x: Value, cout: int, kernel: int, stride: int = 1, zp_out: int = 128, name="conv"):
        """uint8 conv2d (pad kernel//2) + requantize."""
        w = self._weights((kernel, kernel, x.shape[-1], cout))
        acc = self.step(name + ".acc", "conv2d_nhwc", [x], [w], stride=stride, pad=kernel // 2, zp_in=x.zp)
        return self._requantize(name, x, acc, w.reshape(-1, cout), zp_out)

    def dense(self, x: Value, units: int, zp_out: int = 128, name="fc"):
        """uint8 x int8 [units, K] dense + requantize."""
        w = self._weights((x.shape[-1], units)).T
        acc = self.step(name + ".acc", "dense", [x], [w])
        return self._requantize(name, x, acc, w.T, zp_out)

    def add(self, a: Value, b: Value, zp_out: int = 128, name="add"):
        """Residual add, both inputs requantized so that the sum has the target spread."""
        c = a.shape[-1]
        consts = []
        for v in (a, b):
            rms = max(float(np.sqrt(np.mean((v.sample.astype(np.float64) - v.zp) ** 2))), 1.0)
            mult, rshift = fixed_point(np.full(c, TARGET_RMS / (rms * np.sqrt(2.0))))
            consts += [mult, rshift]
        zps = {"zp_a": a.zp, "zp_b": b.zp, "zp_out": zp_out}
        return self.step(name, "add_requantize", [a, b], consts, zp=zp_out, **zps)

    def max_pool(self, x: Value, name="maxpool"):
        """3x3 / 2 max pool, pad 1."""
        return self.step(name, "max_pool2d", [x], zp=x.zp, size=3, stride=2, pad=1)

    def global_avg_pool(self, x: Value, name="avgpool"):
        """Integer global average pool."""
        return self.step(name, "global_avg_pool", [x], zp=x.zp)

    # -- using -----------------------------------------------------------------------
    def run(self, inputs) -> list[np.ndarray]:
        """All values of the graph (inputs first) computed by the NumPy reference."""
        values = [np.asarray(v) for v in inputs]
        for step in self.steps:
            args = [values[i] for i in step.inputs]
            values.append(getattr(self.reference, step.op)(*args, *step.consts, **step.attrs))
        return values

    def __call__(self, inputs) -> np.ndarray:
        return self.run(inputs)[-1]

    def clip_fractions(self, inputs) -> dict[str, float]:
        """Per requantized layer: fraction of outputs clipped to 0 or 255."""
        values = self.run(inputs)[len(self.input_specs) :]
        return {
            s.name: ref.clip_fraction(v)
            for s, v in zip(self.steps, values)
            if s.op in ("requantize", "add_requantize")
        }

    def to_relax(self, fused: bool = True, emitter=None) -> tvm.IRModule:
        """The graph as a Relax module whose ``main`` takes the inputs; weights are constants.
        ``emitter``: how steps become Relax bindings (default ``NHWCEmitter``; ``qnn_packed``'s
        emits the same graph in the packed VNNI layouts)."""
        emitter = emitter or NHWCEmitter()
        bb = relax.BlockBuilder()
        params = [
            relax.Var(f"x{i}" if i else "x", relax.TensorType(shape, dtype))
            for i, (shape, dtype) in enumerate(self.input_specs)
        ]
        if hasattr(emitter, "plan"):  # an emitter that looks at the whole graph first
            emitter.plan(self.steps, len(params))
        with bb.function("main", params):
            with bb.dataflow():
                values = [emitter.input(bb, p) for p in params]
                for step in self.steps:
                    values.append(emitter.step(bb, step, [values[i] for i in step.inputs]))
                out = bb.emit_output(emitter.output(bb, values[-1]))
            bb.emit_func_output(out)
        mod = bb.get()
        return fuse(mod) if fused else mod


class NHWCEmitter:
    """Emits a recorded step as the TE op of the same name in this module, on NHWC
    tensors, with the step's constants as Relax constants (the graph as recorded)."""

    def input(self, bb, var):  # pylint: disable=unused-argument
        return var

    def step(self, bb, step: _Step, args):
        op = globals().get(step.op) or getattr(qnn_ort, step.op)  # qnn_ort: an imported model's add
        consts = [relax.const(c) for c in step.consts]
        return bb.emit_te(op, *args, *consts, primfunc_name_hint=step.op, **step.attrs)

    def output(self, bb, value):  # pylint: disable=unused-argument
        return value
