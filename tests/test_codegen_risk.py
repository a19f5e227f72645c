"""Which scheduled GPU functions need tvm.compile's lowering (tvm_ext.codegen_risk), and
the fast form of that lowering (tvm_ext.lowering.build_lowering(fast=True)).

Inputs are small TVMScript functions written here; each case says why its answer is the
one the staged VerifyGPUCode relies on.
"""
import pytest
import tvm
from tvm.script import tirx as T

from tir_kernels import cross_thread_reduction, cuda_target, vector_copy
from tvm_ext.codegen_risk import has_cross_thread_reduction, wide_vectors
from tvm_ext.lowering import build_lowering, without_unroll_pragmas
from tvm_ext.tir_utils import collect


def widened(lanes):
    """int64 values: b[i] = int64(a[i]) * 3, ``lanes`` vectorized."""
    @T.prim_func(s_tir=True)
    def func(a: T.Buffer((4096,), "int32"), b: T.Buffer((4096,), "int64")):
        for bx in T.thread_binding(4096 // 128 // lanes, thread="blockIdx.x"):
            for tx in T.thread_binding(128, thread="threadIdx.x"):
                for v in T.vectorized(lanes):
                    with T.sblock("b"):
                        vi = T.axis.spatial(4096, (bx * 128 + tx) * lanes + v)
                        b[vi] = T.Cast("int64", a[vi]) * T.int64(3)
    return func


def serial_row_sum():
    """b[i] = sum_k a[i, k] with k a serial loop: no cross-thread reduction."""
    @T.prim_func(s_tir=True)
    def serial(a: T.Buffer((64, 32), "float32"), b: T.Buffer((64,), "float32")):
        for bx in T.thread_binding(64, thread="blockIdx.x"):
            for k in range(32):
                with T.sblock("b"):
                    vi, vk = T.axis.remap("SR", [bx, k])
                    with T.init():
                        b[vi] = T.float32(0)
                    b[vi] = b[vi] + a[vi, vk]
    return serial


@pytest.mark.parametrize("func, why", [
    (vector_copy(4), None),                                   # 4 x 1 byte: no broadcast over the limits
    (vector_copy(4, "int32", const=3), None),                 # int32x4 = 16 bytes: at the limit, fine
    (vector_copy(4, index_dtype="int64"), None),              # int64 indices are narrowed to int32 first
    (vector_copy(8), "8 lanes"),                              # a uint8x8 broadcast is possible
    (vector_copy(16, const=3), "16 lanes"),
    (widened(2), None),                                # int64x2 = 16 bytes
    (widened(4), "4 lanes with 64-bit values"),        # int64x4 = 32 bytes
])
def test_vectors_wide_enough_for_a_bad_broadcast_need_the_build_check(func, why):
    assert wide_vectors(func) == why


def test_a_cross_thread_reduction_needs_the_build_check():
    assert has_cross_thread_reduction(cross_thread_reduction("sum"))
    assert not has_cross_thread_reduction(serial_row_sum())
    assert wide_vectors(cross_thread_reduction("sum")) is None and wide_vectors(serial_row_sum()) is None


def test_buffers_of_2_to_the_31_elements_keep_int64_index_vectors():
    """NarrowDataType cannot narrow indices into a buffer this large: int64 index vectors
    stay, so 4 lanes of a uint8 copy are already 64-bit wide."""
    big = vector_copy(4, index_dtype="int64", n=2**31)
    assert wide_vectors(big) == "4 lanes with 64-bit values"


def test_nested_vectorized_loops_multiply_their_lanes():
    @T.prim_func(s_tir=True)
    def func(a: T.Buffer((4096,), "uint8"), b: T.Buffer((4096,), "uint8")):
        for bx in T.thread_binding(8, thread="blockIdx.x"):
            for tx in T.thread_binding(128, thread="threadIdx.x"):
                for v0 in T.vectorized(2):
                    for v1 in T.vectorized(4):
                        with T.sblock("b"):
                            vi = T.axis.spatial(4096, (bx * 128 + tx) * 8 + v0 * 4 + v1)
                            b[vi] = a[vi]
    assert wide_vectors(func) == "8 lanes"


def unrolled_copy():
    func = vector_copy(4, "int32", const=3)
    sch = tvm.s_tir.Schedule(func)
    loops = sch.get_loops(sch.get_sblock("b"))
    sch.annotate(loops[0], "pragma_auto_unroll_max_step", 64)
    sch.annotate(loops[0], "pragma_unroll_explicit", 1)
    return sch.mod["main"]


def test_without_unroll_pragmas_takes_only_the_pragmas_off():
    func = unrolled_copy()
    stripped = without_unroll_pragmas(func)
    keys = [set(loop.annotations) for loop in collect(stripped.body, tvm.tirx.For)]
    assert all(not k & {"pragma_auto_unroll_max_step", "pragma_unroll_explicit"} for k in keys)
    tvm.ir.assert_structural_equal(stripped, without_unroll_pragmas(vector_copy(4, "int32", const=3)))
    tvm.ir.assert_structural_equal(without_unroll_pragmas(stripped), stripped)  # idempotent


def test_fast_build_lowering_gives_the_same_vectors():
    """The fast form keeps what the checks look at: the same kinds of vector expressions
    (ramps, broadcasts and their types) reach the codegen as with the full pipeline."""
    target = cuda_target()
    func = unrolled_copy()

    def vector_types(mods):
        found = set()
        for mod in mods:
            for _gv, f in mod.functions.items():
                found |= {(type(e).__name__, str(e.ty)) for e in
                          collect(f.body, tvm.tirx.Ramp) + collect(f.body, tvm.tirx.Broadcast)}
        return found

    full, fast = build_lowering(func, "main", target), build_lowering(func, "main", target, fast=True)
    assert vector_types(full) == vector_types(fast) and ("Broadcast", "int32x4") in vector_types(fast)


def test_vectors_already_in_the_function_need_the_build_check():
    """A tensor intrinsic's body (or hand-written TIR) can hold vectors no vectorized loop
    announces: those functions always go through tvm.compile's lowering."""
    @T.prim_func(s_tir=True)
    def func(a: T.Buffer((64,), "uint8"), b: T.Buffer((64,), "uint8")):
        for bx in T.thread_binding(8, thread="blockIdx.x"):
            with T.sblock("b"):
                vb = T.axis.spatial(8, bx)
                b[T.Ramp(vb * 8, 1, 8)] = a[T.Ramp(vb * 8, 1, 8)]
    assert wide_vectors(func) == "vector expressions before lowering"
