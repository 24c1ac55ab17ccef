/*
 * The NATS connection of a plane (net/nats_conn.h): options, a connect
 * retried forever, state kept by libnats' callbacks.
 */
#include "net/nats_conn.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "net/log.h"

static void on_connected(natsConnection *nc, void *closure)
{
    (void)nc;
    struct kvi_nats_conn *c = closure;
    atomic_store_explicit(&c->connected, true, memory_order_relaxed);
    kvi_log_info("nats: connected");
}

static void on_disconnected(natsConnection *nc, void *closure)
{
    (void)nc;
    struct kvi_nats_conn *c = closure;
    if (atomic_exchange_explicit(&c->connected, false, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&c->disconnects, 1, memory_order_relaxed);
        kvi_log_warn("nats: disconnected; reconnecting");
    }
}

static void on_reconnected(natsConnection *nc, void *closure)
{
    (void)nc;
    struct kvi_nats_conn *c = closure;
    atomic_store_explicit(&c->connected, true, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->reconnects, 1, memory_order_relaxed);
    kvi_log_info("nats: reconnected");
}

/* The last callback libnats makes for a connection (C1). */
static void on_closed(natsConnection *nc, void *closure)
{
    (void)nc;
    struct kvi_nats_conn *c = closure;
    pthread_mutex_lock(&c->mu);
    c->closed = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Backoff: reconnect_wait_ms doubling per attempt, at most 2 s. */
static int64_t reconnect_delay(natsConnection *nc, int attempts, void *closure)
{
    (void)nc;
    const struct kvi_nats_conn *c = closure;
    int64_t d = c->reconnect_wait_ms;
    for (int i = 1; i < attempts && d < 2000; i++)
        d *= 2;
    return d < 2000 ? d : 2000;
}

/* Split the comma-separated list into libnats' server array. */
static natsStatus set_servers(natsOptions *o, const char *list)
{
    char *copy = strdup(list);
    if (copy == NULL)
        return NATS_NO_MEMORY;
    const char *urls[64];
    int n = 0;
    char *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t != NULL && n < 64; t = strtok_r(NULL, ",", &save))
        if (*t != '\0')
            urls[n++] = t;
    natsStatus s = n > 0 ? natsOptions_SetServers(o, urls, n) : NATS_INVALID_ARG;
    free(copy);
    return s;
}

int kvi_nats_conn_open(struct kvi_nats_conn *c, const struct kvi_nats_config *cfg)
{
    c->reconnect_wait_ms = cfg->reconnect_wait_ms ? cfg->reconnect_wait_ms : KVI_NATS_DEFAULT_RECONNECT_WAIT_MS;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->closed = false;
    natsOptions *o = NULL;
    natsStatus s = natsOptions_Create(&o);
    const char *step = "options";
    if (s == NATS_OK && (step = "servers", s = set_servers(o, cfg->servers)) == NATS_OK &&
        (step = "reconnect", s = natsOptions_SetMaxReconnect(o, -1)) == NATS_OK &&
        (s = natsOptions_SetCustomReconnectDelay(o, reconnect_delay, c)) == NATS_OK &&
        (s = natsOptions_SetRetryOnFailedConnect(o, true, on_connected, c)) == NATS_OK &&
        (s = natsOptions_SetDisconnectedCB(o, on_disconnected, c)) == NATS_OK &&
        (s = natsOptions_SetReconnectedCB(o, on_reconnected, c)) == NATS_OK &&
        (s = natsOptions_SetClosedCB(o, on_closed, c)) == NATS_OK) {
        if (cfg->name != NULL && s == NATS_OK)
            s = natsOptions_SetName(o, cfg->name);
        if ((cfg->user != NULL || cfg->password != NULL) && s == NATS_OK)
            step = "user", s = natsOptions_SetUserInfo(o, cfg->user, cfg->password);
        if (cfg->token != NULL && s == NATS_OK)
            step = "token", s = natsOptions_SetToken(o, cfg->token);
        if (cfg->creds_file != NULL && s == NATS_OK)
            step = "creds", s = natsOptions_SetUserCredentialsFromFiles(o, cfg->creds_file, NULL);
        if (cfg->tls_ca != NULL && s == NATS_OK) {
            step = "tls";
            s = natsOptions_SetSecure(o, true);
            if (s == NATS_OK)
                s = natsOptions_LoadCATrustedCertificates(o, cfg->tls_ca);
        }
    }
    if (s == NATS_OK) {
        step = "connect";
        s = natsConnection_Connect(&c->nc, o);
        if (s == NATS_OK)
            atomic_store_explicit(&c->connected, true, memory_order_relaxed);
        else if (s == NATS_NOT_YET_CONNECTED) {
            kvi_log_warn("nats: no server answers at %s yet; retrying in the background", cfg->servers);
            s = NATS_OK;
        }
    }
    natsOptions_Destroy(o);
    if (s != NATS_OK) {
        kvi_log_error("nats: %s failed: %s (%s)", step, natsStatus_GetText(s), nats_GetLastError(NULL));
        c->nc = NULL;
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        return s == NATS_NO_MEMORY ? -ENOMEM : s == NATS_INVALID_ARG ? -EINVAL : -EIO;
    }
    return 0;
}

bool kvi_nats_conn_close(struct kvi_nats_conn *c)
{
    if (c->nc == NULL)
        return true;
    natsConnection_Close(c->nc);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&c->mu);
    while (!c->closed && pthread_cond_timedwait(&c->cv, &c->mu, &until) == 0) {
    }
    bool closed = c->closed;
    pthread_mutex_unlock(&c->mu);
    natsConnection_Destroy(c->nc);
    c->nc = NULL;
    if (!closed) {
        kvi_log_warn("nats: the connection's closed callback never came: its state is left allocated");
        return false;
    }
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    return true;
}

void kvi_nats_conn_read(struct kvi_nats_conn *c, struct kvi_nats_conn_info *out)
{
    memset(out, 0, sizeof *out);
    out->connected = atomic_load_explicit(&c->connected, memory_order_relaxed);
    out->reconnects = atomic_load_explicit(&c->reconnects, memory_order_relaxed);
    out->disconnects = atomic_load_explicit(&c->disconnects, memory_order_relaxed);
    if (c->nc != NULL && out->connected &&
        natsConnection_GetConnectedUrl(c->nc, out->url, sizeof out->url) != NATS_OK)
        out->url[0] = '\0';
}
