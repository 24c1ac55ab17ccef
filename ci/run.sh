#!/usr/bin/env bash
# Build kvidx (Release) and run it. Until the kvidxd daemon lands this runs
# the engine micro-benchmark (kvidx-bench micro); extra arguments are passed on.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/deps.sh
bash ci/build.sh Release
exec build/release/bench/kvidx-bench micro "$@"
