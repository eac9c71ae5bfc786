#!/bin/sh
# sh tests/check_symbols.sh LIBRARY...
#
# A program that links liblinseq (static or shared) must see only the public API: every
# global symbol a library defines has to start with linseq_, so the library's internal
# functions (kda_*, ls_*, the per-ISA kernels) can never collide with the caller's own.
# Lists the global defined symbols of each LIBRARY (.a or .so) and fails on any other.
set -u

if [ "$#" -lt 1 ]; then
    echo "usage: sh tests/check_symbols.sh LIBRARY..." >&2
    exit 2
fi
NM=${NM:-nm}
status=0
for lib in "$@"; do
    if [ ! -f "$lib" ]; then
        echo "check_symbols.sh: no library '$lib' (run make first)" >&2
        exit 2
    fi
    case $lib in
        *.a) opts="" ;;
        *) opts="-D" ;; # a shared library: the dynamic symbol table is what a program sees
    esac
    # "ADDRESS TYPE NAME" lines; archive member headers and blank lines have fewer fields.
    # shellcheck disable=SC2086
    if ! syms=$($NM -g --defined-only $opts "$lib"); then
        echo "check_symbols.sh: $NM cannot read '$lib'" >&2
        exit 2
    fi
    api=$(printf '%s\n' "$syms" | awk 'NF == 3 && $3 ~ /^linseq_/' | wc -l)
    other=$(printf '%s\n' "$syms" | awk 'NF == 3 && $3 !~ /^linseq_/ { print $3 }' | sort -u)
    if [ "$api" -eq 0 ]; then
        echo "FAIL  $lib: defines no linseq_ symbol at all" >&2
        status=1
    elif [ -n "$other" ]; then
        n=$(printf '%s\n' "$other" | wc -l)
        echo "FAIL  $lib: $n global symbols without the linseq_ prefix:" >&2
        printf '%s\n' "$other" | head -n 20 | sed 's/^/      /' >&2
        [ "$n" -le 20 ] || echo "      ..." >&2
        status=1
    else
        echo "ok    $lib: $api global symbols, all linseq_"
    fi
done
exit $status
