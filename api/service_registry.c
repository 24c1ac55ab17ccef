/*
 * Registrations shared by a fleet (--nats-registry BUCKET, issue 21 §1):
 * every /register and /unregister of either dialect a replica accepts is written to a
 * JetStream Key-Value bucket (net/nats_kv.h), and every replica applies
 * what the bucket holds, so a registration made through any replica opens
 * listeners on all of them.
 *
 * KEYS AND VALUES
 *   NATS sources added through POST /nats/sources:
 *   `nats.<c|s>.<hex subject or stream>.<hex filter subject, or ->.<hex model>.<hex tenant>`, the
 *   value the request's fields as JSON; stored before the source starts here, run by every replica
 *   that does not run it yet (sources are never removed).
 *   One key per Dynamo registration (model, tenant, instance, rank):
 *   `dyn.<hex model>.<hex tenant>.<instance_id>.<dp_rank>` (names in lower
 *   case hex: a KV key allows [-/_=.A-Za-z0-9] only). The value is the
 *   registration as it was accepted, as JSON: instance_id, endpoint,
 *   model_name, tenant_id, block_size, dp_rank, and replay_endpoint when
 *   given.
 *   One key per Conductor service key (instance|tenant|rank, http-api.md
 *   §2.2; the model is in the value): `cond.<hex instance>.<hex
 *   tenant>.<dp_rank>`, the instance being the endpoint for a Mooncake
 *   master registered without an instance_id. The value is the registration
 *   as accepted, as a Conductor /register JSON body: endpoint, type (its
 *   canonical spelling), modelname, tenant_id, block_size, dp_rank, and when
 *   given instance_id, replay_endpoint, lora_name, additionalsalt,
 *   cache_group (0) and hash_profile (its five members, "" when absent).
 *
 * ORDER OF THINGS
 *   /register: validated and applied here first (the same 400 / 409 / 503
 *   rules as without a registry), then created in the bucket only if its key
 *   holds no value (the bucket's revision check), so of two replicas racing
 *   to register one rank, one wins and the other undoes its local
 *   registration and answers 409 as for a rank taken (Conductor: 400
 *   invalid_registration, its answer for a service key registered with other
 *   values; an identical re-registration finding its own key is the no-op it
 *   is without a registry); a store that fails
 *   otherwise undoes it and answers 503. /unregister (both dialects): the
 *   keys are deleted first (a failure answers 503 and changes nothing),
 *   then the registration goes here. Every change the bucket reports
 *   (the current values at start-up first) is applied on the control
 *   thread: a value this replica holds already is left as it is (so its own
 *   writes come back as no-ops), another endpoint for a held rank (other
 *   values for a held Conductor service key) replaces it, a delete drops the
 *   rank (the service key).
 *   Not ordered across keys: two Conductor keys racing for one endpoint are
 *   both stored, and a replica that holds one refuses the other (logged:
 *   "conflicting active registration for endpoint"). The listeners' gate opens only once the
 *   bucket's current values are applied, and /ready says
 *   `registry_loading` until then.
 *
 * THREADS: the bucket's watcher posts each change to the control thread;
 * everything else here runs on the control thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/nats_args.h"
#include "api/service_internal.h"
#include "net/log.h"
#include "net/nats_kv.h"

#define KEY_MAX 1024

/* Lower-case hex of s into out. @return the end of what was written. */
static char *hex_put(char *out, struct kvi_str s)
{
    return kvi_hex_lower(out, s.p, s.len);
}

/* `dyn.<hex model>.<hex tenant>.<id>.<rank>` into out (KEY_MAX). @return false when too long. */
static bool dyn_key(char *out, struct kvi_str model, struct kvi_str tenant, uint64_t id, uint32_t rank)
{
    if (4 + 2 * model.len + 1 + 2 * tenant.len + 48 > KEY_MAX)
        return false;
    memcpy(out, "dyn.", 4);
    char *k = hex_put(out + 4, model);
    *k++ = '.';
    k = hex_put(k, tenant);
    snprintf(k, KEY_MAX - (size_t)(k - out), ".%" PRIu64 ".%" PRIu32, id, rank);
    return true;
}

