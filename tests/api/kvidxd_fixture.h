/*
 * Shared fixture of the kvidxd integration tests (tests/api/kvidxd_*_test.c):
 * start the real kvidxd binary on an ephemeral port, drive it with libcurl
 * (HTTP/1.1 or h2c prior knowledge), publish KV events with the C publisher
 * library, and stop it with a signal.
 *
 * The binary: KVIDXD_PATH (set by api/CMakeLists.txt), the KVIDXD environment
 * variable, or ../api/kvidxd next to this test program.
 *
 * Waiting: every wait polls a condition every few milliseconds up to a
 * deadline and fails the test when it does not hold by then; nothing sleeps a
 * fixed time and assumes something happened. Slow joiner: publishers have a
 * replay ROUTER, so once any batch reaches kvidxd the gap rule replays the
 * ones it missed; kfx_until_query nudges with empty batches until then.
 *
 * Cleanup: every daemon started is recorded; kfx_stop_all (call it from the
 * test's teardown) and an atexit handler kill what is left, and the child
 * gets PR_SET_PDEATHSIG so it never outlives the test.
 *
 * Declared here with their contracts, defined in kvidxd_fixture.c (built
 * once into kvi_test_api, tests/CMakeLists.txt); small helpers and the
 * macros stay here. Functions that fail the test use cmocka: call them from
 * the test's main thread only.
 */
#ifndef KVI_TESTS_API_KVIDXD_FIXTURE_H
#define KVI_TESTS_API_KVIDXD_FIXTURE_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <kvidx/publisher.h>

#include "engine/hash.h"

#define KFX_WAIT_MS 20000
#define KFX_MAX_DAEMONS 8

