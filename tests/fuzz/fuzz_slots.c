/*
 * Fuzz target: the request parsers of the slot-tracker port
 * (api/codec_slots.h: /register, /unregister, /add, /prefill_complete and
 * /free, /potential_loads, /register_peer and /deregister_peer, the
 * /workers and /loads query string, the replica-sync batch) and of POST
 * /route (api/codec_route.h), plus the answers built from what they parsed:
 * the engine's error texts, the slot encoders, and /route's ranking and
 * response.
 *
 * INPUT: byte 0 selects what runs, the rest is the body (or query string).
 *   bits 0-3  the parser (enum op below, modulo OP_COUNT)
 *   bits 4-5  the Content-Type class (KVI_CT_NONE, JSON, MSGPACK, OTHER)
 *   bits 6-7  msgpack header widths of the transcoded twin (fuzz_body.h):
 *             bit 6 = every int 64-bit, bit 7 = every length 32-bit
 *   OP_RANK reads its input as raw parameters instead (run_rank).
 *
 * CHECKS (besides ASan + UBSan):
 *   - the return is 0 or -EINVAL (no -ENOMEM on small bodies); a
 *     Content-Type the route does not take is 415;
 *   - failure: the status is 400, 415 or 422, the message is set, and
 *     kvi_slot_encode_err gives valid JSON (UTF-8 included);
 *   - success: the documented guarantees of the parsed struct ("default"
 *     tenants, lifecycle requests without worker or hashes, exactly one
 *     /route prompt form, finite weights >= 0, commit only with a
 *     request_id, array lengths bounded by the body) and every string and
 *     array readable in full;
 *   - determinism: parsing again after kvi_scratch_reset gives the same
 *     result;
 *   - JSON and msgpack agree (/route and the replica batch, the two that
 *     take both): a JSON body's exact msgpack twin parses to the same
 *     return, status and fields;
 *   - answers: every engine error (kvi_slot_err_engine) and /route's
 *     block-size conflict quoting the parsed strings encode to valid JSON;
 *     the slot encoders (/workers, /loads, /peers) and /route's response in
 *     both encodings are valid documents that give the parsed strings back;
 *     /route's ranking is sorted and follows codec_route.h's COST; a
 *     replica batch written the way senders write it (msgpack) parses back
 *     to the same events.
 */
#include <errno.h>
#include <math.h>

#include "api/codec_route.h"
#include "api/codec_slots.h"
#include "fuzz.h"
#include "fuzz_body.h"

enum op {
    OP_REGISTER,
    OP_UNREGISTER,
    OP_ADD,
    OP_LIFECYCLE,
    OP_POTENTIAL,
    OP_PEER,
    OP_FILTER, /* the query string of GET /workers and /loads */
    OP_ROUTE,
    OP_REPLICA,
    OP_RANK, /* kvi_route_rank + kvi_route_encode on raw parameters */
    OP_COUNT
};

struct replica {
    struct kvi_str source;
    struct kvi_slots_event *evs; /* malloc'd */
    size_t n;
};

union parsed {
    struct kvi_slot_register reg;
    struct kvi_slot_unregister unreg;
    struct kvi_slots_request req; /* add, lifecycle */
    struct kvi_slot_potential pot;
    struct kvi_str url;
    struct kvi_route_req route;
    struct replica rep;
};

/* The most elements a body of @p len bytes can hold: one byte each (JSON
 * digits and commas, msgpack fixints), or 4 / 8 bytes each in a bin. */
static bool count_ok(size_t n, size_t len)
{
    return n <= len;
}

/* ---- answers built from parsed strings ---------------------------------------------- */

/* An error answer of the slot port (and /route): JSON, valid UTF-8. */
static void check_slot_error(int rc, const struct kvi_api_err *e)
{
    FZ_CHECK(rc == -EINVAL);
    FZ_CHECK(memchr(e->msg, '\0', sizeof(e->msg)) != NULL && e->msg[0] != '\0');
    struct kvi_buf b;
    kvi_buf_init(&b);
    const char *ct = NULL;
    FZ_CHECK(kvi_slot_encode_err(e, &b, &ct) == 0);
    FZ_CHECK(ct != NULL && strcmp(ct, KVI_MIME_JSON) == 0);
    fz_check_doc(&b, KVI_ENC_JSON);
    kvi_buf_free(&b);
}

