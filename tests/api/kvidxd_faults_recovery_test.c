/* ctest-labels: integration */
/*
 * Fault matrix, restart and recovery half (issue 7 §3), against the real
 * kvidxd binary (kvidxd_recovery_test has the happy path, a refused peer, a
 * 404, an {"error":...} namespace and a Content-Length cut). Here:
 *   - peers failing every other way (500, a 200 of garbage, a close-delimited
 *     cut, a peer trickling past --recovery-timeout-ms) before a good one, a
 *     peer still recovering itself, and only bad peers (with --workers);
 *   - SIGTERM while a peer fetch hangs;
 *   - SIGKILL mid-stream and restart with --peers, with runtime
 *     registrations (replay) and with --workers (gated, no replay);
 *   - SIGTERM under ingestion and queries right after a peer recovered from
 *     it, and SIGTERM while a slow reader holds a large /dump open.
 * Dumps are compared record by record after decoding them with kvidx's own
 * decoder (api/codec_dump.h), which also proves they parse.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>

#include "kvidxd_fixture.h"

#include "api/codec_dump.h"

#define MODEL "m"

static int teardown(void **state)
{
    (void)state;
    kfx_kill_leftovers();
    return 0;
}

/* ---- small helpers ----------------------------------------------------------------------- */

static void reg(const struct kfx_daemon *d, uint64_t id, struct kvidx_pub *p)
{
    char j[512];
    snprintf(j, sizeof j,
             "{\"instance_id\":%llu,\"model_name\":\"" MODEL "\",\"block_size\":%d,\"endpoint\":\"%s\","
             "\"replay_endpoint\":\"%s\"}",
             (unsigned long long)id, KFX_BS, kvidx_pub_endpoint(p), kvidx_pub_replay_endpoint(p));
    kfx_expect(d, "/register", j, 201, NULL);
}

/* The whole file at `path` (NUL-terminated, "" when missing); free it. */
static char *slurp(const char *path)
{
    struct stat st;
    FILE *f = fopen(path, "r");
    size_t cap = f != NULL && fstat(fileno(f), &st) == 0 ? (size_t)st.st_size : 0;
    char *s = calloc(1, cap + 1);
    if (f != NULL) {
        s[fread(s, 1, cap, f)] = '\0';
        fclose(f);
    }
    return s;
}

/* The log line of a failed peer must name it and say why. */
static void expect_peer_failed(const struct kfx_daemon *d, uint16_t port, const char *why)
{
    char *s = slurp(d->logfile);
    char needle[128];
    snprintf(needle, sizeof needle, "recovery: peer http://127.0.0.1:%u failed: ", port);
    const char *line = strstr(s, needle), *eol = line ? line + strcspn(line, "\n") : NULL;
    if (line == NULL || (why != NULL && (strstr(line, why) == NULL || strstr(line, why) > eol)))
        fail_msg("no '%s%s' in the log:\n%s", needle, why ? why : "", s);
    free(s);
}

static bool status_has(const struct kfx_daemon *d, const char *needle)
{
    return kfx_get_has(d, "/status", 200, needle);
}

static void wait_recovery(const struct kfx_daemon *d, const char *result)
{
    char want[160];
    snprintf(want, sizeof want, "\"recovery\":{\"enabled\":true,\"in_progress\":false,\"last_result\":\"%s\"}",
             result);
    if (!KFX_WAIT(status_has(d, want), KFX_WAIT_MS)) {
        kfx_dump_log(d);
        fail_msg("recovery did not end with %s", result);
    }
}

/* A TCP socket bound to an ephemeral loopback port, listening unless `backlog` is 0; *port gets the port. */
static int loopback_socket(int backlog, uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_true(backlog == 0 || listen(fd, backlog) == 0);
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    *port = ntohs(a.sin_port);
    return fd;
}

/* A TCP port on loopback that nobody listens on (bound, then closed). */
static uint16_t dead_port(void)
{
    uint16_t port;
    close(loopback_socket(0, &port));
    return port;
}

/* "http://127.0.0.1:P1,http://127.0.0.1:P2,..." */
static char *peer_list(char *buf, size_t cap, const uint16_t *ports, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%shttp://127.0.0.1:%u", i ? "," : "", ports[i]);
    return buf;
}

/* Stop a helper thread through its stop pipe, join it, close its fds. */
static void stop_helper(pthread_t thr, int lfd, int stop[2])
{
    ssize_t w = write(stop[1], "x", 1);
    (void)w;
    pthread_join(thr, NULL);
    close(lfd);
    close(stop[0]);
    close(stop[1]);
}

/* SIGKILL without the fixture's log print (an expected non-zero status). */
static void kill9(struct kfx_daemon *d)
{
    kill(d->pid, SIGKILL);
    int st = 0;
    assert_int_equal(waitpid(d->pid, &st, 0), d->pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    kfx_track(d->pid, NULL, NULL);
    d->pid = 0;
    unlink(d->portfile);
    unlink(d->logfile);
}

/* SIGTERM and wait (10 s at most); *ms = time to exit, *log = its log (free it).
 * @return the exit status, 128 + signal, or -1 when it had to be killed. */
static int term_keep_log(struct kfx_daemon *d, int64_t *ms, char **log)
{
    int64_t t0 = kfx_now_ms();
    kill(d->pid, SIGTERM);
    int st = 0, rc = -1;
    while (kfx_now_ms() - t0 < 10000) {
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            break;
        }
        kfx_nap(1);
    }
    *ms = kfx_now_ms() - t0;
    if (rc == -1) {
        kill(d->pid, SIGKILL);
        waitpid(d->pid, NULL, 0);
    }
    kfx_track(d->pid, NULL, NULL);
    d->pid = 0;
    *log = slurp(d->logfile);
    unlink(d->portfile);
    unlink(d->logfile);
    return rc;
}

/*
 * The SIGTERM guarantee: exit 0 within 2 s. Sanitizer builds add their own
 * exit work (the leak check) after kvidxd's shutdown has finished, so there
 * the daemon's own "stopped in N ms" (signal to end of main) must be under
 * 2 s and the process gets 8 s to be gone.
 */
static void expect_quick_exit(int rc, int64_t ms, const char *log, const char *what)
{
    const char *p = strstr(log, "stopped in ");
    long own = p != NULL ? strtol(p + 11, NULL, 10) : -1;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(KVI_TSAN)
    bool ok = rc == 0 && own >= 0 && own < 2000 && ms < 8000;
#else
    bool ok = rc == 0 && ms < 2000;
#endif
    print_message("SIGTERM %s: exit %d after %lld ms (shutdown %ld ms)\n", what, rc, (long long)ms, own);
    if (!ok)
        fail_msg("SIGTERM %s: exit %d after %lld ms (kvidxd: stopped in %ld ms):\n%s", what, rc, (long long)ms, own,
                 log);
}

/* Send empty batches until each daemon's (draining) listeners received `min` (slow joiners). */
static void until_joined(struct kfx_daemon *const *ds, size_t n, struct kvidx_pub *const *pubs, size_t n_pubs,
                         long long min)
{
    int64_t end = kfx_now_ms() + KFX_WAIT_MS;
    for (bool all = false; !all;) {
        uint64_t seq;
        for (size_t i = 0; i < n_pubs; i++)
            assert_int_equal(kvidx_pub_flush_empty(pubs[i], &seq), 0);
        all = true;
        for (size_t i = 0; i < n; i++)
            all &= KFX_WAIT(kfx_metric(ds[i], "kvidx_listener_batches_total") >= min, 50);
        if (!all && kfx_now_ms() > end)
            fail_msg("the listeners never received a batch");
    }
}

/* ---- dumps, decoded ------------------------------------------------------------------------ */

struct drec {
    char ns[64];
    struct kvi_dump_rec r; /* strings cleared (they die with the callback) */
    char worker[48];       /* worker_name, when named */
};

struct dset {
    struct drec *v;
    size_t n, cap;
    size_t body_len;
};

static struct drec *dset_push(struct dset *s)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
    }
    struct drec *d = &s->v[s->n++];
    memset(d, 0, sizeof *d);
    return d;
}

static int dset_rec(void *ctx, const struct kvi_dump_rec *r)
{
    struct drec *d = dset_push(ctx);
    snprintf(d->ns, sizeof d->ns, "%.*s:%.*s", (int)r->model.len, r->model.p, (int)r->tenant.len, r->tenant.p);
    if (r->worker_named)
        snprintf(d->worker, sizeof d->worker, "%.*s", (int)r->worker_name.len, r->worker_name.p);
    d->r = *r;
    d->r.model = d->r.tenant = d->r.worker_name = (struct kvi_str){NULL, 0};
    return 0;
}

