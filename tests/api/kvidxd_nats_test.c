/* ctest-labels: integration -- api/service_nats.c, net/nats_source.c: publisher library -> nats-server -> kvidxd */
/*
 * End to end on a real nats-server (tests/net/nats_server_fixture.h): C
 * publishers (the library's NATS transports) -> nats-server -> kvidxd
 * (--nats-source / --nats-stream) -> /query, /query_by_hash and /dump,
 * which must equal a model of what each (worker, dp_rank) holds:
 *   - Core NATS: two workers with two ranks each, a gap (skip_live), bad
 *     payloads interleaved with good ones, /workers and /unregister;
 *   - JetStream: kill -9 of kvidxd mid-stream and a restart with the same
 *     durable name (the consumer reads the stream whole again: /dump equals
 *     the model, pending reaches 0, /ready answers 200);
 *   - JetStream: nats-server stopped and restarted mid-stream (file
 *     storage): nothing lost;
 *   - JetStream: no server answers when kvidxd starts: it serves what it
 *     holds (/health, a ZMQ engine's queries), /ready says nats_unreachable,
 *     and it converges (/dump equals the model) once the server is back.
 * Waits are bounded polls of kvidxd's own counters (no sleep is a
 * synchronisation); checks run on the main thread only.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <msgpack.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api/kvidxd_fixture.h"
#include "api/kvidxd_model.h"
#include "net/nats_server_fixture.h"

#define CHAIN_LEN 6

/* ---- publishers ------------------------------------------------------------------------------ */

/* ---- checks against the model ---------------------------------------------------------------- */

static uint64_t mp_get_u64(const msgpack_object *map, uint64_t key, bool *found)
{
    *found = false;
    if (map == NULL || map->type != MSGPACK_OBJECT_MAP)
        return 0;
    char k[24];
    snprintf(k, sizeof k, "%" PRIu64, key);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == strlen(k) &&
            memcmp(kv->key.via.str.ptr, k, strlen(k)) == 0) {
            *found = true;
            return kv->val.type == MSGPACK_OBJECT_POSITIVE_INTEGER ? kv->val.via.u64 : UINT64_MAX;
        }
    }
    return 0;
}

static const msgpack_object *mp_get(const msgpack_object *map, const char *key)
{
    if (map == NULL || map->type != MSGPACK_OBJECT_MAP)
        return NULL;
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == strlen(key) &&
            memcmp(kv->key.via.str.ptr, key, strlen(key)) == 0)
            return &kv->val;
    }
    return NULL;
}

/*
 * POST a msgpack /query (tokens of chain c) or /query_by_hash (its content
 * hashes) and compare its scores with the model: every (worker, rank)
 * holding a prefix of chain c scores that many tokens, nobody else scores.
 */
