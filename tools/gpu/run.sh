#!/bin/bash
# bash tools/gpu/run.sh   (on the GPU machine, from the repository root; OUT = log folder)
#
# One device session, prepared so that a single call does everything: build the CUDA
# backend, check the compiler's register report, run the CUDA tests and every reference case
# on the GPU, then time linseq next to fla-core's Triton chunk_kda with the machine's two
# ceilings. Logs go under $OUT; the summary table is printed last. Needs third_party/ from
# scripts/fetch-gpu-deps.sh (fla-core, the reference cases, cJSON) carried with the tree.
set -u
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
REFDATA=third_party/refdata
JOBS=$(nproc 2>/dev/null || echo 8)
summary=()
note() { summary+=("$1"); echo "$1"; }

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
CJSON=third_party/cjson
make_vars=(CUDA=1 BUILD=build/gpu CFLAGS=-I$CJSON/include
           "CJSON_LIBS=-L$CJSON/lib -lcjson -Wl,-rpath,$PWD/$CJSON/lib")
if ! make "${make_vars[@]}" -j"$JOBS" lib cuda-tests build/gpu/linseq > "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"
    echo "tools/gpu/run.sh: the CUDA build failed (log: $OUT/build.log)"
    exit 1
fi
sh scripts/cuda-check.sh build/gpu > "$OUT/ptxas.txt" 2>&1
note "ptxas: $(tail -1 "$OUT/ptxas.txt")"

# CUDA tests: each compares its kernels with the CPU path (fp32 and bf16)
for t in build/gpu/tests/cuda/test_*; do
    name=$(basename "$t")
    timeout 600 "$t" > "$OUT/$name.log" 2>&1
    rc=$?
    note "$name: $([ $rc = 0 ] && echo pass || echo "FAIL (rc $rc)") - $(tail -1 "$OUT/$name.log")"
done

# every reference case on the GPU, in every KDA mode
for mode in "--mode recurrent" "--chunk-size 16" "--chunk-size 32" "--chunk-size 64" "--chunk-size 128"; do
    log="$OUT/refdata_cuda_${mode// /_}.log"
    timeout 600 build/gpu/linseq check --device cuda $mode "$REFDATA" > "$log" 2>&1
    note "refdata on CUDA ($mode): $(tail -1 "$log")"
done

# timings
PYTHONPATH=$PWD/python:$PWD/third_party/fla LINSEQ_LIBRARY=$PWD/build/gpu/liblinseq.so \
    timeout 900 python3 tools/gpu/bench.py --out "$OUT" > "$OUT/bench.log" 2> "$OUT/bench.err"
rc=$?
[ $rc = 0 ] || note "bench.py exited with $rc (see $OUT/bench.err)"

echo
echo "==== summary"
printf '%s\n' "${summary[@]}"
sed -n '/^ceilings:/,$p' "$OUT/bench.log"
