#!/bin/bash
# Here (with PyPI): pack what a lent machine without a package index needs to run tvm_ext, in two
# calls of the device tool, each under its 64 MiB with the working tree (7.5 MiB: the databases in
# tuning_logs/ travel compressed):
#   .lent/   call 1: the first PART1_MIB of libtvm_compiler.so as xz (the 259 MB library compresses
#            to ~59 MB with a 256 MiB dictionary; ~5 min of xz on 2 cores)
#   .lent2/  call 2: the rest of it, the rest of TVM + tvm-ffi (tvm-rest.tar.xz), xgboost-cpu and
#            tornado wheels
# setup.sh stages the parts in the machine's /tmp (kept while it is warm: 30 s between calls) and
# unpacks TVM once all are there. rehearse.py runs both calls here from copies of what travels.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-3.12}  # the lent machine's Python
PART1_MIB=${PART1_MIB:-44}
W=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$W" apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1 xgboost-cpu tornado
rm -rf .lent .lent2
mkdir -p .lent .lent2 "$W/site"
(cd "$W/site" && for f in "$W"/apache_tvm*.whl; do unzip -q -o "$f"; done && rm -rf tvm/3rdparty)
xz -T1 -c --lzma2=preset=9e,dict=256MiB "$W/site/tvm/lib/libtvm_compiler.so" > "$W/libtvm_compiler.xz"
rm "$W/site/tvm/lib/libtvm_compiler.so"
split -b "${PART1_MIB}M" -d -a 2 "$W/libtvm_compiler.xz" "$W/libtvm_compiler.xz."
mv "$W/libtvm_compiler.xz.00" .lent/
mv "$W"/libtvm_compiler.xz.0[1-9] .lent2/
tar cf - -C "$W/site" . | xz -9 -T2 > .lent2/tvm-rest.tar.xz
cp "$W"/xgboost_cpu-*.whl "$W"/tornado-*.whl .lent2/
rm -rf "$W"
du -sh .lent .lent2
