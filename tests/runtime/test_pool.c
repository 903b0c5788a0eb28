/* Tests of the kernel thread pool: parallel_for covers its range exactly once in contiguous
 * chunks of at least grain, at most one per thread (parallel_for_ex: per_thread a thread,
 * which balances uneven chunks); the threads' idle time it reports; and LOOM_NUM_THREADS. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/kernel.h"
#include "test_util.h"

static loom_allocator sys;

#define MAX_CHUNKS 64
#define MAX_EXTENT 4096

/* What one parallel_for did: how often each index ran, and each chunk's range and thread. */
typedef struct record {
    atomic_int hits[MAX_EXTENT];
    atomic_int n_chunks;
    int64_t lo[MAX_CHUNKS], hi[MAX_CHUNKS];
    pthread_t thread[MAX_CHUNKS];
} record;

static void record_fn(void *ud, int64_t lo, int64_t hi) {
    record *r = ud;
    int c = atomic_fetch_add(&r->n_chunks, 1);
    if (c < MAX_CHUNKS) {
        r->lo[c] = lo;
        r->hi[c] = hi;
        r->thread[c] = pthread_self();
    }
    for (int64_t i = lo; i < hi; i++)
        atomic_fetch_add(&r->hits[i], 1);
}

static record *run_recorded(loom_rt_pool *pool, int64_t extent, int64_t grain) {
    record *r = calloc(1, sizeof *r);
    assert_non_null(r);
    loom_rt_pool_parallel_for(pool, extent, grain, record_fn, r);
    return r;
}

/* Every index of [0, extent) ran exactly once; chunks are >= grain (or the whole range),
 * at most n_threads of them, and tile the range. (Which thread runs which chunk is not
 * fixed: threads claim chunks, so the caller may run several when workers are slow.) */
static void check_cover(const record *r, int64_t extent, int64_t grain, int32_t n_threads) {
    for (int64_t i = 0; i < extent; i++)
        assert_int_equal(atomic_load(&r->hits[i]), 1);
    for (int64_t i = extent; i < MAX_EXTENT; i++)
        assert_int_equal(atomic_load(&r->hits[i]), 0);
    int n = atomic_load(&r->n_chunks);
    assert_true(n >= 1);
    assert_true(n <= n_threads);
    int64_t covered = 0;
    for (int c = 0; c < n; c++) {
        int64_t size = r->hi[c] - r->lo[c];
        assert_true(size >= 1);
        if (n > 1)
            assert_true(size >= grain);
        covered += size;
    }
    assert_int_equal(covered, extent);
}

static loom_rt_pool *make_pool(int32_t n) {
    loom_rt_pool *pool = NULL;
    assert_int_equal(loom_rt_pool_create(n, &sys, &pool), LOOM_OK);
    assert_non_null(pool);
    assert_int_equal(loom_rt_pool_threads(pool), n);
    return pool;
}

/* ---- parallel_for ------------------------------------------------------------------------- */

static void test_parallel_for_covers_the_range_once_in_even_chunks(void **state) {
    (void)state;
    loom_rt_pool *pool = make_pool(4);
    record *r = run_recorded(pool, 1000, 1);
    check_cover(r, 1000, 1, 4);
    /* 1000 / 4: four chunks of exactly 250, in order [0,250) [250,500) [500,750) [750,1000) */
    assert_int_equal(atomic_load(&r->n_chunks), 4);
    int64_t starts = 0;
    for (int c = 0; c < 4; c++) {
        assert_int_equal(r->hi[c] - r->lo[c], 250);
        starts += r->lo[c];
    }
    assert_int_equal(starts, 0 + 250 + 500 + 750);
    free(r);
    loom_rt_pool_destroy(pool);
}

static void test_parallel_for_uneven_extent_gives_chunks_differing_by_one(void **state) {
    (void)state;
    loom_rt_pool *pool = make_pool(3);
    record *r = run_recorded(pool, 10, 1); /* 4 + 3 + 3 */
    check_cover(r, 10, 1, 3);
    assert_int_equal(atomic_load(&r->n_chunks), 3);
    int sizes[5] = {0};
    for (int c = 0; c < 3; c++)
        sizes[r->hi[c] - r->lo[c]]++;
    assert_int_equal(sizes[4], 1);
    assert_int_equal(sizes[3], 2);
    free(r);
    loom_rt_pool_destroy(pool);
}

