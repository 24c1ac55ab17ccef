/*
 * kvidx publisher: vLLM-compatible KV-event publisher (see
 * net/include/kvidx/publisher.h for the API and the wire format).
 *
 * DESIGN
 *
 * Threads. The caller's thread ("publishing thread", one at a time) owns the
 * PUB socket, the batch being built and every plain field. With a replay
 * endpoint, one internal thread owns the ROUTER socket: ZMQ sockets are
 * single-thread objects, so the two sockets never cross threads (the ROUTER
 * is created and bound in kvidx_pub_create, then handed to the thread by
 * pthread_create, a full barrier). The replay thread sleeps in zmq_poll on
 * the ROUTER and on a pipe that kvidx_pub_destroy writes to stop it.
 *
 * Buffers. A batch is hand-packed as msgpack straight into one heap buffer
 * (struct kvp_buf) with KVP_HEADROOM bytes free in front: events are appended
 * as they are published, and kvidx_pub_flush writes the batch header
 * ([ts, events-array header) right-aligned into the headroom once the event
 * count is known, and the rank after the events. That buffer is the only copy
 * of the payload: the PUB sends it zero-copy (zmq_msg_init_data) and the
 * replay ring keeps a pointer to it; replies are zero-copy sends of the same
 * buffer. A buffer carries a reference count: one for the ring, one per ZMQ
 * message holding it. The last reference returns it to a pool, from which
 * the next batch takes it with its capacity intact, so the steady state
 * allocates nothing of ours (libzmq still mallocs its small per-message
 * header). A buffer that grew for a large batch is trimmed at flush when
 * more than half of it would be slack (never below a fresh buffer's size):
 * otherwise every buffer of the ring and the pool would keep the capacity of
 * the largest batch it ever held, and a long-running publisher's memory
 * would creep towards (ring + pool) x its largest batch.
 *
 * Pool. Buffers come back from ZMQ's I/O threads (message free callbacks),
 * from the replay thread and from the publishing thread (ring eviction).
 * Returns push onto a Treiber stack (`shared`); only the publishing thread
 * pops, and it takes the whole stack with one exchange into its private list,
 * so the stack has a single consumer and no ABA problem. The pool itself is
 * reference counted (1 for the publisher + 1 per buffer out of the pool), so
 * a message still queued in a shared (caller-supplied) ZMQ context after
 * kvidx_pub_destroy can still return its buffer; the last reference frees
 * the pool.
 *
 * Replay ring. pub->ring holds the last ring_cap batches; every flushed batch
 * enters it, so its sequence numbers are contiguous (oldest = last_seq -
 * count + 1) and a request maps to a ring position in O(1). The ring is
 * shared with the replay thread under pub->mu. The replay thread takes a
 * reference on every batch it will send while holding the mutex (a pointer
 * copy and an atomic increment per batch), releases it, and only then sends:
 * the publishing thread is never blocked for the length of a reply.
 *
 * Memory-ordering edges:
 *   R1 (flush: release store of kvp_buf.ref) pairs with A1 (the acq_rel
 *      decrement in kvp_buf_unref, on any thread): the payload written by the
 *      publishing thread happens-before the buffer is recycled.
 *   R2 (kvp_pool_put: release CAS onto pool.shared) pairs with A2 (kvp_pool_get:
 *      acquire exchange): everything done with a buffer happens-before the
 *      publishing thread reuses it.
 *   R3/A3 (the acq_rel decrements of pool.refs): the last holder, which
 *      frees the pool, sees every push made by the others.
 *   The ring, ring_head/ring_count/ring_last_seq and the buffers' seq are
 *   published through pub->mu. Replay counters and faults are relaxed
 *   atomics (statistics and test knobs, no data behind them).
 *
 * Shutdown. kvidx_pub_destroy wakes the replay thread through the pipe and
 * joins it (the thread closes the ROUTER), closes the PUB (linger 0), drops
 * the ring's references, terminates the context if it owns it, and drops the
 * publisher's pool reference.
 *
 * Transports. A NATS publisher (cfg->transport) has pub->nats set and none
 * of the ZMQ state (no socket, pool, ring or thread): every public function
 * hands it to net/publisher_nats.c first (`if (pub->nats) return
 * kvp_nats_...`), which has its own DESIGN block.
 */
#include <kvidx/publisher.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "msgpack_wire.h" /* same folder: the library builds with net/include alone */
#include "publisher_nats.h"

/*
 * libzmq is not built with TSan, so TSan cannot see that a message handed to
 * zmq_msg_send happens-before its free callback on a ZMQ I/O thread. In TSan
 * builds each zero-copy send releases, and the callback acquires, the buffer's
 * address (KVP_TSAN_HANDOFF / KVP_TSAN_TAKEOVER); elsewhere they are no-ops.
 */
#if defined(__SANITIZE_THREAD__) || defined(KVI_TSAN)
#include <sanitizer/tsan_interface.h>
#define KVP_TSAN_HANDOFF(p) __tsan_release(p)
#define KVP_TSAN_TAKEOVER(p) __tsan_acquire(p)
#else
#define KVP_TSAN_HANDOFF(p) ((void)(p))
#define KVP_TSAN_TAKEOVER(p) ((void)(p))
#endif

/* Bytes in front of the events for [ts, array-header: 1 + 9 + 5, rounded up. */
#define KVP_HEADROOM 16u
/* Bytes kept free after the events for the rank element (int32: 5). */
#define KVP_TAIL 8u
/* Allocation size of a fresh buffer, header included. */
#define KVP_BUF_INIT 4096u
/* Buffers the pool keeps for reuse; larger ones are freed on return. */
#define KVP_POOL_KEEP 1024u
#define KVP_BUF_KEEP_MAX (4u << 20)
/* Room for a resolved endpoint string. */
#define KVP_EP_MAX 256u
/* Largest element count msgpack can express (array32/map32). */
#define KVP_MAX_COUNT UINT32_MAX

#define KVP_DEFAULT_ARRAY_LEN 12u