/* Every engine failure for a request on @p key (and request id @p rid). */
static void check_engine_errors(const struct kvi_slots_key *key, const char *rid, size_t rid_len)
{
    for (int i = KVI_SLOTS_E_BLOCK_SIZE; i <= KVI_SLOTS_E_TOO_MANY_RANKS; i++) {
        struct kvi_slots_err why = {.why = (enum kvi_slots_why)i,
                                    .worker_id = UINT64_MAX,
                                    .dp_rank = UINT32_MAX,
                                    .dp_start = UINT32_MAX,
                                    .dp_size = UINT32_MAX,
                                    .ranks = UINT32_MAX,
                                    .max_ranks = UINT32_MAX,
                                    .existing_block_size = UINT32_MAX,
                                    .requested_block_size = UINT32_MAX};
        struct kvi_api_err e;
        int rc = kvi_slot_err_engine(&e, &why, key, rid, rid_len);
        FZ_CHECK(e.status == 400 || e.status == 404 || e.status == 409);
        check_slot_error(rc, &e);
    }
}

static bool same_bytes(struct kvi_str a, const char *p, size_t n)
{
    return a.len == n && (n == 0 || memcmp(a.p, p, n) == 0);
}

/* The string under @p key in the top-level object of a document (@p arr: in
 * the first element of a top-level array). @return true when found. */
static bool doc_str(const struct kvi_buf *b, enum kvi_body_enc enc, bool arr, const char *key,
                    struct kvi_scratch *s, struct kvi_str *out)
{
    struct kvi_rd rd;
    struct kvi_str k;
    kvi_rd_init(&rd, b->data, b->len, enc, s);
    if (arr && (kvi_rd_arr_begin(&rd) != 0 || kvi_rd_arr_next(&rd) != 1))
        return false;
    if (kvi_rd_obj_begin(&rd) != 0)
        return false;
    while (kvi_rd_obj_next(&rd, &k) == 1) {
        if (fz_kstr_is(k, key))
            return kvi_rd_str(&rd, out) == 0;
        if (kvi_rd_skip(&rd) != 0)
            return false;
    }
    return false;
}

/* The (model, tenant) of @p key must come back from the first element of an
 * encoded array. */
static void check_key_echo(const struct kvi_buf *b, enum kvi_body_enc enc, bool arr,
                           const struct kvi_slots_key *key)
{
    struct kvi_scratch s;
    kvi_scratch_init(&s);
    struct kvi_str m, t;
    FZ_CHECK(doc_str(b, enc, arr, "model_name", &s, &m));
    FZ_CHECK(same_bytes(m, key->model, key->model_len));
    FZ_CHECK(doc_str(b, enc, arr, "tenant_id", &s, &t));
    FZ_CHECK(same_bytes(t, key->tenant, key->tenant_len));
    kvi_scratch_free(&s);
}

