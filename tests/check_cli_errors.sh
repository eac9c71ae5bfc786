#!/bin/sh
# sh tests/check_cli_errors.sh CLI REFDATA
#
# REFDATA: a folder of reference cases, normally the generated ones (tests/refgen).
#
# Malformed input through the CLI: bad usage, missing and wrong paths, broken meta.json
# (syntax, missing keys, wrong types and values), missing, corrupt and mis-shaped .npy files,
# values the library rejects, devices and FIFOs in place of files (under a timeout), output
# folders that cannot be written or are the case folder, and a failed re-run over an earlier
# complete set (which must stay as it was). Every case must
# end with exactly one line on stderr, a nonzero exit status below 128 (128 and above is a
# signal: a crash), and no output file left behind. Each case starts from a fresh copy of a
# small reference case. Prints one summary line, or every failing case.
set -u

if [ "$#" -ne 2 ]; then
    echo "usage: sh tests/check_cli_errors.sh CLI REFDATA" >&2
    exit 2
fi
CLI=$1
REFDATA=$2
if [ ! -x "$CLI" ]; then
    echo "check_cli_errors.sh: the CLI '$CLI' is missing or not executable (run make first)" >&2
    exit 2
fi
# The cases by name pattern, so that the generated set (tests/refgen) and the outside set
# both serve: a one-token KDA case with h0 and K = 16, a packed KDA case, a conv case.
first_case() {
    for c in "$@"; do
        [ -f "$c/meta.json" ] && { echo "$c"; return; }
    done
    echo "$1"
}
KDA_CASE=$(first_case "$REFDATA"/kda_pc_B1_T1_H1_K16_V16_*_h0)
VARLEN_CASE=$(first_case "$REFDATA"/kda_varlen*_pc_B1_*)
CONV_CASE=$(first_case "$REFDATA"/conv_B1_T2_D8_W4_none_nobias_state*)
for c in "$KDA_CASE" "$VARLEN_CASE" "$CONV_CASE"; do
    if [ ! -f "$c/meta.json" ]; then
        echo "check_cli_errors.sh: no reference case '$c' (set REFDATA=...)" >&2
        exit 2
    fi
done
if ! command -v python3 >/dev/null 2>&1; then
    echo "check_cli_errors.sh: python3 is needed to edit the cases (scripts/install-deps.sh)" >&2
    exit 2
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/linseq_cli_errors.XXXXXX")
trap 'chmod -R u+w "$WORK" 2>/dev/null; rm -rf "$WORK"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
CASE=$WORK/case
OUT=$WORK/out
passed=0
failed=0

# fresh SOURCE: $CASE becomes a writable copy of SOURCE; $OUT does not exist.
fresh() {
    chmod -R u+w "$CASE" "$OUT" 2>/dev/null
    rm -rf "$CASE" "$OUT"
    cp -R "$1" "$CASE"
    chmod -R u+w "$CASE"
}

# meta PYTHON: runs PYTHON with m = $CASE/meta.json as a dict, then writes m back.
meta() {
    python3 -c 'import json, sys
p = sys.argv[1]
with open(p) as f:
    m = json.load(f)
exec(sys.argv[2])
with open(p, "w") as f:
    json.dump(m, f)' "$CASE/meta.json" "$1"
}

# npy NAME DESCR SHAPE [COUNT]: replaces $CASE/NAME.npy with a well-formed file of that dtype
# and shape holding COUNT elements (default: as many as the shape has).
npy() {
    python3 -c 'import math, struct, sys
path, descr, shape = sys.argv[1:4]
dims = eval(shape)
count = int(sys.argv[4]) if len(sys.argv) > 4 else math.prod(dims)
head = "{%r: %r, %r: False, %r: %s, }" % ("descr", descr, "fortran_order", "shape", shape)
head += " " * ((64 - (10 + len(head) + 1) % 64) % 64) + "\n"
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode())
    f.write(b"\0" * (count * int(descr[2:])))' "$CASE/$1.npy" "$2" "$3" ${4:+"$4"}
}

