"""VNNITensorize: uint8 x int8 -> int32 reductions on x86 VNNI, epilogue kept fused.

What it does, per block:
1. If the block's innermost iterators can be mapped onto the VNNI dot product
   ``C[i] += A[k] * B[i, k]`` (i: 16 int32 lanes, k: 4 uint8 x int8 pairs) and the
   block reads 4 consecutive uint8 of the activation and a [16][4] int8 tile of the
   weight, as the packed layouts of ``tvm_ext.workloads.qnn_vnni`` give (checked on the
   buffers, see ``operands_packed``: the mapping alone also accepts strided tiles), it is tiled
   by TVM's MultiLevelTilingWithIntrin (structure SSRSRS, write cache at tile level 1
   or 2) and annotated for tensorization; ``RewriteTensorize`` (see ``vnni_postprocs``)
   then replaces the inner 16x4 block by the intrinsic.
2. The requantize epilogue is folded into the write-back of that cache
   (``reverse_compute_inline``), so the int32 accumulators never go to memory and the
   conv/dense + requantize is one loop nest. MultiLevelTiling alone does not do this
   on CPU when the epilogue reads other buffers (per-channel multipliers): it adds a
   cache and leaves the epilogue as a second loop nest.
   The tiled block's producers (a conv's padding) are kept out of reach of later
   rules and its innermost tile loop out of auto-vectorization, both of which would
   otherwise undo the tensorization (see ``protect_tensorization``).
3. Anything else is returned untouched for the next rule (TVM's MultiLevelTiling);
   blocks we tiled carry the ``meta_schedule.tiling_structure`` annotation, so that
   rule skips them.

Intrinsics (registered here, on first use, with a 16x4 description equivalent to
that of TVM's ``dot_16x4_vnni``): AVX-512 VNNI targets use ``tvm_ext.dot_16x4_avx512vnni`` (one
512-bit ``vpdpbusd``); AVX-VNNI-only targets (Alder Lake and later client CPUs) use
``tvm_ext.dot_16x4_avxvnni``, two 256-bit (VEX-encoded) ``vpdpbusd``, so one packed
weight layout serves both. TVM's own ``dot_16x4_vnni`` cannot be used with the LLVM
the 0.27 wheel bundles (see _operand_style).
"""
from __future__ import annotations

from functools import lru_cache
from typing import List, Optional

from tvm import tirx
from tvm.ir.utils import derived_object
from tvm.s_tir import TensorIntrin
from tvm.s_tir.meta_schedule.postproc import Postproc, RewriteTensorize
from tvm.s_tir.meta_schedule.schedule_rule import (
    MultiLevelTilingWithIntrin,
    PyScheduleRule,
    ReuseType,
    ScheduleRule,
)
from tvm.s_tir.schedule import ScheduleError
from tvm.s_tir.schedule.analysis import get_auto_tensorize_mapping_info
from tvm.script import tirx as T

AVX512_VNNI_INTRIN = "tvm_ext.dot_16x4_avx512vnni"
AVX_VNNI_INTRIN = "tvm_ext.dot_16x4_avxvnni"
AUTO_TENSORIZE_ATTR = "meta_schedule.auto_tensorize"
# On the innermost tile loop of a tensorized block: any loop annotation stops TVM's
# RewriteParallelVectorizeUnroll from vectorizing that loop (and the loops outside it).
KEEP_SERIAL_ATTR = "tvm_ext.vnni_keep_serial"


# --------------------------------------------------------------------------- intrinsics
# LLVM 21+ declares vpdpbusd on byte vectors, e.g. llvm.x86.avx512.vpdpbusd.512(<16 x i32>,
# <64 x i8>, <64 x i8>); older LLVM on int32 vectors. TVM 0.27's own "dot_16x4_vnni"
# passes int32 vectors and fails LLVM verification with the LLVM 22 that the wheel
# bundles ("Call parameter type does not match function signature"), so we register our
# own implementations for the operand style this LLVM wants (probed once, see
# _operand_style), under the same 16x4 description.


