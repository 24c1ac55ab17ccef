/*
 * The brute-force index model and its workload generator (index_model.h,
 * where every function's contract is): built once into kvi_test_engine
 * (tests/CMakeLists.txt) and linked into the engine tests.
 */
#include "index_model.h"

void *km_grow(void *p, size_t elem, uint32_t *cap, uint32_t need)
{
    if (need <= *cap)
        return p;
    uint32_t nc = *cap ? *cap : 16;
    while (nc < need)
        nc *= 2;
    p = realloc(p, (size_t)nc * elem);
    if (p == NULL)
        abort();
    *cap = nc;
    return p;
}

bool km_map_find(const struct km_map *mp, uint64_t key, uint32_t *at)
{
    if (mp->cap == 0)
        return false;
    for (uint32_t i = km_map_home(mp, key);; i = (i + 1) & (mp->cap - 1)) {
        if (!mp->used[i])
            return false;
        if (mp->k[i] == key) {
            *at = i;
            return true;
        }
    }
}

void km_map_rehash(struct km_map *mp, uint32_t cap)
{
    struct km_map old = *mp;
    mp->cap = cap;
    mp->n = 0;
    mp->k = km_alloc((size_t)cap * sizeof(uint64_t));
    mp->v = km_alloc((size_t)cap * sizeof(uint64_t));
    mp->used = km_alloc(cap);
    for (uint32_t i = 0; i < old.cap; i++)
        if (old.used[i])
            km_map_put(mp, old.k[i], old.v[i]);
    km_map_free(&old);
}

void km_map_put(struct km_map *mp, uint64_t key, uint64_t val)
{
    uint32_t i;
    if (km_map_find(mp, key, &i)) {
        mp->v[i] = val;
        return;
    }
    if ((uint64_t)(mp->n + 1) * 2 > mp->cap)
        km_map_rehash(mp, mp->cap ? mp->cap * 2 : 16);
    for (i = km_map_home(mp, key); mp->used[i]; i = (i + 1) & (mp->cap - 1)) {
    }
    mp->used[i] = 1;
    mp->k[i] = key;
    mp->v[i] = val;
    mp->n++;
}

bool km_map_del(struct km_map *mp, uint64_t key)
{
    uint32_t i;
    if (!km_map_find(mp, key, &i))
        return false;
    mp->used[i] = 0;
    mp->n--;
    uint32_t mask = mp->cap - 1;
    for (uint32_t j = (i + 1) & mask; mp->used[j]; j = (j + 1) & mask) {
        uint32_t h = km_map_home(mp, mp->k[j]);
        bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
        if (stays)
            continue;
        mp->k[i] = mp->k[j];
        mp->v[i] = mp->v[j];
        mp->used[i] = 1;
        mp->used[j] = 0;
        i = j;
    }
    return true;
}

void km_map_clone(struct km_map *dst, const struct km_map *src)
{
    *dst = *src;
    if (src->cap == 0)
        return;
    dst->k = km_alloc((size_t)src->cap * sizeof(uint64_t));
    dst->v = km_alloc((size_t)src->cap * sizeof(uint64_t));
    dst->used = km_alloc(src->cap);
    memcpy(dst->k, src->k, (size_t)src->cap * sizeof(uint64_t));
    memcpy(dst->v, src->v, (size_t)src->cap * sizeof(uint64_t));
    memcpy(dst->used, src->used, src->cap);
}

void km_init(struct km_model *m, uint32_t n_instances)
{
    memset(m, 0, sizeof *m);
    m->n_instances = n_instances;
    m->pf = km_grow(NULL, sizeof *m->pf, &m->cap_pf, 1024);
    m->pf[0] = (struct km_pfx){.parent = KM_ROOT, .pos = UINT32_MAX};
    m->n_pf = 1;
    m->pf_tab_cap = 2048;
    m->pf_tab = km_alloc(m->pf_tab_cap * sizeof(uint32_t));
}

void km_free(struct km_model *m)
{
    for (uint32_t i = 0; i < m->n_slots; i++) {
        km_map_free(&m->slots[i].by_pid);
        km_map_free(&m->slots[i].by_eh);
        km_map_free(&m->slots[i].roots);
    }
    km_map_free(&m->pf_by_seq);
    free(m->slots);
    free(m->pf);
    free(m->pf_tab);
    memset(m, 0, sizeof *m);
}

uint32_t km_lookup(const struct km_model *m, uint32_t parent, uint64_t content)
{
    for (uint32_t i = km_pf_home(m, parent, content);; i = (i + 1) & (m->pf_tab_cap - 1)) {
        uint32_t id = m->pf_tab[i];
        if (id == 0)
            return KM_ROOT;
        if (m->pf[id].parent == parent && m->pf[id].content == content)
            return id;
    }
}

uint32_t km_intern(struct km_model *m, uint32_t parent, uint64_t content)
{
    uint32_t id = km_lookup(m, parent, content);
    if (id != KM_ROOT)
        return id;
    if ((uint64_t)(m->n_pf + 1) * 2 > m->pf_tab_cap) {
        free(m->pf_tab);
        m->pf_tab_cap *= 2;
        m->pf_tab = km_alloc(m->pf_tab_cap * sizeof(uint32_t));
        for (uint32_t j = 1; j < m->n_pf; j++) {
            uint32_t i = km_pf_home(m, m->pf[j].parent, m->pf[j].content);
            while (m->pf_tab[i] != 0)
                i = (i + 1) & (m->pf_tab_cap - 1);
            m->pf_tab[i] = j;
        }
    }
    m->pf = km_grow(m->pf, sizeof *m->pf, &m->cap_pf, m->n_pf + 1);
    id = m->n_pf++;
    const struct km_pfx *pp = &m->pf[parent];
    m->pf[id] = (struct km_pfx){
        .parent = parent,
        .pos = parent == KM_ROOT ? 0 : pp->pos + 1,
        .content = content,
        .seq = parent == KM_ROOT ? content : kvi_seq_hash_next(pp->seq, content),
    };
    uint32_t i = km_pf_home(m, parent, content);
    while (m->pf_tab[i] != 0)
        i = (i + 1) & (m->pf_tab_cap - 1);
    m->pf_tab[i] = id;
    if (!km_map_get(&m->pf_by_seq, m->pf[id].seq, NULL))
        km_map_put(&m->pf_by_seq, m->pf[id].seq, id);
    return id;
}

