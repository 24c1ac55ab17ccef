/*
 * kvidx-bench decode: KV-event batch decoding throughput on one core.
 *
 * Synthesises batches like a vLLM engine serving the Mooncake trace: 1..E
 * events per batch (default E = 8); BlockStored with 1..B u64 engine hashes
 * (default B = 32, uniform), block_size x n token ids drawn from a 152k
 * vocabulary (so uint16 and uint32 token widths mix, as with Qwen), the
 * parent chained to the previous store; R % of events (default 20) are
 * BlockRemoved of 1..4 hashes. Events are vLLM #40984 12-element tagged
 * arrays (--form array) or vLLM #42892 tagged maps (--form map); both by
 * default. Batches are packed with msgpack-c into separate buffers, as
 * ZMQ frames arrive.
 *
 * Decoders, each over every batch, --reps timed passes after one warm-up:
 *   cursor    kvi_decode_batch (net/decode.c), the decoder kvidx uses;
 *   msgpackc  msgpack_unpack into a reused msgpack_zone, then a walk that
 *             normalises hashes and token ids into reused arrays (the
 *             minimal work any decoder must do), as the comparison.
 * Prints MB/s, batches/s, events/s and stored blocks/s per core (best and
 * median of the passes), a checksum agreement line, then one JSON line.
 * Time is the decoding thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so the
 * figures are per busy core even when other processes share the machine.
 */
#include <getopt.h>
#include <inttypes.h>
#include <time.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "bench/bench.h"
#include "engine/common.h"
#include "net/decode.h"

struct dcfg {
    uint32_t batches, max_events, max_blocks, block_size, remove_pct, vocab, reps;
    uint64_t seed;
    bool form_array, form_map, bin_hashes;
    bool run_cursor, run_msgpackc;
};

struct frame {
    uint8_t *data;
    size_t len;
};

struct corpus {
    struct frame *f;
    uint32_t n;
    uint64_t bytes, events, stored_blocks, hashes, tokens;
};

/* ------------------------------------------------------------------------ */
/* synthesis                                                                 */
/* ------------------------------------------------------------------------ */

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_hash(msgpack_packer *pk, uint64_t h, bool bin)
{
    if (!bin) {
        msgpack_pack_uint64(pk, h);
        return;
    }
    uint8_t digest[32];
    for (int i = 0; i < 24; i++)
        digest[i] = (uint8_t)(h * (uint64_t)(i + 1) >> 56);
    for (int i = 0; i < 8; i++)
        digest[24 + i] = (uint8_t)(h >> (56 - 8 * i));
    msgpack_pack_bin(pk, 32);
    msgpack_pack_bin_body(pk, digest, 32);
}

static void pack_stored(msgpack_packer *pk, const struct dcfg *c, bool map, const uint64_t *h, uint32_t n,
                        bool has_parent, uint64_t parent, uint64_t *rng)
{
    if (map) {
        msgpack_pack_map(pk, 11);
        pack_str(pk, "type");
        pack_str(pk, "BlockStored");
        pack_str(pk, "block_hashes");
    } else {
        msgpack_pack_array(pk, 12);
        pack_str(pk, "BlockStored");
    }
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++)
        pack_hash(pk, h[i], c->bin_hashes);
    if (map)
        pack_str(pk, "parent_block_hash");
    if (has_parent)
        pack_hash(pk, parent, c->bin_hashes);
    else
        msgpack_pack_nil(pk);
    if (map)
        pack_str(pk, "token_ids");
    uint32_t nt = n * c->block_size;
    msgpack_pack_array(pk, nt);
    for (uint32_t i = 0; i < nt; i++)
        msgpack_pack_uint32(pk, (uint32_t)(kvi_bench_rand(rng) % c->vocab));
    if (map)
        pack_str(pk, "block_size");
    msgpack_pack_uint32(pk, c->block_size);
    if (map)
        pack_str(pk, "lora_id");
    msgpack_pack_nil(pk);
    if (map)
        pack_str(pk, "medium");
    pack_str(pk, "GPU");
    if (map)
        pack_str(pk, "lora_name");
    msgpack_pack_nil(pk);
    if (map)
        pack_str(pk, "extra_keys");
    msgpack_pack_nil(pk);
    if (map)
        pack_str(pk, "group_idx");
    msgpack_pack_uint32(pk, 0);
    if (map)
        pack_str(pk, "kv_cache_spec_kind");
    pack_str(pk, "full_attention");
    if (!map)
        msgpack_pack_nil(pk); /* kv_cache_spec_sliding_window (omitted by the map form) */
}

