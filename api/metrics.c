/*
 * Prometheus text rendering of kvidxd's metrics (see api/metrics.h). Every
 * figure is read at scrape time from the components' own counters; nothing
 * here is on a request path other than /metrics itself.
 */
#include "api/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "api/recovery.h"
#include "engine/rcu.h"
#include "net/listener.h"
#include "net/nats_bridge.h"

#ifdef KVI_WITH_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

static void put_help(struct kvi_buf *b, const char *name, const char *type, const char *help)
{
    kvi_buf_puts(b, "# HELP ");
    kvi_buf_puts(b, name);
    kvi_buf_putc(b, ' ');
    kvi_buf_puts(b, help);
    kvi_buf_puts(b, "\n# TYPE ");
    kvi_buf_puts(b, name);
    kvi_buf_putc(b, ' ');
    kvi_buf_puts(b, type);
    kvi_buf_putc(b, '\n');
}

/* A label value, escaped as the text format requires (\\, \", \n). */
static void put_label_value(struct kvi_buf *b, const char *s)
{
    kvi_buf_putc(b, '"');
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') {
            kvi_buf_putc(b, '\\');
            kvi_buf_putc(b, *s);
        } else if (*s == '\n') {
            kvi_buf_puts(b, "\\n");
        } else {
            kvi_buf_putc(b, *s);
        }
    }
    kvi_buf_putc(b, '"');
}

static void put_double(struct kvi_buf *b, double v)
{
    char tmp[64];
    int n = snprintf(tmp, sizeof tmp, "%.10g", v);
    kvi_buf_put(b, tmp, (size_t)n);
}

/* name{labels} value\n; labels is preformatted ("" for none). */
static void put_u64(struct kvi_buf *b, const char *name, const char *labels, uint64_t v)
{
    kvi_buf_puts(b, name);
    if (labels[0]) {
        kvi_buf_putc(b, '{');
        kvi_buf_puts(b, labels);
        kvi_buf_putc(b, '}');
    }
    kvi_buf_putc(b, ' ');
    kvi_buf_put_u64(b, v);
    kvi_buf_putc(b, '\n');
}

/* One unlabelled sample with its HELP and TYPE lines. */
static void put_one(struct kvi_buf *b, const char *name, const char *type, const char *help, uint64_t v)
{
    put_help(b, name, type, help);
    put_u64(b, name, "", v);
}

static void put_sec(struct kvi_buf *b, const char *name, const char *labels, uint64_t ns)
{
    kvi_buf_puts(b, name);
    if (labels[0]) {
        kvi_buf_putc(b, '{');
        kvi_buf_puts(b, labels);
        kvi_buf_putc(b, '}');
    }
    kvi_buf_putc(b, ' ');
    put_double(b, (double)ns / 1e9);
    kvi_buf_putc(b, '\n');
}

/* Build `key="value"` pairs into buf. */
static const char *lab1(char *buf, size_t cap, const char *k, const char *v)
{
    struct kvi_buf t = {0};
    kvi_buf_puts(&t, k);
    kvi_buf_putc(&t, '=');
    put_label_value(&t, v);
    snprintf(buf, cap, "%.*s", (int)t.len, t.data ? t.data : "");
    kvi_buf_free(&t);
    return buf;
}

static const char *lab2(char *buf, size_t cap, const char *k1, const char *v1, const char *k2, const char *v2)
{
    struct kvi_buf t = {0};
    kvi_buf_puts(&t, k1);
    kvi_buf_putc(&t, '=');
    put_label_value(&t, v1);
    kvi_buf_putc(&t, ',');
    kvi_buf_puts(&t, k2);
    kvi_buf_putc(&t, '=');
    put_label_value(&t, v2);
    snprintf(buf, cap, "%.*s", (int)t.len, t.data ? t.data : "");
    kvi_buf_free(&t);
    return buf;
}

