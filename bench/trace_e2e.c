/*
 * kvidx-bench trace --e2e (see bench/trace_e2e.h).
 *
 * DESIGN
 *   Threads: the caller (control: spawns or reaches kvidxd, creates the
 *   publishers, registers them over HTTP/1.1, runs the handshake, polls
 *   /metrics for the backlog and the drain, unregisters), `readers` lanes,
 *   the publishers' replay threads and one shared ZMQ I/O thread.
 *   Ownership: lane k owns the workers w with w % readers == k, so each
 *   publisher is used by one lane only (as the publisher library requires);
 *   the caller creates them before the lanes start and destroys them after
 *   the joins (thread creation and join are the happens-before edges).
 *   Start: lanes connect their h2c connection, meet the caller at a barrier,
 *   and wait for t0 (release store by the caller, acquire loads in lanes).
 *   Issue: as in process (trace_replay.c): sleep until an entry is due unless
 *   late; events of due-together entries are appended to their workers'
 *   batches and every pending batch is flushed before a query or a sleep.
 *   End: each lane records when it issued its last entry and sets `done`
 *   (release); the caller then samples /metrics for the backlog and polls it
 *   until every published event was decoded and applied.
 */
#include "bench/trace_e2e.h"

#include <errno.h>
#include <stdio.h>

#include <kvidx/publisher.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "bench/bench.h"
#include "bench/h2c.h"
#include "bench/hist.h"
#include "engine/common.h"
#include "net/http_client.h"

#define SLEEP_MIN_NS 20000   /* below this a lane spins instead of sleeping */
#define HANDSHAKE_MS 30000   /* every listener connected and caught up within this */
#define DRAIN_EXTRA_MS 60000 /* drain wait beyond the last issue when the overrun limit is shorter */
#define H2C_TIMEOUT_MS 30000

struct kvi_e2e {
    char url[256];
    char host[128];
    uint16_t port;
    enum kvi_e2e_query query;
    struct kvi_http_client *http;
    pid_t pid; /* spawned kvidxd, or 0 */
    char portfile[128];
    char logfile[128];
    uint32_t runs;
};

/* ---- HTTP control requests -------------------------------------------------------------- */

int kvi_e2e_text_sink(void *ud, const void *data, size_t len)
{
    struct kvi_e2e_text *t = ud;
    if (t->len + len + 1 > t->cap) {
        t->cap = KVI_MAX(2 * t->cap, t->len + len + 1);
        t->p = kvi_xrealloc(t->p, t->cap);
    }
    memcpy(t->p + t->len, data, len);
    t->len += len;
    t->p[t->len] = '\0';
    return 0;
}

int kvi_e2e_get(struct kvi_http_client *http, const char *base, const char *path,
                int (*fn)(void *ud, const void *data, size_t len), void *ud, char *err, size_t err_len)
{
    char url[512];
    snprintf(url, sizeof url, "%s%s", base, path);
    struct kvi_http_result res;
    int rc = kvi_http_get(http, url, fn, ud, &res);
    if (rc != 0 && err != NULL)
        snprintf(err, err_len, "GET %.80s: %d %.150s", url, res.status, res.error);
    return rc;
}

int kvi_e2e_post_json(struct kvi_http_client *http, const char *base, const char *path, const char *json, char *err,
                      size_t err_len)
{
    char url[512];
    snprintf(url, sizeof url, "%s%s", base, path);
    struct kvi_http_result res;
    int rc = kvi_http_post(http, url, "application/json", json, strlen(json), NULL, NULL, &res);
    if (rc != 0 && err != NULL)
        snprintf(err, err_len, "POST %.80s %.60s: %d %.100s", url, json, res.status, res.error);
    return rc;
}

static int http_get(struct kvi_e2e *e, const char *path, struct kvi_e2e_text *t, char *err, size_t err_len)
{
    t->len = 0;
    return kvi_e2e_get(e->http, e->url, path, kvi_e2e_text_sink, t, err, err_len);
}

static int http_post_json(struct kvi_e2e *e, const char *path, const char *json, char *err, size_t err_len)
{
    return kvi_e2e_post_json(e->http, e->url, path, json, err, err_len);
}

/* ---- /metrics ---------------------------------------------------------------------------- */

/* Sum of the samples of `name` whose labels contain `labels` (NULL: any; "" none). */
static double msum(const char *body, const char *name, const char *labels, uint32_t *count)
{
    size_t nl = strlen(name);
    double s = 0;
    for (const char *p = body; p != NULL && *p != '\0';) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        if (*p != '#' && len > nl && strncmp(p, name, nl) == 0 && (p[nl] == ' ' || p[nl] == '{')) {
            const char *v = p + nl;
            bool match = labels == NULL || labels[0] == '\0';
            if (p[nl] == '{') {
                const char *close = memchr(p, '}', len);
                v = close ? close + 1 : p + len;
                if (labels != NULL && labels[0] != '\0' && close != NULL)
                    match = memmem(p + nl, (size_t)(close - p - nl), labels, strlen(labels)) != NULL;
                else if (labels != NULL && labels[0] == '\0')
                    match = false;
            }
            if (match) {
                s += strtod(v, NULL);
                if (count)
                    (*count)++;
            }
        }
        p = eol ? eol + 1 : NULL;
    }
    return s;
}

struct msnap {
    double ev_stored, ev_removed, submitted, applied, rejected;
    double batches, gaps, lost, replays;
    double busy_s, stalls;
    double q_sum, q_count;
    uint32_t writers;
};

