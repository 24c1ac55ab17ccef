/* An intrusive hash set of byte-string keys: see keyhash.h. */
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/common.h"
#include "net/keyhash.h"

static size_t bucket(size_t cap, const void *key, size_t len)
{
    return (size_t)XXH3_64bits(key, len) & (cap - 1);
}

void kvi_khash_add(struct kvi_khash *h, struct kvi_khnode *node)
{
    if (h->n >= h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 16;
        struct kvi_khnode **tab = kvi_xcalloc(cap, sizeof *tab);
        for (size_t i = 0; i < h->cap; i++)
            for (struct kvi_khnode *x = h->tab[i], *next; x != NULL; x = next) {
                next = x->next;
                size_t k = bucket(cap, x->key, x->len);
                x->next = tab[k];
                tab[k] = x;
            }
        free(h->tab);
        h->tab = tab;
        h->cap = cap;
    }
    size_t k = bucket(h->cap, node->key, node->len);
    node->next = h->tab[k];
    h->tab[k] = node;
    h->n++;
}

struct kvi_khnode *kvi_khash_find(const struct kvi_khash *h, const void *key, size_t len)
{
    if (h->n == 0)
        return NULL;
    for (struct kvi_khnode *x = h->tab[bucket(h->cap, key, len)]; x != NULL; x = x->next)
        if (x->len == len && memcmp(x->key, key, len) == 0)
            return x;
    return NULL;
}

int kvi_khash_del(struct kvi_khash *h, struct kvi_khnode *node)
{
    if (h->n == 0)
        return 0;
    for (struct kvi_khnode **pp = &h->tab[bucket(h->cap, node->key, node->len)]; *pp != NULL; pp = &(*pp)->next)
        if (*pp == node) {
            *pp = node->next;
            h->n--;
            return 1;
        }
    return 0;
}

struct kvi_khnode *kvi_khash_pop(struct kvi_khash *h)
{
    for (size_t i = 0; h->n > 0 && i < h->cap; i++)
        if (h->tab[i] != NULL) {
            struct kvi_khnode *x = h->tab[i];
            h->tab[i] = x->next;
            h->n--;
            return x;
        }
    return NULL;
}

void kvi_khash_fini(struct kvi_khash *h)
{
    free(h->tab);
    memset(h, 0, sizeof *h);
}
