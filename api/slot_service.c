/*
 * kvidxd slot-tracker service: command line, lifetime, the mutation thread
 * (jobs and the stale-request cleanup), the peer list, the outbound replica
 * queue and its sender thread. No HTTP server and no routes: kvidxd creates
 * the slot port and mounts the routes (api/routes_slots.h,
 * api/route_route.h). DESIGN: api/slot_service.h.
 */
#include "api/slot_service.h"

#include <errno.h>
#include <inttypes.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "api/codec_slots.h"
#include "engine/common.h"
#include "engine/rcu.h"
#include "net/http_client.h"
#include "net/log.h"

static void slot_service_teardown(struct kvi_slot_service *x);

#define TICK_NS 1000000000ull         /* stale-request cleanup period */
#define BACKOFF_MIN_NS 100000000ull   /* first backoff of a failing peer */
#define BACKOFF_MAX_NS 5000000000ull
#define SENDER_IDLE_MS 100            /* sender's futex timeout when idle */
#define SENDER_STOP_MS 300            /* how long stop waits for a POST in flight */
#define PEER_URL_MAX 1024

/* An encoded replica event (one msgpack map), owned by the queue. */
struct ev_rec {
    size_t len;
    char data[];
};

/* Sender-side state of one peer. */
struct peer_state {
    char *url;      /* base URL */
    char *post_url; /* url + KVI_SLOT_SYNC_PATH */
    struct kvi_http_client *cl;
    uint64_t backoff_ns;
    uint64_t retry_at; /* kvi_now_ns() before which batches are dropped */
    bool failing;
};

struct kvi_slot_service {
    struct kvi_slot_service_config cfg; /* strings below are owned copies */
    struct kvi_slots *slots;
    uint64_t replica_id;
    char replica_hex[17];
    _Atomic uint64_t clock_offset;

    /* mutation thread and its job FIFO (jmu) */
    pthread_t mut_thread;
    bool mut_started;
    pthread_mutex_t jmu;
    pthread_cond_t jcv;
    struct kvi_slot_job *jhead, *jtail;
    bool jstop;
    bool jexited;
    struct kvi_buf ev_buf; /* on_event's encoder buffer (mutation thread only) */

    /* peers (pmu); peers_gen moves on every change */
    pthread_mutex_t pmu;
    char **peers;
    size_t n_peers, cap_peers;
    _Atomic uint64_t peers_gen;
    _Atomic uint32_t n_peers_live;

    /* outbound ring: single producer (the on_event hook, mutation thread),
     * single consumer (the sender). Head and tail on their own lines: the
     * producer writes only tail, the consumer only head. */
    struct ev_rec **ring;
    uint64_t ring_mask;
    alignas(KVI_CACHE_LINE) _Atomic uint64_t ring_tail;
    alignas(KVI_CACHE_LINE) _Atomic uint64_t ring_head;
    alignas(KVI_CACHE_LINE) _Atomic uint32_t snd_wake; /* futex word */
    _Atomic uint32_t snd_sleeping;
    _Atomic bool snd_stop;
    _Atomic bool snd_done;
    _Atomic bool snd_paused;
    pthread_t snd_thread;
    bool snd_started;
    bool snd_leaked; /* stop gave up waiting: its memory stays */

    /* counters */
    struct {
        _Atomic uint64_t jobs, job_queue, expire_runs;
        _Atomic uint64_t queued, queue_full, batches, events, errors, dropped;
        _Atomic uint64_t recv_batches, recv_applied, recv_dropped, recv_self;
        _Atomic uint64_t route_requests, route_commits;
    } st;
};

/* ---- command line ------------------------------------------------------------------------------ */

static int arg_long(const char *flag, const char *v, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || x < min || x > max) {
        fprintf(stderr, "kvidxd: %s: invalid value '%s' (expected an integer in %ld..%ld)\n", flag, v, min, max);
        return -EINVAL;
    }
    *out = x;
    return 0;
}

enum {
    A_PORT,
    A_PORT_FILE,
    A_THREADS,
    A_SYNC,
    A_PEERS,
    A_ADVERTISE,
    A_QUEUE,
    A_BATCH,
    A_TIMEOUT,
    A_MAX_MODELS,
    A_MAX_DP_SIZE,
    A_MAX_RANKS,
    A_LOADS_PAGE,
    A_COUNT
};

static const struct {
    const char *name;
    bool has_value;
} slot_flags[A_COUNT] = {
    [A_PORT] = {"--slot-port", true},
    [A_PORT_FILE] = {"--slot-port-file", true},
    [A_THREADS] = {"--slot-http-threads", true},
    [A_SYNC] = {"--replica-sync", false},
    [A_PEERS] = {"--replica-sync-peers", true},
    [A_ADVERTISE] = {"--replica-sync-advertise", true},
    [A_QUEUE] = {"--replica-sync-queue", true},
    [A_BATCH] = {"--replica-sync-batch", true},
    [A_TIMEOUT] = {"--replica-sync-timeout-ms", true},
    [A_MAX_MODELS] = {"--slot-max-models", true},
    [A_MAX_DP_SIZE] = {"--slot-max-dp-size", true},
    [A_MAX_RANKS] = {"--slot-max-ranks", true},
    [A_LOADS_PAGE] = {"--slot-loads-page", true},
};