/* GET /workers with the registered worker, GET /loads with a load on @p key. */
static void check_slot_encoders(const struct kvi_slots_key *key, const struct kvi_slot_register *r)
{
    struct kvi_buf b;
    kvi_buf_init(&b);
    if (r != NULL) {
        struct kvi_slots_worker w = {.model = key->model,
                                     .model_len = key->model_len,
                                     .tenant = key->tenant,
                                     .tenant_len = key->tenant_len,
                                     .worker_id = r->worker_id,
                                     .block_size = r->block_size,
                                     .dp_start = r->dp_start,
                                     .dp_size = r->dp_size};
        FZ_CHECK(kvi_slot_encode_workers(&w, 1, &b) == 0);
        fz_check_doc_of(&b, KVI_ENC_JSON, false);
        check_key_echo(&b, KVI_ENC_JSON, true, key);
        kvi_buf_reset(&b);
    }
    struct kvi_slots_load l = {.model = key->model,
                               .model_len = key->model_len,
                               .tenant = key->tenant,
                               .tenant_len = key->tenant_len,
                               .worker_id = UINT64_MAX,
                               .dp_rank = UINT32_MAX,
                               .active_prefill_tokens = UINT64_MAX,
                               .active_decode_blocks = UINT64_MAX,
                               .active_requests = UINT64_MAX};
    FZ_CHECK(kvi_slot_encode_loads(&l, 1, &b) == 0);
    fz_check_doc_of(&b, KVI_ENC_JSON, false);
    check_key_echo(&b, KVI_ENC_JSON, true, key);
    kvi_buf_free(&b);
}

/* ---- /route: ranking and the response --------------------------------------------- */

/* codec_route.h COST, recomputed for one candidate. */
static void check_cost(const struct kvi_route_cand *x, const struct kvi_route_params *p)
{
    uint64_t bs = p->block_size ? p->block_size : 1;
    unsigned __int128 cached = (unsigned __int128)x->overlap_blocks * bs;
    uint64_t np = cached >= p->new_isl_tokens ? 0 : p->new_isl_tokens - (uint64_t)cached;
    FZ_CHECK(x->new_prefill_tokens == np);
    unsigned __int128 sum = (unsigned __int128)x->active_prefill_tokens + np;
    FZ_CHECK(x->potential_prefill_tokens == (sum > UINT64_MAX ? UINT64_MAX : (uint64_t)sum));
    FZ_CHECK(!isnan(x->cost) && x->cost >= 0);
}

/* Rank @p c, check the order, encode the answer in both encodings and read
 * it back. */
static void check_ranked(struct kvi_route_cand *c, size_t n, const struct kvi_route_params *p,
                         const struct kvi_route_answer *a)
{
    kvi_route_rank(c, n, p);
    for (size_t i = 0; i < n; i++) {
        check_cost(&c[i], p);
        if (i == 0)
            continue;
        const struct kvi_route_cand *x = &c[i - 1], *y = &c[i];
        FZ_CHECK(x->cost <= y->cost);
        if (x->cost == y->cost) {
            FZ_CHECK(x->tree_size <= y->tree_size);
            if (x->tree_size == y->tree_size)
                FZ_CHECK(x->worker_id < y->worker_id ||
                         (x->worker_id == y->worker_id && x->dp_rank <= y->dp_rank));
        }
    }
    for (int enc = KVI_ENC_JSON; enc <= KVI_ENC_MSGPACK; enc++) {
        struct kvi_buf b;
        kvi_buf_init(&b);
        FZ_CHECK(kvi_route_encode(a, p, c, n, (enum kvi_body_enc)enc, &b) == 0);
        fz_check_doc(&b, (enum kvi_body_enc)enc);
        struct kvi_scratch s;
        kvi_scratch_init(&s);
        struct kvi_str v;
        FZ_CHECK(doc_str(&b, (enum kvi_body_enc)enc, false, "model_name", &s, &v));
        FZ_CHECK(same_bytes(v, a->model_name.p, a->model_name.len));
        FZ_CHECK(doc_str(&b, (enum kvi_body_enc)enc, false, "tenant_id", &s, &v));
        FZ_CHECK(same_bytes(v, a->tenant_id.p, a->tenant_id.len));
        bool rid = doc_str(&b, (enum kvi_body_enc)enc, false, "request_id", &s, &v);
        FZ_CHECK(rid == a->commit);
        if (rid)
            FZ_CHECK(same_bytes(v, a->request_id.p, a->request_id.len));
        kvi_scratch_free(&s);
        kvi_buf_free(&b);
    }
}

/* A parsed /route request, answered with a few made-up ranks (values from
 * @p seed, extremes included). */
