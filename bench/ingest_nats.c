/*
 * kvidx-bench ingest --transport nats | jetstream | jetstream-mem: the ingest benchmark's
 * workload (bench/ingest.h) through kvidx's NATS event plane.
 *
 *   publisher threads (C publisher library, NATS transport; one publisher =
 *   one NATS connection per engine, worker_id = engine + 1, dp_rank 0)
 *     -> a private nats-server (tests/net/nats_server_fixture.c)
 *     -> one NATS source (net/nats_source.h: a Core subscription, or a
 *        JetStream durable pull consumer) -> writer threads -> index
 *
 * A Dynamo RouterEvent holds one event, so every event is one message:
 * Core NATS sends the RouterEvent as msgpack inside the Dynamo envelope;
 * JetStream sends it as JSON with js_Publish (each publish waits for the
 * stream's acknowledgement; the stream is created by the first publisher,
 * file storage) and the source acks each message once the writers applied
 * it. Stored events carry tokens_hash per block, which the publisher
 * computes (XXH3 of the block's tokens); kvidxd hashes nothing.
 * jetstream-mem is jetstream with the stream in memory (the bench creates
 * it first), to tell the file store's share of nats-server's CPU.
 *
 * MEASURED. From the first publish until the source has applied (Core) or
 * acked (JetStream) every event and the writers have no op queued, bounded
 * by 10 s without progress: events/s, stored blocks/s; the CPU of each
 * thread group from /proc/self/task/<tid>/stat (to 10 ms), the groups told
 * apart by which threads appeared at each set-up step (the NATS connection
 * threads of the plane, the source thread, the publishers' connections);
 * the publisher threads' own CPU clocks; nats-server's CPU from
 * /proc/<pid>/stat. Messages the Core subscription dropped as a slow
 * consumer, gaps, stale and undecodable messages are counted and reported.
 * A benchmark: it prints figures and never asserts.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/ingest.h"
#include "engine/common.h"
#include "engine/index.h"
#include "engine/writer.h"
#include "net/decode_router.h"
#include "net/log.h"
#include "net/nats_server_fixture.h"
#include "net/nats_source.h"
#include "net/router_event.h"

#include <kvidx/publisher.h>
#include <nats/nats.h>

#define CORE_SUBJECT "namespace.kvidx-bench.component.backend.kv-events"
#define STREAM "kvidx-bench"
#define STREAM_SUBJECT STREAM ".kv-events" /* the publisher's "<stream>.kv-events" */
#define DURABLE "kvidx-bench"
#define STALL_NS 10000000000ull /* no progress for this long ends the wait */
#define MAX_TIDS 256

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* ---- threads by set-up step ---------------------------------------------------------------- */

struct tidset {
    pid_t t[MAX_TIDS];
    size_t n;
};

/* Is @p t in @p s? */
static bool tid_in(const struct tidset *s, pid_t t)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->t[i] == t)
            return true;
    return false;
}

/* Every thread of this process now. */
static void tids_now(struct tidset *s)
{
    s->n = 0;
    DIR *d = opendir("/proc/self/task");
    if (d == NULL)
        return;
    for (struct dirent *e; (e = readdir(d)) != NULL && s->n < MAX_TIDS;)
        if (e->d_name[0] != '.')
            s->t[s->n++] = (pid_t)atoi(e->d_name);
    closedir(d);
}

/* The threads of @p now not in @p before. */
static void tids_new(struct tidset *out, const struct tidset *before, const struct tidset *now)
{
    out->n = 0;
    for (size_t i = 0; i < now->n; i++)
        if (!tid_in(before, now->t[i]))
            out->t[out->n++] = now->t[i];
}

enum { NG_SOURCE, NG_PLANE, NG_WRITER, NG_PUB, NG_PUBLIB, NG_OTHER, NG_SERVER, NG_COUNT };
static const char *const ng_name[NG_COUNT] = {
    "NATS source thread",
    "plane's libnats threads (connection, shared)",
    "writer threads",
    "publisher threads",
    "publishers' libnats threads",
    "other (main thread)",
    "nats-server (another process)",
};

struct groups {
    struct tidset source, publib;
    pid_t main_tid;
    int server_pid;
};

/* The group of a thread: by thread id for the source's and the publishers' libnats threads,
 * else by name; the main thread is "other", anything else the plane's libnats threads. */
