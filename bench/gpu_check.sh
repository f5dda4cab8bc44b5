#!/usr/bin/env bash
# The GPU check of issue 18, for a bare GPU machine (its own torch, no network): which GPU; the CUDA
# tests and the whole suite; the WMT14 sample prepared; recipes/wmt14_base.yaml trained a few minutes
# in eager bf16 and again with train.compile=true (tokens/s from metrics.jsonl, the compiled run's
# first-update time and recompilations); newstest2014 translated with beam 4 and scored by
# `tformer eval --src --ref`, by the static decoding path and the dynamic one; bench/gpu_decode.py (issue 20's
# table); then a summary, as the last lines and in summary.txt.
#
#   bash bench/gpu_data.sh                      # once, beside ../shared: the data into .gpu-data/
#   bash bench/gpu_check.sh                     # from the repo root, on the GPU machine: every stage
#   bash bench/gpu_check.sh data eager          # chosen stages: gpu tests data eager compiled translate decode summary
#   GPU_CHECK_SMOKE=1 bash bench/gpu_check.sh   # on a CPU: a tiny model in fp32, seconds of training, 10 lines
#
# Environment:
#   OUT                where the log, summary.txt, the metrics and the translation go (else ./gpu_check_out)
#   GPU_DATA           the folder with wmt14-en-de/{train,newstest2013,newstest2014}.{en,de} (.gpu-data)
#   GPU_CHECK_WORK     prepared data, runs and each stage's result line (runs/gpu_check, smoke mode
#                      runs/gpu_check_smoke; ignored by git).
#                      Kept between calls: stages may run in several calls, each summary shows them all
#                      (running every stage starts afresh).
#   GPU_CHECK_MINUTES  training time of each of the two runs (3; smoke mode 0.25)
#   GPU_CHECK_GRACE    seconds a training run may take past that before it is killed (150; smoke 600)
#   GPU_CHECK_OVERRIDES  key=value settings added to both training runs, e.g. "train.pad_to_multiple=8"
#   GPU_CHECK_SUITE    what the whole-suite stage runs (tests; smoke mode two test files)
#   GPU_CHECK_SMOKE    1: on a CPU
#   PYTHON             the interpreter (python3)
#   GPU_COMMIT         the commit the summary names (else git's HEAD, on a device machine maybe older than the tree)
#
# Where one command may run 10 minutes at most (the device machine here), split it into calls, with
# .gpu-data carried (git-ignored) and the machine kept warm between them (runs/gpu_check stays):
#   bash bench/gpu_check.sh gpu tests
#   GPU_CHECK_MINUTES=2 bash bench/gpu_check.sh data eager translate
#   GPU_CHECK_MINUTES=2 bash bench/gpu_check.sh compiled summary       # killed at 2 min + 150 s
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

PY=${PYTHON:-python3}
SMOKE=${GPU_CHECK_SMOKE:-0}
OUTD=${OUT:-./gpu_check_out}
SHARED=${GPU_DATA:-.gpu-data}/wmt14-en-de
WORK=${GPU_CHECK_WORK:-runs/gpu_check$([[ $SMOKE == 1 ]] && echo _smoke)}
RESULTS=$WORK/results
LOG=$OUTD/gpu_check.log
LOGS=$OUTD/logs # each command's output as it runs: what a killed command printed stays
STAGES=(gpu tests data eager compiled translate decode summary)

if [[ $SMOKE == 1 ]]; then
    MINUTES=${GPU_CHECK_MINUTES:-0.25}
    GRACE=${GPU_CHECK_GRACE:-600} # a cold compile on 2 CPU cores takes minutes
    SUITE=${GPU_CHECK_SUITE:-tests/unit/test_recipes.py tests/unit/test_flops.py}
    DEVICE=cpu
    PRECISION=fp32 # bf16 autocast is ~8x slower than fp32 on a CPU without bf16 instructions
    CORPUS=$WORK/corpus # slices of the sample: 2,000 training pairs, 200 validation, 10 test lines
    SIZE=(tokenizer.vocab_size=1000 model.d_model=64 model.n_heads=4 model.n_layers=2 model.d_ff=256
        train.max_tokens=1024)
    TEST_SET=newstest2014-first10
