"""Records picked inside the network (``tvm-ext tune --in-network K``, ``bench.in_network``,
``tune.picks``): which rank a task keeps, that every later compile of the work dir uses it, that a
pick no longer applies once tuning found a better record, and the bad input."""
import json
import os
import shutil

import pytest
import tvm

from tvm_ext import tune as tuning
from tvm_ext import workloads
from tvm_ext.bench.in_network import choose
from tvm_ext.targets import resolve_target
from tvm_ext.tune.picks import PICKS_FILE, picked_database, ranked, read_picks, trace_key, write_picks
from cli_run import SMALL, TUNED, cli, tuned_conv2d
from made_once import made_once


def test_a_lower_rank_is_kept_only_where_it_beats_the_best_by_the_margin():
    times = {"a": [1.00, 0.90, 0.97], "b": [1.00, 0.97, 0.99], "c": [0.80, 0.90, 0.95], "d": [1.0]}
    assert choose(times, margin=0.05) == {"a": 1}  # b: 3 % is inside the margin; c: its best is fastest
    assert choose(times, margin=0.0) == {"a": 1, "b": 1}
    assert choose({"e": [1.0, float("inf"), 0.5]}, margin=0.05) == {"e": 2}  # a rank never timed is never kept


@pytest.fixture(scope="module")
def picked(tmp_path_factory):
    """conv2d-int8 tuned for 2 trials (the session's database, ``cli_run.tuned_conv2d``), then the same
    command resumed with ``--in-network 2``: picked inside its network over its 2 best records, once per
    session (``made_once``); this module's own copy."""
    def pick(path):
        shutil.copytree(tuned_conv2d(tmp_path_factory) / TUNED, path / TUNED)
        _, out, err = cli("tune", "conv2d-int8", *SMALL, "--trials", "2", "--work-dir", str(path / TUNED),
                          "--in-network", "2", "--json")
        (path / "out.json").write_text(out)
        (path / "err.txt").write_text(err)

    made = made_once(tmp_path_factory, "conv2d-int8-2-trials-in-network-2", pick)
    work_dir = str(tmp_path_factory.mktemp("picks") / TUNED)
    shutil.copytree(made / TUNED, work_dir)
    return work_dir, json.loads((made / "out.json").read_text()), (made / "err.txt").read_text()


def _conv_task_and_ranks(work_dir):
    (task,) = [t for t in tuning.load_tasks(work_dir, tuning.read_meta(work_dir)) if "conv" in t.name]
    return task, ranked(tuning.open_database(work_dir, read_only=True), task.mod, 2)


def _bare(func):
    return func.without_attr("global_symbol").without_attr("tirx.is_scheduled").without_attr("tirx.is_scheduled")


def _compiled_conv(work_dir):
    """The conv function of conv2d-int8 as the work dir's database schedules it inside the network."""
    workload = workloads.get("conv2d-int8", image=8, batch=1)
    mod = tuning.apply_database(workload, resolve_target("llvm"), work_dir)
    (func,) = [f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc) and "conv" in gv.name_hint]
    return _bare(func)


def _picked_ranks(work_dir):
    return {t["name"]: t["picked_rank"] for t in tuning.report(work_dir)["tasks"] if "picked_rank" in t}


def test_tune_in_network_times_the_ranks_and_writes_the_picks(picked):
    work_dir, result, progress = picked
    task, ranks = _conv_task_and_ranks(work_dir)
    assert len(ranks) == 2 and trace_key(ranks[0]) != trace_key(ranks[1])  # distinct schedules
    assert "compiling the network with rank 1" in progress and "tasks run a lower-ranked record" in progress
    about = json.loads(open(os.path.join(work_dir, PICKS_FILE)).read())
    assert about["top_k"] == 2 and len(about["network_ms"]) == 2 and result["in_network"]["top_k"] == 2
    for name, pick in about["picks"].items():  # whatever the host's timings chose: consistent
        assert pick["rank"] == 1 and pick["best"] == trace_key(ranks[0]) and pick["pick"] == trace_key(ranks[1])
        assert pick["in_network_ms"][1] < 0.95 * pick["in_network_ms"][0]
        confirmed = about["confirm_ms"]  # kept: the network ran faster with the picks, first run and warm
        assert confirmed["picks"] < confirmed["best_records"]
        assert confirmed["picks_warm"] < confirmed["best_records_warm"]


def test_a_pick_is_what_the_network_compiles_until_tuning_finds_a_better_record(picked, tmp_path):
    work_dir = str(tmp_path / "wd")
    shutil.copytree(picked[0], work_dir)
    task, (best, second) = _conv_task_and_ranks(work_dir)
    expected = {r: _bare(tuning.scheduled_mod(r, task.mod)["main"]) for r in (best, second)}
    write_picks(work_dir, {task.name: {"best": trace_key(best), "pick": trace_key(second), "rank": 1}}, {})
    tvm.ir.assert_structural_equal(_compiled_conv(work_dir), expected[second])
    assert _picked_ranks(work_dir) == {task.name: 1}  # the report says which record the network runs
    assert [trace_key(r) for r in picked_database(work_dir).get_all_tuning_records()
            if "conv" in str(r.workload.mod)] == [trace_key(second)]
    # the task's best record is another than the pick was made against (tuning went on): the best again
    write_picks(work_dir, {task.name: {"best": "0" * 16, "pick": trace_key(second), "rank": 1}}, {})
    tvm.ir.assert_structural_equal(_compiled_conv(work_dir), expected[best])
    assert _picked_ranks(work_dir) == {}
    os.remove(os.path.join(work_dir, PICKS_FILE))
    assert read_picks(work_dir) == {}
    tvm.ir.assert_structural_equal(_compiled_conv(work_dir), expected[best])


def test_in_network_below_two_records_is_one_line(tmp_path):
    code, _, err = cli("tune", "conv2d-int8", *SMALL, "--trials", "1", "--work-dir", str(tmp_path / "wd"),
                       "--in-network", "1", check=False)
    assert code != 0 and "--in-network compares each task's K best records" in err
    assert len(err.strip().splitlines()) == 1 and not os.path.exists(tmp_path / "wd")
