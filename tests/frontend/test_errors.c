/* Bad input through the public API: every case returns a clear error naming the op, the
 * shapes and the caller's line, and the context stays usable afterwards. */
#include <stdio.h>
#include <string.h>

#include "test_util.h"

typedef struct fixture {
    loom_context *ctx;
    loom_tensor *m23, *m45, *v2, *i2;
} fixture;

static int setup(void **state) {
    static fixture f;
    memset(&f, 0, sizeof f);
    if (loom_context_create(NULL, &f.ctx) != LOOM_OK)
        return -1;
    float data[20] = {0};
    int32_t idata[2] = {1, 2};
    f.m23 = loom_tensor_from_host(f.ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 3}, data);
    f.m45 = loom_tensor_from_host(f.ctx, LOOM_DTYPE_F32, 2, (int64_t[]){4, 5}, data);
    f.v2 = loom_tensor_from_host(f.ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2}, data);
    f.i2 = loom_tensor_from_host(f.ctx, LOOM_DTYPE_I32, 1, (int64_t[]){2}, idata);
    *state = &f;
    return f.m23 && f.m45 && f.v2 && f.i2 ? 0 : -1;
}

static int teardown(void **state) {
    fixture *f = *state;
    loom_tensor_release(f->m23);
    loom_tensor_release(f->m45);
    loom_tensor_release(f->v2);
    loom_tensor_release(f->i2);
    loom_context_destroy(f->ctx);
    return 0;
}

/* The recorded error is `code` with exactly `msg`; then the context runs a valid step. */
static void expect_error(fixture *f, loom_status code, const char *msg) {
    assert_int_equal(loom_context_error(f->ctx), code);
    assert_string_equal(loom_context_error_message(f->ctx), msg);
    loom_context_clear_error(f->ctx);
    assert_int_equal(loom_context_error(f->ctx), LOOM_OK);
    assert_string_equal(loom_context_error_message(f->ctx), "");
    loom_tensor *ok = loom_add(f->ctx, f->v2, f->v2);
    assert_non_null(ok);
    loom_tensor_retain(ok);
    assert_int_equal(loom_mark_step(f->ctx), LOOM_OK);
    float out[2];
    assert_int_equal(loom_tensor_read(f->ctx, ok, out, sizeof out), LOOM_OK);
    loom_tensor_release(ok);
}

static char expected[512];
#define AT(line, text) (snprintf(expected, sizeof expected, "test_errors.c:%d: %s", (line), (text)), expected)

static void test_matmul_with_mismatched_inner_dims_names_shapes_and_line(void **state) {
    fixture *f = *state;
    int line = __LINE__ + 1;
    assert_null(loom_matmul(f->ctx, f->m23, f->m45));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT,
                 AT(line, "matmul: inner dimensions differ: f32[2,3] x f32[4,5]"));
}

static void test_binary_op_with_different_dtypes_is_rejected(void **state) {
    fixture *f = *state;
    int line = __LINE__ + 1;
    assert_null(loom_add(f->ctx, f->v2, f->i2));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT, AT(line, "add: dtypes differ: f32[2] vs i32[2]"));
}

static void test_shapes_that_do_not_broadcast_are_rejected(void **state) {
    fixture *f = *state;
    int line = __LINE__ + 1;
    assert_null(loom_mul(f->ctx, f->m23, f->v2));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT,
                 AT(line, "mul: shapes cannot be broadcast together: f32[2,3] vs f32[2]"));
}

static void test_float_only_op_on_integers_is_rejected(void **state) {
    fixture *f = *state;
    int line = __LINE__ + 1;
    assert_null(loom_exp(f->ctx, f->i2));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT,
                 AT(line, "exp: operand 0 has dtype i32[2]; exp needs a float dtype"));
}

static void test_null_operand_and_null_context(void **state) {
    fixture *f = *state;
    assert_null(loom_add(NULL, f->v2, f->v2)); /* nothing to record into: just NULL */
    int line = __LINE__ + 1;
    assert_null(loom_add(f->ctx, NULL, f->v2));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT,
                 AT(line, "add: operand 0 is NULL (from an earlier failed op?)"));
}

static void test_a_failed_op_feeding_the_next_keeps_the_first_error(void **state) {
    fixture *f = *state;
    int line = __LINE__ + 1;
    loom_tensor *bad = loom_matmul(f->ctx, f->m23, f->m45);
    loom_tensor *worse = loom_relu(f->ctx, loom_add(f->ctx, bad, f->m23));
    assert_null(worse);
    /* the step still runs, but reports the step's first error */
    assert_int_equal(loom_mark_step(f->ctx), LOOM_STATUS_INVALID_ARGUMENT);
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT,
                 AT(line, "matmul: inner dimensions differ: f32[2,3] x f32[4,5]"));
}