static size_t ngroup_of(pid_t tid, const char *comm, void *arg)
{
    const struct groups *g = arg;
    return tid_in(&g->source, tid)               ? NG_SOURCE
           : tid_in(&g->publib, tid)             ? NG_PUBLIB
           : !strncmp(comm, "kvi-writer", 10)    ? NG_WRITER
           : !strncmp(comm, "kvi-bench-pub", 13) ? NG_PUB
           : tid == g->main_tid                  ? NG_OTHER
                                                 : NG_PLANE;
}

/* CPU seconds of each group so far (NG_PUB: 0, the publisher threads clock themselves). */
static void cpu_by_ngroup(const struct groups *g, double out[NG_COUNT])
{
    kvi_bench_thread_cpu_s(out, NG_COUNT, ngroup_of, (void *)g);
    out[NG_PUB] = 0;
    double srv = kvi_bench_proc_cpu_s(g->server_pid);
    out[NG_SERVER] = srv > 0 ? srv : 0;
}

/* ---- publishers ---------------------------------------------------------------------------- */

struct npub_thread {
    pthread_t tid;
    const struct ingest_engine *eng;
    struct kvidx_pub **pub;
    uint32_t n_eng, block_size;
    _Atomic int *go;
    uint64_t cpu_ns, events;
    int err;
    char err_text[128];
};

/* Publish engine @p e's request @p r: each event, then one flush (one message per event). */
static int publish_request(struct npub_thread *pt, const struct ingest_engine *e, struct kvidx_pub *pub, size_t r)
{
    for (size_t i = e->rq[r]; i < e->rq[r + 1]; i++) {
        const struct ingest_ev *v = &e->ev[i];
        int rc;
        if (v->removed) {
            rc = kvidx_pub_publish_removed(pub, e->ev_h + v->h, v->n, NULL);
        } else {
            struct kvidx_pub_stored s = {
                .block_hashes = e->ev_h + v->h,
                .n_hashes = v->n,
                .parent_hash = v->has_parent ? &v->parent : NULL,
                .token_ids = e->ev_t + v->t,
                .n_tokens = (size_t)v->n * pt->block_size,
                .block_size = pt->block_size,
            };
            rc = kvidx_pub_publish_stored_ex(pub, &s, NULL);
        }
        if (rc != 0)
            return rc;
        pt->events++;
    }
    return kvidx_pub_flush(pub, NULL);
}

/* Interleave the engines one request at a time, as the ZMQ path interleaves batches. */
static void *npub_main(void *arg)
{
    struct npub_thread *pt = arg;
    pthread_setname_np(pthread_self(), "kvi-bench-pub");
    while (!atomic_load_explicit(pt->go, memory_order_acquire))
        sched_yield();
    uint64_t c0 = ingest_thread_cpu_ns();
    size_t *next = kvi_xcalloc(pt->n_eng, sizeof *next);
    for (bool more = true; more;) {
        more = false;
        for (uint32_t i = 0; i < pt->n_eng; i++) {
            const struct ingest_engine *e = &pt->eng[i];
            if (next[i] == e->n_rq)
                continue;
            int rc = publish_request(pt, e, pt->pub[i], next[i]++);
            if (rc != 0 && pt->err == 0) {
                pt->err = rc;
                snprintf(pt->err_text, sizeof pt->err_text, "engine %u: %s (%s)", e->idx, strerror(-rc),
                         kvidx_pub_last_error_text(pt->pub[i]));
            }
            more = true;
        }
    }
    free(next);
    pt->cpu_ns = ingest_thread_cpu_ns() - c0;
    return NULL;
}

/* ---- the run ------------------------------------------------------------------------------- */

/* The source's counters, read relaxed. */
struct nsnap {
    uint64_t messages, bytes, applied, acked, ack_ns, dropped, stale, gaps, lost, invalid, decode_errors,
        redelivered, restarts;
};

/* A counter, relaxed (the source thread writes it). */
static uint64_t ld(const _Atomic uint64_t *a) { return atomic_load_explicit(a, memory_order_relaxed); }

/* Snapshot of source 0's counters (all zero when it does not exist). Any thread. */
static void nsnap_read(struct kvi_nats *n, struct nsnap *s)
{
    struct kvi_nats_source_info in;
    memset(s, 0, sizeof *s);
    if (kvi_nats_source_info(n, 0, &in) != 0)
        return;
    const struct kvi_nats_counters *c = in.ctr;
    *s = (struct nsnap){.messages = ld(&c->messages), .bytes = ld(&c->bytes), .applied = ld(&c->applied),
                        .acked = ld(&c->acked), .ack_ns = ld(&c->ack_ns_total), .dropped = ld(&c->dropped),
                        .stale = ld(&c->stale), .gaps = ld(&c->gaps), .lost = ld(&c->events_lost),
                        .invalid = ld(&c->invalid), .redelivered = ld(&c->redelivered),
                        .restarts = ld(&c->restarts)};
    for (int e = 1; e < KVI_REV_ERR_COUNT; e++)
        s->decode_errors += ld(&c->decode_errors[e]);
}

