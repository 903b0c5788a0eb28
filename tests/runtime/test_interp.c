/* Tests of the reference interpreter's values: every op against hand-computed values, 16-bit
 * float rounding, integer edge cases, reductions and matmul. How it runs graphs (aliasing,
 * memory, errors, executables) is test_interp_exec.c's. */
#include "interp_util.h"

/* ---- one test per op ---------------------------------------------------------------------- */

static void test_input_is_read_in_place_and_copied_to_its_output(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 2, S(2, 2));
    output(&t, x, -1);
    float xs[4] = {1.5f, -2.0f, 0.0f, NAN}, out[4] = {9, 9, 9, 9};
    run_graph(&t, (const void *[]){xs}, (void *[]){out});
    EXPECT_F32(out, 0, 1.5f, -2.0f, 0.0f, NAN);
    EXPECT_F32(xs, 0, 1.5f, -2.0f, 0.0f, NAN);
    tg_deinit(&t);
}

static void test_constant_fills_with_its_value_in_each_dtype(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    output(&t, constant(&t, LOOM_DTYPE_F32, 2, S(2, 2), -2.5), -1);
    output(&t, constant(&t, LOOM_DTYPE_I32, 1, S(3), -3.9), -1); /* truncates toward 0 */
    output(&t, constant(&t, LOOM_DTYPE_BOOL, 1, S(2), 0.5), -1); /* != 0 */
    output(&t, constant(&t, LOOM_DTYPE_F64, 0, NULL, INFINITY), -1);
    output(&t, constant(&t, LOOM_DTYPE_BF16, 1, S(2), 1.0), -1);
    float f[4];
    int32_t i[3];
    uint8_t b[2];
    double s = 0;
    uint16_t h[2];
    run_graph(&t, NULL, (void *[]){f, i, b, &s, h});
    EXPECT_F32(f, 0, -2.5f, -2.5f, -2.5f, -2.5f);
    EXPECT_I32(i, -3, -3, -3);
    EXPECT_U8(b, 1, 1);
    assert_true(isinf(s) && s > 0);
    EXPECT_U16(h, 0x3f80, 0x3f80);
    tg_deinit(&t);
}

static void test_neg_flips_signs_and_wraps_int_min(void **state) {
    (void)state;
    float x[5] = {1.0f, -2.0f, 0.0f, INFINITY, NAN}, y[5];
    unary(LOOM_IR_OP_NEG, LOOM_DTYPE_F32, 5, x, y);
    EXPECT_F32(y, 0, -1.0f, 2.0f, 0.0f, -INFINITY, NAN);
    assert_true(signbit(y[2])); /* -(+0) is -0 */
    int32_t xi[3] = {5, -7, INT32_MIN}, yi[3];
    unary(LOOM_IR_OP_NEG, LOOM_DTYPE_I32, 3, xi, yi);
    EXPECT_I32(yi, -5, 7, INT32_MIN);
    int64_t xl[2] = {INT64_MIN, INT64_MAX}, yl[2];
    unary(LOOM_IR_OP_NEG, LOOM_DTYPE_I64, 2, xl, yl);
    EXPECT_I64(yl, INT64_MIN, -INT64_MAX);
}

static void test_abs_of_floats_and_ints(void **state) {
    (void)state;
    float x[5] = {-1.5f, 2.0f, -0.0f, -INFINITY, NAN}, y[5];
    unary(LOOM_IR_OP_ABS, LOOM_DTYPE_F32, 5, x, y);
    EXPECT_F32(y, 0, 1.5f, 2.0f, 0.0f, INFINITY, NAN);
    assert_false(signbit(y[2]));
    int64_t xl[3] = {-3, 4, INT64_MIN}, yl[3];
    unary(LOOM_IR_OP_ABS, LOOM_DTYPE_I64, 3, xl, yl);
    EXPECT_I64(yl, 3, 4, INT64_MIN);
    int32_t xi[3] = {-9, 0, INT32_MIN}, yi[3];
    unary(LOOM_IR_OP_ABS, LOOM_DTYPE_I32, 3, xi, yi);
    EXPECT_I32(yi, 9, 0, INT32_MIN);
}

static void test_exp_values_and_limits(void **state) {
    (void)state;
    float x[6] = {0.0f, 1.0f, -1.0f, -INFINITY, INFINITY, NAN}, y[6];
    unary(LOOM_IR_OP_EXP, LOOM_DTYPE_F32, 6, x, y);
    EXPECT_F32(y, TOL, 1.0f, 2.71828175f, 0.36787945f, 0.0f, INFINITY, NAN);
    double xd[1] = {1.0}, yd[1];
    unary(LOOM_IR_OP_EXP, LOOM_DTYPE_F64, 1, xd, yd);
    EXPECT_F64(yd, 1e-15, 2.718281828459045);
}

static void test_log_values_and_domain(void **state) {
    (void)state;
    float x[7] = {1.0f, 2.0f, 10.0f, 0.5f, 0.0f, -1.0f, INFINITY}, y[7];
    unary(LOOM_IR_OP_LOG, LOOM_DTYPE_F32, 7, x, y);
    EXPECT_F32(y, TOL, 0.0f, 0.693147182f, 2.30258512f, -0.693147182f, -INFINITY, NAN, INFINITY);
}

static void test_sqrt_values_and_domain(void **state) {
    (void)state;
    float x[6] = {4.0f, 2.0f, 0.0f, -1.0f, INFINITY, -0.0f}, y[6];
    unary(LOOM_IR_OP_SQRT, LOOM_DTYPE_F32, 6, x, y);
    EXPECT_F32(y, TOL, 2.0f, 1.41421354f, 0.0f, NAN, INFINITY, 0.0f);
    assert_true(signbit(y[5])); /* sqrt(-0) is -0 */
}

static void test_rsqrt_is_one_over_sqrt(void **state) {
    (void)state;
    float x[6] = {4.0f, 0.25f, 2.0f, 0.0f, -1.0f, INFINITY}, y[6];
    unary(LOOM_IR_OP_RSQRT, LOOM_DTYPE_F32, 6, x, y);
    EXPECT_F32(y, TOL, 0.5f, 2.0f, 0.707106769f, INFINITY, NAN, 0.0f);
}

static void test_tanh_values_and_saturation(void **state) {
    (void)state;
    float x[7] = {0.0f, 1.0f, -1.0f, 0.5f, 20.0f, -INFINITY, NAN}, y[7];
    unary(LOOM_IR_OP_TANH, LOOM_DTYPE_F32, 7, x, y);
    EXPECT_F32(y, TOL, 0.0f, 0.761594176f, -0.761594176f, 0.462117165f, 1.0f, -1.0f, NAN);
}

static void test_sigmoid_values_and_saturation(void **state) {
    (void)state;
    float x[7] = {0.0f, 1.0f, -1.0f, 2.0f, 100.0f, -1000.0f, NAN}, y[7];
    unary(LOOM_IR_OP_SIGMOID, LOOM_DTYPE_F32, 7, x, y);
    EXPECT_F32(y, TOL, 0.5f, 0.731058598f, 0.268941432f, 0.880797088f, 1.0f, 0.0f, NAN);
}

static void test_relu_clamps_negatives_and_keeps_nan(void **state) {
    (void)state;
    float x[6] = {-1.0f, 0.0f, 2.5f, -INFINITY, INFINITY, NAN}, y[6];
    unary(LOOM_IR_OP_RELU, LOOM_DTYPE_F32, 6, x, y);
    EXPECT_F32(y, 0, 0.0f, 0.0f, 2.5f, 0.0f, INFINITY, NAN);
    int32_t xi[4] = {-5, 0, 7, INT32_MIN}, yi[4];
    unary(LOOM_IR_OP_RELU, LOOM_DTYPE_I32, 4, xi, yi);
    EXPECT_I32(yi, 0, 0, 7, 0);
}

static void test_gelu_uses_the_exact_erf_form(void **state) {
    (void)state;
    float x[7] = {0.0f, 1.0f, -1.0f, 2.0f, -3.0f, 0.5f, INFINITY}, y[7];
    unary(LOOM_IR_OP_GELU, LOOM_DTYPE_F32, 7, x, y);
    EXPECT_F32(y, TOL, 0.0f, 0.841344774f, -0.158655256f, 1.95449972f, -0.00404969417f,
               0.345731229f, INFINITY);
}

/* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in double (PyTorch's approximate="tanh"),
 * computed as x sigmoid(2u): at -10 the tail -1.2e-37 that the tanh form cancels to -0 */
static void test_gelu_tanh_is_the_tanh_approximation(void **state) {
    (void)state;
    float x[8] = {0.0f, 1.0f, -1.0f, 2.0f, -3.0f, 0.5f, 10.0f, -10.0f}, y[8];
    unary(LOOM_IR_OP_GELU_TANH, LOOM_DTYPE_F32, 8, x, y);
    EXPECT_F32(y, TOL, 0.0f, 0.841191991f, -0.158808009f, 1.95459769f, -0.00363739208f,
               0.345714010f, 10.0f, -1.20409235e-37f);
}

