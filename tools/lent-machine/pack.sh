#!/bin/bash
# Here (with PyPI): pack what a lent machine without a package index needs to run tvm_ext.
#   .lent/   TVM 0.27.0.post1 + tvm-ffi as xz archives (~64 MB: the 259 MB libtvm_compiler.so alone
#            compresses to 59 MB with a 256 MiB dictionary; ~5 min of xz on 2 cores)
#   .lent2/  xgboost-cpu, tornado wheels and the committed resnet50-int8-nchwc database (no logs)
# Each call of the device tool carries at most 64 MiB with the working tree: carry .lent in the
# first call, .lent2 in the second, and move tuning_logs/*/ out of the tree meanwhile.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-3.12}  # the lent machine's Python
W=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$W" apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1 xgboost-cpu tornado
mkdir -p .lent .lent2 "$W/site"
(cd "$W/site" && for f in "$W"/apache_tvm*.whl; do unzip -q -o "$f"; done && rm -rf tvm/3rdparty)
xz -T1 -c --lzma2=preset=9e,dict=256MiB "$W/site/tvm/lib/libtvm_compiler.so" > .lent/libtvm_compiler.xz
rm "$W/site/tvm/lib/libtvm_compiler.so"
tar cf - -C "$W/site" . | xz -9 -T2 > .lent/tvm-rest.tar.xz
cp "$W"/xgboost_cpu-*.whl "$W"/tornado-*.whl .lent2/
tar czf .lent2/nchwc-db.tgz --exclude=logs tuning_logs/resnet50-int8-nchwc-llvm-plugin
rm -rf "$W"
du -sh .lent .lent2