/* The writers' counters, summed over the pool (kvi_writer_stats). */
struct writers_snap {
    uint64_t blocks, removed, queued, rejected, stalls, busy_ns;
};

static void writers_read(struct kvi_writer_pool *pool, uint32_t n, struct writers_snap *s)
{
    memset(s, 0, sizeof *s);
    for (uint32_t w = 0; w < n; w++) {
        struct kvi_writer_stats st;
        kvi_writer_stats(pool, w, &st);
        s->blocks += st.blocks_stored;
        s->removed += st.hashes_removed;
        s->queued += st.queued;
        s->rejected += st.outcomes[KVI_OUT_PARENT_NOT_FOUND] + st.outcomes[KVI_OUT_INVALID];
        s->stalls += st.stalls;
        s->busy_ns += st.busy_ns;
    }
}

/* Everything a run holds; zeroed, then filled by setup and emptied by teardown. */
struct nrun {
    const struct ingest_cfg *c;
    bool js, js_mem; /* jetstream, jetstream-mem (the stream in memory) */
    struct kvi_nats_server srv;
    struct kvi_writer_pool *pool;
    struct kvi_index *ix;
    struct kvi_nats *plane;
    struct kvidx_pub **pub;
    struct groups grp;
    uint64_t probes; /* raw probe messages published (not events) */
};

/*
 * One NATS publisher per engine (JetStream: the first creates the stream);
 * @p pub_tids receives the threads they added (their connections').
 * @return 0, or -1 (logged; those created are freed by nrun_teardown).
 */
static int make_publishers(struct nrun *r, struct tidset *pub_tids)
{
    const struct ingest_cfg *c = r->c;
    struct tidset before, after;
    tids_now(&before);
    r->pub = kvi_xcalloc(c->workers, sizeof *r->pub);
    for (uint32_t w = 0; w < c->workers; w++) {
        struct kvidx_pub_config pc;
        kvidx_pub_config_init(&pc);
        pc.transport = r->js ? KVIDX_PUB_TRANSPORT_NATS_JETSTREAM : KVIDX_PUB_TRANSPORT_NATS_CORE;
        pc.nats_url = r->srv.url;
        pc.nats_subject = r->js ? NULL : CORE_SUBJECT;
        pc.nats_stream = r->js ? STREAM : NULL;
        pc.flags = r->js ? KVIDX_PUB_F_NATS_CREATE_STREAM : 0;
        pc.worker_id = 1 + w;
        pc.dp_rank = 0;
        r->pub[w] = kvidx_pub_create(&pc);
        if (r->pub[w] == NULL) {
            fprintf(stderr, "ingest: NATS publisher %u: %s\n", w, strerror(errno));
            return -1;
        }
    }
    tids_now(&after);
    tids_new(pub_tids, &before, &after);
    return 0;
}

/* The plane's one source; r->grp.source receives the threads it added. @return 0 or -1 (logged). */
static int add_source(struct nrun *r)
{
    struct tidset before, after;
    tids_now(&before);
    struct kvi_nats_source_spec spec = {
        .kind = r->js ? KVI_NATS_STREAM : KVI_NATS_CORE,
        .subject = r->js ? STREAM_SUBJECT : CORE_SUBJECT,
        .stream = r->js ? STREAM : NULL,
        .ix = r->ix,
        .block_size = r->c->block_size,
        .label = "bench",
    };
    int rc = kvi_nats_add_source(r->plane, &spec);
    tids_now(&after);
    tids_new(&r->grp.source, &before, &after);
    if (rc < 0)
        fprintf(stderr, "ingest: NATS source: %s\n", strerror(-rc));
    return rc < 0 ? -1 : 0;
}

/*
 * jetstream-mem: create the stream the publishers would create (subjects
 * "<stream>.*", max age 1 h) in memory instead of in files, before them, so
 * that their KVIDX_PUB_F_NATS_CREATE_STREAM finds it. @return 0 or -1.
 */