/* A histogram from non-cumulative buckets with upper bounds bound_s(i). */
static void put_hist(struct kvi_buf *b, const char *name, const char *labels, const uint64_t *buckets, unsigned nb,
                     double first_bound_s, uint64_t count, double sum_s)
{
    uint64_t cum = 0;
    double bound = first_bound_s;
    for (unsigned i = 0; i < nb; i++, bound *= 2) {
        cum += buckets[i];
        kvi_buf_puts(b, name);
        kvi_buf_puts(b, "_bucket{");
        if (labels[0]) {
            kvi_buf_puts(b, labels);
            kvi_buf_putc(b, ',');
        }
        kvi_buf_puts(b, "le=\"");
        put_double(b, bound);
        kvi_buf_puts(b, "\"} ");
        kvi_buf_put_u64(b, cum);
        kvi_buf_putc(b, '\n');
    }
    kvi_buf_puts(b, name);
    kvi_buf_puts(b, "_bucket{");
    if (labels[0]) {
        kvi_buf_puts(b, labels);
        kvi_buf_putc(b, ',');
    }
    kvi_buf_puts(b, "le=\"+Inf\"} ");
    kvi_buf_put_u64(b, count);
    kvi_buf_putc(b, '\n');
    kvi_buf_puts(b, name);
    kvi_buf_puts(b, "_sum");
    if (labels[0]) {
        kvi_buf_putc(b, '{');
        kvi_buf_puts(b, labels);
        kvi_buf_putc(b, '}');
    }
    kvi_buf_putc(b, ' ');
    put_double(b, sum_s);
    kvi_buf_putc(b, '\n');
    kvi_buf_puts(b, name);
    kvi_buf_puts(b, "_count");
    if (labels[0]) {
        kvi_buf_putc(b, '{');
        kvi_buf_puts(b, labels);
        kvi_buf_putc(b, '}');
    }
    kvi_buf_putc(b, ' ');
    kvi_buf_put_u64(b, count);
    kvi_buf_putc(b, '\n');
}

static const char *method_name(unsigned m)
{
    if (m & KVI_HTTP_POST)
        return "POST";
    if (m & KVI_HTTP_GET)
        return "GET";
    if (m & KVI_HTTP_PUT)
        return "PUT";
    if (m & KVI_HTTP_DELETE)
        return "DELETE";
    return "unknown";
}

/* ---- the six Dynamo metrics ---------------------------------------------------------- */

static void render_http(const struct kvi_metrics_src *src, struct kvi_buf *b)
{
    int nr = kvi_http_route_count(src->srv);
    struct kvi_http_stats hs;
    kvi_http_server_stats(src->srv, &hs);
    char l[1024];
    const char *dur = "dynamo_kvindexer_request_duration_seconds";
    put_help(b, dur, "histogram", "HTTP request latency");
    for (int r = 0; r <= nr; r++) {
        struct kvi_http_counters c;
        const char *path = "unknown";
        if (r < nr) {
            if (r == src->metrics_route || kvi_http_route_stats(src->srv, r, &c) != 0)
                continue;
            path = kvi_http_route_path(src->srv, r, NULL);
        } else {
            c = hs.unmatched;
        }
        if (c.requests == 0)
            continue;
        uint64_t answered = 0;
        for (unsigned i = 0; i <= KVI_HTTP_LATENCY_BUCKETS; i++)
            answered += c.latency_buckets[i];
        put_hist(b, dur, lab1(l, sizeof l, "endpoint", path), c.latency_buckets, KVI_HTTP_LATENCY_BUCKETS, 0.0001,
                 answered, (double)c.latency_ns_sum / 1e9);
    }
    put_help(b, "dynamo_kvindexer_requests_total", "counter", "Total HTTP requests");
    for (int r = 0; r <= nr; r++) {
        struct kvi_http_counters c;
        const char *path = "unknown", *method = "unknown";
        if (r < nr) {
            unsigned m = 0;
            if (r == src->metrics_route || kvi_http_route_stats(src->srv, r, &c) != 0)
                continue;
            path = kvi_http_route_path(src->srv, r, &m);
            method = method_name(m);
        } else {
            c = hs.unmatched;
        }
        if (c.requests > 0)
            put_u64(b, "dynamo_kvindexer_requests_total", lab2(l, sizeof l, "endpoint", path, "method", method),
                    c.requests);
    }
    put_help(b, "dynamo_kvindexer_errors_total", "counter", "HTTP error responses (4xx/5xx)");
    for (int r = 0; r <= nr; r++) {
        struct kvi_http_counters c;
        const char *path = "unknown";
        if (r < nr) {
            if (r == src->metrics_route || kvi_http_route_stats(src->srv, r, &c) != 0)
                continue;
            path = kvi_http_route_path(src->srv, r, NULL);
        } else {
            c = hs.unmatched;
        }
        if (c.status[4] > 0)
            put_u64(b, "dynamo_kvindexer_errors_total", lab2(l, sizeof l, "endpoint", path, "status_class", "4xx"),
                    c.status[4]);
        if (c.status[5] > 0)
            put_u64(b, "dynamo_kvindexer_errors_total", lab2(l, sizeof l, "endpoint", path, "status_class", "5xx"),
                    c.status[5]);
    }
}

