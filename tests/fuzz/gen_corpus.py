#!/usr/bin/python3
"""Write the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

Seeds are small, valid or nearly valid inputs that show the fuzzer every
shape the parsers accept; libFuzzer mutates from there. Each target's input
layout is described at the top of its tests/fuzz/fuzz_<target>.c:

  decode    the msgpack frame itself: every tests/net/fixtures/decode/*.bin
  codec     1 selector byte (parser | content type << 4 | msgpack widths << 6)
            then the body: the request bodies of tests/api/codec_*_test.c
            (single-literal ones, found by a regular expression), plus
            hand-written JSON and msgpack bodies of every route
  slots     1 selector byte (parser | content type << 4 | msgpack widths << 6)
            then the body: hand-written JSON and msgpack bodies of every
            slot-tracker route, POST /route and the replica-sync batch, plus
            the request bodies of tests/api/codec_{slots,route}_test.c
            (adjacent C literals joined); the rank op's raw parameters
  endpoint  an endpoint and --workers value
  dump      1 byte (chunking mode, callback stops) then a /dump body, in the
            shapes of tests/api/codec_dump_test.c and http-api.md §1.11
  ingest    2 selector bytes (target, rank, skip_tiers, fresh; group,
            pub_applied) then a decode seed: each decoder fixture twice, on a
            fresh target whose block size its events use (a Mooncake-style
            target for RFC 1527 events) and on another target and options
  router    a NATS message payload: Dynamo RouterEvents of every variant as
            JSON, bare msgpack and in the Core NATS envelope, and a few bad ones

Findings are not written here: they go to tests/fuzz/regressions/<target>/
(see tests/README.md, "Fuzzing"). Usage:

    gen_corpus.py            rewrite tests/fuzz/corpus/
    gen_corpus.py --check    exit 1 if the committed corpus differs
"""
import glob
import hashlib
import json
import os
import re
import struct
import sys

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "corpus")

# tests/fuzz/fuzz_codec.c: enum op and the Content-Type classes
OPS = {
    "dyn_register": 0, "dyn_unregister": 1, "dyn_query": 2, "dyn_query_by_hash": 3,
    "dyn_peer": 4, "dyn_listener_ctl": 5, "cond_register": 6, "cond_unregister": 7,
    "cond_query": 8, "cond_query_by_hash": 9, "workers_filter": 10, "flow_register": 11,
    "flow_unregister": 12, "flow_query": 13, "flow_query_by_hash": 14, "headers": 15,
}
CT_NONE, CT_JSON, CT_MSGPACK, CT_OTHER = 0, 1, 2, 3


def sel(op, ct, style=0):
    return bytes([OPS[op] | ct << 4 | style << 6])


def js(obj):
    return json.dumps(obj, separators=(",", ":")).encode()


def mp(obj):
    return msgpack.packb(obj, use_bin_type=True)


# ---------------------------------------------------------------------------
# codec
# ---------------------------------------------------------------------------

DYN_REGISTER = {"instance_id": 1, "endpoint": "tcp://127.0.0.1:5557", "model_name": "m",
                "block_size": 16, "tenant_id": "t", "dp_rank": 2,
                "replay_endpoint": "tcp://[::1]:5558", "additional_salt": "s"}
DYN_UNREGISTER = {"instance_id": 18446744073709551615, "model_name": "m", "tenant_id": None,
                  "dp_rank": 0}
DYN_QUERY = {"token_ids": [1, 2, 3, 4294967295], "model_name": "m", "tenant_id": "default",
             "lora_name": None, "cache_salt": "x"}
