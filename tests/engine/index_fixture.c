/*
 * Definitions of index_fixture.h (where the contracts are): built once into
 * kvi_test_engine (tests/CMakeLists.txt).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "index_fixture.h"

int fx_failures;
int fx_printed;
const char *fx_test_name = "";
const struct fx_cfg *fx_cur_cfg;
struct kvi_match fx_out[FX_MAX_OUT], fx_out2[FX_MAX_OUT];
struct kvi_tier_match fx_tout[FX_MAX_OUT];

void fx_cfg_name(const struct fx_cfg *c, char *buf, size_t n)
{
    if (c == NULL) {
        snprintf(buf, n, "-");
        return;
    }
    char j[32];
    if (!c->set_jump)
        snprintf(j, sizeof j, "default(%u)", (unsigned)KVI_DEFAULT_JUMP);
    else if (c->jump == 0)
        snprintf(j, sizeof j, "0(end)");
    else
        snprintf(j, sizeof j, "%u", c->jump);
    snprintf(buf, n, "parts=%u jump=%s%s", c->n_parts, j, c->probe ? " +lower-tier probe" : "");
}

void fx_fail(int line, const char *fmt, ...)
{
    fx_failures++;
    if (++fx_printed > 60) {
        if (fx_printed == 61)
            print_error("  ... further failures not printed\n");
        return;
    }
    char cn[96], msg[768];
    fx_cfg_name(fx_cur_cfg, cn, sizeof cn);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    print_error("FAIL %s [%s] index_test.c:%d: %s\n", fx_test_name, cn, line, msg);
}

void fx_open(struct fx *f, const struct fx_cfg *c, uint32_t bs)
{
    struct kvi_index_config ic = {.block_size = bs, .n_parts = c->n_parts, .jump = c->jump, .key_seed = c->key_seed};
    if (!c->set_jump)
        ic.jump = 0;
    f->ix = kvi_index_create(&ic);
    assert_non_null(f->ix);
    if (c->set_jump)
        kvi_index_set_jump(f->ix, c->jump);
    f->cfg = c;
    f->bs = bs;
    f->tiered_same = true;
    f->probe = FX_ANY;
    if (c->probe) {
        int64_t p = kvi_index_intern_instance(f->ix, FX_PROBE_ID, NULL, false);
        assert_true(p >= 0);
        f->probe = (uint32_t)p;
        struct kvi_block b = {.engine_hash = 0x9999, .content_hash = FX_PROBE_CONTENT};
        assert_int_equal(kvi_index_store(f->ix, f->probe, 0, KVI_TIER_CPU, false, 0, &b, 1), 0);
    }
}

void fx_run(fx_scenario sc, const char *name, uint32_t bs)
{
    fx_failures = 0;
    fx_printed = 0;
    fx_test_name = name;
    for (size_t i = 0; i < FX_N_CFGS; i++) {
        struct fx f;
        fx_cur_cfg = &fx_cfgs[i];
        fx_open(&f, &fx_cfgs[i], bs);
        sc(&f);
        fx_close(&f);
    }
    fx_cur_cfg = NULL;
    if (fx_failures != 0)
        fail_msg("%s: %d check(s) failed (see FAIL lines above)", name, fx_failures);
}

uint32_t fx_inst(struct fx *f, uint64_t id, bool shared)
{
    int64_t d = kvi_index_intern_instance(f->ix, id, NULL, shared);
    assert_true(d >= 0);
    return (uint32_t)d;
}

uint64_t *fx_seqs(const uint64_t *chain, size_t n)
{
    uint64_t *s = malloc((n ? n : 1) * sizeof *s);
    assert_non_null(s);
    kvi_seq_hashes(chain, n, s);
    return s;
}

int fx_store_tier(struct fx *f, uint32_t w, uint32_t rank, enum kvi_tier tier, const uint64_t *chain,
                  size_t from, size_t to)
{
    uint64_t *s = fx_seqs(chain, to);
    size_t n = to - from;
    struct kvi_block *b = malloc((n ? n : 1) * sizeof *b);
    assert_non_null(b);
    for (size_t i = from; i < to; i++)
        b[i - from] = (struct kvi_block){.engine_hash = s[i], .content_hash = chain[i]};
    int rc = kvi_index_store(f->ix, w, rank, tier, from > 0, from > 0 ? s[from - 1] : 0, b, n);
    free(b);
    free(s);
    return rc;
}

int fx_store_eh(struct fx *f, uint32_t w, uint32_t rank, enum kvi_tier tier, const uint64_t *chain,
                const uint64_t *eh, size_t from, size_t to)
{
    size_t n = to - from;
    struct kvi_block *b = malloc((n ? n : 1) * sizeof *b);
    assert_non_null(b);
    for (size_t i = from; i < to; i++)
        b[i - from] = (struct kvi_block){.engine_hash = eh[i], .content_hash = chain[i]};
    int rc = kvi_index_store(f->ix, w, rank, tier, from > 0, from > 0 ? eh[from - 1] : 0, b, n);
    free(b);
    return rc;
}

size_t fx_remove_tier(struct fx *f, uint32_t w, uint32_t rank, enum kvi_tier tier, const uint64_t *chain,
                      size_t from, size_t to, bool reverse)
{
    uint64_t *s = fx_seqs(chain, to);
    size_t n = to - from;
    uint64_t *h = malloc((n ? n : 1) * sizeof *h);
    assert_non_null(h);
    for (size_t i = 0; i < n; i++)
        h[i] = reverse ? s[to - 1 - i] : s[from + i];
    size_t known = kvi_index_remove(f->ix, w, rank, tier, h, n);
    free(h);
    free(s);
    return known;
}

int fx_cmp_match(const void *a, const void *b)
{
    const struct kvi_match *x = a, *y = b;
    return (x->slot > y->slot) - (x->slot < y->slot);
}

void fx_expect(struct fx *f, int line, const uint64_t *q, size_t n, const struct fx_exp *e, size_t ne)
{
    size_t cnt = fx_find(f->ix, q, n, fx_out, FX_MAX_OUT);
    FX_CHECK(line, cnt == ne, "find_matches(n=%zu): %zu matches, expected %zu", n, cnt, ne);
    if (cnt != ne) {
        fx_print_matches("got", fx_out, FX_MIN(cnt, FX_MAX_OUT));
        for (size_t i = 0; i < ne && i < 40; i++)
            print_error("    expected: instance %u rank %u depth %u tree %d\n", e[i].inst, e[i].rank, e[i].depth,
                         e[i].tree == FX_ANY ? -1 : (int)e[i].tree);
    }
    cnt = FX_MIN(cnt, FX_MAX_OUT);
    bool seen[256] = {false};
    assert_true(ne <= 256);
    for (size_t i = 0; i < cnt; i++) {
        const struct kvi_match *m = &fx_out[i];
        struct kvi_slot_info si;
        kvi_rcu_read_lock();
        int rc = kvi_index_slot_info(f->ix, m->slot, &si);
        kvi_rcu_read_unlock();
        FX_CHECK(line, rc == 0, "slot_info(%u) = %d", m->slot, rc);
        if (rc == 0) {
            FX_CHECK(line, si.tier == KVI_TIER_GPU, "match slot %u is on tier %d", m->slot, (int)si.tier);
            FX_CHECK(line, si.instance == m->instance && si.dp_rank == m->dp_rank,
                     "slot %u is (%u,%u), match says (%u,%u)", m->slot, si.instance, si.dp_rank, m->instance,
                     m->dp_rank);
        }
        for (size_t j = 0; j < i; j++)
            FX_CHECK(line, fx_out[j].slot != m->slot && (fx_out[j].instance != m->instance || fx_out[j].dp_rank != m->dp_rank),
                     "duplicate match for instance %u rank %u", m->instance, m->dp_rank);
        size_t k = 0;
        while (k < ne && (e[k].inst != m->instance || e[k].rank != m->dp_rank))
            k++;
        FX_CHECK(line, k < ne, "unexpected match: instance %u rank %u depth %u tree %u (query n=%zu)", m->instance,
                 m->dp_rank, m->depth, m->tree_size, n);
        if (k == ne)
            continue;
        seen[k] = true;
        FX_CHECK(line, m->depth == e[k].depth, "instance %u rank %u: depth %u, expected %u (query n=%zu)",
                 m->instance, m->dp_rank, m->depth, e[k].depth, n);
        if (e[k].tree != FX_ANY)
            FX_CHECK(line, m->tree_size == e[k].tree, "instance %u rank %u: match tree_size %u, expected %u",
                     m->instance, m->dp_rank, m->tree_size, e[k].tree);
        uint32_t ts = kvi_index_tree_size(f->ix, m->instance, m->dp_rank);
        FX_CHECK(line, ts == m->tree_size, "instance %u rank %u: kvi_index_tree_size %u != match tree_size %u",
                 m->instance, m->dp_rank, ts, m->tree_size);
    }
    for (size_t k = 0; k < ne; k++)
        FX_CHECK(line, seen[k], "missing match: instance %u rank %u depth %u (query n=%zu)", e[k].inst, e[k].rank,
                 e[k].depth, n);

    /* by_seq must agree with the content query */
    uint64_t *s = fx_seqs(q, n);
    size_t cnt2 = fx_find_seq(f->ix, s, n, fx_out2, FX_MAX_OUT);
    size_t c1 = FX_MIN(fx_find(f->ix, q, n, fx_out, FX_MAX_OUT), FX_MAX_OUT);
    cnt2 = FX_MIN(cnt2, FX_MAX_OUT);
    qsort(fx_out, c1, sizeof *fx_out, fx_cmp_match);
    qsort(fx_out2, cnt2, sizeof *fx_out2, fx_cmp_match);
    bool same = c1 == cnt2;
    for (size_t i = 0; same && i < c1; i++)
        same = fx_out[i].slot == fx_out2[i].slot && fx_out[i].instance == fx_out2[i].instance &&
               fx_out[i].dp_rank == fx_out2[i].dp_rank && fx_out[i].depth == fx_out2[i].depth &&
               fx_out[i].tree_size == fx_out2[i].tree_size;
    FX_CHECK(line, same, "find_matches_by_seq differs from find_matches (n=%zu)", n);
    if (!same) {
        fx_print_matches("content", fx_out, c1);
        fx_print_matches("by_seq", fx_out2, cnt2);
    }

    if (f->tiered_same) {
        for (int mode = 0; mode < 2; mode++) {
            size_t tc = fx_tiered(f->ix, mode == 0 ? q : NULL, mode == 0 ? NULL : s, n, fx_tout, FX_MAX_OUT);
            FX_CHECK(line, tc == ne, "find_tiered(by %s, n=%zu): %zu results, expected %zu",
                     mode == 0 ? "content" : "seq", n, tc, ne);
            tc = FX_MIN(tc, FX_MAX_OUT);
            for (size_t i = 0; i < tc; i++) {
                const struct kvi_tier_match *t = &fx_tout[i];
                size_t k = 0;
                while (k < ne && (e[k].inst != t->instance || e[k].rank != t->dp_rank))
                    k++;
                FX_CHECK(line, k < ne, "find_tiered(by %s): unexpected instance %u rank %u",
                         mode == 0 ? "content" : "seq", t->instance, t->dp_rank);
                if (k == ne)
                    continue;
                FX_CHECK(line, t->gpu == e[k].depth && t->cpu == e[k].depth && t->disk == e[k].depth,
                         "find_tiered(by %s) instance %u rank %u: %u/%u/%u, expected %u/%u/%u",
                         mode == 0 ? "content" : "seq", t->instance, t->dp_rank, t->gpu, t->cpu, t->disk,
                         e[k].depth, e[k].depth, e[k].depth);
                if (e[k].tree != FX_ANY)
                    FX_CHECK(line, t->tree_size == e[k].tree, "find_tiered instance %u rank %u: tree %u, expected %u",
                             t->instance, t->dp_rank, t->tree_size, e[k].tree);
            }
        }
    }
    free(s);
}

