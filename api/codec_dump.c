/*
 * GET /dump codec (api/codec_dump.h): incremental encoder and streaming
 * decoder of the Dynamo dump body (http-api.md §1.11).
 *
 * The decoder is a resumable state machine over the outer structure
 * ({ key: { block_size, events: [ ... ] } ... }); each RouterEvent is cut out
 * whole (its extent found by a resumable bracket scan) and parsed with the
 * pull reader of net/body.h. Bytes before the current unit are dropped, so
 * the pending buffer holds at most one event plus one chunk.
 */
#include "api/codec_dump.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/codec_internal.h"

const char *kvi_dump_tier_name(enum kvi_tier t)
{
    switch (t) {
    case KVI_TIER_GPU: return "device";
    case KVI_TIER_CPU: return "host_pinned";
    case KVI_TIER_DISK: return "disk";
    case KVI_TIER_EXTERNAL: return "external";
    }
    return "device";
}

/* ---- encoder ------------------------------------------------------------------- */

#define KVI_DUMP_FLUSH_DEFAULT (64u * 1024u)

void kvi_dump_enc_init(struct kvi_dump_enc *enc, kvi_dump_sink_fn sink, void *sink_ctx,
                       size_t flush_at)
{
    memset(enc, 0, sizeof(*enc));
    kvi_buf_init(&enc->out);
    kvi_buf_init(&enc->_wm);
    enc->_sink = sink;
    enc->_sink_ctx = sink_ctx;
    enc->_flush_at = flush_at ? flush_at : KVI_DUMP_FLUSH_DEFAULT;
    enc->_first_ns = true;
}

void kvi_dump_enc_free(struct kvi_dump_enc *enc)
{
    kvi_buf_free(&enc->out);
    kvi_buf_free(&enc->_wm);
}

static void enc_flush(struct kvi_dump_enc *enc, bool force)
{
    if (!kvi_buf_ok(&enc->out) && enc->err == 0)
        enc->err = -ENOMEM;
    if (enc->_sink == NULL || enc->err != 0)
        return;
    if (enc->out.len == 0 || (!force && enc->out.len < enc->_flush_at))
        return;
    int r = enc->_sink(enc->_sink_ctx, enc->out.data, enc->out.len);
    kvi_buf_reset(&enc->out);
    if (r != 0)
        enc->err = r < 0 ? r : -EIO;
}

void kvi_dump_enc_begin(struct kvi_dump_enc *enc)
{
    kvi_buf_putc(&enc->out, '{');
    enc->_first_ns = true;
}

static void put_ns_key(struct kvi_dump_enc *enc, struct kvi_str model, struct kvi_str tenant)
{
    if (!enc->_first_ns)
        kvi_buf_putc(&enc->out, ',');
    enc->_first_ns = false;
    /* "<model>:<tenant>", escaped as one string */
    size_t n = model.len + 1 + tenant.len;
    char stack[256];
    char *key = n <= sizeof(stack) ? stack : malloc(n);
    if (key == NULL) {
        enc->out.oom = true;
        return;
    }
    memcpy(key, model.p, model.len);
    key[model.len] = ':';
    memcpy(key + model.len + 1, tenant.p, tenant.len);
    kvi_json_put_str(&enc->out, key, n);
    if (key != stack)
        free(key);
    kvi_buf_putc(&enc->out, ':');
}

void kvi_dump_enc_ns_begin(struct kvi_dump_enc *enc, struct kvi_str model, struct kvi_str tenant,
                           uint32_t block_size, struct kvi_index *ix)
{
    put_ns_key(enc, model, tenant);
    kvi_buf_puts(&enc->out, "{\"block_size\":");
    kvi_buf_put_u64(&enc->out, block_size);
    kvi_buf_puts(&enc->out, ",\"events\":[");
    enc->events = 0;
    enc->_ix = ix;
    enc->_in_ns = true;
    enc->_have_cache = false;
    kvi_buf_reset(&enc->_wm);
}

#define LIT(b, s) kvi_buf_put((b), (s), sizeof(s) - 1)

/* `{"worker_id":` and the worker's name (a string) or id (an integer). */
static void put_worker_open(struct kvi_buf *o, const struct kvi_dump_worker *w)
{
    LIT(o, "{\"worker_id\":");
    if (w->name != NULL)
        kvi_json_put_str(o, w->name, strlen(w->name));
    else
        kvi_buf_put_u64(o, w->id);
}