static void check_query(const struct kfx_daemon *d, const struct model *m, const char *model_name,
                        const char *tenant, uint32_t c, bool by_hash)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "model_name", 10);
    msgpack_pack_str_with_body(&pk, model_name, strlen(model_name));
    msgpack_pack_str_with_body(&pk, "tenant_id", 9);
    msgpack_pack_str_with_body(&pk, tenant, strlen(tenant));
    if (by_hash) {
        msgpack_pack_str_with_body(&pk, "block_hashes", 12);
        msgpack_pack_array(&pk, CHAIN_LEN);
        for (uint32_t i = 0; i < CHAIN_LEN; i++)
            msgpack_pack_int64(&pk, (int64_t)kfx_content(c, i));
    } else {
        uint32_t tok[CHAIN_LEN * KFX_BS];
        kfx_tokens(c, 0, CHAIN_LEN, tok);
        msgpack_pack_str_with_body(&pk, "token_ids", 9);
        msgpack_pack_array(&pk, CHAIN_LEN * KFX_BS);
        for (uint32_t i = 0; i < CHAIN_LEN * KFX_BS; i++)
            msgpack_pack_uint32(&pk, tok[i]);
    }
    const char *hm[] = {"Content-Type: application/msgpack", NULL};
    struct kfx_resp r;
    const char *path = by_hash ? "/query_by_hash" : "/query";
    assert_int_equal(kfx_http(d, KFX_H1, "POST", path, hm, sb.data, sb.size, &r), 200);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, r.body, r.len, NULL), MSGPACK_UNPACK_SUCCESS);
    const msgpack_object *scores = mp_get(&u.data, "scores");
    assert_non_null(scores);
    size_t want = 0, got = 0;
    for (size_t i = 0; i < m->n; i++) {
        const struct held *h = &m->h[i];
        if (h->c != c || h->n == 0)
            continue;
        want++;
        bool f1, f2;
        (void)mp_get_u64(scores, h->w, &f1);
        const msgpack_object *ranks = NULL;
        for (uint32_t k = 0; k < scores->via.map.size && f1; k++) {
            char key[24];
            snprintf(key, sizeof key, "%" PRIu64, h->w);
            const msgpack_object_kv *kv = &scores->via.map.ptr[k];
            if (kv->key.via.str.size == strlen(key) && memcmp(kv->key.via.str.ptr, key, strlen(key)) == 0)
                ranks = &kv->val;
        }
        uint64_t s = mp_get_u64(ranks, h->r, &f2);
        if (!f2 || s != (uint64_t)h->n * KFX_BS)
            fail_msg("%s chain %u: worker %" PRIu64 " rank %u scores %" PRIu64 " (found %d), model %u blocks", path,
                     c, h->w, h->r, s, f2, h->n);
    }
    for (uint32_t k = 0; k < scores->via.map.size; k++)
        got += scores->via.map.ptr[k].val.via.map.size;
    if (got != want)
        fail_msg("%s chain %u: %zu scores, model %zu", path, c, got, want);
    msgpack_unpacked_destroy(&u);
    kfx_resp_free(&r);
    msgpack_sbuffer_destroy(&sb);
}

/* How many (worker, rank) score block 0 of chain c (-1 on an error). */
static int scored(const struct kfx_daemon *d, const char *model_name, const char *tenant, uint32_t c)
{
    char body[256];
    uint32_t tok[KFX_BS];
    kfx_tokens(c, 0, 1, tok);
    snprintf(body, sizeof body, "{\"model_name\":\"%s\",\"tenant_id\":\"%s\",\"token_ids\":[%u,%u,%u,%u]}",
             model_name, tenant, tok[0], tok[1], tok[2], tok[3]);
    struct kfx_resp r;
    int n = -1;
    if (kfx_post_json(d, "/query", body, &r) == 200) {
        const char *p = strstr(r.body, "\"scores\":{");
        const char *e = p != NULL ? strstr(p, ",\"frequencies\"") : NULL; /* the end of the scores object */
        n = 0;
        for (const char *q = p; q != NULL && e != NULL && (q = strstr(q, ":4")) != NULL && q < e; q++)
            n++;
    }
    kfx_resp_free(&r);
    return n;
}

static void check_model(const struct kfx_daemon *d, const struct model *m, const char *model_name,
                        const char *tenant, uint32_t n_chains)
{
    for (uint32_t c = 0; c < n_chains; c++) {
        check_query(d, m, model_name, tenant, c, false);
        check_query(d, m, model_name, tenant, c, true);
    }
    char ns_key[128];
    snprintf(ns_key, sizeof ns_key, "\"%s:%s\"", model_name, tenant);
    check_dump(d, m, ns_key);
}

static char metric_name[512];

static const char *metric(const char *name, const char *source, const char *model)
{
    snprintf(metric_name, sizeof metric_name, "%s{source=\"%s\",model=\"%s\"}", name, source, model);
    return metric_name;
}

/* Wait (bounded) until a source's counter reaches `want`. */
static void wait_metric(const struct kfx_daemon *d, const char *name, long long want)
{
    if (!KFX_WAIT(kfx_metric(d, name) >= want, KFX_WAIT_MS)) {
        kfx_dump_log(d);
        fail_msg("%s never reached %lld (now %lld)", name, want, kfx_metric(d, name));
    }
}

/* ---- Core NATS ------------------------------------------------------------------------------- */

