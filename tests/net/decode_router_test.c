/* ctest-labels: unit -- net/decode_router.c: Dynamo RouterEvents in JSON, bare msgpack and the Core NATS envelope */
/*
 * (a) JSON RouterEvents as Dynamo writes them (serde_json: named fields,
 *     enum variants as {"stored": {...}}, the unit variant as "cleared"),
 *     byte for byte, every field checked, u64 values above 2^63 exact;
 * (b) the same events as msgpack named maps, bare and inside the Core NATS
 *     envelope, packed with msgpack-c (an encoder independent of ours);
 * (c) field rules: absent and nil optional fields, storage tiers, negative
 *     worker ids, keys in any order, unknown keys of any type skipped;
 * (d) bad input: every strict prefix fails, trailing bytes, wrong types,
 *     unknown variants, a stored block without tokens_hash, floats, limits
 *     (10^6 hashes decode; past KVI_ROUTER_MAX_BLOCKS or the payload limit
 *     fail with KVI_REV_LIMIT), deep nesting; a failure never leaves the
 *     decoder unusable.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "engine/index.h"
#include "net/decode_router.h"

static struct kvi_router_decoder *dec;

static enum kvi_rev_err decode_str(const char *s, struct kvi_router_event *ev)
{
    /* an exact-size heap copy: ASan sees any read past the payload */
    size_t n = strlen(s);
    char *p = malloc(n ? n : 1);
    memcpy(p, s, n);
    enum kvi_rev_err e = kvi_router_decode(dec, p, n, ev);
    free(p);
    return e;
}

/* ---- (a) JSON ----------------------------------------------------------------------------- */

/* The example of nats-event-plane.md §2, as serde_json writes it. */
static const char *const stored_json =
    "{\"worker_id\":7587890123456789,\"storage_tier\":\"device\",\"event\":{\"event_id\":41,"
    "\"data\":{\"stored\":{\"parent_hash\":null,\"start_position\":null,\"blocks\":[{\"block_hash\":"
    "17165273213457520511,\"tokens_hash\":4521880293847513337,\"mm_extra_info\":null}]}},\"dp_rank\":0}}";

static void test_json_stored(void **state)
{
    (void)state;
    struct kvi_router_event ev;
    assert_int_equal(decode_str(stored_json, &ev), KVI_REV_OK);
    assert_int_equal(ev.form, KVI_REVF_JSON);
    assert_int_equal(ev.kind, KVI_REV_STORED);
    assert_true(ev.worker_id == 7587890123456789ull);
    assert_true(ev.event_id == 41);
    assert_int_equal(ev.dp_rank, 0);
    assert_int_equal(ev.tier, KVI_TIER_GPU);
    assert_false(ev.tier_unknown);
    assert_false(ev.has_parent);
    assert_false(ev.has_start_position);
    assert_int_equal(ev.n_blocks, 1);
    assert_true(ev.block_hashes[0] == 17165273213457520511ull); /* > 2^63 */
    assert_true(ev.tokens_hashes[0] == 4521880293847513337ull);
}

