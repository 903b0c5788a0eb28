/* Shared test helpers: a failing allocator for fault injection and leak accounting. */
#ifndef LOOM_TESTS_TEST_UTIL_H
#define LOOM_TESTS_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "loom/loom.h"

/* Counts live bytes and blocks; fails the allocation numbered fail_at (1-based, counting
 * only allocations and growing reallocs) when fail_at > 0. */
typedef struct test_alloc {
    int64_t live_bytes, live_blocks, peak_bytes;
    int64_t n_allocs; /* allocations and growing reallocs seen so far */
    int64_t fail_at;  /* 0: never fail */
    int64_t n_failed;
} test_alloc;

/* A loom_allocator over ta (which must outlive every use). */
loom_allocator test_alloc_make(test_alloc *ta);

#endif