static void test_isfinite_is_false_for_inf_and_nan(void **state) {
    (void)state;
    float x[6] = {1.0f, INFINITY, -INFINITY, NAN, 0.0f, -2.0f};
    uint8_t y[6];
    tg t;
    tg_init(&t);
    int32_t r = op1(&t, LOOM_IR_OP_ISFINITE, input(&t, LOOM_DTYPE_F32, 1, S(6)));
    expect_type(&t, r, LOOM_DTYPE_BOOL, 1, S(6));
    output(&t, r, -1);
    run_graph(&t, (const void *[]){x}, (void *[]){y});
    EXPECT_U8(y, 1, 0, 0, 0, 1, 1);
    tg_deinit(&t);
    /* f16's largest finite value is finite; its infinity is not */
    uint16_t h[2] = {0x7bff, 0x7c00};
    tg_init(&t);
    output(&t, op1(&t, LOOM_IR_OP_ISFINITE, input(&t, LOOM_DTYPE_F16, 1, S(2))), -1);
    run_graph(&t, (const void *[]){h}, (void *[]){y});
    EXPECT_U8(y, 1, 0);
    tg_deinit(&t);
}

static void test_add_floats_with_infinities(void **state) {
    (void)state;
    float a[5] = {1.0f, -2.5f, INFINITY, INFINITY, NAN}, b[5] = {2.0f, 2.5f, -INFINITY, 1.0f, 1.0f};
    float y[5];
    binary(LOOM_IR_OP_ADD, LOOM_DTYPE_F32, 5, a, b, y);
    EXPECT_F32(y, 0, 3.0f, 0.0f, NAN, INFINITY, NAN);
    int64_t al[2] = {INT64_MAX, -5}, bl[2] = {1, 3}, yl[2];
    binary(LOOM_IR_OP_ADD, LOOM_DTYPE_I64, 2, al, bl, yl);
    EXPECT_I64(yl, INT64_MIN, -2);
}

static void test_sub_floats_and_int64_wraps(void **state) {
    (void)state;
    float a[4] = {5.0f, -1.0f, 0.5f, INFINITY}, b[4] = {3.0f, -1.0f, 2.0f, INFINITY}, y[4];
    binary(LOOM_IR_OP_SUB, LOOM_DTYPE_F32, 4, a, b, y);
    EXPECT_F32(y, 0, 2.0f, 0.0f, -1.5f, NAN);
    int64_t al[2] = {INT64_MIN, 10}, bl[2] = {1, -20}, yl[2];
    binary(LOOM_IR_OP_SUB, LOOM_DTYPE_I64, 2, al, bl, yl);
    EXPECT_I64(yl, INT64_MAX, 30);
}

static void test_mul_floats_and_int32_wraps(void **state) {
    (void)state;
    float a[4] = {2.0f, -3.0f, 0.0f, INFINITY}, b[4] = {4.0f, 5.0f, INFINITY, -2.0f}, y[4];
    binary(LOOM_IR_OP_MUL, LOOM_DTYPE_F32, 4, a, b, y);
    EXPECT_F32(y, 0, 8.0f, -15.0f, NAN, -INFINITY);
    int32_t ai[3] = {65536, -7, 46341}, bi[3] = {65536, 6, 46341}, yi[3];
    binary(LOOM_IR_OP_MUL, LOOM_DTYPE_I32, 3, ai, bi, yi);
    /* 2^32 wraps to 0; 46341^2 = 2147488281 wraps to 2147488281 - 2^32 */
    EXPECT_I32(yi, 0, -42, -2147479015);
    int64_t al[1] = {INT64_MAX}, bl[1] = {2}, yl[1];
    binary(LOOM_IR_OP_MUL, LOOM_DTYPE_I64, 1, al, bl, yl);
    EXPECT_I64(yl, -2);
}

static void test_div_floats_by_zero_give_inf_and_nan(void **state) {
    (void)state;
    float a[5] = {1.0f, -6.0f, 1.0f, 0.0f, -1.0f}, b[5] = {4.0f, 3.0f, 0.0f, 0.0f, 0.0f}, y[5];
    binary(LOOM_IR_OP_DIV, LOOM_DTYPE_F32, 5, a, b, y);
    EXPECT_F32(y, 0, 0.25f, -2.0f, INFINITY, NAN, -INFINITY);
}

static void test_pow_values_and_special_cases(void **state) {
    (void)state;
    float a[7] = {2.0f, 9.0f, 2.0f, -8.0f, 0.0f, 1.0f, -2.0f};
    float b[7] = {10.0f, 0.5f, -1.0f, 0.33333334f, 0.0f, NAN, 3.0f};
    float y[7];
    binary(LOOM_IR_OP_POW, LOOM_DTYPE_F32, 7, a, b, y);
    EXPECT_F32(y, TOL, 1024.0f, 3.0f, 0.5f, NAN, 1.0f, 1.0f, -8.0f);
}

static void test_maximum_propagates_nan(void **state) {
    (void)state;
    float a[5] = {1.0f, -2.0f, NAN, 3.0f, -0.0f}, b[5] = {2.0f, -3.0f, 1.0f, NAN, 0.0f}, y[5];
    binary(LOOM_IR_OP_MAXIMUM, LOOM_DTYPE_F32, 5, a, b, y);
    EXPECT_F32(y, 0, 2.0f, -2.0f, NAN, NAN, 0.0f);
    assert_false(signbit(y[4]));
    int32_t ai[3] = {-5, 7, INT32_MIN}, bi[3] = {-6, 8, INT32_MAX}, yi[3];
    binary(LOOM_IR_OP_MAXIMUM, LOOM_DTYPE_I32, 3, ai, bi, yi);
    EXPECT_I32(yi, -5, 8, INT32_MAX);
}

static void test_minimum_propagates_nan(void **state) {
    (void)state;
    float a[5] = {1.0f, -2.0f, NAN, 3.0f, 0.0f}, b[5] = {2.0f, -3.0f, 1.0f, NAN, -0.0f}, y[5];
    binary(LOOM_IR_OP_MINIMUM, LOOM_DTYPE_F32, 5, a, b, y);
    EXPECT_F32(y, 0, 1.0f, -3.0f, NAN, NAN, 0.0f);
    assert_true(signbit(y[4]));
    int64_t al[2] = {INT64_MIN, 4}, bl[2] = {0, -4}, yl[2];
    binary(LOOM_IR_OP_MINIMUM, LOOM_DTYPE_I64, 2, al, bl, yl);
    EXPECT_I64(yl, INT64_MIN, -4);
}

/* Comparisons: a = {1, 2, 3, nan, -0}, b = {2, 2, 1, 1, 0} */
static const float cmp_a[5] = {1.0f, 2.0f, 3.0f, NAN, -0.0f};
static const float cmp_b[5] = {2.0f, 2.0f, 1.0f, 1.0f, 0.0f};
/* beyond 2^53, where a compare through double would call these equal */
static const int64_t cmp_al[3] = {9007199254740993, -4, 7};
static const int64_t cmp_bl[3] = {9007199254740992, -4, 8};

static void compare(loom_ir_op op, loom_dtype dt, int64_t n, const void *a, const void *b,
                    uint8_t *out) {
    tg t;
    tg_init(&t);
    int32_t x = input(&t, dt, 1, S(n));
    int32_t y = input(&t, dt, 1, S(n));
    int32_t r = op2(&t, op, x, y);
    expect_type(&t, r, LOOM_DTYPE_BOOL, 1, S(n));
    output(&t, r, -1);
    run_graph(&t, (const void *[]){a, b}, (void *[]){out});
    tg_deinit(&t);
}

static void test_eq_compares_with_c_semantics(void **state) {
    (void)state;
    uint8_t y[5];
    compare(LOOM_IR_OP_EQ, LOOM_DTYPE_F32, 5, cmp_a, cmp_b, y);
    EXPECT_U8(y, 0, 1, 0, 0, 1);
    compare(LOOM_IR_OP_EQ, LOOM_DTYPE_I64, 3, cmp_al, cmp_bl, y);
    EXPECT_U8(y, 0, 1, 0);
    uint8_t ba[4] = {0, 0, 1, 1}, bb[4] = {0, 1, 0, 1};
    compare(LOOM_IR_OP_EQ, LOOM_DTYPE_BOOL, 4, ba, bb, y);
    EXPECT_U8(y, 1, 0, 0, 1);
}

static void test_ne_is_true_for_nan(void **state) {
    (void)state;
    uint8_t y[5];
    compare(LOOM_IR_OP_NE, LOOM_DTYPE_F32, 5, cmp_a, cmp_b, y);
    EXPECT_U8(y, 1, 0, 1, 1, 0);
    compare(LOOM_IR_OP_NE, LOOM_DTYPE_I64, 3, cmp_al, cmp_bl, y);
    EXPECT_U8(y, 1, 0, 1);
}

static void test_lt_is_false_for_nan(void **state) {
    (void)state;
    uint8_t y[5];
    compare(LOOM_IR_OP_LT, LOOM_DTYPE_F32, 5, cmp_a, cmp_b, y);
    EXPECT_U8(y, 1, 0, 0, 0, 0);
    compare(LOOM_IR_OP_LT, LOOM_DTYPE_I64, 3, cmp_al, cmp_bl, y);
    EXPECT_U8(y, 0, 0, 1);
}

static void test_le_is_false_for_nan(void **state) {
    (void)state;
    uint8_t y[5];
    compare(LOOM_IR_OP_LE, LOOM_DTYPE_F32, 5, cmp_a, cmp_b, y);
    EXPECT_U8(y, 1, 1, 0, 0, 1);
    compare(LOOM_IR_OP_LE, LOOM_DTYPE_I64, 3, cmp_al, cmp_bl, y);
    EXPECT_U8(y, 0, 1, 1);
}