static void test_core(void **state)
{
    (void)state;
    struct kvi_nats_server ns;
    assert_int_equal(kvi_nats_server_start(&ns, 10000), 0);
    const char *subj = "namespace.dyn.component.backend.kv-events";
    char source[256];
    snprintf(source, sizeof source, "%s=m@%d", subj, KFX_BS);
    const char *args[] = {"--nats", ns.url, "--nats-source", source, NULL};
    struct kfx_daemon d;
    kfx_start(&d, args, NULL);
    /* the subscription is made once the plane started: wait for it before publishing (Core
     * NATS delivers only to subscribers present when a message is published) */
    assert_true(kfx_log_has(&d, "nats: core source", subj, KFX_WAIT_MS));
    assert_true(KFX_WAIT(kfx_metric(&d, "kvidx_nats_connected") == 1, KFX_WAIT_MS));
    struct model m = {0};
    struct npub p[4];
    for (int i = 0; i < 4; i++)
        p[i] = npub_open(KVIDX_PUB_TRANSPORT_NATS_CORE, ns.url, subj, NULL, 11 + (uint64_t)(i / 2), (uint32_t)(i % 2));
    /* the subscription is live once a probe arrives: store and remove a block of chain 9 until one
     * does (bounded), so no later event is published before kvidxd listens */
    char msgs[512];
    snprintf(msgs, sizeof msgs, "%s", metric("kvidx_nats_messages_total", subj, "m:default"));
    int64_t until = kfx_now_ms() + KFX_WAIT_MS;
    do {
        pub_store(&p[0], &m, 9, 0, 1);
        pub_remove(&p[0], &m, 9, 0);
    } while (!KFX_WAIT(kfx_metric(&d, msgs) > 0, 50) && kfx_now_ms() < until);
    assert_true(kfx_metric(&d, msgs) > 0);
    pub_store(&p[0], &m, 0, 0, 4);
    pub_store(&p[0], &m, 0, 4, 6);
    pub_store(&p[1], &m, 0, 0, 2);
    pub_store(&p[2], &m, 1, 0, 6);
    pub_store(&p[3], &m, 1, 0, 3);
    pub_store(&p[3], &m, 0, 0, 5);
    /* bad payloads between good events: counted, the rest applied */
    const void *bad[] = {"garbage"};
    size_t bad_len[] = {7};
    assert_int_equal(kvidx_pub_send_raw(p[1].p, bad, bad_len, 1), 0);
    const void *bad2[] = {"{\"worker_id\":12,\"event\":{\"event_id\":1,\"data\":{\"moved\":{}}}}"};
    size_t bad2_len[] = {strlen(bad2[0])};
    assert_int_equal(kvidx_pub_send_raw(p[2].p, bad2, bad2_len, 1), 0);
    pub_remove(&p[2], &m, 1, 4);
    /* a gap: worker 11 rank 1 loses two events (a store and its removal never reach NATS); the
     * next event is applied and the gap counted */
    kvidx_pub_skip_live(p[1].p, 2);
    kfx_publish(p[1].p, 5, 0, 2, NULL);
    kfx_unpublish(p[1].p, 5, 0, 2);
    pub_store(&p[1], &m, 0, 2, 3);
    pub_remove(&p[3], &m, 0, 1);

    /* a last event from each publisher (block 0 of chain 7): NATS keeps one connection's order,
     * so once all four show in a query, everything before them has been handled */
    for (int i = 0; i < 4; i++)
        pub_store(&p[i], &m, 7, 0, 1);
    if (!KFX_WAIT(scored(&d, "m", "default", 7) == 4, KFX_WAIT_MS)) {
        kfx_dump_log(&d);
        fail_msg("the last events never all arrived (%d of 4)", scored(&d, "m", "default", 7));
    }
    assert_int_equal(kfx_metric(&d, metric("kvidx_nats_gaps_total", subj, "m:default")), 1);
    check_model(&d, &m, "m", "default", 8);
    assert_int_equal(kfx_metric(&d, metric("kvidx_nats_events_lost_total", subj, "m:default")), 2);
    char l[256];
    snprintf(l, sizeof l, "kvidx_nats_decode_errors_total{source=\"%s\",reason=\"syntax\"}", subj);
    assert_int_equal(kfx_metric(&d, l), 1);
    snprintf(l, sizeof l, "kvidx_nats_decode_errors_total{source=\"%s\",reason=\"variant\"}", subj);
    assert_int_equal(kfx_metric(&d, l), 1);

    /* /workers: two NATS workers, two ranks each, with the subject */
    assert_true(kfx_get_has(&d, "/workers", 200, "\"instance_id\":11,\"model_name\":\"m\",\"tenant_id\":\"default\","
                                                  "\"block_size\":4,\"source\":\"nats\""));
    assert_true(kfx_get_has(&d, "/workers", 200, "\"endpoints\":{\"0\":\"namespace.dyn.component.backend.kv-events\","
                                                  "\"1\":\"namespace.dyn.component.backend.kv-events\"}"));
    /* /unregister drops worker 12's blocks on every rank */
    kfx_expect(&d, "/unregister", "{\"instance_id\":12,\"model_name\":\"m\"}", 200, NULL);
    for (size_t i = 0; i < m.n; i++)
        if (m.h[i].w == 12)
            m.h[i].n = 0;
    check_model(&d, &m, "m", "default", 8);
    kfx_expect(&d, "/unregister", "{\"instance_id\":99,\"model_name\":\"m\"}", 404, NULL);

    for (int i = 0; i < 4; i++)
        kvidx_pub_destroy(p[i].p);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
    kvi_nats_server_stop(&ns);
}

