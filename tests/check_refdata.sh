#!/bin/sh
# sh tests/check_refdata.sh [--skip-if-absent] CLI REFDATA JUDGE
#
# REFDATA is a folder of reference cases (docs/semantics.md, "Case folders"): the ones
# tests/refgen/gen.py writes, judged by tests/refgen/judge.py, or another set with its own
# judge. With --skip-if-absent a missing REFDATA prints one line saying so and passes.
#
# Every reference case through the CLI, outputs and gradients: `CLI check` in recurrent mode
# and in chunked mode with each chunk size, and with the kernels of every instruction set the
# CPU runs (LINSEQ_ISA); then, as a cross-check that does not trust the CLI's own comparison,
# `CLI run` of every case (recurrent and chunked-64) on one thread judged by the independent
# Python script on every output and gradient file, and the same runs on 2 and 3 threads
# compared with it byte for byte. Prints one summary line per pass; the full output only when
# a pass fails.
set -e

SKIP_IF_ABSENT=0
if [ "${1:-}" = "--skip-if-absent" ]; then
    SKIP_IF_ABSENT=1
    shift
fi
if [ "$#" -ne 3 ]; then
    echo "usage: sh tests/check_refdata.sh [--skip-if-absent] CLI REFDATA JUDGE" >&2
    exit 2
fi
CLI=$1
REFDATA=$2
JUDGE=$3
if [ "$SKIP_IF_ABSENT" = 1 ] && [ ! -d "$REFDATA" ]; then
    echo "skip  no reference cases in '$REFDATA': only the generated cases were checked"
    exit 0
fi
if [ ! -x "$CLI" ]; then
    echo "check_refdata.sh: the CLI '$CLI' is missing or not executable (run make first)" >&2
    exit 2
fi
if [ ! -d "$REFDATA" ]; then
    echo "check_refdata.sh: no reference data folder '$REFDATA' (set REFDATA=...)" >&2
    exit 2
fi
if [ ! -f "$JUDGE" ]; then
    echo "check_refdata.sh: the judge '$JUDGE' is missing (set JUDGE=...)" >&2
    exit 2
fi
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import numpy' 2>/dev/null; then
    echo "check_refdata.sh: the judge needs a Python with NumPy: '$PYTHON' has none" \
         "(scripts/python-numpy.sh finds or makes one)" >&2
    exit 2
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/linseq_refdata.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
LOG=$WORK/log

# check MODE-OPTIONS...: the CLI's own comparison over every case. A skipped file fails the
# pass too: without --fwd-only nothing is skipped (a forward-only op's case lists no
# gradients), so a skip means gradients went unchecked.
check() {
    if "$CLI" check "$@" "$REFDATA" >"$LOG" 2>&1 && tail -n 1 "$LOG" | grep -q ' 0 skipped$'; then
        echo "ok    linseq check $* : $(tail -n 1 "$LOG")"
    else
        cat "$LOG"
        echo "check_refdata.sh: FAILED: $CLI check $* $REFDATA" >&2
        exit 1
    fi
}

# run_all OUT MODE-OPTIONS...: `run` every case into OUT/<case>.
run_all() {
    out=$1
    shift
    mkdir "$out"
    for case_dir in "$REFDATA"/*/; do
        [ -f "$case_dir/meta.json" ] || continue
        name=$(basename "$case_dir")
        if ! "$CLI" run "$case_dir" "$out/$name" "$@" >"$LOG" 2>&1; then
            cat "$LOG"
            echo "check_refdata.sh: FAILED: $CLI run $case_dir $out/$name $*" >&2
            exit 1
        fi
    done
}

# judge LABEL MODE-OPTIONS...: `run` every case on one thread into a fresh folder, then the
# judge; then the same on 2 and 3 threads must give the same bytes.
judge() {
    label=$1
    shift
    run_all "$WORK/$label" --threads 1 "$@"
    if "$PYTHON" "$JUDGE" "$REFDATA" "$WORK/$label" >"$LOG" 2>&1; then
        echo "ok    judge on linseq run $* : $(tail -n 1 "$LOG")"
    else
        cat "$LOG"
        echo "check_refdata.sh: FAILED: the judge rejects the files of '$CLI run $*'" >&2
        exit 1
    fi
    same_bits "$label" 2 "$@"
    same_bits "$label" 3 "$@"
    rm -rf "${WORK:?}/$label"
}

# isa_check ISA: the CLI's comparison with the kernels of one instruction set (each is
# compiled separately), recurrent and chunked; an ISA this CPU lacks is skipped, saying so.
isa_check() {
    for mode in "--mode recurrent" "--mode chunked --chunk-size 64"; do
        # shellcheck disable=SC2086 # mode holds two or four words
        if LINSEQ_ISA=$1 "$CLI" check $mode "$REFDATA" >"$LOG" 2>&1 &&
            tail -n 1 "$LOG" | grep -q ' 0 skipped$'; then
            echo "ok    LINSEQ_ISA=$1 linseq check $mode : $(tail -n 1 "$LOG")"
        elif head -n 1 "$LOG" | grep -q 'LINSEQ_ISA'; then
            echo "skip  LINSEQ_ISA=$1: $(head -n 1 "$LOG")"
            return 0
        else
            cat "$LOG"
            echo "check_refdata.sh: FAILED: LINSEQ_ISA=$1 $CLI check $mode $REFDATA" >&2
            exit 1
        fi
    done
}

# same_bits LABEL THREADS MODE-OPTIONS...: `run` every case with THREADS threads and compare
# every output and gradient file byte for byte with the 1-thread run in $WORK/LABEL.
same_bits() {
    label=$1
    threads=$2
    shift 2
    out=$WORK/$label-t$threads
    run_all "$out" --threads "$threads" "$@"
    if diff -r "$WORK/$label" "$out" >"$LOG" 2>&1; then
        echo "ok    linseq run $* : $threads threads give the bits of 1"
    else
        cat "$LOG"
        echo "check_refdata.sh: FAILED: $threads threads change the results of '$CLI run $*'" >&2
        exit 1
    fi
    rm -rf "$out"
}

check --mode recurrent
for cs in 16 32 64 128; do
    check --mode chunked --chunk-size "$cs"
done
for isa in scalar avx2 avx512; do
    isa_check "$isa"
done
judge recurrent --mode recurrent
judge chunked64 --mode chunked --chunk-size 64
echo "check_refdata.sh: every case of $REFDATA passes (CLI check on every ISA, the independent judge, the same bits on 1-3 threads)"