static int make_memory_stream(const char *url)
{
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    const char *subjects[1] = {STREAM ".*"};
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    sc.Name = STREAM;
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    sc.Storage = js_MemoryStorage;
    sc.MaxAge = (int64_t)3600 * 1000000000;
    natsStatus st = natsConnection_ConnectTo(&nc, url);
    if (st == NATS_OK)
        st = natsConnection_JetStream(&js, nc, NULL);
    if (st == NATS_OK)
        st = js_AddStream(&si, js, &sc, NULL, &jerr);
    if (st != NATS_OK)
        fprintf(stderr, "ingest: memory stream: %s (%s)\n", natsStatus_GetText(st), nats_GetLastError(NULL));
    jsStreamInfo_Destroy(si);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    return st == NATS_OK ? 0 : -1;
}

/*
 * Server, writers, index, plane, source and publishers. Core: the source
 * subscribes before anything is published; JetStream: the first publisher
 * creates the stream the source's consumer reads.
 */
static int nrun_setup(struct nrun *r)
{
    const struct ingest_cfg *c = r->c;
    r->grp.main_tid = (pid_t)syscall(SYS_gettid);
    int rc = kvi_nats_server_start(&r->srv, 10000);
    if (rc != 0) {
        fprintf(stderr, "ingest: nats-server did not start: %s ($KVI_NATS_SERVER, PATH, /usr/sbin)\n",
                strerror(-rc));
        return -1;
    }
    r->grp.server_pid = (int)r->srv.pid;
    r->pool = kvi_writer_pool_create(c->writers, 0);
    struct kvi_index_config icfg = {.block_size = c->block_size, .n_parts = c->writers};
    r->ix = kvi_index_create(&icfg);
    if (r->pool == NULL || r->ix == NULL) {
        fprintf(stderr, "ingest: set-up failed: %s\n", strerror(errno));
        return -1;
    }
    struct kvi_nats_config nc = {.servers = r->srv.url, .name = "kvidx-bench", .durable = DURABLE,
                                 .writers = r->pool};
    r->plane = kvi_nats_create(&nc);
    if (r->plane == NULL) {
        fprintf(stderr, "ingest: NATS plane: %s\n", strerror(errno));
        return -1;
    }
    if (r->js)
        return (!r->js_mem || make_memory_stream(r->srv.url) == 0) && make_publishers(r, &r->grp.publib) == 0 &&
                       add_source(r) == 0
                   ? 0
                   : -1;
    return add_source(r) == 0 && make_publishers(r, &r->grp.publib) == 0 ? 0 : -1;
}

/*
 * Wait until the source receives (Core: is subscribed) or acks (JetStream:
 * its consumer runs) a raw probe, which is no event (an undecodable message,
 * counted and, on JetStream, acked). Bounded.
 */
static int nrun_sync(struct nrun *r)
{
    const void *probe[1] = {"probe"};
    size_t probe_len[1] = {5};
    struct nsnap s;
    for (int tries = 0; tries < 5000; tries++) {
        nsnap_read(r->plane, &s);
        if (r->js ? s.acked >= 1 : s.messages >= 1)
            return 0;
        if (!r->js || r->probes == 0) {
            if (kvidx_pub_send_raw(r->pub[0], probe, probe_len, 1) == 0)
                r->probes++;
        }
        nap_ms(2);
    }
    fprintf(stderr, "ingest: the NATS source never received a probe\n");
    return -1;
}

/* Free whatever nrun_setup made, in reverse order (publishers before the plane, the server last). */
static void nrun_teardown(struct nrun *r)
{
    if (r->pub != NULL)
        for (uint32_t w = 0; w < r->c->workers; w++)
            kvidx_pub_destroy(r->pub[w]);
    free(r->pub);
    kvi_nats_destroy(r->plane);
    if (r->pool && r->ix) {
        struct kvi_producer *p = kvi_producer_create(r->pool);
        kvi_producer_forget_index(p, r->ix);
        kvi_producer_destroy(p);
    }
    if (r->ix)
        kvi_index_destroy(r->ix);
    if (r->pool)
        kvi_writer_pool_destroy(r->pool);
    kvi_nats_server_stop(&r->srv);
}

/* What the timed part measured. */
struct nmeas {
    uint64_t elapsed_ns, sent_ns, pub_cpu_ns, events_sent;
    int pub_err;
    char pub_err_text[128];
    struct nsnap n0, n1;
    struct writers_snap w0, w1;
    double cpu0[NG_COUNT], cpu1[NG_COUNT];
    bool stalled;
};

/* Events the source is done with: applied or dropped for a reason it counts. */
static uint64_t n_done(const struct nsnap *s, const struct nsnap *s0)
{
    return (s->applied - s0->applied) + (s->invalid - s0->invalid) + (s->stale - s0->stale) +
           (s->dropped - s0->dropped) + (s->lost - s0->lost);
}

