/*
 * ZMQ endpoint validation and the `--workers` list syntax, shared by the
 * daemon's command line and the /register routes (http-api.md §1.1).
 *
 * Pure functions: no I/O, no allocation except where stated; thread-safe.
 */
#ifndef KVI_NET_ENDPOINT_H
#define KVI_NET_ENDPOINT_H

#include <stddef.h>
#include <stdint.h>

/**
 * Check an engine endpoint of @p len bytes (not NUL-terminated) against the
 * rules of kvi_endpoint_validate.
 * @return NULL when valid, else a static reason ("missing scheme",
 *         "unsupported scheme", "missing host", "missing port", "invalid port",
 *         "invalid host", "invalid IPv6 host", "an IPv6 host must be in
 *         brackets", "empty endpoint").
 */
const char *kvi_endpoint_check(const char *s, size_t len);

/**
 * Validate an engine endpoint: `tcp://host:port` (non-empty host, `*`
 * allowed, IPv6 hosts in brackets, port a u16, 0 allowed), or `ipc://...` /
 * `inproc://...` as is.
 * @param err     receives a one-line reason on failure (may be NULL)
 * @param errlen  size of @p err
 * @return 0 when valid, -EINVAL otherwise.
 */
int kvi_endpoint_validate(const char *ep, char *err, size_t errlen);

/** One `--workers` entry. */
struct kvi_worker_spec {
    uint64_t instance_id;
    uint32_t dp_rank;
    char endpoint[256];
};

/**
 * Parse `id[:rank]=endpoint,...` (empty entries skipped; an empty string gives
 * no workers). Each endpoint is validated with kvi_endpoint_validate.
 * @param out   receives at most @p cap entries
 * @param n     receives the number of entries parsed
 * @param err   receives the reason on failure; an entry without `=` gives a
 *              text containing "invalid worker entry" (may be NULL)
 * @return 0, -EINVAL on a syntax or endpoint error, -ENOSPC when more than
 *         @p cap entries are given.
 */
int kvi_workers_parse(const char *spec, struct kvi_worker_spec *out, size_t cap, size_t *n, char *err,
                      size_t errlen);

#endif
