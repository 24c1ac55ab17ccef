/*
 * --nats-snapshot BUCKET (api/README.md "Dynamo on NATS", Snapshots): the
 * snapshot hooks of the NATS plane's stream sources (net/nats_source.h,
 * struct kvi_nats_snap_hooks), storing and loading the /dump content of a
 * source's namespace through net/nats_snapshot.h.
 *
 * DESIGN
 *   Threads: both hooks run on a stream source's thread, which applies
 *   nothing while they run (it waits at a sequence boundary). take dumps
 *   the namespace through the source's own producer, partition by
 *   partition (each partition's writer encodes its blocks into memory, as
 *   /dump does; the source thread compresses and stores them), keeping only
 *   the blocks of the source's workers (the namespace may hold others), so
 *   the snapshot is exactly the state after the sequence it names. Then it
 *   purges the stream (net/nats_snapshot.h, kvi_snap_purge). restore feeds
 *   the verified blob into the dump decoder (api/codec_dump.h) and replays
 *   each block through the source's producer like P2P recovery does
 *   (kvi_recovery_rec_op); a body that does not decode, or a namespace of
 *   another block size, is rolled back (the instances it interned are
 *   removed) and the source reads the whole stream instead.
 *   A stored snapshot that did not load is replaced by this replica's next
 *   one even at the same sequence (otherwise newest seq wins: an equal one
 *   is left alone).
 *   The bucket handle is shared by the sources and opened by the first hook
 *   that needs it; `mu` serialises the hooks (one snapshot at a time).
 *   Shutdown: kvi_svc__snap_free after the plane is destroyed (its threads
 *   joined).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/codec_dump.h"
#include "api/nats_args.h"
#include "api/recovery.h"
#include "api/service_internal.h"
#include "engine/writer.h"
#include "net/log.h"
#include "net/nats_snapshot.h"

struct kvi_svc_snap {
    struct kvi_service *svc;
    struct kvi_nats_snap_hooks hooks;
    const char *bucket;
    pthread_mutex_t mu; /* the hooks, one at a time; st, broken */
    struct kvi_snap_store *st;
    struct broken {     /* snapshots that did not load here, by source: replaced even at their seq */
        uint32_t source;
        char id[40];
    } *broken;
    size_t n_broken;
};

/* The id of source's snapshot that failed to load ("" when none). Called with mu held. */
static const char *broken_of(const struct kvi_svc_snap *sn, uint32_t source)
{
    for (size_t i = 0; i < sn->n_broken; i++)
        if (sn->broken[i].source == source)
            return sn->broken[i].id;
    return "";
}

/* The bucket, opened at first use. Called with mu held. */
static int store_get(struct kvi_svc_snap *sn, struct kvi_snap_store **out)
{
    if (sn->st == NULL) {
        struct kvi_nats *n = kvi_service_nats(sn->svc);
        int rc = n ? kvi_snap_store_open(n, sn->bucket, &sn->st) : -EAGAIN;
        if (rc != 0)
            return rc;
    }
    *out = sn->st;
    return 0;
}

/* The namespace a source feeds (model, tenant, block size copied out). @return false when unknown. */
static bool ns_info(struct kvi_service *svc, const struct kvi_index *ix, char **model, char **tenant, uint32_t *bs)
{
    bool found = false;
    pthread_mutex_lock(&svc->mu);
    for (size_t i = 0; i < svc->n_nats_ns && !found; i++)
        if (svc->nats_ns[i]->ix == ix) {
            *model = strdup(svc->nats_ns[i]->model);
            *tenant = strdup(svc->nats_ns[i]->tenant);
            *bs = svc->nats_ns[i]->block_size;
            found = true;
        }
    pthread_mutex_unlock(&svc->mu);
    if (found && (*model == NULL || *tenant == NULL))
        kvi_die("out of memory");
    return found;
}

/* ---- take -------------------------------------------------------------------------------------- */

struct filter {
    struct kvi_dump_enc *enc;
    const uint32_t *dense; /* sorted: the source's workers */
    size_t n;
};

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* kvi_dump_fn on a partition's writer: only the source's workers' blocks. */
static void emit_filtered(void *ctx, const struct kvi_dump_block *b)
{
    const struct filter *f = ctx;
    if (bsearch(&b->instance, f->dense, f->n, sizeof *f->dense, cmp_u32) != NULL)
        kvi_dump_emit(f->enc, b);
}

