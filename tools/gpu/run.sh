#!/bin/bash
# bash tools/gpu/run.sh   (on the GPU machine, from the repository root; OUT = result folder)
#
# One device session, prepared so that a single call of at most ~8 minutes does everything,
# cheapest and most telling first: preflight, build, ptxas report, the reference cases on
# the GPU (recurrent and chunk 64 first), compute-sanitizer on one tiny case per kernel
# family, the unit tests, then the benchmark against fla-core. Fits a device session of
# 15 minutes with each command cut at 600 s: BUDGET (default 480 s) bounds the whole script,
# leaving room for a rerun while the machine is warm, and each step has its own timeout
# (60-240 s, never more than the budget left). A step that cannot start in time is recorded
# as skipped.
#
# Results, in $OUT (default build/gpu-out), four files at most:
#   summary.txt  one line per step, appended the moment the step ends (a run killed from
#                outside still reports every step it finished)
#   env.txt      the preflight: tools, versions, resolved nvcc, driver, GPU
#   all.log      every step's output, appended in order under a "==== step" header
#   bench.json   the benchmark's rows, rewritten after each row
#
# Carry: the ignored folder third_party/ (made by scripts/fetch-gpu-deps.sh on a machine with
# network access: fla-core's source, the reference cases and their judge, cJSON) must travel
# with the working tree; the script checks it and records what is missing. Without a device
# (no nvidia-smi GPU, no /dev/nvidia0) the build and the ptxas check still run and every step
# that needs the GPU records "no device": that is how the script's control flow is tested
# on a machine without one; ASSUME_DEVICE=1 runs the GPU steps there anyway, to see them fail
# and be cut by their timeouts. Environment: OUT, BUDGET, GPU_BUILD (build folder, default
# build/gpu), JOBS, ASSUME_DEVICE.
set -u
OUT=${OUT:-build/gpu-out}
BUDGET=${BUDGET:-480}
B=${GPU_BUILD:-build/gpu}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 8)}
REFDATA=third_party/refdata
CJSON=third_party/cjson
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
LOG=$OUT/all.log
: > "$SUMMARY"
: > "$LOG"
# the unit tests fail, not skip, when they find no device on the device machine
export LINSEQ_REQUIRE_CUDA=1 PYTHONUNBUFFERED=1
SECONDS=0
n_pass=0
n_fail=0
n_not_run=0

# record STEP RESULT SECONDS [DETAIL]: one summary line, written at once
record() {
    printf '%-34s %-30s %4ss  %s\n' "$1" "$2" "$3" "${4:-}" | tee -a "$SUMMARY"
}

# step NAME TIMEOUT CMD...: runs CMD with its output appended to all.log, cut at TIMEOUT
# seconds or at the budget left, whichever is less; records pass, FAIL (rc), TIMEOUT or
# skipped. The detail is the last "case:" line the output printed (the case in flight when a
# fault or a hang stopped it) and its last line. Returns CMD's exit status.
step() {
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET - SECONDS))
    if [ "$left" -lt 15 ]; then
        record "$name" "skipped (budget spent)" 0
        n_not_run=$((n_not_run + 1))
        return 1
    fi
    [ "$limit" -le "$left" ] || limit=$left
    printf '\n==== %s (limit %ss, at %ss): %s\n' "$name" "$limit" "$SECONDS" "$*" >> "$LOG"
    local from t0=$SECONDS rc
    from=$(($(wc -c < "$LOG") + 1))
    timeout -k 5 "$limit" "$@" >> "$LOG" 2>&1
    rc=$?
    local out last case_line result
    out=$(tail -c +"$from" "$LOG")
    last=$(printf '%s\n' "$out" | grep -v '^[[:space:]]*$' | tail -1 | cut -c1-160)
    case_line=$(printf '%s\n' "$out" | grep '^case: ' | tail -1 | cut -c1-120)
    case $rc in
        0) result=pass n_pass=$((n_pass + 1)) ;;
        124 | 137) result="TIMEOUT (${limit}s)" ;;
        *) result="FAIL (rc $rc)" ;;
    esac
    if [ "$rc" != 0 ]; then
        n_fail=$((n_fail + 1))
        [ -z "$case_line" ] || last="in $case_line | $last"
    fi
    record "$name" "$result" $((SECONDS - t0)) "$last"
    return "$rc"
}