static int snap(struct kvi_e2e *e, struct kvi_e2e_text *t, struct msnap *m, char *err, size_t err_len)
{
    int rc = http_get(e, "/metrics", t, err, err_len);
    if (rc != 0)
        return rc;
    const char *b = t->p;
    memset(m, 0, sizeof *m);
    m->ev_stored = msum(b, "kvidx_events_total", "type=\"stored\"", NULL);
    m->ev_removed = msum(b, "kvidx_events_total", "type=\"removed\"", NULL);
    m->submitted = msum(b, "kvidx_listener_ops_submitted_total", NULL, NULL);
    m->applied = msum(b, "kvidx_listener_ops_applied_total", NULL, NULL);
    m->rejected = msum(b, "kvidx_listener_ops_parent_not_found_total", NULL, NULL) +
                  msum(b, "kvidx_listener_ops_invalid_total", NULL, NULL);
    m->batches = msum(b, "kvidx_listener_batches_total", NULL, NULL);
    m->gaps = msum(b, "kvidx_listener_gaps_total", NULL, NULL);
    m->lost = msum(b, "kvidx_listener_lost_total", NULL, NULL);
    m->replays = msum(b, "kvidx_listener_replays_total", NULL, NULL);
    m->busy_s = msum(b, "kvidx_writer_busy_seconds_total", NULL, &m->writers);
    m->stalls = msum(b, "kvidx_writer_stalls_total", NULL, NULL);
    const char *route = e->query == KVI_E2E_QUERY_HASH ? "route=\"/query_by_hash\",dialect=\"dynamo\""
                                                        : "route=\"/query\",dialect=\"dynamo\"";
    m->q_sum = msum(b, "kvidx_query_duration_seconds_sum", route, NULL);
    m->q_count = msum(b, "kvidx_query_duration_seconds_count", route, NULL);
    return 0;
}

/* ---- kvidxd: reach or spawn --------------------------------------------------------------- */

static int parse_url(struct kvi_e2e *e, const char *url)
{
    const char *p = url;
    if (strncmp(p, "http://", 7) != 0)
        return -EINVAL;
    p += 7;
    const char *colon = strrchr(p, ':');
    const char *slash = strchr(p, '/');
    if (colon == NULL || (slash != NULL && slash < colon) || (size_t)(colon - p) >= sizeof e->host || colon == p)
        return -EINVAL;
    memcpy(e->host, p, (size_t)(colon - p));
    e->host[colon - p] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (port <= 0 || port > 65535 || (*end != '\0' && *end != '/'))
        return -EINVAL;
    e->port = (uint16_t)port;
    snprintf(e->url, sizeof e->url, "http://%s:%ld", e->host, port);
    return 0;
}

static int spawn(struct kvi_e2e *e, const char *bin, uint32_t writers, char *err, size_t err_len)
{
    snprintf(e->portfile, sizeof e->portfile, "/tmp/kvidx-bench-e2e-%d.port", (int)getpid());
    snprintf(e->logfile, sizeof e->logfile, "/tmp/kvidx-bench-e2e-%d.log", (int)getpid());
    unlink(e->portfile);
    char threads[16];
    snprintf(threads, sizeof threads, "%u", writers ? writers : 1);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, err_len, "fork: %s", strerror(errno));
        return -errno;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127);
        int fd = open(e->logfile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execl(bin, bin, "--port", "0", "--host", "127.0.0.1", "--port-file", e->portfile, "--threads", threads,
              "--log-level", "warn", (char *)NULL);
        _exit(127);
    }
    e->pid = pid;
    uint64_t end = kvi_now_ns() + 10000000000ull;
    while (kvi_now_ns() < end) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            e->pid = 0;
            snprintf(err, err_len, "%s exited at startup (status %d); see %s", bin,
                     WIFEXITED(st) ? WEXITSTATUS(st) : -1, e->logfile);
            return -ECHILD;
        }
        FILE *f = fopen(e->portfile, "r");
        unsigned port = 0;
        if (f != NULL) {
            if (fscanf(f, "%u", &port) != 1)
                port = 0;
            fclose(f);
        }
        if (port > 0) {
            snprintf(e->host, sizeof e->host, "127.0.0.1");
            e->port = (uint16_t)port;
            snprintf(e->url, sizeof e->url, "http://127.0.0.1:%u", port);
            return 0;
        }
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    snprintf(err, err_len, "%s did not write its port within 10 s; see %s", bin, e->logfile);
    return -ETIMEDOUT;
}

struct kvi_e2e *kvi_e2e_open(const struct kvi_e2e_cfg *cfg, char *err, size_t err_len)
{
    struct kvi_e2e *e = kvi_xcalloc(1, sizeof *e);
    e->query = cfg->query;
    int rc;
    if (cfg->spawn != NULL)
        rc = spawn(e, cfg->spawn, cfg->spawn_writers, err, err_len);
    else if ((rc = cfg->url ? parse_url(e, cfg->url) : -EINVAL) != 0)
        snprintf(err, err_len, "--e2e: expected http://HOST:PORT, got '%s'", cfg->url ? cfg->url : "");
    if (rc != 0) {
        kvi_e2e_close(e);
        return NULL;
    }
    struct kvi_http_client_options ho;
    kvi_http_client_options_init(&ho);
    ho.proto = KVI_HTTP_CLIENT_H1;
    ho.timeout_ms = 30000;
    ho.bearer_token = getenv("KVIDX_ADMIN_TOKEN");
    e->http = kvi_http_client_create(&ho);
    if (e->http == NULL) {
        snprintf(err, err_len, "cannot create the HTTP client: %s", strerror(errno));
        kvi_e2e_close(e);
        return NULL;
    }
    struct kvi_e2e_text t = {0};
    uint64_t end = kvi_now_ns() + 10000000000ull;
    while ((rc = http_get(e, "/health", &t, err, err_len)) != 0 && kvi_now_ns() < end) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    free(t.p);
    if (rc != 0) {
        kvi_e2e_close(e);
        return NULL;
    }
    return e;
}

