/* Shared benchmark helpers: wall clock, medians, a context per configuration. */
#ifndef LOOM_BENCH_UTIL_H
#define LOOM_BENCH_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include <loom/loom.h>

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of n samples (sorts them in place). */
static inline double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A context: eager (reference interpreter) or compiled, with an optional cache dir. */
static inline loom_context *bench_context(bool eager, const char *cache_dir, int32_t threads) {
    loom_context_options o;
    loom_context_options_init(&o);
    o.eager = eager;
    o.dump_dir = NULL;
    o.num_threads = threads;
    if (cache_dir)
        o.cache_dir = cache_dir;
    loom_context *ctx = NULL;
    if (loom_context_create(&o, &ctx) != LOOM_OK)
        return NULL;
    return ctx;
}

#endif