static void test_json_variants(void **state)
{
    (void)state;
    struct kvi_router_event ev;
    assert_int_equal(decode_str("{\"worker_id\":18446744073709551615,\"storage_tier\":\"host_pinned\","
                                "\"event\":{\"event_id\":18446744073709551614,\"data\":{\"stored\":{"
                                "\"parent_hash\":9223372036854775808,\"start_position\":7,\"blocks\":["
                                "{\"block_hash\":1,\"tokens_hash\":2,\"mm_extra_info\":{\"mm_objects\":"
                                "[{\"mm_hash\":5,\"offsets\":[[0,3]]}]}},{\"block_hash\":3,\"tokens_hash\":4}]}},"
                                "\"dp_rank\":4294967295}}",
                                &ev),
                     KVI_REV_OK);
    assert_true(ev.worker_id == UINT64_MAX);
    assert_true(ev.event_id == UINT64_MAX - 1);
    assert_int_equal(ev.tier, KVI_TIER_CPU);
    assert_true(ev.has_parent && ev.parent_hash == 9223372036854775808ull);
    assert_true(ev.has_start_position && ev.start_position == 7);
    assert_int_equal(ev.dp_rank, UINT32_MAX);
    assert_int_equal(ev.n_blocks, 2);
    assert_true(ev.block_hashes[0] == 1 && ev.tokens_hashes[0] == 2);
    assert_true(ev.block_hashes[1] == 3 && ev.tokens_hashes[1] == 4);

    assert_int_equal(decode_str("{\"worker_id\":7,\"storage_tier\":\"disk\",\"event\":{\"event_id\":3,\"data\":"
                                "{\"removed\":{\"block_hashes\":[17165273213457520511,0,5]}},\"dp_rank\":2}}",
                                &ev),
                     KVI_REV_OK);
    assert_int_equal(ev.kind, KVI_REV_REMOVED);
    assert_int_equal(ev.tier, KVI_TIER_DISK);
    assert_int_equal(ev.dp_rank, 2);
    assert_int_equal(ev.n_blocks, 3);
    assert_true(ev.block_hashes[0] == 17165273213457520511ull && ev.block_hashes[1] == 0 && ev.block_hashes[2] == 5);
    assert_null(ev.tokens_hashes);

    assert_int_equal(decode_str("{\"worker_id\":7,\"storage_tier\":\"external\",\"event\":{\"event_id\":4,"
                                "\"data\":\"cleared\",\"dp_rank\":1}}",
                                &ev),
                     KVI_REV_OK);
    assert_int_equal(ev.kind, KVI_REV_CLEARED);
    assert_int_equal(ev.tier, KVI_TIER_EXTERNAL);
    assert_int_equal(ev.dp_rank, 1);
    /* the unit variant as a map (an encoder writing {"cleared": null}) */
    assert_int_equal(decode_str("{\"worker_id\":7,\"event\":{\"event_id\":4,\"data\":{\"cleared\":null}}}", &ev),
                     KVI_REV_OK);
    assert_int_equal(ev.kind, KVI_REV_CLEARED);
}

/* ---- (c) field rules ------------------------------------------------------------------------ */

static void test_field_rules(void **state)
{
    (void)state;
    struct kvi_router_event ev;
    /* Dynamo <= 0.4: no storage_tier, no dp_rank, an i64 worker id; keys in another order, and
     * unknown keys holding anything */
    assert_int_equal(decode_str(" {\"event\":{\"data\":{\"removed\":{\"block_hashes\":[-1]}},\"x\":[{},[]],"
                                "\"event_id\":0},\"worker_id\":-2,\"future\":{\"a\":[1.5,\"s\",true,null]}}\n",
                                &ev),
                     KVI_REV_OK);
    assert_true(ev.worker_id == UINT64_MAX - 1);
    assert_int_equal(ev.tier, KVI_TIER_GPU);
    assert_int_equal(ev.dp_rank, 0);
    assert_true(ev.block_hashes[0] == UINT64_MAX);
    /* nil dp_rank and storage_tier; letter case of the tier; an unknown tier is the device, flagged */
    assert_int_equal(decode_str("{\"worker_id\":1,\"storage_tier\":null,\"event\":{\"event_id\":1,\"dp_rank\":null,"
                                "\"data\":\"cleared\"}}",
                                &ev),
                     KVI_REV_OK);
    assert_int_equal(ev.tier, KVI_TIER_GPU);
    assert_false(ev.tier_unknown);
    assert_int_equal(decode_str("{\"worker_id\":1,\"storage_tier\":\"Host_Pinned\",\"event\":{\"event_id\":1,"
                                "\"data\":\"cleared\"}}",
                                &ev),
                     KVI_REV_OK);
    assert_int_equal(ev.tier, KVI_TIER_CPU);
    assert_int_equal(decode_str("{\"worker_id\":1,\"storage_tier\":\"hbm3\",\"event\":{\"event_id\":1,"
                                "\"data\":\"cleared\"}}",
                                &ev),
                     KVI_REV_OK);
    assert_int_equal(ev.tier, KVI_TIER_GPU);
    assert_true(ev.tier_unknown);
    /* storage_tier given twice: the last decides, its flag too (fuzz_router found the flag of an
     * unknown first one kept beside a known tier: tests/fuzz/regressions/router) */
    assert_int_equal(decode_str("{\"worker_id\":1,\"storage_tier\":\"hbm3\",\"storage_tier\":\"disk\","
                                "\"event\":{\"event_id\":1,\"data\":\"cleared\"}}",
                                &ev),
                     KVI_REV_OK);
    assert_int_equal(ev.tier, KVI_TIER_DISK);
    assert_false(ev.tier_unknown);
    assert_int_equal(decode_str("{\"worker_id\":1,\"storage_tier\":\"hbm3\",\"storage_tier\":null,"
                                "\"event\":{\"event_id\":1,\"data\":\"cleared\"}}",
                                &ev),
                     KVI_REV_OK);
    assert_int_equal(ev.tier, KVI_TIER_GPU);
    assert_false(ev.tier_unknown);
    assert_int_equal(decode_str("{\"worker_id\":1,\"storage_tier\":\"disk\",\"storage_tier\":\"hbm3\","
                                "\"event\":{\"event_id\":1,\"data\":\"cleared\"}}",
                                &ev),
                     KVI_REV_OK);
    assert_int_equal(ev.tier, KVI_TIER_GPU);
    assert_true(ev.tier_unknown);
    /* an empty stored run */
    assert_int_equal(decode_str("{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":{\"stored\":{\"blocks\":[]}}}}",
                                &ev),
                     KVI_REV_OK);
    assert_int_equal(ev.n_blocks, 0);
}

/* ---- (b) msgpack ---------------------------------------------------------------------------- */

static void pk_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str_with_body(pk, s, strlen(s));
}

