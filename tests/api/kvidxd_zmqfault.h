/*
 * ZMQ fault injection for the kvidxd fault tests (tests/api/kvidxd_faults_*_test.c):
 * threads that sit between a publisher and kvidxd and misbehave on purpose.
 *
 *   - zf_fwd: a lossy forwarder between a publisher's PUB and kvidxd's SUB,
 *     dropping the live batches whose seq is marked in a table;
 *   - zf_rproxy: a replay proxy between kvidxd's replay DEALER and the
 *     publisher's real ROUTER, which can stay silent, answer late
 *     (delay_ms) or precede its replies with malformed ones (junk);
 *   - zf_recv_multipart, zf_be64: receiving a whole multipart message and
 *     reading the big-endian seq frame.
 *
 * Header-only (static functions). Include it after <cmocka.h> and
 * kvidxd_fixture.h (kfx_now_ms, KFX_WAIT). Every struct is owned by the
 * caller, who also owns the ZMQ context (it must outlive the helper: stop the
 * helper before zmq_ctx_term). Each helper runs one thread of its own that
 * uses the helper's sockets from start to stop; what else may be touched
 * from other threads, and when, is said at each function and field. The
 * threads cannot end the test with cmocka (not thread-safe): they abort() on
 * anything unexpected; functions called on the test's thread fail with
 * cmocka's asserts.
 */
#ifndef KVI_TESTS_API_KVIDXD_ZMQFAULT_H
#define KVI_TESTS_API_KVIDXD_ZMQFAULT_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#define ZF_FN static __attribute__((unused))

/* ---- receiving -------------------------------------------------------------------------------- */

/* The big-endian uint64 at @p p (8 readable bytes). Pure; any thread. */
ZF_FN uint64_t zf_be64(const void *p)
{
    const uint8_t *b = p;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | b[i];
    return v;
}

/*
 * Receive one multipart message into fr[0 .. max); frames past max are
 * received and dropped. @return the frame count (close min(count, max)
 * frames), 0 when @p flags has ZMQ_DONTWAIT and nothing was queued.
 * Aborts on any other receive error. Call it on the thread that uses @p zs;
 * the caller owns fr[] and closes the frames.
 */
ZF_FN int zf_recv_multipart(void *zs, zmq_msg_t *fr, int max, int flags)
{
    zmq_msg_t extra;
    int n = 0;
    for (bool more = true; more; n++) {
        zmq_msg_t *m = n < max ? &fr[n] : &extra;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, zs, n == 0 ? flags : 0) < 0) {
            zmq_msg_close(m);
            if (n == 0 && errno == EAGAIN)
                return 0;
            abort();
        }
        more = zmq_msg_more(m);
        if (m == &extra)
            zmq_msg_close(m);
    }
    return n;
}

/* ---- the lossy forwarder ---------------------------------------------------------------------- */

/*
 * A forwarder thread: SUB connected to the publisher's PUB, PUB bound for
 * kvidxd. Batches whose seq is marked in `drop` are not forwarded; anything
 * else (raw probes included) is passed on unchanged.
 *
 * Owned by the caller (zf_fwd_start fills it in; it must stay put until
 * zf_fwd_stop). ep: read-only once started. drop[0 .. n_drop): the caller's,
 * read by the thread without a lock: it must outlive the forwarder and not
 * change while it runs. forwarded, dropped: messages so far, atomic, read
 * them from any thread. sub, pub, th, stop: the helper's.
 */
struct zf_fwd {
    void *sub, *pub;
    char ep[256];
    const uint8_t *drop;
    size_t n_drop;
    pthread_t th;
    atomic_bool stop;
    atomic_ulong forwarded, dropped;
};

