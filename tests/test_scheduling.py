"""The public scheduling pass (``tvm_ext.ApplySchedules``): what a TVM user calls on a Relax module is what the
commands build, tuned records first, our rules next, dlight for the rest."""
import pytest

tvm = pytest.importorskip("tvm")

from tvm.s_tir import meta_schedule as ms  # noqa: E402
from tvm.script import ir as I  # noqa: E402
from tvm.script import tirx as T  # noqa: E402

import tvm_ext  # noqa: E402
from tvm_ext.workloads.phi2.compiled import KV_WRITES, schedule  # noqa: E402
from tvm_ext.scheduling import dlight_schedule, kernel_key, normalize, schedule_module, with_symbol_of  # noqa: E402
from tvm_ext.targets import resolve_target  # noqa: E402
from tvm_ext.workloads.phi2 import model as pm  # noqa: E402

TARGET = resolve_target({"kind": "llvm", "mcpu": "haswell"})  # AVX2: the q4 x int8 GEMM's form too


@pytest.fixture(scope="module")
def model():
    return pm.build_model("reduced", 1, capacity=8, compute="int8")


def _commit_dlight_record(db, mod, target):
    """A record of ``mod`` holding dlight's schedule (not our rules'): the tuned kernel is told apart."""
    sch = dlight_schedule(mod, target)[1]
    workload = db.commit_workload(mod)
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, workload, run_secs=[1e-6], target=target,
                                                     args_info=ms.arg_info.ArgInfo.from_prim_func(mod["main"])))
    return sch.mod


@pytest.mark.parametrize("how", ["dlight", "rule", "int8", "none"])
def test_public_pass_equals_the_commands_schedule(model, how):
    """``tvm_ext.ApplySchedules`` on the lowered Phi-2 module is, function for function, what ``generate``
    compiles (``workloads.phi2.compiled.schedule``), with the same report of what scheduled each kernel."""
    apply = tvm_ext.ApplySchedules(TARGET, how, skip=KV_WRITES)
    got = apply(model.mod)
    want, used = schedule(model.mod, TARGET, how)
    tvm.ir.assert_structural_equal(got, want)
    assert apply.used == used
    if how in ("rule", "int8"):
        assert used["layer_norm"] == "row_norm_cpu" and "q4_int8_gemm" in used.values()
    if how == "dlight":
        assert not {"row_norm_cpu", "q4_int8_gemm", "dequant_gemv"} & set(used.values())


def test_tuned_reads_the_database_and_equals_the_commands_schedule(model, tmp_path):
    """``tuned``: the record where the database holds the kernel (here dlight's schedule of the
    LayerNorm, which our rule would schedule otherwise), our rules elsewhere; the work dir ``generate``
    reads gives the same module; a kernel kept untuned by the side-by-side check gets our rule's."""
    layer_norm = normalize(model.mod["layer_norm"])
    db = ms.database.JSONDatabase(work_dir=str(tmp_path))
    recorded = _commit_dlight_record(db, layer_norm, TARGET)
    apply = tvm_ext.ApplySchedules(TARGET, "tuned", database=db, skip=KV_WRITES)
    got = apply(model.mod)
    assert apply.used["layer_norm"] == "tuned" and apply.used["softmax"] == "row_norm_cpu"
    tvm.ir.assert_structural_equal(got["layer_norm"], with_symbol_of(model.mod["layer_norm"], recorded["main"])
                                   .with_attr("tirx.is_scheduled", True))
    want, used = schedule(model.mod, TARGET, "tuned", str(tmp_path))
    tvm.ir.assert_structural_equal(got, want)
    assert used == apply.used
    kept, kept_used = schedule_module(model.mod, TARGET, "tuned", db, keep_untuned={kernel_key(layer_norm)},
                                      skip=KV_WRITES)
    assert kept_used == apply.used  # the tuned row's kernel, with the untuned schedule the check kept
    tvm.ir.assert_structural_equal(kept, schedule(model.mod, TARGET, "rule")[0])


def test_bad_schedule_names_and_a_tuned_pass_without_database_say_so():
    with pytest.raises(ValueError, match="unknown schedule 'fast'; the schedules are dlight, rule"):
        tvm_ext.ApplySchedules(TARGET, "fast")
    with pytest.raises(ValueError, match="'tuned' needs a tuning database"):
        tvm_ext.ApplySchedules(TARGET, "tuned")
    with pytest.raises(ValueError, match="no tuning database"):
        schedule(pm.build_model("reduced", 1, capacity=4).mod, TARGET, "tuned", "/nonexistent")


def test_every_rule_has_both_faces():
    """Each whole-function rule answers dlight's ``apply(func, target, tunable)`` and is named in
    MetaSchedule as itself (``type(r).__name__``), through the one adapter."""
    from tvm.s_tir import dlight

    from tvm_ext.rulesets import schedule_rules

    for target in (TARGET, resolve_target("cuda-sm80")):
        for rule in schedule_rules(target):
            assert isinstance(rule, dlight.ScheduleRule) and rule.is_target_available(target)
            face = rule.meta_schedule()
            assert isinstance(face, ms.ScheduleRule) and type(face).__name__ == type(rule).__name__


