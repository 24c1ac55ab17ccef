#!/usr/bin/env bash
# bench/slots_http.sh: h2load benchmark of the slot tracker's read path
# (POST /potential_loads on the slot port) and of POST /route on the indexer
# port. A benchmark, not a test.
#
#   bash bench/slots_http.sh        (after `bash ci/build.sh Release`)
#
# What it does:
#   1. generates a Dynamo-format /dump (python3-xxhash computes the content
#      hashes kvidx computes): SEQS sequences of DEPTH blocks (block size 16)
#      spread over WORKERS workers, all sharing a PREFIX-block system prompt;
#      serves it over HTTP and starts kvidxd with --peers pointing at it, so
#      the index P2P-loads that state (no ZMQ publishers needed);
#   2. registers the same WORKERS workers on the slot port and adds ACTIVE
#      active requests (each the shared prefix plus DEPTH_ACTIVE-PREFIX blocks
#      of its own, 64 prefill tokens), round-robin over the workers;
#   3. runs h2load (C connections) against
#        /potential_loads  128 sequence hashes of the first sequence    JSON, HTTP/2 (h2c) and HTTP/1.1
#        /route            2,048 tokens (128 blocks) of it, no commit    JSON and msgpack, both protocols
#        /free             of an unknown request (a no-op write)       JSON, both protocols: the write
#                          path (parse on the loop thread, the hop to the mutation thread and back)
#      checks every answer was 2xx and prints per configuration one line
#      with req/s and latency percentiles (h2load's per-request log) and
#      kvidxd's CPU time per request (/proc/<pid>/stat, every thread), then
#      one JSON line:
#        {"bench":"slots_http","route":"/route","proto":"h2","body":"msgpack","req_per_s":x,"p99_ms":x}
#
# Knobs (environment): KVIDXD (binary), N (requests per configuration,
# default 100000), C (connections, 16), M (concurrent streams per HTTP/2
# connection, 32; HTTP/1.1 runs one request at a time per connection),
# HTTP_THREADS (loop threads of each port, 2), WRITERS (2), WORKERS (16),
# SEQS (256), DEPTH (128), PREFIX (32), ACTIVE (1024), DEPTH_ACTIVE (64),
# ONLY (a substring: run only the matching configurations, e.g. "/route h2").
# kvidxd and h2load share the machine: on 2 cores the client takes about
# half of the CPU; the server's CPU per request says what dedicated cores
# would sustain (req/s <= cores / CPU-s per request).
set -euo pipefail
cd "$(dirname "$0")/.."

KVIDXD=${KVIDXD:-build/release/api/kvidxd}
N=${N:-100000}
C=${C:-16}
M=${M:-32}
HTTP_THREADS=${HTTP_THREADS:-2}
WRITERS=${WRITERS:-2}
WORKERS=${WORKERS:-16}
SEQS=${SEQS:-256}
DEPTH=${DEPTH:-128}
PREFIX=${PREFIX:-32}
ACTIVE=${ACTIVE:-1024}
DEPTH_ACTIVE=${DEPTH_ACTIVE:-64}
ONLY=${ONLY:-}
PY=/usr/bin/python3

BENCH_NAME=slots_http.sh
# shellcheck source=bench/http_lib.sh
. bench/http_lib.sh
bench_setup kvidx-slots-bench

# 1. the index state (a /dump to recover from) and the request bodies
bench_state "index state"
"$PY" - "$tmp" "$PREFIX" <<'EOF'
import json, os, struct, sys
import msgpack, xxhash

out, prefix = sys.argv[1], int(sys.argv[2])
BS, SEED = 16, 1337
first = json.load(open(os.path.join(out, "first.json")))

def content(tokens):
    return xxhash.xxh3_64_intdigest(struct.pack("<%dI" % len(tokens), *tokens), seed=SEED)

def seq_hashes(contents):  # the standard rolling sequence hash (RFC 1527), what routers send the tracker
    out, prev = [], None
    for c in contents:
        prev = c if prev is None else xxhash.xxh3_64_intdigest(struct.pack("<QQ", prev, c), seed=SEED)
        out.append(prev)
    return out