void kvi_dump_enc_block(struct kvi_dump_enc *enc, const struct kvi_dump_block *b,
                        const struct kvi_dump_worker *w)
{
    struct kvi_buf *o = &enc->out;
    if (enc->err != 0)
        return;
    if (enc->events > 0)
        kvi_buf_putc(o, ',');
    put_worker_open(o, w);
    LIT(o, ",\"storage_tier\":\"");
    kvi_buf_puts(o, kvi_dump_tier_name(b->tier));
    LIT(o, "\",\"event\":{\"event_id\":");
    kvi_buf_put_u64(o, enc->events);
    LIT(o, ",\"dp_rank\":");
    kvi_buf_put_u64(o, b->dp_rank);
    LIT(o, ",\"data\":{\"stored\":{\"parent_hash\":");
    if (b->has_parent)
        kvi_buf_put_u64(o, b->parent_engine_hash);
    else
        LIT(o, "null");
    LIT(o, ",\"start_position\":");
    kvi_buf_put_u64(o, b->position);
    LIT(o, ",\"blocks\":[{\"block_hash\":");
    kvi_buf_put_u64(o, b->engine_hash);
    LIT(o, ",\"tokens_hash\":");
    kvi_buf_put_u64(o, b->content_hash);
    LIT(o, ",\"mm_extra_info\":null,\"seq_hash\":");
    kvi_buf_put_u64(o, b->seq_hash);
    if (b->no_content)
        LIT(o, ",\"no_content\":true");
    LIT(o, "}]}}}}");
    enc->events++;
    enc_flush(enc, false);
}

void kvi_dump_emit(void *ctx, const struct kvi_dump_block *b)
{
    struct kvi_dump_enc *enc = ctx;
    if (enc->err != 0 || enc->_ix == NULL)
        return;
    if (!enc->_have_cache || enc->_cache_inst != b->instance) {
        uint64_t id;
        const char *name;
        bool shared;
        if (kvi_index_instance_info(enc->_ix, b->instance, &id, &name, &shared) != 0)
            return;
        enc->_cache_inst = b->instance;
        enc->_cache_worker.id = id;
        enc->_cache_worker.name = name;
        enc->_have_cache = true;
    }
    kvi_dump_enc_block(enc, b, &enc->_cache_worker);
}

void kvi_dump_enc_watermark(struct kvi_dump_enc *enc, const struct kvi_dump_worker *w, uint32_t dp_rank,
                            uint64_t seq)
{
    struct kvi_buf *o = &enc->_wm;
    if (enc->err != 0 || !enc->_in_ns)
        return;
    if (o->len > 0)
        kvi_buf_putc(o, ',');
    put_worker_open(o, w);
    LIT(o, ",\"dp_rank\":");
    kvi_buf_put_u64(o, dp_rank);
    LIT(o, ",\"seq\":");
    kvi_buf_put_u64(o, seq);
    kvi_buf_putc(o, '}');
}

void kvi_dump_enc_ns_end(struct kvi_dump_enc *enc)
{
    if (!enc->_in_ns)
        return;
    kvi_buf_putc(&enc->out, ']');
    if (enc->_wm.len > 0 || !kvi_buf_ok(&enc->_wm)) {
        if (!kvi_buf_ok(&enc->_wm))
            enc->out.oom = true;
        LIT(&enc->out, ",\"watermarks\":[");
        kvi_buf_put(&enc->out, enc->_wm.data, enc->_wm.len);
        kvi_buf_putc(&enc->out, ']');
        kvi_buf_reset(&enc->_wm);
    }
    kvi_buf_putc(&enc->out, '}');
    enc->_in_ns = false;
    enc_flush(enc, false);
}

void kvi_dump_enc_ns_error(struct kvi_dump_enc *enc, struct kvi_str model, struct kvi_str tenant,
                           const char *msg)
{
    put_ns_key(enc, model, tenant);
    kvi_buf_puts(&enc->out, "{\"error\":");
    kvi_json_put_str(&enc->out, msg, strlen(msg));
    kvi_buf_putc(&enc->out, '}');
    enc_flush(enc, false);
}

int kvi_dump_enc_end(struct kvi_dump_enc *enc)
{
    kvi_buf_putc(&enc->out, '}');
    enc_flush(enc, true);
    return enc->err;
}

/* ---- decoder ------------------------------------------------------------------- */

enum dec_state {
    S_TOP,          /* expect '{' */
    S_TOP_FIRST,    /* expect a namespace key or '}' */
    S_TOP_KEY,      /* expect a namespace key (after ',') */
    S_TOP_COLON,    /* expect ':' */
    S_NS_OPEN,      /* expect '{' */
    S_NS_FIRST,     /* expect a key or '}' */
    S_NS_KEY,       /* expect a key (after ',') */
    S_NS_COLON,     /* expect ':' */
    S_NS_VALUE,     /* the value of the current key */
    S_NS_NEXT,      /* expect ',' or '}' */
    S_EV_FIRST,     /* expect an event or ']' */
    S_EV_VALUE,     /* expect an event (after ',') */
    S_EV_NEXT,      /* expect ',' or ']' */
    S_TOP_NEXT,     /* expect ',' or '}' */
    S_END,          /* only whitespace may follow */
};

enum ns_key { K_OTHER, K_BLOCK_SIZE, K_EVENTS, K_ERROR, K_WATERMARKS };

struct dec_block {
    uint64_t engine, content, seq;
    bool has_seq;
    bool no_content;
};