/* ---- JetStream -------------------------------------------------------------------------------- */

static void test_jetstream_restarts(void **state)
{
    (void)state;
    struct kvi_nats_server ns;
    assert_int_equal(kvi_nats_server_start(&ns, 10000), 0);
    const char *stream = "namespace-dyn-component-backend-kv-events";
    struct model m = {0};
    struct npub p[4];
    for (int i = 0; i < 4; i++)
        p[i] = npub_open(KVIDX_PUB_TRANSPORT_NATS_JETSTREAM, ns.url, NULL, stream, 21 + (uint64_t)(i / 2),
                         (uint32_t)(i % 2));
    pub_store(&p[0], &m, 0, 0, 3);
    pub_store(&p[1], &m, 0, 0, 6);
    pub_store(&p[2], &m, 1, 0, 4);

    char source[256];
    snprintf(source, sizeof source, "%s=m:t@%d", stream, KFX_BS);
    const char *args[] = {"--nats", ns.url, "--nats-stream", source, "--nats-durable", "kvidx-test", NULL};
    struct kfx_daemon d;
    kfx_start(&d, args, NULL);
    wait_metric(&d, metric("kvidx_nats_acked_total", stream, "m:t"), 3);
    assert_true(kfx_get_has(&d, "/ready", 200, "\"ready\":true"));
    pub_store(&p[3], &m, 1, 0, 2);
    pub_remove(&p[1], &m, 0, 3);
    wait_metric(&d, metric("kvidx_nats_acked_total", stream, "m:t"), 5);
    check_model(&d, &m, "m", "t", 2);

    /* kill -9 in the middle of the stream; more events while it is down */
    assert_int_equal(kill(d.pid, SIGKILL), 0);
    kfx_stop(&d, 0, NULL);
    pub_store(&p[0], &m, 0, 3, 6);
    pub_remove(&p[2], &m, 1, 1);
    pub_store(&p[3], &m, 1, 2, 5);
    /* a restart with the same durable name rebuilds from the stream */
    kfx_start(&d, args, NULL);
    if (!KFX_WAIT(kfx_get_has(&d, "/ready", 200, "\"ready\":true"), KFX_WAIT_MS)) {
        kfx_dump_log(&d);
        fail_msg("/ready never 200 after the restart");
    }
    assert_true(kfx_get_has(&d, "/status", 200, "\"nats\":{\"connected\":true,\"pending\":0}"));
    wait_metric(&d, metric("kvidx_nats_acked_total", stream, "m:t"), 8);
    assert_int_equal(kfx_metric(&d, metric("kvidx_nats_consumer_pending", stream, "m:t")), 0);
    check_model(&d, &m, "m", "t", 2);

    /* nats-server stopped and restarted mid-stream (file storage): nothing lost */
    kvi_nats_server_pause(&ns);
    assert_int_equal(kvi_nats_server_resume(&ns), 0);
    if (!KFX_WAIT(kfx_metric(&d, "kvidx_nats_reconnects_total") >= 1, KFX_WAIT_MS)) {
        kfx_dump_log(&d);
        kvi_nats_server_dump_log(&ns);
        fail_msg("kvidxd never reconnected");
    }
    pub_store(&p[1], &m, 0, 3, 5);
    pub_store(&p[2], &m, 1, 1, 6);
    wait_metric(&d, metric("kvidx_nats_acked_total", stream, "m:t"), 10);
    check_model(&d, &m, "m", "t", 2);
    assert_int_equal(kfx_metric(&d, metric("kvidx_nats_events_stale_total", stream, "m:t")), 0);

    for (int i = 0; i < 4; i++)
        kvidx_pub_destroy(p[i].p);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
    kvi_nats_server_stop(&ns);
}

