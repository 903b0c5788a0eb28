/* Bad input through the public API: every case returns a clear error naming the op, the
 * shapes and the caller's line, and the context stays usable afterwards. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom/amp.h"
#include "loom/nn.h"
#include "loom/optim.h"
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
    /* the builders of issue 51 alike */
    loom_tensor *parts[2] = {f->v2, f->v2};
    int32_t n_parts = 7;
    assert_null(loom_gather(NULL, f->v2, 0, f->i2));
    assert_null(loom_index_select(NULL, f->v2, 0, f->i2));
    assert_null(loom_scatter_add(NULL, f->v2, 0, f->i2, f->v2));
    assert_null(loom_gelu_tanh(NULL, f->v2));
    assert_null(loom_tril(NULL, f->v2, 0));
    assert_null(loom_triu(NULL, f->v2, 0));
    assert_null(loom_masked_fill(NULL, f->v2, f->v2, 0.0));
    assert_int_equal(loom_split(NULL, f->v2, 2, (int64_t[]){1, 1}, 0, parts),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_chunk(NULL, f->v2, 2, 0, parts, &n_parts), LOOM_STATUS_INVALID_ARGUMENT);
    assert_null(loom_linear_t(NULL, f->v2, f->v2, NULL));
    assert_null(loom_cross_entropy_ex(NULL, f->v2, f->i2, NULL));
    assert_null(loom_scaled_dot_product_attention(NULL, f->m23, f->m23, f->m23, NULL, true, 0));
    assert_null(loom_scaled_dot_product_attention_ex(NULL, f->m23, f->m23, f->m23, NULL));
    loom_attention_options_init(NULL); /* accepted, does nothing */
    loom_tensor *norm = f->v2;
    assert_int_equal(loom_clip_grad_norm(NULL, 2, parts, 1.0, &norm), LOOM_STATUS_INVALID_ARGUMENT);
    assert_true(parts[0] == f->v2 && parts[1] == f->v2 && norm == f->v2); /* untouched */
    loom_optim_options oo;
    loom_optim_options_init(&oo, LOOM_OPTIM_ADAMW);
    loom_optim *opt = (loom_optim *)&opt;
    const loom_optim_group group = {1, &f->v2, 0.0};
    assert_int_equal(loom_optim_create_groups(NULL, &oo, 1, &group, &opt),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_context_error(f->ctx), LOOM_OK); /* f's context untouched */
    int line = __LINE__ + 1;
    assert_null(loom_add(f->ctx, NULL, f->v2));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT,
                 AT(line, "add: operand 0 is NULL (from an earlier failed op?)"));
}

static void test_clip_grad_norm_names_the_callers_line(void **state) {
    fixture *f = *state;
    loom_tensor *grads[2] = {f->v2, f->i2};
    int line = __LINE__ + 1;
    assert_int_equal(loom_clip_grad_norm(f->ctx, 1, grads, 0.0, NULL),
                     LOOM_STATUS_INVALID_ARGUMENT);
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT,
                 AT(line, "clip_grad_norm: max_norm must be finite and > 0 (in f32), got 0"));
    line = __LINE__ + 1;
    assert_int_equal(loom_clip_grad_norm(f->ctx, 2, grads, 1.0, NULL),
                     LOOM_STATUS_INVALID_ARGUMENT);
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT,
                 AT(line, "clip_grad_norm: grads[1] is i32[2], not floating point"));
    assert_true(grads[0] == f->v2 && grads[1] == f->i2);
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
    /* The other extents' product past int64 once was signed overflow (UB) and the message
     * "not a multiple of 0". */
    line = __LINE__ + 1;
    assert_null(loom_reshape(f->ctx, f->m23, 4,
                             (int64_t[]){-1, INT64_C(1) << 32, INT64_C(1) << 32, 2}));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT,
                 AT(line, "reshape: cannot infer the -1 extent of f32[2,3]: the other extents' "
                          "product overflows a 64-bit integer"));
    line = __LINE__ + 1;
    assert_null(loom_reshape(f->ctx, f->m23, 3, (int64_t[]){-1, 0, 3}));
    expect_error(f, LOOM_STATUS_INVALID_ARGUMENT,
                 AT(line, "reshape: cannot infer the -1 extent of f32[2,3]: the other extents' "
                          "product is 0, so any extent fits"));
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

