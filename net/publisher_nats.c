/*
 * kvidx publisher: the NATS transports (Core NATS and JetStream), publishing
 * Dynamo RouterEvents (see enum kvidx_pub_transport in
 * net/include/kvidx/publisher.h for the wire format, net/router_event.h for
 * the encoders, net/publisher_nats.h for the functions publisher.c calls).
 *
 * DESIGN
 *
 * Threads. Every field of struct kvp_nats belongs to the publishing thread
 * (one at a time, as for the ZMQ transport). libnats runs threads of its
 * own: per connection a socket reader and a flusher, and library-wide
 * timers. The publisher registers no callback (no handlers, no async
 * subscriptions, no js_PublishAsync), so those threads never touch its
 * memory: the only hand-overs are the libnats calls made from the
 * publishing thread, which copy what they are given under libnats' own
 * locks (natsConnection_Publish and js_Publish copy the data into the
 * connection's buffer before they return), so every buffer here is free
 * for reuse when a call returns. No atomics or locks of ours.
 *
 * Blocking. Core: natsConnection_Publish only queues (the flusher thread
 * writes the socket); while libnats reconnects it keeps the messages in its
 * reconnect buffer. JetStream: js_Publish is a request waiting for the
 * stream's acknowledgement (nats_timeout_ms at most), so a flush blocks the
 * publishing thread for one round trip per event, and for at most one
 * nats_timeout_ms at the event that fails (it stops there). kvp_nats_destroy
 * waits up to nats_timeout_ms for libnats to send what it buffered; what
 * the queue still holds is discarded.
 *
 * Buffers and delivery. publish_* encode the event at once (the tokens
 * must be hashed while the caller's arrays are valid) into `buf`, one after
 * another, and note (offset, length, event_id, failed tries) in `ev`: a
 * FIFO of the events accepted and not yet published, oldest at index 0.
 * Flush publishes from the front, each as its own message (Core writes the
 * envelope head and copies the RouterEvent behind it into `msg`; JetStream
 * sends the JSON from `buf` as is), and stops at the first transient
 * failure: that event and the ones behind it stay, byte for byte, and the
 * next flush starts with it again (same Nats-Msg-Id, which is derived from
 * the event id, so JetStream drops a copy it already stored). What left the
 * queue is then cut off the front (memmove of the rest: O(held) per flush
 * that made progress, none while every try fails at the front). A message
 * that can never be published (kvp_permanent) is dropped instead, and the
 * flush goes on. The queue holds at most max_pending events (kvp_admit).
 * Sequence numbers are given as messages leave the queue. The buffers keep
 * their capacity while it stays under KVP_NATS_TRIM_BYTES, and are freed
 * when the queue empties above it (after an outage's backlog).
 *
 * Library state. libnats initialises itself on first use; kvp_nats_destroy
 * does not call nats_Close, which would tear libnats down for every other
 * user in the process.
 */
#include "publisher_nats.h"

#include <errno.h>
#include <limits.h>
#include <nats/nats.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "router_event.h"

/* Dynamo's JetStream subject suffix and stream max age. */
#define KVP_NATS_JS_SUFFIX ".kv-events"
#define KVP_NATS_MAX_AGE_NS (3600ll * 1000 * 1000 * 1000)
/* "<u64>-<u32>-<u64>" */
#define KVP_NATS_MSGID_MAX 96u /* four u64 and three dashes: 83 */
/* Buffers above this are freed when the queue empties. */
#define KVP_NATS_TRIM_BYTES ((size_t)1 << 20)

struct kvp_nats_ev {
    size_t off, len;   /* in buf */
    uint64_t event_id;
    uint32_t tries;    /* failed publishes so far */
};

