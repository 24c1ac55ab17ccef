/*
 * kvidx HTTP server on h2o 2.2.5 (libh2o-evloop): the server and its event
 * loops (net/http_server.h). This file holds the server's life (options,
 * listening sockets, the descriptor limit, TLS, the route table, start,
 * stop, free), the loop threads and the messages they take, accepting and
 * the connection cap, the idle reaper, the shutdown drain and the counter
 * readers. Requests are dispatched and answered in net/http_request.c,
 * streamed answers are in net/http_stream.c; the three files share the
 * types of net/http_server_internal.h.
 *
 * DESIGN
 *
 * Threads. One event loop per thread (`struct worker`), each with its own
 * listening socket bound with SO_REUSEPORT to one address; the sockets are
 * bound in kvi_http_server_create (the first picks the port when port 0 was
 * asked for, the others reuse it) and every h2o context is set up in
 * kvi_http_server_start before its thread runs, so a stop message can reach
 * a loop from the first moment on. A loop thread registers as an RCU reader
 * (memb) and runs handlers inline. h2o objects are touched only by their loop
 * thread, and after the thread is joined by kvi_http_server_free.
 *
 * Dispatch and per-request state: see net/http_request.c.
 *
 * Cross-thread traffic goes through one h2o_multithread receiver per loop
 * (mutex + pipe wake-up, only on the empty -> non-empty transition):
 *
 *   | message          | sender                     | loop action                          |
 *   |------------------|----------------------------|--------------------------------------|
 *   | deferred answer  | kvi_http_complete*         | send it, or drop it if the request   |
 *   |                  |                            | died; free the op                    |
 *   | stream wake-up   | kvi_http_stream_write/_end | send queued chunks if the generator  |
 *   |                  | (only when the loop waits) | waits for data                       |
 *   | stop             | kvi_http_server_stop       | start draining                       |
 *
 * Pushed streams (their queue, backpressure and stall timeout, and why
 * END_STREAM goes out on its own send): see net/http_stream.c.
 *
 * Shutdown. The stop message makes a loop close its listener, call
 * h2o_context_request_shutdown (no more keep-alive, HTTP/2 GOAWAY) and sweep
 * its connections every SWEEP_MS: a connection with no dispatched request in
 * flight is shut down (shutdown(2) on its fd; h2o sees end-of-file and frees
 * it its own way). At the grace deadline pending deferred requests are
 * answered 503, idle pushed streams are aborted and every connection is shut
 * down. The loop ends when it has no connection left; kvi_http_server_stop
 * joins the threads. Messages that arrive after a loop ended are drained by
 * kvi_http_server_free (their requests are gone by then).
 *
 * Counters are per thread and per route, written only by the loop thread
 * (relaxed single-writer stores) and summed by readers.
 */
#include "net/http_server_internal.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <h2o.h>
#include <openssl/ssl.h>

#include "engine/common.h"
#include "engine/rcu.h"

#define MAX_THREADS 64
#define SWEEP_MS 20          /* drain sweep period */
#define ACCEPT_PAUSE_MS 100  /* accept back-off after EMFILE and friends */
#define ACCEPT_BURST 64      /* accepts per readiness event */

static _Thread_local struct worker *tl_worker;

/*
 * h2o 2.2.5 caches freed buffers in per-thread recycle lists (__thread
 * variables in lib/common/memory.c, lib/common/socket.c and
 * lib/http2/connection.c, two of them static) and offers no call to empty
 * them. When a loop thread exits, what its caches held becomes unreachable,
 * and LeakSanitizer would report it at exit. Those allocations, and only
 * those, all come from h2o_mem_alloc_recycle.
 */
#if defined(__SANITIZE_ADDRESS__)
#define KVI_HTTP_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVI_HTTP_LSAN 1
#endif
#endif
#ifdef KVI_HTTP_LSAN
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:h2o_mem_alloc_recycle\n";
}
#endif

/* ---- messages to a loop ---- */

/*
 * Post @p m to loop @p w from any thread. Once the loop is gone its request
 * objects are gone too, so the handler runs right here and only frees.
 */
void kvi_http__post(struct worker *w, struct msg *m)
{
    pthread_mutex_lock(&w->mu);
    bool alive = w->alive;
    if (alive)
        h2o_multithread_send_message(&w->receiver, &m->super);
    pthread_mutex_unlock(&w->mu);
    if (!alive)
        m->fn(w, m);
}

