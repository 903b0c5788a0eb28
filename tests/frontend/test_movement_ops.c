/* Slice, pad, concat, iota and rand_uniform, and the compositions of them (tril, triu,
 * masked_fill, split, chunk) through the public API: hand-derived values on
 * the reference interpreter (eager contexts) and the JIT, fused chains (a conv2d by im2col,
 * a max pool), and the builders' errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))
#define SH(...) ((const int64_t[]){__VA_ARGS__})

static loom_context *new_ctx(bool eager) {
    loom_context_options o;
    loom_context_options_init(&o);
    o.eager = eager;
    o.dump_dir = NULL;
    o.cache_dir = ""; /* no disk cache: every JIT run compiles */
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&o, &ctx), LOOM_OK);
    return ctx;
}

/* Builds a value in ctx (from host data the builder owns). */
typedef loom_tensor *(*build_fn)(loom_context *ctx, const void *ud);

/* Runs build in an eager context and in a JIT context; both results must be `bytes` long,
 * bit-identical to each other, and are returned in out (the interpreter's). */
static void run_both(build_fn build, const void *ud, void *out, size_t bytes) {
    void *jit = malloc(bytes ? bytes : 1);
    for (int mode = 0; mode < 2; mode++) {
        loom_context *ctx = new_ctx(mode == 0);
        loom_tensor *r = build(ctx, ud);
        if (!r)
            fail_msg("building failed: %s", loom_context_error_message(ctx));
        loom_tensor_retain(r);
        if (loom_mark_step(ctx) != LOOM_OK ||
            loom_tensor_read(ctx, r, mode == 0 ? out : jit, bytes) != LOOM_OK)
            fail_msg("%s: %s", mode == 0 ? "interpreter" : "JIT", loom_context_error_message(ctx));
        if (mode == 1) /* the JIT really compiled the step */
            assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 1);
        loom_tensor_release(r);
        loom_context_destroy(ctx);
    }
    if (bytes && memcmp(out, jit, bytes) != 0)
        fail_msg("the JIT and the interpreter differ");
    free(jit);
}

static loom_tensor *host_f32(loom_context *ctx, int32_t rank, const int64_t *shape,
                             const float *v) {
    return loom_tensor_from_host(ctx, LOOM_DTYPE_F32, rank, shape, v);
}

static void expect_f32(const float *got, const float *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            fail_msg("element %zu: got %.9g, want %.9g", i, (double)got[i], (double)want[i]);
}

/* ---- slice -------------------------------------------------------------------------------- */

static const float iota12[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};

static loom_tensor *build_strided_slice(loom_context *ctx, const void *ud) {
    (void)ud; /* x[4,3] = 0..11; rows 0 and 2, columns 1 and 2 */
    loom_tensor *x = host_f32(ctx, 2, SH(4, 3), iota12);
    loom_tensor *r = loom_slice(ctx, x, SH(0, 1), SH(2, 2), SH(2, 1));
    loom_tensor_release(x);
    return r;
}

static void test_slice_with_stride_picks_every_other_row(void **state) {
    (void)state;
    float y[4];
    run_both(build_strided_slice, NULL, y, sizeof y);
    expect_f32(y, (const float[]){1, 2, 7, 8}, 4);
}

static loom_tensor *build_slice_of_slice(loom_context *ctx, const void *ud) {
    (void)ud; /* 0..11; odd elements 1,3,5,7,9; of those every other from the second: 3,7 */
    loom_tensor *x = host_f32(ctx, 1, SH(12), iota12);
    loom_tensor *s = loom_slice(ctx, x, SH(1), SH(5), SH(2));
    loom_tensor *r = loom_neg(ctx, loom_slice(ctx, s, SH(1), SH(2), SH(2)));
    loom_tensor_release(x);
    return r;
}

static void test_slice_of_a_slice_composes_starts_and_strides(void **state) {
    (void)state;
    float y[2];
    run_both(build_slice_of_slice, NULL, y, sizeof y);
    expect_f32(y, (const float[]){-3, -7}, 2);
}

static loom_tensor *build_slice_null_stride(loom_context *ctx, const void *ud) {
    (void)ud; /* stride NULL is all ones: rows 1..2, column 2 */
    loom_tensor *x = host_f32(ctx, 2, SH(4, 3), iota12);
    loom_tensor *r = loom_slice(ctx, x, SH(1, 2), SH(2, 1), NULL);
    loom_tensor_release(x);
    return r;
}

static void test_slice_without_strides_takes_a_contiguous_window(void **state) {
    (void)state;
    float y[2];
    run_both(build_slice_null_stride, NULL, y, sizeof y);
    expect_f32(y, (const float[]){5, 8}, 2);
}

/* ---- pad ---------------------------------------------------------------------------------- */