/* Publish the workload and wait (bounded) until the source and the writers are done with it. */
static void nrun_timed(struct nrun *r, const struct ingest_workload *wl, struct nmeas *m)
{
    const struct ingest_cfg *c = r->c;
    uint64_t events = wl->ev_st + wl->ev_rm;
    nsnap_read(r->plane, &m->n0);
    writers_read(r->pool, c->writers, &m->w0);
    cpu_by_ngroup(&r->grp, m->cpu0);
    _Atomic int go = 0;
    struct npub_thread *pt = kvi_xcalloc(c->publishers, sizeof *pt);
    for (uint32_t i = 0, first = 0; i < c->publishers; i++) {
        uint32_t n = c->workers / c->publishers + (i < c->workers % c->publishers);
        pt[i] = (struct npub_thread){.eng = wl->eng + first, .pub = r->pub + first, .n_eng = n,
                                     .block_size = c->block_size, .go = &go};
        first += n;
        pthread_create(&pt[i].tid, NULL, npub_main, &pt[i]);
    }
    uint64_t t0 = kvi_now_ns();
    atomic_store_explicit(&go, 1, memory_order_release);
    for (uint32_t i = 0; i < c->publishers; i++) {
        pthread_join(pt[i].tid, NULL);
        m->pub_cpu_ns += pt[i].cpu_ns;
        m->events_sent += pt[i].events;
        if (m->pub_err == 0 && pt[i].err != 0) {
            m->pub_err = pt[i].err;
            snprintf(m->pub_err_text, sizeof m->pub_err_text, "%s", pt[i].err_text);
        }
    }
    m->sent_ns = kvi_now_ns() - t0;
    free(pt);
    uint64_t last = UINT64_MAX, last_change = kvi_now_ns();
    for (;;) {
        nsnap_read(r->plane, &m->n1);
        writers_read(r->pool, c->writers, &m->w1);
        uint64_t done = n_done(&m->n1, &m->n0);
        bool all = done >= events && m->w1.queued == 0 &&
                   (!r->js || m->n1.acked - m->n0.acked >= m->n1.messages - m->n0.messages);
        if (all)
            break;
        uint64_t now = kvi_now_ns(), progress = done + (m->n1.acked - m->n0.acked);
        if (progress != last) {
            last = progress;
            last_change = now;
        } else if (now - last_change > STALL_NS) {
            printf("  WARNING: no progress for 10 s: %llu of %llu events handled\n", (unsigned long long)done,
                   (unsigned long long)events);
            m->stalled = true;
            break;
        }
        nap_ms(1);
    }
    m->elapsed_ns = kvi_now_ns() - t0;
    cpu_by_ngroup(&r->grp, m->cpu1);
    m->cpu1[NG_PUB] = (double)m->pub_cpu_ns / 1e9;
}

/* Print the run's table and JSON line; fill @p out. */
static void nrun_report(const struct nrun *r, const struct ingest_workload *wl, const struct nmeas *m,
                        struct ingest_summary *out)
{
    const struct ingest_cfg *c = r->c;
    double secs = (double)m->elapsed_ns / 1e9;
    uint64_t events = wl->ev_st + wl->ev_rm;
    const struct nsnap *a = &m->n0, *b = &m->n1;
    double blocks = (double)(m->w1.blocks - m->w0.blocks), msgs = (double)(b->messages - a->messages);
    double acked = (double)(b->acked - a->acked);
    double d[NG_COUNT];
    for (int i = 0; i < NG_COUNT; i++)
        d[i] = m->cpu1[i] - m->cpu0[i];
    double daemon = d[NG_SOURCE] + d[NG_PLANE] + d[NG_WRITER], pub = d[NG_PUB] + d[NG_PUBLIB];
    double per = blocks > 0 ? 1e9 / blocks : 0;
    struct kvi_nats_conn_info ci;
    kvi_nats_conn_info(r->plane, &ci);