/* Which flag argv[i] is (0..A_COUNT-1) or -1; *value gets "=value" forms. */
static int flag_of(const char *arg, const char **value)
{
    *value = NULL;
    for (int f = 0; f < A_COUNT; f++) {
        size_t n = strlen(slot_flags[f].name);
        if (strncmp(arg, slot_flags[f].name, n) != 0)
            continue;
        if (arg[n] == '\0')
            return f;
        if (arg[n] == '=' && slot_flags[f].has_value) {
            *value = arg + n + 1;
            return f;
        }
    }
    return -1;
}

static int apply_flag(int f, const char *v, struct kvi_slot_service_config *cfg, struct kvi_slot_port_flags *port)
{
    long x = 0;
    int rc = 0;
    switch (f) {
    case A_PORT:
        if (strcmp(v, "auto") == 0) {
            port->port = KVI_SLOT_PORT_EPHEMERAL;
        } else if ((rc = arg_long("--slot-port", v, 0, 65535, &x)) == 0) {
            port->port = (int32_t)x;
        }
        port->port_explicit = true;
        break;
    case A_PORT_FILE: port->port_file = v; break;
    case A_THREADS:
        if ((rc = arg_long("--slot-http-threads", v, 1, 64, &x)) == 0)
            port->http_threads = (unsigned)x;
        break;
    case A_SYNC: cfg->sync = true; break;
    case A_PEERS:
        cfg->peers = v;
        cfg->sync = true;
        break;
    case A_ADVERTISE:
        cfg->advertise = v;
        cfg->sync = true;
        break;
    case A_QUEUE:
        if ((rc = arg_long("--replica-sync-queue", v, 1, 1L << 24, &x)) == 0)
            cfg->sync_queue = (uint32_t)x;
        break;
    case A_BATCH:
        if ((rc = arg_long("--replica-sync-batch", v, 1, 1L << 20, &x)) == 0)
            cfg->sync_batch = (uint32_t)x;
        break;
    case A_TIMEOUT:
        if ((rc = arg_long("--replica-sync-timeout-ms", v, 1, 600000, &x)) == 0)
            cfg->sync_timeout_ms = (uint32_t)x;
        break;
    case A_MAX_MODELS:
        if ((rc = arg_long("--slot-max-models", v, 1, 1L << 20, &x)) == 0)
            cfg->max_models = (uint32_t)x;
        break;
    case A_MAX_DP_SIZE:
        if ((rc = arg_long("--slot-max-dp-size", v, 1, 1L << 20, &x)) == 0)
            cfg->max_dp_size = (uint32_t)x;
        break;
    case A_MAX_RANKS:
        if ((rc = arg_long("--slot-max-ranks", v, 1, 1L << 20, &x)) == 0)
            cfg->max_ranks = (uint32_t)x;
        break;
    case A_LOADS_PAGE:
        if ((rc = arg_long("--slot-loads-page", v, 1, 1L << 20, &x)) == 0)
            cfg->loads_page = (uint32_t)x;
        break;
    default: break;
    }
    return rc;
}

int kvi_slot_service_args(int *argc, char **argv, struct kvi_slot_service_config *cfg,
                          struct kvi_slot_port_flags *port)
{
    memset(cfg, 0, sizeof(*cfg));
    memset(port, 0, sizeof(*port));
    port->port = KVI_SLOT_DEFAULT_PORT;
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const char *v;
        int f = strcmp(argv[i], "--") == 0 ? -2 : flag_of(argv[i], &v);
        if (f == -2) { /* end of options: keep the rest as it is */
            while (i < *argc)
                argv[out++] = argv[i++];
            break;
        }
        if (f < 0) {
            argv[out++] = argv[i];
            continue;
        }
        if (slot_flags[f].has_value && v == NULL) {
            if (i + 1 >= *argc) {
                fprintf(stderr, "kvidxd: %s needs a value (see --help)\n", slot_flags[f].name);
                return -EINVAL;
            }
            v = argv[++i];
        }
        if (apply_flag(f, v, cfg, port) != 0)
            return -EINVAL;
    }
    argv[out] = NULL;
    *argc = out;
    return 0;
}

