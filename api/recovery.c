/*
 * P2P recovery: see api/recovery.h. The fetch is a blocking GET
 * (net/http_client.h) on the control thread, cancelled within ~50 ms once
 * shutdown begins; its body callback feeds the dump decoder, whose
 * callbacks turn records into single-block ops submitted through the control
 * thread's producer. Memory stays bounded by the decoder's largest event.
 * The dump's watermarks (api/codec_dump.h) are kept per (namespace,
 * instance, dp_rank) and handed to the service only once the whole dump
 * applied (kvi_service_ctl_recovered_watermark: it seeds the gated
 * listeners, or the key's later registration); a failed peer's are
 * discarded with its blocks.
 */
#include "api/recovery.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "api/codec_dump.h"
#include "api/service.h"
#include "engine/common.h"
#include "engine/namespace.h"
#include "engine/writer.h"
#include "net/http_client.h"
#include "net/log.h"

const char *kvi_recovery_result_name(enum kvi_recovery_result r)
{
    switch (r) {
    case KVI_RECOVERY_SUCCEEDED: return "succeeded";
    case KVI_RECOVERY_NO_REACHABLE_PEERS: return "no_reachable_peers";
    case KVI_RECOVERY_FAILED: return "failed";
    default: return NULL;
    }
}

/* What one attempt touched, for its rollback. */
struct touched_ns {
    struct kvi_ns *ns;
    bool created;
    uint32_t *inst; /* dense ids interned or fed */
    size_t n_inst, cap_inst;
};

struct attempt {
    struct kvi_service *svc;
    struct kvi_producer *prod;
    struct kvi_dump_dec *dec;
    struct kvi_op_sink sink;
    struct touched_ns *ns;
    size_t n_ns, cap_ns;
    struct touched_ns *cur; /* namespace of the last record */
    struct rec_wm {         /* watermarks, applied only when the whole dump was */
        struct kvi_ns *ns;
        uint32_t dense;
        uint32_t dp_rank;
        uint64_t worker_id;
        char *worker_name;  /* NULL for a numeric id */
        uint64_t seq;
    } *wm;
    size_t n_wm, cap_wm;
    int dec_rc;             /* decoder error (sticky) */
    uint64_t blocks;        /* blocks submitted */
    uint64_t skipped;       /* records that could not be replayed */
};

static struct touched_ns *touch_ns(struct attempt *a, struct kvi_str model, struct kvi_str tenant, uint32_t bs)
{
    for (size_t i = 0; i < a->n_ns; i++) {
        struct kvi_ns *ns = a->ns[i].ns;
        if (kvi_str_eq(model, ns->model) && kvi_str_eq(tenant, ns->tenant))
            return &a->ns[i];
    }
    char *m = strndup(model.p, model.len), *t = strndup(tenant.p, tenant.len);
    if (m == NULL || t == NULL)
        kvi_die("out of memory");
    bool created = false;
    struct kvi_ns *ns = kvi_service_ctl_ns_get(a->svc, m, t, bs, &created);
    free(m);
    free(t);
    if (ns == NULL)
        return NULL;
    if (a->n_ns == a->cap_ns) {
        a->cap_ns = a->cap_ns ? a->cap_ns * 2 : 4;
        a->ns = kvi_xrealloc(a->ns, a->cap_ns * sizeof *a->ns);
    }
    a->ns[a->n_ns] = (struct touched_ns){ns, created, NULL, 0, 0};
    return &a->ns[a->n_ns++];
}

static void touch_inst(struct touched_ns *t, uint32_t dense)
{
    for (size_t i = t->n_inst; i-- > 0;)
        if (t->inst[i] == dense)
            return;
    if (t->n_inst == t->cap_inst) {
        t->cap_inst = t->cap_inst ? t->cap_inst * 2 : 8;
        t->inst = kvi_xrealloc(t->inst, t->cap_inst * sizeof *t->inst);
    }
    t->inst[t->n_inst++] = dense;
}

static int on_ns(void *ctx, struct kvi_str model, struct kvi_str tenant, uint32_t block_size)
{
    struct attempt *a = ctx;
    a->cur = touch_ns(a, model, tenant, block_size);
    return a->cur == NULL ? -ENOMEM : 0;
}

struct kvi_op *kvi_recovery_rec_op(const struct kvi_dump_rec *r)
{
    struct kvi_op *op;
    switch (r->op) {
    case KVI_DUMP_STORED:
        if (r->no_content) {
            if (!r->has_seq)
                return NULL;
            op = kvi_op_alloc(1, true);
            op->type = KVI_OP_STORE_SEQ_ONLY;
            op->seq[0] = r->seq_hash;
        } else if (!r->has_parent && r->has_position && r->position > 0) {
            /* a root below position 0: only its seq hash places it */
            if (!r->has_seq)
                return NULL;
            op = kvi_op_alloc(1, true);
            op->type = KVI_OP_STORE;
            op->seq[0] = r->seq_hash;
        } else {
            op = kvi_op_alloc(1, false);
            op->type = KVI_OP_STORE;
        }
        op->n = 1;
        op->blocks[0].engine_hash = r->engine_hash;
        op->blocks[0].content_hash = r->content_hash;
        op->has_parent = r->has_parent;
        op->parent_engine_hash = r->parent_hash;
        op->position = r->has_position ? r->position : 0;
        break;
    case KVI_DUMP_REMOVED:
        op = kvi_op_alloc(1, false);
        op->type = KVI_OP_REMOVE;
        op->n = 1;
        op->hashes[0] = r->engine_hash;
        break;
    default:
        op = kvi_op_alloc(0, false);
        op->type = KVI_OP_CLEAR_DP_RANK; /* the record names (worker, dp_rank) */
        break;
    }
    op->tier = (uint8_t)r->tier;
    op->dp_rank = r->dp_rank;
    return op;
}

