/*
 * The route files' helper library: answering (from a buffer, from memory
 * reserved for the answer, with an encoded error, completing a deferred
 * control request), growing a loop thread's arrays, the tiered index
 * lookup into them, and the answer's encoding. Declared in
 * api/routes_internal.h; DESIGN: api/routes_common.h.
 */
#include "api/routes_internal.h"

#include <stdlib.h>

#include "engine/common.h"
#include "net/log.h"

void kvi_routes_send(struct kvi_http_res *res, int status, const char *ctype, const struct kvi_buf *b)
{
    if (!kvi_buf_ok(b)) {
        kvi_log_error("out of memory encoding an answer of status %d", status); /* every 500 is logged */
        kvi_http_error(res, 500, "out of memory");
        return;
    }
    kvi_http_respond(res, status, ctype, b->data, b->len);
}

char *kvi_routes_body(struct kvi_route_thread *t, struct kvi_http_res *res, size_t max)
{
    if (max <= KVI_ROUTES_POOL_BODY_MAX)
        return kvi_http_alloc(res, max);
    kvi_buf_reset(&t->out);
    return kvi_buf_reserve(&t->out, max);
}

void kvi_routes_send_body(struct kvi_route_thread *t, struct kvi_http_res *res, int status, const char *ctype,
                          const char *body, size_t len)
{
    if (body == t->out.data) /* the thread's buffer is reused by the next request: copy */
        kvi_http_respond(res, status, ctype, body, len);
    else
        kvi_http_respond_nocopy(res, status, ctype, body, len);
}

void kvi_routes_send_err(struct kvi_http_res *res, struct kvi_route_thread *t, enum kvi_dialect d,
                         enum kvi_body_enc enc, const struct kvi_api_err *e)
{
    const char *ctype = KVI_MIME_JSON;
    kvi_buf_reset(&t->out);
    if (kvi_err_encode(e, d, enc, &t->out, &ctype) != 0) {
        kvi_http_error(res, e->status, "%s", e->msg);
        return;
    }
    kvi_http_respond(res, e->status, ctype, t->out.data, t->out.len);
}

void kvi_routes_complete(struct kvi_ctl_req *c, int rc, int status, const struct kvi_api_err *e,
                         const struct kvi_buf *b)
{
    if (rc != 0) {
        struct kvi_buf eb;
        const char *ctype = KVI_MIME_JSON;
        kvi_buf_init(&eb);
        if (kvi_err_encode(e, c->dialect, c->enc, &eb, &ctype) == 0)
            kvi_http_complete(c->d, e->status, ctype, eb.data, eb.len);
        else
            kvi_http_complete_error(c->d, e->status, "%s", e->msg);
        kvi_buf_free(&eb);
        return;
    }
    if (!kvi_buf_ok(b)) {
        kvi_log_error("out of memory encoding an answer of status %d", status); /* every 500 is logged */
        kvi_http_complete_error(c->d, 500, "out of memory");
        return;
    }
    kvi_http_complete(c->d, status, c->enc == KVI_ENC_MSGPACK ? KVI_MIME_MSGPACK : KVI_MIME_JSON, b->data, b->len);
}

void kvi_routes_reserve(struct kvi_route_thread *t, size_t hashes, size_t tm, size_t rows)
{
    if (hashes > t->hashes_cap) {
        t->hashes_cap = hashes + hashes / 2;
        free(t->hashes);
        t->hashes = kvi_xmalloc(t->hashes_cap * sizeof *t->hashes);
    }
    if (tm > t->tm_cap) {
        t->tm_cap = tm + tm / 2;
        free(t->tm);
        t->tm = kvi_xmalloc(t->tm_cap * sizeof *t->tm);
    }
    if (rows > t->rows_cap) {
        t->rows_cap = rows + rows / 2;
        free(t->rows);
        t->rows = kvi_xmalloc(t->rows_cap * sizeof *t->rows);
    }
}

size_t kvi_routes_tiered(struct kvi_route_thread *t, const struct kvi_index *ix, const uint64_t *content,
                         const uint64_t *seq, size_t n)
{
    if (n == 0)
        return 0;
    size_t r = kvi_index_find_tiered(ix, content, seq, n, t->tm, t->tm_cap);
    if (r > t->tm_cap) {
        kvi_routes_reserve(t, 0, r, 0);
        r = kvi_index_find_tiered(ix, content, seq, n, t->tm, t->tm_cap);
        if (r > t->tm_cap)
            r = t->tm_cap; /* grew again meanwhile: answer with what fits */
    }
    return r;
}

enum kvi_body_enc kvi_routes_enc(const struct kvi_http_req *req, enum kvi_ctype ct)
{
    if (ct == KVI_CT_MSGPACK || kvi_accepts_msgpack(req->accept.p, req->accept.len))
        return KVI_ENC_MSGPACK;
    return KVI_ENC_JSON;
}
