"""AMXTensorize: uint8 x int8 -> int32 reductions on Intel AMX tiles, epilogue kept fused.

What it does, per block:
1. The block must read its operands as the tiles lie in memory: the int8 weight's two
   innermost dimensions [16 outputs][4 k] (the packed layouts of ``workloads.qnn_vnni``,
   checked as for VNNI by ``vnni_tensorize.operands_packed``), and 64 consecutive k per
   tile: a conv's activation in NCHW64c (weights OIHW16i16o4i), a dense's K a multiple of
   64. The output's second-innermost iterator (a conv's output column, a dense's row)
   gives the tile's rows: the largest divisor of its extent up to 16 (14 for ResNet-50's
   56/28/14 columns, 7 for 7, 8 for a dense of 8 rows; C and A tiles may have fewer than
   16 rows), so no shape is padded; the activation index's step along it is the A-tile
   stride (1 or 2). Fewer than 4 rows (a batch-1 dense, a prime width): left to VNNI.
   A 3x3 conv gets a second variant as its own sketches: three kernel columns per
   intrinsic call (the C tile loaded and stored once per 3 dots instead of once per dot);
   the tuner picks between them.
2. The tile's loops are split off and blockized for that variant of the AMX intrinsic
   (``tvm_ext.intrinsics.amx``), then the loops outside are tiled by TVM's
   MultiLevelTiling, structure SSRSRS with a write cache, as the VNNI rule does (that is
   what MultiLevelTilingWithIntrin does too, but its applicability check wants operands
   indexed by plain iterators, which AMX's A and B tiles are not); like VNNI it folds the requantize epilogue into the cache write-back and keeps
   later rules from undoing the tiling (``vnni_tensorize.fuse_epilogue`` /
   ``protect_tensorization``).
3. ``postprocs.AMXTileConfig`` then tensorizes the tile and its init (which loads the
   tile configuration); the rule checks on a scratch copy that both will succeed, else
   it steps aside.
Anything else is returned untouched for the next rule (VNNITensorize, then TVM's
MultiLevelTiling); blocks it tiled carry ``meta_schedule.tiling_structure``, which those
skip. ``tvm_ext.rulesets.with_amx`` puts it first on targets with AMX int8.
"""
from __future__ import annotations

from tvm import tirx
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.postproc import RewriteReductionBlock
from tvm.s_tir.meta_schedule.schedule_rule import (
    MultiLevelTiling,
    PyScheduleRule,
    ScheduleRule,
)
from tvm.s_tir.schedule.transform import tile_with_tensor_intrin

from tvm_ext.intrinsics.amx import STRIDES, register_dot
from tvm_ext.postprocs.amx_tile_config import AUTO_TENSORIZE, amx_blocks, tensorize_with_tile_config
from tvm_ext.rules.vnni_tensorize import (fuse_epilogue, operands_packed, protect_tensorization,
                                          tiling_options)

TILING_STRUCTURE = "meta_schedule.tiling_structure"
MIN_ROWS = 4  # below this a tile wastes most of tdpbusd; VNNI does better


def tile_rows_and_stride(block) -> tuple[int, int] | None:
    """(rows, stride) of the A/C tiles for ``block``, or None (see module doc, step 1)."""
    from tvm.sym import detect_linear_equation  # pylint: disable=import-outside-toplevel

    if len(block.writes) != 1 or len(block.writes[0].region) < 2:
        return None
    extents = {iv.var: iv.dom.extent for iv in block.iter_vars}
    row = block.writes[0].region[-2]
    var = row.min
    if not isinstance(var, tirx.Var) or var not in extents or int(getattr(row.extent, "value", 0)) != 1:
        return None
    extent = int(getattr(extents[var], "value", 0))
    rows = max((d for d in range(1, 17) if extent % d == 0), default=0)
    if rows < MIN_ROWS:
        return None
    acts = [r for r in block.reads if str(r.source.dtype) == "uint8"]
    if len(acts) != 1 or len(acts[0].region) < 2:
        return None
    coeffs = detect_linear_equation(acts[0].region[-2].min, [var])
    if len(coeffs) != 2:
        return None
    stride = int(getattr(coeffs[0], "value", 0))
    return (rows, stride) if stride in STRIDES else None


