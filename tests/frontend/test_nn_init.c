/* Parameter initialisation: the seeded generator, parameter tensors and the Linear /
 * Conv2d / BatchNorm2d modules with PyTorch's default initialisations. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "frontend/frontend.h"
#include "loom/nn.h"

/* Reads a long-lived f32 tensor of numel elements into a new malloc'd array. */
static float *read_all(loom_context *ctx, loom_tensor *t, int64_t *out_numel) {
    int64_t n = 0;
    assert_int_equal(loom_tensor_numel(t, &n), LOOM_OK);
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    assert_non_null(v);
    assert_int_equal(loom_tensor_read(ctx, t, v, (size_t)n * sizeof *v), LOOM_OK);
    *out_numel = n;
    return v;
}

static void expect_type(loom_tensor *t, int32_t rank, const int64_t *shape) {
    loom_dtype dt;
    int32_t r = -1;
    int64_t s[LOOM_MAX_RANK];
    assert_int_equal(loom_tensor_dtype(t, &dt), LOOM_OK);
    assert_int_equal(dt, LOOM_DTYPE_F32);
    assert_int_equal(loom_tensor_rank(t, &r), LOOM_OK);
    assert_int_equal(r, rank);
    assert_int_equal(loom_tensor_shape(t, s), LOOM_OK);
    for (int32_t i = 0; i < rank; i++)
        assert_int_equal(s[i], shape[i]);
}

/* ---- generator ---------------------------------------------------------------------------- */

static void test_rng_is_deterministic_per_seed_and_differs_across_seeds(void **state) {
    (void)state;
    loom_rng a, b, c;
    loom_rng_init(&a, 42);
    loom_rng_init(&b, 42);
    loom_rng_init(&c, 43);
    int same_as_c = 0;
    for (int i = 0; i < 100; i++) {
        double x = loom_rng_uniform(&a), y = loom_rng_uniform(&b), z = loom_rng_uniform(&c);
        assert_true(x == y);
        assert_true(x >= 0 && x < 1);
        same_as_c += x == z;
    }
    assert_int_equal(same_as_c, 0);
    /* SplitMix64's published first output for seed 0 (Vigna's splitmix64.c) */
    loom_rng z;
    loom_rng_init(&z, 0);
    assert_true(loom_rng_uniform(&z) == (double)(0xE220A8397B1DCDAFull >> 11) * 0x1.0p-53);
}

static void test_rng_uniform_and_normal_have_the_right_moments(void **state) {
    (void)state;
    loom_rng r;
    loom_rng_init(&r, 7);
    const int n = 200000;
    double su = 0, su2 = 0, sn = 0, sn2 = 0;
    for (int i = 0; i < n; i++) {
        double u = loom_rng_uniform(&r), g = loom_rng_normal(&r);
        assert_true(isfinite(g));
        su += u;
        su2 += u * u;
        sn += g;
        sn2 += g * g;
    }
    double mu = su / n, vu = su2 / n - mu * mu, mn = sn / n, vn = sn2 / n - mn * mn;
    /* standard errors: 0.00065 (uniform mean), 0.0022 (normal mean) */
    assert_true(fabs(mu - 0.5) < 0.005 && fabs(vu - 1.0 / 12) < 0.002);
    assert_true(fabs(mn) < 0.015 && fabs(vn - 1.0) < 0.02);
}

/* ---- parameter tensors ------------------------------------------------------------------- */

static void test_param_uniform_stays_in_bounds_with_uniform_moments(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    loom_rng r;
    loom_rng_init(&r, 1);
    int64_t shape[2] = {256, 256};
    loom_tensor *t = loom_param_uniform(ctx, 2, shape, -0.5, 1.5, &r);
    assert_non_null(t);
    expect_type(t, 2, shape);
    int64_t n;
    float *v = read_all(ctx, t, &n);
    assert_int_equal(n, 65536);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        assert_true(v[i] >= -0.5f && v[i] < 1.5f);
        s += v[i];
        s2 += (double)v[i] * v[i];
    }
    double mean = s / n, var = s2 / n - mean * mean;
    assert_true(fabs(mean - 0.5) < 0.02);     /* exact: 0.5, standard error 0.0023 */
    assert_true(fabs(var - 4.0 / 12) < 0.01); /* exact: (hi - lo)^2 / 12 */
    free(v);
    loom_tensor_release(t);
    loom_context_destroy(ctx);
}

