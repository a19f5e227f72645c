"""rules/injective_cpu: kernels without a reduction on CPU, their loops vectorized, parallel when big.

Before/after TVMScript on small functions (a row that 16 lanes divide; one they do not: a 16-wide head
and a scalar tail; a block writing enough to run in parallel), the Phi-2 kernels it takes (rope, the
head split, the KV-cache concatenate) computing what they computed unscheduled, the kernels it leaves
(reductions, a kernel already scheduled), and its candidate in the plugin's space.
"""
import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from tir_kernels import as_main, ours_in_space, phi2_reduced_kernels
from tvm_ext.rules import injective_cpu


def _scale(rows, cols):
    @T.prim_func(s_tir=True)
    def scale(a: T.Buffer((rows, cols), "float32"), b: T.Buffer((rows, cols), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for i, j in T.grid(rows, cols):
            with T.sblock("b"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vi, vj] * T.float32(2)
    return scale


@T.prim_func(s_tir=True)
def _scale_8x48_after(a: T.Buffer((8, 48), "float32"), b: T.Buffer((8, 48), "float32")):
    T.func_attr({"global_symbol": "main", "tirx.noalias": True})
    for i, j_0 in T.grid(8, 3):
        for j_1 in T.vectorized(16):
            with T.sblock("b"):
                vi = T.axis.spatial(8, i)
                vj = T.axis.spatial(48, j_0 * 16 + j_1)
                b[vi, vj] = a[vi, vj] * T.float32(2)


def test_small_row_vectorized_serial():
    """16 lanes divide the row of 48; 1.5 KiB written: one thread."""
    after = injective_cpu.InjectiveCPU().apply_to_module(tvm.IRModule({"main": _scale(8, 48)}))
    tvm.ir.assert_structural_equal(after["main"], _scale_8x48_after)


def _kinds(func):
    from tvm_ext.tir_utils import collect

    return {(loop.kind, int(loop.extent)) for loop in collect(func.body, tvm.tirx.For)}


def test_odd_row_head_and_tail_and_big_block_parallel():
    """A row of 513: 512 elements 16 wide, the last one scalar; 256 x 513 floats (513 KiB written):
    the fused outer loop parallel; the result unchanged."""
    func = _scale(256, 513)
    after = injective_cpu.InjectiveCPU().apply_to_module(tvm.IRModule({"main": func}))["main"]
    kinds = _kinds(after)
    kind = tvm.tirx.ForKind
    assert (kind.VECTORIZED, 16) in kinds and (kind.PARALLEL, 256) in kinds, kinds
    assert any(b.name_hint.endswith("_partition") for b in _blocks(after))
    x = np.random.default_rng(0).standard_normal((256, 513)).astype("float32")
    out = tvm.runtime.tensor(np.zeros_like(x))
    tvm.compile(tvm.IRModule({"main": after}), target="llvm")["main"](tvm.runtime.tensor(x), out)
    np.testing.assert_array_equal(out.numpy(), x * 2)


def _blocks(func):
    from tvm_ext.tir_utils import blocks_of

    return blocks_of(func)


@pytest.fixture(scope="module")
def kernels():
    return phi2_reduced_kernels()


@pytest.mark.parametrize("which", ["decode", "prefill"])
def test_phi2_kernels_it_takes_compute_the_same(kernels, which):
    """Rope, the head split and (decode) the KV-cache concatenates: the same outputs as unscheduled, bit
    for bit; the GEMVs, LayerNorm, softmax and attention are left to the other rules."""
    taken, left = [], []
    for k in kernels[which]:
        (taken if injective_cpu.InjectiveCPU().matches(k.func) else left).append(k)
    want = {"decode": {"rope", "fused_rope1_concatenate", "fused_split_heads_concatenate"},
            "prefill": {"rope", "rope1", "split_heads", "strided_slice"}}[which]
    assert {k.name for k in taken} == want
    rng = np.random.default_rng(1)
    for k in taken:
        mod = as_main(k.func)
        arrays = [rng.standard_normal([int(s) for s in p.shape]).astype(str(p.dtype)) for p in k.func.params]
        outs = []
        for m in (mod, injective_cpu.InjectiveCPU().apply_to_module(mod)):
            args = [tvm.runtime.tensor(a) for a in arrays]
            tvm.compile(m, target="llvm")["main"](*args)
            outs.append(args[-1].numpy())
        np.testing.assert_array_equal(outs[1], outs[0], err_msg=k.name)


def test_reductions_and_scheduled_kernels_are_left_alone(kernels):
    from tvm_ext.workloads.phi2.q4_int8_gemm import quantize_tokens

    for k in kernels["decode"]:
        if any(w in k.name for w in ("layer_norm", "softmax", "attn", "matmul")):
            assert not injective_cpu.InjectiveCPU().matches(k.func), k.name
    assert not injective_cpu.InjectiveCPU().matches(quantize_tokens(4, 64))  # hand-written, marked tirx.is_scheduled


def test_the_rule_in_the_plugin_space(kernels):
    """InjectiveCPU in tvm_ext.space: this schedule among the candidates, beside MetaSchedule's own."""
    rope = next(k for k in kernels["decode"] if injective_cpu.InjectiveCPU().matches(k.func) and "rope" in k.name)
    ours = ours_in_space(rope.func)
    assert ours and len(ours) < len(ours_in_space(rope.func, mine_only=False))
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal([int(s) for s in p.shape]).astype(str(p.dtype)) for p in rope.func.params]
    want = [tvm.runtime.tensor(a) for a in arrays]
    tvm.compile(as_main(rope.func), target="llvm")["main"](*want)
    for cand in ours:
        assert (tvm.tirx.ForKind.VECTORIZED, 16) in _kinds(cand.mod["main"])
        args = [tvm.runtime.tensor(a) for a in arrays]
        tvm.compile(cand.mod, target="llvm")["main"](*args)
        np.testing.assert_array_equal(args[-1].numpy(), want[-1].numpy())
