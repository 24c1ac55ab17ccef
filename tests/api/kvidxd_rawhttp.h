/*
 * Raw HTTP helpers for the kvidxd fault tests (tests/api/kvidxd_faults_*_test.c):
 * what no well-behaved client sends, written by hand.
 *
 *   - the daemon process: descriptor limits, descriptors, RSS (from /proc);
 *   - raw TCP connections: send all, read until an HTTP/1.1 answer is whole
 *     or kvidxd closes, parse the answer's status, headers and body;
 *   - HTTP/2 by hand: frames, a minimal HPACK encoder (literal fields with
 *     static-table names, no Huffman), a frame parser for what came back;
 *   - slow clients: a poll loop that drips bytes on several connections at
 *     their own pace and notes when kvidxd closes each;
 *   - a kept-alive libcurl client (kvidxd_fixture.h opens one connection per
 *     request);
 *   - latency percentiles.
 *
 * Declared here with their contracts, defined in kvidxd_rawhttp.c (built
 * once into kvi_test_api, tests/CMakeLists.txt); small helpers stay inline.
 * Failures end the test with fail_msg (main thread only). Nothing here is
 * thread-safe except where a function says so; every struct is owned by the
 * caller.
 */
#ifndef KVI_TESTS_API_KVIDXD_RAWHTTP_H
#define KVI_TESTS_API_KVIDXD_RAWHTTP_H

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "engine/common.h"

#include "kvidxd_fixture.h"

/* ---- the process: limits, descriptors, memory ------------------------------------------------ */

/* Set this process's soft descriptor limit to @p v (capped at the hard limit; RLIM_INFINITY: the hard limit). */
void rh_set_nofile_soft(rlim_t v);

/*
 * Raise the hard descriptor limit to at least @p v where the process may
 * (root: CAP_SYS_RESOURCE), so that a daemon started next inherits it; a
 * limit already higher, or a refusal, leaves it as it is.
 */
void rh_raise_nofile_hard(rlim_t v);

/* This process's hard descriptor limit. */
rlim_t rh_nofile_hard(void);

/* Start kvidxd with a soft descriptor limit of 1024, as a shell would give it. */
void rh_start_low_nofile(struct kfx_daemon *d, const char *const *args);

/* A line "Name: value" of /proc/<pid>/<file>, the number after the colon (-1 when absent). */
long long rh_proc_field(pid_t pid, const char *file, const char *name);

static inline long long rh_rss_kb(pid_t pid)
{
    return rh_proc_field(pid, "status", "VmRSS");
}

/* The soft "Max open files" of a process. */
static inline long long rh_nofile_soft_of(pid_t pid)
{
    return rh_proc_field(pid, "limits", "Max open files");
}

/* The targets of a process's descriptors, one per line (for failure messages). */
char *rh_fd_list(pid_t pid);

/* How many descriptors process @p pid has open (-1 when /proc cannot tell). */
int rh_fd_count(pid_t pid);

/* A metric that must exist. */
long long rh_metric(const struct kfx_daemon *d, const char *name);

/* ---- raw sockets --------------------------------------------------------------------------------- */

/* A non-blocking TCP connection to kvidxd; @p rcvbuf > 0 sets SO_RCVBUF before connecting. */
int rh_tcp_open(uint16_t port, int rcvbuf);

/* Send all of @p p, waiting for room up to @p ms. @return 0, or -errno (EPIPE, ECONNRESET: closed by kvidxd). */
int rh_send_all(int fd, const void *p, size_t n, int ms);

/* What came back on a raw connection. */
struct rh_raw {
    char *buf; /* NUL-terminated */
    size_t len, cap;
    bool eof;     /* kvidxd closed (FIN or reset) */
    int64_t ms;   /* from raw_read's start to the close or the whole answer */
};

static inline void rh_raw_free(struct rh_raw *r)
{
    free(r->buf);
    memset(r, 0, sizeof *r);
}

/* End of the header block of the first HTTP/1.1 answer, or 0. */
static inline size_t rh_h1_head_len(const struct rh_raw *r)
{
    const char *e = r->buf != NULL ? strstr(r->buf, "\r\n\r\n") : NULL;
    return e != NULL ? (size_t)(e - r->buf) + 4 : 0;
}

/* A header of the first answer (case-insensitive name), copied into out; false when absent. */
bool rh_h1_header(const struct rh_raw *r, const char *name, char *out, size_t cap);

/* Whether the first HTTP/1.1 answer is all in (headers and Content-Length bytes). */
bool rh_h1_complete(const struct rh_raw *r);

static inline int rh_h1_status(const struct rh_raw *r)
{
    int st = 0;
    if (r->buf == NULL || sscanf(r->buf, "HTTP/1.%*d %d", &st) != 1)
        return 0;
    return st;
}

static inline const char *rh_h1_body(const struct rh_raw *r)
{
    size_t head = rh_h1_head_len(r);
    return head != 0 ? r->buf + head : "";
}

/*
 * Read until kvidxd closes, @p done says the answer is whole (NULL: read to
 * the close), or @p ms pass.
 */
void rh_raw_read(int fd, struct rh_raw *r, int ms, bool (*done)(const struct rh_raw *));

