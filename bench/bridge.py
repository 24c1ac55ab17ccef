#!/usr/bin/python3
"""The ZMQ -> JetStream bridge measured through kvidxd (api/README.md, "The ZMQ -> JetStream bridge").

    /usr/bin/python3 bench/bridge.py [--events N] [--per-batch K] [--blocks B] [--kvidxd PATH]

One private nats-server (-js, file storage in a temporary directory), one engine played by this
script (a ZMQ PUB on loopback sending pre-encoded vLLM KVEventBatch messages: K BlockStored events
of B blocks of 16 tokens each, every event a new root), and kvidxd runs:

1. ZMQ ingest without --nats-publish: seconds from the first send until kvidxd has applied every
   batch (kvidx_listener_batches_total), i.e. events/s through the listener;
2. the same with --nats-publish: ZMQ ingest events/s (the listener must not wait for NATS), then
   the bridge's sustained events/s into the file-storage stream (until kvidx_nats_bridge_acked_total
   reaches N, timed from the first send);
3. a query-only replica (--nats-stream on that stream, no ZMQ): seconds until it has applied the N
   events (kvidx_nats_events_applied_total), i.e. catch-up events/s.

The figures are wall-clock on whatever else runs on the machine: run it on a quiet one.
"""
import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

import msgpack
import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def http(port, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body,
                                 headers={"Content-Type": "application/json"} if body else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read().decode()


def metric(port, name):
    total = None
    for line in http(port, "/metrics").splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total = (total or 0) + float(line.rsplit(" ", 1)[1])
    return total or 0


def start_nats(tmp):
    d = os.path.join(tmp, "nats")
    os.makedirs(d)
    p = subprocess.Popen(["nats-server", "-a", "127.0.0.1", "-p", "-1", "--ports_file_dir", d, "-js", "-sd",
                          os.path.join(d, "js")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pf = os.path.join(d, f"nats-server_{p.pid}.ports")
    for _ in range(500):
        if os.path.exists(pf) and os.path.getsize(pf) > 0:
            url = json.load(open(pf))["nats"][0]
            return p, url
        time.sleep(0.02)
    raise SystemExit("nats-server did not start")


def start_kvidxd(binary, tmp, name, args):
    pf = os.path.join(tmp, name + ".port")
    log = open(os.path.join(tmp, name + ".log"), "w")
    p = subprocess.Popen([binary, "--port", "0", "--port-file", pf, "--slot-port", "0"] + args, stdout=log,
                         stderr=log)
    for _ in range(1000):
        if os.path.exists(pf) and os.path.getsize(pf) > 0:
            return p, int(open(pf).read().split()[0])
        time.sleep(0.01)
    raise SystemExit(f"kvidxd {name} did not start: see {log.name}")


def stop(p):
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)


def batches(n_events, per_batch, blocks):
    """Pre-encoded [topic, seq, payload] of n_events / per_batch batches."""
    out, h = [], 1
    tok = 0
    for seq in range(n_events // per_batch):
        evs = []
        for _ in range(per_batch):
            hashes = list(range(h, h + blocks))
            h += blocks
            evs.append(["BlockStored", hashes, None, list(range(tok, tok + 16 * blocks)), 16, None, "GPU"])
            tok += 16 * blocks
        out.append([b"", struct.pack(">Q", seq), msgpack.packb([time.time(), evs, 0])])
    return out


def wait_for(port, name, want, t0, limit_s):
    while True:
        v = metric(port, name)
        if v >= want:
            return time.time() - t0
        if time.time() - t0 > limit_s:
            raise SystemExit(f"{name} reached {v} of {want} in {limit_s} s")
        time.sleep(0.02)


def run_ingest(binary, tmp, url, msgs, n_events, bridge, name):
    args = ["--nats", url, "--nats-publish", "KVB"] if bridge else []
    k, port = start_kvidxd(binary, tmp, name, args)
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    zport = pub.bind_to_random_port("tcp://127.0.0.1")
    http(port, "/register", json.dumps({"instance_id": 1, "model_name": "m", "block_size": 16,
                                        "endpoint": f"tcp://127.0.0.1:{zport}"}).encode())
    # the slow joiner: empty batches until the listener applies one (seq continues from there)
    seq0 = len(msgs)
    while metric(port, "kvidx_listener_batches_total") < 1:
        pub.send_multipart([b"", struct.pack(">Q", seq0), msgpack.packb([time.time(), [], 0])])
        time.sleep(0.05)
    base = metric(port, "kvidx_listener_batches_total")
    msgs = [[t, struct.pack(">Q", seq0 + 1 + i), p] for i, (t, _, p) in enumerate(msgs)]
    t0 = time.time()
    for m in msgs:
        pub.send_multipart(m)
    sent_s = time.time() - t0
    ingest_s = wait_for(port, "kvidx_listener_batches_total", base + len(msgs), t0, 600)
    res = {"events": n_events, "send_s": sent_s, "ingest_s": ingest_s, "ingest_events_per_s": n_events / ingest_s}
    if bridge:
        acked_s = wait_for(port, "kvidx_nats_bridge_acked_total", n_events, t0, 600)
        res.update({"bridge_s": acked_s, "bridge_events_per_s": n_events / acked_s,
                    "dropped": metric(port, "kvidx_nats_bridge_dropped_total"),
                    "errors": metric(port, "kvidx_nats_bridge_errors_total")})
    pub.close(0)
    stop(k)
    return res


def run_catchup(binary, tmp, url, n_events):
    t0 = time.time()
    q, port = start_kvidxd(binary, tmp, "query-only",
                           ["--nats", url, "--nats-stream", "KVB/KVB.6d.64656661756c74.>=m@16",
                            "--nats-durable", "bench-q"])
    s = wait_for(port, "kvidx_nats_events_applied_total", n_events, t0, 600)
    stop(q)
    return {"events": n_events, "catchup_s": s, "catchup_events_per_s": n_events / s}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200000)
    ap.add_argument("--per-batch", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--kvidxd", default=os.path.join(ROOT, "build/release/api/kvidxd"))
    a = ap.parse_args()
    if not shutil.which("nats-server"):
        raise SystemExit("nats-server not on PATH")
    msgs = batches(a.events, a.per_batch, a.blocks)
    n = len(msgs) * a.per_batch
    tmp = tempfile.mkdtemp(prefix="kvidx-bridge-bench-")
    nats, url = start_nats(tmp)
    try:
        out = {"zmq_only": run_ingest(a.kvidxd, tmp, url, msgs, n, False, "plain"),
               "with_bridge": run_ingest(a.kvidxd, tmp, url, msgs, n, True, "bridge")}
        out["query_only"] = run_catchup(a.kvidxd, tmp, url, n)
        print(json.dumps(out, indent=1))
    finally:
        nats.terminate()
        nats.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