static void test_param_uniform_never_rounds_up_to_hi(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    loom_rng r;
    loom_rng_init(&r, 3);
    /* an interval one f32 step wide: the upper half of draws would round to hi */
    double lo = 1.0, hi = (double)nextafterf(1.0f, 2.0f);
    loom_tensor *t = loom_param_uniform(ctx, 1, (int64_t[]){1000}, lo, hi, &r);
    int64_t n;
    float *v = read_all(ctx, t, &n);
    for (int64_t i = 0; i < n; i++)
        assert_true(v[i] == 1.0f);
    free(v);
    loom_tensor_release(t);
    loom_context_destroy(ctx);
}

static void test_param_normal_has_the_requested_mean_and_std(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    loom_rng r;
    loom_rng_init(&r, 2);
    loom_tensor *t = loom_param_normal(ctx, 1, (int64_t[]){100000}, 3.0, 0.5, &r);
    int64_t n;
    float *v = read_all(ctx, t, &n);
    double s = 0, s2 = 0;
    int64_t beyond_2std = 0;
    for (int64_t i = 0; i < n; i++) {
        s += v[i];
        s2 += (double)v[i] * v[i];
        beyond_2std += fabs(v[i] - 3.0) > 1.0;
    }
    double mean = s / n, std = sqrt(s2 / n - mean * mean);
    assert_true(fabs(mean - 3.0) < 0.01 && fabs(std - 0.5) < 0.01);
    assert_true(beyond_2std > 4000 && beyond_2std < 5100); /* 4.55% of a normal */
    free(v);
    loom_tensor_release(t);
    loom_context_destroy(ctx);
}

static void test_same_seed_gives_the_same_parameter_and_another_seed_differs(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    loom_tensor *ts[3];
    uint64_t seeds[3] = {5, 5, 6};
    for (int k = 0; k < 3; k++) {
        loom_rng r;
        loom_rng_init(&r, seeds[k]);
        ts[k] = loom_param_normal(ctx, 2, (int64_t[]){3, 5}, 0, 1, &r);
        assert_non_null(ts[k]);
    }
    int64_t n;
    float *a = read_all(ctx, ts[0], &n), *b = read_all(ctx, ts[1], &n),
          *c = read_all(ctx, ts[2], &n);
    assert_memory_equal(a, b, (size_t)n * sizeof *a);
    for (int64_t i = 0; i < n; i++)
        assert_true(a[i] != c[i]);
    free(a);
    free(b);
    free(c);
    for (int k = 0; k < 3; k++)
        loom_tensor_release(ts[k]);
    loom_context_destroy(ctx);
}

static void test_param_full_fills_every_element_including_scalars(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    loom_tensor *t = loom_param_full(ctx, 3, (int64_t[]){2, 1, 3}, -2.5);
    int64_t n;
    float *v = read_all(ctx, t, &n);
    assert_int_equal(n, 6);
    for (int i = 0; i < 6; i++)
        assert_true(v[i] == -2.5f);
    free(v);
    loom_tensor_release(t);
    loom_tensor *s = loom_param_full(ctx, 0, NULL, 7);
    float x = 0;
    assert_int_equal(loom_tensor_read(ctx, s, &x, sizeof x), LOOM_OK);
    assert_true(x == 7.0f);
    loom_tensor_release(s);
    loom_tensor *empty = loom_param_full(ctx, 2, (int64_t[]){0, 4}, 1); /* no elements */
    assert_non_null(empty);
    loom_tensor_release(empty);
    loom_context_destroy(ctx);
}

static void expect_error(loom_context *ctx, loom_tensor *t, const char *message) {
    assert_null(t);
    assert_int_equal(loom_context_error(ctx), LOOM_STATUS_INVALID_ARGUMENT);
    if (!strstr(loom_context_error_message(ctx), message)) {
        print_error("message '%s' lacks '%s'\n", loom_context_error_message(ctx), message);
        fail();
    }
    loom_context_clear_error(ctx);
}