static void render_gauges(const struct kvi_metrics_src *src, const struct kvi_listener_totals *t, struct kvi_buf *b)
{
    struct kvi_service_counts sc;
    kvi_service_counts(src->svc, &sc);
    kvi_rcu_read_lock();
    size_t models = kvi_nsreg_list(kvi_service_nsreg(src->svc), NULL, 0);
    kvi_rcu_read_unlock();
    put_help(b, "dynamo_kvindexer_models", "gauge", "Number of active model+tenant indexers");
    put_u64(b, "dynamo_kvindexer_models", "", models);
    put_help(b, "dynamo_kvindexer_workers", "gauge", "Number of registered worker instances");
    put_u64(b, "dynamo_kvindexer_workers", "", sc.workers);
    put_help(b, "dynamo_kvindexer_listeners", "gauge", "ZMQ listeners by status");
    char l[128];
    for (int s = 0; s < KVI_LISTENER_STATES; s++)
        put_u64(b, "dynamo_kvindexer_listeners",
                lab1(l, sizeof l, "status", kvi_listener_state_name((enum kvi_listener_state)s)), t->by_state[s]);
}

/* ---- kvidx_* ------------------------------------------------------------------------------ */

static void render_events(const struct kvi_listener_totals *t, struct kvi_buf *b)
{
    const struct kvi_listener_counters *c = &t->ctr;
    char l[128];
    put_help(b, "kvidx_events_total", "counter", "KV events decoded from engines, by type");
    put_u64(b, "kvidx_events_total", lab1(l, sizeof l, "type", "stored"), c->events_stored);
    put_u64(b, "kvidx_events_total", lab1(l, sizeof l, "type", "removed"), c->events_removed);
    put_u64(b, "kvidx_events_total", lab1(l, sizeof l, "type", "cleared"), c->events_cleared);
    put_u64(b, "kvidx_events_total", lab1(l, sizeof l, "type", "unknown"), c->events_unknown);
    put_u64(b, "kvidx_events_total", lab1(l, sizeof l, "type", "invalid"), c->events_invalid);
    put_help(b, "kvidx_event_ops_total", "counter", "Index ops applied by the writers, by outcome");
    put_u64(b, "kvidx_event_ops_total", lab1(l, sizeof l, "outcome", "applied"), c->ops_applied);
    put_u64(b, "kvidx_event_ops_total", lab1(l, sizeof l, "outcome", "parent_block_not_found"),
            c->ops_parent_not_found);
    put_u64(b, "kvidx_event_ops_total", lab1(l, sizeof l, "outcome", "invalid_block"), c->ops_invalid);
    put_u64(b, "kvidx_event_ops_total", lab1(l, sizeof l, "outcome", "block_not_found"), c->unknown_blocks);

#define KVI_METRIC_X(name, help) put_one(b, "kvidx_listener_" #name "_total", "counter", help, c->name);
    KVI_LISTENER_COUNTERS(KVI_METRIC_X)
    KVI_LISTENER_EVENT_COUNTERS(KVI_METRIC_X)
#undef KVI_METRIC_X
    put_one(b, "kvidx_listener_unknown_topic_total", "counter",
            "bind mode: messages whose topic matched no registration", t->unknown_topic);
    put_one(b, "kvidx_listener_held_dropped_total", "counter",
            "open bind endpoints (--zmq-bind): messages held for a pod being registered, dropped past the bound",
            t->held_dropped);
    put_one(b, "kvidx_listener_threads", "gauge", "listener threads", t->threads);
}

static void render_writers(const struct kvi_metrics_src *src, struct kvi_buf *b)
{
    struct kvi_writer_pool *wp = kvi_service_writers(src->svc);
    uint32_t n = kvi_writer_pool_size(wp);
    struct kvi_writer_stats st[KVI_WRITER_MAX];
    for (uint32_t w = 0; w < n; w++)
        kvi_writer_stats(wp, w, &st[w]);
    char l[64], id[16];
    struct {
        const char *name, *type, *help;
        int which;
    } m[] = {
        {"kvidx_writer_ops_total", "counter", "ops applied by the writer", 0},
        {"kvidx_writer_queued_ops", "gauge", "ops submitted to the writer and not applied yet (ring occupancy)", 1},
        {"kvidx_writer_blocks_total", "counter", "blocks in store ops applied by the writer", 2},
        {"kvidx_writer_sleeps_total", "counter", "times the writer went to sleep", 3},
        {"kvidx_writer_stalls_total", "counter", "submits that found the writer's ring full", 4},
    };
    for (size_t k = 0; k < sizeof m / sizeof m[0]; k++) {
        put_help(b, m[k].name, m[k].type, m[k].help);
        for (uint32_t w = 0; w < n; w++) {
            snprintf(id, sizeof id, "%" PRIu32, w);
            uint64_t v = m[k].which == 0   ? st[w].ops
                         : m[k].which == 1 ? st[w].queued
                         : m[k].which == 2 ? st[w].blocks_stored
                         : m[k].which == 3 ? st[w].sleeps
                                           : st[w].stalls;
            put_u64(b, m[k].name, lab1(l, sizeof l, "writer", id), v);
        }
    }
    put_help(b, "kvidx_writer_lag_seconds", "gauge", "submit-to-apply delay of the writer's last op");
    for (uint32_t w = 0; w < n; w++) {
        snprintf(id, sizeof id, "%" PRIu32, w);
        put_sec(b, "kvidx_writer_lag_seconds", lab1(l, sizeof l, "writer", id), st[w].last_lag_ns);
    }
    put_help(b, "kvidx_writer_max_lag_seconds", "gauge", "largest submit-to-apply delay seen");
    for (uint32_t w = 0; w < n; w++) {
        snprintf(id, sizeof id, "%" PRIu32, w);
        put_sec(b, "kvidx_writer_max_lag_seconds", lab1(l, sizeof l, "writer", id), st[w].max_lag_ns);
    }
    put_help(b, "kvidx_writer_busy_seconds_total", "counter", "time the writer spent applying ops");
    for (uint32_t w = 0; w < n; w++) {
        snprintf(id, sizeof id, "%" PRIu32, w);
        put_sec(b, "kvidx_writer_busy_seconds_total", lab1(l, sizeof l, "writer", id), st[w].busy_ns);
    }
}