else
    MINUTES=${GPU_CHECK_MINUTES:-3}
    GRACE=${GPU_CHECK_GRACE:-150} # past the time budget: the first update (compiling), validation, saving
    SUITE=${GPU_CHECK_SUITE:-tests}
    DEVICE=cuda
    PRECISION=bf16 # the recipe's
    CORPUS=$SHARED
    SIZE=(tokenizer.vocab_size=8000) # the 20k-pair sample takes no 37k vocabulary (recipe comment)
    TEST_SET=newstest2014-full
fi
read -ra EXTRA <<<"${GPU_CHECK_OVERRIDES:-}"
COMMON=(data.train="$CORPUS/train" data.valid="$CORPUS/newstest2013" data.test="$CORPUS/newstest2014"
    data.dir="$WORK/data" run.out_dir="$WORK/runs" run.device="$DEVICE" "${SIZE[@]}")

tformer() { "$PY" -m tformer_cli "$@"; }

# logged NAME CMD...: run CMD with its output in $LOGS/NAME.log (then added to the call's log); its tail on failure
logged() {
    local name=$1 rc
    shift
    echo "[$name] $*"
    {
        echo "===== $name: $*"
        "$@"
    } >"$LOGS/$name.log" 2>&1
    rc=$?
    cat "$LOGS/$name.log" >>"$LOG"
    if ((rc != 0)); then
        echo "[$name] exit code $rc; the end of its log ($LOG):"
        tail -n 25 "$LOGS/$name.log" | sed 's/^/    /'
    fi
    return $rc
}

# result FILE LINE: a stage's line of the summary, kept in $WORK between calls
result() { echo "$2" >"$RESULTS/$1"; }
failed() { echo "$2 FAILED: $3" >"$RESULTS/$1"; }

stage_gpu() {
    local name torch_line
    if command -v nvidia-smi >/dev/null; then
        name=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -n 1)
    else
        name="none (no nvidia-smi)"
    fi
    torch_line=$("$PY" -c 'import torch; c = torch.cuda.is_available()
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device {torch.cuda.get_device_name(0) if c else None}")')
    echo "[gpu] $name; $torch_line"
    result 1-gpu "gpu: $name; $torch_line"
    if [[ $SMOKE != 1 && $torch_line == *"device None" ]]; then
        failed 1-gpu "gpu: $name; $torch_line" "torch sees no CUDA device (GPU_CHECK_SMOKE=1 runs this on a CPU)"
        return 1
    fi
}

pytest_line() { # the closing "N passed, M skipped in S" line of a pytest log
    grep -E '[0-9]+ (passed|failed|errors?|skipped|deselected)|no tests ran' "$1" | tail -n 1 | tr -d '='
}

stage_tests() {
    local xdist=() workers rc line status=0
    if "$PY" -c 'import xdist' 2>/dev/null; then
        workers=$(nproc)
        xdist=(-n $((workers < 8 ? workers : 8)))
    fi
    logged cuda-tests "$PY" -m pytest -m cuda -q -p no:cacheprovider ${xdist[@]+"${xdist[@]}"}
    rc=$?
    line="cuda tests (pytest -m cuda): $(pytest_line "$LOGS/cuda-tests.log")"
    case $rc in
        0) result 2-cuda-tests "$line" ;;
        5) result 2-cuda-tests "cuda tests (pytest -m cuda): none selected (no test has the cuda marker yet)" ;;
        *) failed 2-cuda-tests "$line" "rc $rc" && status=1 ;;
    esac
    # shellcheck disable=SC2086  # SUITE is a list of paths
    logged all-tests "$PY" -m pytest -x -q -p no:cacheprovider ${xdist[@]+"${xdist[@]}"} $SUITE
    rc=$?
    if ((rc == 0)); then
        result 3-all-tests "all tests (pytest -x $SUITE): $(pytest_line "$LOGS/all-tests.log")"
    else
        failed 3-all-tests "all tests (pytest -x $SUITE): $(pytest_line "$LOGS/all-tests.log")" "rc $rc"
        status=1
    fi
    return $status
}

