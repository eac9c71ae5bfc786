#!/bin/sh
# sh scripts/fetch-gpu-deps.sh [REFDATA]
#
# Gathers, on a machine with network access, what the GPU machine (which has none) needs
# besides this tree, into third_party/ (git-ignored, never committed; carried to the device
# with the working tree): fla-core's Python source (the Triton chunk_kda that
# tools/gpu/bench.py times linseq against), the reference cases and their judge, and the
# cJSON header and shared library the CLI links (the device image may lack them).
# tools/gpu/run.sh checks that third_party/ came with the tree.
#
# fla-core is pinned so that the timings of one session compare with the next: its Triton
# kernels change between releases, and an unpinned download would change the baseline
# linseq is measured against without anyone noticing. 0.6.0 is the newest release when this
# was written; moving the pin is a deliberate change, with the benchmark rerun.
# --only-binary=:all: takes the published wheel and never builds from a source archive
# (which could run code at download time and would not be what others measure).
set -e
cd "$(dirname "$0")/.."
REFDATA=${1:-../shared/refdata}
FLA_CORE_VERSION=0.6.0
mkdir -p third_party
if [ ! -f third_party/fla/.version ] || [ "$(cat third_party/fla/.version)" != "$FLA_CORE_VERSION" ]; then
    rm -rf third_party/fla third_party/wheels
    python3 -m pip download -q --no-deps --only-binary=:all: -d third_party/wheels \
        "fla-core==$FLA_CORE_VERSION"
    python3 -m zipfile -e third_party/wheels/fla_core-"$FLA_CORE_VERSION"-*.whl third_party/fla
    echo "$FLA_CORE_VERSION" > third_party/fla/.version
fi
rm -rf third_party/refdata
cp -r "$REFDATA" third_party/refdata
cp "$(dirname "$REFDATA")/tools/check_npy_dir.py" third_party/check_npy_dir.py
mkdir -p third_party/cjson/include/cjson third_party/cjson/lib
cp /usr/include/cjson/cJSON.h third_party/cjson/include/cjson/
lib=$(ls /usr/lib/*/libcjson.so.1.* 2>/dev/null | head -1)
cp "$lib" third_party/cjson/lib/
ln -sf "$(basename "$lib")" third_party/cjson/lib/libcjson.so.1
ln -sf libcjson.so.1 third_party/cjson/lib/libcjson.so
du -sh third_party