static uint64_t ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Write the body of p's namespace into w; *dump_ms: the time the writers spent encoding.
 * @return 0 or a negative errno. */
static int write_body(struct kvi_snap_writer *w, const struct kvi_nats_snap_point *p, const char *model,
                      const char *tenant, uint32_t bs, uint64_t *dump_ms)
{
    uint32_t *dense = kvi_xmalloc((p->n_order ? p->n_order : 1) * sizeof *dense);
    size_t nd = 0;
    for (size_t i = 0; i < p->n_order; i++) {
        int64_t d = kvi_index_find_instance(p->ix, p->order[i].worker_id, NULL);
        if (d >= 0)
            dense[nd++] = (uint32_t)d;
    }
    qsort(dense, nd, sizeof *dense, cmp_u32);
    struct kvi_dump_enc enc;
    kvi_dump_enc_init(&enc, NULL, NULL, 0);
    struct filter f = {&enc, dense, nd};
    kvi_dump_enc_begin(&enc);
    kvi_dump_enc_ns_begin(&enc, (struct kvi_str){model, strlen(model)}, (struct kvi_str){tenant, strlen(tenant)},
                          bs, p->ix);
    int rc = 0;
    for (uint32_t part = 0; part < kvi_index_n_parts(p->ix) && rc == 0; part++) {
        uint64_t t0 = ms_now();
        kvi_producer_dump_partition(p->prod, p->ix, part, emit_filtered, &f);
        *dump_ms += ms_now() - t0;
        if (enc.err != 0 || enc.out.oom)
            rc = -ENOMEM;
        else
            rc = kvi_snap_writer_write(w, enc.out.data, enc.out.len);
        kvi_buf_reset(&enc.out);
    }
    kvi_dump_enc_ns_end(&enc);
    if (rc == 0 && (rc = kvi_dump_enc_end(&enc)) == 0)
        rc = kvi_snap_writer_write(w, enc.out.data, enc.out.len);
    kvi_dump_enc_free(&enc);
    free(dense);
    return rc;
}

static int take(void *ctx, const struct kvi_nats_snap_point *p, struct kvi_nats_snap_result *r)
{
    struct kvi_svc_snap *sn = ctx;
    char *model = NULL, *tenant = NULL, prefix[KVI_SNAP_PREFIX_MAX];
    uint32_t bs = 0;
    uint64_t t0 = ms_now(), dump_ms = 0, purge_ms = 0;
    if (!ns_info(sn->svc, p->ix, &model, &tenant, &bs))
        return -ENOENT;
    int rc = kvi_snap_prefix(prefix, sizeof prefix, p->stream, p->subject, p->label);
    pthread_mutex_lock(&sn->mu);
    struct kvi_snap_store *st = NULL;
    if (rc == 0)
        rc = store_get(sn, &st);
    struct kvi_snap_writer *w = NULL;
    if (rc == 0) {
        w = kvi_snap_writer_begin(st, prefix, p->seq, 0);
        kvi_snap_writer_replace(w, broken_of(sn, p->source));
        size_t hl = kvi_snap_header_size(p->n_order);
        uint8_t *h = kvi_xmalloc(hl);
        kvi_snap_header_encode(p->order, p->n_order, h);
        rc = kvi_snap_writer_write(w, h, hl);
        free(h);
    }
    if (rc == 0)
        rc = write_body(w, p, model, tenant, bs, &dump_ms);
    struct kvi_snap_manifest m = {0};
    if (rc == 0) {
        rc = kvi_snap_writer_commit(w, &m);
        w = NULL;
    }
    kvi_snap_writer_abort(w);
    pthread_mutex_unlock(&sn->mu);
    if (rc == 0) {
        r->bytes = m.bytes;
        r->raw_bytes = m.raw_bytes;
        uint64_t t1 = ms_now();
        kvi_snap_purge(kvi_service_nats(sn->svc), p->stream, p->subject[0] ? p->subject : NULL, p->seq,
                       &r->purged_below);
        purge_ms = ms_now() - t1;
        kvi_log_info("nats snapshot %s:%s: sequence %" PRIu64 " of stream %s stored (%" PRIu64 " bytes, %" PRIu64
                     " uncompressed, %" PRIu32 " chunks; %" PRIu64 " ms: dump %" PRIu64 ", deflate and store %" PRIu64
                     ", purge %" PRIu64 ")",
                     model, tenant, p->seq, p->stream, m.bytes, m.raw_bytes, m.chunks, ms_now() - t0, dump_ms,
                     t1 - t0 - dump_ms, purge_ms);
    } else if (rc == -ESTALE) {
        kvi_log_info("nats snapshot %s:%s: a snapshot as new as sequence %" PRIu64 " is stored already", model,
                     tenant, p->seq);
    } else {
        kvi_log_warn("nats snapshot %s:%s: sequence %" PRIu64 " not stored (%s); next period", model, tenant,
                     p->seq, strerror(-rc));
    }
    free(model);
    free(tenant);
    return rc;
}