void kvi_slot_service_usage(FILE *f)
{
    fprintf(f,
            "\n"
            "Slot tracker (Dynamo standalone slot-tracker API on its own port) and replica sync:\n"
            "  --slot-port N|auto     slot-tracker HTTP port (default 8091; 0 = no slot port;\n"
            "                         auto = a free port, see --slot-port-file). A default port\n"
            "                         that is taken only warns; an explicit one is fatal\n"
            "  --slot-port-file PATH  write the bound slot port to PATH once listening\n"
            "  --slot-http-threads N  slot-port event-loop threads (default: --http-threads)\n"
            "  --replica-sync         accept replica events and peer registrations\n"
            "  --replica-sync-peers URLS  comma-separated peer slot-port base URLs\n"
            "                         (e.g. http://10.0.0.2:8091) that receive this replica's\n"
            "                         lifecycle events over HTTP/2; implies --replica-sync\n"
            "  --replica-sync-advertise URL  this replica's own base URL (never registered as a\n"
            "                         peer); implies --replica-sync\n"
            "  --replica-sync-queue N outbound events buffered before new ones are dropped\n"
            "                         (default 65536)\n"
            "  --replica-sync-batch N events per POST (default 1024)\n"
            "  --replica-sync-timeout-ms N  timeout of one POST to a peer (default 1000)\n"
            "  --slot-max-models N    slot trackers (model x tenant) that may exist (default 1024);\n"
            "                         a /register that would create another answers 429\n"
            "  --slot-max-dp-size N   largest dp_size of one /register (default 1024; 400 past it)\n"
            "  --slot-max-ranks N     ranks one slot tracker may hold (default 65536; 400 past it)\n"
            "  --slot-loads-page N    most ranks in one GET /loads answer, workers in one GET\n"
            "                         /workers answer (default 16384; also cut when it could pass\n"
            "                         8 MiB); the rest is paged with ?cursor= (header\n"
            "                         X-Kvidx-Next-Cursor) and ?limit=\n"
            "  (POST /route on the indexer port joins the index's overlaps with these loads.\n"
            "  DYN_KV_INDEXER_TEST_ENDPOINTS also mounts POST /test/advance_clock and\n"
            "  /test/replica_sender on the slot port: a faster clock and a paused sender, for tests)\n");
}

/* ---- small helpers -------------------------------------------------------------------------------- */

static char *xstrdup_or_null(const char *s)
{
    if (s == NULL)
        return NULL;
    char *d = strdup(s);
    if (d == NULL)
        kvi_die("out of memory");
    return d;
}

static void futex_wait(_Atomic uint32_t *w, uint32_t val, int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void sender_wake(struct kvi_slot_service *s)
{
    atomic_fetch_add_explicit(&s->snd_wake, 1, memory_order_release);
    futex_wake(&s->snd_wake);
}

/* ---- clock ------------------------------------------------------------------------------------------- */

static uint64_t slot_clock(void *ctx)
{
    const struct kvi_slot_service *s = ctx;
    return kvi_now_ns() + atomic_load_explicit(&s->clock_offset, memory_order_relaxed);
}

uint64_t kvi_slot_service_now(const struct kvi_slot_service *s)
{
    return slot_clock((void *)s);
}

void kvi_slot_service_clock_advance(struct kvi_slot_service *s, uint64_t ns)
{
    atomic_fetch_add_explicit(&s->clock_offset, ns, memory_order_relaxed);
}

/* ---- peers --------------------------------------------------------------------------------------------- */

/* Normalise a peer URL into @p out (trimmed, no trailing '/'). @return its length or -EINVAL. */
static int peer_norm(const char *url, size_t len, char *out, const char **why)
{
    while (len > 0 && (*url == ' ' || *url == '\t')) {
        url++;
        len--;
    }
    while (len > 0 && (url[len - 1] == ' ' || url[len - 1] == '\t' || url[len - 1] == '/'))
        len--;
    size_t scheme = 0;
    if (len > 7 && strncmp(url, "http://", 7) == 0)
        scheme = 7;
    else if (len > 8 && strncmp(url, "https://", 8) == 0)
        scheme = 8;
    if (scheme == 0) {
        *why = "peer url must be an http:// or https:// base URL";
        return -EINVAL;
    }
    if (len >= PEER_URL_MAX) {
        *why = "peer url is too long";
        return -EINVAL;
    }
    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)url[i] <= ' ' || url[i] == 0x7f) {
            *why = "peer url contains whitespace or control characters";
            return -EINVAL;
        }
    }
    memcpy(out, url, len);
    out[len] = '\0';
    return (int)len;
}

bool kvi_slot_service_commit_allowed(const struct kvi_slot_service *s, const struct kvi_http_req *req)
{
    if (s->cfg.data_token == NULL)
        return true;
    return kvi_http_req_bearer_ok(req, s->cfg.data_token) ||
           (s->cfg.admin_token != NULL && kvi_http_req_bearer_ok(req, s->cfg.admin_token));
}

bool kvi_slot_service_sync_enabled(const struct kvi_slot_service *s)
{
    return s->cfg.sync;
}

int kvi_slot_service_peer_add(struct kvi_slot_service *s, const char *url, size_t len, const char **why)
{
    static const char *no_why;
    if (why == NULL)
        why = &no_why;
    if (!s->cfg.sync)
        return -ENOTSUP;
    char norm[PEER_URL_MAX];
    if (peer_norm(url, len, norm, why) < 0)
        return -EINVAL;
    if (s->cfg.advertise != NULL && strcmp(norm, s->cfg.advertise) == 0) {
        *why = "cannot register this replica's own advertised url as a peer";
        return -EEXIST;
    }
    pthread_mutex_lock(&s->pmu);
    for (size_t i = 0; i < s->n_peers; i++) {
        if (strcmp(s->peers[i], norm) == 0) {
            pthread_mutex_unlock(&s->pmu);
            return 0;
        }
    }
    if (s->n_peers == s->cap_peers) {
        s->cap_peers = s->cap_peers ? 2 * s->cap_peers : 8;
        s->peers = kvi_xrealloc(s->peers, s->cap_peers * sizeof(*s->peers));
    }
    s->peers[s->n_peers++] = xstrdup_or_null(norm);
    atomic_store_explicit(&s->n_peers_live, (uint32_t)s->n_peers, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->peers_gen, 1, memory_order_release);
    pthread_mutex_unlock(&s->pmu);
    return 1;
}