static int on_rec(void *ctx, const struct kvi_dump_rec *r)
{
    struct attempt *a = ctx;
    struct touched_ns *t = a->cur;
    if (t == NULL || !kvi_str_eq(r->model, t->ns->model) || !kvi_str_eq(r->tenant, t->ns->tenant))
        t = a->cur = touch_ns(a, r->model, r->tenant, r->block_size);
    if (t == NULL)
        return -ENOMEM;
    char *name = NULL;
    if (r->worker_named && (name = strndup(r->worker_name.p, r->worker_name.len)) == NULL)
        return -ENOMEM;
    int64_t dense = kvi_index_intern_instance(t->ns->ix, r->worker_named ? 0 : r->worker_id, name, false);
    free(name);
    if (dense < 0)
        return -ENOMEM;
    touch_inst(t, (uint32_t)dense);
    struct kvi_op *op = kvi_recovery_rec_op(r);
    if (op == NULL) {
        a->skipped++;
        return 0;
    }
    op->ix = t->ns->ix;
    op->instance = (uint32_t)dense;
    op->sink = &a->sink;
    kvi_producer_submit(a->prod, op);
    a->blocks += r->op == KVI_DUMP_STORED;
    return 0;
}

static int on_wm(void *ctx, const struct kvi_dump_wm *w)
{
    struct attempt *a = ctx;
    struct touched_ns *t = a->cur;
    if (t == NULL || !kvi_str_eq(w->model, t->ns->model) || !kvi_str_eq(w->tenant, t->ns->tenant)) {
        t = NULL; /* only namespaces whose block size is known (the encoder puts watermarks last) */
        for (size_t i = 0; i < a->n_ns && t == NULL; i++)
            if (kvi_str_eq(w->model, a->ns[i].ns->model) && kvi_str_eq(w->tenant, a->ns[i].ns->tenant))
                t = &a->ns[i];
        if (t == NULL)
            return 0;
    }
    char *name = NULL;
    if (w->worker_named && (name = strndup(w->worker_name.p, w->worker_name.len)) == NULL)
        return -ENOMEM;
    int64_t dense = kvi_index_intern_instance(t->ns->ix, w->worker_named ? 0 : w->worker_id, name, false);
    if (dense < 0) {
        free(name);
        return -ENOMEM;
    }
    touch_inst(t, (uint32_t)dense);
    if (a->n_wm == a->cap_wm) {
        a->cap_wm = a->cap_wm ? a->cap_wm * 2 : 16;
        a->wm = kvi_xrealloc(a->wm, a->cap_wm * sizeof *a->wm);
    }
    a->wm[a->n_wm++] = (struct rec_wm){t->ns, (uint32_t)dense, w->dp_rank, w->worker_named ? 0 : w->worker_id,
                                       name, w->seq};
    return 0;
}

static int on_body(void *ud, const void *data, size_t len)
{
    struct attempt *a = ud;
    if (kvi_service_stopping(a->svc))
        return 1; /* shutdown: give up the transfer */
    if (a->dec_rc == 0)
        a->dec_rc = kvi_dump_dec_feed(a->dec, data, len);
    return a->dec_rc != 0;
}

/* Undo what a failed attempt applied. */
static void rollback(struct attempt *a)
{
    kvi_producer_flush(a->prod);
    for (size_t i = 0; i < a->n_ns; i++) {
        struct touched_ns *t = &a->ns[i];
        for (size_t j = 0; j < t->n_inst; j++) {
            struct kvi_op *op = kvi_op_alloc(0, false);
            op->type = KVI_OP_REMOVE_INSTANCE;
            op->ix = t->ns->ix;
            op->instance = t->inst[j];
            kvi_producer_submit(a->prod, op);
        }
        kvi_producer_flush(a->prod);
        if (t->created)
            kvi_service_ctl_ns_drop_unused(a->svc, t->ns);
    }
}

static void attempt_free(struct attempt *a)
{
    for (size_t i = 0; i < a->n_ns; i++)
        free(a->ns[i].inst);
    free(a->ns);
    for (size_t i = 0; i < a->n_wm; i++)
        free(a->wm[i].worker_name);
    free(a->wm);
    kvi_dump_dec_destroy(a->dec);
}

/* The client's cancel hook: shutdown stops a fetch that is connecting or
 * waiting for the peer, not only one that is receiving (on_body). */
static bool stop_fetch(void *ud)
{
    return kvi_service_stopping(ud);
}

