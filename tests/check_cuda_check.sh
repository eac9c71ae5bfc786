#!/bin/sh
# sh tests/check_cuda_check.sh
#
# scripts/cuda-check.sh on synthetic ptxas reports (no nvcc needed): it has to fail on a
# kernel with a stack frame and no spills, on one that spills with no stack frame, and on a
# non-inlined device function with a stack frame, and pass on a clean report. Each report
# is the text ptxas -v prints for one object (BUILD/obj/src/cuda/NAME.o.ptxas).
set -u
cd "$(dirname "$0")/.." || exit 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

# report NAME STACK STORES LOADS: one kernel's report for sm_80 and sm_90a, with the given
# stack frame and spills on sm_90a only (a regression on one architecture must show)
report() {
    cat <<EOF
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '$1' for 'sm_80'
ptxas info    : Function properties for $1
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 80 registers, used 1 barriers, 2048 bytes smem, 512 bytes cmem[0]
ptxas info    : Compile time = 565.630 ms
ptxas info    : Compiling entry function '$1' for 'sm_90a'
ptxas info    : Function properties for $1
    $2 bytes stack frame, $3 bytes spill stores, $4 bytes spill loads
ptxas info    : Used 96 registers, used 1 barriers, 2048 bytes smem, 512 bytes cmem[0]
ptxas info    : Compile time = 612.001 ms
EOF
}

# a kernel that calls a non-inlined device function: ptxas reports the callee's frame under
# its own name, with no "Used N registers" line
callee_report() {
    cat <<EOF
ptxas info    : Function properties for _Z6helperPf
    $1 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'caller' for 'sm_80'
ptxas info    : Function properties for caller
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, 380 bytes cmem[0]
EOF
}

# expect WANT LABEL: runs cuda-check.sh on $tmp/LABEL and compares its exit status with WANT
# (pass or fail)
expect() {
    if sh scripts/cuda-check.sh "$tmp/$2" > "$tmp/$2.out" 2>&1; then got=pass; else got=fail; fi
    if [ "$got" = "$1" ]; then
        echo "  ok: $2 -> $got"
    else
        echo "FAIL: cuda-check.sh on $2: expected $1, got $got; its output:" >&2
        sed 's/^/    /' "$tmp/$2.out" >&2
        status=1
    fi
}

make_case() {
    mkdir -p "$tmp/$1/obj/src/cuda"
    echo "$tmp/$1/obj/src/cuda/kernel.o.ptxas"
}

report kern 0 0 0 > "$(make_case clean)"
report kern 64 0 0 > "$(make_case stack_frame)"
report kern 0 8 0 > "$(make_case spill_stores)"
report kern 0 0 8 > "$(make_case spill_loads)"
callee_report 0 > "$(make_case callee_clean)"
callee_report 32 > "$(make_case callee_stack_frame)"

echo "check_cuda_check.sh: scripts/cuda-check.sh on synthetic ptxas reports"
expect pass clean
expect fail stack_frame
expect fail spill_stores
expect fail spill_loads
expect pass callee_clean
expect fail callee_stack_frame
# the registers, stack and spills it prints are the report's, field by field
if ! grep -q 'sm_90a.*regs  96 stack   64 spill 0' "$tmp/stack_frame.out"; then
    echo "FAIL: cuda-check.sh did not print 'regs 96 stack 64 spill 0' for the stack frame:" >&2
    sed 's/^/    /' "$tmp/stack_frame.out" >&2
    status=1
fi
if [ "$status" = 0 ]; then
    echo "check_cuda_check.sh: every synthetic report judged right"
fi
exit "$status"
