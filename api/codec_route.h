/*
 * POST /route codec (kvidx's own route on the indexer port): one call that
 * joins the index's cache overlap and the slot tracker's load for every
 * worker rank of a (model, tenant), ranks them with the reference KV
 * router's cost, and optionally records the /add for the best one.
 * Pure functions as api/codec.h: bytes in, structs out; structs in, bytes
 * out; plus the ranking itself (kvi_route_rank), so it is tested without a
 * daemon.
 *
 * REQUEST (JSON, or msgpack with the same keys)
 *   {"model_name": str,                       required
 *    "tenant_id": str,                        default "default" (null = default)
 *    exactly one of:
 *      "token_ids": [u32],                    prompt tokens (msgpack: also a bin of LE u32)
 *      "block_hashes": [i64],                 local block (content) hashes, as /query_by_hash
 *      "sequence_hashes": [i64],              rolling sequence hashes, as the slot tracker's /add
 *                                             (hash lists: i64 or u64 values; msgpack: also a bin of LE u64)
 *    "lora_name": str,                        token_ids only: the adapter's hash seed
 *    "new_isl_tokens": u64,                   prompt tokens to prefill before caching; default
 *                                             len(token_ids), or blocks x block_size for hashes
 *    "overlap_weight": number >= 0,           default 1.0 (the reference's kv_overlap_score_weight)
 *    "decode_weight": number >= 0,            default 1.0
 *    "commit": bool,                          default false: record the /add for the best rank
 *    "request_id": str}                       required with commit
 *   Unknown keys are ignored. Errors (Dynamo dialect texts, JSON bodies):
 *   415 Content-Type neither JSON nor msgpack; 400 syntax; 422 a missing or
 *   ill-typed field, none or several of the three prompt keys, a negative
 *   or non-finite weight, commit without request_id.
 *
 * COST (per candidate rank r of the slot tracker; bs = block size)
 *   overlap(r)        = blocks of the prompt's prefix that the index holds
 *                       on r's GPU tier (kvi_index_find_tiered, gpu)
 *   new_prefill(r)    = max(0, new_isl_tokens - overlap(r) * bs)
 *   prefill_tokens(r) = active_prefill_tokens(r) + new_prefill(r)
 *   prefill_blocks(r) = prefill_tokens(r) / bs            (a real number)
 *   decode_blocks(r)  = the tracker's potential_decode_blocks(r): active
 *                       decode blocks + prompt blocks r's active requests
 *                       do not already hold
 *   cost(r)           = overlap_weight * prefill_blocks(r)
 *                       + decode_weight * decode_blocks(r)
 *   Ranked by cost ascending, then tree_size (GPU blocks r holds in the
 *   index) ascending, then (worker_id, dp_rank) ascending.
 *
 * RESPONSE (the request's encoding, or msgpack when Accept asks for it)
 *   {"model_name","tenant_id","block_size","blocks","new_isl_tokens",
 *    "overlap_weight","decode_weight",
 *    "worker_id","dp_rank",            the best rank (ranked[0])
 *    "committed": bool,                true when the /add was recorded
 *    "request_id": str,                only with commit
 *    "candidates": [{"worker_id","dp_rank","overlap_blocks","tree_size",
 *        "new_prefill_tokens","potential_prefill_tokens","prefill_blocks",
 *        "potential_decode_blocks","active_requests","cost"}, ...]}  ranked
 *   Weights, prefill_blocks and cost are floats (JSON: shortest text that
 *   reads back exactly, null for a cost that overflows to infinity, which
 *   takes a weight above ~1e289; msgpack: float64); the rest are unsigned
 *   integers.
 *
 * ERROR CONVENTION, OWNERSHIP, THREAD-SAFETY: as api/codec.h.
 */
#ifndef KVI_API_CODEC_ROUTE_H
#define KVI_API_CODEC_ROUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api/codec.h"
#include "net/body.h"

/** Which prompt form the request carried. */
enum kvi_route_input {
    KVI_ROUTE_TOKENS = 0,    /* token_ids */
    KVI_ROUTE_BLOCK_HASHES,  /* block_hashes (content hashes) */
    KVI_ROUTE_SEQ_HASHES,    /* sequence_hashes */
};

/** A parsed POST /route. */
struct kvi_route_req {
    struct kvi_str model_name;
    struct kvi_str tenant_id; /* "default" when absent or null */
    struct kvi_str lora_name; /* len 0 = base model */
    struct kvi_str request_id; /* valid when has_request_id */
    enum kvi_route_input input;
    const uint32_t *token_ids; /* KVI_ROUTE_TOKENS */
    size_t n_tokens;
    const uint64_t *hashes;    /* the other two inputs (u64 bit patterns) */
    size_t n_hashes;
    uint64_t new_isl_tokens;   /* valid when has_isl */
    double overlap_weight;     /* 1.0 when absent */
    double decode_weight;      /* 1.0 when absent */
    bool has_isl;
    bool commit;
    bool has_request_id;
};

/**
 * Parse POST /route (see REQUEST). @p ct must be JSON or msgpack.
 * @return 0, or -EINVAL (415, 400, 422) / -ENOMEM (500) with @p err filled.
 */
int kvi_route_parse(const void *body, size_t len, enum kvi_ctype ct, struct kvi_scratch *s,
                    struct kvi_route_req *out, struct kvi_api_err *err);

/** One candidate rank. Inputs are filled by the caller; kvi_route_rank fills the rest. */
struct kvi_route_cand {
    /* inputs */
    uint64_t worker_id;
    uint32_t dp_rank;
    uint32_t overlap_blocks;          /* index: GPU prefix blocks */
    uint32_t tree_size;               /* index: GPU blocks held */
    uint64_t active_prefill_tokens;   /* tracker */
    uint64_t potential_decode_blocks; /* tracker */
    uint64_t active_requests;         /* tracker */
    /* outputs */
    uint64_t new_prefill_tokens;
    uint64_t potential_prefill_tokens;
    double prefill_blocks;
    double cost;
};

/** The ranking parameters. */
struct kvi_route_params {
    uint32_t block_size;     /* > 0 */
    uint64_t new_isl_tokens;
    double overlap_weight;
    double decode_weight;
};

/**
 * Compute every candidate's cost (COST) and sort @p c in place, best first.
 * Reentrant; cannot fail.
 */
void kvi_route_rank(struct kvi_route_cand *c, size_t n, const struct kvi_route_params *p);

/** What the response reports besides the candidates. */
struct kvi_route_answer {
    struct kvi_str model_name;
    struct kvi_str tenant_id;
    struct kvi_str request_id; /* emitted when commit is set */
    uint64_t blocks;           /* prompt blocks */
    bool commit;               /* the request asked for a commit */
    bool committed;            /* the /add was recorded */
};

/**
 * Encode the response (RESPONSE) for ranked candidates @p c (n >= 1).
 * @return 0 or -ENOMEM.
 */
int kvi_route_encode(const struct kvi_route_answer *a, const struct kvi_route_params *p,
                     const struct kvi_route_cand *c, size_t n, enum kvi_body_enc enc, struct kvi_buf *out);

/** 409 "block_size mismatch for model={m} tenant={t}: index={a}, slot tracker={b}". @return -EINVAL. */
int kvi_route_err_block_size(struct kvi_api_err *e, struct kvi_str model, struct kvi_str tenant,
                             uint32_t index_bs, uint32_t tracker_bs);

#endif
