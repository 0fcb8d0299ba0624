#!/usr/bin/env bash
# verify's GPU check: CUDA tests and `pipesim verify` runs on the GPUs here; ends with ONE
# summary line.
#
#   scripts/gpu_check.sh [OUT_DIR]        (default OUT_DIR: gpu-check-out)
#
# Needs a CUDA build of torch >= 2.4 and pipesim installed in the Python that $PYTHON names
# (default: python, else python3), e.g. a venv made with --system-site-packages over the
# Python that has the CUDA torch, then `pip install -e '.[dev,verify]'` in it (as CI does).
# One GPU: the one-process executor with every rank on cuda:0. Two or more: in addition,
# torchrun with one rank per GPU and NCCL (`torchrun -m verify`). Leaves in OUT_DIR: the
# JSON reports, cost files, JUnit XML (the CUDA tests' and gpu-check.xml with one test
# case per check), each check's output (NAME.log.txt) and gpus.txt. Exit status: 0 when
# every check is bit-identical, 1 when one is not or a check failed or timed out, 3 when
# the environment cannot run the check (no torch, a CPU build of torch, no GPU visible).
# The planner's GEMM rates (burst against sustained at the power limit) are measured apart:
# benchmarks/bench_gpu_rates.py (docs/planner-model.md, "Burst and sustained rates").
set -uo pipefail

OUT=${1:-gpu-check-out}
PY=${PYTHON:-$(command -v python || command -v python3 || echo python)}
mkdir -p "$OUT"
# cuBLAS is deterministic only with a fixed workspace (PyTorch reproducibility notes);
# it must be set before CUDA starts.
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}

# One probe: GPU count, CUDA version ("none" for a CPU build), torch version.
if ! probe=$("$PY" -c 'import torch
print(torch.cuda.device_count(), torch.version.cuda or "none", torch.__version__)' \
    2> "$OUT/probe.stderr.txt"); then
    echo "gpu_check: FAIL $PY cannot import torch; set PYTHON to a Python with a CUDA build of torch >= 2.4 and pipesim installed"
    exit 3
fi
read -r N CUDA TORCH <<< "$probe"
if [ "$CUDA" = none ]; then
    echo "gpu_check: FAIL torch $TORCH in $PY is a CPU build; install a CUDA build of torch >= 2.4"
    exit 3
fi
if [ "$N" -lt 1 ]; then
    echo "gpu_check: FAIL no CUDA GPU visible (torch.cuda.device_count() == 0)"
    exit 3
fi
"$PY" -c 'import torch
for i in range(torch.cuda.device_count()):
    print(f"cuda:{i} {torch.cuda.get_device_name(i)}")
print("torch", torch.__version__, "cuda", torch.version.cuda)' > "$OUT/gpus.txt"
GPU=$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0))')

checks=()
failed=()
run() {  # run NAME TIMEOUT COMMAND...: note NAME as failed (or timed out) unless it exits 0
    local name=$1 limit=$2 status
    shift 2
    checks+=("$name")
    timeout "$limit" "$@" > "$OUT/$name.log.txt" 2>&1
    status=$?
    if [ "$status" -eq 124 ]; then
        failed+=("$name(timed-out-after-${limit}s)")
    elif [ "$status" -ne 0 ]; then
        failed+=("$name(exit-$status)")
    fi
}

run cuda-tests 600 "$PY" -m pytest -q -m cuda tests/test_verify_cuda.py -p no:cacheprovider \
    --junitxml="$OUT/cuda-tests.xml" -o junit_family=xunit2
# Single GPU (or the first of several): the one-process executor, every rank on cuda:0.
run verify-mlp-cuda0 180 "$PY" -m verify 1f1b --pipeline-parallel 2 --microbatches 4 --device cuda:0 \
    --json --costs-out "$OUT/verify-mlp-cuda0-costs.json" --output "$OUT/verify-mlp-cuda0.json"
run verify-gpt-cuda0 180 "$PY" -m verify interleaved-1f1b --pipeline-parallel 2 --virtual 2 \
    --microbatches 8 --model gpt --gpt-layers 6 --device cuda:0 --json \
    --costs-out "$OUT/verify-gpt-cuda0-costs.json" --output "$OUT/verify-gpt-cuda0.json"
# bf16, as models train on GPUs: every tensor bf16 (the messages too), split backward
# (zero bubble's I and W) on the Llama; and float32 weights under autocast on the GPT.
run verify-llama-bf16-cuda0 180 "$PY" -m verify zb-h1 --pipeline-parallel 2 --microbatches 4 \
    --model llama --llama-layers 4 --dtype bf16 --device cuda:0 --json \
    --output "$OUT/verify-llama-bf16-cuda0.json"