/* The forwarder thread's body (zf_fwd_start runs it); aborts on a ZMQ error. */
ZF_FN void *zf_fwd_main(void *arg)
{
    struct zf_fwd *f = arg;
    zmq_pollitem_t it = {.socket = f->sub, .events = ZMQ_POLLIN};
    zmq_msg_t fr[8];
    while (!atomic_load(&f->stop)) {
        if (zmq_poll(&it, 1, 20) <= 0)
            continue;
        int n;
        while ((n = zf_recv_multipart(f->sub, fr, 8, ZMQ_DONTWAIT)) > 0) {
            if (n > 8)
                abort(); /* nothing the fault tests send has that many */
            bool drop = false;
            if (n == 3 && zmq_msg_size(&fr[1]) == 8) {
                uint64_t seq = zf_be64(zmq_msg_data(&fr[1]));
                drop = seq < f->n_drop && f->drop[seq];
            }
            for (int i = 0; i < n; i++) {
                if (!drop && zmq_msg_send(&fr[i], f->pub, i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
                    abort();
                zmq_msg_close(&fr[i]);
            }
            atomic_fetch_add(drop ? &f->dropped : &f->forwarded, 1);
        }
    }
    return NULL;
}

/*
 * Start forwarding from @p pub_ep: a SUB (everything subscribed) connected
 * to it, a PUB bound on an ephemeral loopback port (its endpoint in f->ep for
 * kvidxd), no high-water marks, no linger, and the thread. @p drop is
 * borrowed (see struct zf_fwd). Test thread only (fails the test with
 * cmocka); then zf_fwd_stop, once, before zmq_ctx_term(@p zctx).
 */
ZF_FN void zf_fwd_start(struct zf_fwd *f, void *zctx, const char *pub_ep, const uint8_t *drop, size_t n_drop)
{
    memset(f, 0, sizeof *f);
    f->drop = drop;
    f->n_drop = n_drop;
    int zero = 0;
    f->sub = zmq_socket(zctx, ZMQ_SUB);
    f->pub = zmq_socket(zctx, ZMQ_PUB);
    assert_non_null(f->sub);
    assert_non_null(f->pub);
    zmq_setsockopt(f->sub, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(f->pub, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(f->sub, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(f->pub, ZMQ_LINGER, &zero, sizeof zero);
    assert_int_equal(zmq_setsockopt(f->sub, ZMQ_SUBSCRIBE, "", 0), 0);
    assert_int_equal(zmq_connect(f->sub, pub_ep), 0);
    assert_int_equal(zmq_bind(f->pub, "tcp://127.0.0.1:*"), 0);
    size_t len = sizeof f->ep;
    assert_int_equal(zmq_getsockopt(f->pub, ZMQ_LAST_ENDPOINT, f->ep, &len), 0);
    assert_int_equal(pthread_create(&f->th, NULL, zf_fwd_main, f), 0);
}

/* Stop the thread, join it and close both sockets; the thread that started
 * it, once. Afterwards *f may be freed (the counters stay readable). */
ZF_FN void zf_fwd_stop(struct zf_fwd *f)
{
    atomic_store(&f->stop, true);
    pthread_join(f->th, NULL);
    zmq_close(f->sub);
    zmq_close(f->pub);
}

/* ---- the replay proxy ------------------------------------------------------------------------- */

/*
 * A replay proxy: a ROUTER kvidxd's DEALER connects to (ZMQ_ROUTER_MANDATORY,
 * so a reply to a DEALER that went away fails instead of vanishing), and a
 * DEALER to the publisher's real ROUTER. Mode silent: requests are read and
 * ignored. Otherwise each request is forwarded `delay_ms` after it arrived
 * and the replies are routed back to the identity that asked.
 *
 * Owned by the caller (zf_rp_start fills it in; it must stay put until
 * zf_rp_stop). From other threads, at any time: set silent, junk and
 * delay_ms (atomic; silent and delay_ms apply to requests read from then
 * on, junk to requests forwarded from then on); read replies and
 * unroutable (atomic); read the request log through zf_rp_requests (under
 * mu). ep: read-only once started. The rest is the proxy thread's.
 */
#define ZF_RP_MAX_IDS 16
#define ZF_RP_MAX_PENDING 64

struct zf_rp_req {
    uint8_t id[256];
    size_t id_len;
    uint8_t seq[8];
    int64_t due_ms;
};

struct zf_rproxy {
    void *router, *dealer;
    char ep[256];
    pthread_t th;
    atomic_bool stop;
    atomic_bool silent;
    atomic_bool junk; /* precede each forwarded request's replies with 4 malformed ones */
    atomic_uint delay_ms;
    /* mu: the request log */
    pthread_mutex_t mu;
    uint64_t requests;      /* well-formed requests received */
    uint64_t last_from;     /* start seq of the last one */
    int last_id;            /* index in ids[] of the identity that sent it */
    uint8_t ids[ZF_RP_MAX_IDS][256];
    size_t id_len[ZF_RP_MAX_IDS];
    int n_ids;
    /* thread-owned */
    struct zf_rp_req pend[ZF_RP_MAX_PENDING]; /* waiting for their delay */
    size_t n_pend;
    struct zf_rp_req fifo[ZF_RP_MAX_PENDING]; /* forwarded, replies not finished */
    size_t n_fifo;
    atomic_ulong replies, unroutable;
};

/* Index of DEALER identity @p id in rp->ids, added if new; call with rp->mu held (proxy thread). */
ZF_FN int zf_rp_identity(struct zf_rproxy *rp, const uint8_t *id, size_t len)
{
    for (int i = 0; i < rp->n_ids; i++)
        if (rp->id_len[i] == len && memcmp(rp->ids[i], id, len) == 0)
            return i;
    if (rp->n_ids == ZF_RP_MAX_IDS || len > sizeof rp->ids[0])
        abort();
    memcpy(rp->ids[rp->n_ids], id, len);
    rp->id_len[rp->n_ids] = len;
    return rp->n_ids++;
}

/* Read one request from the ROUTER, log it, queue it unless silent (proxy thread). */
ZF_FN void zf_rp_on_request(struct zf_rproxy *rp)
{
    zmq_msg_t fr[4];
    int n = zf_recv_multipart(rp->router, fr, 4, 0);
    /* [identity, "", seq8] */
    if (n == 3 && zmq_msg_size(&fr[1]) == 0 && zmq_msg_size(&fr[2]) == 8 && zmq_msg_size(&fr[0]) <= 256) {
        struct zf_rp_req q = {.id_len = zmq_msg_size(&fr[0])};
        memcpy(q.id, zmq_msg_data(&fr[0]), q.id_len);
        memcpy(q.seq, zmq_msg_data(&fr[2]), 8);
        pthread_mutex_lock(&rp->mu);
        rp->requests++;
        rp->last_from = zf_be64(q.seq);
        rp->last_id = zf_rp_identity(rp, q.id, q.id_len);
        pthread_mutex_unlock(&rp->mu);
        if (!atomic_load(&rp->silent)) {
            q.due_ms = kfx_now_ms() + (int64_t)atomic_load(&rp->delay_ms);
            if (rp->n_pend == ZF_RP_MAX_PENDING)
                abort();
            rp->pend[rp->n_pend++] = q;
        }
    }
    for (int i = 0; i < (n < 4 ? n : 4); i++)
        zmq_msg_close(&fr[i]);
}

/* Send [identity, frames...] on the ROUTER (the requester must be there). Proxy thread. */
ZF_FN void zf_rp_send(struct zf_rproxy *rp, const struct zf_rp_req *q, const void *const *fr, const size_t *sz, int n)
{
    if (zmq_send(rp->router, q->id, q->id_len, ZMQ_SNDMORE) < 0)
        abort();
    for (int i = 0; i < n; i++)
        if (zmq_send(rp->router, fr[i], sz[i], i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
            abort();
}

/* Replies kvidx must ignore (replay_malformed): too few frames, a 7-byte seq, the
 * sentinel with a payload, a non-empty delimiter. Proxy thread. */
ZF_FN void zf_rp_send_junk(struct zf_rproxy *rp, const struct zf_rp_req *q)
{
    static const uint8_t ff[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    const void *fr[4][4] = {{"", "x"}, {"", "", q->seq, "p"}, {"", ff, "p"}, {"d", q->seq, "p"}};
    const size_t sz[4][4] = {{0, 1}, {0, 0, 7, 1}, {0, 8, 1}, {1, 8, 1}};
    const int n[4] = {2, 4, 3, 3};
    for (int i = 0; i < 4; i++)
        zf_rp_send(rp, q, fr[i], sz[i], n[i]);
}

/* Forward the queued requests whose delay is over to the publisher (proxy thread). */
ZF_FN void zf_rp_forward_due(struct zf_rproxy *rp)
{
    int64_t now = kfx_now_ms();
    while (rp->n_pend > 0 && rp->pend[0].due_ms <= now) {
        if (atomic_load(&rp->junk))
            zf_rp_send_junk(rp, &rp->pend[0]);
        if (rp->n_fifo == ZF_RP_MAX_PENDING)
            abort();
        rp->fifo[rp->n_fifo++] = rp->pend[0];
        if (zmq_send(rp->dealer, "", 0, ZMQ_SNDMORE) != 0 || zmq_send(rp->dealer, rp->pend[0].seq, 8, 0) != 8)
            abort();
        memmove(rp->pend, rp->pend + 1, --rp->n_pend * sizeof *rp->pend);
    }
}

/* One reply from the publisher: ["", (topic,) seq8, payload]; route it to the head of the FIFO.
 * Proxy thread; counts a reply whose DEALER is gone in unroutable. */
ZF_FN void zf_rp_on_reply(struct zf_rproxy *rp)
{
    zmq_msg_t fr[6];
    int n = zf_recv_multipart(rp->dealer, fr, 6, 0);
    if (rp->n_fifo == 0 || n < 3 || n > 6)
        abort();
    bool sentinel = zmq_msg_size(&fr[n - 2]) == 8 && zf_be64(zmq_msg_data(&fr[n - 2])) == UINT64_MAX;
    struct zf_rp_req *q = &rp->fifo[0];
    if (zmq_send(rp->router, q->id, q->id_len, ZMQ_SNDMORE) < 0) {
        if (errno != EHOSTUNREACH)
            abort();
        atomic_fetch_add(&rp->unroutable, 1); /* the DEALER that asked is gone */
    } else {
        for (int i = 0; i < n; i++)
            if (zmq_msg_send(&fr[i], rp->router, i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
                abort();
        atomic_fetch_add(&rp->replies, 1);
    }
    for (int i = 0; i < n; i++)
        zmq_msg_close(&fr[i]);
    if (sentinel)
        memmove(rp->fifo, rp->fifo + 1, --rp->n_fifo * sizeof *rp->fifo);
}

/* The proxy thread's body (zf_rp_start runs it); aborts on a ZMQ error. */
ZF_FN void *zf_rp_main(void *arg)
{
    struct zf_rproxy *rp = arg;
    zmq_pollitem_t it[2] = {{.socket = rp->router, .events = ZMQ_POLLIN},
                            {.socket = rp->dealer, .events = ZMQ_POLLIN}};
    while (!atomic_load(&rp->stop)) {
        long wait = 20;
        if (rp->n_pend > 0) {
            int64_t left = rp->pend[0].due_ms - kfx_now_ms();
            wait = left < 0 ? 0 : left < wait ? (long)left : wait;
        }
        if (zmq_poll(it, 2, wait) < 0 && errno != EINTR)
            abort();
        if (it[0].revents & ZMQ_POLLIN)
            zf_rp_on_request(rp);
        if (it[1].revents & ZMQ_POLLIN)
            zf_rp_on_reply(rp);
        zf_rp_forward_due(rp);
    }
    return NULL;
}

/*
 * Start a proxy to the replay ROUTER at @p upstream: a ROUTER bound on an
 * ephemeral loopback port (its endpoint in rp->ep for kvidxd), a DEALER
 * connected upstream, and the thread; responsive, no delay, no junk. Test
 * thread only (fails the test with cmocka); then zf_rp_stop, once, before
 * zmq_ctx_term(@p zctx).
 */
ZF_FN void zf_rp_start(struct zf_rproxy *rp, void *zctx, const char *upstream)
{
    memset(rp, 0, sizeof *rp);
    pthread_mutex_init(&rp->mu, NULL);
    int zero = 0, one = 1;
    rp->router = zmq_socket(zctx, ZMQ_ROUTER);
    rp->dealer = zmq_socket(zctx, ZMQ_DEALER);
    assert_non_null(rp->router);
    assert_non_null(rp->dealer);
    zmq_setsockopt(rp->router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(rp->dealer, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(rp->dealer, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(rp->router, ZMQ_SNDHWM, &zero, sizeof zero);
    assert_int_equal(zmq_setsockopt(rp->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one), 0);
    assert_int_equal(zmq_bind(rp->router, "tcp://127.0.0.1:*"), 0);
    size_t len = sizeof rp->ep;
    assert_int_equal(zmq_getsockopt(rp->router, ZMQ_LAST_ENDPOINT, rp->ep, &len), 0);
    assert_int_equal(zmq_connect(rp->dealer, upstream), 0);
    assert_int_equal(pthread_create(&rp->th, NULL, zf_rp_main, rp), 0);
}

/* Stop the thread, join it, close both sockets and the log's mutex; the
 * thread that started it, once. Afterwards *rp may be freed. */
ZF_FN void zf_rp_stop(struct zf_rproxy *rp)
{
    atomic_store(&rp->stop, true);
    pthread_join(rp->th, NULL);
    zmq_close(rp->router);
    zmq_close(rp->dealer);
    pthread_mutex_destroy(&rp->mu);
}

/* Well-formed requests so far; the start seq and the identity index of the
 * last one in *from and *id (either may be NULL). Any thread (takes mu). */
ZF_FN uint64_t zf_rp_requests(struct zf_rproxy *rp, uint64_t *from, int *id)
{
    pthread_mutex_lock(&rp->mu);
    uint64_t n = rp->requests;
    if (from)
        *from = rp->last_from;
    if (id)
        *id = rp->last_id;
    pthread_mutex_unlock(&rp->mu);
    return n;
}

/* Wait for request number @p n; check that it asks from @p from. @return the DEALER identity index.
 * Test thread only: fails the test with cmocka after KFX_WAIT_MS. */
ZF_FN int zf_rp_wait_request(struct zf_rproxy *rp, uint64_t n, uint64_t from)
{
    if (!KFX_WAIT(zf_rp_requests(rp, NULL, NULL) >= n, KFX_WAIT_MS))
        fail_msg("replay request %llu never came", (unsigned long long)n);
    uint64_t got_from;
    int id;
    assert_int_equal(zf_rp_requests(rp, &got_from, &id), n);
    assert_int_equal(got_from, from);
    return id;
}

#endif /* KVI_TESTS_API_KVIDXD_ZMQFAULT_H */
