"""AMXTileConfig: tensorize AMX blocks together with the tile configuration they need.

An AMX tile instruction executed before ``ldtilecfg`` in the same thread raises #UD: the
process dies (SIGILL). So every block that ``rules.amx_tensorize`` annotated for an AMX
dot intrinsic must have its accumulator init tensorized with the init intrinsic of the
same tile shape (``ldtilecfg`` + ``tilezero``, see ``tvm_ext.intrinsics.amx``): the init
of an output tile runs right before that tile's dots, in the same thread, so the
configuration is in place whichever thread runs which tiles.

Why not one ``ldtilecfg`` at the start of the function and ``tilerelease`` at the end:
MetaSchedule replays a candidate from its trace (databases store traces, not IR), and
schedule primitives cannot insert a statement at a function's entry; a change made
outside the trace would be lost on replay and the replayed kernel would crash. Here
everything is ``decompose_reduction`` / ``tensorize`` / ``unannotate``, all traced. The
init reads the thread's configuration back (``sttilecfg``, ~14 cycles) and loads it only
where it differs: ``ldtilecfg`` costs ~290 cycles, which per output tile was most of a
64-channel 1x1 conv's time. No ``tilerelease`` is emitted (the kernel keeps the thread's
tile state until it exits).

It runs after ``RewriteReductionBlock`` and before ``RewriteTensorize`` (whose failures
are only warnings, which for AMX would mean a crash): it tensorizes the dot and its init
itself and rejects the candidate (returns False) when either fails.
"""
from __future__ import annotations

from tvm import tirx
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.postproc import PyPostproc

from tvm_ext.intrinsics.amx import DOT_PREFIX, init_for_dot, register_intrinsics
from tvm_ext.tir_utils import block_realize, blocks_of, collect, prim_funcs

AUTO_TENSORIZE = "meta_schedule.auto_tensorize"


def amx_blocks(mod) -> list[tuple[str, str, str]]:
    """(block name, function name, dot intrinsic) of every block annotated for AMX."""
    found = []
    for fname, func in prim_funcs(mod):
        for block in blocks_of(func):
            intrin = block.annotations.get(AUTO_TENSORIZE)
            if intrin is not None and str(intrin).startswith(DOT_PREFIX):
                found.append((block.name_hint, fname, str(intrin)))
    return found


def tensorize_with_tile_config(sch, block_name: str, func_name: str, intrin: str) -> bool:
    """Tensorize one annotated block with ``intrin`` and its init with the config intrinsic.

    The block's init is split off first when ``RewriteReductionBlock`` left it inside (no
    reduction loop outside the tile: a K of exactly 64). False when anything fails (the
    schedule may then be half rewritten: callers drop it or work on a copy).
    """
    try:
        block = sch.get_sblock(block_name, func_name)
        if sch.get(block).init is not None:
            loops = sch.get_loops(block)
            if not loops or _has_reduction_loop(sch, block, loops, func_name):
                return False  # RewriteReductionBlock's job (it runs before this postproc)
            init = sch.decompose_reduction(block, loops[-1])
        else:
            base = block_name[: -len("_update")] if block_name.endswith("_update") else block_name
            init = sch.get_sblock(f"{base}_init", func_name)
        sch.unannotate(block, AUTO_TENSORIZE)
        if AUTO_TENSORIZE in sch.get(init).annotations:
            sch.unannotate(init, AUTO_TENSORIZE)
        sch.tensorize(block, intrin)
        sch.tensorize(init, init_for_dot(intrin))
        return True
    except Exception:  # pylint: disable=broad-except
        return False


def _has_reduction_loop(sch, block, loops, func_name: str) -> bool:
    """Whether any of ``loops`` binds a reduction iterator of ``block``."""
    stmt = sch.get(block)
    realize = block_realize(sch, block, func_name)
    if realize is None:
        return True
    loop_vars = {sch.get(loop).loop_var for loop in loops}
    for iv, value in zip(stmt.iter_vars, realize.iter_values):
        if int(iv.iter_type) == tirx.IterVar.CommReduce and any(v in loop_vars for v in collect(value, tirx.Var)):
            return True
    return False


@derived_object
class AMXTileConfig(PyPostproc):
    """Postproc: AMX dot + tile-config init for every AMX-annotated block (see module doc)."""

    def __init__(self) -> None:
        super().__init__()
        register_intrinsics()

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, sch) -> bool:
        for block_name, func_name, intrin in amx_blocks(sch.mod):
            if not tensorize_with_tile_config(sch, block_name, func_name, intrin):
                return False
        return True

    def clone(self):
        return AMXTileConfig()
