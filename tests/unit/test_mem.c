/* Tests of the small-object allocator (gateway/base/mem.c): every size up to
 * past the largest class keeps its bytes, realloc keeps contents when it
 * grows and shrinks, calloc zeroes (and refuses an overflowing count),
 * blocks freed are reused without overlap whatever the size, more frees
 * than a class keeps go back to malloc, blocks move between threads, and
 * the nghttp2 vtable allocates through the same calls. Under
 * AddressSanitizer the calls are malloc's own, and the same checks hold. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "gateway/base/mem.h"

#include <nghttp2/nghttp2.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_UNDER_ASAN 1
#endif
#endif

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed + i * 7);
}

static void check(const uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (uint8_t)(seed + i * 7))
            fail_msg("byte %zu of %zu changed", i, n);
}

static void test_sizes(void **state)
{
    void *blocks[2100];
    for (size_t n = 0; n < 2100; n++) {
        blocks[n] = gw_mem_alloc(n);
        assert_non_null(blocks[n]);
        assert_int_equal((uintptr_t)blocks[n] % 16, 0);
        fill(blocks[n], n, (uint8_t)n);
    }
    for (size_t n = 0; n < 2100; n++) {
        check(blocks[n], n, (uint8_t)n);
        gw_mem_free(blocks[n]);
    }
    gw_mem_free(NULL);
}

static void test_grow_shrink(void **state)
{
    uint8_t *p = gw_mem_realloc(NULL, 10);
    assert_non_null(p);
    fill(p, 10, 1);
    for (size_t n = 11; n < 5000; n = n * 3 / 2 + 1) {
        p = gw_mem_realloc(p, n);
        assert_non_null(p);
        check(p, 10, 1);
        memset(p + 10, 0xab, n - 10);
    }
    p = gw_mem_realloc(p, 5);
    assert_non_null(p);
    check(p, 5, 1);
    gw_mem_free(p);
}

static void test_zeroed(void **state)
{
    for (int round = 0; round < 3; round++) {
        /* dirty blocks of every class first, so that reuse must clear them */
        for (size_t n = 1; n <= 1100; n += 37) {
            uint8_t *d = gw_mem_alloc(n);
            memset(d, 0xff, n);
            gw_mem_free(d);
        }
        for (size_t n = 1; n <= 1100; n += 37) {
            uint8_t *z = gw_mem_calloc(n, 1);
            assert_non_null(z);
            for (size_t i = 0; i < n; i++)
                assert_int_equal(z[i], 0);
            gw_mem_free(z);
        }
    }
#ifndef TEST_UNDER_ASAN /* AddressSanitizer reports such sizes as errors */
    assert_null(gw_mem_calloc(SIZE_MAX / 2, 3));
    assert_null(gw_mem_alloc(SIZE_MAX - 4));
#endif
}

/* Many blocks of one class live at once (more than a class keeps), all
 * distinct and intact; then freed in another order and taken again. */
static void test_reuse(void **state)
{
    enum { N = GW_MEM_CLASS_KEEP * 3 };
    static uint8_t *b[N];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            b[i] = gw_mem_alloc(100);
            assert_non_null(b[i]);
            fill(b[i], 100, (uint8_t)i);
        }
        for (int i = 0; i < N; i++)
            check(b[i], 100, (uint8_t)i);
        for (int i = 0; i < N; i += 2)
            gw_mem_free(b[i]);
        for (int i = 1; i < N; i += 2) {
            check(b[i], 100, (uint8_t)i);
            gw_mem_free(b[i]);
        }
    }
}

static void *free_on_thread(void *arg)
{
    void **blocks = arg;
    for (int i = 0; i < 64; i++) {
        check(blocks[i], 200, (uint8_t)i);
        gw_mem_free(blocks[i]);
    }
    /* and some of its own, taken and given back on this thread */
    for (int i = 0; i < 64; i++) {
        void *p = gw_mem_alloc(200);
        fill(p, 200, 3);
        gw_mem_free(p);
    }
    return NULL;
}

static void test_threads(void **state)
{
    void *blocks[64];
    for (int i = 0; i < 64; i++) {
        blocks[i] = gw_mem_alloc(200);
        fill(blocks[i], 200, (uint8_t)i);
    }
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, free_on_thread, blocks), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    void *p = gw_mem_alloc(200);
    assert_non_null(p);
    gw_mem_free(p);
}

static void test_nghttp2_vtable(void **state)
{
    nghttp2_mem *mem = gw_mem_nghttp2();
    void *p = mem->malloc(50, mem->mem_user_data);
    assert_non_null(p);
    p = mem->realloc(p, 3000, mem->mem_user_data);
    assert_non_null(p);
    mem->free(p, mem->mem_user_data);
    uint8_t *z = mem->calloc(10, 10, mem->mem_user_data);
    for (int i = 0; i < 100; i++)
        assert_int_equal(z[i], 0);
    mem->free(z, mem->mem_user_data);

    /* a whole session lives and dies on it */
    nghttp2_session_callbacks *cb;
    nghttp2_session *s;
    assert_int_equal(nghttp2_session_callbacks_new(&cb), 0);
    assert_int_equal(nghttp2_session_client_new3(&s, cb, NULL, NULL, mem), 0);
    const nghttp2_nv nv[] = {
        {(uint8_t *)":method", (uint8_t *)"GET", 7, 3, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)":scheme", (uint8_t *)"http", 7, 4, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)":authority", (uint8_t *)"x", 10, 1, NGHTTP2_NV_FLAG_NONE},
        {(uint8_t *)":path", (uint8_t *)"/", 5, 1, NGHTTP2_NV_FLAG_NONE},
    };
    for (int i = 0; i < 50; i++)
        assert_true(nghttp2_submit_request(s, NULL, nv, 4, NULL, NULL) > 0);
    const uint8_t *data;
    while (nghttp2_session_mem_send(s, &data) > 0)
        ;
    nghttp2_session_del(s);
    nghttp2_session_callbacks_del(cb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),   cmocka_unit_test(test_grow_shrink),
        cmocka_unit_test(test_zeroed),  cmocka_unit_test(test_reuse),
        cmocka_unit_test(test_threads), cmocka_unit_test(test_nghttp2_vtable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
