/*
 * Mooncake traces: JSONL parsing, the synthetic generator, length and
 * duplication expansion, statistics, default-path discovery and SHA-256
 * (see bench/trace.h).
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/trace.h"
#include "bench/trace_map.h"
#include "engine/common.h"
#include "net/msgpack_wire.h"

#define DEFAULT_TRACE_REL "shared/data/mooncake-traces/conversation_trace.jsonl"

void kvi_trace_init(struct kvi_trace *t)
{
    memset(t, 0, sizeof *t);
}

void kvi_trace_free(struct kvi_trace *t)
{
    free(t->req);
    free(t->ids);
    kvi_trace_init(t);
}

static void push_request(struct kvi_trace *t, const struct kvi_trace_request *r)
{
    if (t->n_req == t->cap_req) {
        t->cap_req = t->cap_req ? 2 * t->cap_req : 1024;
        t->req = kvi_xrealloc(t->req, t->cap_req * sizeof *t->req);
    }
    t->req[t->n_req++] = *r;
}

static void push_id(struct kvi_trace *t, uint64_t id)
{
    if (t->n_ids == t->cap_ids) {
        t->cap_ids = t->cap_ids ? 2 * t->cap_ids : 16384;
        t->ids = kvi_xrealloc(t->ids, t->cap_ids * sizeof *t->ids);
    }
    t->ids[t->n_ids++] = id;
    if (id > t->max_id)
        t->max_id = id;
}

/* ---- a minimal JSON scanner for one request object ------------------------- */

struct scan {
    const char *p, *end;
    char *err;
    size_t err_len;
};

static void skip_ws(struct scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\r' || *s->p == '\n'))
        s->p++;
}

static bool fail(struct scan *s, const char *what)
{
    if (s->err && s->err_len)
        snprintf(s->err, s->err_len, "%s", what);
    return false;
}

static bool expect(struct scan *s, char c)
{
    skip_ws(s);
    if (s->p >= s->end || *s->p != c) {
        char msg[64];
        snprintf(msg, sizeof msg, "expected '%c'", c);
        return fail(s, msg);
    }
    s->p++;
    return true;
}

/* A string; out and len give its raw bytes (escapes not decoded: keys and
 * session ids only need identity). */
static bool scan_string(struct scan *s, const char **out, size_t *len)
{
    if (!expect(s, '"'))
        return false;
    const char *b = s->p;
    while (s->p < s->end && *s->p != '"') {
        if (*s->p == '\\' && s->p + 1 < s->end)
            s->p++;
        s->p++;
    }
    if (s->p >= s->end)
        return fail(s, "unterminated string");
    *out = b;
    *len = (size_t)(s->p - b);
    s->p++;
    return true;
}

static bool scan_number(struct scan *s, double *v)
{
    skip_ws(s);
    char buf[64];
    size_t n = 0;
    while (s->p < s->end && n + 1 < sizeof buf && strchr("+-0123456789.eE", *s->p))
        buf[n++] = *s->p++;
    buf[n] = 0;
    char *e;
    *v = strtod(buf, &e);
    if (n == 0 || *e != 0)
        return fail(s, "bad number");
    return true;
}

static bool scan_u64(struct scan *s, uint64_t *v)
{
    double d;
    if (!scan_number(s, &d))
        return false;
    if (!(d >= 0) || d > 1.8e19 || d != floor(d))
        return fail(s, "expected a non-negative integer");
    *v = (uint64_t)d;
    return true;
}

static bool skip_value(struct scan *s, int depth)
{
    skip_ws(s);
    if (s->p >= s->end)
        return fail(s, "missing value");
    if (depth > 64)
        return fail(s, "nested too deeply");
    const char *str;
    size_t len;
    double d;
    switch (*s->p) {
    case '"':
        return scan_string(s, &str, &len);
    case '{':
    case '[': {
        char close = *s->p == '{' ? '}' : ']';
        bool obj = close == '}';
        s->p++;
        skip_ws(s);
        if (s->p < s->end && *s->p == close) {
            s->p++;
            return true;
        }
        for (;;) {
            if (obj && (!scan_string(s, &str, &len) || !expect(s, ':')))
                return false;
            if (!skip_value(s, depth + 1))
                return false;
            skip_ws(s);
            if (s->p < s->end && *s->p == ',') {
                s->p++;
                continue;
            }
            return expect(s, close);
        }
    }
    case 't':
    case 'f':
    case 'n': {
        static const char *const words[] = {"true", "false", "null"};
        for (size_t i = 0; i < 3; i++) {
            size_t l = strlen(words[i]);
            if ((size_t)(s->end - s->p) >= l && !memcmp(s->p, words[i], l)) {
                s->p += l;
                return true;
            }
        }
        return fail(s, "bad literal");
    }
    default:
        return scan_number(s, &d);
    }
}