/* A stored RouterEvent with two blocks as Dynamo >= 1.0 packs it (rmp-serde, named). */
static void pack_router_event(msgpack_packer *pk, uint64_t worker, uint64_t event_id, uint32_t rank)
{
    msgpack_pack_map(pk, 3);
    pk_str(pk, "worker_id");
    msgpack_pack_uint64(pk, worker);
    pk_str(pk, "storage_tier");
    pk_str(pk, "device");
    pk_str(pk, "event");
    msgpack_pack_map(pk, 3);
    pk_str(pk, "event_id");
    msgpack_pack_uint64(pk, event_id);
    pk_str(pk, "data");
    msgpack_pack_map(pk, 1);
    pk_str(pk, "stored");
    msgpack_pack_map(pk, 3);
    pk_str(pk, "parent_hash");
    msgpack_pack_uint64(pk, 0xfedcba9876543210ull);
    pk_str(pk, "start_position");
    msgpack_pack_nil(pk);
    pk_str(pk, "blocks");
    msgpack_pack_array(pk, 2);
    for (int i = 0; i < 2; i++) {
        msgpack_pack_map(pk, 3);
        pk_str(pk, "block_hash");
        msgpack_pack_uint64(pk, 0x8000000000000000ull + (uint64_t)i);
        pk_str(pk, "tokens_hash");
        msgpack_pack_uint64(pk, 100u + (uint64_t)i); /* small: a positive fixint */
        pk_str(pk, "mm_extra_info");
        msgpack_pack_nil(pk);
    }
    pk_str(pk, "dp_rank");
    msgpack_pack_uint32(pk, rank);
}

static void check_packed_event(const struct kvi_router_event *ev)
{
    assert_int_equal(ev->kind, KVI_REV_STORED);
    assert_true(ev->worker_id == 0xffffffffffffff01ull);
    assert_true(ev->event_id == 9);
    assert_int_equal(ev->dp_rank, 3);
    assert_true(ev->has_parent && ev->parent_hash == 0xfedcba9876543210ull);
    assert_false(ev->has_start_position);
    assert_int_equal(ev->n_blocks, 2);
    assert_true(ev->block_hashes[0] == 0x8000000000000000ull && ev->block_hashes[1] == 0x8000000000000001ull);
    assert_true(ev->tokens_hashes[0] == 100 && ev->tokens_hashes[1] == 101);
}

static enum kvi_rev_err decode_buf(const void *p, size_t n, struct kvi_router_event *ev)
{
    char *c = malloc(n ? n : 1);
    memcpy(c, p, n);
    enum kvi_rev_err e = kvi_router_decode(dec, c, n, ev);
    free(c);
    return e;
}