/* ---- connections and accepting ---- */

static void on_sock_close(void *data)
{
    struct conn *c = data;
    struct worker *w = c->w;
    while (!h2o_linklist_is_empty(&c->reqs)) {
        struct kvi_http_res *r = H2O_STRUCT_FROM_MEMBER(struct kvi_http_res, conn_link, c->reqs.next);
        h2o_linklist_unlink(&r->conn_link);
        r->conn = NULL;
    }
    h2o_linklist_unlink(&c->link);
    kvi_http__addr_release(w, c);
    w->nconns--;
    atomic_fetch_sub_explicit(&w->srv->conns_open, 1, memory_order_relaxed);
    free(c);
    if (w->state == W_DRAINING && w->nconns == 0)
        w->state = W_DONE;
}

struct conn *kvi_http__conn_of_sock(h2o_socket_t *sock)
{
    if (sock == NULL || sock->on_close.cb != on_sock_close)
        return NULL;
    return sock->on_close.data;
}

struct conn *kvi_http__conn_of(h2o_req_t *req)
{
    if (req->conn->callbacks->get_socket == NULL)
        return NULL;
    return kvi_http__conn_of_sock(req->conn->callbacks->get_socket(req->conn));
}

static void on_accept(h2o_socket_t *listener, const char *err);

static void accept_resume(h2o_timeout_entry_t *e)
{
    struct worker *w = H2O_STRUCT_FROM_MEMBER(struct worker, pause_entry, e);
    if (w->state == W_RUNNING && w->listener != NULL)
        h2o_socket_read_start(w->listener, on_accept);
}

static void on_accept(h2o_socket_t *listener, const char *err)
{
    struct worker *w = listener->data;
    struct kvi_http_server *s = w->srv;
    if (err != NULL || w->state != W_RUNNING)
        return;
    for (int i = 0; i < ACCEPT_BURST; i++) {
        struct sockaddr_storage peer;
        socklen_t peer_len = sizeof peer;
        int fd = accept4(w->listen_fd, (struct sockaddr *)&peer, &peer_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* Out of descriptors: stop polling the listener for a while instead of spinning. */
                kvi_http__accept_failed(w, errno);
                h2o_socket_read_stop(w->listener);
                if (!h2o_timeout_is_linked(&w->pause_entry))
                    h2o_timeout_link(w->ctx.loop, &w->pause_timeout, &w->pause_entry);
            }
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return;
        }
        if (atomic_fetch_add_explicit(&s->conns_open, 1, memory_order_relaxed) >= s->opt.max_connections) {
            atomic_fetch_sub_explicit(&s->conns_open, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&s->conns_rejected, 1, memory_order_relaxed);
            close(fd);
            continue;
        }
        struct conn *c = kvi_xcalloc(1, sizeof *c);
        if (!kvi_http__addr_acquire(w, c, (struct sockaddr *)&peer, peer_len)) {
            atomic_fetch_sub_explicit(&s->conns_open, 1, memory_order_relaxed);
            free(c);
            close(fd);
            continue;
        }
        atomic_fetch_add_explicit(&s->conns_accepted, 1, memory_order_relaxed);
        int on = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
        h2o_socket_t *sock = h2o_evloop_socket_create(w->ctx.loop, fd, H2O_SOCKET_FLAG_IS_ACCEPTED_CONNECTION);
        c->w = w;
        c->fd = fd;
        c->idle_since = h2o_now(w->ctx.loop);
        h2o_linklist_init_anchor(&c->reqs);
        h2o_linklist_insert(&w->conns, &c->link);
        w->nconns++;
        sock->on_close.cb = on_sock_close;
        sock->on_close.data = c;
        h2o_accept(&w->accept_ctx, sock);
    }
}

/* ---- idle reaper ---- */

/*
 * h2o closes an HTTP/1.1 connection whose request has not arrived whole
 * within idle_timeout_ms, and an idle HTTP/2 connection, but resets its
 * HTTP/2 idle timer on every frame: a stream trickling its body (or PINGs
 * alone) kept a connection and its slot forever. Every REAP_DIVISOR-th of
 * the timeout each loop shuts down the connections that have had no request
 * dispatched for twice the timeout (h2o's own, graceful close comes first
 * for every well-behaved idle connection), and those holding an answer the
 * client has taken nothing of for the timeout (the write deadline h2o 2.2
 * lacks; see net/http_guard.c).
 */
#define REAP_DIVISOR 4

