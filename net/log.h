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
 */
#ifndef KVI_NET_LOG_H
#define KVI_NET_LOG_H

#include <stdbool.h>

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

#define kvi_log_error(...) kvi_log(KVI_LOG_ERROR, __VA_ARGS__)
#define kvi_log_warn(...) kvi_log(KVI_LOG_WARN, __VA_ARGS__)
#define kvi_log_info(...) kvi_log(KVI_LOG_INFO, __VA_ARGS__)
#define kvi_log_debug(...) kvi_log(KVI_LOG_DEBUG, __VA_ARGS__)

#endif