# Importing tvm.s_tir.tensor_intrin (even .x86) runs its package __init__, which builds
# every CUDA intrinsic: ~30 s of CPU. So the description is written here, not imported.
@T.prim_func(s_tir=True)
def _dot_16x4_desc(
    a: T.Buffer((4,), "uint8", offset_factor=1),
    b: T.Buffer((16, 4), "int8", offset_factor=1),
    c: T.Buffer((16,), "int32", offset_factor=1),
) -> None:
    # c[lane] += sum over 4 bytes of a[byte] * b[lane, byte]
    with T.sblock("root"):
        T.reads(c[0:16], a[0:4], b[0:16, 0:4])
        T.writes(c[0:16])
        for lane, byte in T.grid(16, 4):
            with T.sblock("update"):
                v_lane, v_byte = T.axis.remap("SR", [lane, byte])
                c[v_lane] = c[v_lane] + T.cast(a[v_byte], "int32") * T.cast(b[v_lane, v_byte], "int32")


def _make_impl(instr_lanes: int, byte_operands: bool):
    """16x4 u8.s8->s32 dot product as 16 // instr_lanes vpdpbusd of instr_lanes lanes."""
    n_calls = 16 // instr_lanes
    nbytes = 4 * instr_lanes
    name = f"llvm.x86.avx512.vpdpbusd.{instr_lanes * 32}"
    acc_t, u8_t, i8_t = f"int32x{instr_lanes}", f"uint8x{nbytes}", f"int8x{nbytes}"

    def a_operand(a4):  # the 4 activation bytes, as an int32, broadcast to every lane
        return tirx.reinterpret(u8_t, a4) if byte_operands else a4

    def b_operand(b_bytes):  # 4 * lanes weight bytes: [lane][4]
        return b_bytes if byte_operands else tirx.reinterpret(acc_t, b_bytes)

    @T.prim_func(s_tir=True)
    def impl(
        a: T.Buffer((4,), "uint8", offset_factor=1),
        b: T.Buffer((16, 4), "int8", offset_factor=1),
        c: T.Buffer((16,), "int32", offset_factor=1),
    ) -> None:
        with T.sblock("root"):
            T.reads(c[0:16], a[0:4], b[0:16, 0:4])
            T.writes(c[0:16])
            a4 = T.broadcast(T.reinterpret(a.vload([0], "uint8x4"), dtype="int32"), instr_lanes)
            for h in T.unroll(n_calls):
                c[T.ramp(h * instr_lanes, 1, instr_lanes)] = T.call_llvm_pure_intrin(
                    T.llvm_lookup_intrinsic_id(name),
                    c.vload([h * instr_lanes], dtype=acc_t),
                    a_operand(a4),
                    b_operand(b.vload([h * instr_lanes, 0], dtype=i8_t)),
                    dtype=acc_t,
                )

    return impl


@lru_cache(maxsize=1)
def _operand_style() -> bool:
    """True when this LLVM wants byte-vector operands for vpdpbusd (probed by compiling)."""
    import tvm  # pylint: disable=import-outside-toplevel
    from tvm.target import codegen  # pylint: disable=import-outside-toplevel

    first = codegen.llvm_version_major() >= 21
    for style in (first, not first):
        func = _make_impl(16, style).with_attr("global_symbol", "probe")
        try:
            tvm.compile(
                tvm.IRModule({"probe": func}),
                target=tvm.target.Target({"kind": "llvm", "mcpu": "cascadelake"}),
            )
            return style
        except Exception:  # pylint: disable=broad-except
            continue
    return first


def _register(name: str, instr_lanes: int) -> str:
    try:
        TensorIntrin.get(name)
        return name
    except Exception:  # pylint: disable=broad-except
        pass
    try:
        TensorIntrin.register(name, _dot_16x4_desc, _make_impl(instr_lanes, _operand_style()))
    except Exception:  # pylint: disable=broad-except
        TensorIntrin.get(name)  # registered meanwhile under the same name
    return name


def avx512_vnni_intrin() -> str:
    """Register (once) and name the 16x4 intrinsic as one 512-bit vpdpbusd."""
    return _register(AVX512_VNNI_INTRIN, 16)


def avx_vnni_intrin() -> str:
    """Register (once) and name the 16x4 intrinsic as two 256-bit (VEX) vpdpbusd."""
    return _register(AVX_VNNI_INTRIN, 8)


def register_intrinsics() -> None:
    """Register both intrinsics: a database whose traces tensorize with them can only be
    loaded (JSONDatabase replays every trace) once they exist in this process."""
    avx512_vnni_intrin()
    avx_vnni_intrin()


