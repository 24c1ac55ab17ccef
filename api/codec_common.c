/*
 * Shared pieces of the HTTP codecs: route table, Content-Type and Accept
 * classification, dialect detection (http-api.md §0), error answers,
 * endpoint validation (§1.1) and the table-driven object parser both
 * dialects' request parsers are built on.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/codec_internal.h"
#include "net/endpoint.h"

const struct kvi_str kvi_str_default = {"default", 7};

/* ---- routes ------------------------------------------------------------------ */

static const struct {
    const char *path;
    const char *method;
} kvi_routes[KVI_R_COUNT] = {
    [KVI_R_HEALTH] = {"/health", "GET"},
    [KVI_R_READY] = {"/ready", "GET"},
    [KVI_R_STATUS] = {"/status", "GET"},
    [KVI_R_METRICS] = {"/metrics", "GET"},
    [KVI_R_REGISTER] = {"/register", "POST"},
    [KVI_R_UNREGISTER] = {"/unregister", "POST"},
    [KVI_R_WORKERS] = {"/workers", "GET"},
    [KVI_R_QUERY] = {"/query", "POST"},
    [KVI_R_QUERY_BY_HASH] = {"/query_by_hash", "POST"},
    [KVI_R_DUMP] = {"/dump", "GET"},
    [KVI_R_REGISTER_PEER] = {"/register_peer", "POST"},
    [KVI_R_DEREGISTER_PEER] = {"/deregister_peer", "POST"},
    [KVI_R_PEERS] = {"/peers", "GET"},
    [KVI_R_TEST_PAUSE] = {"/test/pause_listener", "POST"},
    [KVI_R_TEST_RESUME] = {"/test/resume_listener", "POST"},
    [KVI_R_GLOBAL_VIEW] = {"/global_view", "GET"},
    [KVI_R_SERVICES] = {"/services", "GET"},
    [KVI_R_NATS_SOURCES] = {"/nats/sources", "POST"},
    [KVI_R_ZMQ_BIND] = {"/zmq/bind", "POST"},
    [KVI_R_ZMQ_UNBIND] = {"/zmq/unbind", "POST"},
    [KVI_R_ZMQ_BINDS] = {"/zmq/binds", "GET"},
};

enum kvi_route kvi_route_of(const char *path, size_t len)
{
    const char *q = memchr(path, '?', len);
    if (q != NULL)
        len = (size_t)(q - path);
    for (int r = 1; r < KVI_R_COUNT; r++) {
        const char *p = kvi_routes[r].path;
        if (strlen(p) == len && memcmp(p, path, len) == 0)
            return (enum kvi_route)r;
    }
    return KVI_R_UNKNOWN;
}

const char *kvi_route_method(enum kvi_route r)
{
    return r > KVI_R_UNKNOWN && r < KVI_R_COUNT ? kvi_routes[r].method : NULL;
}

/* ---- content types ------------------------------------------------------------ */

static bool ieq(const char *a, size_t n, const char *lit)
{
    return strlen(lit) == n && strncasecmp(a, lit, n) == 0;
}

/* The media type of a header value: trimmed, without parameters. */
static void media_type(const char *v, size_t len, const char **out, size_t *n)
{
    while (len > 0 && (*v == ' ' || *v == '\t')) {
        v++;
        len--;
    }
    const char *semi = memchr(v, ';', len);
    if (semi != NULL)
        len = (size_t)(semi - v);
    while (len > 0 && (v[len - 1] == ' ' || v[len - 1] == '\t'))
        len--;
    *out = v;
    *n = len;
}

enum kvi_ctype kvi_ctype_of(const char *value, size_t len)
{
    if (value == NULL)
        return KVI_CT_NONE;
    /* what clients send, exactly: no trimming nor case folding needed */
    if (len == 16 && memcmp(value, "application/json", 16) == 0)
        return KVI_CT_JSON;
    if (len == 19 && memcmp(value, "application/msgpack", 19) == 0)
        return KVI_CT_MSGPACK;
    const char *m;
    size_t n;
    media_type(value, len, &m, &n);
    if (n == 0)
        return KVI_CT_NONE;
    if (ieq(m, n, "application/msgpack") || ieq(m, n, "application/x-msgpack"))
        return KVI_CT_MSGPACK;
    if (ieq(m, n, "application/json"))
        return KVI_CT_JSON;
    /* application/<anything>+json (axum accepts the +json suffix) */
    if (n > 17 && strncasecmp(m, "application/", 12) == 0 && ieq(m + n - 5, 5, "+json"))
        return KVI_CT_JSON;
    return KVI_CT_OTHER;
}