static bool key_is(const char *k, size_t len, const char *name)
{
    return strlen(name) == len && !memcmp(k, name, len);
}

static bool scan_ids(struct scan *s, struct kvi_trace *t, uint32_t *n_ids)
{
    if (!expect(s, '['))
        return false;
    skip_ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
        return true;
    }
    for (;;) {
        uint64_t id;
        if (!scan_u64(s, &id))
            return false;
        push_id(t, id);
        (*n_ids)++;
        skip_ws(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            continue;
        }
        return expect(s, ']');
    }
}

int kvi_trace_parse_line(struct kvi_trace *t, const char *line, size_t len, char *err, size_t err_len)
{
    struct scan s = {line, line + len, err, err_len};
    skip_ws(&s);
    if (s.p == s.end)
        return 1;
    size_t ids_mark = t->n_ids;
    uint64_t max_mark = t->max_id;
    struct kvi_trace_request r = {.ids_off = t->n_ids};
    bool have_ids = false, have_out = false, have_in = false, have_session = false;
    if (!expect(&s, '{'))
        goto bad;
    skip_ws(&s);
    if (s.p < s.end && *s.p == '}') {
        s.p++;
    } else {
        for (;;) {
            const char *k;
            size_t kl;
            if (!scan_string(&s, &k, &kl) || !expect(&s, ':'))
                goto bad;
            uint64_t v;
            double d;
            if (key_is(k, kl, "timestamp") || key_is(k, kl, "created_time")) {
                if (!scan_number(&s, &d))
                    goto bad;
                if (!(d >= 0)) {
                    fail(&s, "negative timestamp");
                    goto bad;
                }
                r.t_ms = (uint64_t)llround(d);
            } else if (key_is(k, kl, "input_length") || key_is(k, kl, "input_tokens")) {
                if (!scan_u64(&s, &v))
                    goto bad;
                r.input_len = (uint32_t)KVI_MIN(v, UINT32_MAX);
                have_in = true;
            } else if (key_is(k, kl, "output_length") || key_is(k, kl, "output_tokens")) {
                if (!scan_u64(&s, &v))
                    goto bad;
                r.output_len = (uint32_t)KVI_MIN(v, UINT32_MAX);
                have_out = true;
            } else if (key_is(k, kl, "hash_ids")) {
                if (have_ids) {
                    fail(&s, "hash_ids given twice");
                    goto bad;
                }
                if (!scan_ids(&s, t, &r.n_ids))
                    goto bad;
                have_ids = true;
            } else if (key_is(k, kl, "session_id")) {
                skip_ws(&s);
                if (s.p < s.end && *s.p == '"') {
                    const char *sv;
                    size_t sl;
                    if (!scan_string(&s, &sv, &sl))
                        goto bad;
                    uint64_t h = 0xcbf29ce484222325ull;
                    for (size_t i = 0; i < sl; i++)
                        h = (h ^ (unsigned char)sv[i]) * 0x100000001b3ull;
                    r.session = kvi_fmix64(h);
                } else {
                    if (!scan_u64(&s, &v))
                        goto bad;
                    r.session = kvi_fmix64(v + 1);
                }
                have_session = true;
            } else if (!skip_value(&s, 0)) {
                goto bad;
            }
            skip_ws(&s);
            if (s.p < s.end && *s.p == ',') {
                s.p++;
                continue;
            }
            if (!expect(&s, '}'))
                goto bad;
            break;
        }
    }
    skip_ws(&s);
    if (s.p != s.end) {
        fail(&s, "trailing characters after the object");
        goto bad;
    }
    if (!have_ids || !have_out) {
        fail(&s, have_ids ? "missing output_length" : "missing hash_ids");
        goto bad;
    }
    if (!have_in)
        r.input_len = (uint32_t)KVI_MIN((uint64_t)r.n_ids * KVI_TRACE_ID_TOKENS, UINT32_MAX);
    if (have_session)
        t->has_sessions = true;
    else
        r.session = ~(uint64_t)t->n_req; /* a session of its own */
    push_request(t, &r);
    return 0;
bad:
    t->n_ids = ids_mark;
    t->max_id = max_mark;
    return -EINVAL;
}