static loom_tensor *build_pad(loom_context *ctx, const void *ud) {
    (void)ud; /* x[2,3] = 1..6; rows: low 1; columns: interior 1, high 2; fill 9 -> [3,7] */
    loom_tensor *x = host_f32(ctx, 2, SH(2, 3), (const float[]){1, 2, 3, 4, 5, 6});
    loom_tensor *r = loom_pad(ctx, x, SH(1, 0), SH(0, 2), SH(0, 1), 9.0);
    loom_tensor_release(x);
    return r;
}

static void test_pad_with_interior_gaps_and_uneven_edges(void **state) {
    (void)state;
    float y[21];
    run_both(build_pad, NULL, y, sizeof y);
    expect_f32(y, (const float[]){9, 9, 9, 9, 9, 9, 9, /* low row */
                                  1, 9, 2, 9, 3, 9, 9, /* interior gaps, then high 2 */
                                  4, 9, 5, 9, 6, 9, 9},
               21);
}

static loom_tensor *build_pad_int(loom_context *ctx, const void *ud) {
    (void)ud; /* i32 [3] padded 2 low, 1 high with -2.75, which truncates to -2 */
    loom_tensor *x =
        loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 1, SH(3), (const int32_t[]){7, 8, 9});
    loom_tensor *r = loom_pad(ctx, x, SH(2), SH(1), NULL, -2.75);
    loom_tensor_release(x);
    return r;
}

static void test_pad_converts_the_value_to_the_integer_dtype(void **state) {
    (void)state;
    int32_t y[6];
    run_both(build_pad_int, NULL, y, sizeof y);
    const int32_t want[6] = {-2, -2, 7, 8, 9, -2};
    assert_memory_equal(y, want, sizeof want);
}

/* A sum of pads along the innermost axis, as the backward of im2col's slices: six windows
 * (low 0..1 rows, 0..2 columns) of [3, W] padded to [4, W + 2] with 0, one [4, W] padded
 * by a column each side with 0.5, and one with interior 1 on the columns. The JIT splits the
 * column loop where the windows start and end; edges (W 1, 2) and odd widths included. */
enum { PSUM_PADS = 8 };

static float psum_x(int p, int i) {
    return (float)((i * 7 + p * 3) % 13 - 6) + 0.25f * (float)p;
}

/* pad p's operand shape, low, high and interior (columns only for the interior) */
static void psum_geom(int64_t w, int p, int64_t *shape, int64_t *lo, int64_t *hi, int64_t *in) {
    in[0] = in[1] = 0;
    if (p < 6) {
        shape[0] = 3, shape[1] = w;
        lo[0] = p / 3, lo[1] = p % 3, hi[0] = 1 - lo[0], hi[1] = 2 - lo[1];
    } else if (p == 6) {
        shape[0] = 4, shape[1] = w, lo[0] = hi[0] = 0, lo[1] = hi[1] = 1;
    } else { /* 2e - 1 + high = w + 2 */
        shape[0] = 4, shape[1] = (w + 2) / 2, lo[0] = hi[0] = lo[1] = 0, in[1] = 1;
        hi[1] = w + 3 - 2 * shape[1];
    }
}

static loom_tensor *build_pad_sum(loom_context *ctx, const void *ud) {
    int64_t w = *(const int64_t *)ud;
    loom_tensor *sum = NULL;
    for (int p = 0; p < PSUM_PADS; p++) {
        int64_t shape[2], lo[2], hi[2], in[2];
        psum_geom(w, p, shape, lo, hi, in);
        float v[4 * 26];
        for (int i = 0; i < shape[0] * shape[1]; i++)
            v[i] = psum_x(p, i);
        loom_tensor *x = host_f32(ctx, 2, shape, v);
        loom_tensor *t = loom_pad(ctx, x, lo, hi, in, p == 6 ? 0.5 : 0.0);
        loom_tensor_release(x);
        sum = sum ? loom_add(ctx, sum, t) : t;
    }
    return sum;
}

static void test_a_sum_of_pads_along_the_innermost_axis_matches_hand_values(void **state) {
    (void)state;
    static const int64_t widths[] = {1, 2, 5, 24};
    for (size_t k = 0; k < LEN(widths); k++) {
        int64_t w = widths[k], ow = w + 2;
        float y[4 * 26], want[4 * 26] = {0};
        run_both(build_pad_sum, &w, y, (size_t)(4 * ow) * sizeof(float));
        for (int p = 0; p < PSUM_PADS; p++) {
            int64_t shape[2], lo[2], hi[2], in[2];
            psum_geom(w, p, shape, lo, hi, in);
            for (int64_t r = 0; r < 4; r++)
                for (int64_t c = 0; c < ow; c++) {
                    int64_t xr = r - lo[0], xc = c - lo[1];
                    bool hit = xr >= 0 && xr < shape[0] && xc >= 0 && xc % (in[1] + 1) == 0 &&
                               xc / (in[1] + 1) < shape[1];
                    want[r * ow + c] += hit ? psum_x(p, (int)(xr * shape[1] + xc / (in[1] + 1)))
                                            : (p == 6 ? 0.5f : 0.0f);
                }
        }
        expect_f32(y, want, (size_t)(4 * ow));
    }
}

