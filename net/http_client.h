/*
 * kvidx HTTP client: blocking GET/POST on libcurl, for P2P recovery (a
 * peer's streamed /dump, http-api.md §1.16) and replica sync.
 *
 * The response body is handed to a callback as it arrives, so a large dump
 * is applied while it downloads and never sits whole in memory. Errors keep
 * the transport (no answer) apart from the status (an answer that is not
 * 2xx).
 *
 * Protocols: HTTP/1.1; HTTP/2 cleartext through `Upgrade: h2c` or with prior
 * knowledge; HTTPS with ALPN (h2 preferred when an HTTP/2 mode is chosen).
 * Debian 12's libcurl 7.88.1 cannot reuse a prior-knowledge h2c connection
 * (c-stack.md §2.2), so in that mode every request opens a new connection;
 * the other modes keep connections alive between requests.
 *
 * Threads: a client is one libcurl easy handle (driven through a multi
 * handle of its own); use it from one thread at a time (one client per
 * thread). Creating the first client initialises libcurl process-wide (once,
 * thread-safe).
 *
 * Cancellation: with options.cancel set, a request that is connecting,
 * waiting for the answer or receiving the body stops within about
 * KVI_HTTP_CLIENT_CANCEL_POLL_MS of the hook answering true, and returns
 * -ECANCELED (a shutdown need not wait for a peer that never answers).
 */
#ifndef KVI_NET_HTTP_CLIENT_H
#define KVI_NET_HTTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/common.h"

struct kvi_http_client;

/** How to speak to the server. */
enum kvi_http_client_proto {
    KVI_HTTP_CLIENT_H1 = 0,      /* HTTP/1.1 (HTTPS: ALPN http/1.1) */
    KVI_HTTP_CLIENT_H2C_UPGRADE, /* http://: HTTP/1.1 with Upgrade: h2c; https://: ALPN h2 */
    KVI_HTTP_CLIENT_H2C_PRIOR,   /* http://: HTTP/2 at once (prior knowledge); https://: ALPN h2 */
};

/** How often a running request asks options.cancel (and at most how late it notices). */
#define KVI_HTTP_CLIENT_CANCEL_POLL_MS 50

/** Client options; fill with kvi_http_client_options_init, then override. */
struct kvi_http_client_options {
    unsigned connect_timeout_ms; /* TCP + TLS connect; default 2 000 */
    unsigned timeout_ms;         /* whole request including the body; default 10 000; 0 = none */
    enum kvi_http_client_proto proto; /* default KVI_HTTP_CLIENT_H2C_UPGRADE */
    const char *bearer_token;    /* sent as `Authorization: Bearer ...` when set; copied */
    const char *ca_file;         /* PEM trust anchors for https; NULL = system store; copied */
    bool insecure;               /* https without certificate checks (tests only) */
    /* Cancellation hook, optional (default NULL): called with cancel_ud on
     * the requesting thread at least every KVI_HTTP_CLIENT_CANCEL_POLL_MS
     * while a request runs; true stops the request (-ECANCELED). It must be
     * cheap and must not block, e.g. a relaxed load of an atomic flag that
     * another thread sets. */
    bool (*cancel)(void *cancel_ud);
    void *cancel_ud;
};

/** Fill @p o with the defaults above. */
void kvi_http_client_options_init(struct kvi_http_client_options *o);

/** Free a client and close its connections (NULL is a no-op). */
void kvi_http_client_free(struct kvi_http_client *c);

/**
 * Create a client.
 * @param o  NULL for defaults
 * @return the client, or NULL with errno set: ENOMEM, EIO (libcurl could
 *         not be initialised).
 */
KVI_DEALLOC(kvi_http_client_free, 1) KVI_WARN_UNUSED
struct kvi_http_client *kvi_http_client_create(const struct kvi_http_client_options *o);

/**
 * Receives the body of a 2xx answer, piece by piece, in order, on the
 * calling thread. Return 0 to go on; anything else aborts the transfer
 * (the request then returns -ECANCELED).
 */
typedef int (*kvi_http_body_fn)(void *ud, const void *data, size_t len);

/** What a request got back. */
struct kvi_http_result {
    int status;            /* HTTP status of the final answer; 0 when none arrived */
    int http_version;      /* 0x100, 0x101 or 0x200 when an answer arrived; else 0 */
    uint64_t body_bytes;   /* body bytes handed to the callback (2xx only) */
    char content_type[128]; /* of the final answer; "" when absent */
    char error[512];       /* transport error text, or the start of a non-2xx body; "" on success */
};

/**
 * GET @p url (blocking). The body of a 2xx answer goes to @p fn (NULL:
 * discarded); a non-2xx body is kept (cut) in res->error instead.
 * @param res  receives the outcome; may not be NULL
 * @return 0              a 2xx answer arrived complete
 *         -EREMOTEIO     the server answered with a non-2xx status (res->status)
 *         -ETIMEDOUT     connect or total timeout (res->error says which)
 *         -ECONNREFUSED  nobody listens there
 *         -EHOSTUNREACH  the host does not resolve or cannot be reached
 *         -ECANCELED     @p fn asked to stop, or options.cancel did
 *         -EPROTO        malformed answer, HTTP/2 or TLS failure
 *         -EIO           any other transport failure (connection reset, ...)
 *         -EINVAL        bad URL or unsupported scheme
 */
int kvi_http_get(struct kvi_http_client *c, const char *url, kvi_http_body_fn fn, void *ud,
                 struct kvi_http_result *res);

/**
 * POST @p len bytes of @p body with Content-Type @p ctype (NULL: none);
 * otherwise as kvi_http_get, with the same return values.
 */
int kvi_http_post(struct kvi_http_client *c, const char *url, const char *ctype, const void *body, size_t len,
                  kvi_http_body_fn fn, void *ud, struct kvi_http_result *res);

#endif