/* `cond.<hex instance>.<hex tenant>.<rank>` into out (KEY_MAX). @return false when too long. */
static bool cond_key(char *out, struct kvi_str inst, struct kvi_str tenant, uint32_t rank)
{
    if (5 + 2 * inst.len + 1 + 2 * tenant.len + 24 > KEY_MAX)
        return false;
    memcpy(out, "cond.", 5);
    char *k = hex_put(out + 5, inst);
    *k++ = '.';
    k = hex_put(k, tenant);
    snprintf(k, KEY_MAX - (size_t)(k - out), ".%" PRIu32, rank);
    return true;
}

/* Store the JSON value in @p b under @p key (create: only if the key holds no value), then free @p b.
 * @return 0, -ENOMEM (the value could not be built), or kvi_nats_kv_create's / _put's error. */
static int store_json(struct kvi_service *svc, const char *key, struct kvi_buf *b, bool create)
{
    int rc = !kvi_buf_ok(b) ? -ENOMEM
             : create       ? kvi_nats_kv_create(svc->registry, key, b->data, b->len)
                            : kvi_nats_kv_put(svc->registry, key, b->data, b->len);
    kvi_buf_free(b);
    return rc;
}

bool kvi_svc__registry_on(const struct kvi_service *svc) { return svc->registry != NULL; /* control thread */ }

int kvi_svc__registry_put_dyn(struct kvi_service *svc, const struct kvi_dyn_register *r)
{
    char key[KEY_MAX];
    if (!dyn_key(key, r->model_name, r->tenant_id, r->instance_id, r->dp_rank))
        return -EINVAL;
    struct kvi_buf b;
    kvi_buf_init(&b);
    struct kvi_wr w;
    kvi_wr_init(&w, &b, KVI_ENC_JSON);
    kvi_wr_obj(&w, 6 + r->has_replay + r->has_capacity);
    kvi_wr_keyz(&w, "instance_id");
    kvi_wr_u64(&w, r->instance_id);
    kvi_wr_keyz(&w, "endpoint");
    kvi_wr_str(&w, r->endpoint.p, r->endpoint.len);
    kvi_wr_keyz(&w, "model_name");
    kvi_wr_str(&w, r->model_name.p, r->model_name.len);
    kvi_wr_keyz(&w, "tenant_id");
    kvi_wr_str(&w, r->tenant_id.p, r->tenant_id.len);
    kvi_wr_keyz(&w, "block_size");
    kvi_wr_u64(&w, r->block_size);
    kvi_wr_keyz(&w, "dp_rank");
    kvi_wr_u64(&w, r->dp_rank);
    if (r->has_replay) {
        kvi_wr_keyz(&w, "replay_endpoint");
        kvi_wr_str(&w, r->replay_endpoint.p, r->replay_endpoint.len);
    }
    if (r->has_capacity) {
        kvi_wr_keyz(&w, "capacity_blocks");
        kvi_wr_u64(&w, r->capacity_blocks);
    }
    kvi_wr_end(&w);
    return store_json(svc, key, &b, true);
}

int kvi_svc__registry_del_dyn(struct kvi_service *svc, struct kvi_str model, struct kvi_str tenant, uint64_t id,
                              uint32_t rank)
{
    char key[KEY_MAX];
    if (!dyn_key(key, model, tenant, id, rank))
        return -EINVAL;
    return kvi_nats_kv_delete(svc->registry, key);
}

