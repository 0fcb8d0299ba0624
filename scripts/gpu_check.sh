#!/usr/bin/env bash
# verify's GPU check: CUDA tests and `pipesim verify` runs on the GPUs here; ends with ONE
# summary line.
#
#   scripts/gpu_check.sh [OUT_DIR]        (default OUT_DIR: gpu-check-out)
#
# Needs a CUDA build of torch and pipesim installed (`pip install -e '.[dev,verify]'`
# with a CUDA torch). One GPU: the one-process executor with every rank on cuda:0. Two or
# more: in addition, torchrun with one rank per GPU and NCCL (`torchrun -m verify`). Leaves
# JSON reports, cost files and JUnit XML in OUT_DIR. Exit status: 0 when every check is
# bit-identical, 1 when one is not or a check failed, 3 when no GPU is visible.
set -uo pipefail

OUT=${1:-gpu-check-out}
PY=${PYTHON:-python}
mkdir -p "$OUT"
# cuBLAS is deterministic only with a fixed workspace (PyTorch reproducibility notes);
# it must be set before CUDA starts.
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}

N=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [ "$N" -lt 1 ]; then
    echo "gpu_check: FAIL no CUDA GPU visible (torch.cuda.device_count() == 0)"
    exit 3
fi
"$PY" -c 'import torch
for i in range(torch.cuda.device_count()):
    print(f"cuda:{i} {torch.cuda.get_device_name(i)}")
print("torch", torch.__version__, "cuda", torch.version.cuda)' > "$OUT/gpus.txt"
GPU=$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))')
TORCH=$("$PY" -c 'import torch; print(torch.__version__)')

failed=()
run() {  # run NAME TIMEOUT COMMAND...: note NAME as failed unless the command exits 0
    local name=$1 limit=$2
    shift 2
    if ! timeout "$limit" "$@" 2> "$OUT/$name.stderr.txt"; then
        failed+=("$name")
    fi
}

run cuda-tests 600 "$PY" -m pytest -q -m cuda tests/test_verify_cuda.py -p no:cacheprovider \
    --junitxml="$OUT/cuda-tests.xml" -o junit_family=xunit2
# Single GPU (or the first of several): the one-process executor, every rank on cuda:0.
run verify-mlp-cuda0 180 "$PY" -m verify 1f1b --stages 2 --microbatches 4 --device cuda:0 \
    --json --costs-out "$OUT/verify-mlp-cuda0-costs.json" --output "$OUT/verify-mlp-cuda0.json"
run verify-gpt-cuda0 180 "$PY" -m verify interleaved-1f1b --stages 2 --virtual 2 \
    --microbatches 8 --model gpt --gpt-layers 6 --device cuda:0 --json \
    --costs-out "$OUT/verify-gpt-cuda0-costs.json" --output "$OUT/verify-gpt-cuda0.json"
if [ "$N" -ge 2 ]; then
    # One process per GPU under torchrun, NCCL between them; rank 0 writes the report.
    run verify-mlp-nccl 300 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 \
        -m verify 1f1b --stages 2 --microbatches 8 --timeout 240 --json \
        --costs-out "$OUT/verify-mlp-nccl-costs.json" --output "$OUT/verify-mlp-nccl.json"
    run verify-zbv-nccl 300 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 \
        -m verify zbv --stages 2 --microbatches 8 --model gpt --gpt-layers 6 --timeout 240 \
        --json --output "$OUT/verify-zbv-nccl.json"
fi

summary=$("$PY" - "$OUT" <<'PYEOF'
import glob, json, os, sys
parts = []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "verify-*.json"))):
    if path.endswith("-costs.json"):
        continue
    r = json.load(open(path))
    name = os.path.basename(path)[len("verify-"):-len(".json")]
    verdict = "bit-identical" if r["bit_identical"] else "DIFFERS"
    parts.append(f"{name} {verdict} {r['measured_makespan'] * 1e3:.1f}ms"
                 f"(pred {r['makespan_error_percent']:+.0f}%)")
print("; ".join(parts) or "no reports")
PYEOF
)
if [ ${#failed[@]} -eq 0 ]; then
    echo "gpu_check: PASS on ${N}x ${GPU} (torch ${TORCH}): ${summary}; outputs in ${OUT}/"
    exit 0
fi
echo "gpu_check: FAIL ${failed[*]} on ${N}x ${GPU} (torch ${TORCH}): ${summary}; see ${OUT}/*.stderr.txt"
exit 1