@derived_object
class AMXTensorize(PyScheduleRule):
    """Schedule rule: tensorize u8 x s8 -> s32 reductions with AMX tiles, epilogue fused.

    Parameters
    ----------
    max_innermost_factor: as in MultiLevelTiling.
    fuse: fold the elementwise epilogue into the tile (see module doc).
    emulated: tensorize with the plain-code twins of the AMX intrinsics (same addresses
        and layouts, no tile instructions): tests of the rule on hosts without AMX.
    """

    def __init__(self, max_innermost_factor: int = 64, fuse: bool = True, emulated: bool = False) -> None:
        super().__init__()
        self.max_innermost_factor = max_innermost_factor
        self.fuse = fuse
        self.emulated = emulated
        # tiles the loops outside the blockized AMX tile (what MultiLevelTilingWithIntrin
        # does after its own tiling, whose applicability check needs an intrinsic whose
        # operands are indexed by plain iterators: the A and B tiles cannot be)
        self._mlt = MultiLevelTiling(**tiling_options(max_innermost_factor))

    def _initialize_with_tune_context(self, context) -> None:
        self._mlt._initialize_with_tune_context(context)  # pylint: disable=protected-access

    def choose_intrins(self, sch, block) -> list[str]:
        """The AMX intrinsic variants ``block`` tiles with (empty: left to other rules).

        A 3x3 conv gets two, each its own sketches: the 3-column variant ("k4t3", the C
        tile stays in tmm0 for 3 dots) and the one-dot variant ("k4"); the tuner picks.
        """
        stmt = sch.get(block)
        if not operands_packed(stmt):
            return []
        shape = tile_rows_and_stride(stmt)
        if shape is None:
            return []
        found = []
        for k_form in ("k4t3", "k4", "k"):
            intrin = register_dot(*shape, k_form, emulated=self.emulated)
            try:
                if tile_with_tensor_intrin(sch.copy(), block, intrin) is not None:
                    found.append(intrin)
            except Exception:  # pylint: disable=broad-except
                continue
            if k_form == "k4" and found:
                break  # a conv: the dense form cannot apply
        return found

    def choose_intrin(self, sch, block) -> str | None:
        """The one-dot variant ``block`` tiles with, or None (see ``choose_intrins``)."""
        plain = [i for i in self.choose_intrins(sch, block) if not i.split("_")[-1].startswith("k4t")
                 and not (i.endswith("_emu") and i.split("_")[-2].startswith("k4t"))]
        return plain[0] if plain else None

    def apply(self, sch, block):
        out = []
        for intrin in self.choose_intrins(sch, block):
            out += self._tile(sch, block, intrin)
        return out or [sch]

    def _tile(self, sch, block, intrin: str) -> list:
        """Candidates tiled for ``intrin`` (empty when it does not tensorize after all)."""
        try:
            tiled = sch.copy()
            outer = tiled.blockize(tile_with_tensor_intrin(tiled, block, intrin))
            tiled.annotate(outer, AUTO_TENSORIZE, intrin)
            # the tile itself is done: later rules (VNNI, MultiLevelTiling) skip tiled blocks
            tiled.annotate(block, TILING_STRUCTURE, "SSRSRS")
            results = list(self._mlt.apply(tiled, outer))
        except Exception:  # pylint: disable=broad-except
            return []
        out = []
        for res in results:
            if TILING_STRUCTURE not in res.get(outer).annotations:
                continue  # MultiLevelTiling declined the block
            if not out and not self._tensorizes(res):
                return []  # the postproc would reject every candidate
            protect_tensorization(res, outer)
            if self.fuse:
                fuse_epilogue(res, outer)
            out.append(res)
        return out

    @staticmethod
    def _tensorizes(sch) -> bool:
        """Whether AMXTileConfig can tensorize the tiled block (tried on a scratch copy,
        after the RewriteReductionBlock that runs before it)."""
        tmp = sch.copy()
        if not RewriteReductionBlock().apply(tmp):
            return False
        blocks = amx_blocks(tmp.mod)
        return bool(blocks) and all(tensorize_with_tile_config(tmp, *b) for b in blocks)

    def clone(self) -> ScheduleRule:
        return AMXTensorize(self.max_innermost_factor, self.fuse, self.emulated)