static const uint8_t kvp_end_seq[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

struct kvp_pool;

struct kvp_buf {
    atomic_uint ref;        /* R1/A1 */
    uint32_t n_events;
    struct kvp_buf *next;   /* pool link */
    struct kvp_pool *pool;
    uint64_t seq;           /* set before the batch is shared */
    size_t cap;             /* bytes in data[] */
    size_t start;           /* payload start (after finalize) */
    size_t end;             /* write position, then payload end */
    uint8_t data[];
};

struct kvp_pool {
    _Atomic(struct kvp_buf *) shared; /* returned buffers, R2/A2 */
    atomic_size_t refs;               /* 1 (publisher) + buffers out of the pool, R3/A3 */
    struct kvp_buf *priv;             /* publishing thread only */
    size_t n_priv;
};

struct kvidx_pub {
    struct kvp_nats *nats;   /* NATS transports: everything else unused */

    /* --- publishing thread --- */
    void *ctx;
    void *sock;
    bool own_ctx;
    struct kvp_pool *pool;
    struct kvp_buf *cur;     /* batch being built, NULL when none */
    uint64_t next_seq;
    uint64_t next_event_id;
    uint64_t skip_live;
    int last_error;

    enum kvidx_pub_form form;
    enum kvidx_pub_hash_enc hash_enc;
    uint32_t array_len;
    uint32_t auto_flush;
    uint32_t flags;
    int32_t dp_rank;
    char *topic;
    size_t topic_len;
    char *medium;            /* NULL: nil */
    char *lora_name;         /* NULL: nil */

    uint64_t st_batches, st_live, st_skipped, st_events, st_bytes, st_send_errors, st_raw;

    char endpoint[KVP_EP_MAX];
    char replay_ep[KVP_EP_MAX];

    /* --- replay (shared with the replay thread) --- */
    bool has_replay;
    enum kvidx_pub_replay_layout layout;
    pthread_t thread;
    int wake_rd, wake_wr;
    void *router;                    /* replay thread after create */
    struct kvp_buf **scratch;        /* replay thread only: batches of one reply */
    pthread_mutex_t mu;
    struct kvp_buf **ring;           /* under mu */
    uint32_t ring_cap;
    uint32_t ring_head;              /* under mu: next slot written */
    uint32_t ring_count;             /* under mu */
    uint64_t ring_last_seq;          /* under mu: seq of the newest batch */
    atomic_uint_fast64_t faults;     /* packed kvidx_pub_replay_faults, relaxed */
    atomic_uint_fast64_t rp_requests, rp_malformed, rp_silenced, rp_batches, rp_dropped;
};

/* ------------------------------------------------------------------------
 * Buffers and pool
 * ------------------------------------------------------------------------ */

static void kvp_pool_free(struct kvp_pool *pool)
{
    struct kvp_buf *lists[2] = {pool->priv, atomic_load_explicit(&pool->shared, memory_order_acquire)};
    for (int i = 0; i < 2; i++) {
        for (struct kvp_buf *b = lists[i], *n; b; b = n) {
            n = b->next;
            free(b);
        }
    }
    free(pool);
}

static struct kvp_pool *kvp_pool_create(void)
{
    struct kvp_pool *pool = calloc(1, sizeof(*pool));
    if (!pool)
        return NULL;
    atomic_init(&pool->shared, NULL);
    atomic_init(&pool->refs, 1);
    return pool;
}

/* Drop one pool reference; the last one frees the pool and its buffers. */
static void kvp_pool_unref(struct kvp_pool *pool)
{
    if (atomic_fetch_sub_explicit(&pool->refs, 1, memory_order_acq_rel) == 1) /* R3/A3 */
        kvp_pool_free(pool);
}

/* Return a buffer nobody references any more (any thread). */
static void kvp_pool_put(struct kvp_buf *b)
{
    struct kvp_pool *pool = b->pool;
    struct kvp_buf *head = atomic_load_explicit(&pool->shared, memory_order_relaxed);
    do {
        b->next = head;
    } while (!atomic_compare_exchange_weak_explicit(&pool->shared, &head, b,
                                                    memory_order_release, /* R2 */
                                                    memory_order_relaxed));
    kvp_pool_unref(pool);
}

/* Take a buffer, empty, with the headroom reserved (publishing thread). */
static struct kvp_buf *kvp_pool_get(struct kvp_pool *pool)
{
    if (!pool->priv) {
        /* A2: take every returned buffer at once; keep a bounded number. */
        struct kvp_buf *l = atomic_exchange_explicit(&pool->shared, NULL, memory_order_acquire);
        while (l) {
            struct kvp_buf *n = l->next;
            if (pool->n_priv < KVP_POOL_KEEP && l->cap <= KVP_BUF_KEEP_MAX) {
                l->next = pool->priv;
                pool->priv = l;
                pool->n_priv++;
            } else {
                free(l);
            }
            l = n;
        }
    }
    struct kvp_buf *b = pool->priv;
    if (b) {
        pool->priv = b->next;
        pool->n_priv--;
    } else {
        b = malloc(KVP_BUF_INIT);
        if (!b)
            return NULL;
        b->cap = KVP_BUF_INIT - sizeof(*b);
        b->pool = pool;
    }
    atomic_fetch_add_explicit(&pool->refs, 1, memory_order_relaxed);
    b->next = NULL;
    b->n_events = 0;
    b->start = KVP_HEADROOM;
    b->end = KVP_HEADROOM;
    return b;
}

static void kvp_buf_unref(struct kvp_buf *b)
{
    if (atomic_fetch_sub_explicit(&b->ref, 1, memory_order_acq_rel) == 1) /* A1 */
        kvp_pool_put(b);
}

/* zmq_msg free callback: the message no longer needs the payload. */
static void kvp_zmq_free(void *data, void *hint)
{
    (void)data;
    KVP_TSAN_TAKEOVER(hint);
    kvp_buf_unref(hint);
}

/* Make room for @p need more bytes (plus the tail) in the current batch. */
static int kvp_reserve(struct kvidx_pub *pub, size_t need)
{
    struct kvp_buf *b = pub->cur;
    if (!b) {
        b = kvp_pool_get(pub->pool);
        if (!b)
            return -ENOMEM;
        pub->cur = b;
    }
    need += KVP_TAIL;
    if (need <= b->cap - b->end)
        return 0;
    size_t cap = b->cap * 2;
    if (cap - b->end < need)
        cap = b->end + need;
    struct kvp_buf *nb = realloc(b, sizeof(*b) + cap);
    if (!nb)
        return -ENOMEM;
    nb->cap = cap;
    pub->cur = nb;
    return 0;
}

/* ------------------------------------------------------------------------
 * msgpack writers (no bounds checks: callers reserve a bound first)
 * ------------------------------------------------------------------------ */

/* The writers are net/msgpack_wire.h's (kvi_mp_w_*); only the token and
 * hash encoders below are the publisher's own. */

#define MP_LIT(w, s) kvi_mp_w_str((w), (s), sizeof(s) - 1)

/*
 * Token ids: the same bytes as mp_uint, without branches (token ids look
 * random, so a branch on the width mispredicts often: 4.5 ns per token with
 * a 128k vocabulary, against 0.9 ns here). The width class comes from the
 * bit length: the big-endian bytes of the value are shifted down behind the
 * marker byte in one 64-bit word. Each token stores 8 bytes and advances by
 * its encoded length (1, 2, 3 or 5): callers reserve 5 bytes per token plus
 * at least 3 bytes of slack.
 */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
/* Indexed by __builtin_clz(v | 1): 0..15 uint32, 16..23 uint16, 24 uint8, 25.. fixint. */
static const uint8_t kvp_tok_shift[32] = {
    24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24, 24,
    40, 40, 40, 40, 40, 40, 40, 40, 48, 56, 56, 56, 56, 56, 56, 56};
static const uint8_t kvp_tok_marker[32] = {
    0xce, 0xce, 0xce, 0xce, 0xce, 0xce, 0xce, 0xce, 0xce, 0xce, 0xce, 0xce, 0xce, 0xce, 0xce, 0xce,
    0xcd, 0xcd, 0xcd, 0xcd, 0xcd, 0xcd, 0xcd, 0xcd, 0xcc, 0, 0, 0, 0, 0, 0, 0};
static const uint8_t kvp_tok_len[32] = {
    5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5,
    3, 3, 3, 3, 3, 3, 3, 3, 2, 1, 1, 1, 1, 1, 1, 1};
#endif

static uint8_t *mp_tokens(uint8_t *w, const uint32_t *t, size_t n)
{
    w = kvi_mp_w_array_hdr(w, (uint32_t)n);
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    for (size_t i = 0; i < n; i++) {
        uint32_t v = t[i];
        unsigned z = (unsigned)__builtin_clz(v | 1);
        uint64_t word = (__builtin_bswap64((uint64_t)v) >> kvp_tok_shift[z]) | kvp_tok_marker[z];
        memcpy(w, &word, 8);
        w += kvp_tok_len[z];
    }
#else
    for (size_t i = 0; i < n; i++)
        w = kvi_mp_w_uint(w, t[i]);
#endif
    return w;
}

/* A stand-in for the digest bytes in front of the u64 of a bin hash. */
static inline uint64_t kvp_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline uint8_t *mp_bin_hash(uint8_t *w, uint64_t h, unsigned words)
{
    w = kvi_mp_w_bin_hdr(w, 8 * (words + 1));
    uint64_t m = h;
    for (unsigned i = 0; i < words; i++) {
        m = kvp_mix(m);
        w = kvi_store_be64(w, m);
    }
    return kvi_store_be64(w, h);
}

/* Worst-case bytes of one hash in any encoding (bin 32: 2 + 32). */
#define KVP_HASH_MAX 34u

static inline uint8_t *mp_hash(uint8_t *w, uint64_t h, enum kvidx_pub_hash_enc enc)
{
    switch (enc) {
    case KVIDX_PUB_HASH_I64:
        return kvi_mp_w_int(w, (int64_t)h);
    case KVIDX_PUB_HASH_BIN32:
        return mp_bin_hash(w, h, 3);
    case KVIDX_PUB_HASH_BIN16:
        return mp_bin_hash(w, h, 1);
    case KVIDX_PUB_HASH_U64:
    default:
        return kvi_mp_w_uint(w, h);
    }
}

static uint8_t *mp_hashes(uint8_t *w, const uint64_t *h, size_t n, enum kvidx_pub_hash_enc enc)
{
    w = kvi_mp_w_array_hdr(w, (uint32_t)n);
    if (enc == KVIDX_PUB_HASH_U64) {
        for (size_t i = 0; i < n; i++)
            w = kvi_mp_w_uint(w, h[i]);
    } else {
        for (size_t i = 0; i < n; i++)
            w = mp_hash(w, h[i], enc);
    }
    return w;
}

/* ------------------------------------------------------------------------
 * Events
 * ------------------------------------------------------------------------ */

/* Account a finished event; flush automatically when configured. */
static int kvp_event_done(struct kvidx_pub *pub, uint8_t *w, uint64_t *event_id)
{
    struct kvp_buf *b = pub->cur;
    b->end = (size_t)(w - b->data);
    b->n_events++;
    if (event_id)
        *event_id = pub->next_event_id;
    pub->next_event_id++;
    if (pub->auto_flush && b->n_events >= pub->auto_flush)
        return kvidx_pub_flush(pub, NULL);
    return 0;
}

static inline uint8_t *kvp_cursor(struct kvidx_pub *pub)
{
    return pub->cur->data + pub->cur->end;
}

/* extra_keys: one entry per block, nil, or [lora_name] under an adapter. */
static uint8_t *mp_extra_keys(uint8_t *w, size_t n, const char *lora, size_t lora_len)
{
    w = kvi_mp_w_array_hdr(w, (uint32_t)n);
    if (!lora || lora_len == 0) {
        memset(w, 0xc0, n);
        return w + n;
    }
    for (size_t i = 0; i < n; i++) {
        w = kvi_mp_w_array_hdr(w, 1);
        w = kvi_mp_w_str(w, lora, lora_len);
    }
    return w;
}

int kvidx_pub_publish_stored_ex(struct kvidx_pub *pub, const struct kvidx_pub_stored *ev,
                                uint64_t *event_id)
{
    if (pub && pub->nats)
        return kvp_nats_stored(pub->nats, ev, event_id);
    if (!pub || !ev || !ev->block_hashes || ev->n_hashes == 0 || ev->n_hashes > KVP_MAX_COUNT ||
        ev->n_tokens > KVP_MAX_COUNT || (ev->n_tokens && !ev->token_ids && !ev->token_ids_nil))
        return -EINVAL;
    const char *medium = ev->medium ? ev->medium : pub->medium;
    const char *lora = ev->lora_name ? ev->lora_name : pub->lora_name;
    size_t medium_len = medium ? strlen(medium) : 0;
    size_t lora_len = lora ? strlen(lora) : 0;
    size_t n_tok = ev->token_ids_nil ? 0 : ev->n_tokens;
    /* A placeholder (no tokens: offload tiers) carries neither extra_keys
     * nor kv_cache_spec_kind, as vLLM's offloading connector sends it. */
    bool full = n_tok > 0;
    size_t n = ev->n_hashes;
    size_t bound = 256 + medium_len + lora_len + (n + 1) * KVP_HASH_MAX + n_tok * 5 +
                   (full ? n * (lora_len + 8) : 0);
    int rc = kvp_reserve(pub, bound);
    if (rc)
        return rc;

    const enum kvidx_pub_hash_enc enc = pub->hash_enc;
    uint8_t *w = kvp_cursor(pub);
    bool map = pub->form == KVIDX_PUB_FORM_MAP;
    uint32_t len = pub->array_len;
    if (map) {
        w = kvi_mp_w_map_hdr(w, full ? 11 : 9, pub->flags & KVIDX_PUB_F_WIDE_HEADERS);
        w = MP_LIT(w, "type");
    } else {
        w = kvi_mp_w_array_hdr(w, len);
    }
    w = MP_LIT(w, "BlockStored");
    if (map)
        w = MP_LIT(w, "block_hashes");
    w = mp_hashes(w, ev->block_hashes, n, enc);
    if (map)
        w = MP_LIT(w, "parent_block_hash");
    w = ev->parent_hash ? mp_hash(w, *ev->parent_hash, enc) : kvi_mp_w_nil(w);
    if (map)
        w = MP_LIT(w, "token_ids");
    if (ev->token_ids_nil) {
        w = kvi_mp_w_nil(w);
    } else {
        w = mp_tokens(w, ev->token_ids, n_tok);
    }
    if (map)
        w = MP_LIT(w, "block_size");
    w = kvi_mp_w_uint(w, ev->block_size);
    if (map || len > 5) {
        if (map)
            w = MP_LIT(w, "lora_id");
        w = kvi_mp_w_nil(w); /* deprecated; vLLM sends nil */
    }
    if (map || len > 6) {
        if (map)
            w = MP_LIT(w, "medium");
        w = medium ? kvi_mp_w_str(w, medium, medium_len) : kvi_mp_w_nil(w);
    }
    if (map || len > 7) {
        if (map)
            w = MP_LIT(w, "lora_name");
        w = lora ? kvi_mp_w_str(w, lora, lora_len) : kvi_mp_w_nil(w);
    }
    if (map ? full : len > 8) {
        if (map)
            w = MP_LIT(w, "extra_keys");
        w = full ? mp_extra_keys(w, n, lora, lora_len) : kvi_mp_w_nil(w);
    }
    if (map || len > 9) {
        if (map)
            w = MP_LIT(w, "group_idx");
        w = kvi_mp_w_int(w, ev->group_idx);
    }
    if (map ? full : len > 10) {
        if (map)
            w = MP_LIT(w, "kv_cache_spec_kind");
        w = full ? MP_LIT(w, "full_attention") : kvi_mp_w_nil(w);
    }
    if (!map && len > 11)
        w = kvi_mp_w_nil(w); /* kv_cache_spec_sliding_window */
    return kvp_event_done(pub, w, event_id);
}

int kvidx_pub_publish_stored(struct kvidx_pub *pub, const uint64_t *hashes, size_t n_hashes,
                             const uint64_t *parent, const uint32_t *tokens, size_t n_tokens,
                             uint32_t block_size, uint64_t *event_id)
{
    struct kvidx_pub_stored ev = {
        .block_hashes = hashes,
        .n_hashes = n_hashes,
        .parent_hash = parent,
        .token_ids = tokens,
        .n_tokens = n_tokens,
        .block_size = block_size,
    };
    return kvidx_pub_publish_stored_ex(pub, &ev, event_id);
}

int kvidx_pub_publish_removed_ex(struct kvidx_pub *pub, const struct kvidx_pub_removed *ev,
                                 uint64_t *event_id)
{
    if (pub && pub->nats)
        return kvp_nats_removed(pub->nats, ev, event_id);
    if (!pub || !ev || !ev->block_hashes || ev->n_hashes == 0 || ev->n_hashes > KVP_MAX_COUNT)
        return -EINVAL;
    const char *medium = ev->medium ? ev->medium : pub->medium;
    size_t medium_len = medium ? strlen(medium) : 0;
    int rc = kvp_reserve(pub, 128 + medium_len + ev->n_hashes * KVP_HASH_MAX);
    if (rc)
        return rc;
    uint8_t *w = kvp_cursor(pub);
    if (pub->form == KVIDX_PUB_FORM_MAP) {
        w = kvi_mp_w_map_hdr(w, 4, false);
        w = MP_LIT(w, "type");
        w = MP_LIT(w, "BlockRemoved");
        w = MP_LIT(w, "block_hashes");
        w = mp_hashes(w, ev->block_hashes, ev->n_hashes, pub->hash_enc);
        w = MP_LIT(w, "medium");
        w = medium ? kvi_mp_w_str(w, medium, medium_len) : kvi_mp_w_nil(w);
        w = MP_LIT(w, "group_idx");
        w = kvi_mp_w_int(w, ev->group_idx);
    } else {
        uint32_t len = pub->array_len <= 6 ? 2 : pub->array_len <= 9 ? 3 : 4;
        w = kvi_mp_w_array_hdr(w, len);
        w = MP_LIT(w, "BlockRemoved");
        w = mp_hashes(w, ev->block_hashes, ev->n_hashes, pub->hash_enc);
        if (len > 2)
            w = medium ? kvi_mp_w_str(w, medium, medium_len) : kvi_mp_w_nil(w);
        if (len > 3)
            w = kvi_mp_w_int(w, ev->group_idx);
    }
    return kvp_event_done(pub, w, event_id);
}

int kvidx_pub_publish_removed(struct kvidx_pub *pub, const uint64_t *hashes, size_t n_hashes,
                              uint64_t *event_id)
{
    struct kvidx_pub_removed ev = {.block_hashes = hashes, .n_hashes = n_hashes};
    return kvidx_pub_publish_removed_ex(pub, &ev, event_id);
}

int kvidx_pub_publish_cleared(struct kvidx_pub *pub, uint64_t *event_id)
{
    if (!pub)
        return -EINVAL;
    if (pub->nats)
        return kvp_nats_cleared(pub->nats, event_id);
    int rc = kvp_reserve(pub, 32);
    if (rc)
        return rc;
    uint8_t *w = kvp_cursor(pub);
    if (pub->form == KVIDX_PUB_FORM_MAP) {
        w = kvi_mp_w_map_hdr(w, 1, false);
        w = MP_LIT(w, "type");
    } else {
        w = kvi_mp_w_array_hdr(w, 1);
    }
    w = MP_LIT(w, "AllBlocksCleared");
    return kvp_event_done(pub, w, event_id);
}

/* ------------------------------------------------------------------------
 * Batches
 * ------------------------------------------------------------------------ */

static double kvp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Write [ts, <events header> in front of the events and the rank after. */
static void kvp_finalize(struct kvidx_pub *pub, struct kvp_buf *b)
{
    size_t pos = KVP_HEADROOM - kvi_mp_array_hdr_len(b->n_events);
    kvi_mp_w_array_hdr(b->data + pos, b->n_events);
    pos -= 9;
    kvi_mp_w_f64(b->data + pos, kvp_now());
    pos -= 1;
    b->data[pos] = pub->dp_rank == KVIDX_PUB_RANK_OMIT ? 0x92 : 0x93;
    b->start = pos;
    uint8_t *w = b->data + b->end;
    if (pub->dp_rank == KVIDX_PUB_RANK_NIL)
        w = kvi_mp_w_nil(w);
    else if (pub->dp_rank != KVIDX_PUB_RANK_OMIT)
        w = kvi_mp_w_int(w, pub->dp_rank);
    b->end = (size_t)(w - b->data);
}

static int kvp_zmq_fail(struct kvidx_pub *pub)
{
    pub->last_error = zmq_errno();
    pub->st_send_errors++;
    return -EIO;
}

static int kvp_send_copy(void *sock, const void *data, size_t len, int flags)
{
    int rc;
    do {
        rc = zmq_send(sock, len ? data : "", len, flags);
    } while (rc < 0 && zmq_errno() == EINTR);
    return rc < 0 ? -1 : 0;
}

/* Send a zero-copy frame of @p b's payload; consumes one reference of @p b. */
static int kvp_send_buf(void *sock, struct kvp_buf *b, int flags)
{
    zmq_msg_t m;
    KVP_TSAN_HANDOFF(b);
    if (zmq_msg_init_data(&m, b->data + b->start, b->end - b->start, kvp_zmq_free, b) != 0) {
        int e = zmq_errno();
        kvp_buf_unref(b);
        errno = e;
        return -1;
    }
    int rc;
    do {
        rc = zmq_msg_send(&m, sock, flags);
    } while (rc < 0 && zmq_errno() == EINTR);
    if (rc < 0) {
        int e = zmq_errno();
        zmq_msg_close(&m); /* calls kvp_zmq_free */
        errno = e;
        return -1;
    }
    return 0;
}

/* [topic, seq8, payload] on the PUB; consumes one reference of @p b. */
static int kvp_send_live(struct kvidx_pub *pub, struct kvp_buf *b)
{
    uint8_t seq8[8];
    kvi_store_be64(seq8, b->seq);
    if (kvp_send_copy(pub->sock, pub->topic, pub->topic_len, ZMQ_SNDMORE) ||
        kvp_send_copy(pub->sock, seq8, 8, ZMQ_SNDMORE)) {
        kvp_buf_unref(b);
        return kvp_zmq_fail(pub);
    }
    if (kvp_send_buf(pub->sock, b, 0))
        return kvp_zmq_fail(pub);
    return 0;
}

static void kvp_ring_push(struct kvidx_pub *pub, struct kvp_buf *b)
{
    pthread_mutex_lock(&pub->mu);
    struct kvp_buf *old = pub->ring_count == pub->ring_cap ? pub->ring[pub->ring_head] : NULL;
    pub->ring[pub->ring_head] = b;
    pub->ring_head = pub->ring_head + 1 == pub->ring_cap ? 0 : pub->ring_head + 1;
    if (pub->ring_count < pub->ring_cap)
        pub->ring_count++;
    pub->ring_last_seq = b->seq;
    pthread_mutex_unlock(&pub->mu);
    if (old)
        kvp_buf_unref(old);
}

/* Give back the slack of a finished buffer that grew for a larger batch
 * (publishing thread, before the buffer is shared). */
static struct kvp_buf *kvp_trim(struct kvp_buf *b)
{
    const size_t fresh = KVP_BUF_INIT - sizeof(*b);
    size_t keep = b->end + KVP_TAIL > fresh ? b->end + KVP_TAIL : fresh;
    if (b->cap <= fresh || keep > b->cap / 2)
        return b;
    struct kvp_buf *nb = realloc(b, sizeof(*b) + keep);
    if (!nb)
        return b; /* keep the larger buffer */
    nb->cap = keep;
    return nb;
}

/* Give a finished payload its sequence number, keep it for replay, send it. */
static int kvp_emit(struct kvidx_pub *pub, struct kvp_buf *b, uint64_t *seq)
{
    b = kvp_trim(b);
    b->seq = pub->next_seq++;
    bool live = true;
    if (pub->skip_live) {
        pub->skip_live--;
        live = false;
    }
    pub->st_batches++;
    pub->st_events += b->n_events;
    pub->st_bytes += b->end - b->start;
    if (live)
        pub->st_live++;
    else
        pub->st_skipped++;
    if (seq)
        *seq = b->seq;
    unsigned refs = (unsigned)pub->has_replay + (unsigned)live;
    if (refs == 0) {
        atomic_store_explicit(&b->ref, 0, memory_order_relaxed);
        kvp_pool_put(b);
        return 0;
    }
    atomic_store_explicit(&b->ref, refs, memory_order_release); /* R1 */
    if (pub->has_replay)
        kvp_ring_push(pub, b);
    return live ? kvp_send_live(pub, b) : 0;
}

int kvidx_pub_flush(struct kvidx_pub *pub, uint64_t *seq)
{
    if (!pub)
        return -EINVAL;
    if (pub->nats)
        return kvp_nats_flush(pub->nats, seq);
    struct kvp_buf *b = pub->cur;
    if (!b || b->n_events == 0) {
        if (seq)
            *seq = KVIDX_PUB_NO_SEQ;
        return 0;
    }
    pub->cur = NULL;
    kvp_finalize(pub, b);
    return kvp_emit(pub, b, seq);
}

int kvidx_pub_flush_empty(struct kvidx_pub *pub, uint64_t *seq)
{
    if (pub && pub->nats)
        return -ENOTSUP; /* a RouterEvent holds exactly one event */
    int rc = kvidx_pub_flush(pub, NULL);
    if (rc)
        return rc;
    rc = kvp_reserve(pub, 0);
    if (rc)
        return rc;
    struct kvp_buf *b = pub->cur;
    pub->cur = NULL;
    kvp_finalize(pub, b);
    return kvp_emit(pub, b, seq);
}

int kvidx_pub_publish_payload(struct kvidx_pub *pub, const void *payload, size_t len,
                              uint64_t *seq)
{
    if (!pub || (!payload && len))
        return -EINVAL;
    if (pub->nats)
        return kvp_nats_payload(pub->nats, payload, len, seq);
    int rc = kvidx_pub_flush(pub, NULL);
    if (rc)
        return rc;
    rc = kvp_reserve(pub, len);
    if (rc)
        return rc;
    struct kvp_buf *b = pub->cur;
    pub->cur = NULL;
    if (len)
        memcpy(b->data + b->start, payload, len);
    b->end = b->start + len;
    return kvp_emit(pub, b, seq);
}

/* ------------------------------------------------------------------------
 * Replay thread
 * ------------------------------------------------------------------------ */

#define KVP_FAULT_SILENT (UINT64_C(1) << 63)

/* Wait up to @p ms for the stop signal; true when it came. */
static bool kvp_wait_stop(struct kvidx_pub *pub, uint32_t ms)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        int64_t done = (int64_t)(t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
        if (done >= ms)
            return false;
        struct pollfd p = {.fd = pub->wake_rd, .events = POLLIN};
        int rc = poll(&p, 1, (int)(ms - done));
        if (rc > 0)
            return true;
        if (rc < 0 && errno != EINTR)
            return false;
    }
}

/* Take references on every buffered batch with seq >= start, oldest first. */
static uint32_t kvp_ring_collect(struct kvidx_pub *pub, uint64_t start)
{
    uint32_t k = 0;
    pthread_mutex_lock(&pub->mu);
    uint32_t n = pub->ring_count;
    if (n && start <= pub->ring_last_seq) {
        uint64_t oldest = pub->ring_last_seq - (n - 1);
        uint64_t first = start < oldest ? oldest : start;
        k = (uint32_t)(pub->ring_last_seq - first + 1);
        uint32_t pos = (uint32_t)(((uint64_t)pub->ring_head + pub->ring_cap - k) % pub->ring_cap);
        for (uint32_t i = 0; i < k; i++) {
            struct kvp_buf *b = pub->ring[pos];
            atomic_fetch_add_explicit(&b->ref, 1, memory_order_relaxed);
            pub->scratch[i] = b;
            pos = pos + 1 == pub->ring_cap ? 0 : pos + 1;
        }
    }
    pthread_mutex_unlock(&pub->mu);
    return k;
}

/* Send [id, "", (topic,) seq8] as the head of a reply message. */
static void kvp_reply_head(struct kvidx_pub *pub, const void *id, size_t id_len, const void *seq8,
                           const void *topic, size_t topic_len)
{
    kvp_send_copy(pub->router, id, id_len, ZMQ_SNDMORE);
    kvp_send_copy(pub->router, "", 0, ZMQ_SNDMORE);
    if (pub->layout == KVIDX_PUB_REPLAY_TOPIC)
        kvp_send_copy(pub->router, topic, topic_len, ZMQ_SNDMORE);
    kvp_send_copy(pub->router, seq8, 8, ZMQ_SNDMORE);
}

/*
 * Answer one request. The ROUTER has no ZMQ_ROUTER_MANDATORY (like vLLM's):
 * replies to a vanished peer, or beyond its high-water mark, are dropped by
 * libzmq, so sends here do not fail in practice and are not checked.
 */
static void kvp_serve(struct kvidx_pub *pub, const void *id, size_t id_len, uint64_t start,
                      uint32_t drop_every)
{
    uint32_t k = kvp_ring_collect(pub, start);
    uint64_t sent = 0, dropped = 0;
    for (uint32_t i = 0; i < k; i++) {
        struct kvp_buf *b = pub->scratch[i];
        if (drop_every && (i + 1) % drop_every == 0) {
            kvp_buf_unref(b);
            dropped++;
            continue;
        }
        uint8_t seq8[8];
        kvi_store_be64(seq8, b->seq);
        kvp_reply_head(pub, id, id_len, seq8, pub->topic, pub->topic_len);
        kvp_send_buf(pub->router, b, 0);
        sent++;
    }
    /* Counted before the sentinel: a client holding it sees the counts. */
    atomic_fetch_add_explicit(&pub->rp_batches, sent, memory_order_relaxed);
    atomic_fetch_add_explicit(&pub->rp_dropped, dropped, memory_order_relaxed);
    atomic_fetch_add_explicit(&pub->rp_requests, 1, memory_order_relaxed);
    kvp_reply_head(pub, id, id_len, kvp_end_seq, "", 0);
    kvp_send_copy(pub->router, "", 0, 0);
}

/*
 * Receive one request ([identity, "", start8]) and answer it.
 * @return 1 handled, 0 nothing to read, -1 stop (woken or socket error).
 */
static int kvp_replay_one(struct kvidx_pub *pub)
{
    zmq_msg_t f[3];
    int nf = 0;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        int rc = zmq_msg_recv(&m, pub->router, nf == 0 ? ZMQ_DONTWAIT : 0);
        if (rc < 0) {
            int e = zmq_errno();
            zmq_msg_close(&m);
            if (e == EINTR)
                continue;
            for (int i = 0; i < nf && i < 3; i++)
                zmq_msg_close(&f[i]);
            return nf == 0 && e == EAGAIN ? 0 : -1;
        }
        bool more = zmq_msg_more(&m);
        if (nf < 3)
            f[nf] = m;
        else
            zmq_msg_close(&m);
        nf++;
        if (!more)
            break;
    }
    int ret = 1;
    if (nf != 3 || zmq_msg_size(&f[1]) != 0 || zmq_msg_size(&f[2]) != 8) {
        atomic_fetch_add_explicit(&pub->rp_malformed, 1, memory_order_relaxed);
        goto out;
    }
    uint64_t faults = atomic_load_explicit(&pub->faults, memory_order_relaxed);
    if (faults & KVP_FAULT_SILENT) {
        atomic_fetch_add_explicit(&pub->rp_silenced, 1, memory_order_relaxed);
        goto out;
    }
    uint32_t delay = (uint32_t)((faults >> 32) & 0x7fffffffu);
    if (delay && kvp_wait_stop(pub, delay)) {
        ret = -1;
        goto out;
    }
    uint64_t start = kvi_load_be64(zmq_msg_data(&f[2]));
    kvp_serve(pub, zmq_msg_data(&f[0]), zmq_msg_size(&f[0]), start, (uint32_t)faults);
out:
    for (int i = 0; i < (nf < 3 ? nf : 3); i++)
        zmq_msg_close(&f[i]);
    return ret;
}