/* Settings that are wrong are errors, not silently the default. */
static void test_bad_settings_are_errors(void **state) {
    (void)state;
    loom_context_options opts;
    loom_context *ctx = NULL;
    static const char *const bad[] = {"abc", "-3", "0", "2.5", "1e9"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("LOOM_NUM_THREADS", bad[i], 1);
        loom_context_options_init(&opts);
        assert_int_equal(loom_context_create(&opts, &ctx), LOOM_STATUS_INVALID_ARGUMENT);
        assert_null(ctx);
    }
    setenv("LOOM_NUM_THREADS", "1", 1);
    loom_context_options_init(&opts);
    assert_int_equal(loom_context_create(&opts, &ctx), LOOM_OK);
    loom_context_destroy(ctx);
    unsetenv("LOOM_NUM_THREADS");
    setenv("LOOM_MAX_GRAPH_NODES", "lots", 1);
    assert_int_equal(loom_context_create(NULL, &ctx), LOOM_STATUS_INVALID_ARGUMENT);
    unsetenv("LOOM_MAX_GRAPH_NODES");
    setenv("LOOM_DEVICE_MEMORY_MB", "-1", 1);
    assert_int_equal(loom_context_create(NULL, &ctx), LOOM_STATUS_INVALID_ARGUMENT);
    unsetenv("LOOM_DEVICE_MEMORY_MB");
    loom_context_options_init(&opts);
    opts.num_threads = -3;
    assert_int_equal(loom_context_create(&opts, &ctx), LOOM_STATUS_INVALID_ARGUMENT);
    loom_context_options_init(&opts);
    opts.max_graph_nodes = -1;
    assert_int_equal(loom_context_create(&opts, &ctx), LOOM_STATUS_INVALID_ARGUMENT);
}

/* ctx still computes: x + x in a step of its own reads back as want in every element. */
static void assert_still_computes(loom_context *ctx, loom_tensor *x, float want) {
    loom_tensor *z = loom_add(ctx, x, x);
    assert_non_null(z);
    loom_tensor_retain(z);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    int64_t n = 0;
    assert_int_equal(loom_tensor_numel(z, &n), LOOM_OK);
    static float v[1024];
    assert_true(n <= 1024);
    assert_int_equal(loom_tensor_read(ctx, z, v, (size_t)n * sizeof *v), LOOM_OK);
    for (int64_t i = 0; i < n; i++)
        assert_true(v[i] == want);
    loom_tensor_release(z);
}

/* A loop that forgets loom_mark_step is stopped at the graph limit with an error saying so
 * and naming the line that recorded most of the graph; the context stays usable. */
static void test_a_graph_past_its_limit_says_mark_step_is_missing(void **state) {
    (void)state;
    loom_context_options opts;
    loom_context_options_init(&opts);
    opts.max_graph_nodes = 200;
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&opts, &ctx), LOOM_OK);
    loom_tensor *x = tu_scalar_f32(ctx, 1.0f);
    loom_tensor *y = x;
    int line = 0;
    for (int i = 0; i < 300 && y; i++) {
        line = __LINE__ + 1;
        y = loom_add(ctx, y, x);
    }
    assert_null(y);
    assert_int_equal(loom_context_error(ctx), LOOM_STATUS_INVALID_ARGUMENT);
    char where[64];
    snprintf(where, sizeof where, "recorded at test_errors.c:%d", line);
    const char *msg = loom_context_error_message(ctx);
    if (!strstr(msg, "is a loom_mark_step missing in a loop?") || !strstr(msg, where) ||
        !strstr(msg, "200 nodes"))
        fail_msg("message: %s", msg);
    assert_int_equal(loom_mark_step(ctx), LOOM_STATUS_INVALID_ARGUMENT);
    loom_context_clear_error(ctx);
    assert_still_computes(ctx, x, 2.0f); /* the next step has room again */
    loom_tensor_release(x);
    loom_context_destroy(ctx);
}

