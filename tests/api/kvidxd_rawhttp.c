/*
 * Definitions of kvidxd_rawhttp.h (where the contracts are): built once into
 * kvi_test_api (tests/CMakeLists.txt) and linked into the api tests.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvidxd_rawhttp.h"

void rh_set_nofile_soft(rlim_t v)
{
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    rl.rlim_cur = v == RLIM_INFINITY || v > rl.rlim_max ? rl.rlim_max : v;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &rl), 0);
}

void rh_raise_nofile_hard(rlim_t v)
{
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < v) {
        rl.rlim_max = v;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
}

rlim_t rh_nofile_hard(void)
{
    struct rlimit rl;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &rl), 0);
    return rl.rlim_max;
}

void rh_start_low_nofile(struct kfx_daemon *d, const char *const *args)
{
    rh_set_nofile_soft(1024);
    kfx_start(d, args, NULL);
    rh_set_nofile_soft(RLIM_INFINITY);
}

long long rh_proc_field(pid_t pid, const char *file, const char *name)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, file);
    FILE *f = fopen(path, "r");
    long long v = -1;
    size_t n = strlen(name);
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, name, n) == 0) {
            v = strtoll(line + n + strspn(line + n, " \t:"), NULL, 10);
            break;
        }
    if (f != NULL)
        fclose(f);
    return v;
}

char *rh_fd_list(pid_t pid)
{
    char path[64], target[256], *out = calloc(1, 1);
    size_t len = 0;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    for (struct dirent *e; dir != NULL && (e = readdir(dir)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        char link[320];
        snprintf(link, sizeof link, "%s/%s", path, e->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        target[n > 0 ? n : 0] = '\0';
        out = realloc(out, len + strlen(e->d_name) + strlen(target) + 4);
        len += (size_t)sprintf(out + len, "%s %s\n", e->d_name, target);
    }
    if (dir != NULL)
        closedir(dir);
    return out;
}

int rh_fd_count(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    int n = 0;
    if (dir == NULL)
        return -1;
    for (struct dirent *e; (e = readdir(dir)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(dir);
    return n;
}

long long rh_metric(const struct kfx_daemon *d, const char *name)
{
    long long v = kfx_metric(d, name);
    if (v < 0)
        fail_msg("metric %s missing", name);
    return v;
}

int rh_tcp_open(uint16_t port, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        fail_msg("socket: %s", strerror(errno));
    if (rcvbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        fail_msg("connect to %u: %s", port, strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

int rh_send_all(int fd, const void *p, size_t n, int ms)
{
    const char *c = p;
    int64_t end = kfx_now_ms() + ms;
    while (n > 0) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k > 0) {
            c += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno != EAGAIN && errno != EINTR)
            return -errno;
        int64_t left = end - kfx_now_ms();
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd pf = {fd, POLLOUT, 0};
        poll(&pf, 1, (int)left);
    }
    return 0;
}

bool rh_h1_header(const struct rh_raw *r, const char *name, char *out, size_t cap)
{
    size_t head = rh_h1_head_len(r), n = strlen(name);
    for (const char *l = r->buf; head != 0 && l != NULL && l < r->buf + head; l = strstr(l, "\r\n")) {
        l += l == r->buf ? 0 : 2;
        if (strncasecmp(l, name, n) == 0 && l[n] == ':') {
            const char *v = l + n + 1 + strspn(l + n + 1, " ");
            size_t vl = strcspn(v, "\r\n");
            snprintf(out, cap, "%.*s", (int)vl, v);
            return true;
        }
        if (l == r->buf)
            l++;
    }
    return false;
}

bool rh_h1_complete(const struct rh_raw *r)
{
    size_t head = rh_h1_head_len(r);
    char cl[32];
    if (head == 0)
        return false;
    if (!rh_h1_header(r, "content-length", cl, sizeof cl))
        return false; /* read to the close */
    return r->len >= head + strtoull(cl, NULL, 10);
}

void rh_raw_read(int fd, struct rh_raw *r, int ms, bool (*done)(const struct rh_raw *))
{
    int64_t t0 = kfx_now_ms(), end = t0 + ms;
    if (r->buf == NULL) {
        r->cap = 4096;
        r->buf = calloc(1, r->cap);
    }
    for (;;) {
        if (done != NULL && done(r)) {
            r->ms = kfx_now_ms() - t0;
            return;
        }
        int64_t left = end - kfx_now_ms();
        if (left <= 0)
            return;
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, (int)left) <= 0)
            continue;
        if (r->len + 65536 + 1 > r->cap) {
            r->cap = 2 * (r->len + 65536 + 1);
            r->buf = realloc(r->buf, r->cap);
        }
        ssize_t k = recv(fd, r->buf + r->len, r->cap - r->len - 1, 0);
        if (k > 0) {
            r->len += (size_t)k;
            r->buf[r->len] = '\0';
        } else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
            r->eof = true;
            r->ms = kfx_now_ms() - t0;
            return;
        }
    }
}

