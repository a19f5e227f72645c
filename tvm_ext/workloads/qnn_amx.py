"""The packed quantized network in the layout Intel AMX tiles want (``resnet50-int8-amx``).

AMX's ``tdpbusd`` reduces 64 input channels per tile row (``tvm_ext.intrinsics.amx``):
the activation must hold 64 consecutive input channels per pixel and the weight tile 16
rows of [16 outputs][4 inputs]. So, compared with the VNNI emission of ``qnn_packed``
(NCHW16c everywhere):

* every conv writes NCHW64c (all of ResNet-50's convs have a multiple of 64 outputs),
  so the next conv reads 64 channels per pixel; the network input is still NCHW4c (the
  stem's 3 channels padded to 4: that conv stays with VNNI);
* weights stay OIHW[cb/4]i16o4i, packed once at build time: with cb = 64 the 16 x 16 x 4
  bytes of one (output block, input block, kh, kw) are one B tile (rows 64 bytes apart);
  an output channel ``o`` of a 64-block reads weight block ``o // 16`` and lane ``o % 16``;
* requantize, residual add, pooling and the classifier are ``qnn_packed``'s, on 64-channel
  blocks (its per-channel constants and channel axes follow the block size), except that in
  ``resnet50-int8-amx`` (a ``qnn_float.FloatQuantGraph``) the requantize and the residual adds
  compute in float32, as ONNX's QLinearConv / QLinearAdd define them (``qnn_float``: 16 lanes
  per vector where the fixed point's ``q_multiply_shift`` runs 8 in int64; the residual tasks'
  epilogue was most of their time once AMX made the convs fast), and the requantize feeding a
  residual add is computed inside the add (``fold_requantize``: no uint8 round trip). Imported
  models requantize in float32 too; their adds are ORT's own arithmetic (``qnn_ort``);
* an imported model's convs that are grouped or whose outputs are not a multiple of 64
  (``tvm-ext import --layout amx``) are emitted as ``qnn_packed`` does (16-lane blocks),
  and convs reading them are left to VNNI by the AMX rule.

Same graph, weights and quantization parameters as ``resnet50-int8``; the reference is that
graph's float view (``FloatQuantGraph.of``). Each requantize is within one uint8 step of the
fixed point's; through 53 layers the outputs drift apart (at 224: up to 28 steps, 95 % of the
1000 differ, same top-1), as ONNX Runtime's do from either.
"""
from __future__ import annotations

from tvm import relax, te, tirx

from . import qnn_float
from .qnn import _pad_hw, _pads, _pair
from .qnn_packed import Packed, PackedEmitter, pack_input
from .qnn_vnni import K_BLOCK, OC_BLOCK, _out_hw, channel_block, pack_conv_weight

AMX_BLOCK = 64  # channels per activation block: the 64 bytes of one tile row


def activation_block(channels: int) -> int:
    """NCHW[cb]c block for an AMX network's activation: 64 where the channels allow."""
    return AMX_BLOCK if channels % AMX_BLOCK == 0 else channel_block(channels)


