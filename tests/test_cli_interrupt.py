"""tvm-ext tune interrupted by a real SIGINT: the database stays valid and the same command resumes.

Apart from test_cli.py so that, with one pytest-xdist worker per module (pytest.ini: --dist loadscope),
it runs beside that module's tests instead of after them."""
import json
import os
import signal
import subprocess
import sys
import time

from cli_run import SMALL, cli


def test_ctrl_c_leaves_a_valid_database_and_resume_finishes(tmp_path):
    """One trial per search iteration: the first record appears after iteration 1, Ctrl-C
    lands during iteration 2, which is finished and kept; the same command resumes."""
    work_dir = str(tmp_path / "interrupted")
    proc = subprocess.Popen([sys.executable, "-m", "tvm_ext", "tune", "conv2d-int8", *SMALL,
                             "--trials", "3", "--per-iter", "1", "--work-dir", work_dir],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    records = os.path.join(work_dir, "database_tuning_record.json")
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(records) and os.path.getsize(records) > 0:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "tuning finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    assert "resume" in err
    partial = json.loads(cli("report", work_dir, "--json")[1])["tasks"][0]
    assert 1 <= partial["trials"] < 3
    assert partial["tuning_s"] > 0  # the interrupted run's time is counted
    done = json.loads(cli("tune", "conv2d-int8", *SMALL, "--trials", "3", "--work-dir", work_dir,
                          "--json")[1])
    assert done["tasks"][0]["trials"] == 3
    assert done["tuning_s"] > partial["tuning_s"]  # both runs' time