static void test_param_functions_reject_invalid_arguments(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    int32_t live0 = ctx->n_live_tensors;
    loom_rng r;
    loom_rng_init(&r, 1);
    int64_t shape[2] = {2, 3};
    expect_error(ctx, loom_param_uniform(ctx, 2, shape, 1, 0, &r),
                 "param_uniform: needs finite bounds lo <= hi, got [1, 0)");
    expect_error(ctx, loom_param_uniform(ctx, 2, shape, -INFINITY, 0, &r), "finite bounds");
    expect_error(ctx, loom_param_uniform(ctx, 2, shape, 0, 1, NULL), "param_uniform: rng is NULL");
    expect_error(ctx, loom_param_normal(ctx, 2, shape, 0, -1, &r),
                 "param_normal: needs a finite mean and std >= 0, got mean 0, std -1");
    expect_error(ctx, loom_param_normal(ctx, 2, shape, NAN, 1, &r), "finite mean");
    expect_error(ctx, loom_param_full(ctx, 9, shape, 0), "param_full: rank 9 is outside [0, 8]");
    expect_error(ctx, loom_param_full(ctx, -1, shape, 0), "rank -1");
    expect_error(ctx, loom_param_full(ctx, 2, NULL, 0), "param_full: shape is NULL");
    expect_error(ctx, loom_param_full(ctx, 2, (int64_t[]){2, -3}, 0),
                 "extent -3 of axis 1 is negative");
    expect_error(ctx, loom_param_full(ctx, 2, (int64_t[]){INT64_MAX, 4}, 0), "too many elements");
    expect_error(ctx, loom_param_full(ctx, 1, (int64_t[]){2}, NAN), "value is NaN");
    assert_null(loom_param_full(NULL, 1, (int64_t[]){2}, 0));
    assert_int_equal(ctx->n_live_tensors, live0);
    loom_context_destroy(ctx);
}

/* ---- modules ------------------------------------------------------------------------------ */

static void expect_uniform_bound(loom_context *ctx, loom_tensor *t, double bound) {
    int64_t n;
    float *v = read_all(ctx, t, &n);
    float lo = v[0], hi = v[0];
    for (int64_t i = 0; i < n; i++) {
        assert_true(v[i] >= (float)-bound && v[i] <= (float)bound);
        lo = fminf(lo, v[i]);
        hi = fmaxf(hi, v[i]);
    }
    if (n >= 1000) /* the bound is tight: the extremes come near it */
        assert_true(lo < -0.95 * bound && hi > 0.95 * bound);
    free(v);
}

static void test_linear_init_uses_pytorch_bounds_and_shapes(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    int32_t live0 = ctx->n_live_tensors;
    loom_rng r;
    loom_rng_init(&r, 42);
    loom_nn_linear fc;
    assert_int_equal(loom_nn_linear_init(ctx, &fc, 784, 16, true, &r), LOOM_OK);
    expect_type(fc.weight, 2, (int64_t[]){16, 784});
    expect_type(fc.bias, 1, (int64_t[]){16});
    expect_uniform_bound(ctx, fc.weight, 1 / sqrt(784.0));
    expect_uniform_bound(ctx, fc.bias, 1 / sqrt(784.0));
    assert_int_equal(ctx->n_live_tensors, live0 + 2);
    /* the same seed draws the same module */
    loom_nn_linear again;
    loom_rng_init(&r, 42);
    assert_int_equal(loom_nn_linear_init(ctx, &again, 784, 16, true, &r), LOOM_OK);
    int64_t n;
    float *a = read_all(ctx, fc.weight, &n), *b = read_all(ctx, again.weight, &n);
    assert_memory_equal(a, b, (size_t)n * sizeof *a);
    free(a);
    free(b);
    loom_nn_linear_deinit(&again);
    loom_nn_linear_deinit(&fc);
    assert_null(fc.weight);
    assert_null(fc.bias);
    assert_int_equal(ctx->n_live_tensors, live0);
    loom_nn_linear_deinit(&fc); /* a zeroed module, and NULL */
    loom_nn_linear_deinit(NULL);
    assert_int_equal(loom_nn_linear_init(ctx, &fc, 3, 2, false, &r), LOOM_OK);
    assert_null(fc.bias);
    loom_nn_linear_deinit(&fc);
    assert_int_equal(ctx->n_live_tensors, live0);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_linear_forward_computes_x_times_weight_transposed_plus_bias(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    loom_rng r;
    loom_rng_init(&r, 9);
    loom_nn_linear fc;
    assert_int_equal(loom_nn_linear_init(ctx, &fc, 3, 2, true, &r), LOOM_OK);
    float xs[2 * 3] = {1, -2, 0.5f, 0, 3, -1};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 3}, xs);
    loom_tensor *y = loom_nn_linear_forward(ctx, &fc, x);
    assert_non_null(y);
    loom_tensor_retain(y);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    float got[4];
    assert_int_equal(loom_tensor_read(ctx, y, got, sizeof got), LOOM_OK);
    int64_t n;
    float *w = read_all(ctx, fc.weight, &n), *b = read_all(ctx, fc.bias, &n);
    for (int i = 0; i < 2; i++)
        for (int o = 0; o < 2; o++) {
            double want = b[o];
            for (int k = 0; k < 3; k++)
                want += (double)xs[i * 3 + k] * w[o * 3 + k];
            assert_true(fabs(got[i * 2 + o] - want) < 1e-6);
        }
    free(w);
    free(b);
    loom_tensor_release(y);
    loom_tensor_release(x);
    loom_nn_linear deinited;
    memset(&deinited, 0, sizeof deinited);
    assert_null(loom_nn_linear_forward(ctx, &deinited, NULL));
    assert_non_null(strstr(loom_context_error_message(ctx),
                           "nn_linear_forward: the module is NULL or not initialised"));
    loom_context_clear_error(ctx);
    loom_nn_linear_deinit(&fc);
    loom_context_destroy(ctx);
}

