#!/bin/bash
# Call 3 (no carry: TVM is unpacked in /tmp; within 30 s of call 2, while the machine is warm): tune resnet50-int8-amx for
# TUNE_S seconds (SIGINT: the database stays valid and resumes), bench it against ORT per layer, then
# the VNNI network from its committed database; everything within LIMIT seconds. The AMX bench adds warm runs
# and the breakdown: the network against the sum of its kernels there (issue 35: 2.1-2.4x in session 17).
set -u
LIMIT=${LIMIT:-480}; TUNE_S=${TUNE_S:-200}; T0=$(date +%s)
left() { echo $(( LIMIT - 15 - ($(date +%s) - T0) )); }
exec > >(tee -a "$OUT/tune-bench.log") 2>&1
source tools/lent-machine/setup.sh
python3 -c "import tvm, tvm_ext, xgboost" || { echo "no TVM or xgboost here (a cold machine?)"; exit 3; }
# the saved database travels compressed; tune unpacks it in place (in this copy of the tree): unpack
# amx-db.tgz here and 'tvm-ext save' the directory to keep its new records
W=tuning_logs/resnet50-int8-amx-emeraldrapids16-llvm-plugin
timeout -s INT -k 20 "$TUNE_S" tvm-ext tune resnet50-int8-amx --trials "${TRIALS:-8}" --work-dir $W
echo "tune rc=$? at $(( $(date +%s) - T0 )) s"
tar czf "$OUT/amx-db.tgz" --exclude=logs $W
t=$(left); [ "$t" -gt 30 ] && timeout "$t" tvm-ext bench resnet50-int8-amx --rulesets plugin --from-logs \
  --peers ort --layers --rounds 10 --warm 5 --breakdown 20 --out "$OUT/bench-resnet50-int8-amx-llvm.json"
t=$(left); [ "$t" -gt 30 ] && timeout "$t" tvm-ext bench resnet50-int8-nchwc --rulesets plugin --from-logs \
  --peers ort --rounds 10 --out "$OUT/bench-resnet50-int8-nchwc-amxhost.json"
echo "done at $(( $(date +%s) - T0 )) s"