void rh_raw_drain(int fd, struct rh_raw *r)
{
    for (;;) {
        if (r->len + 65536 + 1 > r->cap) {
            r->cap = 2 * (r->len + 65536 + 1);
            r->buf = realloc(r->buf, r->cap);
        }
        ssize_t k = recv(fd, r->buf + r->len, r->cap - r->len - 1, MSG_DONTWAIT);
        if (k > 0) {
            r->len += (size_t)k;
            r->buf[r->len] = '\0';
        } else {
            r->eof |= k == 0 || (errno != EAGAIN && errno != EINTR);
            return;
        }
    }
}

size_t rh_h2_frame(uint8_t *out, uint8_t type, uint8_t flags, uint32_t stream, const void *payload, size_t len)
{
    out[0] = (uint8_t)(len >> 16);
    out[1] = (uint8_t)(len >> 8);
    out[2] = (uint8_t)len;
    out[3] = type;
    out[4] = flags;
    out[5] = (uint8_t)(stream >> 24) & 0x7f;
    out[6] = (uint8_t)(stream >> 16);
    out[7] = (uint8_t)(stream >> 8);
    out[8] = (uint8_t)stream;
    if (len != 0 && payload != NULL)
        memcpy(out + 9, payload, len);
    return len + 9;
}

size_t rh_hpack_lit(uint8_t *out, unsigned idx, const char *value)
{
    size_t o = 0, n = strlen(value);
    if (idx < 15) {
        out[o++] = (uint8_t)idx;
    } else {
        out[o++] = 0x0f;
        out[o++] = (uint8_t)(idx - 15);
    }
    out[o++] = (uint8_t)n; /* values here are < 127 bytes, not Huffman-coded */
    memcpy(out + o, value, n);
    return o + n;
}

size_t rh_hpack_request(uint8_t *out, bool post, const char *path, const char *ctype, long long content_length)
{
    size_t o = 0;
    out[o++] = post ? 0x83 : 0x82; /* :method POST / GET */
    out[o++] = 0x86;               /* :scheme http */
    o += rh_hpack_lit(out + o, 4, path);
    o += rh_hpack_lit(out + o, 1, "kvidx");
    if (ctype != NULL)
        o += rh_hpack_lit(out + o, 31, ctype);
    if (content_length >= 0) {
        char cl[32];
        snprintf(cl, sizeof cl, "%lld", content_length);
        o += rh_hpack_lit(out + o, 28, cl);
    }
    return o;
}

void rh_h2_parse(const struct rh_raw *r, struct rh_h2_seen *s)
{
    memset(s, 0, sizeof *s);
    const uint8_t *p = (const uint8_t *)r->buf;
    size_t o = 0;
    while (r->buf != NULL && o + 9 <= r->len) {
        size_t len = ((size_t)p[o] << 16) | ((size_t)p[o + 1] << 8) | p[o + 2];
        uint8_t type = p[o + 3];
        int stream = (int)((((uint32_t)p[o + 5] & 0x7f) << 24) | ((uint32_t)p[o + 6] << 16) |
                           ((uint32_t)p[o + 7] << 8) | p[o + 8]);
        if (o + 9 + len > r->len) {
            s->bad = true;
            return;
        }
        const uint8_t *pl = p + o + 9;
        if (type == H2_GOAWAY && len >= 8) {
            s->goaway = true;
            s->goaway_code = ((uint32_t)pl[4] << 24) | ((uint32_t)pl[5] << 16) | ((uint32_t)pl[6] << 8) | pl[7];
        } else if (type == H2_RST && len == 4 && s->rst_stream == 0) { /* the first one */
            s->rst_stream = stream;
            s->rst_code = ((uint32_t)pl[0] << 24) | ((uint32_t)pl[1] << 16) | ((uint32_t)pl[2] << 8) | pl[3];
        } else if (type == H2_HEADERS && len > 0) {
            s->headers_stream = stream;
            s->headers_first = pl[0];
        } else if (type == H2_DATA) {
            s->data += len;
        } else if (type == H2_WINDOW_UPDATE && len == 4 && stream <= 1) {
            s->win[stream] +=
                (((uint32_t)pl[0] & 0x7f) << 24) | ((uint32_t)pl[1] << 16) | ((uint32_t)pl[2] << 8) | pl[3];
        }
        o += 9 + len;
    }
}

