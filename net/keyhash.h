/*
 * An intrusive hash set of byte-string keys (topics): nodes live inside the
 * caller's structs and point at their own key bytes; chains through the
 * nodes, buckets a power of two doubling from 16 so that there is at most
 * one node per bucket on average. Keys hash with XXH3-64. A key is in the
 * set at most once (the caller checks with find before add).
 *
 * Used for a bind endpoint's exact topics (net/listener.c: one probe per
 * message on the listener thread) and kvidxd's --zmq-bind pod topics
 * (api/service_zbind.c).
 *
 * THREAD: none of its own; the owner serialises every call (a single
 * thread, or its lock). MEMORY: the set owns its bucket array only
 * (kvi_khash_fini frees it); nodes and keys belong to the caller and must
 * stay unchanged while in the set. Allocation failure aborts (kvi_xcalloc).
 */
#ifndef KVI_NET_KEYHASH_H
#define KVI_NET_KEYHASH_H

#include <stddef.h>

struct kvi_khnode {
    struct kvi_khnode *next; /* the set's chain */
    const void *key;         /* set by the caller before add */
    size_t len;
};

struct kvi_khash {
    struct kvi_khnode **tab; /* NULL until the first add */
    size_t cap;              /* buckets: 0 or a power of two */
    size_t n;                /* nodes in the set */
};

/** Add @p node (key and len set; the key not in the set yet), growing the buckets first when full. */
void kvi_khash_add(struct kvi_khash *h, struct kvi_khnode *node);

/** The node whose key equals [key, key + len), or NULL. */
struct kvi_khnode *kvi_khash_find(const struct kvi_khash *h, const void *key, size_t len);

/** Remove @p node if it is in the set. @return 1 when removed, 0 when it was not there. */
int kvi_khash_del(struct kvi_khash *h, struct kvi_khnode *node);

/** Remove and return some node of the set (to empty it), or NULL when empty. */
struct kvi_khnode *kvi_khash_pop(struct kvi_khash *h);

/** Free the buckets (the nodes are the caller's) and zero the set. */
void kvi_khash_fini(struct kvi_khash *h);

#endif
