/*
 * The slot port's routes (dynamo-standalone-slot-tracker.md, http-api.md §3)
 * plus kvidx's replica-sync route, /metrics and the test routes. Contract:
 * api/routes_slots.h; the service they call, DESIGN: api/slot_service.h.
 * Reads run inline inside an RCU read section; writes are parsed inline,
 * packed into one allocation and run on the mutation thread, which
 * completes the deferred answer.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/codec_slots.h"
#include "api/routes_slots.h"
#include "engine/common.h"
#include "engine/rcu.h"
#include "net/log.h"

#define MIME_PROM "text/plain; version=0.0.4"
#define OK_BODY "{\"status\":\"ok\"}"

struct slot_thread {
    struct kvi_scratch scratch;
    struct kvi_buf out;
    struct kvi_slots_worker *w;
    size_t w_cap;
    struct kvi_slots_load *l;
    size_t l_cap;
    struct kvi_slots_potential *p;
    size_t p_cap;
};

struct kvi_slot_routes;

typedef void (*slot_fn)(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                        struct kvi_http_res *res);

struct route_def {
    const char *path;
    unsigned methods; /* KVI_HTTP_GET or KVI_HTTP_POST */
    slot_fn fn;
    bool admin;
    bool test; /* mounted only with test endpoints */
    bool data; /* a data-plane write: the data token when one is set */
};

struct route_ud {
    struct kvi_slot_routes *rt;
    const struct route_def *def;
};

struct kvi_slot_routes {
    struct kvi_slot_service *s;
    unsigned n_threads;
    size_t body_limit;
    bool test_endpoints;
    struct slot_thread *threads;
    struct route_ud *uds;
    _Atomic uint64_t loads_paged;   /* /loads answers cut to a page (more followed) */
    _Atomic uint64_t workers_paged; /* /workers answers cut to a page (more followed) */
};

/* ---- answers ------------------------------------------------------------------------------------- */

