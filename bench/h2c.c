/*
 * Minimal h2c client (see bench/h2c.h). RFC 9113 framing, RFC 7541 HPACK
 * for the request's literals and the response's :status only.
 */
#include "bench/h2c.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "engine/common.h"
#include "net/msgpack_wire.h"

enum {
    F_DATA = 0x0,
    F_HEADERS = 0x1,
    F_RST_STREAM = 0x3,
    F_SETTINGS = 0x4,
    F_PING = 0x6,
    F_GOAWAY = 0x7,
    F_WINDOW_UPDATE = 0x8,
    F_CONTINUATION = 0x9,
};
enum { FL_END_STREAM = 0x1, FL_ACK = 0x1, FL_END_HEADERS = 0x4, FL_PADDED = 0x8, FL_PRIORITY = 0x20 };
enum { S_HEADER_TABLE_SIZE = 0x1, S_ENABLE_PUSH = 0x2, S_INITIAL_WINDOW_SIZE = 0x4, S_MAX_FRAME_SIZE = 0x5 };

#define FRAME_HDR 9
#define OUR_MAX_FRAME 16384u /* the default; the server's frames to us are at most this */
#define MAX_WINDOW 0x7fffffffu
#define RBUF_CAP (4 * (FRAME_HDR + OUR_MAX_FRAME))

