#!/bin/sh
# sh scripts/build-xla-ffi.sh OUTPUT
#
# Builds linseq's XLA FFI handlers (python/linseq/_xla_ffi.c), the shared object through
# which linseq.jax calls the C library as XLA custom calls, into OUTPUT. It needs the XLA FFI
# C header that jax ships: from $LINSEQ_XLA_FFI_INCLUDE when set, else from the jax that
# $PYTHON (default python3) imports. Exits 3, building nothing, when neither is there:
# linseq.jax then runs its kernels through jax.pure_callback instead (slower, same results).
# liblinseq itself never includes an XLA header; the handlers do not link it either (linseq.jax
# hands them the entry points of the liblinseq the package loaded).
set -e
cd "$(dirname "$0")/.."
OUTPUT=${1:?usage: sh scripts/build-xla-ffi.sh OUTPUT}
PYTHON=${PYTHON:-python3}
CC=${CC:-cc}
INCLUDE=${LINSEQ_XLA_FFI_INCLUDE:-}
if [ -z "$INCLUDE" ]; then
    # from another folder, so that python/linseq/jax.py cannot shadow the jax package
    INCLUDE=$(cd / && "$PYTHON" -c 'import jax.ffi; print(jax.ffi.include_dir())' 2>/dev/null) || INCLUDE=
fi
if [ -z "$INCLUDE" ] || [ ! -f "$INCLUDE/xla/ffi/api/c_api.h" ]; then
    echo "build-xla-ffi.sh: no XLA FFI header (install jax, or set LINSEQ_XLA_FFI_INCLUDE):" \
         "linseq.jax will build its handlers at first use (needs a C compiler there)," \
         "else use jax.pure_callback" >&2
    exit 3
fi
mkdir -p "$(dirname "$OUTPUT")"
# -isystem: the header's own style is not this project's warnings' business
"$CC" -std=c11 -O2 -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wvla \
      -fPIC -fvisibility=hidden -shared -Iinclude -isystem "$INCLUDE" \
      python/linseq/_xla_ffi.c -o "$OUTPUT.tmp$$"
mv "$OUTPUT.tmp$$" "$OUTPUT"
