#!/bin/sh
# sh tests/check_refdata.sh [--skip-if-absent] CLI REFDATA JUDGE
#
# REFDATA is a folder of reference cases (docs/semantics.md, "Case folders"): the ones
# tests/refgen/gen.py writes, judged by tests/refgen/judge.py, or another set with its own
# judge. With --skip-if-absent a missing REFDATA prints one line saying so and passes.
#
# Every reference case through the CLI, outputs and gradients: `CLI check` in recurrent mode
# and in chunked mode with each chunk size, then, as a cross-check that does not trust the
# CLI's own comparison, `CLI run` of every case (recurrent and chunked-64) judged by the
# independent Python script on every output and gradient file. Prints one summary line per
# pass; the full output only when a pass fails.
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
# pass too: every case has a backward, so a skip means the gradients went unchecked.
check() {
    if "$CLI" check "$@" "$REFDATA" >"$LOG" 2>&1 && tail -n 1 "$LOG" | grep -q ' 0 skipped$'; then
        echo "ok    linseq check $* : $(tail -n 1 "$LOG")"
    else
        cat "$LOG"
        echo "check_refdata.sh: FAILED: $CLI check $* $REFDATA" >&2
        exit 1
    fi
}

# judge LABEL MODE-OPTIONS...: `run` every case into a fresh folder, then the judge.
judge() {
    label=$1
    shift
    out=$WORK/$label
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
    if "$PYTHON" "$JUDGE" "$REFDATA" "$out" >"$LOG" 2>&1; then
        echo "ok    judge on linseq run $* : $(tail -n 1 "$LOG")"
    else
        cat "$LOG"
        echo "check_refdata.sh: FAILED: the judge rejects the files of '$CLI run $*'" >&2
        exit 1
    fi
    rm -rf "$out"
}

check --mode recurrent
for cs in 16 32 64 128; do
    check --mode chunked --chunk-size "$cs"
done
judge recurrent --mode recurrent
judge chunked64 --mode chunked --chunk-size 64
echo "check_refdata.sh: every case of $REFDATA passes (CLI check and the independent judge)"