int kvi_slot_service_peer_remove(struct kvi_slot_service *s, const char *url, size_t len)
{
    if (!s->cfg.sync)
        return -ENOTSUP;
    char norm[PEER_URL_MAX];
    const char *why;
    if (peer_norm(url, len, norm, &why) < 0)
        return -ENOENT;
    pthread_mutex_lock(&s->pmu);
    for (size_t i = 0; i < s->n_peers; i++) {
        if (strcmp(s->peers[i], norm) == 0) {
            free(s->peers[i]);
            s->peers[i] = s->peers[--s->n_peers];
            atomic_store_explicit(&s->n_peers_live, (uint32_t)s->n_peers, memory_order_relaxed);
            atomic_fetch_add_explicit(&s->peers_gen, 1, memory_order_release);
            pthread_mutex_unlock(&s->pmu);
            return 0;
        }
    }
    pthread_mutex_unlock(&s->pmu);
    return -ENOENT;
}

int kvi_slot_service_encode_peers(struct kvi_slot_service *s, struct kvi_buf *out)
{
    pthread_mutex_lock(&s->pmu);
    int rc = kvi_slot_encode_peers((const char *const *)s->peers, s->n_peers, out);
    pthread_mutex_unlock(&s->pmu);
    return rc;
}

uint64_t kvi_slot_service_replica_id(const struct kvi_slot_service *s)
{
    return s->replica_id;
}

/* ---- outbound events (the tracker's on_event hook) ---------------------------------------------------- */

static const char *ev_type_name(enum kvi_slots_event_type t)
{
    switch (t) {
    case KVI_SLOTS_EV_ADD: return "add";
    case KVI_SLOTS_EV_PREFILL_COMPLETE: return "prefill_complete";
    default: return "free";
    }
}

/* Encode one event as the msgpack map the receiver parses (kvi_slot_parse_replica, api/codec_slots.c). */
static void ev_encode(struct kvi_buf *b, const struct kvi_slots_event *ev)
{
    const struct kvi_slots_request *r = &ev->req;
    bool add = ev->type == KVI_SLOTS_EV_ADD;
    struct kvi_wr w;
    kvi_wr_init(&w, b, KVI_ENC_MSGPACK);
    kvi_wr_obj(&w, add ? 9 : 7);
    kvi_wr_keyz(&w, "type");
    kvi_wr_strz(&w, ev_type_name(ev->type));
    kvi_wr_keyz(&w, "model_name");
    kvi_wr_str(&w, r->key.model, r->key.model_len);
    kvi_wr_keyz(&w, "tenant_id");
    kvi_wr_str(&w, r->key.tenant, r->key.tenant_len);
    kvi_wr_keyz(&w, "block_size");
    kvi_wr_u64(&w, ev->block_size);
    kvi_wr_keyz(&w, "request_id");
    kvi_wr_str(&w, r->request_id, r->request_id_len);
    kvi_wr_keyz(&w, "worker_id");
    kvi_wr_u64(&w, r->worker_id);
    kvi_wr_keyz(&w, "dp_rank");
    kvi_wr_u64(&w, r->dp_rank);
    if (add) {
        kvi_wr_keyz(&w, "sequence_hashes");
        kvi_wr_arr(&w, (uint32_t)r->n_hashes);
        for (size_t i = 0; i < r->n_hashes; i++)
            kvi_wr_i64(&w, (int64_t)r->hashes[i]);
        kvi_wr_end(&w);
        kvi_wr_keyz(&w, "new_isl_tokens");
        kvi_wr_u64(&w, r->new_isl_tokens);
    }
    kvi_wr_end(&w);
}

static void on_event(void *ctx, const struct kvi_slots_event *ev)
{
    struct kvi_slot_service *s = ctx;
    if (atomic_load_explicit(&s->n_peers_live, memory_order_relaxed) == 0)
        return; /* nobody to tell */
    uint64_t tail = atomic_load_explicit(&s->ring_tail, memory_order_relaxed);
    /* A1: pairs with the sender's release store of ring_head (R1): the slot is free again */
    uint64_t head = atomic_load_explicit(&s->ring_head, memory_order_acquire);
    if (tail - head > s->ring_mask) {
        kvi_relaxed_add(&s->st.queue_full, 1);
        return;
    }
    kvi_buf_reset(&s->ev_buf);
    ev_encode(&s->ev_buf, ev);
    if (!kvi_buf_ok(&s->ev_buf)) {
        kvi_relaxed_add(&s->st.queue_full, 1);
        return;
    }
    struct ev_rec *rec = kvi_xmalloc(sizeof(*rec) + s->ev_buf.len);
    rec->len = s->ev_buf.len;
    memcpy(rec->data, s->ev_buf.data, rec->len);
    s->ring[tail & s->ring_mask] = rec;
    /* R0: publishes the slot (release; pairs with the sender's acquire loads of ring_tail, A0).
     * D0: seq_cst, and so is the load of snd_sleeping after it: with the sender's D1 pair
     * (store snd_sleeping, then load ring_tail) one of the two sides sees the other's
     * store, so a sleeping sender is never missed (Dekker; no fences, which TSan cannot model) */
    atomic_store_explicit(&s->ring_tail, tail + 1, memory_order_seq_cst);
    kvi_relaxed_add(&s->st.queued, 1);
    if (atomic_load_explicit(&s->snd_sleeping, memory_order_seq_cst))
        sender_wake(s);
}