void fx_expect_tiered_mode(struct fx *f, int line, const uint64_t *content, const uint64_t *seq, size_t n,
                           const struct fx_texp *e, size_t ne)
{
    const char *mode = content ? "content" : "seq";
    size_t tc = fx_tiered(f->ix, content, seq, n, fx_tout, FX_MAX_OUT);
    FX_CHECK(line, tc == ne, "find_tiered(by %s, n=%zu): %zu results, expected %zu", mode, n, tc, ne);
    tc = FX_MIN(tc, FX_MAX_OUT);
    bool seen[64] = {false};
    assert_true(ne <= 64);
    bool bad = tc != ne;
    for (size_t i = 0; i < tc; i++) {
        const struct kvi_tier_match *t = &fx_tout[i];
        size_t k = 0;
        while (k < ne && (e[k].inst != t->instance || e[k].rank != t->dp_rank))
            k++;
        if (k == ne) {
            fx_fail(line, "find_tiered(by %s): unexpected instance %u rank %u (%u/%u/%u)", mode, t->instance,
                    t->dp_rank, t->gpu, t->cpu, t->disk);
            bad = true;
            continue;
        }
        FX_CHECK(line, !seen[k], "find_tiered(by %s): instance %u rank %u reported twice", mode, t->instance,
                 t->dp_rank);
        seen[k] = true;
        if (t->gpu != e[k].gpu || t->cpu != e[k].cpu || t->disk != e[k].disk) {
            fx_fail(line, "find_tiered(by %s) instance %u rank %u: gpu/cpu/disk = %u/%u/%u, expected %u/%u/%u", mode,
                    t->instance, t->dp_rank, t->gpu, t->cpu, t->disk, e[k].gpu, e[k].cpu, e[k].disk);
            bad = true;
        }
        if (e[k].tree != FX_ANY)
            FX_CHECK(line, t->tree_size == e[k].tree, "find_tiered(by %s) instance %u rank %u: tree %u, expected %u",
                     mode, t->instance, t->dp_rank, t->tree_size, e[k].tree);
    }
    for (size_t k = 0; k < ne; k++)
        if (!seen[k]) {
            fx_fail(line, "find_tiered(by %s): missing instance %u rank %u (expected %u/%u/%u)", mode, e[k].inst,
                    e[k].rank, e[k].gpu, e[k].cpu, e[k].disk);
            bad = true;
        }
    if (bad)
        fx_print_tmatches(mode, fx_tout, tc);
}

