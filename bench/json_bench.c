/*
 * JSON layer measurement behind the decision recorded in net/body_json.c: parse
 * cost of /query bodies (4 Ki and 128 Ki token ids) and of a 1 Ki-hash
 * /query_by_hash body with kvidx's pull reader and with the Debian JSON
 * libraries (yajl 2.1 streaming callbacks, jansson 2.14 DOM, cJSON 1.7 DOM),
 * each producing the same u32 token array / u64 hash array. Also msgpack
 * bodies: kvidx's reader (int array and bin) against msgpack-c's unpacker.
 *
 * Build (not part of the default build; needs libyajl-dev libjansson-dev
 * libcjson-dev):
 *   cmake -S . -B build/jb -DCMAKE_BUILD_TYPE=Release -DKVI_JSON_BENCH=ON
 *   cmake --build build/jb --target kvi-json-bench && build/jb/api/kvi-json-bench
 * Prints one line per (body, parser): best and median microseconds per parse
 * over 7 runs.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <jansson.h>
#include <msgpack.h>
#include <yajl/yajl_parse.h>

#include "api/codec.h"
#include "net/body.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* CPU time: other tenants preempt us */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* ---- the parsers under test: each returns the element count (or 0) ------------ */

static struct kvi_scratch scratch;
static volatile uint64_t sink;

static size_t kvidx_query(const char *b, size_t n)
{
    struct kvi_dyn_query q;
    struct kvi_api_err e;
    kvi_scratch_reset(&scratch);
    if (kvi_dyn_parse_query(b, n, KVI_CT_JSON, &scratch, &q, &e) != 0)
        return 0;
    sink += q.token_ids[q.n_tokens - 1];
    return q.n_tokens;
}

static size_t kvidx_query_detect(const char *b, size_t n)
{
    if (kvi_detect_dialect(KVI_R_QUERY, KVI_CT_JSON, b, n) != KVI_DIALECT_DYNAMO)
        return 0;
    return kvidx_query(b, n);
}

static size_t kvidx_qbh(const char *b, size_t n)
{
    struct kvi_dyn_query_hash q;
    struct kvi_api_err e;
    kvi_scratch_reset(&scratch);
    if (kvi_dyn_parse_query_by_hash(b, n, KVI_CT_JSON, &scratch, &q, &e) != 0)
        return 0;
    sink += q.block_hashes[q.n_hashes - 1];
    return q.n_hashes;
}

static size_t kvidx_query_mp(const char *b, size_t n)
{
    struct kvi_dyn_query q;
    struct kvi_api_err e;
    kvi_scratch_reset(&scratch);
    if (kvi_dyn_parse_query(b, n, KVI_CT_MSGPACK, &scratch, &q, &e) != 0)
        return 0;
    sink += q.token_ids[q.n_tokens - 1];
    return q.n_tokens;
}

/* yajl: callbacks filling a growable array */
struct yctx {
    uint64_t *a;
    size_t n, cap;
    int in_arr;
    int key_is_arr;
    int u32;
};

static int y_int(void *c, long long v)
{
    struct yctx *y = c;
    if (!y->in_arr)
        return 1;
    if (y->u32 && (v < 0 || v > 0xffffffffll))
        return 0;
    if (y->n == y->cap) {
        y->cap = y->cap ? 2 * y->cap : 1024;
        y->a = realloc(y->a, y->cap * sizeof(*y->a));
    }
    y->a[y->n++] = (uint64_t)v;
    return 1;
}
static int y_key(void *c, const unsigned char *k, size_t l)
{
    struct yctx *y = c;
    y->key_is_arr = (l == 9 && memcmp(k, "token_ids", 9) == 0) ||
                    (l == 12 && memcmp(k, "block_hashes", 12) == 0);
    return 1;
}
static int y_sa(void *c)
{
    struct yctx *y = c;
    y->in_arr = y->key_is_arr;
    return 1;
}
static int y_ea(void *c)
{
    ((struct yctx *)c)->in_arr = 0;
    return 1;
}
static int y_str(void *c, const unsigned char *s, size_t l)
{
    sink += l + (s[0] & 1);
    return 1;
}

static const yajl_callbacks ycb = {
    NULL, NULL, y_int, NULL, NULL, y_str, NULL, y_key, NULL, y_sa, y_ea,
};

