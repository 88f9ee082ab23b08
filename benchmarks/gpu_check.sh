#!/usr/bin/env bash
# One command for a GPU machine (issue 39): the GPU tests, compare toy and jpeg, script mode on a CUDA training
# script, the article's table, the thread loader against the DataLoader at 4, 8 and 16, nvjpeg against the CPU
# decode-crop op, collate/pin, and `make demo`'s diagnosis at its defaults; each phase capped from what is left
# of one budget, so the table always prints (benchmarks/gpu_check.py says how). Done in under 7 minutes.
#
#   benchmarks/gpu_check.sh                                   # from any directory
#   FASTPIPE_GPU_CHECK_DEVICE=sim:290 benchmarks/gpu_check.sh # dry run without a GPU
#
# Environment:
#   FASTPIPE_GPU_CHECK_DEVICE        cuda (default), cuda:N, or sim:STEP_MS for a dry run (CUDA-only phases are skipped)
#   FASTPIPE_GPU_CHECK_BUDGET_S      wall-clock seconds for everything, table included (default 400)
#   FASTPIPE_GPU_CHECK_RESULTS_ROOT  results go in gpu_check_<machine>[_dryrun] here (default benchmarks/results)
#   FASTPIPE_GPU_CHECK_STEPS         measured steps per rung / article row (default 6)
#   FASTPIPE_GPU_CHECK_WARMUP        warm-up steps (default 2)
#   FASTPIPE_GPU_CHECK_EXTRA         more options for compare toy (default on a dry run: small sizes, 2 workers, --no-memory)
#   FASTPIPE_GPU_CHECK_EXTRA_JPEG    more options for compare jpeg (default on a dry run: batch 16, 2 workers)
#   FASTPIPE_GPU_CHECK_ONLY          comma-separated phase keys to run (default: all)
#   PYTHON                           interpreter (default python3)
#
# It downloads nothing and installs nothing: it runs this checkout (PYTHONPATH), C++ extensions as built in place
# (benchmarks/gpu_oneshot.sh builds them first when missing).
# Exit status: 0 when no phase failed (cut or skipped phases are in the table), 1 when one failed,
# 3 when fastpipe cannot be imported, 4 when the device is cuda and there is no GPU.
set -euo pipefail
export PYTHONUNBUFFERED=1

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
DEVICE="${FASTPIPE_GPU_CHECK_DEVICE:-cuda}"
BUDGET="${FASTPIPE_GPU_CHECK_BUDGET_S:-400}"
START=$SECONDS
case "$DEVICE" in
  cuda|cuda:*) DRY_EXTRA=""; DRY_EXTRA_JPEG="" ;;
  *) DRY_EXTRA="--batch-size 16 --raw-size 128 --img-size 64 --num-workers 2 --no-memory"; DRY_EXTRA_JPEG="--batch-size 16 --num-workers 2" ;;
esac
EXTRA="${FASTPIPE_GPU_CHECK_EXTRA-$DRY_EXTRA}"
EXTRA_JPEG="${FASTPIPE_GPU_CHECK_EXTRA_JPEG-$DRY_EXTRA_JPEG}"

# This checkout first, installed or not: the benchmark scripts run as files, whose folder is not the root.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import fastpipe"; then
  echo "fastpipe cannot be imported (above). It needs torch, torchvision, numpy, scipy, pillow, numba, psutil and rich." >&2
  exit 3
fi
case "$DEVICE" in
  cuda|cuda:*)
    if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
      echo "device $DEVICE: torch.cuda.is_available() is False here, so the GPU check still awaits a GPU." >&2
      echo "Dry-run it with FASTPIPE_GPU_CHECK_DEVICE=sim:290." >&2
      exit 4
    fi
    ;;
esac

exec "$PY" benchmarks/gpu_check.py --device "$DEVICE" --budget "$(( BUDGET - (SECONDS - START) ))" \
  --results-root "${FASTPIPE_GPU_CHECK_RESULTS_ROOT:-$ROOT/benchmarks/results}" \
  --steps "${FASTPIPE_GPU_CHECK_STEPS:-6}" --warmup "${FASTPIPE_GPU_CHECK_WARMUP:-2}" \
  --extra "$EXTRA" --extra-jpeg "$EXTRA_JPEG" --only "${FASTPIPE_GPU_CHECK_ONLY:-}" --python "$(command -v "$PY")"
