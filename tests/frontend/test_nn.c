/* nn functional ops: forward values against naive loops written here (conv2d, pooling,
 * norms) and hand-derived numbers (cross-entropy, argmax, one-hot, dropout), on both the
 * interpreter and the JIT, plus argument errors. Gradients are in test_autograd.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "frontend/frontend.h"
#include "loom/nn.h"

static void fill(float *p, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (float)((double)(seed >> 11) * 0x1.0p-53 * 2 - 1);
    }
}

/* ---- conv2d ---------------------------------------------------------------------------- */

typedef struct conv_case {
    int64_t n, c, h, w, o, kh, kw, stride[2], pad[2], dil[2], groups;
    bool bias;
} conv_case;

static void naive_conv(const conv_case *cc, const float *x, const float *w, const float *b,
                       int64_t oh, int64_t ow, double *y) {
    int64_t cg = cc->c / cc->groups, og = cc->o / cc->groups;
    for (int64_t n = 0; n < cc->n; n++)
        for (int64_t o = 0; o < cc->o; o++)
            for (int64_t i = 0; i < oh; i++)
                for (int64_t j = 0; j < ow; j++) {
                    double acc = b ? b[o] : 0;
                    int64_t g = o / og;
                    for (int64_t c = 0; c < cg; c++)
                        for (int64_t p = 0; p < cc->kh; p++)
                            for (int64_t q = 0; q < cc->kw; q++) {
                                int64_t hi = i * cc->stride[0] - cc->pad[0] + p * cc->dil[0];
                                int64_t wi = j * cc->stride[1] - cc->pad[1] + q * cc->dil[1];
                                if (hi < 0 || hi >= cc->h || wi < 0 || wi >= cc->w)
                                    continue;
                                int64_t ci = g * cg + c;
                                acc += (double)x[((n * cc->c + ci) * cc->h + hi) * cc->w + wi] *
                                       w[((o * cg + c) * cc->kh + p) * cc->kw + q];
                            }
                    y[((n * cc->o + o) * oh + i) * ow + j] = acc;
                }
}

static void check_conv(const conv_case *cc, bool eager) {
    loom_context *ctx = tu_context(eager);
    int64_t oh = (cc->h + 2 * cc->pad[0] - cc->dil[0] * (cc->kh - 1) - 1) / cc->stride[0] + 1;
    int64_t ow = (cc->w + 2 * cc->pad[1] - cc->dil[1] * (cc->kw - 1) - 1) / cc->stride[1] + 1;
    int64_t nx = cc->n * cc->c * cc->h * cc->w, nw = cc->o * (cc->c / cc->groups) * cc->kh * cc->kw;
    int64_t ny = cc->n * cc->o * oh * ow;
    float *x = malloc((size_t)nx * 4), *w = malloc((size_t)nw * 4), b[64],
          *y = malloc((size_t)ny * 4);
    double *ref = malloc((size_t)ny * 8);
    fill(x, nx, 1);
    fill(w, nw, 2);
    fill(b, cc->o, 3);
    naive_conv(cc, x, w, cc->bias ? b : NULL, oh, ow, ref);
    loom_tensor *tx =
        loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, (int64_t[]){cc->n, cc->c, cc->h, cc->w}, x);
    loom_tensor *tw = loom_tensor_from_host(
        ctx, LOOM_DTYPE_F32, 4, (int64_t[]){cc->o, cc->c / cc->groups, cc->kh, cc->kw}, w);
    loom_tensor *tb = cc->bias ? loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, &cc->o, b) : NULL;
    loom_tensor *ty = loom_conv2d(ctx, tx, tw, tb, cc->stride, cc->pad, cc->dil, cc->groups);
    if (!ty)
        fail_msg("%s", loom_context_error_message(ctx));
    int64_t s[4];
    assert_int_equal(loom_tensor_shape(ty, s), LOOM_OK);
    assert_int_equal(s[0], cc->n);
    assert_int_equal(s[1], cc->o);
    assert_int_equal(s[2], oh);
    assert_int_equal(s[3], ow);
    tu_read_f32(ctx, ty, y, (size_t)ny);
    for (int64_t i = 0; i < ny; i++)
        if (fabs(y[i] - ref[i]) > 1e-5 * (1 + fabs(ref[i])))
            fail_msg("conv2d y[%lld] = %g, expected %g", (long long)i, y[i], ref[i]);
    loom_tensor_release(tx);
    loom_tensor_release(tw);
    loom_tensor_release(tb);
    loom_context_destroy(ctx);
    free(x);
    free(w);
    free(y);
    free(ref);
}