static void test_step_scoped_tensor_used_after_its_step_is_a_stale_handle(void **state) {
    fixture *f = *state;
    loom_tensor *tmp = loom_neg(f->ctx, f->v2);
    assert_non_null(tmp);
    assert_int_equal(loom_mark_step(f->ctx), LOOM_OK);
    int line = __LINE__ + 1;
    assert_null(loom_add(f->ctx, tmp, f->v2));
    expect_error(f, LOOM_STATUS_STALE_HANDLE,
                 AT(line, "add: tensor handle is stale: the tensor died at an earlier mark_step or "
                          "was released (op results live one step unless loom_tensor_retain'ed)"));
    float out[2];
    assert_int_equal(loom_tensor_read(f->ctx, tmp, out, sizeof out), LOOM_STATUS_STALE_HANDLE);
    loom_context_clear_error(f->ctx);
    loom_dtype dt;
    assert_int_equal(loom_tensor_dtype(tmp, &dt), LOOM_STATUS_STALE_HANDLE);
    loom_tensor_retain(tmp); /* ignored, recorded */
    assert_int_equal(loom_context_error(f->ctx), LOOM_STATUS_STALE_HANDLE);
    loom_context_clear_error(f->ctx);
}

static void test_released_tensor_and_over_release(void **state) {
    fixture *f = *state;
    float one = 1;
    loom_tensor *t = loom_tensor_from_host(f->ctx, LOOM_DTYPE_F32, 0, NULL, &one);
    assert_non_null(t);
    loom_tensor_release(t);
    assert_null(loom_abs(f->ctx, t));
    assert_int_equal(loom_context_error(f->ctx), LOOM_STATUS_STALE_HANDLE);
    loom_context_clear_error(f->ctx);
    loom_tensor *r = loom_abs(f->ctx, f->v2); /* step-owned, never retained */
    loom_tensor_release(r);
    assert_int_equal(loom_context_error(f->ctx), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(f->ctx), "released more often than retained"));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT, loom_context_error_message(f->ctx));
}

static void test_handle_from_another_context_is_rejected(void **state) {
    fixture *f = *state;
    loom_context *other = NULL;
    assert_int_equal(loom_context_create(NULL, &other), LOOM_OK);
    float v[2] = {1, 2};
    loom_tensor *foreign = loom_tensor_from_host(other, LOOM_DTYPE_F32, 1, (int64_t[]){2}, v);
    assert_non_null(foreign);
    int line = __LINE__ + 1;
    assert_null(loom_add(f->ctx, foreign, f->v2));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT,
                 AT(line, "add: not a tensor handle of this context (another context's, or garbage)"));
    loom_context_destroy(other);
    /* its handles are now stale everywhere, and retain/release ignore them */
    loom_tensor_release(foreign);
    int32_t rank;
    assert_int_equal(loom_tensor_rank(foreign, &rank), LOOM_STATUS_STALE_HANDLE);
}

static void test_bad_tensor_creation_arguments(void **state) {
    fixture *f = *state;
    float v[4] = {0};
    int line = __LINE__ + 1;
    assert_null(loom_tensor_from_host(f->ctx, (loom_dtype)99, 1, (int64_t[]){4}, v));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT, AT(line, "tensor_from_host: dtype 99 is not a valid dtype"));
    line = __LINE__ + 1;
    assert_null(loom_tensor_from_host(f->ctx, LOOM_DTYPE_F32, 9, (int64_t[9]){1}, v));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT, AT(line, "tensor_from_host: rank 9 is out of range (0..8)"));
    line = __LINE__ + 1;
    assert_null(loom_tensor_from_host(f->ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, -2}, v));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT,
                 AT(line, "tensor_from_host: extent -2 of axis 1 is negative"));
    line = __LINE__ + 1;
    assert_null(loom_tensor_from_host(f->ctx, LOOM_DTYPE_F32, 1, (int64_t[]){4}, NULL));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT, AT(line, "tensor_from_host: data is NULL"));
    line = __LINE__ + 1;
    assert_null(loom_tensor_from_host(f->ctx, LOOM_DTYPE_F32, 1, NULL, v));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT, AT(line, "tensor_from_host: shape is NULL for rank 1"));
}