static void test_gt_is_false_for_nan(void **state) {
    (void)state;
    uint8_t y[5];
    compare(LOOM_IR_OP_GT, LOOM_DTYPE_F32, 5, cmp_a, cmp_b, y);
    EXPECT_U8(y, 0, 0, 1, 0, 0);
    compare(LOOM_IR_OP_GT, LOOM_DTYPE_I64, 3, cmp_al, cmp_bl, y);
    EXPECT_U8(y, 1, 0, 0);
}

static void test_ge_is_false_for_nan(void **state) {
    (void)state;
    uint8_t y[5];
    compare(LOOM_IR_OP_GE, LOOM_DTYPE_F32, 5, cmp_a, cmp_b, y);
    EXPECT_U8(y, 0, 1, 1, 0, 1);
    int32_t ai[3] = {INT32_MIN, 0, 5}, bi[3] = {INT32_MAX, 0, -5};
    compare(LOOM_IR_OP_GE, LOOM_DTYPE_I32, 3, ai, bi, y);
    EXPECT_U8(y, 0, 1, 1);
}

static void test_select_picks_by_condition(void **state) {
    (void)state;
    uint8_t c[4] = {1, 0, 1, 0};
    float a[4] = {1.0f, 2.0f, NAN, 4.0f}, b[4] = {-1.0f, -2.0f, -3.0f, NAN}, y[4];
    tg t;
    tg_init(&t);
    int32_t sc = input(&t, LOOM_DTYPE_BOOL, 1, S(4));
    int32_t sa = input(&t, LOOM_DTYPE_F32, 1, S(4));
    int32_t sb = input(&t, LOOM_DTYPE_F32, 1, S(4));
    output(&t, op3(&t, LOOM_IR_OP_SELECT, sc, sa, sb), -1);
    run_graph(&t, (const void *[]){c, a, b}, (void *[]){y});
    EXPECT_F32(y, 0, 1.0f, -2.0f, NAN, NAN);
    tg_deinit(&t);
    /* 8-byte elements */
    int64_t al[3] = {INT64_MIN, 2, 3}, bl[3] = {-1, -2, INT64_MAX}, yl[3];
    uint8_t c3[3] = {1, 1, 0};
    tg_init(&t);
    sc = input(&t, LOOM_DTYPE_BOOL, 1, S(3));
    sa = input(&t, LOOM_DTYPE_I64, 1, S(3));
    sb = input(&t, LOOM_DTYPE_I64, 1, S(3));
    output(&t, op3(&t, LOOM_IR_OP_SELECT, sc, sa, sb), -1);
    run_graph(&t, (const void *[]){c3, al, bl}, (void *[]){yl});
    EXPECT_I64(yl, INT64_MIN, 2, INT64_MAX);
    tg_deinit(&t);
}

/* x (f32) cast to dt */
static void cast_f32(loom_dtype dt, int64_t n, const float *x, void *out) {
    tg t;
    tg_init(&t);
    output(&t, cast_to(&t, input(&t, LOOM_DTYPE_F32, 1, S(n)), dt), -1);
    run_graph(&t, (const void *[]){x}, (void *[]){out});
    tg_deinit(&t);
}

static void test_cast_float_to_int_truncates_and_saturates(void **state) {
    (void)state;
    float x[7] = {3.7f, -3.7f, NAN, 1e20f, -1e20f, -0.5f, INFINITY};
    int32_t yi[7];
    cast_f32(LOOM_DTYPE_I32, 7, x, yi);
    EXPECT_I32(yi, 3, -3, 0, INT32_MAX, INT32_MIN, 0, INT32_MAX);
    int64_t yl[7];
    cast_f32(LOOM_DTYPE_I64, 7, x, yl);
    EXPECT_I64(yl, 3, -3, 0, INT64_MAX, INT64_MIN, 0, INT64_MAX);
}

static void test_cast_to_bool_is_nonzero(void **state) {
    (void)state;
    float x[5] = {0.0f, -0.0f, 2.0f, NAN, -1e-30f};
    uint8_t y[5];
    cast_f32(LOOM_DTYPE_BOOL, 5, x, y);
    EXPECT_U8(y, 0, 0, 1, 1, 1);
    int32_t xi[3] = {0, -7, 1};
    tg t;
    tg_init(&t);
    output(&t, cast_to(&t, input(&t, LOOM_DTYPE_I32, 1, S(3)), LOOM_DTYPE_BOOL), -1);
    run_graph(&t, (const void *[]){xi}, (void *[]){y});
    EXPECT_U8(y, 0, 1, 1);
    tg_deinit(&t);
}

static void test_cast_between_ints_floats_and_16_bit_floats(void **state) {
    (void)state;
    /* f32 -> bf16 rounds to nearest even: 1 + 2^-8 is a tie (stays 1), 1 + 3*2^-8 rounds up
     * to 1 + 2^-6; f32 -> f16: 65519 rounds to 65504, 65520 to inf */
    float xb[3] = {1.00390625f, 1.01171875f, -2.0f};
    uint16_t yb[3];
    cast_f32(LOOM_DTYPE_BF16, 3, xb, yb);
    EXPECT_U16(yb, 0x3f80, 0x3f82, 0xc000);
    float xh[4] = {65519.0f, 65520.0f, 1.0f, -0.5f};
    uint16_t yh[4];
    cast_f32(LOOM_DTYPE_F16, 4, xh, yh);
    EXPECT_U16(yh, 0x7bff, 0x7c00, 0x3c00, 0xb800);
    /* i64 -> i32 wraps; i64 -> f64 exact for small values; bool -> f32 */
    int64_t xl[3] = {4294967297, -1, 2147483648};
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_I64, 1, S(3));
    output(&t, cast_to(&t, x, LOOM_DTYPE_I32), -1);
    output(&t, cast_to(&t, x, LOOM_DTYPE_F64), -1);
    int32_t yi[3];
    double yd[3];
    run_graph(&t, (const void *[]){xl}, (void *[]){yi, yd});
    EXPECT_I32(yi, 1, -1, INT32_MIN);
    EXPECT_F64(yd, 0, 4294967297.0, -1.0, 2147483648.0);
    tg_deinit(&t);
    /* f16 -> f32 is exact */
    uint16_t h[3] = {0x7bff, 0x0001, 0xfc00};
    float yf[3];
    tg_init(&t);
    output(&t, cast_to(&t, input(&t, LOOM_DTYPE_F16, 1, S(3)), LOOM_DTYPE_F32), -1);
    run_graph(&t, (const void *[]){h}, (void *[]){yf});
    EXPECT_F32(yf, 0, 65504.0f, 5.96046448e-8f, -INFINITY);
    tg_deinit(&t);
}

static void test_broadcast_repeats_axes_of_extent_one(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t row = input(&t, LOOM_DTYPE_F32, 1, S(3));       /* [3] -> [2,3] */
    int32_t col = input(&t, LOOM_DTYPE_F32, 2, S(2, 1));    /* [2,1] -> [2,3] */
    int32_t mid = input(&t, LOOM_DTYPE_I32, 3, S(2, 1, 2)); /* [2,1,2] -> [2,3,2] */
    int32_t sc = input(&t, LOOM_DTYPE_F64, 0, NULL);        /* [] -> [2,2] */
    output(&t, shaped(&t, LOOM_IR_OP_BROADCAST, row, 2, S(2, 3)), -1);
    output(&t, shaped(&t, LOOM_IR_OP_BROADCAST, col, 2, S(2, 3)), -1);
    output(&t, shaped(&t, LOOM_IR_OP_BROADCAST, mid, 3, S(2, 3, 2)), -1);
    output(&t, shaped(&t, LOOM_IR_OP_BROADCAST, sc, 2, S(2, 2)), -1);
    float r[3] = {1, 2, 3}, c[2] = {-1, -2};
    int32_t m[4] = {1, 2, 3, 4};
    double s = -0.25;
    float yr[6], yc[6];
    int32_t ym[12];
    double ys[4];
    run_graph(&t, (const void *[]){r, c, m, &s}, (void *[]){yr, yc, ym, ys});
    EXPECT_F32(yr, 0, 1, 2, 3, 1, 2, 3);
    EXPECT_F32(yc, 0, -1, -1, -1, -2, -2, -2);
    EXPECT_I32(ym, 1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4);
    EXPECT_F64(ys, 0, -0.25, -0.25, -0.25, -0.25);
    tg_deinit(&t);
}

static void test_reshape_keeps_row_major_order(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 2, S(2, 3));
    int32_t r = shaped(&t, LOOM_IR_OP_RESHAPE, x, 3, S(3, 1, 2));
    /* transposing the reshaped value shows that its axes are [3,1,2] */
    int32_t tr = transpose(&t, r, 3, (const int32_t[]){2, 1, 0});
    expect_type(&t, tr, LOOM_DTYPE_F32, 3, S(2, 1, 3));
    output(&t, r, -1);
    output(&t, tr, -1);
    float xs[6] = {0, 1, 2, 3, 4, 5}, y[6], yt[6];
    run_graph(&t, (const void *[]){xs}, (void *[]){y, yt});
    EXPECT_F32(y, 0, 0, 1, 2, 3, 4, 5);
    EXPECT_F32(yt, 0, 0, 2, 4, 1, 3, 5);
    tg_deinit(&t);
}

