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
 * Declared here with their contracts, defined in kvidxd_zmqfault.c (built
 * once into kvi_test_api, tests/CMakeLists.txt). It uses kvidxd_fixture.h
 * (kfx_now_ms, KFX_WAIT). Every struct is owned by the
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

#include "kvidxd_fixture.h"


/* ---- receiving -------------------------------------------------------------------------------- */

/* The big-endian uint64 at @p p (8 readable bytes). Pure; any thread. */
static inline uint64_t zf_be64(const void *p)
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
int zf_recv_multipart(void *zs, zmq_msg_t *fr, int max, int flags);

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
void *zf_fwd_main(void *arg);

/*
 * Start forwarding from @p pub_ep: a SUB (everything subscribed) connected
 * to it, a PUB bound on an ephemeral loopback port (its endpoint in f->ep for
 * kvidxd), no high-water marks, no linger, and the thread. @p drop is
 * borrowed (see struct zf_fwd). Test thread only (fails the test with
 * cmocka); then zf_fwd_stop, once, before zmq_ctx_term(@p zctx).
 */
void zf_fwd_start(struct zf_fwd *f, void *zctx, const char *pub_ep, const uint8_t *drop, size_t n_drop);

/* Stop the thread, join it and close both sockets; the thread that started
 * it, once. Afterwards *f may be freed (the counters stay readable). */
void zf_fwd_stop(struct zf_fwd *f);

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
int zf_rp_identity(struct zf_rproxy *rp, const uint8_t *id, size_t len);

/* Read one request from the ROUTER, log it, queue it unless silent (proxy thread). */
void zf_rp_on_request(struct zf_rproxy *rp);

/* Send [identity, frames...] on the ROUTER (the requester must be there). Proxy thread. */
static inline void zf_rp_send(struct zf_rproxy *rp, const struct zf_rp_req *q, const void *const *fr, const size_t *sz, int n)
{
    if (zmq_send(rp->router, q->id, q->id_len, ZMQ_SNDMORE) < 0)
        abort();
    for (int i = 0; i < n; i++)
        if (zmq_send(rp->router, fr[i], sz[i], i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
            abort();
}

/* Replies kvidx must ignore (replay_malformed): too few frames, a 7-byte seq, the
 * sentinel with a payload, a non-empty delimiter. Proxy thread. */
static inline void zf_rp_send_junk(struct zf_rproxy *rp, const struct zf_rp_req *q)
{
    static const uint8_t ff[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    const void *fr[4][4] = {{"", "x"}, {"", "", q->seq, "p"}, {"", ff, "p"}, {"d", q->seq, "p"}};
    const size_t sz[4][4] = {{0, 1}, {0, 0, 7, 1}, {0, 8, 1}, {1, 8, 1}};
    const int n[4] = {2, 4, 3, 3};
    for (int i = 0; i < 4; i++)
        zf_rp_send(rp, q, fr[i], sz[i], n[i]);
}

/* Forward the queued requests whose delay is over to the publisher (proxy thread). */
void zf_rp_forward_due(struct zf_rproxy *rp);

/* One reply from the publisher: ["", (topic,) seq8, payload]; route it to the head of the FIFO.
 * Proxy thread; counts a reply whose DEALER is gone in unroutable. */
void zf_rp_on_reply(struct zf_rproxy *rp);

/* The proxy thread's body (zf_rp_start runs it); aborts on a ZMQ error. */
void *zf_rp_main(void *arg);

/*
 * Start a proxy to the replay ROUTER at @p upstream: a ROUTER bound on an
 * ephemeral loopback port (its endpoint in rp->ep for kvidxd), a DEALER
 * connected upstream, and the thread; responsive, no delay, no junk. Test
 * thread only (fails the test with cmocka); then zf_rp_stop, once, before
 * zmq_ctx_term(@p zctx).
 */
void zf_rp_start(struct zf_rproxy *rp, void *zctx, const char *upstream);

/* Stop the thread, join it, close both sockets and the log's mutex; the
 * thread that started it, once. Afterwards *rp may be freed. */
void zf_rp_stop(struct zf_rproxy *rp);

/* Well-formed requests so far; the start seq and the identity index of the
 * last one in *from and *id (either may be NULL). Any thread (takes mu). */
uint64_t zf_rp_requests(struct zf_rproxy *rp, uint64_t *from, int *id);

/* Wait for request number @p n; check that it asks from @p from. @return the DEALER identity index.
 * Test thread only: fails the test with cmocka after KFX_WAIT_MS. */
int zf_rp_wait_request(struct zf_rproxy *rp, uint64_t n, uint64_t from);

#endif /* KVI_TESTS_API_KVIDXD_ZMQFAULT_H */
