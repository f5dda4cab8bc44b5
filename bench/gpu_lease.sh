#!/usr/bin/env bash
# Issue 35's checks that fit one device call (10 minutes at most, a whole session's device time 15): on a
# bare GPU machine, with a deadline, in the order of what matters most:
#   1. gpu     the GPU, the driver, torch;
#   2. suite   the whole test suite, the CUDA tests included (pytest -n 14 -v; failures and skips listed, each
#              failure's last "E" line; the failed tests then rerun alone, one at a time);
#   3. train   bench/gpu_train.py --only model: the model-only update at the paper's shape, tformer eager and
#              compiled (model + loss), tformer's own update() with train.compile and bf16-weights, and the
#              peers (torch.nn.Transformer, Hugging Face Marian) eager and compiled;
#   4. decode  bench/gpu_decode.py: beam 4 and greedy, tformer's static and dynamic paths vs `generate`;
#   5. loop    bench/gpu_train.py --only loop: `tformer train`'s loop (compiled, bf16-weights) on the WMT14 sample
#              as a fraction of its own update() on random batches (.gpu-data carried);
#   6. same    bench/gpu_same_results.py: the compiled path's final losses against the eager one's (.gpu-data), both
#              with train.pad_to_multiple=8.
# Each stage is killed at its share of the deadline; what it printed stays. The training loop, the
# WMT14 sample and its translation are bench/gpu_check.sh's, in the same call after this one or in another, with
# .gpu-data carried beside .whl (about 50 MB together), e.g. with `gpu suite` here:
#   GPU_CHECK_MINUTES=1 OUT=$OUT/check bash bench/gpu_check.sh data compiled translate
#
#   bash bench/gpu_lease.sh                       # on the GPU machine, from the repo root
#   GPU_LEASE_SECONDS=300 bash bench/gpu_lease.sh gpu train     # chosen stages, another deadline
#
# Environment: OUT (where the logs go: summary.txt last; else ./gpu_lease_out), GPU_LEASE_SECONDS (the
# deadline from the start, 570), GPU_LEASE_SUITE_SECONDS (the suite's share, 300: on an H200 with 14 workers
# it had not finished in 235 s), GPU_LEASE_RERUN_SECONDS (the failed tests' rerun after it, 120: it tells a
# failure of the load from one of the code), GPU_LEASE_LOOP_OVERRIDES (key=value settings added to the loop's,
# e.g. "train.pad_to_multiple=8"), PYTHON (python3), GPU_COMMIT (the commit the summary names; else git's HEAD,
# which on a device machine's copy of the checkout may be older than the tree). Wheels of missing packages in
# .whl/ (git-ignored) are installed first, for a machine without a package index; a GPU image may lack
# ctranslate2, which two test files import. Fetched beside the checkout, for the GPU machine's Python:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 -d .whl ctranslate2==4.8.5
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

PY=${PYTHON:-python3}
OUTD=${OUT:-./gpu_lease_out}
DEADLINE=$((SECONDS + ${GPU_LEASE_SECONDS:-570}))
MIN_SHARE=20 # seconds: a stage given less is not started
STAGES=(gpu suite train decode loop same)
mkdir -p "$OUTD"
SUMMARY=$OUTD/summary.txt
: >"$SUMMARY"

note() { echo "$*" | tee -a "$SUMMARY"; }

# bounded SHARE NAME CMD...: run CMD, its output in $OUTD/NAME.log, killed after SHARE seconds or at the
# deadline, whichever comes first
bounded() {
    local share=$1 name=$2 left rc start=$SECONDS
    shift 2
    left=$((DEADLINE - SECONDS))
    ((share < left)) || share=$left
    if ((share < MIN_SHARE)); then
        rm -f "$OUTD/$name.log" # no earlier invocation's log read as this one's
        note "[$name] not run: $left s left before the deadline"
        return 1
    fi
    echo "[$name] (at most $share s) $*"
    timeout -k 10 "$share" "$@" >"$OUTD/$name.log" 2>&1
    rc=$?
    echo "[$name] exit code $rc after $((SECONDS - start)) s$( ((rc == 124)) && echo ", killed at $share s")"
    return $rc
}

