/*
 * The NATS connection of a plane (net/nats_source.h, CONNECTION): libnats
 * options from a struct kvi_nats_config, a connect that is retried forever
 * in the background, and the connection's state and counters, kept by
 * libnats' callbacks. Internal to net/nats_*.c.
 *
 * THREADS: open and close on the control plane; the callbacks run on
 * libnats' threads and only touch the atomics below; readers load them
 * relaxed.
 */
#ifndef KVI_NET_NATS_CONN_H
#define KVI_NET_NATS_CONN_H

#include <nats/nats.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "net/nats_source.h"

struct kvi_nats_conn {
    natsConnection *nc;
    uint32_t reconnect_wait_ms;
    _Atomic bool connected;
    _Atomic uint64_t reconnects;
    _Atomic uint64_t disconnects;
    /* libnats runs its connection callbacks on a thread of its own, after the
     * call that caused them may have returned: close waits for the closed
     * callback, the last one, before this struct may go (C1) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool closed;
};

/**
 * Connect @p c per @p cfg: returns at once when no server answers yet
 * (libnats keeps trying). @return 0, -EINVAL (a URL or option libnats
 * rejects: logged), -ENOMEM, -EIO (logged).
 */
int kvi_nats_conn_open(struct kvi_nats_conn *c, const struct kvi_nats_config *cfg);

/**
 * Close and free the connection, waiting (up to 10 s) for libnats' closed
 * callback, after which no callback touches @p c. @return true when @p c
 * may be freed; false (logged) when the callback never came: the caller
 * must then leave @p c allocated.
 */
bool kvi_nats_conn_close(struct kvi_nats_conn *c);

/** The plane's libnats connection (net/nats_source.c), for the other net/nats_*.c files. */
natsConnection *kvi_nats__connection(struct kvi_nats *n);

/** Connection state into @p out. Any thread. */
void kvi_nats_conn_read(struct kvi_nats_conn *c, struct kvi_nats_conn_info *out);

#endif