static void test_parallel_for_never_makes_chunks_below_grain(void **state) {
    (void)state;
    loom_rt_pool *pool = make_pool(4);
    /* 100 / grain 30: at most 3 chunks of >= 30 (34 + 33 + 33), though 4 threads exist */
    record *r = run_recorded(pool, 100, 30);
    check_cover(r, 100, 30, 4);
    assert_int_equal(atomic_load(&r->n_chunks), 3);
    free(r);
    /* grain above extent: one chunk, the whole range, on the caller's thread */
    r = run_recorded(pool, 100, 500);
    check_cover(r, 100, 500, 4);
    assert_int_equal(atomic_load(&r->n_chunks), 1);
    assert_int_equal(r->lo[0], 0);
    assert_int_equal(r->hi[0], 100);
    assert_true(pthread_equal(r->thread[0], pthread_self()));
    free(r);
    loom_rt_pool_destroy(pool);
}

static void test_parallel_for_with_extent_below_threads_uses_one_chunk_per_index(void **state) {
    (void)state;
    loom_rt_pool *pool = make_pool(8);
    record *r = run_recorded(pool, 3, 1);
    check_cover(r, 3, 1, 8);
    assert_int_equal(atomic_load(&r->n_chunks), 3);
    for (int c = 0; c < 3; c++)
        assert_int_equal(r->hi[c] - r->lo[c], 1);
    free(r);
    loom_rt_pool_destroy(pool);
}

static void test_parallel_for_with_extent_zero_calls_nothing(void **state) {
    (void)state;
    loom_rt_pool *pool = make_pool(4);
    record *r = run_recorded(pool, 0, 1);
    assert_int_equal(atomic_load(&r->n_chunks), 0);
    free(r);
    r = run_recorded(pool, -5, 1);
    assert_int_equal(atomic_load(&r->n_chunks), 0);
    free(r);
    loom_rt_pool_destroy(pool);
}

static void test_parallel_for_on_one_thread_runs_inline(void **state) {
    (void)state;
    loom_rt_pool *pool = make_pool(1);
    record *r = run_recorded(pool, 777, 1);
    check_cover(r, 777, 1, 1);
    assert_int_equal(atomic_load(&r->n_chunks), 1);
    assert_true(pthread_equal(r->thread[0], pthread_self()));
    free(r);
    loom_rt_pool_destroy(pool);
}

/* Sums i over [lo, hi) into a shared total. */
static void sum_fn(void *ud, int64_t lo, int64_t hi) {
    int64_t s = 0;
    for (int64_t i = lo; i < hi; i++)
        s += i;
    atomic_fetch_add((_Atomic int64_t *)ud, s);
}

static void test_parallel_for_back_to_back_calls_all_complete(void **state) {
    (void)state;
    /* Many short calls exercise the spin / sleep hand-over: a lost wake-up would hang or
     * a stale job word would double-count a chunk. Varying extents change the chunk count
     * between calls, so workers without a chunk must notice they have none. */
    /* 2 and 8 threads: pools no larger than the machine spin before sleeping, larger ones
     * sleep at once, so on most machines both paths run. */
    const int32_t sizes[] = {2, 8};
    for (int s = 0; s < 2; s++) {
        loom_rt_pool *pool = make_pool(sizes[s]);
        for (int it = 0; it < 20000; it++) {
            int64_t extent = 1 + it % 11;
            _Atomic int64_t total = 0;
            loom_rt_pool_parallel_for(pool, extent, 1, sum_fn, (void *)&total);
            assert_int_equal(atomic_load(&total), extent * (extent - 1) / 2);
            if (it % 5000 == 4999)
                usleep(2000); /* let the workers fall asleep, then wake them */
        }
        loom_rt_pool_destroy(pool);
    }
}

