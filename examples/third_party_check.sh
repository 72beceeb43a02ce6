#!/usr/bin/env bash
# Judge third-party kernels against the golden vectors on a GPU host, in one go:
# PyTorch's scaled_dot_product_attention with each backend forced (MATH, FLASH_ATTENTION,
# EFFICIENT_ATTENTION, CUDNN_ATTENTION; examples/torch_sdpa/sdpa.py) on draft_attention, and
# FlashInfer 0.5.3 (examples/flashinfer/adapter.py) on draft_attention, context_kv,
# target_distribution and speculative_accept (NOT_IMPLEMENTED: its kernel draws its own uniforms),
# plus FlashInfer with the context_kv head norm in PyTorch FP32 (FlashInferTorchNorm).
#
#   [THIRD_PARTY_SDPA="Math ..."] [THIRD_PARTY_FI_OPS=op,...] examples/third_party_check.sh OUT [--dry-run]
#
# OUT receives at most 8 files: one JSON report per run (sdpa_math.json, sdpa_flash.json,
# sdpa_efficient.json, sdpa_cudnn.json, flashinfer.json, flashinfer_torch_norm.json), summary.txt
# (versions, what FlashInfer JIT-compiled, and one table: implementation, Op, the verdict counts,
# the worst error over the accuracy envelope, the first FAIL/ERROR line per Op) and logs.tar.gz
# (every run's and warm-up's output). The reports are rewritten as cases finish, so a run cut short
# still leaves valid (incomplete) JSON.
#
# FlashInfer is not installed on the GPU host: its wheels travel in .whl/ at the repository root
# (flashinfer-python 0.5.3 and apache-tvm-ffi; examples/flashinfer/README.md says how to fetch them)
# and are installed into /tmp/site with pip --no-index. Its kernels are JIT-compiled there by nvcc
# (into $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer): a warm-up process compiles the four modules
# the adapter uses in parallel (examples/flashinfer/warmup.py) in the background while the SDPA runs
# go, so the FlashInfer run does not wait on nvcc case by case.
#
# Time: everything ends within THIRD_PARTY_BUDGET seconds (default 440): the SDPA runs first (each
# at most THIRD_PARTY_SDPA_LIMIT, default 75 s), then FlashInfer gets what remains. Every step runs
# under `timeout`, and the CLI's --deadline stops a run cleanly just before its step's limit.
# Exit status: 0 when every report is complete, 1 when one is missing or incomplete, 2 bad usage.

set -u -o pipefail

usage() {
    echo "usage: examples/third_party_check.sh OUT [--dry-run]" >&2
    echo "  OUT        folder for the JSON reports, summary.txt and logs.tar.gz" >&2
    echo "  --dry-run  print what would run, run nothing" >&2
    exit 2
}

OUT=""
DRY=0
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY=1 ;;
        -h|--help) usage ;;
        -*) echo "third_party_check.sh: unknown option $arg" >&2; usage ;;
        *) if [ -z "$OUT" ]; then OUT=$arg; else echo "third_party_check.sh: one OUT only" >&2; usage; fi ;;
    esac
done
[ -n "$OUT" ] || usage

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
BUDGET=${THIRD_PARTY_BUDGET:-440}
SDPA_LIMIT=${THIRD_PARTY_SDPA_LIMIT:-75}
START=$(date +%s)
DEADLINE=$((START + BUDGET))
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi_ws}
# tvm-ffi 0.1.x would JIT-build (about a minute, in the first process that imports it) an optional
# addon that only speeds up passing torch tensors; without it tvm-ffi passes them through DLPack on
# torch's current stream. Set TVM_FFI_DISABLE_TORCH_C_DLPACK=0 to build it anyway.
export TVM_FFI_DISABLE_TORCH_C_DLPACK=${TVM_FFI_DISABLE_TORCH_C_DLPACK:-1}
# what runs: THIRD_PARTY_SDPA, the SDPA backends (default all four; empty: none), THIRD_PARTY_FI_OPS,
# FlashInfer's Ops (default all four; the FP32-norm run goes with context_kv; empty: no FlashInfer)
SDPA_CLASSES=${THIRD_PARTY_SDPA-Math Flash Efficient Cudnn}
FI_OPS=${THIRD_PARTY_FI_OPS-draft_attention,context_kv,target_distribution,speculative_accept}

