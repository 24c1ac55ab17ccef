/*
 * Fuzz target: /dump import, the streaming dump decoder of api/codec_dump.h
 * (and its encoder, through a round trip).
 *
 * INPUT: byte 0 sets how the body (the rest) is cut into chunks and whether
 * a callback stops the decoding:
 *   bits 0-1  chunking: 0 one byte at a time (bodies up to 4 KiB; larger
 *             ones as 1), 1 sizes 1..64, 2 sizes 1..4096 (both drawn from a
 *             PRNG seeded by the body), 3 two pieces cut at a point the
 *             body's last bytes choose
 *   bit 2     the record callback stops the decoding after k records
 *   bit 3     the namespace callback stops it at the second namespace
 *   bits 4-6  k
 *   bit 7     the callbacks stop with a positive value (7, 9) instead of a
 *             negative one (-7, -9): "nonzero stops decoding" either way
 *
 * CHECKS (besides ASan + UBSan):
 *   - chunking does not matter: the body fed whole and fed in chunks gives
 *     the same return, the same namespaces and the same records, in order;
 *   - returns are 0, -EBADMSG (with a reason) or the callback's value;
 *     errors are sticky (a later feed or finish returns the same value);
 *     once a callback has stopped the decoding, no callback runs again;
 *   - watermark entries (the kvidx extension) are the same, in order, however
 *     the body is chunked, and never carry the sentinel seq ff x 8;
 *   - every record belongs to the namespace announced last, with its block
 *     size (> 0); op and tier are in range; only stored records carry a
 *     parent, position, seq hash or no_content;
 *   - round trip: when the whole body decodes, its stored records are
 *     encoded again with kvi_dump_enc_* (flushing through a sink every few
 *     bytes), the output is valid JSON, and decoding it gives the same
 *     namespaces and the same stored records (event ids are renumbered by
 *     design; start_position and seq_hash are then always present).
 */
#include <errno.h>

#include "api/codec_dump.h"
#include "fuzz.h"

#define STOP_REC 7
#define STOP_NS 9

/* One record as compared across runs (strings copied: they live only
 * during the callback). */
struct rec {
    struct kvi_dump_rec r;
    size_t ns; /* index of its namespace in run.ns */
    char *worker_name;
};

struct ns {
    char *model, *tenant;
    size_t model_len, tenant_len;
    uint32_t block_size;
};

struct run {
    struct rec *recs;
    size_t n_recs, cap_recs;
    struct ns *ns;
    size_t n_ns, cap_ns;
    long stop_rec_after; /* -1 = never */
    bool stop_second_ns;
    int stop_rec, stop_ns; /* the values the callbacks stop with */
    size_t n_wm;           /* watermark entries, and a digest of them in order */
    uint64_t wm_dig;
    bool stopped;          /* a callback has asked to stop */
};

static void *grow(void *p, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return p;
    *cap = *cap ? 2 * *cap : 16;
    void *q = realloc(p, *cap * elem);
    if (q == NULL)
        abort();
    return q;
}

static int on_ns(void *ctx, struct kvi_str model, struct kvi_str tenant, uint32_t block_size)
{
    struct run *u = ctx;
    FZ_CHECK(!u->stopped);
    FZ_CHECK(block_size > 0);
    FZ_CHECK((model.len == 0 || model.p != NULL) && (tenant.len == 0 || tenant.p != NULL));
    if (u->stop_second_ns && u->n_ns == 1) {
        u->stopped = true;
        return u->stop_ns;
    }
    u->ns = grow(u->ns, &u->cap_ns, u->n_ns, sizeof(*u->ns));
    struct ns *n = &u->ns[u->n_ns++];
    n->model = fz_dup(model.p, model.len, true);
    n->tenant = fz_dup(tenant.p, tenant.len, true);
    n->model_len = model.len;
    n->tenant_len = tenant.len;
    n->block_size = block_size;
    return 0;
}

static bool kstr_eq(struct kvi_str s, const char *p, size_t n)
{
    return s.len == n && (n == 0 || memcmp(s.p, p, n) == 0);
}