struct kvi_dump_dec {
    struct kvi_dump_dec_cb cb;
    struct kvi_buf in;    /* pending bytes; in.data[pos] is the next unread */
    size_t pos;
    uint64_t base_off;    /* body offset of in.data[0] */
    enum dec_state st;
    enum ns_key key;
    int err;
    char errmsg[256];
    /* resumable extent scan of the value at pos */
    size_t scan_off;
    unsigned scan_depth;
    bool scan_in_str, scan_esc;
    /* current namespace */
    struct kvi_buf ns_name; /* "<model>:<tenant>" */
    struct kvi_str model, tenant;
    bool ns_has_bs, ns_has_events, ns_announced;
    uint32_t block_size;
    /* records held until block_size arrives */
    struct kvi_dump_rec *held;
    size_t n_held, cap_held;
    struct kvi_scratch held_names;
    /* per event */
    struct kvi_scratch ev_scratch;
    struct dec_block *blocks;
    size_t cap_blocks;
};

struct kvi_dump_dec *kvi_dump_dec_create(const struct kvi_dump_dec_cb *cb)
{
    struct kvi_dump_dec *d = calloc(1, sizeof(*d));
    if (d == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    d->cb = *cb;
    kvi_buf_init(&d->in);
    kvi_buf_init(&d->ns_name);
    kvi_scratch_init(&d->held_names);
    kvi_scratch_init(&d->ev_scratch);
    d->st = S_TOP;
    return d;
}

void kvi_dump_dec_destroy(struct kvi_dump_dec *d)
{
    if (d == NULL)
        return;
    kvi_buf_free(&d->in);
    kvi_buf_free(&d->ns_name);
    kvi_scratch_free(&d->held_names);
    kvi_scratch_free(&d->ev_scratch);
    free(d->held);
    free(d->blocks);
    free(d);
}

const char *kvi_dump_dec_error(const struct kvi_dump_dec *d)
{
    return d->err ? d->errmsg : "";
}

static int dec_fail(struct kvi_dump_dec *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int dec_fail(struct kvi_dump_dec *d, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(d->errmsg, sizeof(d->errmsg), "%s at byte %llu", msg,
             (unsigned long long)(d->base_off + d->pos));
    d->err = -EBADMSG;
    return -EBADMSG;
}

static int dec_nomem(struct kvi_dump_dec *d)
{
    snprintf(d->errmsg, sizeof(d->errmsg), "out of memory");
    d->err = -ENOMEM;
    return -ENOMEM;
}

/* Skip whitespace; @return the next byte or -1 when the buffer is exhausted. */
static int next_byte(struct kvi_dump_dec *d)
{
    while (d->pos < d->in.len) {
        char c = d->in.data[d->pos];
        if (c != ' ' && c != '\n' && c != '\r' && c != '\t')
            return (unsigned char)c;
        d->pos++;
    }
    return -1;
}

/*
 * Extent of the value at pos (first byte is not whitespace).
 * @return 1 with *len set, 0 when more bytes are needed, -EBADMSG.
 */
static int value_extent(struct kvi_dump_dec *d, bool final, size_t *len)
{
    const char *p = d->in.data + d->pos;
    size_t avail = d->in.len - d->pos;
    char c0 = p[0];
    if (c0 == '{' || c0 == '[' || c0 == '"') {
        size_t i = d->scan_off;
        if (i == 0) {
            d->scan_depth = 0;
            d->scan_in_str = false;
            d->scan_esc = false;
        }
        for (; i < avail; i++) {
            char c = p[i];
            if (d->scan_in_str) {
                if (d->scan_esc)
                    d->scan_esc = false;
                else if (c == '\\')
                    d->scan_esc = true;
                else if (c == '"') {
                    d->scan_in_str = false;
                    if (d->scan_depth == 0) {
                        *len = i + 1;
                        d->scan_off = 0;
                        return 1;
                    }
                }
            } else if (c == '"') {
                d->scan_in_str = true;
            } else if (c == '{' || c == '[') {
                d->scan_depth++;
            } else if (c == '}' || c == ']') {
                if (d->scan_depth == 0)
                    return dec_fail(d, "unbalanced brackets");
                if (--d->scan_depth == 0) {
                    *len = i + 1;
                    d->scan_off = 0;
                    return 1;
                }
            }
        }
        d->scan_off = i;
        return final ? dec_fail(d, "EOF while parsing a value") : 0;
    }
    size_t i = 0;
    while (i < avail && p[i] != ',' && p[i] != '}' && p[i] != ']' && p[i] != ' ' && p[i] != '\n' &&
           p[i] != '\r' && p[i] != '\t')
        i++;
    if (i == avail && !final)
        return 0;
    if (i == 0)
        return dec_fail(d, "expected value");
    *len = i;
    return 1;
}

/* Parse the JSON string [pos, pos + len) into *out (ev_scratch). */
static int parse_str_at(struct kvi_dump_dec *d, size_t len, struct kvi_str *out)
{
    struct kvi_rd rd;
    kvi_rd_init(&rd, d->in.data + d->pos, len, KVI_ENC_JSON, &d->ev_scratch);
    if (kvi_rd_str(&rd, out) != 0 || kvi_rd_finish(&rd) != 0)
        return rd.err == -ENOMEM ? dec_nomem(d) : dec_fail(d, "invalid string");
    return 0;
}

/* Read a key string at pos. @return 1 done, 0 need more, < 0 error. */
static int read_key(struct kvi_dump_dec *d, bool final, struct kvi_str *key)
{
    if (d->in.data[d->pos] != '"')
        return dec_fail(d, "key must be a string");
    size_t len;
    int r = value_extent(d, final, &len);
    if (r <= 0)
        return r;
    if ((r = parse_str_at(d, len, key)) != 0)
        return r;
    d->pos += len;
    return 1;
}

/* Hand a record over (or hold it until the namespace's block_size is known). */
static int emit(struct kvi_dump_dec *d, struct kvi_dump_rec *r)
{
    r->model = d->model;
    r->tenant = d->tenant;
    if (d->ns_announced) {
        r->block_size = d->block_size;
        int cr = d->cb.rec ? d->cb.rec(d->cb.ctx, r) : 0;
        if (cr != 0) {
            snprintf(d->errmsg, sizeof(d->errmsg), "stopped by the record callback (%d)", cr);
            d->err = cr;
        }
        return cr;
    }
    if (d->n_held == d->cap_held) {
        size_t cap = d->cap_held ? 2 * d->cap_held : 64;
        struct kvi_dump_rec *h = realloc(d->held, cap * sizeof(*h));
        if (h == NULL)
            return dec_nomem(d);
        d->held = h;
        d->cap_held = cap;
    }
    if (r->worker_named) {
        char *s = kvi_scratch_strdup(&d->held_names, r->worker_name.p, r->worker_name.len);
        if (s == NULL)
            return dec_nomem(d);
        r->worker_name.p = s;
    }
    d->held[d->n_held++] = *r;
    return 0;
}

static int announce(struct kvi_dump_dec *d)
{
    d->ns_announced = true;
    if (d->cb.ns != NULL) {
        int cr = d->cb.ns(d->cb.ctx, d->model, d->tenant, d->block_size);
        if (cr != 0) {
            snprintf(d->errmsg, sizeof(d->errmsg), "stopped by the namespace callback (%d)", cr);
            d->err = cr;
            return cr;
        }
    }
    for (size_t i = 0; i < d->n_held; i++) {
        int r = emit(d, &d->held[i]);
        if (r != 0)
            return r;
    }
    d->n_held = 0;
    kvi_scratch_reset(&d->held_names);
    return 0;
}

/* A hash: u64, or a negative i64 reinterpreted. */
static int rd_hash(struct kvi_rd *rd, uint64_t *out)
{
    struct kvi_num n;
    int r = kvi_rd_num(rd, &n);
    if (r != 0)
        return r < 0 ? r : -EINVAL;
    *out = n.neg ? (uint64_t)0 - n.mag : n.mag;
    return 0;
}

static int rd_u32(struct kvi_rd *rd, uint32_t *out)
{
    struct kvi_num n;
    int r = kvi_rd_num(rd, &n);
    if (r != 0)
        return r < 0 ? r : -EINVAL;
    if (n.neg || n.mag > UINT32_MAX)
        return -EINVAL;
    *out = (uint32_t)n.mag;
    return 0;
}

struct ev {
    bool has_worker, named;
    uint64_t worker_id;
    struct kvi_str worker_name;
    enum kvi_tier tier;
    uint64_t event_id;
    uint32_t dp_rank;
    enum kvi_dump_op op;
    bool has_data;
    bool has_parent, has_start;
    uint64_t parent;
    uint32_t start;
    size_t n_blocks;
    const uint64_t *removed;
    size_t n_removed;
};

static int push_block(struct kvi_dump_dec *d, size_t i, const struct dec_block *b)
{
    if (i == d->cap_blocks) {
        size_t cap = d->cap_blocks ? 2 * d->cap_blocks : 16;
        struct dec_block *nb = realloc(d->blocks, cap * sizeof(*nb));
        if (nb == NULL)
            return -ENOMEM;
        d->blocks = nb;
        d->cap_blocks = cap;
    }
    d->blocks[i] = *b;
    return 0;
}

static int parse_blocks(struct kvi_dump_dec *d, struct kvi_rd *rd, struct ev *ev)
{
    int r;
    if ((r = kvi_rd_arr_begin(rd)) != 0)
        return r < 0 ? r : -EINVAL;
    while ((r = kvi_rd_arr_next(rd)) == 1) {
        struct dec_block b = {0, 0, 0, false, false};
        bool has_bh = false, has_th = false;
        struct kvi_str k;
        if ((r = kvi_rd_obj_begin(rd)) != 0)
            return r < 0 ? r : -EINVAL;
        while ((r = kvi_rd_obj_next(rd, &k)) == 1) {
            r = 0;
            if (kvi_str_eq(k, "block_hash")) {
                r = rd_hash(rd, &b.engine);
                has_bh = true;
            } else if (kvi_str_eq(k, "tokens_hash")) {
                r = rd_hash(rd, &b.content);
                has_th = true;
            } else if (kvi_str_eq(k, "seq_hash")) {
                if (!kvi_rd_null(rd)) {
                    r = rd_hash(rd, &b.seq);
                    b.has_seq = true;
                }
            } else if (kvi_str_eq(k, "no_content")) {
                if (!kvi_rd_null(rd) && (r = kvi_rd_bool(rd, &b.no_content)) > 0)
                    r = -EINVAL;
            } else {
                r = kvi_rd_skip(rd);
            }
            if (r != 0)
                return r;
        }
        if (r < 0)
            return r;
        if (!has_bh || !has_th)
            return -EINVAL;
        if (push_block(d, ev->n_blocks, &b) != 0)
            return -ENOMEM;
        ev->n_blocks++;
    }
    return r < 0 ? r : 0;
}

static int parse_data(struct kvi_dump_dec *d, struct kvi_rd *rd, struct ev *ev)
{
    struct kvi_str k;
    int r;
    if (kvi_rd_peek(rd) == KVI_VT_STR) {
        if ((r = kvi_rd_str(rd, &k)) != 0)
            return r;
        if (!kvi_str_eq(k, "cleared"))
            return -EINVAL;
        ev->op = KVI_DUMP_CLEARED;
        ev->has_data = true;
        return 0;
    }
    if ((r = kvi_rd_obj_begin(rd)) != 0)
        return r < 0 ? r : -EINVAL;
    while ((r = kvi_rd_obj_next(rd, &k)) == 1) {
        struct kvi_str k2;
        if (ev->has_data)
            return -EINVAL; /* an enum has exactly one variant */
        if (kvi_str_eq(k, "stored")) {
            ev->op = KVI_DUMP_STORED;
            bool has_blocks = false;
            if ((r = kvi_rd_obj_begin(rd)) != 0)
                return r < 0 ? r : -EINVAL;
            while ((r = kvi_rd_obj_next(rd, &k2)) == 1) {
                r = 0;
                if (kvi_str_eq(k2, "parent_hash")) {
                    if (!kvi_rd_null(rd)) {
                        r = rd_hash(rd, &ev->parent);
                        ev->has_parent = true;
                    }
                } else if (kvi_str_eq(k2, "start_position")) {
                    if (!kvi_rd_null(rd)) {
                        r = rd_u32(rd, &ev->start);
                        ev->has_start = true;
                    }
                } else if (kvi_str_eq(k2, "blocks")) {
                    r = parse_blocks(d, rd, ev);
                    has_blocks = true;
                } else {
                    r = kvi_rd_skip(rd);
                }
                if (r != 0)
                    return r;
            }
            if (r < 0 || !has_blocks)
                return r < 0 ? r : -EINVAL;
        } else if (kvi_str_eq(k, "removed")) {
            ev->op = KVI_DUMP_REMOVED;
            bool has_hashes = false;
            if ((r = kvi_rd_obj_begin(rd)) != 0)
                return r < 0 ? r : -EINVAL;
            while ((r = kvi_rd_obj_next(rd, &k2)) == 1) {
                if (kvi_str_eq(k2, "block_hashes")) {
                    struct kvi_elem_err e;
                    uint64_t *h;
                    r = kvi_rd_u64_array(rd, INT64_MIN, UINT64_MAX, &h, &ev->n_removed, &e);
                    ev->removed = h;
                    has_hashes = true;
                } else {
                    r = kvi_rd_skip(rd);
                }
                if (r != 0)
                    return r < 0 ? r : -EINVAL;
            }
            if (r < 0 || !has_hashes)
                return r < 0 ? r : -EINVAL;
        } else if (kvi_str_eq(k, "cleared")) {
            ev->op = KVI_DUMP_CLEARED;
            if ((r = kvi_rd_skip(rd)) != 0)
                return r;
        } else {
            return -EINVAL;
        }
        ev->has_data = true;
    }
    return r < 0 ? r : 0;
}

static int parse_tier(struct kvi_rd *rd, enum kvi_tier *t)
{
    struct kvi_str s;
    int r = kvi_rd_str(rd, &s);
    if (r != 0)
        return r < 0 ? r : -EINVAL;
    static const char *const names[] = {"device", "host_pinned", "disk", "external"};
    for (int i = 0; i < 4; i++)
        if (kvi_str_eq(s, names[i])) {
            *t = (enum kvi_tier)i;
            return 0;
        }
    return -EINVAL;
}

/* Parse one RouterEvent [pos, pos + len) and emit its records. */
static int parse_event(struct kvi_dump_dec *d, size_t len)
{
    struct ev ev;
    memset(&ev, 0, sizeof(ev));
    ev.tier = KVI_TIER_GPU;
    struct kvi_rd rd;
    kvi_rd_init(&rd, d->in.data + d->pos, len, KVI_ENC_JSON, &d->ev_scratch);
    struct kvi_str k, k2;
    int r = kvi_rd_obj_begin(&rd);
    if (r != 0)
        goto bad;
    bool has_event = false;
    while ((r = kvi_rd_obj_next(&rd, &k)) == 1) {
        r = 0;
        if (kvi_str_eq(k, "worker_id")) {
            if (kvi_rd_peek(&rd) == KVI_VT_STR) {
                r = kvi_rd_str(&rd, &ev.worker_name);
                ev.named = true;
            } else {
                r = rd_hash(&rd, &ev.worker_id);
            }
            ev.has_worker = true;
        } else if (kvi_str_eq(k, "storage_tier")) {
            if (!kvi_rd_null(&rd))
                r = parse_tier(&rd, &ev.tier);
        } else if (kvi_str_eq(k, "event")) {
            has_event = true;
            if ((r = kvi_rd_obj_begin(&rd)) != 0)
                goto bad;
            while ((r = kvi_rd_obj_next(&rd, &k2)) == 1) {
                if (kvi_str_eq(k2, "event_id"))
                    r = rd_hash(&rd, &ev.event_id);
                else if (kvi_str_eq(k2, "dp_rank"))
                    r = kvi_rd_null(&rd) ? 0 : rd_u32(&rd, &ev.dp_rank);
                else if (kvi_str_eq(k2, "data"))
                    r = parse_data(d, &rd, &ev);
                else
                    r = kvi_rd_skip(&rd);
                if (r != 0)
                    goto bad;
            }
        } else {
            r = kvi_rd_skip(&rd);
        }
        if (r != 0)
            goto bad;
    }
    if (r < 0 || kvi_rd_finish(&rd) != 0)
        goto bad;
    if (!ev.has_worker || !has_event || !ev.has_data) {
        r = -EINVAL;
        goto bad;
    }
    struct kvi_dump_rec rec;
    memset(&rec, 0, sizeof(rec));
    rec.op = ev.op;
    rec.tier = ev.tier;
    rec.worker_named = ev.named;
    rec.worker_id = ev.worker_id;
    rec.worker_name = ev.worker_name;
    rec.dp_rank = ev.dp_rank;
    rec.event_id = ev.event_id;
    if (ev.op == KVI_DUMP_CLEARED)
        return emit(d, &rec);
    if (ev.op == KVI_DUMP_REMOVED) {
        for (size_t i = 0; i < ev.n_removed; i++) {
            rec.engine_hash = ev.removed[i];
            if ((r = emit(d, &rec)) != 0)
                return r;
        }
        return 0;
    }
    for (size_t i = 0; i < ev.n_blocks; i++) {
        const struct dec_block *b = &d->blocks[i];
        rec.has_parent = i > 0 || ev.has_parent;
        rec.parent_hash = i > 0 ? d->blocks[i - 1].engine : ev.parent;
        rec.engine_hash = b->engine;
        rec.content_hash = b->content;
        rec.has_position = ev.has_start;
        rec.position = ev.has_start ? ev.start + (uint32_t)i : 0;
        rec.has_seq = b->has_seq;
        rec.seq_hash = b->seq;
        rec.no_content = b->no_content;
        if ((r = emit(d, &rec)) != 0)
            return r;
    }
    return 0;
bad:
    if (r == -ENOMEM || rd.err == -ENOMEM)
        return dec_nomem(d);
    if (rd.err != 0)
        return dec_fail(d, "invalid RouterEvent: %s (at event byte %zu)", rd.err_what, rd.err_off);
    return dec_fail(d, "invalid RouterEvent");
}

/* Parse a "watermarks" value [pos, pos + len) and hand its entries over. */
static int parse_watermarks(struct kvi_dump_dec *d, size_t len)
{
    struct kvi_rd rd;
    kvi_rd_init(&rd, d->in.data + d->pos, len, KVI_ENC_JSON, &d->ev_scratch);
    int r = kvi_rd_arr_begin(&rd);
    if (r != 0)
        goto bad;
    /* two passes: validate the whole array, then call back (so that a bad
     * entry fails the body before any entry of it was handed out) */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            kvi_rd_init(&rd, d->in.data + d->pos, len, KVI_ENC_JSON, &d->ev_scratch);
            (void)kvi_rd_arr_begin(&rd);
        }
        while ((r = kvi_rd_arr_next(&rd)) == 1) {
            struct kvi_dump_wm w;
            memset(&w, 0, sizeof(w));
            w.model = d->model;
            w.tenant = d->tenant;
            bool has_worker = false, has_seq = false;
            struct kvi_str k;
            if ((r = kvi_rd_obj_begin(&rd)) != 0)
                goto bad;
            while ((r = kvi_rd_obj_next(&rd, &k)) == 1) {
                r = 0;
                if (kvi_str_eq(k, "worker_id")) {
                    if (kvi_rd_peek(&rd) == KVI_VT_STR) {
                        r = kvi_rd_str(&rd, &w.worker_name);
                        w.worker_named = true;
                    } else {
                        r = rd_hash(&rd, &w.worker_id);
                    }
                    has_worker = true;
                } else if (kvi_str_eq(k, "dp_rank")) {
                    r = kvi_rd_null(&rd) ? 0 : rd_u32(&rd, &w.dp_rank);
                } else if (kvi_str_eq(k, "seq")) {
                    struct kvi_num n;
                    r = kvi_rd_num(&rd, &n);
                    if (r == 0 && (n.neg || n.mag == UINT64_MAX)) /* ff x 8 is never a batch */
                        r = -EINVAL;
                    w.seq = n.mag;
                    has_seq = true;
                } else {
                    r = kvi_rd_skip(&rd);
                }
                if (r != 0)
                    goto bad;
            }
            if (r < 0)
                goto bad;
            if (!has_worker || !has_seq) {
                r = -EINVAL;
                goto bad;
            }
            if (pass == 1 && d->cb.wm != NULL) {
                int cr = d->cb.wm(d->cb.ctx, &w);
                if (cr != 0) {
                    snprintf(d->errmsg, sizeof(d->errmsg), "stopped by the watermark callback (%d)", cr);
                    d->err = cr;
                    return cr;
                }
            }
        }
        if (r < 0 || kvi_rd_finish(&rd) != 0)
            goto bad;
    }
    return 0;
bad:
    if (r == -ENOMEM || rd.err == -ENOMEM)
        return dec_nomem(d);
    return dec_fail(d, "invalid watermarks");
}

