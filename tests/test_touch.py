"""bench/touch: a kernel's traffic without its compute, and the bench's floor column from it.

The touch kernel of a function takes the function's own arguments, reads every word of the parameters
it reads and writes every word of those it writes (checked against NumPy: each output word is the xor
of its thread's share of the input words), on 1 and 2 threads, with words past the last full vector.
"""
import numpy as np
import pytest
import tvm
from tvm import te

from tvm_ext.arrays import param_buffers
from tvm_ext.bench.touch import LANES, touch_func, written_params


def _func():
    """Three inputs of three dtypes (one whose words do not fill the last vector), one output."""
    a = te.placeholder((3, 37), "float32", name="a")
    b = te.placeholder((50,), "float16", name="b")
    c = te.placeholder((5, 16), "uint32", name="c")
    out = te.compute((2, 21), lambda i, j: a[i, j] + b[j].astype("float32") + c[i, j].astype("float32"), name="out")
    return te.create_prim_func([a, b, c, out])


def _expected(arrays, written, threads):
    """Each output word: the xor of the input words of the thread that writes it (module doc)."""
    words = [np.ascontiguousarray(a).view("uint32").reshape(-1) for a in arrays]
    acc = [np.zeros(LANES, "uint32") for _ in range(threads)]
    for i, w in enumerate(words):
        if i in written:
            continue
        full = w.size // LANES
        for t in range(threads):
            lo, hi = t * full // threads, (t + 1) * full // threads
            acc[t] ^= np.bitwise_xor.reduce(w[lo * LANES:hi * LANES].reshape(-1, LANES), axis=0)
        acc[-1][0] ^= np.bitwise_xor.reduce(w[full * LANES:]) if w.size % LANES else 0
    out = {}
    for i in written:
        w, full = np.zeros_like(words[i]), words[i].size // LANES
        for t in range(threads):
            lo, hi = t * full // threads, (t + 1) * full // threads
            w[lo * LANES:hi * LANES] = np.tile(acc[t], hi - lo)
        w[full * LANES:] = acc[-1][0]
        out[i] = w
    return out


def test_written_params_are_the_outputs():
    assert written_params(_func()) == {3}


@pytest.mark.parametrize("threads", [1, 2])
def test_touch_reads_and_writes_every_word(threads):
    func = _func()
    touch = touch_func(func, threads)
    assert [p[1:] for p in param_buffers(touch)] == [p[1:] for p in param_buffers(func)]  # same arguments
    rng = np.random.default_rng(threads)
    arrays = [rng.integers(0, 2**16, size=shape).astype(dtype) if dtype != "float16"
              else rng.standard_normal(shape).astype(dtype) for _, dtype, shape in param_buffers(func)]
    arrays[0] = rng.standard_normal(arrays[0].shape).astype("float32")
    args = [tvm.runtime.tensor(a) for a in arrays]
    tvm.compile(touch, target="llvm")["main"](*args)
    want = _expected(arrays, {3}, threads)
    np.testing.assert_array_equal(args[3].numpy().view("uint32").reshape(-1), want[3])
    for i in range(3):  # inputs untouched
        np.testing.assert_array_equal(args[i].numpy(), arrays[i])


def test_floors_are_the_faster_thread_count_and_leave_the_times():
    from tvm_ext.bench.phi2 import measure as pm

    times = {(True, "rule", "k"): 3.0, (True, "floor1", "k"): 2.0, (True, "floor2", "k"): 1.5,
             (True, "floor1", "j"): 0.5, (True, "floor2", "j"): 0.9}
    assert pm.floors(times) == {"k": 1.5, "j": 0.5}
    assert times == {(True, "rule", "k"): 3.0}