/* One peer. @return 0 on success, else a negative errno (err says why). */
static int try_peer(struct kvi_service *svc, struct kvi_http_client *client, const char *peer,
                    struct kvi_recovery_stats *st, char *err, size_t errlen)
{
    struct attempt a = {.svc = svc, .prod = kvi_service_ctl_producer(svc)};
    struct kvi_dump_dec_cb cb = {on_ns, on_rec, &a, on_wm};
    a.dec = kvi_dump_dec_create(&cb);
    if (a.dec == NULL) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    size_t plen = strlen(peer);
    while (plen > 0 && peer[plen - 1] == '/')
        plen--;
    char *url = kvi_xmalloc(plen + 8);
    memcpy(url, peer, plen);
    memcpy(url + plen, "/dump", 6);
    st->attempts++;
    struct kvi_http_result res;
    int rc = kvi_http_get(client, url, on_body, &a, &res);
    free(url);
    if (a.dec_rc != 0) {
        snprintf(err, errlen, "bad dump: %s", a.dec_rc == -ENOMEM ? "out of memory" : kvi_dump_dec_error(a.dec));
        rc = a.dec_rc < 0 ? a.dec_rc : -EBADMSG;
    } else if (rc == -EREMOTEIO) {
        snprintf(err, errlen, "HTTP status %d: %.200s", res.status, res.error);
    } else if (rc != 0) {
        snprintf(err, errlen, "%.300s", kvi_service_stopping(svc) ? "shutting down" : res.error);
    } else if ((a.dec_rc = kvi_dump_dec_finish(a.dec)) != 0) {
        snprintf(err, errlen, "bad dump: %s", kvi_dump_dec_error(a.dec));
        rc = -EBADMSG;
    }
    kvi_producer_flush(a.prod);
    if (rc != 0) {
        rollback(&a); /* its watermarks go with its blocks */
    } else {
        for (size_t i = 0; i < a.n_wm; i++) {
            const struct rec_wm *w = &a.wm[i];
            kvi_service_ctl_recovered_watermark(svc, w->ns, w->dense, w->worker_id, w->worker_name, w->dp_rank,
                                                w->seq);
        }
        struct kvi_op_sink s;
        kvi_op_sink_read(&a.sink, &s);
        st->blocks = a.blocks;
        st->rejected = s.outcomes[KVI_OUT_PARENT_NOT_FOUND] + s.outcomes[KVI_OUT_INVALID] + a.skipped;
        kvi_log_info("recovery: applied %" PRIu64 " block(s) in %zu namespace(s) from %s (%" PRIu64
                     " rejected, %zu watermark(s))",
                     a.blocks, a.n_ns, peer, st->rejected, a.n_wm);
    }
    attempt_free(&a);
    return rc;
}

enum kvi_recovery_result kvi_recovery_run(struct kvi_service *svc, const char *const *peers, size_t n_peers,
                                          uint32_t delay_ms, uint32_t timeout_ms, struct kvi_recovery_stats *st)
{
    uint64_t t0 = kvi_now_ns();
    memset(st, 0, sizeof *st);
    kvi_log_info("recovery: fetching /dump from %zu peer(s) in %" PRIu32 " ms", n_peers, delay_ms);
    if (delay_ms > 0 && !kvi_service_ctl_wait(svc, delay_ms))
        return KVI_RECOVERY_FAILED;
    struct kvi_http_client_options o;
    kvi_http_client_options_init(&o);
    o.timeout_ms = timeout_ms;
    if (o.connect_timeout_ms > timeout_ms)
        o.connect_timeout_ms = timeout_ms;
    o.proto = KVI_HTTP_CLIENT_H1; /* what every peer (kvidx, Dynamo) speaks */
    o.cancel = stop_fetch;
    o.cancel_ud = svc;
    struct kvi_http_client *client = kvi_http_client_create(&o);
    if (client == NULL) {
        kvi_log_error("recovery: no HTTP client: %s", strerror(errno));
        st->duration_ms = (kvi_now_ns() - t0) / 1000000u;
        return KVI_RECOVERY_FAILED;
    }
    enum kvi_recovery_result res = KVI_RECOVERY_NO_REACHABLE_PEERS;
    for (size_t i = 0; i < n_peers; i++) {
        if (kvi_service_stopping(svc)) {
            res = KVI_RECOVERY_FAILED;
            break;
        }
        char err[512] = "";
        if (try_peer(svc, client, peers[i], st, err, sizeof err) == 0) {
            res = KVI_RECOVERY_SUCCEEDED;
            break;
        }
        kvi_log_warn("recovery: peer %s failed: %s", peers[i], err);
    }
    kvi_http_client_free(client);
    if (res == KVI_RECOVERY_NO_REACHABLE_PEERS && kvi_service_stopping(svc))
        res = KVI_RECOVERY_FAILED; /* cut short by shutdown, not out of peers */
    if (res == KVI_RECOVERY_NO_REACHABLE_PEERS)
        kvi_log_warn("recovery: no reachable peer; starting empty");
    st->duration_ms = (kvi_now_ns() - t0) / 1000000u;
    return res;
}
