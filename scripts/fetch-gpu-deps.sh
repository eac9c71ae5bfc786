#!/bin/sh
# sh scripts/fetch-gpu-deps.sh [REFDATA]
#
# Gathers, on a machine with network access, what the GPU machine (which has none) needs
# besides this tree, into third_party/ (git-ignored, never committed; carried to the device
# with the working tree): fla-core's Python source (the Triton chunk_kda that
# tools/gpu/bench.py times linseq against), the reference cases and their judge, and the
# cJSON header and shared library the CLI links (the device image may lack them).
set -e
cd "$(dirname "$0")/.."
REFDATA=${1:-../shared/refdata}
mkdir -p third_party
if [ ! -d third_party/fla/fla ]; then
    rm -rf third_party/fla third_party/wheels
    python3 -m pip download -q --no-deps -d third_party/wheels fla-core
    python3 -m zipfile -e third_party/wheels/fla_core-*.whl third_party/fla
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