/* ---- concat ------------------------------------------------------------------------------- */

static loom_tensor *build_concat3(loom_context *ctx, const void *ud) {
    (void)ud; /* [2,1,2] ++ [2,2,2] ++ [2,3,2] along axis 1 (given as -2) -> [2,6,2] */
    loom_tensor *a = host_f32(ctx, 3, SH(2, 1, 2), (const float[]){1, 2, 3, 4});
    loom_tensor *b = host_f32(ctx, 3, SH(2, 2, 2), (const float[]){10, 11, 12, 13, 14, 15, 16, 17});
    loom_tensor *c = host_f32(ctx, 3, SH(2, 3, 2), iota12);
    loom_tensor *r = loom_concat(ctx, 3, (loom_tensor *[]){a, loom_neg(ctx, b), c}, -2);
    loom_tensor_release(a);
    loom_tensor_release(b);
    loom_tensor_release(c);
    return r;
}

static void test_concat_of_three_operands_along_a_middle_axis(void **state) {
    (void)state;
    float y[24];
    run_both(build_concat3, NULL, y, sizeof y);
    expect_f32(y, (const float[]){1, 2, -10, -11, -12, -13, 0, 1, 2, 3, 4,  5, /* batch 0 */
                                  3, 4, -14, -15, -16, -17, 6, 7, 8, 9, 10, 11},
               24);
}

/* ---- iota --------------------------------------------------------------------------------- */

typedef struct iota_case {
    loom_dtype dt;
    int32_t axis;
} iota_case;

static loom_tensor *build_iota(loom_context *ctx, const void *ud) {
    const iota_case *c = ud;
    return loom_iota(ctx, c->dt, 3, SH(2, 3, 4), c->axis);
}

static void test_iota_counts_along_each_axis_in_every_numeric_dtype(void **state) {
    (void)state;
    static const loom_dtype dts[] = {LOOM_DTYPE_F32, LOOM_DTYPE_I32, LOOM_DTYPE_I64,
                                     LOOM_DTYPE_BF16, LOOM_DTYPE_F64};
    for (size_t t = 0; t < LEN(dts); t++) {
        for (int32_t axis = -1; axis < 3; axis++) {
            iota_case c = {dts[t], axis};
            unsigned char y[24 * 8];
            run_both(build_iota, &c, y, 24 * loom_dtype_size(dts[t]));
            int32_t ax = axis < 0 ? axis + 3 : axis;
            for (int64_t i = 0; i < 24; i++) {
                int64_t idx[3] = {i / 12, i / 4 % 3, i % 4};
                double got = loom_ir_load_f64(y, dts[t], i);
                if (got != (double)idx[ax])
                    fail_msg("%s axis %d element %lld: got %g, want %lld", loom_dtype_name(dts[t]),
                             (int)axis, (long long)i, got, (long long)idx[ax]);
            }
        }
    }
}

static loom_tensor *build_iota_onehot_sum(loom_context *ctx, const void *ud) {
    (void)ud; /* one-hot rows from labels, summed with weights: a cross-entropy's pattern */
    loom_tensor *labels =
        loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 2, SH(4, 1), (const int32_t[]){2, 0, 4, 1});
    loom_tensor *w =
        host_f32(ctx, 2, SH(4, 5), (const float[]){0,  1,  2,  3,  4,  5,  6,  7,  8,  9,
                                                   10, 11, 12, 13, 14, 15, 16, 17, 18, 19});
    loom_tensor *hot = loom_eq(ctx, loom_iota(ctx, LOOM_DTYPE_I32, 2, SH(4, 5), 1), labels);
    loom_tensor *picked = loom_select(ctx, hot, w, loom_scalar(ctx, LOOM_DTYPE_F32, 0));
    loom_tensor *r = loom_sum(ctx, picked, 1, (int32_t[]){1}, false);
    loom_tensor_release(labels);
    loom_tensor_release(w);
    return r;
}

static void test_iota_fuses_into_a_reduction_as_a_one_hot_mask(void **state) {
    (void)state;
    float y[4];
    run_both(build_iota_onehot_sum, NULL, y, sizeof y);
    expect_f32(y, (const float[]){2, 5, 14, 16}, 4);
}

/* ---- rand_uniform ------------------------------------------------------------------------- */

typedef struct rand_case {
    int64_t seed;
    loom_dtype dt;
    int64_t n;
} rand_case;

static loom_tensor *build_rand(loom_context *ctx, const void *ud) {
    const rand_case *c = ud;
    loom_tensor *seed = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 0, NULL, &c->seed);
    loom_tensor *r = loom_rand_uniform(ctx, seed, c->dt, 2, SH(c->n / 10, 10));
    loom_tensor_release(seed);
    return r;
}