static void on_reap(h2o_timeout_entry_t *e)
{
    struct worker *w = H2O_STRUCT_FROM_MEMBER(struct worker, reap_entry, e);
    uint64_t now = h2o_now(w->ctx.loop), limit = 2 * (uint64_t)w->srv->opt.idle_timeout_ms;
    for (h2o_linklist_t *n = w->conns.next; n != &w->conns; n = n->next) {
        struct conn *c = H2O_STRUCT_FROM_MEMBER(struct conn, link, n);
        if (c->shut)
            continue;
        if (c->inflight == 0 ? now - c->idle_since >= limit
                             : kvi_http__conn_stalled(w, c, now, w->srv->opt.idle_timeout_ms)) {
            shutdown(c->fd, SHUT_RDWR);
            c->shut = true;
        }
    }
    if (w->state == W_RUNNING)
        h2o_timeout_link(w->ctx.loop, &w->reap_timeout, &w->reap_entry);
}

/* ---- shutdown ---- */

static void abort_pending(struct worker *w)
{
    while (!h2o_linklist_is_empty(&w->deferred)) {
        struct kvi_http_deferred *d = H2O_STRUCT_FROM_MEMBER(struct kvi_http_deferred, link, w->deferred.next);
        struct kvi_http_res *r = d->res;
        h2o_linklist_unlink(&d->link);
        d->res = NULL;
        r->def = NULL;
        kvi_http__send_error(r, 503, "the server is shutting down");
    }
    while (!h2o_linklist_is_empty(&w->streams)) {
        struct kvi_http_stream *st = H2O_STRUCT_FROM_MEMBER(struct kvi_http_stream, link, w->streams.next);
        bool idle;
        h2o_linklist_unlink(&st->link);
        pthread_mutex_lock(&st->mu);
        st->gone = true;
        idle = st->loop_idle;
        st->loop_idle = false;
        pthread_cond_broadcast(&st->cv);
        pthread_mutex_unlock(&st->mu);
        if (idle) {
            kvi_http__push_finish(st, false);
            h2o_send(st->res->req, NULL, 0, H2O_SEND_STATE_ERROR);
        }
    }
}

static void sweep(struct worker *w)
{
    bool force = h2o_now(w->ctx.loop) >= w->deadline;
    if (force && !w->forced) {
        w->forced = true;
        atomic_store_explicit(&w->srv->forced, true, memory_order_relaxed);
        abort_pending(w);
    }
    for (h2o_linklist_t *n = w->conns.next; n != &w->conns; n = n->next) {
        struct conn *c = H2O_STRUCT_FROM_MEMBER(struct conn, link, n);
        if (!c->shut && (c->inflight == 0 || force)) {
            if (force && c->inflight != 0)
                atomic_store_explicit(&w->srv->forced, true, memory_order_relaxed);
            shutdown(c->fd, SHUT_RDWR);
            c->shut = true;
        }
    }
    if (w->nconns == 0)
        w->state = W_DONE;
    else if (!h2o_timeout_is_linked(&w->sweep_entry))
        h2o_timeout_link(w->ctx.loop, &w->sweep_timeout, &w->sweep_entry);
}

static void on_sweep(h2o_timeout_entry_t *e)
{
    sweep(H2O_STRUCT_FROM_MEMBER(struct worker, sweep_entry, e));
}

static void on_stop(struct worker *w, struct msg *m)
{
    if (tl_worker != w || w->state != W_RUNNING)
        return;
    w->state = W_DRAINING;
    if (w->listener != NULL) {
        h2o_socket_read_stop(w->listener);
        h2o_socket_close(w->listener);
        w->listener = NULL;
        w->listen_fd = -1;
        atomic_store_explicit(&w->listening, 0, memory_order_relaxed);
    }
    h2o_timeout_unlink(&w->pause_entry);
    h2o_timeout_unlink(&w->reap_entry);
    h2o_context_request_shutdown(&w->ctx);
    w->deadline = h2o_now(w->ctx.loop) + w->srv->opt.shutdown_grace_ms;
    sweep(w);
}

static void on_messages(h2o_multithread_receiver_t *recv, h2o_linklist_t *list)
{
    struct worker *w = H2O_STRUCT_FROM_MEMBER(struct worker, receiver, recv);
    while (!h2o_linklist_is_empty(list)) {
        struct msg *m = H2O_STRUCT_FROM_MEMBER(struct msg, super.link, list->next);
        h2o_linklist_unlink(&m->super.link);
        m->fn(w, m);
    }
}