static void test_transpose_permutes_axes(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x2 = input(&t, LOOM_DTYPE_F32, 2, S(2, 3));
    int32_t x3 = input(&t, LOOM_DTYPE_I32, 3, S(2, 3, 4));
    output(&t, transpose(&t, x2, 2, (const int32_t[]){1, 0}), -1);
    int32_t t3 = transpose(&t, x3, 3, (const int32_t[]){2, 0, 1});
    expect_type(&t, t3, LOOM_DTYPE_I32, 3, S(4, 2, 3));
    output(&t, t3, -1);
    float a[6] = {0, 1, 2, 3, 4, 5}, ya[6];
    int32_t b[24], yb[24];
    for (int32_t i = 0; i < 24; i++)
        b[i] = i; /* b[i][j][k] = 12i + 4j + k */
    run_graph(&t, (const void *[]){a, b}, (void *[]){ya, yb});
    EXPECT_F32(ya, 0, 0, 3, 1, 4, 2, 5);
    /* result[k][i][j] = b[i][j][k] */
    EXPECT_I32(yb, 0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19,
               23);
    tg_deinit(&t);
}

static int32_t movement(tg *t, loom_ir_op op, int32_t n, const int32_t *in, int32_t rank,
                        const int64_t *shape, loom_ir_attrs at) {
    return add_node(
        t, (loom_ir_node_desc){
               .op = op, .n_inputs = n, .inputs = in, .rank = rank, .shape = shape, .attrs = at});
}

static void test_slice_takes_strided_windows(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_I32, 2, S(3, 5)); /* x[i][j] = 10i + j */
    /* rows 0 and 2, columns 1 and 4 */
    output(&t,
           movement(&t, LOOM_IR_OP_SLICE, 1, &x, 2, S(2, 2),
                    (loom_ir_attrs){.start = {0, 1}, .step = {2, 3}}),
           -1);
    /* row 1 only, columns 2..4 */
    output(&t,
           movement(&t, LOOM_IR_OP_SLICE, 1, &x, 2, S(1, 3),
                    (loom_ir_attrs){.start = {1, 2}, .step = {1, 1}}),
           -1);
    int32_t a[15], y0[4], y1[3];
    for (int32_t i = 0; i < 15; i++)
        a[i] = 10 * (i / 5) + i % 5;
    run_graph(&t, (const void *[]){a}, (void *[]){y0, y1});
    EXPECT_I32(y0, 1, 4, 21, 24);
    EXPECT_I32(y1, 12, 13, 14);
    tg_deinit(&t);
}

static void test_pad_places_elements_with_low_and_interior_gaps(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 2, S(2, 2));
    /* axis 0: low 1, high 0; axis 1: low 0, interior 1, high 1 -> [3, 4] */
    output(&t,
           movement(&t, LOOM_IR_OP_PAD, 1, &x, 2, S(3, 4),
                    (loom_ir_attrs){.start = {1, 0}, .step = {0, 1}, .value = -1}),
           -1);
    float a[4] = {1, 2, 3, 4}, y[12];
    run_graph(&t, (const void *[]){a}, (void *[]){y});
    EXPECT_F32(y, 0, -1, -1, -1, -1, 1, -1, 2, -1, 3, -1, 4, -1);
    tg_deinit(&t);
}

static void test_concat_joins_three_operands_along_the_middle_axis(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t in[3] = {input(&t, LOOM_DTYPE_I64, 3, S(2, 1, 2)),
                     input(&t, LOOM_DTYPE_I64, 3, S(2, 2, 2)),
                     input(&t, LOOM_DTYPE_I64, 3, S(2, 0, 2))};
    int32_t c = movement(&t, LOOM_IR_OP_CONCAT, 3, in, 0, NULL, (loom_ir_attrs){.index = 1});
    expect_type(&t, c, LOOM_DTYPE_I64, 3, S(2, 3, 2));
    output(&t, c, -1);
    int64_t a[4] = {1, 2, 3, 4}, b[8] = {10, 11, 12, 13, 14, 15, 16, 17}, y[12];
    run_graph(&t, (const void *[]){a, b, NULL}, (void *[]){y});
    EXPECT_I64(y, 1, 2, 10, 11, 12, 13, 3, 4, 14, 15, 16, 17);
    tg_deinit(&t);
}

/* x [[1,2,3],[4,5,6]]: along axis 1 at [[2,0],[1,7]] (7 clamped to 2), along axis 0 at
 * i64 [[1,0,-5]] (-5 clamped to 0). */
static void test_gather_reads_along_its_axis_and_clamps(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t in[3] = {input(&t, LOOM_DTYPE_F32, 2, S(2, 3)), input(&t, LOOM_DTYPE_I32, 2, S(2, 2)),
                     input(&t, LOOM_DTYPE_I64, 2, S(1, 3))};
    int32_t g1 = movement(&t, LOOM_IR_OP_GATHER, 2, (int32_t[]){in[0], in[1]}, 0, NULL,
                          (loom_ir_attrs){.index = 1});
    int32_t g0 = movement(&t, LOOM_IR_OP_GATHER, 2, (int32_t[]){in[0], in[2]}, 0, NULL,
                          (loom_ir_attrs){.index = 0});
    expect_type(&t, g1, LOOM_DTYPE_F32, 2, S(2, 2));
    expect_type(&t, g0, LOOM_DTYPE_F32, 2, S(1, 3));
    output(&t, g1, -1);
    output(&t, g0, -1);
    float x[6] = {1, 2, 3, 4, 5, 6}, y1[4], y0[3];
    int32_t i1[4] = {2, 0, 1, 7};
    int64_t i0[3] = {1, 0, -5};
    run_graph(&t, (const void *[]){x, i1, i0}, (void *[]){y1, y0});
    EXPECT_F32(y1, 0, 3, 1, 5, 6);
    EXPECT_F32(y0, 0, 4, 2, 3);
    tg_deinit(&t);
}

/* base all ones; src 0.5, 0.25 both at column 0 of row 0 (summed), 2 and 3 at column 2 of
 * row 1 (9 clamped to 2): one rounding of each sum. */
static void test_scatter_add_sums_repeated_indices(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t in[3] = {input(&t, LOOM_DTYPE_F32, 2, S(2, 3)), input(&t, LOOM_DTYPE_I64, 2, S(2, 2)),
                     input(&t, LOOM_DTYPE_F32, 2, S(2, 2))};
    int32_t sc = movement(&t, LOOM_IR_OP_SCATTER_ADD, 3, in, 0, NULL, (loom_ir_attrs){.index = 1});
    expect_type(&t, sc, LOOM_DTYPE_F32, 2, S(2, 3));
    output(&t, sc, -1);
    float base[6] = {1, 1, 1, 1, 1, 1}, src[4] = {0.5f, 0.25f, 2, 3}, y[6];
    int64_t ix[4] = {0, 0, 2, 9};
    run_graph(&t, (const void *[]){base, ix, src}, (void *[]){y});
    EXPECT_F32(y, 0, 1.75f, 1, 1, 1, 1, 6);
    tg_deinit(&t);
}

/* The attention ops on one head by hand: E = 1, scale 1, q = [0, 1], k = [0, ln 3], v = [1, 5],
 * so row 0's weights are [1/2, 1/2] (o = 3, lse = ln 2) and row 1's [1/4, 3/4] (o = 4,
 * lse = ln 4); causal, row 0 sees key 0 alone (o = 1, lse = 0). With do = [1, 2] and
 * delta = do o = [3, 8]: dP = do v^T, dS = P (dP - delta) = [[-1, 1], [-1.5, 1.5]], so
 * dq = dS k = ln 3 [1, 1.5], dk = dS^T q = [-1.5, 1.5], dv = P^T do = [1, 2]. */
static void attention_by_hand(loom_ir_op op, bool causal, const float *want) {
    tg t;
    tg_init(&t);
    loom_ir_attrs at = {.index = causal, .value = 1.0};
    int32_t q = input(&t, LOOM_DTYPE_F32, 2, S(2, 1)), k = input(&t, LOOM_DTYPE_F32, 2, S(2, 1));
    int32_t v = input(&t, LOOM_DTYPE_F32, 2, S(2, 1)), dout = input(&t, LOOM_DTYPE_F32, 2, S(2, 1));
    int32_t delta = input(&t, LOOM_DTYPE_F32, 1, S(2));
    int32_t lse = movement(&t, LOOM_IR_OP_ATTENTION_LSE, 2, (int32_t[]){q, k}, 0, NULL, at);
    int32_t y = op == LOOM_IR_OP_ATTENTION_LSE ? lse
                : op == LOOM_IR_OP_ATTENTION
                    ? movement(&t, op, 3, (int32_t[]){q, k, v}, 0, NULL, at)
                : op == LOOM_IR_OP_ATTENTION_GRAD_V
                    ? movement(&t, op, 4, (int32_t[]){q, k, dout, lse}, 0, NULL, at)
                    : movement(&t, op, 6, (int32_t[]){q, k, v, dout, lse, delta}, 0, NULL, at);
    if (op == LOOM_IR_OP_ATTENTION_LSE)
        expect_type(&t, y, LOOM_DTYPE_F32, 1, S(2));
    else
        expect_type(&t, y, LOOM_DTYPE_F32, 2, S(2, 1));
    output(&t, y, -1);
    float qd[2] = {0, 1}, kd[2] = {0, (float)log(3.0)}, vd[2] = {1, 5}, dd[2] = {1, 2};
    float del[2] = {3, 8}, out[2];
    run_graph(&t, (const void *[]){qd, kd, vd, dd, del}, (void *[]){out});
    for (int i = 0; i < 2; i++)
        assert_float_equal(out[i], want[i], 1e-6);
    tg_deinit(&t);
}