static void test_rand_uniform_is_bit_identical_in_the_jit_and_the_interpreter(void **state) {
    (void)state;
    /* SplitMix64 from state 0 starts 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4,
     * 0x06C45D188009454F: their top 24 bits, scaled by 2^-24 */
    rand_case c0 = {0, LOOM_DTYPE_F64, 10};
    double y0[10];
    run_both(build_rand, &c0, y0, sizeof y0);
    assert_true(y0[0] == 0xE220A8 * 0x1p-24 && y0[1] == 0x6E789E * 0x1p-24 &&
                y0[2] == 0x06C45D * 0x1p-24);
    /* a large f32 draw: in [0, 1), mean 1/2 (its standard error here is 0.0009) */
    rand_case c = {-123456789, LOOM_DTYPE_F32, 100000};
    float *y = malloc(sizeof(float) * (size_t)c.n);
    run_both(build_rand, &c, y, sizeof(float) * (size_t)c.n);
    double sum = 0;
    for (int64_t i = 0; i < c.n; i++) {
        assert_true(y[i] >= 0.0f && y[i] < 1.0f);
        sum += y[i];
    }
    assert_true(fabs(sum / (double)c.n - 0.5) < 0.005);
    free(y);
    rand_case h = {42, LOOM_DTYPE_BF16, 1000}; /* rounded the same way in both */
    uint16_t yh[1000];
    run_both(build_rand, &h, yh, sizeof yh);
}

static void test_a_new_seed_gives_new_numbers_without_recompiling(void **state) {
    (void)state;
    loom_context *ctx = new_ctx(false);
    float first[8], second[8];
    for (int64_t step = 0; step < 2; step++) {
        int64_t s = 1000 + step;
        loom_tensor *seed = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 0, NULL, &s);
        loom_tensor *r = loom_rand_uniform(ctx, seed, LOOM_DTYPE_F32, 1, SH(8));
        loom_tensor_retain(r);
        assert_int_equal(loom_mark_step(ctx), LOOM_OK);
        assert_int_equal(loom_tensor_read(ctx, r, step ? second : first, sizeof first), LOOM_OK);
        loom_tensor_release(r);
        loom_tensor_release(seed);
    }
    assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 1);
    assert_int_equal(loom_metric_value(ctx, "CacheHit"), 1);
    assert_true(memcmp(first, second, sizeof first) != 0);
    loom_context_destroy(ctx);
}

/* ---- fused chains --------------------------------------------------------------------------- */

static loom_tensor *build_chain(loom_context *ctx, const void *ud) {
    (void)ud; /* relu(slice(pad(x))) stacked over its negation, plus a row iota */
    const float v[12] = {-1, 2, -3, 4, 5, -6, 7, -8, 9, 10, -11, 12};
    loom_tensor *x = host_f32(ctx, 2, SH(3, 4), v);
    loom_tensor *p = loom_pad(ctx, x, SH(1, 1), SH(1, 1), NULL, -0.5); /* [5,6] */
    loom_tensor *s = loom_relu(ctx, loom_slice(ctx, p, SH(0, 1), SH(3, 3), SH(2, 2)));
    loom_tensor *c = loom_concat(ctx, 2, (loom_tensor *[]){s, loom_neg(ctx, s)}, 0); /* [6,3] */
    loom_tensor *r = loom_add(ctx, c, loom_iota(ctx, LOOM_DTYPE_F32, 2, SH(6, 3), 0));
    loom_tensor_release(x);
    return r;
}

static void test_relu_of_a_slice_of_a_pad_then_concat_matches_hand_values(void **state) {
    (void)state;
    /* p rows 0, 2, 4 at columns 1, 3, 5: row 0 is all padding (relu(-0.5) = 0); row 2 is x's
     * row 1 at columns 0, 2 and the right pad: 5, 7, -0.5; row 4 the bottom pad */
    float y[18];
    run_both(build_chain, NULL, y, sizeof y);
    expect_f32(y,
               (const float[]){0, 0, 0, 1 + 5, 1 + 7, 1 + 0, 2, 2, 2, /* s + row index */
                               3, 3, 3, 4 - 5, 4 - 7, 4 - 0, 5, 5, 5},
               18);
}

/* conv2d by im2col: pad, 9 slices of [C,N,H,W], stacked on a new leading axis, reshaped
 * to [9C, N*H*W], multiplied by weights [K, 9C]; compared with the direct convolution. */
enum { CC = 2, NN = 2, HH = 5, WW = 4, KK = 3 };

static float conv_x(int c, int n, int h, int w) {
    return (float)((c * 7 + n * 5 + h * 3 + w) % 11) - 5.0f;
}

static float conv_w(int k, int tap, int c) {
    return (float)((k * 5 + tap * 3 + c) % 7) - 3.0f;
}

