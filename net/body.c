/*
 * kvidx body layer, the format-independent part: the output buffer, the
 * scratch allocator, the reader's state and error reporting, and the public
 * kvi_rd_* / kvi_wr_* entry points, which dispatch on the body's encoding to
 * body_json.c or body_msgpack.c. Contract: net/body.h; the two encodings'
 * entry points: net/body_internal.h.
 */
#include "net/body.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "net/body_internal.h"

/* ---- buffer ----------------------------------------------------------------- */

void kvi_buf_init(struct kvi_buf *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->oom = false;
}

void kvi_buf_free(struct kvi_buf *b)
{
    free(b->data);
    kvi_buf_init(b);
}

void kvi_buf_reset(struct kvi_buf *b)
{
    b->len = 0;
    b->oom = false;
}

char *kvi_buf_reserve(struct kvi_buf *b, size_t n)
{
    if (b->oom)
        return NULL;
    if (b->cap - b->len >= n && b->data != NULL) /* never NULL + 0 */
        return b->data + b->len;
    size_t need = b->len + n;
    if (need < b->len)
        goto fail;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > SIZE_MAX / 2)
            goto fail;
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (p == NULL)
        goto fail;
    b->data = p;
    b->cap = cap;
    return p + b->len;
fail:
    b->oom = true;
    return NULL;
}

void kvi_buf_put(struct kvi_buf *b, const void *p, size_t n)
{
    char *w = kvi_buf_reserve(b, n);
    if (w == NULL || n == 0)
        return;
    memcpy(w, p, n);
    b->len += n;
}

void kvi_buf_puts(struct kvi_buf *b, const char *s)
{
    kvi_buf_put(b, s, strlen(s));
}

void kvi_buf_putc(struct kvi_buf *b, char c)
{
    char *w = kvi_buf_reserve(b, 1);
    if (w == NULL)
        return;
    *w = c;
    b->len++;
}

const char kvi__digits2[201] = "00010203040506070809"
                               "10111213141516171819"
                               "20212223242526272829"
                               "30313233343536373839"
                               "40414243444546474849"
                               "50515253545556575859"
                               "60616263646566676869"
                               "70717273747576777879"
                               "80818283848586878889"
                               "90919293949596979899";

unsigned kvi_dec_len(uint64_t v)
{
    return kvi__dec_len(v);
}

size_t kvi_u64_to_dec(uint64_t v, char *out)
{
    return (size_t)(kvi__w_dec(out, v) - out);
}


void kvi_buf_put_u64(struct kvi_buf *b, uint64_t v)
{
    char *w = kvi_buf_reserve(b, 20);
    if (w == NULL)
        return;
    b->len += kvi_u64_to_dec(v, w);
}

void kvi_buf_put_i64(struct kvi_buf *b, int64_t v)
{
    if (v < 0) {
        kvi_buf_putc(b, '-');
        kvi_buf_put_u64(b, (uint64_t)0 - (uint64_t)v);
    } else {
        kvi_buf_put_u64(b, (uint64_t)v);
    }
}

void kvi_buf_consume(struct kvi_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}

/* ---- scratch ------------------------------------------------------------------ */

struct kvi_scratch_chunk {
    struct kvi_scratch_chunk *next;
    size_t cap;
    size_t used;
    size_t _pad; /* keeps data 16-byte aligned */
    unsigned char data[];
};

#define KVI_SCRATCH_MIN_CHUNK (16u * 1024u)

void kvi_scratch_init(struct kvi_scratch *s)
{
    s->_head = NULL;
}

void kvi_scratch_free(struct kvi_scratch *s)
{
    struct kvi_scratch_chunk *c = s->_head;
    while (c != NULL) {
        struct kvi_scratch_chunk *next = c->next;
        free(c);
        c = next;
    }
    s->_head = NULL;
}

void kvi_scratch_reset(struct kvi_scratch *s)
{
    struct kvi_scratch_chunk *keep = NULL;
    for (struct kvi_scratch_chunk *c = s->_head; c != NULL; c = c->next)
        if (keep == NULL || c->cap > keep->cap)
            keep = c;
    struct kvi_scratch_chunk *c = s->_head;
    while (c != NULL) {
        struct kvi_scratch_chunk *next = c->next;
        if (c != keep)
            free(c);
        c = next;
    }
    if (keep != NULL) {
        keep->next = NULL;
        keep->used = 0;
    }
    s->_head = keep;
}

