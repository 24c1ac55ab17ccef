/* ctest-labels: unit */
/*
 * api/service.h without HTTP: the control thread (posts made before start
 * wait for it, posts after stop get -ESHUTDOWN, order is kept), Dynamo and
 * Conductor registrations through the kvi_service_ctl_* calls (namespaces
 * created and deleted with their registrations, the Conductor roster read
 * through RCU), and readiness with the minimum-workers gate.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/service.h"
#include "engine/rcu.h"
#include "net/log.h"

struct step {
    int *log;
    int *n;
    int id;
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
};

static void record(struct kvi_service *svc, void *arg)
{
    (void)svc;
    struct step *s = arg;
    pthread_mutex_lock(s->mu);
    s->log[(*s->n)++] = s->id;
    pthread_cond_broadcast(s->cv);
    pthread_mutex_unlock(s->mu);
    free(s);
}

static struct kvi_service *svc_new(uint64_t min_workers)
{
    struct kvi_service_config cfg = {.writer_threads = 2, .min_initial_workers = min_workers, .listeners_quiet = true};
    struct kvi_service *svc = kvi_service_create(&cfg);
    assert_non_null(svc);
    return svc;
}

static void test_post_order_and_shutdown(void **state)
{
    (void)state;
    struct kvi_service *svc = svc_new(0);
    int log[8], n = 0;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    for (int i = 0; i < 4; i++) {
        struct step *s = malloc(sizeof *s);
        *s = (struct step){log, &n, i, &mu, &cv};
        assert_int_equal(kvi_service_post(svc, record, s), 0); /* before start: queued */
    }
    assert_int_equal(n, 0);
    assert_int_equal(kvi_service_start(svc), 0);
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 20;
    pthread_mutex_lock(&mu);
    while (n < 4 && pthread_cond_timedwait(&cv, &mu, &dl) == 0)
        ;
    pthread_mutex_unlock(&mu);
    assert_int_equal(n, 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(log[i], i);
    assert_int_equal(kvi_service_stop(svc, 0), 0);
    assert_true(kvi_service_stopping(svc));
    struct step s = {log, &n, 9, &mu, &cv};
    assert_int_equal(kvi_service_post(svc, record, &s), -ESHUTDOWN);
    kvi_service_destroy(svc);
}

/* Runs registrations on the control thread and reports back. */
struct ctl_case {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int rc[8];
    struct kvi_api_err err[8];
};

static struct kvi_str S(const char *s)
{
    return (struct kvi_str){s, strlen(s)};
}