static void *kvp_replay_main(void *arg)
{
    struct kvidx_pub *pub = arg;
    zmq_pollitem_t items[2] = {
        {.socket = pub->router, .events = ZMQ_POLLIN},
        {.socket = NULL, .fd = pub->wake_rd, .events = ZMQ_POLLIN},
    };
    for (;;) {
        int rc = zmq_poll(items, 2, -1);
        if (rc < 0) {
            if (zmq_errno() == EINTR)
                continue;
            break;
        }
        if (items[1].revents)
            break;
        int r;
        while ((r = kvp_replay_one(pub)) > 0) {
        }
        if (r < 0)
            break;
    }
    zmq_close(pub->router);
    pub->router = NULL;
    return NULL;
}

/* ------------------------------------------------------------------------
 * Create / destroy
 * ------------------------------------------------------------------------ */

void kvidx_pub_config_init(struct kvidx_pub_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->topic = "";
    cfg->medium = "GPU";
    cfg->buffer_batches = KVIDX_PUB_DEFAULT_BUFFER_BATCHES;
    cfg->hwm = KVIDX_PUB_DEFAULT_HWM;
    cfg->array_len = KVP_DEFAULT_ARRAY_LEN;
    cfg->rebind_ms = KVIDX_PUB_DEFAULT_REBIND_MS;
    cfg->form = KVIDX_PUB_FORM_MAP;
    cfg->hash_enc = KVIDX_PUB_HASH_U64;
    cfg->replay_layout = KVIDX_PUB_REPLAY_TOPIC;
    cfg->socket_mode = KVIDX_PUB_SOCKET_AUTO;
}