DYN_QBH = {"block_hashes": [1, -2, 9223372036854775807], "model_name": "m", "cache_salt": None}
COND_REGISTER = {"endpoint": "tcp://1.1.1.1:5557", "replay_endpoint": "tcp://1.1.1.1:5558",
                 "type": "vLLM", "modelname": "deepseek", "lora_name": "sql-adapter",
                 "tenant_id": "default", "instance_id": "vllm-prefill-node1", "block_size": 128,
                 "dp_rank": 0, "additionalsalt": "w8a8", "cache_group": 0,
                 "hash_profile": {"strategy": "vllm", "algorithm": "sha256",
                                  "python_hash_seed": 0, "root_digest": "ab",
                                  "index_projection": "x", "future": [1]}}
COND_MOONCAKE = {"endpoint": "tcp://*:5557", "type": "mooncake", "model": "m", "block_size": 64,
                 "dp_rank": 1, "tenant_id": None}
COND_UNREGISTER = {"instance_id": "vllm-1", "tenant_id": "", "dp_rank": 0, "type": "vLLM",
                   "modelname": "m", "block_size": 16}
COND_QUERY = {"model": "deepseek", "block_size": 128, "token_ids": [1, -2, 2147483647],
              "tenant_id": "", "lora_name": "l", "instance_id": "i", "cache_salt": "s",
              "lora_id": 3}
COND_QBH = {"model": "m", "block_size": 16, "seq_hashes": [1, 18446744073709551615, -5],
            "instance_id": None}


def codec_seeds():
    seeds = {}

    def add(name, data):
        seeds[name] = data

    bodies = {
        "dyn_register": DYN_REGISTER, "dyn_unregister": DYN_UNREGISTER, "dyn_query": DYN_QUERY,
        "dyn_query_by_hash": DYN_QBH, "dyn_peer": {"url": "http://127.0.0.1:8091"},
        "dyn_listener_ctl": {"instance_id": 7, "dp_rank": 1},
        "cond_register": COND_REGISTER, "cond_unregister": COND_UNREGISTER,
        "cond_query": COND_QUERY, "cond_query_by_hash": COND_QBH,
    }
    for op, body in bodies.items():
        add(op + "_json", sel(op, CT_JSON) + js(body))
        add(op + "_json_pretty", sel(op, CT_JSON, 3) + json.dumps(body, indent=1).encode())
        if op.startswith("cond") or op in ("dyn_query", "dyn_query_by_hash"):
            add(op + "_msgpack", sel(op, CT_MSGPACK) + mp(body))
    add("cond_register_mooncake", sel("cond_register", CT_NONE) + js(COND_MOONCAKE))
    add("cond_query_by_hash_block_hash",
        sel("cond_query_by_hash", CT_OTHER) + js({"model": "m", "block_size": 1, "block_hash": [7]}))
    # msgpack bins: little-endian u32 tokens / u64 hashes
    add("dyn_query_msgpack_bin", sel("dyn_query", CT_MSGPACK) +
        mp({"model_name": "m", "token_ids": struct.pack("<4I", 1, 2, 3, 0xffffffff)}))
    add("dyn_query_by_hash_msgpack_bin", sel("dyn_query_by_hash", CT_MSGPACK) +
        mp({"model_name": "m", "block_hashes": struct.pack("<2Q", 5, 2**63 - 1)}))
    add("cond_query_msgpack_bin", sel("cond_query", CT_MSGPACK) +
        mp({"model": "m", "block_size": 4, "token_ids": struct.pack("<3i", 1, -1, 7)}))
    # JSON the reader must get exactly right
    add("dyn_query_escapes", sel("dyn_query", CT_JSON) +
        b'{"model_name":"m\\u00e9\\ud83d\\ude00\\n\\"","token_ids":[ 0 , 1e0 ],"x":[{}]}')
    add("dyn_register_errors", sel("dyn_register", CT_JSON) +
        b'{"instance_id":1,"instance_id":-0,"endpoint":"udp://h:1","block_size":1.5}')
    add("cond_register_errors", sel("cond_register", CT_JSON) +
        b'{"endpoint":"tcp://h","type":"TRT","block_size":0,"dp_rank":2147483648,"zzz":1}')
    add("dyn_query_wrong_ct", sel("dyn_register", CT_OTHER) + js(DYN_REGISTER))
    # dialect detection and the handler flow
    for op, bodies_ in (("flow_register", [DYN_REGISTER, COND_REGISTER]),
                        ("flow_unregister", [DYN_UNREGISTER, COND_UNREGISTER,
                                             {"model_name": "m", "instance_id": None}]),
                        ("flow_query", [DYN_QUERY, COND_QUERY]),
                        ("flow_query_by_hash", [DYN_QBH, COND_QBH])):
        for i, b in enumerate(bodies_):
            add("%s_%d_json" % (op, i), sel(op, CT_JSON) + js(b))
            add("%s_%d_msgpack" % (op, i), sel(op, CT_MSGPACK) + mp(b))
    add("workers_filter", sel("workers_filter", CT_NONE) +
        b"model_name=m%20x&tenant_id=t+1&other=%zz&model_name")
    for i, h in enumerate([b"/query?x=1", b"/register_peer", b"application/json; charset=utf-8",
                           b"Application/X-MsgPack", b"text/html, application/msgpack;q=0.9"]):
        add("headers_%d" % i, sel("headers", CT_NONE) + h)

    # single-literal bodies of the codec unit tests
    lit = re.compile(r'kvi_(dyn|cond)_parse_(register|unregister|query_by_hash|query|peer|'
                     r'listener_ctl)\(\s*J\("((?:[^"\\]|\\.)*)"\)')
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "api", "codec_*_test.c"))):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for i, m in enumerate(lit.finditer(text)):
            op = "%s_%s" % (m.group(1), m.group(2))
            body = m.group(3).encode("latin-1").decode("unicode_escape").encode("latin-1")
            add("t_%s_%s_%d" % (os.path.basename(path)[6:-7], op, i), sel(op, CT_JSON) + body)
    return seeds


