/* ctest-labels: integration -- bench/soak.c, soak_model.c: the model, the /dump comparator, and a short soak against a spawned kvidxd */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/codec_dump.h"
#include "bench/soak.h"

#define MODEL "soak-test"
#define ID0 1000u

/* ---- dump bodies built with kvidx's own encoder ------------------------------------- */

struct body {
    struct kvi_dump_enc enc;
};

static void body_begin(struct body *b, const char *model)
{
    kvi_dump_enc_init(&b->enc, NULL, NULL, 0);
    kvi_dump_enc_begin(&b->enc);
    kvi_dump_enc_ns_begin(&b->enc, (struct kvi_str){model, strlen(model)}, (struct kvi_str){"default", 7}, 16, NULL);
}

static void body_block(struct body *b, uint64_t worker, uint64_t eh, bool has_parent, uint64_t parent,
                       uint64_t content, uint32_t depth)
{
    struct kvi_dump_block blk = {.tier = KVI_TIER_GPU, .position = depth, .engine_hash = eh,
                                 .content_hash = content, .seq_hash = content ^ 1, .has_parent = has_parent,
                                 .parent_engine_hash = parent};
    struct kvi_dump_worker w = {worker, NULL};
    kvi_dump_enc_block(&b->enc, &blk, &w);
}

static void body_end(struct body *b)
{
    kvi_dump_enc_ns_end(&b->enc);
    assert_int_equal(kvi_dump_enc_end(&b->enc), 0);
}

/* Compare, feeding the body in pieces of @p chunk bytes. */
static int compare(struct kvi_soak_model *m, struct body *b, size_t chunk, struct kvi_soak_diff *d)
{
    struct kvi_soak_cmp *c = kvi_soak_cmp_begin(m, MODEL, ID0, d);
    const char *p = b->enc.out.data;
    size_t n = b->enc.out.len;
    for (size_t off = 0; off < n; off += chunk)
        kvi_soak_cmp_feed(c, p + off, n - off < chunk ? n - off : chunk);
    int rc = kvi_soak_cmp_end(c);
    kvi_dump_enc_free(&b->enc);
    return rc;
}

/* Worker 0: chain A(1) <- B(2) <- C(3) and a second branch B <- D(4); worker 1: root E(5) <- F(6). */
static struct kvi_soak_model *small_model(void)
{
    struct kvi_soak_model *m = kvi_soak_model_create(2);
    const uint64_t abc[] = {1, 2, 3}, abc_c[] = {101, 102, 103}, d[] = {4}, d_c[] = {104}, ef[] = {5, 6},
                   ef_c[] = {105, 106};
    assert_int_equal(kvi_soak_model_store(m, 0, false, 0, abc, abc_c, 3), 0);
    assert_int_equal(kvi_soak_model_store(m, 0, true, 2, d, d_c, 1), 0);
    assert_int_equal(kvi_soak_model_store(m, 1, false, 0, ef, ef_c, 2), 0);
    return m;
}

/* The dump of small_model, with hooks to leave a block out or add one. */
static void small_body(struct body *b, const char *model, int skip_eh)
{
    body_begin(b, model);
    if (skip_eh != 1)
        body_block(b, ID0, 1, false, 0, 101, 0);
    if (skip_eh != 2)
        body_block(b, ID0, 2, true, 1, 102, 1);
    if (skip_eh != 3)
        body_block(b, ID0, 3, true, 2, 103, 2);
    if (skip_eh != 4)
        body_block(b, ID0, 4, true, 2, 104, 2);
    if (skip_eh != 5)
        body_block(b, ID0 + 1, 5, false, 0, 105, 0);
    if (skip_eh != 6)
        body_block(b, ID0 + 1, 6, true, 5, 106, 1);
}

static bool shown(const struct kvi_soak_diff *d, const char *what)
{
    for (uint32_t i = 0; i < d->n_shown; i++)
        if (strstr(d->shown[i], what) != NULL)
            return true;
    return false;
}

