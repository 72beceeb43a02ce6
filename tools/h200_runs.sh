#!/usr/bin/env bash
# The H200 runs behind docs/reports (issues 11 and 12), one section per argument, logs and JSON
# under $OUT (default ./h200-out). Run from the repository root on the GPU machine, where the
# package is not installed: PYTHONPATH is set to the checkout.
#
#   bash tools/h200_runs.sh gpu-tests      # tests/gpu (exact, fast, round and step kernels)
#   bash tools/h200_runs.sh suites         # the CLI over every vector: exact, fast, CudaRound
#   bash tools/h200_runs.sh torch          # the PyTorch engine (CUDA): controls and a capture folder
#   bash tools/h200_runs.sh bench          # benchmarks/gpu_bench.py, every Op, both modes, torch
#   bash tools/h200_runs.sh geometry-fast  # the fast mode at the two official geometries, full width
#   bash tools/h200_runs.sh fast-v5        # the fast-mode GPU tests changed in session v5, the CLI over
#                                          # every vector (fast, FastRound), the round bench and trace
#   bash tools/h200_runs.sh v6-d           # session v6: top-k / attention / block / round GPU tests, the top-k
#                                          # A/B, the attention's phases and benchmark, the round bench and trace
#   bash tools/h200_runs.sh v6-final       # session v6: the final kernels' tests, both CLI suites, the top-k A/B,
#                                          # the bench of the changed Ops and the rounds, the trace (logs.tgz)
#   bash tools/h200_runs.sh v6-attn        # session v6: the attention benchmark with its split sweep
#   bash tools/h200_runs.sh v7-tests       # session v7: every GPU test, both CLI suites of the fast mode
#   bash tools/h200_runs.sh v7-bench       # session v7: the bench of the block and the rounds, the round A/B,
#                                          # the trace
#   bash tools/h200_runs.sh v7-a           # session v7: the block / attention / round GPU tests, fb_resid_norm
#                                          # per path, the round A/B (K-split GEMMs), the trace (logs.tgz)
#   bash tools/h200_runs.sh v8-geo-sel     # session v8: the selector's rowdot kernels (bench, GPU tests), and
#                                          # the fast mode at both full geometries as four processes at once
#                                          # (35B; 27B B1; 27B B8 W8; 27B B8 W16), cut at GEO_DEADLINE s
#   bash tools/h200_runs.sh v8-final       # session v8: every GPU test, both CLI suites of the fast mode, the
#                                          # bench of candidate_topk, the block and the rounds, the trace
#   bash tools/h200_runs.sh v8-combine     # session v8: the attention combine A/B (bits, us) against bc06c16's,
#                                          # every GPU test, both CLI suites, the bench of the rounds, the trace
#   bash tools/h200_runs.sh v9-a           # session v9 (tree adf7b02 + the probe's files): attention / head-GEMM
#                                          # GPU tests, the round A/B of the attention's pipeline depth and the
#                                          # tuned head GEMM, the attention's phases, the L2 prefetch probe
#                                          # (logs.tgz); its round_ab configs stages2 / auto are gone since the
#                                          # attention experiments were reverted: check out adf7b02 to rerun
#   bash tools/h200_runs.sh v9-b           # session v9 (tree 13b0f7b): the cluster-merged attention: its GPU
#                                          # tests, the round A/B against the combine kernel, the trace; both
#                                          # attention experiments were reverted after these runs (their
#                                          # configs are gone from round_ab: check out those trees to rerun)
#   bash tools/h200_runs.sh v10-a          # session v10: PDL's GPU tests, the round A/B against ordinary
#                                          # launches, the trace, the attention / block / round GPU tests
#   bash tools/h200_runs.sh v10-final      # session v10: every GPU test, both CLI suites of the fast mode
#   bash tools/h200_runs.sh v10-bench      # session v10: masked_block at the 35B geometry, the round A/B (PDL off /
#                                          # on), the bench of the block and the rounds, the trace
#   bash tools/h200_runs.sh v10-lo         # session v10: launch-order edges from 64 rows: PDL / FastRound GPU tests,
#                                          # FastRound's suite, the round A/B, the bench, the trace
#   bash tools/h200_runs.sh v11-a          # session v11: fast_gemv (weights staged before the PDL wait): its GPU
#                                          # tests, the PDL / block / round tests, the round A/B at B1 (logs.tgz)
#   bash tools/h200_runs.sh v11-final      # session v11: the round A/B (the v10 tree from .carry/v10tree when present,
#                                          # early_table_all), the changed kernels' GPU tests, both CLI suites of
#                                          # the fast mode (logs.tgz)
#   bash tools/h200_runs.sh v11-check      # after session v11: the GPU test written once its device time was spent
#                                          # (the block's vectors on fast_gemv), fast_gemv / PDL tests, the round A/B
#   bash tools/h200_runs.sh v12-final      # session v12: the round A/B against the v11 tree (.carry/v11tree, a git
#                                          # archive of ac998e8, when present), the block and round GPU tests, both
#                                          # CLI suites of the fast mode; V12_PART=geo: the 35B geometry's masked_block
#                                          # (its B1 cases run the SiLU-mul form), the bench and the 35B B1 trace
#   bash tools/h200_runs.sh v9-final       # session v9: every GPU test, both CLI suites of the fast mode,
#                                          # proposal_head at the 35B geometry, the bench of proposal_head, the
#                                          # block and the rounds, the trace (logs.tgz); V9_PART=tests stops after
#                                          # the suites, v9-bench runs the rest (one device call each)
#   bash tools/h200_runs.sh v13-head       # session v13: the fused head's tests, probe, A/B, geometries, fast suite
#   bash tools/h200_runs.sh v14-a          # session v14: the ping-pong fused head (probe, tests, A/B), v13 unrun edits
#   bash tools/h200_runs.sh v14-b          # session v14: batched slot claims, the ping-pong kernel's clocks
#   bash tools/h200_runs.sh v14-c          # session v14: the ping-pong kernel selecting from staged logits
#   bash tools/h200_runs.sh v14-d          # session v14: that selection HP_R rows at a time
#   bash tools/h200_runs.sh v14-e          # session v14: a row at a time, branch-free keys, bisection seed
#   bash tools/h200_runs.sh v14-f          # session v14: lane-maxima seed against bisection, the timeline
#   bash tools/h200_runs.sh v14-g          # session v14: loads a row ahead, the last tile by both warpgroups
#   bash tools/h200_runs.sh v14-h          # session v14: routed everywhere and in FastRound's graph: tests, A/Bs
#   bash tools/h200_runs.sh v14-geo        # session v14: the head Ops' geometries with the routed kernel
#   bash tools/h200_runs.sh v15-a          # session v15: the selection a lane a hidden row: tests, probe, A/Bs
#   bash tools/h200_runs.sh v15-geo        # session v15: the head Ops' geometries with the lane-form selection
#   bash tools/h200_runs.sh v15-e          # session v15: the lane form's tile-end compaction: tests, probe, A/Bs
#   bash tools/h200_runs.sh v15-f          # session v15: insertions in k steps, idle warps skipped: tests, A/Bs
#   bash tools/h200_runs.sh v16-a          # session v16: fast_wgemm's GPU tests, the GEMM A/B, the round A/B
#   bash tools/h200_runs.sh v17-a          # session v17: the GPU files v16 left unrun, the attention benchmark
#   bash tools/h200_runs.sh v17-b          # session v17: the attention's wgmma form: tests, benchmark, round A/B
#   bash tools/h200_runs.sh v18-a          # session v18: the fused head's probe: x's traffic, clocks under load
#   bash tools/h200_runs.sh v18-b          # session v18: the same, the GEMM kept in the builds without selection
#   bash tools/h200_runs.sh v18-c          # session v18: a wgmma group in flight across stages: tests, probe, A/B
#   bash tools/h200_runs.sh v18-d          # session v18: the head prefetched into L2 ahead of the stages
#   bash tools/h200_runs.sh v18-e          # session v18: thresholds shared between the blocks: tests, probe, A/B
#   bash tools/h200_runs.sh v18-f          # session v18: the round A/B, the head Ops' geometries
#   bash tools/h200_runs.sh v18-g          # session v18: the 35B B8 W16 head geometry alone
#   bash tools/h200_runs.sh v19-a          # session v19: v18's unrun GPU files (head, round), the 35B B8 W16 head
#                                          # geometry beside them, the 35B B8 W16 round's kernel trace
#   bash tools/h200_runs.sh v19-b          # session v19: the head's thresholds zeroed on a branch of the round's graph:
#                                          # its tests, the round A/B against the memset before the head, the trace
#                                          # (slower, reverted: check out 91464d7 to rerun)
#   bash tools/h200_runs.sh v19-c          # session v19: the head's thresholds zeroed by the kernel's last block: the
#                                          # head / round tests, the round and Op A/Bs against the memset, the head
#                                          # Ops' geometries beside them
#   bash tools/h200_runs.sh v19-d          # session v19: the final tree: FastRound's tests, the CLI suites of the fast
#                                          # mode and of FastRound, the 35B B8 W16 round's trace
#   bash tools/h200_runs.sh v19-e          # session v19: each consumer thread fences before the head's zeroing count:
#                                          # the head's and the round's tests, the round A/B
#   bash tools/h200_runs.sh v20-a          # session v20: the attention's splits merged by their last block: the round
#                                          # A/B against the combine kernel, the fused combine's GPU tests (slower,
#                                          # reverted: check out cec4461 to rerun). v20-b..d ran by hand at 57411bc:
#                                          # python -m benchmarks.fused_combine_probe; benchmarks.attn_phases --wgmma
#                                          # on [--define=-DFA_FC_PROBE=5 or 6]; benchmarks.profile_round (35B 8x16)
#   bash tools/h200_runs.sh v20-e          # session v20: the combine kernel in one pass: its A/B against 498d94b's
#                                          # (bits, us), the round A/B, the attention tests. v20-e/f/g read 498d94b's
#                                          # source from h200-in/ (untracked; make it before the device call:
#                                          # mkdir -p h200-in && git show 498d94b:kernels_cu/fast_attention.cu \
#                                          #   > h200-in/fast_attention_498d94b.cu)
#   bash tools/h200_runs.sh v20-f          # session v20: the final tree's combine A/B, changed attention tests, the
#                                          # round A/B again, FastRound's GPU tests
#   bash tools/h200_runs.sh v20-g          # session v20: the combine's 16-split instance: combine A/B, tests, round A/B
#   bash tools/h200_runs.sh v20-h          # session v20: the head and block GPU tests, the 35B B8 W16 trace
#   bash tools/h200_runs.sh v21-a          # session v21: the round without one glue kernel at a time (timing probes)
#   bash tools/h200_runs.sh v21-cublas     # session v21: do cuBLAS's GEMMs wait behind a programmatic graph edge?
#   bash tools/h200_runs.sh v21-b          # session v21 (trees named in the section; the fused attention was dropped):
#                                          # q / k normalized in the attention: tests, round A/B, trace
#   bash tools/h200_runs.sh v21-c          # session v21: attention_qkv's second form: probe, tests, round A/B
#   bash tools/h200_runs.sh v21-d          # session v21: attention_qkv's phases, the 35B round traces
#   bash tools/h200_runs.sh v21-e          # session v21: attention_qkv's fourth form: probe, phases, tests, round A/B
#   bash tools/h200_runs.sh v21-f          # session v21: attention_qkv with and without PDL, the 35B traces
#   bash tools/h200_runs.sh v21-g          # session v21: the 35B B8 layer GEMMs' K splits, round A/B
#   bash tools/h200_runs.sh v21-h          # session v21: 35B masked_block B8 W16 geometry with the o / down splits at 2
#   bash tools/h200_runs.sh v22-a          # session v22 at tree 672cae9 (ring_prefetch, dropped after this run): the
#                                          # ring tiles asked into L2 ahead of the attention, 35B round A/B; test_pdl
#   bash tools/h200_runs.sh v22-b          # session v22: test_pdl, the rounds, the head's growth against the GEMM
#                                          # alone, the 35B masked_block geometry at B8 W8
#   bash tools/h200_runs.sh v22-e          # session v22: the head Ops and the attention against torch eager, one run
#   bash tools/h200_runs.sh v22-c          # session v22: the 35B rounds; the GPU tests of the attention, head, block
#                                          # and round; v22-d: the 35B rounds; every other GPU test file
#   bash tools/h200_runs.sh v16-b          # session v16: the head's and fast_wgemm's GPU tests, the head-form round A/B
#   bash tools/h200_runs.sh v9-lt          # session v9 after the review: the head GEMM's and FastRound's GPU
#                                          # tests, FastRound's CLI suite, the head A/B (logs.tgz)
set -uo pipefail
OUT=${OUT:-h200-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: some steps run from .carry/<tree>
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=python3
rc=0
step() {  # name, command...: run it, log it, keep going, remember a failure
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$OUT/$name.log" 2>&1
  local r=$?
  [ $r -ne 0 ] && rc=1
  printf '%-22s rc=%d %4ds  %s\n' "$name" "$r" "$((SECONDS - t0))" "$(tail -n 1 "$OUT/$name.log" | cut -c1-150)"
}
head_geos() {  # deadline (s): the fast mode's geometries of the head Ops, three processes at once, then a line each
  local deadline=$1 name
  geo() {
    OMP_NUM_THREADS=5 OPENBLAS_NUM_THREADS=5 timeout "$deadline" $PY -m conformance.cli geometry \
      --impl kernels_cu.fast:FastCudaBackend "$@" >"$OUT/geo_$name.log" 2>&1 &
  }
  name=35b; geo --geometry dflash-35b-a3b --ops proposal_head --json "$OUT/geo_35b.json"
  name=27b-b1; geo --geometry dflash2-27b --batch 1 --ops candidate_topk --json "$OUT/geo_27b_b1.json"
  name=27b-b8w16; geo --geometry dflash2-27b --batch 8 --width 16 --ops candidate_topk --json "$OUT/geo_27b_b8w16.json"
  wait
  for f in "$OUT"/geo_*.log; do printf '%-22s %s\n' "$(basename "$f")" "$(grep -cE '^(PASS|ACCEPTABLE) ' "$f") ok, \
    $(grep -cE '^(FAIL|ERROR) ' "$f") bad; $(tail -n 1 "$f" | cut -c1-100)"; done
}
v10_perf() {  # rounds: the round A/B (PDL off / on), the bench of the block and the rounds, the trace
  step round-ab timeout 150 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs nopdl,default --rounds "$1" \
    --json "$OUT/round_ab.json"
  step bench timeout 200 $PY -m benchmarks.gpu_bench --no-exact --ops masked_block,proposal_round \
    --json "$OUT/bench.json"
  step profile timeout 60 $PY -m benchmarks.profile_round --no-gemm-probe --top 4 --json "$OUT/profile.json"
}
round_steps() {  # the round bench (masked_block, proposal_round; fast mode and torch) and its kernel trace
  step bench-round timeout 70 $PY -m benchmarks.gpu_bench --no-exact --ops masked_block,proposal_round \
    --json "$OUT/bench.json"
  step profile timeout 45 $PY -m benchmarks.profile_round --no-gemm-probe --top 4 --json "$OUT/profile.json"
}
for what in "$@"; do
  V9_SKIP_TESTS=
  case $what in
    gpu-tests)
      step gpu-tests env ROUND_SUITE_REPORT="$OUT/round_suite.json" FAST_SUITE_REPORT="$OUT/fast_suite.json" \
        FAST_ROUND_REPORT="$OUT/fast_round_suite.json" $PY -m pytest -q -p no:cacheprovider tests/gpu ;;
    suites)
      step suite-exact $PY -m conformance.cli run --json "$OUT/suite_exact.json"
      step suite-fast $PY -m conformance.cli run --impl kernels_cu.fast:FastCudaBackend --json "$OUT/suite_fast.json"
      step suite-round $PY -m conformance.cli run --impl kernels_cu.round:CudaRound \
        --ops proposal_round,speculative_step --json "$OUT/suite_round.json"
      step suite-fast-round $PY -m conformance.cli run --impl kernels_cu.fast_round:FastRound \
        --ops proposal_round,speculative_step --json "$OUT/suite_fast_round.json" ;;
    torch)
      step torch-controls $PY -m tests.controls.test_controls --torch cuda --only-torch
      step torch-capture $PY -m examples.torch_capture_engine /tmp/cap --device cuda
      step torch-check $PY -m conformance.cli check-capture /tmp/cap
      step torch-capture-bug $PY -m examples.torch_capture_engine /tmp/capbug --device cuda --bug context_kv
      step torch-check-bug $PY -m conformance.cli check-capture /tmp/capbug ;;
    bench)
      step bench $PY -m benchmarks.gpu_bench --json "$OUT/bench.json" ;;
    geometry-fast)
      step geometry-fast $PY -m conformance.cli geometry --impl kernels_cu.fast:FastCudaBackend \
        --json "$OUT/geometry_fast.json" ;;
    fast-v5)
      step gpu-tests-v5 timeout 175 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_block.py \
        tests/gpu/test_fast_round.py tests/gpu/test_fast_selector.py tests/gpu/test_fast_topk.py \
        tests/gpu/test_fast_backend.py tests/gpu/test_kernels_select.py
      step suite-fast timeout 60 $PY -m conformance.cli run --impl kernels_cu.fast:FastCudaBackend \
        --json "$OUT/suite_fast.json"
      step suite-fast-round timeout 45 $PY -m conformance.cli run --impl kernels_cu.fast_round:FastRound \
        --ops proposal_round,speculative_step --json "$OUT/suite_fast_round.json"
      round_steps ;;
    v6-d)
      step gpu-tests-v6d timeout 330 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_topk.py \
        tests/gpu/test_fast_attention.py tests/gpu/test_fast_block.py tests/gpu/test_fast_round.py
      step topk-ab timeout 60 $PY -m benchmarks.topk_ab --rows 7,120 --blocks 2112,528 --json "$OUT/topk_ab.json"
      step attn-phases timeout 60 $PY -m benchmarks.attn_phases --json "$OUT/attn_phases.json"
      step attn timeout 60 $PY -m benchmarks.bench_fast_attention --cupti --json "$OUT/attn.json"
      round_steps ;;
    v6-final)
      step gpu-tests-v6f timeout 200 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_topk.py \
        tests/gpu/test_fast_round.py tests/gpu/test_fast_backend.py
      step suite-fast timeout 70 $PY -m conformance.cli run --impl kernels_cu.fast:FastCudaBackend \
        --json "$OUT/suite_fast.json"
      step suite-fast-round timeout 50 $PY -m conformance.cli run --impl kernels_cu.fast_round:FastRound \
        --ops proposal_round,speculative_step --json "$OUT/suite_fast_round.json"
      step topk-ab timeout 30 $PY -m benchmarks.topk_ab --rows 7,120 --json "$OUT/topk_ab.json"
      step bench timeout 150 $PY -m benchmarks.gpu_bench --no-exact \
        --ops candidate_topk,proposal_head,draft_attention,masked_block,proposal_round --json "$OUT/bench.json"
      step profile timeout 45 $PY -m benchmarks.profile_round --no-gemm-probe --top 4 --json "$OUT/profile.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v7-tests)
      step gpu-tests-v7 timeout 330 $PY -m pytest -q -p no:cacheprovider tests/gpu
      step suite-fast timeout 90 $PY -m conformance.cli run --impl kernels_cu.fast:FastCudaBackend \
        --json "$OUT/suite_fast.json"
      step suite-fast-round timeout 60 $PY -m conformance.cli run --impl kernels_cu.fast_round:FastRound \
        --ops proposal_round,speculative_step --json "$OUT/suite_fast_round.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v7-bench)
      step bench timeout 150 $PY -m benchmarks.gpu_bench --no-exact --ops masked_block,proposal_round \
        --json "$OUT/bench.json"
      step round-ab timeout 120 $PY -m benchmarks.round_ab --rounds 3 --json "$OUT/round_ab.json"
      step profile timeout 60 $PY -m benchmarks.profile_round --no-gemm-probe --top 4 --json "$OUT/profile.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v7-a)
      step gpu-tests-v7a timeout 240 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_block.py \
        tests/gpu/test_fast_attention.py tests/gpu/test_fast_round.py
      step glue timeout 60 $PY -m benchmarks.glue_probe
      step round-ab timeout 200 $PY -m benchmarks.round_ab --rounds 3 --json "$OUT/round_ab.json"
      step profile timeout 60 $PY -m benchmarks.profile_round --no-gemm-probe --top 4 --json "$OUT/profile.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v8-geo-sel)
      GEO_DEADLINE=${GEO_DEADLINE:-560}
      step sel-bench timeout 150 $PY -m benchmarks.bench_fast_selector --json "$OUT/sel_bench.json"
      geo() {  # name, geometry arguments...: one geometry process in the background, 4 BLAS threads
        local name=$1; shift
        OMP_NUM_THREADS=4 OPENBLAS_NUM_THREADS=4 MKL_NUM_THREADS=4 timeout $((GEO_DEADLINE - SECONDS)) \
          $PY -m conformance.cli geometry --impl kernels_cu.fast:FastCudaBackend "$@" \
          --json "$OUT/geo_$name.json" >"$OUT/geo_$name.log" 2>&1 &
      }
      geo 35b --geometry dflash-35b-a3b
      geo 27b-b1 --geometry dflash2-27b --batch 1
      geo 27b-b8w8 --geometry dflash2-27b --batch 8 --width 8 --ops masked_block candidate_topk candidate_selector
      geo 27b-b8w16 --geometry dflash2-27b --batch 8 --width 16 --ops masked_block candidate_topk candidate_selector
      step sel-tests timeout 240 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_selector.py \
        tests/test_fast_selector_plan.py
      wait
      for f in "$OUT"/geo_*.log; do printf '%-22s %s\n' "$(basename "$f")" "$(grep -cE '^(PASS|ACCEPTABLE) ' "$f") ok, \
$(grep -cE '^(FAIL|ERROR) ' "$f") FAIL/ERROR, last: $(tail -n 1 "$f" | cut -c1-90)"; done
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v8-final)
      step gpu-tests-v8 timeout 330 env FAST_SUITE_REPORT="$OUT/fast_suite_pytest.json" \
        FAST_ROUND_REPORT="$OUT/fast_round_suite_pytest.json" $PY -m pytest -q -p no:cacheprovider tests/gpu
      step suite-fast timeout 90 $PY -m conformance.cli run --impl kernels_cu.fast:FastCudaBackend \
        --json "$OUT/suite_fast.json"
      step suite-fast-round timeout 60 $PY -m conformance.cli run --impl kernels_cu.fast_round:FastRound \
        --ops proposal_round,speculative_step --json "$OUT/suite_fast_round.json"
      step bench timeout 200 $PY -m benchmarks.gpu_bench --no-exact --ops candidate_topk,masked_block,proposal_round \
        --json "$OUT/bench.json"
      step profile timeout 60 $PY -m benchmarks.profile_round --no-gemm-probe --top 4 --json "$OUT/profile.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v8-combine)
      git show bc06c16:kernels_cu/fast_attention.cu >"$OUT/fast_attention_bc06c16.cu" 2>/dev/null \
        || cp "${BEFORE_FA:-kernels_cu/fast_attention.cu}" "$OUT/fast_attention_bc06c16.cu"
      step combine-ab timeout 90 $PY -m benchmarks.combine_ab --before "$OUT/fast_attention_bc06c16.cu" \
        --json "$OUT/combine_ab.json"
      step suite-fast timeout 90 $PY -m conformance.cli run --impl kernels_cu.fast:FastCudaBackend \
        --json "$OUT/suite_fast.json"
      step suite-fast-round timeout 60 $PY -m conformance.cli run --impl kernels_cu.fast_round:FastRound \
        --ops proposal_round,speculative_step --json "$OUT/suite_fast_round.json"
      step bench timeout 200 $PY -m benchmarks.gpu_bench --no-exact --ops masked_block,proposal_round \
        --json "$OUT/bench.json"
      step profile timeout 60 $PY -m benchmarks.profile_round --no-gemm-probe --top 4 --json "$OUT/profile.json"
      step gpu-tests-v8c timeout 330 env FAST_SUITE_REPORT="$OUT/fast_suite_pytest.json" \
        FAST_ROUND_REPORT="$OUT/fast_round_suite_pytest.json" $PY -m pytest -q -p no:cacheprovider tests/gpu
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v9-a)  # session v9: the attention pipeline and the tuned head GEMM (tests, round A/B), the attention's
           # phases, the L2 prefetch probe
      step attn-lt-tests timeout 300 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_attention.py \
        tests/gpu/test_fast_lt.py
      step round-ab timeout 300 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs stages2,head_gemmex,auto \
        --rounds 3 --json "$OUT/round_ab.json"
      step phases timeout 90 $PY -m benchmarks.attn_phases --json "$OUT/phases.json"
      step l2probe timeout 150 $PY -m benchmarks.l2_prefetch_probe --json "$OUT/l2probe.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v9-b)  # session v9: the cluster-merged attention (tests, round A/B against the combine kernel, trace)
      step attn-lt-tests timeout 300 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_attention.py \
        tests/gpu/test_fast_lt.py
      step round-ab timeout 240 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs nocluster,auto \
        --rounds 3 --json "$OUT/round_ab.json"
      step profile timeout 60 $PY -m benchmarks.profile_round --no-gemm-probe --top 4 --json "$OUT/profile.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v9-lt)  # session v9, after the review: the head GEMM's tests and FastRound's (the per-shape cache, the
            # fallback), FastRound's CLI suite
      step lt-tests timeout 300 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_lt.py \
        tests/gpu/test_fast_round.py
      step suite-fast-round timeout 90 $PY -m conformance.cli run --impl kernels_cu.fast_round:FastRound \
        --ops proposal_round,speculative_step --json "$OUT/suite_fast_round.json"
      step round-ab timeout 200 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs head_gemmex,v7 --rounds 2 \
        --json "$OUT/round_ab.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v10-a)  # session v10: programmatic dependent launch (kernels_cu/pdl.py): its GPU tests, the round A/B
            # against ordinary launches, the trace, then the attention / block / round GPU tests
      step pdl-tests timeout 120 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_pdl.py
      step round-ab timeout 240 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs nopdl,default --rounds 2 \
        --json "$OUT/round_ab.json"
      step profile timeout 60 $PY -m benchmarks.profile_round --no-gemm-probe --top 4 --json "$OUT/profile.json"
      step gpu-tests timeout 240 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_attention.py \
        tests/gpu/test_fast_block.py tests/gpu/test_fast_round.py
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v10-final)  # session v10, the final kernels: every GPU test, both CLI suites of the fast mode
      step gpu-tests timeout 330 env FAST_ROUND_REPORT="$OUT/fast_round_suite_pytest.json" \
        $PY -m pytest -q -p no:cacheprovider tests/gpu
      step suite-fast-round timeout 80 $PY -m conformance.cli run --impl kernels_cu.fast_round:FastRound \
        --ops proposal_round,speculative_step --json "$OUT/suite_fast_round.json"
      step suite-fast timeout 120 $PY -m conformance.cli run --impl kernels_cu.fast:FastCudaBackend \
        --json "$OUT/suite_fast.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v10-bench)  # session v10: masked_block at the 35B geometry (the attention kernel changed; the geometry's Ops have
                # no draft_attention of their own), the round A/B against ordinary launches, the bench of the block
                # and the rounds, the trace
      step geo-35b-block timeout 200 $PY -m conformance.cli geometry --impl kernels_cu.fast:FastCudaBackend \
        --geometry dflash-35b-a3b --ops masked_block --jobs 4 --json "$OUT/geometry_35b_block.json"
      v10_perf 3
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v10-lo)  # session v10, the graph's PDL edges relaxed to launch order from 64 rows: PDL and FastRound GPU tests,
             # FastRound's CLI suite, the round A/B, the bench of the block and the rounds, the trace
      step pdl-round-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_pdl.py \
        tests/gpu/test_fast_round.py
      step suite-fast-round timeout 60 $PY -m conformance.cli run --impl kernels_cu.fast_round:FastRound \
        --ops proposal_round,speculative_step --json "$OUT/suite_fast_round.json"
      v10_perf 2
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v11-a)  # session v11: the layer GEMMs at few rows on fast_gemv.cu, staged before the wait
      step gemv-tests timeout 240 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_gemv.py \
        ${V11_TESTS:-tests/gpu/test_pdl.py tests/gpu/test_fast_block.py tests/gpu/test_fast_round.py}
      step round-ab timeout 240 $PY -m benchmarks.round_ab --shapes 1x8 \
        --configs ${V11_CONFIGS:-cublas_layers,gemv_nostage,gemv_nopdl,default} --rounds 3 --json "$OUT/round_ab.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v11-final)  # session v11: the round against the v10 tree on this machine, the GPU tests of every kernel the
                # session changed, the fast mode's CLI suites
      if [ -d .carry/v10tree ]; then
        (cd .carry/v10tree && PYTHONPATH=$PWD step round-ab-v10tree timeout 100 $PY -m benchmarks.round_ab \
          --shapes 1x8,8x16 --configs default --rounds 3 --json "$OUT/round_ab_v10tree.json")
      fi
      step round-ab timeout 120 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs default,early_table_all,cublas_layers \
        --rounds 3 --json "$OUT/round_ab.json"
      step gpu-tests timeout 240 env FAST_ROUND_REPORT="$OUT/fast_round_suite_pytest.json" $PY -m pytest -q \
        -p no:cacheprovider tests/gpu/test_fast_gemv.py tests/gpu/test_pdl.py tests/gpu/test_fast_block.py \
        tests/gpu/test_fast_round.py tests/gpu/test_fast_attention.py
      step suite-fast timeout 120 $PY -m conformance.cli run --impl kernels_cu.fast:FastCudaBackend \
        --json "$OUT/suite_fast.json"
      step suite-fast-round timeout 80 $PY -m conformance.cli run --impl kernels_cu.fast_round:FastRound \
        --ops proposal_round,speculative_step --json "$OUT/suite_fast_round.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v12-final)  # session v12 (two device calls: V12_PART unset, then V12_PART=geo)
      if [ "${V12_PART:-}" = geo ]; then
        step geo-35b-block timeout 300 $PY -m conformance.cli geometry --impl kernels_cu.fast:FastCudaBackend \
          --geometry dflash-35b-a3b --ops masked_block --jobs 4 --json "$OUT/geometry_35b_block.json"
        step bench timeout 200 $PY -m benchmarks.gpu_bench --no-exact --ops masked_block,proposal_round \
          --json "$OUT/bench.json"
        step profile timeout 60 $PY -m benchmarks.profile_round --no-gemm-probe --shapes 1x8 \
          --geometries dflash-35b-a3b --sequence --json "$OUT/profile.json"
      else
        if [ -d .carry/v11tree ]; then
          (cd .carry/v11tree && PYTHONPATH=$PWD step round-ab-v11tree timeout 100 $PY -m benchmarks.round_ab \
            --shapes 1x8,8x16 --configs default --rounds 3 --json "$OUT/round_ab_v11tree.json")
        fi
        step round-ab timeout 120 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs default,gemv_noact \
          --rounds 3 --json "$OUT/round_ab.json"
        step block-round-tests timeout 200 env FAST_ROUND_REPORT="$OUT/fast_round_suite_pytest.json" $PY -m pytest \
          -q -p no:cacheprovider tests/gpu/test_fast_block.py tests/gpu/test_fast_round.py
        step suite-fast timeout 120 $PY -m conformance.cli run --impl kernels_cu.fast:FastCudaBackend \
          --json "$OUT/suite_fast.json"
        step suite-fast-round timeout 80 $PY -m conformance.cli run --impl kernels_cu.fast_round:FastRound \
          --ops proposal_round,speculative_step --json "$OUT/suite_fast_round.json"
      fi
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v11-check)  # the first thing to run after session v11 (its last GPU test never ran on a GPU)
      step gemv-pdl-tests timeout 200 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_gemv.py \
        tests/gpu/test_pdl.py
      step round-ab timeout 120 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs default,cublas_layers \
        --rounds 3 --json "$OUT/round_ab.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v9-bench) V9_SKIP_TESTS=1 ;&
    v9-final)  # session v9: the final tree (the tuned head GEMM in FastRound and proposal_head): every GPU test,
               # FastRound's CLI suite, the fast mode's CLI suite, proposal_head at the 35B geometry, the bench
               # of proposal_head, the block and the rounds, the trace
      [ -n "${V9_SKIP_TESTS:-}" ] || step gpu-tests-v9 timeout 420 env FAST_ROUND_REPORT="$OUT/fast_round_suite_pytest.json" \
        $PY -m pytest -q -p no:cacheprovider tests/gpu
      [ -n "${V9_SKIP_TESTS:-}" ] || step suite-fast-round timeout 90 $PY -m conformance.cli run \
        --impl kernels_cu.fast_round:FastRound --ops proposal_round,speculative_step --json "$OUT/suite_fast_round.json"
      [ -n "${V9_SKIP_TESTS:-}" ] || step suite-fast timeout 120 $PY -m conformance.cli run --impl kernels_cu.fast:FastCudaBackend \
        --json "$OUT/suite_fast.json"
      [ "${V9_PART:-}" = tests ] && { tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ; continue; }
      step geo-35b-head timeout 300 $PY -m conformance.cli geometry --impl kernels_cu.fast:FastCudaBackend \
        --geometry dflash-35b-a3b --ops proposal_head --jobs 4 --json "$OUT/geometry_35b_head.json"
      step bench timeout 300 $PY -m benchmarks.gpu_bench --no-exact --ops proposal_head,masked_block,proposal_round \
        --json "$OUT/bench.json"
      step profile timeout 60 $PY -m benchmarks.profile_round --no-gemm-probe --top 4 --json "$OUT/profile.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v6-attn)
      step attn-sweep timeout 200 $PY -m benchmarks.bench_fast_attention --sweep --cupti --json "$OUT/attn.json" ;;
    v13-head)  # session v13: the fused head (kernels_cu/fast_head.py): its GPU tests, the probe, the A/B (alone on the
      # GPU), then the geometries whose Ops it serves (27B candidate_topk at B1 and B8 W16, 35B proposal_head: three
      # processes at once) beside the fast suite
      geo() {
        OMP_NUM_THREADS=5 OPENBLAS_NUM_THREADS=5 timeout 330 $PY -m conformance.cli geometry \
          --impl kernels_cu.fast:FastCudaBackend "$@" >"$OUT/geo_$name.log" 2>&1 &
      }
      step head-tests timeout 120 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step head-probe timeout 90 $PY -m benchmarks.fast_head_probe --json "$OUT/probe.json"
      step head-ab timeout 120 $PY -m benchmarks.head_topk_ab --rows 7,15,56,120 --reps 11 --json "$OUT/head_ab.json"
      name=35b; geo --geometry dflash-35b-a3b --ops proposal_head --json "$OUT/geo_35b.json"
      name=27b-b1; geo --geometry dflash2-27b --batch 1 --ops candidate_topk --json "$OUT/geo_27b_b1.json"
      name=27b-b8w16; geo --geometry dflash2-27b --batch 8 --width 16 --ops candidate_topk \
        --json "$OUT/geo_27b_b8w16.json"
      step fast-suite env FAST_SUITE_REPORT="$OUT/fast_suite.json" timeout 150 $PY -m pytest -q -p no:cacheprovider \
        tests/gpu/test_fast_backend.py
      wait
      for f in "$OUT"/geo_*.log; do printf '%-22s %s\n' "$(basename "$f")" "$(grep -cE '^(PASS|ACCEPTABLE) ' "$f") ok, \
        $(grep -cE '^(FAIL|ERROR) ' "$f") bad; $(tail -n 1 "$f" | cut -c1-100)"; done
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v14-a)  # session v14: the ping-pong fused head (probe first, under timeouts: v13's version hung), its GPU tests
      # (both kernels; the single-tile kernel's only if the ping-pong probe failed), the A/B, and the GPU tests of
      # v13's last unrun edits (fast.merge_into, FastRound's fused_head off)
      step pp-probe timeout 60 $PY -m benchmarks.fast_head_probe --only base,stream,pingpong,pp_no_epilogue,pp_stream \
        --json "$OUT/probe.json"
      sel=""; grep -q pingpong "$OUT/probe.json" 2>/dev/null || sel="-k single"
      step head-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py $sel
      step head-ab timeout 120 $PY -m benchmarks.head_topk_ab --rows 7,15,56,120 --reps 11 --json "$OUT/head_ab.json"
      step sel-tests timeout 200 $PY -m pytest -q -p no:cacheprovider -x tests/gpu/test_fast_topk.py \
        tests/gpu/test_fast_round.py tests/gpu/test_fast_backend.py
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v14-b)  # session v14: one claim a thread and hidden row (both kernels), the ping-pong kernel's clocks: the probe,
      # the fused head's GPU tests, the A/B. Ran on a761c17; the batched claims were reverted after it
      step probe timeout 90 $PY -m benchmarks.fast_head_probe --only base,stream,pingpong,pp_clocks,clocks \
        --json "$OUT/probe.json"
      step head-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step head-ab timeout 120 $PY -m benchmarks.head_topk_ab --rows 7,15,56,120 --reps 11 --json "$OUT/head_ab.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz probe.log head-tests.log head-ab.log ;;
    v14-c)  # session v14: the ping-pong kernel selecting from logits staged in shared memory (a warp a hidden row):
      # the probe, the fused head's GPU tests (both kernels), the A/B
      step probe timeout 120 $PY -m benchmarks.fast_head_probe \
        --only base,stream,pingpong,pp_no_epilogue,pp_stream,pp_stages3,pp_clocks --json "$OUT/probe.json"
      step head-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step head-ab timeout 120 $PY -m benchmarks.head_topk_ab --rows 7,15,56,120 --reps 11 --json "$OUT/head_ab.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz probe.log head-tests.log head-ab.log ;;
    v14-d)  # session v14: the ping-pong selection HP_R rows at a time, ballot slots, accumulators dead across it
      # (ran on cced0b9; HP_R and the pp_r* variants went in 7c3762e, so on later trees those rows are skipped)
      step probe timeout 120 $PY -m benchmarks.fast_head_probe \
        --only base,stream,pingpong,pp_no_epilogue,pp_r1,pp_r8,pp_clocks --json "$OUT/probe.json"
      step head-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step head-ab timeout 120 $PY -m benchmarks.head_topk_ab --rows 7,15,56,120 --reps 11 --json "$OUT/head_ab.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz probe.log head-tests.log head-ab.log ;;
    v14-e)  # session v14: the ping-pong selection a row at a time, keys compared branch-free, the first tile's
      # thresholds by bisection (no compaction there)
      step probe timeout 120 $PY -m benchmarks.fast_head_probe \
        --only stream,pingpong,pp_no_epilogue,pp_nomma_clocks,pp_clocks --json "$OUT/probe.json"
      step head-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step head-ab timeout 120 $PY -m benchmarks.head_topk_ab --rows 7,15,56,120 --reps 11 --json "$OUT/head_ab.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz probe.log head-tests.log head-ab.log ;;
    v14-f)  # session v14: the first threshold from the lanes' maxima (or by bisection), the ping-pong timeline
      step probe timeout 120 $PY -m benchmarks.fast_head_probe \
        --only stream,pingpong,pp_clocks,pp_bisect,pp_bisect_clocks --json "$OUT/probe.json"
      step head-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py -k pingpong
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz probe.log head-tests.log ;;
    v14-g)  # session v14: the next row's loads ahead, the block's last tile selected by both warpgroups
      step probe timeout 120 $PY -m benchmarks.fast_head_probe \
        --only stream,pingpong,pp_no_epilogue,pp_clocks --json "$OUT/probe.json"
      step head-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step head-ab timeout 120 $PY -m benchmarks.head_topk_ab --rows 1,7,15,56,120,128 --reps 11 --json "$OUT/head_ab.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz probe.log head-tests.log head-ab.log ;;
    v14-h)  # session v14: the ping-pong kernel routed for both Ops at every row count, and in FastRound's graph (device-
      # resident tensor maps): the fused head's, the round's and the fast backend's GPU tests, the head A/B, the round
      # A/B (fused against unfused), then the geometries of the head Ops (three processes) beside the CLI fast suite
      step head-tests timeout 120 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step round-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_round.py \
        tests/gpu/test_fast_backend.py
      step head-ab timeout 60 $PY -m benchmarks.head_topk_ab --rows 1,7,15,56,120,128 --reps 11 --json "$OUT/head_ab.json"
      step round-ab timeout 150 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs head_unfused,default --rounds 3 \
        --json "$OUT/round_ab.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v14-geo)  # session v14: the geometries whose Ops the routed kernel serves (27B candidate_topk B1 and B8 W16, 35B
      # proposal_head: three processes at once) beside the CLI fast suite (tests/gpu/test_fast_backend.py's report)
      head_geos 300
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v15-a)  # session v15: the ping-pong kernel's selection a lane a hidden row (hp_select_lanes; first run at ec31ad3, the
      # final one at the tree that reports it): the fused head's GPU
      # tests, the probe (27B and the 35B head's H 2048) against the warp form, the head A/B, the round A/B (warp form,
      # lane form, unfused head) in one process, the round's GPU tests
      step head-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step probe timeout 150 $PY -m benchmarks.fast_head_probe --only pingpong,pp_warp_rows,pp_pair,pp_clocks,pp_stream \
        --json "$OUT/probe.json"
      step probe35 timeout 90 $PY -m benchmarks.fast_head_probe --hidden 2048 --only pingpong,pp_warp_rows,pp_clocks,pp_stream \
        --json "$OUT/probe35.json"
      step head-ab timeout 90 $PY -m benchmarks.head_topk_ab --rows 1,7,15,56,120,128 --reps 11 --json "$OUT/head_ab.json"
      step round-ab timeout 200 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs head_warp_rows,default,head_unfused \
        --rounds 3 --json "$OUT/round_ab.json"
      tar -C "$OUT" -czf "$OUT/logs.tgz" --exclude=logs.tgz . ;;
    v15-geo)  # session v15: the head Ops' geometries with the lane-form selection (27B candidate_topk B1 and B8 W16, 35B
      # proposal_head: three processes at once), cut at GEO_DEADLINE s (default 370)
      head_geos "${GEO_DEADLINE:-370}" ;;
    v15-e)  # session v15: the lane form's tile-end compaction (HP_TILE_COMPACT): the fused head's GPU tests, the probe
      # against the form without it (27B and the 35B head's H 2048), the head A/B, the round A/B
      step head-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step probe timeout 120 $PY -m benchmarks.fast_head_probe --only pingpong,pp_tc0,pp_clocks,pp_tc0_clocks \
        --json "$OUT/probe.json"
      step probe35 timeout 90 $PY -m benchmarks.fast_head_probe --hidden 2048 --only pingpong,pp_tc0,pp_clocks,pp_tc0_clocks \
        --json "$OUT/probe35.json"
      step head-ab timeout 90 $PY -m benchmarks.head_topk_ab --rows 1,7,15,56,120,128 --reps 11 --json "$OUT/head_ab.json"
      step round-ab timeout 150 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs head_warp_rows,default \
        --rounds 3 --json "$OUT/round_ab.json" ;;
    v15-f)  # session v15: the lane form's seed and tile-end insertions in k steps, warps without a live row skipped:
      # the fused head's GPU tests, the round A/B, the head A/B
      step head-tests timeout 100 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step round-ab timeout 80 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs head_warp_rows,default \
        --rounds 3 --json "$OUT/round_ab.json"
      step head-ab timeout 40 $PY -m benchmarks.head_topk_ab --rows 1,7,15,56,120,128 --reps 11 --json "$OUT/head_ab.json" ;;
    v16-a)  # session v16: fast_wgemm (the layer GEMMs at 17..128 rows on wgmma): its GPU tests and PDL race, the GEMM A/B
      # against cuBLAS at 128 rows (stages 4 and 6 too), the round A/B against cuBLAS, the v15 head test not run yet
      step wgemm-tests timeout 200 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_wgemm.py \
        "tests/gpu/test_pdl.py::test_wgemm_reads_x_and_writes_its_output_only_after_the_wait"
      step wgemm-ab timeout 120 $PY -m benchmarks.wgemm_ab --rows 128 --stages 4,6 --json "$OUT/wgemm_ab.json"
      step round-ab timeout 120 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs default,wgemm \
        --rounds 3 --json "$OUT/round_ab.json" ;;
    v16-b)  # session v16: fast_wgemm off by default, the fused head's warp form up to 8 rows: the fused head's GPU tests
      # (the warp form's C4 case first run), fast_wgemm's at its final state, the round A/B of the head's forms
      step head-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step wgemm-tests timeout 100 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_wgemm.py \
        "tests/gpu/test_pdl.py::test_wgemm_reads_x_and_writes_its_output_only_after_the_wait"
      step round-ab timeout 120 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs head_lanes_all,default \
        --rounds 3 --json "$OUT/round_ab.json" ;;
    v17-a)  # session v17: the GPU test files not run at v16's final tree (a2379cd), the attention benchmark (before)
      step tests-v16-rest timeout 420 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_pdl.py \
        tests/gpu/test_fast_gemv.py tests/gpu/test_fast_lt.py tests/gpu/test_fast_wgemm.py \
        tests/gpu/test_fast_selector.py tests/gpu/test_fast_target.py tests/gpu/test_kernels_attention.py \
        tests/gpu/test_kernels_select.py tests/gpu/test_philox_gpu.py tests/gpu/test_round_gpu.py
      step attn-bench timeout 120 $PY -m benchmarks.bench_fast_attention --cupti --json "$OUT/attn_bench.json" ;;
    v17-b)  # session v17: the attention's wgmma form: its GPU tests, the attention benchmark (mma / wgmma, 2 and 3
      # stages), the round A/B (run on the unswizzled form at e58c54b, then on the swizzled one at d2ce1cc)
      step attn-tests timeout 300 env FAST_ATTENTION_REPORT="$OUT/attn_report.json" $PY -m pytest -q -p no:cacheprovider \
        tests/gpu/test_fast_attention.py -k "wgmma or nonfinite or graph"
      step attn-bench timeout 150 $PY -m benchmarks.bench_fast_attention --cupti --json "$OUT/attn_bench.json"
      step round-ab timeout 150 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs attn_mma,default,attn_wg_s3 \
        --rounds 3 --json "$OUT/round_ab.json" ;;
    v17-c)  # session v17: why the unswizzled wgmma form was slower: probes without the proxy fence and with the mma.sync
      # kernel's copy mapping, the phases of both forms. Its switches are gone: check out de2c7c6 to rerun (v17-c, v17-d)
      step attn-probe timeout 150 $PY -m benchmarks.bench_fast_attention --cupti --wg-extra=-DFA_WG_FENCE=0 \
        --wg-extra=-DFA_WG_LOADMAP=0 --wg-extra="-DFA_WG_FENCE=0 -DFA_WG_LOADMAP=0" --json "$OUT/attn_probe.json"
      step phases-mma timeout 60 $PY -m benchmarks.attn_phases --json "$OUT/phases_mma.json"
      step phases-wg timeout 60 $PY -m benchmarks.attn_phases --wgmma on --json "$OUT/phases_wg.json" ;;
    v17-d)  # session v17: which of the unswizzled form's two products is slow: QK^T or PV back on mma.sync (ldmatrix from
      # the core-matrix tiles), both; the phases of the wgmma form (tree de2c7c6)
      step attn-probe timeout 150 $PY -m benchmarks.bench_fast_attention --cupti --wg-extra=-DFA_WG_QK=0 \
        --wg-extra=-DFA_WG_PV=0 --wg-extra="-DFA_WG_QK=0 -DFA_WG_PV=0" --json "$OUT/attn_probe.json"
      step phases-wg timeout 60 $PY -m benchmarks.attn_phases --wgmma on --json "$OUT/phases_wg.json" ;;
    v17-e)  # session v17: the mma.sync kernel built and launched as the wgmma form's module (FA_WG_FORM=0), and the core-matrix
      # layout alone (both products on mma.sync, no fence, the mma.sync kernel's copy mapping); tree 43bdac4
      step attn-probe timeout 150 $PY -m benchmarks.bench_fast_attention --cupti --wg-extra=-DFA_WG_FORM=0 \
        --wg-extra="-DFA_WG_QK=0 -DFA_WG_PV=0 -DFA_WG_FENCE=0 -DFA_WG_LOADMAP=0" --json "$OUT/attn_probe.json" ;;
    v17-f)  # session v17: the unswizzled form launched with the mma.sync kernel's dynamic shared memory (FA_PROBE_PAD); tree
      # 43bdac4
      step attn-probe timeout 150 $PY -m benchmarks.bench_fast_attention --cupti --wg-extra=-DFA_PROBE_PAD \
        --wg-extra="-DFA_PROBE_PAD -DFA_WG_QK=0 -DFA_WG_PV=0" --json "$OUT/attn_probe.json" ;;
    v17-g)  # session v17: the swizzled wgmma form on by default: its tests again (the same-bits test fixed), the block and
      # round GPU tests
      step attn-wg-tests timeout 120 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_attention.py -k wgmma
      step block-round-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_block.py \
        tests/gpu/test_fast_round.py ;;
    v18-a)  # session v18: where candidate_topk's growth with the rows comes from: the fused head's probe with x's L2
      # traffic cut (HP_PROBE_X_EVERY), with and without the selection, each variant also run for 1.5 s under nvidia-smi
      step head-probe timeout 500 $PY -m benchmarks.fast_head_probe --sustain 1.5 --only \
        pingpong,pp_no_epilogue,pp_no_epilogue7,pp_stream,pp_stream7,pp_nocand,pp_xhalf,pp_xquarter,pp_xonce,\
