/* ctest-labels: unit -- bench/trace_io.c: --export / --import round trip (same timeline, same answers), rejections */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <msgpack.h>
#include <msgpack/fbuffer.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/trace.h"
#include "bench/trace_io.h"
#include "bench/trace_replay.h"
#include "rcu_group.h"

struct fx {
    struct kvi_trace t;
    struct kvi_trace_workload w;
    char path[64];
};

/* A synthetic trace small enough for a unit test, with evictions (a small
 * pool), replayed by 8 workers; the timeline exported to a temporary file. */
static int fx_setup(void **state)
{
    struct fx *f = calloc(1, sizeof *f);
    struct kvi_trace_synth_cfg sc;
    kvi_trace_synth_defaults(&sc);
    sc.requests = 400;
    sc.span_s = 600;
    sc.seed = 7;
    kvi_trace_init(&f->t);
    kvi_trace_synthesize(&f->t, &sc);
    struct kvi_trace_workload_cfg c;
    kvi_trace_workload_defaults(&c);
    c.n_workers = 8;
    c.gpu_blocks = 512;
    c.seed = 99;
    if (kvi_trace_workload_build(&f->w, &f->t, &c, NULL, NULL) < 0)
        return -1;
    snprintf(f->path, sizeof f->path, "/tmp/kvi_trace_io_test.%d", (int)getpid());
    if (kvi_trace_export(&f->w, "synthetic 400", f->path) < 0)
        return -1;
    *state = f;
    return 0;
}

static int fx_teardown(void **state)
{
    struct fx *f = *state;
    unlink(f->path);
    kvi_trace_workload_free(&f->w);
    kvi_trace_free(&f->t);
    free(f);
    return 0;
}

static void hashes_equal(const uint64_t *a, const uint64_t *b, uint32_t n, size_t i)
{
    for (uint32_t k = 0; k < n; k++)
        if (a[k] != b[k])
            fail_msg("entry %zu hash %u: %llx != %llx", i, k, (unsigned long long)a[k], (unsigned long long)b[k]);
}

/* The imported timeline is the exported one, entry by entry. */
static void test_same_timeline(void **state)
{
    struct fx *f = *state;
    const struct kvi_trace_workload *a = &f->w;
    assert_true(a->st.stores > 0 && a->st.removes > 0 && a->st.queries > 0);
    struct kvi_trace_workload b;
    char err[256] = "", sha[65] = "";
    assert_int_equal(kvi_trace_import(&b, f->path, sha, err, sizeof err), 0);
    assert_int_equal(strlen(sha), 64);
    assert_null(b.trace);
    assert_int_equal(b.n, a->n);
    assert_int_equal(b.n_workers_total, a->n_workers_total);
    assert_int_equal(b.cfg.block_size, a->cfg.block_size);
    assert_int_equal(b.cfg.seed, 99);
    assert_int_equal(b.span_ns, a->span_ns);
    assert_int_equal(b.st.queries, a->st.queries);
    assert_int_equal(b.st.query_blocks, a->st.query_blocks);
    assert_int_equal(b.st.stores, a->st.stores);
    assert_int_equal(b.st.stored_blocks, a->st.stored_blocks);
    assert_int_equal(b.st.removes, a->st.removes);
    assert_int_equal(b.st.removed_blocks, a->st.removed_blocks);
    size_t roots = 0;
    for (size_t i = 0; i < a->n; i++) {
        const struct kvi_trace_entry *x = &a->e[i], *y = &b.e[i];
        assert_int_equal(y->t_ns, x->t_ns);
        assert_int_equal(y->worker, x->worker);
        assert_int_equal(y->kind, x->kind);
        assert_int_equal(y->n, x->n);
        if (x->kind != KVI_TRACE_QUERY)
            hashes_equal(x->engine_hash, y->engine_hash, x->n, i);
        if (x->kind != KVI_TRACE_REMOVE)
            hashes_equal(x->content, y->content, x->n, i);
        if (x->kind == KVI_TRACE_STORE) {
            assert_int_equal(y->has_parent, x->has_parent);
            assert_int_equal(y->parent, x->parent);
            roots += !x->has_parent;
        }
    }
    assert_true(roots > 0 && roots < a->st.stores); /* both kinds of store travelled */
    kvi_trace_workload_free(&b);
}

/* Serial replay of a workload on a fresh backend: every query's scores, in
 * timeline order, appended to *out (worker, depth pairs). */