static loom_tensor *build_im2col(loom_context *ctx, const void *ud) {
    (void)ud;
    float xv[CC * NN * HH * WW], wv[KK * 9 * CC];
    for (int c = 0; c < CC; c++)
        for (int n = 0; n < NN; n++)
            for (int h = 0; h < HH; h++)
                for (int w = 0; w < WW; w++)
                    xv[((c * NN + n) * HH + h) * WW + w] = conv_x(c, n, h, w);
    for (int k = 0; k < KK; k++)
        for (int tap = 0; tap < 9; tap++)
            for (int c = 0; c < CC; c++)
                wv[(k * 9 + tap) * CC + c] = conv_w(k, tap, c);
    loom_tensor *x = host_f32(ctx, 4, SH(CC, NN, HH, WW), xv);
    loom_tensor *wt = host_f32(ctx, 2, SH(KK, 9 * CC), wv);
    loom_tensor *p = loom_pad(ctx, x, SH(0, 0, 1, 1), SH(0, 0, 1, 1), NULL, 0.0);
    loom_tensor *taps[9];
    for (int dy = 0; dy < 3; dy++)
        for (int dx = 0; dx < 3; dx++)
            taps[dy * 3 + dx] =
                loom_broadcast(ctx, loom_slice(ctx, p, SH(0, 0, dy, dx), SH(CC, NN, HH, WW), NULL),
                               5, SH(1, CC, NN, HH, WW));
    loom_tensor *cols =
        loom_reshape(ctx, loom_concat(ctx, 9, taps, 0), 2, SH(9 * CC, NN * HH * WW));
    loom_tensor *r = loom_matmul(ctx, wt, cols);
    loom_tensor_release(x);
    loom_tensor_release(wt);
    return r;
}

static void test_conv2d_by_im2col_matches_the_direct_convolution(void **state) {
    (void)state;
    float y[KK * NN * HH * WW];
    run_both(build_im2col, NULL, y, sizeof y);
    for (int k = 0; k < KK; k++)
        for (int n = 0; n < NN; n++)
            for (int h = 0; h < HH; h++)
                for (int w = 0; w < WW; w++) {
                    double want = 0;
                    for (int tap = 0; tap < 9; tap++)
                        for (int c = 0; c < CC; c++) {
                            int hh = h + tap / 3 - 1, ww = w + tap % 3 - 1;
                            if (hh >= 0 && hh < HH && ww >= 0 && ww < WW)
                                want += conv_w(k, tap, c) * conv_x(c, n, hh, ww);
                        }
                    float got = y[((k * NN + n) * HH + h) * WW + w];
                    if (got != (float)want)
                        fail_msg("k %d n %d h %d w %d: got %g, want %g", k, n, h, w, (double)got,
                                 want);
                }
}

static loom_tensor *build_maxpool(loom_context *ctx, const void *ud) {
    (void)ud; /* 2x2 max pool, stride 2, of [1, 4, 6]: the maximum of four strided slices */
    float v[24];
    for (int i = 0; i < 24; i++)
        v[i] = (float)((i * 7) % 24);
    loom_tensor *x = host_f32(ctx, 3, SH(1, 4, 6), v);
    loom_tensor *m = NULL;
    for (int dy = 0; dy < 2; dy++)
        for (int dx = 0; dx < 2; dx++) {
            loom_tensor *s = loom_slice(ctx, x, SH(0, dy, dx), SH(1, 2, 3), SH(1, 2, 2));
            m = m ? loom_maximum(ctx, m, s) : s;
        }
    loom_tensor_release(x);
    return m;
}

static void test_max_pool_as_the_maximum_of_strided_slices(void **state) {
    (void)state;
    float y[6], want[6];
    for (int oy = 0; oy < 2; oy++)
        for (int ox = 0; ox < 3; ox++) {
            float m = -1;
            for (int i = 0; i < 4; i++) {
                int idx = (2 * oy + i / 2) * 6 + 2 * ox + i % 2;
                float v = (float)((idx * 7) % 24);
                m = v > m ? v : m;
            }
            want[oy * 3 + ox] = m;
        }
    run_both(build_maxpool, NULL, y, sizeof y);
    expect_f32(y, want, 6);
}

/* ---- errors ------------------------------------------------------------------------------- */

/* The recorded error names this file, the op and each fragment. */
static void expect_error(loom_context *ctx, loom_tensor *r, const char *const *frags, size_t n) {
    assert_null(r);
    assert_int_equal(loom_context_error(ctx), LOOM_STATUS_INVALID_ARGUMENT);
    const char *msg = loom_context_error_message(ctx);
    assert_non_null(strstr(msg, "test_movement_ops.c:"));
    for (size_t i = 0; i < n; i++)
        if (!strstr(msg, frags[i]))
            fail_msg("message \"%s\" lacks \"%s\"", msg, frags[i]);
    loom_context_clear_error(ctx);
}
#define EXPECT_ERROR(ctx, r, ...)                                                                  \
    expect_error((ctx), (r), (const char *const[]){__VA_ARGS__},                                   \
                 sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *))

/* ---- tril, triu, masked_fill, split, chunk (frontend/ops_compose.c) ------------------------ */