/* GET /dump and decode it (the test fails when it does not parse). */
static struct dset dump_get(const struct kfx_daemon *d)
{
    struct kfx_resp resp;
    if (kfx_get(d, "/dump", &resp) != 200)
        fail_msg("/dump answered %ld", resp.status);
    struct dset s = {0};
    s.body_len = resp.len;
    struct kvi_dump_dec_cb cb = {NULL, dset_rec, &s, NULL};
    struct kvi_dump_dec *dec = kvi_dump_dec_create(&cb);
    assert_non_null(dec);
    int rc = kvi_dump_dec_feed(dec, resp.body, resp.len);
    if (rc == 0)
        rc = kvi_dump_dec_finish(dec);
    if (rc != 0)
        fail_msg("/dump does not parse (%d: %s): %.300s", rc, kvi_dump_dec_error(dec), resp.body);
    kvi_dump_dec_destroy(dec);
    kfx_resp_free(&resp);
    return s;
}

static void dset_free(struct dset *s)
{
    free(s->v);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

struct lines {
    char **v;
    size_t n;
};

static void lines_add(struct lines *l, const char *s)
{
    l->v = realloc(l->v, (l->n + 1) * sizeof *l->v);
    l->v[l->n++] = strdup(s);
}

static void lines_free(struct lines *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* One record, every field (event ids excluded: they are renumbered per dump). */
static void full_line(const struct drec *d, char *out, size_t cap)
{
    const struct kvi_dump_rec *r = &d->r;
    char w[64];
    if (r->worker_named)
        snprintf(w, sizeof w, "\"%s\"", d->worker);
    else
        snprintf(w, sizeof w, "%llu", (unsigned long long)r->worker_id);
    snprintf(out, cap, "%s w=%s r=%u t=%d op=%d h=%016llx p=%c%016llx c=%016llx pos=%c%u s=%c%016llx nc=%d", d->ns, w,
             r->dp_rank, (int)r->tier, (int)r->op, (unsigned long long)r->engine_hash, r->has_parent ? '+' : '-',
             (unsigned long long)r->parent_hash, (unsigned long long)r->content_hash, r->has_position ? '+' : '-',
             r->position, r->has_seq ? '+' : '-', (unsigned long long)r->seq_hash, (int)r->no_content);
}

/* The workload's view of a record: worker, block, parent (0 for a root). */
static void key_line(uint64_t w, uint64_t h, uint64_t parent, char *out, size_t cap)
{
    snprintf(out, cap, "w=%llu h=%016llx p=%016llx", (unsigned long long)w, (unsigned long long)h,
             (unsigned long long)parent);
}

static struct lines dset_lines(const struct dset *s, bool keys_only)
{
    struct lines l = {0};
    char buf[512];
    for (size_t i = 0; i < s->n; i++) {
        if (keys_only)
            key_line(s->v[i].r.worker_id, s->v[i].r.engine_hash, s->v[i].r.has_parent ? s->v[i].r.parent_hash : 0,
                     buf, sizeof buf);
        else
            full_line(&s->v[i], buf, sizeof buf);
        lines_add(&l, buf);
    }
    qsort(l.v, l.n, sizeof *l.v, cmp_str);
    return l;
}

/* Whether two sorted line sets are equal; else print the first differences to stderr when `say`. */
static bool lines_equal(const struct lines *a, const struct lines *b, const char *na, const char *nb, bool say)
{
    bool eq = a->n == b->n;
    for (size_t i = 0; eq && i < a->n; i++)
        eq = strcmp(a->v[i], b->v[i]) == 0;
    if (eq || !say)
        return eq;
    fprintf(stderr, "%s has %zu records, %s %zu; first differences:\n", na, a->n, nb, b->n);
    size_t i = 0, j = 0;
    int shown = 0;
    while ((i < a->n || j < b->n) && shown < 16) {
        int c = i == a->n ? 1 : j == b->n ? -1 : strcmp(a->v[i], b->v[j]);
        if (c == 0) {
            i++;
            j++;
            continue;
        }
        fprintf(stderr, "  only in %s: %s\n", c < 0 ? na : nb, c < 0 ? a->v[i] : b->v[j]);
        c < 0 ? i++ : j++;
        shown++;
    }
    return false;
}

/* Both daemons' dumps, every field, are equal. */
static bool dumps_equal(const struct kfx_daemon *a, const struct kfx_daemon *b, bool say)
{
    struct dset da = dump_get(a), db = dump_get(b);
    struct lines la = dset_lines(&da, false), lb = dset_lines(&db, false);
    bool eq = lines_equal(&la, &lb, "A", "B", say);
    lines_free(&la);
    lines_free(&lb);
    dset_free(&da);
    dset_free(&db);
    return eq;
}

/* "namespace worker rank hash": where a block's parent must be (same slot owner, any tier). */
static void owner_key(const struct drec *d, uint64_t h, char *out, size_t cap)
{
    snprintf(out, cap, "%s %s%llu %u %016llx", d->ns, d->worker, (unsigned long long)d->r.worker_id, d->r.dp_rank,
             (unsigned long long)h);
}

/* Every record is a stored block, and every block that names a parent has that parent in the dump. */
static void expect_parents_exist(const struct dset *s)
{
    struct lines have = {0};
    char key[256], *k = key;
    for (size_t i = 0; i < s->n; i++) {
        owner_key(&s->v[i], s->v[i].r.engine_hash, key, sizeof key);
        lines_add(&have, key);
        if (s->v[i].r.op != KVI_DUMP_STORED)
            fail_msg("a dump holds only stored events; record %zu has op %d", i, (int)s->v[i].r.op);
    }
    qsort(have.v, have.n, sizeof *have.v, cmp_str);
    for (size_t i = 0; i < s->n; i++) {
        owner_key(&s->v[i], s->v[i].r.parent_hash, key, sizeof key);
        if (s->v[i].r.has_parent && bsearch(&k, have.v, have.n, sizeof *have.v, cmp_str) == NULL)
            fail_msg("the parent of %s is not in the dump", key);
    }
    lines_free(&have);
}

/* ---- fake peers -------------------------------------------------------------------------------- */

enum fp_mode {
    FP_FIXED,   /* write the response, close */
    FP_TRICKLE, /* write the response head and one chunk, then one more chunk every 50 ms, forever */
    FP_SILENT,  /* read the request, answer nothing, hold the connection */
};

struct fake_peer {
    int fd, stop[2];
    uint16_t port;
    enum fp_mode mode;
    const char *resp;
    size_t resp_len;
    pthread_t thr;
    atomic_int requests;      /* whole request heads read */
    atomic_int client_closed; /* connections the client closed before we did (trickle, silent) */
    atomic_llong held_ms;     /* how long the last held connection lasted */
};

/* Wait for `fd` readable, or the stop pipe; @return 1 readable, 0 timeout, -1 stop. */
static int fp_wait(struct fake_peer *f, int fd, int ms)
{
    struct pollfd p[2] = {{fd, POLLIN, 0}, {f->stop[0], POLLIN, 0}};
    int n = poll(p, 2, ms);
    if (n > 0 && p[1].revents)
        return -1;
    return n > 0 ? 1 : 0;
}

static bool fp_send(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0)
            return false;
        c += w;
        n -= (size_t)w;
    }
    return true;
}

static void fp_serve(struct fake_peer *f, int c)
{
    char req[4096];
    size_t n = 0;
    while (n < sizeof req - 1) {
        if (fp_wait(f, c, 5000) != 1)
            return;
        ssize_t got = read(c, req + n, sizeof req - 1 - n);
        if (got <= 0) {
            atomic_fetch_add(&f->client_closed, 1);
            return;
        }
        n += (size_t)got;
        req[n] = '\0';
        if (strstr(req, "\r\n\r\n") != NULL)
            break;
    }
    atomic_fetch_add(&f->requests, 1);
    if (f->mode == FP_FIXED) {
        fp_send(c, f->resp, f->resp_len);
        return;
    }
    int64_t t0 = kfx_now_ms();
    if (f->mode == FP_TRICKLE && !fp_send(c, f->resp, f->resp_len))
        return;
    /* until the client goes: a trickle sends JSON whitespace between two events, one chunk at a time */
    for (int w; (w = fp_wait(f, c, 50)) >= 0;) {
        char b[256];
        if (w == 1 ? read(c, b, sizeof b) <= 0 : f->mode == FP_TRICKLE && !fp_send(c, "1\r\n \r\n", 6)) {
            atomic_store(&f->held_ms, kfx_now_ms() - t0);
            atomic_fetch_add(&f->client_closed, 1);
            return;
        }
    }
}