static void pack_removed(msgpack_packer *pk, const struct dcfg *c, bool map, const uint64_t *h, uint32_t n)
{
    if (map) {
        msgpack_pack_map(pk, 4);
        pack_str(pk, "type");
        pack_str(pk, "BlockRemoved");
        pack_str(pk, "block_hashes");
    } else {
        msgpack_pack_array(pk, 4);
        pack_str(pk, "BlockRemoved");
    }
    msgpack_pack_array(pk, n);
    for (uint32_t i = 0; i < n; i++)
        pack_hash(pk, h[i], c->bin_hashes);
    if (map)
        pack_str(pk, "medium");
    pack_str(pk, "GPU");
    if (map)
        pack_str(pk, "group_idx");
    msgpack_pack_uint32(pk, 0);
}

static void corpus_build(struct corpus *cp, const struct dcfg *c, bool map)
{
    uint64_t rng = c->seed;
    memset(cp, 0, sizeof *cp);
    cp->n = c->batches;
    cp->f = kvi_xcalloc(cp->n, sizeof *cp->f);
    uint64_t *h = kvi_xmalloc((size_t)c->max_blocks * sizeof *h);
    uint64_t last = 0;
    bool have_last = false;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    for (uint32_t b = 0; b < cp->n; b++) {
        msgpack_packer pk;
        msgpack_sbuffer_clear(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        uint32_t ne = 1 + (uint32_t)(kvi_bench_rand(&rng) % c->max_events);
        msgpack_pack_array(&pk, 3);
        msgpack_pack_double(&pk, 1795250797.88 + b * 0.001);
        msgpack_pack_array(&pk, ne);
        for (uint32_t e = 0; e < ne; e++) {
            bool rem = kvi_bench_rand(&rng) % 100 < c->remove_pct;
            uint32_t n = 1 + (uint32_t)(kvi_bench_rand(&rng) % (rem ? KVI_MIN(4u, c->max_blocks) : c->max_blocks));
            for (uint32_t i = 0; i < n; i++)
                h[i] = kvi_bench_rand(&rng);
            if (rem) {
                pack_removed(&pk, c, map, h, n);
            } else {
                /* a new sequence every few stores, else continue the chain */
                bool chain = have_last && kvi_bench_rand(&rng) % 4 != 0;
                pack_stored(&pk, c, map, h, n, chain, last, &rng);
                last = h[n - 1];
                have_last = true;
                cp->stored_blocks += n;
                cp->tokens += (uint64_t)n * c->block_size;
            }
            cp->hashes += n;
        }
        msgpack_pack_int32(&pk, 0);
        cp->f[b].len = sb.size;
        cp->f[b].data = kvi_xmalloc(sb.size);
        memcpy(cp->f[b].data, sb.data, sb.size);
        cp->bytes += sb.size;
        cp->events += ne;
    }
    msgpack_sbuffer_destroy(&sb);
    free(h);
}

static void corpus_free(struct corpus *cp)
{
    for (uint32_t i = 0; i < cp->n; i++)
        free(cp->f[i].data);
    free(cp->f);
}

/* ------------------------------------------------------------------------ */
/* decoders                                                                  */
/* ------------------------------------------------------------------------ */

/* CPU time of the calling thread: per-core cost, unaffected by the other
 * tenants of a shared machine preempting the benchmark. */
static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Checksum of what a decoder produced, to compare decoders. */
struct sums {
    uint64_t events, hashes, tokens, hsum, tsum;
};

static uint64_t run_cursor(const struct corpus *cp, struct kvi_decoder *d, struct sums *s)
{
    struct kvi_batch b;
    uint64_t t0 = thread_cpu_ns();
    for (uint32_t i = 0; i < cp->n; i++) {
        if (kvi_decode_batch(d, cp->f[i].data, cp->f[i].len, &b) != 0)
            kvi_die("decode bench: batch %u failed: %s", i, kvi_decoder_error_str(d));
        s->events += b.n_events;
        for (uint32_t e = 0; e < b.n_events; e++) {
            /* what ingest reads: the hash array and the last token */
            const struct kvi_ev *ev = &b.events[e];
            s->hashes += ev->n_hashes;
            s->hsum += ev->n_hashes ? ev->hashes[ev->n_hashes - 1] : 0;
            s->tokens += ev->n_tokens;
            s->tsum += ev->n_tokens ? ev->tokens[ev->n_tokens - 1] : 0;
        }
    }
    return thread_cpu_ns() - t0;
}

/* The msgpack-c comparison: unpack, then normalise what ingest needs. */
struct mpc {
    msgpack_zone zone;
    uint64_t *h;
    uint32_t *t;
    size_t hcap, tcap;
};

static bool mpc_key(const msgpack_object *k, const char *lit)
{
    size_t n = strlen(lit);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && memcmp(k->via.str.ptr, lit, n) == 0;
}

static uint64_t mpc_hash(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return o->via.u64;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return (uint64_t)o->via.i64;
    case MSGPACK_OBJECT_BIN: {
        uint64_t h = 0;
        uint32_t n = o->via.bin.size, k = n < 8 ? n : 8;
        for (uint32_t i = n - k; i < n; i++)
            h = h << 8 | (uint8_t)o->via.bin.ptr[i];
        return h;
    }
    default:
        kvi_die("decode bench: bad hash");
    }
}