remaining() { echo $((DEADLINE - $(date +%s))); }
lower() { echo "$1" | tr '[:upper:]' '[:lower:]'; }

if [ "$DRY" = 1 ]; then
    LOGS="<logs>"
else
    mkdir -p "$OUT" || exit 2
    OUT=$(cd "$OUT" && pwd)
    LOGS=$(mktemp -d /tmp/third_party_logs.XXXXXX)
fi

# step LIMIT LOG CMD...: run CMD under timeout LIMIT (seconds), output to LOGS/LOG; its status in $RC
step() {
    local limit=$1 log=$2
    shift 2
    if [ "$DRY" = 1 ]; then
        echo "[dry-run] timeout $limit $* > $LOGS/$log"
        RC=0
        return 0
    fi
    if [ "$limit" -lt 5 ]; then
        echo "skipped: no time left for: $*" | tee -a "$LOGS/$log"
        RC=124
        return 0
    fi
    echo "[$(date +%T)] ($limit s) $*" | tee -a "$LOGS/$log"
    timeout -k 10 "$limit" "$@" >> "$LOGS/$log" 2>&1
    RC=$?
    echo "[$(date +%T)] exit $RC" | tee -a "$LOGS/$log"
    tail -n 3 "$LOGS/$log" | sed 's/^/    /'
}

# conformance IMPL OPS NAME LIMIT: one run, its JSON report OUT/NAME.json
conformance() {
    local impl=$1 ops=$2 name=$3 limit=$4
    local deadline=$((limit - 15))
    [ "$deadline" -ge 10 ] || deadline=10
    step "$limit" "$name.log" python3 -m conformance.cli run --impl "$impl" --vectors vectors --ops "$ops" \
        --json "$OUT/$name.json" --timeout 300 --deadline "$deadline"
}

WARM_PIDS=""
finish() {
    trap - EXIT INT TERM
    [ "$DRY" = 1 ] && return
    for pid in $WARM_PIDS; do kill "$pid" 2>/dev/null; done
    find "$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer" -name '*.so' 2>/dev/null | sort > "$LOGS/jit_compiled.txt"
    {
        echo "third_party_check.sh: $(date -u +%FT%TZ), $(( $(date +%s) - START )) s of $BUDGET"
        cat "$LOGS/versions.txt" 2>/dev/null
        echo "FlashInfer JIT-compiled modules ($FLASHINFER_WORKSPACE_BASE/.cache/flashinfer):"
        sed 's/^/    /' "$LOGS/jit_compiled.txt"
        [ -s "$LOGS/jit_compiled.txt" ] || echo "    (none)"
        echo
        python3 -m examples.torch_sdpa.summary "$OUT"/sdpa_math.json "$OUT"/sdpa_flash.json \
            "$OUT"/sdpa_efficient.json "$OUT"/sdpa_cudnn.json "$OUT"/flashinfer.json \
            "$OUT"/flashinfer_torch_norm.json 2>&1
    } > "$OUT/summary.txt"
    cat "$OUT/summary.txt"
    tar -czf "$OUT/logs.tar.gz" -C "$LOGS" . 2>/dev/null
}
trap finish EXIT
trap 'exit 130' INT TERM

# --- versions -------------------------------------------------------------------------------------
if [ "$DRY" = 0 ]; then
    {
        echo "host: $(uname -srm); python3: $(command -v python3) $(python3 --version 2>&1)"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
        echo "nvcc: $(nvcc --version 2>&1 | grep -i release || echo 'not found')"
        python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', \
torch.backends.cudnn.version(), 'device', torch.cuda.get_device_name() if torch.cuda.is_available() else None)" 2>&1
    } > "$LOGS/versions.txt"