static size_t replay_answers(const struct kvi_trace_workload *w, const char *backend, uint32_t **out)
{
    struct kvi_trace_be *b = kvi_trace_be_create(kvi_trace_backend_by_name(backend), w->n_workers_total, 1,
                                                 w->cfg.block_size, 0, w->cfg.seed);
    struct kvi_bl_scratch s = {0};
    struct kvi_bl_score *sc = calloc(w->n_workers_total, sizeof *sc);
    size_t n = 0, cap = 1024;
    uint32_t *v = malloc(cap * sizeof *v);
    for (size_t i = 0; i < w->n; i++) {
        const struct kvi_trace_entry *e = &w->e[i];
        if (e->kind != KVI_TRACE_QUERY) {
            assert_int_equal(kvi_trace_be_apply(b, e), 0);
            continue;
        }
        size_t k = kvi_trace_be_scores(b, &s, e->content, e->n, sc, w->n_workers_total);
        if (n + 2 * k + 1 > cap)
            v = realloc(v, (cap = 2 * (n + 2 * k + 1)) * sizeof *v);
        v[n++] = (uint32_t)k;
        for (size_t j = 0; j < k; j++) {
            v[n++] = sc[j].worker;
            v[n++] = sc[j].depth;
        }
    }
    free(sc);
    kvi_bl_scratch_free(&s);
    kvi_trace_be_destroy(b);
    *out = v;
    return n;
}

/* The replay of the imported timeline answers every query exactly as the
 * original's, on kvidx and on the radix-tree baseline, and the answers are
 * not trivial (hits at depth > 1 on several workers). */
static void test_same_answers(void **state)
{
    struct fx *f = *state;
    struct kvi_trace_workload b;
    char err[256] = "";
    assert_int_equal(kvi_trace_import(&b, f->path, NULL, err, sizeof err), 0);
    static const char *const backends[] = {"kvidx", "radix-lock"};
    for (size_t k = 0; k < 2; k++) {
        uint32_t *x, *y;
        size_t nx = replay_answers(&f->w, backends[k], &x), ny = replay_answers(&b, backends[k], &y);
        assert_int_equal(ny, nx);
        assert_memory_equal(x, y, nx * sizeof *x);
        size_t deep = 0, multi = 0;
        for (size_t i = 0; i < nx;) {
            uint32_t m = x[i++];
            multi += m > 1;
            for (uint32_t j = 0; j < m; j++, i += 2)
                deep += x[i + 1] > 1;
        }
        assert_true(deep > 100);
        assert_true(multi > 10);
        free(x);
        free(y);
    }
    kvi_trace_workload_free(&b);
}

/* ---- rejections: hand-packed files ----------------------------------------- */

static void pk_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

enum flaw { OK, BAD_FORMAT, BAD_VERSION, COUNT_HIGH, COUNT_LOW, RANK, WORKER, LENGTHS, BACK_IN_TIME, BAD_OP, SPAN };

/* Two entries (a root store of 2 blocks, a query) with one flaw. */
static void write_file(const char *path, enum flaw flaw)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    msgpack_packer pk;
    msgpack_packer_init(&pk, fp, msgpack_fbuffer_write);
    msgpack_pack_map(&pk, 7);
    pk_str(&pk, "format");
    pk_str(&pk, flaw == BAD_FORMAT ? "kvidx-timelines" : "kvidx-timeline");
    pk_str(&pk, "version");
    msgpack_pack_uint32(&pk, flaw == BAD_VERSION ? 2 : 1);
    pk_str(&pk, "workers");
    msgpack_pack_uint32(&pk, 2);
    pk_str(&pk, "block_size");
    msgpack_pack_uint32(&pk, 16);
    pk_str(&pk, "entries");
    msgpack_pack_uint32(&pk, flaw == COUNT_HIGH ? 3 : flaw == COUNT_LOW ? 1 : 2);
    pk_str(&pk, "span_ns");
    msgpack_pack_uint64(&pk, flaw == SPAN ? 6 : 5);
    pk_str(&pk, "seed");
    msgpack_pack_uint64(&pk, 1);
    /* a store, with an unknown key (readers skip them) */
    msgpack_pack_map(&pk, 8);
    pk_str(&pk, "t");
    msgpack_pack_uint64(&pk, flaw == BACK_IN_TIME ? 9 : 1);
    pk_str(&pk, "op");
    pk_str(&pk, flaw == BAD_OP ? "stored" : "store");
    pk_str(&pk, "worker");
    msgpack_pack_uint32(&pk, flaw == WORKER ? 2 : 1);
    pk_str(&pk, "rank");
    msgpack_pack_uint32(&pk, flaw == RANK ? 1 : 0);
    pk_str(&pk, "hashes");
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint64(&pk, 0xffffffffffffffffull);
    msgpack_pack_uint64(&pk, 12);
    pk_str(&pk, "content");
    msgpack_pack_array(&pk, flaw == LENGTHS ? 1 : 2);
    msgpack_pack_uint64(&pk, 100);
    if (flaw != LENGTHS)
        msgpack_pack_uint64(&pk, 0x8000000000000001ull);
    pk_str(&pk, "parent");
    msgpack_pack_nil(&pk);
    pk_str(&pk, "note");
    pk_str(&pk, "skipped");
    /* a query */
    msgpack_pack_map(&pk, 5);
    pk_str(&pk, "t");
    msgpack_pack_uint64(&pk, 5);
    pk_str(&pk, "op");
    pk_str(&pk, "query");
    pk_str(&pk, "worker");
    msgpack_pack_uint32(&pk, 0);
    pk_str(&pk, "rank");
    msgpack_pack_uint32(&pk, 0);
    pk_str(&pk, "content");
    msgpack_pack_array(&pk, 3);
    msgpack_pack_uint64(&pk, 100);
    msgpack_pack_uint64(&pk, 0x8000000000000001ull);
    msgpack_pack_uint64(&pk, 7);
    assert_int_equal(fclose(fp), 0);
}