static void mpc_event(struct mpc *m, const msgpack_object *ev, struct sums *s)
{
    const msgpack_object *hashes = NULL, *tokens = NULL, *medium = NULL, *bs = NULL;
    if (ev->type == MSGPACK_OBJECT_ARRAY) {
        const msgpack_object *a = ev->via.array.ptr;
        uint32_t n = ev->via.array.size;
        bool stored = mpc_key(&a[0], "BlockStored");
        hashes = n > 1 ? &a[1] : NULL;
        if (stored) {
            tokens = n > 3 ? &a[3] : NULL;
            bs = n > 4 ? &a[4] : NULL;
            medium = n > 6 ? &a[6] : NULL;
        } else {
            medium = n > 2 ? &a[2] : NULL;
        }
    } else {
        for (uint32_t i = 0; i < ev->via.map.size; i++) {
            const msgpack_object_kv *kv = &ev->via.map.ptr[i];
            if (mpc_key(&kv->key, "block_hashes"))
                hashes = &kv->val;
            else if (mpc_key(&kv->key, "token_ids"))
                tokens = &kv->val;
            else if (mpc_key(&kv->key, "medium"))
                medium = &kv->val;
            else if (mpc_key(&kv->key, "block_size"))
                bs = &kv->val;
        }
    }
    uint32_t nh = hashes->via.array.size;
    if (nh > m->hcap) {
        m->hcap = nh * 2;
        m->h = kvi_xrealloc(m->h, m->hcap * sizeof *m->h);
    }
    for (uint32_t i = 0; i < nh; i++)
        m->h[i] = mpc_hash(&hashes->via.array.ptr[i]);
    uint32_t nt = tokens ? tokens->via.array.size : 0;
    if (nt > m->tcap) {
        m->tcap = nt * 2;
        m->t = kvi_xrealloc(m->t, m->tcap * sizeof *m->t);
    }
    for (uint32_t i = 0; i < nt; i++) {
        const msgpack_object *o = &tokens->via.array.ptr[i];
        if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > UINT32_MAX)
            kvi_die("decode bench: bad token");
        m->t[i] = (uint32_t)o->via.u64;
    }
    if (medium && medium->type == MSGPACK_OBJECT_STR)
        (void)kvi_medium_tier(medium->via.str.ptr, medium->via.str.size, NULL);
    (void)bs;
    s->events++;
    s->hashes += nh;
    s->hsum += nh ? m->h[nh - 1] : 0;
    s->tokens += nt;
    s->tsum += nt ? m->t[nt - 1] : 0;
}

