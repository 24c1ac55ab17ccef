/*
 * POST /route on the indexer port (api/route_route.h; api/codec_route.h has
 * the request, answer and cost). The service it calls, DESIGN:
 * api/slot_service.h.
 *
 *   Without commit the whole request runs inline on the loop thread inside
 *   one RCU read section: parse, hash, index lookup (kvi_index_find_tiered),
 *   tracker projection (kvi_slots_potential_loads), ranking, encoding. No
 *   lock, no hop.
 *   With "commit": true the loop thread computes the index side (overlaps
 *   and tree sizes: the cache state, which engines change independently of
 *   the tracker) and hands the rest to the slot service's mutation thread,
 *   the tracker's only writer: it re-reads the loads, ranks, and records the
 *   /add for the best rank with no other tracker write in between. The
 *   answer shows the loads the choice was made on (before the add).
 *
 *   Per-thread scratch is indexed by the request's loop-thread number and
 *   created by the thread's first /route (the indexer port's thread hooks
 *   belong to api/routes_table.c).
 */
#include <errno.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include "api/codec_route.h"
#include "api/codec_slots.h"
#include "api/route_route.h"
#include "engine/common.h"
#include "engine/hash.h"
#include "engine/index.h"
#include "engine/namespace.h"
#include "engine/rcu.h"

struct rr_thread {
    bool ready;
    struct kvi_scratch scratch;
    struct kvi_buf out;
    uint64_t *content, *seq;
    size_t h_cap;
    struct kvi_tier_match *tm;
    size_t tm_cap;
    struct kvi_slots_potential *pl;
    size_t pl_cap;
    struct kvi_route_cand *c;
    size_t c_cap;
};

struct kvi_route_route {
    struct kvi_slot_service *s;
    struct kvi_service *svc;
    unsigned n_threads;
    struct rr_thread *threads; /* loop threads, by index */
    struct rr_thread commit;   /* the mutation thread's */
};

/* ---- helpers ------------------------------------------------------------------------------------------ */

static void grow(void **p, size_t *cap, size_t want, size_t elem)
{
    if (want <= *cap)
        return;
    *cap = want + want / 2;
    free(*p);
    *p = kvi_xmalloc(*cap * elem);
}

static void send_err(struct kvi_http_res *res, struct rr_thread *t, const struct kvi_api_err *e)
{
    const char *ctype = KVI_MIME_JSON;
    kvi_buf_reset(&t->out);
    if (kvi_slot_encode_err(e, &t->out, &ctype) != 0) {
        kvi_http_error(res, e->status, "%s", e->msg);
        return;
    }
    kvi_http_respond(res, e->status, ctype, t->out.data, t->out.len);
}

static void complete_err(struct kvi_http_deferred *d, const struct kvi_api_err *e)
{
    struct kvi_buf b;
    const char *ctype = KVI_MIME_JSON;
    kvi_buf_init(&b);
    if (kvi_slot_encode_err(e, &b, &ctype) == 0)
        kvi_http_complete(d, e->status, ctype, b.data, b.len);
    else
        kvi_http_complete_error(d, e->status, "%s", e->msg);
    kvi_buf_free(&b);
}

static int no_tracker(struct kvi_api_err *e, const struct kvi_slots_key *key)
{
    struct kvi_slots_err why = {.why = KVI_SLOTS_E_NO_TRACKER};
    return kvi_slot_err_engine(e, &why, key, NULL, 0);
}

/* Candidates from the tracker's projection (sorted by (worker_id, dp_rank)); index fields unknown. */
static void cands_from_loads(struct kvi_route_cand *c, const struct kvi_slots_potential *pl, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        c[i] = (struct kvi_route_cand){
            .worker_id = pl[i].worker_id,
            .dp_rank = pl[i].dp_rank,
            .tree_size = UINT32_MAX, /* not known yet */
            .active_prefill_tokens = pl[i].active_prefill_tokens,
            .potential_decode_blocks = pl[i].potential_decode_blocks,
            .active_requests = pl[i].active_requests,
        };
    }
}

/* First candidate with (worker_id, dp_rank) >= the key (c sorted by both). */
static size_t cand_lower(const struct kvi_route_cand *c, size_t n, uint64_t w, uint32_t r)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c[mid].worker_id < w || (c[mid].worker_id == w && c[mid].dp_rank < r))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/*
 * Fill overlap_blocks and tree_size of every candidate from the index:
 * matched ranks from the tiered lookup, the others' tree sizes from their
 * instance. Inside an RCU read section.
 */
