/* The collective op builders of loom/dist.h on one rank (no loom_dist_init: the world is this
 * process): their values through a step on the JIT context (compiled: the program runs them
 * on the host) and an eager one, their errors, loom_allreduce_gradients (a no-op on one rank)
 * and the VJPs.
 * Several ranks: tests/runtime/comm_ranks.c under mpiexec. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "loom/dist.h"
#include "loom/nn.h"

/* One step of every collective on x; checks the values on one rank. */
static void collectives_step(loom_context *ctx) {
    const float xs[4] = {1, -2, 3.5f, 0.25f};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 2}, xs);
    loom_tensor *s = loom_all_reduce(ctx, x, LOOM_REDUCE_SUM, 0.5);
    loom_tensor *m = loom_all_reduce(ctx, x, LOOM_REDUCE_MIN, -1.0);
    loom_tensor *b = loom_broadcast_from(ctx, x, 0);
    loom_tensor *g = loom_all_gather(ctx, x);
    loom_tensor *r[4] = {s, m, b, g};
    for (int k = 0; k < 4; k++)
        loom_tensor_retain(r[k]);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    int32_t rank;
    int64_t shape[LOOM_MAX_RANK];
    assert_int_equal(loom_tensor_rank(g, &rank), LOOM_OK);
    assert_int_equal(loom_tensor_shape(g, shape), LOOM_OK);
    assert_int_equal(rank, 2);
    assert_true(shape[0] == 2 && shape[1] == 2); /* world 1 x 2 rows */
    float out[4];
    const float want[4][4] = {{0.5f, -1, 1.75f, 0.125f},
                              {-1, 2, -3.5f, -0.25f},
                              {1, -2, 3.5f, 0.25f},
                              {1, -2, 3.5f, 0.25f}};
    for (int k = 0; k < 4; k++) {
        tu_read_f32(ctx, r[k], out, 4);
        for (int i = 0; i < 4; i++)
            assert_true(out[i] == want[k][i]);
        loom_tensor_release(r[k]);
    }
    assert_int_equal(loom_metric_value(ctx, "Fallbacks"), 0); /* compiled, not interpreted */
    loom_tensor_release(x);
}

static loom_context *context_with_cache(const char *dir) {
    loom_context_options o;
    loom_context_options_init(&o);
    o.eager = false;
    o.cache_dir = dir;
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&o, &ctx), LOOM_OK);
    return ctx;
}

static void test_collectives_on_one_rank_give_the_scaled_value_in_a_step(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true); /* eager: the interpreter */
    collectives_step(ctx);
    loom_context_destroy(ctx);
    /* compiled, then the same code from the disk cache (collective kernels have none) */
    char dir[] = "/tmp/loom-collectives-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    for (int run = 0; run < 2; run++) {
        ctx = context_with_cache(dir);
        collectives_step(ctx);
        assert_int_equal(loom_metric_value(ctx, "DiskCacheHit"), run);
        loom_context_destroy(ctx);
    }
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void expect_error(loom_context *ctx, loom_tensor *t, int line, const char *part) {
    assert_null(t);
    assert_int_equal(loom_context_error(ctx), LOOM_STATUS_INVALID_ARGUMENT);
    const char *msg = loom_context_error_message(ctx);
    char where[64];
    snprintf(where, sizeof where, "test_collectives.c:%d", line);
    if (!strstr(msg, where) || !strstr(msg, part))
        fail_msg("message \"%s\" lacks \"%s\" or \"%s\"", msg, where, part);
    loom_context_clear_error(ctx);
}

static void test_collective_builders_reject_bad_attributes_naming_op_and_line(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    const int32_t is[2] = {1, 2};
    const float fs[2] = {1, 2};
    loom_tensor *i = loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 1, (int64_t[]){2}, is);
    loom_tensor *f = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2}, fs);
    loom_tensor *f0 = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 0, NULL, fs);
    expect_error(ctx, loom_all_reduce(ctx, f, LOOM_REDUCE_COUNT_, 1.0), __LINE__,
                 "all_reduce: reduce op 3 is not sum, max or min");
    expect_error(ctx, loom_all_reduce(ctx, f, LOOM_REDUCE_SUM, NAN), __LINE__,
                 "all_reduce: scale nan is not finite");
    expect_error(ctx, loom_all_reduce(ctx, i, LOOM_REDUCE_SUM, 0.5), __LINE__,
                 "scale 0.5 on i32[2]: only float dtypes scale");
    expect_error(ctx, loom_broadcast_from(ctx, f, 1), __LINE__,
                 "broadcast_from: root 1 is not a rank of this job (world size 1)");
    expect_error(ctx, loom_all_gather(ctx, f0), __LINE__,
                 "all_gather: gathers along axis 0, but the operand f32[] is a scalar");
    /* a NULL operand: NULL, and no new error */
    assert_null(loom_all_reduce(ctx, NULL, LOOM_REDUCE_SUM, 1.0));
    loom_context_clear_error(ctx);
    loom_tensor_release(i);
    loom_tensor_release(f);
    loom_tensor_release(f0);
    loom_context_destroy(ctx);
}