/* ---- threads ---- */

static void worker_ctx_init(struct worker *w)
{
    struct kvi_http_server *s = w->srv;
    /* On the loop thread: h2o binds socket buffers to the creating thread's caches. */
    h2o_context_init(&w->ctx, h2o_evloop_create(), &s->cfg);
    w->accept_ctx.ctx = &w->ctx;
    w->accept_ctx.hosts = s->cfg.hosts;
    w->accept_ctx.ssl_ctx = s->ssl;
    h2o_multithread_register_receiver(w->ctx.queue, &w->receiver, on_messages);
    w->stop_msg.fn = on_stop;
    h2o_timeout_init(w->ctx.loop, &w->sweep_timeout, SWEEP_MS);
    h2o_timeout_init(w->ctx.loop, &w->pause_timeout, ACCEPT_PAUSE_MS);
    h2o_timeout_init(w->ctx.loop, &w->reap_timeout, KVI_MAX(s->opt.idle_timeout_ms / REAP_DIVISOR, 1u));
    w->sweep_entry.cb = on_sweep;
    w->pause_entry.cb = accept_resume;
    w->reap_entry.cb = on_reap;
    h2o_linklist_init_anchor(&w->conns);
    h2o_linklist_init_anchor(&w->deferred);
    h2o_linklist_init_anchor(&w->streams);
    w->listener = h2o_evloop_socket_create(w->ctx.loop, w->listen_fd, H2O_SOCKET_FLAG_DONT_READ);
    w->listener->data = w;
    h2o_socket_read_start(w->listener, on_accept);
    atomic_store_explicit(&w->listening, 1, memory_order_relaxed);
    w->state = W_RUNNING;
    if (s->opt.idle_timeout_ms != 0)
        h2o_timeout_link(w->ctx.loop, &w->reap_timeout, &w->reap_entry);
    pthread_mutex_lock(&w->mu);
    w->alive = true;
    pthread_mutex_unlock(&w->mu);
}

static void worker_ctx_dispose(struct worker *w)
{
    pthread_mutex_lock(&w->mu);
    w->alive = false;
    pthread_mutex_unlock(&w->mu);
    /* Messages posted before the gate closed: their requests are gone, so this only frees. */
    while (!h2o_linklist_is_empty(&w->receiver._messages)) {
        struct msg *m = H2O_STRUCT_FROM_MEMBER(struct msg, super.link, w->receiver._messages.next);
        h2o_linklist_unlink(&m->super.link);
        m->fn(w, m);
    }
    h2o_multithread_unregister_receiver(w->ctx.queue, &w->receiver);
    if (w->listener != NULL) {
        h2o_socket_read_stop(w->listener);
        h2o_socket_close(w->listener);
        w->listener = NULL;
        w->listen_fd = -1;
    }
    atomic_store_explicit(&w->listening, 0, memory_order_relaxed);
    h2o_timeout_unlink(&w->sweep_entry);
    h2o_timeout_unlink(&w->pause_entry);
    h2o_timeout_unlink(&w->reap_entry);
    h2o_timeout_dispose(w->ctx.loop, &w->sweep_timeout);
    h2o_timeout_dispose(w->ctx.loop, &w->pause_timeout);
    h2o_timeout_dispose(w->ctx.loop, &w->reap_timeout);
    /* h2o's GOAWAY re-send timer may still be linked. */
    h2o_timeout_unlink(&w->ctx.http2._graceful_shutdown_timeout);
    h2o_loop_t *loop = w->ctx.loop;
    h2o_multithread_queue_t *queue = w->ctx.queue;
    h2o_context_dispose(&w->ctx);
    /* In the evloop build h2o_multithread_destroy_queue (called by
     * h2o_context_dispose) closes the queue but does not free it. */
    free(queue);
    h2o_evloop_destroy(loop);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct kvi_http_server *s = w->srv;
    tl_worker = w;
    kvi_rcu_register_thread();
    worker_ctx_init(w);
    pthread_mutex_lock(&s->ready_mu);
    w->ready = true;
    pthread_cond_broadcast(&s->ready_cv);
    pthread_mutex_unlock(&s->ready_mu);
    if (s->opt.thread_init != NULL)
        w->thread_ctx = s->opt.thread_init(w->idx, s->opt.thread_ud);
    while (w->state != W_DONE)
        h2o_evloop_run(w->ctx.loop, INT32_MAX);
    if (s->opt.thread_fini != NULL)
        s->opt.thread_fini(w->idx, w->thread_ctx, s->opt.thread_ud);
    worker_ctx_dispose(w);
    kvi_rcu_unregister_thread();
    tl_worker = NULL;
    return NULL;
}