int kvidx_pub_offset_endpoint(const char *endpoint, int32_t rank, char *out, size_t cap)
{
    if (!out || cap == 0 || rank < 0)
        return -EINVAL;
    int n;
    if (!endpoint || rank == 0) {
        n = snprintf(out, cap, "%s", endpoint ? endpoint : "");
    } else if (!strncmp(endpoint, "inproc://", 9)) {
        n = snprintf(out, cap, "%s_dp%d", endpoint, (int)rank);
    } else if (!strncmp(endpoint, "tcp://", 6)) {
        const char *colon = strrchr(endpoint + 6, ':');
        if (!colon || !colon[1])
            return -EINVAL;
        char *endp;
        errno = 0;
        unsigned long port = strtoul(colon + 1, &endp, 10);
        if (*endp || errno || colon[1] < '0' || colon[1] > '9' || port + (unsigned long)rank > 65535)
            return -EINVAL;
        n = snprintf(out, cap, "%.*s:%lu", (int)(colon - endpoint), endpoint,
                     port + (unsigned long)rank);
    } else {
        return -EINVAL; /* ipc:// (vLLM refuses rank > 0) or unknown transport */
    }
    return n < 0 || (size_t)n >= cap ? -ENOSPC : 0;
}

static bool kvp_binds(const char *ep, enum kvidx_pub_socket_mode mode)
{
    if (mode != KVIDX_PUB_SOCKET_AUTO)
        return mode == KVIDX_PUB_SOCKET_BIND;
    return strchr(ep, '*') || strstr(ep, "::") || !strncmp(ep, "ipc://", 6) ||
           !strncmp(ep, "inproc://", 9);
}

