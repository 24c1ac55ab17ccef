/*
 * The C publisher's NATS transports (net/publisher_nats.c), as
 * net/publisher.c dispatches to them: one function per public call of
 * net/include/kvidx/publisher.h, with that call's contract, for a publisher
 * whose transport is KVIDX_PUB_TRANSPORT_NATS_CORE or _NATS_JETSTREAM.
 *
 * Ownership: struct kvp_nats is created by kvp_nats_create and freed by
 * kvp_nats_destroy; its owner (struct kvidx_pub) holds the only pointer.
 * Thread: the publishing thread of its publisher (one at a time), except
 * kvp_nats_create (any thread).
 * Errors: as the public calls (0 or a negative errno; -EIO with the
 * natsStatus in kvp_nats_last_error).
 * Not installed.
 */
#ifndef KVI_NET_PUBLISHER_NATS_H
#define KVI_NET_PUBLISHER_NATS_H

#include <kvidx/publisher.h>

struct kvp_nats;

/** @return 0 and *out, or a positive errno (see kvidx_pub_create). */
int kvp_nats_create(const struct kvidx_pub_config *cfg, struct kvp_nats **out);
/** NULL is a no-op. */
void kvp_nats_destroy(struct kvp_nats *n);

int kvp_nats_stored(struct kvp_nats *n, const struct kvidx_pub_stored *ev, uint64_t *event_id);
int kvp_nats_removed(struct kvp_nats *n, const struct kvidx_pub_removed *ev, uint64_t *event_id);
int kvp_nats_cleared(struct kvp_nats *n, uint64_t *event_id);
int kvp_nats_flush(struct kvp_nats *n, uint64_t *seq);
int kvp_nats_payload(struct kvp_nats *n, const void *payload, size_t len, uint64_t *seq);
int kvp_nats_send_raw(struct kvp_nats *n, const void *const *frames, const size_t *sizes,
                      size_t n_frames);
void kvp_nats_skip_live(struct kvp_nats *n, uint64_t count);

size_t kvp_nats_pending(const struct kvp_nats *n);
uint64_t kvp_nats_next_seq(const struct kvp_nats *n);
/** The subject published to; owned by @p n. */
const char *kvp_nats_subject(const struct kvp_nats *n);
uint64_t kvp_nats_publisher_id(const struct kvp_nats *n);
int kvp_nats_last_error(const struct kvp_nats *n);
const char *kvp_nats_last_error_text(const struct kvp_nats *n);
/** Fills every field of @p out (the replay counters 0). */
void kvp_nats_stats(const struct kvp_nats *n, struct kvidx_pub_stats *out);

#endif
