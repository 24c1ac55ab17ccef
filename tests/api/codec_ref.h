/*
 * The score-row order of the reference encoders in codec_conductor_test.c and
 * codec_dynamo_test.c (the encoders as they were written on kvi_wr_*, before
 * the direct writer), shared by both: defined in codec_ref.c, built once into
 * kvi_test_api (tests/CMakeLists.txt).
 */
#ifndef KVI_TESTS_API_CODEC_REF_H
#define KVI_TESTS_API_CODEC_REF_H

#include <stdbool.h>
#include <stddef.h>

#include "api/codec.h"

/* Whether two rows name the same instance: by name when either has one, else by numeric id. */
bool ref_same(const struct kvi_score_row *a, const struct kvi_score_row *b);

/* Rows by instance (named ones after unnamed ones, by name; else by id), then dp_rank. */
int ref_cmp(const struct kvi_score_row *x, const struct kvi_score_row *y);

/* Sort @p rows by ref_cmp, stably (insertion sort). */
void ref_sort(struct kvi_score_row *rows, size_t n);

#endif