static void test_model_semantics(void **state)
{
    (void)state;
    struct kvi_soak_model *m = small_model();
    assert_int_equal(kvi_soak_model_blocks(m, 0), 4);
    assert_int_equal(kvi_soak_model_blocks(m, 1), 2);
    assert_int_equal(kvi_soak_model_total(m), 6);
    assert_true(kvi_soak_model_holds(m, 0, 3));
    assert_false(kvi_soak_model_holds(m, 1, 3));
    /* unknown parent: rejected whole; a repeated hash or the parent inside the run: invalid */
    const uint64_t x[] = {7, 8}, xc[] = {107, 108}, rep[] = {9, 9}, self[] = {10, 2};
    assert_int_equal(kvi_soak_model_store(m, 0, true, 42, x, xc, 2), -ENOENT);
    assert_int_equal(kvi_soak_model_store(m, 0, false, 0, rep, xc, 2), -EINVAL);
    assert_int_equal(kvi_soak_model_store(m, 0, true, 2, self, xc, 2), -EINVAL);
    assert_int_equal(kvi_soak_model_store(m, 2, false, 0, x, xc, 2), -EINVAL);
    assert_int_equal(kvi_soak_model_blocks(m, 0), 4);
    /* the parent of a worker is per worker */
    assert_int_equal(kvi_soak_model_store(m, 1, true, 1, x, xc, 2), -ENOENT);
    /* idempotent re-store */
    const uint64_t a[] = {1}, ac[] = {101};
    assert_int_equal(kvi_soak_model_store(m, 0, false, 0, a, ac, 1), 0);
    assert_int_equal(kvi_soak_model_blocks(m, 0), 4);
    /* removes: leaves first are clean; unknown hashes are skipped */
    const uint64_t leaves[] = {3, 99, 4};
    assert_int_equal(kvi_soak_model_remove(m, 0, leaves, 3), 2);
    assert_int_equal(kvi_soak_model_orphaning_removes(m), 0);
    /* removing E while F is held is counted (the model does not cascade) */
    const uint64_t e[] = {5};
    assert_int_equal(kvi_soak_model_remove(m, 1, e, 1), 1);
    assert_int_equal(kvi_soak_model_orphaning_removes(m), 1);
    assert_true(kvi_soak_model_holds(m, 1, 6));
    /* iteration visits every held block once */
    size_t pos = 0, n = 0;
    uint64_t eh, sum = 0;
    while (kvi_soak_model_next(m, 0, &pos, &eh)) {
        n++;
        sum += eh;
    }
    assert_int_equal(n, 2);
    assert_int_equal(sum, 1 + 2);
    kvi_soak_model_destroy(m);
}

static void test_dump_equal(void **state)
{
    (void)state;
    static const size_t chunks[] = {1, 7, 1u << 20};
    for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
        struct kvi_soak_model *m = small_model();
        struct body b;
        struct kvi_soak_diff d;
        small_body(&b, MODEL, 0);
        body_end(&b);
        assert_int_equal(compare(m, &b, chunks[i], &d), 0);
        assert_true(d.decoded);
        assert_true(d.equal);
        assert_int_equal(d.dump_blocks, 6);
        assert_int_equal(d.matched, 6);
        assert_int_equal(d.missing + d.extra + d.wrong + d.duplicates, 0);
        assert_int_equal(d.n_shown, 0);
        /* a second comparison of the same model starts afresh */
        small_body(&b, MODEL, 0);
        body_end(&b);
        assert_int_equal(compare(m, &b, chunks[i], &d), 0);
        assert_true(d.equal);
        kvi_soak_model_destroy(m);
    }
}

static void test_dump_missing_block(void **state)
{
    (void)state;
    struct kvi_soak_model *m = small_model();
    struct body b;
    struct kvi_soak_diff d;
    small_body(&b, MODEL, 3);
    body_end(&b);
    assert_int_equal(compare(m, &b, 64, &d), 0);
    assert_true(d.decoded);
    assert_false(d.equal);
    assert_int_equal(d.missing, 1);
    assert_int_equal(d.matched, 5);
    assert_int_equal(d.extra + d.wrong + d.duplicates, 0);
    assert_true(shown(&d, "missing: worker 0 block 0x3"));
    kvi_soak_model_destroy(m);
}