# ---------------------------------------------------------------------------
# slots
# ---------------------------------------------------------------------------

# tests/fuzz/fuzz_slots.c: enum op
SLOT_OPS = {
    "register": 0, "unregister": 1, "add": 2, "lifecycle": 3, "potential": 4, "peer": 5,
    "filter": 6, "route": 7, "replica": 8, "rank": 9,
}


def ssel(op, ct, style=0):
    return bytes([SLOT_OPS[op] | ct << 4 | style << 6])


SLOT_REGISTER = {"worker_id": 7, "model_name": "llama", "tenant_id": "t", "block_size": 16,
                 "dp_start": 0, "dp_size": 2}
SLOT_UNREGISTER = {"worker_id": 18446744073709551615, "model_name": "m"}
SLOT_ADD = {"model_name": "m", "tenant_id": "default", "request_id": "r-1", "worker_id": 7,
            "dp_rank": 1, "sequence_hashes": [1, -2, 9223372036854775807],
            "new_isl_tokens": 64, "extra": [{"x": None}]}
SLOT_LIFECYCLE = {"model_name": "m", "request_id": "r-1"}
SLOT_POTENTIAL = {"model_name": "m", "tenant_id": "t", "sequence_hashes": [],
                  "new_isl_tokens": 0}
ROUTES = [
    {"model_name": "m", "token_ids": [1, 2, 3, 4294967295]},
    {"model_name": "m", "tenant_id": None, "block_hashes": [1, -1, 18446744073709551615],
     "overlap_weight": 0.5, "decode_weight": 2, "new_isl_tokens": 128},
    {"model_name": "m", "tenant_id": "t", "sequence_hashes": [5], "lora_name": "sql",
     "commit": True, "request_id": "r-2", "overlap_weight": 1e-3, "decode_weight": 0},
    {"model_name": "m", "token_ids": None, "block_hashes": [], "commit": False,
     "request_id": None, "lora_name": None},
]
REPLICA = {"source": "00000000deadbeef", "events": [
    {"type": "add", "model_name": "m", "tenant_id": "t", "block_size": 16, "request_id": "r-1",
     "worker_id": 7, "dp_rank": 0, "sequence_hashes": [1, -2], "new_isl_tokens": 32},
    {"type": "prefill_complete", "model_name": "m", "block_size": 16, "request_id": "r-1",
     "worker_id": 7, "dp_rank": 0, "future": {"a": [1]}},
    {"type": "free", "model_name": "m", "tenant_id": "", "block_size": 4294967295,
     "request_id": "", "worker_id": 18446744073709551615, "dp_rank": 4294967295},
]}


