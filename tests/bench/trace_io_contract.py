#!/usr/bin/python3
"""The timeline format's contract (bench/README.md#timeline-format), checked
from outside: kvidx-bench exports a timeline, and this reader, written from
the README alone with python3-msgpack, checks every rule the section states
and replays the file into a naive model indexer of its own, as another
indexer would be driven.

usage: trace_io_contract.py KVIDX_BENCH   (exit 0 when every rule holds)
"""
import os
import subprocess
import sys
import tempfile

import msgpack

U64 = (1 << 64) - 1


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def is_u64(x):
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= U64


def check(path):
    with open(path, "rb") as f:
        data = f.read()
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(data)
    objs = iter(unpacker)
    h = next(objs)
    if h.get("format") != "kvidx-timeline" or h.get("version") != 1:
        fail("header: %r" % h)
    for k in ("workers", "block_size", "entries", "span_ns", "seed"):
        if not is_u64(h.get(k)):
            fail("header %s: %r" % (k, h.get(k)))
    if not isinstance(h.get("source"), str):
        fail("header source")
    W = h["workers"]
    # the model: per worker, engine hash -> (chain id, parent engine hash or None);
    # a chain id names the content prefix from the root (the tuple of content hashes)
    held = [dict() for _ in range(W)]
    chains = [dict() for _ in range(W)]  # chain id -> number of held blocks naming it
    children = [dict() for _ in range(W)]  # engine hash -> number of held children
    n = 0
    last_t = 0
    counts = {"query": 0, "store": 0, "remove": 0}
    hits = deep = 0
    for e in objs:
        n += 1
        where = "entry %d" % (n - 1)
        for k in ("t", "worker", "rank"):
            if not is_u64(e.get(k)):
                fail("%s: %s %r" % (where, k, e.get(k)))
        if e["t"] < last_t:
            fail(where + ": time goes back")
        last_t = e["t"]
        w = e["worker"]
        if w >= W or e["rank"] != 0:
            fail(where + ": worker or rank")
        op = e.get("op")
        if op not in counts:
            fail(where + ": op %r" % op)
        counts[op] += 1
        if op == "store":
            hs, cs, p = e.get("hashes"), e.get("content"), e.get("parent", "missing")
            if not hs or not isinstance(hs, list) or not isinstance(cs, list) or len(hs) != len(cs):
                fail(where + ": hashes and content of one length >= 1")
            if not all(is_u64(x) for x in hs + cs) or not (p is None or is_u64(p)):
                fail(where + ": hash types")
            if p is not None and p not in held[w]:
                fail(where + ": parent %x not held by worker %d" % (p, w))
            chain = held[w][p][0] if p is not None else ()
            for eh, c in zip(hs, cs):
                chain = chain + (c,)
                if eh in held[w]:
                    if held[w][eh][0] != chain:
                        fail(where + ": engine hash %x stored again under another prefix" % eh)
                else:
                    held[w][eh] = (chain, p)
                    chains[w][chain] = chains[w].get(chain, 0) + 1
                    if p is not None:
                        children[w][p] = children[w].get(p, 0) + 1
                p = eh
        elif op == "remove":
            hs = e.get("hashes")
            if not hs or not isinstance(hs, list) or not all(is_u64(x) for x in hs):
                fail(where + ": hashes")
            for eh in hs:
                if eh not in held[w]:
                    fail(where + ": removes %x, which worker %d does not hold" % (eh, w))
                if children[w].get(eh, 0):
                    fail(where + ": removes %x before its children (not leaves first)" % eh)
                chain, p = held[w].pop(eh)
                chains[w][chain] -= 1
                if not chains[w][chain]:
                    del chains[w][chain]
                if p is not None:
                    children[w][p] -= 1
        else:
            cs = e.get("content")
            if not cs or not isinstance(cs, list) or not all(is_u64(x) for x in cs):
                fail(where + ": content")
            best = 0
            for wk in range(W):
                d = 0
                while d < len(cs) and tuple(cs[: d + 1]) in chains[wk]:
                    d += 1
                best = max(best, d)
            hits += best > 0
            deep += best > 1
    if n != h["entries"]:
        fail("%d entries, the header announces %d" % (n, h["entries"]))
    if last_t != h["span_ns"]:
        fail("span_ns %d, last t %d" % (h["span_ns"], last_t))
    if min(counts.values()) == 0 or hits == 0 or deep == 0:
        fail("trivial timeline: %r, %d hits" % (counts, hits))
    print("timeline ok: %d entries %r; the model answered %d of %d queries with a hit (%d deeper than one block)"
          % (n, counts, hits, counts["query"], deep))


def main():
    if len(sys.argv) != 2:
        fail(__doc__)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "timeline.kvt")
        subprocess.run([sys.argv[1], "trace", "--trace", "synthetic", "--synthetic-requests", "300",
                        "--workers", "8", "--gpu-blocks", "512", "--no-progress", "--export", path],
                       check=True, stdout=subprocess.DEVNULL)
        check(path)


if __name__ == "__main__":
    main()
