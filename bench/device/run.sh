#!/usr/bin/env bash
# The one command a lent GPU runs: `bash bench/device/run.sh` from the repository root (extra arguments go to
# cuda_check, e.g. --plan or --section). The lent image has torch 2.11 (CUDA 13) and triton 3.6, no Ray and no
# internet: nothing is installed here, the image's python runs the checkout as it is. Writes $OUT/cuda_check.json
# (OUT defaults to bench/results) and prints the summary table; the whole run keeps within a 600 s device call
# (cuda_check's --budget-s 540; `--plan` shows each section's estimate).
#   bash bench/device/run.sh --with-tests   first the GPU cases of the kernel tests (flash at pages of 256, the
#                                           Triton kernel compiled, graphs captured: they fail, never skip, when
#                                           the engine chose a CUDA kernel), at most 150 s, then cuda_check in the
#                                           time left; the tests' result is printed last.
#   bash bench/device/run.sh --section hybrid   Qwen3.5's section (opt-in, as moe): the image has no fla-core, so
#                                           run `make device-deps` here first and carry .device-deps (pure
#                                           Python, put first on PYTHONPATH below); without it the section
#                                           reports the torch reference serving bfloat16, and why.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
export OUT=${OUT:-bench/results}
# No network: any hub lookup fails at once instead of waiting; all weights are built locally (random).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -d .device-deps ]; then export PYTHONPATH="$PWD/.device-deps${PYTHONPATH:+:$PYTHONPATH}"; fi
"$PYTHON" - <<'PY'
import importlib

missing = []
for name in ("torch", "transformers", "safetensors", "tokenizers", "triton"):
    try:
        mod = importlib.import_module(name)
        print(f"{name} {getattr(mod, '__version__', '?')}")
    except ImportError as e:
        missing.append(f"{name} ({e})")
if missing:
    raise SystemExit("bench/device/run.sh: this python lacks " + ", ".join(missing))
try:  # optional: Qwen3.5's kernels on CUDA (make device-deps)
    import fla
    print(f"fla-core {fla.__version__}")
except Exception as e:
    print(f"fla-core not importable ({type(e).__name__}): the torch reference serves Qwen3.5's linear layers")
PY
budget=${BUDGET_S:-540}
tests_rc=skipped
if [ "${1:-}" = "--with-tests" ]; then
    shift
    start=$(date +%s)
    tests_rc=0
    # fla's kernels (Qwen3.5) where fla-core imports: the image lacks it unless .device-deps was carried.
    fla_tests=$("$PYTHON" -c "import fla" 2>/dev/null && echo tests/engine/test_gated_delta_kernels.py || true)
    timeout --signal=INT 150 "$PYTHON" -m pytest -q -p no:cacheprovider -k "cuda or triton or probe or kernel" \
        tests/engine/test_varlen_triton.py tests/engine/test_varlen_attention.py tests/engine/test_decode_graphs.py \
        $fla_tests || tests_rc=$?
    budget=$(( budget - ($(date +%s) - start) ))
fi
rc=0
timeout --signal=INT $(( budget + 40 )) "$PYTHON" -m bench cuda_check --budget-s "$budget" "$@" || rc=$?
echo "bench/device/run.sh: GPU tests: ${tests_rc} (0 = passed); cuda_check exit ${rc}"
[ "$tests_rc" = skipped ] || [ "$tests_rc" = 0 ] || exit 1
exit "$rc"