# expect LABEL NEEDLE CMD...: CMD must fail with exit status 1..127, print exactly one line
# on stderr containing NEEDLE, and leave no file in $OUT (a folder that existed is fine).
expect() {
    label=$1
    needle=$2
    shift 2
    rc=0
    "$@" >"$WORK/stdout" 2>"$WORK/stderr" </dev/null || rc=$?
    lines=$(wc -l <"$WORK/stderr")
    why=""
    if [ "$rc" -eq 0 ]; then
        why="exit status 0"
    elif [ "$rc" -eq 124 ]; then
        why="still running after ${LIMIT}s (timeout's status 124): it hangs or reads without end"
    elif [ -n "$want_rc" ] && [ "$rc" -ne "$want_rc" ]; then
        why="exit status $rc, expected $want_rc"
    elif [ "$rc" -ge 128 ]; then
        why="exit status $rc (a crash)"
    elif [ "$lines" -ne 1 ]; then
        why="$lines lines on stderr"
    elif ! grep -qF -- "$needle" "$WORK/stderr"; then
        why="stderr does not say '$needle'"
    elif [ -e "$OUT" ] && [ -n "$(find "$OUT" ! -type d -print)" ]; then
        why="files left in the output folder: $(find "$OUT" ! -type d -print | tr '\n' ' ')"
    fi
    if [ -z "$why" ]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL  $label: $why"
        echo "      command: $*"
        sed 's/^/      stderr: /' "$WORK/stderr" | head -n 5
    fi
}

run() { expect "$1" "$2" "$CLI" run "$CASE" "$OUT"; }
want_rc=""

# run_bounded LABEL NEEDLE: `run` on a case whose file is a device or a pipe. It must refuse
# it at once, exit status 2 (bad input), instead of reading without end or waiting for a
# writer: the timeout turns such a regression into a failure instead of a hang.
LIMIT=3
run_bounded() {
    want_rc=2
    expect "$1" "$2" timeout "$LIMIT" "$CLI" run "$CASE" "$OUT"
    want_rc=""
}
check() { expect "$1" "$2" "$CLI" check "$CASE"; }

# check_fails LABEL NEEDLE: `check` of a case the library rejects. That is a failing
# implementation, not bad input, so it is a FAIL line on stdout (naming the call, with the
# library's message) and exit status 1, and nothing on stderr.
check_fails() {
    rc=0
    "$CLI" check "$CASE" >"$WORK/stdout" 2>"$WORK/stderr" </dev/null || rc=$?
    if [ "$rc" -eq 1 ] && [ ! -s "$WORK/stderr" ] && grep "^FAIL" "$WORK/stdout" | grep -qF -- "$2"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL  $1: exit status $rc, or no FAIL line saying '$2', or text on stderr"
        sed 's/^/      /' "$WORK/stdout" "$WORK/stderr" | head -n 6
    fi
}

# ---- usage -----------------------------------------------------------------------------
fresh "$KDA_CASE"
expect "no command" "no command" "$CLI"
expect "unknown command" "unknown command 'frob'" "$CLI" frob
expect "run: one operand" "needs CASE_DIR and OUT_DIR" "$CLI" run "$CASE"
expect "run: three operands" "needs CASE_DIR and OUT_DIR" "$CLI" run "$CASE" "$OUT" extra
expect "check: no operand" "at least one folder" "$CLI" check
expect "demo: an operand" "demo takes no operand" "$CLI" demo extra
expect "unknown option" "unknown option '--frob'" "$CLI" run "$CASE" "$OUT" --frob
expect "unknown mode" "--mode: 'sideways'" "$CLI" run "$CASE" "$OUT" --mode sideways
expect "mode without value" "'--mode' needs a value" "$CLI" run "$CASE" "$OUT" --mode
expect "chunk size 48" "--chunk-size: '48'" "$CLI" check "$CASE" --chunk-size 48
expect "chunk size text" "--chunk-size: 'abc'" "$CLI" check "$CASE" --chunk-size=abc
expect "threads 0" "--threads: '0'" "$CLI" run "$CASE" "$OUT" --threads 0
expect "threads negative" "--threads: '-2'" "$CLI" run "$CASE" "$OUT" --threads=-2
expect "threads huge" "--threads: '99999999999'" "$CLI" run "$CASE" "$OUT" --threads 99999999999
expect "unknown device" "--device: 'gpu'" "$CLI" run "$CASE" "$OUT" --device gpu
expect "flag with a value" "takes no value" "$CLI" run "$CASE" "$OUT" --fwd-only=yes
expect "demo mode" "unknown option '--mode'" "$CLI" demo --mode chunked
expect "bench unknown op" "frob" "$CLI" bench frob
expect "bench bad size" "--T" "$CLI" bench kda --T 0
# A bad LINSEQ_ISA fails every library call: one line naming it, not a FAIL line per case.
expect "check: bad LINSEQ_ISA" "LINSEQ_ISA" env LINSEQ_ISA=avx-2 "$CLI" check "$CASE"
expect "bench: bad LINSEQ_ISA" "LINSEQ_ISA" env LINSEQ_ISA=sse4 "$CLI" bench kda --T 16