static void test_conv2d_matches_naive_loops(void **state) {
    (void)state;
    const conv_case cases[] = {
        {1, 1, 5, 5, 2, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1, true},
        {2, 3, 7, 6, 4, 3, 2, {2, 1}, {1, 2}, {1, 1}, 1, true},
        {1, 2, 8, 8, 3, 3, 3, {1, 2}, {2, 1}, {2, 3}, 1, false},
        {2, 4, 5, 5, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2, true},
        {1, 4, 4, 4, 4, 1, 1, {1, 1}, {0, 0}, {1, 1}, 4, false}, /* depthwise 1x1 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        check_conv(&cases[i], true);
        check_conv(&cases[i], false);
    }
}

/* ---- pooling --------------------------------------------------------------------------- */

/* tiled: windows that tile x exactly (kernel == stride, no padding), computed as a
 * reduction over window axes; otherwise overlapping, padded windows (strided slices). */
static void check_pool(bool is_max, bool eager, bool tiled) {
    loom_context *ctx = tu_context(eager);
    enum { N = 2, C = 3, H = 7, W = 6 };
    int64_t k[2] = {3, 2}, st[2] = {2, 2}, pd[2] = {1, 1};
    if (tiled) { /* 2x2 windows over a 6x6 image */
        k[0] = 2;
        st[0] = 2;
        pd[0] = pd[1] = 0;
    }
    const int64_t h = tiled ? H - 1 : H; /* tiled: 6x6, a multiple of the 2x2 window */
    int64_t oh = (h + 2 * pd[0] - k[0]) / st[0] + 1, ow = (W + 2 * pd[1] - k[1]) / st[1] + 1;
    float x[N * C * H * W], y[N * C * 4 * 4];
    fill(x, N * C * H * W, 5);
    loom_tensor *tx = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, (int64_t[]){N, C, h, W}, x);
    loom_tensor *ty =
        is_max ? loom_max_pool2d(ctx, tx, k, st, pd) : loom_avg_pool2d(ctx, tx, k, st, pd);
    if (!ty)
        fail_msg("%s", loom_context_error_message(ctx));
    assert_int_equal(oh, tiled ? 3 : 4);
    assert_int_equal(ow, tiled ? 3 : 4);
    tu_read_f32(ctx, ty, y, (size_t)(N * C * oh * ow));
    for (int64_t nc = 0; nc < N * C; nc++)
        for (int64_t i = 0; i < oh; i++)
            for (int64_t j = 0; j < ow; j++) {
                double acc = is_max ? -INFINITY : 0;
                for (int64_t p = 0; p < k[0]; p++)
                    for (int64_t q = 0; q < k[1]; q++) {
                        int64_t hi = i * st[0] - pd[0] + p, wi = j * st[1] - pd[1] + q;
                        double v = hi < 0 || hi >= h || wi < 0 || wi >= W
                                       ? (is_max ? -INFINITY : 0)
                                       : x[(nc * h + hi) * W + wi];
                        acc = is_max ? fmax(acc, v) : acc + v;
                    }
                if (!is_max)
                    acc /= (double)(k[0] * k[1]);
                assert_float_equal(y[(nc * oh + i) * ow + j], acc, 1e-6);
            }
    loom_tensor_release(tx);
    loom_context_destroy(ctx);
}

static void test_max_and_avg_pool_match_naive_loops(void **state) {
    (void)state;
    for (int tiled = 0; tiled < 2; tiled++) {
        check_pool(true, true, tiled);
        check_pool(true, false, tiled);
        check_pool(false, true, tiled);
        check_pool(false, false, tiled);
    }
}

/* max_pool2d and its gradient (loss = sum(y * r): dy = r) against loops written here with
 * PyTorch's rule: each window's value and gradient go to its first maximum. Rows of 16
 * windows and a tail, column strides 1, 2 and 3 (the kernel's three ways of reading a
 * tap), padding, a last row that no window reaches, runs of equal values (ties) in x; in
 * f32 and in bf16 (x and r bf16 values, so only dx's sums round). */
typedef struct pool_case {
    int64_t h, w, k[2], st[2], pd[2];
} pool_case;

/* f's nearest bf16 toward zero: a value bf16 holds exactly */
static float bf16_exact(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u &= 0xffff0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void check_max_pool(const pool_case *pc, bool eager, loom_dtype dt) {
    enum { N = 2, C = 2, MAXX = N * C * 9 * 40, MAXY = N * C * 9 * 40 };
    loom_context *ctx = tu_context(eager);
    int64_t oh = (pc->h + 2 * pc->pd[0] - pc->k[0]) / pc->st[0] + 1;
    int64_t ow = (pc->w + 2 * pc->pd[1] - pc->k[1]) / pc->st[1] + 1;
    int64_t nx = N * C * pc->h * pc->w, ny = N * C * oh * ow;
    static float x[MAXX], r[MAXY], y[MAXY], dx[MAXX];
    assert_true(nx <= MAXX && ny <= MAXY);
    fill(x, nx, 11);
    fill(r, ny, 12);
    for (int64_t i = 0; i < nx; i += 7) /* ties: runs of one value */
        x[i] = x[i + 1 < nx ? i + 1 : i] = 0.25f;
    bool b16 = dt == LOOM_DTYPE_BF16;
    for (int64_t i = 0; b16 && i < nx; i++)
        x[i] = bf16_exact(x[i]);
    for (int64_t i = 0; b16 && i < ny; i++)
        r[i] = bf16_exact(r[i]);
    loom_tensor *tx32 =
        loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, (int64_t[]){N, C, pc->h, pc->w}, x);
    loom_tensor *tr = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, (int64_t[]){N, C, oh, ow}, r);
    loom_tensor *tx = b16 ? loom_cast(ctx, tx32, dt) : tx32;
    loom_tensor *ty = loom_max_pool2d(ctx, tx, pc->k, pc->st, pc->pd);
    loom_tensor *g = NULL;
    loom_tensor *weights = b16 ? loom_cast(ctx, tr, dt) : tr;
    loom_tensor *loss = loom_sum(ctx, loom_mul(ctx, ty, weights), 0, NULL, false);
    assert_int_equal(loom_backward(ctx, loss, 1, &tx, &g), LOOM_OK);
    tu_read_f32(ctx, b16 ? loom_cast(ctx, ty, LOOM_DTYPE_F32) : ty, y, (size_t)ny);
    tu_read_f32(ctx, b16 ? loom_cast(ctx, g, LOOM_DTYPE_F32) : g, dx, (size_t)nx);
    static double want_dx[MAXX];
    memset(want_dx, 0, sizeof want_dx);
    for (int64_t nc = 0; nc < N * C; nc++)
        for (int64_t i = 0; i < oh; i++)
            for (int64_t j = 0; j < ow; j++) {
                int64_t best = -1;
                for (int64_t p = 0; p < pc->k[0]; p++)
                    for (int64_t q = 0; q < pc->k[1]; q++) {
                        int64_t hi = i * pc->st[0] - pc->pd[0] + p,
                                wi = j * pc->st[1] - pc->pd[1] + q;
                        if (hi < 0 || hi >= pc->h || wi < 0 || wi >= pc->w)
                            continue;
                        int64_t at = (nc * pc->h + hi) * pc->w + wi;
                        if (best < 0 || x[at] > x[best])
                            best = at;
                    }
                int64_t o = (nc * oh + i) * ow + j;
                assert_float_equal(y[o], x[best], 0.0);
                want_dx[best] += r[o];
            }
    /* bf16: a sum of up to four r's, rounded once to 8 bits of mantissa */
    double tol = b16 ? 1.0 / 256 : 1e-6;
    for (int64_t i = 0; i < nx; i++)
        if (fabs(dx[i] - want_dx[i]) > tol * (b16 ? fabs(want_dx[i]) : 1.0))
            fail_msg("%lldx%lld window, stride %lldx%lld, %s, %s: dx[%lld] = %g, want %g",
                     (long long)pc->k[0], (long long)pc->k[1], (long long)pc->st[0],
                     (long long)pc->st[1], eager ? "eager" : "compiled", b16 ? "bf16" : "f32",
                     (long long)i, dx[i], want_dx[i]);
    loom_tensor_release(tx32);
    loom_tensor_release(tr);
    loom_context_destroy(ctx);
}

static void test_max_pool_sends_the_gradient_to_each_windows_first_maximum(void **state) {
    (void)state;
    static const pool_case cases[] = {
        {9, 40, {3, 3}, {2, 2}, {1, 1}}, /* ResNet's stem pool: 20 windows a row */
        {7, 37, {3, 3}, {1, 1}, {1, 1}}, /* stride 1: 37 windows, overlapping */
        {8, 38, {2, 3}, {3, 3}, {0, 1}}, /* stride 3: pixel by pixel */
        {6, 33, {2, 2}, {2, 2}, {0, 0}}, /* tiling windows, the last column left over */
        {9, 20, {2, 2}, {3, 2}, {0, 0}}, /* the last row reached by no window */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int e = 0; e < 2; e++) {
            check_max_pool(&cases[i], e == 0, LOOM_DTYPE_F32);
            check_max_pool(&cases[i], e == 0, LOOM_DTYPE_BF16);
        }
}

/* ---- losses and labels ----------------------------------------------------------------- */

