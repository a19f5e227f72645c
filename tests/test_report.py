"""Report pages (``tvm-ext report ... --html``): what each figure draws is what the database or the JSON
holds, read back from matplotlib's artists; every task is on the page; bad input is one line."""
import base64
import json
import os
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from toy_database import LLVM, toy_mod
from toy_database import commit as _commit

from tvm_ext.cli.main import main
from tvm_ext.tune import database as D
from tvm_ext.tune.driver import Task, report, save_tasks

pytest.importorskip("matplotlib", reason='the [report] extra: pip install -e ".[report]"')

from tvm_ext.bench.timing import time_turns  # noqa: E402
from tvm_ext.report import html_of, page_for, result_page, work_dir_page, write_html  # noqa: E402
from tvm_ext.report import results as R  # noqa: E402
from tvm_ext.report.history import read_scheduler_log  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "tuning_logs"
# seconds per record, in the order they are committed (1e10: a failed candidate, as MetaSchedule marks it)
RECORDS = {"conv_big": (3, [40e-6, 25e-6, 1e10, 30e-6]), "add_small": (1, [9e-6, 12e-6]),
           "pool": (2, [1e10, 5e-6, 4e-6])}
# MetaSchedule's task-scheduler log of two tune_tasks calls (the format TVM 0.27 writes), the second
# covering only add_small's last record
SCHEDULER_LOG = """2026-12-07 07:27:48 [INFO] Logging directory: /x/logs
2026-12-07 07:27:55 [INFO] [task_scheduler.cc:344]
 ID | Name |  FLOP | Weight | Speed (GFLOPS) | Latency (us) | Weighted Latency (us) | Trials | Done
----------------------------------------------------------------------------------------------------
  0 | conv_big | 65536 |      3 |            N/A |          N/A |                   N/A |      0 |
----------------------------------------------------------------------------------------------------
2026-12-07 07:28:48 [INFO] [task_scheduler.cc:344]
 ID | Name |  FLOP | Weight | Speed (GFLOPS) | Latency (us) | Weighted Latency (us) | Trials | Done
----------------------------------------------------------------------------------------------------
  0 | conv_big | 65536 |      3 |         1.1181 |      25.0 |               75.0 |      4 |
----------------------------------------------------------------------------------------------------
2026-12-08 10:00:00 [INFO] Logging directory: /x/logs
2026-12-08 10:00:30 [INFO] [task_scheduler.cc:344]
 ID | Name |  FLOP | Weight | Speed (GFLOPS) | Latency (us) | Weighted Latency (us) | Trials | Done
----------------------------------------------------------------------------------------------------
  0 | add_small | 65536 |      1 |         1.1181 |      12.0 |               12.0 |      1 |    Y
----------------------------------------------------------------------------------------------------
"""


def _bodies():
    return {"conv_big": lambda x: x * 3 + 1, "add_small": lambda x: x + 7, "pool": lambda x: x - 2}


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    """A toy work dir of three weighted tasks, records committed in a known order, and a scheduler log."""
    path = str(tmp_path_factory.mktemp("report") / "toy-llvm-plugin")
    meta = D.prepare_work_dir(path, SimpleNamespace(name="toy", options={}), LLVM, "plugin")
    mods = {name: toy_mod(body) for name, body in _bodies().items()}
    save_tasks(path, meta, [Task(name, RECORDS[name][0], mods[name]) for name in RECORDS])
    db = D.open_database(path)
    for name, (_, seconds) in RECORDS.items():
        for secs in seconds:
            _commit(db, mods[name], secs)
    os.makedirs(os.path.join(path, "logs"))
    with open(os.path.join(path, "logs", "tvm.s_tir.meta_schedule.logging.task_scheduler.log"), "w") as f:
        f.write(SCHEDULER_LOG)
    return path


@pytest.fixture(scope="module")
def toy_page(work_dir):
    return work_dir_page(work_dir)


def _best_so_far(seconds):
    out, best = [], None
    for s in seconds:
        if s < 1e9 and (best is None or s < best):
            best = s
        out.append(best)
    return out


def _close(points, expected):
    """Drawn points (an array of x, y rows) equal ``expected`` to float precision."""
    np.testing.assert_allclose(np.asarray(points, dtype=float), np.asarray(expected, dtype=float), rtol=1e-9)


def _by_name(page):
    return {d.name: d for d in page.figures}


def test_page_of_a_work_dir_has_every_task_and_embeds_its_figures(toy_page, tmp_path):
    page = toy_page
    assert [d.name for d in page.figures] == ["estimate", "curves", "shares"]
    out = write_html(page, str(tmp_path / "page.html"))
    text = Path(out).read_text()
    for name in RECORDS:
        assert name in text
    assert "kind llvm" in text  # the target it was tuned for
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', text)
    assert len(images) == 3 and all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert "http://" not in text and "https://" not in text and "<script" not in text  # self-contained