# ---- paths -----------------------------------------------------------------------------
expect "run: no such case" "cannot open" "$CLI" run "$WORK/nonexistent" "$OUT"
expect "check: no such folder" "nonexistent" "$CLI" check "$WORK/nonexistent"
expect "run: case is a file" "meta.json" "$CLI" run "$CASE/q.npy" "$OUT"
fresh "$KDA_CASE"
rm "$CASE/meta.json"
run "no meta.json" "meta.json: cannot open"
check "check: no meta.json" "no meta.json"
fresh "$KDA_CASE"
rm "$CASE/meta.json" && mkdir "$CASE/meta.json"
run "meta.json is a folder" "meta.json"

# ---- --device cuda without a GPU, and run over a folder of cases ------------------------
# Where no GPU is visible, --device cuda is one usage error, whatever the build: no CUDA
# backend, or no device for it.
if ! nvidia-smi -L >/dev/null 2>&1; then
    fresh "$KDA_CASE"
    expect "check --device cuda, no GPU" "--device cuda:" "$CLI" check "$CASE" --device cuda
    expect "run --device cuda, no GPU" "--device cuda:" "$CLI" run "$CASE" "$OUT" --device cuda
fi
# run over a folder of case folders: each case into OUT/<case>. A broken case is reported
# (its own line and a summary) and the others are still written; exit status 2.
rm -rf "$WORK/cases" "$OUT"
mkdir "$WORK/cases"
cp -R "$KDA_CASE" "$WORK/cases/a_kda" && cp -R "$CONV_CASE" "$WORK/cases/b_conv"
chmod -R u+w "$WORK/cases"
rc=0
"$CLI" run "$WORK/cases" "$OUT" >/dev/null 2>"$WORK/stderr" || rc=$?
if [ "$rc" -eq 0 ] && [ ! -s "$WORK/stderr" ] && [ -f "$OUT/a_kda/o.npy" ] &&
    [ -f "$OUT/b_conv/y.npy" ]; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    echo "FAIL  run over a folder of cases: exit status $rc, or a case's files missing"
    sed 's/^/      stderr: /' "$WORK/stderr" | head -n 5
fi
rm -rf "$OUT"
rm "$WORK/cases/a_kda/q.npy"
rc=0
"$CLI" run "$WORK/cases" "$OUT" >/dev/null 2>"$WORK/stderr" || rc=$?
if [ "$rc" -eq 2 ] && grep -q "q.npy" "$WORK/stderr" && grep -q "1 of the 2 cases" "$WORK/stderr" &&
    [ ! -e "$OUT/a_kda/o.npy" ] && [ -f "$OUT/b_conv/y.npy" ]; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    echo "FAIL  run over a folder with a broken case: exit status $rc, or wrong files or stderr"
    sed 's/^/      stderr: /' "$WORK/stderr" | head -n 5
fi
rm -rf "$WORK/cases" "$OUT"

# ---- meta.json syntax ------------------------------------------------------------------
fresh "$KDA_CASE"
: >"$CASE/meta.json"
run "empty meta.json" "malformed JSON"
printf '{"op": "kda",\n "B": 1,\n' >"$CASE/meta.json"
run "truncated JSON" "malformed JSON (line 3)"
check "check: truncated JSON" "malformed JSON"
printf '[1, 2, 3]' >"$CASE/meta.json"
run "top level a list" "not an object"
printf '"kda"' >"$CASE/meta.json"
run "top level a string" "not an object"
printf '{"op": "kda"} trailing' >"$CASE/meta.json"
run "trailing garbage" "malformed JSON"
printf '{"op": "kda"\0}' >"$CASE/meta.json"
run "NUL byte" "NUL byte"
head -c 17000000 /dev/zero | tr '\0' ' ' >"$CASE/meta.json"
run "huge meta.json" "larger than"
# a duplicate key: cJSON would read the first, Python's json the last
fresh "$KDA_CASE"
sed 's/^{/{"op": "ssm1", /' "$KDA_CASE/meta.json" >"$CASE/meta.json"
run "duplicate key" 'duplicate key "op"'
check "check: duplicate key" 'duplicate key "op"'
fresh "$KDA_CASE"; meta 'm["options_probe"] = {"a": 1}'
sed 's/"options_probe": {"a": 1}/"options_probe": {"a": 1, "a": 2}/' "$CASE/meta.json" >"$WORK/meta"
mv "$WORK/meta" "$CASE/meta.json"
run "duplicate nested key" 'duplicate key "a" in "options_probe"'