struct kvp_nats {
    enum kvidx_pub_transport transport;
    natsConnection *nc;
    jsCtx *js;               /* JetStream only */
    char *subject;           /* published to */
    char *medium;            /* NULL: "GPU" */
    char *lora_name;         /* NULL: none */
    uint64_t lora_seed;      /* tokens_hash seed of lora_name */
    uint64_t worker_id;
    uint64_t publisher_id;
    uint32_t dp_rank;
    uint32_t auto_flush;
    size_t max_pending;      /* bound on n_ev */
    int64_t timeout_ms;

    uint64_t next_seq, next_event_id, skip;
    int last_error;          /* natsStatus of the last -EIO */

    uint8_t *buf;            /* encoded events held, oldest first */
    size_t len, cap;
    struct kvp_nats_ev *ev;  /* the queue: [0, n_ev) */
    size_t n_ev, ev_cap;
    uint8_t *msg;            /* Core: envelope + payload of one message */
    size_t msg_cap;
    uint64_t *th;            /* tokens_hash scratch */
    size_t th_cap;

    uint64_t st_batches, st_live, st_skipped, st_events, st_bytes, st_send_errors, st_raw;
    uint64_t st_retries, st_dups, st_dropped;
};

/* ------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------ */

/* Grow *p to at least need elements of size elem; 0 or -ENOMEM. */
static int kvp_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c = c > SIZE_MAX / 2 ? need : c * 2;
    if (c > SIZE_MAX / elem)
        return -ENOMEM;
    void *q = realloc(*p, c * elem);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

static int kvp_errno(natsStatus s)
{
    switch (s) {
    case NATS_NO_SERVER:
        return ECONNREFUSED;
    case NATS_TIMEOUT:
        return ETIMEDOUT;
    case NATS_NO_MEMORY:
        return ENOMEM;
    case NATS_INVALID_ARG:
        return EINVAL;
    default:
        return EIO;
    }
}

static uint64_t kvp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* A random non-zero publisher id (getrandom; a clock/pid mix if it fails). */
static uint64_t kvp_random_id(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        v = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^
            ((uint64_t)getpid() << 32);
        v ^= v >> 31;
        v *= 0x9e3779b97f4a7c15ull;
        v ^= v >> 29;
    }
    return v ? v : 1;
}

static int kvp_fail(struct kvp_nats *n, natsStatus s)
{
    n->last_error = (int)s;
    n->st_send_errors++;
    return -EIO;
}

/* ------------------------------------------------------------------------
 * Stream name, connection
 * ------------------------------------------------------------------------ */

int kvidx_pub_nats_stream_name(const char *subject, char *out, size_t cap)
{
    if (!subject || !out || !subject[0])
        return -EINVAL;
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)subject; *p; p++) {
        unsigned char c = *p;
        if (c >= 0x80 && c < 0xc0 && p != (const unsigned char *)subject)
            continue; /* a UTF-8 continuation byte: its character is written */
        if (c >= 'A' && c <= 'Z')
            c = (unsigned char)(c - 'A' + 'a');
        bool keep = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
        if (o + 1 >= cap)
            return -ENOSPC;
        out[o++] = keep ? (char)c : '-'; /* '_' and the rest: '_', then '-' */
    }
    out[o] = '\0';
    return 0;
}

/* Split the comma-separated @p urls and connect. */
static natsStatus kvp_connect(struct kvp_nats *n, const char *urls)
{
    char *copy = strdup(urls);
    size_t max = 1;
    for (const char *p = urls; *p; p++)
        max += *p == ',';
    const char **list = calloc(max, sizeof(*list));
    natsOptions *o = NULL;
    natsStatus s = copy && list ? NATS_OK : NATS_NO_MEMORY;
    int cnt = 0;
    for (char *save = NULL, *t = s == NATS_OK ? strtok_r(copy, ",", &save) : NULL; t;
         t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ')
            t++;
        size_t l = strlen(t);
        while (l && t[l - 1] == ' ')
            t[--l] = '\0';
        if (l)
            list[cnt++] = t;
    }
    if (s == NATS_OK && cnt == 0)
        s = NATS_INVALID_ARG;
    if (s == NATS_OK)
        s = natsOptions_Create(&o);
    if (s == NATS_OK)
        s = natsOptions_SetServers(o, list, cnt);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(o, n->timeout_ms);
    if (s == NATS_OK)
        s = natsOptions_SetName(o, "kvidx-publisher");
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(o, -1); /* an engine outlives server restarts */
    if (s == NATS_OK)
        s = natsConnection_Connect(&n->nc, o);
    natsOptions_Destroy(o);
    free(list);
    free(copy);
    return s;
}

