/*
 * The route table of the indexer port (api/routes_common.h): its creation,
 * the loop threads' scratch (the kvi_http_options thread hooks), mounting
 * the shared paths and both dialects' own routes, and freeing it.
 */
#include "api/routes_internal.h"

#include <stdlib.h>
#include <string.h>

#include "engine/common.h"

struct kvi_routes *kvi_routes_create(struct kvi_service *svc, const struct kvi_routes_config *cfg, unsigned n_threads)
{
    struct kvi_routes *rt = kvi_xcalloc(1, sizeof *rt);
    rt->svc = svc;
    rt->cfg = *cfg;
    if (rt->cfg.body_limit == 0)
        rt->cfg.body_limit = KVI_ROUTES_DEFAULT_BODY_LIMIT;
    if (rt->cfg.query_body_limit == 0)
        rt->cfg.query_body_limit = KVI_ROUTES_DEFAULT_QUERY_LIMIT;
    rt->n_threads = n_threads ? n_threads : 1;
    rt->threads = kvi_xcalloc(rt->n_threads, sizeof *rt->threads);
    rt->hists = aligned_alloc(KVI_CACHE_LINE, (size_t)rt->n_threads * KVI_QK_COUNT * sizeof *rt->hists);
    if (rt->hists == NULL)
        kvi_die("out of memory");
    memset(rt->hists, 0, (size_t)rt->n_threads * KVI_QK_COUNT * sizeof *rt->hists);
    rt->metrics_route = -1;
    return rt;
}

void *kvi_routes_thread_init(unsigned thread, void *ud)
{
    struct kvi_routes *rt = ud;
    KVI_ASSERT(thread < rt->n_threads);
    struct kvi_route_thread *t = &rt->threads[thread];
    t->idx = thread;
    kvi_scratch_init(&t->scratch);
    kvi_buf_init(&t->out);
    t->hist = &rt->hists[(size_t)thread * KVI_QK_COUNT];
    kvi_routes_reserve(t, 1024, 256, 256);
    return t;
}

void kvi_routes_thread_fini(unsigned thread, void *thread_ctx, void *ud)
{
    (void)thread;
    (void)ud;
    struct kvi_route_thread *t = thread_ctx;
    kvi_scratch_free(&t->scratch);
    kvi_buf_free(&t->out);
    free(t->hashes);
    free(t->tm);
    free(t->rows);
    t->hashes = NULL;
    t->tm = NULL;
    t->rows = NULL;
    t->hashes_cap = t->tm_cap = t->rows_cap = 0;
}

void kvi_routes_free(struct kvi_routes *rt)
{
    if (rt == NULL)
        return;
    free(rt->threads);
    free(rt->hists);
    free(rt);
}

int kvi_routes_mount(struct kvi_routes *rt, struct kvi_http_server *srv)
{
    rt->srv = srv;
    int rc;
    if ((rc = kvi_routes_shared_mount(rt, srv)) < 0)
        return rc;
    if ((rc = kvi_routes_dyn_mount(rt, srv)) < 0)
        return rc;
    return kvi_routes_cond_mount(rt, srv);
}