static void render_indexes(const struct kvi_metrics_src *src, struct kvi_buf *b)
{
    struct kvi_nsreg *reg = kvi_service_nsreg(src->svc);
#define STAT(f) offsetof(struct kvi_index_stats, f)
    struct {
        const char *name, *type, *help;
        size_t off;  /* of the uint64_t field of struct kvi_index_stats */
        bool sec;    /* the field is in ns, exposed in seconds */
    } m[] = {
        {"kvidx_index_entries", "gauge", "distinct indexed prefixes (blocks)", STAT(entries), false},
        {"kvidx_index_holdings", "gauge", "(block, worker slot) pairs held", STAT(holdings), false},
        {"kvidx_index_slots", "gauge", "live (instance, dp_rank, tier) slots", STAT(slots), false},
        {"kvidx_index_bytes", "gauge", "bytes allocated by the index", STAT(bytes), false},
        {"kvidx_index_stored_blocks_total", "counter", "blocks newly stored", STAT(stored_blocks), false},
        {"kvidx_index_removed_blocks_total", "counter", "blocks removed, cascades included", STAT(removed_blocks),
         false},
        {"kvidx_index_parent_not_found_total", "counter", "stores rejected: parent unknown", STAT(parent_not_found),
         false},
        {"kvidx_index_parent_elsewhere_total", "counter",
         "lower-tier seq-hash stores whose parent the rank does not hold, placed by position",
         STAT(parent_elsewhere), false},
        {"kvidx_index_seq_conflicts_total", "counter",
         "stored blocks whose seq hash named no prefix while their content did: they joined it",
         STAT(seq_conflicts), false},
        {"kvidx_index_unknown_removes_total", "counter", "removes of unknown blocks (no-ops)", STAT(unknown_removes),
         false},
        {"kvidx_index_table_rebuilds_total", "counter", "hash tables rebuilt to grow, shrink or purge tombstones",
         STAT(table_rebuilds), false},
        {"kvidx_index_table_rebuild_slots_total", "counter", "live table slots moved by those rebuilds",
         STAT(table_rebuild_slots), false},
        {"kvidx_index_table_rebuild_seconds_total", "counter", "writer time spent in those rebuilds",
         STAT(table_rebuild_ns), true},
    };
#undef STAT
    const size_t nm = sizeof m / sizeof m[0];
    kvi_rcu_read_lock();
    struct kvi_ns *list[256];
    size_t n = kvi_nsreg_list(reg, list, 256);
    if (n > 256)
        n = 256; /* the first 256 namespaces by (model, tenant) */
    static _Thread_local struct kvi_index_stats st[256];
    for (size_t i = 0; i < n; i++)
        kvi_index_stats(list[i]->ix, &st[i]);
    char l[1024];
    for (size_t k = 0; k < nm; k++) {
        put_help(b, m[k].name, m[k].type, m[k].help);
        for (size_t i = 0; i < n; i++) {
            uint64_t v;
            memcpy(&v, (const char *)&st[i] + m[k].off, sizeof v);
            const char *lab = lab2(l, sizeof l, "model", list[i]->model, "tenant", list[i]->tenant);
            if (m[k].sec)
                put_sec(b, m[k].name, lab, v);
            else
                put_u64(b, m[k].name, lab, v);
        }
    }
    kvi_rcu_read_unlock();
}