/* ---- restore ----------------------------------------------------------------------------------- */

struct restore {
    const struct kvi_nats_snap_point *p;
    uint32_t bs;
    struct kvi_dump_dec *dec;
    uint32_t *inst; /* dense ids interned (for a rollback) */
    size_t n_inst, cap_inst;
    struct kvi_nats_order *order;
    size_t n_order;
    uint64_t blocks;
    char why[160];
};

static int on_ns(void *ctx, struct kvi_str model, struct kvi_str tenant, uint32_t block_size)
{
    struct restore *r = ctx;
    (void)model;
    (void)tenant;
    if (block_size != r->bs) {
        snprintf(r->why, sizeof r->why, "block size %" PRIu32 ", the namespace has %" PRIu32, block_size, r->bs);
        return -EINVAL;
    }
    return 0;
}

static int on_rec(void *ctx, const struct kvi_dump_rec *rec)
{
    struct restore *r = ctx;
    if (rec->worker_named || rec->block_size != r->bs) {
        snprintf(r->why, sizeof r->why, "a record of a named worker or another block size");
        return -EINVAL;
    }
    int64_t d = kvi_index_intern_instance(r->p->ix, rec->worker_id, NULL, false);
    if (d < 0)
        return -ENOMEM;
    bool seen = false;
    for (size_t i = r->n_inst; i-- > 0 && !seen;)
        seen = r->inst[i] == (uint32_t)d;
    if (!seen) {
        if (r->n_inst == r->cap_inst) {
            r->cap_inst = r->cap_inst ? 2 * r->cap_inst : 16;
            r->inst = kvi_xrealloc(r->inst, r->cap_inst * sizeof *r->inst);
        }
        r->inst[r->n_inst++] = (uint32_t)d;
    }
    struct kvi_op *op = kvi_recovery_rec_op(rec);
    if (op == NULL)
        return 0;
    op->ix = r->p->ix;
    op->instance = (uint32_t)d;
    kvi_producer_submit(r->p->prod, op);
    r->blocks += rec->op == KVI_DUMP_STORED;
    return 0;
}

static int on_order(void *ctx, struct kvi_nats_order *order, size_t n)
{
    struct restore *r = ctx;
    r->order = order;
    r->n_order = n;
    return 0;
}

static int on_body(void *ctx, const void *data, size_t len)
{
    struct restore *r = ctx;
    return kvi_dump_dec_feed(r->dec, data, len);
}

static void rollback(struct restore *r)
{
    kvi_producer_flush(r->p->prod);
    for (size_t i = 0; i < r->n_inst; i++) {
        struct kvi_op *op = kvi_op_alloc(0, false);
        op->type = KVI_OP_REMOVE_INSTANCE;
        op->ix = r->p->ix;
        op->instance = r->inst[i];
        kvi_producer_submit(r->p->prod, op);
    }
    kvi_producer_flush(r->p->prod);
}