bool km_is_ancestor(const struct km_model *m, uint32_t anc, uint32_t id)
{
    if (anc == KM_ROOT)
        return id != KM_ROOT;
    while (id != KM_ROOT) {
        id = m->pf[id].parent;
        if (id == anc)
            return true;
    }
    return false;
}

struct km_slot *km_slot_create(struct km_model *m, uint32_t inst, uint32_t rank, enum kvi_tier tier)
{
    m->slots = km_grow(m->slots, sizeof *m->slots, &m->cap_slots, m->n_slots + 1);
    struct km_slot *s = &m->slots[m->n_slots++];
    memset(s, 0, sizeof *s);
    s->instance = inst;
    s->rank = rank;
    s->tier = tier;
    m->st.slots++;
    return s;
}

void km_block_drop(struct km_model *m, struct km_slot *s, uint32_t pid)
{
    uint64_t eh;
    if (!km_map_get(&s->by_pid, pid, &eh))
        abort();
    km_map_del(&s->by_pid, pid);
    km_map_del(&s->by_eh, eh);
    km_map_del(&s->roots, pid);
    m->st.holdings--;
    m->st.removed_blocks++;
}

void km_remove_cascade(struct km_model *m, struct km_slot *s, uint32_t pid)
{
    uint32_t n = 0, *victims = km_alloc(((size_t)s->by_pid.n + 1) * sizeof(uint32_t));
    for (uint32_t i = 0; i < s->by_pid.cap; i++)
        if (s->by_pid.used[i]) {
            uint32_t b = (uint32_t)s->by_pid.k[i];
            if (b == pid || km_is_descendant_in_slot(m, s, pid, b))
                victims[n++] = b;
        }
    for (uint32_t i = 0; i < n; i++)
        km_block_drop(m, s, victims[i]);
    free(victims);
}

uint32_t km_resolve_parent(const struct km_model *m, uint32_t inst, uint32_t rank, enum kvi_tier tier,
                           uint64_t peh)
{
    uint64_t pid;
    const struct km_slot *s = km_slot_find(m, inst, rank, tier);
    if (s != NULL && km_map_get(&s->by_eh, peh, &pid))
        return (uint32_t)pid;
    if (tier == KVI_TIER_GPU)
        return KM_ROOT;
    for (uint32_t i = 0; i < m->n_slots; i++) {
        const struct km_slot *o = &m->slots[i];
        if (o != s && o->instance == inst && o->rank == rank && km_map_get(&o->by_eh, peh, &pid))
            return (uint32_t)pid;
    }
    return KM_ROOT;
}

bool km_run_invalid(bool has_parent, uint64_t peh, const struct kvi_block *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (has_parent && b[i].engine_hash == peh)
            return true;
        for (size_t j = i + 1; j < n; j++)
            if (b[i].engine_hash == b[j].engine_hash)
                return true;
    }
    return false;
}

int km_store_any(struct km_model *m, uint32_t inst, uint32_t rank, enum kvi_tier tier, bool has_parent,
                 uint64_t peh, uint32_t position, const struct kvi_block *b, const uint64_t *seq,
                 size_t n)
{
    if (inst >= m->n_instances || (unsigned)tier >= KVI_TIER_COUNT)
        return -EINVAL;
    if (n == 0)
        return 0;
    if (km_run_invalid(has_parent, peh, b, n)) {
        m->st.invalid_events++;
        return -EINVAL;
    }
    uint32_t cur = KM_ROOT, placed = KM_ROOT;
    if (has_parent) {
        cur = km_resolve_parent(m, inst, rank, tier, peh);
        if (cur == KM_ROOT && seq != NULL && tier != KVI_TIER_GPU && position > 0) {
            has_parent = false; /* the rank does not hold the parent: placed by position */
            m->st.parent_elsewhere++;
        } else if (cur == KM_ROOT) {
            m->st.parent_not_found++;
            return -ENOENT;
        }
    }
    if (!has_parent && seq != NULL && position > 0) {
        if (tier == KVI_TIER_GPU) {
            m->st.invalid_events++;
            return -EINVAL;
        }
        placed = km_seq_pid(m, seq[0], position);
        if (placed == KM_ROOT || m->pf[placed].content != b[0].content_hash)
            abort(); /* the workload only places prefixes the model knows */
        m->pf[placed].placed = true;
    }
    struct km_slot *s = km_slot_find(m, inst, rank, tier);
    if (s == NULL)
        s = km_slot_create(m, inst, rank, tier);
    /* rollback copy for a rejected rename */
    struct km_map save_pid, save_eh, save_roots;
    struct kvi_index_stats save_st = m->st;
    km_map_clone(&save_pid, &s->by_pid);
    km_map_clone(&save_eh, &s->by_eh);
    km_map_clone(&save_roots, &s->roots);
    bool cur_in_slot = cur != KM_ROOT && km_holds(s, cur);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t pid = i == 0 && placed != KM_ROOT ? placed : km_intern(m, cur, b[i].content_hash);
        uint64_t have;
        if (km_map_get(&s->by_eh, b[i].engine_hash, &have)) {
            if ((uint32_t)have == pid) { /* idempotent */
                cur = pid;
                cur_in_slot = true;
                continue;
            }
            km_remove_cascade(m, s, (uint32_t)have); /* the name now means another block */
            if (cur_in_slot && !km_holds(s, cur)) {
                rc = -EINVAL;
                break;
            }
        }
        uint64_t old_eh;
        if (km_map_get(&s->by_pid, pid, &old_eh)) { /* same prefix, new name */
            km_map_del(&s->by_eh, old_eh);
            km_map_put(&s->by_pid, pid, b[i].engine_hash);
            km_map_put(&s->by_eh, b[i].engine_hash, pid);
        } else {
            km_block_add(m, s, pid, b[i].engine_hash);
            if (i == 0 && placed != KM_ROOT)
                km_map_put(&s->roots, pid, 1);
        }
        cur = pid;
        cur_in_slot = true;
    }
    if (rc != 0) {
        km_map_free(&s->by_pid);
        km_map_free(&s->by_eh);
        km_map_free(&s->roots);
        s->by_pid = save_pid;
        s->by_eh = save_eh;
        s->roots = save_roots;
        m->st = save_st;
        m->st.invalid_events++;
        m->cycles++;
    } else {
        km_map_free(&save_pid);
        km_map_free(&save_eh);
        km_map_free(&save_roots);
    }
    return rc;
}

uint32_t km_resolve_known(const struct km_model *m, uint32_t inst, uint32_t rank, uint64_t eh)
{
    for (int t = 0; t < KVI_TIER_COUNT; t++) {
        const struct km_slot *s = km_slot_find(m, inst, rank, (enum kvi_tier)t);
        uint64_t pid;
        if (s != NULL && km_map_get(&s->by_eh, eh, &pid))
            return (uint32_t)pid;
    }
    return KM_ROOT;
}