static void run_registrations(struct kvi_service *svc, void *arg)
{
    struct ctl_case *c = arg;
    struct kvi_dyn_register r = {.instance_id = 5, .endpoint = S("tcp://127.0.0.1:5999"), .model_name = S("m"),
                                 .tenant_id = S("default"), .block_size = 16};
    c->rc[0] = kvi_service_ctl_dyn_register(svc, &r, &c->err[0]);
    r.block_size = 32;
    r.instance_id = 6;
    c->rc[1] = kvi_service_ctl_dyn_register(svc, &r, &c->err[1]);
    struct kvi_cond_register cr = {.endpoint = S("tcp://127.0.0.1:5998"), .type = KVI_COND_VLLM,
                                   .model_name = S("cm"), .lora_name = S(""), .tenant_id = S("default"),
                                   .instance_id = S("node-x"), .additional_salt = S(""), .block_size = 8,
                                   .dp_rank = 1, .has_instance = true};
    c->rc[2] = kvi_service_ctl_cond_register(svc, &cr, &c->err[2]);
    cr.dp_rank = 0;
    cr.endpoint = S("tcp://127.0.0.1:5997");
    c->rc[3] = kvi_service_ctl_cond_register(svc, &cr, &c->err[3]);
    pthread_mutex_lock(&c->mu);
    c->done = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void run_unregistrations(struct kvi_service *svc, void *arg)
{
    struct ctl_case *c = arg;
    struct kvi_dyn_unregister u = {.instance_id = 5, .model_name = S("m")};
    c->rc[4] = kvi_service_ctl_dyn_unregister(svc, &u, &c->err[4]);
    c->rc[5] = kvi_service_ctl_dyn_unregister(svc, &u, &c->err[5]);
    struct kvi_cond_unregister cu = {.instance_id = S("node-x"), .tenant_id = S("default"), .dp_rank = 0};
    struct kvi_cond_key key;
    c->rc[6] = kvi_service_ctl_cond_unregister(svc, &cu, &key, &c->err[6]);
    cu.dp_rank = 1;
    c->rc[7] = kvi_service_ctl_cond_unregister(svc, &cu, &key, &c->err[7]);
    pthread_mutex_lock(&c->mu);
    c->done = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void wait_done(struct ctl_case *c)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 20;
    pthread_mutex_lock(&c->mu);
    while (!c->done && pthread_cond_timedwait(&c->cv, &c->mu, &dl) == 0)
        ;
    assert_true(c->done);
    c->done = false;
    pthread_mutex_unlock(&c->mu);
}

static void test_registrations(void **state)
{
    (void)state;
    kvi_rcu_register_thread();
    struct kvi_service *svc = svc_new(2);
    assert_int_equal(kvi_service_start(svc), 0);
    struct ctl_case c = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    assert_int_equal(kvi_service_post(svc, run_registrations, &c), 0);
    wait_done(&c);
    assert_int_equal(c.rc[0], 0);
    assert_int_equal(c.rc[1], -EINVAL);
    assert_int_equal(c.err[1].status, 409);
    assert_string_equal(c.err[1].msg, "block_size mismatch for model=m tenant=default: existing=16, requested=32");
    assert_int_equal(c.rc[2], 0);
    assert_int_equal(c.rc[3], 0);

    struct kvi_service_counts n;
    kvi_service_counts(svc, &n);
    assert_int_equal(n.workers, 2); /* instance 5 and node-x */
    assert_int_equal(n.services, 2);
    struct kvi_status_view st;
    kvi_service_status(svc, &st); /* two instances registered: the gate of 2 opened */
    assert_int_equal(st.registered, 2);
    assert_string_equal(st.reason, "ready");

    kvi_rcu_read_lock();
    const struct kvi_svc_cond_ctx *x = kvi_service_cond_find(svc, S("cm"), S("default"), S(""), 8);
    assert_non_null(x);
    assert_int_equal(x->n_inst, 1);
    assert_string_equal(x->inst[0].name, "node-x");
    assert_int_equal(x->inst[0].n_ranks, 2);
    assert_int_equal(x->inst[0].ranks[0], 0);
    assert_int_equal(x->inst[0].ranks[1], 1);
    assert_null(kvi_service_cond_find(svc, S("cm"), S("default"), S("lora"), 8));
    assert_null(kvi_service_cond_find(svc, S("cm"), S("default"), S(""), 16));
    assert_non_null(kvi_nsreg_find(kvi_service_nsreg(svc), "m", "default"));
    kvi_rcu_read_unlock();

    assert_int_equal(kvi_service_post(svc, run_unregistrations, &c), 0);
    wait_done(&c);
    assert_int_equal(c.rc[4], 0);
    assert_int_equal(c.rc[5], -EINVAL);
    assert_int_equal(c.err[5].status, 404);
    assert_string_equal(c.err[5].msg, "instance 5 not found");
    assert_int_equal(c.rc[6], 0);
    assert_int_equal(c.rc[7], 0);
    kvi_rcu_read_lock();
    assert_null(kvi_nsreg_find(kvi_service_nsreg(svc), "m", "default")); /* gone with its last instance */
    assert_null(kvi_nsreg_find(kvi_service_nsreg(svc), "cm", "default"));
    assert_null(kvi_service_cond_find(svc, S("cm"), S("default"), S(""), 8));
    kvi_rcu_read_unlock();
    kvi_service_counts(svc, &n);
    assert_int_equal(n.workers, 0);
    assert_int_equal(n.models, 0);
    assert_int_equal(kvi_service_stop(svc, 0), 0);
    kvi_service_destroy(svc);
    kvi_rcu_unregister_thread();
}

int main(void)
{
    kvi_log_set_level(getenv("KVI_TEST_VERBOSE") ? KVI_LOG_DEBUG : KVI_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_post_order_and_shutdown),
        cmocka_unit_test(test_registrations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