static void test_cross_entropy_matches_hand_computed_values(void **state) {
    (void)state;
    for (int e = 0; e < 2; e++) {
        loom_context *ctx = tu_context(e == 0);
        float logits[6] = {1, 2, 3, 0, 0, 5};
        int64_t labels[2] = {2, 0};
        loom_tensor *tl = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 3}, logits);
        loom_tensor *ty = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 1, (int64_t[]){2}, labels);
        double l0 = log(exp(1) + exp(2) + exp(3)) - 3, l1 = log(2 + exp(5)) - 0;
        float none[2], sum, mean;
        tu_read_f32(ctx, loom_cross_entropy(ctx, tl, ty, LOOM_REDUCTION_NONE), none, 2);
        tu_read_f32(ctx, loom_cross_entropy(ctx, tl, ty, LOOM_REDUCTION_SUM), &sum, 1);
        tu_read_f32(ctx, loom_cross_entropy(ctx, tl, ty, LOOM_REDUCTION_MEAN), &mean, 1);
        assert_float_equal(none[0], l0, 1e-6);
        assert_float_equal(none[1], l1, 1e-5);
        assert_float_equal(sum, l0 + l1, 1e-5);
        assert_float_equal(mean, (l0 + l1) / 2, 1e-5);
        /* an out-of-range label is ignored: not counted in the mean */
        int64_t bad[2] = {2, -100};
        loom_tensor *tb = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 1, (int64_t[]){2}, bad);
        tu_read_f32(ctx, loom_cross_entropy(ctx, tl, tb, LOOM_REDUCTION_MEAN), &mean, 1);
        assert_float_equal(mean, l0, 1e-6);
        float sm[6], lsm[6];
        tu_read_f32(ctx, loom_softmax(ctx, tl, 1), sm, 6);
        tu_read_f32(ctx, loom_log_softmax(ctx, tl, 1), lsm, 6);
        for (int i = 0; i < 6; i++)
            assert_float_equal(logf(sm[i]), lsm[i], 1e-5);
        assert_float_equal(sm[0] + sm[1] + sm[2], 1, 1e-6);
        loom_tensor_release(tl);
        loom_tensor_release(ty);
        loom_tensor_release(tb);
        loom_context_destroy(ctx);
    }
}

/* logits [2, 2, 3] against labels [2, 2] with ignore_index 1 (an in-range class: rows 2 and
 * 3 not counted) and label smoothing 0.1: per row 0.9 (lse - x[label]) + 0.1 (lse - mean x). */
static void test_cross_entropy_over_leading_axes_with_ignore_index_and_smoothing(void **state) {
    (void)state;
    for (int e = 0; e < 2; e++) {
        loom_context *ctx = tu_context(e == 0);
        const float logits[12] = {1, 2, 3, 0, 0, 5, 2, -1, 0.5f, 0, 1, 0};
        const int32_t labels[4] = {2, 0, 1, 1};
        loom_tensor *tl =
            loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 3, (int64_t[]){2, 2, 3}, logits);
        loom_tensor *ty = loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 2, (int64_t[]){2, 2}, labels);
        double want[4] = {0, 0, 0, 0};
        for (int r = 0; r < 2; r++) {
            const float *x = logits + 3 * r;
            double lse = log(exp(x[0]) + exp(x[1]) + exp(x[2]));
            want[r] = 0.9 * (lse - x[labels[r]]) + 0.1 * (lse - (x[0] + x[1] + x[2]) / 3);
        }
        loom_cross_entropy_options o = {LOOM_REDUCTION_NONE, 1, 0.1};
        float none[4], mean;
        loom_tensor *ln = loom_cross_entropy_ex(ctx, tl, ty, &o);
        int64_t sh[LOOM_MAX_RANK];
        int32_t rank = 0;
        assert_int_equal(loom_tensor_rank(ln, &rank), LOOM_OK);
        assert_int_equal(rank, 2);
        assert_int_equal(loom_tensor_shape(ln, sh), LOOM_OK);
        assert_int_equal(sh[0] * 10 + sh[1], 22);
        tu_read_f32(ctx, ln, none, 4);
        o.reduction = LOOM_REDUCTION_MEAN;
        tu_read_f32(ctx, loom_cross_entropy_ex(ctx, tl, ty, &o), &mean, 1);
        for (int r = 0; r < 4; r++)
            assert_float_equal(none[r], want[r], 1e-5);
        assert_float_equal(mean, (want[0] + want[1]) / 2, 1e-5);
        /* the defaults (NULL): mean, ignore_index -100, no smoothing */
        tu_read_f32(ctx, loom_cross_entropy_ex(ctx, tl, ty, NULL), &mean, 1);
        double plain = 0;
        for (int r = 0; r < 4; r++) {
            const float *x = logits + 3 * r;
            plain += log(exp(x[0]) + exp(x[1]) + exp(x[2])) - x[labels[r]];
        }
        assert_float_equal(mean, plain / 4, 1e-5);
        o.label_smoothing = 1.5;
        assert_null(loom_cross_entropy_ex(ctx, tl, ty, &o));
        assert_non_null(strstr(loom_context_error_message(ctx), "label_smoothing 1.5"));
        loom_context_clear_error(ctx);
        loom_tensor_release(tl);
        loom_tensor_release(ty);
        loom_context_destroy(ctx);
    }
}

static void test_argmax_takes_the_first_maximum_and_one_hot_marks_labels(void **state) {
    (void)state;
    for (int e = 0; e < 2; e++) {
        loom_context *ctx = tu_context(e == 0);
        float x[8] = {1, 5, 5, 0, -1, -3, -1, -2};
        loom_tensor *tx = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 4}, x);
        int64_t am[2], am0[4];
        assert_int_equal(loom_tensor_read(ctx, loom_argmax(ctx, tx, 1), am, sizeof am), LOOM_OK);
        assert_int_equal(am[0], 1);
        assert_int_equal(am[1], 0);
        assert_int_equal(loom_tensor_read(ctx, loom_argmax(ctx, tx, 0), am0, sizeof am0), LOOM_OK);
        assert_int_equal(am0[0], 0);
        assert_int_equal(am0[1], 0);
        assert_int_equal(am0[2], 0);
        assert_int_equal(am0[3], 0);
        int32_t lab[3] = {2, 0, 7};
        loom_tensor *tl = loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 1, (int64_t[]){3}, lab);
        float oh[9];
        tu_read_f32(ctx, loom_one_hot(ctx, tl, 3, LOOM_DTYPE_F32), oh, 9);
        const float want[9] = {0, 0, 1, 1, 0, 0, 0, 0, 0};
        for (int i = 0; i < 9; i++)
            assert_float_equal(oh[i], want[i], 0);
        loom_tensor_release(tx);
        loom_tensor_release(tl);
        loom_context_destroy(ctx);
    }
}

/* ---- normalisation --------------------------------------------------------------------- */

