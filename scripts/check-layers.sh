#!/bin/sh
# Checks that the library's includes point one way (docs/developer-guide.md, "Layers"):
#   core <- optable (each op's description, the validation it drives) <- ops (kda, ssm);
#   core <- simd <- ops; cuda sits on core only;
# an op includes no other op's internals and, of the CUDA backend, only its entry header.
# Prints each include that breaks the rule; exits 1 when there is any.
set -eu
cd "$(dirname "$0")/.."
allowed() { # folder -> the folders its sources may include from
    case "$1" in
    core) echo "core" ;;
    simd) echo "core simd" ;;
    kda) echo "core simd optable kda cuda/cuda_entry.h" ;;
    ssm) echo "core simd optable ssm cuda/cuda_entry.h" ;;
    ema) echo "core simd optable ema" ;;
    optable) echo "core optable" ;;
    cuda) echo "core cuda" ;;
    *) echo "" ;;
    esac
}
bad=0
for dir in src/*/; do
    layer=$(basename "$dir")
    ok=$(allowed "$layer")
    if [ -z "$ok" ]; then
        echo "check-layers.sh: src/$layer has no rule here; add one" >&2
        bad=1
        continue
    fi
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
if [ -s "${TMPDIR:-/tmp}/linseq-layers.$$" ] || [ "$bad" = 1 ]; then
    cat "${TMPDIR:-/tmp}/linseq-layers.$$"
    rm -f "${TMPDIR:-/tmp}/linseq-layers.$$"
    echo "check-layers.sh: an include points the wrong way" >&2
    exit 1
fi
rm -f "${TMPDIR:-/tmp}/linseq-layers.$$"
echo "check-layers.sh: every include of src/ points down the layers"
