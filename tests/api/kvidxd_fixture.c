/*
 * Definitions of kvidxd_fixture.h (where the contracts are): built once into
 * kvi_test_api (tests/CMakeLists.txt) and linked into the api tests.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvidxd_fixture.h"

/* Daemons still running (a test failed before stopping them), with their files. */
static struct {
    pid_t pid;
    char portfile[128];
    char logfile[128];
} kfx_live[KFX_MAX_DAEMONS];
static bool kfx_atexit_set;

void kfx_dump_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    char line[2048];
    fprintf(stderr, "---- %s ----\n", path);
    while (fgets(line, sizeof line, f))
        fputs(line, stderr);
    fclose(f);
}

void kfx_kill_leftovers(void)
{
    for (int i = 0; i < KFX_MAX_DAEMONS; i++) {
        if (kfx_live[i].pid > 0) {
            kill(kfx_live[i].pid, SIGKILL);
            waitpid(kfx_live[i].pid, NULL, 0);
            kfx_live[i].pid = 0;
            kfx_dump_file(kfx_live[i].logfile);
            unlink(kfx_live[i].portfile);
            unlink(kfx_live[i].logfile);
        }
    }
}

void kfx_track(pid_t pid, const char *portfile, const char *logfile)
{
    for (int i = 0; i < KFX_MAX_DAEMONS; i++) {
        if (portfile != NULL && kfx_live[i].pid == 0) {
            kfx_live[i].pid = pid;
            snprintf(kfx_live[i].portfile, sizeof kfx_live[i].portfile, "%s", portfile);
            snprintf(kfx_live[i].logfile, sizeof kfx_live[i].logfile, "%s", logfile);
            return;
        }
        if (portfile == NULL && kfx_live[i].pid == pid) {
            kfx_live[i].pid = 0;
            return;
        }
    }
}

const char *kfx_binary(void)
{
    static char path[PATH_MAX + 32];
    const char *env = getenv("KVIDXD");
    if (env != NULL)
        return env;
#ifdef KVIDXD_PATH
    if (access(KVIDXD_PATH, X_OK) == 0)
        return KVIDXD_PATH;
#endif
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return "kvidxd";
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = '\0';
    snprintf(path, sizeof path, "%s/../api/kvidxd", self);
    return path;
}

