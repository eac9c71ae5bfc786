#!/bin/sh
# sh scripts/cuda-check.sh BUILD_DIR
#
# Reads ptxas's report of every CUDA object under BUILD_DIR/obj/src/cuda and fails when a
# kernel spills registers or keeps a stack frame (local memory in the hot loops), printing
# each kernel's registers, shared memory and stack so a change that grows them shows up.
set -e
dir=${1:?usage: sh scripts/cuda-check.sh BUILD_DIR}/obj/src/cuda
fail=0
found=0
for log in "$dir"/*.o.ptxas; do
    [ -f "$log" ] || continue
    found=1
    # ptxas prints, per kernel and target architecture, "Compiling entry function 'NAME' for
    # 'sm_XX'", "Function properties for NAME", then "N bytes stack frame, S bytes spill
    # stores, L bytes spill loads" and "Used R registers, ...". A device function that is not
    # inlined gets its own "Function properties" and stack line, with no "Used" line: its
    # frame fails the check under its own name. Each number is read by the words after it,
    # not by its position on the line.
    awk -v src="$(basename "$log" .o.ptxas).cu" '
        function bytes(line, what,    at) {
            if (!match(line, "[0-9]+ bytes " what)) return 0
            at = substr(line, RSTART, RLENGTH); sub(/ .*/, "", at); return at + 0
        }
        /Compiling entry function/ {
            name = $0; sub(/.*function .\047?/, "", name); sub(/\047.*/, "", name)
            arch = $0; sub(/.* for .\047?/, "", arch); sub(/\047.*/, "", arch)
            stack = 0; spills = 0
        }
        /Function properties for/ { func_name = $0; sub(/.*Function properties for /, "", func_name) }
        /bytes stack frame/ {
            stack = bytes($0, "stack frame")
            spills = bytes($0, "spill stores") + bytes($0, "spill loads")
            if (stack + spills > 0) bad = 1
            if (stack + spills > 0 && func_name != name)
                printf "  %-12s %-6s %-56.56s (device function) stack %4d spill %d\n", src,
                       "-", func_name, stack, spills
        }
        /Used [0-9]+ registers/ {
            regs = $5
            printf "  %-12s %-6s %-56.56s regs %3d stack %4d spill %d\n", src, arch, name, regs,
                   stack, spills
        }
        END { exit bad }' "$log" || fail=1
done
if [ "$found" = 0 ]; then
    echo "cuda-check: no CUDA kernels in this tree yet"
    exit 0
fi
if [ "$fail" != 0 ]; then
    echo "cuda-check: a kernel spills registers or uses a stack frame (local memory)" >&2
    exit 1
fi
echo "cuda-check: every CUDA kernel compiles for every target architecture with no spills and no stack frame"
