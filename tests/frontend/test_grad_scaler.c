/* GradScaler: scale, unscale with the inf/NaN check and PyTorch's scale update, against
 * values computed here, on the interpreter and the JIT; skipped optimizer steps (also with
 * gradient clipping between unscale and step), the disabled scaler, checkpoints, bad input,
 * no host sync, f16 underflow, out of memory. */
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#include "frontend/frontend.h"
#include "loom/amp.h"
#include "loom/nn.h"
#include "loom/optim.h"
#include "loom/safetensors.h"

#define N 4

static const float P0[N] = {1.0f, -0.5f, 0.25f, 2.0f};
static const float G0[N] = {0.5f, -0.25f, 1.0f, -2.0f};

static loom_grad_scaler *make_scaler(loom_context *ctx, double init_scale, int32_t interval) {
    loom_grad_scaler_options o;
    loom_grad_scaler_options_init(&o);
    o.init_scale = init_scale;
    o.growth_interval = interval;
    loom_grad_scaler *s = NULL;
    assert_int_equal(loom_grad_scaler_create(ctx, &o, &s), LOOM_OK);
    assert_non_null(s);
    return s;
}

static float read_f32(loom_context *ctx, loom_tensor *t) {
    float v = -1;
    tu_read_f32(ctx, t, &v, 1);
    return v;
}

static int32_t read_i32(loom_context *ctx, loom_tensor *t) {
    int32_t v = -1;
    assert_int_equal(loom_tensor_read(ctx, t, &v, sizeof v), LOOM_OK);
    return v;
}

/* The scale's and tracker's values, after the pending step. */
static void expect_scaler(loom_context *ctx, loom_grad_scaler *s, float scale, int32_t tracker) {
    float got_scale = read_f32(ctx, loom_grad_scaler_scale_tensor(s));
    int32_t got_tracker = read_i32(ctx, loom_grad_scaler_growth_tracker(s));
    if (memcmp(&got_scale, &scale, sizeof scale) != 0 || got_tracker != tracker) {
        print_error("scale %.9g tracker %d, want %.9g and %d\n", got_scale, (int)got_tracker, scale,
                    (int)tracker);
        fail();
    }
}

/* ---- options ------------------------------------------------------------------------- */

static void test_options_init_gives_pytorch_defaults(void **state) {
    (void)state;
    loom_grad_scaler_options o;
    memset(&o, 0xff, sizeof o);
    loom_grad_scaler_options_init(&o);
    assert_true(o.init_scale == 65536.0 && o.growth_factor == 2.0 && o.backoff_factor == 0.5);
    assert_int_equal(o.growth_interval, 2000);
    assert_true(o.enabled);
    loom_grad_scaler_options_init(NULL); /* ignored */
    loom_context *ctx = tu_context(true);
    loom_grad_scaler *s = NULL;
    assert_int_equal(loom_grad_scaler_create(ctx, &o, &s), LOOM_OK);
    assert_true(loom_grad_scaler_is_enabled(s));
    expect_scaler(ctx, s, 65536.0f, 0);
    loom_grad_scaler_destroy(s);
    assert_false(loom_grad_scaler_is_enabled(NULL));
    loom_context_destroy(ctx);
}

/* ---- scale --------------------------------------------------------------------------- */

static void run_scale(bool eager) {
    loom_context *ctx = tu_context(eager);
    loom_grad_scaler *s = make_scaler(ctx, 65536.0, 2000);
    float lf = 1.5f;
    double ld = -0.1;
    uint16_t lh = loom_ir_f32_to_f16(0.5f), lb = loom_ir_f32_to_bf16(3.0f);
    loom_tensor *l32 = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 0, NULL, &lf);
    loom_tensor *l64 = loom_tensor_from_host(ctx, LOOM_DTYPE_F64, 0, NULL, &ld);
    loom_tensor *l16 = loom_tensor_from_host(ctx, LOOM_DTYPE_F16, 0, NULL, &lh);
    loom_tensor *lbf = loom_tensor_from_host(ctx, LOOM_DTYPE_BF16, 1, (int64_t[]){1}, &lb);
    loom_tensor *out[4] = {loom_grad_scaler_scale(s, l32), loom_grad_scaler_scale(s, l64),
                           loom_grad_scaler_scale(s, l16), loom_grad_scaler_scale(s, lbf)};
    const loom_dtype want_dt[4] = {LOOM_DTYPE_F32, LOOM_DTYPE_F64, LOOM_DTYPE_F16, LOOM_DTYPE_BF16};
    for (int i = 0; i < 4; i++) {
        assert_non_null(out[i]);
        loom_dtype dt;
        assert_int_equal(loom_tensor_dtype(out[i], &dt), LOOM_OK);
        assert_int_equal(dt, want_dt[i]); /* the loss's dtype is kept */
    }
    int32_t rank = -1;
    assert_int_equal(loom_tensor_rank(out[3], &rank), LOOM_OK);
    assert_int_equal(rank, 1); /* and its shape */
    float got32 = 0;
    double got64 = 0;
    uint16_t got16 = 0, gotbf = 0;
    assert_int_equal(loom_tensor_read(ctx, out[0], &got32, sizeof got32), LOOM_OK);
    assert_int_equal(loom_tensor_read(ctx, out[1], &got64, sizeof got64), LOOM_OK);
    assert_int_equal(loom_tensor_read(ctx, out[2], &got16, sizeof got16), LOOM_OK);
    assert_int_equal(loom_tensor_read(ctx, out[3], &gotbf, sizeof gotbf), LOOM_OK);
    assert_true(got32 == 98304.0f);
    assert_true(got64 == -0.1 * 65536.0);
    /* 0.5 * 65536 fits f16 although 65536 itself does not */
    assert_true(loom_ir_f16_to_f32(got16) == 32768.0f);
    assert_true(loom_ir_bf16_to_f32(gotbf) == 196608.0f);
    loom_tensor_release(l32);
    loom_tensor_release(l64);
    loom_tensor_release(l16);
    loom_tensor_release(lbf);
    loom_grad_scaler_destroy(s);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_scale_multiplies_the_loss_and_keeps_its_dtype(void **state) {
    (void)state;
    run_scale(true);
    run_scale(false);
}