def test_tuning_curves_are_the_records_in_tuning_order(toy_page):
    curves = _by_name(toy_page)["curves"].figure
    axes = {ax.get_title().split(" (x")[0]: ax for ax in curves.axes if ax.get_visible()}
    assert set(axes) == set(RECORDS)
    for name, (weight, seconds) in RECORDS.items():
        dots, best = axes[name].get_lines()
        ran = [(i, s * 1e6) for i, s in enumerate(seconds, 1) if s < 1e9]
        _close(dots.get_xydata(), ran)
        steps = [(i, b * 1e6) for i, b in enumerate(_best_so_far(seconds), 1) if b is not None]
        _close(best.get_xydata(), steps)
        assert f"(x{weight})" in axes[name].get_title()


def test_estimate_over_trials_and_time_ends_at_the_reports_estimate(toy_page, work_dir):
    fig = _by_name(toy_page)["estimate"].figure
    by_trials, over_time = fig.axes
    first = {name: next(s for s in secs if s < 1e9) for name, (_, secs) in RECORDS.items()}
    expected = []
    for k in range(1, 5):  # each task's best of its first k records; one with none yet at its first that ran
        total = 0.0
        for name, (weight, secs) in RECORDS.items():
            best = _best_so_far(secs)[min(k, len(secs)) - 1]
            total += weight * (best if best is not None else first[name])
        expected.append((k, total * 1e3))  # ms
    _close(by_trials.get_lines()[0].get_xydata(), expected)
    assert expected[-1][1] == pytest.approx(report(work_dir)["e2e_us"] / 1e3)
    # the log times conv_big's 4 records (60 s into the first call) and add_small's last (30 s into the
    # second, a day later: the time between calls is left out); pool's records and add_small's first
    # are not covered, so they count from the start
    start = (3 * 40e-6 + 9e-6 + 2 * 4e-6) * 1e3
    after_conv = (3 * 25e-6 + 9e-6 + 2 * 4e-6) * 1e3
    _close(over_time.get_lines()[0].get_xydata(), [(0.0, start), (1.0, after_conv), (1.5, after_conv)])


def test_scheduler_log_gives_the_trials_of_each_batch(tmp_path):
    path = tmp_path / "log"
    path.write_text(SCHEDULER_LOG)
    assert read_scheduler_log(str(path)) == [(60.0, "conv_big", 4), (90.0, "add_small", 1)]
    assert read_scheduler_log(str(tmp_path / "missing")) == []


def test_shares_are_weight_times_best(toy_page):
    fig = _by_name(toy_page)["shares"].figure
    ax = fig.axes[0]
    drawn = {label.get_text().rsplit(" x", 1)[0]: bar.get_width()
             for label, bar in zip(ax.get_yticklabels(), ax.patches)}
    assert drawn == pytest.approx({name: w * min(s for s in secs if s < 1e9) * 1e3
                                   for name, (w, secs) in RECORDS.items()})


def _bench_json(tmp_path):
    """A bench JSON as ``bench.int8.run`` writes it, rounds included."""
    doc = {"workload": "resnet50-int8-nchwc", "options": {}, "target": "llvm", "rounds": 3, "warm_runs": 2,
           "host": {"cpu": "AMD EPYC", "mcpu": "znver5", "cores": 2, "int8_flags": ["avx512vnni"]},
           "trials_per_task": 8, "rows": [
               {"ruleset": "plugin", "exact_match": True, "e2e_ms": 6.0, "warm_ms": 5.5, "ratio_to_plugin": 1.0,
                "e2e_ms_rounds": [6.2, 6.0, 5.9], "warm_ms_rounds": [5.5, 5.4, 5.6, 5.5, 5.7, 5.3]},
               {"ruleset": "ort", "exact_match": False, "e2e_ms": 7.0, "warm_ms": 6.5, "ratio_to_plugin": 1.17,
                "e2e_ms_rounds": [7.1, 7.0, 6.8], "warm_ms_rounds": [6.5, 6.4, 6.6, 6.5, 6.7, 6.3]}]}
    path = tmp_path / "bench-x-llvm.json"
    path.write_text(json.dumps(doc))
    return doc, str(path)


