#!/bin/bash
# Call 2 (carry .lent2, after call 1 staged .lent: see tools/lent-machine/README.md): the host's int8 flags, tvm-ext targets, and the AMX / VNNI tests that skip
# on hosts without them (the 3 deselected ones tune).
set -u
exec > >(tee -a "$OUT/checks.log") 2>&1
date; nproc; grep -m1 'model name' /proc/cpuinfo; uname -r
grep -o 'amx_[a-z0-9]*\|avx512_vnni\|avx_vnni\|avx512f' /proc/cpuinfo | sort | uniq -c
source tools/lent-machine/setup.sh
python3 -c "import tvm, onnxruntime; print('tvm', tvm.__version__, 'onnxruntime', onnxruntime.__version__)"
tvm-ext targets
# -o addopts="": pytest.ini's "-n auto" needs pytest-xdist, which the lent machine lacks
timeout 240 python3 -m pytest -q -rs -o addopts="" -p no:cacheprovider -p tvm_ext.testing.pytest_plugin \
  -m "slow or not slow" --timeout 150 tests/test_amx.py tests/test_vnni.py tests/test_q4_int8_gemm.py tests/test_q4_amx.py tests/test_phi2_int8.py \
  tests/test_avx2_u8s8.py -k "not tuned_with_rule and not opens_in_a_fresh"
date