static void check_route_answer(const struct kvi_route_req *q, uint64_t seed)
{
    struct kvi_api_err e;
    check_slot_error(kvi_route_err_block_size(&e, q->model_name, q->tenant_id, 1, UINT32_MAX), &e);
    FZ_CHECK(e.status == 409);
    struct kvi_route_cand c[4];
    size_t n = 1 + seed % 4;
    uint64_t rng = seed;
    for (size_t i = 0; i < n; i++) {
        bool big = fz_rng(&rng) & 1;
        c[i] = (struct kvi_route_cand){
            .worker_id = fz_rng(&rng) % 3,
            .dp_rank = (uint32_t)(fz_rng(&rng) % 2),
            .overlap_blocks = (uint32_t)fz_rng(&rng),
            .tree_size = (uint32_t)(fz_rng(&rng) % 3),
            .active_prefill_tokens = big ? UINT64_MAX - fz_rng(&rng) % 4 : fz_rng(&rng) % 1000,
            .potential_decode_blocks = big ? UINT64_MAX : fz_rng(&rng) % 1000,
            .active_requests = fz_rng(&rng)};
    }
    uint64_t blocks = q->input == KVI_ROUTE_TOKENS ? q->n_tokens / 16 : q->n_hashes;
    struct kvi_route_params p = {
        .block_size = (uint32_t)(1 + fz_rng(&rng) % 64),
        .new_isl_tokens = q->has_isl ? q->new_isl_tokens : q->n_tokens,
        .overlap_weight = q->overlap_weight,
        .decode_weight = q->decode_weight,
    };
    struct kvi_route_answer a = {.model_name = q->model_name,
                                 .tenant_id = q->tenant_id,
                                 .request_id = q->request_id,
                                 .blocks = blocks,
                                 .commit = q->commit,
                                 .committed = q->commit && (seed & 1)};
    check_ranked(c, n, &p, &a);
}

/* OP_RANK: the input is the parameters themselves: block_size (4 bytes),
 * new_isl_tokens (8), the two weights (8 bytes each: a double's bits, made
 * finite and >= 0 as the parser guarantees), then 36 bytes per candidate. */
static void run_rank(const uint8_t *data, size_t size)
{
    struct fz_in in = {data, size};
    struct kvi_route_params p;
    p.block_size = (uint32_t)fz_u64(&in, 4);
    p.new_isl_tokens = fz_u64(&in, 8);
    double w[2];
    for (int i = 0; i < 2; i++) {
        uint64_t bits = fz_u64(&in, 8);
        memcpy(&w[i], &bits, sizeof(w[i]));
        if (!isfinite(w[i]))
            w[i] = 0;
        w[i] = fabs(w[i]);
    }
    p.overlap_weight = w[0];
    p.decode_weight = w[1];
    struct kvi_route_cand c[16];
    size_t n = 0;
    do {
        c[n] = (struct kvi_route_cand){.worker_id = fz_u64(&in, 8),
                                       .dp_rank = (uint32_t)fz_u64(&in, 4),
                                       .overlap_blocks = (uint32_t)fz_u64(&in, 4),
                                       .tree_size = (uint32_t)fz_u64(&in, 4),
                                       .active_prefill_tokens = fz_u64(&in, 8),
                                       .potential_decode_blocks = fz_u64(&in, 4),
                                       .active_requests = fz_u64(&in, 4)};
        n++;
    } while (in.n > 0 && n < 16);
    struct kvi_route_answer a = {.model_name = {"m", 1}, .tenant_id = {"default", 7}};
    check_ranked(c, n, &p, &a);
}

/* ---- checks of parsed values ---------------------------------------------------------- */

static void dig_key(struct fz_dig *d, const struct kvi_slots_key *k, size_t len)
{
    FZ_CHECK(k->model_len == 0 || k->model != NULL);
    FZ_CHECK(k->model_len <= len);
    /* tenant_id: given, or "default" */
    FZ_CHECK(k->tenant != NULL);
    FZ_CHECK(k->tenant_len <= len || (k->tenant_len == 7 && memcmp(k->tenant, "default", 7) == 0));
    fz_dig_bytes(d, k->model, k->model_len);
    fz_dig_bytes(d, k->tenant, k->tenant_len);
}

