#!/bin/sh
# Installs what building and testing linseq needs on Debian/Ubuntu: a C compiler with
# OpenMP, make, cJSON (meta.json parsing in the CLI) and python3 (the independent judge).
set -e
pkgs="build-essential libcjson-dev python3"
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
