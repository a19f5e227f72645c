#!/bin/bash
# Both CUDA seed experiments (issues 32, 33; int8 ResNet-50 at batch 16 under three rule sets, Phi-2 q4 decode
# fused and unfused) as one measurement bundle (tvm-ext bundle; issue 50): everything is built here, the lent
# GPU machine only loads, checks and times, with TVM's runtime alone, in ONE call.
#
#   here:    bash tools/lent-machine/cuda-seeds.sh pack       # build the bundle + TVM's runtime for Python 3.12
#                                                             # into .bundle/carry (prints sizes, time model)
#   device:  one call, carry [".bundle/carry"], timeout_s 600 (or what status says is left, minus ~60 s):
#            LIMIT=600 bash tools/lent-machine/cuda-seeds.sh run
#   here:    bash tools/lent-machine/collect.sh FILES_AT h200 # import the results, print the tables
#
# run: unpacks TVM's runtime and the bundle into /tmp, names the GPU, then the bundle's runner (--supervise:
# restarted after a crash) writes $OUT/results.jsonl row by row (fsync'ed: a timeout loses nothing already
# measured) and stops on its own LIMIT - 45 s after its start. 'pack' options go to 'tvm-ext bundle build'
# (e.g. --candidates 8). 'rehearse' runs the slow rehearsal test (the runner on a CPU stand-in bundle, under
# Python 3.12 where .bundle/wheels312 holds its wheels, SIGKILLed and resumed). 'stage' is call 1 of the AMX
# checks (README), which still use the packed compiler (pack.sh, setup.sh).
set -u
STEP=${1:-}; shift || true
C=.bundle/carry
case "$STEP" in
pack)
  set -e
  tvm-ext bundle build --out .bundle/cuda-seeds "$@"
  tvm-ext bundle runtime --python 3.12 --out "$C/tvm-runtime.tar.xz"
  mkdir -p "$C" && cp .bundle/cuda-seeds/bundle.tar.xz "$C/"
  cp tools/lent-machine/cuda-seeds.sh "$C/"
  du -b "$C"/* | awk '{s += $1; printf "%8.1f MiB  %s\n", $1 / 1048576, $2} END {printf "%8.1f MiB  carried in all\n", s / 1048576}'
  ;;
stage)  # call 1 of the AMX sequence (README): stage TVM's compiler parts (carry .lent) on the machine
  [ "${1:-}" = "--dry-run" ] && export LENT_DRY=1
  OUT=${OUT:-$(mktemp -d)}; source tools/lent-machine/setup.sh; echo "stage: done"
  ;;
rehearse)  # TVM_EXT_PYTHON312: a Python 3.12 interpreter (default: python3.12 on PATH)
  W=${TVM_EXT_WHEELS312:-$PWD/.bundle/wheels312}
  [ -d "$W" ] || { python -c "from tvm_ext.bundle.runtime import download_wheels; download_wheels('$W')" \
    && python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
       --platform manylinux_2_17_x86_64 -d "$W" "numpy<2.3"; } || exit 1
  TVM_EXT_WHEELS312=$W python -m pytest -q -n 0 -s -m slow tests/test_bundle.py -o addopts=''
  ;;
run)
  export PYTHONUNBUFFERED=1
  OUT=${OUT:-$(mktemp -d)}; LIMIT=${LIMIT:-600}; T0=$(date +%s); W=/tmp/tvm-ext-bundle
  exec > >(tee -a "$OUT/cuda-seeds.log") 2>&1
  mkdir -p "$W" && tar xJf "$C/tvm-runtime.tar.xz" -C "$W" && tar xJf "$C/bundle.tar.xz" -C "$W" || exit 3
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv
  CUDA_LIB=$(dirname "$(ls /usr/local/cuda*/lib*/libcudart.so.13* 2>/dev/null | head -1)" 2>/dev/null)
  export LD_LIBRARY_PATH=${CUDA_LIB:+$CUDA_LIB:}${LD_LIBRARY_PATH:-} PYTHONPATH=$W/site TVM_USE_RUNTIME_LIB=1
  python3 -s "$W/bundle/runner.py" "$W/bundle" --results "$OUT/results.jsonl" --supervise \
    --deadline $(( LIMIT - 45 - ($(date +%s) - T0) ))
  echo "runner rc=$? at $(( $(date +%s) - T0 )) s; $(grep -c '"ok": true' "$OUT/results.jsonl") rows ok"
  ;;
*) echo "usage: cuda-seeds.sh pack [tvm-ext bundle build options] | rehearse | run | stage [--dry-run]"; exit 2;;
esac