size_t km_store_known(struct km_model *m, uint32_t inst, uint32_t rank, enum kvi_tier tier,
                      const uint64_t *ehs, size_t n, size_t *unres)
{
    *unres = 0;
    if (inst >= m->n_instances || (unsigned)tier >= KVI_TIER_COUNT) {
        *unres = n;
        return 0;
    }
    uint64_t *order = km_alloc((n + 1) * sizeof(uint64_t));
    for (size_t i = 0; i < n; i++) { /* (position, index), sorted: stable by index */
        uint32_t pid = km_resolve_known(m, inst, rank, ehs[i]);
        order[i] = ((uint64_t)(pid == KM_ROOT ? 0 : m->pf[pid].pos) << 32) | i;
    }
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && order[j - 1] > order[j]; j--) {
            uint64_t t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    size_t held = 0;
    for (size_t k = 0; k < n; k++) {
        uint64_t eh = ehs[(uint32_t)order[k]];
        uint32_t pid = km_resolve_known(m, inst, rank, eh);
        if (pid == KM_ROOT) {
            (*unres)++;
            continue;
        }
        struct km_slot *s = km_slot_find(m, inst, rank, tier);
        uint64_t have;
        if (s != NULL && km_map_get(&s->by_eh, eh, &have)) {
            if ((uint32_t)have == pid) {
                held++;
                continue;
            }
            km_remove_cascade(m, s, (uint32_t)have);
        }
        bool root = false;
        const struct km_pfx *pf = &m->pf[pid];
        if (pf->parent != KM_ROOT) {
            bool linked = tier == KVI_TIER_GPU ? km_holds(s, pf->parent) : km_rank_holds(m, inst, rank, pf->parent);
            if (!linked && tier == KVI_TIER_GPU) {
                (*unres)++;
                continue;
            }
            root = !linked;
        }
        if (s == NULL)
            s = km_slot_create(m, inst, rank, tier);
        uint64_t old_eh;
        if (km_map_get(&s->by_pid, pid, &old_eh)) {
            km_map_del(&s->by_eh, old_eh);
            km_map_put(&s->by_pid, pid, eh);
            km_map_put(&s->by_eh, eh, pid);
        } else {
            km_block_add(m, s, pid, eh);
            if (root)
                km_map_put(&s->roots, pid, 1);
        }
        held++;
    }
    free(order);
    m->st.unknown_blocks += *unres;
    return held;
}

size_t km_remove(struct km_model *m, uint32_t inst, uint32_t rank, enum kvi_tier tier,
                 const uint64_t *ehs, size_t n)
{
    if (inst >= m->n_instances || (unsigned)tier >= KVI_TIER_COUNT)
        return 0;
    struct km_slot *s = km_slot_find(m, inst, rank, tier);
    if (s == NULL) {
        m->st.unknown_removes += n;
        return 0;
    }
    size_t known = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t pid;
        if (!km_map_get(&s->by_eh, ehs[i], &pid)) {
            m->st.unknown_removes++;
            continue;
        }
        known++;
        km_remove_cascade(m, s, (uint32_t)pid);
    }
    return known;
}

void km_drop(struct km_model *m, uint32_t inst, uint32_t rank, bool forget)
{
    if (inst >= m->n_instances)
        return;
    uint32_t j = 0;
    for (uint32_t i = 0; i < m->n_slots; i++) {
        struct km_slot *s = &m->slots[i];
        bool hit = s->instance == inst && (rank == UINT32_MAX || s->rank == rank);
        if (hit)
            km_slot_empty(m, s);
        if (hit && forget) {
            m->st.slots--;
            continue;
        }
        m->slots[j++] = *s;
    }
    m->n_slots = j;
}

size_t km_query_ids(const struct km_model *m, const uint64_t *q, size_t n, uint32_t *ids)
{
    uint32_t cur = KM_ROOT;
    for (size_t i = 0; i < n; i++) {
        cur = km_lookup(m, cur, q[i]);
        if (cur == KM_ROOT)
            return i;
        ids[i] = cur;
    }
    return n;
}

size_t km_match(const struct km_model *m, const uint64_t *q, size_t n, struct kvi_match *out)
{
    uint32_t *ids = km_alloc((n + 1) * sizeof(uint32_t));
    size_t known = km_query_ids(m, q, n, ids), count = 0;
    for (uint32_t i = 0; i < m->n_slots; i++) {
        const struct km_slot *s = &m->slots[i];
        if (s->tier != KVI_TIER_GPU)
            continue;
        uint32_t k = 0;
        while (k < known && km_holds(s, ids[k]))
            k++;
        if (k > 0)
            out[count++] = (struct kvi_match){.instance = s->instance, .dp_rank = s->rank, .depth = k,
                                              .tree_size = s->by_pid.n};
    }
    free(ids);
    if (count > 1)
        qsort(out, count, sizeof *out, km_cmp_match);
    return count;
}

int kd_cmp(const void *a, const void *b)
{
    const struct kvi_dump_block *x = a, *y = b;
#define KD_CMP(f)                                                                                                    \
    if (x->f != y->f)                                                                                                \
        return x->f < y->f ? -1 : 1;
    KD_CMP(instance)
    KD_CMP(dp_rank)
    KD_CMP(tier)
    KD_CMP(engine_hash)
    KD_CMP(content_hash)
    KD_CMP(has_parent)
    KD_CMP(parent_engine_hash)
    KD_CMP(position)
    KD_CMP(seq_hash)
#undef KD_CMP
    return 0;
}

void kd_print_rec(FILE *f, const char *tag, const struct kvi_dump_block *r)
{
    fprintf(f, "    %s inst %u rank %u %s pos %u eh %#" PRIx64 " content %#" PRIx64 " seq %#" PRIx64, tag,
            r->instance, r->dp_rank, kvi_tier_name(r->tier), r->position, r->engine_hash, r->content_hash,
            r->seq_hash);
    if (r->has_parent)
        fprintf(f, " parent %#" PRIx64 "\n", r->parent_engine_hash);
    else
        fprintf(f, " no parent\n");
}