/* zmq_bind, retrying while the address is still held by a closing socket. */
static int kvp_bind(void *sock, const char *ep, uint32_t retry_ms)
{
    struct timespec t0, t, pause = {.tv_nsec = 2 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (zmq_bind(sock, ep) == 0)
            return 0;
        int e = zmq_errno();
        clock_gettime(CLOCK_MONOTONIC, &t);
        int64_t ms = (int64_t)(t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
        if (e != EADDRINUSE || ms >= retry_ms)
            return e;
        nanosleep(&pause, NULL);
    }
}

static int kvp_last_endpoint(void *sock, char *out)
{
    size_t len = KVP_EP_MAX;
    return zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, out, &len) == 0 ? 0 : zmq_errno();
}

static int kvp_socket(struct kvidx_pub *pub, int type, void **out)
{
    int linger = 0;
    void *s = zmq_socket(pub->ctx, type);
    if (!s || zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger))) {
        int e = zmq_errno();
        if (s)
            zmq_close(s);
        return e;
    }
    *out = s;
    return 0;
}

static char *kvp_strdup_opt(const char *s, bool *oom)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *oom = true;
    return d;
}

static int kvp_check_config(const struct kvidx_pub_config *cfg)
{
    if (!cfg || !cfg->endpoint || !cfg->endpoint[0] ||
        (cfg->replay_endpoint && !cfg->replay_endpoint[0]))
        return EINVAL;
    if ((unsigned)cfg->form > KVIDX_PUB_FORM_ARRAY || (unsigned)cfg->hash_enc > KVIDX_PUB_HASH_BIN16 ||
        (unsigned)cfg->replay_layout > KVIDX_PUB_REPLAY_LEGACY ||
        (unsigned)cfg->socket_mode > KVIDX_PUB_SOCKET_CONNECT)
        return EINVAL;
    if (cfg->array_len && (cfg->array_len < 5 || cfg->array_len > 12))
        return EINVAL;
    return 0;
}

