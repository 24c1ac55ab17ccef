/*
 * A minimal blocking HTTP/2 cleartext client (h2c with prior knowledge) for
 * the end-to-end trace benchmark (bench/ only).
 *
 * Why not libcurl: Debian 12's libcurl 7.88 cannot reuse a prior-knowledge
 * h2c connection (c-stack.md §2.2), so every query would pay a TCP and
 * HTTP/2 handshake, and an easy handle costs tens of microseconds of client
 * CPU per request, more than the server spends. This client keeps one
 * connection, sends each request as one HEADERS frame (HPACK literals,
 * nothing indexed, no Huffman) plus DATA frames in a single write, and reads
 * frames until the stream ends: one write and usually one read per request.
 *
 * Scope: one request in flight per connection (streams 1, 3, 5, ...); flow
 * control in both directions (the client announces the largest windows and
 * tops up the connection window; request bodies wait for the server's
 * WINDOW_UPDATEs); SETTINGS and PING are answered; server push is disabled.
 * The response status is decoded when HPACK gives it as a static-table
 * index (200, 204, 206, 304, 400, 404, 500) or as a literal (plain or
 * Huffman-coded digits); the client sets SETTINGS_HEADER_TABLE_SIZE = 0 so
 * the server never refers to a dynamic table. Other response headers are not
 * decoded.
 *
 * Threads: a client is used by one thread at a time.
 */
#ifndef KVI_BENCH_H2C_H
#define KVI_BENCH_H2C_H

#include <stddef.h>
#include <stdint.h>

struct kvi_h2c;

/** A response; body points into the client and is valid until its next call. */
struct kvi_h2c_resp {
    int status; /* HTTP status; -1 when the server encoded it in a way this client does not decode */
    const uint8_t *body;
    size_t len;
};

/**
 * Connect to @p host:@p port and exchange the HTTP/2 preface and SETTINGS.
 * @param timeout_ms  send/receive timeout of every later call
 * @return the client, or NULL with a message in @p err.
 */
struct kvi_h2c *kvi_h2c_connect(const char *host, uint16_t port, unsigned timeout_ms, char *err, size_t err_len);

/** Close the connection and free the client (NULL is a no-op). */
void kvi_h2c_close(struct kvi_h2c *c);

/**
 * POST @p len bytes of @p body to @p path with Content-Type @p ctype and wait
 * for the whole response.
 * @return 0 (any status, see @p out), -ECONNRESET (the server closed or sent
 *         GOAWAY: reconnect), -ETIMEDOUT, -ECONNABORTED (the stream was
 *         reset), -EPROTO (a malformed frame), -EIO.
 */
int kvi_h2c_post(struct kvi_h2c *c, const char *path, const char *ctype, const void *body, size_t len,
                 struct kvi_h2c_resp *out);

#endif
