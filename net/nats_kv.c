/*
 * A watched JetStream Key-Value bucket (net/nats_kv.h).
 *
 * DESIGN (see the header): one watcher thread opens the bucket, watches every
 * key and calls back; writers use the opened handle under `mu`.
 *   K1  `loaded` is stored (release) after on_loaded returned; readers load
 *       it with acquire.
 *   K2  `stop` (relaxed): a late read delays the exit by one wait (POLL_MS).
 */
#include "net/nats_kv.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "net/log.h"
#include "net/nats_conn.h"

#define POLL_MS 200
#define RETRY_MS_MAX 2000

struct kvi_nats_kv {
    struct kvi_nats *plane;
    char bucket[KVI_NATS_NAME_MAX];
    kvi_kv_change_fn on_change;
    void (*on_loaded)(void *ctx);
    void *ctx;
    pthread_t thread;
    _Atomic bool stop;   /* K2 */
    _Atomic bool loaded; /* K1 */
    pthread_mutex_t mu;  /* kv and js, for writers */
    jsCtx *js;
    kvStore *kv;
};

bool kvi_nats_kv_key_ok(const char *key)
{
    size_t n = strlen(key);
    if (n == 0 || key[0] == '.' || key[n - 1] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = key[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '/' ||
              c == '_' || c == '=' || c == '.'))
            return false;
    }
    return true;
}

static bool bucket_ok(const char *b)
{
    if (b == NULL || *b == '\0' || strlen(b) >= KVI_NATS_NAME_MAX)
        return false;
    for (const char *p = b; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
              *p == '_'))
            return false;
    return true;
}

static bool stopping(const struct kvi_nats_kv *k) { return atomic_load_explicit(&k->stop, memory_order_relaxed); }