static void test_msgpack_bare_and_envelope(void **state)
{
    (void)state;
    msgpack_sbuffer inner;
    msgpack_sbuffer_init(&inner);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &inner, msgpack_sbuffer_write);
    pack_router_event(&pk, 0xffffffffffffff01ull, 9, 3);
    struct kvi_router_event ev;
    assert_int_equal(decode_buf(inner.data, inner.size, &ev), KVI_REV_OK);
    assert_int_equal(ev.form, KVI_REVF_MSGPACK);
    check_packed_event(&ev);

    /* the Core NATS envelope around it (keys in Dynamo's order) */
    msgpack_sbuffer env;
    msgpack_sbuffer_init(&env);
    msgpack_packer_init(&pk, &env, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 5);
    pk_str(&pk, "publisher_id");
    msgpack_pack_uint64(&pk, 0x9000000000000001ull);
    pk_str(&pk, "sequence");
    msgpack_pack_uint64(&pk, 77);
    pk_str(&pk, "published_at");
    msgpack_pack_uint64(&pk, 1767225600123ull);
    pk_str(&pk, "topic");
    pk_str(&pk, "kv-events");
    pk_str(&pk, "payload");
    msgpack_pack_bin_with_body(&pk, inner.data, inner.size);
    assert_int_equal(decode_buf(env.data, env.size, &ev), KVI_REV_OK);
    assert_int_equal(ev.form, KVI_REVF_ENVELOPE);
    check_packed_event(&ev);
    assert_true(ev.publisher_id == 0x9000000000000001ull);
    assert_true(ev.sequence == 77);
    assert_true(ev.published_at == 1767225600123ull);

    /* (d) every strict prefix of both fails, and so does a trailing byte */
    for (size_t n = 0; n < env.size; n++)
        assert_int_not_equal(decode_buf(env.data, n, &ev), KVI_REV_OK);
    for (size_t n = 0; n < inner.size; n++)
        assert_int_not_equal(decode_buf(inner.data, n, &ev), KVI_REV_OK);
    msgpack_sbuffer_write(&env, "\xc0", 1);
    assert_int_equal(decode_buf(env.data, env.size, &ev), KVI_REV_SYNTAX);
    /* the decoder is fine afterwards */
    assert_int_equal(decode_buf(inner.data, inner.size, &ev), KVI_REV_OK);
    check_packed_event(&ev);
    msgpack_sbuffer_destroy(&env);
    msgpack_sbuffer_destroy(&inner);
}

/* ---- (d) bad input -------------------------------------------------------------------------- */

