/* Compile time for graphs of 10, 100 and 1000 nodes: cold (empty disk cache) and warm
 * (a new context, the same cache folder: object code is loaded, not compiled). The graphs
 * mix elementwise ops with row reductions so they become many kernels. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

static loom_tensor *build(loom_context *ctx, loom_tensor *x, int nodes) {
    loom_tensor *y = x;
    int made = 0;
    for (int i = 0; made < nodes; i++) {
        if (i % 4 == 3) { /* a reduction and a broadcast back: a kernel boundary */
            y = loom_sub(ctx, y, loom_max(ctx, y, 1, (int32_t[]){1}, true));
            made += 3;
        } else {
            y = i % 2 ? loom_tanh(ctx, y) : loom_mul(ctx, y, x);
            made += 1;
        }
    }
    return y;
}

static double compile_ms(const char *dir, int nodes, int64_t *kernels) {
    loom_context *ctx = bench_context(false, dir, 0);
    float v[64 * 64];
    for (int i = 0; i < 64 * 64; i++)
        v[i] = (float)(i % 17) * 0.01f;
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){64, 64}, v);
    loom_tensor *y = build(ctx, x, nodes);
    loom_tensor_retain(y);
    if (loom_mark_step(ctx) != LOOM_OK || loom_context_sync(ctx) != LOOM_OK)
        fprintf(stderr, "bench: %s\n", loom_context_error_message(ctx));
    double ms = (double)loom_metric_total(ctx, "CompileTime") / 1e6;
    *kernels = loom_metric_total(ctx, "KernelsPerGraph");
    loom_tensor_release(y);
    loom_tensor_release(x);
    loom_context_destroy(ctx);
    return ms;
}

int main(void) {
    printf("%8s %8s %12s %14s %12s %10s\n", "nodes", "kernels", "cold ms", "cold ms/kernel",
           "warm ms", "cold/warm");
    const int sizes[] = {10, 100, 1000};
    for (int s = 0; s < 3; s++) {
        double cold[3], warm[3];
        int64_t kernels = 0;
        for (int r = 0; r < 3; r++) {
            char dir[] = "/tmp/loom-bench-cache-XXXXXX";
            if (!mkdtemp(dir))
                return 1;
            cold[r] = compile_ms(dir, sizes[s], &kernels);
            warm[r] = compile_ms(dir, sizes[s], &kernels);
            char cmd[128];
            snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
            if (system(cmd) != 0)
                return 1;
        }
        double c = bench_median(cold, 3), w = bench_median(warm, 3);
        printf("%8d %8lld %12.1f %14.2f %12.2f %9.1fx\n", sizes[s], (long long)kernels, c,
               kernels ? c / (double)kernels : 0.0, w, w > 0 ? c / w : 0.0);
    }
    return 0;
}