static void test_batch_norm_normalises_and_updates_running_stats(void **state) {
    (void)state;
    for (int e = 0; e < 2; e++) {
        loom_context *ctx = tu_context(e == 0);
        /* x [2, 2, 1, 2]: channel 0 holds {1, 2, 3, 4}, channel 1 holds {0, 0, 4, 4} */
        float x[8] = {1, 2, 0, 0, 3, 4, 4, 4};
        float rm0[2] = {0, 0}, rv0[2] = {1, 1}, wv[2] = {2, 1}, bv[2] = {0, 1};
        loom_tensor *tx = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, (int64_t[]){2, 2, 1, 2}, x);
        loom_tensor *rm = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2}, rm0);
        loom_tensor *rv = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2}, rv0);
        loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2}, wv);
        loom_tensor *b = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2}, bv);
        loom_tensor *y = loom_batch_norm(ctx, tx, rm, rv, w, b, true, 0.1, 0.0);
        loom_tensor_retain(y);
        assert_int_equal(loom_mark_step(ctx), LOOM_OK);
        float yv[8], m[2], v[2];
        tu_read_f32(ctx, y, yv, 8);
        tu_read_f32(ctx, rm, m, 2);
        tu_read_f32(ctx, rv, v, 2);
        /* channel 0: mean 2.5, biased var 1.25; channel 1: mean 2, var 4 (unbiased 5.333) */
        double s0 = 1 / sqrt(1.25);
        assert_float_equal(yv[0], 2 * (1 - 2.5) * s0, 1e-5);
        assert_float_equal(yv[5], 2 * (4 - 2.5) * s0, 1e-5);
        assert_float_equal(yv[2], (0 - 2) / 2.0 + 1, 1e-6);
        assert_float_equal(yv[7], (4 - 2) / 2.0 + 1, 1e-6);
        assert_float_equal(m[0], 0.25, 1e-6);
        assert_float_equal(m[1], 0.2, 1e-6);
        assert_float_equal(v[0], 0.9 + 0.1 * 1.25 * 4 / 3, 1e-6);
        assert_float_equal(v[1], 0.9 + 0.1 * 16.0 / 3, 1e-6);
        loom_tensor_release(y);
        /* eval mode uses the running statistics */
        float ye[8];
        tu_read_f32(ctx, loom_batch_norm(ctx, tx, rm, rv, NULL, NULL, false, 0.1, 0.0), ye, 8);
        assert_float_equal(ye[0], (1 - m[0]) / sqrt(v[0]), 1e-5);
        loom_tensor *all[] = {tx, rm, rv, w, b};
        for (int i = 0; i < 5; i++)
            loom_tensor_release(all[i]);
        loom_context_destroy(ctx);
    }
}

static void test_layer_norm_gives_zero_mean_unit_variance_rows(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    float x[12];
    fill(x, 12, 9);
    loom_tensor *tx = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){3, 4}, x);
    float y[12];
    tu_read_f32(ctx, loom_layer_norm(ctx, tx, 1, NULL, NULL, 0.0), y, 12);
    for (int r = 0; r < 3; r++) {
        double m = 0, v = 0;
        for (int i = 0; i < 4; i++)
            m += y[r * 4 + i] / 4.0;
        for (int i = 0; i < 4; i++)
            v += (y[r * 4 + i] - m) * (y[r * 4 + i] - m) / 4.0;
        assert_float_equal(m, 0, 1e-6);
        assert_float_equal(v, 1, 1e-5);
    }
    loom_tensor_release(tx);
    loom_context_destroy(ctx);
}

/* ---- dropout and embedding ------------------------------------------------------------- */

static void test_dropout_is_deterministic_per_seed_and_scales_survivors(void **state) {
    (void)state;
    enum { N = 4096 };
    float *ones = malloc(N * 4), *a = malloc(N * 4), *b = malloc(N * 4), *c = malloc(N * 4);
    for (int i = 0; i < N; i++)
        ones[i] = 1;
    for (int e = 0; e < 2; e++) {
        loom_context *ctx = tu_context(e == 0);
        loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){N}, ones);
        int64_t s1 = 11, s2 = 12;
        loom_tensor *k1 = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 0, NULL, &s1);
        loom_tensor *k2 = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 0, NULL, &s2);
        tu_read_f32(ctx, loom_dropout(ctx, x, 0.25, true, k1, 0), a, N);
        tu_read_f32(ctx, loom_dropout(ctx, x, 0.25, true, k1, 0), b, N);
        tu_read_f32(ctx, loom_dropout(ctx, x, 0.25, true, k2, 0), c, N);
        int kept = 0, same = 0;
        for (int i = 0; i < N; i++) {
            assert_true(a[i] == 0 || fabsf(a[i] - 1 / 0.75f) < 1e-6f);
            kept += a[i] != 0;
            assert_float_equal(a[i], b[i], 0);
            same += (a[i] != 0) == (c[i] != 0);
        }
        assert_in_range(kept, N * 0.75 - 150, N * 0.75 + 150);
        assert_true(same < N - 100); /* another seed, another mask */
        tu_read_f32(ctx, loom_dropout(ctx, x, 0.25, false, NULL, 0), c, N); /* eval: identity */
        assert_float_equal(c[0], 1, 0);
        assert_float_equal(c[N - 1], 1, 0);
        loom_tensor_release(x);
        loom_tensor_release(k1);
        loom_tensor_release(k2);
        loom_context_destroy(ctx);
    }
    free(ones);
    free(a);
    free(b);
    free(c);
}

static void test_embedding_picks_rows(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    float table[8] = {0, 1, 10, 11, 20, 21, 30, 31};
    int64_t idx[4] = {3, 0, 3, 2};
    loom_tensor *t = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){4, 2}, table);
    loom_tensor *i = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 2, (int64_t[]){2, 2}, idx);
    loom_tensor *e = loom_embedding(ctx, i, t);
    int64_t s[3];
    assert_int_equal(loom_tensor_shape(e, s), LOOM_OK);
    assert_int_equal(s[2], 2);
    float out[8];
    tu_read_f32(ctx, e, out, 8);
    const float want[8] = {30, 31, 0, 1, 30, 31, 20, 21};
    for (int k = 0; k < 8; k++)
        assert_float_equal(out[k], want[k], 0);
    loom_tensor_release(t);
    loom_tensor_release(i);
    loom_context_destroy(ctx);
}

/* ---- attention ------------------------------------------------------------------------- */

typedef struct attn_case {
    int64_t bh, l, s, e, ev; /* batch*heads folded into one axis of 2 x (bh/2) */
    bool causal, bool_mask, add_mask;
} attn_case;