static void test_bad_json(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        enum kvi_rev_err want;
    } cases[] = {
        {"", KVI_REV_SYNTAX},
        {"[]", KVI_REV_SYNTAX}, /* neither a JSON object nor a msgpack map */
        {"{\"worker_id\":1}", KVI_REV_SHAPE},
        {"{\"event\":{\"event_id\":1,\"data\":\"cleared\"}}", KVI_REV_SHAPE},
        {"{\"worker_id\":\"7\",\"event\":{\"event_id\":1,\"data\":\"cleared\"}}", KVI_REV_SHAPE},
        {"{\"worker_id\":1.5,\"event\":{\"event_id\":1,\"data\":\"cleared\"}}", KVI_REV_SHAPE},
        {"{\"worker_id\":18446744073709551616,\"event\":{\"event_id\":1,\"data\":\"cleared\"}}", KVI_REV_SHAPE},
        {"{\"worker_id\":1,\"event\":{\"event_id\":-1,\"data\":\"cleared\"}}", KVI_REV_SHAPE},
        {"{\"worker_id\":1,\"event\":{\"data\":\"cleared\"}}", KVI_REV_SHAPE},
        {"{\"worker_id\":1,\"event\":{\"event_id\":1}}", KVI_REV_SHAPE},
        {"{\"worker_id\":1,\"event\":{\"event_id\":1,\"dp_rank\":4294967296,\"data\":\"cleared\"}}", KVI_REV_SHAPE},
        {"{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":\"Ignored\"}}", KVI_REV_VARIANT},
        {"{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":{\"moved\":{}}}}", KVI_REV_VARIANT},
        {"{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":{}}}", KVI_REV_VARIANT},
        {"{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":{\"cleared\":null,\"stored\":{\"blocks\":[]}}}}",
         KVI_REV_SHAPE},
        {"{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":{\"stored\":{\"parent_hash\":null}}}}", KVI_REV_SHAPE},
        {"{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":{\"stored\":{\"blocks\":[{\"block_hash\":1}]}}}}",
         KVI_REV_SHAPE}, /* a stored block without tokens_hash */
        {"{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":{\"stored\":{\"blocks\":[{\"tokens_hash\":1}]}}}}",
         KVI_REV_SHAPE},
        {"{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":{\"stored\":{\"blocks\":[[1,2]]}}}}", KVI_REV_SHAPE},
        {"{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":{\"stored\":{\"blocks\":{}}}}}", KVI_REV_SHAPE},
        {"{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":{\"removed\":{\"block_hashes\":[1.0]}}}}",
         KVI_REV_SHAPE},
        {"{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":{\"removed\":{}}}}", KVI_REV_SHAPE},
        {"{\"worker_id\":1,\"storage_tier\":7,\"event\":{\"event_id\":1,\"data\":\"cleared\"}}", KVI_REV_SHAPE},
        {"{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":\"cleared\"}} x", KVI_REV_SYNTAX},
        {"{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":\"cleared\"},}", KVI_REV_SYNTAX},
        {"{\"worker_id\":1,\"event\":{\"event_id\":01,\"data\":\"cleared\"}}", KVI_REV_SYNTAX},
        {"{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":\"cl\xff\"}}", KVI_REV_SYNTAX},
    };
    struct kvi_router_event ev;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        enum kvi_rev_err e = decode_str(cases[i].json, &ev);
        if (e != cases[i].want)
            fail_msg("case %zu %s: got %s (%s), want %s", i, cases[i].json, kvi_router_err_name(e),
                     kvi_router_decoder_what(dec), kvi_router_err_name(cases[i].want));
        assert_true(strlen(kvi_router_decoder_what(dec)) > 0);
    }
    /* every strict prefix of a valid event fails */
    size_t n = strlen(stored_json);
    for (size_t k = 0; k < n; k++) {
        char *p = malloc(k ? k : 1);
        memcpy(p, stored_json, k);
        assert_int_not_equal(kvi_router_decode(dec, p, k, &ev), KVI_REV_OK);
        free(p);
    }
    /* nesting past the reader's depth in an unknown key */
    char deep[400];
    size_t k = (size_t)snprintf(deep, sizeof deep, "{\"worker_id\":1,\"x\":");
    for (int d = 0; d < 100; d++)
        deep[k++] = '[';
    for (int d = 0; d < 100; d++)
        deep[k++] = ']';
    snprintf(deep + k, sizeof deep - k, ",\"event\":{\"event_id\":1,\"data\":\"cleared\"}}");
    assert_int_equal(decode_str(deep, &ev), KVI_REV_SYNTAX);
    assert_int_equal(decode_str(stored_json, &ev), KVI_REV_OK);
}

/* A removed event of n hashes, as JSON. */
static char *removed_of(size_t n)
{
    char *s = malloc(n * 2 + 128);
    size_t k = (size_t)sprintf(s, "{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":{\"removed\":{\"block_hashes\":[");
    for (size_t i = 0; i < n; i++) {
        s[k++] = (char)('0' + i % 10);
        s[k++] = ',';
    }
    if (n > 0)
        k--;
    strcpy(s + k, "]}}}}");
    return s;
}

static void test_limits(void **state)
{
    (void)state;
    struct kvi_router_event ev;
    char *s = removed_of(1000000);
    assert_int_equal(decode_str(s, &ev), KVI_REV_OK);
    assert_int_equal(ev.n_blocks, 1000000);
    assert_true(ev.block_hashes[999999] == 9);
    free(s);
    s = removed_of(KVI_ROUTER_MAX_BLOCKS + 1u);
    assert_int_equal(decode_str(s, &ev), KVI_REV_LIMIT);
    free(s);
    /* past the payload limit: refused before reading */
    size_t big = KVI_ROUTER_MAX_PAYLOAD + 1;
    char *p = calloc(1, big);
    p[0] = '{';
    assert_int_equal(kvi_router_decode(dec, p, big, &ev), KVI_REV_LIMIT);
    free(p);
    /* stored blocks past the limit (the stored path counts as it goes) */
    size_t nb = KVI_ROUTER_MAX_BLOCKS + 1u;
    char *q = malloc(nb * 36 + 128);
    size_t k = (size_t)sprintf(q, "{\"worker_id\":1,\"event\":{\"event_id\":1,\"data\":{\"stored\":{\"blocks\":[");
    for (size_t i = 0; i < nb; i++)
        k += (size_t)sprintf(q + k, "%s{\"block_hash\":1,\"tokens_hash\":2}", i ? "," : "");
    strcpy(q + k, "]}}}}");
    assert_int_equal(decode_str(q, &ev), KVI_REV_LIMIT);
    free(q);
    assert_int_equal(decode_str(stored_json, &ev), KVI_REV_OK);
}

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(kvi_router_err_name(KVI_REV_OK), "ok");
    assert_string_equal(kvi_router_err_name(KVI_REV_VARIANT), "variant");
    assert_string_equal(kvi_router_err_name(KVI_REV_LIMIT), "limit");
    assert_string_equal(kvi_router_form_name(KVI_REVF_ENVELOPE), "envelope");
    assert_string_equal(kvi_router_form_name(KVI_REVF_JSON), "json");
}

static int setup(void **state)
{
    (void)state;
    dec = kvi_router_decoder_new();
    return dec == NULL;
}

static int teardown(void **state)
{
    (void)state;
    kvi_router_decoder_free(dec);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_stored),
        cmocka_unit_test(test_json_variants),
        cmocka_unit_test(test_field_rules),
        cmocka_unit_test(test_msgpack_bare_and_envelope),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
