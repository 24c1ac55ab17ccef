/*
 * Namespace registry: one kvi_index per (model_name, tenant_id), created with
 * the block size of its first registration (http-api.md §1.5).
 *
 * Readers (query handlers on HTTP loop threads) find a namespace wait-free:
 * the registry is an RCU-published, copy-on-write open-addressing table of
 * namespace pointers, rebuilt by the control plane on every add or unlink
 * (namespaces change rarely; lookups happen on every query).
 *
 *   | call                          | who may call                          |
 *   |-------------------------------|---------------------------------------|
 *   | create / destroy              | control plane; destroy with no users  |
 *   | add, unlink                   | any thread (internally serialised)    |
 *   | find, list                    | registered RCU readers, inside a read |
 *   |                               | section (results valid until it ends) |
 *   | free                          | control plane, after unlink + a grace |
 *   |                               | period + every writer forgot the index|
 */
#ifndef KVI_ENGINE_NAMESPACE_H
#define KVI_ENGINE_NAMESPACE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/index.h"
#include "engine/common.h"

/** A namespace: immutable after creation except for the index's contents. */
struct kvi_ns {
    const char *model;  /* NUL-terminated, owned */
    const char *tenant; /* NUL-terminated, owned */
    uint32_t block_size;
    uint64_t hash;      /* of (model, tenant) */
    struct kvi_index *ix;
};

struct kvi_nsreg;

/**
 * Destroy the registry and every namespace still in it, indexes included.
 * No reader or writer may use any of them any more.
 */
void kvi_nsreg_destroy(struct kvi_nsreg *r);

/**
 * Create a registry whose indexes are created with @p tmpl (block_size is
 * taken from each add).
 * @return the registry or NULL with errno = ENOMEM.
 */
KVI_DEALLOC(kvi_nsreg_destroy, 1) KVI_WARN_UNUSED
struct kvi_nsreg *kvi_nsreg_create(const struct kvi_index_config *tmpl);

/**
 * Find or create the namespace (model, tenant).
 * @param out  receives the namespace (existing or new)
 * @return 1 when created with @p block_size, 0 when it existed (its block
 *         size may differ: callers compare), -EINVAL for an empty model,
 *         -ENOMEM.
 */
int kvi_nsreg_add(struct kvi_nsreg *r, const char *model, const char *tenant, uint32_t block_size,
                  struct kvi_ns **out);

/**
 * Find a namespace. Call inside an RCU read-side section (the pointer stays
 * valid until the section ends), or from the control plane while no unlink
 * can race.
 * @return the namespace or NULL.
 */
struct kvi_ns *kvi_nsreg_find(const struct kvi_nsreg *r, const char *model, const char *tenant);

/**
 * Copy up to @p cap namespace pointers into @p out, sorted by (model,
 * tenant). Call inside an RCU read-side section.
 * @return the number of namespaces (may exceed @p cap).
 */
size_t kvi_nsreg_list(const struct kvi_nsreg *r, struct kvi_ns **out, size_t cap);

/**
 * Remove a namespace from the registry (new lookups stop finding it). Waits
 * for an RCU grace period before returning, so no reader still holds it;
 * must not be called inside a read-side section. The caller then makes the
 * writers forget the index (kvi_producer_forget_index) and calls kvi_ns_free.
 * @return 0, or -ENOENT when @p ns is not in the registry.
 */
int kvi_nsreg_unlink(struct kvi_nsreg *r, struct kvi_ns *ns);

/** Free an unlinked namespace and its index. */
void kvi_ns_free(struct kvi_ns *ns);

#endif
