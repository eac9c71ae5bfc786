#!/bin/sh
# Lists the C, header and CUDA files of the repository that clang-format (with the tree's
# .clang-format) would change, with the number of lines each would change; exits 1 when
# there is any. Changes nothing: to apply, run clang-format -i on the files it names.
#
#   scripts/check-format.sh [FILE...]      default: every tracked *.c *.h *.cu *.cuh
#
# Environment: CLANG_FORMAT (default clang-format).
set -eu
cd "$(dirname "$0")/.."
cf=${CLANG_FORMAT:-clang-format}
if ! command -v "$cf" >/dev/null 2>&1; then
    echo "check-format.sh: $cf is missing (Debian: clang-format)" >&2
    exit 2
fi
if [ "$#" -eq 0 ]; then
    set -- $(git ls-files '*.c' '*.h' '*.cu' '*.cuh')
fi
bad=0
total=0
for f in "$@"; do
    # lines of the file that the formatted text replaces or adds
    n=$("$cf" --style=file "$f" | diff "$f" - | grep -c '^[<>]' || true)
    if [ "$n" -ne 0 ]; then
        printf '%6d  %s\n' "$n" "$f"
        bad=$((bad + 1))
        total=$((total + n))
    fi
done
if [ "$bad" -ne 0 ]; then
    echo "check-format.sh: $bad of $# files differ from .clang-format ($total diff lines)" >&2
    exit 1
fi
echo "check-format.sh: all $# files follow .clang-format"