def c_literals(text):
    """Bytes of adjacent C string literals (the escapes the tests use)."""
    out = bytearray()
    for lit in re.findall(r'"((?:[^"\\]|\\.)*)"', text):
        b = lit.encode("utf-8")
        i = 0
        while i < len(b):
            c = b[i:i + 1]
            if c != b"\\":
                out += c
                i += 1
                continue
            e = b[i + 1:i + 2]
            if e == b"x":
                j = i + 2
                while j < len(b) and b[j:j + 1] in b"0123456789abcdefABCDEF":
                    j += 1
                out.append(int(b[i + 2:j], 16) & 0xff)
                i = j
                continue
            out += {b"n": b"\n", b"t": b"\t", b"r": b"\r", b"0": b"\0"}.get(e, e)
            i += 2
    return bytes(out)


def slots_seeds():
    seeds = {}
    bodies = {"register": SLOT_REGISTER, "unregister": SLOT_UNREGISTER, "add": SLOT_ADD,
              "lifecycle": SLOT_LIFECYCLE, "potential": SLOT_POTENTIAL,
              "peer": {"url": "http://127.0.0.1:8091"}}
    for op, body in bodies.items():
        seeds[op + "_json"] = ssel(op, CT_JSON) + js(body)
        seeds[op + "_json_pretty"] = ssel(op, CT_JSON) + json.dumps(body, indent=1).encode()
    seeds["register_msgpack_415"] = ssel("register", CT_MSGPACK) + mp(SLOT_REGISTER)
    seeds["add_errors"] = ssel("add", CT_JSON) + (
        b'{"model_name":"m","request_id":1,"worker_id":-1,"dp_rank":4294967296,'
        b'"sequence_hashes":[1.5],"new_isl_tokens":"x","model_name":"n"}')
    seeds["lifecycle_tenant_null"] = ssel("lifecycle", CT_JSON) + \
        b'{"model_name":"m\\u00e9","tenant_id":null,"request_id":"r"}'
    seeds["filter"] = ssel("filter", CT_NONE) + b"model_name=m%20x&tenant_id=t+1&other=%zz&tenant_id"
    seeds["filter_empty"] = ssel("filter", CT_NONE) + b"model_name=&x"
    for i, r in enumerate(ROUTES):
        seeds["route_%d_json" % i] = ssel("route", CT_JSON, i & 3) + js(r)
        seeds["route_%d_msgpack" % i] = ssel("route", CT_MSGPACK) + mp(r)
    seeds["route_msgpack_bins"] = ssel("route", CT_MSGPACK) + mp(
        {"model_name": "m", "token_ids": struct.pack("<3I", 1, 2, 0xffffffff),
         "overlap_weight": 1.5, "decode_weight": 0})
    seeds["route_msgpack_hash_bin"] = ssel("route", CT_MSGPACK) + mp(
        {"model_name": "m", "sequence_hashes": struct.pack("<2Q", 9, 2**64 - 1)})
    seeds["route_float32"] = ssel("route", CT_MSGPACK) + \
        b"\x83\xaamodel_name\xa1m\xa9token_ids\x90\xaedecode_weight\xca\x3f\xc0\x00\x00"
    seeds["route_errors"] = ssel("route", CT_JSON) + (
        b'{"model_name":"m","token_ids":[1],"block_hashes":[2],"overlap_weight":-1,'
        b'"decode_weight":1e999,"commit":true}')
    seeds["replica_json"] = ssel("replica", CT_JSON) + js(REPLICA)
    seeds["replica_json_wide"] = ssel("replica", CT_JSON, 3) + js(REPLICA)
    seeds["replica_msgpack"] = ssel("replica", CT_MSGPACK) + mp(REPLICA)
    seeds["replica_empty"] = ssel("replica", CT_MSGPACK) + mp({"events": []})
    seeds["replica_errors"] = ssel("replica", CT_JSON) + (
        b'{"source":"x","events":[{"type":"evict","model_name":"m","request_id":"r",'
        b'"block_size":1,"worker_id":1,"dp_rank":0}]}')
    seeds["rank"] = ssel("rank", CT_NONE) + struct.pack(
        ">IQdd", 16, 1000, 1.0, 0.5) + b"".join(
        struct.pack(">QIIIQII", w, r, o, t, a, d, n)
        for w, r, o, t, a, d, n in [(1, 0, 3, 10, 0, 5, 1), (0, 1, 3, 10, 2**64 - 1, 0, 0),
                                    (2, 0, 0, 0, 7, 7, 7)])

    # the request bodies of the codec unit tests (adjacent literals joined)
    ops = {"register": "register", "unregister": "unregister", "add": "add",
           "lifecycle": "lifecycle", "potential": "potential", "peer": "peer"}
    slot_lit = re.compile(r'kvi_slot_parse_(\w+)\(\s*J\(((?:\s*"(?:[^"\\]|\\.)*")+)\s*\)')
    route_lit = re.compile(r'(?:parse_json|EXPECT_ERR)\(((?:\s*"(?:[^"\\]|\\.)*")+)\s*[,)]')
    with open(os.path.join(ROOT, "tests", "api", "codec_slots_test.c"), encoding="utf-8") as f:
        text = f.read()
    for i, m in enumerate(slot_lit.finditer(text)):
        if m.group(1) in ops:
            seeds["t_slots_%s_%d" % (m.group(1), i)] = ssel(m.group(1), CT_JSON) + \
                c_literals(m.group(2))
    with open(os.path.join(ROOT, "tests", "api", "codec_route_test.c"), encoding="utf-8") as f:
        text = f.read()
    for i, m in enumerate(route_lit.finditer(text)):
        seeds["t_route_%d" % i] = ssel("route", CT_JSON) + c_literals(m.group(1))
    return seeds