static int on_rec(void *ctx, const struct kvi_dump_rec *r)
{
    struct run *u = ctx;
    FZ_CHECK(!u->stopped);
    FZ_CHECK(u->n_ns > 0); /* records follow their namespace's announcement */
    const struct ns *n = &u->ns[u->n_ns - 1];
    FZ_CHECK(kstr_eq(r->model, n->model, n->model_len));
    FZ_CHECK(kstr_eq(r->tenant, n->tenant, n->tenant_len));
    FZ_CHECK(r->block_size == n->block_size);
    FZ_CHECK(r->op <= KVI_DUMP_CLEARED && r->tier < KVI_TIER_COUNT);
    if (r->op != KVI_DUMP_STORED)
        FZ_CHECK(!r->has_parent && !r->has_position && !r->has_seq && !r->no_content);
    FZ_CHECK(!r->worker_named || r->worker_name.len == 0 || r->worker_name.p != NULL);
    if (u->stop_rec_after >= 0 && (long)u->n_recs >= u->stop_rec_after) {
        u->stopped = true;
        return u->stop_rec;
    }
    u->recs = grow(u->recs, &u->cap_recs, u->n_recs, sizeof(*u->recs));
    struct rec *x = &u->recs[u->n_recs++];
    x->r = *r;
    x->ns = u->n_ns - 1;
    x->r.model = x->r.tenant = (struct kvi_str){NULL, 0};
    x->worker_name = NULL;
    if (r->worker_named)
        x->worker_name = fz_dup(r->worker_name.p, r->worker_name.len, true);
    x->r.worker_name.p = x->worker_name;
    if (!r->worker_named)
        x->r.worker_name.len = 0;
    return 0;
}

static int on_wm(void *ctx, const struct kvi_dump_wm *w)
{
    struct run *u = ctx;
    FZ_CHECK(!u->stopped);
    FZ_CHECK(w->seq != UINT64_MAX); /* ff x 8 is never a batch */
    FZ_CHECK(!w->worker_named || w->worker_name.len == 0 || w->worker_name.p != NULL);
    FZ_CHECK((w->model.len == 0 || w->model.p != NULL) && (w->tenant.len == 0 || w->tenant.p != NULL));
    uint64_t h = w->seq * 0x9e3779b97f4a7c15ull ^ w->dp_rank ^ (w->worker_named ? 0 : w->worker_id);
    for (size_t i = 0; w->worker_named && i < w->worker_name.len; i++)
        h = h * 131 + (uint8_t)w->worker_name.p[i];
    for (size_t i = 0; i < w->model.len; i++)
        h = h * 137 + (uint8_t)w->model.p[i];
    u->wm_dig = u->wm_dig * 1000003u ^ h;
    u->n_wm++;
    return 0;
}

static void run_free(struct run *u)
{
    for (size_t i = 0; i < u->n_recs; i++)
        free(u->recs[i].worker_name);
    for (size_t i = 0; i < u->n_ns; i++) {
        free(u->ns[i].model);
        free(u->ns[i].tenant);
    }
    free(u->recs);
    free(u->ns);
    memset(u, 0, sizeof(*u));
}

static bool same_ns(const struct ns *a, const struct ns *b)
{
    return a->model_len == b->model_len && a->tenant_len == b->tenant_len &&
           a->block_size == b->block_size && memcmp(a->model, b->model, a->model_len) == 0 &&
           memcmp(a->tenant, b->tenant, a->tenant_len) == 0;
}

/* Records equal; @p rt: the second went through the encoder (event ids,
 * start_position and seq presence are the encoder's). */
