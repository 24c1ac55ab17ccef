/*
 * kvidx-bench snapshot: what --nats-snapshot costs and saves, on a
 * namespace of N blocks (default 1,000,000) fed by a JetStream stream.
 *
 *   1. a private nats-server (tests/net/nats_server_fixture.c); one C
 *      publisher (JetStream transport, worker 1, dp_rank 0) stores N blocks
 *      as N / B stored events of B blocks (default 100), each event a new
 *      chain, one message each; --churn K first adds K rounds that store
 *      and remove as many blocks (a long stream over the same state size);
 *   2. replay: kvidxd --nats-stream (no snapshot) is started and timed
 *      until /ready answers 200 (the whole stream applied), then stopped;
 *   3. write: kvidxd with --nats-snapshot (period 1 s) reads the stream
 *      again and writes a snapshot: its size compressed and uncompressed
 *      and its time (kvidx_nats_snapshot_write_ms: dump, deflate, store,
 *      purge; the source waits meanwhile) are read from /metrics; SIGTERM;
 *   4. load: the same kvidxd started again and timed until /ready (the
 *      snapshot loaded, nothing after it in the stream);
 *      kvidx_nats_snapshot_load_ms is the load alone.
 *
 * The kvidxd binary: --kvidxd PATH, else ../api/kvidxd next to this
 * program (the build tree's layout). A benchmark: it prints figures and
 * asserts nothing. One SUMMARY line closes the run.
 */
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "engine/hash.h"
#include "net/nats_server_fixture.h"

#include <kvidx/publisher.h>

#define STREAM "kvidx-snap-bench"
#define BS 16u

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct body {
    char *p;
    size_t n;
};

static size_t on_body(char *p, size_t sz, size_t nm, void *ud)
{
    struct body *b = ud;
    char *q = realloc(b->p, b->n + sz * nm + 1);
    if (q == NULL)
        return 0;
    b->p = q;
    memcpy(b->p + b->n, p, sz * nm);
    b->n += sz * nm;
    b->p[b->n] = '\0';
    return sz * nm;
}

/* GET http://127.0.0.1:port/path: the status (0 on a transport error), the body into *b. */
static long http_get(int port, const char *path, struct body *b)
{
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    free(b->p);
    *b = (struct body){0};
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    long st = 0;
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
    curl_easy_cleanup(c);
    return st;
}

