"""tvm_ext.intrin_import: the memoized inspect.getmodule sees the same stack, and the fast
import registers TVM's tensor intrinsics."""
import inspect
import subprocess
import sys

import pytest

from tvm_ext.intrinsics import quick_parsing


def _frames():
    return [(f.filename, f.lineno, f.function, f.code_context) for f in inspect.stack()]


def test_stack_is_the_same_with_memoized_getmodule():
    plain = _frames()
    original = inspect.getmodule
    with quick_parsing():
        assert inspect.getmodule is not original
        memoized = [_frames(), _frames()]  # the second call is answered from the memo
    assert inspect.getmodule is original
    # [0] is _frames, [1] the calling line of this test: the callers above must agree
    assert memoized[0][2:] == plain[2:] and memoized[1][2:] == plain[2:]
    assert any(f[3] for f in plain)  # source lines are really looked up


# -m slow: the default run's test_record_intrinsics opens wmma records in a fresh process, which
# needs this import to have registered them (a second fresh process, ~13 s)
@pytest.mark.slow
def test_fast_import_registers_the_intrinsics():
    code = ("import sys, tvm\n"
            "from tvm_ext.intrinsics.fast_import import import_tensor_intrinsics\n"
            "import_tensor_intrinsics()\n"
            "assert 'tvm.s_tir.tensor_intrin.cuda' in sys.modules\n"
            "from tvm.s_tir.tensor_intrin.cuda import WMMA_SYNC_16x16x16_f16f16f32_INTRIN as n\n"
            "assert tvm.s_tir.TensorIntrin.get(n).desc is not None\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_cpu_space_imports_the_cpu_intrinsics_only_and_a_cuda_space_the_rest(tmp_path):
    """An llvm space parses TVM's CPU intrinsic families only (~1 s, not ~6.6 s): its TuneContext finds the
    package in place and the x86 intrinsics registered, no CUDA module is imported; a CUDA space made later
    in the same process imports the rest (its wmma intrinsics then registered)."""
    code = ("import sys, tvm\n"
            "from tvm.s_tir import TensorIntrin, meta_schedule as ms\n"
            "from tvm.script import tirx as T\n"
            "import tvm_ext\n"
            "from tvm_ext.targets import resolve_target\n"
            "@T.prim_func(s_tir=True)\n"
            "def f(a: T.Buffer((8,), 'float32'), b: T.Buffer((8,), 'float32')):\n"
            "    for i in range(8):\n"
            "        with T.sblock('b'):\n"
            "            v = T.axis.remap('S', [i])\n"
            "            b[v] = a[v] + 1.0\n"
            "cpu = resolve_target('llvm')\n"
            "ctx = ms.TuneContext(mod=tvm.IRModule({'main': f}), target=cpu, space_generator=tvm_ext.space(cpu),\n"
            "                     search_strategy='replay-trace', task_name='t', num_threads=1)\n"
            "assert len(ctx.generate_design_space()) >= 1\n"
            "assert 'tvm.s_tir.tensor_intrin.cuda' not in sys.modules, 'cuda imported for a CPU space'\n"
            "assert TensorIntrin.get('dot_16x4_vnni', allow_missing=True) is not None\n"
            "tvm_ext.space(tvm.target.Target({'kind': 'cuda', 'arch': 'sm_80'}))\n"
            "from tvm.s_tir.tensor_intrin.cuda import WMMA_SYNC_16x16x16_f16f16f32_INTRIN as n\n"
            "assert 'tvm.s_tir.tensor_intrin.rocm' in sys.modules and TensorIntrin.get(n).desc is not None\n")
    script = tmp_path / "spaces.py"  # TVMScript reads its source: a file, not -c
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_each_name_of_ours_registers_that_intrinsic():
    """``tvm_ext.intrinsics.makers``: no two families share a name, and a name's call registers
    the intrinsic of that name (what a database's records are opened with)."""
    from tvm.s_tir import TensorIntrin

    from tvm_ext.intrinsics import amx, makers, q4_amx, q4_vnni, vnni

    families = [vnni.makers(), amx.makers(), q4_vnni.makers(), q4_amx.makers()]
    assert len(makers()) == sum(len(f) for f in families)
    for name in (vnni.AVX2_INTRIN, amx.init_intrin(3, True), amx.dot_intrin(5, 2, "k4t3"),
                 q4_vnni.intrin_name(2, 1, "avxvnni"), q4_amx.init_name(4, 1)):
        makers()[name]()
        assert TensorIntrin.get(name, allow_missing=True) is not None, name