static const char *base_name(const char *path)
{
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

int kvi_trace_load(struct kvi_trace *t, const char *path, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        int e = errno;
        snprintf(err, err_len, "%s: %s", path, strerror(e));
        return -e;
    }
    size_t cap = 1 << 20, n = 0;
    char *buf = kvi_xmalloc(cap);
    for (;;) {
        if (n == cap)
            buf = kvi_xrealloc(buf, cap *= 2);
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0)
            break;
    }
    int rerr = ferror(f);
    fclose(f);
    if (rerr) {
        snprintf(err, err_len, "%s: read error", path);
        free(buf);
        return -EIO;
    }
    kvi_sha256_hex(buf, n, t->sha256);
    snprintf(t->name, sizeof t->name, "%s", base_name(path));
    if (realpath(path, t->path) == NULL)
        snprintf(t->path, sizeof t->path, "%s", path);
    size_t line_no = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && buf[j] != '\n')
            j++;
        line_no++;
        char msg[128] = "";
        if (kvi_trace_parse_line(t, buf + i, j - i, msg, sizeof msg) < 0) {
            snprintf(err, err_len, "%s:%zu: %s", path, line_no, msg);
            free(buf);
            return -EINVAL;
        }
        i = j + 1;
    }
    free(buf);
    if (t->n_req == 0) {
        snprintf(err, err_len, "%s: no requests", path);
        return -EINVAL;
    }
    /* keep arrival order (the format promises it; be robust anyway) */
    for (size_t i = 1; i < t->n_req; i++)
        if (t->req[i].t_ms < t->req[i - 1].t_ms) {
            snprintf(err, err_len, "%s: timestamps go backwards at request %zu", path, i + 1);
            return -EINVAL;
        }
    return 0;
}

/* ---- synthetic generator ----------------------------------------------------- */

void kvi_trace_synth_defaults(struct kvi_trace_synth_cfg *c)
{
    *c = (struct kvi_trace_synth_cfg){
        .requests = 12000, .span_s = 3600.0, .followup = 0.39, .think_s = 60.0, .seed = 42};
}