def vnni_intrin_name(target) -> Optional[str]:
    """Name of the tensor intrinsic for ``target``: AVX-512 VNNI first, then AVX-VNNI."""
    from tvm_ext.targets import vnni_kinds  # pylint: disable=import-outside-toplevel

    kinds = vnni_kinds(target)
    if "avx512vnni" in kinds:
        return avx512_vnni_intrin()
    if "avxvnni" in kinds:
        return avx_vnni_intrin()
    return None


# --------------------------------------------------------------------------- rule
def operands_packed(block) -> bool:
    """Whether ``block``'s operands lie in memory as the 16x4 implementation reads them.

    The implementation loads the weight tile as 64 consecutive bytes, the activation as
    4 consecutive bytes and the accumulators as 16 consecutive int32. TVM's tensorize
    checks how the iterators map, not the strides, so a dense over a plain [N][K] int8
    weight (row stride K) maps onto the intrinsic, tensorizes, and computes wrong sums
    (found by the equivalence corpus, ``qnn_dense``). Required here: the int8 operand's
    two innermost dimensions are exactly [16][4], indexed by a spatial iterator (lane)
    and a reduction iterator (byte) -- the packed layouts of ``workloads.qnn_vnni``; the
    uint8 operand's innermost index steps by 1 with that byte iterator and the output's
    with the lane iterator (``v`` or ``v % 16`` / ``v % 4`` in the weight's index).
    """
    kinds = {iv.var: int(iv.iter_type) for iv in block.iter_vars}

    def index(region, dim):
        rng = region.region[dim]
        return rng.min if int(getattr(rng.extent, "value", -1)) == 1 else None

    weights = [r for r in block.reads if str(r.source.dtype) == "int8" and len(r.source.shape) >= 2]
    acts = [r for r in block.reads if str(r.source.dtype) == "uint8"]
    if len(weights) != 1 or len(acts) != 1 or len(block.writes) != 1:
        return False
    w, a, out = weights[0], acts[0], block.writes[0]
    if [int(getattr(d, "value", -1)) for d in w.source.shape[-2:]] != [16, 4]:
        return False
    lane, byte = _tile_var(index(w, -2), 16), _tile_var(index(w, -1), 4)
    if lane is None or byte is None:
        return False
    if kinds.get(lane) != tirx.IterVar.DataPar or kinds.get(byte) != tirx.IterVar.CommReduce:
        return False
    a_last, out_last = index(a, -1), index(out, -1)
    return _unit_step(a_last, byte) and _unit_step(out_last, lane)


def _tile_var(expr, extent: int):
    """The iterator ``v`` when ``expr`` is ``v`` or ``v % extent`` (a packed tile dim), else None."""
    if isinstance(expr, tirx.Var):
        return expr
    if isinstance(expr, tirx.FloorMod) and isinstance(expr.a, tirx.Var) and \
            int(getattr(expr.b, "value", -1)) == extent:
        return expr.a
    return None


def _unit_step(expr, var) -> bool:
    """Whether ``expr`` is linear in ``var`` with coefficient 1 (consecutive in memory)."""
    from tvm.sym import detect_linear_equation  # pylint: disable=import-outside-toplevel

    if expr is None:
        return False
    coeffs = detect_linear_equation(expr, [var])
    return len(coeffs) == 2 and int(getattr(coeffs[0], "value", 0)) == 1


def _find_tensorized_block(sch, name: str):
    """The outer (blockized) block that MultiLevelTilingWithIntrin made from ``name``."""
    try:
        return sch.get_sblock(f"{name}_o")
    except Exception:  # pylint: disable=broad-except
        return None


def fuse_epilogue(sch, outer_block, max_depth: int = 4) -> int:
    """Fold the elementwise consumers of a tiled reduction into its cache write-back.

    ``outer_block`` writes a cache that a copy block, placed inside the tile loops,
    writes back; its consumer (the requantize epilogue) is reverse-compute-inlined
    into that copy, then the next consumer, up to ``max_depth``. Returns how many
    blocks were folded; stops quietly at the first one that cannot be.
    """
    folded = 0
    consumers = sch.get_consumers(outer_block)
    if len(consumers) != 1:
        return 0
    writeback = consumers[0]
    for _ in range(max_depth):
        nxt = sch.get_consumers(writeback)
        if len(nxt) != 1:
            break
        try:
            sch.reverse_compute_inline(nxt[0])
        except ScheduleError:
            break
        folded += 1
    return folded


