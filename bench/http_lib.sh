# shellcheck shell=bash
# bench/http_lib.sh: what bench/http.sh and bench/slots_http.sh share.
# Sourced, not run. Expects, set by the caller: KVIDXD, N, C, M, ONLY, PY,
# WORKERS, SEQS, DEPTH, PREFIX, HTTP_THREADS, WRITERS, and BENCH_NAME (the
# script's name, for messages).
#
#   bench_setup TMP_PREFIX       checks the tools, makes $tmp, installs cleanup
#   bench_state LABEL            writes $tmp/www/dump (the Dynamo-format state)
#                                and $tmp/first.json (the first sequence's tokens)
#   bench_start_kvidxd ARGS...   serves the dump, starts kvidxd (--peers at it),
#                                waits for recovery; sets $kvidxd_pid and $base
#   bench_h2load URL LABEL PROTO BODY FILE CTYPE
#                                one h2load configuration: checks every answer
#                                was 2xx, prints the human line, and sets
#                                $rps and $p99 for the caller's JSON line;
#                                returns 1 when ONLY filters it out

die() { echo "$BENCH_NAME: $*" >&2; exit 1; }

bench_setup() {
  local t
  for t in h2load curl "$PY" "$KVIDXD"; do
    command -v "$t" >/dev/null || die "$t not found (bash ci/deps.sh; bash ci/build.sh Release)"
  done
  tmp=$(mktemp -d "/tmp/$1.XXXXXX")
  kvidxd_pid=""
  server_pid=""
  trap bench_cleanup EXIT
  CLK_TCK=$(getconf CLK_TCK)
}

bench_cleanup() {
  [ -n "$kvidxd_pid" ] && kill "$kvidxd_pid" 2>/dev/null && wait "$kvidxd_pid" 2>/dev/null || true
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  rm -rf "$tmp"
}

bench_state() {
  "$PY" - "$tmp" "$WORKERS" "$SEQS" "$DEPTH" "$PREFIX" "$1" <<'PYEOF'
import json, os, random, struct, sys
import xxhash

out, label = sys.argv[1], sys.argv[6]
workers, seqs, depth, prefix = map(int, sys.argv[2:6])
BS, SEED = 16, 1337
rng = random.Random(42)

def content(tokens):
    return xxhash.xxh3_64_intdigest(struct.pack("<%dI" % len(tokens), *tokens), seed=SEED)

system = [rng.randrange(1, 128000) for _ in range(prefix * BS)]
events, first = [], None
for s in range(seqs):
    tokens = system + [rng.randrange(1, 128000) for _ in range((depth - prefix) * BS)]
    if first is None:
        first = tokens
    blocks, eh = [], 0
    for i in range(depth):
        c = content(tokens[i * BS:(i + 1) * BS])
        eh = xxhash.xxh3_64_intdigest(struct.pack("<QQ", eh, c), seed=7)  # an engine's opaque name
        blocks.append({"block_hash": eh, "tokens_hash": c, "mm_extra_info": None})
    events.append({"worker_id": s % workers, "storage_tier": "device",
                   "event": {"event_id": s, "dp_rank": 0,
                             "data": {"stored": {"parent_hash": None, "start_position": 0, "blocks": blocks}}}})
os.makedirs(os.path.join(out, "www"), exist_ok=True)
with open(os.path.join(out, "www", "dump"), "w") as f:
    json.dump({"bench:default": {"block_size": BS, "events": events}}, f)
with open(os.path.join(out, "first.json"), "w") as f:
    json.dump(first, f)
print("%s: %d workers, %d sequences x %d blocks (%d-block shared prefix), dump %.1f MB"
      % (label, workers, seqs, depth, prefix, os.path.getsize(os.path.join(out, "www", "dump")) / 1e6))
PYEOF
}

bench_start_kvidxd() {
  "$PY" -u -c '
import http.server, socketserver, sys, os
os.chdir(sys.argv[1])
class H(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a): pass
with socketserver.TCPServer(("127.0.0.1", 0), H) as s:
    open(sys.argv[2], "w").write(str(s.server_address[1]))
    s.serve_forever()
' "$tmp/www" "$tmp/peer.port" &
  server_pid=$!
  for _ in $(seq 200); do [ -s "$tmp/peer.port" ] && break; sleep 0.05; done
  local peer_port
  peer_port=$(cat "$tmp/peer.port")

  "$KVIDXD" --port 0 --port-file "$tmp/port" "$@" --http-threads "$HTTP_THREADS" --threads "$WRITERS" \
    --peers "http://127.0.0.1:$peer_port" --recovery-delay-ms 0 --log-level warn &
  kvidxd_pid=$!
  for _ in $(seq 400); do [ -s "$tmp/port" ] && break; sleep 0.05; done
  base="http://127.0.0.1:$(cat "$tmp/port")"
  for _ in $(seq 1200); do
    curl -fs "$base/status" | grep -q '"last_result"' && break
    sleep 0.05
  done
  curl -fs "$base/status" | grep -q '"last_result":"succeeded"' || die "recovery failed"
  kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""
}

cpu_ticks() { # kvidxd's user + system time so far, in clock ticks
  awk '{ print $14 + $15 }' "/proc/$kvidxd_pid/stat"
}

bench_h2load() {
  local url=$1 label=$2 proto=$3 body=$4 file=$5 ctype=$6
  [ -n "$ONLY" ] && [[ "$label $proto $body" != *"$ONLY"* ]] && return 1
  local args=(-n "$N" -c "$C" -d "$file" -H "content-type: $ctype" --log-file "$tmp/h2load.log")
  if [ "$proto" = h1 ]; then args+=(--h1 -m 1); else args+=(-m "$M"); fi
  rm -f "$tmp/h2load.log"
  local out t0 t1 ok p50 p90 p999 cpu_us
  t0=$(cpu_ticks)
  out=$(h2load "${args[@]}" "$url" 2>&1)
  t1=$(cpu_ticks)
  rps=$(sed -n 's/^finished in [^,]*, \([0-9.]*\) req\/s.*/\1/p' <<<"$out")
  ok=$(sed -n 's/^status codes: \([0-9]*\) 2xx.*/\1/p' <<<"$out")
  if [ "${ok:-0}" != "$N" ]; then
    echo "$BENCH_NAME: $label $proto $body: only ${ok:-0} of $N answers were 2xx" >&2
    echo "$out" >&2
    exit 1
  fi
  read -r p50 p90 p99 p999 < <(cut -f3 "$tmp/h2load.log" | sort -n | awk '
    { v[NR] = $1 } END { n = NR; printf "%.3f %.3f %.3f %.3f\n", v[int(n*0.50)]/1000, v[int(n*0.90)]/1000, v[int(n*0.99)]/1000, v[int(n*0.999)]/1000 }')
  cpu_us=$(awk -v t=$((t1 - t0)) -v hz="$CLK_TCK" -v n="$N" 'BEGIN { printf "%.2f", t / hz * 1e6 / n }')
  printf '%-17s %-3s %-8s %10s req/s   p50 %6s ms  p90 %6s ms  p99 %6s ms  p99.9 %6s ms   kvidxd CPU %s us/req\n' \
    "$label" "$proto" "$body" "$rps" "$p50" "$p90" "$p99" "$p999" "$cpu_us"
}