static double unit(uint64_t *rng)
{
    return ((double)(kvi_bench_rand(rng) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double gauss(uint64_t *rng)
{
    return sqrt(-2.0 * log(unit(rng))) * cos(2.0 * M_PI * unit(rng));
}

static double lognormal(uint64_t *rng, double mu, double sigma)
{
    return exp(mu + sigma * gauss(rng));
}

struct synth_turn {
    double t_ms;
    uint32_t session, turn;
    uint32_t input, output;
    uint32_t prev; /* index of the previous turn of the session (sorted order fixed later) */
};

static int cmp_turn_time(const void *a, const void *b)
{
    const struct synth_turn *x = a, *y = b;
    if (x->t_ms != y->t_ms)
        return x->t_ms < y->t_ms ? -1 : 1;
    if (x->session != y->session)
        return x->session < y->session ? -1 : 1;
    return (x->turn > y->turn) - (x->turn < y->turn);
}

/*
 * Conversation-like: every request starts with one shared system-prompt id
 * (id 0, as every request of the conversation trace does); sessions start as
 * a Poisson process, have 1 + Geometric(followup) turns, and each later turn's
 * prompt is the previous prompt's full 512-token blocks plus the previous
 * answer and a new user message. Prompt and output lengths are log-normal,
 * fitted to the conversation trace (median prompt ~6 k tokens, mean output
 * ~340). New ids are consecutive integers in arrival order, as in the traces.
 */
void kvi_trace_synthesize(struct kvi_trace *t, const struct kvi_trace_synth_cfg *c)
{
    uint64_t rng = c->seed ^ 0x5eed5eedull;
    size_t cap = c->requests + 64, n = 0;
    struct synth_turn *v = kvi_xmalloc(cap * sizeof *v);
    double sessions = (double)c->requests * (1.0 - c->followup);
    double mean_gap_ms = c->span_s * 1000.0 / (sessions > 1 ? sessions : 1);
    double start = 0;
    for (uint32_t s = 0; n < c->requests; s++) {
        start += -log(unit(&rng)) * mean_gap_ms;
        double tm = start;
        uint32_t input = (uint32_t)fmin(fmax(lognormal(&rng, 8.45, 1.1), 600), 126000);
        for (uint32_t turn = 0; n < c->requests; turn++) {
            uint32_t output = (uint32_t)fmin(fmax(lognormal(&rng, 5.72, 0.55), 1), 4000);
            if (n == cap)
                v = kvi_xrealloc(v, (cap *= 2) * sizeof *v);
            v[n++] = (struct synth_turn){tm, s, turn, input, output, 0};
            if (unit(&rng) >= c->followup)
                break;
            tm += -log(unit(&rng)) * c->think_s * 1000.0;
            double next = (double)input + output + lognormal(&rng, 7.3, 1.0);
            input = (uint32_t)fmin(next, 200000);
        }
    }
    qsort(v, n, sizeof *v, cmp_turn_time);
    /* per session: where its latest turn's ids are */
    struct kvi_u64map last;
    kvi_u64map_init(&last);
    uint64_t next_id = 1;
    snprintf(t->name, sizeof t->name, "synthetic");
    for (size_t i = 0; i < n; i++) {
        struct kvi_trace_request r = {
            .t_ms = (uint64_t)v[i].t_ms,
            .session = v[i].session,
            .input_len = v[i].input,
            .output_len = v[i].output,
            .ids_off = t->n_ids,
        };
        uint32_t n_ids = (v[i].input + KVI_TRACE_ID_TOKENS - 1) / KVI_TRACE_ID_TOKENS;
        uint64_t prev_req;
        uint32_t inherit = 0;
        if (kvi_u64map_get(&last, v[i].session, &prev_req)) {
            const struct kvi_trace_request *p = &t->req[prev_req];
            inherit = KVI_MIN(p->input_len / KVI_TRACE_ID_TOKENS, n_ids);
            for (uint32_t k = 0; k < inherit; k++)
                push_id(t, t->ids[p->ids_off + k]);
        }
        for (uint32_t k = inherit; k < n_ids; k++)
            push_id(t, k == 0 ? 0 : next_id++);
        r.n_ids = n_ids;
        kvi_u64map_put(&last, v[i].session, t->n_req);
        push_request(t, &r);
    }
    t->has_sessions = true;
    kvi_u64map_free(&last);
    free(v);
}

/* ---- expansion -------------------------------------------------------------- */

void kvi_trace_expand(const struct kvi_trace *in, uint32_t f, uint32_t dup, struct kvi_trace *out)
{
    if (f == 0)
        f = 1;
    if (dup == 0)
        dup = 1;
    memcpy(out->name, in->name, sizeof out->name);
    memcpy(out->path, in->path, sizeof out->path);
    memcpy(out->sha256, in->sha256, sizeof out->sha256);
    out->has_sessions = in->has_sessions;
    uint64_t span = (in->max_id + 1) * f; /* ids per copy */
    for (size_t i = 0; i < in->n_req; i++) {
        const struct kvi_trace_request *r = &in->req[i];
        for (uint32_t c = 0; c < dup; c++) {
            struct kvi_trace_request x = *r;
            x.ids_off = out->n_ids;
            x.n_ids = r->n_ids * f;
            x.input_len = (uint32_t)KVI_MIN((uint64_t)r->input_len * f, UINT32_MAX);
            x.session = r->session * dup + c;
            for (uint32_t k = 0; k < r->n_ids; k++)
                for (uint32_t j = 0; j < f; j++)
                    push_id(out, in->ids[r->ids_off + k] * f + j + span * c);
            push_request(out, &x);
        }
    }
}

/* ---- statistics ------------------------------------------------------------- */

void kvi_trace_stats(const struct kvi_trace *t, struct kvi_trace_stats *st)
{
    memset(st, 0, sizeof *st);
    st->requests = t->n_req;
    if (t->n_req == 0)
        return;
    st->span_ms = t->req[t->n_req - 1].t_ms - t->req[0].t_ms;
    struct kvi_u64map seen;
    kvi_u64map_init(&seen);
    uint64_t in = 0, out = 0, reused = 0;
    for (size_t i = 0; i < t->n_req; i++) {
        const struct kvi_trace_request *r = &t->req[i];
        in += r->input_len;
        out += r->output_len;
        st->max_input = KVI_MAX(st->max_input, r->input_len);
        st->max_ids = KVI_MAX(st->max_ids, r->n_ids);
        st->total_ids += r->n_ids;
        for (uint32_t k = 0; k < r->n_ids; k++)
            if (!kvi_u64map_put(&seen, t->ids[r->ids_off + k], 1))
                reused++;
    }
    st->unique_ids = kvi_u64map_size(&seen);
    st->avg_input = (double)in / (double)t->n_req;
    st->avg_output = (double)out / (double)t->n_req;
    st->avg_ids = (double)st->total_ids / (double)t->n_req;
    st->reuse = st->total_ids ? (double)reused / (double)st->total_ids : 0;
    kvi_u64map_free(&seen);
}

/* ---- default trace discovery ----------------------------------------------------- */

static bool is_file(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Try <d>/../DEFAULT_TRACE_REL and <d>/DEFAULT_TRACE_REL for d and each of its ancestors. */
static bool search_up(const char *start, char *out, size_t cap)
{
    char dir[PATH_MAX];
    if (realpath(start, dir) == NULL)
        return false;
    for (;;) {
        char cand[PATH_MAX + 64];
        snprintf(cand, sizeof cand, "%s/%s", strcmp(dir, "/") ? dir : "", DEFAULT_TRACE_REL);
        if (is_file(cand) && realpath(cand, out) != NULL && strlen(out) < cap)
            return true;
        char *slash = strrchr(dir, '/');
        if (slash == NULL || slash == dir)
            return false;
        *slash = 0;
    }
}

bool kvi_trace_find_default(char *out, size_t cap)
{
    char buf[PATH_MAX];
    char tmp[PATH_MAX];
    if (cap < PATH_MAX)
        return false;
    /* 1. the repository this file was compiled from: <root>/bench/trace_load.c */
    snprintf(buf, sizeof buf, "%s", __FILE__);
    if (buf[0] == '/') {
        char *slash = strrchr(buf, '/');
        if (slash != NULL) {
            *slash = 0; /* <root>/bench */
            if (search_up(buf, tmp, sizeof tmp)) {
                snprintf(out, cap, "%s", tmp);
                return true;
            }
        }
    }
    /* 2. the working directory */
    if (search_up(".", tmp, sizeof tmp)) {
        snprintf(out, cap, "%s", tmp);
        return true;
    }
    /* 3. the executable's directory */
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n > 0) {
        buf[n] = 0;
        char *slash = strrchr(buf, '/');
        if (slash != NULL) {
            *slash = 0;
            if (search_up(buf, tmp, sizeof tmp)) {
                snprintf(out, cap, "%s", tmp);
                return true;
            }
        }
    }
    return false;
}

/* ---- SHA-256 (FIPS 180-4) ----------------------------------------------------- */

static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t ror(uint32_t x, int n)
{
    return (x >> n) | (x << (32 - n));
}

static void sha_block(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = kvi_load_be32(p + 4 * i);
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + sha_k[i] + w[i];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

void kvi_sha256_hex(const void *data, size_t n, char hex[65])
{
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    const uint8_t *p = data;
    size_t full = n / 64;
    for (size_t i = 0; i < full; i++)
        sha_block(h, p + 64 * i);
    uint8_t tail[128] = {0};
    size_t rem = n - full * 64;
    memcpy(tail, p + full * 64, rem);
    tail[rem] = 0x80;
    size_t tl = rem + 9 <= 64 ? 64 : 128;
    uint64_t bits = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++)
        tail[tl - 1 - i] = (uint8_t)(bits >> (8 * i));
    sha_block(h, tail);
    if (tl == 128)
        sha_block(h, tail + 64);
    for (int i = 0; i < 8; i++)
        snprintf(hex + 8 * i, 9, "%08x", h[i]);
}