n = 128
contents = [content(first[i * BS:(i + 1) * BS]) for i in range(n)]
seqh = seq_hashes(contents)
signed = [h - (1 << 64) if h >= 1 << 63 else h for h in seqh]
with open(os.path.join(out, "pl.json"), "w") as f:
    json.dump({"model_name": "bench", "sequence_hashes": signed, "new_isl_tokens": n * BS}, f)
with open(os.path.join(out, "free.json"), "w") as f:
    json.dump({"model_name": "bench", "request_id": "no-such-request"}, f)
with open(os.path.join(out, "system.json"), "w") as f:
    json.dump(signed[:prefix], f)
tokens = first[:n * BS]
with open(os.path.join(out, "route.json"), "w") as f:
    json.dump({"model_name": "bench", "token_ids": tokens}, f)
with open(os.path.join(out, "route.msgpack"), "wb") as f:
    f.write(msgpack.packb({"model_name": "bench", "token_ids": struct.pack("<%dI" % len(tokens), *tokens)}))
EOF

bench_start_kvidxd --slot-port auto --slot-port-file "$tmp/slot.port"
slot="http://127.0.0.1:$(cat "$tmp/slot.port")"

# 2. the slot tracker's state, over one keep-alive connection
"$PY" - "$(cat "$tmp/slot.port")" "$WORKERS" "$ACTIVE" "$DEPTH_ACTIVE" "$tmp/system.json" <<'EOF'
import http.client, json, random, sys
port, workers, active, depth = map(int, sys.argv[1:5])
system = json.load(open(sys.argv[5]))
c = http.client.HTTPConnection("127.0.0.1", port)
def post(path, body, want):
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse(); data = r.read()
    if r.status != want:
        sys.exit("slots_http.sh: %s -> %d %s" % (path, r.status, data))
for w in range(workers):
    post("/register", {"worker_id": w, "model_name": "bench", "block_size": 16, "dp_start": 0, "dp_size": 1}, 201)
rng = random.Random(7)
for i in range(active):
    own = [rng.randrange(-2**63, 2**63) for _ in range(depth - len(system))]
    post("/add", {"model_name": "bench", "request_id": "r%d" % i, "worker_id": i % workers, "dp_rank": 0,
                  "sequence_hashes": system + own, "new_isl_tokens": 64}, 201)
print("slot state: %d workers, %d active requests of %d blocks" % (workers, active, depth))
EOF
echo "kvidxd: indexer $base, slot tracker $slot; $HTTP_THREADS HTTP threads per port, $WRITERS writers; $(nproc) CPUs shared with h2load"
curl -fs -H 'content-type: application/json' --data-binary @"$tmp/route.json" "$base/route" \
  | grep -q '"candidates":\[{"worker_id":0,"dp_rank":0,"overlap_blocks":128' \
  || die "unexpected /route answer"

# 3. the runs
run() { # base route proto body file ctype
  local url=$1$2
  shift
  bench_h2load "$url" "$@" || return 0
  printf '{"bench":"slots_http","route":"%s","proto":"%s","body":"%s","req_per_s":%s,"p99_ms":%s}\n' \
    "$1" "$2" "$3" "$rps" "$p99"
}

echo "h2load -n $N -c $C (HTTP/2: -m $M; HTTP/1.1: -m 1)"
run "$slot" /potential_loads h2 json "$tmp/pl.json" application/json
run "$slot" /potential_loads h1 json "$tmp/pl.json" application/json
run "$base" /route h2 json "$tmp/route.json" application/json
run "$base" /route h2 msgpack "$tmp/route.msgpack" application/msgpack
run "$base" /route h1 json "$tmp/route.json" application/json
run "$base" /route h1 msgpack "$tmp/route.msgpack" application/msgpack
run "$slot" /free h2 json "$tmp/free.json" application/json
run "$slot" /free h1 json "$tmp/free.json" application/json
