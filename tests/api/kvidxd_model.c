/* The /dump model of the kvidxd integration tests (see kvidxd_model.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "api/kvidxd_model.h"

struct held *held_of(struct model *m, uint64_t w, uint32_t r, uint32_t c)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->h[i].w == w && m->h[i].r == r && m->h[i].c == c)
            return &m->h[i];
    assert_true(m->n < KMD_MAX_HELD);
    m->h[m->n] = (struct held){w, r, c, 0};
    return &m->h[m->n++];
}

struct dump_row {
    uint64_t w, h, t;
    uint32_t r;
};

static int row_cmp(const void *a, const void *b)
{
    const struct dump_row *x = a, *y = b;
    if (x->w != y->w)
        return x->w < y->w ? -1 : 1;
    if (x->r != y->r)
        return x->r < y->r ? -1 : 1;
    return x->h < y->h ? -1 : x->h > y->h;
}

/* Scan /dump's JSON: each event's worker_id and dp_rank, then its blocks' block_hash and tokens_hash.
 * @return the rows, or SIZE_MAX when there are more than @p cap. */
static size_t dump_rows(const char *body, const char *ns_key, struct dump_row *out, size_t cap)
{
    const char *p = strstr(body, ns_key);
    if (p == NULL)
        return 0;
    const char *end = strstr(p + 1, "\"block_size\""); /* the next namespace, if any */
    const char *next_ns = end != NULL ? strstr(end + 1, "\"block_size\"") : NULL;
    size_t n = 0;
    uint64_t w = 0;
    uint32_t r = 0;
    while ((p = strchr(p + 1, '"')) != NULL && (next_ns == NULL || p < next_ns)) {
        if (strncmp(p, "\"worker_id\":", 12) == 0)
            w = strtoull(p + 12, NULL, 10);
        else if (strncmp(p, "\"dp_rank\":", 10) == 0)
            r = (uint32_t)strtoul(p + 10, NULL, 10);
        else if (strncmp(p, "\"block_hash\":", 13) == 0) {
            if (n == cap)
                return SIZE_MAX;
            out[n].w = w;
            out[n].r = r;
            out[n].h = strtoull(p + 13, NULL, 10);
            const char *t = strstr(p, "\"tokens_hash\":");
            assert_non_null(t);
            out[n].t = strtoull(t + 14, NULL, 10);
            n++;
        }
    }
    return n;
}

bool check_dump_model(const struct kfx_daemon *d, const struct model *m, const char *ns_key, bool quiet)
{
    struct kfx_resp r;
    long st = kfx_get(d, "/dump", &r);
    if (quiet && st != 200) {
        kfx_resp_free(&r);
        return false;
    }
    assert_int_equal(st, 200);
    size_t nw = 0;
    for (size_t i = 0; i < m->n; i++)
        nw += m->h[i].n;
    size_t cap = nw + 1;
    struct dump_row *got = calloc(cap, sizeof *got), *want = calloc(cap, sizeof *want);
    assert_true(got != NULL && want != NULL);
    size_t ng = dump_rows(r.body, ns_key, got, cap);
    nw = 0;
    for (size_t i = 0; i < m->n; i++)
        for (uint32_t b = 0; b < m->h[i].n; b++)
            want[nw++] = (struct dump_row){m->h[i].w, kfx_hash(m->h[i].c, b), kfx_content(m->h[i].c, b), m->h[i].r};
    bool same = ng == nw;
    if (same) {
        qsort(got, ng, sizeof *got, row_cmp);
        qsort(want, nw, sizeof *want, row_cmp);
    }
    for (size_t i = 0; i < ng && same; i++)
        same = got[i].w == want[i].w && got[i].r == want[i].r && got[i].h == want[i].h && got[i].t == want[i].t;
    if (!same && !quiet)
        fail_msg("/dump has %zu blocks, model %zu (or they differ); dump: %.2000s", ng == SIZE_MAX ? 0 : ng, nw,
                 r.body);
    free(got);
    free(want);
    kfx_resp_free(&r);
    return same;
}

struct npub npub_open(enum kvidx_pub_transport t, const char *url, const char *subject, const char *stream,
                      uint64_t w, uint32_t r)
{
    struct kvidx_pub_config pc;
    kvidx_pub_config_init(&pc);
    pc.transport = t;
    pc.nats_url = url;
    pc.nats_subject = subject;
    pc.nats_stream = stream;
    pc.worker_id = w;
    pc.dp_rank = (int32_t)r;
    pc.flags = KVIDX_PUB_F_NATS_CREATE_STREAM;
    struct npub n = {kvidx_pub_create(&pc), w, r};
    assert_non_null(n.p);
    return n;
}

void pub_store(struct npub *n, struct model *m, uint32_t c, uint32_t from, uint32_t to)
{
    kfx_publish(n->p, c, from, to, NULL);
    struct held *h = held_of(m, n->w, n->r, c);
    assert_int_equal(h->n, from);
    h->n = to;
}

void pub_remove(struct npub *n, struct model *m, uint32_t c, uint32_t from)
{
    struct held *h = held_of(m, n->w, n->r, c);
    kfx_unpublish(n->p, c, from, h->n);
    h->n = from;
}