void kvi_e2e_close(struct kvi_e2e *e)
{
    if (e == NULL)
        return;
    kvi_http_client_free(e->http);
    if (e->pid > 0) {
        kill(e->pid, SIGTERM);
        uint64_t end = kvi_now_ns() + 5000000000ull;
        int st = 0;
        while (waitpid(e->pid, &st, WNOHANG) != e->pid) {
            if (kvi_now_ns() > end) {
                kill(e->pid, SIGKILL);
                waitpid(e->pid, &st, 0);
                break;
            }
            struct timespec ts = {0, 5000000};
            nanosleep(&ts, NULL);
        }
        unlink(e->portfile);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
            unlink(e->logfile); /* kept when kvidxd failed */
        else
            fprintf(stderr, "trace: kvidxd ended with status %d; its log: %s\n",
                    WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), e->logfile);
    }
    free(e);
}

const char *kvi_e2e_url(const struct kvi_e2e *e)
{
    return e->url;
}

int kvi_e2e_pid(const struct kvi_e2e *e)
{
    return (int)e->pid;
}

double kvi_e2e_metric_sum(const char *body, const char *name, const char *labels)
{
    return msum(body, name, labels, NULL);
}

/* ---- lanes ------------------------------------------------------------------------------------ */

struct e2e_run;

struct e2e_lane {
    struct e2e_run *run;
    uint32_t id;
    uint32_t *idx; /* entries of this lane, in timeline order */
    size_t n;
    pthread_t tid;
    struct kvi_h2c *h2;
    struct kvi_hist find, lag;
    KVI_CACHE_ALIGNED _Atomic uint64_t issued;
    _Atomic bool done;
    uint64_t queries, events, block_ops, hits, best_depth_sum, errors, cpu_ns, ev_cpu_ns;
    uint64_t t_issue_end;
    char err[256];
    uint32_t *dirty; /* workers with unflushed events */
    size_t n_dirty;
    uint8_t *q;
    size_t qcap;
    uint32_t *tok;
    size_t tcap;
} KVI_CACHE_ALIGNED;

struct e2e_run {
    struct kvi_e2e *e;
    const struct kvi_trace_workload *w;
    const struct kvi_trace_run_cfg *cfg;
    struct kvidx_pub **pub; /* per worker */
    bool *pending;          /* per worker: unflushed events (owned by its lane) */
    char model[64];
    uint64_t id0; /* instance id of worker 0: ids never collide with other registrations */
    pthread_barrier_t ready;
    _Atomic uint64_t t0;
    double scale;
    uint64_t stop_after;
};