static void nap_ms(const struct kvi_nats_kv *k, uint32_t ms)
{
    for (uint32_t t = 0; t < ms && !stopping(k); t += 50) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* Open (or create) the bucket. Watcher thread. @return 0 or -1 (logged once per failure kind). */
static int bucket_open(struct kvi_nats_kv *k)
{
    natsConnection *nc = kvi_nats__connection(k->plane);
    jsCtx *js = NULL;
    kvStore *kv = NULL;
    natsStatus s = natsConnection_JetStream(&js, nc, NULL);
    if (s == NATS_OK) {
        s = js_KeyValue(&kv, js, k->bucket);
        if (s == NATS_NOT_FOUND) {
            kvConfig c;
            kvConfig_Init(&c);
            c.Bucket = k->bucket;
            c.History = 1;
            c.StorageType = js_FileStorage;
            s = js_CreateKeyValue(&kv, js, &c);
            if (s == NATS_OK)
                kvi_log_info("nats registry: bucket %s created", k->bucket);
        }
    }
    if (s != NATS_OK) {
        jsCtx_Destroy(js);
        return -1;
    }
    pthread_mutex_lock(&k->mu);
    k->js = js;
    k->kv = kv;
    pthread_mutex_unlock(&k->mu);
    return 0;
}

/* Watch every key until stop or a failure. Watcher thread. */
static void watch(struct kvi_nats_kv *k)
{
    kvWatcher *w = NULL;
    if (kvStore_WatchAll(&w, k->kv, NULL) != NATS_OK) {
        kvi_log_warn("nats registry: cannot watch bucket %s (%s); retrying", k->bucket, nats_GetLastError(NULL));
        return;
    }
    while (!stopping(k)) {
        kvEntry *e = NULL;
        natsStatus s = kvWatcher_Next(&e, w, POLL_MS);
        if (s == NATS_TIMEOUT)
            continue;
        if (s != NATS_OK) {
            kvi_log_warn("nats registry: watch of %s stopped (%s); starting it again", k->bucket,
                         natsStatus_GetText(s));
            break;
        }
        if (e == NULL) { /* the current values are all delivered */
            if (!atomic_load_explicit(&k->loaded, memory_order_relaxed)) {
                if (k->on_loaded != NULL)
                    k->on_loaded(k->ctx);
                atomic_store_explicit(&k->loaded, true, memory_order_release); /* K1 */
            }
            continue;
        }
        kvOperation op = kvEntry_Operation(e);
        k->on_change(k->ctx, op == kvOp_Put ? KVI_KV_PUT : KVI_KV_DELETE, kvEntry_Key(e),
                     op == kvOp_Put ? kvEntry_Value(e) : NULL, op == kvOp_Put ? (size_t)kvEntry_ValueLen(e) : 0,
                     kvEntry_Revision(e));
        kvEntry_Destroy(e);
    }
    kvWatcher_Destroy(w);
}

static void *watcher_main(void *arg)
{
    struct kvi_nats_kv *k = arg;
    uint32_t backoff = 100;
    bool warned = false;
    while (!stopping(k)) {
        if (k->kv == NULL && bucket_open(k) != 0) {
            if (!warned)
                kvi_log_warn("nats registry: bucket %s not reachable yet (%s); retrying", k->bucket,
                             nats_GetLastError(NULL));
            warned = true;
            nap_ms(k, backoff);
            backoff = backoff * 2 < RETRY_MS_MAX ? backoff * 2 : RETRY_MS_MAX;
            continue;
        }
        backoff = 100;
        watch(k);
        nap_ms(k, POLL_MS);
    }
    return NULL;
}

struct kvi_nats_kv *kvi_nats_kv_open(struct kvi_nats *plane, const char *bucket, kvi_kv_change_fn on_change,
                                     void (*on_loaded)(void *ctx), void *ctx)
{
    if (plane == NULL || on_change == NULL || !bucket_ok(bucket)) {
        errno = EINVAL;
        return NULL;
    }
    struct kvi_nats_kv *k = kvi_xcalloc(1, sizeof *k);
    k->plane = plane;
    snprintf(k->bucket, sizeof k->bucket, "%s", bucket);
    k->on_change = on_change;
    k->on_loaded = on_loaded;
    k->ctx = ctx;
    pthread_mutex_init(&k->mu, NULL);
    int rc = pthread_create(&k->thread, NULL, watcher_main, k);
    if (rc != 0) {
        pthread_mutex_destroy(&k->mu);
        free(k);
        errno = rc;
        return NULL;
    }
    return k;
}

void kvi_nats_kv_close(struct kvi_nats_kv *k)
{
    if (k == NULL)
        return;
    atomic_store_explicit(&k->stop, true, memory_order_relaxed);
    pthread_join(k->thread, NULL);
    kvStore_Destroy(k->kv);
    jsCtx_Destroy(k->js);
    pthread_mutex_destroy(&k->mu);
    free(k);
}

bool kvi_nats_kv_loaded(const struct kvi_nats_kv *k)
{
    return atomic_load_explicit(&((struct kvi_nats_kv *)k)->loaded, memory_order_acquire); /* K1 */
}

enum wop { W_PUT, W_CREATE, W_DELETE };

static int write_key(struct kvi_nats_kv *k, const char *key, const void *value, size_t len, enum wop op)
{
    static const char *const names[] = {"put", "create", "delete"};
    if (!kvi_nats_kv_key_ok(key) || len > INT32_MAX)
        return -EINVAL;
    pthread_mutex_lock(&k->mu);
    natsStatus s = NATS_OK;
    int rc = 0;
    if (k->kv == NULL) {
        rc = -EAGAIN;
    } else if (op == W_DELETE) {
        s = kvStore_Delete(k->kv, key);
    } else if (op == W_PUT) {
        s = kvStore_Put(NULL, k->kv, key, value, (int)len);
    } else {
        s = kvStore_Create(NULL, k->kv, key, value, (int)len);
        if (s != NATS_OK) { /* taken, or the server did not answer: a live value says which */
            kvEntry *e = NULL;
            if (kvStore_Get(&e, k->kv, key) == NATS_OK) {
                rc = -EEXIST;
                s = NATS_OK;
            }
            kvEntry_Destroy(e);
        }
    }
    pthread_mutex_unlock(&k->mu);
    if (rc == 0 && s != NATS_OK) {
        kvi_log_warn("nats registry: %s of %s in %s failed: %s", names[op], key, k->bucket, natsStatus_GetText(s));
        rc = -EIO;
    }
    return rc;
}

int kvi_nats_kv_put(struct kvi_nats_kv *k, const char *key, const void *value, size_t len)
{
    return write_key(k, key, value, len, W_PUT);
}

int kvi_nats_kv_create(struct kvi_nats_kv *k, const char *key, const void *value, size_t len)
{
    return write_key(k, key, value, len, W_CREATE);
}

int kvi_nats_kv_delete(struct kvi_nats_kv *k, const char *key) { return write_key(k, key, NULL, 0, W_DELETE); }