static void dig_hashes(struct fz_dig *d, const uint64_t *h, size_t n, size_t len)
{
    FZ_CHECK(count_ok(n, len) && (n == 0 || h != NULL));
    fz_dig_bytes(d, h, n * sizeof(*h));
}

static void dig_request(struct fz_dig *d, const struct kvi_slots_request *r, size_t len)
{
    dig_key(d, &r->key, len);
    FZ_CHECK(r->request_id_len == 0 || r->request_id != NULL);
    FZ_CHECK(r->request_id_len <= len);
    fz_dig_bytes(d, r->request_id, r->request_id_len);
    fz_dig_u64(d, r->worker_id);
    fz_dig_u64(d, r->dp_rank);
    fz_dig_u64(d, r->new_isl_tokens);
    dig_hashes(d, r->hashes, r->n_hashes, len);
}

static void dig_f64(struct fz_dig *d, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof(bits));
    fz_dig_u64(d, bits);
}

static uint64_t check_route(const struct kvi_route_req *q, size_t len)
{
    struct fz_dig d;
    fz_dig_init(&d);
    fz_dig_kstr(&d, q->model_name);
    FZ_CHECK(q->tenant_id.p != NULL); /* given, or "default" */
    fz_dig_kstr(&d, q->tenant_id);
    fz_dig_kstr(&d, q->lora_name);
    FZ_CHECK(q->has_request_id || q->request_id.len == 0);
    FZ_CHECK(!q->commit || q->has_request_id);
    fz_dig_u64(&d, q->has_request_id);
    fz_dig_kstr(&d, q->request_id);
    FZ_CHECK(q->input <= KVI_ROUTE_SEQ_HASHES);
    fz_dig_u64(&d, q->input);
    if (q->input == KVI_ROUTE_TOKENS) {
        FZ_CHECK(q->n_hashes == 0);
        FZ_CHECK(count_ok(q->n_tokens, len) && (q->n_tokens == 0 || q->token_ids != NULL));
        fz_dig_bytes(&d, q->token_ids, q->n_tokens * sizeof(uint32_t));
    } else {
        FZ_CHECK(q->n_tokens == 0);
        dig_hashes(&d, q->hashes, q->n_hashes, len);
    }
    FZ_CHECK(isfinite(q->overlap_weight) && q->overlap_weight >= 0);
    FZ_CHECK(isfinite(q->decode_weight) && q->decode_weight >= 0);
    dig_f64(&d, q->overlap_weight);
    dig_f64(&d, q->decode_weight);
    fz_dig_u64(&d, q->has_isl);
    fz_dig_u64(&d, q->has_isl ? q->new_isl_tokens : 0);
    fz_dig_u64(&d, q->commit);
    return d.h;
}

static uint64_t check_replica(const struct replica *r, size_t len)
{
    struct fz_dig d;
    fz_dig_init(&d);
    FZ_CHECK(count_ok(r->n, len) && (r->n == 0 || r->evs != NULL));
    fz_dig_kstr(&d, r->source);
    fz_dig_u64(&d, r->n);
    for (size_t i = 0; i < r->n; i++) {
        const struct kvi_slots_event *ev = &r->evs[i];
        FZ_CHECK(ev->type <= KVI_SLOTS_EV_FREE);
        fz_dig_u64(&d, ev->type);
        fz_dig_u64(&d, ev->block_size);
        dig_request(&d, &ev->req, len);
    }
    return d.h;
}