uint64_t fx_pub(const struct kvi_index *ix, uint32_t inst, bool *shared)
{
    uint64_t id = 0;
    const char *name = NULL;
    bool sh = false;
    int rc = kvi_index_instance_info((struct kvi_index *)ix, inst, &id, &name, &sh);
    assert_int_equal(rc, 0);
    assert_null(name); /* the tests use numeric ids only */
    if (shared)
        *shared = sh;
    return id;
}

int fx_cmp_tuple(const void *a, const void *b)
{
    const struct fx_tuple *x = a, *y = b;
#define FX_C(fld)                                                                                  \
    if (x->fld != y->fld)                                                                          \
        return x->fld < y->fld ? -1 : 1;
    FX_C(id) FX_C(rank) FX_C(tier) FX_C(eh) FX_C(ch) FX_C(has_parent) FX_C(peh) FX_C(pos) FX_C(seq) FX_C(shared)
    FX_C(no_content)
#undef FX_C
    return 0;
}

void fx_dump_emit(void *ctx, const struct kvi_dump_block *b)
{
    struct fx_snap *s = ctx;
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->t = realloc(s->t, s->cap * sizeof *s->t);
        s->raw = realloc(s->raw, s->cap * sizeof *s->raw);
        assert_non_null(s->t);
        assert_non_null(s->raw);
    }
    /* parents before children: the parent (same instance and rank, any tier
     * for a lower-tier block, gpu for a gpu block) was emitted earlier, one
     * position up; an (instance, rank)'s blocks come in position order */
    if (b->has_parent) {
        bool found = false;
        for (size_t i = s->n; i-- > 0 && !found;) {
            const struct kvi_dump_block *p = &s->raw[i];
            if (p->instance == b->instance && p->dp_rank == b->dp_rank && p->engine_hash == b->parent_engine_hash &&
                (b->tier != KVI_TIER_GPU || p->tier == KVI_TIER_GPU)) {
                found = true;
                FX_CHECK(s->line, p->position + 1 == b->position,
                         "dump: block %" PRIx64 " at position %u, its parent at %u", b->engine_hash, b->position,
                         p->position);
            }
        }
        if (!found) {
            s->order_errors++;
            fx_fail(s->line, "dump: block eh %" PRIx64 " (instance %u rank %u tier %d pos %u) emitted before its parent %" PRIx64,
                    b->engine_hash, b->instance, b->dp_rank, (int)b->tier, b->position, b->parent_engine_hash);
        }
    } else if (b->tier == KVI_TIER_GPU) {
        FX_CHECK(s->line, b->position == 0, "dump: gpu block %" PRIx64 " at position %u has no parent",
                 b->engine_hash, b->position);
    }
    /* within an (instance, rank), blocks come in position order across tiers */
    for (size_t i = 0; i < s->n; i++)
        if (s->raw[i].instance == b->instance && s->raw[i].dp_rank == b->dp_rank && s->raw[i].position > b->position) {
            s->order_errors++;
            fx_fail(s->line, "dump: block at position %u after position %u of instance %u rank %u", b->position,
                    s->raw[i].position, b->instance, b->dp_rank);
            break;
        }
    s->raw[s->n] = *b;
    bool sh = false;
    s->t[s->n] = (struct fx_tuple){
        .id = fx_pub(s->ix, b->instance, &sh),
        .shared = sh,
        .rank = b->dp_rank,
        .tier = (uint32_t)b->tier,
        .has_parent = b->has_parent,
        .eh = b->engine_hash,
        .ch = b->content_hash,
        .peh = b->has_parent ? b->parent_engine_hash : 0,
        .pos = b->position,
        .seq = b->seq_hash,
        .no_content = b->no_content,
    };
    FX_CHECK(s->line, !b->no_content || b->content_hash == 0, "dump: block %" PRIx64 " without content has content %" PRIx64,
             b->engine_hash, b->content_hash);
    s->n++;
}

