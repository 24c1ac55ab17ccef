/*
 * A JetStream Key-Value bucket on a NATS plane's connection (net/nats_source.h):
 * created if missing (history 1, file storage), written with put / delete,
 * and watched by a thread of its own that hands every change, the bucket's
 * current values first, to a callback. kvidxd keeps its registrations there
 * (--nats-registry: api/service_registry.c), so that every replica of a
 * fleet sees every registration.
 *
 * DESIGN
 *   The watcher thread opens the bucket (retrying, with a backoff doubling
 *   to 2 s, while the server cannot be reached or JetStream does not answer),
 *   starts a watch of every key, and calls on_change for each entry: first
 *   the current values, then `on_loaded` once (libnats' marker entry), then
 *   every later change. A watch that fails (the connection lost for long) is
 *   started again, which replays the current values: on_change must be
 *   idempotent (applying a value twice is harmless). Writers (put, delete)
 *   use the bucket handle the thread opened, under a mutex; before it
 *   exists they fail with -EAGAIN.
 *
 * THREADS
 *   open / close: control plane. put / delete: any thread but the watcher's
 *   (they wait for the server's acknowledgement). on_change / on_loaded: the
 *   watcher thread; they should hand work on rather than block.
 */
#ifndef KVI_NET_NATS_KV_H
#define KVI_NET_NATS_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/common.h"
#include "net/nats_source.h"

/** What a change did to its key. */
enum kvi_kv_op {
    KVI_KV_PUT = 0,
    KVI_KV_DELETE = 1, /* a delete or purge marker */
};

/**
 * A change: @p key (NUL-terminated), its value (@p len bytes; NULL and 0
 * for a delete), its revision. Watcher thread; the strings are valid during
 * the call only.
 */
typedef void (*kvi_kv_change_fn)(void *ctx, enum kvi_kv_op op, const char *key, const void *value, size_t len,
                                 uint64_t revision);

struct kvi_nats_kv;

/** Stop the watcher (join) and free. NULL: no-op. */
void kvi_nats_kv_close(struct kvi_nats_kv *kv);

/**
 * Watch (and create when missing) @p bucket on @p plane's connection, in a
 * thread of its own. @p on_loaded (may be NULL) runs once, after the current
 * values. The plane must outlive the handle.
 * @return the handle, or NULL with errno EINVAL (a bucket name other than
 *         [A-Za-z0-9_-]+) or ENOMEM.
 */
KVI_DEALLOC(kvi_nats_kv_close, 1) KVI_WARN_UNUSED
struct kvi_nats_kv *kvi_nats_kv_open(struct kvi_nats *plane, const char *bucket, kvi_kv_change_fn on_change,
                                     void (*on_loaded)(void *ctx), void *ctx);

/**
 * Store @p len bytes under @p key (characters [-/_=.A-Za-z0-9]) and wait
 * for the server. @return 0, -EAGAIN (the bucket is not open yet), -EINVAL
 * (a bad key), -EIO (the server refused or did not answer: logged).
 */
int kvi_nats_kv_put(struct kvi_nats_kv *kv, const char *key, const void *value, size_t len);

/**
 * Store @p key only if it holds no value (never written, or deleted): the
 * bucket's revision check decides between two writers racing. Returns as
 * kvi_nats_kv_put, and -EEXIST when the key holds a value.
 */
int kvi_nats_kv_create(struct kvi_nats_kv *kv, const char *key, const void *value, size_t len);

/** Delete @p key (a delete marker). Returns as kvi_nats_kv_put. */
int kvi_nats_kv_delete(struct kvi_nats_kv *kv, const char *key);

/** Has the watcher delivered the bucket's current values (on_loaded ran)? Any thread. */
bool kvi_nats_kv_loaded(const struct kvi_nats_kv *kv);

/** Is @p key a valid key ([-/_=.A-Za-z0-9]+, no leading or trailing '.')? */
bool kvi_nats_kv_key_ok(const char *key);

#endif