static void index_side(struct rr_thread *t, struct kvi_index *ix, const uint64_t *content, const uint64_t *seq,
                       size_t n_blocks, struct kvi_route_cand *c, size_t n)
{
    size_t n_tm = 0;
    if (n_blocks > 0) {
        n_tm = kvi_index_find_tiered(ix, content, content ? NULL : seq, n_blocks, t->tm, t->tm_cap);
        if (n_tm > t->tm_cap) {
            grow((void **)&t->tm, &t->tm_cap, n_tm, sizeof(*t->tm));
            n_tm = KVI_MIN(kvi_index_find_tiered(ix, content, content ? NULL : seq, n_blocks, t->tm, t->tm_cap),
                           t->tm_cap);
        }
    }
    for (size_t i = 0; i < n_tm; i++) {
        uint64_t id;
        const char *name;
        bool shared;
        if (kvi_index_instance_info(ix, t->tm[i].instance, &id, &name, &shared) != 0 || name != NULL || shared)
            continue; /* Conductor instances and storage pools are not slot-tracker workers */
        size_t k = cand_lower(c, n, id, t->tm[i].dp_rank);
        if (k < n && c[k].worker_id == id && c[k].dp_rank == t->tm[i].dp_rank) {
            c[k].overlap_blocks = t->tm[i].gpu;
            c[k].tree_size = t->tm[i].tree_size;
        }
    }
    /* tree sizes of the ranks without a hit: walk the index's instances (lock-free) */
    uint64_t id;
    const char *name;
    bool shared;
    for (uint32_t d = 0; kvi_index_instance_info(ix, d, &id, &name, &shared) == 0; d++) {
        if (name != NULL || shared)
            continue;
        for (size_t k = cand_lower(c, n, id, 0); k < n && c[k].worker_id == id; k++)
            if (c[k].tree_size == UINT32_MAX)
                c[k].tree_size = kvi_index_tree_size(ix, d, c[k].dp_rank);
    }
    for (size_t k = 0; k < n; k++)
        if (c[k].tree_size == UINT32_MAX)
            c[k].tree_size = 0;
}

/* The tracker's projection for @p seq into t->pl. Inside an RCU read section. @return 0 or -ENOENT. */
static int loads(struct rr_thread *t, const struct kvi_slots *sl, const struct kvi_slots_key *key,
                 const uint64_t *seq, size_t n, size_t *n_out)
{
    int rc;
    while ((rc = kvi_slots_potential_loads(sl, key, seq, n, 0, t->pl, t->pl_cap, n_out)) == -ENOSPC)
        grow((void **)&t->pl, &t->pl_cap, *n_out, sizeof(*t->pl));
    return rc;
}

/* ---- commit: on the mutation thread ---------------------------------------------------------------------- */

struct ov {
    uint64_t worker_id;
    uint32_t dp_rank;
    uint32_t overlap_blocks;
    uint32_t tree_size;
};

struct commit_job {
    struct kvi_slot_job job;
    struct kvi_route_route *rr;
    struct kvi_http_deferred *d;
    struct kvi_route_params p;
    struct kvi_route_answer a;
    struct kvi_slots_key key;
    enum kvi_body_enc enc;
    uint64_t *seq;
    size_t n_blocks;
    struct ov *ov; /* sorted by (worker_id, dp_rank) */
    size_t n_ov;
    alignas(8) char data[];
};