static int set_err(struct kvi_api_err *e, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int set_err(struct kvi_api_err *e, int status, const char *fmt, ...)
{
    memset(e, 0, sizeof(*e));
    e->status = status;
    e->index = -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return -EINVAL;
}

static void send_err(struct kvi_http_res *res, struct slot_thread *t, const struct kvi_api_err *e)
{
    const char *ctype = KVI_MIME_JSON;
    kvi_buf_reset(&t->out);
    if (kvi_slot_encode_err(e, &t->out, &ctype) != 0) {
        kvi_http_error(res, e->status, "%s", e->msg);
        return;
    }
    kvi_http_respond(res, e->status, ctype, t->out.data, t->out.len);
}

static void send_buf(struct kvi_http_res *res, int status, const char *ctype, const struct kvi_buf *b)
{
    if (!kvi_buf_ok(b)) {
        kvi_http_error(res, 500, "out of memory");
        return;
    }
    kvi_http_respond(res, status, ctype, b->data, b->len);
}

/* Complete a deferred write with {"status":"ok"} or the error. */
static void complete(struct kvi_http_deferred *d, int rc, int status, const struct kvi_api_err *e)
{
    if (rc == 0) {
        kvi_http_complete(d, status, KVI_MIME_JSON, OK_BODY, sizeof(OK_BODY) - 1);
        return;
    }
    struct kvi_buf b;
    const char *ctype = KVI_MIME_JSON;
    kvi_buf_init(&b);
    if (kvi_slot_encode_err(e, &b, &ctype) == 0)
        kvi_http_complete(d, e->status, ctype, b.data, b.len);
    else
        kvi_http_complete_error(d, e->status, "%s", e->msg);
    kvi_buf_free(&b);
}

static enum kvi_ctype ctype_of(const struct kvi_http_req *req)
{
    return kvi_ctype_of(req->content_type.p, req->content_type.len);
}

/* ---- writes: packed requests run on the mutation thread ----------------------------------------------- */

enum op { OP_REGISTER, OP_UNREGISTER, OP_ADD, OP_PREFILL, OP_FREE };

struct write_job {
    struct kvi_slot_job job;
    struct kvi_http_deferred *d;
    enum op op;
    struct kvi_slots_request r; /* key, request id, rank, hashes and tokens point into data */
    uint32_t block_size, dp_start, dp_size;
    alignas(8) char data[];
};

static void run_write(struct kvi_slot_service *s, struct kvi_slot_job *j, bool stopping)
{
    struct write_job *w = (struct write_job *)j;
    struct kvi_slots *sl = kvi_slot_service_slots(s);
    struct kvi_slots_err why = {0};
    struct kvi_api_err e;
    int rc = 0, status = 200;
    if (stopping) {
        kvi_http_complete_error(w->d, 503, "shutting down");
        free(w);
        return;
    }
    switch (w->op) {
    case OP_REGISTER:
        rc = kvi_slots_register(sl, &w->r.key, w->r.worker_id, w->block_size, w->dp_start, w->dp_size, &why);
        status = 201;
        break;
    case OP_UNREGISTER:
        rc = kvi_slots_unregister(sl, &w->r.key, w->r.worker_id, &why);
        break;
    case OP_ADD:
        rc = kvi_slots_add(sl, &w->r, &why);
        status = 201;
        break;
    case OP_PREFILL: rc = kvi_slots_prefill_complete(sl, &w->r, &why); break;
    case OP_FREE: rc = kvi_slots_free(sl, &w->r, &why); break;
    }
    if (rc != 0)
        kvi_slot_err_engine(&e, &why, &w->r.key, w->r.request_id, w->r.request_id_len);
    if (why.why == KVI_SLOTS_E_TOO_MANY_TRACKERS || why.why == KVI_SLOTS_E_DP_SIZE_LIMIT ||
        why.why == KVI_SLOTS_E_TOO_MANY_RANKS) /* a limit, not a client's typo: say so (admin route) */
        kvi_log_warn("slot tracker: /register of worker %" PRIu64 " refused: %s", w->r.worker_id, e.msg);
    complete(w->d, rc, status, &e);
    free(w);
}

/* Pack @p r (strings and hashes anywhere) into one job, defer the answer and post it. */
static void post_write(struct kvi_slot_routes *rt, struct kvi_http_res *res, enum op op,
                       const struct kvi_slots_request *r, uint32_t block_size, uint32_t dp_start, uint32_t dp_size)
{
    size_t hb = r->n_hashes * sizeof(uint64_t);
    size_t len = hb + r->key.model_len + r->key.tenant_len + r->request_id_len + 3;
    struct write_job *w = kvi_xmalloc(sizeof(*w) + len);
    w->job.fn = run_write;
    w->op = op;
    w->r = *r;
    w->block_size = block_size;
    w->dp_start = dp_start;
    w->dp_size = dp_size;
    char *p = w->data;
    if (hb > 0)
        memcpy(p, r->hashes, hb);
    w->r.hashes = (const uint64_t *)(void *)p;
    p += hb;
    if (r->key.model_len > 0)
        memcpy(p, r->key.model, r->key.model_len);
    p[r->key.model_len] = '\0';
    w->r.key.model = p;
    p += r->key.model_len + 1;
    if (r->key.tenant_len > 0)
        memcpy(p, r->key.tenant, r->key.tenant_len);
    p[r->key.tenant_len] = '\0';
    w->r.key.tenant = p;
    p += r->key.tenant_len + 1;
    if (r->request_id_len > 0)
        memcpy(p, r->request_id, r->request_id_len);
    p[r->request_id_len] = '\0';
    w->r.request_id = p;
    w->d = kvi_http_defer(res);
    if (kvi_slot_service_post(rt->s, &w->job) != 0) {
        kvi_http_complete_error(w->d, 503, "shutting down");
        free(w);
    }
}

static void h_register(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                       struct kvi_http_res *res)
{
    struct kvi_slot_register r;
    struct kvi_api_err e;
    if (kvi_slot_parse_register(req->body, req->body_len, ctype_of(req), &t->scratch, &r, &e) != 0) {
        send_err(res, t, &e);
        return;
    }
    struct kvi_slots_request q = {.key = r.key, .worker_id = r.worker_id};
    post_write(rt, res, OP_REGISTER, &q, r.block_size, r.dp_start, r.dp_size);
}

static void h_unregister(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                         struct kvi_http_res *res)
{
    struct kvi_slot_unregister r;
    struct kvi_api_err e;
    if (kvi_slot_parse_unregister(req->body, req->body_len, ctype_of(req), &t->scratch, &r, &e) != 0) {
        send_err(res, t, &e);
        return;
    }
    struct kvi_slots_request q = {.key = r.key, .worker_id = r.worker_id};
    post_write(rt, res, OP_UNREGISTER, &q, 0, 0, 0);
}

static void h_add(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                  struct kvi_http_res *res)
{
    struct kvi_slots_request q;
    struct kvi_api_err e;
    if (kvi_slot_parse_add(req->body, req->body_len, ctype_of(req), &t->scratch, &q, &e) != 0) {
        send_err(res, t, &e);
        return;
    }
    post_write(rt, res, OP_ADD, &q, 0, 0, 0);
}

static void h_lifecycle(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                        struct kvi_http_res *res, enum op op)
{
    struct kvi_slots_request q;
    struct kvi_api_err e;
    if (kvi_slot_parse_lifecycle(req->body, req->body_len, ctype_of(req), &t->scratch, &q, &e) != 0) {
        send_err(res, t, &e);
        return;
    }
    post_write(rt, res, op, &q, 0, 0, 0);
}

static void h_prefill(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                      struct kvi_http_res *res)
{
    h_lifecycle(rt, t, req, res, OP_PREFILL);
}

static void h_free(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                   struct kvi_http_res *res)
{
    h_lifecycle(rt, t, req, res, OP_FREE);
}

/* ---- reads (inline, RCU read section) -------------------------------------------------------------------- */

static void h_health(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                     struct kvi_http_res *res)
{
    (void)rt;
    (void)t;
    (void)req;
    kvi_http_respond(res, 200, NULL, NULL, 0);
}

/* The position of entry @p i of a page (its strings point where the entry's do). */
static struct kvi_slots_pos pos_of(enum kvi_slot_listing what, const struct slot_thread *t, size_t i)
{
    if (what == KVI_SLOT_LIST_WORKERS) {
        const struct kvi_slots_worker *w = &t->w[i];
        return (struct kvi_slots_pos){{w->model, w->model_len, w->tenant, w->tenant_len}, w->worker_id, 0};
    }
    const struct kvi_slots_load *l = &t->l[i];
    return (struct kvi_slots_pos){{l->model, l->model_len, l->tenant, l->tenant_len}, l->worker_id, l->dp_rank};
}

/*
 * GET /workers and GET /loads (sorted, filtered by model_name and tenant_id) with kvidx's paging: at most one page
 * (--slot-loads-page entries, worst case KVI_SLOT_LOADS_MAX_BYTES) per answer; when more follow, the header
 * KVI_SLOT_CURSOR_HEADER names the last entry, after which the next answer (?cursor=) starts. Loop thread.
 */
static void h_listing(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                      struct kvi_http_res *res, enum kvi_slot_listing what)
{
    struct kvi_slots_key f;
    struct kvi_slot_page pg;
    struct kvi_api_err e;
    if (kvi_slot_parse_filter(req->query.p, req->query.len, &t->scratch, &f, &e) != 0 ||
        kvi_slot_parse_page(req->query.p, req->query.len, &t->scratch, kvi_slot_service_loads_page(rt->s), what,
                            &pg, &e) != 0) {
        send_err(res, t, &e);
        return;
    }
    bool workers = what == KVI_SLOT_LIST_WORKERS;
    size_t *cap = workers ? &t->w_cap : &t->l_cap;
    if (*cap < pg.limit + 1) { /* one more than the page: whether another follows */
        *cap = pg.limit + 1;
        if (workers) {
            free(t->w);
            t->w = kvi_xmalloc(*cap * sizeof(*t->w));
        } else {
            free(t->l);
            t->l = kvi_xmalloc(*cap * sizeof(*t->l));
        }
    }
    const struct kvi_slots *sl = kvi_slot_service_slots(rt->s);
    const struct kvi_slots_pos *after = pg.has_after ? &pg.after : NULL;
    kvi_buf_reset(&t->out);
    struct kvi_buf cur = {0};
    kvi_rcu_read_lock(); /* names point into tracker memory: cursor and body are encoded inside */
    size_t n = workers ? kvi_slots_workers_page(sl, &f, after, t->w, pg.limit + 1)
                       : kvi_slots_loads_page(sl, &f, after, t->l, pg.limit + 1);
    size_t m = n < pg.limit ? n : pg.limit;
    size_t fit = workers ? kvi_slot_workers_fit(t->w, m, KVI_SLOT_LOADS_MAX_BYTES)
                         : kvi_slot_loads_fit(t->l, m, KVI_SLOT_LOADS_MAX_BYTES);
    if (fit < n) {
        struct kvi_slots_pos last = pos_of(what, t, fit - 1);
        kvi_slot_encode_cursor(what, &last, &cur);
    }
    if (workers)
        kvi_slot_encode_workers(t->w, fit, &t->out);
    else
        kvi_slot_encode_loads(t->l, fit, &t->out);
    kvi_rcu_read_unlock();
    if (fit < n) {
        if (!kvi_buf_ok(&cur)) {
            kvi_buf_free(&cur);
            kvi_http_error(res, 500, "out of memory");
            return;
        }
        kvi_http_add_header(res, KVI_SLOT_CURSOR_HEADER, (const char *)cur.data);
        atomic_fetch_add_explicit(workers ? &rt->workers_paged : &rt->loads_paged, 1, memory_order_relaxed);
    }
    kvi_buf_free(&cur);
    send_buf(res, 200, KVI_MIME_JSON, &t->out);
}

static void h_workers(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                      struct kvi_http_res *res)
{
    h_listing(rt, t, req, res, KVI_SLOT_LIST_WORKERS);
}

static void h_loads(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                    struct kvi_http_res *res)
{
    h_listing(rt, t, req, res, KVI_SLOT_LIST_LOADS);
}

static void h_potential(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                        struct kvi_http_res *res)
{
    struct kvi_slot_potential q;
    struct kvi_api_err e;
    if (kvi_slot_parse_potential(req->body, req->body_len, ctype_of(req), &t->scratch, &q, &e) != 0) {
        send_err(res, t, &e);
        return;
    }
    const struct kvi_slots *sl = kvi_slot_service_slots(rt->s);
    size_t n = 0;
    kvi_rcu_read_lock();
    int rc;
    while ((rc = kvi_slots_potential_loads(sl, &q.key, q.hashes, q.n_hashes, q.new_isl_tokens, t->p, t->p_cap,
                                           &n)) == -ENOSPC) {
        t->p_cap = n + n / 2;
        free(t->p);
        t->p = kvi_xmalloc(t->p_cap * sizeof(*t->p));
    }
    kvi_rcu_read_unlock();
    if (rc != 0) {
        struct kvi_slots_err why = {.why = KVI_SLOTS_E_NO_TRACKER};
        kvi_slot_err_engine(&e, &why, &q.key, NULL, 0);
        send_err(res, t, &e);
        return;
    }
    kvi_buf_reset(&t->out);
    kvi_slot_encode_potential(t->p, n, &t->out);
    send_buf(res, 200, KVI_MIME_JSON, &t->out);
}

/* ---- peers -------------------------------------------------------------------------------------------- */

static void h_peers(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                    struct kvi_http_res *res)
{
    (void)req;
    kvi_buf_reset(&t->out);
    kvi_slot_service_encode_peers(rt->s, &t->out);
    send_buf(res, 200, KVI_MIME_JSON, &t->out);
}

static void h_peer(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                   struct kvi_http_res *res, bool add)
{
    struct kvi_str url;
    struct kvi_api_err e;
    if (kvi_slot_parse_peer(req->body, req->body_len, ctype_of(req), &t->scratch, &url, &e) != 0) {
        send_err(res, t, &e);
        return;
    }
    const char *why = NULL;
    int rc = add ? kvi_slot_service_peer_add(rt->s, url.p, url.len, &why)
                 : kvi_slot_service_peer_remove(rt->s, url.p, url.len);
    int status = add ? (rc == 1 ? 201 : 200) : 200;
    if (rc == -ENOTSUP)
        kvi_slot_err_sync_disabled(&e);
    else if (rc == -ENOENT)
        kvi_slot_err_peer_not_found(&e);
    else if (rc < 0)
        set_err(&e, 400, "%s", why ? why : "invalid peer url");
    if (rc < 0) {
        send_err(res, t, &e);
        return;
    }
    kvi_http_respond(res, status, KVI_MIME_JSON, OK_BODY, sizeof(OK_BODY) - 1);
}

static void h_register_peer(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                            struct kvi_http_res *res)
{
    h_peer(rt, t, req, res, true);
}

static void h_deregister_peer(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                              struct kvi_http_res *res)
{
    h_peer(rt, t, req, res, false);
}

/* ---- replica events (kvidx's sync route) ---------------------------------------------------------------- */

/* Body: api/codec_slots.h, kvi_slot_parse_replica. Answer: 200 {"applied": a, "dropped": d}. */
struct replica_job {
    struct kvi_slot_job job;
    struct kvi_http_deferred *d;
    size_t n;
    struct kvi_slots_event *ev; /* into data */
    alignas(8) char data[];
};

static void run_replica(struct kvi_slot_service *s, struct kvi_slot_job *j, bool stopping)
{
    struct replica_job *rj = (struct replica_job *)j;
    if (stopping) {
        kvi_http_complete_error(rj->d, 503, "shutting down");
        free(rj);
        return;
    }
    uint64_t applied = 0;
    for (size_t i = 0; i < rj->n; i++)
        applied += kvi_slots_apply_replica(kvi_slot_service_slots(s), &rj->ev[i]) == 0;
    kvi_slot_service_count_received(s, applied, rj->n - applied, false);
    char body[96];
    int len = snprintf(body, sizeof(body), "{\"applied\":%" PRIu64 ",\"dropped\":%" PRIu64 "}", applied,
                       (uint64_t)rj->n - applied);
    kvi_http_complete(rj->d, 200, KVI_MIME_JSON, body, (size_t)len);
    free(rj);
}

static char *pack_str(char **p, const char *s, size_t n)
{
    char *d = *p;
    if (n > 0)
        memcpy(d, s, n);
    d[n] = '\0';
    *p += n + 1;
    return d;
}

static void h_replica(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                      struct kvi_http_res *res)
{
    struct kvi_api_err e;
    if (!kvi_slot_service_sync_enabled(rt->s)) {
        kvi_slot_err_sync_disabled(&e);
        send_err(res, t, &e);
        return;
    }
    struct kvi_str source;
    struct kvi_slots_event *evs;
    size_t n;
    int rc = kvi_slot_parse_replica(req->body, req->body_len, ctype_of(req), &t->scratch, &source, &evs, &n, &e);
    if (rc != 0) {
        free(evs);
        send_err(res, t, &e);
        return;
    }
    char own[17];
    snprintf(own, sizeof(own), "%016" PRIx64, kvi_slot_service_replica_id(rt->s));
    if (kvi_str_eq(source, own)) { /* our own events came back (a peer loop): never apply them */
        kvi_slot_service_count_received(rt->s, 0, n, true);
        free(evs);
        char body[96];
        int len = snprintf(body, sizeof(body), "{\"applied\":0,\"dropped\":%zu}", n);
        kvi_http_respond(res, 200, KVI_MIME_JSON, body, (size_t)len);
        return;
    }
    size_t bytes = n * sizeof(*evs);
    for (size_t i = 0; i < n; i++)
        bytes += evs[i].req.n_hashes * 8 + evs[i].req.key.model_len + evs[i].req.key.tenant_len +
                 evs[i].req.request_id_len + 3;
    struct replica_job *rj = kvi_xmalloc(sizeof(*rj) + bytes);
    rj->job.fn = run_replica;
    rj->n = n;
    rj->ev = (struct kvi_slots_event *)(void *)rj->data;
    char *p = rj->data + n * sizeof(*evs);
    for (size_t i = 0; i < n; i++) { /* hashes first (8-aligned: the event array is) */
        struct kvi_slots_event *d = &rj->ev[i];
        *d = evs[i];
        if (d->req.n_hashes > 0)
            memcpy(p, evs[i].req.hashes, d->req.n_hashes * 8);
        d->req.hashes = (const uint64_t *)(void *)p;
        p += d->req.n_hashes * 8;
    }
    for (size_t i = 0; i < n; i++) {
        struct kvi_slots_event *d = &rj->ev[i];
        d->req.key.model = pack_str(&p, evs[i].req.key.model, evs[i].req.key.model_len);
        d->req.key.tenant = pack_str(&p, evs[i].req.key.tenant, evs[i].req.key.tenant_len);
        d->req.request_id = pack_str(&p, evs[i].req.request_id, evs[i].req.request_id_len);
    }
    free(evs);
    rj->d = kvi_http_defer(res);
    if (kvi_slot_service_post(rt->s, &rj->job) != 0) {
        kvi_http_complete_error(rj->d, 503, "shutting down");
        free(rj);
    }
}

/* ---- /metrics (kvidx extension) ---------------------------------------------------------------------------- */

static void metric(struct kvi_buf *b, const char *name, const char *type, const char *help, uint64_t v)
{
    kvi_buf_puts(b, "# HELP ");
    kvi_buf_puts(b, name);
    kvi_buf_putc(b, ' ');
    kvi_buf_puts(b, help);
    kvi_buf_puts(b, "\n# TYPE ");
    kvi_buf_puts(b, name);
    kvi_buf_putc(b, ' ');
    kvi_buf_puts(b, type);
    kvi_buf_putc(b, '\n');
    kvi_buf_puts(b, name);
    kvi_buf_putc(b, ' ');
    kvi_buf_put_u64(b, v);
    kvi_buf_putc(b, '\n');
}

static void h_metrics(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                      struct kvi_http_res *res)
{
    (void)req;
    struct kvi_slots_stats st;
    struct kvi_slot_service_stats ss;
    kvi_slots_stats(kvi_slot_service_slots(rt->s), &st);
    kvi_slot_service_stats(rt->s, &ss);
    struct kvi_buf *b = &t->out;
    kvi_buf_reset(b);
#define G(n, h, v) metric(b, "kvidx_slots_" n, "gauge", h, v)
#define C(n, h, v) metric(b, "kvidx_slots_" n "_total", "counter", h, v)
    G("trackers", "Slot trackers (model, tenant).", st.trackers);
    G("workers", "Registered workers.", st.workers);
    G("ranks", "Registered worker ranks.", st.ranks);
    G("requests", "Active requests.", st.requests);
    G("trie_nodes", "Live prompt-trie nodes.", st.nodes);
    C("adds", "Local /add writes.", st.adds);
    C("frees", "Local /free writes that removed a request.", st.frees);
    C("prefill_completes", "Local /prefill_complete writes.", st.prefill_completes);
    C("expired", "Requests removed as stale (older than 300 s).", st.expired);
    C("expire_runs", "Stale-request cleanup ticks.", ss.expire_runs);
    C("jobs", "Writes run by the mutation thread.", ss.jobs);
    G("job_queue", "Writes waiting for the mutation thread.", ss.job_queue);
    C("replica_applied", "Replica events applied.", st.replica_applied);
    C("replica_dropped_tracker", "Replica events dropped: unknown (model, tenant).", st.replica_dropped_tracker);
    C("replica_dropped_block_size", "Replica events dropped: block size mismatch.", st.replica_dropped_block_size);
    C("replica_dropped_worker", "Replica events dropped: unknown worker or rank.", st.replica_dropped_worker);
    C("replica_dropped_duplicate", "Replica adds dropped: request id already active.",
      st.replica_dropped_duplicate);
    C("replica_dropped_request", "Replica prefill_complete/free dropped: unknown request.",
      st.replica_dropped_request);
    C("replica_received_batches", "Replica batches received.", ss.recv_batches);
    C("replica_received_self", "Replica batches carrying this replica's own id (dropped).", ss.recv_self);
    C("replica_events_emitted", "Local lifecycle events offered to replica sync.", st.events_emitted);
    C("replica_queued", "Events put in the outbound replica queue.", ss.sync_queued);
    C("replica_queue_full", "Events dropped because the outbound replica queue was full.", ss.sync_queue_full);
    G("replica_queue_depth", "Events waiting in the outbound replica queue.", ss.sync_queue_depth);
    C("replica_sent_batches", "Batches delivered to a peer (2xx).", ss.sync_batches);
    C("replica_sent_events", "Events delivered to peers.", ss.sync_events);
    C("replica_send_errors", "Failed POSTs to peers.", ss.sync_errors);
    C("replica_send_dropped", "Events not delivered to a peer (failed POST or backoff).", ss.sync_dropped);
    G("replica_peers", "Configured replica peers.", ss.sync_peers);
    C("route_requests", "POST /route answers (indexer port).", ss.route_requests);
    C("route_commits", "POST /route commits that recorded an /add.", ss.route_commits);
    C("register_refused_models", "/register refused: --slot-max-models trackers exist.", st.refused_trackers);
    C("register_refused_ranks", "/register refused: --slot-max-dp-size or --slot-max-ranks.", st.refused_ranks);
    C("loads_paged", "GET /loads answers cut to a page (X-Kvidx-Next-Cursor set).",
      atomic_load_explicit(&rt->loads_paged, memory_order_relaxed));
    C("workers_paged", "GET /workers answers cut to a page (X-Kvidx-Next-Cursor set).",
      atomic_load_explicit(&rt->workers_paged, memory_order_relaxed));
#undef G
#undef C
    send_buf(res, 200, MIME_PROM, b);
}

/* ---- test routes (DYN_KV_INDEXER_TEST_ENDPOINTS) ------------------------------------------------------------- */

/* The value of one unsigned or boolean key of a flat JSON object; -1 when absent, -2 on errors. */
static int small_obj(const struct kvi_http_req *req, struct kvi_scratch *s, const char *key, uint64_t *num,
                     bool *flag)
{
    struct kvi_rd rd;
    struct kvi_str k;
    int found = -1, r;
    if (ctype_of(req) != KVI_CT_JSON)
        return -3;
    kvi_rd_init(&rd, req->body, req->body_len, KVI_ENC_JSON, s);
    if (kvi_rd_obj_begin(&rd) != 0)
        return -2;
    while ((r = kvi_rd_obj_next(&rd, &k)) == 1) {
        if (kvi_str_eq(k, key)) {
            struct kvi_num n;
            if (num != NULL && (kvi_rd_num(&rd, &n) != 0 || n.neg))
                return -2;
            if (flag != NULL && kvi_rd_bool(&rd, flag) != 0)
                return -2;
            if (num != NULL)
                *num = n.mag;
            found = 0;
        } else if (kvi_rd_skip(&rd) != 0) {
            return -2;
        }
    }
    return r < 0 || kvi_rd_finish(&rd) != 0 ? -2 : found;
}

static void small_err(struct kvi_http_res *res, struct slot_thread *t, int rc, const char *what)
{
    struct kvi_api_err e;
    if (rc == -3)
        set_err(&e, 415, "Expected request with `Content-Type: application/json`");
    else
        set_err(&e, rc == -1 ? 422 : 400, "expected %s", what);
    send_err(res, t, &e);
}

static void h_advance_clock(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                            struct kvi_http_res *res)
{
    uint64_t sec = 0, ms = 0;
    int a = small_obj(req, &t->scratch, "seconds", &sec, NULL);
    int b = a < -1 ? a : small_obj(req, &t->scratch, "milliseconds", &ms, NULL);
    if (a < -1 || b < -1 || (a == -1 && b == -1)) {
        small_err(res, t, a < -1 ? a : (b < -1 ? b : -1), "{\"seconds\": N} or {\"milliseconds\": N}");
        return;
    }
    kvi_slot_service_clock_advance(rt->s, sec * 1000000000ull + ms * 1000000ull);
    kvi_http_respond(res, 200, KVI_MIME_JSON, OK_BODY, sizeof(OK_BODY) - 1);
}

static void h_replica_sender(struct kvi_slot_routes *rt, struct slot_thread *t, const struct kvi_http_req *req,
                             struct kvi_http_res *res)
{
    bool paused = false;
    int rc = small_obj(req, &t->scratch, "paused", NULL, &paused);
    if (rc != 0) {
        small_err(res, t, rc, "{\"paused\": true|false}");
        return;
    }
    kvi_slot_service_sender_pause(rt->s, paused);
    kvi_http_respond(res, 200, KVI_MIME_JSON, OK_BODY, sizeof(OK_BODY) - 1);
}

/* ---- route table ---------------------------------------------------------------------------------------------- */

static const struct route_def routes[] = {
    {"/health", KVI_HTTP_GET, h_health, false, false, false},
    {"/register", KVI_HTTP_POST, h_register, true, false, false},
    {"/unregister", KVI_HTTP_POST, h_unregister, true, false, false},
    {"/workers", KVI_HTTP_GET, h_workers, false, false, false},
    {"/add", KVI_HTTP_POST, h_add, false, false, true},
    {"/prefill_complete", KVI_HTTP_POST, h_prefill, false, false, true},
    {"/free", KVI_HTTP_POST, h_free, false, false, true},
    {"/loads", KVI_HTTP_GET, h_loads, false, false, false},
    {"/potential_loads", KVI_HTTP_POST, h_potential, false, false, false},
    {"/register_peer", KVI_HTTP_POST, h_register_peer, true, false, false},
    {"/deregister_peer", KVI_HTTP_POST, h_deregister_peer, true, false, false},
    {"/peers", KVI_HTTP_GET, h_peers, false, false, false},
    {KVI_SLOT_SYNC_PATH, KVI_HTTP_POST, h_replica, true, false, false},
    {"/metrics", KVI_HTTP_GET, h_metrics, false, false, false},
    {"/test/advance_clock", KVI_HTTP_POST, h_advance_clock, true, true, false},
    {"/test/replica_sender", KVI_HTTP_POST, h_replica_sender, true, true, false},
};

/* Every path takes any method: a wrong one gets the reference's 405 text (with Allow). */
static void dispatch(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    const struct route_ud *u = ud;
    struct slot_thread *t = req->thread_ctx;
    unsigned ok = u->def->methods == KVI_HTTP_GET ? (KVI_HTTP_GET | KVI_HTTP_HEAD) : u->def->methods;
    if (!(req->method & ok)) {
        struct kvi_api_err e;
        kvi_slot_err_method(&e);
        kvi_http_add_header(res, "Allow", u->def->methods == KVI_HTTP_GET ? "GET,HEAD" : "POST");
        send_err(res, t, &e);
        return;
    }
    u->def->fn(u->rt, t, req, res);
    kvi_scratch_reset(&t->scratch);
}

struct kvi_slot_routes *kvi_slot_routes_create(struct kvi_slot_service *s, unsigned n_threads, size_t body_limit,
                                               bool test_endpoints)
{
    struct kvi_slot_routes *rt = kvi_xcalloc(1, sizeof(*rt));
    rt->s = s;
    rt->n_threads = n_threads ? n_threads : 1;
    rt->body_limit = body_limit;
    rt->test_endpoints = test_endpoints;
    rt->threads = kvi_xcalloc(rt->n_threads, sizeof(*rt->threads));
    rt->uds = kvi_xcalloc(KVI_ARRAY_LEN(routes), sizeof(*rt->uds));
    return rt;
}

void *kvi_slot_routes_thread_init(unsigned thread, void *ud)
{
    struct kvi_slot_routes *rt = ud;
    KVI_ASSERT(thread < rt->n_threads);
    struct slot_thread *t = &rt->threads[thread];
    kvi_scratch_init(&t->scratch);
    kvi_buf_init(&t->out);
    t->w_cap = t->l_cap = t->p_cap = 64;
    t->w = kvi_xmalloc(t->w_cap * sizeof(*t->w));
    t->l = kvi_xmalloc(t->l_cap * sizeof(*t->l));
    t->p = kvi_xmalloc(t->p_cap * sizeof(*t->p));
    return t;
}

void kvi_slot_routes_thread_fini(unsigned thread, void *thread_ctx, void *ud)
{
    (void)thread;
    (void)ud;
    struct slot_thread *t = thread_ctx;
    kvi_scratch_free(&t->scratch);
    kvi_buf_free(&t->out);
    free(t->w);
    free(t->l);
    free(t->p);
    memset(t, 0, sizeof(*t));
}

int kvi_slot_routes_mount(struct kvi_slot_routes *rt, struct kvi_http_server *srv)
{
    for (size_t i = 0; i < KVI_ARRAY_LEN(routes); i++) {
        if (routes[i].test && !rt->test_endpoints)
            continue;
        struct kvi_http_route_opts o = {rt->body_limit, (routes[i].admin ? KVI_HTTP_ROUTE_ADMIN : 0u) |
                                                            (routes[i].data ? KVI_HTTP_ROUTE_DATA : 0u)};
        rt->uds[i] = (struct route_ud){rt, &routes[i]};
        int rc = kvi_http_server_route(srv, KVI_HTTP_ANY, routes[i].path, dispatch, &rt->uds[i], &o);
        if (rc < 0)
            return rc;
    }
    return 0;
}

void kvi_slot_routes_free(struct kvi_slot_routes *rt)
{
    if (rt == NULL)
        return;
    free(rt->threads);
    free(rt->uds);
    free(rt);
}