static int ns_open(struct kvi_dump_dec *d, struct kvi_str key)
{
    kvi_buf_reset(&d->ns_name);
    kvi_buf_put(&d->ns_name, key.p, key.len);
    kvi_buf_putc(&d->ns_name, '\0');
    if (!kvi_buf_ok(&d->ns_name))
        return dec_nomem(d);
    const char *s = d->ns_name.data;
    const char *colon = memchr(s, ':', key.len);
    if (colon != NULL) {
        d->model = (struct kvi_str){s, (size_t)(colon - s)};
        d->tenant = (struct kvi_str){colon + 1, key.len - (size_t)(colon - s) - 1};
    } else {
        d->model = (struct kvi_str){s, key.len};
        d->tenant = kvi_str_default;
    }
    d->ns_has_bs = d->ns_has_events = d->ns_announced = false;
    d->n_held = 0;
    kvi_scratch_reset(&d->held_names);
    return 0;
}

static int ns_close(struct kvi_dump_dec *d)
{
    if (!d->ns_has_bs || !d->ns_has_events)
        return dec_fail(d, "namespace %.*s:%.*s has no %s", (int)d->model.len, d->model.p,
                        (int)d->tenant.len, d->tenant.p,
                        d->ns_has_bs ? "events" : "block_size");
    return 0;
}

