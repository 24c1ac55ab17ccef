/*
 * The service's peer list (POST /register_peer, /deregister_peer, GET /peers;
 * the startup's --peers are added once recovery is over).
 *
 * DESIGN (the whole service: api/service.h)
 *   Any thread: every call takes `mu` for the whole of its work.
 */
#include "api/service_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "engine/common.h"

/* ---- peers ------------------------------------------------------------------------------- */

static ssize_t peer_index_locked(struct kvi_service *svc, const char *url, size_t len)
{
    for (size_t i = 0; i < svc->n_peers; i++)
        if (strlen(svc->peers[i]) == len && memcmp(svc->peers[i], url, len) == 0)
            return (ssize_t)i;
    return -1;
}

void kvi_service_peer_add(struct kvi_service *svc, const char *url, size_t len)
{
    pthread_mutex_lock(&svc->mu);
    if (peer_index_locked(svc, url, len) < 0) {
        if (svc->n_peers == svc->cap_peers) {
            svc->cap_peers = svc->cap_peers ? svc->cap_peers * 2 : 4;
            svc->peers = kvi_xrealloc(svc->peers, svc->cap_peers * sizeof(char *));
        }
        svc->peers[svc->n_peers++] = xstrndup(url, len);
    }
    pthread_mutex_unlock(&svc->mu);
}

int kvi_service_peer_remove(struct kvi_service *svc, const char *url, size_t len)
{
    pthread_mutex_lock(&svc->mu);
    ssize_t i = peer_index_locked(svc, url, len);
    if (i >= 0) {
        free(svc->peers[i]);
        memmove(&svc->peers[i], &svc->peers[i + 1], (svc->n_peers - (size_t)i - 1) * sizeof(char *));
        svc->n_peers--;
    }
    pthread_mutex_unlock(&svc->mu);
    return i >= 0 ? 0 : -ENOENT;
}

int kvi_service_encode_peers(struct kvi_service *svc, struct kvi_buf *out)
{
    pthread_mutex_lock(&svc->mu);
    int rc = kvi_dyn_encode_peers((const char *const *)svc->peers, svc->n_peers, out);
    pthread_mutex_unlock(&svc->mu);
    return rc;
}
