/* Tracing overhead: record a 1000-node graph, cut it, hash it and hit the cache, per
 * recorded op, in µs (the step's execution is excluded: LOOM_SYNC off and a tiny tensor). */
#include <stdio.h>

#include "bench_util.h"

int main(void) {
    loom_context *ctx = bench_context(false, "", 1);
    if (!ctx)
        return 1;
    float v[4] = {1, 2, 3, 4};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){4}, v);
    loom_tensor *c = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){4}, v);
    enum { OPS = 1000, REPS = 50 };
    double samples[REPS];
    for (int r = 0; r < REPS + 3; r++) {
        double t0 = bench_now();
        loom_tensor *y = x;
        for (int i = 0; i < OPS; i++)
            y = (i & 1) ? loom_add(ctx, y, c) : loom_mul(ctx, y, c);
        loom_tensor_retain(y);
        loom_mark_step(ctx); /* cut + hash + cache hit + launch */
        double t1 = bench_now();
        loom_context_sync(ctx);
        loom_tensor_release(y);
        if (r >= 3)
            samples[r - 3] = (t1 - t0) / OPS * 1e6;
    }
    printf("tracing + cut + hash + cache hit: %.3f us per recorded op (median of %d steps of %d ops)\n",
           bench_median(samples, REPS), REPS, OPS);
    printf("cache: %lld misses, %lld hits\n", (long long)loom_metric_value(ctx, "CacheMiss"),
           (long long)loom_metric_value(ctx, "CacheHit"));
    loom_tensor_release(x);
    loom_tensor_release(c);
    loom_context_destroy(ctx);
    return 0;
}