# ---- meta.json keys, types and values --------------------------------------------------
fresh "$KDA_CASE"; meta 'del m["op"]'
run "op missing" '"op" is missing'
fresh "$KDA_CASE"; meta 'm["op"] = 42'
run "op a number" '"op" must be a string'
fresh "$KDA_CASE"; meta 'm["op"] = "frob"'
run "unknown op" 'unknown op "frob"'
check "check: unknown op" 'unknown op "frob"'
fresh "$KDA_CASE"; meta 'del m["inputs"]'
run "inputs missing" 'the list "inputs" is missing'
fresh "$KDA_CASE"; meta 'del m["outputs"]'
run "outputs missing" 'the list "outputs" is missing'
fresh "$KDA_CASE"; meta 'm["inputs"] = "q"'
run "inputs a string" '"inputs" must be a list'
fresh "$KDA_CASE"; meta 'm["inputs"] = [1, 2]'
run "inputs of numbers" '"inputs" holds an entry'
fresh "$KDA_CASE"; meta 'm["inputs"].append("../meta")'
run "input name leaving the folder" '"inputs" holds an entry'
fresh "$KDA_CASE"; meta 'm["inputs"].append("q")'
run "input listed twice" 'lists "q" twice'
fresh "$KDA_CASE"; meta 'm["inputs"] += ["x%d" % i for i in range(20)]'
run "too many inputs" 'more than'
fresh "$KDA_CASE"; meta 'del m["B"]'
run "size missing" 'the size "B" is missing'
fresh "$KDA_CASE"; meta 'm["B"] = "one"'
run "size a string" '"B" must be an integer >= 1'
fresh "$KDA_CASE"; meta 'm["K"] = 2.5'
run "size fractional" '"K" must be an integer >= 1'
fresh "$KDA_CASE"; meta 'm["T"] = 0'
run "size zero" '"T" must be an integer >= 1'
fresh "$KDA_CASE"; meta 'm["V"] = -16'
run "size negative" '"V" must be an integer >= 1'
fresh "$KDA_CASE"; meta 'm["H"] = 1e300'
run "size huge" '"H" must be an integer >= 1'
fresh "$KDA_CASE"; meta 'm["B"] = True'
run "size a bool" '"B" must be an integer >= 1'
fresh "$KDA_CASE"; meta 'm["HV"] = 2**52; m["K"] = 2**52'
run "HV*K overflows" 'overflow'
fresh "$KDA_CASE"; meta 'm["T"] = 2**40'
run "sizes larger than the files" 'q.npy: shape'
fresh "$KDA_CASE"; meta 'm["use_qk_l2norm"] = "yes"'
run "bool a string" '"use_qk_l2norm" must be true or false'
fresh "$KDA_CASE"; meta 'm["scale"] = "big"'
run "float a string" '"scale" must be a number'
fresh "$KDA_CASE"; meta 'm["decay"] = "sideways"'
run "unknown decay" '"decay" is "sideways"'
fresh "$CONV_CASE"; meta 'm["activation"] = "tanh"'
run "unknown activation" '"activation" is "tanh"'
fresh "$KDA_CASE"; meta 'm["inputs"].remove("h0")'
run "has_h0 without h0" '"has_h0" is true'
fresh "$KDA_CASE"; meta 'm["inputs"].append("A_log")'
run "input the op does not take" 'A_log'
fresh "$KDA_CASE"; meta 'm["outputs"].append("y")'
run "output the op does not produce" '"outputs" lists "y"'
fresh "$KDA_CASE"; meta 'm["grads"].append("dx")'
run "gradient the op does not compute" '"grads" lists "dx"'
fresh "$KDA_CASE"; meta 'm["upstream_grads"].remove("d_o")'
run "grads without d_o" 'lacks "d_o"'

