#!/bin/sh
# sh tests/check_install.sh
#
# The README's install example, run exactly as written: the sh block after the
# "install-example" marker in README.md (make install into $HOME/.local, pkg-config, cc, run
# the program), with HOME a fresh temporary folder, so the test fails when the README
# drifts from what works. Then the installed static archive: the example linked against it
# next to an object that defines names the library uses internally, which collides unless
# the archive exports only the linseq_ API. Environment: BUILD (the Makefile's build folder,
# default build), CC (default cc).
set -eu
cd "$(dirname "$0")/.."
repo=$(pwd)
build=${BUILD:-build}
case $build in /*) ;; *) build=$repo/$build ;; esac
if ! command -v pkg-config >/dev/null 2>&1; then
    echo "check_install.sh: pkg-config is needed (scripts/install-deps.sh)" >&2
    exit 2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/linseq_install.XXXXXX")
trap 'rm -rf "$work"' EXIT
snippet=$work/readme_install.sh
awk '/<!-- install-example/ { armed = 1; next }
     armed && /^```sh$/ { inside = 1; next }
     inside && /^```$/ { exit }
     inside { print }' README.md >"$snippet"
if [ ! -s "$snippet" ]; then
    echo "check_install.sh: README.md has no sh block after an 'install-example' marker" >&2
    exit 1
fi

# The snippet runs in a folder that looks like the repository (links to its sources) so the
# program it builds lands outside the working tree; BUILD reuses the build folder already made.
mkdir "$work/tree" "$work/home"
for f in Makefile linseq.pc.in include src examples; do ln -s "$repo/$f" "$work/tree/$f"; done
if ! (cd "$work/tree" && HOME="$work/home" BUILD="$build" PKG_CONFIG_PATH="" \
    sh -eu "$snippet") >"$work/log" 2>&1; then
    sed 's/^/    | /' "$work/log"
    echo "check_install.sh: FAILED: README.md's install example:" >&2
    sed 's/^/    $ /' "$snippet" >&2
    exit 1
fi
echo "ok    README's install example: $(grep -m 1 '^linseq ' "$work/log" || tail -n 1 "$work/log")"

# The installed static archive next to a program of the caller's own that happens to use
# the library's internal names: only linseq_ symbols may be global in the archive.
prefix=$work/home/.local
cat >"$work/own.c" <<'EOF'
/* Names the library uses internally; the caller's program defines them for itself. */
int kda_check_problem(void);
int kda_state_load(void);
int ls_isa_active(void);
int kda_check_problem(void) { return 1; }
int kda_state_load(void) { return 2; }
int ls_isa_active(void) { return 3; }
EOF
cc_=${CC:-cc}
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# shellcheck disable=SC2046 # pkg-config's output is a list of flags
"$cc_" -std=c11 -Wall -Wextra -o "$work/example_static" examples/kda_prefill_decode.c \
    "$work/own.c" $(pkg-config --cflags linseq) "$prefix/lib/liblinseq.a" \
    $(pkg-config --libs-only-other --static linseq) -lm
"$work/example_static" >/dev/null
echo "ok    static archive: the example links next to the caller's own kda_*/ls_* functions"