void km_dump(const struct km_model *m, struct kd_set *out)
{
    for (uint32_t i = 0; i < m->n_slots; i++) {
        const struct km_slot *s = &m->slots[i];
        for (uint32_t j = 0; j < s->by_pid.cap; j++) {
            if (!s->by_pid.used[j])
                continue;
            uint32_t pid = (uint32_t)s->by_pid.k[j];
            const struct km_pfx *p = &m->pf[pid];
            struct kvi_dump_block r = {
                .instance = s->instance,
                .dp_rank = s->rank,
                .tier = s->tier,
                .position = p->pos,
                .engine_hash = s->by_pid.v[j],
                .content_hash = p->content,
                .seq_hash = p->seq,
            };
            if (p->parent != KM_ROOT && !km_map_get(&s->roots, pid, NULL)) {
                uint64_t peh;
                if (km_map_get(&s->by_pid, p->parent, &peh)) {
                    r.has_parent = true;
                    r.parent_engine_hash = peh;
                } else {
                    for (uint32_t tk = 0; tk < KVI_TIER_COUNT * m->n_slots && !r.has_parent; tk++) {
                        const struct km_slot *o = &m->slots[tk % m->n_slots];
                        if ((uint32_t)o->tier != tk / m->n_slots)
                            continue;
                        if (o != s && o->instance == s->instance && o->rank == s->rank &&
                            km_map_get(&o->by_pid, p->parent, &peh)) {
                            r.has_parent = true;
                            r.parent_engine_hash = peh;
                        }
                    }
                }
            }
            kd_push(out, &r);
        }
    }
}

void kw_corpus_build(struct kw_corpus *c, uint64_t seed, uint32_t n, uint32_t max_len, uint32_t n_long,
                     uint32_t long_len)
{
    struct kr_rng r = {seed};
    memset(c, 0, sizeof *c);
    c->lora_seed[0] = kvi_hash_seed(NULL, 0, NULL, 0);
    c->lora_seed[1] = kvi_hash_seed("adapter-a", 9, NULL, 0);
    c->lora_seed[2] = kvi_hash_seed("adapter-b", 9, NULL, 0);
    c->n = n;
    c->d = km_alloc(n * sizeof *c->d);
    for (uint32_t i = 0; i < n; i++) {
        struct kw_doc *d = &c->d[i];
        bool is_long = i >= n - n_long;
        uint32_t target = is_long ? long_len + kr_below(&r, 41) : 1 + kr_below(&r, max_len);
        uint32_t cut = 0;
        const struct kw_doc *from = NULL;
        if (i > 0 && kr_chance(&r, 750)) {
            from = &c->d[kr_below(&r, i)];
            cut = kr_below(&r, from->len + 1);
            if (target <= cut)
                target = cut + 1 + kr_below(&r, 8);
        }
        d->len = target;
        d->tok = km_alloc(target * sizeof(uint32_t));
        d->content = km_alloc(target * sizeof(uint64_t));
        if (from != NULL) {
            memcpy(d->tok, from->tok, cut * sizeof(uint32_t));
            d->lora = kr_chance(&r, 900) ? from->lora : kr_below(&r, KW_LORAS);
        } else {
            uint32_t x = kr_below(&r, 10);
            d->lora = x < 6 ? 0 : x < 8 ? 1 : 2;
        }
        for (uint32_t t = cut; t < target; t++)
            d->tok[t] = kw_token(&r);
        for (uint32_t t = 0; t < target; t++)
            d->content[t] = kw_content(c, d->tok[t], d->lora);
        if (target > c->max_len)
            c->max_len = target;
    }
}

const char *kw_kind_name(enum kw_kind k)
{
    switch (k) {
    case KW_STORE: return "store";
    case KW_REMOVE: return "remove";
    case KW_CLEAR: return "clear";
    case KW_REMOVE_RANK: return "remove_dp_rank";
    case KW_REMOVE_INSTANCE: return "remove_instance";
    case KW_STORE_KNOWN: return "store_known";
    case KW_CLEAR_RANK: return "clear_dp_rank";
    }
    return "?";
}

void kw_op_print(FILE *f, const struct kw_op *op)
{
    fprintf(f, "%s(%s) inst %u", kw_kind_name(op->kind), op->why ? op->why : "", op->inst);
    if (op->kind == KW_STORE || op->kind == KW_REMOVE || op->kind == KW_REMOVE_RANK || op->kind == KW_CLEAR_RANK)
        fprintf(f, " rank %u", op->rank);
    if (op->kind == KW_STORE || op->kind == KW_REMOVE || op->kind == KW_STORE_KNOWN)
        fprintf(f, " %s", kvi_tier_name(op->tier));
    if (op->kind == KW_STORE) {
        if (op->seq != NULL)
            fprintf(f, op->tokenless ? " (store_seq_only)" : " (store_seq)");
        if (op->has_parent)
            fprintf(f, " parent %#" PRIx64, op->peh);
        else if (op->seq != NULL && op->position > 0)
            fprintf(f, " placed at %u seq %#" PRIx64, op->position, op->seq[0]);
        else
            fprintf(f, " root");
    }
    if (op->kind == KW_STORE || op->kind == KW_REMOVE || op->kind == KW_STORE_KNOWN) {
        fprintf(f, " [");
        for (uint32_t i = 0; i < op->n; i++) {
            if (op->kind == KW_STORE)
                fprintf(f, "%s%#" PRIx64 ":%#" PRIx64, i ? " " : "", op->b[i].engine_hash, op->b[i].content_hash);
            else
                fprintf(f, "%s%#" PRIx64, i ? " " : "", op->b[i].engine_hash);
        }
        fprintf(f, "]");
    }
    fprintf(f, " -> %ld\n", op->rc);
}

void kw_op_copy(struct kw_op *dst, const struct kw_op *src)
{
    *dst = *src;
    dst->b = NULL;
    dst->seq = NULL;
    dst->above = NULL;
    if (src->above != NULL) {
        dst->above = km_alloc((src->position + 1) * sizeof *dst->above);
        memcpy(dst->above, src->above, src->position * sizeof *dst->above);
    }
    if (src->n) {
        dst->b = km_alloc(src->n * sizeof *dst->b);
        memcpy(dst->b, src->b, src->n * sizeof *dst->b);
    }
    if (src->seq != NULL) {
        dst->seq = km_alloc((src->n + 1) * sizeof *dst->seq);
        if (src->n)
            memcpy(dst->seq, src->seq, src->n * sizeof *dst->seq);
    }
}

