"""Packed quantized conv2d / dense test cases (one kernel each, random data, NumPy
reference) for the VNNI tests: the layouts and accumulators of
``tvm_ext.workloads.qnn_vnni``, an epilogue written as one expression (no
constant-scalar block), the exact reference of ``qnn_reference``.

conv2d_case(...) / dense_case(...) -> PackedQCase; run_case(case, lib) -> output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import tvm
from tvm import te, tirx

from tvm_ext.workloads import qnn_reference as ref
from tvm_ext.workloads.qnn_vnni import (K_BLOCK, OC_BLOCK, channel_block, conv2d_nchwc_acc, dense_acc,
                                        pack_activation, pack_conv_weight, pack_dense_weight)


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


@dataclass
class PackedQCase:
    """A packed quantized kernel with its data and NumPy reference.

    func:      PrimFunc (args ..., out), global_symbol "main".
    args:      NumPy values for the inputs, in order (activation first, then constants).
    reference: () -> expected output (NumPy, packed layout).
    """

    name: str
    func: tvm.tirx.PrimFunc
    args: list
    out_shape: tuple
    reference: Callable[[], np.ndarray]

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
    w_max: int = 127,
) -> PackedQCase:
    """A packed quantized conv2d (+requantize) with random data (weights in [-w_max, w_max])
    and its NumPy reference."""
    cb = cb or channel_block(c_in)
    c_in_p = -(-c_in // cb) * cb
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, h, w, c_in)).astype(np.uint8)
    wt = rng.integers(-w_max, w_max + 1, (c_out, kh, kw, c_in)).astype(np.int8)
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
        y = ref.requantize(acc, corr, 0, mult, 0, rshift, zp_out=zp_out)
        return pack_activation(y, OC_BLOCK)

    return PackedQCase(
        name=f"conv2d_nchwc_int8_{n}x{h}x{w}x{c_in}_{c_out}_k{kh}s{stride}p{pad}",
        func=func,
        args=[xp, wp, corr, mult, rshift],
        out_shape=(n, c_out // OC_BLOCK, oh, ow, OC_BLOCK),
        reference=reference,
    )


def dense_case(m: int = 8, n: int = 64, k: int = 128, zp_x: int = 9, zp_out: int = 90, seed: int = 0,
               w_max: int = 127) -> PackedQCase:
    """A packed quantized dense (+requantize) with random data (weights in [-w_max, w_max])
    and its NumPy reference."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (m, k)).astype(np.uint8)
    wt = rng.integers(-w_max, w_max + 1, (n, k)).astype(np.int8)
    corr, mult, rshift = _quant_params(rng, wt, k, zp_x, 74.0)
    wp = pack_dense_weight(wt)
    args_te, out_te = dense_int8_te(m, n, k, zp_out)
    func = te.create_prim_func([*args_te, out_te]).with_attr("global_symbol", "main")

    def reference() -> np.ndarray:
        acc = x.astype(np.int64) @ wt.astype(np.int64).T
        return ref.requantize(acc, corr, 0, mult, 0, rshift, zp_out=zp_out)

    return PackedQCase(
        name=f"dense_int8_{m}x{n}x{k}",
        func=func,
        args=[x, wp, corr, mult, rshift],
        out_shape=(m, n),
        reference=reference,
    )


def annotated(case: PackedQCase, value=1) -> PackedQCase:
    """``case`` with its accumulator block annotated ``PAIRS_FIT_INT16_ATTR`` = ``value``, as the
    workloads do when every weight pair fits vpmaddubsw's int16 sums."""
    import dataclasses

    from tvm_ext.intrinsics.vnni import PAIRS_FIT_INT16_ATTR
    from tvm_ext.rules.vnni_tensorize import operands_packed
    from tvm_ext.tir_utils import blocks_of

    sch = tvm.s_tir.Schedule(case.mod)
    (acc,) = [b for b in blocks_of(case.func) if operands_packed(b)]
    sch.annotate(sch.get_sblock(acc.name_hint), PAIRS_FIT_INT16_ATTR, value)
    return dataclasses.replace(case, func=sch.mod["main"])


def run_case(case: PackedQCase, lib, dev=None) -> np.ndarray:
    """Run a compiled case (``tvm.compile(case.mod, target)``) and return its output."""
    dev = dev or tvm.cpu()
    out = tvm.runtime.tensor(np.zeros(case.out_shape, np.uint8), dev)
    lib(*[tvm.runtime.tensor(a, dev) for a in case.args], out)
    return out.numpy()
