/*
 * Snapshots of a JetStream-fed namespace in a JetStream Key-Value bucket
 * (libnats 3.4.1 has no object store): the storage format, the bucket I/O
 * and the stream purge that follows a stored snapshot. kvidxd's
 * --nats-snapshot (api/service_snapshot.c) fills the blob with the /dump
 * body of the namespace; this module knows nothing of its content past the
 * order header.
 *
 * FORMAT
 *   A snapshot is one blob, deflated (zlib format) and cut into chunks of
 *   chunk_size bytes (the last one shorter), each stored under its own key,
 *   and a manifest key written after the last chunk:
 *     <prefix>.manifest            the manifest (text, below)
 *     <prefix>.<id>.<k>            compressed chunk k (0 .. chunks-1)
 *   The prefix names one source's snapshot (kvi_snap_prefix); the id is
 *   unique per written snapshot (its seq and a random part), so a new
 *   snapshot never overwrites chunks an older manifest still names.
 *   The blob, uncompressed: "KVISNAP1", u32 n_order, n_order records of 32
 *   bytes {u64 worker_id, u32 dp_rank, u32 flags (bit 0: publisher_id
 *   known), u64 last_event_id, u64 publisher_id} (all little-endian), then
 *   the body (the /dump content) to the end.
 *   The manifest, "key=value" lines after a first line "kvidx-snapshot 1":
 *   seq, id, chunks, chunk_size, bytes (compressed), raw_bytes, crc32 (of
 *   the compressed bytes in chunk order, zlib's crc32), created_ms (unix).
 *   Unknown keys are ignored; a missing or malformed one rejects it.
 *
 * WRITE (kvi_snap_writer_*): chunks are stored as the compressor fills
 *   them (memory: one chunk), then the manifest, with a revision check: it
 *   is created when absent, else updated only if the stored one is still
 *   the one read and covers an older sequence (newest seq wins; two
 *   replicas writing the same prefix never interleave chunks, since ids
 *   differ). Once the manifest is stored, the chunks of the snapshot it
 *   replaced are purged from the bucket. A snapshot that lost (an equal or
 *   newer one is stored) purges its own chunks. A crash between chunks and
 *   manifest leaves orphan chunks no manifest names (harmless; the bucket's
 *   size grows by one snapshot at most per crash).
 *
 * READ (kvi_snap_load): the manifest, then every chunk; sizes and the
 *   checksum are verified before any byte is handed on; a chunk missing (a
 *   writer replaced the snapshot meanwhile) re-reads the manifest, up to 3
 *   times. Then the blob is inflated and handed on: the order records once,
 *   then the body in pieces.
 *
 * THREADS: a store is used by one thread at a time (its caller serialises);
 *   the codec functions are pure.
 *
 * ERRORS: 0 or a negative errno, as each call says; -EAGAIN means NATS or
 *   JetStream did not answer (retry later).
 */
#ifndef KVI_NET_NATS_SNAPSHOT_H
#define KVI_NET_NATS_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/common.h"
#include "net/nats_source.h"

#define KVI_SNAP_CHUNK_DEFAULT (512u * 1024)   /* under the 1 MiB max_payload, headers included */
#define KVI_SNAP_MANIFEST_MAX 512              /* bytes of an encoded manifest */
#define KVI_SNAP_ORDER_REC 32                  /* bytes per order record */
#define KVI_SNAP_HEADER_FIXED 12               /* magic + n_order */
#define KVI_SNAP_KEY_MAX 1024                  /* bytes of a key, NUL included */
#define KVI_SNAP_PREFIX_MAX 900                /* bytes of a prefix, NUL included */

/* ---- codec (pure) ------------------------------------------------------------------------------ */

struct kvi_snap_manifest {
    uint64_t seq;         /* last stream sequence the snapshot covers */
    char id[40];          /* its chunks' id: [0-9a-z-]+ */
    uint32_t chunks;
    uint32_t chunk_size;  /* every chunk but the last has this size */
    uint64_t bytes;       /* compressed, all chunks */
    uint64_t raw_bytes;   /* uncompressed blob */
    uint32_t crc32;       /* of the compressed bytes in chunk order */
    uint64_t created_ms;  /* unix time of the write */
};

/**
 * Encode @p m into @p buf. @return its length, or -ENOSPC when @p cap is too
 * small (KVI_SNAP_MANIFEST_MAX always suffices).
 */
int kvi_snap_manifest_encode(const struct kvi_snap_manifest *m, char *buf, size_t cap);

/**
 * Decode a manifest. @return 0, or -EBADMSG (not a manifest, a key missing
 * or malformed, an id with other characters, chunk figures that do not add
 * up: chunks == ceil(bytes / chunk_size), chunk_size > 0).
 */
int kvi_snap_manifest_decode(const void *buf, size_t len, struct kvi_snap_manifest *m);