/* Check the guarantees of a successful parse; @return its digest. */
static uint64_t check_parsed(enum op op, const union parsed *o, size_t len)
{
    struct fz_dig d;
    fz_dig_init(&d);
    switch (op) {
    case OP_REGISTER:
        dig_key(&d, &o->reg.key, len);
        fz_dig_u64(&d, o->reg.worker_id);
        fz_dig_u64(&d, o->reg.block_size);
        fz_dig_u64(&d, o->reg.dp_start);
        fz_dig_u64(&d, o->reg.dp_size);
        break;
    case OP_UNREGISTER:
        dig_key(&d, &o->unreg.key, len);
        fz_dig_u64(&d, o->unreg.worker_id);
        break;
    case OP_ADD: dig_request(&d, &o->req, len); break;
    case OP_LIFECYCLE:
        /* worker, rank and hashes zero */
        FZ_CHECK(o->req.worker_id == 0 && o->req.dp_rank == 0 && o->req.n_hashes == 0 &&
                 o->req.hashes == NULL && o->req.new_isl_tokens == 0);
        dig_request(&d, &o->req, len);
        break;
    case OP_POTENTIAL:
        dig_key(&d, &o->pot.key, len);
        dig_hashes(&d, o->pot.hashes, o->pot.n_hashes, len);
        fz_dig_u64(&d, o->pot.new_isl_tokens);
        break;
    case OP_PEER:
        FZ_CHECK(o->url.len <= len);
        fz_dig_kstr(&d, o->url);
        break;
    case OP_ROUTE: return check_route(&o->route, len);
    case OP_REPLICA: return check_replica(&o->rep, len);
    default: fz_fail(__FILE__, __LINE__, "not a body parser");
    }
    return d.h;
}

/* ---- answers for a request that parsed ----------------------------------------------- */

static void parse_replica(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                          struct replica *r, struct kvi_api_err *e, int *rc)
{
    *rc = kvi_slot_parse_replica(body, len, ct, s, &r->source, &r->evs, &r->n, e);
}

/* Write @p r as a sender does (api/slot_service.c: msgpack, every field of
 * the event's type) into @p b. */
static void encode_replica(const struct replica *r, struct kvi_buf *b)
{
    static const char *const names[] = {"add", "prefill_complete", "free"};
    struct kvi_wr w;
    kvi_wr_init(&w, b, KVI_ENC_MSGPACK);
    kvi_wr_obj(&w, 2);
    kvi_wr_keyz(&w, "source");
    kvi_wr_str(&w, r->source.p, r->source.len);
    kvi_wr_keyz(&w, "events");
    kvi_wr_arr(&w, (uint32_t)r->n);
    for (size_t i = 0; i < r->n; i++) {
        const struct kvi_slots_event *ev = &r->evs[i];
        const struct kvi_slots_request *q = &ev->req;
        kvi_wr_obj(&w, 9);
        kvi_wr_keyz(&w, "type");
        kvi_wr_strz(&w, names[ev->type]);
        kvi_wr_keyz(&w, "model_name");
        kvi_wr_str(&w, q->key.model, q->key.model_len);
        kvi_wr_keyz(&w, "tenant_id");
        kvi_wr_str(&w, q->key.tenant, q->key.tenant_len);
        kvi_wr_keyz(&w, "block_size");
        kvi_wr_u64(&w, ev->block_size);
        kvi_wr_keyz(&w, "request_id");
        kvi_wr_str(&w, q->request_id, q->request_id_len);
        kvi_wr_keyz(&w, "worker_id");
        kvi_wr_u64(&w, q->worker_id);
        kvi_wr_keyz(&w, "dp_rank");
        kvi_wr_u64(&w, q->dp_rank);
        kvi_wr_keyz(&w, "sequence_hashes");
        kvi_wr_arr(&w, (uint32_t)q->n_hashes);
        for (size_t j = 0; j < q->n_hashes; j++)
            kvi_wr_i64(&w, (int64_t)q->hashes[j]);
        kvi_wr_end(&w);
        kvi_wr_keyz(&w, "new_isl_tokens");
        kvi_wr_u64(&w, q->new_isl_tokens);
        kvi_wr_end(&w);
    }
    kvi_wr_end(&w);
    kvi_wr_end(&w);
    FZ_CHECK(kvi_buf_ok(b));
}

