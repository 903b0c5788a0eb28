/* A 64-op fused elementwise chain over 16M floats: Loom compiled vs the reference
 * interpreter vs a plain memcpy of the same bytes (read + write), in GB/s. One pass over
 * memory is the goal: the KernelsPerGraph metric says how many kernels the chain became. */
#include <stdio.h>
#include <string.h>

#include "bench_util.h"

#define N (16 * 1024 * 1024)

static loom_tensor *chain(loom_context *ctx, loom_tensor *x) {
    loom_tensor *c1 = loom_scalar(ctx, LOOM_DTYPE_F32, 1.0001), *c2 = loom_scalar(ctx, LOOM_DTYPE_F32, 0.999);
    loom_tensor *y = x;
    for (int i = 0; i < 64; i++) {
        switch (i % 4) {
        case 0: y = loom_mul(ctx, y, c1); break;
        case 1: y = loom_add(ctx, y, c2); break;
        case 2: y = loom_maximum(ctx, y, c2); break;
        default: y = loom_sub(ctx, y, c1); break;
        }
    }
    return y;
}

static double run(bool eager, int reps, int64_t *kernels) {
    loom_context *ctx = bench_context(eager, "", 0);
    if (!ctx)
        return -1;
    float *host = malloc(sizeof(float) * N);
    for (int64_t i = 0; i < N; i++)
        host[i] = (float)(i % 1000) * 0.001f;
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){N}, host);
    double t[16];
    for (int r = 0; r < reps + 1; r++) { /* first run: compile + warm-up */
        loom_tensor *y = chain(ctx, x);
        loom_tensor_retain(y);
        double t0 = bench_now();
        if (loom_mark_step(ctx) != LOOM_OK || loom_context_sync(ctx) != LOOM_OK) {
            fprintf(stderr, "bench: %s\n", loom_context_error_message(ctx));
            return -1;
        }
        if (r > 0)
            t[r - 1] = bench_now() - t0;
        loom_tensor_release(y);
    }
    *kernels = loom_metric_total(ctx, "KernelsPerGraph");
    loom_tensor_release(x);
    loom_context_destroy(ctx);
    free(host);
    return 2.0 * N * sizeof(float) / bench_median(t, reps) / 1e9;
}

int main(void) {
    float *a = malloc(sizeof(float) * N), *b = malloc(sizeof(float) * N);
    memset(a, 1, sizeof(float) * N);
    memset(b, 0, sizeof(float) * N);
    double t[9];
    for (int r = 0; r < 10; r++) {
        double t0 = bench_now();
        memcpy(b, a, sizeof(float) * N);
        if (r > 0)
            t[r - 1] = bench_now() - t0;
    }
    double memcpy_gbs = 2.0 * N * sizeof(float) / bench_median(t, 9) / 1e9;
    int64_t kernels = 0, k_eager = 0;
    double jit = run(false, 7, &kernels);
    double interp = run(true, 2, &k_eager);
    printf("64-op elementwise chain over %d floats (median after warm-up)\n", N);
    printf("%-22s %10s %10s\n", "", "GB/s", "vs memcpy");
    printf("%-22s %10.2f %10.2f\n", "memcpy", memcpy_gbs, 1.0);
    printf("%-22s %10.2f %10.2f   (%lld kernel%s)\n", "Loom compiled", jit, jit / memcpy_gbs,
           (long long)kernels, kernels == 1 ? "" : "s");
    printf("%-22s %10.3f %10.3f\n", "Loom interpreter", interp, interp / memcpy_gbs);
    printf("JIT vs interpreter: %.1fx\n", jit / interp);
    free(a);
    free(b);
    return 0;
}
