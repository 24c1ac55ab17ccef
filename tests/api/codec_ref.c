/*
 * Definitions of codec_ref.h (where the contracts are): built once into
 * kvi_test_api (tests/CMakeLists.txt).
 */
#include <string.h>

#include "codec_ref.h"

bool ref_same(const struct kvi_score_row *a, const struct kvi_score_row *b)
{
    if (a->name != NULL || b->name != NULL)
        return a->name != NULL && b->name != NULL && strcmp(a->name, b->name) == 0;
    return a->instance_id == b->instance_id;
}

int ref_cmp(const struct kvi_score_row *x, const struct kvi_score_row *y)
{
    if (x->name != NULL || y->name != NULL) {
        if (x->name == NULL)
            return -1;
        if (y->name == NULL)
            return 1;
        int c = strcmp(x->name, y->name);
        if (c != 0)
            return c;
    } else if (x->instance_id != y->instance_id) {
        return x->instance_id < y->instance_id ? -1 : 1;
    }
    return x->dp_rank < y->dp_rank ? -1 : x->dp_rank > y->dp_rank;
}

void ref_sort(struct kvi_score_row *rows, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        struct kvi_score_row x = rows[i];
        size_t j = i;
        for (; j > 0 && ref_cmp(&rows[j - 1], &x) > 0; j--)
            rows[j] = rows[j - 1];
        rows[j] = x;
    }
}