static void test_hand_written_file(void **state)
{
    struct fx *f = *state;
    write_file(f->path, OK);
    struct kvi_trace_workload w;
    char err[256] = "";
    assert_int_equal(kvi_trace_import(&w, f->path, NULL, err, sizeof err), 0);
    assert_int_equal(w.n, 2);
    assert_int_equal(w.n_workers_total, 2);
    assert_int_equal(w.cfg.block_size, 16);
    assert_int_equal(w.e[0].kind, KVI_TRACE_STORE);
    assert_false(w.e[0].has_parent);
    assert_int_equal(w.e[0].engine_hash[0], 0xffffffffffffffffull);
    assert_int_equal(w.e[0].content[1], 0x8000000000000001ull);
    assert_int_equal(w.e[1].kind, KVI_TRACE_QUERY);
    assert_int_equal(w.e[1].n, 3);
    /* worker 1 holds the first two blocks of the query */
    struct kvi_trace_be *b = kvi_trace_be_create(kvi_trace_backend_by_name("kvidx"), 2, 1, 16, 0, 1);
    assert_int_equal(kvi_trace_be_apply(b, &w.e[0]), 0);
    struct kvi_bl_scratch s = {0};
    struct kvi_bl_score sc[2];
    assert_int_equal(kvi_trace_be_scores(b, &s, w.e[1].content, w.e[1].n, sc, 2), 1);
    assert_int_equal(sc[0].worker, 1);
    assert_int_equal(sc[0].depth, 2);
    kvi_bl_scratch_free(&s);
    kvi_trace_be_destroy(b);
    kvi_trace_workload_free(&w);
}

static void test_rejects(void **state)
{
    struct fx *f = *state;
    static const struct {
        enum flaw flaw;
        const char *msg;
    } cases[] = {
        {BAD_FORMAT, "not a \"kvidx-timeline\" file"},
        {BAD_VERSION, "version"},
        {COUNT_HIGH, "entry 2: the file ends"},
        {COUNT_LOW, "bytes after the 1 entries"},
        {RANK, "entry 0: rank 1"},
        {WORKER, "entry 0: needs t, worker (< 2)"},
        {LENGTHS, "entry 0: a store needs hashes and content of one equal length"},
        {BACK_IN_TIME, "entry 1: t 5 goes back in time"},
        {BAD_OP, "entry 0: op is not"},
        {SPAN, "span_ns 6 is not the last entry's t 5"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_file(f->path, cases[i].flaw);
        struct kvi_trace_workload w;
        char err[256] = "";
        assert_int_equal(kvi_trace_import(&w, f->path, NULL, err, sizeof err), -EINVAL);
        if (strstr(err, cases[i].msg) == NULL)
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, err, cases[i].msg);
        assert_int_equal(w.n, 0);
        assert_null(w.e);
    }
    /* every truncation of a real export is rejected */
    assert_int_equal(kvi_trace_export(&f->w, NULL, f->path), 0);
    FILE *fp = fopen(f->path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fclose(fp);
    static const long cut[] = {1, 9, 1000};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(truncate(f->path, len - cut[i]), 0);
        struct kvi_trace_workload w;
        char err[256] = "";
        assert_int_equal(kvi_trace_import(&w, f->path, NULL, err, sizeof err), -EINVAL);
        assert_non_null(strstr(err, "truncated"));
        len -= cut[i];
    }
    struct kvi_trace_workload w;
    char err[256] = "";
    assert_int_equal(kvi_trace_import(&w, "/nonexistent/timeline", NULL, err, sizeof err), -ENOENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_same_timeline, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_same_answers, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_hand_written_file, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_rejects, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, kvi_test_rcu_setup, kvi_test_rcu_teardown);
}