/* One step of the state machine. @return 1 progress, 0 need more, < 0 error. */
static int step(struct kvi_dump_dec *d, bool final)
{
    int c = next_byte(d);
    if (c < 0)
        return 0;
    struct kvi_str key;
    size_t len;
    int r;
    switch (d->st) {
    case S_TOP:
        if (c != '{')
            return dec_fail(d, "dump is not a JSON object");
        d->pos++;
        d->st = S_TOP_FIRST;
        return 1;
    case S_TOP_FIRST:
    case S_TOP_KEY:
        if (c == '}' && d->st == S_TOP_FIRST) {
            d->pos++;
            d->st = S_END;
            return 1;
        }
        if ((r = read_key(d, final, &key)) <= 0)
            return r;
        if ((r = ns_open(d, key)) != 0)
            return r;
        d->st = S_TOP_COLON;
        return 1;
    case S_TOP_COLON:
    case S_NS_COLON:
        if (c != ':')
            return dec_fail(d, "expected `:`");
        d->pos++;
        d->st = d->st == S_TOP_COLON ? S_NS_OPEN : S_NS_VALUE;
        return 1;
    case S_NS_OPEN:
        if (c != '{')
            return dec_fail(d, "namespace %.*s:%.*s is not an object", (int)d->model.len,
                            d->model.p, (int)d->tenant.len, d->tenant.p);
        d->pos++;
        d->st = S_NS_FIRST;
        return 1;
    case S_NS_FIRST:
    case S_NS_KEY:
        if (c == '}' && d->st == S_NS_FIRST) {
            d->pos++;
            d->st = S_TOP_NEXT;
            return ns_close(d) == 0 ? 1 : d->err;
        }
        if ((r = read_key(d, final, &key)) <= 0)
            return r;
        d->key = kvi_str_eq(key, "block_size") ? K_BLOCK_SIZE
                 : kvi_str_eq(key, "events")   ? K_EVENTS
                 : kvi_str_eq(key, "error")    ? K_ERROR
                 : kvi_str_eq(key, "watermarks") ? K_WATERMARKS
                                               : K_OTHER;
        kvi_scratch_reset(&d->ev_scratch);
        d->st = S_NS_COLON;
        return 1;
    case S_NS_VALUE:
        if (d->key == K_EVENTS) {
            if (c != '[')
                return dec_fail(d, "events is not an array");
            if (d->ns_has_events)
                return dec_fail(d, "duplicate events");
            d->pos++;
            d->st = S_EV_FIRST;
            return 1;
        }
        if ((r = value_extent(d, final, &len)) <= 0)
            return r;
        if (d->key == K_BLOCK_SIZE) {
            struct kvi_rd rd;
            kvi_rd_init(&rd, d->in.data + d->pos, len, KVI_ENC_JSON, &d->ev_scratch);
            if (rd_u32(&rd, &d->block_size) != 0 || kvi_rd_finish(&rd) != 0 ||
                d->block_size == 0 || d->ns_has_bs)
                return dec_fail(d, "invalid block_size");
            d->ns_has_bs = true;
            d->pos += len;
            d->st = S_NS_NEXT;
            return announce(d) == 0 ? 1 : d->err;
        }
        if (d->key == K_WATERMARKS) {
            if ((r = parse_watermarks(d, len)) != 0)
                return r;
            d->pos += len;
            d->st = S_NS_NEXT;
            return 1;
        }
        if (d->key == K_ERROR) {
            struct kvi_str msg = {"", 0};
            if (d->in.data[d->pos] == '"')
                (void)parse_str_at(d, len, &msg);
            d->err = 0;
            return dec_fail(d, "namespace %.*s:%.*s reported an error: %.*s", (int)d->model.len,
                            d->model.p, (int)d->tenant.len, d->tenant.p,
                            (int)(msg.len > 80 ? 80 : msg.len), msg.p);
        }
        {
            struct kvi_rd rd;
            kvi_rd_init(&rd, d->in.data + d->pos, len, KVI_ENC_JSON, &d->ev_scratch);
            if (kvi_rd_skip(&rd) != 0 || kvi_rd_finish(&rd) != 0)
                return dec_fail(d, "invalid value");
        }
        d->pos += len;
        d->st = S_NS_NEXT;
        return 1;
    case S_NS_NEXT:
        if (c == ',') {
            d->pos++;
            d->st = S_NS_KEY;
            return 1;
        }
        if (c != '}')
            return dec_fail(d, "expected `,` or `}`");
        d->pos++;
        d->st = S_TOP_NEXT;
        return ns_close(d) == 0 ? 1 : d->err;
    case S_EV_FIRST:
    case S_EV_VALUE:
        if (c == ']' && d->st == S_EV_FIRST) {
            d->pos++;
            d->ns_has_events = true;
            d->st = S_NS_NEXT;
            return 1;
        }
        if (c != '{')
            return dec_fail(d, "event is not an object");
        if ((r = value_extent(d, final, &len)) <= 0)
            return r;
        kvi_scratch_reset(&d->ev_scratch);
        if ((r = parse_event(d, len)) != 0)
            return r;
        d->pos += len;
        d->st = S_EV_NEXT;
        return 1;
    case S_EV_NEXT:
        if (c == ',') {
            d->pos++;
            d->st = S_EV_VALUE;
            return 1;
        }
        if (c != ']')
            return dec_fail(d, "expected `,` or `]`");
        d->pos++;
        d->ns_has_events = true;
        d->st = S_NS_NEXT;
        return 1;
    case S_TOP_NEXT:
        if (c == ',') {
            d->pos++;
            d->st = S_TOP_KEY;
            return 1;
        }
        if (c != '}')
            return dec_fail(d, "expected `,` or `}`");
        d->pos++;
        d->st = S_END;
        return 1;
    case S_END:
        return dec_fail(d, "trailing characters");
    }
    return dec_fail(d, "internal state");
}