/* ---- unscale ------------------------------------------------------------------------- */

/* Unscales an f32, an f16, a bf16 gradient and a NULL one with a scale of 3 (whose
 * reciprocal rounds), and compares with 1/3 rounded to f32 and applied as PyTorch does. */
static void run_unscale_values(bool eager) {
    loom_context *ctx = tu_context(eager);
    loom_grad_scaler *s = make_scaler(ctx, 3.0, 2000);
    const float inv = (float)(1.0 / (double)3.0f);
    const float g32[N] = {3.0f, -1.0f, 1e30f, 7.25f};
    uint16_t g16[N], gbf[N];
    for (int i = 0; i < N; i++) {
        g16[i] = loom_ir_f32_to_f16(g32[i] == 1e30f ? 60000.0f : g32[i]);
        gbf[i] = loom_ir_f32_to_bf16(g32[i]);
    }
    loom_tensor *orig[4] = {tu_f32(ctx, N, g32), NULL,
                            loom_tensor_from_host(ctx, LOOM_DTYPE_F16, 1, (int64_t[]){N}, g16),
                            loom_tensor_from_host(ctx, LOOM_DTYPE_BF16, 1, (int64_t[]){N}, gbf)};
    loom_tensor *grads[4];
    memcpy(grads, orig, sizeof grads);
    loom_tensor *found = loom_grad_scaler_unscale(s, 4, grads);
    assert_non_null(found);
    assert_true(grads[0] != orig[0] && grads[2] != orig[2] && grads[3] != orig[3]);
    assert_null(grads[1]); /* NULL gradients are skipped */
    float got[N];
    uint16_t got16[N];
    tu_read_f32(ctx, grads[0], got, N);
    for (int i = 0; i < N; i++)
        assert_true(got[i] == g32[i] * inv);
    assert_int_equal(loom_tensor_read(ctx, grads[2], got16, sizeof got16), LOOM_OK);
    for (int i = 0; i < N; i++) /* in f32, rounded once to f16 */
        assert_int_equal(got16[i], loom_ir_f32_to_f16(loom_ir_f16_to_f32(g16[i]) * inv));
    assert_int_equal(loom_tensor_read(ctx, grads[3], got16, sizeof got16), LOOM_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(got16[i], loom_ir_f32_to_bf16(loom_ir_bf16_to_f32(gbf[i]) * inv));
    int32_t rank = -1;
    assert_int_equal(loom_tensor_rank(found, &rank), LOOM_OK);
    assert_int_equal(rank, 0);
    assert_true(read_f32(ctx, found) == 0.0f);
    /* the original gradients are untouched */
    tu_read_f32(ctx, orig[0], got, N);
    assert_memory_equal(got, g32, sizeof got);
    for (int i = 0; i < 4; i++)
        loom_tensor_release(orig[i]);
    loom_grad_scaler_destroy(s);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_unscale_multiplies_by_the_f32_reciprocal_of_the_scale(void **state) {
    (void)state;
    run_unscale_values(true);
    run_unscale_values(false);
}

/* found_inf of two gradients, the second holding `bad` at index 2 (of dtype dt). */
static float found_with(loom_context *ctx, loom_grad_scaler *s, loom_dtype dt, float bad) {
    float g[N] = {1, 2, 3, 4};
    g[2] = bad;
    loom_tensor *clean = tu_f32(ctx, N, G0), *other;
    if (dt == LOOM_DTYPE_F32) {
        other = tu_f32(ctx, N, g);
    } else {
        uint16_t h[N];
        for (int i = 0; i < N; i++)
            h[i] = dt == LOOM_DTYPE_F16 ? loom_ir_f32_to_f16(g[i]) : loom_ir_f32_to_bf16(g[i]);
        other = loom_tensor_from_host(ctx, dt, 2, (int64_t[]){2, 2}, h);
    }
    loom_tensor *grads[3] = {clean, NULL, other};
    loom_tensor *found = loom_grad_scaler_unscale(s, 3, grads);
    assert_non_null(found);
    float v = read_f32(ctx, found);
    loom_tensor_release(clean);
    loom_tensor_release(other);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    return v;
}

static void run_found_inf(bool eager) {
    loom_context *ctx = tu_context(eager);
    loom_grad_scaler *s = make_scaler(ctx, 65536.0, 2000);
    const loom_dtype dts[3] = {LOOM_DTYPE_F32, LOOM_DTYPE_F16, LOOM_DTYPE_BF16};
    for (int d = 0; d < 3; d++) {
        assert_true(found_with(ctx, s, dts[d], 5.0f) == 0.0f);
        assert_true(found_with(ctx, s, dts[d], INFINITY) == 1.0f);
        assert_true(found_with(ctx, s, dts[d], -INFINITY) == 1.0f);
        assert_true(found_with(ctx, s, dts[d], NAN) == 1.0f);
    }
    /* as PyTorch, the incoming values are checked: with a scale below 1, a finite gradient
     * may overflow when unscaled without being flagged */
    loom_grad_scaler *half = make_scaler(ctx, 0.5, 2000);
    float huge[N] = {3e38f, 1, 2, 3}, got[N];
    loom_tensor *g = tu_f32(ctx, N, huge), *grads[1] = {g};
    loom_tensor *found_huge = loom_grad_scaler_unscale(half, 1, grads);
    assert_true(read_f32(ctx, found_huge) == 0.0f);
    tu_read_f32(ctx, grads[0], got, N);
    assert_true(isinf(got[0]) && got[3] == 6.0f);
    loom_tensor_release(g);
    loom_grad_scaler_destroy(half);
    /* no gradient at all: nothing found */
    loom_tensor *none[2] = {NULL, NULL};
    loom_tensor *found = loom_grad_scaler_unscale(s, 2, none);
    assert_non_null(found);
    assert_true(read_f32(ctx, found) == 0.0f);
    found = loom_grad_scaler_unscale(s, 0, NULL);
    assert_non_null(found);
    assert_true(read_f32(ctx, found) == 0.0f);
    /* an empty gradient is unscaled (to an empty tensor) and finds nothing */
    loom_tensor *empty = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){0, 3}, G0);
    loom_tensor *with_empty[1] = {empty};
    found = loom_grad_scaler_unscale(s, 1, with_empty);
    assert_non_null(found);
    assert_true(with_empty[0] != empty);
    int64_t numel = -1;
    assert_int_equal(loom_tensor_numel(with_empty[0], &numel), LOOM_OK);
    assert_int_equal(numel, 0);
    assert_true(read_f32(ctx, found) == 0.0f);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    loom_tensor_release(empty);
    loom_grad_scaler_destroy(s);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_unscale_finds_inf_minus_inf_and_nan_in_any_gradient(void **state) {
    (void)state;
    run_found_inf(true);
    run_found_inf(false);
}

/* ---- update -------------------------------------------------------------------------- */

static void update_with(loom_context *ctx, loom_grad_scaler *s, float flag) {
    loom_tensor *f = tu_scalar_f32(ctx, flag);
    assert_int_equal(loom_grad_scaler_update(s, f), LOOM_OK);
    if (loom_mark_step(ctx) != LOOM_OK) {
        print_error("%s\n", loom_context_error_message(ctx));
        fail();
    }
    loom_tensor_release(f);
}

static void run_growth(bool eager) {
    loom_context *ctx = tu_context(eager);
    loom_grad_scaler *s = make_scaler(ctx, 1024.0, 3);
    update_with(ctx, s, 0.0f);
    expect_scaler(ctx, s, 1024.0f, 1);
    update_with(ctx, s, 0.0f);
    expect_scaler(ctx, s, 1024.0f, 2);
    update_with(ctx, s, 0.0f); /* the third clean step in a row grows the scale */
    expect_scaler(ctx, s, 2048.0f, 0);
    update_with(ctx, s, 0.0f);
    expect_scaler(ctx, s, 2048.0f, 1);
    update_with(ctx, s, 1.0f); /* an overflow halves it and restarts the count */
    expect_scaler(ctx, s, 1024.0f, 0);
    update_with(ctx, s, NAN); /* NaN counts as found */
    expect_scaler(ctx, s, 512.0f, 0);
    update_with(ctx, s, 0.0f);
    update_with(ctx, s, 0.0f);
    expect_scaler(ctx, s, 512.0f, 2);
    bool yes = true; /* a bool flag of shape [1] works too */
    loom_tensor *b = loom_tensor_from_host(ctx, LOOM_DTYPE_BOOL, 1, (int64_t[]){1}, &yes);
    assert_int_equal(loom_grad_scaler_update(s, b), LOOM_OK);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    expect_scaler(ctx, s, 256.0f, 0);
    loom_tensor_release(b);
    if (!eager) /* the scale and the tracker are graph inputs: one graph for every step */
        assert_int_equal(loom_metric_value(ctx, "Fallbacks"), 0);
    loom_grad_scaler_destroy(s);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_scale_grows_after_growth_interval_clean_steps_and_backs_off(void **state) {
    (void)state;
    run_growth(true);
    run_growth(false);
}

static void run_no_growth_to_inf(bool eager) {
    loom_context *ctx = tu_context(eager);
    loom_grad_scaler *s = make_scaler(ctx, FLT_MAX, 1); /* FLT_MAX * 2 is inf in f32 */
    update_with(ctx, s, 0.0f);
    expect_scaler(ctx, s, FLT_MAX, 0);
    update_with(ctx, s, 0.0f);
    expect_scaler(ctx, s, FLT_MAX, 0);
    update_with(ctx, s, 1.0f);
    expect_scaler(ctx, s, (float)((double)FLT_MAX * 0.5), 0);
    /* a product computed in f64 and rounded once: 3 * 1.1 grows to f32(3.3000000000000003) */
    loom_grad_scaler_options o;
    loom_grad_scaler_options_init(&o);
    o.init_scale = 3.0;
    o.growth_factor = 1.1;
    o.growth_interval = 1;
    loom_grad_scaler *t = NULL;
    assert_int_equal(loom_grad_scaler_create(ctx, &o, &t), LOOM_OK);
    loom_tensor *f = tu_scalar_f32(ctx, 0.0f);
    assert_int_equal(loom_grad_scaler_update(t, f), LOOM_OK);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    expect_scaler(ctx, t, (float)(3.0 * 1.1), 0);
    loom_tensor_release(f);
    loom_grad_scaler_destroy(t);
    loom_grad_scaler_destroy(s);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_scale_never_grows_past_the_largest_f32(void **state) {
    (void)state;
    run_no_growth_to_inf(true);
    run_no_growth_to_inf(false);
}

/* ---- with an optimizer ----------------------------------------------------------------- */

/* param, every state tensor of the optimizer (the step counter included), as bytes */
static size_t snapshot(loom_context *ctx, loom_optim *opt, loom_tensor *p, float *out) {
    tu_read_f32(ctx, p, out, N);
    loom_tensor *ts[4];
    int32_t k = loom_optim_state(opt, 0, NULL, ts);
    size_t n = N;
    for (int32_t j = 0; j < k; j++) {
        int64_t numel = 0;
        assert_int_equal(loom_tensor_numel(ts[j], &numel), LOOM_OK);
        tu_read_f32(ctx, ts[j], out + n, (size_t)numel);
        n += (size_t)numel;
    }
    return n;
}

/* One AMP step on loss = sum(p * x) * c: backward from the scaled loss, unscale, clip to
 * max_norm (when > 0; the total norm, retained, in *out_norm when out_norm is not NULL),
 * optimizer step on found_inf, update. With poison, the gradient gets `poison` at index 1
 * (added to the scaled gradient in the graph, as an overflow in backward would). */
static void amp_step_clipped(loom_context *ctx, loom_grad_scaler *s, loom_optim *opt,
                             loom_tensor *p, loom_tensor *x, float poison, double max_norm,
                             loom_tensor **out_norm) {
    loom_tensor *loss = loom_sum(ctx, loom_mul(ctx, p, x), 0, NULL, false);
    loom_tensor *grads[1] = {NULL};
    assert_int_equal(loom_backward(ctx, loom_grad_scaler_scale(s, loss), 1, &p, grads), LOOM_OK);
    if (poison != 0) {
        float pv[N] = {0};
        pv[1] = poison;
        loom_tensor *pt = tu_f32(ctx, N, pv);
        grads[0] = loom_add(ctx, grads[0], pt);
        loom_tensor_release(pt);
    }
    loom_tensor *found = loom_grad_scaler_unscale(s, 1, grads);
    assert_non_null(found);
    if (max_norm > 0) {
        loom_tensor *norm = NULL;
        assert_int_equal(loom_clip_grad_norm(ctx, 1, grads, max_norm, &norm), LOOM_OK);
        if (out_norm) {
            loom_tensor_retain(norm);
            *out_norm = norm;
        }
    }
    assert_int_equal(loom_optim_step(opt, grads, found), LOOM_OK);
    assert_int_equal(loom_grad_scaler_update(s, found), LOOM_OK);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
}

static void amp_step(loom_context *ctx, loom_grad_scaler *s, loom_optim *opt, loom_tensor *p,
                     loom_tensor *x, float poison) {
    amp_step_clipped(ctx, s, opt, p, x, poison, 0, NULL);
}

static void run_skip(loom_optim_kind kind, bool eager) {
    loom_context *ctx = tu_context(eager);
    loom_tensor *p = tu_f32(ctx, N, P0), *x = tu_f32(ctx, N, G0);
    loom_optim_options o;
    loom_optim_options_init(&o, kind);
    o.lr = 0.05;
    o.momentum = 0.9;
    loom_optim *opt = NULL;
    assert_int_equal(loom_optim_create(ctx, &o, 1, &p, &opt), LOOM_OK);
    loom_grad_scaler *s = make_scaler(ctx, 65536.0, 2000);
    amp_step(ctx, s, opt, p, x, 0); /* a clean step first: non-zero state */
    expect_scaler(ctx, s, 65536.0f, 1);
    /* the unscaled gradient was x exactly (power-of-two scale): p moved */
    float before[4 * N], after[4 * N];
    size_t n = snapshot(ctx, opt, p, before);
    assert_true(before[n - 1] == 1.0f); /* the step counter */
    assert_true(memcmp(before, P0, sizeof P0) != 0);
    const float poisons[3] = {INFINITY, NAN, -INFINITY};
    float want_scale = 65536.0f;
    for (int k = 0; k < 3; k++) {
        amp_step(ctx, s, opt, p, x, poisons[k]);
        assert_int_equal(snapshot(ctx, opt, p, after), n);
        assert_memory_equal(before, after, n * sizeof *after); /* bit-identical */
        want_scale *= 0.5f;
        expect_scaler(ctx, s, want_scale, 0);
    }
    amp_step(ctx, s, opt, p, x, 0); /* and it proceeds from there */
    snapshot(ctx, opt, p, after);
    assert_true(after[n - 1] == 2.0f);
    assert_true(memcmp(before, after, N * sizeof *after) != 0);
    expect_scaler(ctx, s, want_scale, 1);
    loom_grad_scaler_destroy(s);
    loom_optim_destroy(opt);
    loom_tensor_release(p);
    loom_tensor_release(x);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_inf_or_nan_gradients_skip_sgd_and_adamw_steps_bit_identically(void **state) {
    (void)state;
    run_skip(LOOM_OPTIM_SGD, true);
    run_skip(LOOM_OPTIM_SGD, false);
    run_skip(LOOM_OPTIM_ADAMW, true);
    run_skip(LOOM_OPTIM_ADAMW, false);
}

/* SGD with momentum behind unscale and clip_grad_norm(max_norm 1): the clean steps scale the
 * gradient (x, norm ||x|| > 1) by 1 / (||x|| + 1e-6); an inf or NaN gradient gives an inf or
 * NaN norm, and the step leaves the parameter, the buffer and the counter bit-identical while
 * the scale halves. */
static void run_clip_skip(bool eager) {
    loom_context *ctx = tu_context(eager);
    loom_tensor *p = tu_f32(ctx, N, P0), *x = tu_f32(ctx, N, G0);
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_SGD);
    o.lr = 0.1;
    o.momentum = 0.9;
    loom_optim *opt = NULL;
    assert_int_equal(loom_optim_create(ctx, &o, 1, &p, &opt), LOOM_OK);
    loom_grad_scaler *s = make_scaler(ctx, 65536.0, 2000);
    double sq = 0;
    for (int i = 0; i < N; i++)
        sq += (double)G0[i] * G0[i];
    const double norm = sqrt(sq), coef = 1.0 / (norm + 1e-6);
    assert_true(coef < 0.5); /* a real clip */
    double want_p[N], buf[N];
    for (int i = 0; i < N; i++) { /* PyTorch's first SGD step: the buffer is the gradient */
        buf[i] = G0[i] * coef;
        want_p[i] = P0[i] - o.lr * buf[i];
    }
    loom_tensor *got_norm = NULL;
    amp_step_clipped(ctx, s, opt, p, x, 0, 1.0, &got_norm);
    assert_true(fabs(read_f32(ctx, got_norm) - norm) < 1e-6 * norm);
    loom_tensor_release(got_norm);
    float before[4 * N], after[4 * N];
    size_t n = snapshot(ctx, opt, p, before);
    assert_int_equal(n, 2 * N + 1); /* param, momentum_buffer, step */
    for (int i = 0; i < N; i++) {
        assert_true(fabs(before[i] - want_p[i]) < 1e-6);
        assert_true(fabs(before[N + i] - buf[i]) < 1e-6);
    }
    const float poisons[3] = {INFINITY, NAN, -INFINITY};
    float want_scale = 65536.0f;
    for (int k = 0; k < 3; k++) {
        amp_step_clipped(ctx, s, opt, p, x, poisons[k], 1.0, &got_norm);
        float nv = read_f32(ctx, got_norm);
        assert_true(isnan(poisons[k]) ? isnan(nv) : nv == INFINITY);
        loom_tensor_release(got_norm);
        assert_int_equal(snapshot(ctx, opt, p, after), n);
        assert_memory_equal(before, after, n * sizeof *after); /* bit-identical */
        want_scale *= 0.5f;
        expect_scaler(ctx, s, want_scale, 0);
    }
    amp_step_clipped(ctx, s, opt, p, x, 0, 1.0, NULL); /* and it proceeds from there */
    for (int i = 0; i < N; i++) {
        buf[i] = o.momentum * buf[i] + G0[i] * coef;
        want_p[i] -= o.lr * buf[i];
    }
    snapshot(ctx, opt, p, after);
    for (int i = 0; i < N; i++) {
        assert_true(fabs(after[i] - want_p[i]) < 1e-6);
        assert_true(fabs(after[N + i] - buf[i]) < 1e-6);
    }
    assert_true(after[n - 1] == 2.0f);
    expect_scaler(ctx, s, want_scale, 1);
    loom_grad_scaler_destroy(s);
    loom_optim_destroy(opt);
    loom_tensor_release(p);
    loom_tensor_release(x);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_clipping_after_unscale_skips_inf_and_nan_steps_with_the_optimizer(void **state) {
    (void)state;
    run_clip_skip(true);
    run_clip_skip(false);
}

/* Six AMP steps (one poisoned), clipped or not, without a single read from the device. */
static void run_never_read_back(double max_norm) {
    loom_context *ctx = tu_context(false);
    loom_tensor *p = tu_f32(ctx, N, P0), *x = tu_f32(ctx, N, G0);
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_ADAMW);
    loom_optim *opt = NULL;
    assert_int_equal(loom_optim_create(ctx, &o, 1, &p, &opt), LOOM_OK);
    loom_grad_scaler *s = make_scaler(ctx, 65536.0, 2);
    int64_t from0 = loom_metric_total(ctx, "TransferFromDeviceBytes");
    int64_t reads0 = loom_metric_value(ctx, "ForcedReads");
    assert_true(from0 >= 0);
    for (int step = 0; step < 6; step++)
        amp_step_clipped(ctx, s, opt, p, x, step == 3 ? INFINITY : 0, max_norm, NULL);
    assert_int_equal(loom_context_sync(ctx), LOOM_OK);
    assert_int_equal(loom_metric_total(ctx, "TransferFromDeviceBytes"), from0);
    assert_int_equal(loom_metric_value(ctx, "ForcedReads"), reads0);
    assert_int_equal(loom_metric_value(ctx, "Fallbacks"), 0);
    /* one graph for the clean steps, one for the poisoned step (its extra add) */
    assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 2);
    /* the device did the work: 2 clean steps grew the scale, the inf halved it, 2 more grew
     * it again */
    expect_scaler(ctx, s, 131072.0f, 0);
    loom_grad_scaler_destroy(s);
    loom_optim_destroy(opt);
    loom_tensor_release(p);
    loom_tensor_release(x);
    loom_context_destroy(ctx);
}

static void test_amp_training_steps_never_read_back_from_the_device(void **state) {
    (void)state;
    run_never_read_back(0);
    run_never_read_back(1.0); /* clip_grad_norm adds no sync either */
}

/* ---- f16 underflow --------------------------------------------------------------------- */

/* loss = sum(f32(f16(w) * x16)) * 1e-4 with x ~ 1e-4: the f16 gradient of f16(w) is ~1e-8,
 * below f16's smallest subnormal (6e-8), so it flushes to zero unless the loss is scaled.
 * The master weight w and its gradient stay f32. */
static void f16_grad(loom_context *ctx, loom_grad_scaler *s, loom_tensor *w, loom_tensor *x16,
                     bool f16, float *out) {
    loom_tensor *wc = f16 ? loom_cast(ctx, w, LOOM_DTYPE_F16) : w;
    loom_tensor *xc = f16 ? x16 : loom_cast(ctx, x16, LOOM_DTYPE_F32);
    loom_tensor *y = loom_mul(ctx, wc, xc);
    if (f16)
        y = loom_cast(ctx, y, LOOM_DTYPE_F32);
    loom_tensor *loss =
        loom_mul(ctx, loom_sum(ctx, y, 0, NULL, false), loom_scalar(ctx, LOOM_DTYPE_F32, 1e-4));
    loom_tensor *grads[1] = {NULL};
    assert_int_equal(loom_backward(ctx, s ? loom_grad_scaler_scale(s, loss) : loss, 1, &w, grads),
                     LOOM_OK);
    if (s) {
        loom_tensor *found = loom_grad_scaler_unscale(s, 1, grads);
        assert_true(read_f32(ctx, found) == 0.0f);
    }
    tu_read_f32(ctx, grads[0], out, N);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
}

static void run_f16_underflow(bool eager) {
    loom_context *ctx = tu_context(eager);
    const float xs[N] = {1e-4f, 2e-4f, -1.5e-4f, 1.2e-4f};
    uint16_t xh[N];
    for (int i = 0; i < N; i++)
        xh[i] = loom_ir_f32_to_f16(xs[i]);
    loom_tensor *w = tu_f32(ctx, N, P0);
    loom_tensor *x16 = loom_tensor_from_host(ctx, LOOM_DTYPE_F16, 1, (int64_t[]){N}, xh);
    float ref[N], plain[N], scaled[N];
    f16_grad(ctx, NULL, w, x16, false, ref); /* all in f32: the reference */
    f16_grad(ctx, NULL, w, x16, true, plain);
    loom_grad_scaler *s = make_scaler(ctx, 65536.0, 2000);
    f16_grad(ctx, s, w, x16, true, scaled);
    for (int i = 0; i < N; i++) {
        assert_true(fabsf(ref[i]) > 5e-9f);
        assert_true(plain[i] == 0.0f); /* flushed to zero in f16 */
        /* f16 rounding of x (already in ref), of the seed 6.5536 and of the product */
        if (!(fabsf(scaled[i] - ref[i]) <= 2e-3f * fabsf(ref[i]))) {
            print_error("grad[%d] = %g, want %g\n", i, scaled[i], ref[i]);
            fail();
        }
    }
    loom_grad_scaler_destroy(s);
    loom_tensor_release(w);
    loom_tensor_release(x16);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_f16_gradients_that_underflow_survive_with_the_scaler(void **state) {
    (void)state;
    run_f16_underflow(true);
    run_f16_underflow(false);
}

/* ---- disabled ------------------------------------------------------------------------ */

static void test_a_disabled_scaler_changes_nothing(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    int32_t live0 = ctx->n_live_tensors;
    loom_grad_scaler_options o;
    loom_grad_scaler_options_init(&o);
    o.enabled = false;
    o.growth_factor = 0.5; /* not looked at, as in PyTorch */
    loom_grad_scaler *s = NULL;
    assert_int_equal(loom_grad_scaler_create(ctx, &o, &s), LOOM_OK);
    assert_false(loom_grad_scaler_is_enabled(s));
    assert_int_equal(ctx->n_live_tensors, live0); /* no state */
    loom_tensor *loss = tu_scalar_f32(ctx, 2.0f), *g = tu_f32(ctx, N, G0);
    assert_ptr_equal(loom_grad_scaler_scale(s, loss), loss);
    loom_tensor *grads[2] = {g, NULL};
    assert_null(loom_grad_scaler_unscale(s, 2, grads));
    assert_ptr_equal(grads[0], g);
    assert_null(grads[1]);
    assert_int_equal(loom_grad_scaler_update(s, NULL), LOOM_OK);
    assert_int_equal(loom_grad_scaler_update(s, loss), LOOM_OK);
    assert_null(loom_grad_scaler_scale_tensor(s));
    assert_null(loom_grad_scaler_growth_tracker(s));
    assert_int_equal(loom_grad_scaler_state(s, NULL, NULL), 0);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 0); /* nothing was recorded */
    float got[N];
    tu_read_f32(ctx, g, got, N);
    assert_memory_equal(got, G0, sizeof got);
    loom_tensor_release(loss);
    loom_tensor_release(g);
    loom_grad_scaler_destroy(s);
    loom_context_destroy(ctx);
}

/* ---- checkpoints --------------------------------------------------------------------- */

static void test_state_round_trips_through_safetensors_bit_exactly(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    loom_grad_scaler_options o;
    loom_grad_scaler_options_init(&o);
    o.init_scale = 3.0;
    o.growth_factor = 1.5;
    o.backoff_factor = 0.25;
    o.growth_interval = 5;
    loom_grad_scaler *a = NULL, *b = make_scaler(ctx, 65536.0, 2000);
    assert_int_equal(loom_grad_scaler_create(ctx, &o, &a), LOOM_OK);
    update_with(ctx, a, 1.0f); /* 0.75 */
    update_with(ctx, a, 0.0f);
    update_with(ctx, a, 0.0f); /* tracker 2 */
    const char *names[LOOM_GRAD_SCALER_STATE_MAX];
    loom_tensor *ta[LOOM_GRAD_SCALER_STATE_MAX], *tb[LOOM_GRAD_SCALER_STATE_MAX];
    assert_int_equal(loom_grad_scaler_state(a, names, ta), 5);
    assert_int_equal(loom_grad_scaler_state(b, NULL, tb), 5);
    const char *want[5] = {"scale", "growth_factor", "backoff_factor", "growth_interval",
                           "_growth_tracker"};
    const loom_dtype want_dt[5] = {LOOM_DTYPE_F32, LOOM_DTYPE_F64, LOOM_DTYPE_F64, LOOM_DTYPE_I64,
                                   LOOM_DTYPE_I32};
    char keys[5][64];
    loom_named_tensor na[5], nb[5];
    for (int i = 0; i < 5; i++) {
        assert_string_equal(names[i], want[i]);
        loom_dtype dt;
        int32_t rank = -1;
        assert_int_equal(loom_tensor_dtype(ta[i], &dt), LOOM_OK);
        assert_int_equal(loom_tensor_rank(ta[i], &rank), LOOM_OK);
        assert_int_equal(dt, want_dt[i]);
        assert_int_equal(rank, 0);
        snprintf(keys[i], sizeof keys[i], "scaler.%s", names[i]);
        na[i] = (loom_named_tensor){keys[i], ta[i]};
        nb[i] = (loom_named_tensor){keys[i], tb[i]};
    }
    assert_ptr_equal(ta[0], loom_grad_scaler_scale_tensor(a));
    assert_ptr_equal(ta[4], loom_grad_scaler_growth_tracker(a));
    char dir[] = "/tmp/loom-scaler-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/scaler.safetensors", dir);
    assert_int_equal(loom_safetensors_save(ctx, path, 5, na), LOOM_OK);
    assert_int_equal(loom_safetensors_load(ctx, path, 5, nb, true), LOOM_OK);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(rmdir(dir), 0);
    for (int i = 0; i < 5; i++) {
        uint8_t va[8] = {0}, vb[8] = {0};
        size_t size = loom_dtype_size(want_dt[i]);
        assert_int_equal(loom_tensor_read(ctx, ta[i], va, size), LOOM_OK);
        assert_int_equal(loom_tensor_read(ctx, tb[i], vb, size), LOOM_OK);
        assert_memory_equal(va, vb, size);
    }
    expect_scaler(ctx, b, 0.75f, 2);
    /* and b now runs with a's hyperparameters: 3 more clean steps reach the interval of 5 */
    update_with(ctx, b, 0.0f);
    update_with(ctx, b, 0.0f);
    expect_scaler(ctx, b, 0.75f, 4);
    update_with(ctx, b, 0.0f);
    expect_scaler(ctx, b, 1.125f, 0);
    update_with(ctx, b, 1.0f);
    expect_scaler(ctx, b, 0.28125f, 0);
    assert_int_equal(loom_grad_scaler_state(NULL, names, ta), 0);
    loom_grad_scaler_destroy(a);
    loom_grad_scaler_destroy(b);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

/* ---- bad input ----------------------------------------------------------------------- */

static void expect_error(loom_context *ctx, loom_status want, const char *message) {
    assert_int_equal(loom_context_error(ctx), want);
    if (!strstr(loom_context_error_message(ctx), message)) {
        print_error("message '%s' lacks '%s'\n", loom_context_error_message(ctx), message);
        fail();
    }
    loom_context_clear_error(ctx);
}

static void expect_rejected(loom_context *ctx, const loom_grad_scaler_options *o,
                            const char *message) {
    loom_grad_scaler *s = (loom_grad_scaler *)&s; /* must be reset to NULL */
    assert_int_equal(loom_grad_scaler_create(ctx, o, &s), LOOM_STATUS_INVALID_ARGUMENT);
    assert_null(s);
    expect_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, message);
}

static void test_create_rejects_bad_options_naming_the_value(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    int32_t live0 = ctx->n_live_tensors;
    loom_grad_scaler_options o;
#define REJECT(field, value, msg)                                                                  \
    do {                                                                                           \
        loom_grad_scaler_options_init(&o);                                                         \
        o.field = value;                                                                           \
        expect_rejected(ctx, &o, msg);                                                             \
    } while (0)
    REJECT(init_scale, 0.0,
           "grad_scaler_create: init_scale must be finite (in f32) and > 0, got 0");
    REJECT(init_scale, -2.0, "init_scale must be finite (in f32) and > 0, got -2");
    REJECT(init_scale, INFINITY, "got inf");
    REJECT(init_scale, NAN, "got nan");
    REJECT(init_scale, 1e39, "got 1e+39"); /* inf in f32 */
    REJECT(growth_factor, 1.0, "growth_factor must be finite and > 1, got 1");
    REJECT(growth_factor, INFINITY, "growth_factor must be finite and > 1, got inf");
    REJECT(growth_factor, NAN, "growth_factor must be finite and > 1, got nan");
    REJECT(backoff_factor, 1.0, "backoff_factor must be in (0, 1), got 1");
    REJECT(backoff_factor, 0.0, "backoff_factor must be in (0, 1), got 0");
    REJECT(backoff_factor, NAN, "backoff_factor must be in (0, 1), got nan");
    REJECT(growth_interval, 0, "growth_interval must be >= 1, got 0");
    REJECT(growth_interval, -5, "growth_interval must be >= 1, got -5");
#undef REJECT
    expect_rejected(ctx, NULL, "grad_scaler_create: options is NULL");
    loom_grad_scaler_options_init(&o);
    assert_int_equal(loom_grad_scaler_create(ctx, &o, NULL), LOOM_STATUS_INVALID_ARGUMENT);
    expect_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, "out is NULL");
    loom_grad_scaler *s = NULL;
    assert_int_equal(loom_grad_scaler_create(NULL, &o, &s), LOOM_STATUS_INVALID_ARGUMENT);
    assert_null(s);
    loom_grad_scaler_destroy(NULL);
    assert_int_equal(ctx->n_live_tensors, live0); /* rejected creates left nothing behind */
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_bad_arguments_are_errors_and_the_context_stays_usable(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    loom_grad_scaler *s = make_scaler(ctx, 8.0, 2000);
    loom_tensor *g = tu_f32(ctx, N, G0);
    /* NULL scaler: nothing to record into */
    loom_tensor *grads[1] = {g};
    assert_null(loom_grad_scaler_scale(NULL, g));
    assert_null(loom_grad_scaler_unscale(NULL, 1, grads));
    assert_ptr_equal(grads[0], g);
    assert_int_equal(loom_grad_scaler_update(NULL, g), LOOM_STATUS_INVALID_ARGUMENT);
    assert_null(loom_grad_scaler_scale_tensor(NULL));
    assert_null(loom_grad_scaler_growth_tracker(NULL));
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    /* NULL loss: NULL without a new error (sticky) */
    assert_null(loom_grad_scaler_scale(s, NULL));
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    int32_t iv = 3;
    loom_tensor *i32 = loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 0, NULL, &iv);
    assert_null(loom_grad_scaler_scale(s, i32));
    expect_error(ctx, LOOM_STATUS_INVALID_ARGUMENT,
                 "grad_scaler_scale: loss is i32[]; it must be floating point");
    assert_null(loom_grad_scaler_unscale(s, 1, NULL));
    expect_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, "grad_scaler_unscale: grads is NULL");
    assert_null(loom_grad_scaler_unscale(s, -1, grads));
    expect_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, "n must be >= 0, got -1");
    loom_tensor *mixed[2] = {g, i32};
    assert_null(loom_grad_scaler_unscale(s, 2, mixed));
    expect_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, "grads[1] is i32[]; it must be floating point");
    assert_ptr_equal(mixed[0], g); /* nothing replaced */
    assert_int_equal(loom_grad_scaler_update(s, NULL), LOOM_STATUS_INVALID_ARGUMENT);
    expect_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, "grad_scaler_update: found_inf is NULL");
    assert_int_equal(loom_grad_scaler_update(s, g), LOOM_STATUS_INVALID_ARGUMENT);
    expect_error(ctx, LOOM_STATUS_INVALID_ARGUMENT,
                 "grad_scaler_update: found_inf must be one float or bool element, got f32[4]");
    assert_int_equal(loom_grad_scaler_update(s, i32), LOOM_STATUS_INVALID_ARGUMENT);
    expect_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, "got i32[]");
    /* stale handles: a released tensor, and a step's result after the step */
    loom_tensor *dead = tu_f32(ctx, N, G0);
    loom_tensor_release(dead);
    assert_null(loom_grad_scaler_scale(s, dead));
    expect_error(ctx, LOOM_STATUS_STALE_HANDLE, "grad_scaler_scale");
    loom_tensor *old_grads[1] = {g};
    loom_tensor *old_found = loom_grad_scaler_unscale(s, 1, old_grads);
    assert_non_null(old_found);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    assert_int_equal(loom_grad_scaler_update(s, old_found), LOOM_STATUS_STALE_HANDLE);
    expect_error(ctx, LOOM_STATUS_STALE_HANDLE, "grad_scaler_update");
    assert_null(loom_grad_scaler_unscale(s, 1, old_grads));
    expect_error(ctx, LOOM_STATUS_STALE_HANDLE, "grad_scaler_unscale");
    /* none of that changed the state, and the scaler still works */
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    expect_scaler(ctx, s, 8.0f, 0);
    update_with(ctx, s, 1.0f);
    expect_scaler(ctx, s, 4.0f, 0);
    loom_tensor_release(i32);
    loom_tensor_release(g);
    loom_grad_scaler_destroy(s);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