static void *fp_main(void *arg)
{
    struct fake_peer *f = arg;
    for (;;) {
        if (fp_wait(f, f->fd, -1) != 1)
            return NULL;
        int c = accept4(f->fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0)
            continue;
        fp_serve(f, c);
        close(c);
    }
}

static void fp_start(struct fake_peer *f, enum fp_mode mode, const char *resp, size_t len)
{
    memset(f, 0, sizeof *f);
    f->mode = mode;
    f->resp = resp;
    f->resp_len = len;
    assert_int_equal(pipe2(f->stop, O_CLOEXEC), 0);
    f->fd = loopback_socket(16, &f->port);
    assert_int_equal(pthread_create(&f->thr, NULL, fp_main, f), 0);
}

#define fp_stop(f) stop_helper((f)->thr, (f)->fd, (f)->stop)

/* One dump event: worker w, block h (a root at position 0), content c. */
static void dump_event(char *out, size_t cap, uint64_t w, uint64_t h, uint64_t c)
{
    snprintf(out, cap,
             "{\"worker_id\":%llu,\"storage_tier\":\"device\",\"event\":{\"event_id\":0,\"dp_rank\":0,\"data\":"
             "{\"stored\":{\"parent_hash\":null,\"start_position\":0,\"blocks\":[{\"block_hash\":%llu,"
             "\"tokens_hash\":%llu,\"mm_extra_info\":null}]}}}}",
             (unsigned long long)w, (unsigned long long)h, (unsigned long long)c);
}

#define BOGUS_HASH 0xdead00000000beefull

/* The bad peers' bodies and responses (static storage: the threads read them). */
struct bad_bodies {
    char http500[512];
    char garbage[512];
    size_t garbage_len;
    char cut[2048];    /* a close-delimited 200 whose body stops mid-dump */
    char trickle[2048]; /* chunked head + the start of a dump naming worker `w` */
};

static void bad_bodies_init(struct bad_bodies *b, uint64_t w)
{
    static const char e500[] = "{\"error\":\"dump exploded\"}";
    snprintf(b->http500, sizeof b->http500,
             "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
             "Connection: close\r\n\r\n%s",
             strlen(e500), e500);
    static const char junk[] = "\x00\xff\xfe<html>not a dump</html>\x01";
    int o = snprintf(b->garbage, sizeof b->garbage,
                     "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     sizeof junk - 1);
    memcpy(b->garbage + o, junk, sizeof junk - 1);
    b->garbage_len = (size_t)o + sizeof junk - 1;
    char e1[512], e2[512];
    dump_event(e1, sizeof e1, w, BOGUS_HASH, 7);
    dump_event(e2, sizeof e2, 9, BOGUS_HASH + 1, 8);
    /* complete events, then the connection closes: HTTP sees a whole body, the decoder an EOF */
    snprintf(b->cut, sizeof b->cut,
             "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
             "{\"" MODEL ":default\":{\"block_size\":%d,\"events\":[%s,%s",
             KFX_BS, e1, e2);
    char body[1536];
    int bl = snprintf(body, sizeof body, "{\"" MODEL ":default\":{\"block_size\":%d,\"events\":[%s,%s,", KFX_BS, e1,
                      e2);
    snprintf(b->trickle, sizeof b->trickle,
             "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n",
             (unsigned)bl, body);
}

/* No record of the dump is the fake peers' (their hashes, their worker 9). */
static void expect_no_bogus(const struct dset *s)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i].r.engine_hash == BOGUS_HASH || s->v[i].r.engine_hash == BOGUS_HASH + 1 ||
            s->v[i].r.worker_id == 9)
            fail_msg("a failed peer's block survived its rollback (worker %llu, hash %llx)",
                     (unsigned long long)s->v[i].r.worker_id, (unsigned long long)s->v[i].r.engine_hash);
}

/* ---- 1. bad peers, then a good one ----------------------------------------------------------- */

static void test_failing_peers_fall_through(void **state)
{
    (void)state;
    struct kfx_daemon a, b;
    kfx_start(&a, NULL, NULL);
    struct kvidx_pub *p = kfx_pub(0);
    reg(&a, 1, p);
    kfx_publish(p, 1, 0, 6, NULL);
    kfx_publish(p, 2, 0, 3, NULL);
    kfx_publish(p, 2, 3, 5, "CPU");
    char *q = kfx_query_json(MODEL, 2, 5);
    kfx_until_query(&a, "/query", q, "\"1\":{\"longest_matched\":20,\"gpu\":12,", &p, 1);

    static struct bad_bodies bb;
    bad_bodies_init(&bb, 1);
    static struct fake_peer f[4];
    struct fake_peer *f500 = &f[0], *fjunk = &f[1], *fcut = &f[2], *fslow = &f[3];
    fp_start(f500, FP_FIXED, bb.http500, strlen(bb.http500));
    fp_start(fjunk, FP_FIXED, bb.garbage, bb.garbage_len);
    fp_start(fcut, FP_FIXED, bb.cut, strlen(bb.cut));
    fp_start(fslow, FP_TRICKLE, bb.trickle, strlen(bb.trickle));
    uint16_t dead = dead_port(), ports[6] = {dead, f500->port, fjunk->port, fcut->port, fslow->port, a.port};
    char peers[512];
    const char *args[] = {"--peers", peer_list(peers, sizeof peers, ports, 6), "--recovery-delay-ms", "0",
                          "--recovery-timeout-ms", "1000", NULL};
    int64_t t0 = kfx_now_ms();
    kfx_start(&b, args, NULL);
    /* the trickling peer holds recovery for the whole timeout */
    assert_true(KFX_WAIT(atomic_load(&fslow->requests) == 1, KFX_WAIT_MS));
    kfx_expect_get(&b, "/ready", 503, "{\"ready\":false,\"reason\":\"recovering_from_peer\"}");
    wait_recovery(&b, "succeeded");
    int64_t took = kfx_now_ms() - t0;
    kfx_expect_get(&b, "/ready", 200, "{\"ready\":true,\"reason\":\"ready\"}");

    /* each bad peer was asked once and given up on; the slow one at the timeout */
    for (int i = 0; i < 3; i++)
        assert_int_equal(atomic_load(&f[i].requests), 1);
    assert_true(KFX_WAIT(atomic_load(&fslow->client_closed) == 1, KFX_WAIT_MS));
    long long held = atomic_load(&fslow->held_ms);
    if (held < 900 || took < 900 || held > 5000)
        fail_msg("the trickling peer was dropped after %lld ms (recovery took %lld ms), not at the 1000 ms timeout",
                 held, (long long)took);
    print_message("recovery through 5 bad peers took %lld ms (slow peer held %lld ms)\n", (long long)took, held);
    assert_int_equal(kfx_metric(&b, "kvidx_recovery_attempts_total"), 6);
    assert_int_equal(kfx_metric(&b, "kvidx_recovery_blocks"), 6 + 5);
    assert_int_equal(kfx_metric(&b, "kvidx_recovery_rejected_blocks"), 0);
    expect_peer_failed(&b, dead, NULL);
    expect_peer_failed(&b, f500->port, "HTTP status 500: {\"error\":\"dump exploded\"}");
    expect_peer_failed(&b, fjunk->port, "bad dump: dump is not a JSON object");
    expect_peer_failed(&b, fcut->port, "bad dump: EOF while parsing the dump");
    expect_peer_failed(&b, fslow->port, "timed out");
    assert_true(kfx_log_has(&b, "recovery: applied 11 block(s) in 1 namespace(s)", NULL, 0));

    /* exactly A's state: the partial dumps of the cut and slow peers were rolled back */
    struct dset db = dump_get(&b);
    expect_no_bogus(&db);
    expect_parents_exist(&db);
    assert_int_equal(db.n, 11);
    dset_free(&db);
    assert_true(dumps_equal(&a, &b, true));
    kfx_until_query(&b, "/query", q, "\"1\":{\"longest_matched\":20,\"gpu\":12,", NULL, 0);
    for (int i = 0; i < 4; i++)
        fp_stop(&f[i]);
    free(q);
    kvidx_pub_destroy(p);
    assert_int_equal(kfx_stop(&b, SIGTERM, NULL), 0);
    assert_int_equal(kfx_stop(&a, SIGTERM, NULL), 0);
}

/*
 * A peer that is itself still recovering: C waits out its recovery delay
 * before fetching A; B asks C meanwhile. C's control thread serves /dump only
 * after its own recovery, so B gets A's whole state, not C's empty start.
 */