/* softmax(q k^T / sqrt(e) + mask) v in f64, and its gradients for the loss sum(out * w). */
static void naive_attention(const attn_case *c, const float *q, const float *k, const float *v,
                            const uint8_t *bmask, const float *amask, const float *w, double *out,
                            double *dq, double *dk, double *dv) {
    int64_t L = c->l, S = c->s, E = c->e, Ev = c->ev;
    double scale = 1 / sqrt((double)E);
    double *p = malloc((size_t)S * sizeof *p), *dp = malloc((size_t)S * sizeof *dp);
    memset(dk, 0, (size_t)(c->bh * S * E) * sizeof *dk);
    memset(dv, 0, (size_t)(c->bh * S * Ev) * sizeof *dv);
    for (int64_t b = 0; b < c->bh; b++)
        for (int64_t i = 0; i < L; i++) {
            const float *qi = q + (b * L + i) * E;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < S; j++) {
                double d = 0;
                for (int64_t x = 0; x < E; x++)
                    d += (double)qi[x] * k[(b * S + j) * E + x];
                d *= scale;
                if ((c->causal && j > i) || (c->bool_mask && !bmask[i * S + j]))
                    d = -INFINITY;
                if (c->add_mask)
                    d += amask[i * S + j];
                p[j] = d;
                mx = d > mx ? d : mx;
            }
            for (int64_t j = 0; j < S; j++)
                sum += p[j] = exp(p[j] - mx);
            for (int64_t j = 0; j < S; j++)
                p[j] /= sum;
            const float *wi = w + (b * L + i) * Ev;
            double *oi = out + (b * L + i) * Ev, dot = 0;
            for (int64_t y = 0; y < Ev; y++) {
                double acc = 0;
                for (int64_t j = 0; j < S; j++)
                    acc += p[j] * v[(b * S + j) * Ev + y];
                oi[y] = acc;
            }
            for (int64_t j = 0; j < S; j++) {
                double g = 0;
                for (int64_t y = 0; y < Ev; y++) {
                    g += (double)wi[y] * v[(b * S + j) * Ev + y];
                    dv[(b * S + j) * Ev + y] += p[j] * wi[y];
                }
                dp[j] = g;
                dot += g * p[j];
            }
            double *dqi = dq + (b * L + i) * E;
            memset(dqi, 0, (size_t)E * sizeof *dqi);
            for (int64_t j = 0; j < S; j++) {
                double ds = p[j] * (dp[j] - dot) * scale;
                for (int64_t x = 0; x < E; x++) {
                    dqi[x] += ds * k[(b * S + j) * E + x];
                    dk[(b * S + j) * E + x] += ds * qi[x];
                }
            }
        }
    free(p);
    free(dp);
}

static void expect_near(const char *what, const attn_case *c, bool eager, const float *got,
                        const double *want, int64_t n, double tol) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= tol * (1 + fabs(want[i]))))
            fail_msg("attention L %lld S %lld E %lld%s%s (%s): %s[%lld] = %.8g, want %.8g",
                     (long long)c->l, (long long)c->s, (long long)c->e, c->causal ? " causal" : "",
                     c->bool_mask ? " bool mask" : "", eager ? "interpreter" : "JIT", what,
                     (long long)i, got[i], want[i]);
}

/* The op forward and backward against naive_attention, through the interpreter and the JIT,
 * in the BHTD layout, and for BTHD the same values permuted. */
static void check_attention(const attn_case *c, bool eager, bool bthd) {
    int64_t B = 2, H = c->bh / 2, L = c->l, S = c->s, E = c->e, Ev = c->ev;
    int64_t nq = c->bh * L * E, nk = c->bh * S * E, nv = c->bh * S * Ev, no = c->bh * L * Ev;
    float *q = malloc((size_t)nq * 4), *k = malloc((size_t)nk * 4), *v = malloc((size_t)nv * 4);
    float *w = malloc((size_t)no * 4), *am = malloc((size_t)(L * S) * 4);
    uint8_t *bm = malloc((size_t)(L * S));
    fill(q, nq, 1 + (uint64_t)L);
    fill(k, nk, 2 + (uint64_t)S);
    fill(v, nv, 3 + (uint64_t)E);
    fill(w, no, 4);
    fill(am, L * S, 5);
    for (int64_t i = 0; i < L * S; i++)
        bm[i] = (i * 7 + i / S) % 3 != 0 || i % S == 0; /* every row keeps key 0 */
    double *want = malloc((size_t)no * 8), *wq = malloc((size_t)nq * 8);
    double *wk = malloc((size_t)nk * 8), *wv = malloc((size_t)nv * 8);
    naive_attention(c, q, k, v, bm, am, w, want, wq, wk, wv);

    loom_context *ctx = tu_context(eager);
    /* in BTHD the host data is the BHTD data permuted, so the reference stays the same */
    int64_t sq[4] = {B, H, L, E}, sk[4] = {B, H, S, E}, sv[4] = {B, H, S, Ev},
            so[4] = {B, H, L, Ev};
    loom_tensor *in[3] = {loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, sq, q),
                          loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, sk, k),
                          loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, sv, v)};
    static const int32_t perm[4] = {0, 2, 1, 3};
    loom_tensor *use[3];
    for (int i = 0; i < 3; i++)
        use[i] = bthd ? loom_permute(ctx, in[i], perm) : in[i];
    loom_tensor *mask = NULL;
    if (c->bool_mask)
        mask = loom_tensor_from_host(ctx, LOOM_DTYPE_BOOL, 2, (int64_t[]){L, S}, bm);
    if (c->add_mask)
        mask = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){L, S}, am);
    loom_attention_options o;
    loom_attention_options_init(&o);
    o.mask = mask;
    o.causal = c->causal;
    o.layout = bthd ? LOOM_ATTENTION_BTHD : LOOM_ATTENTION_BHTD;
    loom_tensor *y = loom_scaled_dot_product_attention_ex(ctx, use[0], use[1], use[2], &o);
    if (!y)
        fail_msg("%s", loom_context_error_message(ctx));
    if (bthd)
        y = loom_permute(ctx, y, perm);
    loom_tensor *tw = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, so, w);
    loom_tensor *loss = loom_sum(ctx, loom_mul(ctx, y, tw), 0, NULL, false);
    loom_tensor *g[3] = {0};
    assert_int_equal(loom_backward(ctx, loss, 3, in, g), LOOM_OK);
    int64_t most = nq > nk ? nq : nk;
    most = most > nv ? most : nv;
    float *got = malloc((size_t)(most > no ? most : no) * 4);
    tu_read_f32(ctx, y, got, (size_t)no);
    expect_near("out", c, eager, got, want, no, 2e-5);
    tu_read_f32(ctx, g[0], got, (size_t)nq);
    expect_near("dq", c, eager, got, wq, nq, 5e-5);
    tu_read_f32(ctx, g[1], got, (size_t)nk);
    expect_near("dk", c, eager, got, wk, nk, 5e-5);
    tu_read_f32(ctx, g[2], got, (size_t)nv);
    expect_near("dv", c, eager, got, wv, nv, 5e-5);
    for (int i = 0; i < 3; i++)
        loom_tensor_release(in[i]);
    loom_tensor_release(mask);
    loom_tensor_release(tw);
    loom_context_destroy(ctx);
    free(got);
    free(q);
    free(k);
    free(v);
    free(w);
    free(am);
    free(bm);
    free(want);
    free(wq);
    free(wk);
    free(wv);
}