static struct yctx yc;
static size_t yajl_parse_body(const char *b, size_t n, int u32)
{
    yc.n = 0;
    yc.in_arr = 0;
    yc.u32 = u32;
    yajl_handle h = yajl_alloc(&ycb, NULL, &yc);
    if (yajl_parse(h, (const unsigned char *)b, n) != yajl_status_ok ||
        yajl_complete_parse(h) != yajl_status_ok) {
        yajl_free(h);
        return 0;
    }
    yajl_free(h);
    sink += yc.a[yc.n - 1];
    return yc.n;
}
static size_t yajl_query(const char *b, size_t n)
{
    return yajl_parse_body(b, n, 1);
}
static size_t yajl_qbh(const char *b, size_t n)
{
    return yajl_parse_body(b, n, 0);
}

static uint64_t *out_arr;
static size_t jansson_body(const char *b, size_t n, const char *key, int u32)
{
    json_error_t err;
    json_t *root = json_loadb(b, n, 0, &err);
    if (root == NULL)
        return 0;
    json_t *a = json_object_get(root, key);
    size_t cnt = json_array_size(a);
    for (size_t i = 0; i < cnt; i++) {
        json_int_t v = json_integer_value(json_array_get(a, i));
        if (u32 && (v < 0 || v > 0xffffffffll)) {
            json_decref(root);
            return 0;
        }
        out_arr[i] = (uint64_t)v;
    }
    json_decref(root);
    sink += out_arr[cnt - 1];
    return cnt;
}
static size_t jansson_query(const char *b, size_t n)
{
    return jansson_body(b, n, "token_ids", 1);
}
static size_t jansson_qbh(const char *b, size_t n)
{
    return jansson_body(b, n, "block_hashes", 0);
}

static size_t cjson_body(const char *b, size_t n, const char *key)
{
    cJSON *root = cJSON_ParseWithLength(b, n);
    if (root == NULL)
        return 0;
    cJSON *a = cJSON_GetObjectItemCaseSensitive(root, key);
    size_t cnt = 0;
    for (cJSON *e = a ? a->child : NULL; e != NULL; e = e->next)
        out_arr[cnt++] = (uint64_t)(int64_t)e->valuedouble; /* loses bits above 2^53 */
    cJSON_Delete(root);
    sink += out_arr[cnt - 1];
    return cnt;
}
static size_t cjson_query(const char *b, size_t n)
{
    return cjson_body(b, n, "token_ids");
}
static size_t cjson_qbh(const char *b, size_t n)
{
    return cjson_body(b, n, "block_hashes");
}

static size_t msgpackc_query(const char *b, size_t n)
{
    msgpack_zone z;
    msgpack_zone_init(&z, 64 * 1024);
    msgpack_object o;
    size_t off = 0;
    size_t cnt = 0;
    if (msgpack_unpack(b, n, &off, &z, &o) == MSGPACK_UNPACK_SUCCESS && o.type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < o.via.map.size; i++) {
            msgpack_object_kv *kv = &o.via.map.ptr[i];
            if (kv->key.via.str.size == 9 && memcmp(kv->key.via.str.ptr, "token_ids", 9) == 0 &&
                kv->val.type == MSGPACK_OBJECT_ARRAY) {
                for (uint32_t k = 0; k < kv->val.via.array.size; k++) {
                    msgpack_object *e = &kv->val.via.array.ptr[k];
                    if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 > 0xffffffffu)
                        goto out;
                    out_arr[cnt++] = e->via.u64;
                }
            }
        }
    }
out:
    msgpack_zone_destroy(&z);
    sink += cnt ? out_arr[cnt - 1] : 0;
    return cnt;
}

/* ---- bodies -------------------------------------------------------------------------- */

static char *json_query_body(size_t ntok, size_t *len)
{
    struct kvi_buf b;
    kvi_buf_init(&b);
    kvi_buf_puts(&b, "{\"token_ids\":[");
    for (size_t i = 0; i < ntok; i++) {
        if (i)
            kvi_buf_putc(&b, ',');
        kvi_buf_put_u64(&b, next_rand() % 128000);
    }
    kvi_buf_puts(&b, "],\"model_name\":\"llama-3-8b\",\"tenant_id\":\"default\"}");
    *len = b.len;
    return b.data;
}

static char *json_qbh_body(size_t n, size_t *len)
{
    struct kvi_buf b;
    kvi_buf_init(&b);
    kvi_buf_puts(&b, "{\"block_hashes\":[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            kvi_buf_putc(&b, ',');
        kvi_buf_put_i64(&b, (int64_t)next_rand());
    }
    kvi_buf_puts(&b, "],\"model_name\":\"llama-3-8b\"}");
    *len = b.len;
    return b.data;
}

