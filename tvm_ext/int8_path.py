"""Which int8 path a target runs best: AMX tiles, the VNNI-packed layout, int8 tensor cores, or plain NHWC.

One policy for the built-in ResNet-50 (``tvm-ext tune resnet50-int8`` picks its workload by it)
and for imported ONNX models (``frontend.onnx_int8.emit``): AMX where the CPU has AMX int8
(``tdpbusd``, ~7x ``vpdpbusd`` per core); the packed NCHW[x]c layout where a u8 x s8 16x4
product tensorizes -- VNNI (``vpdpbusd``), or AVX2: ``vpmaddubsw`` where every weight pair fits its
saturating int16 sums (7-bit weights), else ``vpmaddwd`` on int16 pairs (exact for any int8
weights, ~1.4x the instructions); else NHWC, which nothing tensorizes.  On CUDA GPUs with
int8 tensor cores (sm_72 and later) NHWC with the convs on signed activations (``s8``:
``workloads.qnn_signed``), the s8 x s8 form their MMA takes; else NHWC.
"""
from __future__ import annotations

# the built-in ResNet-50 of each layout
RESNET50 = {"amx": "resnet50-int8-amx", "nchwc": "resnet50-int8-nchwc", "nhwc": "resnet50-int8",
            "s8": "resnet50-int8-s8"}
LAYOUTS = ("auto", "nhwc", "nchwc", "amx", "s8")  # what --layout takes: auto, or one of RESNET50's


def best_layout(target, weights_fit_int16: bool) -> tuple[str, str]:
    """(layout, why) for ``target``: "amx", "nchwc", "s8" or "nhwc", and the reason in a few words.
    ``weights_fit_int16``: every conv/dense weight pair fits ``vpmaddubsw`` (7-bit weights); on
    AVX2 without VNNI it names the form the packed layout gets, not the layout."""
    from tvm_ext.intrinsics.vnni import AVX2_INTRIN, u8s8_intrin_name
    from tvm_ext.targets import has_amx, resolve_target

    target = resolve_target(target)  # a Target, a preset name or a JSON dict
    if target.kind.name == "cuda":
        from tvm_ext.rules.int8_tensor_core_cuda import supported

        if supported(target):
            return "s8", "this GPU has int8 tensor cores, which multiply s8 x s8"
        return "nhwc", "no int8 tensor cores before sm_72"
    if target.kind.name != "llvm":
        return "nhwc", f"the packed int8 layouts are CPU layouts, not for {target.kind.name}"
    if has_amx(target):
        return "amx", "this CPU has AMX int8 tiles"
    intrin = u8s8_intrin_name(target)
    if intrin is not None and intrin != AVX2_INTRIN:
        return "nchwc", "this CPU has VNNI (vpdpbusd) and no AMX"
    if intrin == AVX2_INTRIN and weights_fit_int16:
        return "nchwc", "AVX2 without VNNI, and every weight fits vpmaddubsw's int16 pairs"
    if intrin == AVX2_INTRIN:
        return "nchwc", "AVX2 without VNNI: vpmaddwd on int16 pairs, exact with 8-bit weights"
    return "nhwc", "no AVX2, VNNI or AMX: nothing tensorizes the int8 products"


__all__ = ["LAYOUTS", "RESNET50", "best_layout"]
