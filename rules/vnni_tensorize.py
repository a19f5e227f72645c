"""VNNITensorize: uint8 x int8 -> int32 reductions on x86 (VNNI or AVX2), epilogue kept fused.

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

On x86 CPUs without VNNI the rule is built with ``AVX2_INTRIN`` and has two forms. Blocks
annotated ``PAIRS_FIT_INT16_ATTR`` (truthy) get ``AVX2_INTRIN`` (``vpmaddubsw`` +
``vpmaddwd``): ``vpmaddubsw`` sums adjacent u8 x s8 products in int16 with saturation, so it
is exact only when every weight pair has 255 * (|w0| + |w1|) <= 32767; the weights are
constants the workload knows and this rule does not, so the workload vouches for them with
the annotation. Any other block gets ``AVX2_EXACT_INTRIN`` (``vpmaddwd`` on int16 pairs,
exact for any int8 weights, ~1.4x the instructions). The VNNI forms are exact for any int8
weights and ignore the annotation.

The intrinsics live in ``tvm_ext.intrinsics.vnni``; the rule lists that put this rule
before MultiLevelTiling (``with_vnni``, which picks the form by ``u8s8_intrin_name``) in
``tvm_ext.rulesets``.
"""
from __future__ import annotations

from tvm import tirx
from tvm.s_tir import TensorIntrin
from tvm.s_tir.meta_schedule.schedule_rule import MultiLevelTilingWithIntrin, ReuseType
from tvm.s_tir.schedule import ScheduleError
from tvm.s_tir.schedule.analysis import get_auto_tensorize_mapping_info

from tvm_ext.intrinsics.vnni import (AVX2_EXACT_INTRIN, AVX2_INTRIN, AVX512_VNNI_INTRIN, PAIRS_FIT_INT16_ATTR,
                                      U8S8_FORMS, block_form, register_intrinsics)
from tvm_ext.schedule_rule import ScheduleRule

AUTO_TENSORIZE_ATTR = "meta_schedule.auto_tensorize"
# On the innermost tile loop of a tensorized block: any loop annotation stops TVM's
# RewriteParallelVectorizeUnroll from vectorizing that loop (and the loops outside it).
KEEP_SERIAL_ATTR = "tvm_ext.vnni_keep_serial"
# The forms whose 8-lane accumulator updates need the write-back vectorized per pixel (``narrow_writeback``)
NARROW_WRITEBACK_FORMS = (AVX2_INTRIN, AVX2_EXACT_INTRIN)


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


def annotated_pairs_fit(block) -> bool:
    """Whether ``block`` carries a truthy ``PAIRS_FIT_INT16_ATTR`` (its weight pairs fit
    vpmaddubsw's int16 sums, so the AVX2 form is exact)."""
    value = block.annotations.get(PAIRS_FIT_INT16_ATTR)
    try:
        return bool(int(getattr(value, "value", value) or 0))
    except (TypeError, ValueError):
        return False


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


def narrow_writeback(sch, outer_block) -> None:
    """Vectorize the accumulators' write-back (and the epilogue folded into it) over the 16
    output channels of one pixel only: ``KEEP_SERIAL_ATTR`` on the loop outside them.

    Otherwise RewriteParallelVectorizeUnroll fuses the tile's pixels into one vector (112 lanes
    for 7 pixels); LLVM's SROA then turns the whole accumulator tile into one <112 x i32> value,
    and every 8-lane update of the AVX2 forms becomes element inserts and extracts inside the
    reduction loop (measured: 4.6 GMAC/s for a 7-pixel tile of a 3x3 conv, ~40 for 4 pixels)."""
    consumers = sch.get_consumers(outer_block)
    if len(consumers) != 1:
        return
    loops = sch.get_loops(consumers[0])
    if len(loops) >= 2:
        sch.annotate(loops[-2], KEEP_SERIAL_ATTR, 1)


def tiling_options(max_innermost_factor: int) -> dict:
    """MultiLevelTiling options around a CPU tensor intrinsic (VNNI here, AMX too): CPU
    structure, no thread binds or read caches, and always a write cache whose write-back
    can take the epilogue."""
    return dict(structure="SSRSRS", tile_binds=None, max_innermost_factor=max_innermost_factor,
                vector_load_lens=None, reuse_read=None,
                reuse_write=ReuseType(req="must", levels=[1, 2], scope="global"))