static void test_attention_weights_values_by_their_softmax(void **state) {
    (void)state;
    attention_by_hand(LOOM_IR_OP_ATTENTION, false, (const float[]){3, 4});
    attention_by_hand(LOOM_IR_OP_ATTENTION, true, (const float[]){1, 4});
}

static void test_attention_lse_is_each_rows_logsumexp(void **state) {
    (void)state;
    attention_by_hand(LOOM_IR_OP_ATTENTION_LSE, false,
                      (const float[]){(float)log(2.0), (float)log(4.0)});
    attention_by_hand(LOOM_IR_OP_ATTENTION_LSE, true, (const float[]){0, (float)log(4.0)});
}

static void test_attention_grad_q_is_ds_times_k(void **state) {
    (void)state;
    float l3 = (float)log(3.0);
    attention_by_hand(LOOM_IR_OP_ATTENTION_GRAD_Q, false, (const float[]){l3, 1.5f * l3});
}

static void test_attention_grad_k_is_ds_transposed_times_q(void **state) {
    (void)state;
    attention_by_hand(LOOM_IR_OP_ATTENTION_GRAD_K, false, (const float[]){-1.5f, 1.5f});
}

static void test_attention_grad_v_is_the_weights_transposed_times_do(void **state) {
    (void)state;
    attention_by_hand(LOOM_IR_OP_ATTENTION_GRAD_V, false, (const float[]){1, 2});
}

static void test_iota_counts_along_its_axis(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    output(&t,
           add_node(&t, (loom_ir_node_desc){.op = LOOM_IR_OP_IOTA,
                                            .dtype = LOOM_DTYPE_I32,
                                            .rank = 2,
                                            .shape = S(2, 3),
                                            .attrs = {.index = 0}}),
           -1);
    output(&t,
           add_node(&t, (loom_ir_node_desc){.op = LOOM_IR_OP_IOTA,
                                            .dtype = LOOM_DTYPE_F32,
                                            .rank = 2,
                                            .shape = S(2, 3),
                                            .attrs = {.index = 1}}),
           -1);
    int32_t y0[6];
    float y1[6];
    run_graph(&t, NULL, (void *[]){y0, y1});
    EXPECT_I32(y0, 0, 0, 0, 1, 1, 1);
    EXPECT_F32(y1, 0, 0, 1, 2, 0, 1, 2);
    tg_deinit(&t);
}

static void test_rand_uniform_is_splitmix64_of_seed_and_index(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t seed = input(&t, LOOM_DTYPE_I64, 0, NULL);
    output(&t,
           add_node(&t, (loom_ir_node_desc){.op = LOOM_IR_OP_RAND_UNIFORM,
                                            .n_inputs = 1,
                                            .inputs = &seed,
                                            .dtype = LOOM_DTYPE_F64,
                                            .rank = 1,
                                            .shape = S(3)}),
           -1);
    int64_t sv = 0;
    double y[3];
    run_graph(&t, (const void *[]){&sv}, (void *[]){y});
    /* SplitMix64 from state 0: its first outputs are 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4,
     * 0x06C45D188009454F (the reference sequence); the top 24 bits, times 2^-24 */
    EXPECT_F64(y, 0, 0xE220A8 * 0x1p-24, 0x6E789E * 0x1p-24, 0x06C45D * 0x1p-24);
    tg_deinit(&t);
}

/* Collectives on one rank (no loom_dist_init: the world is this process alone). */
static int32_t collective(tg *t, loom_ir_op op, int32_t x, int64_t index, double value) {
    return add_node(
        t, (loom_ir_node_desc){
               .op = op, .n_inputs = 1, .inputs = &x, .attrs = {.index = index, .value = value}});
}

static void test_all_reduce_of_one_rank_is_the_scaled_value(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 2, S(2, 2));
    int32_t i = input(&t, LOOM_DTYPE_I32, 1, S(3));
    output(&t, collective(&t, LOOM_IR_OP_ALL_REDUCE, x, LOOM_REDUCE_SUM, 0.5), -1);
    output(&t, collective(&t, LOOM_IR_OP_ALL_REDUCE, x, LOOM_REDUCE_MAX, -2.0), -1);
    output(&t, collective(&t, LOOM_IR_OP_ALL_REDUCE, i, LOOM_REDUCE_MIN, 1.0), -1);
    float xs[4] = {1, -2, 3.5f, 0}, ys[4], ym[4];
    int32_t is[3] = {7, -8, 9}, yi[3];
    run_graph(&t, (const void *[]){xs, is}, (void *[]){ys, ym, yi});
    EXPECT_F32(ys, 0, 0.5f, -1, 1.75f, 0);
    EXPECT_F32(ym, 0, -2, 4, -7, -0.0f);
    EXPECT_I32(yi, 7, -8, 9);
    tg_deinit(&t);
}

static void test_broadcast_from_rank_0_of_one_is_the_value(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_I64, 1, S(3));
    output(&t, collective(&t, LOOM_IR_OP_BROADCAST_FROM, x, 0, 0.0), -1);
    int64_t xs[3] = {1, INT64_MIN, 3}, y[3];
    run_graph(&t, (const void *[]){xs}, (void *[]){y});
    EXPECT_I64(y, 1, INT64_MIN, 3);
    tg_deinit(&t);
}

static void test_all_gather_of_one_rank_is_a_copy(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F64, 2, S(2, 1));
    int32_t gth = collective(&t, LOOM_IR_OP_ALL_GATHER, x, 1, 0.0);
    expect_type(&t, gth, LOOM_DTYPE_F64, 2, S(2, 1));
    output(&t, gth, -1);
    double xs[2] = {0.25, -3}, y[2];
    run_graph(&t, (const void *[]){xs}, (void *[]){y});
    EXPECT_F64(y, 0, 0.25, -3);
    tg_deinit(&t);
}

/* A graph built for another world size, or a root outside this one, is an error that names
 * the node's op and location, never a hang or a silent copy. */
static void test_collectives_for_another_world_fail_with_the_op_and_location(void **state) {
    (void)state;
    for (int k = 0; k < 2; k++) {
        tg t;
        tg_init(&t);
        int32_t x = input(&t, LOOM_DTYPE_F32, 1, S(2));
        loom_ir_op op = k == 0 ? LOOM_IR_OP_ALL_GATHER : LOOM_IR_OP_BROADCAST_FROM;
        int32_t c = add_node(&t, (loom_ir_node_desc){.op = op,
                                                     .n_inputs = 1,
                                                     .inputs = &x,
                                                     .attrs = {.index = 2},
                                                     .loc = {"train.c", 42}});
        output(&t, c, -1);
        float xs[2] = {1, 2}, y[4];
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        loom_allocator sys = loom_allocator_system();
        assert_int_equal(loom_rt_interp_run(&t.g, &sys, (const void *[]){xs}, (void *[]){y}, &d),
                         LOOM_STATUS_INVALID_ARGUMENT);
        assert_non_null(strstr(d.msg, "train.c:42"));
        assert_non_null(strstr(d.msg, loom_ir_op_name(op)));
        assert_non_null(strstr(d.msg, k == 0 ? "gathers from 2 ranks, but the world has 1"
                                             : "root 2 is not a rank of a world of 1"));
        tg_deinit(&t);
    }
}

static void test_reduce_sum_over_axis_sets(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 2, S(2, 3));
    int32_t s1 = reduce(&t, LOOM_IR_OP_REDUCE_SUM, x, 1u << 1, false);
    int32_t s0k = reduce(&t, LOOM_IR_OP_REDUCE_SUM, x, 1u << 0, true);
    int32_t sall = reduce(&t, LOOM_IR_OP_REDUCE_SUM, x, 3u, false);
    int32_t snone = reduce(&t, LOOM_IR_OP_REDUCE_SUM, x, 0u, false);
    expect_type(&t, s1, LOOM_DTYPE_F32, 1, S(2));
    expect_type(&t, s0k, LOOM_DTYPE_F32, 2, S(1, 3));
    expect_type(&t, sall, LOOM_DTYPE_F32, 0, NULL);
    expect_type(&t, snone, LOOM_DTYPE_F32, 2, S(2, 3));
    output(&t, s1, -1);
    output(&t, s0k, -1);
    output(&t, sall, -1);
    output(&t, snone, -1);
    float xs[6] = {1, 2, 3, -4, 5, 6.5f}, y1[2], y0[3], ya[1], yn[6];
    run_graph(&t, (const void *[]){xs}, (void *[]){y1, y0, ya, yn});
    EXPECT_F32(y1, 0, 6, 7.5f);
    EXPECT_F32(y0, 0, -3, 7, 9.5f);
    EXPECT_F32(ya, 0, 13.5f);
    EXPECT_F32(yn, 0, 1, 2, 3, -4, 5, 6.5f);
    tg_deinit(&t);
    /* integer sums wrap */
    int32_t xi[3] = {INT32_MAX, 1, 5}, yi[1];
    tg_init(&t);
    output(&t, reduce(&t, LOOM_IR_OP_REDUCE_SUM, input(&t, LOOM_DTYPE_I32, 1, S(3)), 1u, false),
           -1);
    run_graph(&t, (const void *[]){xi}, (void *[]){yi});
    EXPECT_I32(yi, INT32_MIN + 5);
    tg_deinit(&t);
}

