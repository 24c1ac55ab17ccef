#!/usr/bin/env bash
# Build and run the whole test suite: installs dependencies, then
#   1. Release build: every test (unit, stress, integration);
#   2. asan build (ASan + UBSan, libc malloc): unit and integration tests;
#   3. tsan build (libc malloc): the concurrency/stress tests;
#   4. the fuzz targets (clang, build/fuzz), 20 s each, endpoint 10 s (ci/fuzz.sh).
# The last line of output is CTest's summary of the combined run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/deps.sh

bash ci/build.sh Release
bash ci/build.sh asan
bash ci/build.sh tsan

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"

status=0
echo "== asan: unit + integration"
(cd build/asan && ctest --output-on-failure -j2 -L 'unit|integration') || status=1
echo "== tsan: stress"
# Tests labelled notsan are skipped here (each says why in its source).
(cd build/tsan && ctest --output-on-failure -j1 -L 'stress|tsan' -LE notsan) || status=1
echo "== fuzz: every libFuzzer target for a bounded time (ci/fuzz.sh, about 80 s with a fresh build)"
bash ci/fuzz.sh || status=1
echo "== release: all tests"
(cd build/release && ctest --output-on-failure -j2) || status=1
exit $status