static int kvp_start_replay(struct kvidx_pub *pub, const struct kvidx_pub_config *cfg,
                            const char *ep)
{
    pub->ring_cap = cfg->buffer_batches ? cfg->buffer_batches : KVIDX_PUB_DEFAULT_BUFFER_BATCHES;
    pub->ring = calloc(pub->ring_cap, sizeof(*pub->ring));
    pub->scratch = calloc(pub->ring_cap, sizeof(*pub->scratch));
    if (!pub->ring || !pub->scratch)
        return ENOMEM;
    int e = kvp_socket(pub, ZMQ_ROUTER, &pub->router);
    if (e)
        return e;
    e = kvp_bind(pub->router, ep, cfg->rebind_ms);
    if (!e)
        e = kvp_last_endpoint(pub->router, pub->replay_ep);
    if (e)
        return e;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK))
        return errno;
    pub->wake_rd = fds[0];
    pub->wake_wr = fds[1];
    e = pthread_create(&pub->thread, NULL, kvp_replay_main, pub);
    if (e)
        return e;
    pub->has_replay = true;
    return 0;
}

/* Free a publisher whose replay thread is not running. */
static void kvp_free(struct kvidx_pub *pub)
{
    kvp_nats_destroy(pub->nats);
    if (pub->router)
        zmq_close(pub->router);
    if (pub->sock)
        zmq_close(pub->sock);
    if (pub->cur) {
        atomic_store_explicit(&pub->cur->ref, 0, memory_order_relaxed);
        kvp_pool_put(pub->cur);
    }
    if (pub->ring) {
        for (uint32_t i = 0; i < pub->ring_cap; i++)
            if (pub->ring[i])
                kvp_buf_unref(pub->ring[i]);
    }
    if (pub->own_ctx && pub->ctx)
        zmq_ctx_term(pub->ctx); /* waits for in-flight messages to be freed */
    if (pub->wake_rd >= 0)
        close(pub->wake_rd);
    if (pub->wake_wr >= 0)
        close(pub->wake_wr);
    if (pub->pool)
        kvp_pool_unref(pub->pool);
    pthread_mutex_destroy(&pub->mu);
    free(pub->ring);
    free(pub->scratch);
    free(pub->topic);
    free(pub->medium);
    free(pub->lora_name);
    free(pub);
}

