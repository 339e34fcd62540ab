#!/usr/bin/env bash
# The one command a lent GPU runs: `bash bench/device/run.sh` from the repository root (extra arguments go to
# cuda_check, e.g. --plan or --section). The lent image has torch 2.11 (CUDA 13) and triton 3.6, no Ray and no
# internet: nothing is installed here, the image's python runs the checkout as it is. Writes $OUT/cuda_check.json
# (OUT defaults to bench/results) and prints the summary table; the whole run keeps within a 600 s device call
# (cuda_check's --budget-s 540; `--plan` shows each section's estimate).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
export OUT=${OUT:-bench/results}
# No network: any hub lookup fails at once instead of waiting; all weights are built locally (random).
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
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
PY
exec timeout --signal=INT 580 "$PYTHON" -m bench cuda_check --budget-s "${BUDGET_S:-540}" "$@"
