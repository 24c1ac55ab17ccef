/*
 * kvidxd's NATS flags (--nats, --nats-source, --nats-stream, ...): parsed
 * out of argv before the daemon's own options, into the configuration the
 * service starts its NATS plane with (api/service_nats.c,
 * net/nats_source.h). api/README.md ("Dynamo on NATS") documents them.
 *
 * THREAD: main, before the service starts. Strings point into argv or into
 * memory the struct owns (kvi_nats_args_free).
 */
#ifndef KVI_API_NATS_ARGS_H
#define KVI_API_NATS_ARGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "net/nats_source.h"

#define KVI_NATS_SNAPSHOT_EVERY_S_DEFAULT 300u

/** One --nats-source / --nats-stream: where events come from, which index they feed. */
struct kvi_nats_source_arg {
    enum kvi_nats_kind kind;
    char *subject;       /* core: the subject; stream: the filter subject or NULL */
    char *stream;        /* stream: the stream name; core: NULL */
    char *model;         /* the namespace (model, tenant) and its block size */
    char *tenant;        /* "default" when not given */
    uint32_t block_size;
};

struct kvi_nats_args {
    struct kvi_nats_config conn; /* servers == NULL: no --nats (writers set by the service) */
    struct kvi_nats_source_arg *sources;
    size_t n_sources;
    char *durable_default;       /* owned: the default durable name ("kvidx-<host>") */
    const char *registry;        /* --nats-registry BUCKET: shared registrations (NULL: none) */
    const char *snapshot;        /* --nats-snapshot BUCKET: stream sources' snapshots (NULL: none) */
    uint32_t snapshot_every_s;   /* --nats-snapshot-every-s (default KVI_NATS_SNAPSHOT_EVERY_S_DEFAULT) */
    const char *publish;         /* --nats-publish STREAM: bridge ZMQ events into it (NULL: none) */
};

/**
 * Take the NATS flags out of argv (the rest stays, in order, for the
 * daemon's parser) into @p out (zeroed first). A flag without --nats, or
 * sources without --nats, is an error; so is a malformed source.
 * @return 0, or -EINVAL with a message on stderr.
 */
int kvi_nats_args(int *argc, char **argv, struct kvi_nats_args *out);

/** Free what kvi_nats_args allocated. */
void kvi_nats_args_free(struct kvi_nats_args *a);

/** The flags' --help text. */
void kvi_nats_args_usage(FILE *f);

/**
 * Parse one source value: core "SUBJECT=MODEL[:TENANT]@BLOCK_SIZE", stream
 * "STREAM[/SUBJECT]=MODEL[:TENANT]@BLOCK_SIZE". The subject (or stream) ends
 * at the first '=', the block size follows the last '@', and the last ':'
 * of MODEL[:TENANT] starts the tenant. @return 0 or -EINVAL (@p why set).
 */
int kvi_nats_source_parse(enum kvi_nats_kind kind, const char *s, struct kvi_nats_source_arg *out,
                          const char **why);

#endif
