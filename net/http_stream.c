/*
 * kvidx HTTP server (net/http_server.h): streamed answers. This file holds
 * pulled streams (kvi_http_stream_pull: the loop calls the producer) and
 * pushed streams (kvi_http_stream_open/_write/_end: any thread writes, the
 * loop sends), with the pushed stream's queue, backpressure, stall timeout
 * and connection cut. The server and its loops are in net/http_server.c
 * (DESIGN there), requests and whole answers in net/http_request.c.
 *
 * DESIGN
 *
 * A pushed stream's queue is guarded by its mutex; the writer blocks on its
 * condition variable above KVI_HTTP_STREAM_HIGH_WATER queued bytes, the loop
 * signals it as it takes chunks. A writer that sees no progress for
 * idle_timeout_ms (the client reads nothing: h2o 2.2 has no write timeout)
 * marks the stream stalled and gone and wakes the loop, which shuts the
 * connection down; the writer's thread (e.g. a writer thread dumping its
 * partition) is never held longer than that. The stream is freed when its three
 * references are gone: the loop's (request disposed), the writer's
 * (kvi_http_stream_end) and a pending wake-up message.
 *
 * A streamed body's END_STREAM always goes out on its own empty final send:
 * Debian 12's libcurl 7.88.1 now and then never finishes an HTTP/2 transfer
 * whose END_STREAM rides on the last DATA frame of a pushed stream (measured
 * with a libcurl client: 11 stalls in 60 8-MiB transfers; none with the
 * empty final send).
 */
#include "net/http_server_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <h2o.h>

#include "engine/common.h"

#define PUSH_IOV_MAX 64      /* chunks handed to h2o per send */
#define PUSH_CHUNK_MIN 16384 /* pushed writes are coalesced into chunks this big */

/* ---- chunks and stream memory ---- */

void kvi_http__free_chunks(struct chunk *c)
{
    while (c != NULL) {
        struct chunk *n = c->next;
        free(c);
        c = n;
    }
}

void kvi_http__stream_release(struct kvi_http_stream *st, bool last)
{
    if (last) {
        pthread_mutex_destroy(&st->mu);
        pthread_cond_destroy(&st->cv);
        free(st);
    }
}

/* ---- pulled streams ---- */

static void pull_finish(struct kvi_http_res *r, int outcome)
{
    r->pull.released = true;
    if (outcome == 0)
        kvi_http__res_count_answer(r, r->status, r->pull.bytes);
    else
        kvi_http__res_count_abort(r);
    if (r->pull.p.release != NULL)
        r->pull.p.release(r->pull.p.ud, outcome);
}

static void pull_next(struct kvi_http_res *r)
{
    h2o_req_t *req = r->req;
    ssize_t n = r->pull.p.pull(r->pull.p.ud, r->pull.buf, KVI_HTTP_PULL_CHUNK);
    if (n > 0) {
        if ((size_t)n > KVI_HTTP_PULL_CHUNK)
            kvi_die("http: pull() returned %zd bytes for a %u-byte buffer", n, KVI_HTTP_PULL_CHUNK);
        h2o_iovec_t v = h2o_iovec_init(r->pull.buf, (size_t)n);
        r->pull.bytes += (uint64_t)n;
        kvi_http__out_waiting(r);
        h2o_send(req, &v, 1, H2O_SEND_STATE_IN_PROGRESS);
    } else if (n == 0) {
        pull_finish(r, 0);
        kvi_http__out_waiting(r);
        h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
    } else {
        pull_finish(r, (int)n);
        h2o_send(req, NULL, 0, H2O_SEND_STATE_ERROR);
    }
}

static void pull_proceed(h2o_generator_t *g, h2o_req_t *req)
{
    struct kvi_http_res *r = H2O_STRUCT_FROM_MEMBER(struct kvi_http_res, gen, g);
    pull_next(r);
}

void kvi_http_stream_pull(struct kvi_http_res *r, int status, const char *ctype, const struct kvi_http_producer *p)
{
    kvi_http__answer_check(r);
    h2o_req_t *req = r->req;
    r->state = R_PULL;
    r->status = status;
    r->pull.p = *p;
    kvi_http__set_head(req, status, ctype);
    r->gen.proceed = pull_proceed;
    r->gen.stop = NULL; /* res_dispose releases the producer */
    h2o_start_response(req, &r->gen);
    if (r->head) {
        pull_finish(r, 0);
        h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
        return;
    }
    r->pull.buf = h2o_mem_alloc_pool(&req->pool, KVI_HTTP_PULL_CHUNK);
    pull_next(r);
}

/* ---- pushed streams ---- */