static bool same_rec(const struct rec *x, const struct rec *y, bool rt)
{
    const struct kvi_dump_rec *a = &x->r, *b = &y->r;
    if (x->ns != y->ns || a->op != b->op || a->tier != b->tier || a->block_size != b->block_size)
        return false;
    if (a->worker_named != b->worker_named || a->dp_rank != b->dp_rank)
        return false;
    if (a->worker_named ? a->worker_name.len != b->worker_name.len ||
                              memcmp(x->worker_name, y->worker_name, a->worker_name.len) != 0
                        : a->worker_id != b->worker_id)
        return false;
    if (a->has_parent != b->has_parent || (a->has_parent && a->parent_hash != b->parent_hash))
        return false;
    if (a->engine_hash != b->engine_hash || a->content_hash != b->content_hash ||
        a->no_content != b->no_content || a->seq_hash != b->seq_hash || a->position != b->position)
        return false;
    if (rt)
        return b->has_position && b->has_seq;
    return a->event_id == b->event_id && a->has_position == b->has_position &&
           a->has_seq == b->has_seq;
}

/* ---- decoding ----------------------------------------------------------------------- */

struct chunker {
    int mode;
    uint64_t rng;
    size_t cut; /* mode 3 */
};

static size_t next_chunk(struct chunker *c, size_t off, size_t len)
{
    size_t left = len - off, n;
    switch (c->mode) {
    case 0: n = 1; break;
    case 1: n = 1 + (size_t)(fz_rng(&c->rng) % 64); break;
    case 2: n = 1 + (size_t)(fz_rng(&c->rng) % 4096); break;
    default: n = off < c->cut ? c->cut - off : left; break;
    }
    return n < left ? n : left;
}

/* Decode @p body (chunked unless @p c is NULL) into @p u. @return the result. */
static int decode(const uint8_t *body, size_t len, struct chunker *c, struct run *u)
{
    struct kvi_dump_dec_cb cb = {on_ns, on_rec, u, on_wm};
    struct kvi_dump_dec *d = kvi_dump_dec_create(&cb);
    if (d == NULL)
        abort();
    int r = 0;
    if (c == NULL) {
        r = kvi_dump_dec_feed(d, body, len);
    } else {
        for (size_t off = 0; off < len && r == 0;) {
            size_t n = next_chunk(c, off, len);
            /* each chunk alone in its own allocation: overreads are seen */
            char *piece = fz_dup(body + off, n, false);
            r = kvi_dump_dec_feed(d, piece, n);
            free(piece);
            off += n;
        }
    }
    if (r == 0)
        r = kvi_dump_dec_finish(d);
    if (r == 0) {
        FZ_CHECK(kvi_dump_dec_error(d)[0] == '\0');
    } else {
        FZ_CHECK(r == -EBADMSG || r == u->stop_rec || r == u->stop_ns);
        FZ_CHECK(kvi_dump_dec_error(d)[0] != '\0');
        /* sticky */
        FZ_CHECK(kvi_dump_dec_feed(d, "}", 1) == r);
        FZ_CHECK(kvi_dump_dec_finish(d) == r);
    }
    kvi_dump_dec_destroy(d);
    return r;
}

static void check_same_runs(const struct run *a, const struct run *b, bool rt)
{
    FZ_CHECK(a->n_ns == b->n_ns);
    for (size_t i = 0; i < a->n_ns; i++)
        FZ_CHECK(same_ns(&a->ns[i], &b->ns[i]));
    FZ_CHECK(a->n_recs == b->n_recs);
    for (size_t i = 0; i < a->n_recs; i++)
        FZ_CHECK(same_rec(&a->recs[i], &b->recs[i], rt));
    if (!rt) /* the round trip re-encodes records only */
        FZ_CHECK(a->n_wm == b->n_wm && a->wm_dig == b->wm_dig);
}

/* ---- round trip through the encoder ---------------------------------------------- */

struct sink {
    struct kvi_buf all;
    size_t calls;
};

static int sink_fn(void *ctx, const char *data, size_t len)
{
    struct sink *s = ctx;
    FZ_CHECK(len > 0);
    kvi_buf_put(&s->all, data, len);
    s->calls++;
    return 0;
}

