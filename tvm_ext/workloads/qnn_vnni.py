"""Quantized conv2d / dense in the packed layouts the x86 VNNI intrinsic can match.

VNNI (``vpdpbusd``) computes, for 16 int32 lanes ``i``, ``C[i] += sum_k A[k] * B[i, k]``
with ``k`` in 0..3, ``A`` 4 consecutive uint8 and ``B`` 64 consecutive int8 laid out
``[16 output channels][4 input channels]``. An NHWC activation with HWIO weights has the
4 input channels of a weight row 16*C_out bytes apart, so MetaSchedule's auto-tensorizer
finds no match. Here we use the layouts that do match:

* activations NCHW[cb]c: ``(N, C // cb, H, W, cb)`` uint8, ``cb`` a multiple of 4
  (16 for every layer of ResNet-50 but the stem, whose 3 channels are padded to 4);
* weights OIHW[cb/4]i16o4i: ``(O // 16, I // cb, KH, KW, cb // 4, 16, 4)`` int8,
  packed once, at build time;
* output NCHW16c ``(N, O // 16, OH, OW, 16)`` uint8, i.e. the next layer's input layout;
* dense: data ``(M, K)`` uint8, weight ``(ceil(N / 16), K // 4, 16, 4)`` int8 (rows past N zero).

``qnn_packed`` emits whole recorded networks (``resnet50-int8-nchwc``) with the
accumulators of this module (``conv2d_nchwc_acc``, ``dense_acc``) and the packers, and
``qnn.requantize`` as the epilogue; the padding of a conv is filled with the input zero
point so that its zero-point term is the same at borders. NumPy references are in
``qnn_reference``; the single-kernel test cases in tests/qnn_cases.py.
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from tvm_ext.intrinsics.vnni import PAIRS_FIT_INT16_ATTR

from .qnn import _pads, _pair

OC_BLOCK = 16  # lanes of one vpdpbusd (512-bit) = output channels per weight block
K_BLOCK = 4  # uint8 x int8 pairs summed per lane


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
def pairs_fit_int16(weight: np.ndarray) -> bool:
    """Whether every pair of adjacent input-channel weights of a packed ``(.., 16, 4)``
    weight has ``255 * (|w0| + |w1|) <= 32767``: then ``vpmaddubsw``'s saturating int16
    pair sums are exact for any uint8 activation (see ``PAIRS_FIT_INT16_ATTR``)."""
    w = np.abs(np.asarray(weight, np.int32)).reshape(-1, 2)
    return bool(255 * int(w.sum(axis=1).max(initial=0)) <= 32767)


def _attrs(pairs_fit: bool) -> dict:
    return {PAIRS_FIT_INT16_ATTR: 1} if pairs_fit else {}


def _pad_nchwc(data: te.Tensor, pads, zp_x: int) -> te.Tensor:
    """``data`` (N, C/cb, H, W, cb) padded on H and W with ``zp_x`` (pads (top, left,
    bottom, right)), so that a conv's zero-point term is the same at the borders. Not
    ``qnn._pad_hw`` (topi's pad): that would change the TIR of ``resnet50-int8-nchwc`` and
    orphan its committed databases."""
    n, icb, h, w, cb = (int(d) for d in data.shape)
    top, left, bottom, right = pads
    if not any(pads):
        return data
    return te.compute(
        (n, icb, h + top + bottom, w + left + right, cb),
        lambda b, c, y, x, ci: tirx.if_then_else(
            tirx.all(y >= top, y < h + top, x >= left, x < w + left),
            data[b, c, y - top, x - left, ci],
            tirx.const(zp_x, "uint8"),
        ),
        name="pad",
    )


def _out_hw(data, kh, kw, stride, pads):
    h, w = (int(d) for d in data.shape[2:4])
    (sh, sw), (top, left, bottom, right) = stride, pads
    return (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1


def conv2d_nchwc_acc(data: te.Tensor, weight: te.Tensor, *, stride=1, pad=0,
                     zp_x: int = 0, pairs_fit: bool = False) -> te.Tensor:
    """int32 accumulator of a packed uint8 x int8 conv2d (no epilogue).

    data (N, C/cb, H, W, cb) u8, padded with ``zp_x``; weight
    (O/16, C/cb, KH, KW, cb/4, 16, 4) i8; returns (N, O/16, OH, OW, 16) i32.
    ``stride``: int or (h, w); ``pad``: int or (top, left, bottom, right).
    ``pairs_fit``: the weights pass ``pairs_fit_int16`` (annotates the block so that the
    AVX2 form of the 16x4 product may be used).
    """
    n, icb, _, _, cb = (int(d) for d in data.shape)
    ocb, _, kh, kw = (int(d) for d in weight.shape[:4])
    assert cb % K_BLOCK == 0 and tuple(int(d) for d in weight.shape[4:]) == (cb // K_BLOCK, OC_BLOCK, K_BLOCK)
    (sh, sw), pads = _pair(stride), _pads(pad)
    oh, ow = _out_hw(data, kh, kw, (sh, sw), pads)
    padded = _pad_nchwc(data, pads, zp_x)
    ric = te.reduce_axis((0, icb), name="ic")
    rkh = te.reduce_axis((0, kh), name="kh")
    rkw = te.reduce_axis((0, kw), name="kw")
    ric4 = te.reduce_axis((0, cb // K_BLOCK), name="ic4")
    rici = te.reduce_axis((0, K_BLOCK), name="ici")
    return te.compute(
        (n, ocb, oh, ow, OC_BLOCK),
        lambda b, oc, y, x, oci: te.sum(
            padded[b, ric, y * sh + rkh, x * sw + rkw, ric4 * K_BLOCK + rici].astype("int32")
            * weight[oc, ric, rkh, rkw, ric4, oci, rici].astype("int32"),
            axis=[ric, rkh, rkw, ric4, rici],
        ),
        name="conv2d_nchwc_int8",
        attrs=_attrs(pairs_fit),
    )


def pack_depthwise_weight(w_hwio: np.ndarray, cb: int) -> np.ndarray:
    """Depthwise HWIO ``(KH, KW, 1, C)`` int8 -> ``(C/cb, KH, KW, cb)``."""
    kh, kw, one, c = w_hwio.shape
    assert one == 1 and c % cb == 0, (w_hwio.shape, cb)
    return np.ascontiguousarray(w_hwio.reshape(kh, kw, c // cb, cb).transpose(2, 0, 1, 3))


def depthwise_nchwc_acc(data: te.Tensor, weight: te.Tensor, *, stride=1, pad=0, zp_x: int = 0) -> te.Tensor:
    """int32 accumulator of a depthwise conv on NCHW[cb]c uint8 data: weight
    ``(C/cb, KH, KW, cb)`` int8 (``pack_depthwise_weight``); returns (N, C/cb, OH, OW, cb).
    No dot product to tensorize (one input channel per output): the channel block is the
    vector."""
    n, icb, _, _, cb = (int(d) for d in data.shape)
    kh, kw = (int(d) for d in weight.shape[1:3])
    (sh, sw), pads = _pair(stride), _pads(pad)
    oh, ow = _out_hw(data, kh, kw, (sh, sw), pads)
    padded = _pad_nchwc(data, pads, zp_x)
    rkh = te.reduce_axis((0, kh), name="kh")
    rkw = te.reduce_axis((0, kw), name="kw")
    return te.compute(
        (n, icb, oh, ow, cb),
        lambda b, c, y, x, ci: te.sum(
            padded[b, c, y * sh + rkh, x * sw + rkw, ci].astype("int32") * weight[c, rkh, rkw, ci].astype("int32"),
            axis=[rkh, rkw],
        ),
        name="depthwise_nchwc_int8",
    )


def dense_acc(data: te.Tensor, weight: te.Tensor, *, pairs_fit: bool = False) -> te.Tensor:
    """int32 accumulator of uint8 (M, K) data x packed int8 (N/16, K/4, 16, 4) weight: (M, N)
    (``pairs_fit`` as for ``conv2d_nchwc_acc``)."""
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
        attrs=_attrs(pairs_fit),
    )


__all__ = [
    "OC_BLOCK",
    "K_BLOCK",
    "channel_block",
    "pack_activation",
    "unpack_activation",
    "pack_conv_weight",
    "pack_dense_weight",
    "conv2d_nchwc_acc",
    "depthwise_nchwc_acc",
    "pack_depthwise_weight",
    "pairs_fit_int16",
    "dense_acc",
]