long kw_apply_model(struct km_model *m, const struct kw_op *op)
{
    switch (op->kind) {
    case KW_STORE:
        if (op->above != NULL && op->n > 0) { /* make the placed prefix known to this model */
            uint32_t cur = KM_ROOT;
            for (uint32_t i = 0; i < op->position; i++)
                cur = km_intern(m, cur, op->above[i]);
            (void)km_intern(m, cur, op->b[0].content_hash);
        }
        return km_store_any(m, op->inst, op->rank, op->tier, op->has_parent, op->peh, op->position, op->b, op->seq,
                            op->n);
    case KW_REMOVE: {
        uint64_t *ehs = km_alloc((op->n + 1) * sizeof(uint64_t));
        for (uint32_t i = 0; i < op->n; i++)
            ehs[i] = op->b[i].engine_hash;
        long k = (long)km_remove(m, op->inst, op->rank, op->tier, ehs, op->n);
        free(ehs);
        return k;
    }
    case KW_CLEAR: km_clear(m, op->inst); return 0;
    case KW_CLEAR_RANK: km_clear_dp_rank(m, op->inst, op->rank); return 0;
    case KW_REMOVE_RANK: km_remove_dp_rank(m, op->inst, op->rank); return 0;
    case KW_REMOVE_INSTANCE: km_remove_instance(m, op->inst); return 0;
    case KW_STORE_KNOWN: {
        uint64_t *ehs = km_alloc((op->n + 1) * sizeof(uint64_t));
        for (uint32_t i = 0; i < op->n; i++)
            ehs[i] = op->b[i].engine_hash;
        size_t unres;
        long k = (long)km_store_known(m, op->inst, op->rank, op->tier, ehs, op->n, &unres);
        free(ehs);
        return k;
    }
    }
    return 0;
}

long kw_apply_index(struct kvi_index *ix, const struct kw_op *op)
{
    switch (op->kind) {
    case KW_STORE:
        if (op->seq != NULL && op->tokenless) {
            uint64_t *ehs = km_alloc((op->n + 1) * sizeof(uint64_t));
            for (uint32_t i = 0; i < op->n; i++)
                ehs[i] = op->b[i].engine_hash;
            long rc = kvi_index_store_seq_only(ix, op->inst, op->rank, op->tier, op->has_parent, op->peh,
                                               op->position, ehs, op->seq, op->n);
            free(ehs);
            return rc;
        }
        if (op->seq != NULL)
            return kvi_index_store_seq(ix, op->inst, op->rank, op->tier, op->has_parent, op->peh, op->position, op->b,
                                       op->seq, op->n);
        return kvi_index_store(ix, op->inst, op->rank, op->tier, op->has_parent, op->peh, op->b, op->n);
    case KW_REMOVE: {
        uint64_t *ehs = km_alloc((op->n + 1) * sizeof(uint64_t));
        for (uint32_t i = 0; i < op->n; i++)
            ehs[i] = op->b[i].engine_hash;
        long k = (long)kvi_index_remove(ix, op->inst, op->rank, op->tier, ehs, op->n);
        free(ehs);
        return k;
    }
    case KW_CLEAR: kvi_index_clear(ix, op->inst); return 0;
    case KW_CLEAR_RANK: kvi_index_clear_dp_rank(ix, op->inst, op->rank); return 0;
    case KW_REMOVE_RANK: kvi_index_remove_dp_rank(ix, op->inst, op->rank); return 0;
    case KW_REMOVE_INSTANCE: kvi_index_remove_instance(ix, op->inst); return 0;
    case KW_STORE_KNOWN: {
        uint64_t *ehs = km_alloc((op->n + 1) * sizeof(uint64_t));
        for (uint32_t i = 0; i < op->n; i++)
            ehs[i] = op->b[i].engine_hash;
        long k = (long)kvi_index_store_known(ix, op->inst, op->rank, op->tier, ehs, op->n, NULL);
        free(ehs);
        return k;
    }
    }
    return 0;
}

void kw_gen_init(struct kw_gen *g, uint64_t seed, const struct kw_corpus *corp, const uint32_t *inst,
                 uint32_t n_inst, uint32_t n_ranks, uint32_t n_valid)
{
    memset(g, 0, sizeof *g);
    g->rng.s = seed;
    g->corp = corp;
    g->inst = inst;
    g->n_inst = n_inst;
    g->n_hot = n_inst < 16 ? n_inst : 16;
    g->n_ranks = n_ranks;
    g->n_valid = n_valid;
    g->corners = true;
    g->placements = true;
    g->w_clear = 12;
    g->w_remove_rank = 8;
    g->w_remove_instance = 4;
}

void kw_gen_remember(struct kw_gen *g, const struct kw_op *op)
{
    struct kw_op *h = &g->hist[g->hist_at];
    if (g->n_hist == KW_HISTORY)
        kw_op_free(h);
    else
        g->n_hist++;
    kw_op_copy(h, op);
    g->hist_at = (g->hist_at + 1) % KW_HISTORY;
}

uint32_t kw_doc_held(struct km_model *m, const struct km_slot *s, const struct kw_doc *d, uint32_t *pids)
{
    uint32_t cur = KM_ROOT, held = 0;
    bool contiguous = true;
    for (uint32_t i = 0; i < d->len; i++) {
        cur = km_intern(m, cur, d->content[i]);
        pids[i] = cur;
        if (contiguous && km_holds(s, cur))
            held = i + 1;
        else
            contiguous = false;
    }
    return held;
}

bool kw_conflict(const struct km_model *m, uint32_t inst, uint32_t rank, enum kvi_tier tier, uint64_t eh,
                 uint32_t pid)
{
    const struct km_slot *s = km_slot_find(m, inst, rank, tier);
    uint64_t own;
    bool renames = s != NULL && km_map_get(&s->by_eh, eh, &own) && (uint32_t)own != pid;
    for (uint32_t i = 0; i < m->n_slots; i++) {
        const struct km_slot *o = &m->slots[i];
        uint64_t other;
        if (o == s || o->instance != inst || o->rank != rank || !km_map_get(&o->by_eh, eh, &other))
            continue;
        if ((uint32_t)other != pid || renames)
            return true;
    }
    return false;
}