def test_bench_page_draws_every_round_of_ours_and_the_peers(tmp_path):
    doc, path = _bench_json(tmp_path)
    page = result_page(path)
    assert [d.name for d in page.figures] == ["runtimes", "rounds"]
    runtimes = page.figures[0].figure.axes[0]
    dots = [line for line in runtimes.get_lines() if line.get_marker() == "o"]
    assert [sorted(line.get_ydata()) for line in dots] == [
        sorted(r[k]) for r in doc["rows"] for k in ("e2e_ms_rounds", "warm_ms_rounds")]
    rounds = page.figures[1].figure.axes[0].get_lines()
    assert len(rounds) == len(doc["rows"])
    for line, row in zip(rounds, doc["rows"]):
        _close(line.get_xydata(), list(enumerate(row["e2e_ms_rounds"], 1)))
    assert "AMD EPYC" in html_of(page) and "znver5" in html_of(page)


def test_time_turns_gives_every_timed_call(monkeypatch):
    now = [0.0]
    costs = {"a": iter([1.0, 2.0, 3.0, 4.0]), "b": iter([5.0, 6.0, 7.0, 8.0])}

    def runtime(name):
        def call():
            now[0] += next(costs[name])
        return call

    samples = {}
    time_turns({"a": runtime("a"), "b": runtime("b")}, rounds=2, warmup=0, warm=1, settle=None,
               clock=lambda: now[0], samples=samples)
    # round 1: a (1, warm 2), b (5, warm 6); round 2 rotates: b (7, warm 8), a (3, warm 4)
    assert samples == {"a": {"first": [1.0, 3.0], "warm": [2.0, 4.0]},
                       "b": {"first": [5.0, 7.0], "warm": [6.0, 8.0]}}


def test_committed_generate_json_draws_its_rounds_and_kernels_against_the_bound():
    path = LOGS / "generate-phi2-znver5-llvm.json"
    doc = json.loads(path.read_text())
    page = result_page(str(path))
    rounds_ax = _by_name(page)["rounds"].figure.axes[0]
    lines = rounds_ax.get_lines()
    for row, line in zip(doc, lines):
        assert line.get_ydata().tolist() == pytest.approx(row["tok_s_rounds"])
    assert lines[len(doc)].get_ydata().tolist() == pytest.approx(doc[0]["peer_tok_s_rounds"])
    assert lines[len(doc) + 1].get_ydata().tolist() == pytest.approx(doc[0]["bound_tok_s_rounds"])
    kernels_ax = _by_name(page)["kernels"].figure.axes[0]
    labels = [t.get_text() for t in kernels_ax.get_yticklabels()]
    tuned = {k["label"]: k for k in doc[-1]["kernels"]}
    bars = kernels_ax.patches[-len(labels):]  # the last row's (tuned) bars, one per kernel label
    for label, bar in zip(labels, bars):
        assert bar.get_width() == pytest.approx(tuned[label]["ms"])


def test_a_run_over_several_contexts_draws_each_context_with_both_peers():
    path = LOGS / "generate-peers-phi2-znver3-llvm.json"
    doc = json.loads(path.read_text())
    figures = _by_name(result_page(str(path)))
    for row in doc:  # one row (int8, float16 cache) per context, llama.cpp and OpenVINO after it in each round
        lines = figures[f"rounds-context{row['context']}"].figure.axes[0].get_lines()
        assert lines[0].get_ydata().tolist() == pytest.approx(row["tok_s_rounds"])
        for line, peer in zip(lines[1:3], ("llama.cpp", "openvino")):
            assert line.get_label() == f"{peer} (peer)"
            assert line.get_ydata().tolist() == pytest.approx(row["peers_tok_s_rounds"][peer])
        assert f"kernels-context{row['context']}" in figures


def test_committed_prompt_json_draws_gemms_against_the_vpdpbusd_peak():
    path = LOGS / "generate-prompt128-phi2-znver5-llvm.json"
    doc = json.loads(path.read_text())
    page = result_page(str(path))
    gemms = _by_name(page)["gemms"].figure.axes[0]
    peak = [line for line in gemms.get_lines() if line.get_linestyle() == "--"][0]
    assert peak.get_ydata()[0] == pytest.approx(doc["vnni_peak_tops"])
    heights = [p.get_height() for p in gemms.patches]
    assert heights == pytest.approx([doc["rows"][j]["gemm_tops"][n] for j in range(2)
                                     for n in doc["rows"][0]["gemm_tops"]])
    prompt = _by_name(page)["prompt"].figure.axes[0]
    dots = [line for line in prompt.get_lines() if line.get_marker() == "o"]
    assert dots[0].get_ydata().tolist() == pytest.approx([128 / s for s in doc["rows"][0]["prefill_s_all"]])


@pytest.mark.parametrize("name,kind", [("bench-resnet50-int8-nchwc-peers-znver5-llvm.json", "bench-int8"),
                                       ("bench-phi2-decode-dram-znver5-llvm.json", "bench-phi2"),
                                       ("generate-phi2-znver5-llvm.json", "generate"),
                                       ("generate-prompt512-phi2-znver5-llvm.json", "generate-prompt"),
                                       ("search-cost.json", None)])