void fx_snapshot(struct kvi_index *ix, int line, struct fx_snap *s)
{
    memset(s, 0, sizeof *s);
    s->ix = ix;
    s->line = line;
    for (uint32_t p = 0; p < kvi_index_n_parts(ix); p++)
        kvi_index_dump_partition(ix, p, fx_dump_emit, s);
    if (s->n > 0)
        qsort(s->t, s->n, sizeof *s->t, fx_cmp_tuple);
    for (size_t i = 1; i < s->n; i++)
        FX_CHECK(line, !(s->t[i].id == s->t[i - 1].id && s->t[i].rank == s->t[i - 1].rank &&
                         s->t[i].tier == s->t[i - 1].tier && s->t[i].eh == s->t[i - 1].eh),
                 "dump: engine hash %" PRIx64 " listed twice for worker %" PRIu64 " rank %u tier %u", s->t[i].eh,
                 s->t[i].id, s->t[i].rank, s->t[i].tier);
}

bool fx_snap_equal(int line, const struct fx_snap *a, const struct fx_snap *b, const char *what)
{
    size_t i = 0;
    while (i < a->n && i < b->n && fx_cmp_tuple(&a->t[i], &b->t[i]) == 0)
        i++;
    if (i == a->n && i == b->n)
        return true;
    fx_fail(line, "snapshots differ (%s): %zu vs %zu blocks, first difference at sorted index %zu", what, a->n, b->n,
            i);
    if (i < a->n)
        fx_print_tuple("left ", &a->t[i]);
    if (i < b->n)
        fx_print_tuple("right", &b->t[i]);
    return false;
}

