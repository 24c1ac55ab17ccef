#!/usr/bin/env bash
# Configure and build one variant: ci/build.sh [Release|Debug|asan|tsan]
# into build/<variant>. -Werror when CI is set (or KVI_WERROR=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
type="${1:-Release}"
dir="build/$(echo "$type" | tr 'A-Z' 'a-z')"
werror="${KVI_WERROR:-OFF}"
if [ -n "${CI:-}" ]; then werror=ON; fi
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="$type" -DKVI_WERROR="$werror" >/dev/null
cmake --build "$dir" -j"$(nproc)"