/* ---- server ---- */

void kvi_http_options_init(struct kvi_http_options *o)
{
    memset(o, 0, sizeof *o);
    o->host = "0.0.0.0";
    o->threads = 2;
    o->body_limit = 2u << 20;
    o->idle_timeout_ms = 60000;
    o->handshake_timeout_ms = 10000;
    o->max_connections = 16384;
    o->max_conns_per_addr = 1024;
    o->h2_max_streams = 100;
    o->h2_max_resets = 1000;
    o->conn_output_limit = (size_t)16 << 20;
    o->output_limit = (size_t)256 << 20;
    o->shutdown_grace_ms = 1500;
    o->backlog = 4096;
}

static char *dup_opt(const char *p)
{
    if (p == NULL)
        return NULL;
    char *d = strdup(p);
    if (d == NULL)
        kvi_die("out of memory");
    return d;
}

/*
 * Raise the soft descriptor limit to the hard one (capped at NOFILE_CAP, but
 * at least @p want). Connections are not the only descriptors: every ZMQ
 * listener holds one or two, so sizing the limit by max_connections alone
 * made registrations fail with EMFILE once connections and listeners
 * together passed it. An epoll server gains nothing from a low soft limit.
 */
#define NOFILE_CAP ((rlim_t)1 << 20)

static void raise_nofile(unsigned want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    rlim_t target = KVI_MAX(NOFILE_CAP, (rlim_t)want);
    if (rl.rlim_max != RLIM_INFINITY && target > rl.rlim_max)
        target = rl.rlim_max;
    if (rl.rlim_cur >= target)
        return;
    rl.rlim_cur = target;
    setrlimit(RLIMIT_NOFILE, &rl);
}

static int bind_one(const struct addrinfo *ai, uint16_t port, int backlog)
{
    struct sockaddr_storage ss;
    int on = 1;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    if (ai->ai_family == AF_INET6)
        ((struct sockaddr_in6 *)&ss)->sin6_port = htons(port);
    else
        ((struct sockaddr_in *)&ss)->sin_port = htons(port);
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on) != 0 ||
        bind(fd, (struct sockaddr *)&ss, ai->ai_addrlen) != 0 || listen(fd, backlog) != 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    return fd;
}

static int bind_all(struct kvi_http_server *s)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(s->opt.host, NULL, &hints, &ai);
    if (rc != 0 || ai == NULL)
        return -ENOENT;
    uint16_t port = s->opt.port;
    for (unsigned i = 0; i < s->nthreads; i++) {
        int fd = bind_one(ai, port, s->opt.backlog);
        if (fd < 0) {
            freeaddrinfo(ai);
            return fd;
        }
        s->workers[i].listen_fd = fd;
        if (i == 0) {
            struct sockaddr_storage ss;
            socklen_t sl = sizeof ss;
            if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
                freeaddrinfo(ai);
                return -errno;
            }
            port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                            : ntohs(((struct sockaddr_in *)&ss)->sin_port);
        }
    }
    freeaddrinfo(ai);
    s->port = port;
    return 0;
}

