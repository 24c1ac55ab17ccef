/* Endpoint validation and --workers parsing (http-api.md §1.1). */
/* ctest-labels: unit */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "net/endpoint.h"

static void test_endpoints_accepted(void **state)
{
    const char *ok[] = {"tcp://*:5558",      "tcp://127.0.0.1:0", "inproc://listener", "ipc://engine0.sock",
                        "tcp://[::1]:5557", "tcp://host:65535",  "tcp://a.b-c:1"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        char err[256] = "";
        assert_int_equal(kvi_endpoint_validate(ok[i], err, sizeof(err)), 0);
    }
}

static void test_endpoints_rejected(void **state)
{
    struct {
        const char *ep, *why;
    } bad[] = {
        {"tcp://host", "missing port"},         {"tcp://:5558", "missing host"},
        {"udp://host:5558", "unsupported scheme"}, {"not-an-endpoint", "missing scheme"},
        {"tcp://host:65536", "port"},           {"tcp://host:", "port"},
        {"tcp://::1:5557", "brackets"},         {"tcp://[]:1", "IPv6"},
        {"tcp://[::1]", "missing port"},        {"", "empty"},
        {"tcp://host:12a", "port"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[256] = "";
        assert_int_equal(kvi_endpoint_validate(bad[i].ep, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, bad[i].why));
    }
}

static void test_workers_parse(void **state)
{
    struct kvi_worker_spec w[4];
    size_t n = 99;
    char err[256];
    assert_int_equal(kvi_workers_parse("1=tcp://host:5557,2:1=tcp://host:5558", w, 4, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 2);
    assert_int_equal(w[0].instance_id, 1);
    assert_int_equal(w[0].dp_rank, 0);
    assert_string_equal(w[0].endpoint, "tcp://host:5557");
    assert_int_equal(w[1].instance_id, 2);
    assert_int_equal(w[1].dp_rank, 1);
    assert_string_equal(w[1].endpoint, "tcp://host:5558");

    assert_int_equal(kvi_workers_parse("", w, 4, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 0);
    assert_int_equal(kvi_workers_parse(",,18446744073709551615:4294967295=ipc://x,", w, 4, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 1);
    assert_true(w[0].instance_id == UINT64_MAX);
    assert_true(w[0].dp_rank == UINT32_MAX);
}

static void test_workers_errors(void **state)
{
    struct kvi_worker_spec w[2];
    size_t n;
    char err[256];
    assert_int_equal(kvi_workers_parse("1", w, 2, &n, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "invalid worker entry"));
    const char *bad[] = {"x=tcp://h:1", "1:x=tcp://h:1", "18446744073709551616=tcp://h:1", "1:4294967296=tcp://h:1",
                         "1=tcp://h", "=tcp://h:1", "1:=tcp://h:1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        assert_int_equal(kvi_workers_parse(bad[i], w, 2, &n, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "invalid worker entry"));
    }
    assert_int_equal(kvi_workers_parse("1=ipc://a,2=ipc://b,3=ipc://c", w, 2, &n, err, sizeof(err)), -ENOSPC);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoints_accepted),
        cmocka_unit_test(test_endpoints_rejected),
        cmocka_unit_test(test_workers_parse),
        cmocka_unit_test(test_workers_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