# not_run NAME WHY: a step that cannot run here (no device, a failed build, missing data)
not_run() {
    record "$1" "$2" 0
    n_not_run=$((n_not_run + 1))
}

# ---- preflight -> env.txt
{
    echo "date: $(date -u +%FT%TZ)"
    echo "uname: $(uname -srm)   cpus: $(nproc 2>/dev/null)"
    for tool in make cc nvcc python3 compute-sanitizer nvidia-smi; do
        printf '%-18s %s\n' "$tool:" "$(command -v "$tool" || echo MISSING)"
    done
    echo "make: $(make --version 2>&1 | head -1)"
    echo "cc: $(cc --version 2>&1 | head -1)"
    echo "nvcc: $(timeout 20 nvcc --version 2>&1 | tail -2 | tr '\n' ' ')"
    echo "nvcc resolved: $(readlink -f "$(command -v nvcc)" 2>/dev/null)"
    echo "python3: $(python3 --version 2>&1)"
    echo "torch, its CUDA, device seen: $(timeout 60 python3 -c 'import torch
print(torch.__version__, torch.version.cuda, torch.cuda.is_available())' 2>&1 | tail -1)"
    echo "triton: $(timeout 30 python3 -c 'import triton; print(triton.__version__)' 2>&1 | tail -1)"
    echo "compute-sanitizer: $(timeout 20 compute-sanitizer --version 2>&1 | tail -1)"
    echo "nvidia-smi:"
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm \
        --format=csv 2>&1
    timeout 20 nvidia-smi 2>&1 | head -20
    echo "third_party: $(du -sh third_party 2>&1 | cut -f1)"
} > "$OUT/env.txt" 2>&1
record preflight "done" "$SECONDS" "see env.txt"

device=0
gpu=$(timeout 20 nvidia-smi -L 2>/dev/null | grep '^GPU ' | head -1)
if [ -n "$gpu" ]; then
    device=1
elif [ -e /dev/nvidia0 ]; then
    device=1 gpu="/dev/nvidia0 (nvidia-smi lists none)"
elif [ "${ASSUME_DEVICE:-0}" = 1 ]; then
    device=1 gpu="none, but ASSUME_DEVICE=1: the GPU steps run (and fail)"
fi
record device "$([ "$device" = 1 ] && echo found || echo "none")" 0 \
    "${gpu:-no GPU from nvidia-smi -L, no /dev/nvidia0: the GPU steps record no device}"

# ---- the carried folder
missing=""
for path in "$REFDATA/index.json" third_party/check_npy_dir.py "$CJSON/include/cjson/cJSON.h" \
    third_party/fla/fla; do
    [ -e "$path" ] || missing="$missing $path"
done
if [ -n "$missing" ]; then
    record carry "MISSING" 0 "not carried:$missing (make them with scripts/fetch-gpu-deps.sh)"
else
    record carry "ok" 0 "third_party/ is here"
fi

# ---- build: the library with the CUDA backend, the CUDA tests and the CLI. CUDA_HOME comes
# from the resolved nvcc (a symlinked nvcc, /usr/bin/nvcc, would give /usr otherwise).
built=0
nvcc_path=$(command -v nvcc || true)
if [ -z "$nvcc_path" ]; then
    record build "FAIL (no nvcc)" 0
    n_fail=$((n_fail + 1))
else
    cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc_path")")")
    make_vars=(CUDA=1 "BUILD=$B" "CUDA_HOME=$cuda_home")
    if [ -f "$CJSON/include/cjson/cJSON.h" ]; then
        make_vars+=("CFLAGS=-I$CJSON/include"
            "CJSON_LIBS=-L$CJSON/lib -lcjson -Wl,-rpath,$PWD/$CJSON/lib")
    fi
    step build 240 sh -c 'make "$@" && echo "built into $0"' "$B" "${make_vars[@]}" \
        -j"$JOBS" lib cuda-tests "$B/linseq" && built=1
fi
if [ "$built" = 1 ]; then
    step "ptxas: no spills, no stack frame" 30 sh scripts/cuda-check.sh "$B"
