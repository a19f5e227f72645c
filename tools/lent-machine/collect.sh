#!/bin/bash
# After a lent-GPU run (cuda-seeds.sh run): keep what came back in $OUT (the device tool's files_at folder).
#   bash tools/lent-machine/collect.sh FILES_AT [GPU]      e.g. GPU=h100 or h200 (goes into the saved names)
# Saves each result JSON into tuning_logs/ under a name that carries the GPU, unpacks cuda-dbs.tgz into
# tvm_ext_work/ and saves its databases (tvm-ext save checks and compresses them), then prints the lines of
# cuda-seeds.log that carry figures. Nothing is committed: read the figures, then commit with the GPU named.
set -eu
SRC=${1:?usage: collect.sh FILES_AT [GPU]}; GPU=${2:-gpu}
[ -d "$SRC" ] || { echo "collect.sh: no folder $SRC"; exit 2; }
for f in bench-phi2-decode-cuda generate-phi2-cuda bench-resnet50-int8-cuda-b16; do
  [ -f "$SRC/$f.json" ] && tvm-ext save "$SRC/$f.json" --name "$f-$GPU.json" || echo "collect.sh: no $f.json"
done
if [ -f "$SRC/cuda-dbs.tgz" ]; then
  mkdir -p tvm_ext_work && tar xzf "$SRC/cuda-dbs.tgz" -C tvm_ext_work --strip-components=1
  for d in tvm_ext_work/resnet50-int8-cuda-*; do
    [ -d "$d" ] && tvm-ext save "$d" --name "$(basename "$d")-$GPU"
  done
fi
[ -f "$SRC/cuda-seeds.log" ] && grep -E "rc=|tok/s|ms|exact|MISMATCH|GB/s|Error|error" "$SRC/cuda-seeds.log" | tail -60
