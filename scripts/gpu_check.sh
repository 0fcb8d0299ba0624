#!/usr/bin/env bash
# verify's GPU check: run the CUDA tests and two `pipesim verify` runs on the GPUs here.
#
#   scripts/gpu_check.sh [OUT_DIR]        (default OUT_DIR: gpu-check-out)
#
# Needs a CUDA build of torch and pipesim installed (`pip install -e '.[dev,verify]'`
# with a CUDA torch). Uses every visible GPU: ranks take cuda:0, cuda:1, ... in turn,
# so one GPU works too (all ranks share it). Exits non-zero when anything is not
# bit-identical, when no GPU is visible, or after 10 minutes.
set -euo pipefail

OUT=${1:-gpu-check-out}
PY=${PYTHON:-python}
PIPESIM=${PIPESIM:-pipesim}
mkdir -p "$OUT"
# cuBLAS is deterministic only with a fixed workspace (PyTorch reproducibility notes);
# it must be set before CUDA starts.
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}

N=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
if [ "$N" -lt 1 ]; then
    echo "gpu_check: no CUDA GPU visible (torch.cuda.device_count() == 0)" >&2
    exit 2
fi
"$PY" -c 'import torch
for i in range(torch.cuda.device_count()):
    print(f"cuda:{i} {torch.cuda.get_device_name(i)}")
print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee "$OUT/gpus.txt"

DEVICES=$("$PY" -c "print(','.join(f'cuda:{r % $N}' for r in range(2)))")

timeout 600 "$PY" -m pytest -q -m cuda tests/test_verify_cuda.py -p no:cacheprovider \
    --junitxml="$OUT/cuda-tests.xml"
timeout 120 "$PIPESIM" verify 1f1b --stages 2 --microbatches 1 --batch-size 32 \
    --device "$DEVICES" --json --costs-out "$OUT/mlp-costs.json" > "$OUT/verify-mlp.json"
timeout 120 "$PIPESIM" verify interleaved-1f1b --stages 2 --virtual 2 --microbatches 8 \
    --model gpt --gpt-layers 6 --device "$DEVICES" --json \
    --costs-out "$OUT/gpt-costs.json" > "$OUT/verify-gpt.json"
"$PY" - "$OUT" <<'PYEOF'
import json, sys
for name in ("verify-mlp.json", "verify-gpt.json"):
    r = json.load(open(f"{sys.argv[1]}/{name}"))
    print(f"{name}: bit_identical={r['bit_identical']} devices={','.join(r['devices'])} "
          f"measured={r['measured_makespan'] * 1e3:.3f} ms "
          f"predicted={r['predicted_makespan'] * 1e3:.3f} ms ({r['makespan_error_percent']:+.1f}%)")
PYEOF
echo "gpu_check: all CUDA checks passed; outputs in $OUT/"
