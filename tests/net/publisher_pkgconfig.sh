#!/bin/sh
# The installed C publisher, used the way an engine's build uses it: install
# the "publisher" component of BUILD_DIR into a temporary prefix, then compile
# net/README.md's example (net/examples/publisher_example.c) with nothing but
# `pkg-config --cflags --libs kvidx-publisher`, run it, and check its output.
#
# usage: publisher_pkgconfig.sh BUILD_DIR SOURCE_DIR
# env:   CMAKE (default cmake), CC (default cc), CFLAGS (the build's flags, so
#        that sanitizer builds link their runtime)
set -eu
build=$1
src=$2
cmake_cmd=${CMAKE:-cmake}
cc_cmd=${CC:-cc}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvidx-pkgconfig.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

"$cmake_cmd" --install "$build" --component publisher --prefix "$tmp/prefix" >"$tmp/install.log"
pc=$(find "$tmp/prefix" -name kvidx-publisher.pc)
if [ -z "$pc" ]; then
    echo "kvidx-publisher.pc was not installed" >&2
    cat "$tmp/install.log" >&2
    exit 1
fi
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
pkg-config --exists --print-errors kvidx-publisher
echo "pkg-config: $(pkg-config --cflags --libs kvidx-publisher)"
case "$(pkg-config --variable=prefix kvidx-publisher)" in
"$tmp/prefix") ;;
*) echo "the .pc names another prefix" >&2; exit 1 ;;
esac

# shellcheck disable=SC2046,SC2086  # word splitting of flags is intended
"$cc_cmd" ${CFLAGS:-} -std=c11 -Wall -Wextra -Wpedantic -Werror -o "$tmp/example" \
    "$src/net/examples/publisher_example.c" $(pkg-config --cflags --libs kvidx-publisher)

# Ephemeral ports: tests may run in parallel.
LD_LIBRARY_PATH=$(pkg-config --variable=libdir kvidx-publisher) \
    "$tmp/example" 'tcp://127.0.0.1:*' 'tcp://127.0.0.1:*' >"$tmp/out"
cat "$tmp/out"
grep -q '^event 0 stored 2 blocks in batch 0$' "$tmp/out"
grep -q '^event 1 removed 1 block in batch 1$' "$tmp/out"
echo "publisher_pkgconfig: OK"
