/*
 * kvidxd: the kvidx daemon. Dynamo standalone-indexer command line
 * (http-api.md §1.1) plus kvidx's own flags; both HTTP dialects on one port.
 *
 * DESIGN
 *   main parses the command line, blocks SIGTERM / SIGINT (every thread
 *   inherits the mask), creates the service (writer and listener pools),
 *   its route table and the HTTP server (bound at once) as siblings, mounts
 *   the routes, and assembles the slot tracker the same way: its service
 *   (api/slot_service.h), its route table (api/routes_slots.h) and its own
 *   server on the slot port (--slot-port; the same TLS, tokens, timeouts and
 *   HTTP abuse limits as the indexer port), plus POST /route
 *   (api/route_route.h) on the indexer port. It starts HTTP first (newer
 *   Dynamo order: /health answers at once, /ready reports progress): the
 *   slot port, then the slot service's threads, then the indexer port; then
 *   the service's control thread, which registers --workers, runs P2P
 *   recovery and opens the ready gate. main then waits in sigwait(). On a
 *   signal: the service is told to stop (recovery is cut short), both ports
 *   stop accepting and let in-flight requests finish (1.5 s grace on the
 *   indexer port, 250 ms on the slot port), the slot service's mutation
 *   thread completes what is queued (deferred answers of both ports), the
 *   control thread completes what is queued, the pools are torn down, and
 *   the process exits 0 (within 2 s).
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <curl/curl.h>

#include "api/route_route.h"
#include "api/routes_common.h"
#include "api/routes_slots.h"
#include "api/nats_args.h"
#include "api/service.h"
#include "api/slot_service.h"
#include "engine/common.h"
#include "net/endpoint.h"
#include "net/http_server.h"
#include "net/log.h"

#if defined(__SANITIZE_THREAD__)
/*
 * libzmq is not built with TSan: its I/O threads hand messages over with
 * atomics TSan cannot see. Ignore reports from inside it; kvidx's own
 * hand-overs (commands, rings, counters, RCU) stay checked.
 */
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void)
{
    return "called_from_lib:libzmq.so\n";
}
#endif

#ifdef KVI_WITH_JEMALLOC
#include <jemalloc/jemalloc.h>
/*
 * jemalloc purges freed (dirty) pages only on its decay ticks, which run when
 * some thread allocates. After a burst (10,000 workers unregistered, a
 * namespace dropped, a large body freed) an idle daemon kept those pages
 * resident for good. Background threads purge them on jemalloc's decay
 * schedule (dirty_decay_ms, 10 s) whether anything allocates or not
 * (tests/api/kvidxd_faults_http_test.c, test_10k_workers_memory).
 */
const char *malloc_conf = "background_thread:true";
#endif

#define KVIDXD_VERSION "0.1.0"
#define DEFAULT_PORT 8090
#define DEFAULT_HTTP_THREADS 2
#define MAX_WORKERS 4096
#define MAX_PEERS 64
#define SLOT_GRACE_MS 250 /* slot port shutdown grace: its requests are short */