fi

# --- FlashInfer: install the carried wheels, check the import --------------------------------------
FI_OK=0
[ -n "$FI_OPS" ] || [ "$DRY" = 1 ] || echo "flashinfer: not asked for (THIRD_PARTY_FI_OPS is empty)" >> "$LOGS/versions.txt"
if [ -z "$FI_OPS" ]; then
    :
elif ls .whl/*.whl > /dev/null 2>&1 || [ "$DRY" = 1 ]; then
    if [ "$DRY" = 1 ]; then
        echo "[dry-run] python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:\$PYTHONPATH"
    else
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
        echo "wheels: $(cd .whl && ls *.whl | tr '\n' ' ')" >> "$LOGS/versions.txt"
    fi
else
    echo "no .whl/ wheels: FlashInfer is whatever python3 imports" >> "$LOGS/versions.txt"
fi
if [ "$DRY" = 0 ]; then
    if [ -z "${CUDA_HOME:-}" ] && command -v nvcc > /dev/null; then
        CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
        export CUDA_HOME
    fi
    if ! command -v ninja > /dev/null; then
        NINJA_DIR=$(python3 -c "import ninja; print(ninja.BIN_DIR)" 2>/dev/null) && export PATH="$NINJA_DIR:$PATH"
    fi
    CUDA_DIR=${CUDA_HOME:-/usr/local/cuda}
    # FlashInfer's JIT compiles against $CUDA_HOME/include alone, and its norm and sampling sources
    # include cuBLASLt's and cuRAND's headers: where the toolkit lacks them, take them from the NVIDIA
    # wheels torch brings (nvidia/cu13/include), searched after the toolkit's own headers
    if [ ! -f "$CUDA_DIR/include/cublasLt.h" ] || [ ! -f "$CUDA_DIR/include/curand.h" ]; then
        NV_INCLUDES=$(python3 -c "
import glob, os, nvidia
dirs = []
for root in nvidia.__path__:
    for header in ('cublasLt.h', 'curand.h'):
        for found in sorted(glob.glob(os.path.join(root, '*', 'include', header))):
            if os.path.dirname(found) not in dirs:
                dirs.append(os.path.dirname(found))
print(' '.join('-isystem ' + d for d in dirs))" 2>/dev/null)
        if [ -n "$NV_INCLUDES" ]; then
            export FLASHINFER_EXTRA_CUDAFLAGS="${FLASHINFER_EXTRA_CUDAFLAGS:+$FLASHINFER_EXTRA_CUDAFLAGS }$NV_INCLUDES"
        fi
    fi
    # its modules link with -lcuda: without the toolkit's stub, link the driver's library
    if [ ! -e "$CUDA_DIR/lib64/stubs/libcuda.so" ] && [ ! -e "$CUDA_DIR/lib64/libcuda.so" ]; then
        for lib in /usr/lib/x86_64-linux-gnu/libcuda.so /usr/lib64/libcuda.so /usr/local/nvidia/lib64/libcuda.so \
                   $(ldconfig -p 2>/dev/null | awk '/libcuda\.so(\.1)? /{print $NF}') \
                   /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/local/nvidia/lib64/libcuda.so.1; do
            [ -e "$lib" ] || continue
            mkdir -p /tmp/fi_libcuda && ln -sf "$lib" /tmp/fi_libcuda/libcuda.so
            export FLASHINFER_EXTRA_LDFLAGS="${FLASHINFER_EXTRA_LDFLAGS:+$FLASHINFER_EXTRA_LDFLAGS }-L/tmp/fi_libcuda"
            break
        done
    fi
    {
        echo "CUDA_HOME $CUDA_DIR; ninja $(command -v ninja || echo 'not found')"
        echo "FLASHINFER_EXTRA_CUDAFLAGS '${FLASHINFER_EXTRA_CUDAFLAGS:-}'; FLASHINFER_EXTRA_LDFLAGS '${FLASHINFER_EXTRA_LDFLAGS:-}'"
    } >> "$LOGS/versions.txt"
fi
RC=1
[ -n "$FI_OPS" ] && step $(( $(remaining) < 150 ? $(remaining) : 150 )) versions_flashinfer.log python3 -c "import flashinfer, tvm_ffi; \
from flashinfer.jit import env; print('flashinfer', flashinfer.__version__, 'tvm_ffi', tvm_ffi.__version__, \
'jit dir', env.FLASHINFER_JIT_DIR)"
if [ -n "$FI_OPS" ] && [ "$RC" = 0 ]; then
    FI_OK=1
    [ "$DRY" = 0 ] && grep '^flashinfer ' "$LOGS/versions_flashinfer.log" >> "$LOGS/versions.txt"
elif [ -n "$FI_OPS" ]; then
    [ "$DRY" = 0 ] && echo "flashinfer: import failed (exit $RC; logs.tar.gz: versions_flashinfer.log)" >> "$LOGS/versions.txt"
fi

# --- FlashInfer warm-up in the background: its four JIT modules compiled in parallel, then each Op
# tried once on its first vector ---------------------------------------------------------------------
WARM_WHAT=all
case "$FI_OPS" in *,*) ;; ?*) WARM_WHAT=$FI_OPS ;; esac  # one Op: compile only its modules
if [ "$FI_OK" = 1 ]; then
    WARM_LIMIT=$(( $(remaining) - 100 ))
    [ "$WARM_LIMIT" -ge 60 ] || WARM_LIMIT=60
    if [ "$DRY" = 1 ]; then
        echo "[dry-run] timeout $WARM_LIMIT python3 -m examples.flashinfer.warmup $WARM_WHAT > $LOGS/warmup.log &"
    else
        timeout -k 10 "$WARM_LIMIT" python3 -m examples.flashinfer.warmup "$WARM_WHAT" > "$LOGS/warmup.log" 2>&1 &
        WARM_PIDS="$!"
    fi
fi

# --- PyTorch SDPA, one backend forced per run --------------------------------------------------------
for cls in $SDPA_CLASSES; do
    left=$(( $(remaining) - 120 ))
    limit=$(( SDPA_LIMIT < left ? SDPA_LIMIT : left ))
    conformance "examples.torch_sdpa.sdpa:$cls" draft_attention "sdpa_$(lower "$cls")" "$limit"
done

# --- FlashInfer --------------------------------------------------------------------------------------
if [ "$FI_OK" = 1 ]; then
    if [ "$DRY" = 0 ]; then
        for pid in $WARM_PIDS; do wait "$pid"; echo "[$(date +%T)] warm-up exit $?" | tee -a "$LOGS/warmup.log"; done
        WARM_PIDS=""
        grep '^warmup' "$LOGS/warmup.log" | cut -c1-300 | tee -a "$LOGS/versions.txt" | sed 's/^/    /'
    else
        echo "[dry-run] wait for the warm-up"
    fi
    conformance examples.flashinfer.adapter:FlashInfer "$FI_OPS" flashinfer $(( $(remaining) - 40 ))
    case ",$FI_OPS," in
        *,context_kv,*) conformance examples.flashinfer.adapter:FlashInferTorchNorm context_kv flashinfer_torch_norm \
            $(( $(remaining) - 8 )) ;;
    esac
fi

[ "$DRY" = 1 ] && { echo "[dry-run] python3 -m examples.torch_sdpa.summary OUT/*.json > OUT/summary.txt; tar logs into OUT/logs.tar.gz"; exit 0; }
finish
complete=0
expected=""
for cls in $SDPA_CLASSES; do expected="$expected sdpa_$(lower "$cls")"; done
[ -n "$FI_OPS" ] && expected="$expected flashinfer"
case ",$FI_OPS," in *,context_kv,*) expected="$expected flashinfer_torch_norm" ;; esac
for name in $expected; do
    python3 -c "import json, sys; sys.exit(0 if json.load(open(sys.argv[1])).get('complete') else 1)" \
        "$OUT/$name.json" 2>/dev/null || complete=1
done
exit $complete