/* ---- fusion ------------------------------------------------------------------------- */

/* The plan of one unscale of three gradients, read from the context's dump: each gradient
 * is read by one reduction kernel (the check), the products fuse into their users. */
static void test_unscale_checks_each_gradient_in_one_reduction_kernel(void **state) {
    (void)state;
    char dir[] = "/tmp/loom-scaler-plan-XXXXXX";
    assert_non_null(mkdtemp(dir));
    loom_context_options opts;
    loom_context_options_init(&opts);
    opts.dump_dir = dir;
    opts.cache_dir = "";
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&opts, &ctx), LOOM_OK);
    loom_grad_scaler *s = make_scaler(ctx, 1024.0, 2000);
    float big[64];
    for (int i = 0; i < 64; i++)
        big[i] = (float)i;
    loom_tensor *orig[3] = {loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){8, 8}, big),
                            loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){16}, big),
                            loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){32}, big)};
    loom_tensor *grads[3];
    memcpy(grads, orig, sizeof grads);
    loom_tensor *found = loom_grad_scaler_unscale(s, 3, grads);
    loom_tensor_retain(found);
    for (int i = 0; i < 3; i++)
        loom_tensor_retain(grads[i]);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    assert_true(read_f32(ctx, found) == 0.0f);
    float got[32];
    tu_read_f32(ctx, grads[2], got, 32);
    assert_true(got[31] == 31.0f / 1024.0f);
    loom_tensor_release(found);
    for (int i = 0; i < 3; i++) {
        loom_tensor_release(grads[i]);
        loom_tensor_release(orig[i]);
    }
    loom_grad_scaler_destroy(s);
    loom_context_destroy(ctx);

    DIR *dp = opendir(dir);
    assert_non_null(dp);
    char text[16384] = "";
    struct dirent *e;
    int n_plans = 0;
    while ((e = readdir(dp))) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (strstr(e->d_name, ".plan.txt")) {
            FILE *f = fopen(path, "r");
            assert_non_null(f);
            size_t n = fread(text, 1, sizeof text - 1, f);
            text[n] = '\0';
            fclose(f);
            n_plans++;
        }
        if (e->d_name[0] != '.')
            unlink(path);
    }
    closedir(dp);
    rmdir(dir);
    assert_int_equal(n_plans, 1);
    /* "kernel 5: reduction, root %25 (reduce_max)": one reduction per gradient, each reading
     * its gradient's input buffer; the flags combine in their epilogues (no kernel of its
     * own for a maximum) */
    int reductions = 0, combines = 0;
    for (const char *p = text; (p = strstr(p, "\nkernel ")); p++) {
        const char *eol = strchr(p + 1, '\n');
        assert_non_null(eol);
        const char *kind = strstr(p, ": reduction, root");
        reductions += kind && kind < eol;
        const char *max = strstr(p, "(maximum)");
        combines += max && max < eol;
    }
    assert_int_equal(reductions, 3);
    assert_int_equal(combines, 0);
}