static int run(struct kvi_dump_dec *d, bool final)
{
    int r;
    /* a callback asking to stop sets d->err: stop stepping then, whatever
     * step() returned (a positive stop value used to loop forever) */
    while ((r = step(d, final)) > 0 && d->err == 0)
        ;
    if (d->err != 0)
        return d->err;
    if (r < 0) {
        if (d->err == 0)
            d->err = r;
        return d->err;
    }
    /* drop consumed bytes once they dominate the buffer */
    if (d->pos > 0 && (d->pos >= d->in.len / 2 || d->pos >= 1u << 20)) {
        d->base_off += d->pos;
        kvi_buf_consume(&d->in, d->pos);
        d->pos = 0;
    }
    return 0;
}

int kvi_dump_dec_feed(struct kvi_dump_dec *d, const void *data, size_t len)
{
    if (d->err != 0)
        return d->err;
    kvi_buf_put(&d->in, data, len);
    if (!kvi_buf_ok(&d->in))
        return dec_nomem(d);
    return run(d, false);
}

int kvi_dump_dec_finish(struct kvi_dump_dec *d)
{
    if (d->err != 0)
        return d->err;
    int r = run(d, true);
    if (r != 0)
        return r;
    if (d->st != S_END)
        return dec_fail(d, "EOF while parsing the dump");
    return 0;
}