static char *mp_query_body(size_t ntok, bool bin, size_t *len)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str_with_body(&pk, "token_ids", 9);
    if (bin) {
        uint8_t *raw = malloc(ntok * 4);
        for (size_t i = 0; i < ntok; i++) {
            uint32_t v = (uint32_t)(next_rand() % 128000);
            memcpy(raw + 4 * i, &v, 4); /* little-endian host */
        }
        msgpack_pack_bin_with_body(&pk, raw, ntok * 4);
        free(raw);
    } else {
        msgpack_pack_array(&pk, ntok);
        for (size_t i = 0; i < ntok; i++)
            msgpack_pack_uint32(&pk, (uint32_t)(next_rand() % 128000));
    }
    msgpack_pack_str_with_body(&pk, "model_name", 10);
    msgpack_pack_str_with_body(&pk, "llama-3-8b", 10);
    *len = sb.size;
    return sb.data;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void run(const char *body_name, const char *parser, size_t (*fn)(const char *, size_t),
                const char *b, size_t len, size_t expect, int iters)
{
    uint64_t per[7];
    size_t got = fn(b, len); /* warm-up, and a correctness check */
    if (got != expect) {
        printf("%-28s %-16s FAILED (got %zu elements, want %zu)\n", body_name, parser, got, expect);
        return;
    }
    for (int r = 0; r < 7; r++) {
        uint64_t t0 = now_ns();
        for (int i = 0; i < iters; i++)
            fn(b, len);
        per[r] = (now_ns() - t0) / (uint64_t)iters;
    }
    qsort(per, 7, sizeof(per[0]), cmp_u64);
    printf("%-28s %-16s best %9.1f us  median %9.1f us  (%7.1f MB/s at best)\n", body_name, parser,
           per[0] / 1e3, per[3] / 1e3, (double)len / (per[0] / 1e3));
}

int main(void)
{
    kvi_scratch_init(&scratch);
    out_arr = malloc(sizeof(uint64_t) * 200000);
    struct {
        const char *name;
        size_t n;
        int iters;
    } q[] = {{"/query 4096 tokens", 4096, 400}, {"/query 131072 tokens", 131072, 15}};
    for (int i = 0; i < 2; i++) {
        size_t len;
        char *b = json_query_body(q[i].n, &len);
        char name[64];
        snprintf(name, sizeof(name), "%s (%zu B)", q[i].name, len);
        run(name, "kvidx", kvidx_query, b, len, q[i].n, q[i].iters);
        run(name, "kvidx+detect", kvidx_query_detect, b, len, q[i].n, q[i].iters);
        run(name, "yajl", yajl_query, b, len, q[i].n, q[i].iters);
        run(name, "jansson", jansson_query, b, len, q[i].n, q[i].iters);
        run(name, "cJSON", cjson_query, b, len, q[i].n, q[i].iters);
        free(b);
        b = mp_query_body(q[i].n, false, &len);
        snprintf(name, sizeof(name), "%s msgpack arr (%zu B)", q[i].name + 7, len);
        run(name, "kvidx", kvidx_query_mp, b, len, q[i].n, q[i].iters);
        run(name, "msgpack-c", msgpackc_query, b, len, q[i].n, q[i].iters);
        free(b);
        b = mp_query_body(q[i].n, true, &len);
        snprintf(name, sizeof(name), "%s msgpack bin (%zu B)", q[i].name + 7, len);
        run(name, "kvidx", kvidx_query_mp, b, len, q[i].n, q[i].iters);
        free(b);
    }
    size_t len;
    char *b = json_qbh_body(1024, &len);
    char name[64];
    snprintf(name, sizeof(name), "/query_by_hash 1024 (%zu B)", len);
    run(name, "kvidx", kvidx_qbh, b, len, 1024, 1000);
    run(name, "yajl", yajl_qbh, b, len, 1024, 1000);
    run(name, "jansson", jansson_qbh, b, len, 1024, 1000);
    run(name, "cJSON (lossy)", cjson_qbh, b, len, 1024, 1000);
    free(b);
    free(out_arr);
    free(yc.a);
    kvi_scratch_free(&scratch);
    return sink == 42 ? 1 : 0;
}
