/* u64 -> u64 open-addressing hash map (see bench/trace_map.h). */
#include "bench/trace_map.h"

#include <stdlib.h>
#include <string.h>

#include "engine/common.h"

#define MAP_MIN_CAP 8u

void kvi_u64map_init(struct kvi_u64map *m)
{
    memset(m, 0, sizeof *m);
}

void kvi_u64map_free(struct kvi_u64map *m)
{
    free(m->slots);
    kvi_u64map_init(m);
}

static inline uint32_t home(const struct kvi_u64map *m, uint64_t key)
{
    return (uint32_t)kvi_fmix64(key) & m->mask;
}

static void grow(struct kvi_u64map *m)
{
    uint32_t old_cap = m->slots ? m->mask + 1u : 0u;
    uint32_t cap = old_cap ? old_cap * 2u : MAP_MIN_CAP;
    if (cap == 0)
        kvi_die("u64map: table too large");
    struct kvi_u64map_slot *old = m->slots;
    m->slots = kvi_xcalloc(cap, sizeof *m->slots);
    m->mask = cap - 1u;
    for (uint32_t i = 0; i < old_cap; i++) {
        if (old[i].key == 0)
            continue;
        uint32_t j = home(m, old[i].key);
        while (m->slots[j].key != 0)
            j = (j + 1u) & m->mask;
        m->slots[j] = old[i];
    }
    free(old);
}

bool kvi_u64map_get(const struct kvi_u64map *m, uint64_t key, uint64_t *val)
{
    if (key == 0) {
        if (m->has_zero && val)
            *val = m->zero_val;
        return m->has_zero;
    }
    if (m->slots == NULL)
        return false;
    for (uint32_t j = home(m, key);; j = (j + 1u) & m->mask) {
        uint64_t k = m->slots[j].key;
        if (k == key) {
            if (val)
                *val = m->slots[j].val;
            return true;
        }
        if (k == 0)
            return false;
    }
}

bool kvi_u64map_put(struct kvi_u64map *m, uint64_t key, uint64_t val)
{
    if (key == 0) {
        bool fresh = !m->has_zero;
        m->has_zero = true;
        m->zero_val = val;
        return fresh;
    }
    if (m->slots == NULL || (uint64_t)(m->n + 1u) * 4u > (uint64_t)(m->mask + 1u) * 3u)
        grow(m);
    for (uint32_t j = home(m, key);; j = (j + 1u) & m->mask) {
        uint64_t k = m->slots[j].key;
        if (k == key) {
            m->slots[j].val = val;
            return false;
        }
        if (k == 0) {
            m->slots[j].key = key;
            m->slots[j].val = val;
            m->n++;
            return true;
        }
    }
}

bool kvi_u64map_del(struct kvi_u64map *m, uint64_t key, uint64_t *val)
{
    if (key == 0) {
        if (!m->has_zero)
            return false;
        if (val)
            *val = m->zero_val;
        m->has_zero = false;
        return true;
    }
    if (m->slots == NULL)
        return false;
    uint32_t j = home(m, key);
    for (;; j = (j + 1u) & m->mask) {
        uint64_t k = m->slots[j].key;
        if (k == 0)
            return false;
        if (k == key)
            break;
    }
    if (val)
        *val = m->slots[j].val;
    /* backward shift: pull later members of the cluster into the hole when
     * their home does not lie cyclically in (hole, their slot] */
    uint32_t hole = j;
    for (uint32_t i = (j + 1u) & m->mask; m->slots[i].key != 0; i = (i + 1u) & m->mask) {
        uint32_t h = home(m, m->slots[i].key);
        bool stays = hole <= i ? (hole < h && h <= i) : (hole < h || h <= i);
        if (stays)
            continue;
        m->slots[hole] = m->slots[i];
        hole = i;
    }
    m->slots[hole].key = 0;
    m->slots[hole].val = 0;
    m->n--;
    return true;
}

bool kvi_u64map_next(const struct kvi_u64map *m, size_t *pos, uint64_t *key, uint64_t *val)
{
    /* position 0 is the out-of-line zero key, then slot i at position i + 1 */
    if (*pos == 0) {
        *pos = 1;
        if (m->has_zero) {
            *key = 0;
            *val = m->zero_val;
            return true;
        }
    }
    size_t cap = m->slots ? (size_t)m->mask + 1u : 0u;
    while (*pos - 1u < cap) {
        const struct kvi_u64map_slot *s = &m->slots[*pos - 1u];
        (*pos)++;
        if (s->key != 0) {
            *key = s->key;
            *val = s->val;
            return true;
        }
    }
    return false;
}