/* ---- sender thread ------------------------------------------------------------------------------------ */

struct sender {
    struct kvi_slot_service *s;
    struct peer_state *peers;
    size_t n_peers;
    uint64_t gen;
    struct ev_rec **batch;
    struct kvi_buf body;
};

static void peer_state_free(struct peer_state *p)
{
    kvi_http_client_free(p->cl);
    free(p->url);
    free(p->post_url);
}

/* Bring the sender's peer states in line with the peer list (when it changed). */
static void sender_refresh(struct sender *x)
{
    struct kvi_slot_service *s = x->s;
    uint64_t gen = atomic_load_explicit(&s->peers_gen, memory_order_acquire);
    if (gen == x->gen && x->peers != NULL)
        return;
    pthread_mutex_lock(&s->pmu);
    size_t n = s->n_peers;
    struct peer_state *np = kvi_xcalloc(n ? n : 1, sizeof(*np));
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < x->n_peers; j++) {
            if (x->peers[j].url != NULL && strcmp(x->peers[j].url, s->peers[i]) == 0) {
                np[i] = x->peers[j];
                memset(&x->peers[j], 0, sizeof(x->peers[j]));
                break;
            }
        }
        if (np[i].url == NULL)
            np[i].url = xstrdup_or_null(s->peers[i]);
    }
    x->gen = atomic_load_explicit(&s->peers_gen, memory_order_relaxed);
    pthread_mutex_unlock(&s->pmu);
    for (size_t j = 0; j < x->n_peers; j++)
        peer_state_free(&x->peers[j]);
    free(x->peers);
    x->peers = np;
    x->n_peers = n;
    for (size_t i = 0; i < n; i++) {
        struct peer_state *p = &np[i];
        if (p->cl != NULL)
            continue;
        size_t ul = strlen(p->url) + sizeof(KVI_SLOT_SYNC_PATH);
        p->post_url = kvi_xmalloc(ul);
        snprintf(p->post_url, ul, "%s%s", p->url, KVI_SLOT_SYNC_PATH);
        struct kvi_http_client_options o;
        kvi_http_client_options_init(&o);
        o.proto = KVI_HTTP_CLIENT_H2C_PRIOR;
        o.timeout_ms = s->cfg.sync_timeout_ms;
        o.connect_timeout_ms = KVI_MIN(s->cfg.sync_timeout_ms, 500u);
        o.bearer_token = s->cfg.admin_token;
        p->cl = kvi_http_client_create(&o);
        if (p->cl == NULL)
            kvi_log_error("replica peer %s: cannot create an HTTP client: %s", p->url, strerror(errno));
    }
}

/* The batch body: msgpack {"source": "<replica id>", "events": [events...]}. */
static void sender_body(struct sender *x, size_t n)
{
    struct kvi_buf *b = &x->body;
    kvi_buf_reset(b);
    struct kvi_wr w;
    kvi_wr_init(&w, b, KVI_ENC_MSGPACK);
    kvi_wr_obj(&w, 2);
    kvi_wr_keyz(&w, "source");
    kvi_wr_strz(&w, x->s->replica_hex);
    kvi_wr_keyz(&w, "events");
    kvi_wr_arr(&w, (uint32_t)n);
    for (size_t i = 0; i < n; i++) /* each is a complete msgpack value */
        kvi_buf_put(b, x->batch[i]->data, x->batch[i]->len);
    kvi_wr_end(&w);
    kvi_wr_end(&w);
}

static void sender_post(struct sender *x, struct peer_state *p, size_t n)
{
    struct kvi_slot_service *s = x->s;
    uint64_t now = kvi_now_ns();
    if (p->cl == NULL || now < p->retry_at) {
        kvi_relaxed_add(&s->st.dropped, n);
        return;
    }
    struct kvi_http_result res;
    int rc = kvi_http_post(p->cl, p->post_url, KVI_MIME_MSGPACK, x->body.data, x->body.len, NULL, NULL, &res);
    if (rc == 0) {
        kvi_relaxed_add(&s->st.batches, 1);
        kvi_relaxed_add(&s->st.events, n);
        if (p->failing)
            kvi_log_info("replica peer %s: reachable again", p->url);
        p->failing = false;
        p->backoff_ns = 0;
        return;
    }
    kvi_relaxed_add(&s->st.errors, 1);
    kvi_relaxed_add(&s->st.dropped, n);
    p->backoff_ns = p->backoff_ns ? KVI_MIN(2 * p->backoff_ns, BACKOFF_MAX_NS) : BACKOFF_MIN_NS;
    p->retry_at = kvi_now_ns() + p->backoff_ns;
    if (!p->failing && rc == -EREMOTEIO)
        kvi_log_warn("replica peer %s: answered %d %s; dropping its events, retrying with backoff", p->url,
                     res.status, res.error);
    else if (!p->failing)
        kvi_log_warn("replica peer %s: %s (%s); dropping its events, retrying with backoff", p->url,
                     strerror(-rc), res.error);
    p->failing = true;
}