stage_gpu() {
    note "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | head -n 1)"
    note "$("$PY" -c 'import torch, platform; c = torch.cuda.is_available()
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cudnn {torch.backends.cudnn.version()}, "
      f"device {torch.cuda.get_device_name(0) if c else None}, python {platform.python_version()}")')"
    note "cpu: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
    if compgen -G ".whl/*.whl" >/dev/null; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl &&
            export PYTHONPATH="$PYTHONPATH:/tmp/site" && note "carried wheels: $(ls .whl | tr '\n' ' ')"
    fi
    "$PY" -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || note "pip install -e . failed"
    "$PY" -c 'import ctranslate2' 2>/dev/null ||
        note "ctranslate2 missing: two test files that import it will not be collected (carry its wheel in .whl/)"
}

stage_suite() {
    # -v: each test's result as it comes (-q names the failed ones only at the end, lost if the run is cut off);
    # a test stopped after 270 s (pytest-timeout, in the GPU image; the longest test, test_run_safety.py's kill
    # at every point of a save, takes 144 s on 2 CPU cores); one compile thread per worker (each worker's
    # torch.compile would otherwise start a pool of nproc compile processes).
    # --dist worksteal: a worker that runs out of tests takes queued ones from a busy worker, so that no test
    # waits behind a slow one while a worker is idle (the default, `load`, hands each worker its queue).
    # The longest test runs in a process of its own from the start: in the pool it may start last and end the stage
    # minutes after every other test.
    local rc timeout=() longest=tests/integration/test_run_safety.py::test_kill_9_at_every_point_of_a_save pid= failed
    local share=${GPU_LEASE_SUITE_SECONDS:-300} rerun
    # each failure's traceback as it comes (tests/conftest.py): pytest prints them at its end, which a killed run never
    # reaches
    export TFORMER_TEST_FAILURES=$OUTD/suite-failures.txt
    rm -f "$TFORMER_TEST_FAILURES"
    ((share < DEADLINE - SECONDS)) || share=$((DEADLINE - SECONDS))
    "$PY" -c 'import pytest_timeout' 2>/dev/null && timeout=(--timeout 270)
    if ((share >= MIN_SHARE)); then # bounded's own floor: below it neither part runs
        timeout -k 10 "$share" "$PY" -m pytest -v -p no:cacheprovider -rfEs "$longest" >"$OUTD/suite-longest.log" 2>&1 &
        pid=$!
    fi
    TORCHINDUCTOR_COMPILE_THREADS=1 bounded "$share" suite "$PY" -m pytest -n 14 --dist worksteal -v \
        -p no:cacheprovider -rfEs --durations=25 ${timeout[@]+"${timeout[@]}"} --deselect "$longest"
    rc=$?
    if [[ -n $pid ]]; then
        wait "$pid" || rc=$((rc ? rc : $?))
        cat "$OUTD/suite-longest.log" >>"$OUTD/suite.log"
    fi
    [[ -f $OUTD/suite.log ]] || return "$rc" # too little time left: bounded said so, and nothing ran
    note "suite (pytest -n 14, CUDA tests included): rc $rc; $(grep -E '[0-9]+ (passed|failed)' "$OUTD/suite.log" | tail -n 2 | tr -d '=' | tr '\n' ';')"
    # a failure: "[gw3] [ 5%] FAILED tests/..." as it comes under -n, "FAILED tests/..." in a run's closing lines
    failed=$(grep -oE '(^| )(FAILED|ERROR) tests/[^ ]+' "$OUTD/suite.log" | sed 's/^ //' | sort -u)
    note "    reported: $(grep -cE ' (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) ' "$OUTD/suite.log"), failed or errors: \
$(grep -c . <<<"$failed")"
    [[ -z $failed ]] || head -n 40 <<<"$failed" | sed 's/^/    /' | tee -a "$SUMMARY"
    # why, each distinct reason once: the last "E" line of each traceback (a module fixture's error repeats per test)
    [[ ! -s $TFORMER_TEST_FAILURES ]] ||
        awk '/^=== /{if (e) print e; e=""} /^E /{e=$0} END{if (e) print e}' "$TFORMER_TEST_FAILURES" |
        cut -c1-300 | awk '!seen[$0]++' | head -n 20 | sed 's/^/    why: /' | tee -a "$SUMMARY"
    note "    skipped for lack of CUDA: $(grep -E 'SKIPPED' "$OUTD/suite.log" | grep -ci 'needs CUDA')"
    [[ -z $pid ]] || note "    ${longest#*::} (in a process of its own): $(grep -oE "${longest#*::} (PASSED|FAILED|ERROR)" \
"$OUTD/suite-longest.log" | tail -n 1 | cut -d' ' -f2 | grep . || echo "no result: stopped at $share s")"
    # the failed ones again, alone and one at a time, in a share of their own: a failure that passes alone came from
    # the load of 14 workers (a timeout), one that fails again is the code's
    [[ -n $failed ]] || return 0
    mapfile -t rerun < <(sed -E 's/^(FAILED|ERROR) //' <<<"$failed")
    TFORMER_TEST_FAILURES=$OUTD/suite-rerun-failures.txt bounded "${GPU_LEASE_RERUN_SECONDS:-120}" suite-rerun \
        "$PY" -m pytest -v -p no:cacheprovider -rfEs ${timeout[@]+"${timeout[@]}"} "${rerun[@]}"
    note "    rerun alone (pytest -v, the ${#rerun[@]} failed): rc $?; $(grep -E '[0-9]+ (passed|failed|error)' \
        "$OUTD/suite-rerun.log" 2>/dev/null | tail -n 1 | tr -d '=')"
}