/* A device-memory cap makes an allocation past it fail with OUT_OF_MEMORY, not the process
 * be killed; the context stays usable. */
static void test_a_device_memory_cap_fails_cleanly(void **state) {
    (void)state;
    loom_context_options opts;
    loom_context_options_init(&opts);
    opts.device_memory_mb = 1;
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&opts, &ctx), LOOM_OK);
    static float big[1 << 19]; /* 2 MB */
    int line = __LINE__ + 1;
    assert_null(loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){1 << 19}, big));
    char want[256];
    snprintf(want, sizeof want,
             "test_errors.c:%d: tensor_from_host: out of memory for 2097152 bytes of device "
             "memory; the device is capped at 1 MB (device_memory_mb, LOOM_DEVICE_MEMORY_MB) "
             "and holds 0 MB",
             line);
    assert_int_equal(loom_context_error(ctx), LOOM_STATUS_OUT_OF_MEMORY);
    assert_string_equal(loom_context_error_message(ctx), want);
    loom_context_clear_error(ctx);
    /* A step whose output (2 MB) is past the cap: the error says so and where the step's
     * memory goes. */
    loom_tensor *row = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){1024}, big);
    loom_tensor *wide = loom_broadcast(ctx, row, 2, (int64_t[]){512, 1024});
    loom_tensor *s = loom_exp(ctx, wide);
    loom_tensor_retain(s);
    loom_status st = loom_mark_step(ctx);
    if (st == LOOM_OK)
        st = loom_context_sync(ctx);
    const char *msg = loom_context_error_message(ctx);
    /* TAP: every line of the report as a comment */
    for (const char *l = msg; *l;) {
        size_t n = strcspn(l, "\n");
        print_message("# %.*s\n", (int)n, l);
        l += n + (l[n] == '\n');
    }
    assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
    if (!strstr(msg, "out of memory for output 0 of the step (2097152 bytes)") ||
        !strstr(msg, "the device is capped at 1 MB") || !strstr(msg, "planned peak"))
        fail_msg("message: %s", msg);
    loom_tensor_release(s);
    loom_tensor_release(row);
    loom_context_clear_error(ctx);
    loom_tensor *small = tu_scalar_f32(ctx, 3.0f);
    assert_still_computes(ctx, small, 6.0f);
    loom_tensor_release(small);
    loom_context_destroy(ctx);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The seconds to compile and run a chain of n elementwise ops (what a loop that should
 * have called loom_mark_step builds), checking its value. */
static double chain_seconds(int n) {
    loom_context *ctx = tu_context(false);
    float one = 1.0f;
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 0, NULL, &one), *y = x;
    for (int i = 0; i < n; i++) /* y/2 + 1/4: 0.5 is its fixed point, reached exactly */
        y = loom_add(ctx, loom_mul(ctx, y, loom_scalar(ctx, LOOM_DTYPE_F32, 0.5)),
                     loom_scalar(ctx, LOOM_DTYPE_F32, 0.25));
    assert_non_null(y);
    loom_tensor_retain(y);
    double t0 = now_s();
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    float v = 0;
    assert_int_equal(loom_tensor_read(ctx, y, &v, sizeof v), LOOM_OK);
    double t = now_s() - t0;
    assert_true(v == 0.5f);
    loom_tensor_release(y);
    loom_tensor_release(x);
    loom_context_destroy(ctx);
    return t;
}

/* A 100,000-node chain compiles in time linear in its length (fused kernels are capped, so
 * no LLVM function grows with it; it took 63 s when they were not) and without recursion as
 * deep as the chain (it overflowed the stack under ASan). */
