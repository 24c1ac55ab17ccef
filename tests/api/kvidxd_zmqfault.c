/*
 * Definitions of kvidxd_zmqfault.h (where the contracts are): built once into
 * kvi_test_api (tests/CMakeLists.txt) and linked into the api tests.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvidxd_zmqfault.h"

int zf_recv_multipart(void *zs, zmq_msg_t *fr, int max, int flags)
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

void *zf_fwd_main(void *arg)
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

void zf_fwd_start(struct zf_fwd *f, void *zctx, const char *pub_ep, const uint8_t *drop, size_t n_drop)
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

void zf_fwd_stop(struct zf_fwd *f)
{
    atomic_store(&f->stop, true);
    pthread_join(f->th, NULL);
    zmq_close(f->sub);
    zmq_close(f->pub);
}

int zf_rp_identity(struct zf_rproxy *rp, const uint8_t *id, size_t len)
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

void zf_rp_on_request(struct zf_rproxy *rp)
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

void zf_rp_forward_due(struct zf_rproxy *rp)
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

void zf_rp_on_reply(struct zf_rproxy *rp)
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

void *zf_rp_main(void *arg)
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

void zf_rp_start(struct zf_rproxy *rp, void *zctx, const char *upstream)
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

void zf_rp_stop(struct zf_rproxy *rp)
{
    atomic_store(&rp->stop, true);
    pthread_join(rp->th, NULL);
    zmq_close(rp->router);
    zmq_close(rp->dealer);
    pthread_mutex_destroy(&rp->mu);
}

uint64_t zf_rp_requests(struct zf_rproxy *rp, uint64_t *from, int *id)
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

int zf_rp_wait_request(struct zf_rproxy *rp, uint64_t n, uint64_t from)
{
    if (!KFX_WAIT(zf_rp_requests(rp, NULL, NULL) >= n, KFX_WAIT_MS))
        fail_msg("replay request %llu never came", (unsigned long long)n);
    uint64_t got_from;
    int id;
    assert_int_equal(zf_rp_requests(rp, &got_from, &id), n);
    assert_int_equal(got_from, from);
    return id;
}