# excerpt NAME PATTERN: the lines of $OUTD/NAME.log that match, each once (a table may be printed twice), indented
# into the summary; nothing where the stage had no time to write its log
excerpt() {
    [[ -f $OUTD/$1.log ]] || return 0
    grep -E "$2" "$OUTD/$1.log" | awk '!seen[$0]++' | cut -c1-400 | sed 's/^/    /' | tee -a "$SUMMARY"
}

stage_train() {
    bounded 240 train "$PY" bench/gpu_train.py --only model --compile model+loss \
        --settings "train.compile=true train.precision=bf16-weights"
    note "train (bench/gpu_train.py --only model): rc $?"
    excerpt train '^matmul peak|: [0-9.]+ ms/update|FAILED|tformer over'
}

stage_decode() {
    bounded 240 decode "$PY" bench/gpu_decode.py
    note "decode (bench/gpu_decode.py): rc $?"
    excerpt decode '^\|'
}

stage_loop() {
    local extra
    read -ra extra <<<"${GPU_LEASE_LOOP_OVERRIDES:-}"
    bounded 300 loop "$PY" bench/gpu_train.py --only loop --loop-overrides train.compile=true \
        train.precision=bf16-weights ${extra[@]+"${extra[@]}"}
    note "loop (bench/gpu_train.py --only loop): rc $?"
    excerpt loop '^Real loop|^- |FAILED'
}

stage_same() {
    # lengths padded to multiples of 8 in both paths: the same batches for both, and the compiled one compiles once
    # (unpadded, it compiled again at updates 3 and 6, about 68 s each, on an H200: docs/benchmarks.md)
    bounded 300 same "$PY" bench/gpu_same_results.py --both train.pad_to_multiple=8
    note "same (bench/gpu_same_results.py): rc $?"
    excerpt same '^\||PASS|FAIL'
}

chosen=("$@")
((${#chosen[@]})) || chosen=("${STAGES[@]}")
for stage in "${chosen[@]}"; do
    [[ " ${STAGES[*]} " == *" $stage "* ]] || { echo "unknown stage '$stage' (stages: ${STAGES[*]})" >&2 && exit 2; }
done
note "== gpu_lease (${GPU_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}; $(date -u +%FT%TZ)): ${chosen[*]}"
for stage in "${chosen[@]}"; do
    "stage_$stage"
done
echo
echo "===== summary ($SUMMARY)"
cat "$SUMMARY"
