#!/usr/bin/env bash
# Build the libFuzzer targets of tests/fuzz (clang, ASan + UBSan) into
# build/fuzz and run each for a bounded time. Fails on any crash, hang,
# leak, broken invariant or out-of-memory.
#
#   ci/fuzz.sh                  CI: 20 s per target (endpoint, router and
#                               admin, small parsers that saturate early:
#                               10 s), two at a time: about 75 s of fuzzing
#                               on 2 cores, about 2 minutes with a fresh build
#   ci/fuzz.sh --long SECONDS   every target for SECONDS
#   ci/fuzz.sh [--long S] decode dump
#                               only the targets named (decode, codec,
#                               slots, dump, ingest, endpoint, router, admin)
#
# KVI_FUZZ_DIR=path builds and works elsewhere than build/fuzz. The build
# uses -Werror when CI is set (or KVI_WERROR=ON), as ci/build.sh does.
#
# Inputs: the committed seeds (tests/fuzz/corpus/<t>/) and recorded findings
# (tests/fuzz/regressions/<t>/) are read only; what the fuzzer learns is kept
# in build/fuzz/corpus/<t>/, so later runs start from there. New crashes are
# written to build/fuzz/findings/<t>/, logs to build/fuzz/logs/<t>.log.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=""   # --long: every target; default: ci_secs
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --long) secs="${2:?--long needs a number of seconds}"; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    decode|codec|slots|endpoint|dump|ingest|router|admin) targets+=("$1"); shift ;;
    *) echo "fuzz: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
# Listed longest first: two run at a time, in this order.
if [ ${#targets[@]} -eq 0 ]; then targets=(decode codec slots dump ingest endpoint router admin); fi
if [ -n "$secs" ]; then
  case "$secs" in *[!0-9]*) echo "fuzz: --long takes whole seconds" >&2; exit 2 ;; esac
fi
# CI's seconds per target (the whole fuzz step stays under 2 minutes).
ci_secs() { case "$1" in endpoint|router|admin) echo 10 ;; *) echo 20 ;; esac; }
secs_of() { if [ -n "$secs" ]; then echo "$secs"; else ci_secs "$1"; fi; }

# Every invariant of every target runs, fuzz_ingest's whole-table check
# (kvi_index_check_tables) included (KVI_FUZZ_INGEST_SKIP_TABLES=1 leaves that
# one out, to fuzz past a table finding while it is being fixed).
dir="${KVI_FUZZ_DIR:-build/fuzz}" # the build tree (the corpus and findings live in it)
start=$(date +%s)
mkdir -p "$dir/logs"
# clang 14 builds the fuzz targets without a warning, so CI treats any as
# an error here too (net/decode_event.c's branch-free `&` of two bools is cast).
werror="${KVI_WERROR:-OFF}"
if [ -n "${CI:-}" ]; then werror=ON; fi
if ! { cmake -S . -B "$dir" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=asan -DKVI_FUZZ=ON \
         -DKVI_WERROR="$werror" &&
       cmake --build "$dir" -j"$(nproc)" --target "${targets[@]/#/fuzz_}"; } >"$dir/logs/build.log" 2>&1; then
  cat "$dir/logs/build.log"
  echo "fuzz: the build failed"
  exit 1
fi
plan=""
for t in "${targets[@]}"; do plan+=" $t $(secs_of "$t") s,"; done
echo "fuzz: built ${targets[*]} in $(( $(date +%s) - start )) s; fuzzing${plan%,}"

# Hangs: no single input may take 10 s (a few ms is normal). Leaks are
# checked after each input, out-of-memory at 2 GB.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

run_one() {
  local t=$1
  local seeds=(tests/fuzz/corpus/"$t")
  if [ -d tests/fuzz/regressions/"$t" ]; then seeds+=(tests/fuzz/regressions/"$t"); fi
  mkdir -p "$dir/corpus/$t" "$dir/findings/$t"
  local rc=0
  "$dir/tests/fuzz/fuzz_$t" -max_total_time="$(secs_of "$t")" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$dir/findings/$t/" \
      "$dir/corpus/$t" "${seeds[@]}" >"$dir/logs/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$dir/logs/$t.rc"
}

# Run at most nproc targets at a time; each is one libFuzzer process.
jobs_max=$(nproc)
for t in "${targets[@]}"; do
  rm -f "$dir/logs/$t.rc"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
  run_one "$t" &
done
wait
status=0
failed=()
for t in "${targets[@]}"; do
  if [ "$(cat "$dir/logs/$t.rc" 2>/dev/null)" != 0 ]; then failed+=("$t"); status=1; fi
done

# One line per target: executions, speed, coverage (edges), features, corpus.
for t in "${targets[@]}"; do
  log="$dir/logs/$t.log"
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")
  printf 'fuzz: %-8s %s  runs %s  exec/s %s  cov %s  ft %s  corpus %s\n' "$t" \
    "$([[ " ${failed[*]} " == *" $t "* ]] && echo FAIL || echo ok)" \
    "${runs:-?}" "${eps:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}"
done

if [ $status -ne 0 ]; then
  for t in "${failed[@]}"; do
    echo "== fuzz_$t failed; end of $dir/logs/$t.log:"
    tail -n 60 "$dir/logs/$t.log"
    echo "== findings in $dir/findings/$t/:"
    ls -l "$dir/findings/$t/" || true
  done
  cat <<EOF
fuzz: a target failed. To turn a finding into a regression test:
  1. reproduce:  $dir/tests/fuzz/fuzz_<t> $dir/findings/<t>/<crash-file>
  2. minimise:   $dir/tests/fuzz/fuzz_<t> -minimize_crash=1 -runs=20000 \\
                     -exact_artifact_path=/tmp/min $dir/findings/<t>/<crash-file>
     (for a timeout or a leak, minimise with -timeout=10 / as is)
  3. record it:  cp /tmp/min tests/fuzz/regressions/<t>/<what-it-breaks>.bin
     CTest's fuzz_<t>_regress then runs it in every build (it fails until
     the bug is fixed), and ci/fuzz.sh seeds the fuzzer with it.
EOF
fi
echo "fuzz: total $(( $(date +%s) - start )) s"
exit $status