static void test_attention_matches_the_definition_on_odd_lengths_and_head_sizes(void **state) {
    (void)state;
    /* T 1, 7, 63, 65, 257 and head sizes 8, 64, 80; L != S both ways; masks of both kinds */
    static const attn_case cases[] = {
        {2, 1, 1, 8, 8, true, false, false},       {4, 7, 7, 64, 64, true, false, false},
        {2, 63, 63, 80, 80, true, false, false},   {2, 65, 65, 8, 8, false, false, false},
        {2, 257, 257, 64, 64, true, false, false}, {2, 7, 65, 8, 16, false, true, false},
        {2, 65, 7, 80, 8, true, false, false},     {2, 63, 65, 64, 64, false, false, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int eager = 0; eager < 2; eager++)
            check_attention(&cases[i], eager, false);
    /* the token-major layout gives the same values */
    check_attention(&cases[1], false, true);
    check_attention(&cases[5], true, true);
}

/* Dropout on the attention weights: the graph's RNG as loom_dropout draws it, so the op
 * equals the composition with loom_dropout (seed, stream) and differs from no dropout. */
static void test_attention_dropout_is_loom_dropout_on_the_weights(void **state) {
    (void)state;
    enum { L = 9, E = 8, N = 2 * L * E };
    float q[N], k[N], v[N], a[N], b[N], c[N];
    fill(q, N, 21);
    fill(k, N, 22);
    fill(v, N, 23);
    for (int eager = 0; eager < 2; eager++) {
        loom_context *ctx = tu_context(eager);
        int64_t sh[4] = {1, 2, L, E}, sd = 77;
        loom_tensor *tq = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, sh, q);
        loom_tensor *tk = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, sh, k);
        loom_tensor *tv = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, sh, v);
        loom_tensor *seed = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 0, NULL, &sd);
        loom_attention_options o;
        loom_attention_options_init(&o);
        o.dropout_p = 0.25;
        o.seed = seed;
        o.stream = 3;
        tu_read_f32(ctx, loom_scaled_dot_product_attention_ex(ctx, tq, tk, tv, &o), a, N);
        loom_tensor *scores = loom_matmul(
            ctx, loom_mul(ctx, tq, loom_scalar(ctx, LOOM_DTYPE_F32, 1 / sqrt((double)E))),
            loom_transpose(ctx, tk));
        loom_tensor *w = loom_dropout(ctx, loom_softmax(ctx, scores, -1), 0.25, true, seed, 3);
        tu_read_f32(ctx, loom_matmul(ctx, w, tv), b, N);
        tu_read_f32(ctx, loom_scaled_dot_product_attention(ctx, tq, tk, tv, NULL, false, 0), c, N);
        int differ = 0;
        for (int i = 0; i < N; i++) {
            assert_float_equal(a[i], b[i], 1e-6);
            differ += fabsf(a[i] - c[i]) > 1e-4f;
        }
        assert_true(differ > N / 4);
        loom_tensor_release(tq);
        loom_tensor_release(tk);
        loom_tensor_release(tv);
        loom_tensor_release(seed);
        loom_context_destroy(ctx);
    }
}

/* How causal_attention computes: the fused op with causal, the fused op with the causal
 * tril as a bool mask, or the composition written out with public ops (scores, masked_fill,
 * softmax, loom_dropout on the weights, @ v). */
typedef enum att_path { PATH_CAUSAL, PATH_MASK, PATH_COMPOSED } att_path;

static loom_tensor *composed_attention(loom_context *ctx, loom_tensor *const *x, loom_dtype dt,
                                       int64_t D, loom_tensor *tril, double p, loom_tensor *seed) {
    loom_tensor *qs = loom_mul(ctx, x[0], loom_scalar(ctx, dt, 1 / sqrt((double)D)));
    loom_tensor *scores = loom_matmul(ctx, qs, loom_transpose(ctx, x[1]));
    scores = loom_select(ctx, tril, scores, loom_scalar(ctx, dt, -INFINITY));
    loom_tensor *w = loom_softmax(ctx, scores, -1);
    if (p > 0)
        w = loom_dropout(ctx, w, p, true, seed, 2);
    return loom_matmul(ctx, w, x[2]);
}

/* An additive mask [L, L] with dropout: the fused op's gradients (q's and the mask's, whose
 * VJP composes the scores with the forward's draws) equal the composition's, written out
 * with loom_dropout, through the interpreter and the JIT, in f32 and f64. */
static void test_attention_mask_gradient_with_dropout_is_the_compositions(void **state) {
    (void)state;
    enum { L = 11, E = 8, N = 2 * L * E };
    float q[N], k[N], v[N], w[N], m[L * L];
    fill(q, N, 31);
    fill(k, N, 32);
    fill(v, N, 33);
    fill(w, N, 34);
    fill(m, L * L, 35);
    for (int run = 0; run < 4; run++) {
        bool eager = run % 2;
        loom_dtype dt = run < 2 ? LOOM_DTYPE_F32 : LOOM_DTYPE_F64;
        loom_context *ctx = tu_context(eager);
        int64_t sh[4] = {1, 2, L, E}, sm[2] = {L, L}, sd = 91;
        loom_tensor *in[5] = {loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, sh, q),
                              loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, sh, k),
                              loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, sh, v),
                              loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, sm, m),
                              loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, sh, w)};
        loom_tensor *seed = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 0, NULL, &sd);
        loom_tensor *x[4];
        for (int i = 0; i < 4; i++)
            x[i] = loom_cast(ctx, in[i], dt);
        double got[2][N];
        for (int fused = 0; fused < 2; fused++) {
            loom_tensor *y;
            if (fused) {
                loom_attention_options o;
                loom_attention_options_init(&o);
                o.mask = x[3];
                o.dropout_p = 0.3;
                o.seed = seed;
                o.stream = 4;
                y = loom_scaled_dot_product_attention_ex(ctx, x[0], x[1], x[2], &o);
            } else {
                loom_tensor *s =
                    loom_matmul(ctx, loom_mul(ctx, x[0], loom_scalar(ctx, dt, 1 / sqrt((double)E))),
                                loom_transpose(ctx, x[1]));
                loom_tensor *p = loom_softmax(ctx, loom_add(ctx, s, x[3]), -1);
                /* the fused op draws in f32 for f32 operands, in f64 for f64 ones */
                y = loom_matmul(ctx, loom_dropout(ctx, p, 0.3, true, seed, 4), x[2]);
            }
            loom_tensor *loss = loom_sum(
                ctx, loom_mul(ctx, loom_cast(ctx, y, LOOM_DTYPE_F32), in[4]), 0, NULL, false);
            loom_tensor *g[4] = {0};
            assert_int_equal(loom_backward(ctx, loss, 4, in, g), LOOM_OK);
            float buf[N];
            tu_read_f32(ctx, g[0], buf, N);
            for (int i = 0; i < N; i++)
                got[fused][i] = buf[i];
            tu_read_f32(ctx, g[3], buf, L * L);
            for (int i = 0; i < L * L; i++)
                got[fused][N - L * L + i] = buf[i]; /* dq's tail gives way to the mask's */
        }
        int nonzero = 0;
        for (int i = 0; i < N; i++) {
            if (fabs(got[1][i] - got[0][i]) > 1e-5 * (1 + fabs(got[0][i])))
                fail_msg("%s %s: fused %s[%d] = %.8g, composition %.8g", loom_dtype_name(dt),
                         eager ? "interpreter" : "JIT", i < N - L * L ? "dq" : "dmask",
                         i < N - L * L ? i : i - (N - L * L), got[1][i], got[0][i]);
            nonzero += i >= N - L * L && got[0][i] != 0;
        }
        assert_true(nonzero > L * L / 2);
        for (int i = 0; i < 5; i++)
            loom_tensor_release(in[i]);
        loom_tensor_release(seed);
        loom_context_destroy(ctx);
    }
}

/* Causal attention of [1, 2, T, D] q, k, v in dt through the JIT by `path`, with dropout p
 * of the weights (seed 5, stream 2): the output and dq, dk, dv (of a weighted sum of the
 * output, in f32) into res (4 T D each). The fused graphs compute no value of [..., T, T]
 * anywhere, forward or backward. */