static void sleep_until(uint64_t due)
{
    for (;;) {
        uint64_t now = kvi_now_ns();
        if (now >= due)
            return;
        if (due - now > SLEEP_MIN_NS) {
            struct timespec ts = {(time_t)(due / 1000000000u), (long)(due % 1000000000u)};
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        } else {
            sched_yield();
        }
    }
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void lane_error(struct e2e_lane *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void lane_error(struct e2e_lane *l, const char *fmt, ...)
{
    l->errors++;
    if (l->err[0] != '\0')
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->err, sizeof l->err, fmt, ap);
    va_end(ap);
}

static void flush_dirty(struct e2e_lane *l)
{
    struct e2e_run *r = l->run;
    for (size_t i = 0; i < l->n_dirty; i++) {
        uint32_t wk = l->dirty[i];
        int rc = kvidx_pub_flush(r->pub[wk], NULL);
        if (rc != 0)
            lane_error(l, "publish: %s (worker %u)", strerror(-rc), wk);
        r->pending[wk] = false;
    }
    l->n_dirty = 0;
}

static void lane_event(struct e2e_lane *l, const struct kvi_trace_entry *en)
{
    struct e2e_run *r = l->run;
    struct kvidx_pub *p = r->pub[en->worker];
    int rc;
    if (en->kind == KVI_TRACE_STORE) {
        uint32_t bs = r->w->cfg.block_size;
        size_t nt = (size_t)en->n * bs;
        if (nt > l->tcap) {
            l->tcap = nt;
            l->tok = kvi_xrealloc(l->tok, nt * sizeof *l->tok);
        }
        for (uint32_t i = 0; i < en->n; i++)
            kvi_trace_block_tokens(r->w, en->req, en->pos + i, l->tok + (size_t)i * bs);
        rc = kvidx_pub_publish_stored(p, en->engine_hash, en->n, en->has_parent ? &en->parent : NULL, l->tok, nt,
                                      bs, NULL);
    } else {
        rc = kvidx_pub_publish_removed(p, en->engine_hash, en->n, NULL);
    }
    if (rc != 0)
        lane_error(l, "publish: %s (worker %u)", strerror(-rc), en->worker);
    if (!r->pending[en->worker]) {
        r->pending[en->worker] = true;
        l->dirty[l->n_dirty++] = en->worker;
    }
    l->events++;
}

/* msgpack helpers for the query body */
static size_t mp_str(uint8_t *o, const char *s)
{
    size_t n = strlen(s), k = 0;
    if (n < 32) {
        o[k++] = (uint8_t)(0xa0 | n);
    } else {
        o[k++] = 0xd9;
        o[k++] = (uint8_t)n;
    }
    memcpy(o + k, s, n);
    return k + n;
}

static size_t mp_bin_hdr(uint8_t *o, size_t n)
{
    if (n <= 0xff) {
        o[0] = 0xc4;
        o[1] = (uint8_t)n;
        return 2;
    }
    if (n <= 0xffff) {
        o[0] = 0xc5;
        o[1] = (uint8_t)(n >> 8);
        o[2] = (uint8_t)n;
        return 3;
    }
    o[0] = 0xc6;
    for (int b = 0; b < 4; b++)
        o[1 + b] = (uint8_t)(n >> (24 - 8 * b));
    return 5;
}

/* {"model_name": model, "block_hashes" | "token_ids": bin} */
static size_t build_query(struct e2e_lane *l, const struct kvi_trace_entry *en)
{
    struct e2e_run *r = l->run;
    bool hashes = r->e->query == KVI_E2E_QUERY_HASH;
    uint32_t bs = r->w->cfg.block_size;
    size_t payload = hashes ? (size_t)en->n * 8 : (size_t)en->n * bs * 4;
    size_t need = 64 + sizeof r->model + payload;
    if (need > l->qcap) {
        l->qcap = need;
        l->q = kvi_xrealloc(l->q, need);
    }
    uint8_t *o = l->q;
    size_t k = 0;
    o[k++] = 0x82;
    k += mp_str(o + k, "model_name");
    k += mp_str(o + k, r->model);
    k += mp_str(o + k, hashes ? "block_hashes" : "token_ids");
    k += mp_bin_hdr(o + k, payload);
    if (hashes) {
        for (uint32_t i = 0; i < en->n; i++)
            for (int b = 0; b < 8; b++)
                o[k++] = (uint8_t)(en->content[i] >> (8 * b));
    } else {
        if ((size_t)en->n * bs > l->tcap) {
            l->tcap = (size_t)en->n * bs;
            l->tok = kvi_xrealloc(l->tok, l->tcap * sizeof *l->tok);
        }
        for (uint32_t i = 0; i < en->n; i++)
            kvi_trace_block_tokens(r->w, en->req, i, l->tok + (size_t)i * bs);
        for (size_t i = 0; i < (size_t)en->n * bs; i++)
            for (int b = 0; b < 4; b++)
                o[k++] = (uint8_t)(l->tok[i] >> (8 * b));
    }
    return k;
}

/* A msgpack reader over one buffer, allocation-free: the lanes decode every
 * answer, and msgpack-c's unpacker (a zone per answer) costs more client CPU
 * than the whole HTTP/2 exchange. */
struct mp {
    const uint8_t *p, *end;
    bool bad;
};

static uint64_t mp_be(struct mp *m, unsigned n)
{
    if ((size_t)(m->end - m->p) < n) {
        m->bad = true;
        m->p = m->end;
        return 0;
    }
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = v << 8 | m->p[i];
    m->p += n;
    return v;
}

static void mp_advance(struct mp *m, uint64_t n)
{
    if ((uint64_t)(m->end - m->p) < n) {
        m->bad = true;
        m->p = m->end;
    } else {
        m->p += n;
    }
}

/* Next object's header: its kind ('i' int, 's' str/bin/ext payload, 'm' map, 'a' array, 'o' other),
 * with the integer value, the payload length or the element count in *v. */
static char mp_head(struct mp *m, uint64_t *v)
{
    if (m->p >= m->end) {
        m->bad = true;
        return 'o';
    }
    uint8_t b = *m->p++;
    *v = 0;
    if (b <= 0x7f) { *v = b; return 'i'; }
    if (b >= 0xe0) { *v = (uint64_t)(int64_t)(int8_t)b; return 'i'; }
    if ((b & 0xf0) == 0x80) { *v = b & 0x0f; return 'm'; }
    if ((b & 0xf0) == 0x90) { *v = b & 0x0f; return 'a'; }
    if ((b & 0xe0) == 0xa0) { *v = b & 0x1f; return 's'; }
    switch (b) {
    case 0xcc: case 0xd0: *v = mp_be(m, 1); return 'i';
    case 0xcd: case 0xd1: *v = mp_be(m, 2); return 'i';
    case 0xce: case 0xd2: *v = mp_be(m, 4); return 'i';
    case 0xcf: case 0xd3: *v = mp_be(m, 8); return 'i';
    case 0xca: mp_advance(m, 4); return 'o';
    case 0xcb: mp_advance(m, 8); return 'o';
    case 0xc4: case 0xd9: *v = mp_be(m, 1); return 's';
    case 0xc5: case 0xda: *v = mp_be(m, 2); return 's';
    case 0xc6: case 0xdb: *v = mp_be(m, 4); return 's';
    case 0xc7: *v = mp_be(m, 1) + 1; return 's';
    case 0xc8: *v = mp_be(m, 2) + 1; return 's';
    case 0xc9: *v = mp_be(m, 4) + 1; return 's';
    case 0xd4: *v = 2; return 's';
    case 0xd5: *v = 3; return 's';
    case 0xd6: *v = 5; return 's';
    case 0xd7: *v = 9; return 's';
    case 0xd8: *v = 17; return 's';
    case 0xdc: *v = mp_be(m, 2); return 'a';
    case 0xdd: *v = mp_be(m, 4); return 'a';
    case 0xde: *v = mp_be(m, 2); return 'm';
    case 0xdf: *v = mp_be(m, 4); return 'm';
    case 0xc0: case 0xc2: case 0xc3: return 'o';
    default: m->bad = true; return 'o';
    }
}

static void mp_skip(struct mp *m, int depth)
{
    uint64_t v;
    char k = mp_head(m, &v);
    if (depth > 32) {
        m->bad = true;
        return;
    }
    if (k == 's')
        mp_advance(m, v);
    else if (k == 'a' || k == 'm')
        for (uint64_t i = 0; i < (k == 'm' ? 2 * v : v) && !m->bad; i++)
            mp_skip(m, depth + 1);
}

/* The best score (tokens) in a Dynamo msgpack answer {"scores": {inst: {rank: tokens}}, ...};
 * -1 when the answer does not decode. */
static int64_t best_score(const uint8_t *p, size_t n)
{
    struct mp m = {p, p + n, false};
    uint64_t v;
    if (mp_head(&m, &v) != 'm')
        return -1;
    int64_t best = -1;
    for (uint64_t i = v; i > 0 && !m.bad; i--) {
        uint64_t kl, ni;
        char kk = mp_head(&m, &kl);
        if (kk == 'a' || kk == 'm')
            return -1; /* keys are strings (or ints) */
        bool scores = kk == 's' && kl == 6 && (size_t)(m.end - m.p) >= 6 && !memcmp(m.p, "scores", 6);
        if (kk == 's')
            mp_advance(&m, kl);
        if (!scores) {
            mp_skip(&m, 0);
            continue;
        }
        if (mp_head(&m, &ni) != 'm')
            return -1;
        best = 0;
        for (; ni > 0 && !m.bad; ni--) {
            mp_skip(&m, 0); /* instance id */
            uint64_t nr;
            if (mp_head(&m, &nr) != 'm')
                return -1;
            for (; nr > 0 && !m.bad; nr--) {
                mp_skip(&m, 0); /* dp rank */
                uint64_t tokens;
                if (mp_head(&m, &tokens) != 'i')
                    return -1;
                best = KVI_MAX(best, (int64_t)tokens);
            }
        }
    }
    return m.bad ? -1 : best;
}

static void lane_query(struct e2e_lane *l, const struct kvi_trace_entry *en)
{
    struct e2e_run *r = l->run;
    bool hashes = r->e->query == KVI_E2E_QUERY_HASH;
    uint64_t c0 = thread_cpu_ns();
    size_t len = build_query(l, en);
    struct kvi_h2c_resp resp;
    const char *path = hashes ? "/query_by_hash" : "/query";
    uint64_t t1 = kvi_now_ns();
    int rc = l->h2 ? kvi_h2c_post(l->h2, path, "application/msgpack", l->q, len, &resp) : -ECONNRESET;
    if (rc == -ECONNRESET) { /* the server closed the connection (idle timeout, GOAWAY): reconnect, retry once */
        char err[256];
        kvi_h2c_close(l->h2);
        l->h2 = kvi_h2c_connect(r->e->host, r->e->port, H2C_TIMEOUT_MS, err, sizeof err);
        t1 = kvi_now_ns();
        rc = l->h2 ? kvi_h2c_post(l->h2, path, "application/msgpack", l->q, len, &resp) : -ECONNRESET;
    }
    uint64_t t2 = kvi_now_ns();
    l->queries++;
    if (rc != 0) {
        lane_error(l, "query: %s", strerror(-rc));
    } else if (resp.status != 200) {
        char msg[160];
        snprintf(msg, sizeof msg, "%.*s", (int)KVI_MIN(resp.len, sizeof msg - 1), (const char *)resp.body);
        lane_error(l, "query answered %d: %s", resp.status, msg);
    } else {
        kvi_hist_record(&l->find, t2 - t1);
        int64_t best = best_score(resp.body, resp.len);
        if (best > 0) {
            l->hits++;
            l->best_depth_sum += (uint64_t)best / r->w->cfg.block_size;
        } else if (best < 0) {
            lane_error(l, "query: undecodable msgpack answer (%zu bytes)", resp.len);
        }
    }
    l->cpu_ns += thread_cpu_ns() - c0;
}

static void *lane_main(void *arg)
{
    struct e2e_lane *l = arg;
    struct e2e_run *r = l->run;
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    char name[16];
    snprintf(name, sizeof name, "kvi-e2e-%u", l->id);
    pthread_setname_np(pthread_self(), name);
    char err[256] = "";
    l->h2 = kvi_h2c_connect(r->e->host, r->e->port, H2C_TIMEOUT_MS, err, sizeof err);
    if (l->h2 == NULL)
        lane_error(l, "%s", err);
    pthread_barrier_wait(&r->ready);
    uint64_t t0;
    while ((t0 = atomic_load_explicit(&r->t0, memory_order_acquire)) == 0) /* pairs with the caller's release */
        sched_yield();
    uint64_t stop = t0 + r->stop_after;
    const struct kvi_trace_entry *ents = r->w->e;
    size_t i;
    for (i = 0; i < l->n; i++) {
        const struct kvi_trace_entry *en = &ents[l->idx[i]];
        uint64_t due = t0 + (uint64_t)((double)en->t_ns * r->scale);
        uint64_t now = kvi_now_ns();
        if (now < due) {
            flush_dirty(l);
            sleep_until(due);
            now = kvi_now_ns();
        }
        if (now > stop)
            break;
        kvi_hist_record(&l->lag, now - due);
        if (en->kind == KVI_TRACE_QUERY) {
            flush_dirty(l);
            lane_query(l, en);
        } else {
            uint64_t c0 = thread_cpu_ns();
            lane_event(l, en);
            l->ev_cpu_ns += thread_cpu_ns() - c0;
        }
        l->block_ops += en->n;
        atomic_store_explicit(&l->issued, i + 1, memory_order_relaxed);
    }
    flush_dirty(l);
    l->t_issue_end = kvi_now_ns();
    atomic_store_explicit(&l->done, true, memory_order_release); /* pairs with the caller's acquire */
    return NULL;
}

/* ---- one run ----------------------------------------------------------------------------------- */

static int setup_publishers(struct e2e_run *r, void *zctx, struct kvi_e2e_extra *x)
{
    uint32_t n = r->w->n_workers_total;
    for (uint32_t wk = 0; wk < n; wk++) {
        struct kvidx_pub_config pc;
        kvidx_pub_config_init(&pc);
        pc.endpoint = "tcp://127.0.0.1:*";
        pc.replay_endpoint = "tcp://127.0.0.1:*";
        pc.zmq_ctx = zctx;
        pc.hwm = 0; /* never drop live batches: the backlog stays visible */
        r->pub[wk] = kvidx_pub_create(&pc);
        if (r->pub[wk] == NULL) {
            snprintf(x->first_error, sizeof x->first_error, "kvidx_pub_create: %s", strerror(errno));
            return -errno;
        }
    }
    return 0;
}

static int register_all(struct e2e_run *r, struct kvi_e2e_extra *x)
{
    uint32_t n = r->w->n_workers_total;
    for (uint32_t wk = 0; wk < n; wk++) {
        char j[1024];
        snprintf(j, sizeof j,
                 "{\"instance_id\":%llu,\"model_name\":\"%s\",\"block_size\":%u,\"endpoint\":\"%s\","
                 "\"replay_endpoint\":\"%s\"}",
                 (unsigned long long)(r->id0 + wk), r->model, r->w->cfg.block_size, kvidx_pub_endpoint(r->pub[wk]),
                 kvidx_pub_replay_endpoint(r->pub[wk]));
        int rc = http_post_json(r->e, "/register", j, x->first_error, sizeof x->first_error);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static void unregister_all(struct e2e_run *r, uint32_t n)
{
    for (uint32_t wk = 0; wk < n; wk++) {
        char j[256];
        snprintf(j, sizeof j, "{\"instance_id\":%llu,\"model_name\":\"%s\"}", (unsigned long long)(r->id0 + wk),
                 r->model);
        http_post_json(r->e, "/unregister", j, NULL, 0);
    }
}

/* Empty batches until kvidxd applied every one: each listener is connected and caught up. */
static int handshake(struct e2e_run *r, struct kvi_e2e_text *t, struct kvi_e2e_extra *x)
{
    struct msnap m0, m;
    int rc = snap(r->e, t, &m0, x->first_error, sizeof x->first_error);
    uint64_t sent = 0, end = kvi_now_ns() + (uint64_t)HANDSHAKE_MS * 1000000u;
    while (rc == 0) {
        for (uint32_t wk = 0; wk < r->w->n_workers_total; wk++) {
            if (kvidx_pub_flush_empty(r->pub[wk], NULL) == 0)
                sent++;
        }
        struct timespec ts = {0, 30000000};
        nanosleep(&ts, NULL);
        if ((rc = snap(r->e, t, &m, x->first_error, sizeof x->first_error)) != 0)
            break;
        if (m.batches - m0.batches >= (double)sent)
            return 0;
        if (kvi_now_ns() > end) {
            snprintf(x->first_error, sizeof x->first_error,
                     "handshake: kvidxd applied %.0f of %llu empty batches within %d ms", m.batches - m0.batches,
                     (unsigned long long)sent, HANDSHAKE_MS);
            return -ETIMEDOUT;
        }
    }
    return rc;
}

static void split_lanes(const struct kvi_trace_workload *w, struct e2e_lane *lanes, uint32_t n_lanes)
{
    for (size_t i = 0; i < w->n; i++)
        lanes[w->e[i].worker % n_lanes].n++;
    for (uint32_t k = 0; k < n_lanes; k++) {
        lanes[k].idx = kvi_xmalloc((lanes[k].n ? lanes[k].n : 1) * sizeof *lanes[k].idx);
        lanes[k].n = 0;
        lanes[k].dirty = kvi_xmalloc(((size_t)w->n_workers_total / n_lanes + 1) * sizeof *lanes[k].dirty);
    }
    for (size_t i = 0; i < w->n; i++) {
        struct e2e_lane *l = &lanes[w->e[i].worker % n_lanes];
        l->idx[l->n++] = (uint32_t)i;
    }
}

static double d_ms(uint64_t a, uint64_t b)
{
    return b > a ? (double)(b - a) / 1e6 : 0.0;
}

/* events published but not decoded, plus ops not yet applied */
static double backlog_of(const struct msnap *m0, const struct msnap *m, uint64_t published)
{
    double decoded = (m->ev_stored - m0->ev_stored) + (m->ev_removed - m0->ev_removed);
    double ops_left = (m->submitted - m0->submitted) - (m->applied - m0->applied) - (m->rejected - m0->rejected);
    return KVI_MAX(0.0, (double)published - decoded) + KVI_MAX(0.0, ops_left);
}

static void fill(const struct kvi_trace_workload *w, const struct kvi_trace_run_cfg *cfg, struct e2e_lane *lanes,
                 uint64_t t0, uint64_t t_end, uint64_t t_last_issue, struct kvi_trace_run_result *res)
{
    struct kvi_hist *find = kvi_xmalloc(sizeof *find), *lag = kvi_xmalloc(sizeof *lag);
    kvi_hist_reset(find);
    kvi_hist_reset(lag);
    uint64_t best = 0;
    for (uint32_t k = 0; k < cfg->readers; k++) {
        struct e2e_lane *l = &lanes[k];
        res->ops_issued += atomic_load_explicit(&l->issued, memory_order_relaxed);
        res->events_issued += l->events;
        res->queries_issued += l->queries;
        res->block_ops_issued += l->block_ops;
        res->hit_queries += l->hits;
        best += l->best_depth_sum;
        kvi_hist_merge(find, &l->find);
        kvi_hist_merge(lag, &l->lag);
    }
    res->elapsed_ms = d_ms(t0, t_end);
    res->issue_end_ms = d_ms(t0, t_last_issue);
    kvi_trace_result_derive(w, cfg, find, lag, best, res);
    free(find);
    free(lag);
}

/* Start the lanes, release them at t0, wait until each finished issuing. */
static void run_lanes(struct e2e_run *r, struct e2e_lane *lanes, uint32_t n_lanes)
{
    const struct kvi_trace_run_cfg *cfg = r->cfg;
    pthread_barrier_init(&r->ready, NULL, n_lanes + 1);
    for (uint32_t k = 0; k < n_lanes; k++) {
        struct e2e_lane *l = &lanes[k];
        l->run = r;
        l->id = k;
        kvi_hist_reset(&l->find);
        kvi_hist_reset(&l->lag);
        int rc = pthread_create(&l->tid, NULL, lane_main, l);
        if (rc != 0)
            kvi_die("pthread_create: %d", rc);
    }
    pthread_barrier_wait(&r->ready);
    atomic_store_explicit(&r->t0, kvi_now_ns() + 1000000u, memory_order_release);
    uint64_t next_progress = 0;
    for (;;) {
        bool all = true;
        uint64_t done = 0;
        for (uint32_t k = 0; k < n_lanes; k++) {
            all &= atomic_load_explicit(&lanes[k].done, memory_order_acquire);
            done += atomic_load_explicit(&lanes[k].issued, memory_order_relaxed);
        }
        if (cfg->progress && kvi_now_ns() >= next_progress) {
            cfg->progress(cfg->pctx, done, r->w->n);
            next_progress = kvi_now_ns() + 100000000u;
        }
        if (all)
            break;
        struct timespec ts = {0, 500000};
        nanosleep(&ts, NULL);
    }
}

int kvi_e2e_run(struct kvi_e2e *e, const struct kvi_trace_workload *w, const struct kvi_trace_run_cfg *cfg,
                struct kvi_trace_run_result *res, struct kvi_e2e_extra *x)
{
    memset(res, 0, sizeof *res);
    memset(x, 0, sizeof *x);
    x->server_cpu_s = -1;
    if (!(cfg->window_ms > 0) || cfg->readers == 0 || !(cfg->max_overrun > 1.0) || w->n == 0 ||
        w->n_workers_total == 0)
        return -EINVAL;
    snprintf(res->backend, sizeof res->backend, "kvidxd-e2e");
    uint64_t t_setup = kvi_now_ns();
    uint32_t nw = w->n_workers_total;
    struct e2e_run r = {.e = e, .w = w, .cfg = cfg};
    snprintf(r.model, sizeof r.model, "trace-e2e-%d-%u", (int)getpid(), ++e->runs);
    r.id0 = ((uint64_t)getpid() << 32) + ((uint64_t)e->runs << 24) + 1; /* up to 2^24 workers per run */
    r.pub = kvi_xcalloc(nw, sizeof *r.pub);
    r.pending = kvi_xcalloc(nw, sizeof *r.pending);
    r.scale = cfg->window_ms * 1e6 / (w->span_ns ? (double)w->span_ns : 1.0);
    r.stop_after = (uint64_t)(cfg->max_overrun * cfg->window_ms * 1e6);
    void *zctx = zmq_ctx_new();
    if (zctx == NULL)
        kvi_die("zmq_ctx_new failed");
    zmq_ctx_set(zctx, ZMQ_IO_THREADS, 1);
    zmq_ctx_set(zctx, ZMQ_MAX_SOCKETS, (int)KVI_MIN(2u * nw + 64u, 65536u)); /* a PUB and a ROUTER per worker */
    struct kvi_e2e_text t = {0};
    int rc = setup_publishers(&r, zctx, x);
    if (rc == 0)
        rc = register_all(&r, x);
    if (rc == 0)
        rc = handshake(&r, &t, x);
    struct msnap m0, m1, m;
    if (rc == 0)
        rc = snap(e, &t, &m0, x->first_error, sizeof x->first_error);
    x->setup_ms = d_ms(t_setup, kvi_now_ns());
    struct e2e_lane *lanes = NULL;
    if (rc == 0) {
        lanes = aligned_alloc(KVI_CACHE_LINE, cfg->readers * sizeof *lanes);
        if (lanes == NULL)
            kvi_die("out of memory");
        memset(lanes, 0, cfg->readers * sizeof *lanes);
        split_lanes(w, lanes, cfg->readers);
        double cpu0 = kvi_bench_proc_cpu_s((int)e->pid);
        run_lanes(&r, lanes, cfg->readers);
        uint64_t t0 = atomic_load(&r.t0), t_last_issue = t0, published = 0;
        for (uint32_t k = 0; k < cfg->readers; k++) {
            t_last_issue = KVI_MAX(t_last_issue, lanes[k].t_issue_end);
            published += lanes[k].events;
        }
        /* backlog when issuing ended, then the drain */
        rc = snap(e, &t, &m1, x->first_error, sizeof x->first_error);
        res->backlog_events = rc == 0 ? (uint64_t)backlog_of(&m0, &m1, published) : published;
        uint64_t deadline = KVI_MAX(t0 + r.stop_after, t_last_issue + (uint64_t)DRAIN_EXTRA_MS * 1000000u);
        uint64_t t_end = kvi_now_ns(), polls = 0, poll_ns = 0;
        m = m1;
        while (rc == 0 && backlog_of(&m0, &m, published) > 0 && kvi_now_ns() < deadline) {
            uint64_t a = kvi_now_ns();
            rc = snap(e, &t, &m, x->first_error, sizeof x->first_error);
            t_end = kvi_now_ns();
            poll_ns += t_end - a;
            polls++;
            struct timespec ts = {0, 1000000}; /* leave the daemon's CPUs to the drain */
            nanosleep(&ts, NULL);
        }
        x->drained = rc == 0 && backlog_of(&m0, &m, published) == 0;
        if (!x->drained)
            t_end = kvi_now_ns();
        x->drain_poll_ms = polls ? (double)poll_ns / (double)polls / 1e6 : 0;
        if (e->pid > 0 && cpu0 >= 0)
            x->server_cpu_s = kvi_bench_proc_cpu_s((int)e->pid) - cpu0;
        for (uint32_t k = 0; k < cfg->readers; k++)
            pthread_join(lanes[k].tid, NULL);
        pthread_barrier_destroy(&r.ready);
        fill(w, cfg, lanes, t0, t_end, t_last_issue, res);
        res->backlog_pct = res->events_total ? 100.0 * (double)res->backlog_events / (double)res->events_total : 0;
        res->aborted = res->ops_issued < res->ops_total;
        uint64_t cpu = 0;
        for (uint32_t k = 0; k < cfg->readers; k++) {
            x->query_errors += lanes[k].errors;
            cpu += lanes[k].cpu_ns;
            x->publish_cpu_s += (double)lanes[k].ev_cpu_ns / 1e9;
            if (x->first_error[0] == '\0' && lanes[k].err[0] != '\0')
                snprintf(x->first_error, sizeof x->first_error, "%s", lanes[k].err);
        }
        res->valid = res->issue_ok && !res->aborted && res->backlog_pct <= 5.0 && x->drained && x->query_errors == 0;
        x->client_cpu_us = res->queries_issued ? (double)cpu / (double)res->queries_issued / 1e3 : 0;
        x->hit_pct = res->queries_issued ? 100.0 * (double)res->hit_queries / (double)res->queries_issued : 0;
        x->server_handler_us = m.q_count > m0.q_count ? (m.q_sum - m0.q_sum) / (m.q_count - m0.q_count) * 1e6 : 0;
        x->gaps = (uint64_t)(m.gaps - m0.gaps);
        x->lost = (uint64_t)(m.lost - m0.lost);
        x->replays = (uint64_t)(m.replays - m0.replays);
        res->rejected = (uint64_t)(m.rejected - m0.rejected);
        res->writer_busy_ms = (m.busy_s - m0.busy_s) * 1e3;
        res->stalls = (uint64_t)(m.stalls - m0.stalls);
        res->readers = cfg->readers;
        res->threads = cfg->readers + KVI_MAX(m.writers, 1u);
        x->ran = true;
        rc = 0;
    }
    for (uint32_t wk = 0; wk < nw; wk++) {
        if (r.pub[wk] == NULL)
            continue;
        struct kvidx_pub_stats ps;
        kvidx_pub_get_stats(r.pub[wk], &ps);
        x->batches += ps.batches;
        x->bytes += ps.bytes;
    }
    unregister_all(&r, nw);
    for (uint32_t wk = 0; wk < nw; wk++)
        kvidx_pub_destroy(r.pub[wk]);
    zmq_ctx_term(zctx);
    for (uint32_t k = 0; lanes != NULL && k < cfg->readers; k++) {
        kvi_h2c_close(lanes[k].h2);
        free(lanes[k].idx);
        free(lanes[k].dirty);
        free(lanes[k].q);
        free(lanes[k].tok);
    }
    free(lanes);
    free(r.pub);
    free(r.pending);
    free(t.p);
    return rc;
}

void kvi_e2e_print(const struct kvi_e2e_extra *x)
{
    if (!x->ran) {
        printf("%-10s   e2e setup failed: %s\n", "", x->first_error);
        fflush(stdout);
        return;
    }
    printf("%-10s   e2e: round trip per query (the find columns); kvidxd handler %.1f us, client CPU %.1f us per "
           "query; %.1f %% of queries hit;\n",
           "", x->server_handler_us, x->client_cpu_us, x->hit_pct);
    printf("%-10s   %llu batches (%.1f MB) published; listener gaps %llu, lost %llu, replays %llu; ", "",
           (unsigned long long)x->batches, (double)x->bytes / 1e6, (unsigned long long)x->gaps,
           (unsigned long long)x->lost, (unsigned long long)x->replays);
    if (x->server_cpu_s >= 0)
        printf("kvidxd CPU %.2f s; ", x->server_cpu_s);
    printf("lanes' publishing CPU %.2f s; ", x->publish_cpu_s);
    if (x->drain_poll_ms > 0)
        printf("drain polled every %.2f ms; ", x->drain_poll_ms);
    else if (x->drained)
        printf("drained when issuing ended; ");
    printf("setup %.0f ms%s\n", x->setup_ms, x->drained ? "" : "; NOT DRAINED");
    if (x->query_errors || x->first_error[0])
        printf("%-10s   errors: %llu (first: %s)\n", "", (unsigned long long)x->query_errors, x->first_error);
    fflush(stdout);
}

