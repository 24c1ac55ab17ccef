/*
 * kvidx-bench trace --export / --import: a replay's exact timeline in a file
 * (bench/ only).
 *
 * The file format ("kvidx-timeline", version 1: a msgpack stream of one
 * header map and one map per timeline entry) is specified in
 * bench/README.md#timeline-format; that section is the contract, so another
 * indexer can be driven with the identical workload without this code.
 *
 * Neither function is thread-safe with respect to its workload; both run on
 * the calling thread only.
 */
#ifndef KVI_BENCH_TRACE_IO_H
#define KVI_BENCH_TRACE_IO_H

#include <stddef.h>

#include "bench/trace.h"

#define KVI_TIMELINE_FORMAT "kvidx-timeline"
#define KVI_TIMELINE_VERSION 1u

/**
 * Write the timeline of @p w (every entry, in timeline order) to @p path,
 * replacing the file.
 * @param source  free text recorded in the header (trace name, sha256), or NULL
 * @return 0, or -errno when the file cannot be written.
 */
int kvi_trace_export(const struct kvi_trace_workload *w, const char *source, const char *path);

/**
 * Read a timeline file into @p w (uninitialised on entry; free it with
 * kvi_trace_workload_free). The result has no trace (w->trace == NULL, no
 * per-request arrays, every entry's req and pos 0), so it can be replayed in
 * process (kvi_trace_run, kvi_trace_serial) but not end to end, which needs
 * the tokens. Its cfg is the defaults with n_workers, block_size and seed from
 * the header, worker_dup 1; its stats count the entries.
 * @param sha256  receives the file's SHA-256 (64 hex digits), or NULL
 * @return 0; -errno when the file cannot be read; -EINVAL for a file that is
 *         not a valid version-1 timeline (message in @p err, with the entry
 *         index), and @p w is then empty.
 */
int kvi_trace_import(struct kvi_trace_workload *w, const char *path, char sha256[65], char *err, size_t err_len);

#endif