static void render_memory(struct kvi_buf *b)
{
#ifdef KVI_WITH_JEMALLOC
    uint64_t epoch = 1;
    size_t sz = sizeof epoch;
    mallctl("epoch", &epoch, &sz, &epoch, sz);
    const char *keys[] = {"stats.allocated", "stats.active", "stats.resident", "stats.mapped"};
    const char *names[] = {"kvidx_memory_allocated_bytes", "kvidx_memory_active_bytes", "kvidx_memory_resident_bytes",
                           "kvidx_memory_mapped_bytes"};
    const char *helps[] = {"bytes allocated by the application (jemalloc stats.allocated)",
                           "bytes in active pages (jemalloc stats.active)",
                           "bytes in physically resident pages (jemalloc stats.resident)",
                           "bytes in mapped extents (jemalloc stats.mapped)"};
    for (int i = 0; i < 4; i++) {
        size_t v = 0;
        sz = sizeof v;
        if (mallctl(keys[i], &v, &sz, NULL, 0) != 0)
            continue;
        put_help(b, names[i], "gauge", helps[i]);
        put_u64(b, names[i], "", v);
    }
#else
    (void)b;
#endif
}

static void render_queries(const struct kvi_metrics_src *src, struct kvi_buf *b)
{
    static const char *const route[KVI_QK_COUNT] = {"/query", "/query_by_hash", "/query", "/query_by_hash"};
    static const char *const dialect[KVI_QK_COUNT] = {"dynamo", "dynamo", "conductor", "conductor"};
    char l[128];
    put_help(b, "kvidx_query_duration_seconds", "histogram",
             "query handler time (parse, hash, index lookup, encode), measured on the loop thread");
    uint64_t blocks[KVI_QK_COUNT] = {0};
    for (int k = 0; k < KVI_QK_COUNT; k++) {
        uint64_t bk[KVI_QUERY_BUCKETS + 1] = {0}, count = 0, sum = 0;
        for (unsigned t = 0; t < src->n_threads; t++) {
            const struct kvi_query_hist *h = &src->hists[t * KVI_QK_COUNT + (unsigned)k];
            for (unsigned i = 0; i <= KVI_QUERY_BUCKETS; i++)
                bk[i] += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
            count += atomic_load_explicit(&h->count, memory_order_relaxed);
            sum += atomic_load_explicit(&h->sum_ns, memory_order_relaxed);
            blocks[k] += atomic_load_explicit(&h->blocks, memory_order_relaxed);
        }
        put_hist(b, "kvidx_query_duration_seconds", lab2(l, sizeof l, "route", route[k], "dialect", dialect[k]), bk,
                 KVI_QUERY_BUCKETS, 0.000001, count, (double)sum / 1e9);
    }
    put_help(b, "kvidx_query_blocks_total", "counter", "blocks (hashes) looked up by queries");
    for (int k = 0; k < KVI_QK_COUNT; k++)
        put_u64(b, "kvidx_query_blocks_total", lab2(l, sizeof l, "route", route[k], "dialect", dialect[k]),
                blocks[k]);
}

static void render_misc(const struct kvi_metrics_src *src, struct kvi_buf *b)
{
    struct kvi_http_stats hs;
    kvi_http_server_stats(src->srv, &hs);
    const struct {
        const char *name, *type, *help;
        uint64_t v;
    } http[] = {
        {"kvidx_http_connections_open", "gauge", "open HTTP connections", hs.conns_open},
        {"kvidx_http_connections_accepted_total", "counter", "HTTP connections accepted", hs.conns_accepted},
        {"kvidx_http_connections_rejected_total", "counter", "HTTP connections refused over the limit",
         hs.conns_rejected},
        {"kvidx_http_connections_rejected_per_address_total", "counter",
         "HTTP connections refused over --max-conns-per-addr", hs.conns_rejected_addr},
        {"kvidx_http_accept_failures_total", "counter",
         "accept() failures for want of descriptors or memory (accepting pauses 100 ms)", hs.accept_failures},
        {"kvidx_http_h2_stream_resets_total", "counter", "RST_STREAM frames received from HTTP/2 clients",
         hs.h2_resets},
        {"kvidx_http_h2_reset_floods_total", "counter",
         "HTTP/2 connections closed with GOAWAY ENHANCE_YOUR_CALM past --h2-max-resets", hs.h2_reset_floods},
        {"kvidx_http_output_buffered_bytes", "gauge",
         "answer bytes handed to clients and not yet taken (with 4096 per answer for its request)",
         hs.output_buffered},
        {"kvidx_http_output_conn_closed_total", "counter",
         "connections closed past --http-conn-output-limit unread answer bytes", hs.output_conn_closed},
        {"kvidx_http_output_refused_total", "counter", "answers replaced by 503 past --http-output-limit",
         hs.output_refused},
        {"kvidx_http_write_timeouts_total", "counter",
         "connections closed because the client took nothing of an answer for --idle-timeout-ms", hs.write_timeouts},
        {"kvidx_http_requests_rejected_total", "counter",
         "requests refused with 400 for ambiguous framing or a non-canonical target", hs.rejected},
        {"kvidx_http_requests_in_flight", "gauge", "dispatched HTTP requests not yet finished", hs.in_flight},
        {"kvidx_http_request_bytes_total", "counter", "request body bytes", hs.all.bytes_in},
        {"kvidx_http_response_bytes_total", "counter", "response body bytes", hs.all.bytes_out},
    };
    for (size_t i = 0; i < sizeof http / sizeof http[0]; i++) {
        put_one(b, http[i].name, http[i].type, http[i].help, http[i].v);
    }

    struct kvi_status_view sv;
    kvi_service_status(src->svc, &sv);
    put_one(b, "kvidx_ready", "gauge", "1 when /ready answers 200", sv.ready);
    struct kvi_service_counts sc;
    kvi_service_counts(src->svc, &sc);
    put_one(b, "kvidx_conductor_services", "gauge", "registered Conductor service keys", sc.services);
    put_one(b, "kvidx_peers", "gauge", "registered peers", sc.peers);
    struct kvi_recovery_stats rs;
    kvi_service_recovery_stats(src->svc, &rs);
    put_one(b, "kvidx_recovery_attempts_total", "counter", "peer /dump fetches started by P2P recovery", rs.attempts);
    put_one(b, "kvidx_recovery_blocks", "gauge", "blocks applied by the successful P2P recovery", rs.blocks);
    put_one(b, "kvidx_recovery_rejected_blocks", "gauge", "dump blocks the index rejected during recovery",
            rs.rejected);
    put_help(b, "kvidx_recovery_duration_seconds", "gauge", "duration of P2P recovery");
    put_sec(b, "kvidx_recovery_duration_seconds", "", rs.duration_ms * 1000000u);
}