static int restore(void *ctx, const struct kvi_nats_snap_point *p, struct kvi_nats_restore *out)
{
    struct kvi_svc_snap *sn = ctx;
    char *model = NULL, *tenant = NULL, prefix[KVI_SNAP_PREFIX_MAX];
    struct restore r = {.p = p};
    if (!ns_info(sn->svc, p->ix, &model, &tenant, &r.bs))
        return 0;
    int rc = kvi_snap_prefix(prefix, sizeof prefix, p->stream, p->subject, p->label);
    if (rc != 0) {
        kvi_log_warn("nats snapshot %s:%s: a name too long for a key: no snapshot", model, tenant);
        goto out;
    }
    pthread_mutex_lock(&sn->mu);
    struct kvi_snap_store *st = NULL;
    rc = store_get(sn, &st);
    if (rc == -EAGAIN) {
        pthread_mutex_unlock(&sn->mu);
        goto out;
    }
    struct kvi_dump_dec_cb dcb = {on_ns, on_rec, &r, NULL};
    r.dec = kvi_dump_dec_create(&dcb);
    if (r.dec == NULL)
        kvi_die("out of memory");
    struct kvi_snap_read_cb cb = {on_order, on_body, &r};
    struct kvi_snap_manifest m = {0};
    char why[256] = "";
    if (rc == 0)
        rc = kvi_snap_load(st, prefix, &cb, &m, why, sizeof why);
    if (rc != 0 && m.id[0] != '\0') { /* a manifest that parsed, and a snapshot that did not load */
        sn->broken = kvi_xrealloc(sn->broken, (sn->n_broken + 1) * sizeof *sn->broken);
        sn->broken[sn->n_broken].source = p->source;
        snprintf(sn->broken[sn->n_broken++].id, sizeof sn->broken->id, "%s", m.id);
    }
    pthread_mutex_unlock(&sn->mu);
    if (rc == 0 && (rc = kvi_dump_dec_finish(r.dec)) != 0)
        snprintf(why, sizeof why, "dump: %s", kvi_dump_dec_error(r.dec));
    else if (rc != 0 && r.why[0] != '\0')
        snprintf(why, sizeof why, "%s", r.why);
    else if (rc != 0 && rc != -ENOENT && rc != -EAGAIN && kvi_dump_dec_error(r.dec)[0] != '\0')
        snprintf(why, sizeof why, "dump: %s", kvi_dump_dec_error(r.dec));
    if (rc == 0) {
        kvi_producer_flush(p->prod);
        out->seq = m.seq;
        out->order = r.order;
        out->n_order = r.n_order;
        out->blocks = r.blocks;
        r.order = NULL;
    } else if (rc == -ENOENT) {
        kvi_log_info("nats snapshot %s:%s: none stored yet: reading the whole stream %s", model, tenant, p->stream);
        rc = 0;
    } else if (rc == -EAGAIN) {
        rollback(&r);
    } else {
        rollback(&r);
        out->failed = true;
        kvi_log_warn("nats snapshot %s:%s: the stored snapshot (sequence %" PRIu64 ") does not load (%s): falling "
                     "back to the whole stream %s",
                     model, tenant, m.seq, why, p->stream);
        rc = 0;
    }
    kvi_dump_dec_destroy(r.dec);
out:
    free(r.order);
    free(r.inst);
    free(model);
    free(tenant);
    return rc == -EAGAIN ? -EAGAIN : 0;
}

/* ---- service ----------------------------------------------------------------------------------- */

const struct kvi_nats_snap_hooks *kvi_svc__snap_hooks(struct kvi_service *svc)
{
    const struct kvi_nats_args *a = svc->cfg.nats;
    if (a == NULL || a->snapshot == NULL)
        return NULL;
    if (svc->snap == NULL) {
        struct kvi_svc_snap *sn = kvi_xcalloc(1, sizeof *sn);
        sn->svc = svc;
        sn->bucket = a->snapshot;
        pthread_mutex_init(&sn->mu, NULL);
        sn->hooks = (struct kvi_nats_snap_hooks){.restore = restore, .take = take, .ctx = sn,
                                                 .every_ms = a->snapshot_every_s * 1000u};
        svc->snap = sn;
    }
    return &svc->snap->hooks;
}

void kvi_svc__snap_free(struct kvi_service *svc)
{
    struct kvi_svc_snap *sn = svc->snap;
    if (sn == NULL)
        return;
    kvi_snap_store_close(sn->st);
    free(sn->broken);
    pthread_mutex_destroy(&sn->mu);
    free(sn);
    svc->snap = NULL;
}
