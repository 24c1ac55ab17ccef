/* ctest-labels: unit -- net/keyhash.{h,c}: add, find, delete and pop through growth, equal-length keys, keys that prefix each other */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "net/keyhash.h"

#define N 1000

struct item {
    struct kvi_khnode node;
    char key[32];
    bool popped;
};

static struct item items[N];

static void test_add_find_del_pop(void **state)
{
    (void)state;
    struct kvi_khash h = {0};
    assert_null(kvi_khash_find(&h, "x", 1));
    assert_null(kvi_khash_pop(&h));
    for (int i = 0; i < N; i++) {
        /* kv@pod-<i>@m: equal lengths within a decade, and "kv@pod-1" prefixes "kv@pod-12" */
        snprintf(items[i].key, sizeof items[i].key, "kv@pod-%d@m", i);
        items[i].node.key = items[i].key;
        items[i].node.len = strlen(items[i].key);
        assert_null(kvi_khash_find(&h, items[i].key, items[i].node.len));
        kvi_khash_add(&h, &items[i].node);
        assert_int_equal(h.n, (size_t)i + 1);
        assert_true(h.n <= h.cap && (h.cap & (h.cap - 1)) == 0); /* at most one per bucket on average */
    }
    for (int i = 0; i < N; i++)
        assert_ptr_equal(kvi_khash_find(&h, items[i].key, items[i].node.len), &items[i].node);
    assert_null(kvi_khash_find(&h, "kv@pod-1", 8));        /* a prefix of a key is not the key */
    assert_null(kvi_khash_find(&h, "kv@pod-1@mm", 11));    /* nor is a longer one */
    assert_null(kvi_khash_find(&h, "", 0));
    /* delete the even ones (twice: the second is a no-op) */
    for (int i = 0; i < N; i += 2) {
        assert_int_equal(kvi_khash_del(&h, &items[i].node), 1);
        assert_int_equal(kvi_khash_del(&h, &items[i].node), 0);
    }
    assert_int_equal(h.n, N / 2);
    for (int i = 0; i < N; i++)
        assert_ptr_equal(kvi_khash_find(&h, items[i].key, items[i].node.len), i % 2 ? &items[i].node : NULL);
    /* pop the rest: each odd item exactly once */
    size_t popped = 0;
    for (struct kvi_khnode *x; (x = kvi_khash_pop(&h)) != NULL; popped++) {
        struct item *it = (struct item *)((char *)x - offsetof(struct item, node));
        assert_true((it - items) % 2 == 1 && !it->popped);
        it->popped = true;
    }
    assert_int_equal(popped, N / 2);
    assert_int_equal(h.n, 0);
    kvi_khash_fini(&h);
    assert_null(h.tab);
    assert_int_equal(h.cap, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_find_del_pop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