/* capacity_blocks: what the index is pre-sized for now (api/service_capacity.c). */
static void render_capacity(const struct kvi_metrics_src *src, struct kvi_buf *b)
{
    struct kvi_capacity_counters c;
    kvi_service_capacity_counters(src->svc, &c);
    put_one(b, "kvidx_capacity_reserved_entries", "gauge",
            "prefix entries the partitions are pre-sized for by registrations' capacity_blocks", c.reserved_entries);
    put_one(b, "kvidx_capacity_reserved_blocks", "gauge",
            "blocks the registered ranks' slot maps are pre-sized for by their capacity_blocks", c.reserved_blocks);
    put_one(b, "kvidx_capacity_registrations_total", "counter", "registrations whose capacity_blocks was applied",
            c.reservations);
    put_one(b, "kvidx_capacity_capped_total", "counter", "of them, capacity_blocks cut to --capacity-max-blocks",
            c.capped);
}

/* --zmq-bind: pods registered, created, forgotten, and the messages dropped before a registration. */
static void render_zbind(const struct kvi_metrics_src *src, struct kvi_buf *b)
{
    struct kvi_zbind_counters z;
    kvi_service_zbind_counters(src->svc, &z);
    put_one(b, "kvidx_zmq_bind_endpoints", "gauge", "bind endpoints open now (--zmq-bind, POST /zmq/bind)",
            z.endpoints_open);
    put_one(b, "kvidx_zmq_bind_endpoints_refused_total", "counter",
            "POST /zmq/bind answered 429: the most bind endpoints kvidxd keeps are known", z.endpoints_refused);
    put_one(b, "kvidx_zmq_bind_pods", "gauge", "--zmq-bind pods registered now", z.pods);
    put_one(b, "kvidx_zmq_bind_pods_created_total", "counter", "--zmq-bind pods registered on their first message",
            z.pods_created);
    put_one(b, "kvidx_zmq_bind_pods_forgotten_total", "counter",
            "--zmq-bind pods forgotten (blocks dropped) after --zmq-bind-idle-s without a message", z.pods_forgotten);
    put_one(b, "kvidx_zmq_bind_bad_topic_total", "counter",
            "--zmq-bind messages dropped: topic not kv@<pod-id>@<model-name>", z.bad_topic);
    put_one(b, "kvidx_zmq_bind_pods_refused_total", "counter",
            "--zmq-bind messages of a new pod dropped: past --zmq-bind-max-pods, or no namespace or registration",
            z.pods_refused);
    put_one(b, "kvidx_zmq_bind_no_block_size_total", "counter",
            "--zmq-bind first messages of a new pod dropped: no block size from the flag or a BlockStored",
            z.no_block_size);
}