/* ---- NATS unreachable at start-up ---------------------------------------------------------- */

/* kvidxd started with a stream source while no NATS server answers: it serves what it holds (a ZMQ
 * engine's blocks), /ready says nats_unreachable, and once the server is back it reads the stream
 * whole and its /dump equals the model. */
static void test_nats_down_at_start(void **state)
{
    (void)state;
    struct kvi_nats_server ns;
    assert_int_equal(kvi_nats_server_start(&ns, 10000), 0);
    const char *stream = "down-at-start";
    struct model m = {0};
    struct npub p[2];
    for (int i = 0; i < 2; i++)
        p[i] = npub_open(KVIDX_PUB_TRANSPORT_NATS_JETSTREAM, ns.url, NULL, stream, 41 + (uint64_t)i, 0);
    pub_store(&p[0], &m, 0, 0, 4);
    pub_store(&p[1], &m, 1, 0, 3);
    for (int i = 0; i < 2; i++)
        kvidx_pub_destroy(p[i].p);
    kvi_nats_server_pause(&ns); /* (its store, with the stream, stays) */

    char source[256];
    snprintf(source, sizeof source, "%s=m:t@%d", stream, KFX_BS);
    const char *args[] = {"--nats", ns.url, "--nats-stream", source, "--nats-durable", "kvidx-down", NULL};
    struct kfx_daemon d;
    kfx_start(&d, args, NULL);
    assert_true(kfx_get_has(&d, "/health", 200, NULL));
    if (!KFX_WAIT(kfx_get_has(&d, "/ready", 503, "\"reason\":\"nats_unreachable\""), KFX_WAIT_MS)) {
        kfx_dump_log(&d);
        fail_msg("/ready never said nats_unreachable");
    }
    assert_true(kfx_get_has(&d, "/status", 200, "\"nats\":{\"connected\":false"));
    /* it serves what it holds: a ZMQ engine registered meanwhile is indexed and queried */
    struct kvidx_pub *z = kfx_pub(0);
    char body[512];
    snprintf(body, sizeof body, "{\"instance_id\":5,\"endpoint\":\"%s\",\"replay_endpoint\":\"%s\",\"model_name\":\"z\","
             "\"block_size\":%d}", kvidx_pub_endpoint(z), kvidx_pub_replay_endpoint(z), KFX_BS);
    kfx_expect(&d, "/register", body, 201, NULL);
    kfx_publish(z, 0, 0, 3, NULL);
    char *q = kfx_query_json("z", 0, 3);
    kfx_until_query(&d, "/query", q, "\"scores\":{\"5\":{\"0\":12}}", &z, 1);
    assert_true(kfx_get_has(&d, "/ready", 503, "\"reason\":\"nats_unreachable\""));

    /* NATS back: the stream is read whole, and new events follow */
    assert_int_equal(kvi_nats_server_resume(&ns), 0);
    if (!KFX_WAIT(kfx_get_has(&d, "/ready", 200, "\"ready\":true"), KFX_WAIT_MS)) {
        kfx_dump_log(&d);
        kvi_nats_server_dump_log(&ns);
        fail_msg("kvidxd never caught up once NATS came back");
    }
    for (int i = 0; i < 2; i++)
        p[i] = npub_open(KVIDX_PUB_TRANSPORT_NATS_JETSTREAM, ns.url, NULL, stream, 41 + (uint64_t)i, 0);
    pub_store(&p[0], &m, 0, 4, 6);
    pub_remove(&p[1], &m, 1, 1);
    wait_metric(&d, metric("kvidx_nats_acked_total", stream, "m:t"), 4);
    check_model(&d, &m, "m", "t", 2);
    kfx_until_query(&d, "/query", q, "\"scores\":{\"5\":{\"0\":12}}", &z, 1);

    free(q);
    kvidx_pub_destroy(z);
    for (int i = 0; i < 2; i++)
        kvidx_pub_destroy(p[i].p);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
    kvi_nats_server_stop(&ns);
}