static void test_pool_create_rejects_bad_thread_counts(void **state) {
    (void)state;
    loom_rt_pool *pool = (loom_rt_pool *)&pool;
    assert_int_equal(loom_rt_pool_create(0, &sys, &pool), LOOM_STATUS_INVALID_ARGUMENT);
    assert_null(pool);
    assert_int_equal(loom_rt_pool_create(1025, &sys, &pool), LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_rt_pool_create(2, NULL, &pool), LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_rt_pool_create(2, &sys, NULL), LOOM_STATUS_INVALID_ARGUMENT);
    loom_rt_pool_destroy(NULL);
    assert_int_equal(loom_rt_pool_threads(NULL), 0);
}

static void test_pool_create_out_of_memory_leaks_nothing(void **state) {
    (void)state;
    for (int64_t fail = 1;; fail++) {
        test_alloc ta = {.fail_at = fail};
        loom_allocator a = test_alloc_make(&ta);
        loom_rt_pool *pool = NULL;
        loom_status st = loom_rt_pool_create(3, &a, &pool);
        if (st == LOOM_OK) {
            record *r = run_recorded(pool, 30, 1);
            check_cover(r, 30, 1, 3);
            free(r);
            loom_rt_pool_destroy(pool);
            assert_int_equal(ta.live_bytes, 0);
            assert_true(fail > 2); /* the pool and its worker array were both tried */
            break;
        }
        assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
        assert_null(pool);
        assert_int_equal(ta.live_bytes, 0);
        assert_int_equal(ta.live_blocks, 0);
    }
}

/* ---- idle time (LOOM_PROFILE's idle%) ----------------------------------------------------- */

enum { SLEEP_MS = 30 };

/* Sleeps SLEEP_MS in the chunk starting at 0, returns at once in the others. */
static void sleep_first_fn(void *ud, int64_t lo, int64_t hi) {
    (void)ud;
    (void)hi;
    if (lo == 0)
        usleep(SLEEP_MS * 1000);
}

static int64_t idle_of(loom_rt_pool *pool, int64_t extent, int64_t grain, int64_t *wall) {
    int64_t idle = -1, t0 = loom_rt_now_ns();
    loom_rt_pool_parallel_for_ex(pool, extent, grain, 1, sleep_first_fn, NULL, &idle);
    *wall = loom_rt_now_ns() - t0;
    assert_true(*wall >= SLEEP_MS * 1000000LL);
    assert_true(idle >= 0);
    return idle;
}

static void test_parallel_for_idle_counts_the_threads_time_outside_chunks(void **state) {
    (void)state;
    const int64_t ms = 1000000, lower = (SLEEP_MS - 5) * ms;
    loom_rt_pool *pool = NULL;
    assert_int_equal(loom_rt_pool_create(2, &sys, &pool), LOOM_OK);
    int64_t wall;
    /* two chunks, one sleeping: the other thread waits through about all of it */
    int64_t idle = idle_of(pool, 2, 1, &wall);
    assert_true(idle >= lower);
    assert_true(idle <= 2 * wall - SLEEP_MS * ms); /* the sleeping chunk counts as busy */
    /* one chunk (extent below two grains), run inline: the worker idles throughout, the
     * caller only around its clock reads */
    idle = idle_of(pool, 3, 2, &wall);
    assert_true(idle >= lower && idle <= wall + ms);
    loom_rt_pool_destroy(pool);
    /* one thread: it ran the chunk, so it was never idle (but for the clock reads) */
    assert_int_equal(loom_rt_pool_create(1, &sys, &pool), LOOM_OK);
    idle = idle_of(pool, 4, 1, &wall);
    assert_true(idle < 5 * ms);
    /* the ordinary parallel_for still covers the range */
    record *r = run_recorded(pool, 40, 1);
    check_cover(r, 40, 1, 1);
    free(r);
    loom_rt_pool_destroy(pool);
}

/* Sleeps 5 ms per index of [lo, hi), 40 ms more at index 0. */
static void uneven_fn(void *ud, int64_t lo, int64_t hi) {
    (void)ud;
    usleep((useconds_t)((hi - lo) * 5000 + (lo == 0 ? 40000 : 0)));
}