/* --nats-publish: the bridge's counters (net/nats_bridge.h). */
static void render_bridge(const struct kvi_metrics_src *src, struct kvi_buf *b)
{
    struct kvi_nats_bridge *br = kvi_service_bridge(src->svc);
    if (br == NULL)
        return;
    struct kvi_nats_bridge_stats s;
    kvi_nats_bridge_stats(br, &s);
    const struct {
        const char *name, *type, *help;
        uint64_t v;
    } f[] = {
        {"kvidx_nats_bridge_events_total", "counter", "index changes of ZMQ registrations queued for the stream",
         s.events},
        {"kvidx_nats_bridge_published_total", "counter", "publishes handed to libnats (resends included)",
         s.published},
        {"kvidx_nats_bridge_acked_total", "counter", "events the stream stored", s.acked},
        {"kvidx_nats_bridge_duplicates_total", "counter",
         "events the stream had already (same Nats-Msg-Id: another bridging replica, or a resend)", s.duplicates},
        {"kvidx_nats_bridge_errors_total", "counter", "failed publishes (each is queued again)", s.errors},
        {"kvidx_nats_bridge_resent_total", "counter", "publishes sent again after 10 s without an ack", s.resent},
        {"kvidx_nats_bridge_dropped_total", "counter",
         "events not published: the queue was full (NATS unreachable for long)", s.dropped},
        {"kvidx_nats_bridge_skipped_total", "counter",
         "index changes with no RouterEvent form (token-less or seq-only stores, shared pools)", s.skipped},
        {"kvidx_nats_bridge_resumed_skipped_total", "counter",
         "events the stream held already when a registration resumed (not published again)", s.resumed_skipped},
        {"kvidx_nats_bridge_queued", "gauge", "events waiting to be published", s.queued},
        {"kvidx_nats_bridge_queued_bytes", "gauge", "their bytes (bounded: past the bound events are dropped)",
         s.queued_bytes},
        {"kvidx_nats_bridge_pending", "gauge", "events published and not acknowledged yet", s.pending},
        {"kvidx_nats_bridge_stream_ready", "gauge", "1 once the stream exists (created or found)", s.stream_ready},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        put_one(b, f[i].name, f[i].type, f[i].help, f[i].v);
    }
}

/* A NATS source's `source` label: its subject (Core NATS) or its stream (JetStream). */
static const char *nats_source_name(const struct kvi_nats_source_info *si)
{
    return si->kind == KVI_NATS_CORE ? si->subject : si->stream;
}