int kvi_svc__registry_put_cond(struct kvi_service *svc, const struct kvi_cond_register *r)
{
    struct kvi_str inst = r->has_instance ? r->instance_id : r->endpoint;
    char key[KEY_MAX];
    if (!cond_key(key, inst, r->tenant_id, r->dp_rank))
        return -EINVAL;
    struct kvi_buf b;
    kvi_buf_init(&b);
    struct kvi_wr w;
    kvi_wr_init(&w, &b, KVI_ENC_JSON);
    kvi_wr_obj(&w, 6 + r->has_instance + (r->replay_endpoint.len > 0) + (r->lora_name.len > 0) +
                       (r->additional_salt.len > 0) + r->has_cache_group + r->has_hash_profile);
    kvi_wr_keyz(&w, "endpoint");
    kvi_wr_str(&w, r->endpoint.p, r->endpoint.len);
    kvi_wr_keyz(&w, "type");
    kvi_wr_strz(&w, kvi_cond_type_name(r->type));
    kvi_wr_keyz(&w, "modelname");
    kvi_wr_str(&w, r->model_name.p, r->model_name.len);
    kvi_wr_keyz(&w, "tenant_id");
    kvi_wr_str(&w, r->tenant_id.p, r->tenant_id.len);
    kvi_wr_keyz(&w, "block_size");
    kvi_wr_u64(&w, r->block_size);
    kvi_wr_keyz(&w, "dp_rank");
    kvi_wr_u64(&w, r->dp_rank);
    const struct {
        const char *name;
        struct kvi_str v;
    } opt[] = {{"instance_id", r->has_instance ? r->instance_id : (struct kvi_str){"", 0}},
               {"replay_endpoint", r->replay_endpoint},
               {"lora_name", r->lora_name},
               {"additionalsalt", r->additional_salt}};
    for (size_t i = 0; i < sizeof opt / sizeof opt[0]; i++)
        if (opt[i].v.len > 0) {
            kvi_wr_keyz(&w, opt[i].name);
            kvi_wr_str(&w, opt[i].v.p, opt[i].v.len);
        }
    if (r->has_cache_group) {
        kvi_wr_keyz(&w, "cache_group");
        kvi_wr_u64(&w, 0);
    }
    if (r->has_hash_profile) {
        const struct kvi_hash_profile *hp = &r->hash_profile;
        const char *names[] = {"strategy", "algorithm", "python_hash_seed", "root_digest", "index_projection"};
        const struct kvi_str vals[] = {hp->strategy, hp->algorithm, hp->python_hash_seed, hp->root_digest,
                                       hp->index_projection};
        kvi_wr_keyz(&w, "hash_profile");
        kvi_wr_obj(&w, 5);
        for (size_t i = 0; i < 5; i++) {
            kvi_wr_keyz(&w, names[i]);
            kvi_wr_str(&w, vals[i].p != NULL ? vals[i].p : "", vals[i].len);
        }
        kvi_wr_end(&w);
    }
    kvi_wr_end(&w);
    return store_json(svc, key, &b, true);
}

int kvi_svc__registry_del_cond(struct kvi_service *svc, struct kvi_str inst, struct kvi_str tenant, uint32_t rank)
{
    char key[KEY_MAX];
    if (!cond_key(key, inst, tenant, rank))
        return -EINVAL;
    return kvi_nats_kv_delete(svc->registry, key);
}

int kvi_svc__registry_put_source(struct kvi_service *svc, const struct kvi_dyn_nats_source *r)
{
    bool core = r->stream.len == 0;
    struct kvi_str name = core ? r->subject : r->stream;
    if (5 + 2 * (name.len + r->subject.len + r->model_name.len + r->tenant_id.len) + 8 > KEY_MAX)
        return -EINVAL;
    char key[KEY_MAX];
    char *k = key;
    memcpy(k, core ? "nats.c." : "nats.s.", 7);
    k = hex_put(k + 7, name);
    *k++ = '.';
    if (!core && r->subject.len > 0)
        k = hex_put(k, r->subject);
    else
        *k++ = '-'; /* no filter subject (a key's tokens may not be empty) */
    *k++ = '.';
    k = hex_put(k, r->model_name);
    *k++ = '.';
    k = hex_put(k, r->tenant_id);
    *k = '\0';
    if (key[k - key - 1] == '.') /* (an empty tenant cannot end a key) */
        return -EINVAL;
    struct kvi_buf b;
    kvi_buf_init(&b);
    struct kvi_wr w;
    kvi_wr_init(&w, &b, KVI_ENC_JSON);
    kvi_wr_obj(&w, (core ? 1 : 1 + (r->subject.len > 0)) + 3);
    if (core || r->subject.len > 0) {
        kvi_wr_keyz(&w, "subject");
        kvi_wr_str(&w, r->subject.p, r->subject.len);
    }
    if (!core) {
        kvi_wr_keyz(&w, "stream");
        kvi_wr_str(&w, r->stream.p, r->stream.len);
    }
    kvi_wr_keyz(&w, "model_name");
    kvi_wr_str(&w, r->model_name.p, r->model_name.len);
    kvi_wr_keyz(&w, "tenant_id");
    kvi_wr_str(&w, r->tenant_id.p, r->tenant_id.len);
    kvi_wr_keyz(&w, "block_size");
    kvi_wr_u64(&w, r->block_size);
    kvi_wr_end(&w);
    return store_json(svc, key, &b, false);
}