static void test_conv2d_init_bounds_by_fan_in_over_the_kernel(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    int32_t live0 = ctx->n_live_tensors;
    loom_rng r;
    loom_rng_init(&r, 11);
    loom_nn_conv2d conv;
    assert_int_equal(loom_nn_conv2d_init(ctx, &conv, 16, 32, 3, 5, true, &r), LOOM_OK);
    expect_type(conv.weight, 4, (int64_t[]){32, 16, 3, 5});
    expect_type(conv.bias, 1, (int64_t[]){32});
    double bound = 1 / sqrt(16.0 * 3 * 5);
    expect_uniform_bound(ctx, conv.weight, bound);
    expect_uniform_bound(ctx, conv.bias, bound);
    assert_true(conv.stride[0] == 1 && conv.stride[1] == 1 && conv.padding[0] == 0 &&
                conv.padding[1] == 0 && conv.dilation[0] == 1 && conv.dilation[1] == 1 &&
                conv.groups == 1);
    loom_nn_conv2d_deinit(&conv);
    assert_null(conv.weight);
    assert_int_equal(conv.groups, 0);
    assert_int_equal(loom_nn_conv2d_init(ctx, &conv, 1, 1, 1, 1, false, &r), LOOM_OK);
    assert_null(conv.bias);
    loom_nn_conv2d_deinit(&conv);
    loom_nn_conv2d_deinit(NULL);
    assert_int_equal(ctx->n_live_tensors, live0);
    loom_context_destroy(ctx);
}

static void test_batch_norm2d_init_gives_ones_zeros_and_pytorch_defaults(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    int32_t live0 = ctx->n_live_tensors;
    loom_nn_batch_norm2d bn;
    assert_int_equal(loom_nn_batch_norm2d_init(ctx, &bn, 5), LOOM_OK);
    loom_tensor *ts[4] = {bn.weight, bn.bias, bn.running_mean, bn.running_var};
    const float want[4] = {1, 0, 0, 1};
    for (int k = 0; k < 4; k++) {
        expect_type(ts[k], 1, (int64_t[]){5});
        int64_t n;
        float *v = read_all(ctx, ts[k], &n);
        for (int i = 0; i < 5; i++)
            assert_true(v[i] == want[k]);
        free(v);
    }
    assert_true(bn.momentum == 0.1 && bn.eps == 1e-5);
    assert_int_equal(ctx->n_live_tensors, live0 + 4);
    loom_nn_batch_norm2d_deinit(&bn);
    assert_null(bn.running_var);
    assert_true(bn.momentum == 0);
    assert_int_equal(ctx->n_live_tensors, live0);
    loom_nn_batch_norm2d_deinit(&bn);
    loom_nn_batch_norm2d_deinit(NULL);
    loom_context_destroy(ctx);
}