class VNNITensorize(ScheduleRule):
    """Schedule rule: tensorize u8 x s8 -> s32 reductions with VNNI (or the AVX2 forms, see the
    module doc), epilogue fused.  A block-level rule of the contract (``tvm_ext.schedule_rule``):
    MetaSchedule's face only, its tiles are sampled.

    Parameters
    ----------
    intrin_name: tensor intrinsic of ``tvm_ext.intrinsics.vnni`` (``AVX512_VNNI_INTRIN``,
        ``AVX_VNNI_INTRIN``, or ``AVX2_INTRIN``: then ``AVX2_EXACT_INTRIN`` for blocks not
        annotated ``PAIRS_FIT_INT16_ATTR``) or another registered 16x4 one.
    max_innermost_factor: as in MultiLevelTiling.
    fuse: fold the elementwise epilogue into the tile (see module doc).
    """

    name = "vnni_tensorize"
    gpu = False

    def __init__(self, intrin_name: str = AVX512_VNNI_INTRIN, max_innermost_factor: int = 64,
                 fuse: bool = True) -> None:
        super().__init__()
        if intrin_name in U8S8_FORMS:
            register_intrinsics()
        self.intrin_name = intrin_name
        self.max_innermost_factor = max_innermost_factor
        self.fuse = fuse
        self._desc = TensorIntrin.get(intrin_name).desc  # every form of the family shares it
        self._mlt = {}  # intrinsic -> its MultiLevelTilingWithIntrin (made on first use)
        self._context = None

    def form(self, block) -> str:
        """The intrinsic ``block`` gets: the rule's, but the exact AVX2 form for an AVX2 rule's
        blocks whose weights are not vouched for (module doc)."""
        return block_form(self.intrin_name, annotated_pairs_fit(block))

    def _tiling(self, intrin: str):
        if intrin not in self._mlt:
            self._mlt[intrin] = MultiLevelTilingWithIntrin(intrin, **tiling_options(self.max_innermost_factor))
            if self._context is not None:
                self._mlt[intrin]._initialize_with_tune_context(self._context)  # pylint: disable=protected-access
        return self._mlt[intrin]

    def initialize(self, context) -> None:
        self._context = context
        for mlt in self._mlt.values():
            mlt._initialize_with_tune_context(context)  # pylint: disable=protected-access

    def candidates(self, sch, block, target):
        stmt = sch.get(block)
        if not operands_packed(stmt):
            return [sch]
        try:
            if get_auto_tensorize_mapping_info(sch, block, self._desc) is None:
                return [sch]
        except Exception:  # pylint: disable=broad-except
            return [sch]
        intrin = self.form(stmt)
        name = stmt.name_hint
        try:
            results = list(self._tiling(intrin).apply(sch, block))
        except Exception:  # pylint: disable=broad-except
            return [sch]
        out = []
        for res in results:
            outer = _find_tensorized_block(res, name)
            if outer is None:
                continue  # not tensorized after all
            if not out and not _tensorizes(res, outer, intrin):
                # The iterators map onto the intrinsic but the operands do not (e.g. an
                # NHWC conv with HWIO weights: the weight tile is [4][16], the
                # intrinsic wants [16][4]); RewriteTensorize would fail on every candidate.
                return [sch]
            protect_tensorization(res, outer)
            if self.fuse:
                fuse_epilogue(res, outer)
            if intrin in NARROW_WRITEBACK_FORMS:
                narrow_writeback(res, outer)
            out.append(res)
        return out or [sch]

    def clone(self) -> "VNNITensorize":
        return VNNITensorize(self.intrin_name, self.max_innermost_factor, self.fuse)


def _tensorizes(sch, outer, intrin: str) -> bool:
    """Whether ``outer`` really tensorizes with ``intrin`` (tried on a scratch copy, as the
    postproc would)."""
    tmp = sch.copy()
    try:
        block = tmp.get(outer)
        name = block.name_hint
        if block.init is not None:
            tmp.decompose_reduction(outer, tmp.get_loops(outer)[0])
            outer = tmp.get_sblock(f"{name}_update")
        tmp.tensorize(outer, intrin)
        return True
    except Exception:  # pylint: disable=broad-except
        return False
