#!/usr/bin/env bash
# perf/profile.sh — profile one kvidx workload with perf stat, perf record and
# callgrind, and write everything into a report folder with a summary.md.
# Run `perf/profile.sh --help` for the scenarios and options.
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROG=perf/profile.sh

usage() {
  cat <<EOF
usage: $PROG SCENARIO [options] [-- EXTRA_WORKLOAD_ARGS]

Runs one kvidx workload three times and writes a report folder:
  1. perf stat      counters: cycles, instructions, cache references/misses,
                    branches/branch misses where the machine has them (a VM
                    often has none: then software events only, with a note);
  2. perf record    samples with call graphs, and perf report's top symbols;
  3. callgrind      on a reduced-size run: instruction counts (Ir) per
                    function, exclusive and inclusive. They do not depend on
                    the machine's load: the repeatable figure on a noisy VM.
summary.md in the folder has the command lines, IPC and miss rates, the top
symbols by samples and by instructions, and where the raw files are.

scenarios:
  micro    kvidx-bench micro: engine store / find / remove / readers
           perf runs: --seqs 256 --queries 5000 --reader-secs 0.5 (0.26 M blocks)
           callgrind: --seqs 64 --depth 1024 --workers 32 --queries 200
                      --reader-secs 0, collecting only the main thread's
                      deterministic part (--cg-toggle kvi_bench_micro)
  trace    kvidx-bench trace: Mooncake-trace replay, kvidx backend, one window
           perf runs: --backends kvidx --window-ms 2000 (default trace file)
           callgrind: 1,000-request synthetic trace, 16 workers, every op
                      issued at once; collects the replay threads only
                      (--cg-toggle 'lane_main*,writer_main*'), not the
                      workload build
  ingest   kvidx-bench ingest: ZMQ publishers -> listeners -> writers -> index
           perf runs: --requests 3000
           callgrind: --requests 300 --cache-ids 512 (small engine caches,
                      so removals happen too), counting kvidx's side
                      only: the listener and writer threads
                      (--cg-toggle 'thread_main*,writer_main*'), not the
                      publishers (the simulated engines) nor the encoding
  http     the kvidxd daemon under h2load load on POST /query (HTTP/2, h2c)
           starts kvidxd --host 127.0.0.1 on a free port, registers one worker
           for the model (its ZMQ endpoint has no publisher: the index stays
           empty unless --daemon-args feeds it), then attaches perf to the
           daemon for --duration seconds of load each (stat, then record);
           callgrind: a second daemon under valgrind, instrumented only while
           it answers --requests queries one at a time (callgrind_control)

options:
  -b, --build-dir DIR  build directory (env KVIDX_BUILD_DIR; default
                       build/release). Configured as Release when it has no
                       CMakeCache.txt; the target is built incrementally.
      --no-build       use the binaries in the build directory as they are
  -o, --out DIR        report folder (default perf/reports/SCENARIO-YYYYmmdd-HHMMSS)
      --args "ARGS"    kvidx-bench arguments for the perf stat/record runs
                       (replace the scenario's defaults; split on spaces)
      --cg-args "ARGS" kvidx-bench arguments for the callgrind run (replace defaults)
                       In both, @OUT@ is replaced by a per-run file prefix in
                       the report folder (trace uses it for --out).
      --cg-toggle LIST comma-separated functions (wildcards allowed) callgrind
                       collects inside (--toggle-collect); 'all' = everything
                       (bench scenarios; http always counts the queries only)
      --cg-sim / --no-cg-sim
                       callgrind cache and branch simulation (default: on when
                       perf has no hardware counters, so the summary still has
                       miss rates, simulated)
      --no-stat, --no-record, --no-callgrind
                       skip a part
      --freq HZ        perf record sampling frequency (999)
      --call-graph M   perf record call graphs: dwarf (default: the Release
                       build has no frame pointers, so -g alone would lose the
                       callers; about 8 MB of perf.data per CPU-second), fp
                       (plain -g, small files), dwarf,SIZE or lbr
      --events LIST    perf stat hardware events to try
                       (cycles,instructions,cache-references,cache-misses,branches,branch-misses)
      --top N          symbols per table in summary.md (15)
      --no-sysctl      never try to lower kernel.perf_event_paranoid
  -j, --jobs N         build jobs (nproc)
  http only:
      --port N         daemon port (default: a free port in 20000-39999)
      --duration S     seconds of h2load load per perf run (5)
      --clients N      h2load clients (4)   --streams N  streams per client (4)
      --requests N     queries in the callgrind run (300)
      --tokens N       tokens per /query body (2048)
      --model NAME     model_name of the registration and the queries (kvidx-profile)
      --block-size N   block size of the registration (16)
      --h1             HTTP/1.1 instead of HTTP/2
      --daemon-args "ARGS"  extra kvidxd arguments
  -h, --help           this text

Everything after -- is appended to the kvidx-bench arguments of every run.

perf and kernel.perf_event_paranoid: an unprivileged user needs <= 2 to profile
its own processes (user space only; <= 1 for kernel samples too). When the
value is above 1 and the script runs as root, it sets 1 with sysctl for the
run and restores the old value at exit (--no-sysctl to skip). When perf
cannot run at all, the callgrind part is still produced and summary.md says why.

examples:
  $PROG micro
  $PROG micro --args "--seqs 1024 --reader-secs 2" --call-graph fp
  $PROG trace -b /tmp/build --no-build
  $PROG http --duration 10 --clients 8
EOF
}

log() { printf 'profile: %s\n' "$*" >&2; }
die() {
  printf 'profile: error: %s\n' "$*" >&2
  exit 1
}

# ---- options -----------------------------------------------------------------

[ $# -ge 1 ] || {
  usage >&2
  exit 2
}
case "$1" in
  -h | --help)
    usage
    exit 0
    ;;
  micro | trace | ingest | http) SCENARIO=$1 ;;
  *)
    printf 'profile: unknown scenario %s (micro, trace, ingest or http)\n' "$1" >&2
    exit 2
    ;;
esac
shift

BUILD=${KVIDX_BUILD_DIR:-$ROOT/build/release}
DO_BUILD=1
REPORT=""
ARGS_SET=0 ARGS_STR=""
CG_ARGS_SET=0 CG_ARGS_STR=""
CG_TOGGLE_SET=0 CG_TOGGLE=""
CG_SIM=auto
DO_STAT=1 DO_RECORD=1 DO_CG=1
FREQ=999
CALL_GRAPH=dwarf
HW_EVENTS=cycles,instructions,cache-references,cache-misses,branches,branch-misses
TOP=15
TRY_SYSCTL=1
JOBS=$(nproc 2>/dev/null || echo 2)
PORT=""
DURATION=5
CLIENTS=4
STREAMS=4
REQUESTS=300
TOKENS=2048
MODEL=kvidx-profile
BLOCK_SIZE=16
H1=0
DAEMON_ARGS=""
EXTRA=()