/**
 * The key prefix of a source's snapshot: its stream, filter subject and
 * label, each with characters outside [A-Za-z0-9_-] written "=XX" (hex)
 * and an empty one as "=", joined by '.'. @return 0, or -ENAMETOOLONG when it does not fit @p cap
 * (at most KVI_SNAP_PREFIX_MAX: longer prefixes are cut in keys).
 */
int kvi_snap_prefix(char *out, size_t cap, const char *stream, const char *subject, const char *label);

/** Bytes of the blob header for @p n order records. */
size_t kvi_snap_header_size(size_t n);

/** Write the header for @p order[0..n) into @p out (kvi_snap_header_size(n) bytes). */
void kvi_snap_header_encode(const struct kvi_nats_order *order, size_t n, uint8_t *out);

/**
 * Parse a header from the first @p len bytes of a blob.
 * @return the header's size (> 0) with *@p order (malloc'ed; free() it, NULL
 *         when n is 0) and *@p n set; 0 when more bytes are needed;
 *         -EBADMSG (bad magic, or a count past 2^24).
 */
long kvi_snap_header_decode(const uint8_t *buf, size_t len, struct kvi_nats_order **order, size_t *n);

/* ---- bucket I/O -------------------------------------------------------------------------------- */

struct kvi_snap_store;

/** Close a store. NULL: no-op. */
void kvi_snap_store_close(struct kvi_snap_store *st);

/**
 * Open (creating when missing: history 1, file storage) @p bucket on
 * @p plane's connection. @return 0 with *@p out set, -EINVAL (a bucket name
 * other than [A-Za-z0-9_-]+), -EAGAIN (NATS or JetStream not answering).
 */
int kvi_snap_store_open(struct kvi_nats *plane, const char *bucket, struct kvi_snap_store **out);

struct kvi_snap_writer;

/**
 * Start writing the snapshot of @p prefix covering @p seq.
 * @param chunk_size  0 = KVI_SNAP_CHUNK_DEFAULT
 * @return the writer (never NULL: out of memory aborts).
 */
struct kvi_snap_writer *kvi_snap_writer_begin(struct kvi_snap_store *st, const char *prefix, uint64_t seq,
                                              uint32_t chunk_size);

/**
 * Compress and store @p len more bytes of the blob (full chunks are stored
 * at once). @return 0, -EIO (a chunk could not be stored: logged; the
 * writer only accepts abort then).
 */
int kvi_snap_writer_write(struct kvi_snap_writer *w, const void *data, size_t len);

/**
 * Let @p w replace the stored snapshot whose id is @p id even when it covers
 * the same sequence (it did not load here: kvi_snap_load failed on it).
 */
void kvi_snap_writer_replace(struct kvi_snap_writer *w, const char *id);

/**
 * Store the last chunk and the manifest, then purge the replaced
 * snapshot's chunks; frees @p w. @p out (may be NULL) receives the
 * manifest. @return 0, -ESTALE (a snapshot of an equal or newer sequence is
 * stored, unless it is the one named by kvi_snap_writer_replace at an equal
 * sequence: ours is discarded), -EIO (logged; ours is discarded).
 */
int kvi_snap_writer_commit(struct kvi_snap_writer *w, struct kvi_snap_manifest *out);

/** Discard a snapshot being written (its chunks purged) and free @p w. NULL: no-op. */
void kvi_snap_writer_abort(struct kvi_snap_writer *w);

/** What kvi_snap_load hands on, in this order: the order records once, then the body in pieces. */
struct kvi_snap_read_cb {
    /** The order records (@p order is the callee's: free() it). Nonzero stops the load. */
    int (*order)(void *ctx, struct kvi_nats_order *order, size_t n);
    /** The next piece of the body. Nonzero stops the load. */
    int (*body)(void *ctx, const void *data, size_t len);
    void *ctx;
};

/**
 * Load the newest snapshot of @p prefix. @p m (may be NULL) receives its
 * manifest. @p why (may be NULL) receives a reason on failure.
 * @return 0, -ENOENT (no snapshot), -EBADMSG (a manifest, chunk, checksum
 *         or blob that does not verify: nothing was handed on when the
 *         checksum failed), -EAGAIN (NATS did not answer), or a callback's
 *         nonzero value (as a negative errno when it was positive: -ECANCELED).
 */
int kvi_snap_load(struct kvi_snap_store *st, const char *prefix, const struct kvi_snap_read_cb *cb,
                  struct kvi_snap_manifest *m, char *why, size_t why_len);

/**
 * Purge the messages of @p stream on @p subject (NULL: all) below
 * min(@p upto + 1, every durable consumer's ack floor + 1): what the
 * snapshot covers and every consumer has acknowledged. A consumer that
 * acked nothing keeps the whole history.
 * @param below  receives the sequence purged below (0: nothing purged)
 * @return 0, -EAGAIN (NATS did not answer), -EIO (the server refused).
 */
int kvi_snap_purge(struct kvi_nats *plane, const char *stream, const char *subject, uint64_t upto,
                   uint64_t *below);

#endif