void fx_replay(const struct fx_snap *s, struct kvi_index *dst, int line)
{
    /* intern the source's instances in its dense order first: the same dense
     * ids give the same partitions, and so the same entry sharing (which
     * decides whether a block placed without tokens knows its content) */
    uint64_t pid;
    bool psh;
    for (uint32_t d = 0; kvi_index_instance_info((struct kvi_index *)s->ix, d, &pid, NULL, &psh) == 0; d++)
        assert_true(kvi_index_intern_instance(dst, pid, NULL, psh) >= 0);
    for (size_t i = 0; i < s->n; i++) {
        const struct kvi_dump_block *b = &s->raw[i];
        bool sh = false;
        uint64_t id = fx_pub(s->ix, b->instance, &sh);
        int64_t d = kvi_index_intern_instance(dst, id, NULL, sh);
        assert_true(d >= 0);
        struct kvi_block blk = {.engine_hash = b->engine_hash, .content_hash = b->content_hash};
        int rc;
        if (b->no_content)
            rc = kvi_index_store_seq_only(dst, (uint32_t)d, b->dp_rank, b->tier, b->has_parent, b->parent_engine_hash,
                                          b->has_parent ? 0 : b->position, &b->engine_hash, &b->seq_hash, 1);
        else if (b->has_parent)
            rc = kvi_index_store(dst, (uint32_t)d, b->dp_rank, b->tier, true, b->parent_engine_hash, &blk, 1);
        else if (b->position == 0)
            rc = kvi_index_store(dst, (uint32_t)d, b->dp_rank, b->tier, false, 0, &blk, 1);
        else
            rc = kvi_index_store_seq(dst, (uint32_t)d, b->dp_rank, b->tier, false, 0, b->position, &blk,
                                     &b->seq_hash, 1);
        FX_CHECK(line, rc == 0, "replay of block eh %" PRIx64 " (worker %" PRIu64 " rank %u tier %d pos %u) = %d",
                 b->engine_hash, id, b->dp_rank, (int)b->tier, b->position, rc);
    }
}

int fx_cmp_norm(const void *x, const void *y)
{
    const struct fx_norm *p = x, *q = y;
    if (p->id != q->id)
        return p->id < q->id ? -1 : 1;
    return (p->rank > q->rank) - (p->rank < q->rank);
}