static loom_tensor *build_tril_triu(loom_context *ctx, const void *ud) {
    (void)ud; /* x[3,4] = 0..11: tril(x) then triu(x, 1), side by side along axis 1 */
    loom_tensor *x = host_f32(ctx, 2, SH(3, 4), iota12);
    loom_tensor *r =
        loom_concat(ctx, 2, (loom_tensor *[]){loom_tril(ctx, x, 0), loom_triu(ctx, x, 1)}, 1);
    loom_tensor_release(x);
    return r;
}

static void test_tril_and_triu_keep_the_diagonals_asked(void **state) {
    (void)state;
    float y[24];
    run_both(build_tril_triu, NULL, y, sizeof y);
    expect_f32(y, (const float[]){0, 0, 0,  0, 0, 1, 2, 3,   /* row 0 */
                                  4, 5, 0,  0, 0, 0, 6, 7,   /* row 1 */
                                  8, 9, 10, 0, 0, 0, 0, 11}, /* row 2 */
               24);
}

static loom_tensor *build_masked_fill(loom_context *ctx, const void *ud) {
    (void)ud; /* x[2,3] = 0..5, the mask [3] = {1, 0, 1} broadcast over the rows */
    static const uint8_t m[3] = {1, 0, 1};
    loom_tensor *x = host_f32(ctx, 2, SH(2, 3), iota12);
    loom_tensor *mask = loom_tensor_from_host(ctx, LOOM_DTYPE_BOOL, 1, SH(3), m);
    loom_tensor *r = loom_masked_fill(ctx, x, mask, -INFINITY);
    loom_tensor_release(x);
    loom_tensor_release(mask);
    return r;
}

static void test_masked_fill_broadcasts_its_mask(void **state) {
    (void)state;
    float y[6];
    run_both(build_masked_fill, NULL, y, sizeof y);
    expect_f32(y, (const float[]){-INFINITY, 1, -INFINITY, -INFINITY, 4, -INFINITY}, 6);
}

static loom_tensor *build_split_chunk(loom_context *ctx, const void *ud) {
    (void)ud; /* 0..11 [12]: split 5 + 7, chunk(5) of the 7 in parts of 2, 2, 2, 1; all of them
               * concatenated in reverse */
    loom_tensor *x = host_f32(ctx, 1, SH(12), iota12), *p[2], *c[5];
    int32_t n = 0;
    if (loom_split(ctx, x, 2, SH(5, 7), 0, p) != LOOM_OK ||
        loom_chunk(ctx, p[1], 5, -1, c, &n) != LOOM_OK || n != 4) {
        loom_tensor_release(x);
        return NULL;
    }
    loom_tensor *r = loom_concat(ctx, 5, (loom_tensor *[]){c[3], c[2], c[1], c[0], p[0]}, 0);
    loom_tensor_release(x);
    return r;
}

static void test_split_and_chunk_cut_an_axis_as_pytorch_does(void **state) {
    (void)state;
    float y[12];
    run_both(build_split_chunk, NULL, y, sizeof y);
    expect_f32(y, (const float[]){11, 9, 10, 7, 8, 5, 6, 0, 1, 2, 3, 4}, 12);
}

/* scatter_add with few outer indices and wide rows (an embedding's gradient): the kernel
 * splits the columns into tasks of their own, or, where src is short along the axis and the
 * sums are the stored f32 result (plain: no epilogue), the rows along the axis, each task
 * adding the src elements that fall into its rows; a scatter along the last axis (inner
 * extent 1: cross-entropy's gradient) runs without a loop over columns. Repeated (and
 * clamped) indices sum in order, in f32 where the interpreter sums in f64 and rounds once:
 * f32 within a few ulps of its sums, bf16 (summed in f32 scratch, rounded once) within one
 * bf16 ulp. A fused epilogue unless plain. */
typedef struct scatter_case {
    loom_dtype dt;
    int32_t rank, axis;
    int64_t base[4], index[4];
    bool plain;
} scatter_case;

static loom_tensor *build_wide_scatter(loom_context *ctx, const scatter_case *sc) {
    int64_t nb = 1, ni = 1;
    for (int32_t d = 0; d < sc->rank; d++) {
        nb *= sc->base[d];
        ni *= sc->index[d];
    }
    float *b = malloc((size_t)nb * 4), *src = malloc((size_t)ni * 4);
    int64_t *idx = malloc((size_t)ni * 8);
    for (int64_t e = 0; e < nb; e++)
        b[e] = (float)((e * 37) % 23) / 8 - 1.4f;
    for (int64_t e = 0; e < ni; e++) {
        src[e] = (float)((e * 11) % 19) / 16 - 0.5f;
        idx[e] = (e * 7 + e / 5) % (sc->base[sc->axis] + 2); /* repeats; two out of range */
    }
    loom_tensor *tb = loom_cast(ctx, host_f32(ctx, sc->rank, sc->base, b), sc->dt);
    loom_tensor *ts = loom_cast(ctx, host_f32(ctx, sc->rank, sc->index, src), sc->dt);
    loom_tensor *ti = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, sc->rank, sc->index, idx);
    free(b);
    free(src);
    free(idx);
    loom_tensor *y = loom_scatter_add(ctx, tb, sc->axis, ti, ts);
    return sc->plain ? y : loom_cast(ctx, loom_relu(ctx, y), LOOM_DTYPE_F32);
}