static uint64_t run_msgpackc(const struct corpus *cp, struct mpc *m, struct sums *s)
{
    uint64_t t0 = thread_cpu_ns();
    for (uint32_t i = 0; i < cp->n; i++) {
        msgpack_object o;
        size_t off = 0;
        if (msgpack_unpack((const char *)cp->f[i].data, cp->f[i].len, &off, &m->zone, &o) != MSGPACK_UNPACK_SUCCESS)
            kvi_die("decode bench: msgpack-c failed on batch %u", i);
        const msgpack_object *evs = &o.via.array.ptr[1];
        for (uint32_t e = 0; e < evs->via.array.size; e++)
            mpc_event(m, &evs->via.array.ptr[e], s);
        msgpack_zone_clear(&m->zone);
    }
    return thread_cpu_ns() - t0;
}

/* ------------------------------------------------------------------------ */
/* driver                                                                    */
/* ------------------------------------------------------------------------ */

struct result {
    double best_ns, median_ns;
    struct sums sums;
    bool ran;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static struct result measure(const struct corpus *cp, const struct dcfg *c, bool cursor)
{
    struct result r = {.ran = true};
    double *ns = kvi_xmalloc((c->reps + 1) * sizeof *ns);
    struct kvi_decoder *d = NULL;
    struct mpc m = {0};
    if (cursor) {
        d = kvi_decoder_create();
        if (d == NULL)
            kvi_die("decode bench: kvi_decoder_create failed");
    } else {
        msgpack_zone_init(&m.zone, 256 * 1024);
    }
    for (uint32_t rep = 0; rep <= c->reps; rep++) { /* rep 0 warms up */
        struct sums s = {0};
        ns[rep] = (double)(cursor ? run_cursor(cp, d, &s) : run_msgpackc(cp, &m, &s));
        if (rep == 0)
            r.sums = s;
    }
    qsort(ns + 1, c->reps, sizeof *ns, cmp_double);
    r.best_ns = ns[1];
    r.median_ns = ns[1 + c->reps / 2];
    free(ns);
    if (cursor) {
        kvi_decoder_destroy(d);
    } else {
        msgpack_zone_destroy(&m.zone);
        free(m.h);
        free(m.t);
    }
    return r;
}

static void print_row(const char *form, const char *name, const struct corpus *cp, const struct result *r)
{
    double b = r->best_ns / 1e9, md = r->median_ns / 1e9;
    printf("%-6s %-9s %9.0f %9.0f %9.3f %9.3f %9.2f %9.2f %9.2f %9.2f\n", form, name, cp->bytes / b / 1e6,
           cp->bytes / md / 1e6, cp->n / b / 1e6, cp->n / md / 1e6, cp->events / b / 1e6, cp->events / md / 1e6,
           cp->stored_blocks / b / 1e6, cp->stored_blocks / md / 1e6);
}

static void json_part(const char *form, const char *name, const struct corpus *cp, const struct result *r)
{
    double b = r->best_ns / 1e9, md = r->median_ns / 1e9;
    printf(",\"%s_%s_mb_s\":%.0f,\"%s_%s_mb_s_median\":%.0f,\"%s_%s_batches_s\":%.0f,\"%s_%s_events_s\":%.0f,"
           "\"%s_%s_blocks_s\":%.0f,\"%s_%s_blocks_s_median\":%.0f",
           form, name, cp->bytes / b / 1e6, form, name, cp->bytes / md / 1e6, form, name, cp->n / b, form, name,
           cp->events / b, form, name, cp->stored_blocks / b, form, name, cp->stored_blocks / md);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvidx-bench decode [options]\n"
            "  --batches N      distinct batches per pass (default 8192)\n"
            "  --reps N         timed passes after one warm-up (default 5)\n"
            "  --form F         array | map | both (default both)\n"
            "  --decoder D      cursor | msgpackc | both (default both)\n"
            "  --max-events N   events per batch, uniform 1..N (default 8)\n"
            "  --max-blocks N   blocks per BlockStored, uniform 1..N (default 32)\n"
            "  --block-size N   tokens per block (default 16)\n"
            "  --remove-pct N   share of BlockRemoved events in %% (default 20)\n"
            "  --vocab N        token ids drawn from [0, N) (default 152000)\n"
            "  --bin-hashes     hashes as 32-byte bins (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)\n"
            "  --seed N         generator seed (default 1527)\n");
}