/* A NATS publisher: the struct with pub->nats and no ZMQ state. */
static struct kvidx_pub *kvp_create_nats(const struct kvidx_pub_config *cfg)
{
    struct kvidx_pub *pub = calloc(1, sizeof(*pub));
    if (!pub) {
        errno = ENOMEM;
        return NULL;
    }
    pub->wake_rd = pub->wake_wr = -1;
    pthread_mutex_init(&pub->mu, NULL);
    int e = kvp_nats_create(cfg, &pub->nats);
    if (e) {
        kvp_free(pub);
        errno = e;
        return NULL;
    }
    return pub;
}

struct kvidx_pub *kvidx_pub_create(const struct kvidx_pub_config *cfg)
{
    if (cfg && cfg->transport != KVIDX_PUB_TRANSPORT_ZMQ)
        return kvp_create_nats(cfg);
    int e = kvp_check_config(cfg);
    if (e) {
        errno = e;
        return NULL;
    }
    char ep[KVP_EP_MAX], rep[KVP_EP_MAX];
    bool offset = (cfg->flags & KVIDX_PUB_F_OFFSET_BY_RANK) && cfg->dp_rank > 0;
    int32_t rank = offset ? cfg->dp_rank : 0;
    if (kvidx_pub_offset_endpoint(cfg->endpoint, rank, ep, sizeof(ep)) ||
        (cfg->replay_endpoint &&
         kvidx_pub_offset_endpoint(cfg->replay_endpoint, rank, rep, sizeof(rep)))) {
        errno = EINVAL;
        return NULL;
    }

