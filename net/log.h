/*
 * A small leveled logger for the daemon: one line per event on stderr,
 *
 *     2026-11-21T11:53:31.123Z INFO  registered instance 7 rank 0 (tcp://h:5557)
 *
 * written with a single write(2), so lines of concurrent threads never
 * interleave. Control-plane only: nothing on a query path logs (check
 * kvi_log_enabled first when building a message is costly).
 *
 * THREAD-SAFETY: every function may be called from any thread. The level is
 * a relaxed atomic; changing it while other threads log is fine.
 *
 * SINK: kvi_log_set_sink diverts the formatted lines from stderr to a
 * function (tests capture what the daemon would print); see its contract.
 */
#ifndef KVI_NET_LOG_H
#define KVI_NET_LOG_H

#include <stdbool.h>
#include <stddef.h>

enum kvi_log_level {
    KVI_LOG_ERROR = 0,
    KVI_LOG_WARN = 1,
    KVI_LOG_INFO = 2,
    KVI_LOG_DEBUG = 3,
};

/** Set the most verbose level that is printed (default KVI_LOG_INFO). */
void kvi_log_set_level(enum kvi_log_level level);

/** The current level. */
enum kvi_log_level kvi_log_level(void);

/**
 * Parse "error", "warn" (or "warning"), "info" or "debug" (case-insensitive).
 * @return 0 with *out set, or -EINVAL.
 */
int kvi_log_parse_level(const char *s, enum kvi_log_level *out);

/** Name of a level: "error", "warn", "info", "debug". */
const char *kvi_log_level_name(enum kvi_log_level level);

/** Whether messages of @p level are printed. */
bool kvi_log_enabled(enum kvi_log_level level);

/**
 * Print one line at @p level (dropped when the level is disabled). A trailing
 * newline in @p fmt is not needed; lines longer than 2,000 bytes are cut.
 */
void kvi_log(enum kvi_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/**
 * Where lines go instead of stderr: @p fn receives each whole formatted line
 * (timestamp, level tag and message, ending in '\n', not NUL-terminated) and
 * its level. Pass NULL to restore stderr.
 * Thread: any. Calls of @p fn are serialised by an internal mutex, which
 * set_sink takes too: once set_sink returns, no call of the previous sink is
 * running or will start, so its @p ctx may be freed. @p fn must not log (it
 * would deadlock). While no sink is set, logging takes no lock.
 */
typedef void (*kvi_log_sink_fn)(void *ctx, enum kvi_log_level level, const char *line, size_t len);
void kvi_log_set_sink(kvi_log_sink_fn fn, void *ctx);

#define kvi_log_error(...) kvi_log(KVI_LOG_ERROR, __VA_ARGS__)
#define kvi_log_warn(...) kvi_log(KVI_LOG_WARN, __VA_ARGS__)
#define kvi_log_info(...) kvi_log(KVI_LOG_INFO, __VA_ARGS__)
#define kvi_log_debug(...) kvi_log(KVI_LOG_DEBUG, __VA_ARGS__)

#endif