/* Read what is there without waiting. */
void rh_raw_drain(int fd, struct rh_raw *r);

/* ---- HTTP/2 frames by hand ---------------------------------------------------------------------- */

#define H2_PREFACE "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
enum { H2_DATA = 0, H2_HEADERS = 1, H2_RST = 3, H2_SETTINGS = 4, H2_GOAWAY = 7, H2_WINDOW_UPDATE = 8 };
enum { H2_END_STREAM = 1, H2_ACK = 1, H2_END_HEADERS = 4 };

/* Append one frame to out (len + 9 bytes). @return the bytes written. */
size_t rh_h2_frame(uint8_t *out, uint8_t type, uint8_t flags, uint32_t stream, const void *payload, size_t len);

/* HPACK: a literal header field without indexing whose name is static-table entry @p idx. */
size_t rh_hpack_lit(uint8_t *out, unsigned idx, const char *value);

/* The header block of a request: POST (with a body of @p content_length bytes, -1: none announced) or GET. */
size_t rh_hpack_request(uint8_t *out, bool post, const char *path, const char *ctype, long long content_length);

/* Preface, an empty SETTINGS and an ACK of the server's (h2o does not require the order). */
static inline size_t rh_h2_hello(uint8_t *out)
{
    size_t o = strlen(H2_PREFACE);
    memcpy(out, H2_PREFACE, o);
    o += rh_h2_frame(out + o, H2_SETTINGS, 0, 0, NULL, 0);
    o += rh_h2_frame(out + o, H2_SETTINGS, H2_ACK, 0, NULL, 0);
    return o;
}

/* What the server sent, frame by frame. */
struct rh_h2_seen {
    bool goaway;
    uint32_t goaway_code;
    int rst_stream;         /* first RST_STREAM's stream, 0 when none */
    uint32_t rst_code;
    int headers_stream;     /* last HEADERS' stream, 0 when none */
    uint8_t headers_first;  /* first byte of its header block (0x88: :status 200) */
    size_t data;            /* DATA payload bytes */
    uint64_t win[2];        /* WINDOW_UPDATE increments for the connection and for stream 1 */
    bool bad;               /* a truncated or malformed frame */
};

/* Walk the HTTP/2 frames in @p r (after the server's preface) and note what came (struct rh_h2_seen). */
void rh_h2_parse(const struct rh_raw *r, struct rh_h2_seen *s);

/* ---- slow clients: a poll loop that drips bytes and notes closes ---------------------------------- */

struct rh_slow {
    const char *name;
    int fd;
    const uint8_t *drip; /* sent `step` bytes every `every_ms`, then nothing */
    size_t drip_len, off, step;
    int every_ms;
    bool no_read;        /* never read what kvidxd sends */
    int64_t start, next;
    int64_t closed_at;   /* ms after start when kvidxd closed; -1 while open */
    size_t got;          /* bytes received */
    char first[48];      /* their start */
};

/*
 * Open slow client @p name on @p port (receive buffer @p rcvbuf, 0: default),
 * send its first @p pre_len bytes, then let rh_slow_run drip @p drip @p step
 * bytes every @p every_ms; @p no_read: never read the answers.
 */
void rh_slow_open(struct rh_slow *s, const char *name, uint16_t port, int rcvbuf, const void *pre, size_t pre_len,
                  const void *drip, size_t drip_len, size_t step, int every_ms, bool no_read);

static inline void rh_slow_closed(struct rh_slow *s)
{
    if (s->closed_at < 0)
        s->closed_at = kfx_now_ms() - s->start;
}

#define RH_SLOW_MAX 16 /* clients one rh_slow_run call drives at the most */

/*
 * Run every open client for up to @p ms: drip what is due, read, note closes.
 * Calls no cmocka check (a thread may run it): @return 0, or -EINVAL (nothing
 * done) when @p n exceeds RH_SLOW_MAX; the caller asserts on it.
 */
int rh_slow_run(struct rh_slow *s, size_t n, int ms);

static inline void rh_slow_close_all(struct rh_slow *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i].fd > 0) {
            close(s[i].fd);
            s[i].fd = -1;
        }
}

/* ---- a kept-alive libcurl client -------------------------------------------------------------------- */

struct rh_keep {
    CURL *h;
    struct curl_slist *hdr;
    const struct kfx_daemon *d;
    struct kfx_resp r;
};

/* A kept-alive libcurl handle on daemon @p d (HTTP/1.1 or h2c, @p proto), JSON bodies, no Expect. */
void rh_keep_init(struct rh_keep *k, const struct kfx_daemon *d, int proto);

static inline void rh_keep_free(struct rh_keep *k)
{
    kfx_resp_free(&k->r);
    curl_slist_free_all(k->hdr);
    curl_easy_cleanup(k->h);
}

/* POST a JSON body (GET when body is NULL) on the kept connection. @return the status, 0 on a transport error. */
long rh_keep_req(struct rh_keep *k, const char *path, const char *body);

/* ---- latency figures --------------------------------------------------------------------------------- */

static inline int rh_cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static inline int64_t rh_pct(int64_t *v, size_t n, double p)
{
    qsort(v, n, sizeof *v, rh_cmp_i64);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static inline int64_t rh_now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

#endif