def test_a_network_through_the_public_pass_equals_what_tune_compiles(tmp_path):
    """conv2d-int8's fused module: ``tvm_ext.ApplySchedules(target, "tuned", database)`` is what ``tune``,
    ``bench --from-logs`` and the ONNX importer's checks compile from a work dir (``tune.apply``): the
    recorded task as TVM's ``MetaScheduleApplyDatabase`` schedules and marks it (private, as it was), the
    others by our rules or dlight; without a database, ``rule``."""
    from tvm import relax

    from tvm_ext import workloads
    from tvm_ext.tune.apply import apply_database, apply_with
    from tvm_ext.tune.database import open_database

    target = resolve_target({"kind": "llvm", "num-cores": 2})
    wl = workloads.get("conv2d-int8", image=8, batch=1, seed=0)
    (task,) = [t for t in ms.relax_integration.extract_tasks(wl.mod, target) if "conv" in t.task_name]
    mod = task.dispatched[0]
    sch = tvm.s_tir.Schedule(mod)
    (block,) = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if "conv" in sch.get(b).name_hint]
    sch.parallel(sch.get_loops(block)[0])
    db = open_database(str(tmp_path))
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(mod), run_secs=[1e-6],
                                                     target=target,
                                                     args_info=ms.arg_info.ArgInfo.from_prim_func(mod["main"])))
    apply = tvm_ext.ApplySchedules(target, "tuned", database=open_database(str(tmp_path), read_only=True))
    with target:
        got = apply(wl.mod)
    tvm.ir.assert_structural_equal(got, apply_database(wl, target, str(tmp_path)))
    (tuned,) = [name for name, how in apply.used.items() if how == "tuned"]
    assert tuned == task.task_name and set(apply.used) == {gv.name_hint for gv, f in wl.mod.functions_items()
                                                           if isinstance(f, tvm.tirx.PrimFunc)}
    with target, tvm.transform.PassContext(opt_level=3), db:
        theirs = relax.transform.MetaScheduleApplyDatabase()(wl.mod)
    tvm.ir.assert_structural_equal(got[tuned], theirs[tuned])
    untuned, _ = schedule_module(wl.mod, target, "rule")
    tvm.ir.assert_structural_equal(apply_with(wl, target, None), untuned)


# A private elementwise function our injective rule vectorizes, a public one (its global_symbol its name), and one
# marked scheduled by hand as TVM 0.27 marks it (``tirx.is_scheduled``, read by dlight and MetaSchedule).
@I.ir_module(s_tir=True)
class Before:
    @T.prim_func(private=True, s_tir=True)
    def add_one(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i in range(64):
            with T.sblock("add"):
                vi = T.axis.spatial(64, i)
                b[vi] = a[vi] + T.float32(1)

    @T.prim_func(s_tir=True)
    def add_two(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i in range(64):
            with T.sblock("add"):
                vi = T.axis.spatial(64, i)
                b[vi] = a[vi] + T.float32(2)

    @T.prim_func(private=True, s_tir=True)
    def double(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        for i in range(64):
            with T.sblock("mul"):
                vi = T.axis.spatial(64, i)
                b[vi] = a[vi] * T.float32(2)


@I.ir_module(s_tir=True)
class After:
    @T.prim_func(private=True, s_tir=True)
    def add_one(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i_0 in range(4):
            for i_1 in T.vectorized(16):
                with T.sblock("add"):
                    vi = T.axis.spatial(64, i_0 * 16 + i_1)
                    b[vi] = a[vi] + T.float32(1)

    @T.prim_func(s_tir=True)
    def add_two(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i_0 in range(4):
            for i_1 in T.vectorized(16):
                with T.sblock("add"):
                    vi = T.axis.spatial(64, i_0 * 16 + i_1)
                    b[vi] = a[vi] + T.float32(2)

    @T.prim_func(private=True, s_tir=True)
    def double(a: T.Buffer((64,), "float32"), b: T.Buffer((64,), "float32")):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        for i in range(64):
            with T.sblock("mul"):
                vi = T.axis.spatial(64, i)
                b[vi] = a[vi] * T.float32(2)


def test_a_function_marked_tirx_is_scheduled_is_left_as_written():
    """TVM 0.27's mark of a hand-written schedule is ``tirx.is_scheduled``: the pass leaves such a function
    as it is and says so, as dlight's ``ApplyDefaultSchedule`` does."""
    apply = tvm_ext.ApplySchedules(TARGET, "rule")
    got = apply(Before)
    assert apply.used["double"] == "hand-scheduled"
    tvm.ir.assert_structural_equal(got["double"], Before["double"])


def test_scheduled_functions_keep_their_global_symbol_as_found():
    """A function the pass schedules stays private where it was (a fused function; TVM's passes add no
    symbol, the build attaches every name) and keeps its own symbol where it had one."""
    apply = tvm_ext.ApplySchedules(TARGET, "rule")
    got = apply(Before)
    assert apply.used == {"add_one": "injective_cpu", "add_two": "injective_cpu", "double": "hand-scheduled"}
    assert "global_symbol" not in got["add_one"].attrs and got["add_two"].attrs["global_symbol"] == "add_two"
    tvm.ir.assert_structural_equal(got, After)
