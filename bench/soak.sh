#!/usr/bin/env bash
# bench/soak.sh: an N-minute soak of kvidxd (issue 7 §4). A long check, not part of the test suite.
#
#   bash bench/soak.sh --minutes N [--trace PATH|synthetic] [-- more kvidx-bench soak options]
#
# What it does:
#   1. builds the Release tree (bash ci/build.sh Release, into build/release);
#      BUILD=DIR uses an existing build instead and builds nothing;
#   2. runs DIR/bench/kvidx-bench soak --minutes N --kvidxd DIR/api/kvidxd:
#      a kvidxd on a free loopback port; the trace (default
#      ../shared/data/mooncake-traces/conversation_trace.jsonl beside the
#      repository, else the built-in generator) replayed in a loop with fresh
#      hash ids and sessions every loop, one loop per 30 s: 128 mock engines
#      (2,048-block pools, so every admission evicts once they are full), one
#      C publisher each (ZMQ), and a POST /query_by_hash over HTTP/2 (h2c) at
#      every request's arrival (about 400 queries and 1,800 events per second);
#   3. checks, after the load:
#        no errors      every query answered 200 with a valid score map, no
#                       publish error, kvidxd alive at every sample, no batch
#                       lost or undecodable (gaps only when replay filled them);
#        RSS flat       kvidxd's VmRSS every 5 s; after the first 20 % of the
#                       run (warm-up), the median of every 3 consecutive samples
#                       stays within +10 % of the first one (the level);
#        /dump = model  GET /dump, decoded as it streams, equals block for block
#                       (parent, content hash, depth) the model built from every
#                       event published, and the model equals what the engines
#                       cache;
#        counters       per type, events published = decoded by kvidxd, and
#                       published = applied + rejected (rejected = what the
#                       model rejected: 0).
#
# Output: progress lines every 30 s, a summary and, last, one JSON line
#   {"bench":"soak","minutes":x,"queries":n,"events_published":n,"events_applied":n,"events_rejected":n,
#    "rss_start_kb":n,"rss_max_kb":n,"rss_end_kb":n,"dump_equal":true,"ok":true}
# on stdout and in OUT.log; kvidxd's samples in OUT.rss.csv: t_s, rss_kb, backlog_events
# (published, not yet applied), index_kb (kvidx_index_bytes), alloc_kb (jemalloc allocated), holdings.
# OUT defaults to DIR/soak-<UTC time>.
# Exit status: 0 when every check passed, 1 when one failed (or the run could not start), 2 for usage errors.
#
# More options (after --): see `kvidx-bench soak --help` (--loop-s for the load, --workers,
# --rss-bound-pct, --warmup-pct, --rss-interval-s, --lanes, --writers, ...).
# The machine should be otherwise idle: on a busy 2-vCPU VM the lanes fall behind and
# bursts queue in kvidxd's ZMQ sockets.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    echo "usage: bash bench/soak.sh --minutes N [--trace PATH|synthetic] [-- kvidx-bench soak options]" >&2
    exit 2
}

minutes=""
trace=""
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
    --minutes) [ $# -ge 2 ] || usage; minutes="$2"; shift 2 ;;
    --minutes=*) minutes="${1#*=}"; shift ;;
    --trace) [ $# -ge 2 ] || usage; trace="$2"; shift 2 ;;
    --trace=*) trace="${1#*=}"; shift ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak.sh: unknown option '$1' (kvidx-bench soak options go after --)" >&2; usage ;;
    esac
done
[ -n "$minutes" ] || usage
if ! awk -v m="$minutes" 'BEGIN { exit !(m ~ /^[0-9]*\.?[0-9]+$/ && m > 0) }'; then
    echo "soak.sh: --minutes wants a positive number, got '$minutes'" >&2
    exit 2
fi

if [ -z "${BUILD:-}" ]; then
    bash ci/build.sh Release
    BUILD=build/release
fi
bench="$BUILD/bench/kvidx-bench"
kvidxd="$BUILD/api/kvidxd"
for f in "$bench" "$kvidxd"; do
    if [ ! -x "$f" ]; then
        echo "soak.sh: $f is missing (build first, or set BUILD to a build directory)" >&2
        exit 1
    fi
done

out="${OUT:-$BUILD/soak-$(date -u +%Y%m%dT%H%M%SZ)}"
args=(soak --minutes "$minutes" --kvidxd "$kvidxd" --rss-csv "$out.rss.csv")
if [ -n "$trace" ]; then
    args+=(--trace "$trace")
fi
echo "soak.sh: $bench ${args[*]} ${extra[*]}"
echo "soak.sh: log $out.log"
set +e
"$bench" "${args[@]}" "${extra[@]}" 2>&1 | tee "$out.log"
status=${PIPESTATUS[0]}
set -e
echo "soak.sh: exit status $status; log $out.log, RSS series $out.rss.csv"
exit "$status"