static void test_peer_still_recovering(void **state)
{
    (void)state;
    struct kfx_daemon a, b, c;
    kfx_start(&a, NULL, NULL);
    struct kvidx_pub *p = kfx_pub(0);
    reg(&a, 1, p);
    kfx_publish(p, 4, 0, 7, NULL);
    char *q = kfx_query_json(MODEL, 4, 7);
    kfx_until_query(&a, "/query", q, "\"scores\":{\"1\":{\"0\":28}}", &p, 1);
    char pa[64], pc[64];
    snprintf(pa, sizeof pa, "http://127.0.0.1:%u", a.port);
    const char *cargs[] = {"--peers", pa, "--recovery-delay-ms", "1500", NULL};
    kfx_start(&c, cargs, NULL);
    snprintf(pc, sizeof pc, "http://127.0.0.1:%u", c.port);
    const char *bargs[] = {"--peers", pc, "--recovery-delay-ms", "0", "--recovery-timeout-ms", "10000", NULL};
    kfx_start(&b, bargs, NULL);
    /* B starts fetching while C has not recovered yet */
    assert_true(kfx_log_has(&b, "recovery: fetching /dump from 1 peer(s)", NULL, KFX_WAIT_MS));
    assert_true(status_has(&c, "\"recovery\":{\"enabled\":true,\"in_progress\":true}"));
    wait_recovery(&c, "succeeded");
    wait_recovery(&b, "succeeded");
    assert_int_equal(kfx_metric(&b, "kvidx_recovery_attempts_total"), 1);
    assert_int_equal(kfx_metric(&b, "kvidx_recovery_blocks"), 7);
    assert_true(dumps_equal(&a, &c, true));
    assert_true(dumps_equal(&a, &b, true));
    free(q);
    kvidx_pub_destroy(p);
    assert_int_equal(kfx_stop(&b, SIGTERM, NULL), 0);
    assert_int_equal(kfx_stop(&c, SIGTERM, NULL), 0);
    assert_int_equal(kfx_stop(&a, SIGTERM, NULL), 0);
}

/* ---- 1b. only bad peers: start empty, serve, ingest ----------------------------------------- */

static void test_only_bad_peers_start_empty(void **state)
{
    (void)state;
    static struct bad_bodies bb;
    bad_bodies_init(&bb, 1); /* worker 1 is this daemon's own --workers instance */
    static struct fake_peer f[4];
    struct fake_peer *fcut = &f[0], *fslow = &f[1], *f500 = &f[2], *fsilent = &f[3];
    fp_start(fcut, FP_FIXED, bb.cut, strlen(bb.cut));
    fp_start(fslow, FP_TRICKLE, bb.trickle, strlen(bb.trickle));
    fp_start(f500, FP_FIXED, bb.http500, strlen(bb.http500));
    fp_start(fsilent, FP_SILENT, NULL, 0);
    struct kvidx_pub *p = kfx_pub(0);
    char workers[256], peers[512];
    snprintf(workers, sizeof workers, "1=%s", kvidx_pub_endpoint(p));
    uint16_t dead = dead_port(), ports[5] = {dead, fcut->port, fslow->port, f500->port, fsilent->port};
    const char *args[] = {"--workers", workers, "--block-size", "4", "--model-name", MODEL,
                          "--peers", peer_list(peers, sizeof peers, ports, 5), "--recovery-delay-ms", "0",
                          "--recovery-timeout-ms", "700", NULL};
    struct kfx_daemon b;
    kfx_start(&b, args, NULL);
    assert_true(KFX_WAIT(atomic_load(&fslow->requests) == 1, KFX_WAIT_MS));
    /* meanwhile the --workers listener is connected but gated */
    assert_true(status_has(&b, "\"recovery\":{\"enabled\":true,\"in_progress\":true}"));
    assert_true(status_has(&b, "\"listeners\":{\"pending\":1,\"active\":0,"));
    wait_recovery(&b, "no_reachable_peers");
    assert_true(KFX_WAIT(kfx_get_has(&b, "/ready", 200, "{\"ready\":true,\"reason\":\"ready\"}"), KFX_WAIT_MS));
    assert_int_equal(kfx_metric(&b, "kvidx_recovery_attempts_total"), 5);
    assert_int_equal(kfx_metric(&b, "kvidx_recovery_blocks"), 0);
    expect_peer_failed(&b, dead, NULL);
    expect_peer_failed(&b, fcut->port, "bad dump: EOF while parsing the dump");
    expect_peer_failed(&b, fslow->port, "timed out");
    expect_peer_failed(&b, f500->port, "HTTP status 500");
    expect_peer_failed(&b, fsilent->port, "timed out");
    assert_true(kfx_log_has(&b, "recovery: no reachable peer; starting empty", NULL, 0));
    assert_true(KFX_WAIT(atomic_load(&fsilent->client_closed) == 1, KFX_WAIT_MS));

    /* empty: the registered namespace with no events, and queries answer */
    kfx_expect_get(&b, "/dump", 200, "{\"" MODEL ":default\":{\"block_size\":4,\"events\":[]}}");
    char *q = kfx_query_json(MODEL, 3, 4);
    kfx_expect(&b, "/query", q, 200, "{\"scores\":{},\"frequencies\":[],\"tree_sizes\":{},\"instances\":{}}");
    assert_true(kfx_get_has(&b, "/workers", 200, "\"instance_id\":1,"));
    assert_true(kfx_get_has(&b, "/workers", 200, "\"status\":\"active\""));

    /* the live listener of worker 1 ingests (the rolled-back partial dumps named worker 1 too) */
    struct kfx_daemon *bs[1] = {&b};
    until_joined(bs, 1, &p, 1, 1);
    kfx_publish(p, 3, 0, 4, NULL);
    kfx_publish(p, 3, 4, 6, "CPU");
    kfx_until_query(&b, "/query", q, "\"scores\":{\"1\":{\"0\":16}}", &p, 1);
    struct dset db = dump_get(&b);
    expect_no_bogus(&db);
    expect_parents_exist(&db);
    assert_int_equal(db.n, 6);
    for (size_t i = 0; i < db.n; i++)
        assert_int_equal(db.v[i].r.worker_id, 1);
    dset_free(&db);
    free(q);
    kvidx_pub_destroy(p);
    for (int i = 0; i < 4; i++)
        fp_stop(&f[i]);
    assert_int_equal(kfx_stop(&b, SIGTERM, NULL), 0);
}

/* ---- 1c. SIGTERM while the peer fetch hangs ------------------------------------------------- */

/*
 * SIGTERM while the only peer fetch hangs: waiting for the answer (silent
 * peer), then half-way through a body already being applied (trickling
 * peer, rolled back): exit 0 within 2 s, the connection closed.
 */
static void test_sigterm_during_peer_fetch(void **state)
{
    (void)state;
    static struct bad_bodies bb;
    bad_bodies_init(&bb, 1);
    for (int mode = FP_TRICKLE; mode <= FP_SILENT; mode++) {
        static struct fake_peer f;
        fp_start(&f, (enum fp_mode)mode, bb.trickle, strlen(bb.trickle));
        char peers[128];
        const char *args[] = {"--peers", peer_list(peers, sizeof peers, &f.port, 1), "--recovery-delay-ms", "0",
                              "--recovery-timeout-ms", "600000", NULL};
        struct kfx_daemon b;
        kfx_start(&b, args, NULL);
        assert_true(KFX_WAIT(atomic_load(&f.requests) == 1, KFX_WAIT_MS));
        if (mode == FP_TRICKLE) /* the events sent so far are being applied */
            assert_true(kfx_log_has(&b, "namespace " MODEL ":default created", NULL, KFX_WAIT_MS));
        assert_true(status_has(&b, "\"recovery\":{\"enabled\":true,\"in_progress\":true}"));
        int64_t ms = 0;
        char *log = NULL;
        int rc = term_keep_log(&b, &ms, &log);
        expect_quick_exit(rc, ms, log, mode == FP_TRICKLE ? "while applying a peer's dump" : "during a hung fetch");
        if (strstr(log, "failed: shutting down") == NULL || strstr(log, "stopped in") == NULL ||
            (mode == FP_TRICKLE && strstr(log, "namespace " MODEL ":default deleted") == NULL))
            fail_msg("the fetch was not cut short (and rolled back) by the shutdown:\n%s", log);
        free(log);
        /* the hung connection was closed, not leaked */
        assert_true(KFX_WAIT(atomic_load(&f.client_closed) == 1, KFX_WAIT_MS));
        fp_stop(&f);
    }
}