/* Look up (or create) the stream. @return 0 or a positive errno. */
static int kvp_stream(struct kvp_nats *n, const char *stream, bool create)
{
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = n->timeout_ms;
    natsStatus s = natsConnection_JetStream(&n->js, n->nc, &jo);
    if (s != NATS_OK)
        return kvp_errno(s);
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    s = js_GetStreamInfo(&si, n->js, stream, NULL, &jerr);
    if (s == NATS_OK) {
        jsStreamInfo_Destroy(si);
        return 0;
    }
    if (s != NATS_NOT_FOUND && jerr != JSStreamNotFoundErr)
        return kvp_errno(s);
    if (!create)
        return ENOENT;
    size_t sl = strlen(stream);
    char *subj = malloc(sl + 3);
    if (!subj)
        return ENOMEM;
    memcpy(subj, stream, sl);
    memcpy(subj + sl, ".*", 3);
    const char *subjects[1] = {subj};
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    sc.Name = stream;
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    sc.Storage = js_FileStorage;
    sc.MaxAge = KVP_NATS_MAX_AGE_NS;
    jerr = 0;
    s = js_AddStream(&si, n->js, &sc, NULL, &jerr);
    free(subj);
    if (s == NATS_OK)
        jsStreamInfo_Destroy(si);
    else if (jerr == JSStreamNameExistErr)
        s = NATS_OK; /* created meanwhile by another publisher */
    return s == NATS_OK ? 0 : kvp_errno(s);
}

int kvp_nats_create(const struct kvidx_pub_config *cfg, struct kvp_nats **out)
{
    bool js = cfg->transport == KVIDX_PUB_TRANSPORT_NATS_JETSTREAM;
    if ((cfg->transport != KVIDX_PUB_TRANSPORT_NATS_CORE && !js) || cfg->dp_rank < 0)
        return EINVAL;
    bool has_subject = cfg->nats_subject && cfg->nats_subject[0];
    bool has_stream = cfg->nats_stream && cfg->nats_stream[0];
    if (js ? !has_subject && !has_stream : !has_subject)
        return EINVAL;

    struct kvp_nats *n = calloc(1, sizeof(*n));
    if (!n)
        return ENOMEM;
    n->transport = cfg->transport;
    n->worker_id = cfg->worker_id;
    n->publisher_id = cfg->nats_publisher_id ? cfg->nats_publisher_id : kvp_random_id();
    n->dp_rank = (uint32_t)cfg->dp_rank;
    n->auto_flush = cfg->auto_flush;
    n->max_pending = cfg->nats_max_pending ? cfg->nats_max_pending : KVIDX_PUB_DEFAULT_NATS_MAX_PENDING;
    n->timeout_ms = cfg->nats_timeout_ms ? cfg->nats_timeout_ms : KVIDX_PUB_DEFAULT_NATS_TIMEOUT_MS;
    int e = 0;
    char *stream = NULL;
    if (cfg->medium && !(n->medium = strdup(cfg->medium)))
        e = ENOMEM;
    if (cfg->lora_name && !(n->lora_name = strdup(cfg->lora_name)))
        e = ENOMEM;
    n->lora_seed = kvp_re_seed(n->lora_name, n->lora_name ? strlen(n->lora_name) : 0);
    if (!e && js) {
        if (has_stream) {
            stream = strdup(cfg->nats_stream);
        } else {
            size_t cap = strlen(cfg->nats_subject) + 1;
            stream = malloc(cap);
            if (stream && kvidx_pub_nats_stream_name(cfg->nats_subject, stream, cap)) {
                free(stream);
                stream = NULL;
                e = EINVAL;
            }
        }
        if (!stream && !e)
            e = ENOMEM;
        if (!e) {
            size_t sl = strlen(stream);
            n->subject = malloc(sl + sizeof(KVP_NATS_JS_SUFFIX));
            if (n->subject) {
                memcpy(n->subject, stream, sl);
                memcpy(n->subject + sl, KVP_NATS_JS_SUFFIX, sizeof(KVP_NATS_JS_SUFFIX));
            }
        }
    } else if (!e) {
        n->subject = strdup(cfg->nats_subject);
    }
    if (!e && !n->subject)
        e = ENOMEM;
    if (!e) {
        natsStatus s = kvp_connect(n, cfg->nats_url ? cfg->nats_url : KVIDX_PUB_DEFAULT_NATS_URL);
        if (s != NATS_OK)
            e = kvp_errno(s);
    }
    if (!e && js)
        e = kvp_stream(n, stream, cfg->flags & KVIDX_PUB_F_NATS_CREATE_STREAM);
    free(stream);
    if (e) {
        kvp_nats_destroy(n);
        return e;
    }
    *out = n;
    return 0;
}