void kvi_http__push_finish(struct kvi_http_stream *st, bool ok)
{
    struct kvi_http_res *r = st->res;
    st->finished = true;
    if (h2o_linklist_is_linked(&st->link))
        h2o_linklist_unlink(&st->link);
    if (ok)
        kvi_http__res_count_answer(r, r->status, st->bytes);
    else
        kvi_http__res_count_abort(r);
}

/* Hand queued chunks to h2o (loop thread, st->res alive, no send in progress). */
static void push_flush(struct kvi_http_stream *st)
{
    struct chunk *take = NULL, **tp = &take;
    h2o_iovec_t iov[PUSH_IOV_MAX];
    size_t n = 0, bytes = 0;
    bool fin, err;

    pthread_mutex_lock(&st->mu);
    if (st->gone) {
        /* Cut by shutdown while a send was in progress. */
        st->loop_idle = false;
        pthread_mutex_unlock(&st->mu);
        kvi_http__push_finish(st, false);
        h2o_send(st->res->req, NULL, 0, H2O_SEND_STATE_ERROR);
        return;
    }
    while (st->head_chunk != NULL && n < PUSH_IOV_MAX) {
        struct chunk *c = st->head_chunk;
        st->head_chunk = c->next;
        c->next = NULL;
        *tp = c;
        tp = &c->next;
        iov[n++] = h2o_iovec_init(c->data, c->len);
        bytes += c->len;
    }
    if (st->head_chunk == NULL)
        st->tail = &st->head_chunk;
    st->queued -= bytes;
    st->taken += bytes;
    if (bytes != 0)
        pthread_cond_broadcast(&st->cv);
    /* END_STREAM goes out on its own (empty) send; see DESIGN. */
    fin = st->ended && st->head_chunk == NULL && n == 0;
    err = st->ended && st->error != 0;
    st->loop_idle = n == 0 && !fin;
    pthread_mutex_unlock(&st->mu);

    if (n == 0 && !fin)
        return;
    st->sending = take;
    h2o_req_t *req = st->res->req;
    if (err) {
        kvi_http__push_finish(st, false);
        h2o_send(req, NULL, 0, H2O_SEND_STATE_ERROR);
        return;
    }
    st->bytes += bytes;
    kvi_http__out_waiting(st->res);
    if (fin)
        kvi_http__push_finish(st, true);
    h2o_send(req, iov, n, fin ? H2O_SEND_STATE_FINAL : H2O_SEND_STATE_IN_PROGRESS);
}

static void push_proceed(h2o_generator_t *g, h2o_req_t *req)
{
    struct kvi_http_stream *st = H2O_STRUCT_FROM_MEMBER(struct kvi_http_stream, gen, g);
    kvi_http__free_chunks(st->sending);
    st->sending = NULL;
    st->res->wait_since = 0; /* the client took it all; push_flush notes the next send */
    push_flush(st);
}

/*
 * A stalled stream: the client has not taken a byte for stall_ms while h2o
 * still holds a send it cannot finish, so no answer can be ended in-band.
 * Shut the connection down; h2o then fails the send and frees the request.
 */
static void push_cut(struct kvi_http_stream *st)
{
    struct conn *c = st->res->conn;
    if (c != NULL && !c->shut) {
        shutdown(c->fd, SHUT_RDWR);
        c->shut = true;
    }
}

static void push_wake(struct worker *w, struct msg *m)
{
    struct kvi_http_stream *st = H2O_STRUCT_FROM_MEMBER(struct kvi_http_stream, wake, m);
    bool idle, stalled, last;
    pthread_mutex_lock(&st->mu);
    st->wake_pending = false;
    idle = st->loop_idle;
    stalled = st->stalled;
    pthread_mutex_unlock(&st->mu);
    if (st->res != NULL && !st->finished && stalled)
        push_cut(st);
    else if (st->res != NULL && !st->finished && idle)
        push_flush(st);
    pthread_mutex_lock(&st->mu);
    last = --st->refs == 0;
    pthread_mutex_unlock(&st->mu);
    kvi_http__stream_release(st, last);
}

/* Caller holds st->mu; returns whether a wake message must be sent (after unlocking). */
static bool push_need_wake_locked(struct kvi_http_stream *st)
{
    if (!st->loop_idle || st->wake_pending)
        return false;
    st->wake_pending = true;
    st->refs++;
    return true;
}

