#!/bin/bash
# After the lent-GPU call (cuda-seeds.sh run): keep what came back in $OUT (the device tool's files_at folder).
#   bash tools/lent-machine/collect.sh FILES_AT [GPU]      e.g. GPU=h100 or h200 (goes into the saved names)
# Saves results.jsonl as tuning_logs/bundle-cuda-seeds-GPU.jsonl, prints the seed tables (tvm-ext bundle table,
# also as JSON beside it), imports the measured candidates as tuning records into tvm_ext_work/ (tvm-ext bundle
# import: resumable, idempotent) and saves the ResNet-50 work dirs (tvm-ext save) under names that carry the GPU.
# Nothing is committed: read the figures, then commit with the GPU named.
set -eu
SRC=${1:?usage: collect.sh FILES_AT [GPU]}; GPU=${2:-gpu}; B=${BUNDLE:-.bundle/cuda-seeds}
[ -f "$SRC/results.jsonl" ] || { echo "collect.sh: no $SRC/results.jsonl"; exit 2; }
cp "$SRC/results.jsonl" "tuning_logs/bundle-cuda-seeds-$GPU.jsonl"
tvm-ext bundle table "$SRC/results.jsonl" --bundle "$B" --json "tuning_logs/bundle-cuda-seeds-$GPU.json"
tvm-ext bundle import "$SRC/results.jsonl" --bundle "$B" --work-dir tvm_ext_work
for d in tvm_ext_work/resnet50-int8-s8-cuda*; do
  [ -d "$d" ] && tvm-ext save "$d" --name "$(basename "$d")-$GPU"
done
[ -f "$SRC/cuda-seeds.log" ] && grep -E "rc=|runner:|NVIDIA|Error|error" "$SRC/cuda-seeds.log" | tail -20