static void check_replica_answers(const struct replica *r, uint64_t dig)
{
    /* the engine's texts for the first few events */
    for (size_t i = 0; i < r->n && i < 4; i++)
        check_engine_errors(&r->evs[i].req.key, r->evs[i].req.request_id,
                            r->evs[i].req.request_id_len);
    /* a sender's msgpack of the same events parses to the same events */
    struct kvi_buf b;
    kvi_buf_init(&b);
    encode_replica(r, &b);
    char *copy = fz_dup(b.data, b.len, false);
    struct kvi_scratch s;
    kvi_scratch_init(&s);
    struct replica again;
    struct kvi_api_err e;
    int rc;
    parse_replica(copy, b.len, KVI_CT_MSGPACK, &s, &again, &e, &rc);
    FZ_CHECK(rc == 0 && again.n == r->n);
    FZ_CHECK(check_replica(&again, b.len) == dig);
    free(again.evs);
    kvi_scratch_free(&s);
    free(copy);
    kvi_buf_free(&b);
}

static void check_answers(enum op op, const union parsed *o, uint64_t dig)
{
    switch (op) {
    case OP_REGISTER:
        check_engine_errors(&o->reg.key, NULL, 0);
        check_slot_encoders(&o->reg.key, &o->reg);
        break;
    case OP_UNREGISTER:
        check_engine_errors(&o->unreg.key, NULL, 0);
        check_slot_encoders(&o->unreg.key, NULL);
        break;
    case OP_ADD:
    case OP_LIFECYCLE:
        check_engine_errors(&o->req.key, o->req.request_id, o->req.request_id_len);
        check_slot_encoders(&o->req.key, NULL);
        break;
    case OP_POTENTIAL:
        check_engine_errors(&o->pot.key, NULL, 0);
        check_slot_encoders(&o->pot.key, NULL);
        break;
    case OP_PEER: {
        char *u = fz_dup(o->url.p, o->url.len, true);
        const char *urls[2] = {u, "http://127.0.0.1:8091"};
        struct kvi_buf b;
        kvi_buf_init(&b);
        FZ_CHECK(kvi_slot_encode_peers(urls, 2, &b) == 0);
        fz_check_doc_of(&b, KVI_ENC_JSON, false);
        kvi_buf_free(&b);
        free(u);
        break;
    }
    case OP_ROUTE: check_route_answer(&o->route, dig); break;
    case OP_REPLICA: check_replica_answers(&o->rep, dig); break;
    default: break;
    }
}

/* ---- running a parser ------------------------------------------------------------------ */

struct result {
    int rc;
    int status;
    uint64_t dig;
};

static int call_parser(enum op op, const void *body, size_t len, enum kvi_ctype ct,
                       struct kvi_scratch *s, union parsed *o, struct kvi_api_err *e)
{
    int rc;
    switch (op) {
    case OP_REGISTER: return kvi_slot_parse_register(body, len, ct, s, &o->reg, e);
    case OP_UNREGISTER: return kvi_slot_parse_unregister(body, len, ct, s, &o->unreg, e);
    case OP_ADD: return kvi_slot_parse_add(body, len, ct, s, &o->req, e);
    case OP_LIFECYCLE: return kvi_slot_parse_lifecycle(body, len, ct, s, &o->req, e);
    case OP_POTENTIAL: return kvi_slot_parse_potential(body, len, ct, s, &o->pot, e);
    case OP_PEER: return kvi_slot_parse_peer(body, len, ct, s, &o->url, e);
    case OP_ROUTE: return kvi_route_parse(body, len, ct, s, &o->route, e);
    case OP_REPLICA: parse_replica(body, len, ct, s, &o->rep, e, &rc); return rc;
    default: fz_fail(__FILE__, __LINE__, "not a body parser");
    }
}

/* Parse, check, and reduce the outcome to a comparable result; with
 * @p answers, also check the answers built from a successful parse. */