stage_data() {
    local name lang start kept
    for name in train newstest2013 newstest2014; do
        for lang in en de; do
            if [[ ! -f $SHARED/$name.$lang ]]; then
                failed 4-data "data" "$SHARED/$name.$lang not found: run bench/gpu_data.sh and carry .gpu-data"
                echo "[data] $SHARED/$name.$lang not found: run bench/gpu_data.sh (and carry .gpu-data)"
                return 1
            fi
        done
    done
    if [[ $SMOKE == 1 ]]; then
        mkdir -p "$CORPUS"
        for lang in en de; do
            head -n 2000 "$SHARED/train.$lang" >"$CORPUS/train.$lang"
            head -n 200 "$SHARED/newstest2013.$lang" >"$CORPUS/newstest2013.$lang"
            head -n 10 "$SHARED/newstest2014.$lang" >"$CORPUS/newstest2014.$lang"
        done
    fi
    rm -rf "$WORK/data"
    start=$SECONDS
    logged prepare tformer prepare recipes/wmt14_base.yaml "${COMMON[@]}" || {
        failed 4-data "data" "tformer prepare"
        return 1
    }
    kept=$(grep -oE 'train: read [0-9,]+ +kept [0-9,]+' "$LOGS/prepare.log" | tail -n 1 | grep -oE '[0-9,]+$')
    result 4-data "data: $CORPUS prepared in $((SECONDS - start)) s: $kept training pairs, ${SIZE[0]#*=} BPE pieces"
}

# The training speed of a run from its metrics.jsonl (train.log_every=1): updates, the first update's
# time (on the training clock, which starts after the model is built and, with train.compile, compiled), target
# tokens/s past the first tenth (at least 10 updates) and over the whole run.
SPEED='
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
train = [r for r in records if r["split"] == "train"]
if not train:
    print("no update logged")
    sys.exit()