/* A NATS source another replica stored: run it here too (sources are not removed). */
static void apply_source(struct kvi_service *svc, const char *key, const char *value, size_t len)
{
    struct kvi_scratch s;
    kvi_scratch_init(&s);
    struct kvi_dyn_nats_source r;
    struct kvi_api_err err;
    if (kvi_dyn_parse_nats_source(value, len, KVI_CT_JSON, &s, &r, &err) != 0)
        kvi_log_warn("nats registry: value of %s is not a NATS source: ignored", key);
    else if (kvi_svc__nats_source(svc, &r, true, &err) != 0)
        kvi_log_warn("nats registry: NATS source %s not added here: %s", key, err.msg);
    kvi_scratch_free(&s);
}

/* ---- changes from the bucket (control thread) ---------------------------------------------------- */

/* One change, key and value in one block (a post the control thread never
 * runs, at shutdown, is freed whole by kvi_service_destroy). */
struct reg_change {
    enum kvi_kv_op op;
    size_t len;   /* value bytes */
    char *value;  /* into data, after the key */
    char key[];   /* NUL-terminated, then the value, NUL-terminated */
};

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Decode two hex names ending in '.' from *p into a and b (KEY_MAX / 2 each, NUL-terminated); *p moves
 * past them. @return false when malformed. */
static bool parse_names(const char **p, char *a, char *b)
{
    char *outs[2] = {a, b};
    for (int f = 0; f < 2; f++) {
        size_t k = 0;
        while (**p != '.') {
            int hi = hexval((*p)[0]), lo = hi < 0 ? -1 : hexval((*p)[1]);
            if (lo < 0 || k + 1 >= KEY_MAX / 2)
                return false;
            outs[f][k++] = (char)(hi << 4 | lo);
            *p += 2;
        }
        outs[f][k] = '\0';
        (*p)++;
    }
    return true;
}

/* A decimal rank ending the key. */
static bool parse_rank(const char *p, uint32_t *rank)
{
    char *end;
    unsigned long r = strtoul(p, &end, 10);
    if (end == p || *end != '\0' || r > UINT32_MAX)
        return false;
    *rank = (uint32_t)r;
    return true;
}

/* Decode `dyn.<hex>.<hex>.<id>.<rank>`: the names into m and t (NUL-terminated). */
static bool parse_key(const char *key, char *m, char *t, uint64_t *id, uint32_t *rank)
{
    const char *p = key + 4;
    if (strncmp(key, "dyn.", 4) != 0 || !parse_names(&p, m, t))
        return false;
    char *end;
    unsigned long long v = strtoull(p, &end, 10);
    if (*end != '.' || !parse_rank(end + 1, rank))
        return false;
    *id = v;
    return true;
}

/* A change of a `cond.<hex instance>.<hex tenant>.<rank>` key: applied here, never written back. */
static void apply_cond(struct kvi_service *svc, const struct reg_change *c)
{
    char inst[KEY_MAX / 2], t[KEY_MAX / 2];
    uint32_t rank;
    const char *p = c->key + 5;
    if (!parse_names(&p, inst, t) || !parse_rank(p, &rank)) {
        kvi_log_warn("nats registry: key %s is not a kvidx registration: ignored", c->key);
        return;
    }
    struct kvi_str is = {inst, strlen(inst)}, ts = {t, strlen(t)};
    if (c->op == KVI_KV_DELETE) {
        kvi_svc__cond_drop_key(svc, is, ts, rank);
        return;
    }
    struct kvi_scratch s;
    kvi_scratch_init(&s);
    struct kvi_cond_register r;
    struct kvi_api_err err;
    if (kvi_cond_parse_register(c->value, c->len, KVI_CT_JSON, &s, &r, &err) != 0 || r.dp_rank != rank ||
        !kvi_str_eq(r.has_instance ? r.instance_id : r.endpoint, inst) || !kvi_str_eq(r.tenant_id, t))
        kvi_log_warn("nats registry: value of %s is not the registration its key names: ignored", c->key);
    else if (kvi_svc__cond_apply(svc, &r, &err) != 0)
        kvi_log_warn("nats registry: service %s|%s|%" PRIu32 " not applied here: %s", inst, t, rank, err.msg);
    kvi_scratch_free(&s);
}