void kvp_nats_destroy(struct kvp_nats *n)
{
    if (!n)
        return;
    if (n->nc && !natsConnection_IsClosed(n->nc))
        natsConnection_FlushTimeout(n->nc, n->timeout_ms); /* best effort */
    jsCtx_Destroy(n->js);
    natsConnection_Destroy(n->nc);
    free(n->subject);
    free(n->medium);
    free(n->lora_name);
    free(n->buf);
    free(n->ev);
    free(n->msg);
    free(n->th);
    free(n);
}

/* ------------------------------------------------------------------------
 * Events
 * ------------------------------------------------------------------------ */

/* Room for @p bytes more in buf and one more event. */
static int kvp_reserve(struct kvp_nats *n, size_t bytes)
{
    if (bytes > SIZE_MAX - n->len)
        return -ENOMEM;
    int rc = kvp_grow((void **)&n->buf, &n->cap, n->len + bytes, 1);
    if (!rc)
        rc = kvp_grow((void **)&n->ev, &n->ev_cap, n->n_ev + 1, sizeof(*n->ev));
    return rc;
}

static struct kvp_re_head kvp_head(const struct kvp_nats *n, const char *medium)
{
    return (struct kvp_re_head){
        .worker_id = n->worker_id,
        .tier = kvp_re_tier(medium),
        .event_id = n->next_event_id,
        .dp_rank = n->dp_rank,
    };
}

static enum kvp_re_enc kvp_enc(const struct kvp_nats *n)
{
    return n->transport == KVIDX_PUB_TRANSPORT_NATS_JETSTREAM ? KVP_RE_JSON : KVP_RE_MSGPACK;
}

/*
 * Room for one more event under max_pending. With auto_flush, a full queue
 * is flushed once first. *flushed receives that flush's result, or 1 when
 * none was tried. @return 0, or -ENOBUFS (the queue is still full).
 */
static int kvp_admit(struct kvp_nats *n, int *flushed)
{
    *flushed = 1;
    if (n->n_ev < n->max_pending)
        return 0;
    if (n->auto_flush)
        *flushed = kvp_nats_flush(n, NULL);
    return n->n_ev < n->max_pending ? 0 : -ENOBUFS;
}

/*
 * Account the event written up to @p w and flush automatically when
 * configured, unless @p flushed (from kvp_admit) says a flush failed in this
 * call already (one wait per call): then its error is returned.
 */
