#!/usr/bin/env bash
# The device tool's one command (issue 39): build the C++ extensions if this Python has none, run gpu_check.sh with
# its results under $OUT, then pack everything under $OUT into one tarball (the tool returns at most 8 files),
# beside a copy of the table. Back home: tar -xzf gpu_check.tar.gz -C benchmarks/results
#
#   OUT=/some/folder benchmarks/gpu_oneshot.sh     # the device tool sets OUT
#
# Environment: TOTAL_S (default 540), the whole run's wall-clock limit: gpu_check gets what the build left, at most
# 400 s; PYTHON as gpu_check.sh's. Exit status: gpu_check.sh's.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
: "${OUT:?set OUT to the folder whose contents come back}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
TOTAL="${TOTAL_S:-540}"
START=$SECONDS
{
  echo "== $(date -u +%FT%TZ) $(hostname); $(nproc) CPUs; $("$PY" --version 2>&1)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 || true
} | tee "$OUT/machine.txt"
if ! "$PY" -c "import sys, fastpipe.ops as o; sys.exit(0 if o.EXTENSION_AVAILABLE and o.JPEG_OP_AVAILABLE else 1)" 2>/dev/null; then
  echo "== building the C++ extensions (setup.py build_ext --inplace)"
  timeout -k 10 200 "$PY" setup.py build_ext --inplace >"$OUT/build_ext.log" 2>&1 || echo "build failed: see build_ext.log"
  "$PY" -c "import fastpipe.ops as o; print(o.extension_status()); print(o.jpeg_op_status())" 2>&1 | tee -a "$OUT/build_ext.log"
fi
LEFT=$(( TOTAL - (SECONDS - START) - 15 ))
(( LEFT > 400 )) && LEFT=400
FASTPIPE_GPU_CHECK_BUDGET_S="${FASTPIPE_GPU_CHECK_BUDGET_S:-$LEFT}" FASTPIPE_GPU_CHECK_RESULTS_ROOT="$OUT" PYTHON="$PY" \
  benchmarks/gpu_check.sh 2>&1 | tee "$OUT/gpu_check_console.log"
rc=${PIPESTATUS[0]}
table="$(ls -d "$OUT"/gpu_check_*/gpu_check.txt 2>/dev/null | head -1)"
[[ -n "$table" ]] && cp "$table" "$OUT/gpu_check_table.txt"
tar -czf /tmp/gpu_check.tar.gz -C "$OUT" . && find "$OUT" -mindepth 1 -maxdepth 1 ! -name gpu_check_table.txt -exec rm -rf {} + \
  && mv /tmp/gpu_check.tar.gz "$OUT/gpu_check.tar.gz"
echo "packed: $(ls -la "$OUT")"
exit "$rc"