static void test_a_long_chain_compiles_in_linear_time(void **state) {
    (void)state;
    double t1 = chain_seconds(25000), t4 = chain_seconds(100000);
    print_message("# 25,000 nodes: %.2f s; 100,000 nodes: %.2f s\n", t1, t4);
    if (t4 > 8 * t1 + 2) /* linear: 4x; quadratic: 16x */
        fail_msg("100,000 nodes took %.2f s, 25,000 took %.2f s: not linear", t4, t1);
}

/* Passes that walk down a chain walk it without recursing as deep as it: the autocast pass
 * places a weight's cast at its source through 100,000 transposes, and reduce-factor looks
 * for factors through a product of 100,000 operands (both overflowed the stack, the first
 * even without ASan). The values are exact: x is small integers, bf16 holds them. */
static void test_passes_walk_long_chains_without_deep_recursion(void **state) {
    (void)state;
    enum { N = 100000 };
    loom_context *ctx = tu_context(false);
    const float xv[4] = {1, 2, 3, 4}, wv[4] = {1, 0, 0, 2}; /* w = diag(1, 2) */
    const int64_t sh[2] = {2, 2};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, sh, xv);
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, sh, wv);
    loom_tensor *t = w;
    for (int i = 0; i < N; i++) /* even: w itself */
        t = loom_transpose(ctx, t);
    assert_int_equal(loom_autocast_begin(ctx, LOOM_DTYPE_BF16), LOOM_OK);
    loom_tensor *y = loom_matmul(ctx, x, t);
    assert_int_equal(loom_autocast_end(ctx), LOOM_OK);
    const float ones[4] = {1, 1, 1, 1};
    loom_tensor *o = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, sh, ones), *p = o;
    for (int i = 0; i < N; i++)
        p = loom_mul(ctx, p, o);
    loom_tensor *sum = loom_sum(ctx, p, 0, NULL, false);
    assert_non_null(y);
    assert_non_null(sum);
    loom_tensor_retain(y);
    loom_tensor_retain(sum);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    float got[4] = {0}, s = 0;
    assert_int_equal(loom_tensor_read(ctx, y, got, sizeof got), LOOM_OK);
    assert_int_equal(loom_tensor_read(ctx, sum, &s, sizeof s), LOOM_OK);
    const float want[4] = {1, 4, 3, 8};
    for (int i = 0; i < 4; i++)
        assert_true(got[i] == want[i]);
    assert_true(s == 4.0f);
    loom_tensor_release(y);
    loom_tensor_release(sum);
    loom_tensor_release(x);
    loom_tensor_release(w);
    loom_tensor_release(o);
    loom_context_destroy(ctx);
}

/* One context used from two threads at once: a call that finds another thread inside the
 * context fails with BUSY (such use crashed), and the thread inside records the misuse when it
 * leaves. The allocator holds this thread inside (a context allocates only from the thread
 * using it) while the other thread tries the context every way. */
typedef struct {
    loom_context *ctx;
    loom_tensor *t;
    atomic_bool hold, inside, done;
    loom_status query, step, read;
    bool op_refused;
} two_threads;

static void *holding_alloc(void *ud, void *ptr, size_t old_size, size_t new_size) {
    two_threads *tt = ud;
    (void)old_size;
    if (new_size && atomic_exchange(&tt->hold, false)) {
        atomic_store(&tt->inside, true);
        double t0 = now_s();
        while (!atomic_load(&tt->done) && now_s() - t0 < 20)
            sched_yield();
    }
    if (!new_size) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, new_size);
}

static void *other_thread(void *arg) {
    two_threads *tt = arg;
    double t0 = now_s();
    while (!atomic_load(&tt->inside) && now_s() - t0 < 20)
        sched_yield();
    int64_t n = 0;
    float v[4];
    tt->query = loom_tensor_numel(tt->t, &n);
    tt->op_refused = loom_full(tt->ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2}, 1.0) == NULL;
    tt->read = loom_tensor_read(tt->ctx, tt->t, v, sizeof v);
    tt->step = loom_mark_step(tt->ctx);
    loom_tensor_release(tt->t); /* refused: the count stays */
    loom_context_destroy(tt->ctx); /* refused: the context lives on */
    atomic_store(&tt->done, true);
    return NULL;
}

