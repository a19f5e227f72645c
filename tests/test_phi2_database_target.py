"""The Phi-2 ``tuned`` schedule and a database tuned on a CPU with instructions the target lacks.

A record that tensorizes with the AVX-512 VNNI q4 x int8 tile, compiled for an AVX2-only CPU, makes
LLVM abort the whole process ("Do not know how to split the result of this operator!").  The decode
bench of ``generate --schedule tuned`` and ``workloads.phi2.compiled.schedule`` refuse such a database
in one line naming the CPU it was tuned for and the instructions missing
(``tune.database.check_instructions``, as the network benches); a target that has them opens it.
A one-record database cut from the saved Phi-2 database keeps this fast (no full-size model is built)."""
import gzip
import json
from pathlib import Path

import pytest

pytest.importorskip("tvm")

from tvm_ext.bench.phi2 import decode  # noqa: E402
from tvm_ext.targets import resolve_target  # noqa: E402
from tvm_ext.tune.database import RECORDS, WORKLOADS, DatabaseMismatch  # noqa: E402
from tvm_ext.tune.seeds import tuned_inputs  # noqa: E402
from tvm_ext.workloads.phi2 import compiled, model as pm  # noqa: E402

SAVED = Path(__file__).resolve().parents[1] / "tuning_logs" / "phi2-int8-llvm"
AVX2_ONLY = {"kind": "llvm", "mcpu": "znver3"}
WITH_AVX512_VNNI = {"kind": "llvm", "mcpu": "cascadelake"}
MESSAGE = r"\(tuned for [\w-]+\) holds schedules with AVX-512 VNNI instructions .* lacks: .*int8"


@pytest.fixture(scope="module")
def avx512_database(tmp_path_factory):
    """A work dir holding one record of the saved Phi-2 database that tensorizes with AVX-512 VNNI."""
    with gzip.open(SAVED / (WORKLOADS + ".gz"), "rt", encoding="utf-8") as f:
        workloads = f.read().splitlines()
    with gzip.open(SAVED / (RECORDS + ".gz"), "rt", encoding="utf-8") as f:
        record = next(line for line in f if "tvm_ext.q4_int8_group_avx512vnni" in line)
    index, body = json.loads(record)
    work_dir = tmp_path_factory.mktemp("phi2-avx512")
    (work_dir / WORKLOADS).write_text(workloads[index] + "\n", encoding="utf-8")
    (work_dir / RECORDS).write_text(json.dumps([0, body]) + "\n", encoding="utf-8")
    return work_dir


def test_decode_bench_refuses_it_in_one_line_on_an_avx2_target(avx512_database):
    """What ``generate --schedule tuned`` runs (its CLI takes only this host's CPU as an llvm target): the
    refusal comes before the weights are generated, a single line (the CLI prints it as the error)."""
    with pytest.raises(DatabaseMismatch, match=MESSAGE) as err:
        decode.decode_e2e_rows(["tuned"], "reduced", layers=1, tokens=1, context=0, log=lambda _: None,
                               target=AVX2_ONLY, database=str(avx512_database), rounds=1)
    assert "(znver3) lacks" in str(err.value) and "\n" not in str(err.value)


def test_schedule_refuses_it_before_scheduling(avx512_database):
    model = pm.build_model("reduced", layers=1, capacity=2, seed=0, compute="int8")
    with pytest.raises(DatabaseMismatch, match=MESSAGE):
        compiled.schedule(model.mod, resolve_target(AVX2_ONLY), "tuned", str(avx512_database))


def test_a_target_with_the_instructions_opens_it(avx512_database):
    database, kept = tuned_inputs(str(avx512_database), WITH_AVX512_VNNI)
    assert len(database.get_all_tuning_records()) == 1 and kept == frozenset()