    printf("\n  %-46s %14s\n", "metric", "value");
    ingest_row("elapsed s (first publish -> last op applied)", secs);
    ingest_row("publishers done publishing, s", (double)m->sent_ns / 1e9);
    ingest_row("events/s (= messages/s: one per event)", (double)events / secs);
    ingest_row("stored blocks/s", blocks / secs);
    ingest_row("events published", (double)m->events_sent);
    ingest_row("messages received by the source", msgs);
    ingest_row("bytes per message received", msgs > 0 ? (double)(b->bytes - a->bytes) / msgs : 0);
    ingest_row("MB/s received", (double)(b->bytes - a->bytes) / 1e6 / secs);
    ingest_row("events applied", (double)(b->applied - a->applied));
    ingest_row("stored blocks applied (writers)", blocks);
    ingest_row("removed hashes applied (writers)", (double)(m->w1.removed - m->w0.removed));
    ingest_row("stores rejected (parent unknown, invalid)", (double)(m->w1.rejected - m->w0.rejected));
    ingest_row("dropped by the client (slow consumer)", (double)(b->dropped - a->dropped));
    ingest_row("gaps (events lost in them)", (double)(b->gaps - a->gaps));
    ingest_row("events lost in gaps", (double)(b->lost - a->lost));
    ingest_row("stale, invalid", (double)(b->stale - a->stale + b->invalid - a->invalid));
    ingest_row("undecodable", (double)(b->decode_errors - a->decode_errors));
    ingest_row("connection disconnects", (double)ci.disconnects);
    if (r->js) {
        ingest_row("messages acked", acked);
        ingest_row("redelivered", (double)(b->redelivered - a->redelivered));
        ingest_row("fetch start -> ack, mean us per message",
                   acked > 0 ? (double)(b->ack_ns - a->ack_ns) / acked / 1e3 : 0);
    }
    ingest_row("writer busy % of elapsed (per writer)",
               100.0 * (double)(m->w1.busy_ns - m->w0.busy_ns) / c->writers / (double)m->elapsed_ns);
    ingest_row("writer ring stalls", (double)(m->w1.stalls - m->w0.stalls));
    if (m->pub_err != 0)
        printf("  publisher error: %s\n", m->pub_err_text);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    printf("\n  CPU seconds used during the run (%.2f s wall x %ld CPUs = %.2f CPU-s), ns per stored block:\n",
           secs, ncpu, (double)ncpu * secs);
    for (int i = 0; i < NG_COUNT; i++)
        printf("    %-44s %8.2f %8.0f\n", ng_name[i], d[i], d[i] * per);
    printf("    %-44s %8.2f %8.0f\n", "daemon side (source, plane, writers)", daemon, daemon * per);
    printf("    %-44s %8.2f %8.0f\n", "publishing side (threads, libnats)", pub, pub * per);

    bool ok = !m->stalled && m->pub_err == 0 && b->applied - a->applied == events && b->gaps == a->gaps &&
              b->dropped == a->dropped;
    *out = (struct ingest_summary){.ok = ok, .secs = secs, .blocks = blocks, .events = (double)events,
                                   .messages = msgs, .daemon_cpu_s = daemon, .server_cpu_s = d[NG_SERVER],
                                   .pub_cpu_s = pub,
                                   .lost = (b->dropped - a->dropped) + (b->lost - a->lost)};
    snprintf(out->transport, sizeof out->transport, "%s", c->transport);
    printf("{\"bench\":\"ingest\",\"transport\":\"%s\",\"events_per_s\":%.0f,\"blocks_per_s\":%.0f,"
           "\"events\":%llu,\"stored_blocks\":%.0f,\"bytes_per_message\":%.0f,\"writer_threads\":%u,"
           "\"workers\":%u,\"publishers\":%u,\"block_size\":%u,\"source_cpu_s\":%.2f,\"plane_libnats_cpu_s\":%.2f,"
           "\"writer_cpu_s\":%.2f,\"publisher_cpu_s\":%.2f,\"publisher_libnats_cpu_s\":%.2f,\"server_cpu_s\":%.2f,"
           "\"daemon_cpu_ns_per_block\":%.0f,\"server_cpu_ns_per_block\":%.0f,\"dropped\":%llu,\"gaps\":%llu,"
           "\"ok\":%s,\"trace\":\"%s\"}\n",
           c->transport, (double)events / secs, blocks / secs, (unsigned long long)events, blocks,
           msgs > 0 ? (double)(b->bytes - a->bytes) / msgs : 0, c->writers, c->workers, c->publishers,
           c->block_size, d[NG_SOURCE], d[NG_PLANE], d[NG_WRITER], d[NG_PUB], d[NG_PUBLIB], d[NG_SERVER],
           daemon * per, d[NG_SERVER] * per, (unsigned long long)(b->dropped - a->dropped),
           (unsigned long long)(b->gaps - a->gaps), ok ? "true" : "false", wl->synthetic ? "synthetic" : "conversation");
}