/* --nats: the connection, then each source (label source = its subject or stream, kind, model). */
static void render_nats(const struct kvi_metrics_src *src, struct kvi_buf *b)
{
    struct kvi_nats *n = kvi_service_nats(src->svc);
    if (n == NULL)
        return;
    struct kvi_nats_conn_info ci;
    kvi_nats_conn_info(n, &ci);
    put_one(b, "kvidx_nats_connected", "gauge", "1 while connected to a NATS server", ci.connected);
    put_one(b, "kvidx_nats_reconnects_total", "counter", "reconnections to NATS", ci.reconnects);
    put_one(b, "kvidx_nats_disconnects_total", "counter", "NATS connections lost", ci.disconnects);
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } f[] = {
#define NF(field, name, type, help) {name, type, help, offsetof(struct kvi_nats_counters, field)}
        NF(messages, "kvidx_nats_messages_total", "counter", "NATS messages received"),
        NF(bytes, "kvidx_nats_bytes_total", "counter", "NATS payload bytes received"),
        NF(applied, "kvidx_nats_events_applied_total", "counter", "RouterEvents handed to the writers"),
        NF(invalid, "kvidx_nats_events_invalid_total", "counter",
           "RouterEvents decoded but not indexable (stored at start_position > 0 without a parent)"),
        NF(stale, "kvidx_nats_events_stale_total", "counter",
           "RouterEvents dropped: event_id not past the last applied of their (worker, dp_rank)"),
        NF(gaps, "kvidx_nats_gaps_total", "counter", "event_id jumps (events lost before kvidx)"),
        NF(events_lost, "kvidx_nats_events_lost_total", "counter", "event ids skipped by gaps"),
        NF(restarts, "kvidx_nats_publisher_restarts_total", "counter", "publishers seen starting over"),
        NF(dropped, "kvidx_nats_slow_consumer_dropped_total", "counter",
           "Core NATS messages the client dropped past its pending limits"),
        NF(redelivered, "kvidx_nats_redelivered_total", "counter", "JetStream messages delivered again"),
        NF(acked, "kvidx_nats_acked_total", "counter", "JetStream messages acked (after the writers applied them)"),
        NF(pending, "kvidx_nats_consumer_pending", "gauge", "JetStream messages the consumer has yet to deliver"),
        NF(consumer_errors, "kvidx_nats_consumer_errors_total", "counter",
           "JetStream consumer set-up and fetch failures (retried)"),
        NF(snap_written, "kvidx_nats_snapshot_written_total", "counter", "--nats-snapshot: snapshots stored"),
        NF(snap_failed, "kvidx_nats_snapshot_failed_total", "counter",
           "--nats-snapshot: snapshots that could not be stored (retried next period)"),
        NF(snap_superseded, "kvidx_nats_snapshot_superseded_total", "counter",
           "--nats-snapshot: snapshots discarded because a replica stored one as new or newer"),
        NF(snap_seq, "kvidx_nats_snapshot_seq", "gauge",
           "--nats-snapshot: stream sequence covered by the last snapshot stored, loaded, or found stored "
           "by another replica"),
        NF(snap_bytes, "kvidx_nats_snapshot_bytes", "gauge", "--nats-snapshot: last snapshot stored, compressed"),
        NF(snap_raw_bytes, "kvidx_nats_snapshot_raw_bytes", "gauge",
           "--nats-snapshot: last snapshot stored, uncompressed"),
        NF(snap_write_ms, "kvidx_nats_snapshot_write_ms", "gauge",
           "--nats-snapshot: last snapshot's time (dump, compress, store, purge; the source waits)"),
        NF(snap_loaded, "kvidx_nats_snapshot_loaded_total", "counter", "--nats-snapshot: snapshots loaded at start-up"),
        NF(snap_load_fallbacks, "kvidx_nats_snapshot_load_fallbacks_total", "counter",
           "--nats-snapshot: stored snapshots that did not load (the whole stream was read instead)"),
        NF(snap_load_ms, "kvidx_nats_snapshot_load_ms", "gauge", "--nats-snapshot: start-up load's time"),
        NF(snap_loaded_blocks, "kvidx_nats_snapshot_loaded_blocks", "gauge",
           "--nats-snapshot: blocks the start-up snapshot stored"),
        NF(snap_purges, "kvidx_nats_snapshot_purges_total", "counter",
           "--nats-snapshot: stream purges after a stored snapshot"),
        NF(snap_purged_below, "kvidx_nats_snapshot_purged_below_seq", "gauge",
           "--nats-snapshot: the stream was last purged below this sequence"),
#undef NF
    };
    size_t ns = kvi_nats_n_sources(n);
    struct kvi_nats_source_info *si = kvi_xmalloc(sizeof *si);
    char l[3 * KVI_NATS_NAME_MAX + 64];
    for (size_t k = 0; k < KVI_ARRAY_LEN(f); k++) {
        put_help(b, f[k].name, f[k].type, f[k].help);
        for (size_t i = 0; i < ns; i++) {
            if (kvi_nats_source_info(n, i, si) != 0)
                continue;
            const _Atomic uint64_t *c = (const _Atomic uint64_t *)((const char *)si->ctr + f[k].off);
            put_u64(b, f[k].name, lab2(l, sizeof l, "source", nats_source_name(si), "model", si->label),
                    atomic_load_explicit((_Atomic uint64_t *)c, memory_order_relaxed));
        }
    }
    put_help(b, "kvidx_nats_decode_errors_total", "counter", "NATS messages dropped undecoded, by reason");
    for (size_t i = 0; i < ns; i++) {
        if (kvi_nats_source_info(n, i, si) != 0)
            continue;
        for (int e = 1; e < KVI_REV_ERR_COUNT; e++) {
            put_u64(b, "kvidx_nats_decode_errors_total",
                    lab2(l, sizeof l, "source", nats_source_name(si), "reason",
                         kvi_router_err_name((enum kvi_rev_err)e)),
                    atomic_load_explicit(&((struct kvi_nats_counters *)si->ctr)->decode_errors[e],
                                         memory_order_relaxed));
        }
    }
    /* two per-source figures labelled by source alone: seconds, then a gauge */
    for (int k = 0; k < 2; k++) {
        const char *name = k == 0 ? "kvidx_nats_ack_latency_seconds_total" : "kvidx_nats_workers";
        put_help(b, name, k == 0 ? "counter" : "gauge",
                 k == 0 ? "JetStream receipt-to-ack time summed over acked messages (divide by kvidx_nats_acked_total)"
                        : "(worker_id, dp_rank) pairs a NATS source has seen");
        for (size_t i = 0; i < ns; i++) {
            if (kvi_nats_source_info(n, i, si) != 0)
                continue;
            const char *lb = lab1(l, sizeof l, "source", nats_source_name(si));
            if (k == 0)
                put_sec(b, name, lb,
                        atomic_load_explicit(&((struct kvi_nats_counters *)si->ctr)->ack_ns_total,
                                             memory_order_relaxed));
            else
                put_u64(b, name, lb, si->workers);
        }
    }
    free(si);
}

int kvi_metrics_render(const struct kvi_metrics_src *src, struct kvi_buf *out)
{
    struct kvi_listener_totals t;
    kvi_listeners_totals(kvi_service_listeners(src->svc), &t);
    render_http(src, out);
    render_gauges(src, &t, out);
    render_events(&t, out);
    render_writers(src, out);
    render_indexes(src, out);
    render_memory(out);
    render_queries(src, out);
    render_misc(src, out);
    render_nats(src, out);
    render_bridge(src, out);
    render_zbind(src, out);
    render_capacity(src, out);
    return kvi_buf_ok(out) ? 0 : -ENOMEM;
}
