#!/bin/sh
# Installs what building and testing linseq needs on Debian/Ubuntu: a C compiler with
# OpenMP, make, pkg-config, cJSON (meta.json parsing in the CLI) and python3 (the
# independent judge of the reference cases).
set -e
pkgs="build-essential pkg-config libcjson-dev python3"
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