run verify-gpt-autocast-cuda0 180 "$PY" -m verify interleaved-1f1b --pipeline-parallel 2 --virtual 2 \
    --microbatches 4 --model gpt --gpt-layers 6 --autocast bf16 --device cuda:0 --json \
    --output "$OUT/verify-gpt-autocast-cuda0.json"
if [ "$N" -ge 2 ]; then
    # One process per GPU under torchrun, NCCL between them; rank 0 writes the report.
    run verify-mlp-nccl 300 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 \
        -m verify 1f1b --pipeline-parallel 2 --microbatches 8 --timeout 240 --json \
        --costs-out "$OUT/verify-mlp-nccl-costs.json" --output "$OUT/verify-mlp-nccl.json"
    run verify-zbv-nccl 300 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 \
        -m verify zbv --pipeline-parallel 2 --microbatches 8 --model gpt --gpt-layers 6 --timeout 240 \
        --json --output "$OUT/verify-zbv-nccl.json"
    # bf16 messages over NCCL: the report's wire_dtypes must say bfloat16 (checked below).
    run verify-llama-bf16-nccl 300 "$PY" -m torch.distributed.run --standalone \
        --nproc-per-node 2 -m verify 1f1b --pipeline-parallel 2 --microbatches 8 --model llama \
        --dtype bf16 --timeout 240 --json --output "$OUT/verify-llama-bf16-nccl.json"
fi

# The summary line, and gpu-check.xml: one JUnit test case per check (a failed one carries
# the end of its output), so that CI shows every check, not only the pytest ones.
rm -f "$OUT/summary-failures.txt"  # an earlier run's must not count
summary=$("$PY" - "$OUT" "${checks[*]}" "${failed[*]:-}" <<'PYEOF'
import glob, json, os, sys
from xml.etree import ElementTree as ET
out, checks, failed = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
parts = []
for path in sorted(glob.glob(os.path.join(out, "verify-*.json"))):
    if path.endswith("-costs.json"):
        continue
    try:
        r = json.load(open(path))
        name = os.path.basename(path)[len("verify-"):-len(".json")]
        verdict = "bit-identical" if r["bit_identical"] else "DIFFERS"
        # A bf16 model's messages between processes must travel as bf16.
        if r.get("precision") == "bf16" and r.get("wire_bytes") is not None \
                and r.get("wire_dtypes") != ["bfloat16"]:
            verdict += f" WIRE-NOT-BF16({r.get('wire_dtypes')})"
            failed.append(f"verify-{name}(wire-not-bf16)")
        parts.append(f"{name} {r.get('precision', '?')} {verdict} "
                     f"{r['measured_makespan'] * 1e3:.1f}ms"
                     f"(pred {r['makespan_error_percent']:+.0f}%)")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        parts.append(f"{os.path.basename(path)} unreadable ({type(exc).__name__})")
# A CUDA test that skipped here did not run on the GPU: a failure, never a silent pass.
try:
    tests = ET.parse(os.path.join(out, "cuda-tests.xml")).getroot()
    skipped = sum(int(t.get("skipped", 0)) for t in tests.iter("testsuite"))
except (OSError, ET.ParseError):
    skipped = 0  # no XML: cuda-tests failed already, its exit status says so
if skipped and not any(f.startswith("cuda-tests(") for f in failed):
    failed.append(f"cuda-tests({skipped}-skipped)")
with open(os.path.join(out, "summary-failures.txt"), "w") as extra:
    extra.write(" ".join(f for f in failed if f not in sys.argv[3].split()))
suite = ET.Element("testsuite", name="gpu_check", tests=str(len(checks)),
                   failures=str(len(failed)))
for name in checks:
    case = ET.SubElement(suite, "testcase", classname="gpu_check", name=name)
    why = next((f for f in failed if f.split("(")[0] == name), None)
    if why is not None:
        try:
            tail = open(os.path.join(out, f"{name}.log.txt"), errors="replace").read()[-4000:]
        except OSError:
            tail = ""
        ET.SubElement(case, "failure", message=why).text = tail
ET.ElementTree(suite).write(
    os.path.join(out, "gpu-check.xml"), encoding="utf-8", xml_declaration=True)
print("; ".join(parts) or "no reports")
PYEOF
) || failed+=("summary(exit-$?)")
# Failures only the reports show (a skipped CUDA test, a bf16 message sent as another dtype).
read -r -a extra <<< "$(cat "$OUT/summary-failures.txt" 2> /dev/null)"
failed+=("${extra[@]}")
if [ ${#failed[@]} -eq 0 ]; then
    echo "gpu_check: PASS on ${N}x ${GPU} (torch ${TORCH}, CUDA ${CUDA}): ${summary}; outputs in ${OUT}/"
    exit 0
fi
echo "gpu_check: FAIL ${failed[*]} on ${N}x ${GPU} (torch ${TORCH}, CUDA ${CUDA}): ${summary}; see ${OUT}/*.log.txt"
exit 1