# ---------------------------------------------------------------------------
# endpoint
# ---------------------------------------------------------------------------

def endpoint_seeds():
    vals = [b"tcp://127.0.0.1:5557", b"tcp://*:0", b"tcp://[::1]:5558", b"tcp://[fe80::1]:65535",
            b"ipc:///tmp/kvidx.sock", b"inproc://engine", b"udp://h:1", b"tcp://host",
            b"tcp://a:b:1", b"tcp://[]:1", b"tcp://h:65536", b"host:1",
            b"1=tcp://127.0.0.1:5557,2:1=ipc:///tmp/a,,3:0=inproc://x",
            b"18446744073709551615:4294967295=tcp://*:1", b"1:2:3=tcp://h:1", b"x=tcp://h:1",
            b"1=tcp://h:1,1=", b"=", b","]
    return {"ep_%02d" % i: v for i, v in enumerate(vals)}


# ---------------------------------------------------------------------------
# dump
# ---------------------------------------------------------------------------

def ev(worker, tier, eid, rank, data):
    e = {"worker_id": worker, "storage_tier": tier, "event": {"event_id": eid, "dp_rank": rank,
                                                              "data": data}}
    if tier is None:
        del e["storage_tier"]
    return e


def stored(parent, pos, blocks):
    return {"stored": {"parent_hash": parent, "start_position": pos, "blocks": blocks}}


def blk(bh, th, seq=None, no_content=False):
    b = {"block_hash": bh, "tokens_hash": th, "mm_extra_info": None}
    if seq is not None:
        b["seq_hash"] = seq
    if no_content:
        b["no_content"] = True
    return b


