#!/usr/bin/env bash
# The GPU host's one entry point: every check that needs a CUDA GPU, logs and JSON reports under OUT, a short table
# at the end. Run from the repository root on the GPU machine (the package need not be installed: PYTHONPATH is set
# to the checkout). Never writes into docs/.
#
#   tools/gpu_check.sh [--dry-run] OUT [PART ...]        (make gpu-check OUT=out/gpu [PARTS="tests-a bench"])
#
# PARTS (default: all, in this order; a device call of a few minutes each, so they can be batched):
#   tests-a      pytest -m gpu over the four largest GPU test files (attention, fused head, block, round)
#   tests-b      pytest -m gpu over every other test file (tests/, the GPU files not in tests-a)
#   tests        tests-a and tests-b (one pytest process over all of them outgrows a single device call)
#   suites       the committed vectors through the exact mode and the fast mode (dflash-conformance run, JSON)
#   round-suite  proposal_round and speculative_step through FastRound (and the exact mode's CudaRound)
#   geometry-35b the fast mode at the 35B geometry (DFlash), full width, every B and W, parts as 4 processes
#   geometry-27b the fast mode at the 27B geometry (DFlash2), likewise
#   geometry     geometry-35b and geometry-27b
#   geometry-gpu-ref both geometries in one timed run with the float64 reference on the GPU (--reference-backend
#                cupy; GEOMETRY_JOBS processes, default 2: one a geometry)
#   bench        python -m benchmarks.gpu_bench: every Op and the rounds, PyTorch eager and graph, the floors
#
# The exit status is 0 when every step exited 0, 1 otherwise, 2 for a usage error.
set -uo pipefail

ALL_PARTS="tests-a tests-b suites round-suite geometry-35b geometry-27b geometry-gpu-ref bench"
BIG_GPU_TESTS="tests/gpu/test_fast_attention.py tests/gpu/test_fast_head.py tests/gpu/test_fast_block.py \
tests/gpu/test_fast_round.py"

usage() {
  echo "usage: tools/gpu_check.sh [--dry-run] OUT [PART ...]" >&2
  echo "parts: $ALL_PARTS tests geometry (default: all)" >&2
  exit 2
}

DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
[ $# -ge 1 ] || usage
case $1 in -*|"") usage ;; esac
OUT=$1; shift
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || read -r -a PARTS <<<"$ALL_PARTS"

expanded=()
for p in "${PARTS[@]}"; do
  case $p in
    tests) expanded+=(tests-a tests-b) ;;
    geometry) expanded+=(geometry-35b geometry-27b) ;;
    tests-a|tests-b|suites|round-suite|geometry-35b|geometry-27b|geometry-gpu-ref|bench) expanded+=("$p") ;;
    *) echo "gpu_check: unknown part '$p'" >&2; usage ;;
  esac
done

mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
case $OUT/ in "$PWD"/docs/*) echo "gpu_check: OUT must not be under docs/" >&2; exit 2 ;; esac
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
rc=0
TABLE=()

step() {  # name, seconds, command...: run it under a time limit, log it, keep going, remember a failure
  local name=$1 limit=$2; shift 2
  if [ $DRY = 1 ]; then
    echo "[$name] timeout $limit $*"
    return
  fi
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local r=$?
  [ $r -ne 0 ] && rc=1
  TABLE+=("$(printf '%-14s rc=%-3d %5ds  %s' "$name" "$r" "$((SECONDS - t0))" \
    "$(tail -n 1 "$OUT/$name.log" | cut -c1-110)")")
}

ignore_big() { for f in $BIG_GPU_TESTS; do printf -- '--ignore=%s ' "$f"; done; }

for part in "${expanded[@]}"; do
  case $part in
    tests-a)
      # shellcheck disable=SC2086
      step tests-a 570 env FAST_ROUND_REPORT="$OUT/fast_round_pytest.json" \
        FAST_ATTENTION_REPORT="$OUT/fast_attention_pytest.json" \
        $PY -m pytest -q -p no:cacheprovider -m gpu $BIG_GPU_TESTS ;;
    tests-b)
      # shellcheck disable=SC2046
      step tests-b 570 env ROUND_SUITE_REPORT="$OUT/round_suite_pytest.json" \
        FAST_SUITE_REPORT="$OUT/fast_suite_pytest.json" \
        $PY -m pytest -q -p no:cacheprovider -m gpu tests $(ignore_big) ;;
    suites)
      step suite-exact 570 $PY -m conformance.cli run --impl kernels_cu.backend:CudaBackend \
        --vectors vectors --json "$OUT/suite_exact.json"
      step suite-fast 570 $PY -m conformance.cli run --impl kernels_cu.fast:FastCudaBackend \
        --vectors vectors --json "$OUT/suite_fast.json" ;;
    round-suite)
      step suite-fast-round 570 $PY -m conformance.cli run --impl kernels_cu.fast_round:FastRound \
        --vectors vectors --ops proposal_round,speculative_step --json "$OUT/suite_fast_round.json"
      step suite-round 570 $PY -m conformance.cli run --impl kernels_cu.round:CudaRound \
        --vectors vectors --ops proposal_round,speculative_step --json "$OUT/suite_round.json" ;;
    geometry-35b)
      step geometry-35b 580 $PY -m conformance.cli geometry --impl kernels_cu.fast:FastCudaBackend \
        --geometry dflash-35b-a3b --jobs 4 --json "$OUT/geometry_fast_35b.json" ;;
    geometry-27b)
      step geometry-27b 580 $PY -m conformance.cli geometry --impl kernels_cu.fast:FastCudaBackend \
        --geometry dflash2-27b --jobs 4 --json "$OUT/geometry_fast_27b.json" ;;
    geometry-gpu-ref)
      # both official geometries with the float64 reference on the GPU (CuPy), timed as one run
      step geometry-gpu-ref 580 $PY -m conformance.cli geometry --impl kernels_cu.fast:FastCudaBackend \
        --reference-backend cupy --jobs "${GEOMETRY_JOBS:-2}" --json "$OUT/geometry_fast_gpu_ref.json" ;;
    bench)
      step bench 570 $PY -m benchmarks.gpu_bench --json "$OUT/bench.json" ;;
  esac
done

if [ $DRY = 0 ]; then
  echo "gpu_check: logs and reports under $OUT"
  printf '%s\n' "${TABLE[@]}" | tee "$OUT/summary.txt"
fi
exit $rc