else
    not_run "ptxas: no spills, no stack frame" "not run (no build)"
fi

# why_not: empty when the GPU steps can run, else the reason they cannot
why_not() {
    if [ "$device" = 0 ]; then
        echo "no device"
    elif [ "$built" = 0 ]; then
        echo "not run (no build)"
    fi
}

# ---- every reference case on the GPU, one process per KDA mode, the telling modes first
for mode in "--mode recurrent" "--chunk-size 64" "--chunk-size 16" "--chunk-size 32" \
    "--chunk-size 128"; do
    name="refdata on cuda $mode"
    if [ -n "$(why_not)" ]; then
        not_run "$name" "$(why_not)"
    elif [ ! -f "$REFDATA/index.json" ]; then
        not_run "$name" "not run (no $REFDATA)"
    else
        # shellcheck disable=SC2086 # $mode is two words
        step "$name" 60 "$B/linseq" check --device cuda $mode "$REFDATA"
    fi
done

# ---- compute-sanitizer on one tiny case per kernel family (forward and backward each);
# a device or tool it does not support is recorded and the run goes on
sanitizer=$(command -v compute-sanitizer || true)
if [ -z "$sanitizer" ] && [ -n "$nvcc_path" ]; then
    for candidate in "$(dirname "$(readlink -f "$nvcc_path")")/compute-sanitizer" \
        "$(dirname "$(dirname "$(readlink -f "$nvcc_path")")")/compute-sanitizer/compute-sanitizer"; do
        [ -x "$candidate" ] && sanitizer=$candidate && break
    done
fi
tiny_cases="conv_B2_T33_D8_W4_silu_bias_nostate kda_gate_pc_B2_T16_H3_K32
kda_pc_B2_T65_H1_K32_V64_g1.0_l2_h0 ssm1_B2_T33_D64_N16_gate_h0"
for tool in memcheck racecheck; do
    for c in $tiny_cases; do
        name="sanitizer $tool ${c%%_B*}"
        if [ -n "$(why_not)" ]; then
            not_run "$name" "$(why_not)"
        elif [ -z "$sanitizer" ]; then
            not_run "$name" "not run (no compute-sanitizer)"
        elif [ ! -d "$REFDATA/$c" ]; then
            not_run "$name" "not run (no $REFDATA/$c)"
        else
            from=$(($(wc -c < "$LOG") + 1))
            if ! step "$name" 45 "$sanitizer" --tool "$tool" --error-exitcode 9 \
                "$B/linseq" check --device cuda "$REFDATA/$c" &&
                tail -c +"$from" "$LOG" | grep -qi 'not supported'; then
                record "$name" "not supported (go on)" 0 "this tool does not run here"
                n_fail=$((n_fail - 1)) n_not_run=$((n_not_run + 1))
                break
            fi
        fi
    done
done

# ---- the unit tests, one process each (each prints its case before the case's GPU work)
for t in tests/cuda/test_*.c; do
    name=$(basename "$t" .c)
    if [ -n "$(why_not)" ]; then
        not_run "$name" "$(why_not)"
    else
        step "$name" 120 "$B/tests/cuda/$name"
    fi
done

# ---- the benchmark last: linseq's rows, then fla-core's; bench.json rewritten per row
if [ -n "$(why_not)" ]; then
    not_run bench "$(why_not)"
else
    # bench.py starts no new shape past its own budget, 15 s inside the step's limit
    limit=$((BUDGET - SECONDS))
    [ "$limit" -le 240 ] || limit=240
    step bench "$limit" env PYTHONPATH="$PWD/python:$PWD/third_party/fla" \
        LINSEQ_LIBRARY="$PWD/$B/liblinseq.so" \
        python3 tools/gpu/bench.py --out "$OUT" --budget-s $((limit - 15))
fi

record total "$n_pass pass, $n_fail failed, $n_not_run not run" "$SECONDS" "budget ${BUDGET}s; files: $(ls "$OUT" | tr '\n' ' ')"
echo
echo "==== summary ($SUMMARY)"
cat "$SUMMARY"
sed -n '/^ceilings:/,$p' "$LOG"
[ "$n_fail" = 0 ]