static void test_module_inits_reject_invalid_arguments_and_leave_the_module_zeroed(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    int32_t live0 = ctx->n_live_tensors;
    loom_rng r;
    loom_rng_init(&r, 1);
    loom_nn_linear fc;
    memset(&fc, 0xAB, sizeof fc); /* garbage in: zeroed out */
    assert_int_equal(loom_nn_linear_init(ctx, &fc, 0, 4, true, &r), LOOM_STATUS_INVALID_ARGUMENT);
    assert_true(fc.weight == NULL && fc.bias == NULL);
    assert_non_null(
        strstr(loom_context_error_message(ctx), "nn_linear_init: in_features must be >= 1, got 0"));
    loom_context_clear_error(ctx);
    assert_int_equal(loom_nn_linear_init(ctx, &fc, 4, -2, true, &r), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "out_features must be >= 1, got -2"));
    loom_context_clear_error(ctx);
    assert_int_equal(loom_nn_linear_init(ctx, &fc, 4, 2, true, NULL), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "nn_linear_init: rng is NULL"));
    loom_context_clear_error(ctx);
    assert_int_equal(loom_nn_linear_init(ctx, NULL, 4, 2, true, &r), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "module is NULL"));
    loom_context_clear_error(ctx);
    assert_int_equal(loom_nn_linear_init(NULL, &fc, 4, 2, true, &r), LOOM_STATUS_INVALID_ARGUMENT);
    loom_nn_conv2d conv;
    memset(&conv, 0xAB, sizeof conv);
    assert_int_equal(loom_nn_conv2d_init(ctx, &conv, 3, 8, 3, 0, true, &r),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_true(conv.weight == NULL && conv.bias == NULL && conv.groups == 0);
    assert_non_null(strstr(loom_context_error_message(ctx),
                           "nn_conv2d_init: kernel width must be >= 1, got 0"));
    loom_context_clear_error(ctx);
    loom_nn_batch_norm2d bn;
    memset(&bn, 0xAB, sizeof bn);
    assert_int_equal(loom_nn_batch_norm2d_init(ctx, &bn, 0), LOOM_STATUS_INVALID_ARGUMENT);
    assert_true(bn.weight == NULL && bn.running_var == NULL && bn.eps == 0);
    assert_non_null(strstr(loom_context_error_message(ctx),
                           "nn_batch_norm2d_init: channels must be >= 1, got 0"));
    loom_context_clear_error(ctx);
    /* forward on modules that were never initialised */
    assert_null(loom_nn_conv2d_forward(ctx, &conv, NULL));
    assert_non_null(strstr(loom_context_error_message(ctx), "nn_conv2d_forward"));
    loom_context_clear_error(ctx);
    assert_null(loom_nn_batch_norm2d_forward(ctx, NULL, NULL, true));
    assert_non_null(strstr(loom_context_error_message(ctx), "nn_batch_norm2d_forward"));
    loom_context_clear_error(ctx);
    assert_int_equal(ctx->n_live_tensors, live0);
    loom_context_destroy(ctx);
}

/* Out of memory part way through an init: the module is zeroed and nothing leaks. */
static void test_module_inits_fail_cleanly_out_of_memory(void **state) {
    (void)state;
    for (int64_t fail_at = 1;; fail_at++) {
        test_alloc ta = {0};
        loom_context *ctx = tu_context_alloc(false, &ta);
        int32_t live0 = ctx->n_live_tensors;
        ta.fail_at = ta.n_allocs + fail_at;
        loom_rng r;
        loom_rng_init(&r, 1);
        loom_nn_linear fc;
        loom_nn_batch_norm2d bn;
        memset(&bn, 0, sizeof bn);
        loom_status st = loom_nn_linear_init(ctx, &fc, 8, 4, true, &r);
        if (st == LOOM_OK)
            st = loom_nn_batch_norm2d_init(ctx, &bn, 4);
        bool failed = ta.n_failed > 0;
        ta.fail_at = 0;
        if (failed) {
            assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
            assert_null(bn.weight);
            assert_null(bn.running_var);
        } else {
            assert_int_equal(st, LOOM_OK);
        }
        loom_nn_linear_deinit(&fc);
        loom_nn_batch_norm2d_deinit(&bn);
        assert_int_equal(ctx->n_live_tensors, live0);
        loom_context_destroy(ctx);
        assert_int_equal(ta.live_bytes, 0);
        if (!failed)
            break;
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rng_is_deterministic_per_seed_and_differs_across_seeds),
        cmocka_unit_test(test_rng_uniform_and_normal_have_the_right_moments),
        cmocka_unit_test(test_param_uniform_stays_in_bounds_with_uniform_moments),
        cmocka_unit_test(test_param_uniform_never_rounds_up_to_hi),
        cmocka_unit_test(test_param_normal_has_the_requested_mean_and_std),
        cmocka_unit_test(test_same_seed_gives_the_same_parameter_and_another_seed_differs),
        cmocka_unit_test(test_param_full_fills_every_element_including_scalars),
        cmocka_unit_test(test_param_functions_reject_invalid_arguments),
        cmocka_unit_test(test_linear_init_uses_pytorch_bounds_and_shapes),
        cmocka_unit_test(test_linear_forward_computes_x_times_weight_transposed_plus_bias),
        cmocka_unit_test(test_conv2d_init_bounds_by_fan_in_over_the_kernel),
        cmocka_unit_test(test_batch_norm2d_init_gives_ones_zeros_and_pytorch_defaults),
        cmocka_unit_test(test_module_inits_reject_invalid_arguments_and_leave_the_module_zeroed),
        cmocka_unit_test(test_module_inits_fail_cleanly_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
