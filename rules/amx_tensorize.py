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
   a conv reading 2 or more 64-channel blocks another: 4 or 2 blocks per call (C once per
   4 or 2 dots); the tuner picks between them.
2. The tile's loops are split off and blockized for that variant of the AMX intrinsic
   (``tvm_ext.intrinsics.amx``), then the loops outside are tiled by TVM's
   MultiLevelTiling, structure SSRSRS with a write cache, as the VNNI rule does (that is
   what MultiLevelTilingWithIntrin does too, but its applicability check wants operands
   indexed by plain iterators, which AMX's A and B tiles are not); like VNNI it folds the requantize epilogue into
   the cache write-back and keeps
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
from tvm.s_tir.meta_schedule.postproc import RewriteReductionBlock
from tvm.s_tir.meta_schedule.schedule_rule import MultiLevelTiling
from tvm.s_tir.schedule.transform import tile_with_tensor_intrin

from tvm_ext.intrinsics.amx import CHAIN, STRIDES, k_form_of, register_dot
from tvm_ext.postprocs.amx_tile_config import AUTO_TENSORIZE, amx_blocks, tensorize_with_tile_config
from tvm_ext.schedule_rule import ScheduleRule
from tvm_ext.tir_utils import block_realize, collect
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


def tile_chained(sch, block, intrin: str):
    """Split and reorder ``block``'s loops for a chained dot (``k4c2``/``k4c4``) and return
    the outermost loop of the tile, or None where the block does not fit it.

    TVM's ``tile_with_tensor_intrin`` does this for the other forms; for the chained one it
    finds no mapping (its input-channel block lies outside the activation's innermost
    dimensions, kernel rows and columns in between). Innermost, in the intrinsic's order:
    the tile's output rows, its 16 output lanes, the ``chain`` input-channel blocks, then
    the 16 x 4 of one block; the kernel loops stay outside."""
    from tvm.sym import detect_linear_equation  # pylint: disable=import-outside-toplevel

    chain = CHAIN[k_form_of(intrin)]
    stmt = sch.get(block)
    rows, _ = tile_rows_and_stride(stmt)
    loops = sch.get_loops(block)
    realize = block_realize(sch, block)
    if realize is None or len(loops) != len(stmt.iter_vars):
        return None
    loop_of = {}
    for iv, value, loop in zip(stmt.iter_vars, realize.iter_values, loops):
        if not (isinstance(value, tirx.Var) and value.same_as(sch.get(loop).loop_var)):
            return None  # not a fresh block: its loops are not its iterators one to one
        loop_of[iv.var] = (loop, int(iv.dom.extent))
    act = [r for r in stmt.reads if str(r.source.dtype) == "uint8"][0]
    ic, x, oci = act.region[1].min, stmt.writes[0].region[-2].min, stmt.writes[0].region[-1].min
    inner = collect(act.region[-1].min, tirx.Var)
    if not all(v in loop_of for v in (ic, x, oci, *inner)) or len(inner) != 2:
        return None
    k4, ki = sorted(inner, key=lambda v: -int(detect_linear_equation(act.region[-1].min, [v])[0]))
    if loop_of[ic][1] % chain or loop_of[oci][1] % 16 or loop_of[x][1] % rows or \
            (loop_of[k4][1], loop_of[ki][1]) != (16, 4):
        return None
    # every tile loop split off its own (unit) outer loop, as tile_with_tensor_intrin does:
    # the blockized outer block then binds each iterator to a loop (MultiLevelTiling tiles
    # only blocks with such trivial bindings)
    tile = [sch.split(loop_of[v][0], [None, n])[1]
            for v, n in ((x, rows), (oci, 16), (ic, chain), (k4, 16), (ki, 4))]
    rest = [lp for lp in sch.get_loops(block) if not any(sch.get(lp).same_as(sch.get(t)) for t in tile)]
    sch.reorder(*rest, *tile)
    return tile[0]


class AMXTensorize(ScheduleRule):
    """Schedule rule: tensorize u8 x s8 -> s32 reductions with AMX tiles, epilogue fused.  A
    block-level rule of the contract (``tvm_ext.schedule_rule``): MetaSchedule's face only.

    Parameters
    ----------
    max_innermost_factor: as in MultiLevelTiling.
    fuse: fold the elementwise epilogue into the tile (see module doc).
    emulated: tensorize with the plain-code twins of the AMX intrinsics (same addresses
        and layouts, no tile instructions): tests of the rule on hosts without AMX.
    """

    name = "amx_tensorize"
    gpu = False

    def __init__(self, max_innermost_factor: int = 64, fuse: bool = True, emulated: bool = False) -> None:
        super().__init__()
        self.max_innermost_factor = max_innermost_factor
        self.fuse = fuse
        self.emulated = emulated
        # tiles the loops outside the blockized AMX tile (what MultiLevelTilingWithIntrin
        # does after its own tiling, whose applicability check needs an intrinsic whose
        # operands are indexed by plain iterators: the A and B tiles cannot be)
        self._mlt = MultiLevelTiling(**tiling_options(max_innermost_factor))

    def initialize(self, context) -> None:
        from tvm_ext.amx import request_amx_if_host_has_it  # pylint: disable=import-outside-toplevel

        request_amx_if_host_has_it()  # the process's tile permission, before any tile instruction runs here
        self._mlt._initialize_with_tune_context(context)  # pylint: disable=protected-access

    def choose_intrins(self, sch, block) -> list[str]:
        """The AMX intrinsic variants ``block`` tiles with (empty: left to other rules).

        A conv with 2 or more input-channel blocks of 64 gets the chained variant ("k4c4",
        else "k4c2": the C tile stays in tmm0 while A and B step through 4 or 2 blocks), a
        3x3 conv the 3-column variant ("k4t3", the C tile stays for 3 dots), and every conv
        the one-dot variant ("k4"); each has its own sketches and the tuner picks.
        """
        stmt = sch.get(block)
        if not operands_packed(stmt):
            return []
        shape = tile_rows_and_stride(stmt)
        if shape is None:
            return []
        found = []
        for k_form in ("k4c4", "k4c2", "k4t3", "k4", "k"):
            if k_form == "k4c2" and found:
                continue  # chained by 4 already: one chained variant per block
            intrin = register_dot(*shape, k_form, emulated=self.emulated)
            try:
                if self._tile_loop(sch.copy(), block, intrin) is not None:
                    found.append(intrin)
            except Exception:  # pylint: disable=broad-except
                continue
            if k_form == "k4" and found:
                break  # a conv: the dense form cannot apply
        return found

    def choose_intrin(self, sch, block) -> str | None:
        """The one-dot variant ``block`` tiles with, or None (see ``choose_intrins``)."""
        plain = [i for i in self.choose_intrins(sch, block)
                 if k_form_of(i) in ("k4", "k")]
        return plain[0] if plain else None

    def candidates(self, sch, block, target):
        out = []
        for intrin in self.choose_intrins(sch, block):
            out += self._tile(sch, block, intrin)
        return out or [sch]

    def _tile(self, sch, block, intrin: str) -> list:
        """Candidates tiled for ``intrin`` (empty when it does not tensorize after all)."""
        try:
            tiled = sch.copy()
            outer = tiled.blockize(self._tile_loop(tiled, block, intrin))
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
    def _tile_loop(sch, block, intrin: str):
        """The outermost loop of ``block``'s tile for ``intrin`` (None: it does not fit)."""
        if k_form_of(intrin) in CHAIN:
            return tile_chained(sch, block, intrin)
        return tile_with_tensor_intrin(sch, block, intrin)

    @staticmethod
    def _tensorizes(sch) -> bool:
        """Whether AMXTileConfig can tensorize the tiled block (tried on a scratch copy,
        after the RewriteReductionBlock that runs before it)."""
        tmp = sch.copy()
        if not RewriteReductionBlock().apply(tmp):
            return False
        blocks = amx_blocks(tmp.mod)
        return bool(blocks) and all(tensorize_with_tile_config(tmp, *b) for b in blocks)

    def clone(self) -> "AMXTensorize":
        return AMXTensorize(self.max_innermost_factor, self.fuse, self.emulated)