static int tls_init(struct kvi_http_server *s)
{
    s->ssl = SSL_CTX_new(TLS_server_method());
    if (s->ssl == NULL)
        return -ENOMEM;
    SSL_CTX_set_min_proto_version(s->ssl, TLS1_2_VERSION);
    SSL_CTX_set_options(s->ssl, SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    if (SSL_CTX_use_certificate_chain_file(s->ssl, s->opt.tls_cert_file) != 1 ||
        SSL_CTX_use_PrivateKey_file(s->ssl, s->opt.tls_key_file, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(s->ssl) != 1)
        return -EINVAL;
    h2o_ssl_register_alpn_protocols(s->ssl, h2o_alpn_protocols);
    return 0;
}

static void server_destroy(struct kvi_http_server *s)
{
    for (unsigned i = 0; s->workers != NULL && i < s->nthreads; i++) {
        struct worker *w = &s->workers[i];
        if (w->listen_fd >= 0)
            close(w->listen_fd);
        pthread_mutex_destroy(&w->mu);
        free(w->ctr);
    }
    free(s->workers);
    kvi_http__guard_fini(s);
    for (int i = 0; i < s->nroutes; i++)
        free(s->routes[i].path);
    free(s->routes);
    if (s->hostconf != NULL)
        h2o_config_dispose(&s->cfg);
    if (s->ssl != NULL)
        SSL_CTX_free(s->ssl);
    free((char *)s->opt.host);
    free((char *)s->opt.tls_cert_file);
    free((char *)s->opt.tls_key_file);
    free((char *)s->opt.admin_token);
    free((char *)s->opt.admin_hint);
    free((char *)s->opt.data_token);
    pthread_mutex_destroy(&s->stop_mu);
    pthread_mutex_destroy(&s->ready_mu);
    pthread_cond_destroy(&s->ready_cv);
    free(s);
}

struct kvi_http_server *kvi_http_server_create(const struct kvi_http_options *o)
{
    struct kvi_http_options def;
    if (o == NULL) {
        kvi_http_options_init(&def);
        o = &def;
    }
    if (o->threads == 0 || o->threads > MAX_THREADS || o->max_connections == 0 || o->body_limit == 0 ||
        (o->tls_cert_file == NULL) != (o->tls_key_file == NULL)) {
        errno = EINVAL;
        return NULL;
    }
    struct kvi_http_server *s = kvi_xcalloc(1, sizeof *s);
    s->opt = *o;
    s->opt.host = dup_opt(o->host != NULL ? o->host : "0.0.0.0");
    s->opt.tls_cert_file = dup_opt(o->tls_cert_file);
    s->opt.tls_key_file = dup_opt(o->tls_key_file);
    s->opt.admin_token = o->admin_token != NULL && o->admin_token[0] != '\0' ? dup_opt(o->admin_token) : NULL;
    s->opt.admin_hint = o->admin_hint != NULL ? dup_opt(o->admin_hint) : NULL;
    s->opt.data_token = o->data_token != NULL && o->data_token[0] != '\0' ? dup_opt(o->data_token) : NULL;
    if (s->opt.backlog <= 0)
        s->opt.backlog = 4096;
    pthread_mutex_init(&s->stop_mu, NULL);
    pthread_mutex_init(&s->ready_mu, NULL);
    pthread_cond_init(&s->ready_cv, NULL);
    s->nthreads = o->threads;
    s->workers = kvi_xcalloc(s->nthreads, sizeof *s->workers);
    for (unsigned i = 0; i < s->nthreads; i++) {
        pthread_mutex_init(&s->workers[i].mu, NULL);
        s->workers[i].srv = s;
        s->workers[i].idx = i;
        s->workers[i].listen_fd = -1;
        s->workers[i].out_limit = s->opt.output_limit == 0 ? 0 : KVI_MAX(s->opt.output_limit / s->nthreads, (size_t)1);
    }
    kvi_http__guard_init(s);

    int rc = 0;
    if (s->opt.tls_cert_file != NULL)
        rc = tls_init(s);
    if (rc == 0) {
        raise_nofile(s->opt.max_connections + 64 + 8 * s->nthreads);
        rc = bind_all(s);
    }
    if (rc != 0) {
        server_destroy(s);
        errno = -rc;
        return NULL;
    }

    signal(SIGPIPE, SIG_IGN);
    h2o_config_init(&s->cfg);
    s->cfg.server_name = h2o_iovec_init(H2O_STRLIT("kvidx"));
    s->cfg.max_request_entity_size = s->opt.body_limit;
    s->cfg.handshake_timeout = s->opt.handshake_timeout_ms;
    s->cfg.http1.req_timeout = s->opt.idle_timeout_ms;
    s->cfg.http2.idle_timeout = s->opt.idle_timeout_ms;
    s->cfg.http2.graceful_shutdown_timeout = 0; /* our sweep closes stragglers */
    if (s->opt.h2_max_streams != 0)
        s->cfg.http2.max_concurrent_requests_per_connection = s->opt.h2_max_streams;
    s->hostconf = h2o_config_register_host(&s->cfg, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *pc = h2o_config_register_path(s->hostconf, "/", 0);
    struct handler_ext *h = (struct handler_ext *)h2o_create_handler(pc, sizeof *h);
    h->super.on_req = kvi_http__on_req;
    h->srv = s;
    h2o_filter_t *f = h2o_create_filter(&s->hostconf->fallback_path, sizeof *f);
    f->on_setup_ostream = kvi_http__errjson_setup;
    return s;
}

int kvi_http_server_route(struct kvi_http_server *s, unsigned methods, const char *path, kvi_http_handler_fn fn,
                          void *ud, const struct kvi_http_route_opts *opts)
{
    if (atomic_load(&s->started) || s->stopped)
        return -EBUSY;
    if (path == NULL || path[0] != '/' || fn == NULL || (methods & KVI_HTTP_ANY) == 0)
        return -EINVAL;
    if (s->nroutes == s->routes_cap) {
        s->routes_cap = s->routes_cap ? 2 * s->routes_cap : 16;
        s->routes = kvi_xrealloc(s->routes, (size_t)s->routes_cap * sizeof *s->routes);
    }
    struct route *rt = &s->routes[s->nroutes];
    memset(rt, 0, sizeof *rt);
    rt->path = dup_opt(path);
    rt->path_len = strlen(path);
    rt->methods = methods & KVI_HTTP_ANY;
    rt->fn = fn;
    rt->ud = ud;
    rt->body_limit = opts != NULL && opts->body_limit != 0 ? opts->body_limit : s->opt.body_limit;
    rt->flags = opts != NULL ? opts->flags : 0;
    return s->nroutes++;
}

static const char *const method_names[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"};

/* Fill every route's Allow list and size h2o's body limit (before the loops start). */
static void routes_finish(struct kvi_http_server *s)
{
    size_t limit = s->opt.body_limit;
    for (int i = 0; i < s->nroutes; i++) {
        struct route *rt = &s->routes[i];
        unsigned all = 0;
        for (int j = 0; j < s->nroutes; j++)
            if (s->routes[j].path_len == rt->path_len && memcmp(s->routes[j].path, rt->path, rt->path_len) == 0)
                all |= s->routes[j].methods;
        if (all & KVI_HTTP_GET)
            all |= KVI_HTTP_HEAD;
        size_t n = 0;
        for (unsigned b = 0; b < KVI_ARRAY_LEN(method_names); b++) {
            if ((all & (1u << b)) == 0)
                continue;
            n += (size_t)snprintf(rt->allow + n, sizeof rt->allow - n, "%s%s", n ? ", " : "", method_names[b]);
        }
        if (limit < rt->body_limit)
            limit = rt->body_limit;
    }
    s->cfg.max_request_entity_size = limit;
}

int kvi_http_server_start(struct kvi_http_server *s)
{
    if (atomic_load(&s->started) || s->stopped)
        return -EBUSY;
    routes_finish(s);
    for (unsigned i = 0; i < s->nthreads; i++) {
        struct worker *w = &s->workers[i];
        w->ctr = aligned_alloc(KVI_CACHE_LINE, (size_t)(s->nroutes + 1) * sizeof(struct ctr));
        if (w->ctr == NULL)
            kvi_die("out of memory");
        memset(w->ctr, 0, (size_t)(s->nroutes + 1) * sizeof(struct ctr));
    }
    atomic_store_explicit(&s->started, true, memory_order_release);
    for (unsigned i = 0; i < s->nthreads; i++) {
        struct worker *w = &s->workers[i];
        int rc = pthread_create(&w->tid, NULL, worker_main, w);
        if (rc != 0) {
            kvi_http_server_stop(s);
            return -rc;
        }
        w->thread_started = true;
        /* Wait until the loop can take messages (a stop may follow at once). */
        pthread_mutex_lock(&s->ready_mu);
        while (!w->ready)
            pthread_cond_wait(&s->ready_cv, &s->ready_mu);
        pthread_mutex_unlock(&s->ready_mu);
    }
    return 0;
}

uint16_t kvi_http_server_port(const struct kvi_http_server *s)
{
    return s->port;
}

int kvi_http_server_stop(struct kvi_http_server *s)
{
    if (tl_worker != NULL && tl_worker->srv == s)
        return -EDEADLK;
    pthread_mutex_lock(&s->stop_mu);
    if (!s->stopped) {
        s->stopped = true;
        for (unsigned i = 0; i < s->nthreads; i++) {
            struct worker *w = &s->workers[i];
            if (w->thread_started)
                kvi_http__post(w, &w->stop_msg);
        }
        for (unsigned i = 0; i < s->nthreads; i++) {
            struct worker *w = &s->workers[i];
            if (w->thread_started) {
                pthread_join(w->tid, NULL);
                w->thread_started = false;
            }
            atomic_store_explicit(&w->listening, 0, memory_order_relaxed);
        }
        s->stop_result = atomic_load_explicit(&s->forced, memory_order_relaxed) ? 1 : 0;
    }
    int rc = s->stop_result;
    pthread_mutex_unlock(&s->stop_mu);
    return rc;
}

void kvi_http_server_free(struct kvi_http_server *s)
{
    if (s == NULL)
        return;
    if (atomic_load(&s->started))
        kvi_http_server_stop(s);
    int64_t left = atomic_load(&s->outstanding);
    if (left != 0)
        kvi_die("http: server freed with %lld deferred request(s) or stream(s) still open", (long long)left);
    server_destroy(s);
}

/* ---- counters ---- */

static void counters_add(struct kvi_http_counters *o, const struct ctr *c)
{
    o->requests += atomic_load_explicit(&c->requests, memory_order_relaxed);
    for (int i = 0; i < 6; i++)
        o->status[i] += atomic_load_explicit(&c->status[i], memory_order_relaxed);
    o->aborted += atomic_load_explicit(&c->aborted, memory_order_relaxed);
    o->bytes_in += atomic_load_explicit(&c->bytes_in, memory_order_relaxed);
    o->bytes_out += atomic_load_explicit(&c->bytes_out, memory_order_relaxed);
    o->latency_ns_sum += atomic_load_explicit(&c->lat_sum, memory_order_relaxed);
    for (int i = 0; i <= KVI_HTTP_LATENCY_BUCKETS; i++)
        o->latency_buckets[i] += atomic_load_explicit(&c->lat[i], memory_order_relaxed);
}

void kvi_http_server_stats(const struct kvi_http_server *s, struct kvi_http_stats *out)
{
    memset(out, 0, sizeof *out);
    out->conns_open = atomic_load_explicit(&s->conns_open, memory_order_relaxed);
    out->conns_accepted = atomic_load_explicit(&s->conns_accepted, memory_order_relaxed);
    out->conns_rejected = atomic_load_explicit(&s->conns_rejected, memory_order_relaxed);
    out->conns_rejected_addr = atomic_load_explicit(&s->conns_rejected_addr, memory_order_relaxed);
    if (!atomic_load_explicit(&s->started, memory_order_acquire))
        return;
    for (unsigned i = 0; i < s->nthreads; i++) {
        struct worker *w = &s->workers[i];
        for (int r = 0; r <= s->nroutes; r++)
            counters_add(&out->all, &w->ctr[r]);
        counters_add(&out->unmatched, &w->ctr[s->nroutes]);
        out->in_flight += atomic_load_explicit(&w->in_flight, memory_order_relaxed);
        out->rejected += atomic_load_explicit(&w->rejected, memory_order_relaxed);
        out->listeners += atomic_load_explicit(&w->listening, memory_order_relaxed);
        out->accept_failures += atomic_load_explicit(&w->accept_failures, memory_order_relaxed);
        out->h2_resets += atomic_load_explicit(&w->h2_resets, memory_order_relaxed);
        out->h2_reset_floods += atomic_load_explicit(&w->h2_floods, memory_order_relaxed);
        out->output_buffered += atomic_load_explicit(&w->out_buffered, memory_order_relaxed);
        out->output_conn_closed += atomic_load_explicit(&w->out_conn_closed, memory_order_relaxed);
        out->output_refused += atomic_load_explicit(&w->out_refused, memory_order_relaxed);
        out->write_timeouts += atomic_load_explicit(&w->write_timeouts, memory_order_relaxed);
    }
}

int kvi_http_route_stats(const struct kvi_http_server *s, int route, struct kvi_http_counters *out)
{
    memset(out, 0, sizeof *out);
    if (route < 0 || route >= s->nroutes)
        return -ENOENT;
    if (!atomic_load_explicit(&s->started, memory_order_acquire))
        return 0;
    for (unsigned i = 0; i < s->nthreads; i++)
        counters_add(out, &s->workers[i].ctr[route]);
    return 0;
}

int kvi_http_route_count(const struct kvi_http_server *s)
{
    return s->nroutes;
}

const char *kvi_http_route_path(const struct kvi_http_server *s, int route, unsigned *methods)
{
    if (route < 0 || route >= s->nroutes)
        return NULL;
    if (methods != NULL)
        *methods = s->routes[route].methods;
    return s->routes[route].path;
}
