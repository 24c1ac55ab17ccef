/*
 * Helpers shared by writer_test.c and writer_stress_test.c (engine/writer.h):
 * the direct, single-threaded application of an op to a reference index,
 * canonical dump rows and query rows with their orders.
 *
 * Defined in writer_fixture.c, built once into kvi_test_engine
 * (tests/CMakeLists.txt); mix64 stays inline.
 */
#ifndef KVI_TESTS_ENGINE_WRITER_FIXTURE_H
#define KVI_TESTS_ENGINE_WRITER_FIXTURE_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/index.h"
#include "engine/writer.h"

/* splitmix64 finaliser: corpus content and engine hashes. */
static inline uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/*
 * Apply op to ref directly, exactly as a writer applies it (token-less
 * stores included); return the op's outcome. *unknown receives the hashes a
 * STORE_KNOWN op could not resolve (0 for other ops).
 */
enum kvi_op_outcome apply_direct(struct kvi_index *ref, const struct kvi_op *op, uint64_t *unknown);

/* ---- canonical dump rows ----------------------------------------------------- */

/* One dumped block (index-semantics.md section 5, plus position and seq hash). */
struct row {
    uint32_t inst, rank, tier, pos;
    uint64_t eh, content, seq, parent_eh;
    bool has_parent;
    bool no_content;
};

/* The row of one dumped block. */
void row_fill(struct row *r, const struct kvi_dump_block *b);

/* Rows by everything but the content hash (see row_cmp). */
int row_cmp_identity(const void *x, const void *y);

/* Rows by every field: a total order for canonical snapshots. */
int row_cmp(const void *x, const void *y);

/* ---- query rows ------------------------------------------------------------------ */

/* One gpu match, by (instance, dp_rank): slot ids depend on the interleaving. */
struct qrow {
    uint32_t inst, rank, depth, tree;
};

/* Query rows by (instance, dp_rank, depth, tree size). */
int qrow_cmp(const void *x, const void *y);

#endif