/* A metric's value (the first line starting with `name`), or -1. */
static double metric(int port, const char *name)
{
    struct body b = {0};
    double v = -1;
    if (http_get(port, "/metrics", &b) == 200)
        for (char *p = b.p; p != NULL && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
            if (strncmp(p, name, strlen(name)) == 0 && (p[strlen(name)] == '{' || p[strlen(name)] == ' ')) {
                char *sp = strchr(p, ' ');
                v = sp ? strtod(sp + 1, NULL) : -1;
                break;
            }
    free(b.p);
    return v;
}

struct daemon {
    pid_t pid;
    int port;
    char portfile[64];
};

static int start_kvidxd(struct daemon *d, const char *bin, const char *url, const char *snapshot)
{
    snprintf(d->portfile, sizeof d->portfile, "/tmp/kvidx-snap-bench-%d.port", (int)getpid());
    unlink(d->portfile);
    char source[128];
    snprintf(source, sizeof source, STREAM "=bench:t@%u", BS);
    const char *argv[32] = {bin, "--port", "0", "--port-file", d->portfile, "--nats", url, "--nats-stream", source,
                            "--nats-durable", "bench", "--slot-port", "0"};
    int n = 13;
    if (snapshot != NULL) {
        argv[n++] = "--nats-snapshot";
        argv[n++] = snapshot;
        argv[n++] = "--nats-snapshot-every-s";
        argv[n++] = "1";
    }
    argv[n] = NULL;
    d->pid = fork();
    if (d->pid < 0)
        return -errno;
    if (d->pid == 0) {
        FILE *f = freopen("/tmp/kvidx-snap-bench.log", "a", stderr);
        (void)f;
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 3000; i++) {
        FILE *f = fopen(d->portfile, "r");
        if (f != NULL) {
            int ok = fscanf(f, "%d", &d->port);
            fclose(f);
            if (ok == 1 && d->port > 0)
                return 0;
        }
        usleep(10000);
    }
    return -ETIMEDOUT;
}

static void stop_kvidxd(struct daemon *d)
{
    kill(d->pid, SIGTERM);
    waitpid(d->pid, NULL, 0);
    unlink(d->portfile);
}

/* Seconds from now until /ready answers 200 (at most 600 s; -1 then). */
static double until_ready(const struct daemon *d, double t0)
{
    struct body b = {0};
    for (;;) {
        if (http_get(d->port, "/ready", &b) == 200)
            break;
        if (now_s() - t0 > 600) {
            free(b.p);
            return -1;
        }
        usleep(20000);
    }
    free(b.p);
    return now_s() - t0;
}

/* Store `blocks` blocks in events of per_event (fresh random hashes); with `remove`, each event's
 * blocks are removed again right after it (churn: the stream grows, the state does not). */
static int publish_round(struct kvidx_pub *p, uint64_t *rng, uint64_t blocks, uint32_t per_event, bool remove)
{
    uint64_t *h = calloc(per_event, sizeof *h);
    uint32_t *tok = calloc((size_t)per_event * BS, sizeof *tok);
    int rc = 0;
    for (uint64_t done = 0; done < blocks && rc == 0; done += per_event) {
        uint32_t n = (uint32_t)(blocks - done < per_event ? blocks - done : per_event);
        for (uint32_t i = 0; i < n; i++)
            h[i] = kvi_bench_rand(rng);
        for (uint32_t i = 0; i < n * BS; i++)
            tok[i] = (uint32_t)kvi_bench_rand(rng);
        struct kvidx_pub_stored ev = {.block_hashes = h, .n_hashes = n, .token_ids = tok,
                                      .n_tokens = (size_t)n * BS, .block_size = BS};
        uint64_t seq;
        rc = kvidx_pub_publish_stored_ex(p, &ev, NULL);
        if (rc == 0 && remove)
            rc = kvidx_pub_publish_removed(p, h, n, NULL);
        if (rc == 0)
            rc = kvidx_pub_flush(p, &seq);
    }
    free(h);
    free(tok);
    return rc;
}

static int publish(const char *url, uint64_t blocks, uint32_t per_event, uint32_t churn)
{
    struct kvidx_pub_config pc;
    kvidx_pub_config_init(&pc);
    pc.transport = KVIDX_PUB_TRANSPORT_NATS_JETSTREAM;
    pc.nats_url = url;
    pc.nats_stream = STREAM;
    pc.worker_id = 1;
    pc.dp_rank = 0;
    pc.flags = KVIDX_PUB_F_NATS_CREATE_STREAM;
    struct kvidx_pub *p = kvidx_pub_create(&pc);
    if (p == NULL)
        return -errno;
    uint64_t rng = 12345;
    int rc = 0;
    for (uint32_t r = 0; r < churn && rc == 0; r++)
        rc = publish_round(p, &rng, blocks, per_event, true);
    if (rc == 0)
        rc = publish_round(p, &rng, blocks, per_event, false);
    kvidx_pub_destroy(p);
    return rc;
}

int kvi_bench_snapshot(int argc, char **argv)
{
    uint64_t blocks = 1000000;
    uint32_t per_event = 100, churn = 0;
    char bin[PATH_MAX] = "";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--blocks") && i + 1 < argc)
            blocks = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--per-event") && i + 1 < argc)
            per_event = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--churn") && i + 1 < argc)
            churn = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--kvidxd") && i + 1 < argc)
            snprintf(bin, sizeof bin, "%s", argv[++i]);
        else {
            fprintf(stderr, "usage: kvidx-bench snapshot [--blocks N (1000000)] [--per-event B (100)] "
                            "[--churn K (0)] [--kvidxd PATH]\n");
            return 2;
        }
    }
    if (bin[0] == '\0') {
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0)
            return 1;
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        *slash = '\0';
        snprintf(bin, sizeof bin, "%.*s/../api/kvidxd", (int)(PATH_MAX - 16), self);
    }
    if (per_event == 0 || blocks == 0)
        return 2;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    struct kvi_nats_server ns;
    if (kvi_nats_server_start(&ns, 10000) != 0) {
        fprintf(stderr, "snapshot: no nats-server\n");
        return 1;
    }
    printf("snapshot: %" PRIu64 " blocks in %" PRIu64 " stored events of %u blocks (block_size %u), JetStream "
           "file storage, after %u churn round(s) (each stores and removes as many blocks: 2 events per event "
           "of the final state); kvidxd %s (log: /tmp/kvidx-snap-bench.log)\n",
           blocks, (blocks + per_event - 1) / per_event, per_event, BS, churn, bin);
    double t0 = now_s();
    int rc = publish(ns.url, blocks, per_event, churn);
    if (rc != 0) {
        fprintf(stderr, "snapshot: publish failed (%d)\n", rc);
        kvi_nats_server_stop(&ns);
        return 1;
    }
    printf("  published in %.2f s\n", now_s() - t0);

    struct daemon d;
    t0 = now_s();
    if (start_kvidxd(&d, bin, ns.url, NULL) != 0)
        goto fail;
    double replay_s = until_ready(&d, t0);
    double entries = metric(d.port, "kvidx_index_entries");
    stop_kvidxd(&d);
    printf("  replay (no snapshot): ready after %.2f s (%.0f index entries)\n", replay_s, entries);

    t0 = now_s();
    if (start_kvidxd(&d, bin, ns.url, "SNAPBENCH") != 0)
        goto fail;
    double replay2_s = until_ready(&d, t0);
    /* the stream's last sequence: one message per event, two per event of a churn round */
    double last_seq = (double)((blocks + per_event - 1) / per_event) * (2.0 * churn + 1);
    for (int i = 0; i < 6000 && metric(d.port, "kvidx_nats_snapshot_seq") < last_seq; i++)
        usleep(50000);
    double written = metric(d.port, "kvidx_nats_snapshot_written_total");
    double bytes = metric(d.port, "kvidx_nats_snapshot_bytes");
    double raw = metric(d.port, "kvidx_nats_snapshot_raw_bytes");
    double write_ms = metric(d.port, "kvidx_nats_snapshot_write_ms");
    double below = metric(d.port, "kvidx_nats_snapshot_purged_below_seq");
    stop_kvidxd(&d);
    printf("  write: %.0f snapshot(s); %.1f MB compressed, %.1f MB uncompressed (%.1fx); %.0f ms (dump, deflate, "
           "store, purge); stream purged below %.0f; (replay before it: %.2f s)\n",
           written, bytes / 1e6, raw / 1e6, bytes > 0 ? raw / bytes : 0, write_ms, below, replay2_s);

    t0 = now_s();
    if (start_kvidxd(&d, bin, ns.url, "SNAPBENCH") != 0)
        goto fail;
    double load_s = until_ready(&d, t0);
    double load_ms = metric(d.port, "kvidx_nats_snapshot_load_ms");
    double loaded_blocks = metric(d.port, "kvidx_nats_snapshot_loaded_blocks");
    double msgs = metric(d.port, "kvidx_nats_messages_total");
    stop_kvidxd(&d);
    printf("  load: ready after %.2f s (load %.0f ms, %.0f blocks; %.0f messages after it)\n", load_s, load_ms,
           loaded_blocks, msgs);
    printf("SUMMARY snapshot blocks=%" PRIu64 " churn=%u bytes=%.0f raw_bytes=%.0f write_ms=%.0f load_ms=%.0f "
           "ready_from_snapshot_s=%.2f ready_from_replay_s=%.2f\n",
           blocks, churn, bytes, raw, write_ms, load_ms, load_s, replay_s);
    kvi_nats_server_stop(&ns);
    curl_global_cleanup();
    return 0;
fail:
    fprintf(stderr, "snapshot: kvidxd %s did not start\n", bin);
    kvi_nats_server_stop(&ns);
    return 1;
}