static int kvp_event_done(struct kvp_nats *n, uint8_t *w, uint64_t *event_id, int flushed)
{
    size_t end = (size_t)(w - n->buf);
    n->ev[n->n_ev++] = (struct kvp_nats_ev){.off = n->len, .len = end - n->len,
                                            .event_id = n->next_event_id};
    n->len = end;
    if (event_id)
        *event_id = n->next_event_id;
    n->next_event_id++;
    if (flushed < 0)
        return flushed;
    if (n->auto_flush && n->n_ev >= n->auto_flush)
        return kvp_nats_flush(n, NULL);
    return 0;
}

int kvp_nats_stored(struct kvp_nats *n, const struct kvidx_pub_stored *ev, uint64_t *event_id)
{
    if (!ev || !ev->block_hashes || ev->n_hashes == 0 || ev->n_hashes > UINT32_MAX ||
        ev->token_ids_nil || ev->block_size == 0 || !ev->token_ids ||
        ev->n_tokens % ev->block_size || ev->n_tokens / ev->block_size != ev->n_hashes)
        return -EINVAL;
    size_t nb = ev->n_hashes;
    uint64_t seed = ev->lora_name ? kvp_re_seed(ev->lora_name, strlen(ev->lora_name))
                                  : n->lora_seed;
    int flushed;
    int rc = kvp_admit(n, &flushed);
    if (!rc)
        rc = kvp_grow((void **)&n->th, &n->th_cap, nb, sizeof(*n->th));
    if (!rc)
        rc = kvp_reserve(n, kvp_re_stored_max(nb));
    if (rc)
        return rc;
    for (size_t i = 0; i < nb; i++)
        n->th[i] = kvp_re_tokens_hash(ev->token_ids + i * ev->block_size, ev->block_size, seed);
    struct kvp_re_head h = kvp_head(n, ev->medium ? ev->medium : n->medium);
    uint8_t *w = kvp_re_stored(n->buf + n->len, kvp_enc(n), &h, ev->parent_hash,
                               ev->block_hashes, n->th, nb);
    return kvp_event_done(n, w, event_id, flushed);
}

int kvp_nats_removed(struct kvp_nats *n, const struct kvidx_pub_removed *ev, uint64_t *event_id)
{
    if (!ev || !ev->block_hashes || ev->n_hashes == 0 || ev->n_hashes > UINT32_MAX)
        return -EINVAL;
    int flushed;
    int rc = kvp_admit(n, &flushed);
    if (!rc)
        rc = kvp_reserve(n, kvp_re_removed_max(ev->n_hashes));
    if (rc)
        return rc;
    struct kvp_re_head h = kvp_head(n, ev->medium ? ev->medium : n->medium);
    uint8_t *w = kvp_re_removed(n->buf + n->len, kvp_enc(n), &h, ev->block_hashes, ev->n_hashes);
    return kvp_event_done(n, w, event_id, flushed);
}

int kvp_nats_cleared(struct kvp_nats *n, uint64_t *event_id)
{
    int flushed;
    int rc = kvp_admit(n, &flushed);
    if (!rc)
        rc = kvp_reserve(n, kvp_re_cleared_max());
    if (rc)
        return rc;
    struct kvp_re_head h = kvp_head(n, n->medium);
    uint8_t *w = kvp_re_cleared(n->buf + n->len, kvp_enc(n), &h);
    return kvp_event_done(n, w, event_id, flushed);
}

/* ------------------------------------------------------------------------
 * Messages
 * ------------------------------------------------------------------------ */

/* Publish @p len bytes as one message: Core wraps them in the envelope with
 * sequence @p seq; JetStream sends them as they are, with @p msg_id as
 * Nats-Msg-Id when not NULL, and sets *jerr (the stream's error code, 0 if
 * none) and *dup (the ack said the stream held the id already). Counts the
 * bytes sent. */