static const char PREFACE[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

struct kvi_h2c {
    int fd;
    char authority[300];
    uint32_t next_stream;
    int64_t conn_send_win;  /* the server's connection window for our DATA */
    int64_t init_send_win;  /* the server's SETTINGS_INITIAL_WINDOW_SIZE */
    uint32_t peer_max_frame;
    uint64_t recv_unacked;  /* DATA bytes received since our last connection WINDOW_UPDATE */
    bool got_settings;
    bool dead;
    uint8_t *rbuf;
    size_t rpos, rlen;
    uint8_t *wbuf;
    size_t wcap;
    uint8_t *body;
    size_t blen, bcap;
    uint8_t *hblk; /* header block of the response being read */
    size_t hlen, hcap;
};

/* The stream a request is waiting on. */
struct stream {
    uint32_t id;
    int64_t send_win;
    int status;
    bool headers_done;   /* the first header block is complete */
    bool in_headers;     /* CONTINUATION frames expected */
    bool end_after_hdrs; /* the HEADERS frame carried END_STREAM */
    bool done;
};

struct frame {
    uint32_t len;
    uint8_t type, flags;
    uint32_t sid;
    const uint8_t *p;
};

static void grow(uint8_t **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return;
    size_t n = *cap ? *cap : 4096;
    while (n < need)
        n *= 2;
    *buf = kvi_xrealloc(*buf, n);
    *cap = n;
}

static void put_frame_hdr(uint8_t *p, uint32_t len, uint8_t type, uint8_t flags, uint32_t sid)
{
    p[0] = (uint8_t)(len >> 16);
    p[1] = (uint8_t)(len >> 8);
    p[2] = (uint8_t)len;
    p[3] = type;
    p[4] = flags;
    p[5] = (uint8_t)(sid >> 24 & 0x7f);
    p[6] = (uint8_t)(sid >> 16);
    p[7] = (uint8_t)(sid >> 8);
    p[8] = (uint8_t)sid;
}

static int write_all(struct kvi_h2c *c, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            c->dead = true;
            return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -ECONNRESET;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Send one frame of up to 9 + 8 payload bytes built on the stack. */
static int send_small(struct kvi_h2c *c, uint8_t type, uint8_t flags, uint32_t sid, const uint8_t *pl, uint32_t n)
{
    uint8_t f[FRAME_HDR + 8];
    put_frame_hdr(f, n, type, flags, sid);
    if (n > 0)
        memcpy(f + FRAME_HDR, pl, n);
    return write_all(c, f, FRAME_HDR + n);
}

static int send_window_update(struct kvi_h2c *c, uint32_t sid, uint32_t inc)
{
    uint8_t p[4] = {(uint8_t)(inc >> 24 & 0x7f), (uint8_t)(inc >> 16), (uint8_t)(inc >> 8), (uint8_t)inc};
    return send_small(c, F_WINDOW_UPDATE, 0, sid, p, 4);
}

/* Read the next frame into c->rbuf; f->p stays valid until the next read. */
static int read_frame(struct kvi_h2c *c, struct frame *f)
{
    for (;;) {
        size_t avail = c->rlen - c->rpos;
        if (avail >= FRAME_HDR) {
            const uint8_t *h = c->rbuf + c->rpos;
            uint32_t len = (uint32_t)h[0] << 16 | (uint32_t)h[1] << 8 | h[2];
            if (len > OUR_MAX_FRAME) {
                c->dead = true;
                return -EPROTO;
            }
            if (avail >= FRAME_HDR + len) {
                f->len = len;
                f->type = h[3];
                f->flags = h[4];
                f->sid = kvi_load_be32(h + 5) & 0x7fffffffu;
                f->p = h + FRAME_HDR;
                c->rpos += FRAME_HDR + len;
                return 0;
            }
        }
        if (c->rpos > 0 && c->rlen + FRAME_HDR + OUR_MAX_FRAME > RBUF_CAP) {
            memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
            c->rlen -= c->rpos;
            c->rpos = 0;
        }
        ssize_t r = recv(c->fd, c->rbuf + c->rlen, RBUF_CAP - c->rlen, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            c->dead = true;
            return r == 0 ? -ECONNRESET : (errno == EAGAIN || errno == EWOULDBLOCK) ? -ETIMEDOUT : -EIO;
        }
        c->rlen += (size_t)r;
    }
}

/* ---- HPACK: the bits this client needs ------------------------------------------- */

/* Encode an integer with an n-bit prefix (RFC 7541 §5.1); first byte gets `hi`. */
static size_t hp_int(uint8_t *o, uint8_t hi, unsigned nbits, uint64_t v)
{
    uint64_t max = (1u << nbits) - 1;
    if (v < max) {
        o[0] = (uint8_t)(hi | v);
        return 1;
    }
    size_t k = 0;
    o[k++] = (uint8_t)(hi | max);
    v -= max;
    while (v >= 128) {
        o[k++] = (uint8_t)(v % 128 + 128);
        v /= 128;
    }
    o[k++] = (uint8_t)v;
    return k;
}

/* Decode an integer with an n-bit prefix. @return bytes used, 0 when malformed. */
static size_t hp_dec_int(const uint8_t *p, size_t n, unsigned nbits, uint64_t *v)
{
    if (n == 0)
        return 0;
    uint64_t max = (1u << nbits) - 1;
    *v = p[0] & max;
    if (*v < max)
        return 1;
    unsigned shift = 0;
    for (size_t k = 1; k < n && shift < 56; k++, shift += 7) {
        *v += (uint64_t)(p[k] & 0x7f) << shift;
        if (!(p[k] & 0x80))
            return k + 1;
    }
    return 0;
}

/* A literal field whose name is static index `idx` (literal without indexing, 4-bit prefix). */
static size_t hp_lit(uint8_t *o, unsigned idx, const char *v, size_t vlen)
{
    size_t k = hp_int(o, 0x00, 4, idx);
    k += hp_int(o + k, 0x00, 7, vlen);
    memcpy(o + k, v, vlen);
    return k + vlen;
}

/* Huffman-coded decimal digits (RFC 7541 Appendix B: '0'-'2' are 5-bit codes
 * 0x0-0x2, '3'-'9' 6-bit codes 0x19-0x1f). @return the number, or -1. */
static int huff_digits(const uint8_t *p, size_t n)
{
    uint64_t bits = 0;
    unsigned have = 0, used = 0;
    for (size_t i = 0; i < n && i < 7; i++) {
        bits = bits << 8 | p[i];
        have += 8;
    }
    int v = 0, digits = 0;
    while (have - used >= 5) {
        unsigned rest = have - used;
        unsigned c5 = (unsigned)(bits >> (rest - 5)) & 0x1f;
        if (c5 <= 2) {
            v = v * 10 + (int)c5;
            used += 5;
        } else if (rest >= 6 && ((bits >> (rest - 6)) & 0x3f) >= 0x19 && ((bits >> (rest - 6)) & 0x3f) <= 0x1f) {
            v = v * 10 + 3 + (int)(((bits >> (rest - 6)) & 0x3f) - 0x19);
            used += 6;
        } else {
            break; /* padding (all ones) or another symbol */
        }
        digits++;
    }
    return digits > 0 ? v : -1;
}

/* :status of a response header block (the first field). */
static int hp_status(const uint8_t *p, size_t n)
{
    static const int by_index[] = {[8] = 200, [9] = 204, [10] = 206, [11] = 304, [12] = 400, [13] = 404, [14] = 500};
    uint64_t v;
    size_t k;
    while (n > 0 && (p[0] & 0xe0) == 0x20) { /* dynamic table size updates */
        if ((k = hp_dec_int(p, n, 5, &v)) == 0)
            return -1;
        p += k;
        n -= k;
    }
    if (n == 0)
        return -1;
    if (p[0] & 0x80) { /* indexed field */
        if ((k = hp_dec_int(p, n, 7, &v)) == 0 || v >= KVI_ARRAY_LEN(by_index) || by_index[v] == 0)
            return -1;
        return by_index[v];
    }
    unsigned nbits = (p[0] & 0xc0) == 0x40 ? 6 : 4; /* incremental indexing, or without / never indexed */
    if ((k = hp_dec_int(p, n, nbits, &v)) == 0 || v != 8)
        return -1; /* a new name, or not :status */
    p += k;
    n -= k;
    if (n == 0)
        return -1;
    bool huff = p[0] & 0x80;
    if ((k = hp_dec_int(p, n, 7, &v)) == 0 || v > n - k || v == 0)
        return -1;
    p += k;
    if (huff)
        return huff_digits(p, (size_t)v);
    int s = 0;
    for (size_t i = 0; i < v; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        s = s * 10 + (p[i] - '0');
    }
    return s;
}

/* ---- frames ----------------------------------------------------------------------------- */

static int on_settings(struct kvi_h2c *c, const struct frame *f, struct stream *s)
{
    if (f->flags & FL_ACK)
        return 0;
    if (f->len % 6 != 0)
        return -EPROTO;
    for (uint32_t i = 0; i < f->len; i += 6) {
        uint16_t id = (uint16_t)(f->p[i] << 8 | f->p[i + 1]);
        uint32_t v = kvi_load_be32(f->p + i + 2);
        if (id == S_INITIAL_WINDOW_SIZE) {
            if (s != NULL)
                s->send_win += (int64_t)v - c->init_send_win;
            c->init_send_win = v;
        } else if (id == S_MAX_FRAME_SIZE) {
            c->peer_max_frame = v;
        }
    }
    c->got_settings = true;
    return send_small(c, F_SETTINGS, FL_ACK, 0, NULL, 0);
}

/* Strip padding (and priority fields) from a DATA or HEADERS payload. */
static int unpad(const struct frame *f, const uint8_t **p, size_t *n)
{
    *p = f->p;
    *n = f->len;
    if (f->flags & FL_PADDED) {
        if (*n < 1 || (size_t)(*p)[0] + 1 > *n)
            return -EPROTO;
        size_t pad = (*p)[0];
        *p += 1;
        *n -= 1 + pad;
    }
    if (f->type == F_HEADERS && (f->flags & FL_PRIORITY)) {
        if (*n < 5)
            return -EPROTO;
        *p += 5;
        *n -= 5;
    }
    return 0;
}

static void end_headers(struct kvi_h2c *c, struct stream *s)
{
    s->in_headers = false;
    if (!s->headers_done) {
        s->status = hp_status(c->hblk, c->hlen);
        s->headers_done = true;
    }
    if (s->end_after_hdrs)
        s->done = true;
}

/* Handle one frame; s is the stream waited on (NULL during setup). */
static int on_frame(struct kvi_h2c *c, const struct frame *f, struct stream *s)
{
    const uint8_t *p;
    size_t n;
    int rc;
    bool mine = s != NULL && f->sid == s->id;
    if (s != NULL && s->in_headers && f->type != F_CONTINUATION)
        return -EPROTO;
    switch (f->type) {
    case F_DATA:
        c->recv_unacked += f->len;
        if ((rc = unpad(f, &p, &n)) < 0)
            return rc;
        if (mine) {
            grow(&c->body, &c->bcap, c->blen + n + 1);
            memcpy(c->body + c->blen, p, n);
            c->blen += n;
            if (f->flags & FL_END_STREAM)
                s->done = true;
        }
        return 0;
    case F_HEADERS:
        if ((rc = unpad(f, &p, &n)) < 0)
            return rc;
        if (!mine)
            return 0;
        c->hlen = 0;
        grow(&c->hblk, &c->hcap, n);
        memcpy(c->hblk, p, n);
        c->hlen = n;
        s->end_after_hdrs = f->flags & FL_END_STREAM;
        s->in_headers = true;
        if (f->flags & FL_END_HEADERS)
            end_headers(c, s);
        return 0;
    case F_CONTINUATION:
        if (!mine || !s->in_headers)
            return -EPROTO;
        grow(&c->hblk, &c->hcap, c->hlen + f->len);
        memcpy(c->hblk + c->hlen, f->p, f->len);
        c->hlen += f->len;
        if (f->flags & FL_END_HEADERS)
            end_headers(c, s);
        return 0;
    case F_SETTINGS:
        return on_settings(c, f, s);
    case F_PING:
        if (f->len != 8)
            return -EPROTO;
        return (f->flags & FL_ACK) ? 0 : send_small(c, F_PING, FL_ACK, 0, f->p, 8);
    case F_WINDOW_UPDATE:
        if (f->len != 4)
            return -EPROTO;
        if (f->sid == 0)
            c->conn_send_win += kvi_load_be32(f->p) & 0x7fffffffu;
        else if (mine)
            s->send_win += kvi_load_be32(f->p) & 0x7fffffffu;
        return 0;
    case F_RST_STREAM:
        return mine ? -ECONNABORTED : 0;
    case F_GOAWAY:
        c->dead = true;
        if (f->len >= 4 && s != NULL && (kvi_load_be32(f->p) & 0x7fffffffu) >= s->id)
            return 0; /* our stream is still served; the connection goes afterwards */
        return -ECONNRESET;
    default:
        return 0; /* PRIORITY, PUSH_PROMISE (disabled), unknown types */
    }
}

/* ---- connection --------------------------------------------------------------------------- */

static int dial(const char *host, uint16_t port, unsigned timeout_ms, char *err, size_t err_len)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc != 0) {
        snprintf(err, err_len, "%s: %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = res; a != NULL && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            snprintf(err, err_len, "connect %s:%u: %s", host, port, strerror(errno));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {(time_t)(timeout_ms / 1000), (suseconds_t)(timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    return fd;
}

struct kvi_h2c *kvi_h2c_connect(const char *host, uint16_t port, unsigned timeout_ms, char *err, size_t err_len)
{
    int fd = dial(host, port, timeout_ms, err, err_len);
    if (fd < 0)
        return NULL;
    struct kvi_h2c *c = kvi_xcalloc(1, sizeof *c);
    c->fd = fd;
    snprintf(c->authority, sizeof c->authority, "%s:%u", host, port);
    c->next_stream = 1;
    c->conn_send_win = 65535;
    c->init_send_win = 65535;
    c->peer_max_frame = 16384;
    c->rbuf = kvi_xmalloc(RBUF_CAP);
    /* preface, SETTINGS (no dynamic table, no push, largest stream window), connection WINDOW_UPDATE */
    uint8_t out[sizeof PREFACE - 1 + FRAME_HDR + 18 + FRAME_HDR + 4], *o = out;
    memcpy(o, PREFACE, sizeof PREFACE - 1);
    o += sizeof PREFACE - 1;
    put_frame_hdr(o, 18, F_SETTINGS, 0, 0);
    o += FRAME_HDR;
    const struct {
        uint16_t id;
        uint32_t v;
    } set[3] = {{S_HEADER_TABLE_SIZE, 0}, {S_ENABLE_PUSH, 0}, {S_INITIAL_WINDOW_SIZE, MAX_WINDOW}};
    for (int i = 0; i < 3; i++) {
        *o++ = (uint8_t)(set[i].id >> 8);
        *o++ = (uint8_t)set[i].id;
        for (int b = 3; b >= 0; b--)
            *o++ = (uint8_t)(set[i].v >> (8 * b));
    }
    uint32_t inc = MAX_WINDOW - 65535u;
    put_frame_hdr(o, 4, F_WINDOW_UPDATE, 0, 0);
    o += FRAME_HDR;
    for (int b = 3; b >= 0; b--)
        *o++ = (uint8_t)(inc >> (8 * b));
    int rc = write_all(c, out, (size_t)(o - out));
    struct frame f;
    while (rc == 0 && !c->got_settings && (rc = read_frame(c, &f)) == 0)
        rc = on_frame(c, &f, NULL);
    if (rc != 0) {
        snprintf(err, err_len, "HTTP/2 handshake with %s failed: %s", c->authority, strerror(-rc));
        kvi_h2c_close(c);
        return NULL;
    }
    return c;
}

void kvi_h2c_close(struct kvi_h2c *c)
{
    if (c == NULL)
        return;
    close(c->fd);
    free(c->rbuf);
    free(c->wbuf);
    free(c->body);
    free(c->hblk);
    free(c);
}

/* Append DATA frames for as much of the body as the windows allow. */
static size_t add_data(struct kvi_h2c *c, struct stream *s, size_t *wlen, const uint8_t *body, size_t left)
{
    size_t sent = 0;
    while (left > 0) {
        int64_t win = KVI_MIN(c->conn_send_win, s->send_win);
        size_t chunk = KVI_MIN(left, (size_t)KVI_MIN((uint64_t)c->peer_max_frame, (uint64_t)KVI_MAX(win, 0)));
        if (chunk == 0)
            break;
        grow(&c->wbuf, &c->wcap, *wlen + FRAME_HDR + chunk);
        put_frame_hdr(c->wbuf + *wlen, (uint32_t)chunk, F_DATA, chunk == left ? FL_END_STREAM : 0, s->id);
        memcpy(c->wbuf + *wlen + FRAME_HDR, body + sent, chunk);
        *wlen += FRAME_HDR + chunk;
        c->conn_send_win -= (int64_t)chunk;
        s->send_win -= (int64_t)chunk;
        sent += chunk;
        left -= chunk;
    }
    return sent;
}

int kvi_h2c_post(struct kvi_h2c *c, const char *path, const char *ctype, const void *body, size_t len,
                 struct kvi_h2c_resp *out)
{
    if (c->dead || c->next_stream > 0x7fffff00u)
        return -ECONNRESET;
    struct stream s = {.id = c->next_stream, .send_win = c->init_send_win, .status = -1};
    c->next_stream += 2;
    size_t plen = strlen(path), clen = ctype ? strlen(ctype) : 0, alen = strlen(c->authority);
    char cl[24];
    int cll = snprintf(cl, sizeof cl, "%zu", len);
    size_t hmax = 2 + 3 * 10 + plen + alen + clen + (size_t)cll;
    grow(&c->wbuf, &c->wcap, FRAME_HDR + hmax);
    uint8_t *h = c->wbuf + FRAME_HDR;
    size_t k = 0;
    h[k++] = 0x83; /* :method POST */
    h[k++] = 0x86; /* :scheme http */
    k += hp_lit(h + k, 4, path, plen);            /* :path */
    k += hp_lit(h + k, 1, c->authority, alen);    /* :authority */
    if (ctype != NULL)
        k += hp_lit(h + k, 31, ctype, clen);      /* content-type */
    k += hp_lit(h + k, 28, cl, (size_t)cll);      /* content-length */
    put_frame_hdr(c->wbuf, (uint32_t)k, F_HEADERS, FL_END_HEADERS | (len == 0 ? FL_END_STREAM : 0), s.id);
    size_t wlen = FRAME_HDR + k;
    const uint8_t *b = body;
    size_t sent = add_data(c, &s, &wlen, b, len);
    c->blen = 0;
    int rc = write_all(c, c->wbuf, wlen);
    struct frame f;
    while (rc == 0 && !s.done) {
        if ((rc = read_frame(c, &f)) != 0 || (rc = on_frame(c, &f, &s)) != 0)
            break;
        if (sent < len && !s.done) { /* the windows opened: send more of the body */
            wlen = 0;
            sent += add_data(c, &s, &wlen, b + sent, len - sent);
            if (wlen > 0)
                rc = write_all(c, c->wbuf, wlen);
        }
    }
    if (rc == 0 && c->recv_unacked >= (1u << 30)) {
        rc = send_window_update(c, 0, (uint32_t)c->recv_unacked);
        c->recv_unacked = 0;
    }
    if (rc != 0)
        return rc;
    out->status = s.status;
    out->body = c->body ? c->body : (const uint8_t *)"";
    out->len = c->blen;
    return 0;
}
