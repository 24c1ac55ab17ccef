/*
 * kvidx-bench ingest, shared between its two halves:
 *   bench/ingest_bench.c  the workload (trace, engines, events), the options,
 *                         the ZMQ transports (tcp, ipc, inproc) and the loop
 *                         over the transports of one invocation;
 *   bench/ingest_nats.c   the NATS transports (Core NATS, JetStream): a
 *                         private nats-server, the NATS plane
 *                         (net/nats_source.h), one C publisher per engine.
 *
 * Ownership: the workload (struct ingest_workload) is built once per
 * invocation and read by every transport's run; a run creates and frees its
 * own index, writers and publishers. Thread: the main thread, except where a
 * comment says otherwise. Not a library: bench-internal.
 */
#ifndef KVI_BENCH_INGEST_H
#define KVI_BENCH_INGEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvidx_pub;

#define INGEST_MAX_TRANSPORTS 8

struct ingest_cfg {
    uint32_t workers, publishers, listeners, writers;
    uint32_t block_size, cache_ids, event_blocks, batch_events, requests;
    bool array_form;
    const char *trace;
    const char *transport; /* the transport being run: tcp, ipc, inproc, nats, jetstream, jetstream-mem */
    const char *transports[INGEST_MAX_TRANSPORTS]; /* every transport of the invocation, in order */
    uint32_t n_transports;
    bool want_batches; /* a ZMQ transport runs: encode the msgpack batches */
    bool want_events;  /* a NATS transport runs: keep the raw events */
    uint64_t seed;
};

/*
 * One raw event of an engine (NATS transports): a stored event of n blocks
 * (hashes ev_h[h..h+n), tokens ev_t[t..t+n*block_size), parent when
 * has_parent) or a removed event of n hashes (ev_h[h..h+n)).
 */
struct ingest_ev {
    size_t h, t;
    uint64_t parent;
    uint32_t n;
    bool removed, has_parent;
};

struct ingest_engine {
    uint32_t idx;
    uint64_t seed;
    /* ZMQ: encoded batches, batch b = buf[boff[b] .. boff[b + 1]) */
    char *buf;
    size_t len, cap;
    size_t *boff;
    size_t n_batches, cap_batches;
    /* NATS: raw events; request r = events ev[rq[r] .. rq[r + 1]) */
    struct ingest_ev *ev;
    size_t n_ev, cap_ev;
    uint64_t *ev_h;
    size_t n_h, cap_h;
    uint32_t *ev_t;
    size_t n_t, cap_t;
    size_t *rq;
    size_t n_rq, cap_rq;
    uint64_t stored_blocks, removed_hashes, events_stored, events_removed;
    struct kvidx_pub *pub; /* the current run's publisher (NULL between runs) */
    char endpoint[128];
};

struct ingest_trace;
struct gen;

/* The encoded workload. */
struct ingest_workload {
    struct ingest_trace *tr;
    struct gen *g;
    struct ingest_engine *eng;
    uint64_t batches, payload, blocks, removed, ev_st, ev_rm, gen_ns;
    bool synthetic; /* the trace file was missing: a synthetic trace */
};

/** What one transport's run measured, for the closing summary table. */
struct ingest_summary {
    char transport[16];
    bool ok;               /* everything published was applied (and nothing lost) */
    double secs;           /* first publish -> last op applied */
    double blocks;         /* stored blocks applied */
    double events;         /* events (stored + removed) applied */
    double messages;       /* transport messages: ZMQ batches, NATS messages (= events) */
    double daemon_cpu_s;   /* the consumer's side: listeners or NATS source + its libnats
                              threads, writers, and (ZMQ) every ZMQ I/O thread */
    double server_cpu_s;   /* nats-server's CPU (0 for ZMQ) */
    double pub_cpu_s;      /* publishing: publisher threads and their libnats threads */
    uint64_t lost;         /* ZMQ: gaps + lost batches; NATS: events not applied (dropped, gaps) */
};

/** CPU time of the calling thread, ns. */
uint64_t ingest_thread_cpu_ns(void);

/** One "  name  value" row of the human table. */
void ingest_row(const char *name, double v);

/**
 * Run one NATS transport (c->transport "nats", "jetstream" or "jetstream-mem") on @p wl
 * (built with want_events): start a private nats-server, publish every
 * engine's events, wait until they are applied (bounded), report, stop.
 * @return 0, or 1 when set-up failed (then @p out->ok is false).
 */
int ingest_nats_run(const struct ingest_cfg *c, const struct ingest_workload *wl, struct ingest_summary *out);

/**
 * Time, on this thread, the NATS path's per-message and per-block costs on a
 * sample of @p wl's events: the publisher's tokens_hash and RouterEvent
 * encodings (msgpack with the Core envelope, JSON) and the daemon's decoding
 * of each (kvi_router_decode). Prints rows and returns nothing.
 */
void ingest_nats_costs(const struct ingest_cfg *c, const struct ingest_workload *wl);

#endif
