/* Linear regression by gradient descent, written with Loom's core ops: the gradient of the
 * mean squared error is spelled out by hand (autograd arrives with the training work).
 * Every iteration is one lazily traced step: compiled once, then a cache hit. */
#include <stdio.h>
#include <stdlib.h>

#include <loom/loom.h>

#define N 256 /* samples */
#define D 4   /* features */

static void print_chunk(const char *chunk, size_t len, void *ud) {
    fwrite(chunk, 1, len, (FILE *)ud);
}

static int fail(loom_context *ctx, const char *what) {
    fprintf(stderr, "linear_regression: %s: %s\n", what, loom_context_error_message(ctx));
    loom_context_destroy(ctx);
    return 1;
}

int main(void) {
    loom_context *ctx = NULL;
    loom_status st = loom_context_create(NULL, &ctx);
    if (st != LOOM_OK) {
        fprintf(stderr, "linear_regression: cannot create a context: %s\n", loom_status_name(st));
        return 1;
    }

    /* Synthetic data: y = x . w_true + b_true, deterministic. */
    static float xs[N * D], ys[N];
    const float w_true[D] = {2.0f, -3.0f, 0.5f, 1.5f}, b_true = 0.25f;
    unsigned seed = 42;
    for (int i = 0; i < N; i++) {
        float y = b_true;
        for (int j = 0; j < D; j++) {
            seed = seed * 1664525u + 1013904223u;
            xs[i * D + j] = (float)(seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
            y += xs[i * D + j] * w_true[j];
        }
        ys[i] = y;
    }
    float w0[D] = {0}, b0[1] = {0};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){N, D}, xs);
    loom_tensor *y = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){N, 1}, ys);
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){D, 1}, w0);
    loom_tensor *b = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){1}, b0);
    if (!x || !y || !w || !b)
        return fail(ctx, "creating tensors");

    const double lr = 0.5;
    const int steps = 200;
    float loss_value = 0.0f;
    for (int step = 0; step < steps; step++) {
        /* forward: pred = x w + b; loss = mean((pred - y)^2) */
        loom_tensor *err = loom_sub(ctx, loom_add(ctx, loom_matmul(ctx, x, w), b), y);
        loom_tensor *loss = loom_mean(ctx, loom_mul(ctx, err, err), 0, NULL, false);
        /* backward by hand: dL/dw = 2/N x^T err; dL/db = 2 mean(err) */
        loom_tensor *two_over_n = loom_scalar(ctx, LOOM_DTYPE_F32, 2.0 / N);
        loom_tensor *gw = loom_mul(ctx, loom_matmul(ctx, loom_transpose(ctx, x), err), two_over_n);
        loom_tensor *gb = loom_mul(ctx, loom_sum(ctx, err, 1, (int32_t[]){0}, false), two_over_n);
        loom_tensor *step_lr = loom_scalar(ctx, LOOM_DTYPE_F32, lr);
        loom_tensor *w_next = loom_sub(ctx, w, loom_mul(ctx, gw, step_lr));
        loom_tensor *b_next = loom_sub(ctx, b, loom_mul(ctx, gb, step_lr));
        loom_tensor_retain(w_next);
        loom_tensor_retain(b_next);
        loom_tensor_retain(loss);
        if (loom_mark_step(ctx) != LOOM_OK)
            return fail(ctx, "step");
        loom_tensor_release(w);
        loom_tensor_release(b);
        w = w_next;
        b = b_next;
        if (step % 50 == 0 || step == steps - 1) {
            if (loom_tensor_read(ctx, loss, &loss_value, sizeof loss_value) != LOOM_OK)
                return fail(ctx, "reading the loss");
            printf("step=%d loss=%.6g\n", step, (double)loss_value);
        }
        loom_tensor_release(loss);
    }
    float w_fit[D], b_fit;
    if (loom_tensor_read(ctx, w, w_fit, sizeof w_fit) != LOOM_OK ||
        loom_tensor_read(ctx, b, &b_fit, sizeof b_fit) != LOOM_OK)
        return fail(ctx, "reading the weights");
    printf("fitted w = [%.4f, %.4f, %.4f, %.4f], b = %.4f (true: [2, -3, 0.5, 1.5], 0.25)\n",
           (double)w_fit[0], (double)w_fit[1], (double)w_fit[2], (double)w_fit[3], (double)b_fit);
    printf("\n--- metrics ---\n");
    loom_metrics_report(ctx, LOOM_REPORT_FORMAT_TEXT, print_chunk, stdout);
    loom_tensor_release(x);
    loom_tensor_release(y);
    loom_tensor_release(w);
    loom_tensor_release(b);
    loom_context_destroy(ctx);
    return loss_value < 1e-6f ? 0 : 1;
}
