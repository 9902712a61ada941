/* libFuzzer target for gateway/base/prefix.c's body scan.
 *
 * Each input is a request body, any bytes: the scan must stay within
 * them (ASan), give at most GW_PREFIX_MAX chunks whose ends grow and lie
 * within the body, and give the same chain twice, which its own sorted
 * hashes match whole. Violations are __builtin_trap so the fuzzer keeps
 * them. */
#include "gateway/base/prefix.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond)                                                                                     \
    do {                                                                                                     \
        if (!(cond))                                                                                         \
            __builtin_trap();                                                                                \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gw_prefix_chain a, b;
    gw_prefix_chain_of(data, size, &a);
    gw_prefix_chain_of(data, size, &b);
    FUZZ_CHECK(a.n >= 0 && a.n <= GW_PREFIX_MAX);
    FUZZ_CHECK(a.n == b.n && a.user == b.user);
    for (int i = 0; i < a.n; i++) {
        FUZZ_CHECK(a.hash[i] == b.hash[i] && a.end[i] == b.end[i] && a.hash[i] != 0);
        FUZZ_CHECK(a.end[i] <= size && (i == 0 || a.end[i] > a.end[i - 1]));
    }
    FUZZ_CHECK(gw_prefix_match(&a, a.hash, 0) == 0);
    uint64_t sorted[GW_PREFIX_MAX];
    memcpy(sorted, a.hash, sizeof(uint64_t) * (size_t)a.n);
    int n = gw_prefix_sort(sorted, a.n);
    FUZZ_CHECK(n <= a.n && (a.n == 0 || gw_prefix_match(&a, sorted, n) == a.n));
    return 0;
}
