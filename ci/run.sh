#!/usr/bin/env bash
# Install the dependencies, build kvidx (Release) and start the kvidxd daemon
# in the foreground on port 8090 (both HTTP dialects, HTTP/1.1 + h2c).
# Extra arguments go to kvidxd (see `build/release/api/kvidxd --help`), e.g.
#   bash ci/run.sh --block-size 16 --workers "1=tcp://127.0.0.1:5557"
# Ctrl-C (SIGINT) or SIGTERM stops it gracefully.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/deps.sh
bash ci/build.sh Release
exec build/release/api/kvidxd --port "${KVIDXD_PORT:-8090}" "$@"