int kfx_start_rc(struct kfx_daemon *d, const char *const *args, const char *const *env)
{
    static unsigned seq;
    memset(d, 0, sizeof *d);
    snprintf(d->portfile, sizeof d->portfile, "/tmp/kvidxd-test-%d-%u.port", (int)getpid(), seq);
    snprintf(d->logfile, sizeof d->logfile, "/tmp/kvidxd-test-%d-%u.log", (int)getpid(), seq++);
    unlink(d->portfile);
    if (!kfx_atexit_set) {
        atexit(kfx_kill_leftovers);
        kfx_atexit_set = true;
    }
    const char *argv[64];
    int n = 0;
    argv[n++] = kfx_binary();
    argv[n++] = "--port";
    argv[n++] = "0";
    argv[n++] = "--port-file";
    argv[n++] = d->portfile;
    argv[n++] = "--http-threads";
    argv[n++] = "2";
    argv[n++] = "--threads";
    argv[n++] = "2";
    for (int i = 0; args != NULL && args[i] != NULL && n < 62; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = open(d->logfile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        for (int i = 0; env != NULL && env[i] != NULL; i++)
            putenv((char *)env[i]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    if (pid < 0)
        return -1;
    d->pid = pid;
    kfx_track(pid, d->portfile, d->logfile);
    int64_t end = kfx_now_ms() + KFX_WAIT_MS;
    while (kfx_now_ms() < end) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            kfx_track(pid, NULL, NULL);
            d->pid = 0;
            unlink(d->portfile);
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        }
        FILE *f = fopen(d->portfile, "r");
        if (f != NULL) {
            unsigned p = 0;
            if (fscanf(f, "%u", &p) == 1 && p > 0)
                d->port = (uint16_t)p;
            fclose(f);
            if (d->port)
                return 0;
        }
        kfx_nap(5);
    }
    return -1;
}

void kfx_start(struct kfx_daemon *d, const char *const *args, const char *const *env)
{
    int rc = kfx_start_rc(d, args, env);
    if (rc != 0) {
        kfx_dump_log(d);
        if (d->pid == 0) /* it exited: nothing else will remove its log */
            unlink(d->logfile);
        fail_msg("kvidxd did not start (%d)", rc);
    }
}

int kfx_start_nofile(struct kfx_daemon *d, const char *const *args, unsigned nofile)
{
    char wrapper[128];
    snprintf(wrapper, sizeof wrapper, "/tmp/kvidxd-nofile-%d.sh", (int)getpid());
    FILE *f = fopen(wrapper, "w");
    if (f == NULL)
        fail_msg("cannot write %s", wrapper);
    fprintf(f, "#!/bin/sh\nulimit -n %u || exit 97\nexec '%s' \"$@\"\n", nofile, kfx_binary());
    fclose(f);
    if (chmod(wrapper, 0755) != 0)
        fail_msg("chmod %s", wrapper);
    const char *saved = getenv("KVIDXD");
    char *keep = saved ? strdup(saved) : NULL;
    setenv("KVIDXD", wrapper, 1);
    int rc = kfx_start_rc(d, args, NULL);
    if (keep != NULL)
        setenv("KVIDXD", keep, 1);
    else
        unsetenv("KVIDXD");
    free(keep);
    unlink(wrapper);
    return rc;
}

bool kfx_log_has(const struct kfx_daemon *d, const char *a, const char *b, int ms)
{
    int64_t end = kfx_now_ms() + ms;
    do {
        FILE *f = fopen(d->logfile, "r");
        char line[4096];
        bool found = false;
        while (f != NULL && !found && fgets(line, sizeof line, f) != NULL)
            found = strstr(line, a) != NULL && (b == NULL || strstr(line, b) != NULL);
        if (f != NULL)
            fclose(f);
        if (found)
            return true;
        kfx_nap(20);
    } while (kfx_now_ms() < end);
    return false;
}

void kfx_start_slots(struct kfx_daemon *d, struct kfx_daemon *sv, const char *const *extra,
                     const char *const *env)
{
    static unsigned seq;
    char pf[128];
    snprintf(pf, sizeof pf, "/tmp/kvidxd-slots-%d-%u.port", (int)getpid(), seq++);
    unlink(pf);
    const char *args[32] = {"--slot-port", "auto", "--slot-port-file", pf};
    int n = 4;
    for (int i = 0; extra != NULL && extra[i] != NULL; i++) {
        if (n == 31)
            fail_msg("kfx_start_slots: too many arguments");
        args[n++] = extra[i];
    }
    args[n] = NULL;
    kfx_start(d, args, env);
    FILE *f = fopen(pf, "r");
    unsigned p = 0;
    if (f == NULL || fscanf(f, "%u", &p) != 1 || p == 0)
        fail_msg("no slot port file %s", pf);
    fclose(f);
    unlink(pf);
    *sv = *d;
    sv->port = (uint16_t)p;
}

int kfx_stop(struct kfx_daemon *d, int sig, int64_t *ms)
{
    if (d->pid <= 0)
        return -1;
    int64_t t0 = kfx_now_ms();
    kill(d->pid, sig);
    int st = 0, rc = -1;
    while (kfx_now_ms() - t0 < KFX_WAIT_MS) {
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            break;
        }
        kfx_nap(2);
    }
    if (ms)
        *ms = kfx_now_ms() - t0;
    if (rc == -1) {
        kill(d->pid, SIGKILL);
        waitpid(d->pid, NULL, 0);
    }
    kfx_track(d->pid, NULL, NULL);
    d->pid = 0;
    if (getenv("KVI_TEST_VERBOSE") || rc != 0)
        kfx_dump_log(d);
    unlink(d->portfile);
    unlink(d->logfile);
    return rc;
}

size_t kfx_on_body(char *p, size_t sz, size_t nm, void *ud)
{
    struct kfx_resp *r = ud;
    size_t n = sz * nm;
    r->body = realloc(r->body, r->len + n + 1);
    memcpy(r->body + r->len, p, n);
    r->len += n;
    r->body[r->len] = '\0';
    return n;
}