/* ---- the workload of the restart tests ------------------------------------------------------- */

/*
 * Step k goes to worker k % 2 + 1 (publisher k % 2) as one batch: store
 * chain k, blocks [0, L(k)), L(k) = 3 + k % 4, as one event; then, from k = 4
 * on, remove blocks [2, L(k - 4)) of chain k - 4 (the same worker's chain
 * two steps back). Each event is one op, so a worker's state at any point of
 * its stream is "after its first j steps" or "after j - 1 steps and the store
 * of step j".
 */
static uint32_t chain_len(uint32_t k)
{
    return 3 + k % 4;
}

/* @return 0, or the publisher's error (callable off the test's main thread) */
static int step_publish(struct kvidx_pub *p, uint32_t k)
{
    uint32_t L = chain_len(k);
    uint64_t h[8];
    uint32_t tok[8 * KFX_BS];
    for (uint32_t i = 0; i < L; i++)
        h[i] = kfx_hash(k, i);
    kfx_tokens(k, 0, L, tok);
    struct kvidx_pub_stored ev = {0};
    ev.block_hashes = h;
    ev.n_hashes = L;
    ev.token_ids = tok;
    ev.n_tokens = (size_t)L * KFX_BS;
    ev.block_size = KFX_BS;
    int rc = kvidx_pub_publish_stored_ex(p, &ev, NULL);
    uint64_t r[8], seq;
    uint32_t n = 0;
    for (uint32_t i = 2; k >= 4 && i < chain_len(k - 4); i++)
        r[n++] = kfx_hash(k - 4, i);
    if (rc == 0 && n > 0)
        rc = kvidx_pub_publish_removed(p, r, n, NULL);
    return rc != 0 ? rc : kvidx_pub_flush(p, &seq);
}

/*
 * Expected key lines of worker index wi (instance wi + 1) after its first j
 * steps, sorted; `store_only` when the last step's removal is not applied yet.
 */
static struct lines model_lines(uint32_t wi, uint32_t j, bool store_only, struct lines l)
{
    char buf[128];
    for (uint32_t i = 0; i < j; i++) {
        uint32_t k = wi + 2 * i;
        /* chain k is cut by the worker's step i + 2 */
        bool cut = i + 2 < j - 1 || (i + 2 == j - 1 && !store_only);
        uint32_t n = cut ? 2 : chain_len(k);
        for (uint32_t b = 0; b < n; b++) {
            key_line(wi + 1, kfx_hash(k, b), b ? kfx_hash(k, b - 1) : 0, buf, sizeof buf);
            lines_add(&l, buf);
        }
    }
    qsort(l.v, l.n, sizeof *l.v, cmp_str);
    return l;
}

/* The expected key lines of both workers after global steps [0, K). */
static struct lines model_all(uint32_t K)
{
    return model_lines(1, K / 2, false, model_lines(0, (K + 1) / 2, false, (struct lines){0}));
}

/* Whether d's dump holds exactly the workload after K steps (keys; one namespace). */
static bool dump_is_model(const struct kfx_daemon *d, uint32_t K, const char *name, bool say)
{
    struct dset s = dump_get(d);
    struct lines got = dset_lines(&s, true), want = model_all(K);
    bool ok = lines_equal(&want, &got, "the model", name, say);
    for (size_t i = 0; ok && i < s.n; i++)
        ok = strcmp(s.v[i].ns, MODEL ":default") == 0 && s.v[i].r.tier == KVI_TIER_GPU;
    lines_free(&got);
    lines_free(&want);
    dset_free(&s);
    return ok;
}

/*
 * Each worker's blocks in `s` are exactly its state after some prefix of its
 * op stream (what a per-partition-consistent snapshot must be). @return the
 * number of steps seen per worker in steps[2].
 */
static void expect_stream_prefix(const struct dset *s, uint32_t max_steps, uint32_t steps[2])
{
    for (uint32_t wi = 0; wi < 2; wi++) {
        struct dset mine = {0};
        for (size_t i = 0; i < s->n; i++)
            if (s->v[i].r.worker_id == wi + 1)
                *dset_push(&mine) = s->v[i];
        struct lines got = dset_lines(&mine, true);
        /* the newest chain present says how many steps were applied */
        uint32_t j = 0;
        for (uint32_t i = (max_steps + 1 - wi) / 2; i-- > 0 && j == 0;) {
            char buf[128];
            key_line(wi + 1, kfx_hash(wi + 2 * i, 0), 0, buf, sizeof buf);
            char *key = buf;
            if (bsearch(&key, got.v, got.n, sizeof *got.v, cmp_str) != NULL)
                j = i + 1;
        }
        struct lines full = model_lines(wi, j, false, (struct lines){0});
        struct lines half = model_lines(wi, j, true, (struct lines){0});
        if (!lines_equal(&full, &got, "the model", "the dump", false) &&
            !lines_equal(&half, &got, "the model", "the dump", true))
            fail_msg("worker %u's blocks are not a prefix of its stream (newest step %u)", wi + 1, j);
        steps[wi] = j;
        lines_free(&full);
        lines_free(&half);
        lines_free(&got);
        dset_free(&mine);
    }
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i].r.worker_id != 1 && s->v[i].r.worker_id != 2)
            fail_msg("unexpected worker %llu", (unsigned long long)s->v[i].r.worker_id);
}

/*
 * A thread publishing the workload, one step every `pace_us`, until told to
 * stop; it never publishes step `limit` or later (it parks instead), so a
 * test can hold the stream at a known step and let it go on step by step.
 */
struct loader {
    struct kvidx_pub *pubs[2];
    pthread_t thr;
    atomic_uint next;  /* steps published */
    atomic_uint limit; /* UINT32_MAX: no limit */
    atomic_bool parked, stop, failed;
    unsigned pace_us;
};