/* ---- out of memory ------------------------------------------------------------------- */

static void test_every_entry_point_fails_cleanly_out_of_memory(void **state) {
    (void)state;
    for (int64_t fail_at = 1;; fail_at++) {
        test_alloc ta = {0};
        loom_context *ctx = tu_context_alloc(true, &ta);
        loom_tensor *loss = tu_scalar_f32(ctx, 2.0f), *g = tu_f32(ctx, N, G0);
        int32_t live0 = ctx->n_live_tensors;
        ta.fail_at = ta.n_allocs + fail_at;
        loom_grad_scaler_options o;
        loom_grad_scaler_options_init(&o);
        loom_grad_scaler *s = NULL;
        loom_status st = loom_grad_scaler_create(ctx, &o, &s);
        loom_tensor *grads[2] = {g, NULL};
        loom_tensor *found = NULL;
        if (st == LOOM_OK)
            st = loom_grad_scaler_scale(s, loss) ? LOOM_OK : loom_context_error(ctx);
        if (st == LOOM_OK) {
            found = loom_grad_scaler_unscale(s, 2, grads);
            st = found ? LOOM_OK : loom_context_error(ctx);
            if (!found)
                assert_ptr_equal(grads[0], g); /* untouched on failure */
        }
        if (st == LOOM_OK)
            st = loom_grad_scaler_update(s, found);
        bool failed = ta.n_failed > 0;
        if (failed) {
            assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
            if (!s)
                assert_int_equal(ctx->n_live_tensors, live0);
        } else {
            assert_int_equal(st, LOOM_OK);
        }
        ta.fail_at = 0;
        loom_context_clear_error(ctx);
        /* the context is usable: a fresh scaler works */
        loom_grad_scaler *t = make_scaler(ctx, 4.0, 1);
        update_with(ctx, t, 0.0f);
        expect_scaler(ctx, t, 8.0f, 0);
        loom_grad_scaler_destroy(t);
        loom_grad_scaler_destroy(s);
        loom_tensor_release(loss);
        loom_tensor_release(g);
        loom_context_destroy(ctx);
        assert_int_equal(ta.live_bytes, 0);
        if (!failed)
            break;
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_init_gives_pytorch_defaults),
        cmocka_unit_test(test_scale_multiplies_the_loss_and_keeps_its_dtype),
        cmocka_unit_test(test_unscale_multiplies_by_the_f32_reciprocal_of_the_scale),
        cmocka_unit_test(test_unscale_finds_inf_minus_inf_and_nan_in_any_gradient),
        cmocka_unit_test(test_scale_grows_after_growth_interval_clean_steps_and_backs_off),
        cmocka_unit_test(test_scale_never_grows_past_the_largest_f32),
        cmocka_unit_test(test_inf_or_nan_gradients_skip_sgd_and_adamw_steps_bit_identically),
        cmocka_unit_test(test_clipping_after_unscale_skips_inf_and_nan_steps_with_the_optimizer),
        cmocka_unit_test(test_amp_training_steps_never_read_back_from_the_device),
        cmocka_unit_test(test_f16_gradients_that_underflow_survive_with_the_scaler),
        cmocka_unit_test(test_a_disabled_scaler_changes_nothing),
        cmocka_unit_test(test_state_round_trips_through_safetensors_bit_exactly),
        cmocka_unit_test(test_create_rejects_bad_options_naming_the_value),
        cmocka_unit_test(test_bad_arguments_are_errors_and_the_context_stays_usable),
        cmocka_unit_test(test_unscale_checks_each_gradient_in_one_reduction_kernel),
        cmocka_unit_test(test_every_entry_point_fails_cleanly_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