static void test_parallel_for_ex_deals_several_chunks_a_thread(void **state) {
    (void)state;
    loom_rt_pool *pool = NULL;
    assert_int_equal(loom_rt_pool_create(3, &sys, &pool), LOOM_OK);
    /* up to 4 chunks a thread, none below grain, tiling the range */
    static const int64_t shapes[][3] = {{100, 3, 4}, {100, 1, 4}, {7, 2, 4}, {12, 1, 1}, {5, 5, 8}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int64_t extent = shapes[i][0], grain = shapes[i][1];
        int32_t per = (int32_t)shapes[i][2];
        record *r = calloc(1, sizeof *r);
        assert_non_null(r);
        loom_rt_pool_parallel_for_ex(pool, extent, grain, per, record_fn, r, NULL);
        check_cover(r, extent, grain, 3 * per);
        int64_t want = extent / grain < 3 * per ? extent / grain : 3 * per;
        assert_int_equal(atomic_load(&r->n_chunks), want < 1 ? 1 : want);
        free(r);
    }
    loom_rt_pool_destroy(pool);
    /* 2 threads over 16 indices, the first 40 ms longer: in one chunk each (80 and 40 ms),
     * the second thread waits 40 ms for the first; in chunks of two indices it takes the
     * others' share (50 ms against 7 chunks of 10) and waits about none. The bounds leave
     * 15 ms for a VM's oversleeping (a usleep of 20 ms took 29 here) */
    assert_int_equal(loom_rt_pool_create(2, &sys, &pool), LOOM_OK);
    int64_t idle_one = -1, idle_split = -1;
    loom_rt_pool_parallel_for_ex(pool, 16, 1, 1, uneven_fn, NULL, &idle_one);
    loom_rt_pool_parallel_for_ex(pool, 16, 1, 4, uneven_fn, NULL, &idle_split);
    if (!(idle_one >= 25000000 && 2 * idle_split < idle_one))
        fail_msg("idle %lld ns in one chunk a thread, %lld in four", (long long)idle_one,
                 (long long)idle_split);
    loom_rt_pool_destroy(pool);
}

/* ---- LOOM_NUM_THREADS --------------------------------------------------------------------- */

static void test_default_threads_reads_loom_num_threads(void **state) {
    (void)state;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int32_t online = cores < 1 ? 1 : cores > 1024 ? 1024 : (int32_t)cores;
    setenv("LOOM_NUM_THREADS", "3", 1);
    assert_int_equal(loom_rt_default_threads(), 3);
    setenv("LOOM_NUM_THREADS", "1", 1);
    assert_int_equal(loom_rt_default_threads(), 1);
    setenv("LOOM_NUM_THREADS", "1024", 1);
    assert_int_equal(loom_rt_default_threads(), 1024);
    /* Invalid values fall back to the online cores. */
    const char *bad[] = {"0", "1025", "-2", "abc", "4x", "", " 4", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("LOOM_NUM_THREADS", bad[i], 1);
        if (loom_rt_default_threads() != online)
            fail_msg("LOOM_NUM_THREADS=\"%s\" gave %d, expected the %d online cores", bad[i],
                     (int)loom_rt_default_threads(), (int)online);
    }
    unsetenv("LOOM_NUM_THREADS");
    assert_int_equal(loom_rt_default_threads(), online);
}

int main(void) {
    sys = loom_allocator_system();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parallel_for_covers_the_range_once_in_even_chunks),
        cmocka_unit_test(test_parallel_for_uneven_extent_gives_chunks_differing_by_one),
        cmocka_unit_test(test_parallel_for_never_makes_chunks_below_grain),
        cmocka_unit_test(test_parallel_for_with_extent_below_threads_uses_one_chunk_per_index),
        cmocka_unit_test(test_parallel_for_with_extent_zero_calls_nothing),
        cmocka_unit_test(test_parallel_for_on_one_thread_runs_inline),
        cmocka_unit_test(test_parallel_for_back_to_back_calls_all_complete),
        cmocka_unit_test(test_parallel_for_idle_counts_the_threads_time_outside_chunks),
        cmocka_unit_test(test_parallel_for_ex_deals_several_chunks_a_thread),
        cmocka_unit_test(test_pool_create_rejects_bad_thread_counts),
        cmocka_unit_test(test_pool_create_out_of_memory_leaks_nothing),
        cmocka_unit_test(test_default_threads_reads_loom_num_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