static void test_allreduce_gradients_on_one_rank_checks_and_records_nothing(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    const float a[3] = {1, 2, 3}, b[2] = {-4, 0.5f};
    const int32_t is[1] = {7};
    loom_tensor *ta = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){3}, a);
    loom_tensor *tb = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2}, b);
    loom_tensor *ti = loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 1, (int64_t[]){1}, is);
    loom_tensor *bad[2] = {ta, ti};
    assert_int_equal(loom_allreduce_gradients(ctx, 2, bad), LOOM_STATUS_INVALID_ARGUMENT);
    assert_true(bad[0] == ta && bad[1] == ti); /* nothing replaced */
    assert_non_null(strstr(loom_context_error_message(ctx), "grads[1] is i32[1]"));
    loom_context_clear_error(ctx);
    assert_int_equal(loom_allreduce_gradients(ctx, -1, bad), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "n is negative (-1)"));
    loom_context_clear_error(ctx);
    /* One rank's average is its own gradient: the entries stay and no op is recorded (a
     * collective would stay in the step: DCE keeps them). Several ranks: comm_ranks.c. */
    loom_tensor *grads[3] = {ta, NULL, tb};
    int64_t traced = loom_metric_value(ctx, "TracedOps");
    assert_int_equal(loom_allreduce_gradients(ctx, 3, grads), LOOM_OK);
    assert_int_equal(loom_allreduce_gradients(ctx, 0, NULL), LOOM_OK);
    assert_true(grads[0] == ta && grads[1] == NULL && grads[2] == tb);
    assert_int_equal(loom_metric_value(ctx, "TracedOps"), traced);
    loom_tensor *sum = loom_add(ctx, grads[0], grads[0]);
    loom_tensor_retain(sum);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    float out[3];
    tu_read_f32(ctx, sum, out, 3);
    assert_true(out[0] == 2 && out[1] == 4 && out[2] == 6);
    loom_tensor_release(sum);
    loom_tensor_release(ta);
    loom_tensor_release(tb);
    loom_tensor_release(ti);
    loom_context_destroy(ctx);
}

static void test_backward_through_a_sum_all_reduce_reduces_the_gradient(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    const float xs[3] = {1, -2, 3};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){3}, xs);
    loom_tensor *y = loom_all_reduce(ctx, loom_mul(ctx, x, x), LOOM_REDUCE_SUM, 0.25);
    loom_tensor *loss = loom_sum(ctx, y, 0, NULL, false);
    loom_tensor *grad = NULL;
    assert_int_equal(loom_backward(ctx, loss, 1, &x, &grad), LOOM_OK);
    loom_tensor_retain(grad);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    float out[3];
    tu_read_f32(ctx, grad, out, 3); /* 0.25 * 2x (one rank) */
    assert_true(out[0] == 0.5f && out[1] == -1 && out[2] == 1.5f);
    loom_tensor_release(grad);

    loom_tensor *mx = loom_sum(ctx, loom_all_reduce(ctx, x, LOOM_REDUCE_MAX, 1.0), 0, NULL, false);
    grad = NULL;
    assert_int_equal(loom_backward(ctx, mx, 1, &x, &grad), LOOM_STATUS_UNSUPPORTED);
    assert_non_null(strstr(loom_context_error_message(ctx),
                           "all_reduce {reduce = max} of f32[3] has no gradient rule"));
    loom_context_clear_error(ctx);
    loom_tensor *gt = loom_sum(ctx, loom_all_gather(ctx, x), 0, NULL, false);
    assert_int_equal(loom_backward(ctx, gt, 1, &x, &grad), LOOM_STATUS_UNSUPPORTED);
    assert_non_null(
        strstr(loom_context_error_message(ctx), "all_gather of f32[3] has no gradient"));
    loom_context_clear_error(ctx);
    loom_tensor_release(x);
    loom_context_destroy(ctx);
}

static void test_broadcast_parameters_on_one_rank_checks_and_records_nothing(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    const float a[2] = {1.5f, -2};
    loom_tensor *p = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2}, a);
    loom_tensor *step = loom_add(ctx, p, p);
    loom_tensor *bad[2] = {p, step};
    assert_int_equal(loom_broadcast_parameters(ctx, 2, bad), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx),
                           "broadcast_parameters: tensors[1] is a result of this step"));
    loom_context_clear_error(ctx);
    assert_int_equal(loom_broadcast_parameters(ctx, -1, bad), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "n is negative (-1)"));
    loom_context_clear_error(ctx);
    assert_int_equal(loom_broadcast_parameters(ctx, 1, NULL), LOOM_STATUS_INVALID_ARGUMENT);
    loom_context_clear_error(ctx);
    loom_tensor *ok[2] = {NULL, p};
    assert_int_equal(loom_broadcast_parameters(ctx, 2, ok), LOOM_OK);
    assert_int_equal(loom_broadcast_parameters(ctx, 0, NULL), LOOM_OK);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    float out[2];
    tu_read_f32(ctx, p, out, 2); /* one rank: its own values */
    assert_true(out[0] == 1.5f && out[1] == -2);
    loom_tensor_release(p);
    loom_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collectives_on_one_rank_give_the_scaled_value_in_a_step),
        cmocka_unit_test(test_collective_builders_reject_bad_attributes_naming_op_and_line),
        cmocka_unit_test(test_allreduce_gradients_on_one_rank_checks_and_records_nothing),
        cmocka_unit_test(test_backward_through_a_sum_all_reduce_reduces_the_gradient),
        cmocka_unit_test(test_broadcast_parameters_on_one_rank_checks_and_records_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