# ---- values the library rejects (the case loads, the op call fails) ---------------------
fresh "$KDA_CASE"; meta 'm["scale"] = 1e39'
run "scale overflows float" 'scale = inf'
check_fails "check: scale overflows float" 'backward: linseq_kda_backward: scale = inf'
fresh "$KDA_CASE"; meta 'm["gate_in_kernel"] = True; m["lower_bound"] = 2.0'
run "positive lower bound" 'lower_bound = 2'
fresh "$VARLEN_CASE"
python3 -c 'import struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = len(b) // 8 * 8
struct.pack_into("<q", b, n - 16, 999)
open(p, "wb").write(bytes(b))' "$CASE/cu_seqlens.npy"
run "cu_seqlens decreasing" 'cu_seqlens'
check_fails "check: cu_seqlens decreasing" 'cu_seqlens'

# ---- .npy files ------------------------------------------------------------------------
fresh "$KDA_CASE"; rm "$CASE/q.npy"
run "missing input file" 'q.npy: cannot open'
check "check: missing input file" 'q.npy'
fresh "$KDA_CASE"; rm "$CASE/d_o.npy"
run "missing upstream gradient file" 'd_o.npy'
fresh "$KDA_CASE"; rm "$CASE/q.npy" && mkdir "$CASE/q.npy"
run "input file is a folder" 'q.npy'
fresh "$KDA_CASE"; : >"$CASE/k.npy"
run "empty .npy" 'k.npy'
fresh "$KDA_CASE"; head -c 100 "$KDA_CASE/v.npy" >"$CASE/v.npy"
run "truncated .npy" 'v.npy'
fresh "$KDA_CASE"; printf 'not a numpy file at all, just text padding it out\n' >"$CASE/beta.npy"
run "bad magic" 'beta.npy'
fresh "$KDA_CASE"; npy q '<f8' '(1, 1, 1, 16)'
run "float64 input" "q.npy: unsupported dtype '<f8'"
check "check: float64 input" "q.npy: unsupported dtype '<f8'"
fresh "$KDA_CASE"; npy q '>f4' '(1, 1, 1, 16)'
run "big-endian input" 'q.npy'
fresh "$KDA_CASE"; npy q '<i8' '(1, 1, 1, 16)'
run "int64 input" 'q.npy: dtype'
fresh "$KDA_CASE"; npy q '<f4' '(1, 1, 16)'
run "input of the wrong rank" 'q.npy: shape'
fresh "$KDA_CASE"; npy q '<f4' '(1, 1, 1, 15)'
run "input of the wrong shape" 'q.npy: shape'
fresh "$KDA_CASE"; npy q '<f4' '(1, 1, 1, 16)' 15
run "input shorter than its shape" 'q.npy'
fresh "$KDA_CASE"; npy q '<f4' '(1, 1, 1, 16)' 17
run "input longer than its shape" 'q.npy'
fresh "$KDA_CASE"; npy q '<f4' '(4611686018427387904, 1, 1, 16)' 16
run "input with an absurd shape" 'q.npy'
fresh "$KDA_CASE"; npy d_ht '<f4' '(1, 1, 16, 15)'
run "upstream gradient of the wrong shape" 'd_ht.npy: shape'
fresh "$VARLEN_CASE"; npy cu_seqlens '<f4' '(4,)'
run "float cu_seqlens" 'cu_seqlens.npy: dtype'
fresh "$VARLEN_CASE"; npy cu_seqlens '<i8' '(1,)'
run "cu_seqlens without a sequence" 'cu_seqlens.npy: shape'
fresh "$KDA_CASE"
python3 -c 'import sys
p = sys.argv[1]
b = open(p, "rb").read().replace(b"False", b"True ", 1)
open(p, "wb").write(b)' "$CASE/q.npy"
run "Fortran-order input" 'q.npy'
# devices and pipes in place of a file: no size to check a header against, and no end
for dev in /dev/zero /dev/urandom; do
    [ -c "$dev" ] || continue
    fresh "$KDA_CASE"; rm "$CASE/q.npy" && ln -s "$dev" "$CASE/q.npy"
    run_bounded "input linked to $dev" 'q.npy: not a regular file'
done
fresh "$KDA_CASE"; rm "$CASE/q.npy" && mkfifo "$CASE/q.npy"
run_bounded "input a FIFO" 'q.npy: not a regular file'
fresh "$KDA_CASE"; rm "$CASE/meta.json" && mkfifo "$CASE/meta.json"
run_bounded "meta.json a FIFO" 'meta.json: not a regular file'
fresh "$KDA_CASE"; rm "$CASE/meta.json" && ln -s /dev/zero "$CASE/meta.json"
run_bounded "meta.json linked to /dev/zero" 'meta.json: not a regular file'