static void run_commit(struct kvi_slot_service *s, struct kvi_slot_job *j, bool stopping)
{
    struct commit_job *cj = (struct commit_job *)j;
    struct rr_thread *t = &cj->rr->commit;
    struct kvi_api_err e;
    if (stopping) {
        kvi_http_complete_error(cj->d, 503, "shutting down");
        free(cj);
        return;
    }
    if (!t->ready) {
        kvi_scratch_init(&t->scratch);
        kvi_buf_init(&t->out);
        t->ready = true;
    }
    struct kvi_slots *sl = kvi_slot_service_slots(s);
    struct kvi_slots_info info;
    size_t n = 0;
    kvi_rcu_read_lock();
    int rc = kvi_slots_tracker_info(sl, &cj->key, &info);
    if (rc == 0 && info.block_size == cj->p.block_size) {
        rc = loads(t, sl, &cj->key, cj->seq, cj->n_blocks, &n);
        if (rc == 0 && n == 0)
            rc = -ENOENT;
    }
    if (rc == 0) {
        grow((void **)&t->c, &t->c_cap, n, sizeof(*t->c));
        cands_from_loads(t->c, t->pl, n);
    }
    kvi_rcu_read_unlock();
    if (rc != 0 || info.block_size != cj->p.block_size) {
        if (rc != 0)
            no_tracker(&e, &cj->key);
        else
            kvi_route_err_block_size(&e, cj->a.model_name, cj->a.tenant_id, cj->p.block_size, info.block_size);
        complete_err(cj->d, &e);
        free(cj);
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) { /* both sorted by (worker_id, dp_rank) */
        struct kvi_route_cand *c = &t->c[i];
        while (k < cj->n_ov && (cj->ov[k].worker_id < c->worker_id ||
                                (cj->ov[k].worker_id == c->worker_id && cj->ov[k].dp_rank < c->dp_rank)))
            k++;
        bool hit = k < cj->n_ov && cj->ov[k].worker_id == c->worker_id && cj->ov[k].dp_rank == c->dp_rank;
        c->overlap_blocks = hit ? cj->ov[k].overlap_blocks : 0;
        c->tree_size = hit ? cj->ov[k].tree_size : 0;
    }
    kvi_route_rank(t->c, n, &cj->p);
    struct kvi_slots_request add = {
        .key = cj->key,
        .request_id = cj->a.request_id.p,
        .request_id_len = cj->a.request_id.len,
        .worker_id = t->c[0].worker_id,
        .dp_rank = t->c[0].dp_rank,
        .hashes = cj->seq,
        .n_hashes = cj->n_blocks,
        .new_isl_tokens = t->c[0].new_prefill_tokens,
    };
    struct kvi_slots_err why = {0};
    rc = kvi_slots_add(sl, &add, &why);
    if (rc != 0) {
        kvi_slot_err_engine(&e, &why, &cj->key, add.request_id, add.request_id_len);
        complete_err(cj->d, &e);
        free(cj);
        return;
    }
    cj->a.committed = true;
    kvi_slot_service_count_route(s, true);
    kvi_buf_reset(&t->out);
    if (kvi_route_encode(&cj->a, &cj->p, t->c, n, cj->enc, &t->out) != 0)
        kvi_http_complete_error(cj->d, 500, "out of memory");
    else
        kvi_http_complete(cj->d, 200, cj->enc == KVI_ENC_MSGPACK ? KVI_MIME_MSGPACK : KVI_MIME_JSON, t->out.data,
                          t->out.len);
    free(cj);
}

static char *put_str(char **p, struct kvi_str s)
{
    char *d = *p;
    if (s.len > 0)
        memcpy(d, s.p, s.len);
    d[s.len] = '\0';
    *p += s.len + 1;
    return d;
}

/* Pack what the mutation thread needs and post it. */
static void post_commit(struct kvi_route_route *rr, struct rr_thread *t, struct kvi_http_res *res,
                        const struct kvi_route_req *q, const struct kvi_route_params *p, size_t n_blocks,
                        const struct kvi_route_cand *c, size_t n, enum kvi_body_enc enc)
{
    size_t n_ov = 0;
    for (size_t i = 0; i < n; i++)
        n_ov += c[i].overlap_blocks > 0 || c[i].tree_size > 0;
    size_t bytes = n_blocks * sizeof(uint64_t) + n_ov * sizeof(struct ov) + q->model_name.len +
                   q->tenant_id.len + q->request_id.len + 3;
    struct commit_job *cj = kvi_xmalloc(sizeof(*cj) + bytes);
    memset(cj, 0, sizeof(*cj));
    cj->job.fn = run_commit;
    cj->rr = rr;
    cj->p = *p;
    cj->enc = enc;
    cj->n_blocks = n_blocks;
    char *d = cj->data;
    cj->seq = (uint64_t *)(void *)d;
    if (n_blocks > 0)
        memcpy(d, t->seq, n_blocks * sizeof(uint64_t));
    d += n_blocks * sizeof(uint64_t);
    cj->ov = (struct ov *)(void *)d;
    for (size_t i = 0, k = 0; i < n; i++) /* c is in tracker order: (worker_id, dp_rank) */
        if (c[i].overlap_blocks > 0 || c[i].tree_size > 0)
            cj->ov[k++] = (struct ov){c[i].worker_id, c[i].dp_rank, c[i].overlap_blocks, c[i].tree_size};
    cj->n_ov = n_ov;
    d += n_ov * sizeof(struct ov);
    char *m = put_str(&d, q->model_name);
    char *tn = put_str(&d, q->tenant_id);
    char *rid = put_str(&d, q->request_id);
    cj->key = (struct kvi_slots_key){m, q->model_name.len, tn, q->tenant_id.len};
    cj->a = (struct kvi_route_answer){.model_name = {m, q->model_name.len},
                                      .tenant_id = {tn, q->tenant_id.len},
                                      .request_id = {rid, q->request_id.len},
                                      .blocks = n_blocks,
                                      .commit = true};
    cj->d = kvi_http_defer(res);
    if (kvi_slot_service_post(rr->s, &cj->job) != 0) {
        kvi_http_complete_error(cj->d, 503, "shutting down");
        free(cj);
    }
}

