#!/bin/sh
# Checks that the library's includes point one way (docs/developer-guide.md, "Layers"):
#   core <- optable (the op table and the validation it drives) <- op families (kda, ssm);
#   core <- simd <- ops; cuda sits on core only;
# an op family (any other folder) includes no other family's internals and, of the CUDA
# backend, only its entry header.
# Prints each include that breaks the rule; exits 1 when there is any.
set -eu
cd "$(dirname "$0")/.."
allowed() { # folder -> the folders its sources may include from
    case "$1" in
    core) echo "core" ;;
    simd) echo "core simd" ;;
    optable) echo "core optable" ;;
    cuda) echo "core cuda" ;;
    # every other folder is an op family (kda, ssm, ...): the layers below it, its own
    # headers, and of the CUDA backend only its entry header; never another family's
    *) echo "core simd optable $1 cuda/cuda_entry.h" ;;
    esac
}
for dir in src/*/; do
    layer=$(basename "$dir")
    ok=$(allowed "$layer")
    for f in "$dir"*; do
        grep -o '^#include "[^"]*"' "$f" | sed 's/#include "\(.*\)"/\1/' | while read -r inc; do
            case "$inc" in */*) ;; *) continue ;; esac # linseq.h and same-folder names
            pass=0
            for a in $ok; do
                case "$inc" in "$a" | "$a"/*) pass=1 ;; esac
            done
            [ "$pass" = 1 ] || echo "$f includes $inc: $layer may include only from: $ok"
        done
    done
done >"${TMPDIR:-/tmp}/linseq-layers.$$"
if [ -s "${TMPDIR:-/tmp}/linseq-layers.$$" ]; then
    cat "${TMPDIR:-/tmp}/linseq-layers.$$"
    rm -f "${TMPDIR:-/tmp}/linseq-layers.$$"
    echo "check-layers.sh: an include points the wrong way" >&2
    exit 1
fi
rm -f "${TMPDIR:-/tmp}/linseq-layers.$$"
echo "check-layers.sh: every include of src/ points down the layers"