static void test_reduce_sum_of_rank3_over_axes_0_and_2(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F64, 3, S(2, 3, 4));
    int32_t s = reduce(&t, LOOM_IR_OP_REDUCE_SUM, x, (1u << 0) | (1u << 2), false);
    int32_t sk = reduce(&t, LOOM_IR_OP_REDUCE_SUM, x, (1u << 0) | (1u << 2), true);
    int32_t m = reduce(&t, LOOM_IR_OP_REDUCE_MAX, x, (1u << 0) | (1u << 2), true);
    int32_t s12 = reduce(&t, LOOM_IR_OP_REDUCE_SUM, x, (1u << 1) | (1u << 2), false);
    expect_type(&t, s, LOOM_DTYPE_F64, 1, S(3));
    expect_type(&t, sk, LOOM_DTYPE_F64, 3, S(1, 3, 1));
    expect_type(&t, s12, LOOM_DTYPE_F64, 1, S(2));
    output(&t, s, -1);
    output(&t, sk, -1);
    output(&t, m, -1);
    output(&t, s12, -1);
    double xs[24], ys[3], yk[3], ym[3], y12[2];
    for (int i = 0; i < 24; i++)
        xs[i] = i; /* x[i][j][k] = 12i + 4j + k */
    run_graph(&t, (const void *[]){xs}, (void *[]){ys, yk, ym, y12});
    /* sum over i, k of 12i + 4j + k = 48 + 32j + 12 */
    EXPECT_F64(ys, 0, 60, 92, 124);
    EXPECT_F64(yk, 0, 60, 92, 124);
    EXPECT_F64(ym, 0, 15, 19, 23);
    EXPECT_F64(y12, 0, 66, 210); /* 0+...+11, 12+...+23 */
    tg_deinit(&t);
}

static void test_reduce_mean_divides_by_the_reduced_count(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 2, S(2, 3));
    output(&t, reduce(&t, LOOM_IR_OP_REDUCE_MEAN, x, 1u << 1, true), -1);
    output(&t, reduce(&t, LOOM_IR_OP_REDUCE_MEAN, x, 1u << 0, false), -1);
    output(&t, reduce(&t, LOOM_IR_OP_REDUCE_MEAN, x, 3u, false), -1);
    float xs[6] = {1, 2, 3, 4, 5, -6}, y1[2], y0[3], ya[1];
    run_graph(&t, (const void *[]){xs}, (void *[]){y1, y0, ya});
    EXPECT_F32(y1, 0, 2, 1);
    EXPECT_F32(y0, 0, 2.5f, 3.5f, -1.5f);
    EXPECT_F32(ya, 0, 1.5f);
    tg_deinit(&t);
}

static void test_reductions_of_an_empty_axis(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 2, S(2, 0));
    int32_t xi = input(&t, LOOM_DTYPE_I32, 2, S(2, 0));
    int32_t xl = input(&t, LOOM_DTYPE_I64, 1, S(0));
    output(&t, reduce(&t, LOOM_IR_OP_REDUCE_MEAN, x, 1u << 1, false), -1);
    output(&t, reduce(&t, LOOM_IR_OP_REDUCE_SUM, x, 1u << 1, false), -1);
    output(&t, reduce(&t, LOOM_IR_OP_REDUCE_MAX, x, 1u << 1, false), -1);
    output(&t, reduce(&t, LOOM_IR_OP_REDUCE_MAX, xi, 1u << 1, false), -1);
    output(&t, reduce(&t, LOOM_IR_OP_REDUCE_MAX, xl, 1u, false), -1);
    /* reducing the non-empty axis gives an empty result */
    output(&t, reduce(&t, LOOM_IR_OP_REDUCE_SUM, x, 1u << 0, false), -1);
    float mean[2], sum[2], mx[2];
    int32_t mxi[2];
    int64_t mxl[1];
    run_graph(&t, (const void *[]){NULL, NULL, NULL}, (void *[]){mean, sum, mx, mxi, mxl, NULL});
    EXPECT_F32(mean, 0, NAN, NAN);
    EXPECT_F32(sum, 0, 0, 0);
    EXPECT_F32(mx, 0, -INFINITY, -INFINITY);
    EXPECT_I32(mxi, INT32_MIN, INT32_MIN);
    EXPECT_I64(mxl, INT64_MIN);
    tg_deinit(&t);
}

static void test_reduce_max_propagates_nan(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 2, S(3, 3));
    output(&t, reduce(&t, LOOM_IR_OP_REDUCE_MAX, x, 1u << 1, false), -1);
    output(&t, reduce(&t, LOOM_IR_OP_REDUCE_MAX, x, 1u << 0, true), -1);
    float xs[9] = {1, NAN, 3, -4, -5, -6, NAN, -INFINITY, 2}, y1[3], y0[3];
    run_graph(&t, (const void *[]){xs}, (void *[]){y1, y0});
    EXPECT_F32(y1, 0, NAN, -4, NAN);
    EXPECT_F32(y0, 0, NAN, NAN, 3);
    tg_deinit(&t);
    int32_t xi[4] = {-5, INT32_MIN, -7, -2}, yi[2];
    tg_init(&t);
    output(&t, reduce(&t, LOOM_IR_OP_REDUCE_MAX, input(&t, LOOM_DTYPE_I32, 2, S(2, 2)), 2u, false),
           -1);
    run_graph(&t, (const void *[]){xi}, (void *[]){yi});
    EXPECT_I32(yi, -5, -2);
    tg_deinit(&t);
}

static void test_matmul_2x3_by_3x2(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t a = input(&t, LOOM_DTYPE_F32, 2, S(2, 3));
    int32_t b = input(&t, LOOM_DTYPE_F32, 2, S(3, 2));
    int32_t m = op2(&t, LOOM_IR_OP_MATMUL, a, b);
    expect_type(&t, m, LOOM_DTYPE_F32, 2, S(2, 2));
    output(&t, m, -1);
    float as[6] = {1, 2, 3, 4, 5, 6}, bs[6] = {7, 8, 9, 10, 11, 12}, y[4];
    run_graph(&t, (const void *[]){as, bs}, (void *[]){y});
    /* [1 2 3; 4 5 6] x [7 8; 9 10; 11 12] */
    EXPECT_F32(y, 0, 58, 64, 139, 154);
    tg_deinit(&t);
    /* integers, with wrap-around in the accumulation */
    tg_init(&t);
    a = input(&t, LOOM_DTYPE_I32, 2, S(1, 2));
    b = input(&t, LOOM_DTYPE_I32, 2, S(2, 2));
    output(&t, op2(&t, LOOM_IR_OP_MATMUL, a, b), -1);
    int32_t ai[2] = {65536, -3}, bi[4] = {65536, 2, 1, 5}, yi[2];
    run_graph(&t, (const void *[]){ai, bi}, (void *[]){yi});
    EXPECT_I32(yi, -3, 131057); /* 2^32 - 3 wraps to -3; 131072 - 15 */
    tg_deinit(&t);
}

/* A conv op over a and b (the gradients state their result shape) with a window. */
static int32_t conv(tg *t, loom_ir_op op, int32_t a, int32_t b, const int64_t *shape,
                    loom_ir_conv cv) {
    return add_node(t, (loom_ir_node_desc){.op = op,
                                           .n_inputs = 2,
                                           .inputs = (int32_t[]){a, b},
                                           .rank = shape ? 4 : 0,
                                           .shape = shape,
                                           .attrs = {.conv = cv}});
}

static const float conv_x9[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, conv_w4[4] = {1, 2, 3, 4};

static void test_conv2d_slides_the_window_with_padding_stride_and_groups(void **state) {
    (void)state;
    /* x = [1 2 3; 4 5 6; 7 8 9], w = [1 2; 3 4]: y[0][0] = 1 + 4 + 12 + 20 */
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 4, S(1, 1, 3, 3)),
            w = input(&t, LOOM_DTYPE_F32, 4, S(1, 1, 2, 2));
    int32_t y =
        conv(&t, LOOM_IR_OP_CONV2D, x, w, NULL, (loom_ir_conv){{1, 1}, {0, 0}, {1, 1}, 1, {0, 0}});
    expect_type(&t, y, LOOM_DTYPE_F32, 4, S(1, 1, 2, 2));
    output(&t, y, -1);
    /* padding 1, stride 2: the windows at rows/cols -1..0 and 1..2 */
    int32_t z =
        conv(&t, LOOM_IR_OP_CONV2D, x, w, NULL, (loom_ir_conv){{2, 2}, {1, 1}, {1, 1}, 1, {0, 0}});
    expect_type(&t, z, LOOM_DTYPE_F32, 4, S(1, 1, 2, 2));
    output(&t, z, -1);
    float ys[4], zs[4];
    run_graph(&t, (const void *[]){conv_x9, conv_w4}, (void *[]){ys, zs});
    EXPECT_F32(ys, 0, 37, 47, 67, 77);
    EXPECT_F32(zs, 0, 4, 18, 36, 77); /* 1*4; 2*3 + 3*4; 4*2 + 7*4; the full window */
    tg_deinit(&t);
    /* groups 2 of a 1x1 kernel: each channel scaled by its own weight */
    tg_init(&t);
    x = input(&t, LOOM_DTYPE_F32, 4, S(1, 2, 2, 2));
    w = input(&t, LOOM_DTYPE_F32, 4, S(2, 1, 1, 1));
    output(
        &t,
        conv(&t, LOOM_IR_OP_CONV2D, x, w, NULL, (loom_ir_conv){{1, 1}, {0, 0}, {1, 1}, 2, {0, 0}}),
        -1);
    float xs[8] = {1, 2, 3, 4, 5, 6, 7, 8}, ws[2] = {2, -1}, gs[8];
    run_graph(&t, (const void *[]){xs, ws}, (void *[]){gs});
    EXPECT_F32(gs, 0, 2, 4, 6, 8, -5, -6, -7, -8);
    tg_deinit(&t);
}