static void test_scatter_add_splits_wide_rows_into_tasks(void **state) {
    (void)state;
    static const scatter_case cases[] = {
        {LOOM_DTYPE_F32, 3, 1, {3, 40, 300}, {3, 25, 300}, false},
        {LOOM_DTYPE_BF16, 2, 0, {50, 300}, {20, 300}, false},
        {LOOM_DTYPE_F32, 2, 0, {50, 130}, {64, 130}, false},
        /* two inner axes, one outer */
        {LOOM_DTYPE_F32, 4, 1, {2, 9, 10, 20}, {2, 6, 10, 20}, false},
        {LOOM_DTYPE_F32, 4, 2, {3, 2, 9, 70}, {3, 2, 5, 70}, false}, /* two outer axes */
        {LOOM_DTYPE_F32, 2, 0, {300, 40}, {8, 40}, true},            /* rows split, one outer */
        {LOOM_DTYPE_F32, 3, 1, {2, 500, 24}, {2, 10, 24}, true},     /* rows split, two outer */
        {LOOM_DTYPE_F32, 3, 2, {20, 3, 257}, {20, 3, 2}, true},      /* the last axis, in place */
        {LOOM_DTYPE_F32, 3, 2, {20, 3, 257}, {20, 3, 2}, false},     /* ... in scratch */
        {LOOM_DTYPE_BF16, 2, 1, {40, 300}, {40, 1}, false},          /* ... in bf16 */
    };
    for (size_t i = 0; i < LEN(cases); i++) {
        const scatter_case *sc = &cases[i];
        int64_t n = 1;
        for (int32_t d = 0; d < sc->rank; d++)
            n *= sc->base[d];
        float *got[2];
        for (int mode = 0; mode < 2; mode++) {
            loom_context *ctx = new_ctx(mode == 0);
            got[mode] = malloc((size_t)n * 4);
            loom_tensor *y = build_wide_scatter(ctx, sc);
            if (!y || loom_tensor_read(ctx, y, got[mode], (size_t)n * 4) != LOOM_OK)
                fail_msg("%s", loom_context_error_message(ctx));
            if (mode == 1)
                assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 1);
            loom_context_destroy(ctx);
        }
        double rel = sc->dt == LOOM_DTYPE_BF16 ? 0x1p-8 : 0x1p-21;
        for (int64_t e = 0; e < n; e++)
            if (!(fabsf(got[1][e] - got[0][e]) <= rel * (fabsf(got[0][e]) + 1)))
                fail_msg("case %zu: element %lld: JIT %.9g, interpreter %.9g", i, (long long)e,
                         (double)got[1][e], (double)got[0][e]);
        free(got[0]);
        free(got[1]);
    }
}

static void test_compositions_reject_bad_arguments(void **state) {
    (void)state;
    loom_context *ctx = new_ctx(true);
    loom_tensor *v = host_f32(ctx, 1, SH(12), iota12), *p[3];
    assert_null(loom_tril(ctx, v, 0));
    assert_non_null(strstr(loom_context_error_message(ctx), "[..., M, N]"));
    loom_context_clear_error(ctx);
    assert_int_equal(loom_split(ctx, v, 2, SH(5, 8), 0, p), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "part 1 of 8 does not fit"));
    assert_null(p[0]);
    loom_context_clear_error(ctx);
    assert_int_equal(loom_split(ctx, v, 2, SH(5, 6), 0, p), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "sum to 11"));
    loom_context_clear_error(ctx);
    assert_null(loom_masked_fill(ctx, v, v, 0.0));
    assert_non_null(strstr(loom_context_error_message(ctx), "mask must be bool"));
    loom_context_clear_error(ctx);
    loom_tensor_release(v);
    loom_context_destroy(ctx);
}