need() { [ $# -ge 2 ] || die "option $1 needs a value"; }
while [ $# -gt 0 ]; do
  case "$1" in
    -b | --build-dir) need "$@"; BUILD=$2; shift ;;
    --no-build) DO_BUILD=0 ;;
    -o | --out) need "$@"; REPORT=$2; shift ;;
    --args) need "$@"; ARGS_SET=1; ARGS_STR=$2; shift ;;
    --cg-args) need "$@"; CG_ARGS_SET=1; CG_ARGS_STR=$2; shift ;;
    --cg-toggle) need "$@"; CG_TOGGLE_SET=1; CG_TOGGLE=$2; shift ;;
    --cg-sim) CG_SIM=1 ;;
    --no-cg-sim) CG_SIM=0 ;;
    --no-stat) DO_STAT=0 ;;
    --no-record) DO_RECORD=0 ;;
    --no-callgrind) DO_CG=0 ;;
    --freq) need "$@"; FREQ=$2; shift ;;
    --call-graph) need "$@"; CALL_GRAPH=$2; shift ;;
    --events) need "$@"; HW_EVENTS=$2; shift ;;
    --top) need "$@"; TOP=$2; shift ;;
    --no-sysctl) TRY_SYSCTL=0 ;;
    -j | --jobs) need "$@"; JOBS=$2; shift ;;
    --port) need "$@"; PORT=$2; shift ;;
    --duration) need "$@"; DURATION=$2; shift ;;
    --clients) need "$@"; CLIENTS=$2; shift ;;
    --streams) need "$@"; STREAMS=$2; shift ;;
    --requests) need "$@"; REQUESTS=$2; shift ;;
    --tokens) need "$@"; TOKENS=$2; shift ;;
    --model) need "$@"; MODEL=$2; shift ;;
    --block-size) need "$@"; BLOCK_SIZE=$2; shift ;;
    --h1) H1=1 ;;
    --daemon-args) need "$@"; DAEMON_ARGS=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) die "unknown option $1 (see $PROG --help)" ;;
  esac
  shift
done

for v in FREQ TOP JOBS DURATION CLIENTS STREAMS REQUESTS TOKENS BLOCK_SIZE; do
  if ! [[ ${!v} =~ ^[0-9]+$ ]] || [ "${!v}" -eq 0 ]; then die "$v must be a positive integer (got '${!v}')"; fi
done
case "$CALL_GRAPH" in fp | dwarf | dwarf,* | lbr) ;; *) die "--call-graph: fp, dwarf or lbr" ;; esac
[ -z "$PORT" ] || [[ $PORT =~ ^[0-9]+$ ]] || die "--port must be a number"

# Profiling tools (linux-perf, valgrind) and the build dependencies, as root.
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  bash "$ROOT/ci/deps.sh" profile >&2
fi