def dump_seeds():
    full = {
        "m:t": {"block_size": 16, "events": [
            ev(1, "device", 0, 0, stored(None, 0, [blk(11, 22, 33)])),
            ev(1, "device", 1, 0, stored(11, 1, [blk(12, 23, 34), blk(13, 24)])),
            ev("node-\u00e9", "host_pinned", 2, 3, stored(None, 5, [blk(2**64 - 1, 0, 9, True)])),
            ev(2**64 - 1, "disk", 3, 0, {"removed": {"block_hashes": [11, -1]}}),
            ev(7, "external", 4, 1, "cleared"),
            ev(7, None, 5, None, {"cleared": {}}),
        ]},
        "plain": {"events": [ev(3, "device", 0, 0, stored(None, 0, [blk(1, 2)]))],
                  "block_size": 4, "extra": [1, {"a": "]"}]},
    }
    # the kvidx watermarks extension (after the events; one namespace has it before block_size)
    wm = {
        "m:t": {"block_size": 16, "events": [ev(1, "device", 0, 0, stored(None, 0, [blk(11, 22, 33)]))],
                "watermarks": [{"worker_id": 1, "dp_rank": 0, "seq": 41},
                               {"worker_id": "node-a", "dp_rank": 3, "seq": 2**64 - 2}]},
        "w:default": {"watermarks": [{"worker_id": 2, "dp_rank": None, "seq": 0, "x": [1]}],
                      "block_size": 4, "events": []},
    }
    seeds = {}
    seeds["watermarks"] = b"\x01" + js(wm)
    seeds["watermarks_bad"] = b"\x00" + (b'{"m:t":{"block_size":16,"events":[],'
                                         b'"watermarks":[{"worker_id":1,"seq":-1}]}}')
    body = js(full)
    for h in (0x00, 0x01, 0x02, 0x03, 0x14, 0x38):
        seeds["full_%02x" % h] = bytes([h]) + body
    seeds["pretty"] = b"\x01" + json.dumps(full, indent=2).encode()
    seeds["escaped_key"] = b"\x00" + (b'{"m:t\\"x\\u0041":{"block_size":1,"events":[]},'
                                       b'"m2":{"block_size":2,"events":[]}}')
    errors = [b'{"m:t":{"error":"indexer failed"}}', b'{"m:t":{"events":[]}}',
              b'{"m:t":{"block_size":16}}', b'{"m:t":{"block_size":0,"events":[]}}',
              b'{"m:t":{"block_size":16,"events":[{"worker_id":1}]}}',
              b'{"m:t":{"block_size":16,"events":[]}} x', b'{"m:t":{"block_size":16,"events":[]}',
              b'{"m:t":{"block_size":16,"events":[]},}', b"{}", b" { } "]
    for i, e in enumerate(errors):
        seeds["edge_%02d" % i] = bytes([i & 3]) + e
    return seeds


# ---------------------------------------------------------------------------
# ingest
# ---------------------------------------------------------------------------

# tests/fuzz/fuzz_ingest.c: targets by index block size (numeric instance,
# second numeric instance, Mooncake-style string instance)
INGEST_BY_BS = {1: (0, 0, 0), 2: (1, 1, 1), 4: (2, 3, 4), 16: (5, 6, 7)}
INGEST_FRESH = 0x80