pp_xhalf_no_epilogue,pp_clocks,pp_clocks7,pp_xhalf_clocks,pp_nocand_clocks --rows 7,120 --json "$OUT/head_probe.json" ;;
      # (it stopped at the first 7-row variant, whose name made the probe pass no clock buffer: fixed for v18-b)
    v18-b)  # session v18: the same with the GEMM kept in the no-selection builds (v13-v15's had no HGMMA left) and x cut
      step head-probe timeout 500 $PY -m benchmarks.fast_head_probe --sustain 1.5 --only \
        pingpong,pp_no_epilogue,pp_stream,pp_nocand,pp_xhalf,pp_xquarter,pp_xonce,pp_xhalf_no_epilogue,\
pp_xonce_no_epilogue --rows 7,120 --json "$OUT/head_probe.json" ;;
    v18-c)  # session v18: a wgmma group in flight across stages (HP_MMA_INFLIGHT): the fused head's GPU tests, the probe
      # against the serial form (with and without the selection), the Ops' A/B
      step head-tests timeout 200 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step head-probe timeout 300 $PY -m benchmarks.fast_head_probe --sustain 1.5 --only \
        pingpong,pp_serial,pp_no_epilogue,pp_serial_no_epilogue --rows 7,120 --json "$OUT/head_probe.json"
      step head-ab timeout 60 $PY -m benchmarks.head_topk_ab --rows 1,7,15,56,120,128 --reps 11 --json "$OUT/head_ab.json" ;;
      # (the in-flight form was slower everywhere, 0.629 / 0.679 / 0.940 ms at 7 / 120 / 128 rows against 0.611 / 0.658 /
      # 0.713: it holds each buffer until the next stage lands, a stage less of look-ahead; removed after 6ab1787)
    v18-d)  # session v18: the producer's L2 prefetch of the head (HP_L2_AHEAD): the probe at 4..32 stages ahead. Its
      # switch is gone: check out 8ca2f6d to rerun
      step head-probe timeout 400 $PY -m benchmarks.fast_head_probe --sustain 1.5 --only \
        pingpong,pp_no_epilogue,pp_l2a4,pp_l2a8,pp_l2a16,pp_l2a32,pp_l2a16_no_epilogue --rows 7,120,128 \
        --json "$OUT/head_probe.json" ;;
      # (the prefetch was slower at every distance, 0.78-1.10 ms against 0.607 / 0.648 at 7 / 120 rows; removed after
      # 8ca2f6d)
    v18-e)  # session v18: the blocks share their thresholds (HP_SHARED_THR): the fused head's GPU tests, the probe against
      # each block's own thresholds (clocks too), the Ops' A/B, the round A/B
      step head-tests timeout 240 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step head-probe timeout 300 $PY -m benchmarks.fast_head_probe --sustain 1.5 --only \
        pingpong,pp_own_thr,pp_clocks,pp_own_thr_clocks,pp_no_epilogue --rows 7,120,128 --json "$OUT/head_probe.json"
      step head-ab timeout 60 $PY -m benchmarks.head_topk_ab --rows 1,7,15,56,120,128 --reps 11 --json "$OUT/head_ab.json" ;;
    v18-f)  # session v18: the round A/B with and without the shared thresholds, then the head Ops' geometries (27B
      # candidate_topk B1 and B8 W16, 35B proposal_head: three processes at once), cut at GEO_DEADLINE s (default 300)
      step round-ab timeout 170 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs head_own_thr,default --rounds 3 \
        --json "$OUT/round_ab.json"
      head_geos "${GEO_DEADLINE:-300}" ;;
    v18-g)  # session v18: the 35B B8 W16 head geometry alone, cut at 200 s (it ran masked_block B8 W16 first, which took
      # the time; its proposal_head did not finish)
      step geo-35b-b8w16 timeout 200 $PY -m conformance.cli geometry --impl kernels_cu.fast:FastCudaBackend \
        --geometry dflash-35b-a3b --batch 8 --width 16 --ops proposal_head --json "$OUT/geo_35b_b8w16_head.json" ;;
    v19-a)  # session v19: the GPU files v18 left unrun at its final tree (the head tests' refactored helpers, FastRound
      # with shared thresholds), the 35B proposal_head B8 W16 geometry in the background (its CPU reference takes
      # minutes), then the 35B B8 W16 round's kernel sequence
      OMP_NUM_THREADS=8 OPENBLAS_NUM_THREADS=8 timeout 480 $PY -m conformance.cli geometry \
        --impl kernels_cu.fast:FastCudaBackend --geometry dflash-35b-a3b --batch 8 --width 16 --ops proposal_head \
        --json "$OUT/geo_35b_b8w16_head.json" >"$OUT/geo_35b_b8w16_head.log" 2>&1 &
      step head-tests timeout 200 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step round-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_round.py
      step profile timeout 90 $PY -m benchmarks.profile_round --no-gemm-probe --shapes 8x16,1x8 \
        --geometries dflash-35b-a3b --sequence --json "$OUT/profile.json"
      wait
      printf 'geo_35b_b8w16_head: %s ok, %s bad; %s\n' "$(grep -cE '^(PASS|ACCEPTABLE) ' "$OUT/geo_35b_b8w16_head.log")" \
        "$(grep -cE '^(FAIL|ERROR) ' "$OUT/geo_35b_b8w16_head.log")" "$(tail -n 1 "$OUT/geo_35b_b8w16_head.log" | cut -c1-150)" ;;
    v19-b)  # session v19: the fused head's shared thresholds zeroed on a branch of the round's graph (fast_round.
      # ZERO_ON_BRANCH): the round's and the head's tests of the zeroing, FastRound's tests, the round A/B, the trace.
      # The branch was slower (35B B8 W16 0.936 against 0.930 ms) and is gone with its config: check out 91464d7
      step zero-tests timeout 200 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_round.py \
        tests/gpu/test_fast_head.py -k "zero or replay or capture or graph_round"
      step round-ab timeout 200 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs head_zero_inline,default \
        --rounds 3 --json "$OUT/round_ab.json"
      step profile timeout 90 $PY -m benchmarks.profile_round --no-gemm-probe --shapes 8x16 \
        --geometries dflash-35b-a3b --sequence --json "$OUT/profile.json" ;;
    v19-c)  # session v19: the fused head's shared thresholds zeroed by the kernel's last block (fast_head.cu HP_CLEAN), no
      # memset: the head Ops' geometries in the background (three processes, cut at GEO_DEADLINE s, default 330), the
      # head's GPU tests, the round's, the round A/B and the Ops' A/B against v18's memset
      head_geos "${GEO_DEADLINE:-330}" >"$OUT/geos.txt" 2>&1 &
      step head-tests timeout 200 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step round-tests timeout 200 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_round.py
      step round-ab timeout 150 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs head_memset,default \
        --rounds 3 --json "$OUT/round_ab.json"
      wait
      cat "$OUT/geos.txt" ;;
    v19-d)  # session v19: the final tree: FastRound's GPU tests (the round's replay test with its hidden-rows check), the
      # CLI suites of the fast mode and of FastRound, the 35B B8 W16 round's kernel sequence
      step round-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_round.py
      step suite-fast timeout 300 $PY -m conformance.cli run --impl kernels_cu.fast:FastCudaBackend \
        --json "$OUT/suite_fast.json"
      step suite-fast-round timeout 150 $PY -m conformance.cli run --impl kernels_cu.fast_round:FastRound \
        --ops proposal_round,speculative_step --json "$OUT/suite_fast_round.json"
      step profile timeout 90 $PY -m benchmarks.profile_round --no-gemm-probe --shapes 8x16,1x8 \
        --geometries dflash-35b-a3b --json "$OUT/profile.json" ;;
    v19-e)  # session v19: each consumer thread of the fused head fences its own atomics before the block is counted
      # (v19-c/d's build fenced in the counting thread only): the head's and the round's GPU tests, the round A/B
      step head-tests timeout 200 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step round-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_round.py
      step round-ab timeout 150 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs head_memset,default \
        --rounds 3 --json "$OUT/round_ab.json" ;;
    v20-a)  # session v20 (tree cec4461; reverted): the attention's key splits merged by the last split block
      step round-ab timeout 200 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs attn_combine_kernel,default \
        --rounds 3 --json "$OUT/round_ab.json"
      step fused-tests timeout 200 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_attention.py \
        -k "fused or stale or capture_without or graph_replay or split_counts" ;;
    v20-e)  # session v20: the combine kernel's single pass where one batch holds every split
      step combine-ab timeout 120 $PY -m benchmarks.combine_ab --before h200-in/fast_attention_498d94b.cu \
        --json "$OUT/combine_ab.json"
      step round-ab timeout 200 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs combine_two_pass,default \
        --rounds 3 --json "$OUT/round_ab.json"
      step attn-tests timeout 280 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_attention.py ;;
    v20-f)  # session v20, the final tree: the combine's bits against 498d94b's (h200-in/ holds that source), the
      # attention tests changed after v20-e, the round A/B again, FastRound's GPU tests (v19's final edits unrun)
      step combine-ab timeout 90 $PY -m benchmarks.combine_ab --before h200-in/fast_attention_498d94b.cu \
        --json "$OUT/combine_ab.json"
      step attn-tests timeout 90 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_attention.py \
        -k "one_pass or wgmma_cases_exist or two_chunks"
      step round-ab timeout 90 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs combine_two_pass,default \
        --rounds 3 --json "$OUT/round_ab.json"
      step round-tests timeout 170 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_round.py ;;
    v20-g)  # session v20: a combine instance of 16 splits (one pass at 35B B1): its bits and us against 498d94b's,
      # the one-pass test, the round A/B on another machine; the head / block tests and the trace run after v20-f
      step combine-ab timeout 90 $PY -m benchmarks.combine_ab --before h200-in/fast_attention_498d94b.cu \
        --json "$OUT/combine_ab.json"
      step attn-tests timeout 90 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_attention.py \
        -k "one_pass or split_counts"
      step round-ab timeout 100 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs combine_two_pass,default \
        --rounds 3 --json "$OUT/round_ab.json" ;;
    v20-h)  # session v20 (run by hand after v20-f, on the same machine): the head and block GPU tests, the trace
      step head-tests timeout 210 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_head.py
      step block-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_block.py
      step profile timeout 150 $PY -m benchmarks.profile_round --no-gemm-probe --shapes 8x16 \
        --geometries dflash-35b-a3b --sequence ;;
    v21-a)  # session v21: what removing each glue kernel could save at most (timing probes, wrong tokens)
      step round-ab timeout 330 $PY -m benchmarks.round_ab --shapes 1x8,8x16 \
        --configs default,probe_no_qkv_post,probe_no_silu_mul,probe_no_post_norm --rounds 3 --json "$OUT/round_ab.json" ;;
    v21-cublas)  # session v21: whether cuBLAS's GEMM kernels wait for the kernel ahead behind a programmatic edge
      step cublas-pdl timeout 120 $PY -m benchmarks.cublas_pdl_probe ;;
    v21-b)  # session v21 at tree e9d44c4 (git checkout it: the fused attention was dropped after v21-f): q / k
      # normalized and rotated in the attention (attention_qkv, first form): its tests, the round A/B, the trace
      step qkv-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_qkv_attention.py \
        "tests/gpu/test_fast_round.py::test_round_with_qkv_in_the_attention_gives_the_two_kernel_bits"
      step round-ab timeout 150 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs qkv_unfused,default \
        --rounds 3 --json "$OUT/round_ab.json"
      step profile timeout 120 $PY -m benchmarks.profile_round --no-gemm-probe --shapes 8x16 \
        --geometries dflash-35b-a3b --sequence ;;
    v21-c)  # session v21 at trees bc6b029 (attention_qkv's second form: table before the wait, loads at once) and
      # 7ccc874 (third: rsqrt, rows branch-free): alone, tests, round A/B
      step probe timeout 120 $PY -m benchmarks.qkv_attn_probe
      step probe-norows timeout 120 $PY -m benchmarks.qkv_attn_probe --extra=-DFA_QKV_PROBE=1
      step qkv-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_qkv_attention.py \
        "tests/gpu/test_fast_round.py::test_round_with_qkv_in_the_attention_gives_the_two_kernel_bits"
      step round-ab timeout 150 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs qkv_unfused,default \
        --rounds 3 --json "$OUT/round_ab.json" ;;
    v21-d)  # session v21 at tree 5984202: where attention_qkv's time goes: phases against attention_fast's, traces
      step phases timeout 100 $PY -m benchmarks.attn_phases --wgmma on
      step phases-qkv timeout 100 $PY -m benchmarks.attn_phases --wgmma on --qkv
      step profile timeout 150 $PY -m benchmarks.profile_round --no-gemm-probe --shapes 1x8,8x16 \
        --geometries dflash-35b-a3b --sequence ;;
    v21-e)  # session v21 at tree e97487d: attention_qkv's fourth form (the table from fb_rope_table, read before the
      # wait)
      step probe timeout 120 $PY -m benchmarks.qkv_attn_probe
      step phases-qkv timeout 100 $PY -m benchmarks.attn_phases --wgmma on --qkv
      step qkv-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_qkv_attention.py \
        "tests/gpu/test_fast_round.py::test_round_with_qkv_in_the_attention_gives_the_two_kernel_bits"
      step round-ab timeout 150 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs qkv_unfused,default \
        --rounds 3 --json "$OUT/round_ab.json" ;;
    v21-f)  # session v21 at tree 8db3288: attention_qkv's fourth form with and without PDL, the 35B traces
      step round-ab timeout 150 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --geometries dflash-35b-a3b \
        --configs qkv_unfused,qkv_nopdl,default --rounds 2 --json "$OUT/round_ab.json"
      step profile timeout 150 $PY -m benchmarks.profile_round --no-gemm-probe --shapes 1x8,8x16 \
        --geometries dflash-35b-a3b --sequence ;;
    v21-g)  # session v21 at tree c59863a: the 35B layer GEMMs' K splits again (v7 chose them on GEMMs alone, before PDL)
      step round-ab timeout 200 $PY -m benchmarks.round_ab --shapes 8x16 --geometries dflash-35b-a3b \
        --configs default,split_od2,split_o2,split_d2 --rounds 3 --json "$OUT/round_ab.json" ;;
    v21-h)  # session v21: the 35B masked_block geometry at B8 W16 with the o / down GEMMs split in 2 (fast_block's
      # default since v21-g), against the float64 reference (its CPU reference takes ~3 minutes)
      step geo-35b-b8w16-block timeout 280 $PY -m conformance.cli geometry --impl kernels_cu.fast:FastCudaBackend \
        --geometry dflash-35b-a3b --batch 8 --width 16 --ops masked_block --json "$OUT/geo_35b_b8w16_block.json" ;;
    v22-a)  # session v22 at tree 672cae9 (git checkout it: ring_prefetch was dropped after this run): where and how
      # much of the ring to ask into L2 ahead of the attention (round_ab rpf_*), the 35B rounds; test_pdl
      step round-ab timeout 330 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --geometries dflash-35b-a3b \
        --configs default,rpf_norm_t2,rpf_norm_t4,rpf_norm_t8,rpf_norm_t16,rpf_qkv_t2,rpf_qkv_t4,rpf_norm_f2_t4 \
        --rounds 2 --json "$OUT/round_ab.json"
      step pdl-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_pdl.py ;;
    v22-b)  # session v22: test_pdl with the wgmma form accepted; the rounds on this tree; the head Ops' growth with the
      # GEMM alone beside it; the 35B masked_block geometry at B8 W8 (64 rows: the o / down splits at 2, not run in v21)
      step pdl-tests timeout 150 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_pdl.py
      step round-ab timeout 200 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --configs default --rounds 3 \
        --json "$OUT/round_ab.json"
      step head-ab timeout 120 $PY -m benchmarks.head_topk_ab --rows 7,15,56,120 --reps 11 --json "$OUT/head_ab.json"
      step geo-35b-b8w8-block timeout 280 $PY -m conformance.cli geometry --impl kernels_cu.fast:FastCudaBackend \
        --geometry dflash-35b-a3b --batch 8 --width 8 --ops masked_block --json "$OUT/geo_35b_b8w8_block.json" ;;
    v22-c)  # session v22: the 35B rounds on this machine; tests/gpu's four largest files at the final tree
      step round-ab timeout 100 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --geometries dflash-35b-a3b \
        --configs default --rounds 3 --json "$OUT/round_ab.json"
      step gpu-tests-a timeout 480 $PY -m pytest -q -p no:cacheprovider tests/gpu/test_fast_attention.py \
        tests/gpu/test_fast_head.py tests/gpu/test_fast_block.py tests/gpu/test_fast_round.py ;;
    v22-d)  # session v22: the 35B rounds on this machine; every other tests/gpu file at the final tree
      step round-ab timeout 100 $PY -m benchmarks.round_ab --shapes 1x8,8x16 --geometries dflash-35b-a3b \
        --configs default --rounds 3 --json "$OUT/round_ab.json"
      step gpu-tests-b timeout 480 $PY -m pytest -q -p no:cacheprovider tests/gpu \
        --ignore=tests/gpu/test_fast_attention.py --ignore=tests/gpu/test_fast_head.py \
        --ignore=tests/gpu/test_fast_block.py --ignore=tests/gpu/test_fast_round.py ;;
    v22-e)  # session v22: the Ops changed since v12's bench (the fused head v13-v19, the attention v17 / v20) against
      # torch eager in one run
      step bench timeout 240 $PY -m benchmarks.gpu_bench --no-exact --ops proposal_head,candidate_topk,draft_attention \
        --json "$OUT/bench.json" ;;
    *) echo "unknown section $what" >&2; exit 2 ;;
  esac
done
exit $rc