times = [0.0] + [r["time"] for r in train]
tokens = [r["tokens_per_s"] * (t1 - t0) for r, t0, t1 in zip(train, times, times[1:])]
skip, updates, first = max(10, len(train) // 10), train[-1]["step"], train[0]["time"]
line = f"updates {updates} in {times[-1]:.0f} s, the first in {first:.1f} s"
if len(train) > skip:
    steady = sum(tokens[skip:]) / (times[-1] - times[skip])
    ms = 1000 * (times[-1] - times[skip]) / (len(train) - skip)
    line += f"; after update {skip}: {steady:,.0f} target tokens/s ({ms:.0f} ms/update)"
    open(sys.argv[2], "w").write(f"{steady}\n")
print(line + f"; overall: {sum(tokens) / times[-1]:,.0f} target tokens/s")
'

# Seconds from STARTED (epoch seconds) to the first update line of a train.log (its lines are time-stamped).
FIRST_UPDATE='
import datetime, sys
for line in open(sys.argv[2], encoding="utf-8"):
    if line[19:27] == " update ":
        at = datetime.datetime.strptime(line[:19], "%Y-%m-%d %H:%M:%S").timestamp()
        print(f"; the first update logged {at - float(sys.argv[1]):.0f} s after the command started")
        break
'

train_run() { # train_run NAME COMPILE RESULT: wmt14_base for $MINUTES minutes
    local name=$1 compile=$2 file=$3 run=$WORK/runs/$1 rc line recompiles limit started
    rm -rf "$run" "$RESULTS/tps.$file" "$WORK/inductor-cache"
    limit=$("$PY" -c "print(int($MINUTES * 60 + $GRACE))") # max_minutes is checked between updates only
    # valid_every: no validation inside the timed window (the sample's epochs are ~24 updates); one at the end.
    # A cache of compiled kernels of its own, emptied: the first update is a cold compile, as on a new machine.
    started=$(date +%s)
    TORCHINDUCTOR_CACHE_DIR=$WORK/inductor-cache TORCH_LOGS=recompiles logged "$name" \
        timeout -k 30 "$limit" "$PY" -m tformer_cli train recipes/wmt14_base.yaml "${COMMON[@]}" run.name="$name" \
        train.compile="$compile" train.precision="$PRECISION" train.max_minutes="$MINUTES" train.log_every=1 \
        train.valid_every=1000000 ${EXTRA[@]+"${EXTRA[@]}"}
    rc=$?
    [[ -f $run/metrics.jsonl ]] && cp "$run/metrics.jsonl" "$OUTD/metrics_$name.jsonl"
    line="train $name ($PRECISION, compile=$compile${EXTRA[*]:+, ${EXTRA[*]}}): "
    line+=$([[ -f $run/metrics.jsonl ]] && "$PY" -c "$SPEED" "$run/metrics.jsonl" "$RESULTS/tps.$file")
    line+=$([[ -f $run/train.log ]] && "$PY" -c "$FIRST_UPDATE" "$started" "$run/train.log")
    if [[ $compile == true ]]; then
        recompiles=$(grep -c 'Recompiling function' "$LOGS/$name.log")
        line+="; $recompiles recompilations"
        grep -q 'recompile_limit' "$LOGS/$name.log" && line+=" (the recompile limit was hit: eager from there)"
        grep -q 'torch.compile failed' "$LOGS/$name.log" && line+="; torch.compile FAILED, trained eagerly"
    fi
    if ((rc != 0)); then
        failed "$file" "$line" "rc $rc$( ((rc == 124)) && echo ", killed after $limit s")"
        return 1
    fi
    result "$file" "$line"
}

stage_translate() {
    # `tformer eval` twice: decode.static=auto (on CUDA the static path, its step in CUDA graphs) and never
    # (the dynamic path); the same hypotheses expected (issue 20). The eager run's best.pt, else the compiled one's.
    local name run src=$CORPUS/newstest2014.en ref=$CORPUS/newstest2014.de start bleu lines mode
    local -A seconds
    for name in eager compiled; do
        run=$WORK/runs/$name
        [[ -f $run/checkpoints/best.pt ]] && break
    done
    if [[ ! -f $run/checkpoints/best.pt ]]; then
        failed 7-translate "translate" "no trained run in $WORK/runs/eager or compiled (stage eager or compiled)"
        return 1
    fi
    lines=$(wc -l <"$src")
    for mode in auto never; do
        start=$(date +%s.%N)
        logged translate_$mode tformer eval "$run" --src "$src" --ref "$ref" --test-set "$TEST_SET" \
            --device "$DEVICE" decode.beam=4 decode.static=$mode || {
            failed 7-translate "translate" "tformer eval decode.static=$mode"
            return 1
        }
        seconds[$mode]=$("$PY" -c "print(f'{$(date +%s.%N) - $start:.0f}')")
        cp "$run"/eval_"$TEST_SET"_best_beam4*.hyp "$OUTD/$TEST_SET.$mode.hyp.de" 2>/dev/null
    done
    bleu=$(grep -E '^BLEU [0-9]' "$LOGS/translate_auto.log" | head -n 1) # with its sacreBLEU signature
    local line="translate $TEST_SET ($lines lines, beam 4, the $name run's best.pt): ${seconds[auto]} s"
    line+=" (decode.static=auto), ${seconds[never]} s (never), load and scoring included; $bleu"
    if ! cmp -s "$OUTD/$TEST_SET.auto.hyp.de" "$OUTD/$TEST_SET.never.hyp.de"; then
        local differ
        # the lines that differ, both ways, in $TEST_SET.differ.txt: a near-tie is told from a bug by reading them
        differ=$("$PY" -c 'import sys
a, b = (open(f, encoding="utf-8").read().split("\n") for f in sys.argv[1:3])
rows = [(i, x, y) for i, (x, y) in enumerate(zip(a, b), 1) if x != y]
with open(sys.argv[3], "w", encoding="utf-8") as out:
    out.writelines(f"line {i}\n  static:  {x}\n  dynamic: {y}\n" for i, x, y in rows)
print(len(rows) + abs(len(a) - len(b)))' "$OUTD/$TEST_SET.auto.hyp.de" "$OUTD/$TEST_SET.never.hyp.de" \
            "$OUTD/$TEST_SET.differ.txt")
        failed 7-translate "$line" "the static and dynamic paths' hypotheses differ on $differ of $lines lines \
($OUTD/$TEST_SET.differ.txt)"
        return 1
    fi
    result 7-translate "$line; the same hypotheses both ways"
}

stage_decode() {
    # bench/gpu_decode.py: issue 20's table (random weights of the base shape), then the eager run's
    # newstest2014 through both paths, timed after loading.
    local run=$WORK/runs/eager extra=()
    [[ $SMOKE == 1 ]] && extra=(--smoke)
    [[ -f $run/checkpoints/best.pt ]] && extra+=(--run "$run" --src "$CORPUS/newstest2014.en")
    logged decode env OUT="$OUTD" "$PY" bench/gpu_decode.py "${extra[@]}" || {
        failed 8-decode "decode" "bench/gpu_decode.py"
        return 1
    }
    result 8-decode "decode: bench/gpu_decode.py wrote $OUTD/gpu_decode.md: $(grep -E '^\| fp16 \| beam 4 \| 64 ' \
        "$OUTD/gpu_decode.md" | tr -s ' ')"
}

stage_summary() {
    local commit mode eager compiled
    commit=${GPU_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo "unknown")}
    mode=$([[ $SMOKE == 1 ]] && echo "SMOKE, CPU" || echo GPU)
    {
        echo "== gpu_check summary ($mode; commit $commit; $(date -u +%FT%TZ))"
        cat "$RESULTS"/[0-9]-* 2>/dev/null
        if [[ -f $RESULTS/tps.5-eager && -f $RESULTS/tps.6-compiled ]]; then
            eager=$(cat "$RESULTS/tps.5-eager")
            compiled=$(cat "$RESULTS/tps.6-compiled")
            "$PY" -c "c, e = $compiled, $eager
print(f'compiled vs eager: {c / e:.2f}x target tokens/s ({c:,.0f} vs {e:,.0f})')"
        fi
        if grep -q FAILED "$RESULTS"/[0-9]-* 2>/dev/null; then
            echo "gpu_check: FAILED ($(grep -l FAILED "$RESULTS"/[0-9]-* | xargs -n 1 basename | tr '\n' ' '))"
        else
            echo "gpu_check: every stage run passed"
        fi
    } >"$OUTD/summary.txt"
    echo
    cat "$OUTD/summary.txt"
}

# ------------------------------------------------------------------------------------------ main
chosen=("$@")
((${#chosen[@]})) || chosen=("${STAGES[@]}")
for stage in "${chosen[@]}"; do
    [[ " ${STAGES[*]} " == *" $stage "* ]] || {
        echo "unknown stage '$stage' (stages: ${STAGES[*]})" >&2
        exit 2
    }
done
mkdir -p "$OUTD" "$RESULTS" "$LOGS"
if (($# == 0)); then # every stage: start afresh
    rm -rf "${RESULTS:?}"/* "$OUTD"/metrics_{eager,compiled}.jsonl "$OUTD"/newstest2014-*.hyp.de "$OUTD/gpu_decode.md" "$OUTD/summary.txt"
fi
echo "== $(date -u +%FT%TZ) bench/gpu_check.sh ${chosen[*]}" >>"$LOG"
status=0
for stage in "${chosen[@]}"; do
    case $stage in
        gpu) stage_gpu || { status=1 && [[ $SMOKE != 1 ]] && break; } ;;
        tests) stage_tests || status=1 ;;
        data) stage_data || status=1 ;;
        eager) train_run eager false 5-eager || status=1 ;;
        compiled) train_run compiled true 6-compiled || status=1 ;;
        translate) stage_translate || status=1 ;;
        decode) stage_decode || status=1 ;;
        summary) ;;
    esac
done
stage_summary
exit $status