# ---- output folders --------------------------------------------------------------------
fresh "$KDA_CASE"
: >"$WORK/a_file"
expect "output folder under a file" "cannot create the output folder" "$CLI" run "$CASE" "$WORK/a_file/out"
expect "output folder is a file" "not a folder" "$CLI" run "$CASE" "$WORK/a_file"
# the last gradient cannot be written (a folder has its name): the files written before it
# must be removed again, and no temporary file may remain
mkdir -p "$OUT/dh0.npy"
run "an output name taken by a folder" 'dh0.npy: cannot write'
rm -rf "$OUT"
if [ "$(id -u)" -ne 0 ]; then
    mkdir "$WORK/readonly" && chmod 555 "$WORK/readonly"
    expect "read-only output folder" "readonly" "$CLI" run "$CASE" "$WORK/readonly"
    expect "output under a read-only folder" "cannot create the output folder" \
        "$CLI" run "$CASE" "$WORK/readonly/out"
fi
# the output folder is the case folder, by any spelling: refused, the reference files intact
fresh "$KDA_CASE"
ln -s "$CASE" "$WORK/case_link"
for out in "$CASE" "$CASE/." "$WORK/case_link"; do
    expect "output folder is the case folder ($out)" "is the case folder" "$CLI" run "$CASE" "$out"
    if ! diff -r "$KDA_CASE" "$CASE" >/dev/null; then
        failed=$((failed + 1))
        echo "FAIL  run into the case folder ($out) changed it"
        fresh "$KDA_CASE"
    fi
done
rm -f "$WORK/case_link"
# a re-run that fails on a later file leaves the earlier complete set as it was
fresh "$KDA_CASE"
"$CLI" run "$CASE" "$OUT" >/dev/null 2>&1
sums() { (cd "$OUT" && cksum o.npy ht.npy dq.npy 2>&1); }
before=$(sums)
meta 'm["scale"] = 0.125'
rm "$OUT/dh0.npy" && mkdir "$OUT/dh0.npy"
rc=0
"$CLI" run "$CASE" "$OUT" >/dev/null 2>"$WORK/stderr" || rc=$?
if [ "$rc" -eq 2 ] && [ "$(sums)" = "$before" ] && [ -z "$(find "$OUT" -name '.*' -type f)" ]; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    echo "FAIL  a failed re-run changed the earlier outputs (exit status $rc):"
    sums | sed 's/^/      now: /'
    echo "$before" | sed 's/^/      was: /'
fi
rm -rf "$OUT"

# a successful run after all this still writes every file, and nothing else
fresh "$KDA_CASE"
if "$CLI" run "$CASE" "$OUT" >/dev/null 2>"$WORK/stderr" &&
    [ "$(find "$OUT" -type f | wc -l)" -eq "$(python3 -c 'import json, sys
m = json.load(open(sys.argv[1]))
print(len(m["outputs"]) + len(m.get("grads", [])))' "$CASE/meta.json")" ] &&
    [ -z "$(find "$OUT" -name '.*' -type f)" ]; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    echo "FAIL  a valid run after the error cases: $(cat "$WORK/stderr")"
fi

# CMD --help prints that command's usage alone (exit status 0), not the whole of --help
for cmd in run check demo; do
    rc=0
    "$CLI" "$cmd" --help >"$WORK/stdout" 2>"$WORK/stderr" || rc=$?
    others=$(grep -c -E "^  linseq (run|check|demo|bench) " "$WORK/stdout")
    if [ "$rc" -eq 0 ] && grep -q "^  linseq $cmd " "$WORK/stdout" && [ "$others" -eq 1 ] &&
        ! grep -q "^bench" "$WORK/stdout" && [ ! -s "$WORK/stderr" ]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL  linseq $cmd --help: exit status $rc, or not its own usage alone:"
        head -n 5 "$WORK/stdout" | sed 's/^/      /'
    fi
done
if [ "$("$CLI" demo --help | grep -c -- '--mode')" -ne 0 ]; then
    failed=$((failed + 1))
    echo "FAIL  linseq demo --help lists --mode, which demo does not take"
fi

if [ "$failed" -ne 0 ]; then
    echo "check_cli_errors.sh: $failed of $((passed + failed)) malformed-input cases FAILED" >&2
    exit 1
fi
echo "check_cli_errors.sh: $passed malformed-input cases: one line on stderr, a clean exit, no file left"