void rh_slow_open(struct rh_slow *s, const char *name, uint16_t port, int rcvbuf, const void *pre, size_t pre_len,
                  const void *drip, size_t drip_len, size_t step, int every_ms, bool no_read)
{
    memset(s, 0, sizeof *s);
    s->name = name;
    s->fd = rh_tcp_open(port, rcvbuf);
    s->drip = drip;
    s->drip_len = drip_len;
    s->step = step;
    s->every_ms = every_ms;
    s->no_read = no_read;
    s->start = kfx_now_ms();
    s->next = s->start + every_ms;
    s->closed_at = -1;
    if (pre_len != 0 && rh_send_all(s->fd, pre, pre_len, 5000) != 0)
        fail_msg("%s: could not send its first %zu bytes", name, pre_len);
}

int rh_slow_run(struct rh_slow *s, size_t n, int ms)
{
    int64_t end = kfx_now_ms() + ms;
    if (n > RH_SLOW_MAX)
        return -EINVAL;
    for (;;) {
        int64_t now = kfx_now_ms(), wake = end;
        struct pollfd pf[RH_SLOW_MAX];
        size_t map[RH_SLOW_MAX], np = 0;
        for (size_t i = 0; i < n; i++) {
            if (s[i].closed_at >= 0)
                continue;
            if (s[i].off < s[i].drip_len && s[i].next <= now) {
                size_t k = KVI_MIN(s[i].step, s[i].drip_len - s[i].off);
                ssize_t w = send(s[i].fd, s[i].drip + s[i].off, k, MSG_NOSIGNAL);
                if (w > 0)
                    s[i].off += (size_t)w;
                else if (w < 0 && errno != EAGAIN && errno != EINTR)
                    rh_slow_closed(&s[i]);
                s[i].next = now + s[i].every_ms;
            }
            if (s[i].closed_at >= 0)
                continue;
            if (s[i].off < s[i].drip_len && s[i].next < wake)
                wake = s[i].next;
            if (!s[i].no_read) {
                pf[np] = (struct pollfd){s[i].fd, POLLIN, 0};
                map[np++] = i;
            }
        }
        if (now >= end)
            return 0;
        int got = poll(pf, np, (int)KVI_MAX(wake - now, 0));
        for (size_t j = 0; got > 0 && j < np; j++) {
            if (pf[j].revents == 0)
                continue;
            struct rh_slow *c = &s[map[j]];
            char buf[16384];
            ssize_t k = recv(c->fd, buf, sizeof buf, 0);
            if (k > 0) {
                size_t keep = KVI_MIN((size_t)k, sizeof c->first - 1 - KVI_MIN(c->got, sizeof c->first - 1));
                memcpy(c->first + KVI_MIN(c->got, sizeof c->first - 1), buf, keep);
                c->got += (size_t)k;
            } else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
                rh_slow_closed(c);
            }
        }
    }
}

void rh_keep_init(struct rh_keep *k, const struct kfx_daemon *d, int proto)
{
    memset(k, 0, sizeof *k);
    k->d = d;
    k->h = curl_easy_init();
    k->hdr = curl_slist_append(NULL, "Content-Type: application/json");
    k->hdr = curl_slist_append(k->hdr, "Expect:");
    curl_easy_setopt(k->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(k->h, CURLOPT_TIMEOUT_MS, 20000L);
    curl_easy_setopt(k->h, CURLOPT_HTTP_VERSION,
                     proto == KFX_H2C ? (long)CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE : (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(k->h, CURLOPT_HTTPHEADER, k->hdr);
    curl_easy_setopt(k->h, CURLOPT_WRITEFUNCTION, kfx_on_body);
    curl_easy_setopt(k->h, CURLOPT_WRITEDATA, &k->r);
}

long rh_keep_req(struct rh_keep *k, const char *path, const char *body)
{
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", k->d->port, path);
    kfx_resp_free(&k->r);
    k->r.body = calloc(1, 1);
    curl_easy_setopt(k->h, CURLOPT_URL, url);
    if (body != NULL) {
        curl_easy_setopt(k->h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(k->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    } else {
        curl_easy_setopt(k->h, CURLOPT_HTTPGET, 1L);
    }
    if (curl_easy_perform(k->h) != CURLE_OK)
        return 0;
    curl_easy_getinfo(k->h, CURLINFO_RESPONSE_CODE, &k->r.status);
    return k->r.status;
}
