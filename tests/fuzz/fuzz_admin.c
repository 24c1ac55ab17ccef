/*
 * Fuzz target: the Dynamo-dialect admin request parsers that fuzz_codec's
 * 16-op selector has no room for: POST /nats/sources
 * (kvi_dyn_parse_nats_source, also what every replica parses back from the
 * --nats-registry bucket), POST /zmq/bind and /zmq/unbind
 * (kvi_dyn_parse_zbind).
 *
 * INPUT: byte 0 selects what runs, the rest is the body.
 *   bits 0-1  the parser: 0 nats source, 1 zmq bind, 2 zmq unbind, 3 all three
 *   bits 4-5  the Content-Type class (KVI_CT_NONE, JSON, MSGPACK, OTHER)
 *
 * CHECKS (besides ASan + UBSan):
 *   - the return is 0 or -EINVAL;
 *   - failure: a documented Dynamo status (400, 415, 422), a message, and
 *     an answer (kvi_err_encode) that kvidx's strict reader accepts whole in
 *     both encodings; anything but a JSON Content-Type is 415;
 *   - success: the documented guarantees: a nats source has a model name, a
 *     block size > 0, and a subject or a stream; a bind has a non-empty
 *     endpoint (an unbind no block size); every string is readable in full;
 *   - determinism: parsing again after kvi_scratch_reset gives the same
 *     result.
 */
#include <errno.h>

#include "api/codec.h"
#include "fuzz.h"
#include "fuzz_body.h"

enum op { OP_NATS_SOURCE, OP_ZBIND, OP_ZUNBIND, OP_COUNT };

static void check_error(const struct kvi_api_err *e, enum kvi_ctype ct)
{
    FZ_CHECK(memchr(e->msg, '\0', sizeof(e->msg)) != NULL && e->msg[0] != '\0');
    FZ_CHECK(e->status == 400 || e->status == 415 || e->status == 422);
    FZ_CHECK((ct == KVI_CT_JSON) == (e->status != 415));
    for (int enc = KVI_ENC_JSON; enc <= KVI_ENC_MSGPACK; enc++) {
        struct kvi_buf b;
        kvi_buf_init(&b);
        const char *mime = NULL;
        FZ_CHECK(kvi_err_encode(e, KVI_DIALECT_DYNAMO, (enum kvi_body_enc)enc, &b, &mime) == 0 && mime != NULL);
        fz_check_doc(&b, strcmp(mime, KVI_MIME_MSGPACK) == 0 ? KVI_ENC_MSGPACK : KVI_ENC_JSON);
        kvi_buf_free(&b);
    }
}

/* Run parser @p op once; @return the digest of its outcome (checked). */
static uint64_t run(enum op op, const char *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s)
{
    struct kvi_api_err e;
    memset(&e, 0, sizeof e);
    struct fz_dig d;
    fz_dig_init(&d);
    int rc;
    if (op == OP_NATS_SOURCE) {
        struct kvi_dyn_nats_source o;
        rc = kvi_dyn_parse_nats_source(body, len, ct, s, &o, &e);
        if (rc == 0) {
            FZ_CHECK(o.model_name.len > 0 && o.block_size > 0);
            FZ_CHECK(o.subject.len > 0 || o.stream.len > 0);
            FZ_CHECK(o.tenant_id.p != NULL || o.tenant_id.len == 0);
            fz_dig_kstr(&d, o.subject);
            fz_dig_kstr(&d, o.stream);
            fz_dig_kstr(&d, o.model_name);
            fz_dig_kstr(&d, o.tenant_id);
            fz_dig_u64(&d, o.block_size);
        }
    } else {
        struct kvi_dyn_zbind o;
        rc = kvi_dyn_parse_zbind(body, len, ct, s, op == OP_ZUNBIND, &o, &e);
        if (rc == 0) {
            FZ_CHECK(o.endpoint.len > 0 && o.endpoint.p != NULL);
            if (op == OP_ZUNBIND)
                FZ_CHECK(o.block_size == 0);
            fz_dig_kstr(&d, o.endpoint);
            fz_dig_u64(&d, o.block_size);
        }
    }
    FZ_CHECK(rc == 0 || rc == -EINVAL);
    fz_dig_u64(&d, (uint64_t)rc);
    if (rc != 0) {
        check_error(&e, ct);
        fz_dig_u64(&d, (uint64_t)e.status);
        fz_dig_str(&d, e.msg, strlen(e.msg));
    }
    return d.h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    uint8_t sel = data[0];
    enum kvi_ctype ct = (enum kvi_ctype)((sel >> 4) & 3);
    char *body = fz_dup(data + 1, size - 1, false);
    struct kvi_scratch s;
    kvi_scratch_init(&s);
    for (int op = 0; op < OP_COUNT; op++) {
        if ((sel & 3) != 3 && op != (sel & 3))
            continue;
        uint64_t a = run((enum op)op, body, size - 1, ct, &s);
        kvi_scratch_reset(&s);
        uint64_t b = run((enum op)op, body, size - 1, ct, &s);
        kvi_scratch_reset(&s);
        FZ_CHECK(a == b);
    }
    kvi_scratch_free(&s);
    free(body);
    return 0;
}