/* ---- the handler ------------------------------------------------------------------------------------------- */

static struct rr_thread *thread_of(struct kvi_route_route *rr, const struct kvi_http_req *req)
{
    KVI_ASSERT(req->thread < rr->n_threads);
    struct rr_thread *t = &rr->threads[req->thread];
    if (!t->ready) {
        kvi_scratch_init(&t->scratch);
        kvi_buf_init(&t->out);
        t->ready = true;
    }
    return t;
}

/* Room for @p n hashes in t->content and t->seq. */
static void reserve_hashes(struct rr_thread *t, size_t n)
{
    if (n <= t->h_cap && t->content != NULL)
        return;
    t->h_cap = KVI_MAX(n + n / 2, (size_t)64);
    free(t->content);
    free(t->seq);
    t->content = kvi_xmalloc(t->h_cap * sizeof(uint64_t));
    t->seq = kvi_xmalloc(t->h_cap * sizeof(uint64_t));
}

/*
 * Prompt hashes: content hashes (for the index; NULL for sequence-hash
 * input, which the index looks up by seq) and sequence hashes (for the
 * tracker) in t->content / t->seq. @return the number of blocks.
 */
static size_t prompt_hashes(struct rr_thread *t, const struct kvi_route_req *q, uint32_t bs, const uint64_t **content,
                            const uint64_t **seq)
{
    size_t n = q->input == KVI_ROUTE_TOKENS ? q->n_tokens / bs : q->n_hashes;
    reserve_hashes(t, n);
    if (q->input == KVI_ROUTE_SEQ_HASHES) {
        if (n > 0)
            memcpy(t->seq, q->hashes, n * sizeof(uint64_t));
        *content = NULL;
        *seq = t->seq;
        return n;
    }
    if (q->input == KVI_ROUTE_TOKENS) {
        uint64_t seed = kvi_hash_seed(q->lora_name.p, q->lora_name.len, NULL, 0);
        kvi_hash_blocks(q->token_ids, q->n_tokens, bs, seed, t->content, t->h_cap);
    } else if (n > 0) {
        memcpy(t->content, q->hashes, n * sizeof(uint64_t));
    }
    if (n > 0)
        kvi_seq_hashes(t->content, n, t->seq);
    *content = t->content;
    *seq = t->seq;
    return n;
}