static void apply_change(struct kvi_service *svc, void *arg)
{
    struct reg_change *c = arg;
    char m[KEY_MAX / 2], t[KEY_MAX / 2];
    uint64_t id;
    uint32_t rank;
    if (strncmp(c->key, "nats.", 5) == 0) {
        if (c->op == KVI_KV_PUT)
            apply_source(svc, c->key, c->value, c->len);
        goto out;
    }
    if (strncmp(c->key, "cond.", 5) == 0) {
        apply_cond(svc, c);
        goto out;
    }
    if (!parse_key(c->key, m, t, &id, &rank)) {
        kvi_log_warn("nats registry: key %s is not a kvidx registration: ignored", c->key);
        goto out;
    }
    struct kvi_str ms = {m, strlen(m)}, ts = {t, strlen(t)};
    const char *held = kvi_svc__dyn_held(svc, id, ms, ts, rank);
    if (c->op == KVI_KV_DELETE) {
        if (held != NULL) {
            kvi_svc__dyn_drop_rank(svc, id, rank);
            kvi_log_info("nats registry: instance %" PRIu64 " dp_rank %" PRIu32 " of %s:%s unregistered elsewhere",
                         id, rank, m, t);
        }
        goto out;
    }
    struct kvi_scratch s;
    kvi_scratch_init(&s);
    struct kvi_dyn_register r;
    struct kvi_api_err err;
    if (kvi_dyn_parse_register(c->value, c->len, KVI_CT_JSON, &s, &r, &err) != 0 || r.instance_id != id ||
        r.dp_rank != rank || !kvi_str_eq(r.model_name, m) || !kvi_str_eq(r.tenant_id, t)) {
        kvi_log_warn("nats registry: value of %s is not the registration its key names: ignored", c->key);
    } else if (held == NULL || !kvi_str_eq(r.endpoint, held)) {
        if (held != NULL)
            kvi_svc__dyn_drop_rank(svc, id, rank); /* re-registered elsewhere with another endpoint */
        if (kvi_svc__dyn_register(svc, id, r.model_name, r.tenant_id, r.block_size, r.dp_rank, r.endpoint,
                                  r.replay_endpoint, r.has_replay, false, &err) != 0)
            kvi_log_warn("nats registry: instance %" PRIu64 " dp_rank %" PRIu32 " of %s:%s not applied here: %s", id,
                         rank, m, t, err.msg);
        else if (r.has_capacity)
            kvi_svc__dyn_capacity(svc, id, rank, r.capacity_blocks);
    }
    kvi_scratch_free(&s);
out:
    free(c);
}

/* Watcher thread: hand the change to the control thread. */
static void on_change(void *ctx, enum kvi_kv_op op, const char *key, const void *value, size_t len, uint64_t rev)
{
    (void)rev;
    struct kvi_service *svc = ctx;
    size_t kl = strlen(key);
    struct reg_change *c = kvi_xmalloc(sizeof *c + kl + 1 + len + 1);
    c->op = op;
    c->len = len;
    memcpy(c->key, key, kl + 1);
    c->value = c->key + kl + 1;
    if (len > 0)
        memcpy(c->value, value, len);
    c->value[len] = '\0';
    if (kvi_service_post(svc, apply_change, c) != 0) /* shutting down */
        free(c);
}

static void loaded_ctl(struct kvi_service *svc, void *arg)
{
    (void)arg;
    if (!atomic_load(&svc->registry_loaded))
        kvi_log_info("nats registry: %s applied; the gate may open", svc->cfg.nats->registry);
    atomic_store(&svc->registry_loaded, true);
    kvi_svc__maybe_open_gate(svc);
}

/* Watcher thread: the current values are posted; applied in order before this. */
static void on_loaded(void *ctx)
{
    struct kvi_service *svc = ctx;
    if (kvi_service_post(svc, loaded_ctl, NULL) != 0)
        return;
}

void kvi_svc__registry_open(struct kvi_service *svc, struct kvi_nats *n)
{
    const struct kvi_nats_args *a = svc->cfg.nats;
    if (a == NULL || a->registry == NULL || n == NULL)
        return;
    svc->registry = kvi_nats_kv_open(n, a->registry, on_change, on_loaded, svc);
    if (svc->registry == NULL)
        kvi_log_error("nats registry: cannot watch bucket %s: %s", a->registry, strerror(errno));
    else
        atomic_store(&svc->registry_active, true);
}

void kvi_svc__registry_close(struct kvi_service *svc)
{
    kvi_nats_kv_close(svc->registry);
    svc->registry = NULL;
}