static void test_dump_extra_block(void **state)
{
    (void)state;
    struct kvi_soak_model *m = small_model();
    struct body b;
    struct kvi_soak_diff d;
    small_body(&b, MODEL, 0);
    body_block(&b, ID0 + 1, 77, true, 6, 177, 2); /* a block the model does not hold */
    body_end(&b);
    assert_int_equal(compare(m, &b, 64, &d), 0);
    assert_false(d.equal);
    assert_int_equal(d.extra, 1);
    assert_int_equal(d.matched, 6);
    assert_int_equal(d.missing + d.wrong + d.duplicates, 0);
    assert_true(shown(&d, "extra: worker 1 block 0x4d"));
    kvi_soak_model_destroy(m);

    /* blocks of another worker, another namespace, another rank are extra too */
    m = small_model();
    small_body(&b, MODEL, 0);
    body_block(&b, ID0 + 2, 1, false, 0, 101, 0); /* no third worker */
    kvi_dump_enc_ns_end(&b.enc);
    kvi_dump_enc_ns_begin(&b.enc, (struct kvi_str){"other", 5}, (struct kvi_str){"default", 7}, 16, NULL);
    body_block(&b, ID0, 1, false, 0, 101, 0);
    body_end(&b);
    assert_int_equal(compare(m, &b, 64, &d), 0);
    assert_false(d.equal);
    assert_int_equal(d.extra, 2);
    assert_int_equal(d.matched, 6);
    assert_true(shown(&d, "is no soak worker's"));
    kvi_soak_model_destroy(m);
}

static void test_dump_wrong_parent(void **state)
{
    (void)state;
    struct kvi_soak_model *m = small_model();
    struct body b;
    struct kvi_soak_diff d;
    small_body(&b, MODEL, 4);
    body_block(&b, ID0, 4, true, 3, 104, 2); /* D's parent is B, not C */
    body_end(&b);
    assert_int_equal(compare(m, &b, 64, &d), 0);
    assert_false(d.equal);
    assert_int_equal(d.wrong, 1);
    assert_int_equal(d.matched, 5);
    assert_int_equal(d.missing + d.extra + d.duplicates, 0);
    assert_true(shown(&d, "wrong: worker 0 block 0x4: /dump parent 0x3"));
    kvi_soak_model_destroy(m);

    /* a root listed with a parent, a wrong content hash, a wrong depth, a duplicate */
    m = small_model();
    body_begin(&b, MODEL);
    body_block(&b, ID0, 1, true, 5, 101, 0);
    body_block(&b, ID0, 2, true, 1, 999, 1);
    body_block(&b, ID0, 3, true, 2, 103, 5);
    body_block(&b, ID0, 4, true, 2, 104, 2);
    body_block(&b, ID0, 4, true, 2, 104, 2);
    body_block(&b, ID0 + 1, 5, false, 0, 105, 0);
    body_block(&b, ID0 + 1, 6, true, 5, 106, 1);
    body_end(&b);
    assert_int_equal(compare(m, &b, 3, &d), 0);
    assert_false(d.equal);
    assert_int_equal(d.wrong, 3);
    assert_int_equal(d.duplicates, 1);
    assert_int_equal(d.matched, 3);
    assert_int_equal(d.missing + d.extra, 0);
    kvi_soak_model_destroy(m);
}

static void test_dump_malformed(void **state)
{
    (void)state;
    struct kvi_soak_model *m = small_model();
    struct kvi_soak_diff d;
    static const char *bad[] = {"{\"" MODEL ":default\": {\"block_size\": 16, \"events\": [", "[1, 2]",
                                "{\"" MODEL ":default\": {\"error\": \"boom\"}}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct kvi_soak_cmp *c = kvi_soak_cmp_begin(m, MODEL, ID0, &d);
        kvi_soak_cmp_feed(c, bad[i], strlen(bad[i]));
        assert_int_equal(kvi_soak_cmp_end(c), -EBADMSG);
        assert_false(d.decoded);
        assert_false(d.equal);
        assert_true(d.error[0] != '\0');
    }
    /* an empty dump of a non-empty model: everything missing */
    struct kvi_soak_cmp *c = kvi_soak_cmp_begin(m, MODEL, ID0, &d);
    kvi_soak_cmp_feed(c, "{}", 2);
    assert_int_equal(kvi_soak_cmp_end(c), 0);
    assert_false(d.equal);
    assert_int_equal(d.missing, 6);
    assert_int_equal(d.n_shown, 6);
    kvi_soak_model_destroy(m);
}