def test_kind_of_the_committed_jsons(name, kind):
    assert R.kind_of(json.loads((LOGS / name).read_text())) == kind


def test_bad_inputs_are_one_line(tmp_path, capsys, work_dir):
    out = str(tmp_path / "p.html")
    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"rows": [{"x": 1}]}')
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    cases = [([str(tmp_path / "missing"), "--html", out], "no such work dir or JSON file"),
             ([str(unknown), "--html", out], "not a result report draws"),
             ([str(broken), "--png", str(tmp_path)], "is not a JSON file"),
             ([str(unknown)], "add --html OUT.html or --png DIR"),
             ([str(tmp_path), "--html", out], "not a tvm_ext tuning database"),
             ([work_dir, "--html", out, "--json"], "without it")]
    for argv, message in cases:
        assert main(["report", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not os.path.exists(out)


def test_without_matplotlib_one_line_says_how_to_install(monkeypatch, capsys, work_dir, tmp_path):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["report", work_dir, "--html", str(tmp_path / "p.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith('pip install "tvm_ext[report]"') and len(err.splitlines()) == 1
    assert main(["report", work_dir]) == 0  # the text report needs nothing more
    assert "weighted end-to-end estimate" in capsys.readouterr().out


def test_cli_writes_the_page_and_the_pngs(work_dir, tmp_path, capsys):
    out, pngs = tmp_path / "page.html", tmp_path / "png"
    assert main(["report", work_dir, "--html", str(out), "--png", str(pngs)]) == 0
    assert out.read_text().count("<img") == 3
    assert sorted(os.listdir(pngs)) == [f"toy-llvm-plugin-{n}.png" for n in ("curves", "estimate", "shares")]
    assert capsys.readouterr().out == ""  # what was written goes to stderr


@pytest.mark.slow
def test_page_opens_in_headless_chromium_without_errors(work_dir, tmp_path):
    """The page in a real browser: no console error, every figure decoded, every task shown; the
    screenshot is kept in the test's tmp dir (printed)."""
    from tvm_ext.testing.browser import INSTALL, open_page

    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        pytest.fail(f"this test needs Chromium from the OS packages: {INSTALL} (as root)")
    html = write_html(page_for(work_dir), str(tmp_path / "page.html"))
    shot = tmp_path / "page.png"
    seen = open_page(html, str(shot))
    assert seen["errors"] == []
    assert seen["images"] == 3 and seen["broken"] == []
    for name in RECORDS:
        assert name in seen["text"]
    assert "Tuning curve of every task" in seen["headings"]
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")


def test_tune_ends_naming_the_command_that_draws_its_page(work_dir, tmp_path, capsys, monkeypatch):
    """The main job's last line (README): the report command for its work dir, which then draws the page."""
    from tvm_ext import tune as tuning
    from tvm_ext.cli.report import page_command

    monkeypatch.setattr(tuning, "tune", lambda *a, **k: report(work_dir))  # the tuning itself is tested elsewhere
    assert main(["tune", "conv2d-int8", "--image", "8", "--trials", "1", "--work-dir", work_dir]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == page_command(work_dir) and last.endswith(f"tvm-ext report {work_dir} --html toy-llvm-plugin.html")
    argv = last.split("tvm-ext ", 1)[1].split()
    argv[-1] = str(tmp_path / argv[-1])
    assert main(argv) == 0 and (tmp_path / "toy-llvm-plugin.html").read_text().count("<img") == 3


def test_a_work_dir_before_its_first_record_draws_its_tasks(tmp_path):
    from toy_database import toy_work_dir

    toy_work_dir(str(tmp_path / "fresh"), {"only_task": toy_mod(lambda x: x + 1)})  # tune stopped before a record
    page = work_dir_page(str(tmp_path / "fresh"))
    assert [d.name for d in page.figures] == ["curves"] and "only_task" in html_of(page)
    assert ("estimate", "-") in [(k, v.split(" ")[0]) for k, v in page.facts]


def test_in_network_picks_are_drawn_as_measured(work_dir, tmp_path):
    from tvm_ext.tune.picks import write_picks

    copy = str(tmp_path / "picked")
    shutil.copytree(work_dir, copy)
    about = {"top_k": 2, "network_ms": [6.8, 7.3], "confirm_ms": {"best_records": 7.2, "picks": 7.4,
                                                                 "best_records_warm": 5.7, "picks_warm": 5.6}}
    write_picks(copy, {}, about)
    picks = _by_name(work_dir_page(copy))["picks"].figure
    ranks, confirm = picks.axes
    assert [p.get_height() for p in ranks.patches] == about["network_ms"]
    assert [p.get_height() for p in confirm.patches] == [7.2, 7.4, 5.7, 5.6]