size_t fx_norm_query(const struct kvi_index *ix, int kind, const uint64_t *q, size_t n,
                     struct fx_norm *out)
{
    uint64_t *s = fx_seqs(q, n);
    size_t m = 0;
    if (kind == 0 || kind == 1) {
        size_t c = kind == 0 ? fx_find(ix, q, n, fx_out, FX_MAX_OUT) : fx_find_seq(ix, s, n, fx_out, FX_MAX_OUT);
        c = FX_MIN(c, FX_MAX_OUT);
        for (size_t i = 0; i < c; i++)
            out[m++] = (struct fx_norm){fx_pub(ix, fx_out[i].instance, NULL), fx_out[i].dp_rank, fx_out[i].depth, 0,
                                        0, fx_out[i].tree_size};
    } else {
        size_t c = fx_tiered(ix, kind == 2 ? q : NULL, kind == 2 ? NULL : s, n, fx_tout, FX_MAX_OUT);
        c = FX_MIN(c, FX_MAX_OUT);
        for (size_t i = 0; i < c; i++)
            out[m++] = (struct fx_norm){fx_pub(ix, fx_tout[i].instance, NULL), fx_tout[i].dp_rank, fx_tout[i].gpu,
                                        fx_tout[i].cpu, fx_tout[i].disk, fx_tout[i].tree_size};
    }
    free(s);
    qsort(out, m, sizeof *out, fx_cmp_norm);
    return m;
}

bool fx_same_answers(int line, const struct kvi_index *a, const struct kvi_index *b, const uint64_t *q,
                     size_t n)
{
    bool all = true;
    static struct fx_norm na[FX_MAX_OUT], nb[FX_MAX_OUT];
    static const char *kinds[] = {"find_matches", "find_matches_by_seq", "find_tiered(content)", "find_tiered(seq)"};
    for (int kind = 0; kind < 4; kind++) {
        size_t ma = fx_norm_query(a, kind, q, n, na);
        size_t mb = fx_norm_query(b, kind, q, n, nb);
        bool same = ma == mb;
        for (size_t i = 0; same && i < ma; i++)
            same = na[i].id == nb[i].id && na[i].rank == nb[i].rank && na[i].a == nb[i].a && na[i].b == nb[i].b &&
                   na[i].c == nb[i].c && na[i].tree == nb[i].tree;
        FX_CHECK(line, same, "%s(n=%zu) differs between the original and the replayed index (%zu vs %zu results)",
                 kinds[kind], n, ma, mb);
        if (!same) {
            all = false;
            for (size_t i = 0; i < ma && i < 20; i++)
                print_error("    original: worker %" PRIu64 " rank %u %u/%u/%u tree %u\n", na[i].id, na[i].rank,
                            na[i].a, na[i].b, na[i].c, na[i].tree);
            for (size_t i = 0; i < mb && i < 20; i++)
                print_error("    replayed: worker %" PRIu64 " rank %u %u/%u/%u tree %u\n", nb[i].id, nb[i].rank,
                            nb[i].a, nb[i].b, nb[i].c, nb[i].tree);
        }
    }
    return all;
}

void fx_round_trip(struct fx *f, int line, const struct fx_q *qs, size_t nq)
{
    struct fx_snap a, b;
    fx_snapshot(f->ix, line, &a);
    FX_CHECK(line, a.order_errors == 0, "dump order: %d violation(s)", a.order_errors);
    struct fx g;
    fx_open(&g, f->cfg, f->bs);
    /* the probe instance (if any) is in the dump too: the fresh index gets its
     * own copy from fx_open, and replaying it again is idempotent; a scenario
     * that dropped its probe gets a fresh index without one */
    if (f->probe == FX_ANY && g.probe != FX_ANY) {
        kvi_index_remove_instance(g.ix, g.probe);
        fx_reclaim_all(&g);
        g.probe = FX_ANY;
    }
    fx_replay(&a, g.ix, line);
    fx_snapshot(g.ix, line, &b);
    fx_snap_equal(line, &a, &b, "dump -> replay");
    for (size_t i = 0; i < nq; i++) /* every prefix length; report the first difference of each query */
        for (size_t len = 1; len <= qs[i].n; len++)
            if (!fx_same_answers(line, f->ix, g.ix, qs[i].q, len))
                break;
    fx_snap_free(&b);
    fx_snap_free(&a);
    fx_close(&g);
}