/* Wait for events (or stop / resume). */
static void sender_idle(struct kvi_slot_service *s, bool paused)
{
    uint32_t w = atomic_load_explicit(&s->snd_wake, memory_order_acquire);
    /* D1: seq_cst store, then seq_cst load of ring_tail; pairs with the producer's D0 */
    atomic_store_explicit(&s->snd_sleeping, 1, memory_order_seq_cst);
    bool empty = atomic_load_explicit(&s->ring_tail, memory_order_seq_cst) ==
                 atomic_load_explicit(&s->ring_head, memory_order_relaxed);
    if ((empty || paused) && !atomic_load_explicit(&s->snd_stop, memory_order_acquire))
        futex_wait(&s->snd_wake, w, SENDER_IDLE_MS);
    atomic_store_explicit(&s->snd_sleeping, 0, memory_order_relaxed);
}

static void *sender_main(void *arg)
{
    struct kvi_slot_service *s = arg;
    struct sender x = {.s = s};
    x.batch = kvi_xmalloc(s->cfg.sync_batch * sizeof(*x.batch));
    kvi_buf_init(&x.body);
    while (!atomic_load_explicit(&s->snd_stop, memory_order_acquire)) {
        bool paused = atomic_load_explicit(&s->snd_paused, memory_order_relaxed);
        uint64_t head = atomic_load_explicit(&s->ring_head, memory_order_relaxed);
        /* A0: pairs with the producer's R0 */
        uint64_t tail = atomic_load_explicit(&s->ring_tail, memory_order_acquire);
        if (paused || tail == head) {
            sender_idle(s, paused);
            continue;
        }
        size_t n = (size_t)KVI_MIN(tail - head, (uint64_t)s->cfg.sync_batch);
        for (size_t i = 0; i < n; i++)
            x.batch[i] = s->ring[(head + i) & s->ring_mask];
        /* R1: the slots are free for the producer; pairs with its A1 */
        atomic_store_explicit(&s->ring_head, head + n, memory_order_release);
        sender_refresh(&x);
        if (x.n_peers > 0) {
            sender_body(&x, n);
            for (size_t i = 0; i < x.n_peers; i++) {
                if (!kvi_buf_ok(&x.body))
                    kvi_relaxed_add(&s->st.dropped, n);
                else
                    sender_post(&x, &x.peers[i], n);
            }
        }
        for (size_t i = 0; i < n; i++)
            free(x.batch[i]);
    }
    for (size_t j = 0; j < x.n_peers; j++)
        peer_state_free(&x.peers[j]);
    free(x.peers);
    free(x.batch);
    kvi_buf_free(&x.body);
    atomic_store_explicit(&s->snd_done, true, memory_order_release);
    return NULL;
}

void kvi_slot_service_sender_pause(struct kvi_slot_service *s, bool paused)
{
    atomic_store_explicit(&s->snd_paused, paused, memory_order_relaxed);
    sender_wake(s);
}

/* ---- mutation thread ------------------------------------------------------------------------------------- */

int kvi_slot_service_post(struct kvi_slot_service *s, struct kvi_slot_job *j)
{
    j->_next = NULL;
    pthread_mutex_lock(&s->jmu);
    if (s->jexited) {
        pthread_mutex_unlock(&s->jmu);
        return -ESHUTDOWN;
    }
    bool was_empty = s->jhead == NULL;
    if (was_empty)
        s->jhead = j;
    else
        s->jtail->_next = j;
    s->jtail = j;
    kvi_relaxed_add(&s->st.job_queue, 1);
    pthread_mutex_unlock(&s->jmu);
    if (was_empty) /* the thread waits only on an empty queue */
        pthread_cond_signal(&s->jcv);
    return 0;
}

static void expire_tick(struct kvi_slot_service *s)
{
    size_t n = kvi_slots_expire(s->slots, slot_clock(s));
    kvi_relaxed_add(&s->st.expire_runs, 1);
    if (n > 0)
        kvi_log_info("slot tracker: removed %zu stale request(s) older than %llu s", n,
                     (unsigned long long)(KVI_SLOTS_STALE_NS / 1000000000ull));
}

static void *mutation_main(void *arg)
{
    struct kvi_slot_service *s = arg;
    kvi_rcu_register_thread();
    uint64_t next_tick = kvi_now_ns() + TICK_NS;
    pthread_mutex_lock(&s->jmu);
    for (;;) {
        while (s->jhead == NULL && !s->jstop) {
            uint64_t now = kvi_now_ns();
            if (now >= next_tick)
                break;
            struct timespec ts = kvi_timespec_after(CLOCK_MONOTONIC, next_tick - now);
            pthread_cond_timedwait(&s->jcv, &s->jmu, &ts);
        }
        struct kvi_slot_job *j = s->jhead;
        s->jhead = s->jtail = NULL;
        pthread_mutex_unlock(&s->jmu);
        while (j != NULL) {
            struct kvi_slot_job *next = j->_next;
            atomic_fetch_sub_explicit(&s->st.job_queue, 1, memory_order_relaxed);
            kvi_relaxed_add(&s->st.jobs, 1);
            j->fn(s, j, false);
            j = next;
        }
        uint64_t now = kvi_now_ns();
        if (now >= next_tick) {
            expire_tick(s);
            next_tick = now + TICK_NS;
        }
        pthread_mutex_lock(&s->jmu);
        if (s->jstop && s->jhead == NULL)
            break;
    }
    s->jexited = true;
    pthread_mutex_unlock(&s->jmu);
    kvi_rcu_unregister_thread();
    return NULL;
}

