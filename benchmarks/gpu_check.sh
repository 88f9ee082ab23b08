#!/usr/bin/env bash
# One command for a GPU machine: the GPU-marked tests, the collate/pin benchmark (stock against
# recycled batch memory: pin_memory() copies against buffers registered with cudaHostRegister),
# a short diagnosis of toy:naive and toy:optimized, then one table of steps/s, % of the device
# bound and GPU utilisation.
#
#   benchmarks/gpu_check.sh                     # from any directory
#
# Environment:
#   OUT                          results folder (JSON, logs); a temporary folder when unset
#   FASTPIPE_GPU_CHECK_DEVICE    device for the diagnoses (default cuda); sim:290 dry-runs without a GPU
#   FASTPIPE_GPU_CHECK_STEPS     measured steps per experiment (default 6)
#   FASTPIPE_GPU_CHECK_WARMUP    warm-up steps per experiment (default 2)
#   FASTPIPE_GPU_CHECK_STRATEGY  diagnose --strategy: bisect (default, fewest experiments) or linear
#   FASTPIPE_GPU_CHECK_EXTRA     more diagnose options, e.g. "--batch-size 8 --raw-size 128 --img-size 64"
#                                for a quick dry run on a small machine (default: none, the article's sizes)
#   FASTPIPE_GPU_CHECK_BUDGET_S  wall-clock budget for everything (default 390: done in under 7 minutes)
#   PYTHON                       interpreter (default python3)
#
# It downloads nothing. If fastpipe is not importable it is installed from this checkout with
# pip --no-index --no-deps --no-build-isolation, and failing that it runs from the source tree.
# Exit status: 0 when every phase passed, 1 when one failed (the table is printed either way),
# 3 when fastpipe cannot be imported, 4 when the device is cuda and there is no GPU.
set -euo pipefail
export PYTHONUNBUFFERED=1

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
DEVICE="${FASTPIPE_GPU_CHECK_DEVICE:-cuda}"
STEPS="${FASTPIPE_GPU_CHECK_STEPS:-6}"
WARMUP="${FASTPIPE_GPU_CHECK_WARMUP:-2}"
STRATEGY="${FASTPIPE_GPU_CHECK_STRATEGY:-bisect}"
read -r -a EXTRA <<<"${FASTPIPE_GPU_CHECK_EXTRA:-}"
BUDGET="${FASTPIPE_GPU_CHECK_BUDGET_S:-390}"
RESULTS="${OUT:-$(mktemp -d -t fastpipe-gpu-check.XXXXXX)}"
mkdir -p "$RESULTS"
START=$SECONDS
FAILED=()

# seconds_for CAP RESERVE: time for the next phase, at most CAP, keeping RESERVE for the phases after it.
seconds_for() {
  local left=$(( BUDGET - (SECONDS - START) - $2 ))
  (( left > $1 )) && left=$1
  echo "$left"
}

phase() { echo; echo "== [$(( SECONDS - START ))s] $*"; }

phase "fastpipe GPU check: device $DEVICE, results in $RESULTS"
if ! "$PY" -c "import fastpipe" 2>/dev/null; then
  phase "fastpipe is not importable: installing this checkout (no downloads)"
  if ! timeout -k 10 "$(seconds_for 150 200)" "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . \
      >"$RESULTS/pip_install.log" 2>&1; then
    echo "pip install failed (see $RESULTS/pip_install.log); running from the source tree, C++ ops on their fallbacks"
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
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
    GPU_INDEX="${DEVICE#cuda}"; GPU_INDEX="${GPU_INDEX#:}"
    SAMPLE_ARGS=(--gpu "${GPU_INDEX:-0}")
    ;;
  *) SAMPLE_ARGS=(--no-gpu) ;;
esac

phase "GPU tests: pytest -m gpu"
rc=0
timeout -k 10 "$(seconds_for 110 290)" "$PY" -m pytest -m gpu -q -p no:cacheprovider \
  --junitxml "$RESULTS/gpu_tests.xml" tests || rc=$?
(( rc == 0 )) || FAILED+=("pytest -m gpu (exit $rc)")

phase "collate and pin per batch, stock vs recycled: benchmarks/bench_collate.py"
rc=0
timeout -k 10 "$(seconds_for 60 230)" "$PY" benchmarks/bench_collate.py --batches 6 --json "$RESULTS/bench_collate.json" \
  2>&1 | tee "$RESULTS/bench_collate.log" || rc=$?
(( rc == 0 )) || FAILED+=("bench_collate (exit $rc)")

RUNS=()
for variant in naive optimized; do
  if [[ $variant == naive ]]; then limit=$(seconds_for 120 110); else limit=$(seconds_for 100 10); fi
  phase "fastpipe diagnose toy:$variant --device $DEVICE --steps $STEPS --warmup $WARMUP --strategy $STRATEGY (at most ${limit}s)"
  json="$RESULTS/diagnose_$variant.json"
  util="$RESULTS/gpu_util_$variant.json"
  RUNS+=(--run "toy:$variant=$json,$util")
  if (( limit < 20 )); then
    FAILED+=("toy:$variant (no time left in the budget)")
    continue
  fi
  rc=0
  "$PY" benchmarks/gpu_table.py sample --out "$util" "${SAMPLE_ARGS[@]}" -- \
    timeout -k 10 "$limit" "$PY" -m fastpipe diagnose "toy:$variant" --device "$DEVICE" \
    --steps "$STEPS" --warmup "$WARMUP" --strategy "$STRATEGY" --no-progress --json "$json" ${EXTRA[@]+"${EXTRA[@]}"} 2>&1 | tee "$RESULTS/diagnose_$variant.log" || rc=$?
  (( rc == 0 )) || FAILED+=("toy:$variant diagnosis (exit $rc)")
done

phase "results"
"$PY" benchmarks/gpu_table.py table --device "$DEVICE" "${RUNS[@]}" --json "$RESULTS/gpu_check.json" \
  | tee "$RESULTS/gpu_check.txt"

echo
echo "finished in $(( SECONDS - START ))s; results in $RESULTS"
if (( ${#FAILED[@]} )); then
  printf 'FAILED: %s\n' "${FAILED[@]}"
  exit 1
fi
echo "all phases passed"