static void causal_attention(int64_t T, int64_t D, loom_dtype dt, att_path path, double p,
                             float *res) {
    int64_t n = 2 * T * D, s[4] = {1, 2, T, D};
    float *h = malloc((size_t)(4 * n) * sizeof *h);
    uint8_t *tril = malloc((size_t)(T * T));
    for (int i = 0; i < 4; i++)
        fill(h + i * n, n, 11 + (uint64_t)i + (uint64_t)T);
    for (int64_t i = 0; i < T * T; i++)
        tril[i] = i % T <= i / T;
    loom_context *ctx = tu_context(false);
    loom_tensor *in[3], *x[3], *g[3] = {0};
    for (int i = 0; i < 3; i++) {
        in[i] = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, s, h + i * n);
        x[i] = dt == LOOM_DTYPE_F32 ? in[i] : loom_cast(ctx, in[i], dt);
    }
    loom_tensor *mask = loom_tensor_from_host(ctx, LOOM_DTYPE_BOOL, 2, (int64_t[]){T, T}, tril);
    int64_t sd = 5;
    loom_tensor *seed = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 0, NULL, &sd);
    loom_attention_options o;
    loom_attention_options_init(&o);
    o.mask = path == PATH_MASK ? mask : NULL;
    o.causal = path == PATH_CAUSAL;
    o.dropout_p = p;
    o.seed = p > 0 ? seed : NULL;
    o.stream = 2;
    loom_tensor *y = path == PATH_COMPOSED
                         ? composed_attention(ctx, x, dt, D, mask, p, seed)
                         : loom_scaled_dot_product_attention_ex(ctx, x[0], x[1], x[2], &o);
    if (!y)
        fail_msg("%s", loom_context_error_message(ctx));
    loom_tensor *yf = loom_cast(ctx, y, LOOM_DTYPE_F32);
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, s, h + 3 * n);
    loom_tensor *loss = loom_sum(ctx, loom_mul(ctx, yf, w), 0, NULL, false);
    assert_int_equal(loom_backward(ctx, loss, 3, in, g), LOOM_OK);
    for (int32_t i = 0; path != PATH_COMPOSED && T > 1 && i < ctx->trace.n_nodes; i++) {
        const loom_ir_node *nd = &ctx->trace.nodes[i]; /* the mask itself aside */
        if (nd->op != LOOM_IR_OP_INPUT && nd->rank >= 2 && nd->shape[nd->rank - 2] == T &&
            nd->shape[nd->rank - 1] == T)
            fail_msg("fused attention T %lld: %%%d (%s) holds a T x T value", (long long)T, (int)i,
                     loom_ir_op_name(nd->op));
    }
    tu_read_f32(ctx, yf, res, (size_t)n);
    for (int i = 0; i < 3; i++)
        tu_read_f32(ctx, g[i], res + (i + 1) * n, (size_t)n);
    for (int i = 0; i < 3; i++)
        loom_tensor_release(in[i]);
    loom_tensor_release(mask);
    loom_tensor_release(seed);
    loom_tensor_release(w);
    loom_context_destroy(ctx);
    free(h);
    free(tril);
}

/* The fused kernels, causal and with the tril as a bool mask, against the composition they
 * replace, on odd lengths and head sizes, in f32 and bf16 (the fused op keeps its scores and
 * softmax in f32 where the composition rounds them to bf16: the two agree within bf16's
 * rounding), and in f32 with dropout (the fused kernels draw each weight's keep where they
 * make the weight, forward and backward; the composition drops the materialized weights with
 * loom_dropout: the same draws). */
static void test_fused_attention_matches_its_composition(void **state) {
    (void)state;
    static const int64_t Ts[] = {1, 7, 63, 65, 257}, Ds[] = {8, 64, 80};
    static const char *const what[4] = {"out", "dq", "dk", "dv"};
    /* in this host's C tiles, then (f32, T 65) in AVX2's 6 x 16 and AVX-512's 8 x 32 */
    static const char *const tiles[] = {"avx2", "avx512"};
    for (int run = 0; run < 5; run++) {
        int di = run == 1;
        loom_dtype dt = di ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32;
        double tol = di ? 4e-2 : 1e-4, p = run == 4 ? 0.2 : 0.0;
        if (run == 2 || run == 3)
            setenv("LOOM_MATMUL_ISA", tiles[run - 2], 1);
        else
            unsetenv("LOOM_MATMUL_ISA");
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++)
            for (size_t ei = 0; ei < sizeof Ds / sizeof Ds[0]; ei++) {
                int64_t T = Ts[ti], D = Ds[ei], n = 2 * T * D;
                if ((di && T == 257 && D != 64) || ((run == 2 || run == 3) && T != 65) ||
                    (run == 4 && (T == 63 || T == 257 || D == 64)))
                    continue; /* bf16: one long case; other tiles: one odd T; dropout: T 1, 7
                               * and 65 (two key blocks) by D 8 and 80 */
                float *a = malloc((size_t)(4 * n) * sizeof *a);
                float *c = malloc((size_t)(4 * n) * sizeof *c);
                float *z = malloc((size_t)(4 * n) * sizeof *z);
                causal_attention(T, D, dt, PATH_COMPOSED, p, c);
                /* the mask path too: f32 in this host's tiles at D 64, and with dropout (the
                 * definition's test has masks of both kinds on other shapes) */
                bool mask_too = (run == 0 && D == 64) || run == 4;
                for (int mp = 0; mp < 1 + mask_too; mp++) {
                    causal_attention(T, D, dt, mp ? PATH_MASK : PATH_CAUSAL, p, a);
                    for (int64_t i = 0; i < 4 * n; i++)
                        if (!(fabs(a[i] - c[i]) <= tol * (1 + fabs(c[i]))))
                            fail_msg("%s T %lld D %lld, tiles %s%s: fused (%s) %s[%lld] = "
                                     "%.8g, composition %.8g",
                                     loom_dtype_name(dt), (long long)T, (long long)D,
                                     run == 2 || run == 3 ? tiles[run - 2] : "of the host",
                                     p > 0 ? ", dropout 0.2" : "", mp ? "bool mask" : "causal",
                                     what[i / n], (long long)(i % n), a[i], c[i]);
                }
                if (p > 0 && T > 7) { /* and the draws matter: most values move without them */
                    causal_attention(T, D, dt, PATH_CAUSAL, 0.0, z);
                    int64_t moved = 0;
                    for (int64_t i = 0; i < 4 * n; i++)
                        moved += fabsf(a[i] - z[i]) > 1e-3f * (1 + fabsf(z[i]));
                    if (moved < 2 * n)
                        fail_msg("dropout T %lld D %lld: only %lld of %lld values differ from "
                                 "no dropout",
                                 (long long)T, (long long)D, (long long)moved, (long long)(4 * n));
                }
                free(a);
                free(c);
                free(z);
            }
    }
    unsetenv("LOOM_MATMUL_ISA");
}

