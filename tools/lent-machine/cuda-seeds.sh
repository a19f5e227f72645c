#!/bin/bash
# The prepared command of the CUDA issues (32, 33): both seed experiments on a lent GPU machine.
#   call 1, carry [".lent"], timeout_s 120:            bash tools/lent-machine/cuda-seeds.sh stage
#   call 2 at once (the machine stays warm 30 s), carry [".lent2"], timeout_s = device time left
#   minus ~60 s, the same number as LIMIT:             LIMIT=600 bash tools/lent-machine/cuda-seeds.sh run
# run: (1) Phi-2 q4 decode, fused vs unfused under dlight and under our untuned rules (the q4 projections
# by rules/dequant_gemv_cuda.py, checked against NumPy there), per kernel and whole layer against the
# bandwidth bound (bench phi2-decode); (2) int8 ResNet-50 at batch 16 (resnet50-int8-s8 on CUDA: the
# convs on signed activations, which the plugin rule set puts on int8 tensor cores), the seed's table: each rule
# set (plugin, no-inline-const, upstream) tuned for the same TUNE_S seconds and TRIALS per task
# (Ctrl-C semantics: the database stays valid), then all three timed in the same rounds, each
# checked bit-exactly against NumPy, beside PyTorch's fp16 ResNet-50 under a CUDA graph (--peers torch).
# Between them (3): whole-model decode, the 32-layer step as one CUDA graph (generate --target cuda), dlight vs
# our rules, beside transformers' Phi-2 under a CUDA graph. Results and the databases come back in $OUT.
# --dry-run (on the CPU machine, through rehearse.py): the same steps with nothing run on a GPU:
# TVM's parts staged and tested, every CUDA module of both experiments built with nvcc.
set -u
STEP=${1:-}; DRY=0; [ "${2:-}" = "--dry-run" ] && DRY=1
case "$STEP" in stage|run) ;; *) echo "usage: cuda-seeds.sh stage|run [--dry-run]"; exit 2;; esac
OUT=${OUT:-$(mktemp -d)}; LIMIT=${LIMIT:-540}; TUNE_S=${TUNE_S:-90}; TRIALS=${TRIALS:-8}; T0=$(date +%s)
left() { echo $(( LIMIT - 30 - ($(date +%s) - T0) )); }
exec > >(tee -a "$OUT/cuda-seeds.log") 2>&1
[ $DRY = 1 ] && export LENT_DRY=1
source tools/lent-machine/setup.sh
if [ "$STEP" = stage ]; then echo "stage: done in $(( $(date +%s) - T0 )) s"; exit 0; fi
[ "$LENT_TVM" = 1 ] || { echo "run: TVM's parts are missing: call 'stage' (carry .lent) first, within 30 s"; exit 3; }
python3 -c "import tvm, tvm_ext; print('tvm', tvm.__version__)" || exit 3
W=tvm_ext_work
if [ $DRY = 1 ]; then
  timeout "$(left)" tvm-ext bench phi2-decode --target cuda-sm90 --build-only --schedules dlight,rule \
    > "$OUT/build-phi2-decode-cuda.txt" && echo "phi2-decode: every dlight and rule kernel built (nvcc)"
  timeout "$(left)" tvm-ext generate --target cuda-sm90 --build-only --context 512 --tokens 32 \
    > "$OUT/build-generate-cuda.txt" && echo "generate --target cuda: the full step built (nvcc)" \
    || echo "generate --target cuda: the one-function step did not build"
  timeout "$(left)" tvm-ext tune resnet50-int8 --target cuda-sm90 --batch 16 --build-only --candidates 1 \
    --json > "$OUT/build-resnet50-int8-cuda-b16.json" && python3 -c "
import json, sys
tasks = json.load(open(sys.argv[1]))['tasks']
empty = [t['task'] for t in tasks if not t['candidates']]
failed = sum(t['build_failures'] for t in tasks)
print(f'resnet50-int8 b16: {len(tasks) - len(empty)} of {len(tasks)} tasks built a candidate (nvcc), {failed} build failures'
      + (f'; no sampled candidate passed the postprocs for {empty}' if empty else ''))" "$OUT/build-resnet50-int8-cuda-b16.json"
  echo "dry run: done in $(( $(date +%s) - T0 )) s"
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
timeout "$(( $(left) - 330 ))" tvm-ext bench phi2-decode --target cuda --schedules dlight,rule --rounds 5 \
  --out "$OUT/bench-phi2-decode-cuda.json"  # keeps ~330 s for the whole-model decode and ResNet-50
rc=$?; echo "phi2-decode rc=$rc at $(( $(date +%s) - T0 )) s"
if [ $rc != 0 ] && [ "$(left)" -gt 300 ]; then  # our rule's first run on a GPU failed (e.g. its check
  # against NumPy): the dlight row alone, so the lease still answers the seed's question
  timeout "$(( $(left) - 240 ))" tvm-ext bench phi2-decode --target cuda --schedules dlight --rounds 5 \
    --out "$OUT/bench-phi2-decode-cuda.json"
  echo "phi2-decode (dlight alone) rc=$? at $(( $(date +%s) - T0 )) s"
fi
# whole-model decode: the 32-layer step as one CUDA graph, dlight vs our rules, beside transformers' Phi-2
t=$(left); [ "$t" -gt 300 ] && timeout "$(( t - 240 < 150 ? t - 240 : 150 ))" tvm-ext generate --target cuda \
  --context 512 --tokens 32 --rounds 3 --peers torch --out "$OUT/generate-phi2-cuda.json"
echo "generate rc=$? at $(( $(date +%s) - T0 )) s"
# the same tuning time for each rule set: an equal share of what is left once ~100 s are kept for the bench
SHARE=$(( ($(left) - 100) / 3 )); SHARE=$(( SHARE < TUNE_S ? SHARE : TUNE_S ))
echo "tuning each rule set for $SHARE s"
for R in plugin no-inline-const upstream; do
  [ "$SHARE" -gt 20 ] || break
  timeout -s INT -k 20 "$SHARE" tvm-ext tune resnet50-int8 --target cuda --batch 16 \
    --ruleset "$R" --trials "$TRIALS"
  echo "tune $R rc=$? at $(( $(date +%s) - T0 )) s"
done
t=$(left); [ "$t" -gt 30 ] && timeout "$t" tvm-ext bench resnet50-int8 --target cuda --batch 16 \
  --rulesets plugin,no-inline-const,upstream --from-logs --logs-dir "$W" --rounds 10 --peers torch \
  --out "$OUT/bench-resnet50-int8-cuda-b16.json"

tar czf "$OUT/cuda-dbs.tgz" --exclude=logs "$W" 2>/dev/null
echo "run: done in $(( $(date +%s) - T0 )) s"