struct opts {
    const char *host;
    long port;
    long writer_threads;
    long http_threads;
    long listener_threads;
    long replay_timeout_ms;
    long max_dp_ranks;
    long max_models; /* namespaces (model x tenant) registrations may create */
    long block_size;
    const char *workers;
    const char *model_name;
    const char *tenant_id;
    const char *peers;
    long body_limit;
    long query_body_limit;
    const char *tls_cert;
    const char *tls_key;
    const char *admin_token;
    bool allow_remote_admin;
    const char *data_token;
    const char *log_level;
    const char *api;
    long recovery_delay_ms;
    long recovery_timeout_ms;
    long idle_timeout_ms;
    long max_connections;
    long max_conns_per_addr;
    long h2_max_resets;
    long conn_output_limit;
    long output_limit;
    const char *port_file;
    struct kvi_zbind_arg zbind[16]; /* --zmq-bind */
    size_t n_zbind;
    long zbind_max_pods;
    long zbind_idle_s;
    long capacity_max;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvidxd [options]\n"
            "\n"
            "kvidx KV-cache indexer daemon: subscribes to engines' ZMQ KV events and answers\n"
            "prefix-match queries over HTTP/1.1 and HTTP/2 in the Dynamo standalone-indexer and\n"
            "Mooncake Conductor dialects.\n"
            "\n"
            "Dynamo-compatible options:\n"
            "  --port N               HTTP port (default 8090; 0 = ephemeral, see --port-file)\n"
            "  --threads N            indexer threads = writer threads, one index partition each\n"
            "                         (default 4; 1 = single-threaded indexer)\n"
            "  --block-size N         block size of the --workers entries (required with --workers)\n"
            "  --workers LIST         initial workers: instance_id[:dp_rank]=zmq_endpoint,...\n"
            "                         (dp_rank defaults to 0; endpoints tcp://host:port, ipc://, inproc://)\n"
            "  --model-name NAME      model of the --workers entries (default \"default\")\n"
            "  --tenant-id NAME       tenant of the --workers entries (default \"default\")\n"
            "  --peers URLS           comma-separated peer base URLs for P2P recovery at startup\n"
            "                         (e.g. http://10.0.0.2:8090); tried in order\n"
            "\n"
            "kvidx options:\n"
            "  --host ADDR            bind address (default 0.0.0.0)\n"
            "  --http-threads N       HTTP event-loop threads, SO_REUSEPORT (default 2)\n"
            "  --writer-threads N     same as --threads (wins when both are given)\n"
            "  --listener-threads N   ZMQ listener threads (default 0 = 1, or 2 with more than 4 CPUs)\n"
            "  --replay-timeout-ms N  give up a replay after N ms without progress (default 5000)\n"
            "  --max-dp-ranks N       distinct dp ranks one registration's batches may name (default 1024);\n"
            "                         batches of further ranks are dropped and counted\n"
            "  --zmq-bind ENDPOINT[=BLOCK_SIZE]  bind a SUB there for engines that connect (llm-d: topic\n"
            "                         kv@<pod-id>@<model-name>; repeatable, at most 16); each pod is registered\n"
            "                         on its first message; block size from the flag or the first BlockStored\n"
            "  --zmq-bind-max-pods N  pods per --zmq-bind endpoint (default 4096); a new pod past it is dropped\n"
            "  --zmq-bind-idle-s N    forget a pod (and drop its blocks) after N s without a message\n"
            "                         (default 600; 0 = never)\n"
            "  --capacity-max-blocks N  the most a registration's capacity_blocks pre-sizes: entries per\n"
            "                         partition, blocks per slot map (default 4194304; about 56 B per pair;\n"
            "                         0 = capacity_blocks pre-sizes nothing)\n"
            "  --max-models N         namespaces (model x tenant) that may exist (default 1024); a registration\n"
            "                         that would create another answers 429\n"
            "  --body-limit BYTES     request body limit of every route but /query (default 2097152)\n"
            "  --query-body-limit BYTES  body limit of /query (default 8388608 = 8 MiB)\n"
            "  --tls-cert FILE        PEM certificate chain: serve HTTPS (HTTP/2 via ALPN) ...\n"
            "  --tls-key FILE         ... with this PEM private key (both or neither)\n"
            "  --admin-token TOKEN    require 'Authorization: Bearer TOKEN' on mutating routes\n"
            "                         (/register, /unregister, peers, test routes); default none\n"
            "                         (env KVIDX_ADMIN_TOKEN is used when the flag is absent)\n"
            "  --data-token TOKEN     require 'Authorization: Bearer TOKEN' (or the admin token) on\n"
            "                         data-plane writes and whole-index reads: /dump, /route with\n"
            "                         commit, the slot port's /add, /prefill_complete and /free;\n"
            "                         default none (env KVIDX_DATA_TOKEN)\n"
            "  --allow-remote-admin   without an admin token, accept those routes from any client;\n"
            "                         by default only loopback clients may call them (403 otherwise)\n"
            "  --log-level LEVEL      error, warn, info or debug (default info)\n"
            "  --api MODE             dialect of /register, /unregister, /query, /query_by_hash:\n"
            "                         auto (detected per request, default), dynamo or conductor\n"
            "  --recovery-delay-ms N  wait before fetching a peer's /dump (default 1000)\n"
            "  --recovery-timeout-ms N  timeout of one peer fetch (default 10000)\n"
            "  --idle-timeout-ms N    idle keep-alive / slow-client timeout (default 60000)\n"
            "  --max-connections N    open HTTP connections over all threads (default 16384)\n"
            "  --max-conns-per-addr N open HTTP connections from one client address (default 1024;\n"
            "                         0 = no limit); past it a connection is closed at once\n"
            "  --h2-max-resets N      RST_STREAM frames one HTTP/2 connection may send per 10 s (burst N,\n"
            "                         default 1000; 0 = no limit); past it GOAWAY ENHANCE_YOUR_CALM\n"
            "  --http-conn-output-limit BYTES  unread answer bytes one connection may hold (default\n"
            "                         16777216; 0 = no limit); past it the connection is closed\n"
            "  --http-output-limit BYTES  unread answer bytes over all connections (default 268435456;\n"
            "                         0 = no limit); past it answers are 503\n"
            "  --port-file PATH       write the bound port to PATH once listening (default none)\n"
            "  --help                 print this text and exit\n"
            "  --version              print the version and exit\n"
            "\n"
            "Environment:\n"
            "  DYN_ROUTER_MIN_INITIAL_WORKERS  keep the listeners gated (and /ready 503) until at\n"
            "                         least this many instances are registered (unset or 0: off;\n"
            "                         a non-integer is a startup error)\n"
            "  DYN_KV_INDEXER_TEST_ENDPOINTS   mount /test/pause_listener and /test/resume_listener\n"
            "                         when 1, true, yes or on (default: not mounted, 404)\n"
            "  KVIDX_ADMIN_TOKEN      default of --admin-token\n"
            "\n"
            "Signals: SIGTERM or SIGINT stop the daemon gracefully (exit 0 within 2 s).\n");
    kvi_slot_service_usage(f);
    kvi_nats_args_usage(f);
}