[ -n "$REPORT" ] || REPORT="$ROOT/perf/reports/$SCENARIO-$(date +%Y%m%d-%H%M%S)"
case "$REPORT" in /*) ;; *) REPORT="$PWD/$REPORT" ;; esac
case "$BUILD" in /*) ;; *) BUILD="$PWD/$BUILD" ;; esac

# ---- state collected for summary.md ------------------------------------------

NOTES=()    # shown near the top of the summary
COMMANDS=() # "label|command line"
FAILED=0
note() {
  NOTES+=("$*")
  log "note: $*"
}
quote_cmd() { # shell-quoted, but only where needed
  local out="" a
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./,:=@%+-]+$ ]]; then
      out+="$a "
    else
      out+="$(printf '%q' "$a") "
    fi
  done
  printf '%s' "${out% }"
}
add_cmd() {
  local label=$1
  shift
  COMMANDS+=("$label|$(quote_cmd "$@")")
}
now() { date +%s.%N; }
secs_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# ---- cleanup: the daemon we started, and the sysctl we changed ----------------

DPID=""
PARANOID_RESTORE=""
BUILD_LOG_TMP=""
KEEP_BUILD_LOG=0
stop_daemon() {
  [ -n "$DPID" ] || return 0
  if kill -0 "$DPID" 2>/dev/null; then
    kill -TERM "$DPID" 2>/dev/null || true
    local i
    for ((i = 0; i < ${1:-100}; i++)); do
      kill -0 "$DPID" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$DPID" 2>/dev/null; then
      log "daemon $DPID did not exit on SIGTERM; sending SIGKILL"
      kill -KILL "$DPID" 2>/dev/null || true
    fi
  fi
  wait "$DPID" 2>/dev/null || true
  DPID=""
}
# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
  stop_daemon 50
  if [ -n "$BUILD_LOG_TMP" ] && [ -f "$BUILD_LOG_TMP" ] && [ "$KEEP_BUILD_LOG" -eq 0 ]; then
    rm -f "$BUILD_LOG_TMP"
  fi
  if [ -n "$PARANOID_RESTORE" ]; then
    if sysctl -q -w "kernel.perf_event_paranoid=$PARANOID_RESTORE" >/dev/null 2>&1; then
      log "restored kernel.perf_event_paranoid=$PARANOID_RESTORE"
    else
      log "could not restore kernel.perf_event_paranoid=$PARANOID_RESTORE"
    fi
  fi
}
trap cleanup EXIT
trap 'log "internal error: a command failed at line $LINENO"' ERR
trap 'exit 130' INT TERM

# ---- build ---------------------------------------------------------------------

# the report folder is made once the workload is known to exist; the build
# log waits in a temporary file until then (and stays there when the build fails)
BUILD_LOG=$(mktemp "${TMPDIR:-/tmp}/kvidx-profile-build.XXXXXX")
BUILD_LOG_TMP=$BUILD_LOG
has_target() {
  local targets
  targets=$(cmake --build "$BUILD" --target help 2>/dev/null) || true
  grep -Eq "(^|[[:space:]])$1(:|[[:space:]]|\$)" <<<"$targets"
}
ensure_target() { # target
  local t=$1
  if [ "$DO_BUILD" -eq 1 ]; then
    if [ ! -f "$BUILD/CMakeCache.txt" ]; then
      log "configuring $BUILD (Release)"
      cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >>"$BUILD_LOG" 2>&1 ||
        { KEEP_BUILD_LOG=1; die "cmake configure failed; see $BUILD_LOG"; }
    fi
    has_target "$t" || return 3
    log "building $t in $BUILD"
    cmake --build "$BUILD" -j "$JOBS" --target "$t" >>"$BUILD_LOG" 2>&1 ||
      { KEEP_BUILD_LOG=1; die "building $t failed; see $BUILD_LOG"; }
  fi
  return 0
}
build_type() {
  [ -f "$BUILD/CMakeCache.txt" ] || return 0
  sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD/CMakeCache.txt" | head -1
}

BENCH="$BUILD/bench/kvidx-bench"
DAEMON=""
if [ "$SCENARIO" = http ]; then
  rc=0
  ensure_target kvidxd || rc=$?
  [ "$rc" -ne 3 ] || die "the http scenario needs the kvidxd daemon, and this tree has no CMake target 'kvidxd' yet (the daemon is written for the daemon issue). Build it, then retry."
  DAEMON=$(find "$BUILD" -maxdepth 4 -type f -name kvidxd -perm -u+x 2>/dev/null | head -1) || true
  [ -n "$DAEMON" ] || die "no kvidxd executable under $BUILD (build the target kvidxd, or drop --no-build)"
  command -v h2load >/dev/null || die "h2load not found (Debian: apt-get install nghttp2-client)"
  command -v curl >/dev/null || die "curl not found (Debian: apt-get install curl)"
else
  rc=0
  ensure_target kvidx-bench || rc=$?
  [ "$rc" -ne 3 ] || die "this tree has no CMake target kvidx-bench"
  [ -x "$BENCH" ] || die "no $BENCH (build the target kvidx-bench, or drop --no-build)"
  # the subcommand must exist and work in this build
  if ! sub_help=$("$BENCH" "$SCENARIO" --help 2>&1) || ! grep -q "usage: kvidx-bench $SCENARIO" <<<"$sub_help"; then
    msg=$(head -3 <<<"$sub_help" | tr '\n' ' ')
    if [ "$SCENARIO" = ingest ]; then
      die "kvidx-bench in $BUILD has no working 'ingest' subcommand (the ingest benchmark is written for the ingest issue; it needs the ZMQ listener and publisher libraries linked). It said: $msg"
    fi
    die "kvidx-bench in $BUILD has no working '$SCENARIO' subcommand. It said: $msg"
  fi
fi
mkdir -p "$REPORT"
mv "$BUILD_LOG" "$REPORT/build.log"
BUILD_LOG="$REPORT/build.log"
BTYPE=$(build_type)
case "${BTYPE,,}" in
  release) ;;
  "") note "could not read CMAKE_BUILD_TYPE from $BUILD/CMakeCache.txt" ;;
  *) note "the build in $BUILD is '$BTYPE', not Release: figures are not representative" ;;
esac

# ---- scenario defaults -----------------------------------------------------------

case "$SCENARIO" in
  micro)
    DEF_ARGS="--seqs 256 --queries 5000 --reader-secs 0.5"
    DEF_CG_ARGS="--seqs 64 --depth 1024 --workers 32 --queries 200 --reader-secs 0"
    DEF_TOGGLE="kvi_bench_micro"
    ;;
  trace)
    DEF_ARGS="--backends kvidx --window-ms 2000 --no-plot --no-progress --out @OUT@"
    DEF_CG_ARGS="--trace synthetic --synthetic-requests 1000 --workers 16 --backends kvidx --window-ms 1 --max-overrun 1000000 --no-plot --no-progress --out @OUT@"
    DEF_TOGGLE="lane_main*,writer_main*"
    ;;
  ingest)
    DEF_ARGS="--requests 3000"
    DEF_CG_ARGS="--requests 300 --cache-ids 512"
    DEF_TOGGLE="thread_main*,writer_main*"
    ;;
  http)
    DEF_ARGS=""
    DEF_CG_ARGS=""
    DEF_TOGGLE="all"
    ;;
esac
[ "$ARGS_SET" -eq 1 ] || ARGS_STR=$DEF_ARGS
[ "$CG_ARGS_SET" -eq 1 ] || CG_ARGS_STR=$DEF_CG_ARGS
[ "$CG_TOGGLE_SET" -eq 1 ] || CG_TOGGLE=$DEF_TOGGLE

# workload_args PHASE STRING -> WARGS array (@OUT@ -> $REPORT/PHASE)
WARGS=()
workload_args() {
  local phase=$1 s=$2 a
  WARGS=()
  read -r -a parts <<<"$s" || true
  for a in "${parts[@]}"; do WARGS+=("${a//@OUT@/$REPORT/$phase}"); done
  WARGS+=("${EXTRA[@]}")
}

# ---- perf availability ------------------------------------------------------------

PERF_OK=0
PERF_WHY=""
PARANOID=$(cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null || echo "?")
PARANOID_TEXT=""
paranoid_meaning() {
  case "$1" in
    -1) echo "no restrictions" ;;
    0) echo "unprivileged users may profile user space and kernel, CPU-wide too (no raw tracepoints)" ;;
    1) echo "unprivileged users may profile their own processes, user space and kernel" ;;
    2) echo "unprivileged users may profile their own processes, user space only" ;;
    *) echo "unprivileged users may not use perf at all (Debian's level 3 and above)" ;;
  esac
}
HW_OK=()
HW_BAD=()
if [ "$DO_STAT" -eq 0 ] && [ "$DO_RECORD" -eq 0 ]; then
  PERF_WHY="skipped (--no-stat --no-record)"
elif ! command -v perf >/dev/null; then
  PERF_WHY="perf is not installed (Debian: apt-get install linux-perf)"
else
  if [[ $PARANOID =~ ^-?[0-9]+$ ]]; then
    PARANOID_TEXT="kernel.perf_event_paranoid = $PARANOID: $(paranoid_meaning "$PARANOID")"
    if [ "$(id -u)" -eq 0 ]; then
      PARANOID_TEXT+="; this run is root, which perf does not restrict unless the container took its capabilities away (CAP_PERFMON / CAP_SYS_ADMIN)"
    fi
    if [ "$PARANOID" -gt 1 ] && [ "$(id -u)" -eq 0 ] && [ "$TRY_SYSCTL" -eq 1 ]; then
      log "kernel.perf_event_paranoid is $PARANOID; running as root, so setting it to 1 for this run (restored at exit; --no-sysctl to skip)"
      if sysctl -q -w kernel.perf_event_paranoid=1 >/dev/null 2>&1; then
        PARANOID_RESTORE=$PARANOID
        PARANOID_TEXT+=". The script set it to 1 with sysctl for this run and restored $PARANOID at exit"
      else
        PARANOID_TEXT+=". Setting it to 1 with sysctl failed (read-only /proc/sys, e.g. in a container)"
      fi
    elif [ "$PARANOID" -gt 1 ] && [ "$(id -u)" -ne 0 ]; then
      PARANOID_TEXT+=". Not root: kernel symbols are not sampled; as root, run: sysctl -w kernel.perf_event_paranoid=1"
    fi
  else
    PARANOID_TEXT="kernel.perf_event_paranoid could not be read"
  fi
  if probe_err=$(perf stat -e task-clock -x, -o /dev/null -- true 2>&1); then
    PERF_OK=1
  else
    PERF_WHY="perf cannot count even task-clock here: $(head -3 <<<"$probe_err" | tr '\n' ' ')"
  fi
fi
if [ "$PERF_OK" -eq 1 ]; then
  IFS=, read -r -a want <<<"$HW_EVENTS"
  for ev in "${want[@]}"; do
    out=$(perf stat -e "$ev" -x, -- true 2>&1 >/dev/null) || {
      HW_BAD+=("$ev")
      continue
    }
    # "cycles", "cycles:u" or, on hybrid CPUs, "cpu_core/cycles/"
    val=$(awk -F, -v e="$ev" '{ x = $3; sub(/:.*/, "", x); sub(/^cpu_[a-z]+\//, "", x); sub(/\/$/, "", x) }
      x == e && $1 ~ /^[0-9]+$/ { print $1; exit }' <<<"$out")
    if [[ $val =~ ^[0-9]+$ ]]; then HW_OK+=("$ev"); else HW_BAD+=("$ev"); fi
  done
  if [ ${#HW_OK[@]} -eq 0 ]; then
    note "perf: no hardware counters on this machine (${HW_BAD[*]}: not supported; typically a VM without a virtual PMU). perf stat counts software events only and perf record samples on cpu-clock (a timer). IPC and hardware miss rates are not available here$([ "$DO_CG" -eq 0 ] || echo "; the callgrind part adds simulated cache and branch miss rates instead")."
  elif [ ${#HW_BAD[@]} -gt 0 ]; then
    note "perf: not supported here: ${HW_BAD[*]}"
  fi
else
  if [ "$DO_STAT" -eq 1 ] || [ "$DO_RECORD" -eq 1 ]; then
    note "perf unavailable: $PERF_WHY. Only the callgrind part was run."
  fi
  DO_STAT=0
  DO_RECORD=0
fi
[ "$CG_SIM" != auto ] || { if [ "$PERF_OK" -eq 1 ] && [ ${#HW_OK[@]} -gt 0 ]; then CG_SIM=0; else CG_SIM=1; fi; }
if [ "$DO_CG" -eq 1 ] && ! command -v valgrind >/dev/null; then
  note "valgrind is not installed (Debian: apt-get install valgrind): no callgrind part"
  DO_CG=0
fi
SW_EVENTS=task-clock,context-switches,cpu-migrations,page-faults
STAT_EVENTS=$SW_EVENTS
[ ${#HW_OK[@]} -eq 0 ] || STAT_EVENTS+=",$(
  IFS=,
  echo "${HW_OK[*]}"
)"
RECORD_EV=()
[[ ",${HW_OK[*]:-}," == *cycles* ]] || RECORD_EV=(-e cpu-clock)
case "$CALL_GRAPH" in
  fp) CG_OPT=(-g) ;;
  dwarf) CG_OPT=(--call-graph 'dwarf,8192') ;;
  *) CG_OPT=(--call-graph "$CALL_GRAPH") ;;
esac

# ---- runners ------------------------------------------------------------------------

STAT_SECS="" RECORD_SECS="" CG_SECS=""
RESULT_LINE="" # the workload's JSON line, or h2load's figures
RESULT_FROM=""
CG_TOGGLE_ARGS=()
if [ "$CG_TOGGLE" != all ] && [ -n "$CG_TOGGLE" ]; then
  CG_TOGGLE_ARGS=(--collect-atstart=no)
  IFS=, read -r -a fns <<<"$CG_TOGGLE"
  for f in "${fns[@]}"; do CG_TOGGLE_ARGS+=("--toggle-collect=$f"); done
fi
CG_SIM_ARGS=()
[ "$CG_SIM" -eq 0 ] || CG_SIM_ARGS=(--cache-sim=yes --branch-sim=yes)

perf_reports() {
  perf report -i "$REPORT/perf.data" --stdio --no-children -n --sort dso,sym -g none \
    >"$REPORT/perf-report.txt" 2>"$REPORT/perf-report.log" || note "perf report failed; see perf-report.log"
  perf report -i "$REPORT/perf.data" --stdio --children --percent-limit 3 2>/dev/null |
    head -n 4000 >"$REPORT/perf-report-callgraph.txt" || true
}
cg_total_ir() {
  awk '/PROGRAM TOTALS/ { gsub(/[[:space:]]/, "", $1); print $1; exit }' "$REPORT/callgrind-annotate.txt" 2>/dev/null || true
}
cg_reports() {
  [ -s "$REPORT/callgrind.out" ] || {
    note "callgrind wrote no profile; see callgrind.log"
    return 0
  }
  callgrind_annotate --auto=no --threshold=100 --show=Ir "$REPORT/callgrind.out" \
    >"$REPORT/callgrind-annotate.txt" 2>&1 || note "callgrind_annotate failed"
  callgrind_annotate --auto=no --threshold=100 --show=Ir --inclusive=yes "$REPORT/callgrind.out" \
    >"$REPORT/callgrind-annotate-inclusive.txt" 2>&1 || true
  if [ "$CG_SIM" -eq 1 ]; then
    callgrind_annotate --auto=no --threshold=100 "$REPORT/callgrind.out" \
      >"$REPORT/callgrind-annotate-sim.txt" 2>&1 || true
  fi
  local total
  total=$(cg_total_ir)
  if [ -z "$total" ] || [ "$total" = . ] || [ "${total//,/}" = 0 ]; then
    if [ "$SCENARIO" = http ]; then
      note "callgrind counted nothing while the queries ran; see callgrind.log and callgrind-control.log"
    else
      note "callgrind counted nothing: the --cg-toggle functions ($CG_TOGGLE) never ran. Were they renamed? Rerun with --cg-toggle all, or other names."
    fi
  fi
}
json_line() { grep '^{' "$1" 2>/dev/null | tail -1 || true; }

run_bench() {
  local t0 rc
  workload_args stat "$ARGS_STR"
  local -a stat_cmd=("$BENCH" "$SCENARIO" "${WARGS[@]}")
  if [ "$DO_STAT" -eq 1 ]; then
    log "perf stat: $(quote_cmd "${stat_cmd[@]}")"
    local -a c=(perf stat -x ',' -o "$REPORT/perf-stat.csv" -e "$STAT_EVENTS" -- "${stat_cmd[@]}")
    add_cmd "perf stat" "${c[@]}"
    t0=$(now)
    rc=0
    "${c[@]}" >"$REPORT/stat-workload.out" 2>"$REPORT/stat-workload.err" || rc=$?
    STAT_SECS=$(secs_since "$t0")
    [ "$rc" -eq 0 ] || {
      note "the perf stat run exited with $rc; see stat-workload.err"
      FAILED=1
    }
    RESULT_LINE=$(json_line "$REPORT/stat-workload.out")
    RESULT_FROM="the perf stat run"
  fi
  if [ "$DO_RECORD" -eq 1 ]; then
    workload_args record "$ARGS_STR"
    local -a c=(perf record "${CG_OPT[@]}" -F "$FREQ" "${RECORD_EV[@]}" -o "$REPORT/perf.data" -- "$BENCH" "$SCENARIO" "${WARGS[@]}")
    log "perf record: $(quote_cmd "$BENCH" "$SCENARIO" "${WARGS[@]}")"
    add_cmd "perf record" "${c[@]}"
    t0=$(now)
    rc=0
    "${c[@]}" >"$REPORT/record-workload.out" 2>"$REPORT/record-workload.err" || rc=$?
    RECORD_SECS=$(secs_since "$t0")
    [ "$rc" -eq 0 ] || {
      note "the perf record run exited with $rc; see record-workload.err"
      FAILED=1
    }
    [ -n "$RESULT_LINE" ] || {
      RESULT_LINE=$(json_line "$REPORT/record-workload.out")
      RESULT_FROM="the perf record run"
    }
    if [ -s "$REPORT/perf.data" ]; then
      add_cmd "perf report" perf report -i "$REPORT/perf.data" --stdio --no-children -n --sort dso,sym -g none
      perf_reports
    fi
  fi
  if [ "$DO_CG" -eq 1 ]; then
    workload_args callgrind "$CG_ARGS_STR"
    local -a c=(valgrind --tool=callgrind "--callgrind-out-file=$REPORT/callgrind.out"
      "--log-file=$REPORT/callgrind.log" "${CG_TOGGLE_ARGS[@]}" "${CG_SIM_ARGS[@]}"
      -- "$BENCH" "$SCENARIO" "${WARGS[@]}")
    log "callgrind: $(quote_cmd "$BENCH" "$SCENARIO" "${WARGS[@]}")"
    add_cmd "callgrind" "${c[@]}"
    t0=$(now)
    rc=0
    "${c[@]}" >"$REPORT/callgrind-workload.out" 2>"$REPORT/callgrind-workload.err" || rc=$?
    CG_SECS=$(secs_since "$t0")
    [ "$rc" -eq 0 ] || {
      note "the callgrind run exited with $rc; see callgrind.log and callgrind-workload.err"
      FAILED=1
    }
    [ -n "$RESULT_LINE" ] || {
      RESULT_LINE=$(json_line "$REPORT/callgrind-workload.out")
      RESULT_FROM="the callgrind run: reduced size, and valgrind runs it ~50x slower, so its times mean nothing"
    }
    add_cmd "callgrind_annotate" callgrind_annotate --auto=no --threshold=100 --show=Ir "$REPORT/callgrind.out"
    cg_reports
  fi
}

# ---- http -------------------------------------------------------------------------------

pick_port() {
  local p i
  for ((i = 0; i < 50; i++)); do
    p=$((20000 + RANDOM % 20000))
    # free when nothing accepts a connection there
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  die "no free port found; pass --port"
}
BASE=""
start_daemon() { # phase timeout_s wrapper...
  local phase=$1 limit=$2 i
  shift 2
  local -a da=()
  read -r -a da <<<"$DAEMON_ARGS" || true
  local -a c=("$@" "$DAEMON" --host 127.0.0.1 --port "$PORT" "${da[@]}")
  add_cmd "daemon ($phase)" "${c[@]}"
  log "starting $(quote_cmd "${c[@]}")"
  "${c[@]}" >"$REPORT/daemon-$phase.out" 2>"$REPORT/daemon-$phase.err" &
  DPID=$!
  for ((i = 0; i < limit * 10; i++)); do
    if ! kill -0 "$DPID" 2>/dev/null; then
      wait "$DPID" 2>/dev/null || true
      DPID=""
      die "kvidxd exited during start-up; daemon-$phase.err says: $(tail -3 "$REPORT/daemon-$phase.err" | tr '\n' ' ')"
    fi
    if curl -s -f -o /dev/null --max-time 1 "$BASE/health"; then
      return 0
    fi
    sleep 0.1
  done
  die "kvidxd did not answer GET /health within ${limit}s; see daemon-$phase.err"
}
register_worker() { # phase
  local code
  local body
  body=$(printf '{"instance_id":1,"endpoint":"tcp://127.0.0.1:1","model_name":"%s","block_size":%s}' "$MODEL" "$BLOCK_SIZE")
  code=$(curl -s -o "$REPORT/register-$1.txt" -w '%{http_code}' --max-time 10 -X POST \
    -H 'content-type: application/json' -d "$body" "$BASE/register" || true)
  if [ "$code" != 201 ]; then
    note "POST /register answered $code ($(head -c 200 "$REPORT/register-$1.txt" 2>/dev/null)); queries may fail with 404"
  fi
  code=$(curl -s -o "$REPORT/query-sample.txt" -w '%{http_code}' --max-time 10 -X POST \
    -H 'content-type: application/json' --data-binary "@$REPORT/query.json" "$BASE/query" || true)
  log "one POST /query: HTTP $code, $(head -c 200 "$REPORT/query-sample.txt" 2>/dev/null)"
}
H2LOAD_OPTS=()
h2load_summary() { # file -> the lines worth quoting
  grep -E '^(finished in|requests:|status codes:|time for request:|traffic:)' "$1" 2>/dev/null || true
}
run_http() {
  [ -n "$PORT" ] || PORT=$(pick_port)
  BASE="http://127.0.0.1:$PORT"
  # the query body: TOKENS token ids, i.e. TOKENS / BLOCK_SIZE blocks
  awk -v n="$TOKENS" -v m="$MODEL" 'BEGIN {
    printf "{\"model_name\":\"%s\",\"token_ids\":[", m
    for (i = 0; i < n; i++) printf "%s%d", (i ? "," : ""), 1000 + i
    printf "]}\n" }' >"$REPORT/query.json"
  H2LOAD_OPTS=(-H 'content-type: application/json' -d "$REPORT/query.json")
  [ "$H1" -eq 0 ] || H2LOAD_OPTS+=(--h1)
  local rc t0
  if [ -z "$DAEMON_ARGS" ]; then
    note "http: the registered worker's ZMQ endpoint has no publisher, so the index is empty: /query costs parsing, hashing and one missed probe, not deep matches. Feed it through --daemon-args (e.g. --workers with a live engine) for matching load."
  fi
  if [ "$DO_STAT" -eq 1 ] || [ "$DO_RECORD" -eq 1 ]; then
    start_daemon perf 20
    register_worker perf
    local -a load=(h2load -c "$CLIENTS" -m "$STREAMS" -t 1 -D "$DURATION" "${H2LOAD_OPTS[@]}" "$BASE/query")
    if [ "$DO_STAT" -eq 1 ]; then
      local -a c=(perf stat -x ',' -o "$REPORT/perf-stat.csv" -e "$STAT_EVENTS" -p "$DPID" -- "${load[@]}")
      add_cmd "perf stat" "${c[@]}"
      log "perf stat on kvidxd ($DPID) during ${DURATION}s of h2load"
      t0=$(now)
      rc=0
      "${c[@]}" >"$REPORT/h2load-stat.txt" 2>&1 || rc=$?
      STAT_SECS=$(secs_since "$t0")
      [ "$rc" -eq 0 ] || {
        note "h2load under perf stat exited with $rc; see h2load-stat.txt"
        FAILED=1
      }
      RESULT_LINE=$(h2load_summary "$REPORT/h2load-stat.txt")
      RESULT_FROM="h2load during the perf stat run"
    fi
    if [ "$DO_RECORD" -eq 1 ]; then
      local -a c=(perf record "${CG_OPT[@]}" -F "$FREQ" "${RECORD_EV[@]}" -o "$REPORT/perf.data" -p "$DPID" -- "${load[@]}")
      add_cmd "perf record" "${c[@]}"
      log "perf record on kvidxd ($DPID) during ${DURATION}s of h2load"
      t0=$(now)
      rc=0
      "${c[@]}" >"$REPORT/h2load-record.txt" 2>"$REPORT/perf-record.log" || rc=$?
      RECORD_SECS=$(secs_since "$t0")
      [ "$rc" -eq 0 ] || {
        note "h2load under perf record exited with $rc; see h2load-record.txt"
        FAILED=1
      }
      [ -n "$RESULT_LINE" ] || {
        RESULT_LINE=$(h2load_summary "$REPORT/h2load-record.txt")
        RESULT_FROM="h2load during the perf record run"
      }
      if [ -s "$REPORT/perf.data" ]; then
        add_cmd "perf report" perf report -i "$REPORT/perf.data" --stdio --no-children -n --sort dso,sym -g none
        perf_reports
      fi
    fi
    stop_daemon 100
  fi
  if [ "$DO_CG" -eq 1 ]; then
    start_daemon callgrind 180 valgrind --tool=callgrind "--callgrind-out-file=$REPORT/callgrind.out" \
      "--log-file=$REPORT/callgrind.log" --instr-atstart=no "${CG_SIM_ARGS[@]}"
    register_worker callgrind
    if callgrind_control -i on "$DPID" >"$REPORT/callgrind-control.log" 2>&1; then
      add_cmd "callgrind" callgrind_control -i on "$DPID"
    else
      note "callgrind_control -i on failed (see callgrind-control.log): the callgrind profile is empty"
    fi
    local -a load=(h2load -c 1 -m 1 -t 1 -n "$REQUESTS" "${H2LOAD_OPTS[@]}" "$BASE/query")
    add_cmd "callgrind" "${load[@]}"
    log "callgrind: $REQUESTS queries, one at a time"
    t0=$(now)
    rc=0
    "${load[@]}" >"$REPORT/h2load-callgrind.txt" 2>&1 || rc=$?
    CG_SECS=$(secs_since "$t0")
    [ "$rc" -eq 0 ] || {
      note "h2load in the callgrind run exited with $rc; see h2load-callgrind.txt"
      FAILED=1
    }
    callgrind_control -i off "$DPID" >>"$REPORT/callgrind-control.log" 2>&1 || true
    [ -n "$RESULT_LINE" ] || {
      RESULT_LINE=$(h2load_summary "$REPORT/h2load-callgrind.txt")
      RESULT_FROM="h2load during the callgrind run: valgrind makes the daemon ~50x slower"
    }
    stop_daemon 600
    add_cmd "callgrind_annotate" callgrind_annotate --auto=no --threshold=100 --show=Ir "$REPORT/callgrind.out"
    cg_reports
  fi
}

# ---- run ---------------------------------------------------------------------------------

START_UTC=$(date -u +%Y-%m-%dT%H:%M:%SZ)
if [ "$SCENARIO" = http ]; then run_http; else run_bench; fi

# ---- summary.md -----------------------------------------------------------------------------

rel() { # path relative to the repository when inside it
  local p=$1
  case "$p" in "$ROOT"/*) printf '%s' "${p#"$ROOT"/}" ;; *) printf '%s' "$p" ;; esac
}

# perf-stat.csv -> "event value" lines (perf's CSV: value,unit,event,...)
stat_values() {
  awk -F, '/^#/ || NF < 3 { next } {
    ev = $3; sub(/:.*/, "", ev); sub(/^cpu_[a-z]+\//, "", ev); sub(/\/$/, "", ev)
    print ev, $1, $2 }' "$REPORT/perf-stat.csv" 2>/dev/null || true
}
counters_md() {
  local secs=$1
  stat_values | awk -v secs="$secs" '
    function num(x) { return x ~ /^[0-9.]+([eE][+-]?[0-9]+)?$/ }
    function fmt(x) { return x >= 1e9 ? sprintf("%.3f G", x / 1e9) : x >= 1e6 ? sprintf("%.3f M", x / 1e6) : x >= 1e4 ? sprintf("%.1f k", x / 1e3) : sprintf("%g", x) }
    { # hybrid CPUs report an event once per core type: add them up
      if (!($1 in v)) { order[n++] = $1; v[$1] = $2 }
      else if (num(v[$1]) && num($2)) v[$1] += $2
      else if (num($2)) v[$1] = $2 }
    END {
      print "| counter | value | derived |"
      print "|---|---:|---|"
      for (i = 0; i < n; i++) {
        e = order[i]; x = v[e]; d = ""
        if (!num(x)) { print "| " e " | " x " | |"; continue }
        if (e == "task-clock") {
          d = sprintf("%.2f CPU-s", x / 1000)
          if (secs > 0) d = d sprintf(", %.2f CPUs utilised over %.2f s", x / 1000 / secs, secs)
          print "| task-clock | " sprintf("%.1f ms", x) " | " d " |"; continue
        }
        if (e == "context-switches" || e == "cpu-migrations" || e == "page-faults") {
          if (num(v["task-clock"]) && v["task-clock"] > 0) d = sprintf("%.1f per CPU-s", x / (v["task-clock"] / 1000))
        }
        print "| " e " | " fmt(x) " | " d " |"
      }
      print ""
      c = v["cycles"]; ins = v["instructions"]
      printf "- **IPC** (instructions / cycles): %s\n", (num(c) && num(ins) && c > 0) ? sprintf("%.2f", ins / c) : "n/a (no hardware cycles / instructions counters)"
      r = v["cache-references"]; m = v["cache-misses"]
      printf "- **cache miss rate** (cache-misses / cache-references, last-level cache on most x86): %s\n", (num(r) && num(m) && r > 0) ? sprintf("%.2f %%", 100 * m / r) : "n/a (no hardware cache counters)"
      b = v["branches"]; bm = v["branch-misses"]
      printf "- **branch miss rate** (branch-misses / branches): %s\n", (num(b) && num(bm) && b > 0) ? sprintf("%.2f %%", 100 * bm / b) : "n/a (no hardware branch counters)"
    }'
}
perf_top_md() {
  awk -v top="$TOP" '
    /^#/ || NF < 4 { next }
    $1 ~ /%$/ && $2 ~ /^[0-9]+$/ {
      pct = $1; smp = $2; dso = $3; kind = $4
      sym = $0; sub(/^[[:space:]]*[^[:space:]]+[[:space:]]+[^[:space:]]+[[:space:]]+[^[:space:]]+[[:space:]]+[^[:space:]]+[[:space:]]+/, "", sym)
      gsub(/[[:space:]]+$/, "", sym); gsub(/\|/, "\\|", sym)
      if (n == 0) { print "| # | samples % | samples | symbol | object |"; print "|---:|---:|---:|---|---|" }
      if (n < top) printf "| %d | %s | %s | `%s`%s | %s |\n", n + 1, pct, smp, sym, (kind == "[k]" ? " (kernel)" : ""), dso
      n++
    }
    END { if (n == 0) print "(no samples)" }' "$REPORT/perf-report.txt"
}
perf_sample_count() {
  awk '/^# Samples: / { ev = $0; sub(/.* of event /, "", ev); gsub(/\047/, "", ev) }
       !/^#/ && $1 ~ /%$/ && $2 ~ /^[0-9]+$/ { n += $2 }
       END { printf "%d samples of %s", n, ev }' "$REPORT/perf-report.txt"
}
# callgrind_annotate output -> table. $1 file, $2 "skip startup frames" (inclusive)
cg_top_md() {
  awk -v top="$TOP" -v root="$ROOT/" -v incl="$2" '
    /file:function/ { body = 1; next }
    !body { next }
    /^-+$/ { next }
    /^[[:space:]]*[0-9,]+ \([[:space:]]*[0-9.]+%\)/ {
      line = $0
      match(line, /^[[:space:]]*[0-9,]+/); ir = substr(line, RSTART, RLENGTH); gsub(/[[:space:]]/, "", ir)
      match(line, /\([[:space:]]*[0-9.]+%\)/); pct = substr(line, RSTART + 1, RLENGTH - 2); gsub(/[[:space:]]/, "", pct)
      rest = substr(line, RSTART + RLENGTH); sub(/^[[:space:]]+/, "", rest)
      obj = ""
      if (match(rest, / \[[^]]*\]$/)) { obj = substr(rest, RSTART + 2, RLENGTH - 3); rest = substr(rest, 1, RSTART - 1) }
      i = index(rest, ":"); file = substr(rest, 1, i - 1); fn = substr(rest, i + 1)
      if (incl && (fn ~ /below main|^0x|^_start$|^__libc_start|^start_thread$|^clone3?$|^main$/)) next
      if (incl && (fn in seen)) next
      seen[fn] = 1
      if (index(file, root) == 1) file = substr(file, length(root) + 1)
      sub(/.*\//, "", obj)
      gsub(/\|/, "\\|", fn)
      if (n == 0) { print "| # | Ir | % | function | file | object |"; print "|---:|---:|---:|---|---|---|" }
      if (n < top) printf "| %d | %s | %s | `%s` | %s | %s |\n", n + 1, ir, pct, fn, file, obj
      n++
    }
    /^$/ && n > 0 { exit }
    END { if (n == 0) print "(no functions)" }' "$1"
}
cg_sim_md() { # simulated rates from the "summary:"/"totals:" line of callgrind.out
  awk '/^events:/ { for (i = 2; i <= NF; i++) name[i - 1] = $i; ne = NF - 1 }
       /^(summary|totals):/ { for (i = 2; i <= NF; i++) v[name[i - 1]] = $i }
       END {
         if (!("D1mr" in v) && !("Bcm" in v)) exit
         d = v["Dr"] + v["Dw"]
         if (d > 0) {
           printf "- simulated D1 miss rate (data reads + writes): %.2f %% of %.0f accesses\n", 100 * (v["D1mr"] + v["D1mw"]) / d, d
           printf "- simulated last-level miss rate (data): %.3f %% of accesses\n", 100 * (v["DLmr"] + v["DLmw"]) / d
         }
         b = v["Bc"] + v["Bi"]
         if (b > 0) printf "- simulated branch misprediction rate (conditional + indirect): %.2f %% of %.0f branches\n", 100 * (v["Bcm"] + v["Bim"]) / b, b
       }' "$REPORT/callgrind.out" 2>/dev/null || true
}

SUMMARY="$REPORT/summary.md"
{
  echo "# kvidx profile: $SCENARIO"
  echo
  echo "- started: $START_UTC"
  echo "- host: $(uname -n), kernel $(uname -r), $(nproc) CPUs, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  if git -C "$ROOT" rev-parse --short HEAD >/dev/null 2>&1; then
    dirty=""
    [ -z "$(git -C "$ROOT" status --porcelain 2>/dev/null | head -1)" ] || dirty=" (working tree has uncommitted changes)"
    echo "- source: $ROOT at $(git -C "$ROOT" rev-parse --short HEAD)$dirty"
  fi
  echo "- build: $BUILD (${BTYPE:-unknown type})"
  echo "- tools: $(perf --version 2>/dev/null || echo 'no perf'), $(valgrind --version 2>/dev/null || echo 'no valgrind')$([ "$SCENARIO" != http ] || echo ", $(h2load --version 2>/dev/null | head -1)")"
  [ -z "$PARANOID_TEXT" ] || echo "- $PARANOID_TEXT"
  if [ ${#NOTES[@]} -gt 0 ]; then
    echo
    echo "Notes:"
    echo
    for n in "${NOTES[@]}"; do echo "- $n"; done
  fi
  echo
  echo "## Commands"
  echo
  echo '```'
  for c in "${COMMANDS[@]}"; do
    printf '# %s\n%s\n' "${c%%|*}" "${c#*|}"
  done
  echo '```'
  if [ -n "$RESULT_LINE" ]; then
    echo
    echo "Workload result ($RESULT_FROM):"
    echo
    echo '```'
    echo "$RESULT_LINE"
    echo '```'
  fi
  echo
  echo "## Counters (perf stat)"
  echo
  if [ "$DO_STAT" -eq 1 ] && [ -s "$REPORT/perf-stat.csv" ]; then
    if [ "$SCENARIO" = http ]; then
      echo "Counted on the kvidxd process (all its threads) while h2load ran for ${DURATION} s; wall time ${STAT_SECS} s."
    else
      echo "Whole workload, every thread; wall time ${STAT_SECS} s (under perf stat)."
    fi
    echo
    counters_md "$STAT_SECS"
    if [ ${#HW_OK[@]} -eq 0 ]; then
      echo
      echo "No hardware counters here, so no IPC or hardware miss rates: the figures above are software events."
    fi
  else
    echo "Not run: ${PERF_WHY:-skipped (--no-stat)}."
  fi
  if [ "$DO_CG" -eq 1 ] && [ "$CG_SIM" -eq 1 ] && [ -s "$REPORT/callgrind.out" ]; then
    echo
    echo "Simulated by callgrind (--cache-sim --branch-sim; a model of a generic cache, not this CPU), on the callgrind run:"
    echo
    cg_sim_md
  fi
  echo
  echo "## Top $TOP symbols by samples (perf record)"
  echo
  if [ "$DO_RECORD" -eq 1 ] && [ -s "$REPORT/perf-report.txt" ]; then
    echo "$(perf_sample_count), self time (no children); wall time ${RECORD_SECS} s; call graphs: $CALL_GRAPH."
    echo
    perf_top_md
  else
    echo "Not run: ${PERF_WHY:-skipped (--no-record) or perf record failed}."
  fi
  echo
  echo "## Top $TOP functions by instructions (callgrind)"
  echo
  if [ "$DO_CG" -eq 1 ] && [ -s "$REPORT/callgrind-annotate.txt" ]; then
    scope="in the whole program"
    if [ "$SCENARIO" = http ]; then
      scope="in kvidxd while it answered $REQUESTS queries (instrumentation switched on with callgrind_control after start-up, off before shut-down)"
    elif [ "$CG_TOGGLE" != all ] && [ -n "$CG_TOGGLE" ]; then
      scope="only inside ${CG_TOGGLE//,/, } (--toggle-collect)"
    fi
    echo "Reduced-size run; instructions counted $scope: **$(cg_total_ir) Ir** in total; wall time ${CG_SECS} s under valgrind."
    echo "Exclusive (self) instruction counts; inlined code is counted in the function it was inlined into,"
    echo "and shows up under its header's name when callgrind can tell (e.g. \`index_internal.h:find_core\`)."
    echo
    cg_top_md "$REPORT/callgrind-annotate.txt" 0
    echo
    echo "Inclusive (the function and everything it calls), start-up frames left out:"
    echo
    cg_top_md "$REPORT/callgrind-annotate-inclusive.txt" 1
  elif [ "$DO_CG" -eq 1 ]; then
    echo "callgrind produced no profile; see callgrind.log."
  else
    echo "Not run."
  fi
  echo
  echo "## Raw files"
  echo
  echo "In $(rel "$REPORT")/:"
  echo
  for f in perf-stat.csv perf.data perf-report.txt perf-report-callgraph.txt callgrind.out \
    callgrind-annotate.txt callgrind-annotate-inclusive.txt callgrind-annotate-sim.txt callgrind.log build.log; do
    [ -s "$REPORT/$f" ] || continue
    case "$f" in
      perf-stat.csv) d="perf stat counters, CSV (value,unit,event,run time,%,metric)" ;;
      perf.data) d="perf record samples: \`perf report -i $(rel "$REPORT")/perf.data\`" ;;
      perf-report.txt) d="every symbol by self samples" ;;
      perf-report-callgraph.txt) d="perf report with children and call graphs (>= 3 %)" ;;
      callgrind.out) d="callgrind profile: \`callgrind_annotate --auto=yes\` for source lines, or kcachegrind" ;;
      callgrind-annotate.txt) d="every function by exclusive Ir" ;;
      callgrind-annotate-sim.txt) d="every function with the simulated cache and branch events" ;;
      callgrind-annotate-inclusive.txt) d="every function by inclusive Ir" ;;
      callgrind.log) d="valgrind's log" ;;
      build.log) d="the build" ;;
    esac
    echo "- \`$f\`: $d"
  done
  for f in "$REPORT"/*-workload.out "$REPORT"/h2load-*.txt "$REPORT"/daemon-*.err; do
    [ -e "$f" ] || continue
    echo "- \`$(basename "$f")\`: output of that run"
  done
  for f in "$REPORT"/stat.* "$REPORT"/record.* "$REPORT"/callgrind.*; do
    [ -e "$f" ] || continue
    case "$(basename "$f")" in callgrind.out | callgrind.log) continue ;; esac
    echo "- \`$(basename "$f")\`: written by the workload of that run (@OUT@)"
  done
} >"$SUMMARY"

log "report: $(rel "$REPORT")/summary.md"
exit "$FAILED"