static bool parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi)
        return false;
    *out = (uint32_t)v;
    return true;
}

static int parse_args(int argc, char **argv, struct dcfg *c)
{
    enum { O_BATCHES = 1, O_REPS, O_FORM, O_DECODER, O_EVENTS, O_BLOCKS, O_BS, O_RM, O_VOCAB, O_BIN, O_SEED, O_HELP };
    static const struct option opts[] = {
        {"batches", required_argument, NULL, O_BATCHES}, {"reps", required_argument, NULL, O_REPS},
        {"form", required_argument, NULL, O_FORM},       {"decoder", required_argument, NULL, O_DECODER},
        {"max-events", required_argument, NULL, O_EVENTS}, {"max-blocks", required_argument, NULL, O_BLOCKS},
        {"block-size", required_argument, NULL, O_BS},   {"remove-pct", required_argument, NULL, O_RM},
        {"vocab", required_argument, NULL, O_VOCAB},     {"bin-hashes", no_argument, NULL, O_BIN},
        {"seed", required_argument, NULL, O_SEED},       {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        bool ok = true;
        switch (o) {
        case O_BATCHES:
            ok = parse_u32(optarg, 1, 1u << 24, &c->batches);
            break;
        case O_REPS:
            ok = parse_u32(optarg, 1, 1000, &c->reps);
            break;
        case O_FORM:
            c->form_array = !strcmp(optarg, "array") || !strcmp(optarg, "both");
            c->form_map = !strcmp(optarg, "map") || !strcmp(optarg, "both");
            ok = c->form_array || c->form_map;
            break;
        case O_DECODER:
            c->run_cursor = !strcmp(optarg, "cursor") || !strcmp(optarg, "both");
            c->run_msgpackc = !strcmp(optarg, "msgpackc") || !strcmp(optarg, "both");
            ok = c->run_cursor || c->run_msgpackc;
            break;
        case O_EVENTS:
            ok = parse_u32(optarg, 1, 4096, &c->max_events);
            break;
        case O_BLOCKS:
            ok = parse_u32(optarg, 1, 65536, &c->max_blocks);
            break;
        case O_BS:
            ok = parse_u32(optarg, 1, 4096, &c->block_size);
            break;
        case O_RM:
            ok = parse_u32(optarg, 0, 100, &c->remove_pct);
            break;
        case O_VOCAB:
            ok = parse_u32(optarg, 1, UINT32_MAX, &c->vocab);
            break;
        case O_BIN:
            c->bin_hashes = true;
            break;
        case O_SEED: {
            char *end;
            c->seed = strtoull(optarg, &end, 10);
            ok = *optarg && !*end;
            break;
        }
        case O_HELP:
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "decode bench: bad value '%s'\n", optarg);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "decode bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    return -1;
}

int kvi_bench_decode(int argc, char **argv)
{
    struct dcfg c = {
        .batches = 8192, .max_events = 8, .max_blocks = 32, .block_size = 16, .remove_pct = 20,
        .vocab = 152000, .reps = 5, .seed = 1527, .form_array = true, .form_map = true,
        .run_cursor = true, .run_msgpackc = true,
    };
    int rc = parse_args(argc, argv, &c);
    if (rc >= 0)
        return rc;

    printf("decode: %u batches/pass, 1..%u events, stored 1..%u blocks x %u tokens (vocab %u), %u%% removed, "
           "%s hashes; best / median of %u passes, one core\n",
           c.batches, c.max_events, c.max_blocks, c.block_size, c.vocab, c.remove_pct,
           c.bin_hashes ? "bin32" : "u64", c.reps);
    printf("%-6s %-9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "form", "decoder", "MB/s", "(med)", "Mbatch/s", "(med)",
           "Mev/s", "(med)", "Mblk/s", "(med)");
    struct result res[2][2] = {{{0}}};
    struct corpus cps[2];
    const char *forms[2] = {"array", "map"};
    bool want[2] = {c.form_array, c.form_map};
    bool agree = true;
    for (int f = 0; f < 2; f++) {
        if (!want[f])
            continue;
        corpus_build(&cps[f], &c, f == 1);
        if (c.run_cursor) {
            res[f][0] = measure(&cps[f], &c, true);
            print_row(forms[f], "cursor", &cps[f], &res[f][0]);
        }
        if (c.run_msgpackc) {
            res[f][1] = measure(&cps[f], &c, false);
            print_row(forms[f], "msgpackc", &cps[f], &res[f][1]);
        }
        if (c.run_cursor && c.run_msgpackc)
            agree &= !memcmp(&res[f][0].sums, &res[f][1].sums, sizeof res[f][0].sums);
        fflush(stdout);
    }
    for (int f = 0; f < 2; f++) {
        if (!want[f])
            continue;
        printf("%-6s corpus: %.1f MB, %u batches, %" PRIu64 " events, %" PRIu64 " stored blocks, %" PRIu64
               " tokens; %.0f bytes/batch\n",
               forms[f], cps[f].bytes / 1e6, cps[f].n, cps[f].events, cps[f].stored_blocks, cps[f].tokens,
               (double)cps[f].bytes / cps[f].n);
        if (res[f][0].ran && res[f][1].ran)
            printf("%-6s cursor / msgpack-c speed-up: %.2fx best, %.2fx median\n", forms[f],
                   res[f][1].best_ns / res[f][0].best_ns, res[f][1].median_ns / res[f][0].median_ns);
    }
    if (c.run_cursor && c.run_msgpackc)
        printf("decoders agree on events, hashes and tokens: %s\n", agree ? "yes" : "NO");

    printf("{\"bench\":\"decode\",\"batches\":%u,\"max_events\":%u,\"max_blocks\":%u,\"block_size\":%u,"
           "\"bin_hashes\":%s",
           c.batches, c.max_events, c.max_blocks, c.block_size, c.bin_hashes ? "true" : "false");
    for (int f = 0; f < 2; f++) {
        if (!want[f])
            continue;
        printf(",\"%s_bytes_per_batch\":%.0f", forms[f], (double)cps[f].bytes / cps[f].n);
        if (res[f][0].ran)
            json_part(forms[f], "cursor", &cps[f], &res[f][0]);
        if (res[f][1].ran)
            json_part(forms[f], "msgpackc", &cps[f], &res[f][1]);
        corpus_free(&cps[f]);
    }
    if (c.run_cursor && c.run_msgpackc)
        printf(",\"decoders_agree\":%s", agree ? "true" : "false");
    printf("}\n");
    return 0;
}