def protect_tensorization(sch, outer_block) -> None:
    """Keep later rules and postprocessors from undoing the tensorization of ``outer_block``.

    * Its producers (the padding block of a padded conv) are annotated
      ``schedule_rule: "None"``, which PostOrderApply's other rules skip. Otherwise
      RandomComputeLocation inlines the padding into the tiled block in about half
      the samples; the activation operand becomes an ``if_then_else`` the intrinsic
      does not match, RewriteTensorize only warns, and the candidate runs scalar.
    * Its innermost loop (the last spatial tile, outside the intrinsic) gets
      ``KEEP_SERIAL_ATTR``. Otherwise RewriteParallelVectorizeUnroll vectorizes that
      loop when its extent is above 1 (dense layers: 63 tiles of 16 classes) and the
      vector loop around the intrinsic does not build ("Cannot broadcast lanes").
    """
    for producer in sch.get_producers(outer_block):
        sch.annotate(producer, "schedule_rule", "None")
    sch.annotate(sch.get_loops(outer_block)[-1], KEEP_SERIAL_ATTR, 1)


@derived_object
class VNNITensorize(PyScheduleRule):
    """Schedule rule: tensorize u8 x s8 -> s32 reductions with VNNI, epilogue fused.

    Parameters
    ----------
    intrin_name: tensor intrinsic ("dot_16x4_vnni" or "tvm_ext.dot_16x4_avxvnni").
    max_innermost_factor: as in MultiLevelTiling.
    fuse: fold the elementwise epilogue into the tile (see module doc).
    """

    def __init__(self, intrin_name: str = AVX512_VNNI_INTRIN, max_innermost_factor: int = 64,
                 fuse: bool = True) -> None:
        super().__init__()
        if intrin_name in (AVX512_VNNI_INTRIN, AVX_VNNI_INTRIN):
            _register(intrin_name, 16 if intrin_name == AVX512_VNNI_INTRIN else 8)
        self.intrin_name = intrin_name
        self.max_innermost_factor = max_innermost_factor
        self.fuse = fuse
        self._desc = TensorIntrin.get(intrin_name).desc
        self._mlt = MultiLevelTilingWithIntrin(
            intrin_name,
            structure="SSRSRS",
            tile_binds=None,
            max_innermost_factor=max_innermost_factor,
            vector_load_lens=None,
            reuse_read=None,
            # "must": always a cache whose write-back can take the epilogue
            reuse_write=ReuseType(req="must", levels=[1, 2], scope="global"),
        )
        self._context = None

    def _initialize_with_tune_context(self, context) -> None:
        self._context = context
        self._mlt._initialize_with_tune_context(context)  # pylint: disable=protected-access

    def apply(self, sch, block):
        if not operands_packed(sch.get(block)):
            return [sch]
        try:
            if get_auto_tensorize_mapping_info(sch, block, self._desc) is None:
                return [sch]
        except Exception:  # pylint: disable=broad-except
            return [sch]
        name = sch.get(block).name_hint
        try:
            results = list(self._mlt.apply(sch, block))
        except Exception:  # pylint: disable=broad-except
            return [sch]
        out = []
        for res in results:
            outer = _find_tensorized_block(res, name)
            if outer is None:
                continue  # not tensorized after all
            if not out and not self._tensorizes(res, outer):
                # The iterators map onto the intrinsic but the operands do not (e.g. an
                # NHWC conv with HWIO weights: the weight tile is [4][16], the
                # intrinsic wants [16][4]); RewriteTensorize would fail on every candidate.
                return [sch]
            protect_tensorization(res, outer)
            if self.fuse:
                fuse_epilogue(res, outer)
            out.append(res)
        return out or [sch]

    def _tensorizes(self, sch, outer) -> bool:
        """Whether ``outer`` really tensorizes (tried on a scratch copy, as the postproc would)."""
        tmp = sch.copy()
        try:
            block = tmp.get(outer)
            name = block.name_hint
            if block.init is not None:
                tmp.decompose_reduction(outer, tmp.get_loops(outer)[0])
                outer = tmp.get_sblock(f"{name}_update")
            tmp.tensorize(outer, self.intrin_name)
            return True
        except Exception:  # pylint: disable=broad-except
            return False

    def clone(self) -> ScheduleRule:
        return VNNITensorize(self.intrin_name, self.max_innermost_factor, self.fuse)