/* ---- the RSS verdict -------------------------------------------------------------------- */

static void judge(const uint64_t *kb, size_t n, double bound, struct kvi_soak_rss *v)
{
    double t[32];
    assert_true(n <= 32);
    for (size_t i = 0; i < n; i++)
        t[i] = 5.0 * (double)i; /* a sample every 5 s; the warm-up ends at 10 s (third sample) */
    kvi_soak_rss_judge(t, kb, n, 10.0, bound, v);
}

static void test_rss_verdict(void **state)
{
    (void)state;
    struct kvi_soak_rss v;
    /* flat after the warm-up (the warm-up itself may grow) */
    const uint64_t flat[] = {100, 500, 1000, 1020, 990, 1050, 1010, 1000};
    judge(flat, 8, 0.10, &v);
    assert_true(v.ok);
    assert_int_equal(v.after, 6);
    assert_int_equal(v.level_kb, 1000);
    assert_int_equal(v.max_after_kb, 1020);
    assert_int_equal(v.max_kb, 1050);
    /* steady growth after the warm-up fails, and the slope shows it */
    const uint64_t grow[] = {100, 500, 1000, 1030, 1060, 1090, 1120, 1150};
    judge(grow, 8, 0.10, &v);
    assert_false(v.ok);
    assert_int_equal(v.max_after_kb, 1150);
    assert_true(v.slope_kb_per_min > 300);
    /* one sample's peak is a burst, not growth; two in a row are a level */
    const uint64_t spike[] = {100, 500, 1000, 1010, 1400, 1000, 1010, 1000};
    judge(spike, 8, 0.10, &v);
    assert_true(v.ok);
    assert_int_equal(v.raw_max_after_kb, 1400);
    const uint64_t step[] = {100, 500, 1000, 1010, 1400, 1400, 1010, 1000};
    judge(step, 8, 0.10, &v);
    assert_false(v.ok);
    assert_int_equal(v.max_after_kb, 1400);
    /* the last sample (after the drain) counts as it is */
    const uint64_t end[] = {100, 500, 1000, 1010, 1000, 1010, 1000, 1400};
    judge(end, 8, 0.10, &v);
    assert_false(v.ok);
    /* a wider bound accepts it; too few samples after the warm-up never pass */
    judge(end, 8, 0.50, &v);
    assert_true(v.ok);
    judge(flat, 4, 0.10, &v);
    assert_int_equal(v.after, 2);
    assert_false(v.ok);
}

/* ---- a short soak against the real kvidxd ---------------------------------------------- */

static const char *kvidxd_path(void)
{
    const char *env = getenv("KVIDXD");
    if (env != NULL && access(env, X_OK) == 0)
        return env;
#ifdef KVIDXD_PATH
    if (access(KVIDXD_PATH, X_OK) == 0)
        return KVIDXD_PATH;
#endif
    static char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 32);
    if (n > 0) {
        buf[n] = '\0';
        char *slash = strrchr(buf, '/');
        if (slash != NULL) {
            strcpy(slash, "/../api/kvidxd");
            if (access(buf, X_OK) == 0)
                return buf;
        }
    }
    return NULL;
}

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif

static void test_short_soak(void **state)
{
    (void)state;
    const char *bin = kvidxd_path();
    assert_non_null(bin);
    struct kvi_soak_cfg cfg;
    kvi_soak_defaults(&cfg);
    cfg.kvidxd = bin;
    cfg.seconds = 12;
    cfg.trace = "synthetic";
    cfg.synth_requests = 1500; /* ~4 loops of 3 s: 1,500 requests and queries, ~5,000 events per loop */
    cfg.workers = 8;
    cfg.gpu_blocks = 256;      /* the pools fill within the first loop; from then on every admission evicts */
    cfg.loop_s = 3;
    cfg.rss_interval_s = 0.5;
    cfg.warmup_frac = 0.25;
    cfg.report_s = 4;
    /* 12 s of a ~24 MB kvidxd next to a parallel test suite: its RSS moves by a
     * few MB (allocator caches, ZMQ queues), so the bound is wider than the
     * soak's +10 %; the long soak (bench/soak.sh) is the leak detector, this
     * test checks that the machinery works end to end and its checks pass */
    cfg.rss_bound = 0.25;
#ifdef SANITIZED
    /* kvidxd is an ASan build too: freed memory waits in the allocator's
     * quarantine (256 MB by default) before reuse, so its RSS would climb
     * through the whole run. A small quarantine (kvidxd inherits the
     * environment) keeps the check meaningful; ASan's size-class caches
     * still take more room than jemalloc does. */
    const char *old = getenv("ASAN_OPTIONS");
    char opts[1024];
    snprintf(opts, sizeof opts, "%s%squarantine_size_mb=4", old ? old : "", old && old[0] ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    cfg.rss_bound = 0.50;
#endif
    cfg.log = stdout;
    struct kvi_soak_result *r = calloc(1, sizeof *r);
    assert_non_null(r);
    assert_int_equal(kvi_soak_run(&cfg, r), 0);
    kvi_soak_print_json(stdout, cfg.seconds / 60, r);
    /* the load really ran: several loops, stores and evictions, queries that hit */
    assert_true(r->loops_started >= 3);
    assert_true(r->queries > 1000);
    assert_true(r->hits > 0);
    assert_true(r->ev_stored > 1000);
    assert_true(r->ev_removed > 100);
    assert_true(r->model_blocks > 0);
    assert_true(r->rss_samples >= 10);
    /* the four checks */
    assert_true(r->kvidxd_alive);
    assert_int_equal(r->query_errors, 0);
    assert_int_equal(r->publish_errors, 0);
    assert_int_equal(r->k_lost, 0);
    assert_int_equal(r->k_bad, 0);
    assert_true(r->ok_errors);
    assert_true(r->ok_rss);
    assert_true(r->diff.equal);
    assert_int_equal(r->diff.matched, r->model_blocks);
    assert_true(r->engines_match);
    assert_true(r->ok_dump);
    assert_int_equal(r->k_ev_stored, r->ev_stored);
    assert_int_equal(r->k_ev_removed, r->ev_removed);
    assert_int_equal(r->k_ops_applied + r->k_ops_rejected, r->ev_stored + r->ev_removed);
    assert_int_equal(r->k_blocks_stored, r->model_applied_blocks);
    assert_true(r->ok_counters);
    assert_true(r->ok);
    free(r);
}

static void test_bad_config(void **state)
{
    (void)state;
    struct kvi_soak_cfg cfg;
    kvi_soak_defaults(&cfg);
    struct kvi_soak_result *r = calloc(1, sizeof *r);
    assert_non_null(r);
    assert_int_equal(kvi_soak_run(&cfg, r), -EINVAL); /* no kvidxd */
    cfg.kvidxd = "/nonexistent/kvidxd";
    cfg.block_size = 100; /* does not divide 512 */
    assert_int_equal(kvi_soak_run(&cfg, r), -EINVAL);
    cfg.block_size = 128;
    cfg.trace = "/nonexistent/trace.jsonl";
    assert_true(kvi_soak_run(&cfg, r) < 0);
    assert_non_null(strstr(r->first_error, "trace"));
    assert_false(r->ok);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_semantics),
        cmocka_unit_test(test_dump_equal),
        cmocka_unit_test(test_dump_missing_block),
        cmocka_unit_test(test_dump_extra_block),
        cmocka_unit_test(test_dump_wrong_parent),
        cmocka_unit_test(test_dump_malformed),
        cmocka_unit_test(test_rss_verdict),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_short_soak),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