bool kw_guard(struct kw_gen *g, struct km_model *m, struct kw_op *op, bool fix)
{
    if (op->kind != KW_STORE || op->inst >= m->n_instances || (unsigned)op->tier >= KVI_TIER_COUNT)
        return true;
    uint32_t cur = KM_ROOT;
    bool placed = false;
    if (op->has_parent) {
        cur = km_resolve_parent(m, op->inst, op->rank, op->tier, op->peh);
        if (cur == KM_ROOT)
            return true; /* -ENOENT: changes nothing */
    } else if (op->seq != NULL && op->position > 0) {
        if (op->tier == KVI_TIER_GPU)
            return true; /* -EINVAL */
        placed = true;
    }
    for (uint32_t i = 0; i < op->n; i++) {
        cur = i == 0 && placed ? km_seq_pid(m, op->seq[0], op->position) : km_intern(m, cur, op->b[i].content_hash);
        if (!kw_conflict(m, op->inst, op->rank, op->tier, op->b[i].engine_hash, cur))
            continue;
        if (!fix)
            return false;
        uint64_t fresh;
        bool clash;
        do { /* fresh and distinct from the run and its parent */
            fresh = kr_next(&g->rng);
            clash = op->has_parent && fresh == op->peh;
            for (uint32_t j = 0; j < op->n; j++)
                clash |= op->b[j].engine_hash == fresh;
        } while (clash);
        op->b[i].engine_hash = fresh;
    }
    return true;
}

void kw_fix_seqs(struct km_model *m, struct kw_op *op)
{
    if (op->kind != KW_STORE || op->seq == NULL || (!op->has_parent && op->position > 0) ||
        op->inst >= m->n_instances || (unsigned)op->tier >= KVI_TIER_COUNT)
        return;
    uint32_t cur = KM_ROOT;
    if (op->has_parent) {
        cur = km_resolve_parent(m, op->inst, op->rank, op->tier, op->peh);
        if (cur == KM_ROOT)
            return; /* -ENOENT */
    }
    for (uint32_t i = 0; i < op->n; i++) {
        cur = km_intern(m, cur, op->b[i].content_hash);
        op->seq[i] = m->pf[cur].seq;
    }
}

const struct km_slot *kw_random_slot(struct kw_gen *g, const struct km_model *m, bool gpu_only)
{
    for (int tries = 0; tries < 8; tries++) {
        uint32_t inst = kw_pick_inst(g);
        uint32_t cand[64], nc = 0;
        for (uint32_t i = 0; i < m->n_slots && nc < 64; i++)
            if (m->slots[i].instance == inst && m->slots[i].by_pid.n > 0 &&
                (!gpu_only || m->slots[i].tier == KVI_TIER_GPU))
                cand[nc++] = i;
        if (nc)
            return &m->slots[cand[kr_below(&g->rng, nc)]];
    }
    return NULL;
}

uint32_t kw_random_block(struct kw_gen *g, const struct km_slot *s, uint64_t *eh)
{
    uint32_t k = kr_below(&g->rng, s->by_pid.n);
    for (uint32_t i = 0; i < s->by_pid.cap; i++)
        if (s->by_pid.used[i] && k-- == 0) {
            *eh = s->by_pid.v[i];
            return (uint32_t)s->by_pid.k[i];
        }
    abort();
}

bool kw_holder_eh(const struct km_model *m, uint32_t inst, uint32_t rank, enum kvi_tier tier,
                  uint32_t pid, uint64_t *eh)
{
    const struct km_slot *s = km_slot_find(m, inst, rank, tier);
    if (s != NULL && km_map_get(&s->by_pid, pid, eh))
        return true;
    for (uint32_t i = 0; i < m->n_slots; i++) {
        const struct km_slot *o = &m->slots[i];
        if (o->instance == inst && o->rank == rank && km_map_get(&o->by_pid, pid, eh))
            return true;
    }
    return false;
}

void kw_gen_chain(struct kw_gen *g, struct km_model *m, struct kw_op *op, bool lower)
{
    uint32_t inst = kw_pick_inst(g), rank = kw_pick_rank(g);
    enum kvi_tier tier = lower ? kw_pick_lower_tier(g) : KVI_TIER_GPU;
    const struct kw_doc *d = &g->corp->d[kr_below(&g->rng, g->corp->n)];
    uint32_t *pids = km_alloc(d->len * sizeof(uint32_t));
    const struct km_slot *s = km_slot_find(m, inst, rank, tier);
    const struct km_slot *gs = km_slot_find(m, inst, rank, KVI_TIER_GPU);
    uint32_t held = kw_doc_held(m, s, d, pids);
    uint32_t start;
    uint32_t gpu_held = kw_doc_held(m, gs, d, pids);
    if (lower) /* offload a stretch around what the gpu holds */
        start = kr_below(&g->rng, KVI_MAX(held, gpu_held) + 1);
    else if (held == d->len || kr_chance(&g->rng, 200))
        start = kr_below(&g->rng, held + 1); /* overlap / pure duplicate */
    else if (kr_chance(&g->rng, 40))
        start = held + 1 + kr_below(&g->rng, 3); /* parent not held: -ENOENT (clamped below) */
    else
        start = held;
    if (start >= d->len)
        start = d->len - 1;
    uint32_t room = d->len - start;
    uint32_t len = kr_chance(&g->rng, 100) ? room : 1 + kr_below(&g->rng, KVI_MIN(room, lower ? 8u : 12u));
    len = KVI_MIN(len, KW_MAX_RUN);
    op->kind = KW_STORE;
    op->why = lower ? "offload" : "extend";
    op->inst = inst;
    op->rank = rank;
    op->tier = tier;
    op->has_parent = start > 0;
    op->peh = 0;
    if (start > 0 && !kw_holder_eh(m, inst, rank, tier, pids[start - 1], &op->peh))
        op->peh = kw_name(m, inst, rank, pids[start - 1]);
    op->n = len;
    for (uint32_t i = 0; i < len; i++)
        g->buf[i] = (struct kvi_block){kw_eh_for(g, m, s, inst, rank, pids[start + i]), d->content[start + i]};
    op->b = g->buf;
    if (kr_chance(&g->rng, 250)) { /* the same through store_seq (RFC 1527 publishers) */
        for (uint32_t i = 0; i < len; i++)
            g->seqbuf[i] = m->pf[pids[start + i]].seq;
        op->seq = g->seqbuf;
        op->position = start;
        op->tokenless = g->tokenless && kr_chance(&g->rng, 400);
        /* a lower-tier stretch may also be placed by position alone */
        if (lower && start > 0 && g->placements && kr_chance(&g->rng, KW_PLACED_PERMILLE)) {
            op->has_parent = false;
            op->why = "offload-placed";
            kw_set_above(g, m, op, pids[start - 1]);
        }
    }
    free(pids);
}

uint64_t kw_unknown_eh(struct kw_gen *g, const struct km_model *m, uint32_t inst, uint32_t rank)
{
    for (;;) {
        uint64_t eh = kr_next(&g->rng);
        bool known = false;
        for (uint32_t i = 0; i < m->n_slots; i++)
            if (m->slots[i].instance == inst && m->slots[i].rank == rank && km_map_get(&m->slots[i].by_eh, eh, NULL))
                known = true;
        if (!known)
            return eh;
    }
}