static void round_trip(const struct run *u, size_t flush_at)
{
    struct sink sk;
    kvi_buf_init(&sk.all);
    sk.calls = 0;
    struct kvi_dump_enc enc;
    kvi_dump_enc_init(&enc, sink_fn, &sk, flush_at);
    kvi_dump_enc_begin(&enc);
    struct run want;
    memset(&want, 0, sizeof(want));
    want.stop_rec_after = -1;
    size_t ri = 0;
    for (size_t i = 0; i < u->n_ns; i++) {
        const struct ns *n = &u->ns[i];
        struct kvi_str model = {n->model, n->model_len}, tenant = {n->tenant, n->tenant_len};
        kvi_dump_enc_ns_begin(&enc, model, tenant, n->block_size, NULL);
        want.ns = grow(want.ns, &want.cap_ns, want.n_ns, sizeof(*want.ns));
        want.ns[want.n_ns++] = *n;
        for (; ri < u->n_recs && u->recs[ri].ns == i; ri++) {
            const struct rec *x = &u->recs[ri];
            /* the encoder writes stored blocks only, and names as C strings */
            if (x->r.op != KVI_DUMP_STORED ||
                (x->r.worker_named && strlen(x->worker_name) != x->r.worker_name.len))
                continue;
            struct kvi_dump_block b = {
                .dp_rank = x->r.dp_rank,
                .tier = x->r.tier,
                .position = x->r.position,
                .engine_hash = x->r.engine_hash,
                .content_hash = x->r.content_hash,
                .seq_hash = x->r.seq_hash,
                .has_parent = x->r.has_parent,
                .parent_engine_hash = x->r.parent_hash,
                .no_content = x->r.no_content,
            };
            struct kvi_dump_worker w = {x->r.worker_id, x->r.worker_named ? x->worker_name : NULL};
            kvi_dump_enc_block(&enc, &b, &w);
            want.recs = grow(want.recs, &want.cap_recs, want.n_recs, sizeof(*want.recs));
            want.recs[want.n_recs++] = *x;
        }
        kvi_dump_enc_ns_end(&enc);
    }
    FZ_CHECK(kvi_dump_enc_end(&enc) == 0);
    FZ_CHECK(enc.out.len == 0 && sk.calls > 0);
    FZ_CHECK(kvi_buf_ok(&sk.all));
    FZ_CHECK(fz_utf8_valid((const uint8_t *)sk.all.data, sk.all.len));
    struct run got;
    memset(&got, 0, sizeof(got));
    got.stop_rec_after = -1;
    char *body = fz_dup(sk.all.data, sk.all.len, false);
    FZ_CHECK(decode((const uint8_t *)body, sk.all.len, NULL, &got) == 0);
    check_same_runs(&want, &got, true);
    free(body);
    run_free(&got);
    free(want.ns); /* borrowed contents */
    free(want.recs);
    kvi_dump_enc_free(&enc);
    kvi_buf_free(&sk.all);
}

/* ---- entry point ---------------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    uint8_t h = data[0];
    const uint8_t *body = data + 1;
    size_t len = size - 1;
    struct chunker c = {h & 3, 0, 0};
    if (c.mode == 0 && len > 4096)
        c.mode = 1;
    struct fz_dig seed;
    fz_dig_init(&seed);
    fz_dig_bytes(&seed, body, len);
    c.rng = seed.h;
    if (len > 0) {
        size_t tail = len >= 2 ? (size_t)body[len - 1] << 8 | body[len - 2] : body[0];
        c.cut = tail % (len + 1);
    }
    struct run whole, cut;
    memset(&whole, 0, sizeof(whole));
    whole.stop_rec_after = (h & 4) ? (long)((h >> 4) & 7) : -1;
    whole.stop_second_ns = (h & 8) != 0;
    whole.stop_rec = (h & 0x80) ? STOP_REC : -STOP_REC;
    whole.stop_ns = (h & 0x80) ? STOP_NS : -STOP_NS;
    cut = whole;
    int r1 = decode(body, len, NULL, &whole);
    int r2 = decode(body, len, &c, &cut);
    FZ_CHECK(r1 == r2);
    check_same_runs(&whole, &cut, false);
    if (r1 == 0)
        round_trip(&whole, 1 + (size_t)((h >> 4) & 7) * 37);
    run_free(&whole);
    run_free(&cut);
    return 0;
}
