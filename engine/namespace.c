/*
 * Namespace registry: copy-on-write open-addressing table published via RCU.
 * measured: not on any hot path but the lookup (one XXH3 of the two names and
 * one or two probes); rebuilding the table costs O(namespaces) per change.
 */
#include "engine/namespace.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/common.h"
#include "engine/rcu.h"

struct nstab {
    uint32_t mask; /* capacity - 1 (power of two, load <= 1/2) */
    uint32_t n;
    struct kvi_ns *slot[];
};

struct kvi_nsreg {
    _Atomic(struct nstab *) tab;
    pthread_mutex_t lock; /* serialises add / unlink */
    struct kvi_index_config tmpl;
};

static uint64_t ns_hash(const char *model, const char *tenant)
{
    /* the NUL terminators keep ("ab", "c") and ("a", "bc") apart */
    uint64_t hm = XXH3_64bits_withSeed(model, strlen(model) + 1, 0x6b766964786e73ull);
    return XXH3_64bits_withSeed(tenant, strlen(tenant) + 1, hm);
}

static struct nstab *tab_alloc(uint32_t n)
{
    uint32_t cap = 8;
    while (cap < 2 * n)
        cap <<= 1;
    struct nstab *t = kvi_xcalloc(1, sizeof(*t) + cap * sizeof(t->slot[0]));
    t->mask = cap - 1;
    return t;
}

static void tab_put(struct nstab *t, struct kvi_ns *ns)
{
    uint32_t i = (uint32_t)ns->hash & t->mask;
    while (t->slot[i] != NULL)
        i = (i + 1) & t->mask;
    t->slot[i] = ns;
    t->n++;
}

struct kvi_nsreg *kvi_nsreg_create(const struct kvi_index_config *tmpl)
{
    struct kvi_nsreg *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    r->tmpl = *tmpl;
    pthread_mutex_init(&r->lock, NULL);
    atomic_init(&r->tab, tab_alloc(0));
    return r;
}

void kvi_ns_free(struct kvi_ns *ns)
{
    if (ns == NULL)
        return;
    kvi_index_destroy(ns->ix);
    free((void *)ns->model);
    free((void *)ns->tenant);
    free(ns);
}

void kvi_nsreg_destroy(struct kvi_nsreg *r)
{
    if (r == NULL)
        return;
    struct nstab *t = atomic_load_explicit(&r->tab, memory_order_relaxed);
    for (uint32_t i = 0; i <= t->mask; i++)
        kvi_ns_free(t->slot[i]);
    free(t);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

struct kvi_ns *kvi_nsreg_find(const struct kvi_nsreg *r, const char *model, const char *tenant)
{
    const struct nstab *t = kvi_rcu_deref(((struct kvi_nsreg *)r)->tab);
    uint64_t h = ns_hash(model, tenant);
    for (uint32_t i = (uint32_t)h & t->mask;; i = (i + 1) & t->mask) {
        struct kvi_ns *ns = t->slot[i];
        if (ns == NULL)
            return NULL;
        if (ns->hash == h && strcmp(ns->model, model) == 0 && strcmp(ns->tenant, tenant) == 0)
            return ns;
    }
}

/* Replace the table with one holding @p t's namespaces plus @p add minus
 * @p drop; the old table is freed after a grace period. Lock held. */
static void republish(struct kvi_nsreg *r, struct kvi_ns *add, const struct kvi_ns *drop)
{
    struct nstab *old = atomic_load_explicit(&r->tab, memory_order_relaxed);
    struct nstab *t = tab_alloc(old->n + 1);
    for (uint32_t i = 0; i <= old->mask; i++)
        if (old->slot[i] != NULL && old->slot[i] != drop)
            tab_put(t, old->slot[i]);
    if (add != NULL)
        tab_put(t, add);
    kvi_rcu_assign(r->tab, t);
    kvi_rcu_synchronize();
    free(old);
}

int kvi_nsreg_add(struct kvi_nsreg *r, const char *model, const char *tenant, uint32_t block_size,
                  struct kvi_ns **out)
{
    if (model == NULL || *model == '\0' || tenant == NULL)
        return -EINVAL;
    pthread_mutex_lock(&r->lock);
    struct kvi_ns *ns = kvi_nsreg_find(r, model, tenant);
    if (ns != NULL) {
        pthread_mutex_unlock(&r->lock);
        *out = ns;
        return 0;
    }
    struct kvi_index_config cfg = r->tmpl;
    cfg.block_size = block_size;
    ns = calloc(1, sizeof(*ns));
    if (ns == NULL || (ns->model = strdup(model)) == NULL || (ns->tenant = strdup(tenant)) == NULL ||
        (ns->ix = kvi_index_create(&cfg)) == NULL) {
        int err = (ns != NULL && ns->tenant != NULL && block_size == 0) ? -EINVAL : -ENOMEM;
        if (ns != NULL) {
            free((void *)ns->model);
            free((void *)ns->tenant);
            free(ns);
        }
        pthread_mutex_unlock(&r->lock);
        return err;
    }
    ns->block_size = block_size;
    ns->hash = ns_hash(model, tenant);
    republish(r, ns, NULL);
    pthread_mutex_unlock(&r->lock);
    *out = ns;
    return 1;
}

static int cmp_ns(const void *a, const void *b)
{
    const struct kvi_ns *x = *(struct kvi_ns *const *)a, *y = *(struct kvi_ns *const *)b;
    int c = strcmp(x->model, y->model);
    return c != 0 ? c : strcmp(x->tenant, y->tenant);
}

size_t kvi_nsreg_list(const struct kvi_nsreg *r, struct kvi_ns **out, size_t cap)
{
    const struct nstab *t = kvi_rcu_deref(((struct kvi_nsreg *)r)->tab);
    size_t n = 0;
    for (uint32_t i = 0; i <= t->mask; i++) {
        if (t->slot[i] == NULL)
            continue;
        if (n < cap)
            out[n] = t->slot[i];
        n++;
    }
    if (n > 0 && n <= cap)
        qsort(out, n, sizeof(out[0]), cmp_ns);
    return n;
}

int kvi_nsreg_unlink(struct kvi_nsreg *r, struct kvi_ns *ns)
{
    pthread_mutex_lock(&r->lock);
    if (kvi_nsreg_find(r, ns->model, ns->tenant) != ns) {
        pthread_mutex_unlock(&r->lock);
        return -ENOENT;
    }
    republish(r, NULL, ns);
    pthread_mutex_unlock(&r->lock);
    return 0;
}