static int parse_long(const char *flag, const char *s, long min, long max, long *out);

/* --zmq-bind ENDPOINT[=BLOCK_SIZE] (the '=' is cut out of argv). @return 0, or -1 after a message. */
static int parse_zbind(char *arg, struct opts *o)
{
    if (o->n_zbind == sizeof o->zbind / sizeof o->zbind[0]) {
        fprintf(stderr, "kvidxd: at most %zu --zmq-bind endpoints\n", sizeof o->zbind / sizeof o->zbind[0]);
        return -1;
    }
    long bs = 0;
    char *eq = strrchr(arg, '=');
    if (eq != NULL) {
        *eq = '\0';
        if (parse_long("--zmq-bind block size", eq + 1, 1, UINT32_MAX, &bs) != 0)
            return -1;
    }
    char err[128];
    if (kvi_endpoint_validate(arg, err, sizeof err) != 0) {
        fprintf(stderr, "kvidxd: --zmq-bind %s: %s\n", arg, err);
        return -1;
    }
    o->zbind[o->n_zbind++] = (struct kvi_zbind_arg){arg, (uint32_t)bs};
    return 0;
}

static int parse_long(const char *flag, const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < min || v > max) {
        fprintf(stderr, "kvidxd: %s: invalid value '%s' (expected an integer in %ld..%ld)\n", flag, s, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

static bool truthy(const char *v)
{
    if (v == NULL)
        return false;
    while (isspace((unsigned char)*v))
        v++;
    size_t n = strlen(v);
    while (n > 0 && isspace((unsigned char)v[n - 1]))
        n--;
    const char *yes[] = {"1", "true", "yes", "on"};
    for (size_t i = 0; i < 4; i++)
        if (strlen(yes[i]) == n && strncasecmp(v, yes[i], n) == 0)
            return true;
    return false;
}

/* DYN_ROUTER_MIN_INITIAL_WORKERS: 0 when unset; -1 on a non-integer. */
static int min_initial_workers(uint64_t *out)
{
    const char *v = getenv("DYN_ROUTER_MIN_INITIAL_WORKERS");
    *out = 0;
    if (v == NULL)
        return 0;
    while (isspace((unsigned char)*v))
        v++;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    while (isspace((unsigned char)*end))
        end++;
    if (errno != 0 || end == v || *end != '\0' || *v == '-') {
        fprintf(stderr, "kvidxd: DYN_ROUTER_MIN_INITIAL_WORKERS: not a non-negative integer: '%s'\n",
                getenv("DYN_ROUTER_MIN_INITIAL_WORKERS"));
        return -1;
    }
    *out = n;
    return 0;
}

enum {
    O_PORT = 256, O_THREADS, O_BLOCK_SIZE, O_WORKERS, O_MODEL, O_TENANT, O_PEERS, O_HOST, O_HTTP_THREADS,
    O_WRITER_THREADS, O_LISTENER_THREADS, O_REPLAY_TIMEOUT, O_MAX_DP_RANKS, O_MAX_MODELS, O_BODY_LIMIT, O_QUERY_LIMIT, O_TLS_CERT, O_TLS_KEY, O_ADMIN_TOKEN, O_ALLOW_REMOTE_ADMIN, O_DATA_TOKEN,
    O_LOG_LEVEL, O_API, O_REC_DELAY, O_REC_TIMEOUT, O_IDLE, O_MAX_CONN, O_MAX_CONNS_ADDR, O_H2_RESETS, O_CONN_OUT, O_OUT_LIMIT, O_PORT_FILE, O_ZBIND, O_ZBIND_MAX_PODS, O_ZBIND_IDLE, O_CAPACITY_MAX, O_HELP, O_VERSION,
};

static int parse_opts(int argc, char **argv, struct opts *o)
{
    static const struct option lo[] = {
        {"port", required_argument, NULL, O_PORT},
        {"threads", required_argument, NULL, O_THREADS},
        {"block-size", required_argument, NULL, O_BLOCK_SIZE},
        {"workers", required_argument, NULL, O_WORKERS},
        {"model-name", required_argument, NULL, O_MODEL},
        {"tenant-id", required_argument, NULL, O_TENANT},
        {"peers", required_argument, NULL, O_PEERS},
        {"host", required_argument, NULL, O_HOST},
        {"http-threads", required_argument, NULL, O_HTTP_THREADS},
        {"writer-threads", required_argument, NULL, O_WRITER_THREADS},
        {"listener-threads", required_argument, NULL, O_LISTENER_THREADS},
        {"replay-timeout-ms", required_argument, NULL, O_REPLAY_TIMEOUT},
        {"max-dp-ranks", required_argument, NULL, O_MAX_DP_RANKS},
        {"max-models", required_argument, NULL, O_MAX_MODELS},
        {"body-limit", required_argument, NULL, O_BODY_LIMIT},
        {"query-body-limit", required_argument, NULL, O_QUERY_LIMIT},
        {"tls-cert", required_argument, NULL, O_TLS_CERT},
        {"tls-key", required_argument, NULL, O_TLS_KEY},
        {"admin-token", required_argument, NULL, O_ADMIN_TOKEN},
        {"allow-remote-admin", no_argument, NULL, O_ALLOW_REMOTE_ADMIN},
        {"data-token", required_argument, NULL, O_DATA_TOKEN},
        {"log-level", required_argument, NULL, O_LOG_LEVEL},
        {"api", required_argument, NULL, O_API},
        {"recovery-delay-ms", required_argument, NULL, O_REC_DELAY},
        {"recovery-timeout-ms", required_argument, NULL, O_REC_TIMEOUT},
        {"idle-timeout-ms", required_argument, NULL, O_IDLE},
        {"max-connections", required_argument, NULL, O_MAX_CONN},
        {"max-conns-per-addr", required_argument, NULL, O_MAX_CONNS_ADDR},
        {"h2-max-resets", required_argument, NULL, O_H2_RESETS},
        {"http-conn-output-limit", required_argument, NULL, O_CONN_OUT},
        {"http-output-limit", required_argument, NULL, O_OUT_LIMIT},
        {"port-file", required_argument, NULL, O_PORT_FILE},
        {"zmq-bind", required_argument, NULL, O_ZBIND},
        {"zmq-bind-max-pods", required_argument, NULL, O_ZBIND_MAX_PODS},
        {"zmq-bind-idle-s", required_argument, NULL, O_ZBIND_IDLE},
        {"capacity-max-blocks", required_argument, NULL, O_CAPACITY_MAX},
        {"help", no_argument, NULL, O_HELP},
        {"version", no_argument, NULL, O_VERSION},
        {NULL, 0, NULL, 0},
    };
    long threads = KVI_SVC_DEFAULT_WRITERS, writer_threads = -1;
    int c, rc = 0;
    opterr = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case O_PORT: rc = parse_long("--port", optarg, 0, 65535, &o->port); break;
        case O_THREADS: rc = parse_long("--threads", optarg, 1, KVI_WRITER_MAX, &threads); break;
        case O_WRITER_THREADS: rc = parse_long("--writer-threads", optarg, 1, KVI_WRITER_MAX, &writer_threads); break;
        case O_HTTP_THREADS: rc = parse_long("--http-threads", optarg, 1, 64, &o->http_threads); break;
        case O_LISTENER_THREADS:
            rc = parse_long("--listener-threads", optarg, 0, KVI_LISTEN_MAX_THREADS, &o->listener_threads);
            break;
        case O_REPLAY_TIMEOUT:
            rc = parse_long("--replay-timeout-ms", optarg, 1, 3600000, &o->replay_timeout_ms);
            break;
        case O_MAX_DP_RANKS: rc = parse_long("--max-dp-ranks", optarg, 1, 1048576, &o->max_dp_ranks); break;
        case O_MAX_MODELS: rc = parse_long("--max-models", optarg, 1, 1048576, &o->max_models); break;
        case O_BLOCK_SIZE: rc = parse_long("--block-size", optarg, 1, UINT32_MAX, &o->block_size); break;
        case O_WORKERS: o->workers = optarg; break;
        case O_MODEL: o->model_name = optarg; break;
        case O_TENANT: o->tenant_id = optarg; break;
        case O_PEERS: o->peers = optarg; break;
        case O_HOST: o->host = optarg; break;
        case O_BODY_LIMIT: rc = parse_long("--body-limit", optarg, 1, LONG_MAX, &o->body_limit); break;
        case O_QUERY_LIMIT: rc = parse_long("--query-body-limit", optarg, 1, LONG_MAX, &o->query_body_limit); break;
        case O_TLS_CERT: o->tls_cert = optarg; break;
        case O_TLS_KEY: o->tls_key = optarg; break;
        case O_ADMIN_TOKEN: o->admin_token = optarg; break;
        case O_ALLOW_REMOTE_ADMIN: o->allow_remote_admin = true; break;
        case O_DATA_TOKEN: o->data_token = optarg; break;
        case O_LOG_LEVEL: o->log_level = optarg; break;
        case O_API: o->api = optarg; break;
        case O_REC_DELAY: rc = parse_long("--recovery-delay-ms", optarg, 0, 3600000, &o->recovery_delay_ms); break;
        case O_REC_TIMEOUT:
            rc = parse_long("--recovery-timeout-ms", optarg, 1, 3600000, &o->recovery_timeout_ms);
            break;
        case O_IDLE: rc = parse_long("--idle-timeout-ms", optarg, 1, 3600000, &o->idle_timeout_ms); break;
        case O_MAX_CONN: rc = parse_long("--max-connections", optarg, 1, 1000000, &o->max_connections); break;
        case O_MAX_CONNS_ADDR:
            rc = parse_long("--max-conns-per-addr", optarg, 0, 1000000, &o->max_conns_per_addr);
            break;
        case O_H2_RESETS: rc = parse_long("--h2-max-resets", optarg, 0, 100000000, &o->h2_max_resets); break;
        case O_CONN_OUT: rc = parse_long("--http-conn-output-limit", optarg, 0, LONG_MAX, &o->conn_output_limit); break;
        case O_OUT_LIMIT: rc = parse_long("--http-output-limit", optarg, 0, LONG_MAX, &o->output_limit); break;
        case O_PORT_FILE: o->port_file = optarg; break;
        case O_ZBIND: rc = parse_zbind(optarg, o); break;
        case O_ZBIND_MAX_PODS: rc = parse_long("--zmq-bind-max-pods", optarg, 1, 1048576, &o->zbind_max_pods); break;
        case O_ZBIND_IDLE: rc = parse_long("--zmq-bind-idle-s", optarg, 0, 31536000, &o->zbind_idle_s); break;
        case O_CAPACITY_MAX:
            rc = parse_long("--capacity-max-blocks", optarg, 0, 1l << 30, &o->capacity_max);
            break;
        case 'h':
        case O_HELP: usage(stdout); exit(0);
        case O_VERSION: printf("kvidxd %s\n", KVIDXD_VERSION); exit(0);
        default:
            fprintf(stderr, "kvidxd: unknown or incomplete option '%s' (see --help)\n", argv[optind - 1]);
            return -1;
        }
    }
    if (rc != 0)
        return -1;
    if (optind < argc) {
        fprintf(stderr, "kvidxd: unexpected argument '%s' (see --help)\n", argv[optind]);
        return -1;
    }
    o->writer_threads = writer_threads > 0 ? writer_threads : threads;
    return 0;
}