void *kvi_scratch_alloc(struct kvi_scratch *s, size_t n)
{
    n = (n + 7) & ~(size_t)7;
    if (n == 0)
        n = 8;
    struct kvi_scratch_chunk *c = s->_head;
    if (c != NULL && c->cap - c->used >= n) {
        void *p = c->data + c->used;
        c->used += n;
        return p;
    }
    size_t cap = n > KVI_SCRATCH_MIN_CHUNK ? n : KVI_SCRATCH_MIN_CHUNK;
    if (cap > SIZE_MAX - sizeof(*c))
        return NULL;
    struct kvi_scratch_chunk *nc = malloc(sizeof(*nc) + cap);
    if (nc == NULL)
        return NULL;
    nc->cap = cap;
    nc->used = n;
    /* Keep the chunk with more room in front, so small allocations after a
     * big one still fill the previous chunk. */
    if (c != NULL && c->cap - c->used > cap - n) {
        nc->next = c->next;
        c->next = nc;
    } else {
        nc->next = c;
        s->_head = nc;
    }
    return nc->data;
}

char *kvi_scratch_strdup(struct kvi_scratch *s, const char *p, size_t n)
{
    char *d = kvi_scratch_alloc(s, n + 1);
    if (d == NULL)
        return NULL;
    if (n)
        memcpy(d, p, n);
    d[n] = '\0';
    return d;
}

/* ---- reader: common ---------------------------------------------------------- */

void kvi_rd_init(struct kvi_rd *rd, const void *body, size_t len, enum kvi_body_enc enc,
                 struct kvi_scratch *scratch)
{
    rd->_base = body;
    rd->_p = body;
    rd->_end = rd->_p + len;
    rd->_scratch = scratch;
    rd->enc = enc;
    rd->_depth = 0;
    rd->err = 0;
    rd->err_off = 0;
    rd->err_what = NULL;
}

int kvi_rd__fail(struct kvi_rd *rd, const char *what)
{
    if (rd->err == 0) {
        rd->err = -EBADMSG;
        rd->err_off = (size_t)(rd->_p - rd->_base);
        rd->err_what = what;
    }
    return rd->err;
}

int kvi_rd__nomem(struct kvi_rd *rd)
{
    if (rd->err == 0) {
        rd->err = -ENOMEM;
        rd->err_off = (size_t)(rd->_p - rd->_base);
        rd->err_what = "out of memory";
    }
    return rd->err;
}

size_t kvi_rd_offset(const struct kvi_rd *rd)
{
    return (size_t)(rd->_p - rd->_base);
}

void kvi_rd_line_col(const struct kvi_rd *rd, size_t off, size_t *line, size_t *col)
{
    size_t ln = 1, last_nl = 0;
    const uint8_t *end = rd->_base + off;
    if (end > rd->_end)
        end = rd->_end;
    for (const uint8_t *p = rd->_base; p < end; p++) {
        if (*p == '\n') {
            ln++;
            last_nl = (size_t)(p - rd->_base) + 1;
        }
    }
    *line = ln;
    *col = off - last_nl + 1;
}

/* ---- reader: UTF-8 and containers (both encodings) ------------------------------- */