static void *loader_main(void *arg)
{
    struct loader *l = arg;
    while (!atomic_load(&l->stop)) {
        uint32_t k = atomic_load(&l->next);
        if (k >= atomic_load(&l->limit)) {
            atomic_store(&l->parked, true);
            kfx_nap(1);
            continue;
        }
        if (step_publish(l->pubs[k % 2], k) != 0) {
            atomic_store(&l->failed, true);
            break;
        }
        atomic_store(&l->next, k + 1);
        struct timespec ts = {0, (long)l->pace_us * 1000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void loader_start(struct loader *l, struct kvidx_pub *p0, struct kvidx_pub *p1, uint32_t from, unsigned pace_us)
{
    l->pubs[0] = p0;
    l->pubs[1] = p1;
    atomic_store(&l->next, from);
    atomic_store(&l->limit, UINT32_MAX);
    atomic_store(&l->parked, false);
    atomic_store(&l->stop, false);
    atomic_store(&l->failed, false);
    l->pace_us = pace_us;
    assert_int_equal(pthread_create(&l->thr, NULL, loader_main, l), 0);
}

/* Hold the stream; @return the steps published (stable until loader_allow). */
static uint32_t loader_pause(struct loader *l)
{
    atomic_store(&l->limit, 0);
    atomic_store(&l->parked, false);
    assert_true(KFX_WAIT(atomic_load(&l->parked), KFX_WAIT_MS));
    return atomic_load(&l->next);
}

/* Let `n` more steps out (UINT32_MAX: all) and wait until a finite number went out. */
static void loader_allow(struct loader *l, uint32_t n)
{
    uint32_t from = atomic_load(&l->next);
    atomic_store(&l->limit, n == UINT32_MAX ? UINT32_MAX : from + n);
    if (n != UINT32_MAX)
        assert_true(KFX_WAIT(atomic_load(&l->next) == from + n, KFX_WAIT_MS));
}

/* Stop the thread; @return the number of steps published (the publishers are the caller's again). */
static uint32_t loader_stop(struct loader *l)
{
    atomic_store(&l->stop, true);
    pthread_join(l->thr, NULL);
    if (atomic_load(&l->failed))
        fail_msg("publishing step %u failed", atomic_load(&l->next));
    return atomic_load(&l->next);
}

#define steps_past(l, n) (atomic_load(&(l)->next) >= (n))

/* Wait until both daemons hold exactly the workload after K steps. */
static void wait_model(const struct kfx_daemon *a, const struct kfx_daemon *b, uint32_t K)
{
    if (!KFX_WAIT(dump_is_model(a, K, "A", false) && dump_is_model(b, K, "B", false), KFX_WAIT_MS)) {
        dump_is_model(a, K, "A", true);
        dump_is_model(b, K, "B", true);
        kfx_dump_log(b);
        fail_msg("the replicas did not converge on the workload after %u steps", K);
    }
}

/*
 * A TCP relay from one client to an upstream server that forwards the
 * upstream's answer only up to `limit` bytes until released: a slow reader
 * in front of a real kvidxd client.
 */
struct relay {
    int lfd, stop[2];
    uint16_t port, upstream;
    size_t limit;
    pthread_t thr;
    atomic_bool req_go; /* forward the client's bytes (the request) */
    atomic_bool release;
    atomic_ullong from_up, to_client, to_up;
    atomic_bool up_eof;
};

static void *relay_main(void *arg)
{
    struct relay *r = arg;
    struct pollfd lp[2] = {{r->lfd, POLLIN, 0}, {r->stop[0], POLLIN, 0}};
    if (poll(lp, 2, -1) <= 0 || lp[1].revents)
        return NULL;
    int c = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC);
    int u = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int small = 32 * 1024;
    setsockopt(u, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons(r->upstream)};
    if (c < 0 || connect(u, (struct sockaddr *)&a, sizeof a) != 0)
        goto out;
    static char buf[64 * 1024];
    for (;;) {
        bool may_read = atomic_load(&r->release) || atomic_load(&r->to_client) < r->limit;
        struct pollfd p[3] = {
            {c, atomic_load(&r->req_go) ? POLLIN : 0, 0}, {u, may_read ? POLLIN : 0, 0}, {r->stop[0], POLLIN, 0}};
        if (poll(p, 3, 20) < 0 || p[2].revents)
            break;
        if (p[0].revents) {
            ssize_t n = read(c, buf, sizeof buf);
            if (n <= 0 || !fp_send(u, buf, (size_t)n))
                break;
            atomic_fetch_add(&r->to_up, (unsigned long long)n);
        }
        if (may_read && p[1].revents) {
            size_t want = sizeof buf;
            if (!atomic_load(&r->release) && r->limit - atomic_load(&r->to_client) < want)
                want = r->limit - atomic_load(&r->to_client);
            ssize_t n = read(u, buf, want);
            if (n <= 0) {
                atomic_store(&r->up_eof, true);
                break;
            }
            atomic_fetch_add(&r->from_up, (unsigned long long)n);
            if (!fp_send(c, buf, (size_t)n))
                break;
            atomic_fetch_add(&r->to_client, (unsigned long long)n);
        }
    }
out:
    if (c >= 0)
        close(c);
    close(u);
    return NULL;
}

static void relay_start(struct relay *r, uint16_t upstream, size_t limit, bool hold_request)
{
    memset(r, 0, sizeof *r);
    r->upstream = upstream;
    r->limit = limit;
    atomic_store(&r->req_go, !hold_request);
    assert_int_equal(pipe2(r->stop, O_CLOEXEC), 0);
    r->lfd = loopback_socket(4, &r->port);
    assert_int_equal(pthread_create(&r->thr, NULL, relay_main, r), 0);
}

#define relay_stop(r) stop_helper((r)->thr, (r)->lfd, (r)->stop)

/*
 * Subscribers of a publisher, seen from its side: the publishers live in this
 * process, so their accepted TCP connections are our file descriptors. For
 * every connection to local port `pub_port` whose peer port is not in
 * known[0..n_known), report the peer port and the bytes the peer acked
 * (TCP_INFO). A SUB whose subscription reached the PUB is sent batches, so
 * acked bytes beyond the ZMTP handshake prove that it receives the stream,
 * even while kvidxd has not read it yet (gated listeners).
 * @return the number of such connections (at most cap).
 */
static size_t pub_conns(uint16_t pub_port, const uint16_t *known, size_t n_known, uint16_t *peer, uint64_t *acked,
                        size_t cap)
{
    size_t n = 0;
    DIR *dir = opendir("/proc/self/fd");
    assert_non_null(dir);
    for (struct dirent *e; (e = readdir(dir)) != NULL && n < cap;) {
        int fd = atoi(e->d_name);
        struct sockaddr_in la, pa;
        socklen_t ll = sizeof la, pl = sizeof pa;
        if (fd <= 2 || getsockname(fd, (struct sockaddr *)&la, &ll) != 0 || la.sin_family != AF_INET ||
            ntohs(la.sin_port) != pub_port || getpeername(fd, (struct sockaddr *)&pa, &pl) != 0)
            continue;
        bool old = false;
        for (size_t i = 0; i < n_known; i++)
            old |= known[i] == ntohs(pa.sin_port);
        struct tcp_info ti;
        socklen_t tl = sizeof ti;
        if (old || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) != 0)
            continue;
        peer[n] = ntohs(pa.sin_port);
        acked[n++] = ti.tcpi_bytes_acked;
    }
    closedir(dir);
    return n;
}

static uint16_t pub_port(struct kvidx_pub *p)
{
    const char *ep = kvidx_pub_endpoint(p);
    return (uint16_t)atoi(strrchr(ep, ':') + 1);
}

/* Whether a new subscriber (not in known) of each publisher has received more than `bytes`. */
static bool new_subscribers_fed(struct kvidx_pub *const *pubs, uint16_t (*known)[8], const size_t *n_known,
                                uint64_t bytes)
{
    for (int i = 0; i < 2; i++) {
        uint16_t peer[8];
        uint64_t acked[8];
        size_t n = pub_conns(pub_port(pubs[i]), known[i], n_known[i], peer, acked, 8);
        bool fed = false;
        for (size_t j = 0; j < n; j++)
            fed |= acked[j] > bytes;
        if (!fed)
            return false;
    }
    return true;
}

/* ---- 2. SIGKILL and restart with --peers ------------------------------------------------------ */

/*
 * Runtime registrations with replay endpoints: B recovers A's snapshot with
 * its watermarks and registers the workers again, each listener seeded with
 * the recovered W; the first live batch of each asks for a replay from W + 1,
 * not from 0. The publishers keep only the last RING batches, as
 * long-running engines do: the ring no longer reaches back to 0 but holds
 * everything since the snapshot (the stream is held while B restarts so that
 * this holds on any machine), so B converges to the exact state with no
 * overrun and nothing counted as lost.
 */
#define RING 32

static void test_sigkill_restart_registered(void **state)
{
    (void)state;
    struct kfx_daemon a, b;
    kfx_start(&a, NULL, NULL);
    kfx_start(&b, NULL, NULL);
    struct kvidx_pub *p0 = kfx_pub_ring(0, RING), *p1 = kfx_pub_ring(0, RING);
    reg(&a, 1, p0);
    reg(&a, 2, p1);
    reg(&b, 1, p0);
    reg(&b, 2, p1);
    struct loader ld;
    loader_start(&ld, p0, p1, 0, 2000);
    /* B is ingesting (the joiners replay what they missed) ... */
    assert_true(KFX_WAIT(kfx_metric(&b, "kvidx_listener_batches_total") >= 20, KFX_WAIT_MS));
    /* ... when it is killed mid-stream; events keep coming */
    kill9(&b);
    uint32_t at_kill = atomic_load(&ld.next);
    assert_true(KFX_WAIT(steps_past(&ld, at_kill + 60), KFX_WAIT_MS));
    /* B comes back while the stream is held at step P, which A has applied */
    uint32_t P = loader_pause(&ld);
    assert_true(KFX_WAIT(dump_is_model(&a, P, "A", false), KFX_WAIT_MS));
    char peers[64];
    snprintf(peers, sizeof peers, "http://127.0.0.1:%u", a.port);
    const char *args[] = {"--peers", peers, "--recovery-delay-ms", "0", NULL};
    kfx_start(&b, args, NULL);
    wait_recovery(&b, "succeeded");
    assert_true(dump_is_model(&b, P, "B", true));
    assert_int_equal(kfx_metric(&b, "kvidx_recovery_rejected_blocks"), 0);
    /* 20 steps B does not subscribe to: they survive only in the publishers' rings */
    loader_allow(&ld, 20);
    reg(&b, 1, p0);
    reg(&b, 2, p1);
    /* the first live batch of each listener asks for the replay */
    int64_t end = kfx_now_ms() + KFX_WAIT_MS;
    while (!KFX_WAIT(kfx_metric(&b, "kvidx_listener_replays_total") >= 2, 100)) {
        if (kfx_now_ms() > end)
            fail_msg("B never asked for a replay");
        loader_allow(&ld, 1);
    }
    uint32_t at_replay = atomic_load(&ld.next);
    loader_allow(&ld, UINT32_MAX);
    assert_true(KFX_WAIT(steps_past(&ld, at_replay + 40), KFX_WAIT_MS));
    uint32_t K = loader_stop(&ld);
    wait_model(&a, &b, K);
    assert_true(dumps_equal(&a, &b, true));
    /* the replays started at the recovered watermarks (the rings no longer reach back to seq 0):
     * exactly the 20 unseen steps were replayed, no overrun, nothing counted as lost */
    assert_true(kfx_metric(&b, "kvidx_listener_replayed_total") >= 20);
    assert_int_equal(kfx_metric(&b, "kvidx_listener_replay_overruns_total"), 0);
    assert_int_equal(kfx_metric(&b, "kvidx_listener_lost_total"), 0);
    assert_int_equal(kfx_metric(&b, "kvidx_listener_replay_fallbacks_total"), 0);

    /* and B keeps ingesting live */
    for (uint32_t k = K; k < K + 8; k++)
        assert_int_equal(step_publish(k % 2 ? p1 : p0, k), 0);
    wait_model(&a, &b, K + 8);
    assert_true(dumps_equal(&a, &b, true));
    kvidx_pub_destroy(p0);
    kvidx_pub_destroy(p1);
    assert_int_equal(kfx_stop(&b, SIGTERM, NULL), 0);
    assert_int_equal(kfx_stop(&a, SIGTERM, NULL), 0);
}

/*
 * --workers (no replay endpoint): B's listeners connect at startup and buffer
 * behind the gate while it recovers, so A's snapshot and the buffered stream
 * overlap; the recovered watermarks seed the gated listeners, so the
 * buffered batches the snapshot covers are skipped as stale and the next
 * one applies: no gap is counted. Nothing can replay what falls between the
 * two when the SUBs join after the snapshot (that loss would now be counted
 * as a gap), so the test makes the overlap certain instead of hoping the
 * recovery delay covers the slow joiner: a relay holds B's /dump request until B's SUBs are fed (seen from
 * the publishers' side) and A has applied every step, then holds A's answer
 * while 40 more steps go out, removals included (applied before the older
 * snapshot, they would be undone by it for good; the gate orders them after).
 */
static void test_sigkill_restart_workers(void **state)
{
    (void)state;
    struct kvidx_pub *p0 = kfx_pub(0), *p1 = kfx_pub(0), *pubs[2] = {p0, p1};
    char workers[256];
    snprintf(workers, sizeof workers, "1=%s,2=%s", kvidx_pub_endpoint(p0), kvidx_pub_endpoint(p1));
    const char *wargs[] = {"--workers", workers, "--block-size", "4", "--model-name", MODEL, NULL};
    struct kfx_daemon a, b;
    kfx_start(&a, wargs, NULL);
    kfx_start(&b, wargs, NULL);
    struct kfx_daemon *both[2] = {&a, &b};
    until_joined(both, 2, pubs, 2, 2);
    struct loader ld;
    loader_start(&ld, p0, p1, 0, 2000);
    assert_true(KFX_WAIT(kfx_metric(&b, "kvidx_listener_batches_total") >= 20, KFX_WAIT_MS));
    kill9(&b);
    uint32_t at_kill = atomic_load(&ld.next);
    assert_true(KFX_WAIT(steps_past(&ld, at_kill + 40), KFX_WAIT_MS));

    /* A's subscriptions, to tell B's new ones apart (the dead B's are gone once A's alone remain) */
    uint32_t P = loader_pause(&ld);
    uint16_t known[2][8];
    size_t n_known[2];
    for (int i = 0; i < 2; i++) {
        uint64_t acked[8];
        assert_true(KFX_WAIT((n_known[i] = pub_conns(pub_port(pubs[i]), NULL, 0, known[i], acked, 8)) == 1,
                             KFX_WAIT_MS));
    }
    struct relay r;
    relay_start(&r, a.port, 0, true);
    char peers[64];
    snprintf(peers, sizeof peers, "http://127.0.0.1:%u", r.port);
    const char *args[] = {"--workers", workers, "--block-size", "4", "--model-name", MODEL, "--peers", peers,
                          "--recovery-delay-ms", "0", "--recovery-timeout-ms", "60000", NULL};
    kfx_start(&b, args, NULL);
    /* step by step until B's gated SUBs are being sent batches (beyond the ZMTP handshake) */
    int64_t end = kfx_now_ms() + KFX_WAIT_MS;
    while (!KFX_WAIT(new_subscribers_fed(pubs, known, n_known, 200), 50)) {
        if (kfx_now_ms() > end)
            fail_msg("B's SUB sockets were never fed");
        loader_allow(&ld, 2);
    }
    uint32_t at_fed = loader_pause(&ld);
    assert_true(KFX_WAIT(dump_is_model(&a, at_fed, "A", false), KFX_WAIT_MS));
    assert_true(status_has(&b, "\"listeners\":{\"pending\":2,\"active\":0,"));
    /* now A's snapshot holds every step B's buffers lack */
    atomic_store(&r.req_go, true);
    assert_true(KFX_WAIT(atomic_load(&r.to_up) > 0, KFX_WAIT_MS));
    loader_allow(&ld, UINT32_MAX);
    uint32_t at_fetch = atomic_load(&ld.next);
    assert_true(KFX_WAIT(steps_past(&ld, at_fetch + 40), KFX_WAIT_MS));
    assert_true(status_has(&b, "\"recovery\":{\"enabled\":true,\"in_progress\":true}"));
    atomic_store(&r.release, true);
    wait_recovery(&b, "succeeded");
    relay_stop(&r);
    assert_true(kfx_metric(&b, "kvidx_recovery_blocks") > 0);
    uint32_t at_recovery = atomic_load(&ld.next);
    assert_true(KFX_WAIT(steps_past(&ld, at_recovery + 40), KFX_WAIT_MS));
    uint32_t K = loader_stop(&ld);
    wait_model(&a, &b, K);
    assert_true(dumps_equal(&a, &b, true));
    print_message("--workers restart: held at %u, fed at %u, fetched at %u, recovered at %u, converged at %u\n", P,
                  at_fed, at_fetch, at_recovery, K);
    /* seeded with the recovered watermarks: the overlap is skipped as stale, no gap, nothing lost */
    print_message("--workers restart: %lld stale batch(es) skipped\n",
                  (long long)kfx_metric(&b, "kvidx_listener_stale_total"));
    assert_int_equal(kfx_metric(&b, "kvidx_listener_gaps_total"), 0);
    assert_int_equal(kfx_metric(&b, "kvidx_listener_lost_total"), 0);
    assert_int_equal(kfx_metric(&b, "kvidx_listener_replays_total"), 0);
    assert_true(kfx_metric(&b, "kvidx_listener_stale_total") > 0);

    for (uint32_t k = K; k < K + 8; k++)
        assert_int_equal(step_publish(k % 2 ? p1 : p0, k), 0);
    wait_model(&a, &b, K + 8);
    assert_true(dumps_equal(&a, &b, true));
    kvidx_pub_destroy(p0);
    kvidx_pub_destroy(p1);
    assert_int_equal(kfx_stop(&b, SIGTERM, NULL), 0);
    assert_int_equal(kfx_stop(&a, SIGTERM, NULL), 0);
}

/* ---- 3. SIGTERM ------------------------------------------------------------------------------ */

struct querier {
    const struct kfx_daemon *d;
    int proto;
    pthread_t thr;
    atomic_bool stop;
    atomic_llong t_term; /* ms when SIGTERM was sent; 0 before */
    atomic_long ok;      /* the main thread waits for it before SIGTERM */
    long failed_before_term, bad_status, bad_body, last_bad;
};

static void *querier_main(void *arg)
{
    struct querier *qr = arg;
    char *q = kfx_query_json(MODEL, 1, 4);
    const char *h[] = {"Content-Type: application/json", NULL};
    while (!atomic_load(&qr->stop)) {
        struct kfx_resp r;
        long s = kfx_http(qr->d, qr->proto, "POST", "/query", h, q, strlen(q), &r);
        int64_t end = kfx_now_ms();
        long long term = atomic_load(&qr->t_term);
        if (s == 200) {
            if (strncmp(r.body, "{\"scores\":{", 11) != 0)
                qr->bad_body++;
            atomic_fetch_add(&qr->ok, 1);
        } else if (s != 0) {
            qr->bad_status++;
            qr->last_bad = s;
        } else if (term == 0 || end < term) {
            qr->failed_before_term++;
        } else {
            kfx_resp_free(&r);
            break; /* the daemon is going away */
        }
        kfx_resp_free(&r);
    }
    free(q);
    return NULL;
}

/*
 * With the workload and queries (HTTP/1.1 and h2c) in flight, B recovers
 * from A, then A gets SIGTERM: it exits 0 within 2 s, every query answered
 * meanwhile was a 200 with a score map, and B's recovered dump parses, every
 * parent exists, nothing was rejected, and each worker's blocks are exactly
 * its state after a prefix of its stream.
 */
static void test_sigterm_under_load(void **state)
{
    (void)state;
    struct kfx_daemon a, b;
    kfx_start(&a, NULL, NULL);
    struct kvidx_pub *p0 = kfx_pub(0), *p1 = kfx_pub(0);
    reg(&a, 1, p0);
    reg(&a, 2, p1);
    struct loader ld;
    loader_start(&ld, p0, p1, 0, 1000);
    struct querier qs[2];
    for (int i = 0; i < 2; i++) {
        memset(&qs[i], 0, sizeof qs[i]);
        qs[i].d = &a;
        qs[i].proto = i == 0 ? KFX_H1 : KFX_H2C;
        assert_int_equal(pthread_create(&qs[i].thr, NULL, querier_main, &qs[i]), 0);
    }
    assert_true(KFX_WAIT(kfx_metric(&a, "kvidx_listener_batches_total") >= 40, KFX_WAIT_MS));
    char peers[64];
    snprintf(peers, sizeof peers, "http://127.0.0.1:%u", a.port);
    const char *args[] = {"--peers", peers, "--recovery-delay-ms", "0", NULL};
    kfx_start(&b, args, NULL);
    wait_recovery(&b, "succeeded");
    /* still under load, and each querier has had an answer: its progress is
     * part of the test, not the scheduler's luck */
    for (int i = 0; i < 2; i++)
        if (!KFX_WAIT(atomic_load(&qs[i].ok) > 0, KFX_WAIT_MS))
            fail_msg("queries (%s): no answer in %d ms", i ? "h2c" : "HTTP/1.1", KFX_WAIT_MS);
    for (int i = 0; i < 2; i++)
        atomic_store(&qs[i].t_term, kfx_now_ms());
    int64_t ms = 0;
    char *log = NULL;
    int rc = term_keep_log(&a, &ms, &log);
    for (int i = 0; i < 2; i++) {
        atomic_store(&qs[i].stop, true);
        pthread_join(qs[i].thr, NULL);
    }
    uint32_t K = loader_stop(&ld);
    expect_quick_exit(rc, ms, log, "under ingestion and queries");
    free(log);
    print_message("%ld + %ld queries answered, %u steps published\n", atomic_load(&qs[0].ok),
                  atomic_load(&qs[1].ok), K);
    for (int i = 0; i < 2; i++) {
        if (atomic_load(&qs[i].ok) == 0 || qs[i].failed_before_term || qs[i].bad_status || qs[i].bad_body)
            fail_msg("queries (%s): %ld ok, %ld failed before SIGTERM, %ld bad status (last %ld), %ld bad bodies",
                     i ? "h2c" : "HTTP/1.1", atomic_load(&qs[i].ok), qs[i].failed_before_term, qs[i].bad_status,
                     qs[i].last_bad, qs[i].bad_body);
    }

    struct dset s = dump_get(&b);
    expect_parents_exist(&s);
    uint32_t steps[2];
    expect_stream_prefix(&s, K, steps);
    assert_true(steps[0] >= 20 && steps[1] >= 20);
    assert_int_equal((long long)s.n, kfx_metric(&b, "kvidx_recovery_blocks"));
    assert_int_equal(kfx_metric(&b, "kvidx_recovery_rejected_blocks"), 0);
    dset_free(&s);
    kvidx_pub_destroy(p0);
    kvidx_pub_destroy(p1);
    assert_int_equal(kfx_stop(&b, SIGTERM, NULL), 0);
}

/*
 * A holds a large index; B recovers from A through a relay that stops
 * reading after 256 KiB (B has applied part of the dump). SIGTERM to A: it
 * exits 0 within 2 s although the /dump stream is stalled, the stream is cut
 * before its end, and B rolls back what it applied and recovers from C.
 */
static void test_sigterm_slow_dump_reader(void **state)
{
    (void)state;
    struct kfx_daemon a, b, c;
    kfx_start(&a, NULL, NULL);
    kfx_start(&c, NULL, NULL);
    struct kvidx_pub *pa = kfx_pub(0), *pc = kfx_pub(0);
    reg(&a, 1, pa);
    reg(&c, 5, pc);
    /* 40,960 blocks on A (about 10 MB of dump), 2 chains on C */
    enum { CHAINS = 160, LEN = 256 };
    for (uint32_t ch = 0; ch < CHAINS; ch++)
        kfx_publish(pa, 10 + ch, 0, LEN, NULL);
    char *qa = kfx_query_json(MODEL, 10 + CHAINS - 1, 8);
    kfx_until_query(&a, "/query", qa, "\"scores\":{\"1\":{\"0\":32}}", &pa, 1);
    assert_true(KFX_WAIT(kfx_metric(&a, "kvidx_listener_blocks_stored_total") == CHAINS * LEN, KFX_WAIT_MS));
    kfx_publish(pc, 1, 0, 3, NULL);
    kfx_publish(pc, 2, 0, 2, NULL);
    char *qc = kfx_query_json(MODEL, 2, 2);
    kfx_until_query(&c, "/query", qc, "\"scores\":{\"5\":{\"0\":8}}", &pc, 1);
    struct dset full = dump_get(&a);
    assert_int_equal(full.n, CHAINS * LEN);
    size_t full_len = full.body_len;
    dset_free(&full);

    struct relay r;
    relay_start(&r, a.port, 256 * 1024, false);
    char peers[128];
    snprintf(peers, sizeof peers, "http://127.0.0.1:%u,http://127.0.0.1:%u", r.port, c.port);
    const char *args[] = {"--peers", peers, "--recovery-delay-ms", "0", "--recovery-timeout-ms", "30000", NULL};
    kfx_start(&b, args, NULL);
    assert_true(KFX_WAIT(atomic_load(&r.to_client) >= 256 * 1024, KFX_WAIT_MS));
    assert_true(status_has(&b, "\"recovery\":{\"enabled\":true,\"in_progress\":true}"));
    int64_t ms = 0;
    char *log = NULL;
    int rc = term_keep_log(&a, &ms, &log);
    expect_quick_exit(rc, ms, log, "with a stalled /dump");
    if (strstr(log, "/dump cut short") == NULL)
        fail_msg("A's log does not say the dump was cut:\n%s", log);
    free(log);
    /* hand B the rest of what A managed to send, then the end of the connection */
    atomic_store(&r.release, true);
    assert_true(KFX_WAIT(atomic_load(&r.up_eof), KFX_WAIT_MS));
    if (atomic_load(&r.from_up) >= full_len)
        fail_msg("the dump was not cut: %llu of %zu bytes", (unsigned long long)atomic_load(&r.from_up), full_len);
    print_message("the dump was cut after %llu of %zu bytes\n", (unsigned long long)atomic_load(&r.from_up), full_len);
    wait_recovery(&b, "succeeded");
    expect_peer_failed(&b, r.port, NULL);
    assert_int_equal(kfx_metric(&b, "kvidx_recovery_attempts_total"), 2);
    assert_int_equal(kfx_metric(&b, "kvidx_recovery_blocks"), 5);
    /* exactly C's state: nothing of A's partial dump */
    assert_true(dumps_equal(&c, &b, true));
    kfx_expect(&b, "/query", qa, 200, "{\"scores\":{},\"frequencies\":[],\"tree_sizes\":{},\"instances\":{}}");
    relay_stop(&r);
    free(qa);
    free(qc);
    kvidx_pub_destroy(pa);
    kvidx_pub_destroy(pc);
    assert_int_equal(kfx_stop(&b, SIGTERM, NULL), 0);
    assert_int_equal(kfx_stop(&c, SIGTERM, NULL), 0);
}

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_failing_peers_fall_through, teardown),
        cmocka_unit_test_teardown(test_peer_still_recovering, teardown),
        cmocka_unit_test_teardown(test_only_bad_peers_start_empty, teardown),
        cmocka_unit_test_teardown(test_sigterm_during_peer_fetch, teardown),
        cmocka_unit_test_teardown(test_sigkill_restart_registered, teardown),
        cmocka_unit_test_teardown(test_sigkill_restart_workers, teardown),
        cmocka_unit_test_teardown(test_sigterm_under_load, teardown),
        cmocka_unit_test_teardown(test_sigterm_slow_dump_reader, teardown),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
