/*
 * Leveled logger: formats a whole line into a stack buffer and writes it with
 * one write(2) to stderr (atomic for lines up to PIPE_BUF when stderr is a
 * pipe, and never interleaved with other kvidx lines in practice), or hands
 * it to the sink set by kvi_log_set_sink.
 */
#include "net/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define LOG_LINE_MAX 2048

static _Atomic int log_level = KVI_LOG_INFO;

/*
 * The sink. sink_on is read on every line without the lock; release in
 * set_sink / acquire in kvi_log pairs it with sink_fn and sink_ctx, which are
 * read again under sink_mu (so a set_sink(NULL) racing with a line is seen
 * either before the call or not at all).
 */
static pthread_mutex_t sink_mu = PTHREAD_MUTEX_INITIALIZER;
static kvi_log_sink_fn sink_fn; /* sink_mu */
static void *sink_ctx;          /* sink_mu */
static _Atomic bool sink_on;

void kvi_log_set_sink(kvi_log_sink_fn fn, void *ctx)
{
    pthread_mutex_lock(&sink_mu);
    sink_fn = fn;
    sink_ctx = ctx;
    atomic_store_explicit(&sink_on, fn != NULL, memory_order_release); /* pairs with kvi_log's acquire */
    pthread_mutex_unlock(&sink_mu);
}

static const char *const level_names[] = {"error", "warn", "info", "debug"};
static const char *const level_tags[] = {"ERROR", "WARN ", "INFO ", "DEBUG"};

void kvi_log_set_level(enum kvi_log_level level)
{
    atomic_store_explicit(&log_level, (int)level, memory_order_relaxed);
}

enum kvi_log_level kvi_log_level(void)
{
    return (enum kvi_log_level)atomic_load_explicit(&log_level, memory_order_relaxed);
}

int kvi_log_parse_level(const char *s, enum kvi_log_level *out)
{
    if (s == NULL)
        return -EINVAL;
    for (int i = 0; i <= KVI_LOG_DEBUG; i++) {
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = (enum kvi_log_level)i;
            return 0;
        }
    }
    if (strcasecmp(s, "warning") == 0) {
        *out = KVI_LOG_WARN;
        return 0;
    }
    return -EINVAL;
}

const char *kvi_log_level_name(enum kvi_log_level level)
{
    return (unsigned)level <= KVI_LOG_DEBUG ? level_names[level] : "?";
}

bool kvi_log_enabled(enum kvi_log_level level)
{
    return (int)level <= atomic_load_explicit(&log_level, memory_order_relaxed);
}

void kvi_log(enum kvi_log_level level, const char *fmt, ...)
{
    if (!kvi_log_enabled(level))
        return;
    char line[LOG_LINE_MAX];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                     level_tags[(unsigned)level <= KVI_LOG_DEBUG ? level : 0]);
    if (n < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t room = sizeof line - (size_t)n - 2;
    size_t len = (size_t)n + (m < 0 ? 0 : ((size_t)m < room ? (size_t)m : room));
    while (len > (size_t)n && line[len - 1] == '\n')
        len--;
    line[len++] = '\n';
    if (atomic_load_explicit(&sink_on, memory_order_acquire)) { /* pairs with set_sink's release */
        pthread_mutex_lock(&sink_mu);
        bool sent = sink_fn != NULL;
        if (sent)
            sink_fn(sink_ctx, level, line, len);
        pthread_mutex_unlock(&sink_mu);
        if (sent)
            return;
    }
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