static void test_attention_rejects_bad_arguments_with_clear_messages(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    float z[256] = {0};
    loom_tensor *q = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, (int64_t[]){1, 2, 4, 8}, z);
    loom_tensor *k5 = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, (int64_t[]){1, 2, 5, 4}, z);
    loom_tensor *v6 = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, (int64_t[]){1, 2, 6, 8}, z);
    loom_tensor *m = loom_tensor_from_host(ctx, LOOM_DTYPE_BOOL, 2, (int64_t[]){3, 4}, z);
    assert_null(loom_scaled_dot_product_attention(ctx, q, k5, k5, NULL, false, 0));
    assert_non_null(strstr(loom_context_error_message(ctx),
                           "scaled_dot_product_attention: q and k need one head size E"));
    assert_non_null(strstr(loom_context_error_message(ctx), "q f32[1,2,4,8], k f32[1,2,5,4]"));
    loom_context_clear_error(ctx);
    assert_null(loom_scaled_dot_product_attention(ctx, q, q, v6, NULL, false, 0));
    assert_non_null(strstr(loom_context_error_message(ctx), "k and v need one key length S"));
    loom_context_clear_error(ctx);
    assert_null(loom_scaled_dot_product_attention(ctx, q, q, q, m, false, 0));
    assert_non_null(
        strstr(loom_context_error_message(ctx), "broadcast to the scores f32[1,2,4,4]"));
    loom_context_clear_error(ctx);
    loom_tensor *m4 = loom_tensor_from_host(ctx, LOOM_DTYPE_BOOL, 1, (int64_t[]){4}, z);
    assert_null(loom_scaled_dot_product_attention(ctx, q, q, q, m4, true, 0));
    assert_non_null(strstr(loom_context_error_message(ctx), "a mask or causal, not both"));
    loom_context_clear_error(ctx);
    assert_null(loom_scaled_dot_product_attention(ctx, q, q, q, NULL, false, -1));
    assert_non_null(strstr(loom_context_error_message(ctx), "finite scale >= 0"));
    loom_context_clear_error(ctx);
    loom_attention_options o;
    loom_attention_options_init(&o);
    o.dropout_p = 0.1;
    assert_null(loom_scaled_dot_product_attention_ex(ctx, q, q, q, &o));
    assert_non_null(strstr(loom_context_error_message(ctx), "needs a seed tensor"));
    loom_context_clear_error(ctx);
    o.dropout_p = 0;
    o.layout = LOOM_ATTENTION_BTHD;
    loom_tensor *q3 = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 3, (int64_t[]){2, 4, 8}, z);
    assert_null(loom_scaled_dot_product_attention_ex(ctx, q3, q3, q3, &o));
    assert_non_null(strstr(loom_context_error_message(ctx), "layout needs rank-4"));
    loom_context_clear_error(ctx);
    assert_null(loom_scaled_dot_product_attention_ex(ctx, q, q, q, NULL));
    assert_non_null(strstr(loom_context_error_message(ctx), "options is NULL"));
    loom_context_clear_error(ctx);
    /* a bool mask [L, S] broadcasts; rank-3 q without heads works too */
    assert_non_null(loom_scaled_dot_product_attention(ctx, q3, q3, q3, m4, false, 0.5));
    loom_tensor_release(q);
    loom_tensor_release(k5);
    loom_tensor_release(v6);
    loom_tensor_release(m);
    loom_tensor_release(m4);
    loom_tensor_release(q3);
    loom_context_destroy(ctx);
}

static void test_nn_ops_reject_bad_arguments_with_clear_messages(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    float v[64] = {0};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, (int64_t[]){1, 1, 4, 4}, v);
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, (int64_t[]){2, 3, 3, 3}, v);
    assert_null(loom_conv2d(ctx, x, w, NULL, NULL, NULL, NULL, 1));
    assert_non_null(strstr(loom_context_error_message(ctx), "conv2d: needs float x [N, C, H, W]"));
    loom_context_clear_error(ctx);
    loom_tensor *m = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){4, 4}, v);
    assert_null(loom_linear(ctx, m, x, NULL));
    assert_non_null(strstr(loom_context_error_message(ctx), "linear: needs x [..., in]"));
    loom_context_clear_error(ctx);
    assert_null(loom_max_pool2d(ctx, x, (int64_t[]){5, 5}, NULL, NULL));
    assert_non_null(strstr(loom_context_error_message(ctx), "does not fit"));
    loom_context_clear_error(ctx);
    /* the pool's kernel unrolls its window: above 256 taps it is refused when recorded,
     * not when the step compiles */
    loom_tensor *big =
        loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, (int64_t[]){1, 1, 1, 300}, (float[300]){0});
    assert_null(loom_max_pool2d(ctx, big, (int64_t[]){1, 257}, NULL, NULL));
    assert_non_null(
        strstr(loom_context_error_message(ctx), "a 1x257 window has more than 256 taps"));
    loom_context_clear_error(ctx);
    assert_non_null(loom_max_pool2d(ctx, big, (int64_t[]){1, 256}, NULL, NULL));
    assert_null(loom_cross_entropy(ctx, m, m, LOOM_REDUCTION_MEAN));
    assert_non_null(strstr(loom_context_error_message(ctx), "integer labels"));
    loom_context_clear_error(ctx);
    assert_null(loom_softmax(ctx, m, 2));
    assert_non_null(strstr(loom_context_error_message(ctx), "axis 2 is out of range"));
    loom_context_clear_error(ctx);
    assert_null(loom_dropout(ctx, m, 1.5, true, NULL, 0));
    assert_non_null(strstr(loom_context_error_message(ctx), "p in [0, 1]"));
    loom_context_clear_error(ctx);
    /* still usable */
    float out[16];
    tu_read_f32(ctx, loom_relu(ctx, m), out, 16);
    assert_float_equal(out[3], 0, 0);
    loom_tensor_release(x);
    loom_tensor_release(w);
    loom_tensor_release(m);
    loom_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d_matches_naive_loops),
        cmocka_unit_test(test_max_and_avg_pool_match_naive_loops),
        cmocka_unit_test(test_max_pool_sends_the_gradient_to_each_windows_first_maximum),
        cmocka_unit_test(test_cross_entropy_matches_hand_computed_values),
        cmocka_unit_test(test_cross_entropy_over_leading_axes_with_ignore_index_and_smoothing),
        cmocka_unit_test(test_argmax_takes_the_first_maximum_and_one_hot_marks_labels),
        cmocka_unit_test(test_batch_norm_normalises_and_updates_running_stats),
        cmocka_unit_test(test_layer_norm_gives_zero_mean_unit_variance_rows),
        cmocka_unit_test(test_dropout_is_deterministic_per_seed_and_scales_survivors),
        cmocka_unit_test(test_embedding_picks_rows),
        cmocka_unit_test(test_attention_matches_the_definition_on_odd_lengths_and_head_sizes),
        cmocka_unit_test(test_fused_attention_matches_its_composition),
        cmocka_unit_test(test_attention_dropout_is_loom_dropout_on_the_weights),
        cmocka_unit_test(test_attention_mask_gradient_with_dropout_is_the_compositions),
        cmocka_unit_test(test_attention_rejects_bad_arguments_with_clear_messages),
        cmocka_unit_test(test_nn_ops_reject_bad_arguments_with_clear_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