struct kvi_http_stream *kvi_http_stream_open(struct kvi_http_res *r, int status, const char *ctype)
{
    kvi_http__answer_check(r);
    h2o_req_t *req = r->req;
    struct kvi_http_stream *st = kvi_xcalloc(1, sizeof *st);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, &ca);
    pthread_condattr_destroy(&ca);
    st->stall_ms = r->w->srv->opt.idle_timeout_ms;
    st->wake.fn = push_wake;
    st->w = r->w;
    st->res = r;
    st->tail = &st->head_chunk;
    st->refs = 2; /* the loop's (until dispose) and the writer's (until end) */
    st->loop_idle = true;
    st->head = r->head;
    r->state = R_PUSH;
    r->status = status;
    r->stream = st;
    kvi_http__set_head(req, status, ctype);
    st->gen.proceed = push_proceed;
    st->gen.stop = NULL; /* res_dispose cuts the stream */
    h2o_start_response(req, &st->gen);
    atomic_fetch_add_explicit(&r->w->srv->outstanding, 1, memory_order_relaxed);
    if (r->head) {
        st->loop_idle = false;
        kvi_http__push_finish(st, true);
        h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
    } else {
        h2o_linklist_insert(&r->w->streams, &st->link);
    }
    return st;
}

/*
 * Wait (st->mu held) until the queue is under the high water or the stream
 * is gone. @return false when the loop took nothing for stall_ms meanwhile.
 */
static bool push_wait_room(struct kvi_http_stream *st)
{
    uint64_t seen = st->taken;
    struct timespec dl;
    if (st->stall_ms == 0) { /* no idle timeout: wait as long as it takes */
        while (!st->gone && st->queued >= KVI_HTTP_STREAM_HIGH_WATER)
            pthread_cond_wait(&st->cv, &st->mu);
        return true;
    }
    dl = kvi_timespec_after(CLOCK_MONOTONIC, (uint64_t)st->stall_ms * 1000000u);
    while (!st->gone && st->queued >= KVI_HTTP_STREAM_HIGH_WATER) {
        if (pthread_cond_timedwait(&st->cv, &st->mu, &dl) != ETIMEDOUT)
            continue;
        if (st->taken == seen)
            return st->gone || st->queued < KVI_HTTP_STREAM_HIGH_WATER;
        seen = st->taken; /* progress: a new period */
        dl = kvi_timespec_after(CLOCK_MONOTONIC, (uint64_t)st->stall_ms * 1000000u);
    }
    return true;
}

int kvi_http_stream_write(struct kvi_http_stream *st, const void *data, size_t len)
{
    bool wake;
    if (len == 0 || st->head)
        return 0;
    pthread_mutex_lock(&st->mu);
    if (!push_wait_room(st)) {
        /* Stalled: from now on the stream is gone for the writer; the loop cuts the connection. */
        st->stalled = st->gone = true;
        wake = !st->wake_pending;
        if (wake) {
            st->wake_pending = true;
            st->refs++;
        }
        pthread_mutex_unlock(&st->mu);
        if (wake)
            kvi_http__post(st->w, &st->wake);
        return -ETIMEDOUT;
    }
    if (st->gone) {
        pthread_mutex_unlock(&st->mu);
        return st->stalled ? -ETIMEDOUT : -EPIPE;
    }
    /* Coalesce into the tail chunk while it has room. */
    struct chunk *t = st->head_chunk == NULL ? NULL : H2O_STRUCT_FROM_MEMBER(struct chunk, next, st->tail);
    if (t != NULL && t->cap - t->len >= len) {
        memcpy(t->data + t->len, data, len);
        t->len += len;
    } else {
        size_t cap = len < PUSH_CHUNK_MIN ? PUSH_CHUNK_MIN : len;
        struct chunk *c = malloc(sizeof *c + cap);
        if (c == NULL) {
            pthread_mutex_unlock(&st->mu);
            return -ENOMEM;
        }
        c->next = NULL;
        c->len = len;
        c->cap = cap;
        memcpy(c->data, data, len);
        *st->tail = c;
        st->tail = &c->next;
    }
    st->queued += len;
    wake = push_need_wake_locked(st);
    pthread_mutex_unlock(&st->mu);
    if (wake)
        kvi_http__post(st->w, &st->wake);
    return 0;
}

void kvi_http_stream_end(struct kvi_http_stream *st, int error)
{
    struct worker *w = st->w;
    bool wake = false, last;
    atomic_fetch_sub_explicit(&w->srv->outstanding, 1, memory_order_relaxed);
    pthread_mutex_lock(&st->mu);
    st->ended = true;
    st->error = error;
    if (!st->gone)
        wake = push_need_wake_locked(st);
    last = --st->refs == 0;
    pthread_mutex_unlock(&st->mu);
    if (wake)
        kvi_http__post(w, &st->wake);
    kvi_http__stream_release(st, last);
}