static natsStatus kvp_send(struct kvp_nats *n, uint64_t seq, const void *data, size_t len,
                           const char *msg_id, jsErrCode *jerr, bool *dup)
{
    *jerr = 0;
    *dup = false;
    if (len > INT_MAX - KVP_RE_ENVELOPE_MAX)
        return NATS_MAX_PAYLOAD;
    natsStatus s;
    size_t sent = len;
    if (n->transport == KVIDX_PUB_TRANSPORT_NATS_JETSTREAM) {
        jsPubOptions po;
        jsPubOptions_Init(&po);
        po.MsgId = msg_id;
        jsPubAck *ack = NULL;
        s = js_Publish(&ack, n->js, n->subject, data, (int)len, &po, jerr);
        if (s == NATS_OK && ack)
            *dup = ack->Duplicate;
        jsPubAck_Destroy(ack);
    } else {
        if (kvp_grow((void **)&n->msg, &n->msg_cap, KVP_RE_ENVELOPE_MAX + len, 1))
            return NATS_NO_MEMORY;
        uint8_t *w = kvp_re_envelope_head(n->msg, n->publisher_id, seq, kvp_now_ms(),
                                          (uint32_t)len);
        if (len)
            memcpy(w, data, len);
        sent = (size_t)(w - n->msg) + len;
        s = natsConnection_Publish(n->nc, n->subject, n->msg, (int)sent);
    }
    if (s == NATS_OK)
        n->st_bytes += sent;
    return s;
}

/* A failure no retry can cure: the message is too large (for the server or
 * the stream) or refused as an invalid argument. Everything else (timeouts,
 * no responders during an election, a closed or reconnecting connection, a
 * full reconnect buffer, the stream's other errors) is worth a retry. */
static bool kvp_permanent(natsStatus s, jsErrCode jerr)
{
    return s == NATS_MAX_PAYLOAD || s == NATS_INVALID_ARG ||
           jerr == JSStreamMessageExceedsMaximumErr;
}

/* The front event leaves the queue (published, withheld or dropped): it
 * takes the next sequence number. */
static void kvp_leave(struct kvp_nats *n, uint64_t *seq)
{
    uint64_t s = n->next_seq++;
    n->st_batches++;
    n->st_events++;
    if (seq)
        *seq = s;
}

/* Cut the first @p done events (they left) off the queue; free large
 * buffers once it is empty. */
static void kvp_shift(struct kvp_nats *n, size_t done)
{
    if (done == n->n_ev) {
        n->n_ev = 0;
        n->len = 0;
        if (n->cap > KVP_NATS_TRIM_BYTES) {
            free(n->buf);
            n->buf = NULL;
            n->cap = 0;
        }
        if (n->ev_cap * sizeof(*n->ev) > KVP_NATS_TRIM_BYTES) {
            free(n->ev);
            n->ev = NULL;
            n->ev_cap = 0;
        }
        return;
    }
    if (done == 0)
        return;
    size_t off0 = n->ev[done].off;
    memmove(n->buf, n->buf + off0, n->len - off0);
    n->len -= off0;
    memmove(n->ev, n->ev + done, (n->n_ev - done) * sizeof(*n->ev));
    n->n_ev -= done;
    for (size_t i = 0; i < n->n_ev; i++)
        n->ev[i].off -= off0;
}