bool kvi_accepts_msgpack(const char *value, size_t len)
{
    if (value == NULL)
        return false;
    while (len > 0) {
        const char *comma = memchr(value, ',', len);
        size_t part = comma ? (size_t)(comma - value) : len;
        const char *m;
        size_t n;
        media_type(value, part, &m, &n);
        if (ieq(m, n, "application/msgpack") || ieq(m, n, "application/x-msgpack"))
            return true;
        if (comma == NULL)
            break;
        value = comma + 1;
        len -= part + 1;
    }
    return false;
}

/* ---- dialect detection --------------------------------------------------------- */

struct detect_ctx {
    enum kvi_route route;
    int decided; /* -1 undecided, else enum kvi_dialect */
    int unreg_id; /* /unregister: dialect from instance_id's type, -1 unknown */
    int unreg_other;
};

static int detect_key(void *ctx, struct kvi_str key, enum kvi_vt vt)
{
    struct detect_ctx *c = ctx;
    switch (c->route) {
    case KVI_R_REGISTER:
        if (kvi_str_eq(key, "modelname") || kvi_str_eq(key, "type"))
            c->decided = KVI_DIALECT_CONDUCTOR;
        else if (kvi_str_eq(key, "model_name"))
            c->decided = KVI_DIALECT_DYNAMO;
        break;
    case KVI_R_UNREGISTER:
        if (kvi_str_eq(key, "instance_id")) {
            if (vt == KVI_VT_STR)
                c->decided = KVI_DIALECT_CONDUCTOR;
            else if (vt == KVI_VT_INT)
                c->decided = KVI_DIALECT_DYNAMO;
        } else if (c->unreg_other < 0) {
            if (kvi_str_eq(key, "modelname") || kvi_str_eq(key, "type"))
                c->unreg_other = KVI_DIALECT_CONDUCTOR;
            else if (kvi_str_eq(key, "model_name"))
                c->unreg_other = KVI_DIALECT_DYNAMO;
        }
        break;
    case KVI_R_QUERY:
        if (kvi_str_eq(key, "model"))
            c->decided = KVI_DIALECT_CONDUCTOR;
        else if (kvi_str_eq(key, "model_name"))
            c->decided = KVI_DIALECT_DYNAMO;
        break;
    case KVI_R_QUERY_BY_HASH:
        if (kvi_str_eq(key, "seq_hashes") || kvi_str_eq(key, "block_hash"))
            c->decided = KVI_DIALECT_CONDUCTOR;
        else if (kvi_str_eq(key, "block_hashes"))
            c->decided = KVI_DIALECT_DYNAMO;
        break;
    default: break;
    }
    return c->decided >= 0;
}

enum kvi_dialect kvi_detect_dialect(enum kvi_route r, enum kvi_ctype ct, const void *body,
                                    size_t len)
{
    switch (r) {
    case KVI_R_GLOBAL_VIEW:
    case KVI_R_SERVICES: return KVI_DIALECT_CONDUCTOR;
    case KVI_R_REGISTER:
    case KVI_R_UNREGISTER:
    case KVI_R_QUERY:
    case KVI_R_QUERY_BY_HASH: break;
    default: return KVI_DIALECT_DYNAMO;
    }
    enum kvi_body_enc enc = ct == KVI_CT_MSGPACK ? KVI_ENC_MSGPACK : KVI_ENC_JSON;
    enum kvi_dialect dflt = enc == KVI_ENC_MSGPACK ? KVI_DIALECT_CONDUCTOR : KVI_DIALECT_DYNAMO;
    struct detect_ctx c = {r, -1, -1, -1};
    if (body != NULL && len > 0)
        (void)kvi_rd_peek_keys(body, len, enc, detect_key, &c);
    if (c.decided >= 0)
        return (enum kvi_dialect)c.decided;
    if (c.unreg_other >= 0)
        return (enum kvi_dialect)c.unreg_other;
    return dflt;
}

/* ---- errors ------------------------------------------------------------------------- */

