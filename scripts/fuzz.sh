#!/bin/sh
# Builds the libFuzzer targets of fuzz/ with clang and runs each for SECONDS on a copy of its
# seed corpus (fuzz/corpus/TARGET is never modified); fails when any target finds a crash,
# a sanitizer report, a failed contract check, a leak, a timeout or an out-of-memory.
#
#   scripts/fuzz.sh SECONDS [TARGET...]     TARGET: X of a fuzz/fuzz_X.c (default: all of them)
#
# SECONDS = 0 runs every seed once and stops: the corpus doubles as a regression suite (it
# holds the inputs of the bugs fuzzing found).
#
# The library and the CLI's .npy and case code are compiled by the Makefile's own rules into
# build/fuzz/lib, with AddressSanitizer, UndefinedBehaviorSanitizer and the fuzzer's coverage
# instrumentation; the targets go to build/fuzz/, crash inputs to build/fuzz/artifacts/.
# Needs clang with its runtime libraries (libFuzzer, sanitizers) and cJSON. Environment: CLANG (default clang), LINSEQ_ISA (passed on:
# the kernels' instruction set), FUZZ_JOBS (make -j, default 2), FUZZ_CORPUS_OUT (a folder:
# each run's corpus is merged, minimised, into FUZZ_CORPUS_OUT/TARGET, to pick new seeds from).
set -eu
cd "$(dirname "$0")/.."

# Every fuzz/fuzz_X.c but the shared fuzz_util.c is a target: a new one needs no edit here.
all_targets=$(for f in fuzz/fuzz_*.c; do t=${f#fuzz/fuzz_}; t=${t%.c}; [ "$t" = util ] || echo "$t"; done)
usage="usage: scripts/fuzz.sh SECONDS [TARGET...] (targets: $(echo $all_targets))"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
secs=$1
shift
case $secs in '' | *[!0-9]*) echo "$usage" >&2; exit 2 ;; esac
targets=${*:-$all_targets}
for t in $targets; do
  [ -f "fuzz/fuzz_$t.c" ] || { echo "fuzz.sh: no target '$t' (fuzz/fuzz_$t.c)" >&2; exit 2; }
done

CLANG=${CLANG:-clang}
out=build/fuzz
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"

# Fail early, naming what is missing, rather than in the middle of the build.
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n);\nint LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; return (int)n * 0; }\n' \
  >"$probe/p.c"
if ! "$CLANG" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>"$probe/err"; then
  cat "$probe/err" >&2
  echo "fuzz.sh: $CLANG cannot build a libFuzzer target (Debian: clang, libclang-rt-dev)" >&2
  exit 2
fi

echo "== building the fuzz targets ($CLANG) into $out"
# The CLI's sources but main.c, as the Makefile links them into its tests.
cli_objs=""
for f in tools/linseq/*.c; do
  [ "$f" = tools/linseq/main.c ] || cli_objs="$cli_objs $out/lib/obj/${f%.c}.o"
done
# shellcheck disable=SC2086
make -s -j"${FUZZ_JOBS:-2}" BUILD="$out/lib" CC="$CLANG" OPT=-O1 \
  SAN="$san -fsanitize=fuzzer-no-link" "$out/lib/liblinseq-internal.a" $cli_objs
cflags="-std=c11 -D_POSIX_C_SOURCE=200809L -O1 -g -Wall -Wextra $san -fsanitize=fuzzer"
for t in $targets; do
  extra=""
  case $t in
    npy) extra="$out/lib/obj/tools/linseq/npy.o" ;;
    case) extra="$cli_objs" ;;
  esac
  # shellcheck disable=SC2086 # word splitting of the flag lists is intended
  "$CLANG" $cflags -Iinclude -Isrc -Itools/linseq -Ifuzz "fuzz/fuzz_$t.c" fuzz/fuzz_util.c $extra \
    "$out/lib/liblinseq-internal.a" -lcjson -lm -lpthread -o "$out/fuzz_$t"
done

work=$(mktemp -d)
trap 'rm -rf "$probe" "$work"' EXIT
export UBSAN_OPTIONS="print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
failed=""
if [ "$secs" = 0 ]; then what="running every seed once"; else what="fuzzing each target for $secs s"; fi
echo "== $what${LINSEQ_ISA:+ (LINSEQ_ISA=$LINSEQ_ISA)}"
for t in $targets; do
  mkdir -p "$work/$t/corpus" "$work/$t/tmp" "$out/artifacts/$t"
  if [ -d "fuzz/corpus/$t" ]; then cp -R "fuzz/corpus/$t/." "$work/$t/corpus/"; fi
  dict=""
  [ -f "fuzz/$t.dict" ] && dict="-dict=fuzz/$t.dict"
  # TMPDIR: the targets that write files make their private folders there.
  # shellcheck disable=SC2086
  # -max_total_time=0 would mean "no limit"
  if [ "$secs" = 0 ]; then limit=-runs=0; else limit=-max_total_time=$secs; fi
  if TMPDIR="$work/$t/tmp" "$out/fuzz_$t" "$limit" -print_final_stats=1 \
    -timeout=60 -rss_limit_mb=4096 -artifact_prefix="$out/artifacts/$t/" $dict \
    "$work/$t/corpus" >"$work/$t/log" 2>&1; then
    result=ok
  else
    result="FAILED (exit $?)"
    failed="$failed $t"
  fi
  if [ -n "${FUZZ_CORPUS_OUT:-}" ] && [ "$result" = ok ]; then
    mkdir -p "$FUZZ_CORPUS_OUT/$t"
    TMPDIR="$work/$t/tmp" "$out/fuzz_$t" -merge=1 "$FUZZ_CORPUS_OUT/$t" "$work/$t/corpus" \
      >"$work/$t/merge.log" 2>&1 || echo "fuzz.sh: merging the $t corpus failed" >&2
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t/log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/$t/log")
  printf '%-8s %10s execs %8s exec/s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$result"
  if [ "$result" != ok ]; then
    grep -E 'ERROR|FUZZ CHECK|runtime error|SUMMARY|Test unit written|artifact' "$work/$t/log" |
      head -n 20 | sed 's/^/    /'
    tail -n 40 "$work/$t/log" | sed 's/^/    | /'
  fi
done
if [ -n "$failed" ]; then
  echo "fuzz.sh: failures in:$failed (inputs in $out/artifacts/; rerun one with $out/fuzz_TARGET FILE)" >&2
  exit 1
fi
echo "fuzz.sh: no failures"