/* ---- POST /nats/sources ---------------------------------------------------------------------- */

static void test_sources_route(void **state)
{
    (void)state;
    struct kvi_nats_server ns;
    assert_int_equal(kvi_nats_server_start(&ns, 10000), 0);
    const char *args[] = {"--nats", ns.url, NULL};
    struct kfx_daemon d;
    kfx_start(&d, args, NULL);
    assert_true(KFX_WAIT(kfx_metric(&d, "kvidx_nats_connected") == 1, KFX_WAIT_MS));
    /* a Core source added at run time, into a namespace it creates */
    kfx_expect(&d, "/nats/sources", "{\"subject\":\"rt.kv-events\",\"model_name\":\"rm\",\"block_size\":4}", 201,
               NULL);
    assert_true(kfx_log_has(&d, "nats: core source", "rt.kv-events", KFX_WAIT_MS));
    struct model m = {0};
    struct npub p = npub_open(KVIDX_PUB_TRANSPORT_NATS_CORE, ns.url, "rt.kv-events", NULL, 31, 0);
    /* Core NATS delivers only once the subscription is made: publish until the first event shows */
    int64_t until = kfx_now_ms() + KFX_WAIT_MS;
    do
        pub_store(&p, &m, 3, 0, 1), pub_remove(&p, &m, 3, 0);
    while (!KFX_WAIT(kfx_metric(&d, metric("kvidx_nats_messages_total", "rt.kv-events", "rm:default")) > 0, 50) &&
           kfx_now_ms() < until);
    pub_store(&p, &m, 0, 0, 5);
    if (!KFX_WAIT(scored(&d, "rm", "default", 0) == 1, KFX_WAIT_MS)) {
        kfx_dump_log(&d);
        fail_msg("the source added at run time never indexed its events");
    }
    check_model(&d, &m, "rm", "default", 1);
    /* a stream source needs its stream: added, and it waits for the stream (not an error answer) */
    kfx_expect(&d, "/nats/sources",
               "{\"stream\":\"later\",\"model_name\":\"rm\",\"tenant_id\":\"t2\",\"block_size\":4}", 201, NULL);
    assert_true(kfx_get_has(&d, "/ready", 503, "nats_catching_up"));
    /* bad requests */
    kfx_expect(&d, "/nats/sources", "{\"model_name\":\"rm\",\"block_size\":4}", 400, NULL);
    kfx_expect(&d, "/nats/sources", "{\"subject\":\"x\",\"model_name\":\"rm\",\"block_size\":0}", 422, NULL);
    kfx_expect(&d, "/nats/sources", "{\"subject\":\"x\",\"block_size\":4}", 422, NULL);
    kvidx_pub_destroy(p.p);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);

    /* without --nats there is nothing to add a source to */
    const char *plain[] = {NULL};
    kfx_start(&d, plain, NULL);
    kfx_expect(&d, "/nats/sources", "{\"subject\":\"x\",\"model_name\":\"rm\",\"block_size\":4}", 409, NULL);
    assert_int_equal(kfx_stop(&d, SIGTERM, NULL), 0);
    kvi_nats_server_stop(&ns);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_core),
        cmocka_unit_test(test_jetstream_restarts),
        cmocka_unit_test(test_sources_route),
        cmocka_unit_test(test_nats_down_at_start),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
