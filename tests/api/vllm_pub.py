#!/usr/bin/python3
"""A KV-event publisher in vLLM's own wire form, for tests/api/kvidxd_zmqbind_test.c.

Like vLLM's ZmqEventPublisher in the llm-d deployment (--kv-events-config
'{"publisher":"zmq","endpoint":"tcp://<indexer>:5557","topic":"kv@<pod>@<model>"}'),
it CONNECTs a PUB socket to the endpoint (vLLM connects when the endpoint names
a host) and sends multipart messages of three frames:

    topic (bytes), seq (8-byte big-endian, from 0), payload

where the payload is a KVEventBatch encoded by msgspec with array_like=True:
[ts, [events...], data_parallel_rank]. FORM "array" writes each event as a
tagged array of the last array layout (vLLM #40984: 12 BlockStored fields, 4
BlockRemoved fields; /work/shared/reference/wire-protocol.md section 3.1), FORM
"map" as a tagged map (vLLM >= #42892: "type" first, fields equal to their
default omitted; section 3.2). Block hashes are u64, as vLLM's (values >= 2**63
are msgpack uint64).

Usage: vllm_pub.py ENDPOINT TOPIC FORM, then commands on stdin, one per line:
    probe                       a 1-frame message [topic] (never stored: the test's
                                PUB/SUB slow-joiner sync, as kvidxd_zmqbind_test's)
    store RANK C FROM TO BS     blocks [FROM, TO) of chain C, one BlockStored, block size BS
    remove RANK C FROM TO       their removal, one BlockRemoved
    quit
Chain C block i has the engine hash kfx_hash(C, i) and the BS tokens
100000*C + BS*i + (0..BS), as tests/api/kvidxd_fixture.h writes them.
Each command is answered with a line "ok" once sent.
"""
import sys
import time

import msgpack
import zmq

M64 = (1 << 64) - 1


def kfx_hash(c, i):
    """tests/api/kvidxd_fixture.h kfx_mix(((uint64_t)c << 32) | i)."""
    x = ((c << 32) | i) & M64
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def as_map(ev, keys):
    """A tagged array as vLLM >= #42892 writes it: a map, "type" first, defaults omitted."""
    m = {"type": ev[0]}
    for k, v in zip(keys, ev[1:]):
        if v is not None or k in ("parent_block_hash", "lora_id", "medium", "lora_name"):
            m[k] = v
    return m


STORED_KEYS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
               "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window")
REMOVED_KEYS = ("block_hashes", "medium", "group_idx")


def stored(c, lo, hi, bs):
    hashes = [kfx_hash(c, i) for i in range(lo, hi)]
    tokens = [100000 * c + bs * lo + k for k in range((hi - lo) * bs)]
    parent = kfx_hash(c, lo - 1) if lo > 0 else None
    # block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
    # extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window
    return ["BlockStored", hashes, parent, tokens, bs, None, "GPU", None, [None] * len(hashes), 0,
            "full_attention", None]


def removed(c, lo, hi):
    return ["BlockRemoved", [kfx_hash(c, i) for i in range(lo, hi)], "GPU", 0]


def main():
    endpoint, topic, form = sys.argv[1], sys.argv[2].encode(), sys.argv[3]
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 5000)  # let the last batches out at quit
    pub.connect(endpoint)
    seq = 0
    for line in sys.stdin:
        w = line.split()
        if not w:
            continue
        if w[0] == "quit":
            break
        if w[0] == "probe":
            pub.send(topic)
        else:
            rank, c, lo, hi = (int(v) for v in w[1:5])
            if w[0] == "store":
                ev = stored(c, lo, hi, int(w[5]))
                ev = as_map(ev, STORED_KEYS) if form == "map" else ev
            else:
                ev = removed(c, lo, hi)
                ev = as_map(ev, REMOVED_KEYS) if form == "map" else ev
            batch = msgpack.packb([time.time(), [ev], rank], use_bin_type=True)
            pub.send_multipart([topic, seq.to_bytes(8, "big"), batch])
            seq += 1
        print("ok", flush=True)
    pub.close()
    ctx.term()


if __name__ == "__main__":
    main()