static void test_conv2d_grad_input_scatters_dy_through_the_kernel(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t dy = input(&t, LOOM_DTYPE_F32, 4, S(1, 1, 2, 2)),
            w = input(&t, LOOM_DTYPE_F32, 4, S(1, 1, 2, 2));
    int32_t dx = conv(&t, LOOM_IR_OP_CONV2D_GRAD_INPUT, dy, w, S(1, 1, 3, 3),
                      (loom_ir_conv){{1, 1}, {0, 0}, {1, 1}, 1, {0, 0}});
    output(&t, dx, -1);
    /* stride 2 over a 3x3 x: one window, and x's last row and column get nothing */
    int32_t dy1 = input(&t, LOOM_DTYPE_F32, 4, S(1, 1, 1, 1));
    output(&t,
           conv(&t, LOOM_IR_OP_CONV2D_GRAD_INPUT, dy1, w, S(1, 1, 3, 3),
                (loom_ir_conv){{2, 2}, {0, 0}, {1, 1}, 1, {0, 0}}),
           -1);
    float ones[4] = {1, 1, 1, 1}, two[1] = {2}, a[9], b[9];
    run_graph(&t, (const void *[]){ones, conv_w4, two}, (void *[]){a, b});
    /* every dy element adds w at its offset: the full correlation */
    EXPECT_F32(a, 0, 1, 3, 2, 4, 10, 6, 3, 7, 4);
    EXPECT_F32(b, 0, 2, 4, 0, 6, 8, 0, 0, 0, 0);
    tg_deinit(&t);
}

static void test_conv2d_grad_weight_sums_x_windows_weighted_by_dy(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 4, S(1, 1, 3, 3)),
            dy = input(&t, LOOM_DTYPE_F32, 4, S(1, 1, 2, 2));
    int32_t dw = conv(&t, LOOM_IR_OP_CONV2D_GRAD_WEIGHT, x, dy, S(1, 1, 2, 2),
                      (loom_ir_conv){{1, 1}, {0, 0}, {1, 1}, 1, {0, 0}});
    output(&t, dw, -1);
    float ones[4] = {1, 1, 1, 1}, a[4];
    run_graph(&t, (const void *[]){conv_x9, ones}, (void *[]){a});
    EXPECT_F32(a, 0, 12, 16, 24, 28); /* the sums of x's four 2x2 windows, each offset */
    tg_deinit(&t);
}

/* ---- further cases ------------------------------------------------------------------------ */

static void test_matmul_batched_2x2x3_by_2x3x2(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t a = input(&t, LOOM_DTYPE_F32, 3, S(2, 2, 3));
    int32_t b = input(&t, LOOM_DTYPE_F32, 3, S(2, 3, 2));
    int32_t m = op2(&t, LOOM_IR_OP_MATMUL, a, b);
    expect_type(&t, m, LOOM_DTYPE_F32, 3, S(2, 2, 2));
    output(&t, m, -1);
    float as[12] = {1, 2, 3, 4, 5, 6, /* batch 1: */ -1, 0, 2, 3, -2, 1};
    float bs[12] = {7, 8, 9, 10, 11, 12, /* batch 1: */ 1, -1, 0, 2, 4, 0.5f};
    float y[8];
    run_graph(&t, (const void *[]){as, bs}, (void *[]){y});
    /* batch 1: [-1 0 2; 3 -2 1] x [1 -1; 0 2; 4 0.5] = [7 2; 7 -6.5] */
    EXPECT_F32(y, 0, 58, 64, 139, 154, 7, 2, 7, -6.5f);
    tg_deinit(&t);
}

static void test_matmul_accumulates_in_double(void **state) {
    (void)state;
    /* 1e8 + 1 - 1e8 in f32 steps would give 0; in double it is 1 */
    tg t;
    tg_init(&t);
    int32_t a = input(&t, LOOM_DTYPE_F32, 2, S(1, 3));
    int32_t b = input(&t, LOOM_DTYPE_F32, 2, S(3, 1));
    output(&t, op2(&t, LOOM_IR_OP_MATMUL, a, b), -1);
    output(&t, reduce(&t, LOOM_IR_OP_REDUCE_SUM, a, 3u, false), -1);
    float as[3] = {1e8f, 1, -1e8f}, bs[3] = {1, 1, 1}, y[1], s[1];
    run_graph(&t, (const void *[]){as, bs}, (void *[]){y, s});
    EXPECT_F32(y, 0, 1);
    EXPECT_F32(s, 0, 1);
    tg_deinit(&t);
}

static void test_bf16_add_rounds_to_nearest_even(void **state) {
    (void)state;
    /* bf16 keeps 8 significant bits: next to 1 the spacing is 2^-7.
     * 1 + 2^-9 stays 1; 1 + 2^-8 is a tie and stays 1 (even); 1 + 3*2^-9 rounds up. */
    uint16_t a[4] = {0x3f80, 0x3f80, 0x3f80, 0x3f81};
    uint16_t b[4] = {0x3b00 /* 2^-9 */, 0x3b80 /* 2^-8 */, 0x3bc0 /* 3*2^-9 */, 0x3b80 /* 2^-8 */};
    uint16_t y[4];
    binary(LOOM_IR_OP_ADD, LOOM_DTYPE_BF16, 4, a, b, y);
    /* 1, 1, 1 + 2^-7, and (1 + 2^-7) + 2^-8 is a tie rounding up to the even 1 + 2^-6 */
    EXPECT_U16(y, 0x3f80, 0x3f80, 0x3f81, 0x3f82);
    assert_true(loom_ir_bf16_to_f32(y[2]) == 1.0078125f);
}

static void test_f16_add_overflows_to_inf_past_65504(void **state) {
    (void)state;
    uint16_t a[4] = {0x7bff /* 65504 */, 0x7bff, 0x7bff, 0x3c00 /* 1 */};
    uint16_t b[4] = {0x4800 /* 8 */, 0x4c00 /* 16 */, 0x7bff, 0x1000 /* 2^-11 */};
    uint16_t y[4];
    binary(LOOM_IR_OP_ADD, LOOM_DTYPE_F16, 4, a, b, y);
    /* 65512 rounds back to 65504; 65520 (a tie) and 131008 overflow; 1 + 2^-11 is a tie
     * next to 1 and stays 1 */
    EXPECT_U16(y, 0x7bff, 0x7c00, 0x7c00, 0x3c00);
    uint16_t n[2] = {0xfbff, 0x7e00}, m[2] = {0xfbff, 0x3c00};
    binary(LOOM_IR_OP_ADD, LOOM_DTYPE_F16, 2, n, m, y);
    assert_int_equal(y[0], 0xfc00); /* -inf */
    assert_true(isnan(loom_ir_f16_to_f32(y[1])));
}

static void test_i32_add_wraps_around(void **state) {
    (void)state;
    int32_t a[3] = {INT32_MAX, INT32_MIN, -1}, b[3] = {1, -1, 1}, y[3];
    binary(LOOM_IR_OP_ADD, LOOM_DTYPE_I32, 3, a, b, y);
    EXPECT_I32(y, INT32_MIN, INT32_MAX, 0);
}

static void test_int_div_truncates_and_never_traps(void **state) {
    (void)state;
    int32_t a[7] = {7, -7, 7, 5, INT32_MIN, 0, INT32_MIN}, b[7] = {2, 2, -2, 0, -1, 0, 1};
    int32_t y[7];
    binary(LOOM_IR_OP_DIV, LOOM_DTYPE_I32, 7, a, b, y);
    EXPECT_I32(y, 3, -3, -3, 0, INT32_MIN, 0, INT32_MIN);
    int64_t al[4] = {INT64_MIN, -9, 9, INT64_MAX}, bl[4] = {-1, 0, -4, -1}, yl[4];
    binary(LOOM_IR_OP_DIV, LOOM_DTYPE_I64, 4, al, bl, yl);
    EXPECT_I64(yl, INT64_MIN, 0, -2, -INT64_MAX);
}

static void test_16_bit_unary_ops_compute_via_f32(void **state) {
    (void)state;
    /* bf16 exp(1) = 2.71875 (0x402e): 2.7182817 lies between 2.703125 and 2.71875 */
    uint16_t x[2] = {0x3f80, 0xbf80}, y[2];
    unary(LOOM_IR_OP_EXP, LOOM_DTYPE_BF16, 2, x, y);
    EXPECT_U16(y, 0x402e, 0x3ebc); /* 0.36787945 -> 0.367188 (0x3ebc) */
    /* f16 sqrt(2) = 1.4140625 (0x3da8) */
    uint16_t h[1] = {0x4000}, yh[1];
    unary(LOOM_IR_OP_SQRT, LOOM_DTYPE_F16, 1, h, yh);
    EXPECT_U16(yh, 0x3da8);
}

/* max_pool2d (x only) or its gradient (x, dy) over a kernel x kernel window. */
static int32_t pool(tg *t, int32_t x, int32_t dy, int64_t kernel, int64_t stride, int64_t pad) {
    loom_ir_conv w = {{stride, stride}, {pad, pad}, {1, 1}, 0, {kernel, kernel}};
    return add_node(
        t, (loom_ir_node_desc){.op = dy < 0 ? LOOM_IR_OP_MAX_POOL2D : LOOM_IR_OP_MAX_POOL2D_GRAD,
                               .n_inputs = dy < 0 ? 1 : 2,
                               .inputs = (int32_t[]){x, dy},
                               .attrs = {.conv = w}});
}

