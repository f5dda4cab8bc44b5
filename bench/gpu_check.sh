#!/usr/bin/env bash
# Check a CUDA GPU with this checkout: which GPU and PyTorch; the tests marked `cuda` (`pytest -m cuda`: the
# device-dependent tests on the GPU, and CUDA graphs); the whole suite; the GPU benchmarks bench/gpu_train.py
# (training speed: the model-only update at the paper's shape against PyTorch's and Hugging Face's Transformers,
# then tformer's training loop on the WMT14 sample) and bench/gpu_decode.py (decoding speed: the dynamic and the
# static path against Hugging Face `generate`); then a summary, printed last and kept in OUT/summary.txt.
#
#   bash bench/gpu_check.sh --data /path/to/data            # every stage; or TFORMER_DATA=/path/to/data
#   bash bench/gpu_check.sh --data /path/to/data cuda train # chosen stages: gpu cuda suite train decode
#   GPU_CHECK_SMOKE=1 bash bench/gpu_check.sh               # on a CPU: the benchmarks' --smoke modes, two test files
#
# The data root holds wmt14-en-de/{train,newstest2013,newstest2014}.{en,de} (the WMT14 sample of the data
# README); only the `train` stage reads it, and not in smoke mode.
#
# Environment:
#   OUT              where gpu_check.log, logs/STAGE.log (each stage's output as it runs), STAGE-failures.txt (each
#                    failing test's traceback as it comes), the benchmarks' tables and summary.txt go
#                    (else ./gpu_check_out)
#   GPU_CHECK_SMOKE  1: check the script itself on a CPU (tiny models, seconds)
#   PYTHON           the interpreter (python3)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

DATA=${TFORMER_DATA:-}
if [[ ${1:-} == --data ]]; then
    DATA=${2:?--data takes the data root}
    shift 2
fi
STAGES=(gpu cuda suite train decode)
CHOSEN=("$@")
((${#CHOSEN[@]})) || CHOSEN=("${STAGES[@]}")
for stage in "${CHOSEN[@]}"; do
    [[ " ${STAGES[*]} " == *" $stage "* ]] || { echo "unknown stage $stage (choose from: ${STAGES[*]})" >&2 && exit 2; }
done

PY=${PYTHON:-python3}
SMOKE=${GPU_CHECK_SMOKE:-0}
export OUT=${OUT:-./gpu_check_out}
LOGS=$OUT/logs
mkdir -p "$LOGS"
declare -A RESULT

# run STAGE CMD...: CMD's output into logs/STAGE.log (and gpu_check.log); its tail on failure; the exit code
run() {
    local stage=$1 rc
    shift
    echo "[$stage] $*"
    { echo "===== $stage: $*" && "$@"; } >"$LOGS/$stage.log" 2>&1
    rc=$?
    cat "$LOGS/$stage.log" >>"$OUT/gpu_check.log"
    if ((rc != 0)); then
        echo "[$stage] exit code $rc; the end of $LOGS/$stage.log:"
        tail -n 25 "$LOGS/$stage.log" | sed 's/^/    /'
    fi
    return $rc
}

pytest_line() { # pytest's closing "N passed, M skipped in S" line
    grep -E '[0-9]+ (passed|failed|errors?|skipped|deselected)|no tests ran' "$1" | tail -n 1 | tr -d '='
}

stage_gpu() {
    run gpu "$PY" -c 'import torch; c = torch.cuda.is_available()
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device {torch.cuda.get_device_name(0) if c else None}")'
    RESULT[gpu]=$(tail -n 1 "$LOGS/gpu.log")
    if [[ $SMOKE != 1 && ${RESULT[gpu]} == *"device None" ]]; then
        RESULT[gpu]+=" FAILED: PyTorch sees no CUDA device (GPU_CHECK_SMOKE=1 runs this script on a CPU)"
        return 1
    fi
}

stage_tests() { # stage_tests STAGE PYTEST-ARGS...: the tests, on every core where pytest-xdist is installed
    local stage=$1 xdist=()
    shift
    "$PY" -c 'import xdist' 2>/dev/null && xdist=(-n "$(nproc)")
    TFORMER_TEST_FAILURES=$OUT/$stage-failures.txt run "$stage" "$PY" -m pytest -q "${xdist[@]}" "$@"
    local rc=$?
    RESULT[$stage]="$(pytest_line "$LOGS/$stage.log")$( ((rc)) && echo " FAILED (exit code $rc)")"
    return $rc
}

stage_cuda() {
    if [[ $SMOKE == 1 ]]; then stage_tests cuda -m cuda tests/unit/decoding/test_static.py; else stage_tests cuda -m cuda; fi
}

stage_suite() {
    if [[ $SMOKE == 1 ]]; then stage_tests suite tests/unit/test_recipes.py tests/unit/test_flops.py; else stage_tests suite; fi
}

stage_train() {
    local args=(--device cuda)
    if [[ $SMOKE == 1 ]]; then
        args=(--smoke --device cpu --no-compile)
    elif [[ -z $DATA || ! -d $DATA/wmt14-en-de ]]; then
        RESULT[train]="FAILED: no wmt14-en-de under the data root '${DATA}' (give --data DIR or set TFORMER_DATA)"
        echo "[train] ${RESULT[train]}"
        return 1
    else
        args+=(--data "$DATA/wmt14-en-de")
    fi
    run train "$PY" bench/gpu_train.py "${args[@]}" && RESULT[train]="tables in $OUT/gpu_train*.md" ||
        RESULT[train]="FAILED (see $LOGS/train.log)"
}

stage_decode() {
    local args=()
    [[ $SMOKE == 1 ]] && args=(--smoke)
    run decode "$PY" bench/gpu_decode.py "${args[@]}" && RESULT[decode]="table in $OUT/gpu_decode.md" ||
        RESULT[decode]="FAILED (see $LOGS/decode.log)"
}

echo "== $(date -u +%FT%TZ) bench/gpu_check.sh ${CHOSEN[*]}" >>"$OUT/gpu_check.log"
status=0
for stage in "${CHOSEN[@]}"; do
    "stage_$stage" || status=1
    [[ $stage == gpu && $status == 1 ]] && break # no GPU: nothing else to check
done

{
    echo "== gpu_check summary ($([[ $SMOKE == 1 ]] && echo "smoke, CPU" || echo "CUDA");" \
        "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $(date -u +%FT%TZ))"
    for stage in "${STAGES[@]}"; do
        [[ -n ${RESULT[$stage]:-} ]] && echo "$stage: ${RESULT[$stage]}"
    done
} >"$OUT/summary.txt"
cat "$OUT/summary.txt"
exit $status