/* ---- lifetime ---------------------------------------------------------------------------------------------- */

static uint32_t pow2_at_least(uint32_t v)
{
    uint32_t p = 1;
    while (p < v && p < (1u << 31))
        p <<= 1;
    return p;
}

static int add_initial_peers(struct kvi_slot_service *s, const char *list)
{
    char *copy = xstrdup_or_null(list);
    int rc = 0;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        const char *why = NULL;
        size_t len = strlen(tok);
        while (len > 0 && (*tok == ' ' || *tok == '\t')) {
            tok++;
            len--;
        }
        if (len == 0)
            continue;
        if (kvi_slot_service_peer_add(s, tok, len, &why) < 0) {
            kvi_log_error("--replica-sync-peers: %s: %s", tok, why ? why : "invalid");
            rc = -EINVAL;
            break;
        }
    }
    free(copy);
    return rc;
}

struct kvi_slot_service *kvi_slot_service_create(const struct kvi_slot_service_config *cfg)
{
    struct kvi_slot_service *s = kvi_xcalloc(1, sizeof(*s));
    s->cfg = *cfg;
    s->cfg.peers = NULL;
    s->cfg.admin_token = cfg->admin_token && cfg->admin_token[0] ? xstrdup_or_null(cfg->admin_token) : NULL;
    s->cfg.data_token = cfg->data_token && cfg->data_token[0] ? xstrdup_or_null(cfg->data_token) : NULL;
    if (s->cfg.sync_queue == 0)
        s->cfg.sync_queue = KVI_SLOT_SYNC_QUEUE;
    if (s->cfg.sync_batch == 0)
        s->cfg.sync_batch = KVI_SLOT_SYNC_BATCH;
    if (s->cfg.sync_timeout_ms == 0)
        s->cfg.sync_timeout_ms = KVI_SLOT_SYNC_TIMEOUT_MS;
    s->cfg.advertise = NULL;
    pthread_mutex_init(&s->jmu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->jcv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&s->pmu, NULL);
    kvi_buf_init(&s->ev_buf);
    uint32_t cap = pow2_at_least(s->cfg.sync_queue);
    s->ring = kvi_xcalloc(cap, sizeof(*s->ring));
    s->ring_mask = cap - 1;
    if (getrandom(&s->replica_id, sizeof(s->replica_id), 0) != (ssize_t)sizeof(s->replica_id))
        s->replica_id = kvi_now_ns() ^ ((uint64_t)getpid() << 32);
    if (s->replica_id == 0)
        s->replica_id = 1;
    snprintf(s->replica_hex, sizeof(s->replica_hex), "%016" PRIx64, s->replica_id);

    struct kvi_slots_config sc = {0};
    sc.max_trackers = s->cfg.max_models; /* 0 = the engine's defaults */
    sc.max_dp_size = s->cfg.max_dp_size;
    sc.max_ranks = s->cfg.max_ranks;
    if (s->cfg.loads_page == 0)
        s->cfg.loads_page = KVI_SLOT_LOADS_PAGE;
    sc.now_ns = slot_clock;
    sc.clock_ctx = s;
    if (s->cfg.sync) {
        sc.on_event = on_event;
        sc.event_ctx = s;
    }
    s->slots = kvi_slots_create(&sc);
    if (s->slots == NULL) {
        slot_service_teardown(s);
        errno = ENOMEM;
        return NULL;
    }
    if (cfg->advertise != NULL) {
        char norm[PEER_URL_MAX];
        const char *why = NULL;
        if (peer_norm(cfg->advertise, strlen(cfg->advertise), norm, &why) < 0) {
            kvi_log_error("--replica-sync-advertise: %s: %s", cfg->advertise, why);
            slot_service_teardown(s);
            errno = EINVAL;
            return NULL;
        }
        s->cfg.advertise = xstrdup_or_null(norm);
    }
    if (cfg->peers != NULL && add_initial_peers(s, cfg->peers) != 0) {
        slot_service_teardown(s);
        errno = EINVAL;
        return NULL;
    }
    return s;
}

int kvi_slot_service_start(struct kvi_slot_service *s)
{
    int rc = pthread_create(&s->mut_thread, NULL, mutation_main, s);
    if (rc != 0)
        return -rc;
    s->mut_started = true;
    if (s->cfg.sync) {
        if ((rc = pthread_create(&s->snd_thread, NULL, sender_main, s)) != 0)
            return -rc;
        s->snd_started = true;
        pthread_mutex_lock(&s->pmu);
        kvi_log_info("replica sync: replica id %s, %zu peer(s)%s%s", s->replica_hex, s->n_peers,
                     s->cfg.advertise ? ", advertised as " : "", s->cfg.advertise ? s->cfg.advertise : "");
        pthread_mutex_unlock(&s->pmu);
    }
    return 0;
}