static void run_parser(enum op op, const void *body, size_t len, enum kvi_ctype ct,
                       struct kvi_scratch *s, bool answers, struct result *res)
{
    union parsed o;
    struct kvi_api_err e;
    memset(res, 0, sizeof(*res));
    memset(&o, 0, sizeof(o));
    kvi_scratch_reset(s);
    res->rc = call_parser(op, body, len, ct, s, &o, &e);
    bool both = op == OP_ROUTE || op == OP_REPLICA; /* JSON and msgpack */
    bool ct_ok = ct == KVI_CT_JSON || (both && ct == KVI_CT_MSGPACK);
    if (res->rc == 0) {
        FZ_CHECK(ct_ok);
        res->dig = check_parsed(op, &o, len);
        if (answers)
            check_answers(op, &o, res->dig);
    } else {
        FZ_CHECK(res->rc == -EINVAL);
        FZ_CHECK(e.status == 400 || e.status == 415 || e.status == 422);
        FZ_CHECK((e.status == 415) == !ct_ok);
        check_slot_error(res->rc, &e);
        res->status = e.status;
    }
    if (op == OP_REPLICA) {
        FZ_CHECK(res->rc != 0 || o.rep.n == 0 || o.rep.evs != NULL);
        free(o.rep.evs);
    }
}

static bool same_result(const struct result *a, const struct result *b)
{
    return a->rc == b->rc && a->status == b->status && a->dig == b->dig;
}

/* GET /workers and /loads filters: the slot form of the Dynamo parser. */
static void run_filter(const uint8_t *q, size_t len, struct kvi_scratch *s)
{
    struct kvi_slots_key k;
    struct kvi_dyn_workers_filter f;
    struct kvi_api_err e;
    kvi_scratch_reset(s);
    FZ_CHECK(kvi_dyn_parse_workers_filter((const char *)q, len, s, &f, &e) == 0);
    FZ_CHECK(kvi_slot_parse_filter((const char *)q, len, s, &k, &e) == 0);
    /* absent = NULL (match all); present, even empty = non-NULL */
    FZ_CHECK((k.model != NULL) == f.has_model && (k.tenant != NULL) == f.has_tenant);
    if (f.has_model)
        FZ_CHECK(same_bytes(f.model_name, k.model, k.model_len));
    if (f.has_tenant)
        FZ_CHECK(same_bytes(f.tenant_id, k.tenant, k.tenant_len));
    FZ_CHECK(k.model_len <= len && k.tenant_len <= len);
}

/* ---- entry point ---------------------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    uint8_t sel = data[0];
    enum op op = (enum op)((sel & 15) % OP_COUNT);
    enum kvi_ctype ct = (enum kvi_ctype)((sel >> 4) & 3);
    const uint8_t *body = data + 1;
    size_t len = size - 1;
    if (op == OP_RANK) {
        run_rank(body, len);
        return 0;
    }
    struct kvi_scratch s;
    kvi_scratch_init(&s);
    if (op == OP_FILTER) {
        run_filter(body, len, &s);
    } else {
        struct result a, b;
        run_parser(op, body, len, ct, &s, true, &a);
        run_parser(op, body, len, ct, &s, false, &b);
        FZ_CHECK(same_result(&a, &b));
        /* /route and replica batches take msgpack too: a JSON body and its
         * exact msgpack twin must agree */
        struct kvi_buf mp;
        kvi_buf_init(&mp);
        if (ct == KVI_CT_JSON && (op == OP_ROUTE || op == OP_REPLICA) &&
            fz_transcode(body, len, (uint8_t)(sel >> 6), &mp)) {
            char *twin = fz_dup(mp.data, mp.len, false);
            run_parser(op, twin, mp.len, KVI_CT_MSGPACK, &s, false, &b);
            if (!same_result(&a, &b))
                fprintf(stderr, "json: rc %d status %d\nmpk:  rc %d status %d\n", a.rc, a.status,
                        b.rc, b.status);
            FZ_CHECK(same_result(&a, &b));
            free(twin);
        }
        kvi_buf_free(&mp);
    }
    kvi_scratch_free(&s);
    return 0;
}
