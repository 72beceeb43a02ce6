#!/usr/bin/env bash
# The CuPy float64 reference on the H200: (i) its agreement with the NumPy reference on every
# committed vector of the portable Ops, (ii) the full-geometry run at both official geometries with
# the reference on the GPU and the fast implementation. Logs under $OUT (default ./out).
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python -m pytest -q -p no:cacheprovider tests/gpu/test_reference_backend.py tests/test_reference_backend.py \
  > "$OUT/reference_backend_tests.log" 2>&1
echo "tests rc=$?" | tee -a "$OUT/summary.txt"
/usr/bin/time -v dflash-conformance geometry --impl kernels_cu.fast:FastCudaBackend --reference-backend cupy \
  --jobs ${JOBS:-3} --json "$OUT/geometry_cupy.json" > "$OUT/geometry_cupy.log" 2> "$OUT/geometry_cupy.time"
echo "geometry rc=$?" | tee -a "$OUT/summary.txt"
grep -E "Elapsed|Maximum resident" "$OUT/geometry_cupy.time" | tee -a "$OUT/summary.txt"
tail -n 12 "$OUT/geometry_cupy.log" | tee -a "$OUT/summary.txt"