uint32_t kvi_slot_service_loads_page(const struct kvi_slot_service *s)
{
    return s->cfg.loads_page;
}

void kvi_slot_service_stop(struct kvi_slot_service *s)
{
    if (s == NULL)
        return;
    if (s->mut_started) {
        pthread_mutex_lock(&s->jmu);
        s->jstop = true;
        pthread_mutex_unlock(&s->jmu);
        pthread_cond_signal(&s->jcv);
        pthread_join(s->mut_thread, NULL);
        s->mut_started = false;
    }
    if (s->snd_started) {
        atomic_store_explicit(&s->snd_stop, true, memory_order_release);
        sender_wake(s);
        uint64_t end = kvi_now_ns() + SENDER_STOP_MS * 1000000ull;
        while (!atomic_load_explicit(&s->snd_done, memory_order_acquire) && kvi_now_ns() < end) {
            struct timespec ts = {0, 2000000L};
            nanosleep(&ts, NULL);
        }
        if (atomic_load_explicit(&s->snd_done, memory_order_acquire)) {
            pthread_join(s->snd_thread, NULL);
        } else {
            kvi_log_warn("replica sync: a POST to a peer is still in flight; leaving it behind");
            pthread_detach(s->snd_thread);
            s->snd_leaked = true;
        }
        s->snd_started = false;
    }
}

static void slot_service_teardown(struct kvi_slot_service *s)
{
    if (s == NULL)
        return;
    kvi_slot_service_stop(s);
    /* jobs posted but never run (the thread never started) */
    for (struct kvi_slot_job *j = s->jhead, *next; j != NULL; j = next) {
        next = j->_next;
        j->fn(s, j, true);
    }
    s->jhead = s->jtail = NULL;
    if (s->snd_leaked)
        return; /* the sender may still read the ring, peers and config */
    for (uint64_t i = atomic_load(&s->ring_head); i != atomic_load(&s->ring_tail); i++)
        free(s->ring[i & s->ring_mask]);
    free(s->ring);
    kvi_slots_destroy(s->slots);
    kvi_buf_free(&s->ev_buf);
    for (size_t i = 0; i < s->n_peers; i++)
        free(s->peers[i]);
    free(s->peers);
    pthread_mutex_destroy(&s->jmu);
    pthread_cond_destroy(&s->jcv);
    pthread_mutex_destroy(&s->pmu);
    free((char *)s->cfg.admin_token);
    free((char *)s->cfg.data_token);
    free((char *)s->cfg.advertise);
    free(s);
}

struct kvi_slots *kvi_slot_service_slots(const struct kvi_slot_service *s)
{
    return s->slots;
}

/* ---- counters -------------------------------------------------------------------------------------------- */

void kvi_slot_service_count_received(struct kvi_slot_service *s, uint64_t applied, uint64_t dropped, bool self)
{
    kvi_relaxed_add(&s->st.recv_batches, 1);
    kvi_relaxed_add(&s->st.recv_applied, applied);
    kvi_relaxed_add(&s->st.recv_dropped, dropped);
    if (self)
        kvi_relaxed_add(&s->st.recv_self, 1);
}

void kvi_slot_service_count_route(struct kvi_slot_service *s, bool committed)
{
    kvi_relaxed_add(&s->st.route_requests, 1);
    if (committed)
        kvi_relaxed_add(&s->st.route_commits, 1);
}

void kvi_slot_service_stats(const struct kvi_slot_service *s, struct kvi_slot_service_stats *out)
{
#define LD(f) atomic_load_explicit(&((struct kvi_slot_service *)s)->st.f, memory_order_relaxed)
    memset(out, 0, sizeof(*out));
    out->jobs = LD(jobs);
    out->job_queue = LD(job_queue);
    out->expire_runs = LD(expire_runs);
    out->sync_queued = LD(queued);
    out->sync_queue_full = LD(queue_full);
    out->sync_batches = LD(batches);
    out->sync_events = LD(events);
    out->sync_errors = LD(errors);
    out->sync_dropped = LD(dropped);
    out->recv_batches = LD(recv_batches);
    out->recv_applied = LD(recv_applied);
    out->recv_dropped = LD(recv_dropped);
    out->recv_self = LD(recv_self);
    out->route_requests = LD(route_requests);
    out->route_commits = LD(route_commits);
#undef LD
    uint64_t tail = atomic_load_explicit(&s->ring_tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&s->ring_head, memory_order_relaxed);
    out->sync_queue_depth = tail >= head ? tail - head : 0;
    out->sync_peers = atomic_load_explicit(&s->n_peers_live, memory_order_relaxed);
}

/* The public destructor: the constructor's failure paths tear down through slot_service_teardown
 * (GCC's -Wmismatched-dealloc holds kvi_slot_service_free to what the constructor returned). */
void kvi_slot_service_free(struct kvi_slot_service *x)
{
    slot_service_teardown(x);
}