def conv2d_nchwc_acc_ob(data: te.Tensor, weight: te.Tensor, *, stride=1, pad=0,
                        zp_x: int = 0, ob: int = AMX_BLOCK) -> te.Tensor:
    """int32 accumulator of a packed uint8 x int8 conv2d, output in NCHW[ob]c.

    data (N, C/cb, H, W, cb) u8, padded with ``zp_x``; weight
    (O/16, C/cb, KH, KW, cb/4, 16, 4) i8; returns (N, O/ob, OH, OW, ob) i32.
    ``stride``: int or (h, w); ``pad``: int or (top, left, bottom, right) (an imported
    model's). Its padding stays topi's (``qnn._pad_hw``), not ``qnn_vnni._pad_nchwc``: the TIR,
    and so the databases, of ``resnet50-int8-amx`` stay as they are.
    """
    n, icb, _, _, cb = (int(d) for d in data.shape)
    o16, _, kh, kw = (int(d) for d in weight.shape[:4])
    assert cb % K_BLOCK == 0 and tuple(int(d) for d in weight.shape[4:]) == (cb // K_BLOCK, OC_BLOCK, K_BLOCK)
    assert (o16 * OC_BLOCK) % ob == 0 and ob % OC_BLOCK == 0, (o16, ob)
    (sh, sw), pads = _pair(stride), _pads(pad)
    oh, ow = _out_hw(data, kh, kw, (sh, sw), pads)
    padded = _pad_hw(data, pads, tirx.const(zp_x, "uint8"), "pad", spatial=(2, 3))
    ric = te.reduce_axis((0, icb), name="ic")
    rkh = te.reduce_axis((0, kh), name="kh")
    rkw = te.reduce_axis((0, kw), name="kw")
    ric4 = te.reduce_axis((0, cb // K_BLOCK), name="ic4")
    rici = te.reduce_axis((0, K_BLOCK), name="ici")
    per = ob // OC_BLOCK  # weight blocks per output block
    return te.compute(
        (n, o16 * OC_BLOCK // ob, oh, ow, ob),
        lambda b, oc, y, x, oci: te.sum(
            padded[b, ric, y * sh + rkh, x * sw + rkw, ric4 * K_BLOCK + rici].astype("int32")
            * weight[oc * per + oci // OC_BLOCK, ric, rkh, rkw, ric4, oci % OC_BLOCK, rici].astype("int32"),
            axis=[ric, rkh, rkw, ric4, rici],
        ),
        name="conv2d_nchwc_int8",
    )


class AMXEmitter(PackedEmitter):
    """``PackedEmitter`` with 64-channel activation blocks (see the module doc), with
    ``fold_requantize`` the residual adds' conv requantize folded into them. ``float_epilogues``
    as ``PackedEmitter``'s (``for_graph`` picks it from the graph)."""

    def __init__(self, fold_requantize: bool = False, float_epilogues: bool = False):
        super().__init__(float_epilogues)
        # on for resnet50-int8-amx only: in an imported ResNet-50 the folded add of a
        # projection block took the shortcut's conv into its fused function, and FuseOps left
        # the main conv alone, its int32 accumulator written out (4 such tasks)
        self.fold_requantize = fold_requantize

    def input(self, bb, var) -> Packed:
        if str(var.ty.dtype) != "uint8":  # an imported model's float input: packed after its quantize
            return super().input(bb, var)
        c = int(var.ty.shape.values[-1])
        cb = activation_block(c)
        return Packed(bb.emit_te(pack_input, var, cb=cb, primfunc_name_hint="layout_nchwc"), c, cb)

    def _conv2d_nhwc(self, bb, x: Packed, w_hwio, *, stride, pad, zp_in, groups=1) -> Packed:
        c_out = int(w_hwio.shape[3])
        if groups != 1 or c_out % AMX_BLOCK:  # an imported model's depthwise or odd-width conv:
            # the 16-lane VNNI emission (output padded to 16); the next conv reads 16-blocks
            return super()._conv2d_nhwc(bb, x, w_hwio, stride=stride, pad=pad, zp_in=zp_in, groups=groups)
        weight = pack_conv_weight(w_hwio.transpose(3, 0, 1, 2), x.cb)  # HWIO -> OHWI -> packed
        ob = activation_block(c_out)
        acc = bb.emit_te(conv2d_nchwc_acc_ob, x.var, relax.const(weight), stride=stride, pad=pad,
                         zp_x=zp_in, ob=ob, primfunc_name_hint="conv2d_nchwc")
        return Packed(acc, c_out, ob)


def to_relax(graph, fused: bool = True, fold_requantize: bool = False):
    """``graph`` (a ``qnn.QuantGraph``) as a Relax module in the AMX layouts; a
    ``qnn_float.FloatQuantGraph`` gets float32 epilogues."""
    return graph.to_relax(fused=fused, emitter=AMXEmitter.for_graph(graph, fold_requantize=fold_requantize))


def build_resnet50(batch: int = 1, image: int = 224, seed: int = 0):
    """Workload ``resnet50-int8-amx``: ResNet-50's int8 graph (``resnet50_int8.network``:
    the same weights and quantization parameters as ``resnet50-int8``) in the AMX layouts,
    with float32 epilogues (``qnn_float``: ONNX's requantize arithmetic, ~2x cheaper than the
    fixed point on 512-bit vectors), so its reference is the graph's float view."""
    from .base import Workload  # pylint: disable=import-outside-toplevel
    from .resnet50_int8 import network  # pylint: disable=import-outside-toplevel

    g, inputs = network(batch, image, seed)
    g = qnn_float.FloatQuantGraph.of(g)
    options = {"batch": batch, "image": image, "seed": seed}
    return Workload("resnet50-int8-amx", to_relax(g, fold_requantize=True), inputs, g, exact=True, options=options)


__all__ = ["AMX_BLOCK", "AMXEmitter", "activation_block", "build_resnet50", "conv2d_nchwc_acc_ob", "to_relax"]