int kvp_nats_flush(struct kvp_nats *n, uint64_t *seq)
{
    if (seq)
        *seq = KVIDX_PUB_NO_SEQ;
    int rc = 0;
    size_t done = 0;
    for (; done < n->n_ev; done++) {
        struct kvp_nats_ev *e = &n->ev[done];
        if (n->skip) {
            n->skip--;
            n->st_skipped++;
            kvp_leave(n, seq);
            continue;
        }
        char id[KVP_NATS_MSGID_MAX];
        /* the publisher id too: a restarted publisher (a new random id) starts its event ids
         * at 0 again, and must not be dropped as a duplicate of its predecessor */
        snprintf(id, sizeof(id), "%llu-%u-%llu-%llu", (unsigned long long)n->worker_id, n->dp_rank,
                 (unsigned long long)n->publisher_id, (unsigned long long)e->event_id);
        if (e->tries)
            n->st_retries++;
        jsErrCode jerr;
        bool dup;
        natsStatus st = kvp_send(n, n->next_seq, n->buf + e->off, e->len, id, &jerr, &dup);
        if (st == NATS_OK) {
            n->st_live++;
            n->st_dups += dup;
            kvp_leave(n, seq);
            continue;
        }
        rc = kvp_fail(n, st);
        if (kvp_permanent(st, jerr)) {
            n->st_dropped++;
            kvp_leave(n, seq);
            continue;
        }
        e->tries++;
        break; /* it and the events behind it stay, in order, for the next flush */
    }
    kvp_shift(n, done);
    return rc;
}

int kvp_nats_payload(struct kvp_nats *n, const void *payload, size_t len, uint64_t *seq)
{
    int rc = kvp_nats_flush(n, NULL);
    if (rc)
        return rc; /* never ahead of an event */
    uint64_t s = n->next_seq++;
    n->st_batches++;
    if (seq)
        *seq = s;
    if (n->skip) {
        n->skip--;
        n->st_skipped++;
        return 0;
    }
    jsErrCode jerr;
    bool dup;
    natsStatus st = kvp_send(n, s, payload, len, NULL, &jerr, &dup);
    if (st != NATS_OK)
        return kvp_fail(n, st);
    n->st_live++;
    return 0;
}

int kvp_nats_send_raw(struct kvp_nats *n, const void *const *frames, const size_t *sizes,
                      size_t n_frames)
{
    for (size_t i = 0; i < n_frames; i++) {
        if (sizes[i] > INT_MAX)
            return -EINVAL;
        natsStatus s;
        if (n->transport == KVIDX_PUB_TRANSPORT_NATS_JETSTREAM) {
            jsErrCode jerr = 0;
            s = js_Publish(NULL, n->js, n->subject, frames[i], (int)sizes[i], NULL, &jerr);
        } else {
            s = natsConnection_Publish(n->nc, n->subject, frames[i], (int)sizes[i]);
        }
        if (s != NATS_OK)
            return kvp_fail(n, s);
        n->st_raw++;
    }
    return 0;
}

void kvp_nats_skip_live(struct kvp_nats *n, uint64_t count)
{
    n->skip = count > UINT64_MAX - n->skip ? UINT64_MAX : n->skip + count;
}

/* ------------------------------------------------------------------------
 * Accessors
 * ------------------------------------------------------------------------ */

size_t kvp_nats_pending(const struct kvp_nats *n)
{
    return n->n_ev;
}

uint64_t kvp_nats_next_seq(const struct kvp_nats *n)
{
    return n->next_seq;
}

const char *kvp_nats_subject(const struct kvp_nats *n)
{
    return n->subject;
}

uint64_t kvp_nats_publisher_id(const struct kvp_nats *n)
{
    return n->publisher_id;
}

int kvp_nats_last_error(const struct kvp_nats *n)
{
    return n->last_error;
}

const char *kvp_nats_last_error_text(const struct kvp_nats *n)
{
    return n->last_error ? natsStatus_GetText((natsStatus)n->last_error) : "";
}

void kvp_nats_stats(const struct kvp_nats *n, struct kvidx_pub_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->next_seq = n->next_seq;
    out->next_event_id = n->next_event_id;
    out->batches = n->st_batches;
    out->batches_live = n->st_live;
    out->batches_skipped = n->st_skipped;
    out->events = n->st_events;
    out->bytes = n->st_bytes;
    out->send_errors = n->st_send_errors;
    out->raw_messages = n->st_raw;
    out->retries = n->st_retries;
    out->duplicates = n->st_dups;
    out->dropped = n->st_dropped;
}