int ingest_nats_run(const struct ingest_cfg *c, const struct ingest_workload *wl, struct ingest_summary *out)
{
    bool mem = !strcmp(c->transport, "jetstream-mem");
    struct nrun r = {.c = c, .js = mem || !strcmp(c->transport, "jetstream"), .js_mem = mem};
    memset(out, 0, sizeof *out);
    printf("\n== transport %s: %s, Dynamo RouterEvents, one message per event ==\n", c->transport,
           r.js_mem ? "JetStream, the stream in memory (JSON, js_Publish acked; acks after the writers applied)"
           : r.js   ? "JetStream (JSON, js_Publish acked, file stream; the source acks after the writers applied)"
                : "Core NATS (msgpack in the Dynamo envelope)");
    fflush(stdout);
    /* the plane's info lines (a worker appeared, connected) would interleave with the table */
    enum kvi_log_level lvl = kvi_log_level();
    kvi_log_set_level(KVI_LOG_ERROR); /* and the sync probe's "message dropped" */
    int rc = nrun_setup(&r) == 0 && nrun_sync(&r) == 0 ? 0 : 1;
    kvi_log_set_level(KVI_LOG_WARN); /* gaps, slow consumers */
    if (rc == 0) {
        struct nmeas *m = kvi_xcalloc(1, sizeof *m);
        nrun_timed(&r, wl, m);
        nrun_report(&r, wl, m, out);
        free(m);
    }
    fflush(stdout);
    kvi_log_set_level(KVI_LOG_ERROR); /* closing the connection logs a disconnect */
    nrun_teardown(&r);
    kvi_log_set_level(lvl);
    return rc;
}

/* ---- per-message costs, timed on one thread -------------------------------------------------- */

/* One encoded message of the sample: msgs[off .. off + len). */
struct enc {
    uint8_t *buf;
    size_t len, cap;
    size_t *off;
    size_t n;
};

static uint8_t *enc_reserve(struct enc *x, size_t max)
{
    if (x->len + max > x->cap) {
        x->cap = KVI_MAX(x->cap * 2, x->len + max);
        x->buf = kvi_xrealloc(x->buf, x->cap);
    }
    return x->buf + x->len;
}

static void enc_end(struct enc *x, const uint8_t *end)
{
    x->off[x->n++] = x->len;
    x->len = (size_t)(end - x->buf);
    x->off[x->n] = x->len;
}

/* Decode every message of @p x; @return thread CPU ns, *bad += failures. */
static uint64_t decode_all(struct kvi_router_decoder *dec, const struct enc *x, uint64_t *bad)
{
    uint64_t t0 = ingest_thread_cpu_ns();
    for (size_t i = 0; i < x->n; i++) {
        struct kvi_router_event ev;
        *bad += kvi_router_decode(dec, x->buf + x->off[i], x->off[i + 1] - x->off[i], &ev) != KVI_REV_OK;
    }
    return ingest_thread_cpu_ns() - t0;
}

