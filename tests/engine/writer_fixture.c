/*
 * The writer tests' shared helpers (writer_fixture.h, where their contracts
 * are): built once into kvi_test_engine (tests/CMakeLists.txt).
 */
#include "writer_fixture.h"

/* Order by one field, then the next. */
#define CMP(a, b)                                                                                                      \
    do {                                                                                                               \
        if ((a) != (b))                                                                                                \
            return (a) < (b) ? -1 : 1;                                                                                 \
    } while (0)

enum kvi_op_outcome apply_direct(struct kvi_index *ref, const struct kvi_op *op, uint64_t *unknown)
{
    int r = 0;
    *unknown = 0;
    switch (op->type) {
    case KVI_OP_STORE_KNOWN: {
        size_t u = 0;
        (void)kvi_index_store_known(ref, op->instance, op->dp_rank, (enum kvi_tier)op->tier, op->hashes, op->n, &u);
        *unknown = u;
        break;
    }
    case KVI_OP_STORE_SEQ_ONLY: {
        if (op->seq == NULL)
            return KVI_OUT_INVALID;
        uint64_t *eh = malloc(((size_t)op->n + 1) * sizeof *eh);
        if (eh == NULL)
            abort();
        for (uint32_t i = 0; i < op->n; i++)
            eh[i] = op->blocks[i].engine_hash;
        r = kvi_index_store_seq_only(ref, op->instance, op->dp_rank, (enum kvi_tier)op->tier, op->has_parent,
                                     op->parent_engine_hash, op->position, eh, op->seq, op->n);
        free(eh);
        break;
    }
    case KVI_OP_STORE:
        if (op->seq != NULL)
            r = kvi_index_store_seq(ref, op->instance, op->dp_rank, (enum kvi_tier)op->tier, op->has_parent,
                                    op->parent_engine_hash, op->position, op->blocks, op->seq, op->n);
        else
            r = kvi_index_store(ref, op->instance, op->dp_rank, (enum kvi_tier)op->tier, op->has_parent,
                                op->parent_engine_hash, op->blocks, op->n);
        break;
    case KVI_OP_REMOVE:
        (void)kvi_index_remove(ref, op->instance, op->dp_rank, (enum kvi_tier)op->tier, op->hashes, op->n);
        break;
    case KVI_OP_CLEAR:
        kvi_index_clear(ref, op->instance);
        break;
    case KVI_OP_CLEAR_DP_RANK:
        kvi_index_clear_dp_rank(ref, op->instance, op->dp_rank);
        break;
    case KVI_OP_REMOVE_DP_RANK:
        kvi_index_remove_dp_rank(ref, op->instance, op->dp_rank);
        break;
    case KVI_OP_REMOVE_INSTANCE:
        kvi_index_remove_instance(ref, op->instance);
        break;
    default:
        return KVI_OUT_INVALID;
    }
    return r == -ENOENT ? KVI_OUT_PARENT_NOT_FOUND : r < 0 ? KVI_OUT_INVALID : KVI_OUT_APPLIED;
}

void row_fill(struct row *r, const struct kvi_dump_block *b)
{
    memset(r, 0, sizeof *r);
    r->inst = b->instance;
    r->rank = b->dp_rank;
    r->tier = (uint32_t)b->tier;
    r->pos = b->position;
    r->eh = b->engine_hash;
    r->content = b->content_hash;
    r->seq = b->seq_hash;
    r->has_parent = b->has_parent;
    r->parent_eh = b->parent_engine_hash;
    r->no_content = b->no_content;
}

int row_cmp_identity(const void *x, const void *y)
{
    const struct row *a = x, *b = y;
    CMP(a->inst, b->inst);
    CMP(a->rank, b->rank);
    CMP(a->tier, b->tier);
    CMP(a->eh, b->eh);
    CMP(a->parent_eh, b->parent_eh);
    CMP(a->has_parent, b->has_parent);
    CMP(a->pos, b->pos);
    CMP(a->seq, b->seq);
    return 0;
}

int row_cmp(const void *x, const void *y)
{
    int c = row_cmp_identity(x, y);
    if (c != 0)
        return c;
    const struct row *a = x, *b = y;
    CMP(a->content, b->content);
    CMP(a->no_content, b->no_content);
    return 0;
}

int qrow_cmp(const void *x, const void *y)
{
    const struct qrow *a = x, *b = y;
    CMP(a->inst, b->inst);
    CMP(a->rank, b->rank);
    CMP(a->depth, b->depth);
    CMP(a->tree, b->tree);
    return 0;
}
