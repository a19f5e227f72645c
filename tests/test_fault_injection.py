"""SIGKILL ``tvm-ext tune`` at random moments, 20 times: the database always opens, keeps
every record committed before each kill, and the next run resumes (tvm_ext.check.fault_injection;
about 12 minutes on 2 cores, hence slow)."""
import pytest

from tvm_ext.check import fault_injection


@pytest.mark.slow
def test_tune_survives_twenty_kills(tmp_path):
    result = fault_injection.run(kills=20, work_dir=str(tmp_path / "db"), seed=1)
    assert result["kills"] == 20
    failed = [c for c in result["cycles"] if not c["opens"] or c["records_lost"]]
    assert not failed, failed
    assert result["records_lost"] == 0 and result["survived"] == 20
    assert result["resumes_checked"] > 0 and result["resumes_ok"] == result["resumes_checked"]
    assert result["kills_by_mode"]["on-write"] == 10  # half of them the moment a file changes
    final = result["final_run"]
    assert final["ok"] and final["earlier_kept"] and final["records"] == final["budget"]
