"""Quantized conv2d / dense in the packed layouts the x86 VNNI intrinsic can match.

VNNI (``vpdpbusd``) computes, for 16 int32 lanes ``i``, ``C[i] += sum_k A[k] * B[i, k]``
with ``k`` in 0..3, ``A`` 4 consecutive uint8 and ``B`` 64 consecutive int8 laid out
``[16 output channels][4 input channels]``. An NHWC activation with HWIO weights has the
4 input channels of a weight row 16*C_out bytes apart, so MetaSchedule's auto-tensorizer
finds no match (issue 6). Here we use the layouts that do match:

* activations NCHW[cb]c: ``(N, C // cb, H, W, cb)`` uint8, ``cb`` a multiple of 4
  (16 for every layer of ResNet-50 but the stem, whose 3 channels are padded to 4);
* weights OIHW[cb/4]i16o4i: ``(O // 16, I // cb, KH, KW, cb // 4, 16, 4)`` int8,
  packed once, at build time, and passed as constants (they are parameters of the
  PrimFunc; ``constants`` gives their values);
* output NCHW16c ``(N, O // 16, OH, OW, 16)`` uint8, i.e. the next layer's input layout;
* dense: data ``(M, K)`` uint8, weight ``(ceil(N / 16), K // 4, 16, 4)`` int8 (rows past N zero).

``qnn_packed`` emits whole recorded networks (``resnet50-int8-nchwc``) with the
accumulators of this module (``conv2d_nchwc_acc``, ``dense_acc``) and the packers.

Every kernel carries the requantize epilogue of the NHWC workload: subtract the input
zero-point term (``zp_x * sum(w)``, precomputed per output channel, with padding filled
by ``zp_x`` so the term is the same at borders), add the bias,
``q_multiply_shift_per_axis(acc, M[c], 0, rshift[c], 31, False, True)``, add the output
zero point, clip to [0, 255], cast to uint8. The reference is pure NumPy integers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import tvm
from tvm import te, tirx

OC_BLOCK = 16  # lanes of one vpdpbusd (512-bit) = output channels per weight block
K_BLOCK = 4  # uint8 x int8 pairs summed per lane


# --------------------------------------------------------------------------- numerics
def q_multiply_shift_per_axis_ref(x: np.ndarray, mult: np.ndarray, rshift: np.ndarray) -> np.ndarray:
    """NumPy twin of ``q_multiply_shift_per_axis(x, mult, 0, rshift, 31, False, True)``.

    ``(x * mult + 2**(30 + rshift)) >> (31 + rshift)`` in 64-bit, i.e. round half up.
    Checked against TVM's lowering in tests/test_vnni.py.
    """
    total = rshift.astype(np.int64) + 31
    prod = x.astype(np.int64) * mult.astype(np.int64)
    return ((prod + (np.int64(1) << (total - 1))) >> total).astype(np.int32)


def requantize_ref(acc, corr, mult, rshift, zp_out):
    """Epilogue: acc - corr (per channel, last axis), scale, + zp_out, clip, uint8."""
    y = q_multiply_shift_per_axis_ref(acc.astype(np.int64) - corr, mult, rshift).astype(np.int64)
    return np.clip(y + zp_out, 0, 255).astype(np.uint8)


def choose_requant(acc_std: np.ndarray, out_std: float = 40.0):
    """Per-channel (multiplier, rshift) so that acc * scale has std ~ out_std.

    multiplier is a Q31 number in [2**30, 2**31); rshift >= 0.
    """
    scale = out_std / np.maximum(acc_std, 1.0)
    mant, exp = np.frexp(scale)  # scale = mant * 2**exp, mant in [0.5, 1)
    rshift = np.maximum(-exp, 0).astype(np.int32)
    mant = scale * (2.0 ** rshift)  # fold positive exponents into the mantissa (< 1 here)
    mult = np.clip(np.round(mant * (1 << 31)), 1 << 30, (1 << 31) - 1).astype(np.int32)
    return mult, rshift


# --------------------------------------------------------------------------- layouts
def channel_block(channels: int) -> int:
    """The NCHW[cb]c block for an activation of ``channels``: 16, else 4 (padded up)."""
    return OC_BLOCK if channels % OC_BLOCK == 0 else K_BLOCK


def pack_activation(x_nhwc: np.ndarray, cb: int) -> np.ndarray:
    """NHWC uint8 -> NCHW[cb]c, channels zero-padded up to a multiple of cb."""
    n, h, w, c = x_nhwc.shape
    cp = -(-c // cb) * cb
    if cp != c:
        x_nhwc = np.concatenate([x_nhwc, np.zeros((n, h, w, cp - c), x_nhwc.dtype)], axis=3)
    return np.ascontiguousarray(x_nhwc.reshape(n, h, w, cp // cb, cb).transpose(0, 3, 1, 2, 4))


def unpack_activation(x_nchwc: np.ndarray, channels: int | None = None) -> np.ndarray:
    """NCHW[x]c -> NHWC (dropping padded channels beyond ``channels``)."""
    n, co, h, w, cb = x_nchwc.shape
    y = x_nchwc.transpose(0, 2, 3, 1, 4).reshape(n, h, w, co * cb)
    return np.ascontiguousarray(y[..., :channels] if channels else y)


def pack_conv_weight(w_ohwi: np.ndarray, cb: int) -> np.ndarray:
    """OHWI int8 -> OIHW[cb/4]i16o4i, input channels zero-padded to a multiple of cb."""
    o, kh, kw, i = w_ohwi.shape
    assert o % OC_BLOCK == 0, f"output channels {o} not a multiple of {OC_BLOCK}"
    ip = -(-i // cb) * cb
    if ip != i:
        w_ohwi = np.concatenate([w_ohwi, np.zeros((o, kh, kw, ip - i), w_ohwi.dtype)], axis=3)
    w = w_ohwi.reshape(o // OC_BLOCK, OC_BLOCK, kh, kw, ip // cb, cb // K_BLOCK, K_BLOCK)
    # axes: oo, oi, kh, kw, io, ii4, i4 -> oo, io, kh, kw, ii4, oi, i4
    return np.ascontiguousarray(w.transpose(0, 4, 2, 3, 5, 1, 6))


def pack_dense_weight(w_nk: np.ndarray) -> np.ndarray:
    """(N, K) int8 -> (ceil(N / 16), K // 4, 16, 4), rows beyond N zero."""
    n, k = w_nk.shape
    assert k % K_BLOCK == 0, (n, k)
    np_ = -(-n // OC_BLOCK) * OC_BLOCK
    if np_ != n:
        w_nk = np.concatenate([w_nk, np.zeros((np_ - n, k), w_nk.dtype)], axis=0)
    return np.ascontiguousarray(
        w_nk.reshape(np_ // OC_BLOCK, OC_BLOCK, k // K_BLOCK, K_BLOCK).transpose(0, 2, 1, 3)
    )


# --------------------------------------------------------------------------- TE
def _requant_expr(acc, corr, mult, rshift, zp_out: int):
    y = tirx.q_multiply_shift_per_axis(
        acc - corr,
        mult,
        tirx.const(0, "int32"),
        rshift,
        tirx.const(31, "int32"),
        tirx.const(False, "bool"),
        tirx.const(True, "bool"),
    )
    y = y + tirx.const(zp_out, "int32")
    return tirx.Cast("uint8", tirx.max(tirx.min(y, tirx.const(255, "int32")), tirx.const(0, "int32")))


def conv2d_nchwc_acc(data: te.Tensor, weight: te.Tensor, *, stride: int = 1, pad: int = 0,
                     zp_x: int = 0) -> te.Tensor:
    """int32 accumulator of a packed uint8 x int8 conv2d (no epilogue).

    data (N, C/cb, H, W, cb) u8, padded with ``zp_x``; weight
    (O/16, C/cb, KH, KW, cb/4, 16, 4) i8; returns (N, O/16, OH, OW, 16) i32.
    """
    n, icb, h, w, cb = (int(d) for d in data.shape)
    ocb, _, kh, kw = (int(d) for d in weight.shape[:4])
    assert cb % K_BLOCK == 0 and tuple(int(d) for d in weight.shape[4:]) == (cb // K_BLOCK, OC_BLOCK, K_BLOCK)
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (w + 2 * pad - kw) // stride + 1
    if pad:
        padded = te.compute(
            (n, icb, h + 2 * pad, w + 2 * pad, cb),
            lambda b, c, y, x, ci: tirx.if_then_else(
                tirx.all(y >= pad, y < h + pad, x >= pad, x < w + pad),
                data[b, c, y - pad, x - pad, ci],
                tirx.const(zp_x, "uint8"),
            ),
            name="pad",
        )
    else:
        padded = data
    ric = te.reduce_axis((0, icb), name="ic")
    rkh = te.reduce_axis((0, kh), name="kh")
    rkw = te.reduce_axis((0, kw), name="kw")
    ric4 = te.reduce_axis((0, cb // K_BLOCK), name="ic4")
    rici = te.reduce_axis((0, K_BLOCK), name="ici")
    return te.compute(
        (n, ocb, oh, ow, OC_BLOCK),
        lambda b, oc, y, x, oci: te.sum(
            padded[b, ric, y * stride + rkh, x * stride + rkw, ric4 * K_BLOCK + rici].astype("int32")
            * weight[oc, ric, rkh, rkw, ric4, oci, rici].astype("int32"),
            axis=[ric, rkh, rkw, ric4, rici],
        ),
        name="conv2d_nchwc_int8",
    )


def conv2d_nchwc_int8_te(
    n: int, c_in: int, h: int, w: int, c_out: int, kh: int, kw: int,
    stride: int = 1, pad: int = 0, cb: int = 16, zp_x: int = 0, zp_out: int = 0,
):
    """TE tensors of a packed quantized conv2d + requantize.

    Returns ``(args, out)``: args = [data (N, C/cb, H, W, cb) u8,
    weight (O/16, C/cb, KH, KW, cb/4, 16, 4) i8, corr (O,) i32, mult (O,) i32,
    rshift (O,) i32]; out (N, O/16, OH, OW, 16) u8. ``c_in`` must be a multiple of cb
    (pad it first) and ``c_out`` of 16.
    """
    assert cb % K_BLOCK == 0 and c_in % cb == 0 and c_out % OC_BLOCK == 0
    ocb, icb = c_out // OC_BLOCK, c_in // cb
    data = te.placeholder((n, icb, h, w, cb), "uint8", name="data")
    weight = te.placeholder((ocb, icb, kh, kw, cb // K_BLOCK, OC_BLOCK, K_BLOCK), "int8", name="weight")
    corr = te.placeholder((c_out,), "int32", name="corr")
    mult = te.placeholder((c_out,), "int32", name="mult")
    rshift = te.placeholder((c_out,), "int32", name="rshift")
    conv = conv2d_nchwc_acc(data, weight, stride=stride, pad=pad, zp_x=zp_x)
    out = te.compute(
        conv.shape,
        lambda b, oc, y, x, oci: _requant_expr(
            conv[b, oc, y, x, oci],
            corr[oc * OC_BLOCK + oci],
            mult[oc * OC_BLOCK + oci],
            rshift[oc * OC_BLOCK + oci],
            zp_out,
        ),
        name="requantize",
    )
    return [data, weight, corr, mult, rshift], out


def dense_acc(data: te.Tensor, weight: te.Tensor) -> te.Tensor:
    """int32 accumulator of uint8 (M, K) data x packed int8 (N/16, K/4, 16, 4) weight: (M, N)."""
    m, k = (int(d) for d in data.shape)
    n = int(weight.shape[0]) * OC_BLOCK
    assert tuple(int(d) for d in weight.shape[1:]) == (k // K_BLOCK, OC_BLOCK, K_BLOCK), (data.shape, weight.shape)
    rk = te.reduce_axis((0, k), name="k")
    return te.compute(
        (m, n),
        lambda i, j: te.sum(
            data[i, rk].astype("int32")
            * weight[j // OC_BLOCK, rk // K_BLOCK, j % OC_BLOCK, rk % K_BLOCK].astype("int32"),
            axis=rk,
        ),
        name="dense_int8",
    )


def dense_int8_te(m: int, n: int, k: int, zp_out: int = 0):
    """TE tensors of a packed quantized dense + requantize.

    args = [data (M, K) u8, weight (N/16, K/4, 16, 4) i8, corr (N,), mult (N,), rshift (N,)]
    (int32), out (M, N) u8.
    """
    assert n % OC_BLOCK == 0 and k % K_BLOCK == 0
    data = te.placeholder((m, k), "uint8", name="data")
    weight = te.placeholder((n // OC_BLOCK, k // K_BLOCK, OC_BLOCK, K_BLOCK), "int8", name="weight")
    corr = te.placeholder((n,), "int32", name="corr")
    mult = te.placeholder((n,), "int32", name="mult")
    rshift = te.placeholder((n,), "int32", name="rshift")
    acc = dense_acc(data, weight)
    out = te.compute(
        (m, n), lambda i, j: _requant_expr(acc[i, j], corr[j], mult[j], rshift[j], zp_out), name="requantize"
    )
    return [data, weight, corr, mult, rshift], out


# --------------------------------------------------------------------------- cases
@dataclass
class PackedQCase:
    """A packed quantized kernel with its data and NumPy reference.

    func:      PrimFunc (args ..., out), global_symbol "main".
    args:      NumPy values for the inputs, in order (activation first, then constants).
    constants: names -> the same constant arrays (weights, corr, mult, rshift).
    reference: () -> expected output (NumPy, packed layout).
    meta:      shape parameters and quantization parameters.
    """

    name: str
    func: tvm.tirx.PrimFunc
    args: list
    out_shape: tuple
    reference: Callable[[], np.ndarray]
    constants: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    @property
    def mod(self) -> tvm.IRModule:
        return tvm.IRModule({"main": self.func})


def _quant_params(rng, w_oc_flat: np.ndarray, n_red: int, zp_x: int, x_std: float):
    """corr (= zp_x * sum(w) - bias), mult, rshift for per-channel weights (O, n_red)."""
    c_out = w_oc_flat.shape[0]
    wsum = w_oc_flat.astype(np.int64).sum(axis=1)
    bias = rng.integers(-2000, 2000, c_out)
    corr = (zp_x * wsum - bias).astype(np.int32)
    w_std = w_oc_flat.astype(np.float64).std(axis=1) + 1e-3
    acc_std = x_std * w_std * np.sqrt(n_red)
    mult, rshift = choose_requant(acc_std)
    return corr, mult, rshift


def conv2d_case(
    n: int = 1, h: int = 14, w: int = 14, c_in: int = 32, c_out: int = 32, kh: int = 3, kw: int = 3,
    stride: int = 1, pad: int = 1, cb: int | None = None, zp_x: int = 7, zp_out: int = 100, seed: int = 0,
) -> PackedQCase:
    """A packed quantized conv2d (+requantize) with random data and its NumPy reference."""
    cb = cb or channel_block(c_in)
    c_in_p = -(-c_in // cb) * cb
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, h, w, c_in)).astype(np.uint8)
    wt = rng.integers(-127, 128, (c_out, kh, kw, c_in)).astype(np.int8)
    corr, mult, rshift = _quant_params(rng, wt.reshape(c_out, -1), kh * kw * c_in, zp_x, 74.0)
    xp, wp = pack_activation(x, cb), pack_conv_weight(wt, cb)
    # padded input channels: activation 0 x weight 0 -> no contribution
    args_te, out_te = conv2d_nchwc_int8_te(n, c_in_p, h, w, c_out, kh, kw, stride, pad, cb, zp_x, zp_out)
    func = te.create_prim_func([*args_te, out_te]).with_attr("global_symbol", "main")
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (w + 2 * pad - kw) // stride + 1

    def reference() -> np.ndarray:
        xpad = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), constant_values=zp_x).astype(np.int64)
        acc = np.zeros((n, oh, ow, c_out), np.int64)
        w64 = wt.astype(np.int64)
        for i in range(kh):
            for j in range(kw):
                patch = xpad[:, i : i + stride * oh : stride, j : j + stride * ow : stride, :]
                acc += np.einsum("nhwc,oc->nhwo", patch, w64[:, i, j, :])
        y = requantize_ref(acc, corr, mult, rshift, zp_out)
        return pack_activation(y, OC_BLOCK)

    return PackedQCase(
        name=f"conv2d_nchwc_int8_{n}x{h}x{w}x{c_in}_{c_out}_k{kh}s{stride}p{pad}",
        func=func,
        args=[xp, wp, corr, mult, rshift],
        out_shape=(n, c_out // OC_BLOCK, oh, ow, OC_BLOCK),
        reference=reference,
        constants={"weight": wp, "corr": corr, "mult": mult, "rshift": rshift},
        meta=dict(n=n, h=h, w=w, c_in=c_in, c_out=c_out, kh=kh, kw=kw, stride=stride, pad=pad,
                  cb=cb, zp_x=zp_x, zp_out=zp_out, x_nhwc=x, w_ohwi=wt),
    )


def dense_case(m: int = 8, n: int = 64, k: int = 128, zp_x: int = 9, zp_out: int = 90, seed: int = 0) -> PackedQCase:
    """A packed quantized dense (+requantize) with random data and its NumPy reference."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (m, k)).astype(np.uint8)
    wt = rng.integers(-127, 128, (n, k)).astype(np.int8)
    corr, mult, rshift = _quant_params(rng, wt, k, zp_x, 74.0)
    wp = pack_dense_weight(wt)
    args_te, out_te = dense_int8_te(m, n, k, zp_out)
    func = te.create_prim_func([*args_te, out_te]).with_attr("global_symbol", "main")

    def reference() -> np.ndarray:
        acc = x.astype(np.int64) @ wt.astype(np.int64).T
        return requantize_ref(acc, corr, mult, rshift, zp_out)

    return PackedQCase(
        name=f"dense_int8_{m}x{n}x{k}",
        func=func,
        args=[x, wp, corr, mult, rshift],
        out_shape=(m, n),
        reference=reference,
        constants={"weight": wp, "corr": corr, "mult": mult, "rshift": rshift},
        meta=dict(m=m, n=n, k=k, zp_x=zp_x, zp_out=zp_out, x=x, w_nk=wt),
    )


def run_case(case: PackedQCase, lib, dev=None) -> np.ndarray:
    """Run a compiled case (``tvm.compile(case.mod, target)``) and return its output."""
    dev = dev or tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(case.out_shape, np.uint8), dev)
    lib(*[tvm.runtime.tensor(a, dev) for a in case.args], out)
    return out.numpy()


__all__ = [
    "OC_BLOCK",
    "K_BLOCK",
    "PackedQCase",
    "q_multiply_shift_per_axis_ref",
    "requantize_ref",
    "choose_requant",
    "channel_block",
    "pack_activation",
    "unpack_activation",
    "pack_conv_weight",
    "pack_dense_weight",
    "conv2d_nchwc_acc",
    "conv2d_nchwc_int8_te",
    "dense_acc",
    "dense_int8_te",
    "conv2d_case",
    "dense_case",
    "run_case",
]