void ingest_nats_costs(const struct ingest_cfg *c, const struct ingest_workload *wl)
{
    /* a sample: engine 0's first events, up to 200,000 blocks */
    const struct ingest_engine *e = &wl->eng[0];
    size_t n_ev = 0, n_blk = 0, n_st = 0, max_n = 1;
    while (n_ev < e->n_ev && n_blk < 200000) {
        n_blk += e->ev[n_ev].n;
        n_st += e->ev[n_ev].removed ? 0 : e->ev[n_ev].n;
        max_n = KVI_MAX(max_n, (size_t)e->ev[n_ev].n);
        n_ev++;
    }
    struct kvi_router_decoder *dec = kvi_router_decoder_new();
    if (n_ev == 0 || dec == NULL) {
        kvi_router_decoder_free(dec);
        return;
    }
    /* Three rounds over the same buffers, the fastest of each phase kept: the first round's page
     * faults and cold caches are not the steady state a publisher or a source runs in. */
    uint64_t *th = kvi_xcalloc(n_blk, sizeof *th);
    uint64_t seed = kvp_re_seed(NULL, 0);
    struct enc mp = {.off = kvi_xcalloc(n_ev + 1, sizeof(size_t))}, js = {.off = kvi_xcalloc(n_ev + 1, sizeof(size_t))};
    size_t max = kvp_re_stored_max(max_n) + kvp_re_removed_max(max_n) + KVP_RE_ENVELOPE_MAX;
    uint8_t *pay = kvi_xcalloc(max, 1);
    uint64_t t_hash = UINT64_MAX, t_enc[2] = {UINT64_MAX, UINT64_MAX}, t_dmp = UINT64_MAX, t_djs = UINT64_MAX, bad = 0;
    for (int round = 0; round < 3; round++) {
        uint64_t t0 = ingest_thread_cpu_ns();
        for (size_t i = 0, o = 0; i < n_ev; o += e->ev[i].n, i++)
            for (uint32_t k = 0; !e->ev[i].removed && k < e->ev[i].n; k++)
                th[o + k] = kvp_re_tokens_hash(e->ev_t + e->ev[i].t + (size_t)k * c->block_size, c->block_size,
                                               seed);
        t_hash = KVI_MIN(t_hash, ingest_thread_cpu_ns() - t0);
        for (int f = 0; f < 2; f++) { /* 0: msgpack in the Core envelope, 1: JSON */
            struct enc *x = f == 0 ? &mp : &js;
            x->len = x->n = 0;
            t0 = ingest_thread_cpu_ns();
            for (size_t i = 0, o = 0; i < n_ev; o += e->ev[i].n, i++) {
                const struct ingest_ev *v = &e->ev[i];
                struct kvp_re_head h = {.worker_id = 1, .tier = kvp_re_tier(NULL), .event_id = i, .dp_rank = 0};
                const uint64_t *parent = v->has_parent ? &v->parent : NULL, *hs = e->ev_h + v->h;
                uint8_t *w = enc_reserve(x, max);
                if (f == 1) {
                    enc_end(x, v->removed ? kvp_re_removed(w, KVP_RE_JSON, &h, hs, v->n)
                                          : kvp_re_stored(w, KVP_RE_JSON, &h, parent, hs, th + o, v->n));
                    continue;
                }
                uint8_t *pe = v->removed ? kvp_re_removed(pay, KVP_RE_MSGPACK, &h, hs, v->n)
                                         : kvp_re_stored(pay, KVP_RE_MSGPACK, &h, parent, hs, th + o, v->n);
                uint32_t plen = (uint32_t)(pe - pay);
                w = kvp_re_envelope_head(w, 7, i, 1795250797880ull, plen);
                memcpy(w, pay, plen);
                enc_end(x, w + plen);
            }
            t_enc[f] = KVI_MIN(t_enc[f], ingest_thread_cpu_ns() - t0);
        }
        bad = 0;
        t_dmp = KVI_MIN(t_dmp, decode_all(dec, &mp, &bad));
        t_djs = KVI_MIN(t_djs, decode_all(dec, &js, &bad));
    }

    double ne = (double)n_ev, nb = (double)n_blk;
    printf("\n== NATS costs, timed on one thread (its CPU clock, best of 3) on engine 0's first %zu events "
           "(%zu blocks, %.0f per event) ==\n", n_ev, n_blk, nb / ne);
    printf("  %-50s %12s %10s\n", "", "ns/message", "ns/block");
    printf("  %-50s %12.0f %10.1f\n", "publisher: tokens_hash (XXH3-64 of 16 tokens)", (double)t_hash / ne,
           n_st ? (double)t_hash / (double)n_st : 0);
    printf("  %-50s %12.0f %10.1f\n", "publisher: encode msgpack + Core envelope", (double)t_enc[0] / ne,
           (double)t_enc[0] / nb);
    printf("  %-50s %12.0f %10.1f\n", "publisher: encode JSON (JetStream)", (double)t_enc[1] / ne,
           (double)t_enc[1] / nb);
    printf("  %-50s %12.0f %10.1f\n", "kvidx: decode envelope + msgpack (Core)", (double)t_dmp / ne,
           (double)t_dmp / nb);
    printf("  %-50s %12.0f %10.1f\n", "kvidx: decode JSON (JetStream)", (double)t_djs / ne, (double)t_djs / nb);
    printf("  bytes per block: %.1f msgpack + envelope, %.1f JSON; %llu failed decodes\n", (double)mp.len / nb,
           (double)js.len / nb, (unsigned long long)bad);
    printf("{\"bench\":\"ingest_nats_costs\",\"events\":%zu,\"blocks\":%zu,\"hash_ns_per_block\":%.1f,"
           "\"encode_msgpack_ns_per_block\":%.1f,\"encode_json_ns_per_block\":%.1f,"
           "\"decode_msgpack_ns_per_block\":%.1f,\"decode_json_ns_per_block\":%.1f,"
           "\"bytes_per_block_msgpack\":%.1f,\"bytes_per_block_json\":%.1f}\n",
           n_ev, n_blk, n_st ? (double)t_hash / (double)n_st : 0, (double)t_enc[0] / nb, (double)t_enc[1] / nb,
           (double)t_dmp / nb, (double)t_djs / nb, (double)mp.len / nb, (double)js.len / nb);
    kvi_router_decoder_free(dec);
    free(th);
    free(pay);
    free(mp.buf);
    free(mp.off);
    free(js.buf);
    free(js.off);
}
