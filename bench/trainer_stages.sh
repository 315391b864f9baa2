#!/usr/bin/env bash
# Every trainer-stage figure of bench/README.md in one GPU session: target capture, drafter step, GPU tests.
# Usage (repo root, one H200): OUT=/some/dir bash bench/trainer_stages.sh   [BENCHES="target drafter tests"]
set -o pipefail
OUT=${OUT:-/tmp/trainer_stages}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
LOG="$OUT/log.txt"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,driver_version --format=csv
  python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
} 2>&1 | tee -a "$LOG"
for b in ${BENCHES:-target drafter tests}; do
  echo "=== $b $(date -u +%T)" | tee -a "$LOG"
  case $b in
    target) timeout "${T_TARGET:-220}" python3 bench/bench_target.py --out "$OUT" ${TARGET_ARGS:-} 2>&1 | tee -a "$LOG" ;;
    drafter) timeout "${T_DRAFTER:-240}" python3 bench/bench_drafter.py --out "$OUT" ${DRAFTER_ARGS:-} 2>&1 | tee -a "$LOG" ;;
    tests) timeout "${T_TESTS:-120}" python3 -m pytest tests/trainer/test_gpu_model.py -q -rs --timeout 110 2>&1 | tee -a "$LOG" ;;
  esac
  echo "=== $b rc=$? $(date -u +%T)" | tee -a "$LOG"
done