/* Split "a,b,,c" into trimmed non-empty entries (pointers into a copy). */
static size_t split_list(char *s, char **out, size_t cap)
{
    size_t n = 0;
    for (char *tok = strtok(s, ","); tok != NULL && n < cap; tok = strtok(NULL, ",")) {
        while (isspace((unsigned char)*tok))
            tok++;
        size_t len = strlen(tok);
        while (len > 0 && isspace((unsigned char)tok[len - 1]))
            tok[--len] = '\0';
        if (len > 0)
            out[n++] = tok;
    }
    return n;
}

static int write_port_file(const char *path, uint16_t port)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL)
        return -errno;
    fprintf(f, "%u\n", port);
    if (fclose(f) != 0 || rename(tmp, path) != 0)
        return -errno;
    return 0;
}

/*
 * The HTTP options both ports share: bind address, body limit, TLS (the slot
 * port's bearer tokens must not travel in clear either), tokens, protected
 * mode, timeouts and the abuse limits (-1: the HTTP layer's defaults).
 */
static void http_options_shared(const struct opts *o, struct kvi_http_options *ho)
{
    kvi_http_options_init(ho);
    ho->host = o->host;
    ho->body_limit = (size_t)o->body_limit;
    ho->tls_cert_file = o->tls_cert;
    ho->tls_key_file = o->tls_key;
    ho->admin_token = o->admin_token && o->admin_token[0] ? o->admin_token : NULL;
    /* protected mode: without a token, topology changes come from this host only */
    ho->admin_loopback_only = !o->allow_remote_admin;
    ho->admin_hint = "start kvidxd with --admin-token (and send it) or --allow-remote-admin";
    ho->data_token = o->data_token && o->data_token[0] ? o->data_token : NULL;
    ho->idle_timeout_ms = (unsigned)o->idle_timeout_ms;
    ho->max_connections = (unsigned)o->max_connections;
    if (o->max_conns_per_addr >= 0)
        ho->max_conns_per_addr = (unsigned)o->max_conns_per_addr;
    if (o->h2_max_resets >= 0)
        ho->h2_max_resets = (unsigned)o->h2_max_resets;
    if (o->conn_output_limit >= 0)
        ho->conn_output_limit = (size_t)o->conn_output_limit;
    if (o->output_limit >= 0)
        ho->output_limit = (size_t)o->output_limit;
}

