/*
 * /dump threads: GET /dump (http-api.md §1.11) served so that a client that
 * reads slowly, or not at all, holds nothing but its own dump.
 *
 * DESIGN
 *   A small pool of dump threads (up to max_threads, started on demand; more
 *   dumps wait in a FIFO queue). Each thread owns a writer-pool producer for
 *   its whole life (kvi_producer_dump_partition needs one, which an HTTP loop
 *   thread must not own) and is a registered RCU reader.
 *   A dump lists the registry's namespaces and, per namespace and partition,
 *   has the partition's writer encode its blocks into the dump's spool (an
 *   encoder without a sink, in memory) and go back to its events at once;
 *   the dump thread then hands the spool to the sink, in 64 KiB pieces, and
 *   the sink may block as long as the client makes it. So no writer and no
 *   control thread ever waits for a client. Memory held by one dump: the
 *   encoding of one partition of one namespace (a spool that grew past 4 MiB
 *   is freed after it is drained), plus what the sink buffers.
 *   Consistency (unchanged): each partition is one consistent snapshot at a
 *   point of its event stream; partitions and namespaces are taken one after
 *   the other, so the dump as a whole is weakly consistent. The namespaces
 *   are those registered when the dump starts.
 *   Namespace lifetime: a dump pins the namespaces it lists (under the
 *   pool's mutex, taken inside the RCU read section of the listing) and
 *   unpins each once it is dumped. The service deletes a namespace by
 *   unlinking it from the registry (which waits for an RCU grace period:
 *   after it, no dump can list it any more), making the writers forget its
 *   index, then asking kvi_dump_pool_defer_free: when a dump holds it, the
 *   last unpin frees it (kvi_ns_free) on that dump's thread; the deleting
 *   thread never waits for a dump.
 *
 *   | call                          | thread                                  |
 *   |-------------------------------|-----------------------------------------|
 *   | create, close, join, destroy  | the owner (control plane / main)        |
 *   | submit                        | any                                     |
 *   | defer_free                    | the one thread that deletes namespaces  |
 *
 * ERRORS: negative errno values (see each call).
 */
#ifndef KVI_API_DUMP_POOL_H
#define KVI_API_DUMP_POOL_H

#include <stdbool.h>
#include <time.h>

#include "api/codec_dump.h"
#include "engine/namespace.h"
#include "engine/writer.h"
#include "net/listener.h"
#include "engine/common.h"

struct kvi_dump_pool;

/**
 * Called once when a dump ends, on its dump thread; it owns its ctx again.
 * @param rc  0 when the whole body went to the sink, else -ENOMEM, -ENOSPC /
 *            -ENOMEM (the thread has no writer-pool producer) or the sink's
 *            nonzero value (a positive one as -EIO).
 */
typedef void (*kvi_dump_done_fn)(void *ctx, int rc);

/**
 * Close, join (waiting as long as it takes) and free the pool, and free the
 * deleted namespaces it still held. NULL is a no-op. Before the writer pool
 * and the registry are destroyed.
 */
void kvi_dump_pool_destroy(struct kvi_dump_pool *dp);

/**
 * Create a pool over @p writers and @p nsreg (both must outlive it). No
 * thread starts until the first submit.
 * @param max_threads  dumps served at once (>= 1; more than 64 count as 64)
 * @return the pool, or NULL with errno = EINVAL (max_threads 0).
 */
KVI_DEALLOC(kvi_dump_pool_destroy, 1) KVI_WARN_UNUSED
struct kvi_dump_pool *kvi_dump_pool_create(struct kvi_writer_pool *writers, struct kvi_nsreg *nsreg,
                                           unsigned max_threads);

/**
 * Name the listeners whose applied positions each namespace lists under
 * "watermarks" (api/codec_dump.h): read on the partition's writer right
 * before the partition's blocks (kvi_producer_dump_partition_pre), so each
 * entry is exactly the last batch of its stream in the dumped blocks.
 * @p lp must outlive the pool; NULL (the default) dumps no watermarks. Call
 * before the first submit.
 */
void kvi_dump_pool_set_listeners(struct kvi_dump_pool *dp, struct kvi_listeners *lp);

/**
 * Queue a dump of every namespace in @p nsreg: the body goes to
 * @p sink(@p ctx, bytes, len) on a dump thread, in order (a nonzero return
 * ends the dump), then @p done(@p ctx, rc) is called there. Returns at once.
 * @return 0 (@p done will be called), -ESHUTDOWN after kvi_dump_pool_close,
 *         or -errno of pthread_create when no dump thread runs and none could
 *         be started; @p done is then not called.
 */
int kvi_dump_pool_submit(struct kvi_dump_pool *dp, kvi_dump_sink_fn sink, kvi_dump_done_fn done, void *ctx);

/**
 * A namespace was deleted: call after kvi_nsreg_unlink returned and after
 * the writers forgot its index (kvi_producer_forget_index).
 * @return true when a dump still holds @p ns: the last one frees it
 *         (kvi_ns_free) when it is done with it; false: nobody holds it and
 *         the caller frees it.
 */
bool kvi_dump_pool_defer_free(struct kvi_dump_pool *dp, struct kvi_ns *ns);

/** Refuse new dumps; the threads exit once they have served the queue. Idempotent; NULL is a no-op. */
void kvi_dump_pool_close(struct kvi_dump_pool *dp);

/**
 * Join the dump threads (after kvi_dump_pool_close; NULL: nothing to join).
 * @param deadline  CLOCK_REALTIME limit, or NULL to wait as long as it takes
 * @return 0, or -ETIMEDOUT when a dump still runs at @p deadline (its sink
 *         blocks: a stream the HTTP server has not cut yet); the pool must
 *         then not be destroyed.
 */
int kvi_dump_pool_join(struct kvi_dump_pool *dp, const struct timespec *deadline);

#endif