long kfx_http(const struct kfx_daemon *d, int proto, const char *method, const char *path,
              const char *const *hdrs, const void *body, size_t len, struct kfx_resp *r)
{
    memset(r, 0, sizeof *r);
    r->body = calloc(1, 1);
    CURL *h = curl_easy_init();
    char url[512];
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", d->port, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 20000L);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION,
                     proto == KFX_H2C ? (long)CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE : (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (body != NULL || strcmp(method, "POST") == 0) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    /* no `Expect: 100-continue` unless the caller asks for it (a body over the
     * limit is then answered 413 before curl sends it) */
    bool expect = false;
    for (int i = 0; hdrs != NULL && hdrs[i] != NULL; i++)
        expect |= strncasecmp(hdrs[i], "Expect:", 7) == 0;
    struct curl_slist *sl = expect ? NULL : curl_slist_append(NULL, "Expect:");
    for (int i = 0; hdrs != NULL && hdrs[i] != NULL; i++)
        sl = curl_slist_append(sl, hdrs[i]);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, sl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, kfx_on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    if (curl_easy_perform(h) == CURLE_OK) {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
        curl_easy_getinfo(h, CURLINFO_HTTP_VERSION, &r->version);
        char *ct = NULL;
        curl_easy_getinfo(h, CURLINFO_CONTENT_TYPE, &ct);
        snprintf(r->ctype, sizeof r->ctype, "%s", ct ? ct : "");
    }
    curl_slist_free_all(sl);
    curl_easy_cleanup(h);
    return r->status;
}

void kfx_expect(const struct kfx_daemon *d, const char *path, const char *json, long status, const char *body)
{
    struct kfx_resp r;
    long s = kfx_post_json(d, path, json, &r);
    if (s != status || (body != NULL && strcmp(r.body, body) != 0))
        fail_msg("POST %s %s: got %ld %s, want %ld %s", path, json, s, r.body, status, body ? body : "(any)");
    kfx_resp_free(&r);
}

void kfx_expect_get(const struct kfx_daemon *d, const char *path, long status, const char *body)
{
    struct kfx_resp r;
    long s = kfx_get(d, path, &r);
    if (s != status || (body != NULL && strcmp(r.body, body) != 0))
        fail_msg("GET %s: got %ld %s, want %ld %s", path, s, r.body, status, body ? body : "(any)");
    kfx_resp_free(&r);
}

long long kfx_metric(const struct kfx_daemon *d, const char *name)
{
    struct kfx_resp r;
    long long v = -1;
    char needle[256];
    snprintf(needle, sizeof needle, "\n%s ", name);
    if (kfx_get(d, "/metrics", &r) == 200) {
        const char *p = strstr(r.body, needle);
        if (p != NULL)
            v = strtoll(p + strlen(needle), NULL, 10);
    }
    kfx_resp_free(&r);
    return v;
}

struct kvidx_pub *kfx_pub_ring(int32_t rank, uint32_t ring)
{
    struct kvidx_pub_config pc;
    kvidx_pub_config_init(&pc);
    pc.endpoint = "tcp://127.0.0.1:*";
    pc.replay_endpoint = "tcp://127.0.0.1:*";
    pc.dp_rank = rank;
    if (ring != 0)
        pc.buffer_batches = ring;
    struct kvidx_pub *p = kvidx_pub_create(&pc);
    assert_non_null(p);
    return p;
}

void kfx_publish(struct kvidx_pub *p, uint32_t c, uint32_t from, uint32_t to, const char *medium)
{
    uint32_t n = to - from;
    uint64_t *h = calloc(n, sizeof *h);
    uint32_t *tok = calloc((size_t)n * KFX_BS, sizeof *tok);
    for (uint32_t i = 0; i < n; i++)
        h[i] = kfx_hash(c, from + i);
    kfx_tokens(c, from, n, tok);
    uint64_t parent = from > 0 ? kfx_hash(c, from - 1) : 0;
    struct kvidx_pub_stored ev = {0};
    ev.block_hashes = h;
    ev.n_hashes = n;
    ev.parent_hash = from > 0 ? &parent : NULL;
    ev.token_ids = tok;
    ev.n_tokens = (size_t)n * KFX_BS;
    ev.block_size = KFX_BS;
    ev.medium = medium;
    assert_int_equal(kvidx_pub_publish_stored_ex(p, &ev, NULL), 0);
    uint64_t seq;
    assert_int_equal(kvidx_pub_flush(p, &seq), 0);
    free(h);
    free(tok);
}

void kfx_unpublish(struct kvidx_pub *p, uint32_t c, uint32_t from, uint32_t to)
{
    uint64_t h[256];
    for (uint32_t i = from; i < to; i++)
        h[i - from] = kfx_hash(c, i);
    assert_int_equal(kvidx_pub_publish_removed(p, h, to - from, NULL), 0);
    uint64_t seq;
    assert_int_equal(kvidx_pub_flush(p, &seq), 0);
}

char *kfx_query_json(const char *model, uint32_t c, uint32_t n)
{
    size_t cap = 256 + (size_t)n * KFX_BS * 12;
    char *s = malloc(cap);
    size_t o = (size_t)snprintf(s, cap, "{\"model_name\":\"%s\",\"token_ids\":[", model);
    uint32_t tok[KFX_BS];
    for (uint32_t i = 0; i < n; i++) {
        kfx_tokens(c, i, 1, tok);
        for (int k = 0; k < KFX_BS; k++)
            o += (size_t)snprintf(s + o, cap - o, "%s%u", i || k ? "," : "", tok[k]);
    }
    snprintf(s + o, cap - o, "]}");
    return s;
}

void kfx_until_query(const struct kfx_daemon *d, const char *path, const char *json, const char *needle,
                     struct kvidx_pub *const *pubs, size_t n_pubs)
{
    int64_t end = kfx_now_ms() + KFX_WAIT_MS, next_nudge = kfx_now_ms() + 100;
    struct kfx_resp r = {0};
    while (kfx_now_ms() < end) {
        kfx_resp_free(&r);
        if (kfx_post_json(d, path, json, &r) == 200 && strstr(r.body, needle) != NULL) {
            kfx_resp_free(&r);
            return;
        }
        if (kfx_now_ms() >= next_nudge) {
            for (size_t i = 0; i < n_pubs; i++) {
                uint64_t seq;
                kvidx_pub_flush_empty(pubs[i], &seq);
            }
            next_nudge = kfx_now_ms() + 100;
        }
        kfx_nap(5);
    }
    fail_msg("POST %s never answered with %s; last answer %ld %s", path, needle, r.status, r.body);
}