static inline int64_t kfx_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static inline void kfx_nap(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Poll `cond` every 2 ms for up to `ms`; evaluates to whether it held. */
#define KFX_WAIT(cond, ms)                                                     \
    ({                                                                         \
        int64_t kw_end_ = kfx_now_ms() + (ms);                                 \
        bool kw_ok_;                                                           \
        while (!(kw_ok_ = (cond)) && kfx_now_ms() < kw_end_)                   \
            kfx_nap(2);                                                        \
        kw_ok_;                                                                \
    })

/* ---- the daemon ---------------------------------------------------------------------- */

struct kfx_daemon {
    pid_t pid;
    uint16_t port;
    char portfile[128];
    char logfile[128];
};

/* Copy the file at @p path to stderr, framed (nothing when it cannot be opened). */
void kfx_dump_file(const char *path);

/* Kill what a failed test left running, print its log, remove its files. */
void kfx_kill_leftovers(void);

/* Record a started daemon (@p portfile not NULL) or forget the one with @p pid (portfile NULL) for
 * kfx_kill_leftovers. */
void kfx_track(pid_t pid, const char *portfile, const char *logfile);

/* The kvidxd to start: $KVIDXD, KVIDXD_PATH, or ../api/kvidxd next to this program. */
const char *kfx_binary(void);

/* Print the daemon's log (on failures, or always with KVI_TEST_VERBOSE). */
static inline void kfx_dump_log(const struct kfx_daemon *d)
{
    kfx_dump_file(d->logfile);
}

/*
 * Start kvidxd with `args` (NULL-terminated; --port 0 and --port-file are
 * added) and the extra environment `env` ("K=V" strings, NULL-terminated).
 * @return 0 when /health answered 200, else the exit status (or -1).
 */
int kfx_start_rc(struct kfx_daemon *d, const char *const *args, const char *const *env);

/* kfx_start_rc, failing the test (with the daemon's log) unless it started. */
void kfx_start(struct kfx_daemon *d, const char *const *args, const char *const *env);

/*
 * Start kvidxd under `ulimit -n @p nofile` (soft and hard: kvidxd cannot
 * raise it), through a shell wrapper. @return as kfx_start_rc.
 */
int kfx_start_nofile(struct kfx_daemon *d, const char *const *args, unsigned nofile);

/* Whether the daemon's log has a line containing @p a and @p b (NULL: any), polled for up to @p ms. */
bool kfx_log_has(const struct kfx_daemon *d, const char *a, const char *b, int ms);

/*
 * Start kvidxd with an ephemeral slot-tracker port (--slot-port auto) plus
 * @p extra args (NULL-terminated, may be NULL); *sv becomes a copy of *d that
 * talks to the slot port (stop the daemon through d).
 */
void kfx_start_slots(struct kfx_daemon *d, struct kfx_daemon *sv, const char *const *extra,
                     const char *const *env);

/*
 * Send `sig` and wait for the exit. @param ms  receives how long it took.
 * @return the exit status, 128 + signal when killed by one, -1 on timeout
 *         (the process is then killed).
 */
int kfx_stop(struct kfx_daemon *d, int sig, int64_t *ms);

/* ---- HTTP ------------------------------------------------------------------------------ */

enum { KFX_H1 = 0, KFX_H2C = 1 };

struct kfx_resp {
    long status;
    char *body; /* NUL-terminated */
    size_t len;
    char ctype[128];
    long version; /* CURL_HTTP_VERSION_* of the answer */
};

/* libcurl write callback: append to the struct kfx_resp in @p ud (kept NUL-terminated). */
size_t kfx_on_body(char *p, size_t sz, size_t nm, void *ud);

static inline void kfx_resp_free(struct kfx_resp *r)
{
    free(r->body);
    memset(r, 0, sizeof *r);
}

/*
 * One request on a fresh connection (Debian's libcurl 7.88 cannot reuse a
 * prior-knowledge h2c connection). Headers: `hdrs` NULL-terminated.
 * @return the status (0 on a transport error).
 */
long kfx_http(const struct kfx_daemon *d, int proto, const char *method, const char *path,
              const char *const *hdrs, const void *body, size_t len, struct kfx_resp *r);

static inline long kfx_get(const struct kfx_daemon *d, const char *path, struct kfx_resp *r)
{
    return kfx_http(d, KFX_H1, "GET", path, NULL, NULL, 0, r);
}

static inline long kfx_post_json(const struct kfx_daemon *d, const char *path, const char *json, struct kfx_resp *r)
{
    const char *h[] = {"Content-Type: application/json", NULL};
    return kfx_http(d, KFX_H1, "POST", path, h, json, strlen(json), r);
}

/* POST and expect `status` and, when `body` is not NULL, exactly that body. */
void kfx_expect(const struct kfx_daemon *d, const char *path, const char *json, long status, const char *body);

/* GET and expect `status` and, when `body` is not NULL, exactly that body. */
void kfx_expect_get(const struct kfx_daemon *d, const char *path, long status, const char *body);

/* Whether GET path answers `status` with a body containing `needle`. */
static inline bool kfx_get_has(const struct kfx_daemon *d, const char *path, long status, const char *needle)
{
    struct kfx_resp r;
    bool ok = kfx_get(d, path, &r) == status && (needle == NULL || strstr(r.body, needle) != NULL);
    kfx_resp_free(&r);
    return ok;
}

/* The value of an unlabelled metric line "name value" (-1 when absent). */
long long kfx_metric(const struct kfx_daemon *d, const char *name);

/* ---- publishers and the corpus --------------------------------------------------------------- */

/*
 * Chain c, block i: BS tokens 100000*c + BS*i + (0..BS), engine hash
 * kfx_hash(c, i), parent kfx_hash(c, i - 1).
 */
#define KFX_BS 4

static inline uint64_t kfx_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline uint64_t kfx_hash(uint32_t c, uint32_t i)
{
    return kfx_mix(((uint64_t)c << 32) | i);
}

static inline void kfx_tokens(uint32_t c, uint32_t from, uint32_t n, uint32_t *tok)
{
    for (uint32_t i = 0; i < n * KFX_BS; i++)
        tok[i] = 100000u * c + KFX_BS * from + i;
}

/* Local content hash of block i of chain c (base model, no salt). */
static inline uint64_t kfx_content(uint32_t c, uint32_t i)
{
    uint32_t tok[KFX_BS];
    kfx_tokens(c, i, 1, tok);
    return kvi_hash_block(tok, KFX_BS, kvi_hash_seed(NULL, 0, NULL, 0));
}

/* A publisher on loopback with a replay ROUTER keeping the last `ring`
 * batches (0: the library's default), ephemeral ports. */
struct kvidx_pub *kfx_pub_ring(int32_t rank, uint32_t ring);

/* A publisher on loopback with a replay ROUTER, ephemeral ports. */
static inline struct kvidx_pub *kfx_pub(int32_t rank)
{
    return kfx_pub_ring(rank, 0);
}

/* Publish blocks [from, to) of chain c as one stored event in one batch on `medium` (NULL = GPU). */
void kfx_publish(struct kvidx_pub *p, uint32_t c, uint32_t from, uint32_t to, const char *medium);

/* Publish the removal of blocks [from, to) of chain c in one batch. */
void kfx_unpublish(struct kvidx_pub *p, uint32_t c, uint32_t from, uint32_t to);

/* The Dynamo /query body for the first n blocks of chain c. */
char *kfx_query_json(const char *model, uint32_t c, uint32_t n);

/*
 * POST `json` to `path` until the body contains `needle`, sending an empty
 * batch on each publisher between tries (a listener that joined late then
 * sees a gap and replays what it missed). Fails after the deadline.
 */
void kfx_until_query(const struct kfx_daemon *d, const char *path, const char *json, const char *needle,
                     struct kvidx_pub *const *pubs, size_t n_pubs);

#endif