static void h_route(const struct kvi_http_req *req, struct kvi_http_res *res, void *ud)
{
    struct kvi_route_route *rr = ud;
    struct rr_thread *t = thread_of(rr, req);
    struct kvi_route_req q;
    struct kvi_api_err e;
    enum kvi_ctype ct = kvi_ctype_of(req->content_type.p, req->content_type.len);
    enum kvi_body_enc enc =
        ct == KVI_CT_MSGPACK || kvi_accepts_msgpack(req->accept.p, req->accept.len) ? KVI_ENC_MSGPACK : KVI_ENC_JSON;
    if (kvi_route_parse(req->body, req->body_len, ct, &t->scratch, &q, &e) != 0) {
        send_err(res, t, &e);
        goto out;
    }
    char *m = kvi_scratch_strdup(&t->scratch, q.model_name.p, q.model_name.len);
    char *tn = kvi_scratch_strdup(&t->scratch, q.tenant_id.p, q.tenant_id.len);
    if (m == NULL || tn == NULL) {
        kvi_http_error(res, 500, "out of memory");
        goto out;
    }
    struct kvi_slots_key key = {m, q.model_name.len, tn, q.tenant_id.len};
    const struct kvi_slots *sl = kvi_slot_service_slots(rr->s);
    struct kvi_slots_info info;
    size_t n = 0, n_blocks = 0;
    kvi_rcu_read_lock();
    if (kvi_slots_tracker_info(sl, &key, &info) != 0) {
        kvi_rcu_read_unlock();
        no_tracker(&e, &key);
        send_err(res, t, &e);
        goto out;
    }
    uint32_t bs = info.block_size;
    struct kvi_ns *ns = kvi_nsreg_find(kvi_service_nsreg(rr->svc), m, tn);
    if (ns != NULL && ns->block_size != bs) {
        uint32_t ibs = ns->block_size;
        kvi_rcu_read_unlock();
        kvi_route_err_block_size(&e, q.model_name, q.tenant_id, ibs, bs);
        send_err(res, t, &e);
        goto out;
    }
    const uint64_t *content, *seq;
    n_blocks = prompt_hashes(t, &q, bs, &content, &seq);
    if (loads(t, sl, &key, seq, n_blocks, &n) != 0 || n == 0) { /* unregistered meanwhile */
        kvi_rcu_read_unlock();
        no_tracker(&e, &key);
        send_err(res, t, &e);
        goto out;
    }
    grow((void **)&t->c, &t->c_cap, n, sizeof(*t->c));
    cands_from_loads(t->c, t->pl, n);
    if (ns != NULL) {
        index_side(t, ns->ix, content, seq, n_blocks, t->c, n);
    } else {
        for (size_t i = 0; i < n; i++)
            t->c[i].tree_size = 0;
    }
    kvi_rcu_read_unlock();
    struct kvi_route_params p = {
        .block_size = bs,
        .new_isl_tokens = q.has_isl ? q.new_isl_tokens
                                    : (q.input == KVI_ROUTE_TOKENS ? q.n_tokens : (uint64_t)n_blocks * bs),
        .overlap_weight = q.overlap_weight,
        .decode_weight = q.decode_weight,
    };
    if (q.commit && !kvi_slot_service_commit_allowed(rr->s, req)) {
        kvi_http_add_header(res, "www-authenticate", "Bearer");
        kvi_http_error(res, 401, "/route with \"commit\": true needs the data token (Authorization: Bearer ...)");
        goto out;
    }
    if (q.commit) {
        post_commit(rr, t, res, &q, &p, n_blocks, t->c, n, enc);
        goto out;
    }
    kvi_route_rank(t->c, n, &p);
    struct kvi_route_answer a = {.model_name = q.model_name, .tenant_id = q.tenant_id, .blocks = n_blocks};
    kvi_buf_reset(&t->out);
    if (kvi_route_encode(&a, &p, t->c, n, enc, &t->out) != 0) {
        kvi_http_error(res, 500, "out of memory");
        goto out;
    }
    kvi_http_respond(res, 200, enc == KVI_ENC_MSGPACK ? KVI_MIME_MSGPACK : KVI_MIME_JSON, t->out.data, t->out.len);
    kvi_slot_service_count_route(rr->s, false);
out:
    kvi_scratch_reset(&t->scratch);
}

/* ---- lifetime ------------------------------------------------------------------------------------------------- */

struct kvi_route_route *kvi_route_route_create(struct kvi_slot_service *s, struct kvi_service *svc,
                                               unsigned n_threads)
{
    struct kvi_route_route *rr = kvi_xcalloc(1, sizeof(*rr));
    rr->s = s;
    rr->svc = svc;
    rr->n_threads = n_threads ? n_threads : 1;
    rr->threads = kvi_xcalloc(rr->n_threads, sizeof(*rr->threads));
    return rr;
}

int kvi_route_route_mount(struct kvi_route_route *rr, struct kvi_http_server *srv, size_t body_limit)
{
    struct kvi_http_route_opts o = {body_limit, 0};
    int rc = kvi_http_server_route(srv, KVI_HTTP_POST, "/route", h_route, rr, &o);
    return rc < 0 ? rc : 0;
}

static void thread_free(struct rr_thread *t)
{
    if (t->ready) {
        kvi_scratch_free(&t->scratch);
        kvi_buf_free(&t->out);
    }
    free(t->content);
    free(t->seq);
    free(t->tm);
    free(t->pl);
    free(t->c);
    memset(t, 0, sizeof(*t));
}

void kvi_route_route_free(struct kvi_route_route *rr)
{
    if (rr == NULL)
        return;
    for (unsigned i = 0; i < rr->n_threads; i++)
        thread_free(&rr->threads[i]);
    free(rr->threads);
    thread_free(&rr->commit); /* the mutation thread has exited */
    free(rr);
}