static void test_a_context_used_from_two_threads_at_once_fails_with_busy(void **state) {
    (void)state;
    static two_threads tt;
    memset(&tt, 0, sizeof tt);
    loom_context_options o;
    loom_context_options_init(&o);
    o.allocator = (loom_allocator){holding_alloc, &tt};
    o.eager = false;
    assert_int_equal(loom_context_create(&o, &tt.ctx), LOOM_OK);
    float v[4] = {1, 2, 3, 4};
    tt.t = loom_tensor_from_host(tt.ctx, LOOM_DTYPE_F32, 1, (int64_t[]){4}, v);
    assert_non_null(tt.t);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread, &tt), 0);
    atomic_store(&tt.hold, true);
    /* Held inside (in the allocator) until the other thread has tried everything. */
    float big[1024] = {0};
    loom_tensor *b = loom_tensor_from_host(tt.ctx, LOOM_DTYPE_F32, 1, (int64_t[]){1024}, big);
    pthread_join(th, NULL);
    assert_true(atomic_load(&tt.inside) && atomic_load(&tt.done));
    assert_non_null(b); /* the thread inside was not disturbed */
    assert_int_equal(tt.query, LOOM_STATUS_BUSY);
    assert_true(tt.op_refused);
    assert_int_equal(tt.read, LOOM_STATUS_BUSY);
    assert_int_equal(tt.step, LOOM_STATUS_BUSY);
    assert_int_equal(loom_context_error(tt.ctx), LOOM_STATUS_BUSY);
    assert_string_equal(loom_context_error_message(tt.ctx),
                        "tensor_numel: the context was used from two threads at once: this "
                        "call came from another thread while one was inside the context, and "
                        "was refused (a context is used by one thread at a time: one context "
                        "per thread, or a lock around it)");
    /* Used from one thread again, it works; the refused release and destroy did nothing. */
    loom_context_clear_error(tt.ctx);
    assert_still_computes(tt.ctx, b, 0.0f);
    float w[4];
    assert_int_equal(loom_tensor_read(tt.ctx, tt.t, w, sizeof w), LOOM_OK);
    assert_true(w[0] == 1.0f && w[3] == 4.0f);
    loom_tensor_release(b);
    loom_tensor_release(tt.t);
    assert_int_equal(loom_context_error(tt.ctx), LOOM_OK);
    loom_context_destroy(tt.ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_with_mismatched_inner_dims_names_shapes_and_line),
        cmocka_unit_test(test_binary_op_with_different_dtypes_is_rejected),
        cmocka_unit_test(test_shapes_that_do_not_broadcast_are_rejected),
        cmocka_unit_test(test_float_only_op_on_integers_is_rejected),
        cmocka_unit_test(test_null_operand_and_null_context),
        cmocka_unit_test(test_clip_grad_norm_names_the_callers_line),
        cmocka_unit_test(test_a_failed_op_feeding_the_next_keeps_the_first_error),
        cmocka_unit_test(test_step_scoped_tensor_used_after_its_step_is_a_stale_handle),
        cmocka_unit_test(test_released_tensor_and_over_release),
        cmocka_unit_test(test_handle_from_another_context_is_rejected),
        cmocka_unit_test(test_bad_tensor_creation_arguments),
        cmocka_unit_test(test_bad_shape_arguments_to_movement_and_reduction_ops),
        cmocka_unit_test(test_read_with_wrong_size_or_null_destination),
        cmocka_unit_test(test_garbage_handles_do_not_crash),
        cmocka_unit_test(test_context_creation_errors),
        cmocka_unit_test(test_bad_settings_are_errors),
        cmocka_unit_test(test_a_graph_past_its_limit_says_mark_step_is_missing),
        cmocka_unit_test(test_a_device_memory_cap_fails_cleanly),
        cmocka_unit_test(test_a_long_chain_compiles_in_linear_time),
        cmocka_unit_test(test_passes_walk_long_chains_without_deep_recursion),
        cmocka_unit_test(test_a_context_used_from_two_threads_at_once_fails_with_busy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