int kvi_err__set(struct kvi_api_err *e, int status, const char *reason, const char *field,
                 int64_t index, const char *fmt, ...)
{
    e->status = status;
    e->reason = reason;
    e->index = index;
    if (field != NULL) {
        snprintf(e->_field, sizeof(e->_field), "%s", field);
        e->field = e->_field;
    } else {
        e->field = NULL;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return -EINVAL;
}

int kvi_err__from_rd(struct kvi_api_err *e, enum kvi_dialect d, struct kvi_rd *rd)
{
    if (rd->err == -ENOMEM) {
        kvi_err__set(e, 500, NULL, NULL, -1, "out of memory while parsing the request body");
        return -ENOMEM;
    }
    bool mp = rd->enc == KVI_ENC_MSGPACK;
    if (d == KVI_DIALECT_CONDUCTOR)
        return kvi_err__set(e, 400, "invalid_json", NULL, -1,
                            mp ? "Invalid msgpack object" : "Invalid JSON object");
    if (mp)
        return kvi_err__set(e, 400, NULL, NULL, -1,
                            "Failed to parse the request body as msgpack: %s at byte %zu",
                            rd->err_what, rd->err_off);
    size_t line, col;
    kvi_rd_line_col(rd, rd->err_off, &line, &col);
    return kvi_err__set(e, 400, NULL, NULL, -1,
                        "Failed to parse the request body as JSON: %s at line %zu column %zu",
                        rd->err_what, line, col);
}

int kvi_err_encode(const struct kvi_api_err *e, enum kvi_dialect d, enum kvi_body_enc enc,
                   struct kvi_buf *out, const char **content_type)
{
    struct kvi_wr w;
    if (d == KVI_DIALECT_DYNAMO) {
        kvi_wr_init(&w, out, KVI_ENC_JSON);
        kvi_wr_obj(&w, 1);
        kvi_wr_keyz(&w, "error");
        kvi_wr_strz(&w, e->msg);
        kvi_wr_end(&w);
        *content_type = KVI_MIME_JSON;
    } else if (e->status == 400) {
        uint32_t n = 1 + (e->reason != NULL) + (e->field != NULL) + (e->index >= 0);
        kvi_wr_init(&w, out, enc);
        kvi_wr_obj(&w, n);
        kvi_wr_keyz(&w, "error");
        kvi_wr_strz(&w, e->msg);
        if (e->reason != NULL) {
            kvi_wr_keyz(&w, "reason");
            kvi_wr_strz(&w, e->reason);
        }
        if (e->field != NULL) {
            kvi_wr_keyz(&w, "field");
            kvi_wr_strz(&w, e->field);
        }
        if (e->index >= 0) {
            kvi_wr_keyz(&w, "index");
            kvi_wr_i64(&w, e->index);
        }
        kvi_wr_end(&w);
        if (enc == KVI_ENC_JSON)
            kvi_buf_putc(out, '\n');
        *content_type = enc == KVI_ENC_MSGPACK ? KVI_MIME_MSGPACK : KVI_MIME_JSON;
    } else {
        kvi_buf_puts(out, e->msg);
        kvi_buf_putc(out, '\n');
        *content_type = KVI_MIME_TEXT;
    }
    return kvi_buf_ok(out) ? 0 : -ENOMEM;
}

/*
 * Copy at most @p max bytes of @p p into @p out (room for max + 1, always
 * NUL-terminated): whole UTF-8 characters only, every byte that starts none
 * (and NUL) replaced by '?'. For raw request bytes quoted in an answer,
 * which must stay valid UTF-8 (a request path is not checked by the server).
 */
static void utf8_quote(char *out, size_t max, const char *p, size_t len)
{
    const uint8_t *s = (const uint8_t *)p, *end = s + len;
    size_t o = 0;
    while (s < end) {
        size_t k = *s >= 0x80 ? kvi__utf8_seq(s, end) : (*s != 0);
        if (o + (k ? k : 1) > max)
            break;
        if (k == 0) {
            out[o++] = '?';
            s++;
            continue;
        }
        memcpy(out + o, s, k);
        o += k;
        s += k;
    }
    out[o] = '\0';
}

int kvi_err_unknown_path(struct kvi_api_err *e, const char *path, size_t len)
{
    char shown[201];
    utf8_quote(shown, sizeof(shown) - 1, path, len);
    return kvi_err__set(e, 404, NULL, NULL, -1, "not found: %s", shown);
}

int kvi_err_method(struct kvi_api_err *e)
{
    return kvi_err__set(e, 405, NULL, NULL, -1, "Method not allowed");
}

int kvi_err_too_large(struct kvi_api_err *e, size_t limit)
{
    return kvi_err__set(e, 413, NULL, NULL, -1, "request body over the %zu-byte limit", limit);
}

int kvi_err_internal(struct kvi_api_err *e, const char *msg)
{
    return kvi_err__set(e, 500, NULL, NULL, -1, "%s", msg);
}

int kvi_err_too_many_models(struct kvi_api_err *e, size_t limit)
{
    return kvi_err__set(e, 429, NULL, NULL, -1,
                        "too many models: %zu namespaces (model x tenant) exist, the most --max-models allows; "
                        "a registration may not create another",
                        limit);
}

/* ---- endpoints ---------------------------------------------------------------------- */

bool kvi_endpoint_valid(const char *s, size_t len, const char **why)
{
    *why = kvi_endpoint_check(s, len); /* one rule set: net/endpoint.c */
    return *why == NULL;
}

/* ---- the table-driven parser ------------------------------------------------------- */

int kvi_parse__begin(struct kvi_pctx *c, enum kvi_dialect d, const char *type_name,
                     const void *body, size_t len, enum kvi_ctype ct, bool msgpack_ok,
                     struct kvi_scratch *s, struct kvi_api_err *err)
{
    c->d = d;
    c->err = err;
    c->type_name = type_name;
    enum kvi_body_enc enc = KVI_ENC_JSON;
    if (ct == KVI_CT_MSGPACK) {
        if (d == KVI_DIALECT_DYNAMO && !msgpack_ok)
            return kvi_err__set(err, 415, NULL, NULL, -1,
                                "Expected request with `Content-Type: application/json`");
        enc = KVI_ENC_MSGPACK;
    } else if (d == KVI_DIALECT_DYNAMO && ct != KVI_CT_JSON) {
        return kvi_err__set(err, 415, NULL, NULL, -1,
                            "Expected request with `Content-Type: application/json`");
    }
    kvi_rd_init(&c->rd, body, len, enc, s);
    return 0;
}

/* Dynamo data error (422) at byte offset @p off: "<path>: <detail>". */
static int dyn_data_err(struct kvi_pctx *c, size_t off, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int dyn_data_err(struct kvi_pctx *c, size_t off, const char *path, const char *fmt, ...)
{
    char detail[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    const char *sep = path != NULL ? ": " : "";
    if (path == NULL)
        path = "";
    if (c->rd.enc == KVI_ENC_MSGPACK)
        return kvi_err__set(c->err, 422, NULL, NULL, -1,
                            "Failed to deserialize the msgpack body into the target type: %s%s%s "
                            "at byte %zu",
                            path, sep, detail, off);
    size_t line, col;
    kvi_rd_line_col(&c->rd, off, &line, &col);
    return kvi_err__set(c->err, 422, NULL, NULL, -1,
                        "Failed to deserialize the JSON body into the target type: %s%s%s at line "
                        "%zu column %zu",
                        path, sep, detail, line, col);
}

/* Dynamo: the value at the cursor is not a @p expected. */
static int dyn_bad_value(struct kvi_pctx *c, const char *path, const char *expected)
{
    char what[128];
    size_t off = kvi_rd_offset(&c->rd);
    kvi_rd_describe(&c->rd, what, sizeof(what));
    bool is_int = strncmp(what, "integer", 7) == 0;
    return dyn_data_err(c, off, path, "invalid %s: %s, expected %s", is_int ? "value" : "type", what,
                        expected);
}

/* Conductor: 400 with reason and field. */
static int cond_err(struct kvi_pctx *c, const char *reason, const char *field, int64_t index,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static int cond_err(struct kvi_pctx *c, const char *reason, const char *field, int64_t index,
                    const char *fmt, ...)
{
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return kvi_err__set(c->err, 400, reason, field, index, "%s", msg);
}

/* A syntax (or memory) failure of the reader as the dialect's error. */
static int body_err(struct kvi_pctx *c)
{
    return kvi_err__from_rd(c->err, c->d, &c->rd);
}

/* The cursor is not at a value (kvi_rd_peek gave KVI_VT_BAD): let the
 * reader name the syntax error. */
static int not_a_value(struct kvi_pctx *c)
{
    (void)kvi_rd_skip(&c->rd);
    return body_err(c);
}

/* Scratch exhausted outside the reader. */
static int no_memory(struct kvi_pctx *c)
{
    (void)kvi_rd__nomem(&c->rd);
    return body_err(c);
}

static const char *dyn_expect(const struct kvi_field *f)
{
    switch (f->kind) {
    case KVI_FK_U64: return "u64";
    case KVI_FK_U32: return "u32";
    case KVI_FK_U32_NZ: return "a nonzero u32";
    case KVI_FK_U64_NZ: return "a nonzero u64";
    case KVI_FK_TOKENS:
    case KVI_FK_HASHES: return "a sequence";
    default: return "a string";
    }
}

/* Read an integer field. */
static int parse_int_field(struct kvi_pctx *c, const struct kvi_field *f, void *out)
{
    struct kvi_num n = {0, false};
    enum kvi_vt vt = kvi_rd_peek(&c->rd);
    if (c->d == KVI_DIALECT_DYNAMO) {
        if (vt != KVI_VT_INT)
            return vt == KVI_VT_BAD ? not_a_value(c) : dyn_bad_value(c, f->name, dyn_expect(f));
        struct kvi_rd save = c->rd;
        int r = kvi_rd_num(&c->rd, &n);
        if (r < 0)
            return body_err(c);
        bool wide = f->kind == KVI_FK_U64 || f->kind == KVI_FK_U64_NZ;
        bool nz = f->kind == KVI_FK_U32_NZ || f->kind == KVI_FK_U64_NZ;
        uint64_t max = wide ? UINT64_MAX : UINT32_MAX;
        if (r != 0 || n.neg || n.mag > max || (nz && n.mag == 0)) {
            c->rd = save;
            return dyn_bad_value(c, f->name, dyn_expect(f));
        }
        if (wide)
            *(uint64_t *)((char *)out + f->off) = n.mag;
        else
            *(uint32_t *)((char *)out + f->off) = (uint32_t)n.mag;
        return 0;
    }
    if (vt != KVI_VT_INT && vt != KVI_VT_FLOAT) {
        if (vt == KVI_VT_BAD)
            return not_a_value(c);
        return cond_err(c, "invalid_type", f->name, -1, "%s must be an integer", f->name);
    }
    int r = kvi_rd_num(&c->rd, &n);
    if (r < 0)
        return body_err(c);
    if (r == KVI_NUM_FLOAT)
        return cond_err(c, "invalid_type", f->name, -1, "%s must be an integer", f->name);
    if (f->kind == KVI_FK_POS_U32) {
        if (r == 0 && (n.neg || n.mag == 0))
            return cond_err(c, "invalid_value", f->name, -1, "%s must be greater than 0", f->name);
        if (r != 0 || n.mag > UINT32_MAX)
            return cond_err(c, "out_of_range", f->name, -1, "%s is out of range", f->name);
    } else { /* KVI_FK_RANK */
        if (r != 0 || n.neg || n.mag > INT_MAX)
            return cond_err(c, "out_of_range", f->name, -1, "%s must be between 0 and %d", f->name,
                            INT_MAX);
    }
    *(uint32_t *)((char *)out + f->off) = (uint32_t)n.mag;
    return 0;
}

static int parse_str_field(struct kvi_pctx *c, const struct kvi_field *f, struct kvi_str *dst)
{
    enum kvi_vt vt = kvi_rd_peek(&c->rd);
    if (vt != KVI_VT_STR) {
        if (vt == KVI_VT_BAD)
            return not_a_value(c);
        if (c->d == KVI_DIALECT_DYNAMO)
            return dyn_bad_value(c, f->name, "a string");
        return cond_err(c, "invalid_type", f->name, -1, "%s must be a string", f->name);
    }
    if (kvi_rd_str(&c->rd, dst) != 0)
        return body_err(c);
    if ((f->flags & KVI_FF_NONEMPTY) && dst->len == 0 && c->d == KVI_DIALECT_DYNAMO)
        return dyn_data_err(c, kvi_rd_offset(&c->rd), f->name,
                            "invalid value: string \"\", expected a non-empty string");
    if ((f->flags & KVI_FF_NONEMPTY) && dst->len == 0)
        return cond_err(c, "invalid_value", f->name, -1, "%s must be a non-empty string", f->name);
    return 0;
}

int kvi_bin__le_words(struct kvi_scratch *s, const uint8_t *p, size_t len, int width, void **out, size_t *n)
{
    if (len % (size_t)width != 0)
        return -EINVAL;
    void *a = kvi_scratch_alloc(s, len);
    if (a == NULL)
        return -ENOMEM;
    *n = len / (size_t)width;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (len > 0)
        memcpy(a, p, len); /* the wire order is the host's */
#else
    if (width == 4) {
        uint32_t *d = a;
        for (size_t i = 0; i < *n; i++)
            d[i] = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                   (uint32_t)p[4 * i + 3] << 24;
    } else {
        uint64_t *d = a;
        for (size_t i = 0; i < *n; i++) {
            uint64_t v = 0;
            for (int k = 7; k >= 0; k--)
                v = v << 8 | p[8 * i + (size_t)k];
            d[i] = v;
        }
    }
#endif
    *out = a;
    return 0;
}

/* A bin of little-endian @p width-byte values, copied out as u32/u64. */
static int parse_bin_array(struct kvi_pctx *c, const struct kvi_field *f, int width, void **out,
                           size_t *n)
{
    const uint8_t *p;
    size_t len;
    if (kvi_rd_bin(&c->rd, &p, &len) != 0)
        return body_err(c);
    int r = kvi_bin__le_words(c->rd._scratch, p, len, width, out, n);
    if (r == -ENOMEM)
        return no_memory(c);
    if (r != 0) {
        if (c->d == KVI_DIALECT_DYNAMO)
            return dyn_data_err(c, kvi_rd_offset(&c->rd), f->name,
                                "invalid length %zu, expected a multiple of %d bytes", len, width);
        return cond_err(c, "invalid_value", f->name, -1,
                        "%s bin length must be a multiple of %d bytes", f->name, width);
    }
    return 0;
}

static int parse_array_field(struct kvi_pctx *c, const struct kvi_field *f, void *out)
{
    bool tokens = f->kind == KVI_FK_TOKENS;
    bool dyn = c->d == KVI_DIALECT_DYNAMO;
    int width = tokens ? 4 : 8;
    void **dst = (void **)((char *)out + f->off);
    size_t *n = (size_t *)((char *)out + f->off2);
    enum kvi_vt vt = kvi_rd_peek(&c->rd);
    if (vt == KVI_VT_BIN)
        return parse_bin_array(c, f, width, dst, n);
    if (vt != KVI_VT_ARR) {
        if (vt == KVI_VT_BAD)
            return not_a_value(c);
        if (dyn)
            return dyn_bad_value(c, f->name, "a sequence");
        return cond_err(c, "not_array", f->name, -1, "%s must be an array", f->name);
    }
    /* Dynamo: u32 tokens, i64 hashes. Conductor: int32 tokens, u64 or
     * negative i64 hashes. */
    int64_t min = tokens ? (dyn ? 0 : INT32_MIN) : INT64_MIN;
    uint64_t max = tokens ? (dyn ? UINT32_MAX : INT32_MAX) : (dyn ? INT64_MAX : UINT64_MAX);
    struct kvi_elem_err e;
    int r = tokens ? kvi_rd_u32_array(&c->rd, min, max, (uint32_t **)dst, n, &e)
                   : kvi_rd_u64_array(&c->rd, min, max, (uint64_t **)dst, n, &e);
    if (r == 0)
        return 0;
    if (r < 0)
        return body_err(c);
    /* KVI_RD_ELEM: the reader is on the element */
    if (dyn) {
        char path[96];
        snprintf(path, sizeof(path), "%s[%zu]", f->name, e.index);
        return dyn_bad_value(c, path, tokens ? "u32" : "i64");
    }
    if (e.kind == KVI_EF_RANGE)
        return cond_err(c, "out_of_range", f->name, (int64_t)e.index,
                        tokens ? "%s element is outside the int32 range"
                               : "%s element is outside the 64-bit integer range",
                        f->name);
    return cond_err(c, "invalid_type", f->name, (int64_t)e.index, "%s element must be an integer",
                    f->name);
}

static int parse_type_field(struct kvi_pctx *c, const struct kvi_field *f, void *out)
{
    struct kvi_str s;
    int r = parse_str_field(c, f, &s);
    if (r != 0)
        return r;
    static const char *const names[] = {"vllm", "sglang", "mooncake"};
    for (int i = 0; i < 3; i++) {
        if (s.len == strlen(names[i]) && strncasecmp(s.p, names[i], s.len) == 0) {
            *(enum kvi_cond_type *)((char *)out + f->off) = (enum kvi_cond_type)i;
            return 0;
        }
    }
    return cond_err(c, "invalid_value", f->name, -1, "type must be vLLM, SGLang or Mooncake");
}

static int parse_cache_group(struct kvi_pctx *c, const struct kvi_field *f, void *out)
{
    struct kvi_num n;
    enum kvi_vt vt = kvi_rd_peek(&c->rd);
    if (vt != KVI_VT_INT && vt != KVI_VT_FLOAT) {
        if (vt == KVI_VT_BAD)
            return not_a_value(c);
        return cond_err(c, "invalid_type", f->name, -1, "cache_group must be an integer or null");
    }
    int r = kvi_rd_num(&c->rd, &n);
    if (r < 0)
        return body_err(c);
    if (r == KVI_NUM_FLOAT)
        return cond_err(c, "invalid_type", f->name, -1, "cache_group must be an integer or null");
    if (r == KVI_NUM_BIG)
        return cond_err(c, "unsupported", f->name, -1,
                        "cache_group beyond the 64-bit range is not supported (only 0)");
    if (r != 0 || n.mag != 0)
        return cond_err(c, "unsupported", f->name, -1,
                        "cache_group %s%llu is not supported (only 0)", n.neg ? "-" : "",
                        (unsigned long long)n.mag);
    *(bool *)((char *)out + f->off) = true;
    return 0;
}

static int parse_hash_profile(struct kvi_pctx *c, const struct kvi_field *f, void *out)
{
    struct kvi_hash_profile *hp = (struct kvi_hash_profile *)((char *)out + f->off);
    memset(hp, 0, sizeof(*hp));
    enum kvi_vt vt = kvi_rd_peek(&c->rd);
    if (vt != KVI_VT_OBJ) {
        if (vt == KVI_VT_BAD)
            return not_a_value(c);
        return cond_err(c, "invalid_type", f->name, -1, "hash_profile must be an object");
    }
    if (kvi_rd_obj_begin(&c->rd) != 0)
        return body_err(c);
    struct kvi_str key;
    int r;
    while ((r = kvi_rd_obj_next(&c->rd, &key)) == 1) {
        struct kvi_str *dst = NULL;
        if (kvi_str_eq(key, "strategy"))
            dst = &hp->strategy;
        else if (kvi_str_eq(key, "algorithm"))
            dst = &hp->algorithm;
        else if (kvi_str_eq(key, "python_hash_seed"))
            dst = &hp->python_hash_seed;
        else if (kvi_str_eq(key, "root_digest"))
            dst = &hp->root_digest;
        else if (kvi_str_eq(key, "index_projection"))
            dst = &hp->index_projection;
        if (dst == NULL || kvi_rd_null(&c->rd)) {
            /* unknown members are tolerated for forward compatibility */
            if (dst == NULL && kvi_rd_skip(&c->rd) != 0)
                return body_err(c);
            continue;
        }
        vt = kvi_rd_peek(&c->rd);
        if (vt == KVI_VT_STR) {
            if (kvi_rd_str(&c->rd, dst) != 0)
                return body_err(c);
            continue;
        }
        if (vt == KVI_VT_INT && dst == &hp->python_hash_seed) {
            struct kvi_num n;
            int nr = kvi_rd_num(&c->rd, &n);
            if (nr < 0)
                return body_err(c);
            if (nr == 0) {
                char tmp[24];
                size_t k = 0;
                if (n.neg)
                    tmp[k++] = '-';
                k += kvi_u64_to_dec(n.mag, tmp + k);
                char *d = kvi_scratch_strdup(c->rd._scratch, tmp, k);
                if (d == NULL)
                    return no_memory(c);
                dst->p = d;
                dst->len = k;
                continue;
            }
        }
        char fname[64];
        snprintf(fname, sizeof(fname), "hash_profile.%.*s", (int)kvi_utf8_prefix(key.p, key.len, 48), key.p);
        return cond_err(c, "invalid_type", fname, -1, "%s must be a string", fname);
    }
    return r < 0 ? body_err(c) : 0;
}

static int parse_value(struct kvi_pctx *c, const struct kvi_field *f, void *out)
{
    switch (f->kind) {
    case KVI_FK_U64:
    case KVI_FK_U32:
    case KVI_FK_U32_NZ:
    case KVI_FK_U64_NZ:
    case KVI_FK_POS_U32:
    case KVI_FK_RANK: return parse_int_field(c, f, out);
    case KVI_FK_STR: return parse_str_field(c, f, (struct kvi_str *)((char *)out + f->off));
    case KVI_FK_TOKENS:
    case KVI_FK_HASHES: return parse_array_field(c, f, out);
    case KVI_FK_TYPE: return parse_type_field(c, f, out);
    case KVI_FK_CACHE_GROUP: return parse_cache_group(c, f, out);
    case KVI_FK_HASH_PROFILE: return parse_hash_profile(c, f, out);
    default: return kvi_rd_skip(&c->rd) != 0 ? body_err(c) : 0;
    }
}

static int parse_fields(struct kvi_pctx *c, const struct kvi_field *f, size_t nf, void *out,
                        uint64_t *seen)
{
    struct kvi_rd *rd = &c->rd;
    uint64_t given = 0; /* keys present, null or not (duplicates) */
    *seen = 0;
    int r = kvi_rd_obj_begin(rd);
    if (r < 0)
        return body_err(c);
    if (r == KVI_RD_TYPE) {
        if (c->d == KVI_DIALECT_CONDUCTOR)
            return kvi_err__set(c->err, 400, "invalid_json", NULL, -1,
                                rd->enc == KVI_ENC_MSGPACK ? "Invalid msgpack object"
                                                           : "Invalid JSON object");
        char what[128];
        size_t off = kvi_rd_offset(rd);
        kvi_rd_describe(rd, what, sizeof(what));
        return dyn_data_err(c, off, NULL, "invalid type: %s, expected struct %s", what,
                            c->type_name);
    }
    struct kvi_str key;
    while ((r = kvi_rd_obj_next(rd, &key)) == 1) {
        const struct kvi_field *fi = NULL;
        for (size_t i = 0; i < nf; i++) {
            /* the first byte rules out most names before a strlen */
            if (key.len > 0 && key.p[0] == f[i].name[0] && kvi_str_eq(key, f[i].name)) {
                fi = &f[i];
                break;
            }
        }
        if (fi == NULL) {
            if (c->d == KVI_DIALECT_CONDUCTOR) {
                char fname[80];
                snprintf(fname, sizeof(fname), "%.*s", (int)kvi_utf8_prefix(key.p, key.len, 64), key.p);
                return cond_err(c, "unknown_field", fname, -1, "unsupported request field: %s",
                                fname);
            }
            if (kvi_rd_skip(rd) != 0)
                return body_err(c);
            continue;
        }
        if (given & KVI_BIT(fi->bit)) {
            if (c->d == KVI_DIALECT_DYNAMO)
                return dyn_data_err(c, kvi_rd_offset(rd), NULL, "duplicate field `%s`", fi->name);
            return cond_err(c, "invalid_value", fi->name, -1, "duplicate request field: %s",
                            fi->name);
        }
        given |= KVI_BIT(fi->bit);
        if (kvi_rd_peek(rd) == KVI_VT_NULL && (fi->flags & KVI_FF_NULL)) {
            kvi_rd_null(rd);
            continue;
        }
        if ((r = parse_value(c, fi, out)) != 0)
            return r;
        *seen |= KVI_BIT(fi->bit);
    }
    if (r < 0)
        return body_err(c);
    for (size_t i = 0; i < nf; i++) {
        if (!(f[i].flags & KVI_FF_REQ) || (*seen & KVI_BIT(f[i].bit)))
            continue;
        if (c->d == KVI_DIALECT_DYNAMO)
            return dyn_data_err(c, kvi_rd_offset(rd), NULL, "missing field `%s`", f[i].name);
        return cond_err(c, "missing", f[i].name, -1, "missing required field: %s", f[i].name);
    }
    if (kvi_rd_finish(rd) != 0)
        return body_err(c);
    return 0;
}

/* ---- score rows -------------------------------------------------------------------- */

static inline int row_cmp_inline(const struct kvi_score_row *x, const struct kvi_score_row *y)
{
    if (x->name != NULL || y->name != NULL) {
        if (x->name == NULL)
            return -1;
        if (y->name == NULL)
            return 1;
        int c = strcmp(x->name, y->name);
        if (c != 0)
            return c;
    } else if (x->instance_id != y->instance_id) {
        return x->instance_id < y->instance_id ? -1 : 1;
    }
    return x->dp_rank < y->dp_rank ? -1 : x->dp_rank > y->dp_rank;
}

static int row_cmp(const void *a, const void *b)
{
    return row_cmp_inline(a, b);
}

/* Above this many rows, qsort; below, insertion sort (both stable here:
 * glibc's qsort is a merge sort for arrays this small). */
#define KVI_ROWS_INSERTION_MAX 32

void kvi_rows__sort(struct kvi_score_row *rows, size_t n)
{
    /* The index lists matches by dense instance id, which usually follows
     * the ids: check for sorted input first. */
    size_t i = 1;
    while (i < n && row_cmp_inline(&rows[i - 1], &rows[i]) <= 0)
        i++;
    if (i >= n)
        return;
    if (n > KVI_ROWS_INSERTION_MAX) {
        qsort(rows, n, sizeof(*rows), row_cmp);
        return;
    }
    for (; i < n; i++) {
        struct kvi_score_row x = rows[i];
        size_t j = i;
        for (; j > 0 && row_cmp_inline(&rows[j - 1], &x) > 0; j--)
            rows[j] = rows[j - 1];
        rows[j] = x;
    }
}

int kvi_parse__fields(struct kvi_pctx *c, const struct kvi_field *f, size_t nf, void *out,
                      uint64_t *seen)
{
    int r = parse_fields(c, f, nf, out, seen);
    if (r != -EINVAL || c->d != KVI_DIALECT_CONDUCTOR || c->err->status != 400 ||
        (c->err->reason != NULL && strcmp(c->err->reason, "invalid_json") == 0))
        return r;
    /* The Conductor (JsonCpp, msgpack-c) parses the whole document before it
     * validates anything: a syntax error anywhere wins over a validation
     * error. Check the rest only on this (rare) path. */
    struct kvi_rd v;
    kvi_rd_init(&v, c->rd._base, (size_t)(c->rd._end - c->rd._base), c->rd.enc, c->rd._scratch);
    if (kvi_rd_skip(&v) != 0 || kvi_rd_finish(&v) != 0)
        return kvi_err__from_rd(c->err, c->d, &v);
    return r;
}