static void test_bad_shape_arguments_to_movement_and_reduction_ops(void **state) {
    fixture *f = *state;
    int line = __LINE__ + 1;
    assert_null(loom_reshape(f->ctx, f->m23, 2, (int64_t[]){4, 2}));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT,
                 AT(line, "reshape: cannot reshape f32[2,3] to f32[4,2]: element counts differ"));
    line = __LINE__ + 1;
    assert_null(loom_reshape(f->ctx, f->m23, 2, (int64_t[]){-1, -1}));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT, AT(line, "reshape: only one extent may be -1"));
    line = __LINE__ + 1;
    assert_null(loom_reshape(f->ctx, f->m23, 2, (int64_t[]){4, -1}));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT,
                 AT(line, "reshape: cannot infer the -1 extent: 6 elements of f32[2,3] are not a "
                          "multiple of 4"));
    line = __LINE__ + 1;
    assert_null(loom_permute(f->ctx, f->m23, (int32_t[]){0, 0}));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT,
                 AT(line, "permute: perm is not a permutation of the 2 axes of f32[2,3]"));
    line = __LINE__ + 1;
    assert_null(loom_sum(f->ctx, f->m23, 1, (int32_t[]){2}, false));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT, AT(line, "sum: axis 2 is out of range for rank 2"));
    line = __LINE__ + 1;
    assert_null(loom_mean(f->ctx, f->m23, 2, (int32_t[]){1, -1}, false));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT, AT(line, "mean: axis -1 is listed twice"));
    line = __LINE__ + 1;
    assert_null(loom_transpose(f->ctx, f->v2));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT, AT(line, "transpose: needs rank >= 2, got rank 1"));
    line = __LINE__ + 1;
    assert_null(loom_broadcast(f->ctx, f->v2, 2, (int64_t[]){3, 3}));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT, AT(line, "broadcast: cannot broadcast f32[2] to f32[3,3]"));
    line = __LINE__ + 1;
    assert_null(loom_cast(f->ctx, f->v2, LOOM_DTYPE_COUNT_));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT, AT(line, "cast: target dtype 7 is not a valid dtype"));
    line = __LINE__ + 1;
    assert_null(loom_select(f->ctx, f->v2, f->v2, f->v2));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT, AT(line, "select: condition must be bool, got f32[2]"));
}

static void test_read_with_wrong_size_or_null_destination(void **state) {
    fixture *f = *state;
    float out[3];
    assert_int_equal(loom_tensor_read(f->ctx, f->v2, out, sizeof out), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(f->ctx),
                           "tensor_read: size mismatch: destination holds 12 bytes, the tensor "
                           "f32[2] has 8"));
    loom_context_clear_error(f->ctx);
    assert_int_equal(loom_tensor_read(f->ctx, f->v2, NULL, 8), LOOM_STATUS_INVALID_ARGUMENT);
    loom_context_clear_error(f->ctx);
    assert_int_equal(loom_tensor_read(f->ctx, NULL, out, 8), LOOM_STATUS_INVALID_ARGUMENT);
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT, "tensor_read: tensor is NULL");
    assert_int_equal(loom_tensor_read(NULL, f->v2, out, 8), LOOM_STATUS_INVALID_ARGUMENT);
}

static void test_garbage_handles_do_not_crash(void **state) {
    fixture *f = *state;
    loom_tensor *garbage[] = {(loom_tensor *)(uintptr_t)0x1234, (loom_tensor *)(uintptr_t)~0ull,
                              (loom_tensor *)(uintptr_t)0x7fff000000000001ull};
    for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
        assert_null(loom_neg(f->ctx, garbage[i]));
        assert_int_not_equal(loom_context_error(f->ctx), LOOM_OK);
        loom_context_clear_error(f->ctx);
        loom_tensor_retain(garbage[i]);
        loom_tensor_release(garbage[i]);
        loom_context_clear_error(f->ctx);
    }
    expect_error(f, LOOM_OK, "");
}

static void test_context_creation_errors(void **state) {
    (void)state;
    assert_int_equal(loom_context_create(NULL, NULL), LOOM_STATUS_INVALID_ARGUMENT);
    loom_context_options opts;
    loom_context_options_init(&opts);
    opts.device = "gpu:0";
    loom_context *ctx = (loom_context *)(uintptr_t)1;
    assert_int_equal(loom_context_create(&opts, &ctx), LOOM_STATUS_INVALID_ARGUMENT);
    assert_null(ctx);
    loom_context_destroy(NULL);
    assert_string_equal(loom_status_name(LOOM_STATUS_STALE_HANDLE), "STALE_HANDLE");
    assert_string_equal(loom_status_name((loom_status)1000), "UNKNOWN");
    assert_string_equal(loom_dtype_name(LOOM_DTYPE_BF16), "bf16");
    assert_int_equal(loom_dtype_size(LOOM_DTYPE_F16), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_with_mismatched_inner_dims_names_shapes_and_line),
        cmocka_unit_test(test_binary_op_with_different_dtypes_is_rejected),
        cmocka_unit_test(test_shapes_that_do_not_broadcast_are_rejected),
        cmocka_unit_test(test_float_only_op_on_integers_is_rejected),
        cmocka_unit_test(test_null_operand_and_null_context),
        cmocka_unit_test(test_a_failed_op_feeding_the_next_keeps_the_first_error),
        cmocka_unit_test(test_step_scoped_tensor_used_after_its_step_is_a_stale_handle),
        cmocka_unit_test(test_released_tensor_and_over_release),
        cmocka_unit_test(test_handle_from_another_context_is_rejected),
        cmocka_unit_test(test_bad_tensor_creation_arguments),
        cmocka_unit_test(test_bad_shape_arguments_to_movement_and_reduction_ops),
        cmocka_unit_test(test_read_with_wrong_size_or_null_destination),
        cmocka_unit_test(test_garbage_handles_do_not_crash),
        cmocka_unit_test(test_context_creation_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
