#!/bin/sh
# Installs what building and testing linseq needs on Debian/Ubuntu: a C compiler, make,
# pkg-config, cJSON (meta.json parsing in the CLI), python3 with NumPy (the
# generator and the judge of the reference cases, tests/refgen) and venv (the Python
# package's tests), clang with its sanitizer and fuzzer runtimes (the ThreadSanitizer run and
# the libFuzzer targets), clang-format (the tree's style, scripts/check-format.sh) and valgrind.
set -e
pkgs="build-essential pkg-config libcjson-dev python3 python3-numpy python3-venv clang clang-format libclang-rt-dev valgrind"
missing=""
for p in $pkgs; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
echo "installing:$missing"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
