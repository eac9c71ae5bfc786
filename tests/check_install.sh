#!/bin/sh
# `make install` into a temporary prefix, then build the README's example against the
# installed header and library through pkg-config (static and shared) and run it.
set -eu
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
make -s install PREFIX="$prefix" >/dev/null
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cc_=${CC:-cc}
$cc_ -std=c11 -Wall -Wextra -o "$prefix/example_shared" examples/kda_prefill_decode.c \
    $(pkg-config --cflags --libs linseq) -lm
LD_LIBRARY_PATH="$prefix/lib" "$prefix/example_shared"
$cc_ -std=c11 -Wall -Wextra -o "$prefix/example_static" examples/kda_prefill_decode.c \
    $(pkg-config --cflags linseq) "$prefix/lib/liblinseq.a" $(pkg-config --libs-only-other --static linseq) -lm
"$prefix/example_static" >/dev/null
echo "install: header, static and shared library and linseq.pc work from $prefix"