# --------------------------------------------------------------------------- builder
def fast_local_builder(timeout_sec: float = 120.0, max_workers: int | None = None):
    """A LocalBuilder that skips ``import tvm.s_tir.tensor_intrin`` in its workers.

    TVM 0.27's default build function imports that package in every fresh worker, and
    LocalBuilder starts fresh workers for every batch: ~30 s of CPU per worker per batch
    (the CUDA intrinsics), far more than building the candidates. The candidates are
    already tensorized when they reach the builder, so the intrinsics are not needed.
    The build function is defined in a closure so that cloudpickle sends it by value
    (workers need not import tvm_ext).
    """
    from tvm.s_tir.meta_schedule.builder import LocalBuilder  # pylint: disable=import-outside-toplevel

    def make_build():
        def build(mod, target, _params):
            # pylint: disable=import-outside-toplevel
            from tvm.driver import build as tvm_build
            from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

            mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
            return tvm_build(mod, target=target)

        return build

    return LocalBuilder(f_build=make_build(), timeout_sec=timeout_sec, max_workers=max_workers)


# --------------------------------------------------------------------------- presets
def vnni_rules(target) -> List[ScheduleRule]:
    """Rules to insert **before** MultiLevelTiling in an llvm rule list.

    Empty when the target has no VNNI (non-x86, no AVX-512 VNNI / AVX-VNNI, cuda).
    """
    intrin = vnni_intrin_name(target)
    return [VNNITensorize(intrin)] if intrin else []


def vnni_postprocs(target) -> List[Postproc]:
    """Postprocessors the rule needs (RewriteTensorize); empty without VNNI."""
    return [RewriteTensorize(vectorize_init_loop=True)] if vnni_intrin_name(target) else []


def with_vnni(rules: List[ScheduleRule], postprocs: List[Postproc], target):
    """(rules, postprocs) with the VNNI pieces inserted.

    VNNITensorize goes right before the first MultiLevelTiling (else before
    ParallelizeVectorizeUnroll, else at the end); RewriteTensorize right after
    RewriteReductionBlock (it tensorizes the update block that one splits from the
    init), else at the end. Copies of the lists, unchanged when the target has no VNNI.
    """
    extra_rules, extra_posts = vnni_rules(target), vnni_postprocs(target)
    if not extra_rules:
        return list(rules), list(postprocs)
    rules = list(rules)
    names = [type(r).__name__ for r in rules]
    idx = next((i for i, n in enumerate(names) if n == "MultiLevelTiling"), None)
    if idx is None:
        idx = next((i for i, n in enumerate(names) if n == "ParallelizeVectorizeUnroll"), len(rules))
    rules[idx:idx] = extra_rules
    posts = list(postprocs)
    pnames = [type(p).__name__ for p in posts]
    # RewriteTensorize runs after RewriteReductionBlock (it tensorizes the update block
    # that one separates from the init) and before RewriteLayout
    pidx = next((i + 1 for i, n in enumerate(pnames) if n == "RewriteReductionBlock"), len(posts))
    posts[pidx:pidx] = extra_posts
    return rules, posts


def vnni_space(target):
    """TVM's default llvm rules and postprocs with the VNNI pieces (for tests/tools)."""
    from tvm.s_tir.meta_schedule.space_generator import PostOrderApply  # pylint: disable=import-outside-toplevel

    rules, posts = with_vnni(ScheduleRule.create("llvm"), Postproc.create("llvm"), target)
    return PostOrderApply(sch_rules=rules, postprocs=posts, mutator_probs="llvm")


__all__ = [
    "AVX512_VNNI_INTRIN",
    "AVX_VNNI_INTRIN",
    "VNNITensorize",
    "fuse_epilogue",
    "operands_packed",
    "protect_tensorization",
    "vnni_intrin_name",
    "vnni_rules",
    "vnni_postprocs",
    "with_vnni",
    "vnni_space",
    "fast_local_builder",
    "avx512_vnni_intrin",
    "avx_vnni_intrin",
]
