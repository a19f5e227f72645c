"""Batched nvcc (tvm_ext.nvcc): every source gets the outcome and error text of its own compile."""
import shutil
from collections import Counter

import pytest
import tvm
from tvm import te
from tvm.s_tir import Schedule

from tir_kernels import cuda_target
from tvm_ext.check import nvcc

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")

PREAMBLE = '#include <cuda.h>\n#define uchar unsigned char'
OK_KERNEL = ('extern "C" __global__ void __launch_bounds__(32) main_kernel(int* __restrict__ a);\n'
             'extern "C" __global__ void __launch_bounds__(32) main_kernel(int* __restrict__ a) {\n'
             '  a[threadIdx.x] = 1;\n}\n')


def test_split_source_finds_preamble_and_kernels():
    preamble, body, names = nvcc.split_source(PREAMBLE + "\n" + OK_KERNEL)
    assert preamble == PREAMBLE
    assert body.startswith('extern "C"') and names == ["main_kernel"]


@pytest.mark.parametrize("extra", [
    "#define N 4\n",                                    # a directive in the kernel section
    "__device__ int helper() { return 1; }\n",          # another top-level declaration
    'extern "C" __global__ void main_kernel_1(int* a) {\n'
    "  __shared__ int big[16384];\n  big[0] = a[0];\n}\n",  # 64 KiB static shared: ptxas rejects it
])
def test_split_source_refuses_what_could_change_a_batch(extra):
    assert nvcc.split_source(PREAMBLE + "\n" + OK_KERNEL + extra) is None


def test_batch_source_renames_each_members_kernels_and_blame_maps_errors_back():
    body = nvcc.split_source(PREAMBLE + "\n" + OK_KERNEL)[1:]
    batch = nvcc.batch_source(PREAMBLE, [body, body, body])
    assert batch.text.count(PREAMBLE) == 1
    for i in range(3):
        assert f"#define main_kernel tvm_ext_m{i}_main_kernel" in batch.text
    lines = batch.text.split("\n")
    lo, hi = batch.sections[1]
    assert lines[lo - 1].endswith("member 1") and lines[hi - 1] == "#undef main_kernel"
    assert nvcc.blame(f"/tmp/x/kernels.cu({lo + 3}): error: too many arguments", batch) == {1}
    assert nvcc.blame("ptxas error   : Entry function 'tvm_ext_m2_main_kernel' uses too much "
                      "shared data (0x10000 bytes, 0xc000 max)", batch) == {2}
    assert nvcc.blame("kernels.cu(1): error: in the preamble", batch) == {0, 1, 2}
    assert nvcc.blame("nvcc fatal : something else", batch) == set()


def padded_uint8_copy(vec, threads=8):
    """Rows padded with a constant; the vectorized pad value is a uint8 broadcast of
    ``vec`` lanes, which TVM 0.27 writes as make_uintN with one argument per lane:
    nvcc compiles 4 lanes and rejects 16 ("too many arguments")."""
    a = te.placeholder((64, 64), "uint8", name="a")
    b = te.compute((72, 64), lambda i, j: tvm.tirx.if_then_else(
        i < 64, a[tvm.tirx.min(i, 63), j], tvm.tirx.const(3, "uint8")), name="b")
    sch = Schedule(te.create_prim_func([a, b]))
    i, j = sch.get_loops(sch.get_sblock("b"))
    jo, v = sch.split(j, [None, vec])
    bx, tx = sch.split(sch.fuse(i, jo), [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(v)
    return sch


def with_ptxas_failure(source):
    """``source`` plus a kernel with 64 KiB of 2-D static shared memory: the front end
    accepts it, ptxas rejects it, and split_source (which reads 1-D arrays only) still
    batches it -- so the batch fails in ptxas, after every member got through cicc."""
    return source + ('\nextern "C" __global__ void main_kernel_1(int* __restrict__ a) {\n'
                     "  __shared__ int big[8][2048];\n  big[threadIdx.x][0] = a[0];\n"
                     "  __syncthreads();\n  a[threadIdx.x] = big[0][threadIdx.x];\n}\n")


@pytest.fixture(scope="module")
def candidates():
    """Four CUDA sources TVM generates, sharing one preamble, two of which nvcc
    rejects (one in the front end, one in ptxas); their outcomes compiled one by one."""
    from tvm_ext.lowering import cuda_source

    target = cuda_target()
    sources = [cuda_source(sch, target) for sch in
               (padded_uint8_copy(4), padded_uint8_copy(16), padded_uint8_copy(4, threads=16))]
    sources.insert(1, with_ptxas_failure(sources[0]))
    alone = nvcc.compile_many(sources, "sm_80", batch=1)
    return sources, alone


@needs_nvcc
def test_candidates_fail_as_documented(candidates):
    sources, alone = candidates
    assert len({nvcc.split_source(s)[0] for s in sources}) == 1  # one preamble: one batch
    assert [ok for ok, _ in alone] == [True, False, False, True]
    assert "too much shared data" in alone[1][1]
    assert "too many arguments" in alone[2][1] and alone[2][1].startswith("kernels.cu(")


@needs_nvcc
def test_compile_batch_gives_each_source_its_own_outcome_and_error(candidates):
    sources, alone = candidates
    stats = Counter()
    assert nvcc.compile_batch(sources, "sm_80", stats=stats) == alone
    # the two that compile did so in one batch; each failure was compiled alone
    assert stats["batched_ok"] == 2 and stats["batch_failures"] == 2
    assert stats["runs"] == stats["batch_runs"] + 2


@needs_nvcc
def test_pool_results_and_disk_cache_match_one_at_a_time(candidates, tmp_path):
    sources, alone = candidates
    with nvcc.CompilePool("sm_80", jobs=2, cache_dir=str(tmp_path)) as pool:
        futures = [pool.submit(s) for s in sources + sources[:1]]
        assert futures[-1] is futures[0]  # an identical source is compiled once
        assert [f.result() for f in futures[:-1]] == alone
    with nvcc.CompilePool("sm_80", jobs=2, cache_dir=str(tmp_path)) as pool:
        assert [pool.submit(s).result() for s in sources] == alone
        assert pool.summary()["runs"] == 0 and pool.summary()["disk_hits"] == len(sources)