    struct kvidx_pub *pub = calloc(1, sizeof(*pub));
    if (!pub) {
        errno = ENOMEM;
        return NULL;
    }
    pub->wake_rd = pub->wake_wr = -1;
    pthread_mutex_init(&pub->mu, NULL);
    pub->form = cfg->form;
    pub->hash_enc = cfg->hash_enc;
    pub->array_len = cfg->array_len ? cfg->array_len : KVP_DEFAULT_ARRAY_LEN;
    pub->auto_flush = cfg->auto_flush;
    pub->flags = cfg->flags;
    pub->dp_rank = cfg->dp_rank;
    pub->layout = cfg->replay_layout;
    atomic_init(&pub->faults, 0);
    bool oom = false;
    pub->topic = kvp_strdup_opt(cfg->topic ? cfg->topic : "", &oom);
    pub->topic_len = pub->topic ? strlen(pub->topic) : 0;
    pub->medium = kvp_strdup_opt(cfg->medium, &oom);
    pub->lora_name = kvp_strdup_opt(cfg->lora_name, &oom);
    pub->pool = kvp_pool_create();
    if (oom || !pub->pool) {
        e = ENOMEM;
        goto fail;
    }

    pub->ctx = cfg->zmq_ctx;
    if (!pub->ctx) {
        pub->ctx = zmq_ctx_new();
        if (!pub->ctx) {
            e = zmq_errno();
            goto fail;
        }
        pub->own_ctx = true;
    }
    e = kvp_socket(pub, ZMQ_PUB, &pub->sock);
    if (e)
        goto fail;
    int hwm = cfg->hwm < 0 ? 0 : cfg->hwm;
    if (zmq_setsockopt(pub->sock, ZMQ_SNDHWM, &hwm, sizeof(hwm))) {
        e = zmq_errno();
        goto fail;
    }
    if (kvp_binds(ep, cfg->socket_mode)) {
        e = kvp_bind(pub->sock, ep, cfg->rebind_ms);
        if (!e)
            e = kvp_last_endpoint(pub->sock, pub->endpoint);
    } else {
        e = zmq_connect(pub->sock, ep) ? zmq_errno() : 0;
        snprintf(pub->endpoint, sizeof(pub->endpoint), "%s", ep);
    }
    if (e)
        goto fail;
    if (cfg->replay_endpoint) {
        e = kvp_start_replay(pub, cfg, rep);
        if (e)
            goto fail;
    }
    return pub;

fail:
    kvp_free(pub);
    errno = e;
    return NULL;
}

void kvidx_pub_destroy(struct kvidx_pub *pub)
{
    if (!pub)
        return;
    if (pub->has_replay) {
        ssize_t w;
        do {
            w = write(pub->wake_wr, "x", 1);
        } while (w < 0 && errno == EINTR);
        pthread_join(pub->thread, NULL);
    }
    kvp_free(pub);
}

/* ------------------------------------------------------------------------
 * Accessors and faults
 * ------------------------------------------------------------------------ */

size_t kvidx_pub_pending(const struct kvidx_pub *pub)
{
    if (pub->nats)
        return kvp_nats_pending(pub->nats);
    return pub->cur ? pub->cur->n_events : 0;
}

uint64_t kvidx_pub_next_seq(const struct kvidx_pub *pub)
{
    if (pub->nats)
        return kvp_nats_next_seq(pub->nats);
    return pub->next_seq;
}

const char *kvidx_pub_endpoint(const struct kvidx_pub *pub)
{
    if (pub->nats)
        return kvp_nats_subject(pub->nats);
    return pub->endpoint;
}

const char *kvidx_pub_replay_endpoint(const struct kvidx_pub *pub)
{
    return pub->has_replay ? pub->replay_ep : NULL;
}

int kvidx_pub_last_error(const struct kvidx_pub *pub)
{
    if (pub->nats)
        return kvp_nats_last_error(pub->nats);
    return pub->last_error;
}

const char *kvidx_pub_last_error_text(const struct kvidx_pub *pub)
{
    if (pub->nats)
        return kvp_nats_last_error_text(pub->nats);
    return pub->last_error ? zmq_strerror(pub->last_error) : "";
}

uint64_t kvidx_pub_nats_publisher_id(const struct kvidx_pub *pub)
{
    return pub->nats ? kvp_nats_publisher_id(pub->nats) : 0;
}

void kvidx_pub_get_stats(const struct kvidx_pub *pub, struct kvidx_pub_stats *out)
{
    if (pub->nats) {
        kvp_nats_stats(pub->nats, out);
        return;
    }
    struct kvidx_pub *p = (struct kvidx_pub *)pub; /* the mutex only */
    memset(out, 0, sizeof(*out));
    out->next_seq = pub->next_seq;
    out->next_event_id = pub->next_event_id;
    out->batches = pub->st_batches;
    out->batches_live = pub->st_live;
    out->batches_skipped = pub->st_skipped;
    out->events = pub->st_events;
    out->bytes = pub->st_bytes;
    out->send_errors = pub->st_send_errors;
    out->raw_messages = pub->st_raw;
    if (!pub->has_replay)
        return;
    out->replay_requests = atomic_load_explicit(&p->rp_requests, memory_order_relaxed);
    out->replay_malformed = atomic_load_explicit(&p->rp_malformed, memory_order_relaxed);
    out->replay_silenced = atomic_load_explicit(&p->rp_silenced, memory_order_relaxed);
    out->replay_batches = atomic_load_explicit(&p->rp_batches, memory_order_relaxed);
    out->replay_dropped = atomic_load_explicit(&p->rp_dropped, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    out->replay_buffered = p->ring_count;
    pthread_mutex_unlock(&p->mu);
}

void kvidx_pub_skip_live(struct kvidx_pub *pub, uint64_t n)
{
    if (pub->nats) {
        kvp_nats_skip_live(pub->nats, n);
        return;
    }
    pub->skip_live = n > UINT64_MAX - pub->skip_live ? UINT64_MAX : pub->skip_live + n;
}

int kvidx_pub_set_replay_faults(struct kvidx_pub *pub, const struct kvidx_pub_replay_faults *f)
{
    if (!pub || !f || !pub->has_replay)
        return -EINVAL;
    uint64_t delay = f->delay_ms > 0x7fffffffu ? 0x7fffffffu : f->delay_ms;
    uint64_t v = (uint64_t)f->drop_every | delay << 32 | (f->silent ? KVP_FAULT_SILENT : 0);
    atomic_store_explicit(&pub->faults, v, memory_order_relaxed);
    return 0;
}

int kvidx_pub_send_raw(struct kvidx_pub *pub, const void *const *frames, const size_t *sizes,
                       size_t n_frames)
{
    if (!pub || !frames || !sizes || n_frames == 0)
        return -EINVAL;
    for (size_t i = 0; i < n_frames; i++)
        if (!frames[i] && sizes[i])
            return -EINVAL;
    if (pub->nats)
        return kvp_nats_send_raw(pub->nats, frames, sizes, n_frames);
    for (size_t i = 0; i < n_frames; i++) {
        if (kvp_send_copy(pub->sock, frames[i], sizes[i], i + 1 < n_frames ? ZMQ_SNDMORE : 0))
            return kvp_zmq_fail(pub);
    }
    pub->st_raw++;
    return 0;
}
