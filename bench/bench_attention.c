/* Causal self-attention, one compiled training step (forward, then dq, dk, dv of a weighted
 * sum of the output), in f32 at GPT-2's shapes: the fused op (loom_scaled_dot_product_attention:
 * tiles, online softmax, the weights recomputed backward), causal or with the causal tril as
 * a bool mask, against its composition written out with public ops (scores, the mask,
 * softmax, loom_dropout, @ v: [B, H, T, T] in memory), each without and with dropout 0.1.
 * The variants run interleaved, one step each per round; the medians after a warm-up step
 * (which compiles) are printed with the composition / fused (causal) ratio.
 * Usage: bench_attention [ROUNDS] (default 15). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <loom/nn.h>

#include "bench_util.h"

enum { N_VARIANTS = 6, MAX_ROUNDS = 64 };

typedef struct shape {
    const char *name;
    int64_t B, H, T, D;
} shape;

typedef enum path { FUSED_CAUSAL, FUSED_MASK, COMPOSED } path;

typedef struct variant {
    path path;
    double dropout;
    loom_context *ctx;
    loom_tensor *in[4], *mask, *seed; /* q, k, v, the output's weights */
    double ms[MAX_ROUNDS];
} variant;

static void fill(float *x, int64_t n, uint64_t s) {
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 40) / 16777216.0 - 0.5);
    }
}

static int setup(variant *v, const shape *sh, const float *host, const uint8_t *tril) {
    if (!(v->ctx = bench_context(false, "", 0)))
        return 1;
    int64_t s[4] = {sh->B, sh->H, sh->T, sh->D}, n = sh->B * sh->H * sh->T * sh->D, seed = 7;
    for (int i = 0; i < 4; i++)
        v->in[i] = loom_tensor_from_host(v->ctx, LOOM_DTYPE_F32, 4, s, host + i * n);
    v->mask = loom_tensor_from_host(v->ctx, LOOM_DTYPE_BOOL, 2, (int64_t[]){sh->T, sh->T}, tril);
    v->seed = loom_tensor_from_host(v->ctx, LOOM_DTYPE_I64, 0, NULL, &seed);
    return !v->in[3] || !v->seed || !v->mask;
}

/* The composition: softmax(q k^T / sqrt(D), masked) (dropped) @ v. */
static loom_tensor *composed(loom_context *ctx, const variant *v, int64_t D) {
    loom_tensor *qs =
        loom_mul(ctx, v->in[0], loom_scalar(ctx, LOOM_DTYPE_F32, 1 / sqrt((double)D)));
    loom_tensor *s = loom_matmul(ctx, qs, loom_transpose(ctx, v->in[1]));
    s = loom_select(ctx, v->mask, s, loom_scalar(ctx, LOOM_DTYPE_F32, -INFINITY));
    loom_tensor *w = loom_softmax(ctx, s, -1);
    if (v->dropout > 0)
        w = loom_dropout(ctx, w, v->dropout, true, v->seed, 0);
    return loom_matmul(ctx, w, v->in[2]);
}

/* One step; its wall time (record, compile on the first, run, sync) in ms, or -1. */
static double step(variant *v, int64_t D) {
    loom_context *ctx = v->ctx;
    double t0 = bench_now();
    loom_attention_options o;
    loom_attention_options_init(&o);
    o.causal = v->path == FUSED_CAUSAL;
    o.mask = v->path == FUSED_MASK ? v->mask : NULL;
    o.dropout_p = v->dropout;
    o.seed = v->dropout > 0 ? v->seed : NULL;
    loom_tensor *y =
        v->path == COMPOSED
            ? composed(ctx, v, D)
            : loom_scaled_dot_product_attention_ex(ctx, v->in[0], v->in[1], v->in[2], &o);
    loom_tensor *loss = loom_sum(ctx, loom_mul(ctx, y, v->in[3]), 0, NULL, false);
    loom_tensor *g[3] = {0};
    if (!loss || loom_backward(ctx, loss, 3, v->in, g) != LOOM_OK)
        goto fail;
    for (int i = 0; i < 3; i++)
        loom_tensor_retain(g[i]);
    loom_status st = loom_mark_step(ctx);
    if (st == LOOM_OK)
        st = loom_context_sync(ctx);
    for (int i = 0; i < 3; i++)
        loom_tensor_release(g[i]);
    if (st != LOOM_OK)
        goto fail;
    return (bench_now() - t0) * 1e3;
fail:
    fprintf(stderr, "bench_attention: %s\n", loom_context_error_message(ctx));
    return -1;
}

static void teardown(variant *v) {
    for (int i = 0; i < 4; i++)
        loom_tensor_release(v->in[i]);
    loom_tensor_release(v->mask);
    loom_tensor_release(v->seed);
    loom_context_destroy(v->ctx);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 15;
    if (rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "usage: bench_attention [ROUNDS 1..%d]\n", MAX_ROUNDS);
        return 2;
    }
    static const shape shapes[] = {{"(a) GPT-2 4x256, T 64", 4, 4, 64, 64},
                                   {"(b) GPT-2 124M, T 256", 4, 12, 256, 64}};
    printf("causal attention, f32, forward + dq, dk, dv; median ms of %d interleaved steps\n",
           rounds);
    printf("%-24s %8s %12s %12s %12s %8s\n", "shape", "dropout", "causal", "bool mask",
           "composition", "ratio");
    int rc = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes && !rc; si++) {
        const shape *sh = &shapes[si];
        int64_t n = sh->B * sh->H * sh->T * sh->D;
        float *host = malloc((size_t)(4 * n) * sizeof *host);
        uint8_t *tril = malloc((size_t)(sh->T * sh->T));
        if (!host || !tril)
            return 1;
        fill(host, 4 * n, 1 + si);
        for (int64_t i = 0; i < sh->T * sh->T; i++)
            tril[i] = i % sh->T <= i / sh->T;
        variant v[N_VARIANTS];
        for (int k = 0; k < N_VARIANTS; k++)
            v[k] = (variant){.path = (path)(k % 3), .dropout = k < 3 ? 0.0 : 0.1};
        for (int k = 0; k < N_VARIANTS && !rc; k++)
            rc = setup(&v[k], sh, host, tril) || step(&v[k], sh->D) < 0; /* compiles */
        for (int r = 0; r < rounds && !rc; r++)
            for (int k = 0; k < N_VARIANTS && !rc; k++)
                rc = (v[k].ms[r] = step(&v[k], sh->D)) < 0;
        for (int k = 0; k < N_VARIANTS && !rc; k += 3) {
            double f = bench_median(v[k].ms, rounds), m = bench_median(v[k + 1].ms, rounds);
            double c = bench_median(v[k + 2].ms, rounds);
            printf("%-24s %8.1f %9.2f ms %9.2f ms %9.2f ms %7.2fx\n", sh->name, v[k].dropout, f, m,
                   c, c / f);
        }
        for (int k = 0; k < N_VARIANTS; k++)
            teardown(&v[k]);
        free(host);
        free(tril);
    }
    return rc;
}