def ingest_seeds():
    """Each decode fixture behind two selector pairs. The fixture's .expect
    file names the block sizes and families of its events."""
    seeds = {}
    fixtures = sorted(glob.glob(os.path.join(ROOT, "tests", "net", "fixtures", "decode", "*.bin")))
    for i, path in enumerate(fixtures):
        name = os.path.basename(path)[:-4]
        with open(path, "rb") as f:
            frame = f.read()
        expect = ""
        if os.path.exists(path[:-4] + ".expect"):
            with open(path[:-4] + ".expect") as f:
                expect = f.read()
        sizes = [int(x) for x in re.findall(r"block_size=(\d+)", expect)]
        bs = next((x for x in sizes if x in INGEST_BY_BS), 4)
        rfc = "family=rfc1527" in expect
        first = INGEST_BY_BS[bs][2 if rfc else 0]
        seeds[name + "_fresh"] = bytes([first | INGEST_FRESH, 0]) + frame
        # then on rotating targets, ranks, skip_tiers, groups and pub_applied
        other = INGEST_BY_BS[bs][1 + i % 2]
        seeds[name + "_opts"] = bytes([other | (i % 4) << 3 | (i // 4 % 4) << 5,
                                       (i // 2) % 8]) + frame
    return seeds


# ---------------------------------------------------------------------------
# router: Dynamo RouterEvents (net/decode_router.h) as JSON, bare msgpack
# and inside the Core NATS envelope
# ---------------------------------------------------------------------------

def router_seeds():
    evs = [
        ev(7587890123456789, "device", 41, 0, stored(None, None, [blk(17165273213457520511, 4521880293847513337)])),
        ev(2**64 - 1, "host_pinned", 2**64 - 2, 3, stored(9223372036854775808, 7,
                                                          [blk(1, 2), blk(3, 4)])),
        ev(7, "disk", 3, 2, {"removed": {"block_hashes": [17165273213457520511, 0, 5]}}),
        ev(7, "external", 4, 1, "cleared"),
        ev(-2, None, 0, None, {"cleared": None}),
        ev(1, "hbm", 1, 0, stored(1, None, [{"block_hash": 1, "tokens_hash": 2,
                                             "mm_extra_info": {"mm_objects": [{"mm_hash": 5}]}}])),
    ]
    seeds = {}
    for i, e in enumerate(evs):
        seeds["json_%02d" % i] = js(e)
        seeds["msgpack_%02d" % i] = mp(e)
        seeds["envelope_%02d" % i] = mp({"publisher_id": 2**63 + i, "sequence": i, "published_at": 1767225600123,
                                         "topic": "kv-events", "payload": mp(e)})
    seeds["bad_variant"] = js(ev(1, "device", 1, 0, {"moved": {}}))
    seeds["bad_no_tokens_hash"] = js(ev(1, "device", 1, 0, stored(None, None, [{"block_hash": 1}])))
    seeds["bad_envelope"] = mp({"topic": "kv-events", "payload": b"{"})
    return seeds


# ---------------------------------------------------------------------------

def all_seeds():
    out = {"decode": {}, "codec": codec_seeds(), "slots": slots_seeds(),
           "endpoint": endpoint_seeds(), "dump": dump_seeds(), "ingest": ingest_seeds(),
           "router": router_seeds()}
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "net", "fixtures", "decode", "*.bin"))):
        with open(path, "rb") as f:
            out["decode"][os.path.basename(path)[:-4]] = f.read()
    return out


def main():
    check = "--check" in sys.argv[1:]
    seeds = all_seeds()
    bad = []
    for target, files in seeds.items():
        d = os.path.join(OUT, target)
        want = {n + ".bin": data for n, data in files.items()}
        have = set(os.listdir(d)) if os.path.isdir(d) else set()
        if check:
            for n, data in want.items():
                p = os.path.join(d, n)
                if not os.path.exists(p) or open(p, "rb").read() != data:
                    bad.append(p)
            bad.extend(os.path.join(d, n) for n in have - set(want))
            continue
        os.makedirs(d, exist_ok=True)
        for n in have - set(want):
            os.remove(os.path.join(d, n))
        for n, data in want.items():
            with open(os.path.join(d, n), "wb") as f:
                f.write(data)
    if check:
        for p in bad:
            print("corpus differs from gen_corpus.py: " + os.path.relpath(p, ROOT))
        return 1 if bad else 0
    total = sum(len(x) for f in seeds.values() for x in f.values())
    print("wrote %d seeds, %d bytes" % (sum(len(f) for f in seeds.values()), total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