void kw_gen_next(struct kw_gen *g, struct km_model *m, struct kw_op *op)
{
    for (;;) {
        memset(op, 0, sizeof *op);
        op->b = g->buf;
        uint32_t x = kr_below(&g->rng, 1000);
        if (x < 330) {
            kw_gen_chain(g, m, op, false);
        } else if (x < 430) {
            kw_gen_chain(g, m, op, true);
        } else if (x < 580) { /* remove a few held blocks (mid-chain), with noise */
            const struct km_slot *s = kw_random_slot(g, m, kr_chance(&g->rng, 700));
            if (s == NULL)
                continue;
            op->kind = KW_REMOVE;
            op->why = "blocks";
            op->inst = s->instance;
            op->rank = s->rank;
            op->tier = s->tier;
            op->n = 1 + kr_below(&g->rng, 3);
            for (uint32_t i = 0; i < op->n; i++)
                (void)kw_random_block(g, s, &g->buf[i].engine_hash);
            if (kr_chance(&g->rng, 150))
                g->buf[op->n++].engine_hash = kw_unknown_eh(g, m, s->instance, s->rank);
            if (kr_chance(&g->rng, 100))
                g->buf[op->n++].engine_hash = g->buf[0].engine_hash;
        } else if (x < 650) { /* duplicate of a recent store */
            if (g->n_hist == 0)
                continue;
            const struct kw_op *h = &g->hist[kr_below(&g->rng, g->n_hist)];
            *op = *h;
            op->why = "duplicate";
            if (h->n)
                memcpy(g->buf, h->b, h->n * sizeof *h->b);
            op->b = g->buf;
            if (h->seq != NULL) { /* the history slot may be recycled while op is in use */
                if (h->n)
                    memcpy(g->seqbuf, h->seq, h->n * sizeof *h->seq);
                op->seq = g->seqbuf;
            }
            if (h->above != NULL) {
                g->above = km_grow(g->above, sizeof *g->above, &g->cap_above, h->position + 1);
                memcpy(g->above, h->above, h->position * sizeof *h->above);
                op->above = g->above;
            }
            if (!kw_guard(g, m, op, false))
                continue;
            kw_fix_seqs(m, op);
            return;
        } else if (x < 680) { /* same prefix under a fresh engine hash */
            const struct km_slot *s = kw_random_slot(g, m, false);
            if (s == NULL)
                continue;
            uint64_t eh;
            uint32_t pid = kw_random_block(g, s, &eh);
            op->kind = KW_STORE;
            op->why = "rename";
            op->inst = s->instance;
            op->rank = s->rank;
            op->tier = s->tier;
            op->has_parent = m->pf[pid].parent != KM_ROOT;
            if (op->has_parent && !kw_holder_eh(m, s->instance, s->rank, s->tier, m->pf[pid].parent, &op->peh))
                continue;
            op->n = 1;
            g->buf[0] = (struct kvi_block){kw_unknown_eh(g, m, s->instance, s->rank), m->pf[pid].content};
        } else if (x < 710) { /* an engine hash re-used for another block */
            const struct km_slot *s = g->corners ? kw_random_slot(g, m, false) : NULL;
            if (s == NULL)
                continue;
            uint64_t eh, peh;
            (void)kw_random_block(g, s, &eh);
            op->kind = KW_STORE;
            op->why = "reuse";
            op->inst = s->instance;
            op->rank = s->rank;
            op->tier = s->tier;
            op->has_parent = kr_chance(&g->rng, 800);
            if (op->has_parent) {
                (void)kw_random_block(g, s, &peh);
                if (peh == eh)
                    continue;
                op->peh = peh;
            }
            op->n = 1;
            g->buf[0] = (struct kvi_block){eh, kw_content(g->corp, kw_token(&g->rng), kr_below(&g->rng, KW_LORAS))};
            if (!kw_guard(g, m, op, false))
                continue;
            return;
        } else if (x < 740) { /* unknown parent */
            op->kind = KW_STORE;
            op->why = "unknown-parent";
            op->inst = kw_pick_inst(g);
            op->rank = kw_pick_rank(g);
            op->tier = kr_chance(&g->rng, 700) ? KVI_TIER_GPU : kw_pick_lower_tier(g);
            op->has_parent = true;
            op->peh = kw_unknown_eh(g, m, op->inst, op->rank);
            op->n = 1 + kr_below(&g->rng, 3);
            for (uint32_t i = 0; i < op->n; i++)
                g->buf[i] = (struct kvi_block){kr_next(&g->rng), kw_content(g->corp, kw_token(&g->rng), 0)};
        } else if (x < 760) { /* invalid runs and the empty run */
            op->kind = KW_STORE;
            op->why = "invalid";
            op->inst = kw_pick_inst(g);
            op->rank = kw_pick_rank(g);
            op->tier = KVI_TIER_GPU;
            op->n = 2 + kr_below(&g->rng, 3);
            for (uint32_t i = 0; i < op->n; i++)
                g->buf[i] = (struct kvi_block){kr_next(&g->rng), kw_content(g->corp, kw_token(&g->rng), 0)};
            uint32_t v = kr_below(&g->rng, 3);
            if (v == 0) { /* repeated engine hash */
                g->buf[op->n - 1].engine_hash = g->buf[kr_below(&g->rng, op->n - 1)].engine_hash;
            } else if (v == 1) { /* the run contains its parent */
                op->has_parent = true;
                op->peh = g->buf[kr_below(&g->rng, op->n)].engine_hash;
            } else { /* empty run, even with an unknown parent: 0 */
                op->has_parent = kr_chance(&g->rng, 500);
                op->peh = kr_next(&g->rng);
                op->n = 0;
            }
        } else if (x < 830) { /* random short chain at the root */
            op->kind = KW_STORE;
            op->why = "random-root";
            op->inst = kw_pick_inst(g);
            op->rank = kw_pick_rank(g);
            op->tier = kr_chance(&g->rng, 800) ? KVI_TIER_GPU : kw_pick_lower_tier(g);
            op->n = 1 + kr_below(&g->rng, 6);
            uint32_t lora = kr_below(&g->rng, KW_LORAS), cur = KM_ROOT;
            const struct km_slot *s = km_slot_find(m, op->inst, op->rank, op->tier);
            for (uint32_t i = 0; i < op->n; i++) {
                uint64_t c = kw_content(g->corp, kw_token(&g->rng), lora);
                cur = km_intern(m, cur, c);
                g->buf[i] = (struct kvi_block){kw_eh_for(g, m, s, op->inst, op->rank, cur), c};
            }
        } else if (x < 850) { /* removes that match nothing */
            op->kind = KW_REMOVE;
            op->why = "unknown";
            op->inst = kw_pick_inst(g);
            op->rank = kr_chance(&g->rng, 500) ? g->n_ranks + kr_below(&g->rng, 3) : kw_pick_rank(g);
            op->tier = (enum kvi_tier)kr_below(&g->rng, KVI_TIER_COUNT);
            op->n = 1 + kr_below(&g->rng, 3);
            for (uint32_t i = 0; i < op->n; i++)
                g->buf[i].engine_hash = kw_unknown_eh(g, m, op->inst, op->rank);
        } else if (x < 850 + g->w_clear) { /* half of them one rank's (an engine's AllBlocksCleared) */
            op->kind = x % 2 == 0 ? KW_CLEAR : KW_CLEAR_RANK;
            op->inst = kw_pick_inst(g);
            op->rank = op->kind == KW_CLEAR_RANK ? kw_pick_rank(g) : 0;
        } else if (x < 850 + g->w_clear + g->w_remove_rank) {
            op->kind = KW_REMOVE_RANK;
            op->inst = kw_pick_inst(g);
            op->rank = kw_pick_rank(g);
        } else if (x < 850 + g->w_clear + g->w_remove_rank + g->w_remove_instance) {
            op->kind = KW_REMOVE_INSTANCE;
            op->inst = kw_pick_inst(g);
        } else if (x >= 900 && x < 940) { /* lower-tier stretch placed by position and seq hash */
            const struct kw_doc *d = &g->corp->d[kr_below(&g->rng, g->corp->n)];
            if (d->len < 2 || !g->placements)
                continue;
            op->kind = KW_STORE;
            op->why = "placed";
            op->inst = kw_pick_inst(g);
            op->rank = kw_pick_rank(g);
            op->tier = kr_chance(&g->rng, 100) ? KVI_TIER_GPU : kw_pick_lower_tier(g); /* gpu: -EINVAL */
            op->position = 1 + kr_below(&g->rng, d->len - 1);
            op->n = 1 + kr_below(&g->rng, KVI_MIN(4u, d->len - op->position));
            const struct km_slot *s = km_slot_find(m, op->inst, op->rank, op->tier);
            uint32_t cur = KM_ROOT;
            for (uint32_t i = 0; i < op->position + op->n; i++) {
                if (i == op->position)
                    kw_set_above(g, m, op, cur);
                cur = km_intern(m, cur, d->content[i]);
                if (i >= op->position) {
                    uint32_t k = i - op->position;
                    g->buf[k] = (struct kvi_block){kw_eh_for(g, m, s, op->inst, op->rank, cur), d->content[i]};
                    g->seqbuf[k] = m->pf[cur].seq;
                }
            }
            op->seq = g->seqbuf;
            op->tokenless = g->tokenless && kr_chance(&g->rng, 400);
            if (kr_chance(&g->rng, 300)) { /* below another backend's parent: placed all the same */
                op->why = "foreign-parent";
                op->has_parent = true;
                op->peh = kw_unknown_eh(g, m, op->inst, op->rank);
            }
        } else if (x >= 940 && x < 970) { /* new blocks placed by position right below a held one */
            const struct km_slot *s = g->corners && g->placements ? kw_random_slot(g, m, false) : NULL;
            if (s == NULL || s->tier == KVI_TIER_GPU)
                continue;
            uint64_t eh;
            uint32_t cur = kw_random_block(g, s, &eh);
            op->kind = KW_STORE;
            op->why = "placed-below";
            op->inst = s->instance;
            op->rank = s->rank;
            op->tier = s->tier;
            op->position = m->pf[cur].pos + 1;
            kw_set_above(g, m, op, cur);
            op->n = 1 + kr_below(&g->rng, 3);
            uint32_t lora = kr_below(&g->rng, KW_LORAS);
            for (uint32_t i = 0; i < op->n; i++) {
                uint64_t c = kw_content(g->corp, kw_token(&g->rng), lora);
                cur = km_intern(m, cur, c);
                g->buf[i] = (struct kvi_block){kw_eh_for(g, m, s, op->inst, op->rank, cur), c};
                g->seqbuf[i] = m->pf[cur].seq;
            }
            op->seq = g->seqbuf;
        } else if (x >= 970 && g->known_ops) { /* offload / reload by engine hash alone */
            const struct km_slot *s = kw_random_slot(g, m, kr_chance(&g->rng, 600));
            if (s == NULL)
                continue;
            op->kind = KW_STORE_KNOWN;
            op->why = "known";
            op->inst = s->instance;
            op->rank = s->rank;
            uint32_t t = kr_below(&g->rng, 10);
            op->tier = t < 2 ? KVI_TIER_GPU : t < 6 ? KVI_TIER_CPU : t < 9 ? KVI_TIER_DISK : KVI_TIER_EXTERNAL;
            op->n = 1 + kr_below(&g->rng, 5);
            for (uint32_t i = 0; i < op->n; i++) {
                uint64_t eh;
                uint32_t pid = kw_random_block(g, s, &eh);
                /* an entry placed by position may not know its parent: keep
                 * the model's true parent and the index's the same */
                if (m->pf[pid].placed || kr_chance(&g->rng, 100))
                    eh = kw_unknown_eh(g, m, s->instance, s->rank);
                g->buf[i].engine_hash = eh;
            }
            return;
        } else if (g->wild && x < 900) { /* unknown instance / bad tier */
            uint32_t v = kr_below(&g->rng, 4);
            op->inst = v == 3 ? kw_pick_inst(g) : g->n_valid + kr_below(&g->rng, 5);
            op->rank = 0;
            op->tier = v == 3 ? (enum kvi_tier)(KVI_TIER_COUNT + kr_below(&g->rng, 3)) : KVI_TIER_GPU;
            op->why = "wild";
            op->kind = v == 1 ? KW_REMOVE : v == 2 ? (kr_chance(&g->rng, 500) ? KW_CLEAR : KW_REMOVE_RANK) : KW_STORE;
            op->n = 1;
            g->buf[0] = (struct kvi_block){kr_next(&g->rng), kw_content(g->corp, 0, 0)};
        } else {
            continue;
        }
        (void)kw_guard(g, m, op, true);
        kw_fix_seqs(m, op);
        return;
    }
}