int main(int argc, char **argv)
{
    struct opts o = {
        .host = "0.0.0.0",
        .port = DEFAULT_PORT,
        .http_threads = DEFAULT_HTTP_THREADS,
        .model_name = "default",
        .tenant_id = "default",
        .body_limit = KVI_ROUTES_DEFAULT_BODY_LIMIT,
        .query_body_limit = KVI_ROUTES_DEFAULT_QUERY_LIMIT,
        .log_level = "info",
        .api = "auto",
        .recovery_delay_ms = KVI_SVC_DEFAULT_RECOVERY_DELAY_MS,
        .recovery_timeout_ms = KVI_SVC_DEFAULT_RECOVERY_TIMEOUT_MS,
        .idle_timeout_ms = 60000,
        .max_connections = 16384,
        .max_conns_per_addr = -1, /* -1: the HTTP layer's defaults (net/http_server.h) */
        .h2_max_resets = -1,
        .conn_output_limit = -1,
        .output_limit = -1,
        .max_models = KVI_SVC_DEFAULT_MAX_MODELS,
        .zbind_max_pods = KVI_SVC_DEFAULT_ZBIND_MAX_PODS,
        .zbind_idle_s = KVI_SVC_DEFAULT_ZBIND_IDLE_S,
        .capacity_max = (long)KVI_SVC_DEFAULT_CAPACITY_MAX_BLOCKS,
    };
    struct kvi_slot_service_config slot_cfg; /* the slot-tracker flags leave argv here */
    struct kvi_slot_port_flags slot_port;
    static struct kvi_nats_args nats_args; /* the --nats flags leave argv here too; outlive the service */
    if (kvi_slot_service_args(&argc, argv, &slot_cfg, &slot_port) != 0 ||
        kvi_nats_args(&argc, argv, &nats_args) != 0 || parse_opts(argc, argv, &o) != 0)
        return 2;
    enum kvi_log_level lvl;
    if (kvi_log_parse_level(o.log_level, &lvl) != 0) {
        fprintf(stderr, "kvidxd: --log-level: unknown level '%s' (error, warn, info, debug)\n", o.log_level);
        return 2;
    }
    kvi_log_set_level(lvl);
    enum kvi_api_mode api;
    if (strcasecmp(o.api, "auto") == 0) {
        api = KVI_API_AUTO;
    } else if (strcasecmp(o.api, "dynamo") == 0) {
        api = KVI_API_DYNAMO;
    } else if (strcasecmp(o.api, "conductor") == 0) {
        api = KVI_API_CONDUCTOR;
    } else {
        fprintf(stderr, "kvidxd: --api: expected auto, dynamo or conductor, got '%s'\n", o.api);
        return 2;
    }
    if ((o.tls_cert == NULL) != (o.tls_key == NULL)) {
        fprintf(stderr, "kvidxd: --tls-cert and --tls-key go together\n");
        return 2;
    }
    if (o.admin_token == NULL)
        o.admin_token = getenv("KVIDX_ADMIN_TOKEN");
    if (o.data_token == NULL)
        o.data_token = getenv("KVIDX_DATA_TOKEN");

    /* --workers (http-api.md §1.1) */
    static struct kvi_worker_spec workers[MAX_WORKERS];
    size_t n_workers = 0;
    if (o.workers != NULL) {
        char err[512] = "";
        int rc = kvi_workers_parse(o.workers, workers, MAX_WORKERS, &n_workers, err, sizeof err);
        if (rc != 0) {
            fprintf(stderr, "kvidxd: --workers: %s\n", rc == -ENOSPC ? "too many entries" : err);
            return 2;
        }
        if (n_workers > 0 && o.block_size == 0) {
            fprintf(stderr, "kvidxd: --block-size is required when --workers is given\n");
            return 2;
        }
    }
    char *peers_copy = NULL;
    char *peers[MAX_PEERS];
    size_t n_peers = 0;
    if (o.peers != NULL) {
        peers_copy = strdup(o.peers);
        if (peers_copy == NULL)
            return 1;
        n_peers = split_list(peers_copy, peers, MAX_PEERS);
    }
    uint64_t min_workers;
    if (min_initial_workers(&min_workers) != 0)
        return 2;
    bool test_endpoints = truthy(getenv("DYN_KV_INDEXER_TEST_ENDPOINTS"));

    /* Every thread inherits this mask; main takes the signals with sigwait. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);

    struct kvi_service_config sc = {
        .writer_threads = (uint32_t)o.writer_threads,
        .listener_threads = (uint32_t)o.listener_threads,
        .replay_timeout_ms = (uint32_t)o.replay_timeout_ms,
        .min_initial_workers = min_workers,
        .workers = workers,
        .n_workers = n_workers,
        .block_size = (uint32_t)o.block_size,
        .model_name = o.model_name,
        .tenant_id = o.tenant_id,
        .peers = (const char *const *)peers,
        .n_peers = n_peers,
        .recovery_delay_ms = (uint32_t)o.recovery_delay_ms,
        .recovery_timeout_ms = (uint32_t)o.recovery_timeout_ms,
        .listeners_quiet = false, /* listener lines go through kvi_log: --log-level filters them */
        .max_models = (uint32_t)o.max_models,
        .nats = &nats_args,
        .zbinds = o.zbind,
        .n_zbinds = o.n_zbind,
        .zbind_max_pods = (uint32_t)o.zbind_max_pods,
        .zbind_idle_s = (uint32_t)o.zbind_idle_s,
        .capacity_max_blocks = o.capacity_max == 0 ? KVI_SVC_CAPACITY_OFF : (uint64_t)o.capacity_max,
    };
    struct kvi_service *svc = kvi_service_create(&sc);
    if (svc == NULL) {
        kvi_log_error("cannot create the service: %s", strerror(errno));
        return 1;
    }
    kvi_listeners_set_max_ranks(kvi_service_listeners(svc), (uint32_t)o.max_dp_ranks); /* 0 = default */
    struct kvi_routes_config rc_cfg = {
        .body_limit = (size_t)o.body_limit,
        .query_body_limit = (size_t)o.query_body_limit,
        .test_endpoints = test_endpoints,
        .api = api,
    };
    struct kvi_routes *routes = kvi_routes_create(svc, &rc_cfg, (unsigned)o.http_threads);
    struct kvi_http_options ho;
    http_options_shared(&o, &ho);
    ho.port = (uint16_t)o.port;
    ho.threads = (unsigned)o.http_threads;
    ho.thread_init = kvi_routes_thread_init;
    ho.thread_fini = kvi_routes_thread_fini;
    ho.thread_ud = routes;
    struct kvi_http_server *srv = kvi_http_server_create(&ho);
    int exit_code = 0, rc, sig = 0;
    struct kvi_slot_service *slots = NULL;
    struct kvi_slot_routes *slot_routes = NULL;
    struct kvi_http_server *slot_srv = NULL; /* NULL: no slot port */
    struct kvi_route_route *rr = NULL;
    uint64_t t0 = 0;
    if (srv == NULL) {
        kvi_log_error("cannot listen on %s:%ld: %s", o.host, o.port, strerror(errno));
        exit_code = 1;
        goto out_service;
    }
    rc = kvi_routes_mount(routes, srv);

    /* The slot tracker: service, route table and slot port, as the indexer's above. */
    slot_cfg.admin_token = ho.admin_token;
    slot_cfg.data_token = ho.data_token;
    if (rc == 0 && (slots = kvi_slot_service_create(&slot_cfg)) == NULL)
        rc = -errno;
    unsigned slot_threads = slot_port.http_threads ? slot_port.http_threads : (unsigned)o.http_threads;
    if (rc == 0 && slot_port.port != KVI_SLOT_PORT_OFF) {
        slot_routes = kvi_slot_routes_create(slots, slot_threads, (size_t)o.body_limit, test_endpoints);
        struct kvi_http_options sho;
        http_options_shared(&o, &sho); /* the same limits on both ports */
        sho.port = slot_port.port == KVI_SLOT_PORT_EPHEMERAL ? 0 : (uint16_t)slot_port.port;
        sho.threads = slot_threads;
        sho.shutdown_grace_ms = SLOT_GRACE_MS;
        sho.thread_init = kvi_slot_routes_thread_init;
        sho.thread_fini = kvi_slot_routes_thread_fini;
        sho.thread_ud = slot_routes;
        slot_srv = kvi_http_server_create(&sho);
        if (slot_srv == NULL && slot_port.port_explicit) {
            rc = -errno;
            kvi_log_error("slot tracker: cannot listen on %s:%d: %s", o.host, (int)sho.port, strerror(-rc));
        } else if (slot_srv == NULL) { /* the default port is taken: run without a slot port */
            kvi_log_warn("slot tracker: cannot listen on the default port %s:%d (%s): no slot port; pass "
                         "--slot-port N to choose one", o.host, (int)sho.port, strerror(errno));
        } else if ((rc = kvi_slot_routes_mount(slot_routes, slot_srv)) != 0) {
            kvi_log_error("slot tracker: cannot mount its routes: %s", strerror(-rc));
        }
    }
    if (rc == 0) {
        rr = kvi_route_route_create(slots, svc, (unsigned)o.http_threads);
        rc = kvi_route_route_mount(rr, srv, (size_t)o.query_body_limit);
    }
    if (rc == 0 && slot_srv != NULL && (rc = kvi_http_server_start(slot_srv)) == 0) {
        uint16_t slot_port_no = kvi_http_server_port(slot_srv);
        kvi_log_info("slot tracker listening on %s:%u (%u HTTP thread(s)); replica sync %s", o.host, slot_port_no,
                     slot_threads, kvi_slot_service_sync_enabled(slots) ? "on" : "off");
        if (test_endpoints)
            kvi_log_warn("slot tracker: /test/advance_clock and /test/replica_sender are mounted (they move the "
                         "clock and stop replica sync; do not use in production)");
        int prc;
        if (slot_port.port_file != NULL && (prc = write_port_file(slot_port.port_file, slot_port_no)) != 0)
            kvi_log_error("cannot write --slot-port-file %s: %s", slot_port.port_file, strerror(-prc));
    } else if (rc == 0) {
        kvi_log_info("slot tracker: no slot port (POST /route is still served on the indexer port)");
    }
    if (rc == 0)
        rc = kvi_slot_service_start(slots); /* writes posted meanwhile wait for its mutation thread */
    if (rc == 0)
        rc = kvi_http_server_start(srv);
    if (rc != 0) {
        kvi_log_error("cannot start HTTP: %s", strerror(-rc));
        exit_code = 1;
        goto out_server;
    }
    uint16_t port = kvi_http_server_port(srv);
    kvi_log_info("kvidxd %s listening on %s:%u (%s, %ld HTTP thread(s), %ld writer thread(s))", KVIDXD_VERSION, o.host,
                 port, o.tls_cert ? "HTTPS + HTTP/2 via ALPN" : "HTTP/1.1 + h2c", o.http_threads, o.writer_threads);
    if (test_endpoints)
        kvi_log_warn("DYN_KV_INDEXER_TEST_ENDPOINTS is set: /test/pause_listener and /test/resume_listener are "
                     "mounted (they drop events; do not use in production)");
    if (ho.admin_token == NULL && o.allow_remote_admin)
        kvi_log_warn("no admin token and --allow-remote-admin: any client can register, unregister and add peers "
                     "(set --admin-token to protect those routes)");
    else if (ho.admin_token == NULL)
        kvi_log_info("no admin token: registration, peer and other mutating routes accept loopback clients only "
                     "(--admin-token or --allow-remote-admin opens them to others)");
    if (o.port_file != NULL && (rc = write_port_file(o.port_file, port)) != 0)
        kvi_log_error("cannot write --port-file %s: %s", o.port_file, strerror(-rc));
    if ((rc = kvi_service_start(svc)) != 0) {
        /* requests may already wait for it with deferred answers: no orderly teardown */
        kvi_log_error("cannot start the control thread: %s", strerror(-rc));
        _exit(1);
    }

    sigwait(&sigs, &sig);
    t0 = kvi_now_ns();
    kvi_log_info("%s received: shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    kvi_service_begin_stop(svc);
    if (kvi_http_server_stop(srv) == 1)
        kvi_log_warn("some HTTP connections were cut at the end of the grace period");
    if (slot_srv != NULL)
        kvi_http_server_stop(slot_srv);
    kvi_slot_service_stop(slots); /* after both ports: it completes their deferred writes and /route commits */
    /* Exit within 2 s: the control thread normally ends at once; only a peer
     * fetch stuck in connect can hold it, and then the process just exits. */
    if (kvi_service_stop(svc, (uint32_t)KVI_MAX(100, 1900 - (int64_t)((kvi_now_ns() - t0) / 1000000))) != 0) {
        kvi_log_warn("control thread busy (peer fetch): exiting without teardown");
        _exit(0);
    }
out_server:
    kvi_http_server_free(srv); /* first: it starts only after the slot service, so no job of its is left */
    if (slot_srv != NULL)
        kvi_http_server_stop(slot_srv); /* (stopped already unless startup failed) */
    kvi_slot_service_free(slots); /* stops it; jobs never run answer 503 before the slot port is freed */
    kvi_http_server_free(slot_srv);
    kvi_slot_routes_free(slot_routes);
    kvi_route_route_free(rr); /* after the mutation thread, which runs /route commits */
out_service:
    kvi_service_destroy(svc);
    kvi_routes_free(routes);
    curl_global_cleanup();
    free(peers_copy);
    kvi_nats_args_free(&nats_args);
    if (exit_code == 0)
        kvi_log_info("stopped in %.0f ms", (double)(kvi_now_ns() - t0) / 1e6);
    return exit_code;
}