/* Length of the valid UTF-8 sequence starting at p (lead byte >= 0x80), or 0. */
size_t kvi__utf8_seq(const uint8_t *p, const uint8_t *end)
{
    uint8_t c = p[0];
    size_t n;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if ((size_t)(end - p) < n)
        return 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

int kvi_rd__push(struct kvi_rd *rd, uint32_t remain)
{
    if (rd->_depth >= KVI_RD_MAX_DEPTH)
        return kvi_rd__fail(rd, "recursion limit exceeded");
    rd->_first[rd->_depth] = 1;
    rd->_remain[rd->_depth] = remain;
    rd->_depth++;
    return 0;
}

size_t kvi_utf8_prefix(const char *p, size_t len, size_t max)
{
    if (len <= max)
        return len;
    size_t n = max;
    while (n > 0 && ((unsigned char)p[n] & 0xC0) == 0x80) /* p[n] continues a character */
        n--;
    return n;
}

/* ---- reader: public, dispatching on the encoding -------------------------------- */

enum kvi_vt kvi_rd_peek(struct kvi_rd *rd)
{
    if (rd->err)
        return KVI_VT_BAD;
    return rd->enc == KVI_ENC_MSGPACK ? kvi_mp__peek(rd) : kvi_js__peek(rd);
}

int kvi_rd_obj_begin(struct kvi_rd *rd)
{
    if (rd->err)
        return rd->err;
    return rd->enc == KVI_ENC_MSGPACK ? kvi_mp__obj_begin(rd) : kvi_js__obj_begin(rd);
}

int kvi_rd_obj_next(struct kvi_rd *rd, struct kvi_str *key)
{
    if (rd->err)
        return rd->err;
    return rd->enc == KVI_ENC_MSGPACK ? kvi_mp__obj_next(rd, key) : kvi_js__obj_next(rd, key);
}

int kvi_rd_arr_begin(struct kvi_rd *rd)
{
    if (rd->err)
        return rd->err;
    return rd->enc == KVI_ENC_MSGPACK ? kvi_mp__arr_begin(rd, NULL) : kvi_js__arr_begin(rd);
}

int kvi_rd_arr_next(struct kvi_rd *rd)
{
    if (rd->err)
        return rd->err;
    return rd->enc == KVI_ENC_MSGPACK ? kvi_mp__arr_next(rd) : kvi_js__arr_next(rd);
}

int kvi_rd_str(struct kvi_rd *rd, struct kvi_str *out)
{
    if (rd->err)
        return rd->err;
    return rd->enc == KVI_ENC_MSGPACK ? kvi_mp__str(rd, out) : kvi_js__str(rd, out);
}

int kvi_rd_num(struct kvi_rd *rd, struct kvi_num *out)
{
    *out = (struct kvi_num){0}; /* defined on every return, not only 0 */
    if (rd->err)
        return rd->err;
    return rd->enc == KVI_ENC_MSGPACK ? kvi_mp__num(rd, out) : kvi_js__num(rd, out);
}

int kvi_rd_bool(struct kvi_rd *rd, bool *out)
{
    if (rd->err)
        return rd->err;
    return rd->enc == KVI_ENC_MSGPACK ? kvi_mp__bool(rd, out) : kvi_js__bool(rd, out);
}

bool kvi_rd_null(struct kvi_rd *rd)
{
    if (rd->err)
        return false;
    return rd->enc == KVI_ENC_MSGPACK ? kvi_mp__null(rd) : kvi_js__null(rd);
}

int kvi_rd_bin(struct kvi_rd *rd, const uint8_t **p, size_t *len)
{
    if (rd->err)
        return rd->err;
    return rd->enc == KVI_ENC_MSGPACK ? kvi_mp__bin(rd, p, len) : kvi_js__bin(rd);
}

int kvi_rd_skip(struct kvi_rd *rd)
{
    if (rd->err)
        return rd->err;
    return rd->enc == KVI_ENC_MSGPACK ? kvi_mp__skip(rd) : kvi_js__skip(rd);
}

int kvi_rd_finish(struct kvi_rd *rd)
{
    if (rd->err)
        return rd->err;
    if (rd->enc == KVI_ENC_JSON)
        kvi_js__ws(rd);
    if (rd->_p != rd->_end)
        return kvi_rd__fail(rd, "trailing characters");
    return 0;
}

void kvi_rd_describe(struct kvi_rd *rd, char *out, size_t cap)
{
    if (cap == 0)
        return;
    out[0] = '\0';
    if (rd->err)
        return;
    if (rd->enc == KVI_ENC_MSGPACK)
        kvi_mp__describe(rd, out, cap);
    else
        kvi_js__describe(rd, out, cap);
}

/* ---- reader: integer arrays (the token-id hot path) ------------------------------ */

int kvi_rd_u32_array(struct kvi_rd *rd, int64_t min, uint64_t max, uint32_t **out, size_t *n,
                     struct kvi_elem_err *e)
{
    if (rd->err)
        return rd->err;
    void *a = NULL;
    int r = rd->enc == KVI_ENC_MSGPACK ? kvi_mp__int_array(rd, min, max, &a, n, e, 4)
                                       : kvi_js__int_array(rd, min, max, &a, n, e, 4);
    if (r == 0)
        *out = a;
    return r;
}

int kvi_rd_u64_array(struct kvi_rd *rd, int64_t min, uint64_t max, uint64_t **out, size_t *n,
                     struct kvi_elem_err *e)
{
    if (rd->err)
        return rd->err;
    void *a = NULL;
    int r = rd->enc == KVI_ENC_MSGPACK ? kvi_mp__int_array(rd, min, max, &a, n, e, 8)
                                       : kvi_js__int_array(rd, min, max, &a, n, e, 8);
    if (r == 0)
        *out = a;
    return r;
}

/* ---- key peeking for dialect detection ---------------------------------------- */

int kvi_rd_peek_keys(const void *body, size_t len, enum kvi_body_enc enc,
                     int (*fn)(void *ctx, struct kvi_str key, enum kvi_vt vt), void *ctx)
{
    struct kvi_scratch scratch;
    kvi_scratch_init(&scratch);
    struct kvi_rd rd;
    kvi_rd_init(&rd, body, len, enc, &scratch);
    int ret = 0;
    if (kvi_rd_obj_begin(&rd) != 0) {
        ret = -EBADMSG;
        goto out;
    }
    for (;;) {
        struct kvi_str key;
        int r = kvi_rd_obj_next(&rd, &key);
        if (r <= 0) {
            ret = r < 0 ? -EBADMSG : 0;
            break;
        }
        enum kvi_vt vt = kvi_rd_peek(&rd);
        if (fn(ctx, key, vt) != 0)
            break;
        if (enc == KVI_ENC_MSGPACK) {
            if (kvi_rd_skip(&rd) != 0) {
                ret = -EBADMSG;
                break;
            }
        } else {
            const uint8_t *q = kvi_js__fast_skip(rd._p, rd._end);
            if (q == NULL) {
                ret = -EBADMSG;
                break;
            }
            rd._p = q;
        }
    }
out:
    kvi_scratch_free(&scratch);
    return ret;
}

/* ---- writer: the container stack, dispatching on the encoding -------------------- */

void kvi_wr_init(struct kvi_wr *w, struct kvi_buf *b, enum kvi_body_enc enc)
{
    w->b = b;
    w->enc = enc;
    w->_depth = 0;
    w->_after_key = false;
}

static void wr_open(struct kvi_wr *w, uint32_t n, bool obj)
{
    if (w->enc == KVI_ENC_MSGPACK) {
        if (obj)
            kvi_mp__put_map(w->b, n);
        else
            kvi_mp__put_arr(w->b, n);
    } else {
        kvi_js__wr_open(w, obj);
    }
    if (w->_depth >= KVI_WR_MAX_DEPTH) {
        w->b->oom = true; /* programming error surfaces as a failed encode */
        return;
    }
    w->_first[w->_depth] = 1;
    w->_is_obj[w->_depth] = obj;
    w->_depth++;
}

void kvi_wr_obj(struct kvi_wr *w, uint32_t n)
{
    wr_open(w, n, true);
}

void kvi_wr_arr(struct kvi_wr *w, uint32_t n)
{
    wr_open(w, n, false);
}

void kvi_wr_end(struct kvi_wr *w)
{
    if (w->_depth == 0)
        return;
    w->_depth--;
    if (w->enc == KVI_ENC_JSON)
        kvi_js__wr_close(w, w->_is_obj[w->_depth]);
}

void kvi_wr_key(struct kvi_wr *w, const char *s, size_t len)
{
    if (w->enc == KVI_ENC_MSGPACK)
        kvi_mp__put_str(w->b, s, len);
    else
        kvi_js__wr_key(w, s, len);
}

void kvi_wr_keyz(struct kvi_wr *w, const char *s)
{
    kvi_wr_key(w, s, strlen(s));
}

void kvi_wr_key_u64(struct kvi_wr *w, uint64_t v)
{
    char tmp[20];
    kvi_wr_key(w, tmp, kvi_u64_to_dec(v, tmp));
}

void kvi_wr_str(struct kvi_wr *w, const char *s, size_t len)
{
    if (w->enc == KVI_ENC_MSGPACK)
        kvi_mp__put_str(w->b, s, len);
    else
        kvi_js__wr_str(w, s, len);
}

void kvi_wr_strz(struct kvi_wr *w, const char *s)
{
    kvi_wr_str(w, s, strlen(s));
}

void kvi_wr_u64(struct kvi_wr *w, uint64_t v)
{
    if (w->enc == KVI_ENC_MSGPACK)
        kvi_mp__put_u64(w->b, v);
    else
        kvi_js__wr_u64(w, v);
}

void kvi_wr_i64(struct kvi_wr *w, int64_t v)
{
    if (w->enc == KVI_ENC_MSGPACK)
        kvi_mp__put_i64(w->b, v);
    else
        kvi_js__wr_i64(w, v);
}

void kvi_wr_bool(struct kvi_wr *w, bool v)
{
    if (w->enc == KVI_ENC_MSGPACK)
        kvi_mp__put_bool(w->b, v);
    else
        kvi_js__wr_bool(w, v);
}

void kvi_wr_null(struct kvi_wr *w)
{
    if (w->enc == KVI_ENC_MSGPACK)
        kvi_mp__put_nil(w->b);
    else
        kvi_js__wr_null(w);
}