static const float pool_x16[16] = {1, 5, 2, 0, 3, 3, 7, 7, -1, -2, 4, 4, -3, -1, 4, 9};

static void test_max_pool2d_skips_the_padding_and_propagates_nan(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 4, S(1, 1, 4, 4));
    int32_t y = pool(&t, x, -1, 3, 2, 1); /* windows at rows / cols -1..1 and 1..3 */
    expect_type(&t, y, LOOM_DTYPE_F32, 4, S(1, 1, 2, 2));
    output(&t, y, -1);
    int32_t n = input(&t, LOOM_DTYPE_F32, 4, S(1, 1, 2, 2));
    output(&t, pool(&t, n, -1, 2, 1, 0), -1);
    float ys[4], nan[4] = {2, NAN, 1, 3}, zs[1];
    run_graph(&t, (const void *[]){pool_x16, nan}, (void *[]){ys, zs});
    EXPECT_F32(ys, 0, 5, 7, 3, 9);
    assert_true(isnan(zs[0]));
    tg_deinit(&t);
}

static void test_max_pool2d_grad_sends_dy_to_the_first_max_of_each_window(void **state) {
    (void)state;
    tg t;
    tg_init(&t);
    int32_t x = input(&t, LOOM_DTYPE_F32, 4, S(1, 1, 4, 4));
    int32_t dy = input(&t, LOOM_DTYPE_F32, 4, S(1, 1, 3, 3));
    int32_t dx = pool(&t, x, dy, 2, 1, 0);
    expect_type(&t, dx, LOOM_DTYPE_F32, 4, S(1, 1, 4, 4));
    output(&t, dx, -1);
    float dys[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, dxs[16];
    run_graph(&t, (const void *[]){pool_x16, dys}, (void *[]){dxs});
    /* the 7 at (1, 2) is the first max of four windows; -1 at (2, 0) before the one at (3, 1) */
    EXPECT_F32(dxs, 0, 0, 1, 0, 0, 4, 0, 2 + 3 + 5 + 6, 0, 7, 0, 8, 0, 0, 0, 0, 9);
    tg_deinit(&t);
}

/* ---- the op table ------------------------------------------------------------------------- */

/* One test per op in ops.def; a new op fails the static_assert until it has one. */
#define OP_CASE(e, fn)                                                                             \
    { LOOM_IR_OP_##e, cmocka_unit_test(fn) }
static const struct op_case {
    loom_ir_op op;
    struct CMUnitTest test;
} op_cases[] = {
    OP_CASE(INPUT, test_input_is_read_in_place_and_copied_to_its_output),
    OP_CASE(CONSTANT, test_constant_fills_with_its_value_in_each_dtype),
    OP_CASE(NEG, test_neg_flips_signs_and_wraps_int_min),
    OP_CASE(ABS, test_abs_of_floats_and_ints),
    OP_CASE(EXP, test_exp_values_and_limits),
    OP_CASE(LOG, test_log_values_and_domain),
    OP_CASE(SQRT, test_sqrt_values_and_domain),
    OP_CASE(RSQRT, test_rsqrt_is_one_over_sqrt),
    OP_CASE(TANH, test_tanh_values_and_saturation),
    OP_CASE(SIGMOID, test_sigmoid_values_and_saturation),
    OP_CASE(RELU, test_relu_clamps_negatives_and_keeps_nan),
    OP_CASE(GELU, test_gelu_uses_the_exact_erf_form),
    OP_CASE(ISFINITE, test_isfinite_is_false_for_inf_and_nan),
    OP_CASE(ADD, test_add_floats_with_infinities),
    OP_CASE(SUB, test_sub_floats_and_int64_wraps),
    OP_CASE(MUL, test_mul_floats_and_int32_wraps),
    OP_CASE(DIV, test_div_floats_by_zero_give_inf_and_nan),
    OP_CASE(POW, test_pow_values_and_special_cases),
    OP_CASE(MAXIMUM, test_maximum_propagates_nan),
    OP_CASE(MINIMUM, test_minimum_propagates_nan),
    OP_CASE(EQ, test_eq_compares_with_c_semantics),
    OP_CASE(NE, test_ne_is_true_for_nan),
    OP_CASE(LT, test_lt_is_false_for_nan),
    OP_CASE(LE, test_le_is_false_for_nan),
    OP_CASE(GT, test_gt_is_false_for_nan),
    OP_CASE(GE, test_ge_is_false_for_nan),
    OP_CASE(SELECT, test_select_picks_by_condition),
    OP_CASE(CAST, test_cast_float_to_int_truncates_and_saturates),
    OP_CASE(BROADCAST, test_broadcast_repeats_axes_of_extent_one),
    OP_CASE(RESHAPE, test_reshape_keeps_row_major_order),
    OP_CASE(TRANSPOSE, test_transpose_permutes_axes),
    OP_CASE(REDUCE_SUM, test_reduce_sum_over_axis_sets),
    OP_CASE(REDUCE_MEAN, test_reduce_mean_divides_by_the_reduced_count),
    OP_CASE(REDUCE_MAX, test_reduce_max_propagates_nan),
    OP_CASE(MATMUL, test_matmul_2x3_by_3x2),
    OP_CASE(SLICE, test_slice_takes_strided_windows),
    OP_CASE(PAD, test_pad_places_elements_with_low_and_interior_gaps),
    OP_CASE(CONCAT, test_concat_joins_three_operands_along_the_middle_axis),
    OP_CASE(IOTA, test_iota_counts_along_its_axis),
    OP_CASE(RAND_UNIFORM, test_rand_uniform_is_splitmix64_of_seed_and_index),
    OP_CASE(ALL_REDUCE, test_all_reduce_of_one_rank_is_the_scaled_value),
    OP_CASE(BROADCAST_FROM, test_broadcast_from_rank_0_of_one_is_the_value),
    OP_CASE(ALL_GATHER, test_all_gather_of_one_rank_is_a_copy),
    OP_CASE(CONV2D, test_conv2d_slides_the_window_with_padding_stride_and_groups),
    OP_CASE(CONV2D_GRAD_INPUT, test_conv2d_grad_input_scatters_dy_through_the_kernel),
    OP_CASE(CONV2D_GRAD_WEIGHT, test_conv2d_grad_weight_sums_x_windows_weighted_by_dy),
    OP_CASE(MAX_POOL2D, test_max_pool2d_skips_the_padding_and_propagates_nan),
    OP_CASE(MAX_POOL2D_GRAD, test_max_pool2d_grad_sends_dy_to_the_first_max_of_each_window),
    OP_CASE(GATHER, test_gather_reads_along_its_axis_and_clamps),
    OP_CASE(SCATTER_ADD, test_scatter_add_sums_repeated_indices),
    OP_CASE(GELU_TANH, test_gelu_tanh_is_the_tanh_approximation),
    OP_CASE(ATTENTION, test_attention_weights_values_by_their_softmax),
    OP_CASE(ATTENTION_LSE, test_attention_lse_is_each_rows_logsumexp),
    OP_CASE(ATTENTION_GRAD_Q, test_attention_grad_q_is_ds_times_k),
    OP_CASE(ATTENTION_GRAD_K, test_attention_grad_k_is_ds_transposed_times_q),
    OP_CASE(ATTENTION_GRAD_V, test_attention_grad_v_is_the_weights_transposed_times_do),
};
_Static_assert(LEN(op_cases) == LOOM_IR_OP_COUNT_,
               "every op in ops.def needs a test case in op_cases");

static void test_every_op_has_a_test_case(void **state) {
    (void)state;
    for (int op = 0; op < LOOM_IR_OP_COUNT_; op++) {
        int found = 0;
        for (size_t i = 0; i < LEN(op_cases); i++)
            found += op_cases[i].op == (loom_ir_op)op;
        if (found != 1)
            fail_msg("op %s has %d test cases in op_cases, expected 1",
                     loom_ir_op_name((loom_ir_op)op), found);
    }
}

static const struct CMUnitTest other_tests[] = {
    cmocka_unit_test(test_every_op_has_a_test_case),
    cmocka_unit_test(test_collectives_for_another_world_fail_with_the_op_and_location),
    cmocka_unit_test(test_cast_to_bool_is_nonzero),
    cmocka_unit_test(test_cast_between_ints_floats_and_16_bit_floats),
    cmocka_unit_test(test_reduce_sum_of_rank3_over_axes_0_and_2),
    cmocka_unit_test(test_reductions_of_an_empty_axis),
    cmocka_unit_test(test_matmul_batched_2x2x3_by_2x3x2),
    cmocka_unit_test(test_matmul_accumulates_in_double),
    cmocka_unit_test(test_bf16_add_rounds_to_nearest_even),
    cmocka_unit_test(test_f16_add_overflows_to_inf_past_65504),
    cmocka_unit_test(test_i32_add_wraps_around),
    cmocka_unit_test(test_int_div_truncates_and_never_traps),
    cmocka_unit_test(test_16_bit_unary_ops_compute_via_f32),
};

int main(void) {
    /* The op cases run first, from the table, so none can be listed but not run. */
    struct CMUnitTest tests[LEN(op_cases) + LEN(other_tests)];
    size_t n = 0;
    for (size_t i = 0; i < LEN(op_cases); i++)
        tests[n++] = op_cases[i].test;
    for (size_t i = 0; i < LEN(other_tests); i++)
        tests[n++] = other_tests[i];
    return cmocka_run_group_tests_name("interp", tests, NULL, NULL);
}