static void test_builders_reject_bad_arguments_with_clear_messages(void **state) {
    (void)state;
    loom_context *ctx = new_ctx(true);
    loom_tensor *x = host_f32(ctx, 2, SH(4, 3), iota12);
    EXPECT_ERROR(ctx, loom_slice(ctx, x, SH(0, 3), SH(1, 1), NULL), "slice: axis 1 of f32[4,3]",
                 "start is outside");
    EXPECT_ERROR(ctx, loom_slice(ctx, x, SH(1, 0), SH(2, 1), SH(0, 1)),
                 "slice:", "stride must be >= 1");
    EXPECT_ERROR(ctx, loom_slice(ctx, x, SH(1, 0), SH(2, 2), SH(3, 2)), "slice: axis 0",
                 "past the end", "extent 4");
    EXPECT_ERROR(ctx, loom_slice(ctx, x, SH(0, 0), SH(-1, 1), NULL), "size is negative");
    EXPECT_ERROR(ctx, loom_slice(ctx, x, NULL, SH(1, 1), NULL), "slice: start is NULL");
    EXPECT_ERROR(ctx, loom_pad(ctx, x, SH(0, -1), NULL, NULL, 0.0), "pad: axis 1 of f32[4,3]",
                 "must be >= 0");
    EXPECT_ERROR(ctx, loom_pad(ctx, x, NULL, NULL, SH(-2, 0), 0.0), "pad:", "interior -2");
    loom_tensor *y = host_f32(ctx, 2, SH(4, 2), iota12);
    loom_tensor *z =
        loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 2, SH(4, 3), (const int32_t[12]){0});
    EXPECT_ERROR(ctx, loom_concat(ctx, 2, (loom_tensor *[]){x, y}, 0), "concat: tensor 1 is",
                 "f32[4,2]", "f32[4,3]");
    EXPECT_ERROR(ctx, loom_concat(ctx, 2, (loom_tensor *[]){x, z}, 1), "concat:", "i32[4,3]");
    EXPECT_ERROR(ctx, loom_concat(ctx, 1, (loom_tensor *[]){x}, 2), "concat: axis 2",
                 "out of range");
    EXPECT_ERROR(ctx, loom_concat(ctx, 0, (loom_tensor *[]){x}, 0), "at least one tensor");
    EXPECT_ERROR(ctx, loom_concat(ctx, 2, NULL, 0), "concat: the tensor list is NULL");
    EXPECT_ERROR(ctx, loom_iota(ctx, LOOM_DTYPE_BOOL, 1, SH(3), 0), "iota: dtype bool");
    EXPECT_ERROR(ctx, loom_iota(ctx, LOOM_DTYPE_I32, 2, SH(3, 2), 2), "iota: axis 2", "i32[3,2]");
    EXPECT_ERROR(ctx, loom_rand_uniform(ctx, x, LOOM_DTYPE_F32, 1, SH(3)),
                 "rand_uniform: seed must be an i64 scalar", "f32[4,3]");
    int64_t sv = 1;
    loom_tensor *seed = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 0, NULL, &sv);
    EXPECT_ERROR(ctx, loom_rand_uniform(ctx, seed, LOOM_DTYPE_I32, 1, SH(3)),
                 "rand_uniform: dtype i32 is not a float dtype");
    /* NULL operands: NULL results; the first error stays the one reported */
    EXPECT_ERROR(ctx, loom_slice(ctx, NULL, SH(0), SH(1), NULL), "slice: operand 0 is NULL");
    loom_tensor *bad = loom_pad(ctx, x, SH(-1, 0), NULL, NULL, 0.0);
    assert_null(loom_concat(ctx, 2, (loom_tensor *[]){bad, x}, 0));
    EXPECT_ERROR(ctx, NULL, "pad:");
    assert_int_equal(loom_context_error(ctx), LOOM_OK); /* still usable */
    assert_non_null(loom_slice(ctx, x, SH(3, 0), SH(1, 3), NULL));
    loom_tensor_release(seed);
    loom_tensor_release(x);
    loom_tensor_release(y);
    loom_tensor_release(z);
    loom_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slice_with_stride_picks_every_other_row),
        cmocka_unit_test(test_slice_of_a_slice_composes_starts_and_strides),
        cmocka_unit_test(test_slice_without_strides_takes_a_contiguous_window),
        cmocka_unit_test(test_pad_with_interior_gaps_and_uneven_edges),
        cmocka_unit_test(test_pad_converts_the_value_to_the_integer_dtype),
        cmocka_unit_test(test_a_sum_of_pads_along_the_innermost_axis_matches_hand_values),
        cmocka_unit_test(test_concat_of_three_operands_along_a_middle_axis),
        cmocka_unit_test(test_iota_counts_along_each_axis_in_every_numeric_dtype),
        cmocka_unit_test(test_iota_fuses_into_a_reduction_as_a_one_hot_mask),
        cmocka_unit_test(test_rand_uniform_is_bit_identical_in_the_jit_and_the_interpreter),
        cmocka_unit_test(test_a_new_seed_gives_new_numbers_without_recompiling),
        cmocka_unit_test(test_relu_of_a_slice_of_a_pad_then_concat_matches_hand_values),
        cmocka_unit_test(test_conv2d_by_im2col_matches_the_direct_convolution),
        cmocka_unit_test(test_max_pool_as_the_maximum_of_strided_slices),
        cmocka_unit_test(test_builders_reject_bad_arguments_with_clear_messages),
        cmocka_unit_test(test_tril_and_triu_keep_the_diagonals_asked),
        cmocka_unit_test(test_masked_fill_broadcasts_its_mask),
        cmocka_unit_test(test_split_and_chunk_cut_an_axis_as_pytorch_does),
        cmocka_unit_test(test_scatter_add_splits_wide_rows_into_tasks),
        cmocka_unit_test(test_compositions_reject_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
