/* Steady state: identical steps compile once and then hit the cache, with flat memory. */
#include <string.h>

#include "test_util.h"

/* One training-like step: y = relu(x w + b); loss = mean(y^2); w -= 0.01 * x^T y. */
static loom_tensor *step(loom_context *ctx, loom_tensor *x, loom_tensor *w, loom_tensor *b,
                         loom_tensor **out_loss) {
    loom_tensor *y = loom_relu(ctx, loom_add(ctx, loom_matmul(ctx, x, w), b));
    *out_loss = loom_mean(ctx, loom_mul(ctx, y, y), 0, NULL, false);
    loom_tensor *g = loom_matmul(ctx, loom_transpose(ctx, x), y);
    return loom_sub(ctx, w, loom_mul(ctx, g, loom_scalar(ctx, LOOM_DTYPE_F32, 0.01)));
}

static void test_1000_identical_steps_compile_once_with_flat_memory(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_context *ctx = tu_context_alloc(false, &ta);
    float xs[8 * 16], ws[16 * 4], bs[4] = {0.1f, -0.1f, 0.2f, 0};
    for (int i = 0; i < 8 * 16; i++)
        xs[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < 16 * 4; i++)
        ws[i] = (float)((i * 13) % 7) / 7.0f - 0.5f;
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){8, 16}, xs);
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){16, 4}, ws);
    loom_tensor *b = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){4}, bs);
    int64_t host_after_warmup = 0, host_peak_after_warmup = 0;
    size_t dev_after_warmup = 0, dev_peak_after_warmup = 0;
    float first_loss = 0, loss_value = 0;
    for (int i = 0; i < 1000; i++) {
        loom_tensor *loss;
        loom_tensor *w_next = step(ctx, x, w, b, &loss);
        loom_tensor_retain(w_next);
        loom_tensor_retain(loss);
        assert_int_equal(loom_mark_step(ctx), LOOM_OK);
        assert_int_equal(loom_tensor_read(ctx, loss, &loss_value, sizeof loss_value), LOOM_OK);
        if (i == 0)
            first_loss = loss_value;
        loom_tensor_release(loss);
        loom_tensor_release(w);
        w = w_next;
        if (i == 9) {
            host_after_warmup = ta.live_bytes;
            host_peak_after_warmup = ta.peak_bytes;
            assert_int_equal(loom_device_memory(ctx, &dev_after_warmup, &dev_peak_after_warmup),
                             LOOM_OK);
        }
    }
    assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 1);
    assert_int_equal(loom_metric_value(ctx, "CacheHit"), 999);
    assert_int_equal(loom_metric_value(ctx, "MarkStep"), 1000);
    assert_int_equal(loom_metric_value(ctx, "ExecuteTime"), 1000);
    assert_int_equal(loom_metric_value(ctx, "CompileTime"), 1);
    /* memory is flat: host and device bytes after 1000 steps equal those after 10 */
    assert_int_equal(ta.live_bytes, host_after_warmup);
    assert_int_equal(ta.peak_bytes, host_peak_after_warmup);
    size_t dev_now, dev_peak;
    assert_int_equal(loom_device_memory(ctx, &dev_now, &dev_peak), LOOM_OK);
    assert_int_equal(dev_now, dev_after_warmup);
    assert_int_equal(dev_peak, dev_peak_after_warmup);
    /* and the steps did real work: gradient descent on mean(y^2) drives it down */
    assert_true(loss_value < first_loss);
    loom_tensor_release(x);
    loom_tensor_release(w);
    loom_tensor_release(b);
    loom_context_destroy(ctx);
    assert_int_equal(ta.live_bytes, 0);
}

static void test_a_new_shape_misses_and_other_source_lines_hit(void **state) {
    (void)state;
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(NULL, &ctx), LOOM_OK);
    float v[6] = {1, 2, 3, 4, 5, 6};
    loom_tensor *a = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){6}, v);
    loom_tensor *b = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 3}, v);
    loom_tensor *r1 = loom_exp(ctx, a);
    loom_tensor_retain(r1);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    loom_tensor *r2 = loom_exp(ctx, a); /* same graph from another line: locations not hashed */
    loom_tensor_retain(r2);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 1);
    assert_int_equal(loom_metric_value(ctx, "CacheHit"), 1);
    loom_tensor *r3 = loom_exp(ctx, b); /* new shape: a new graph */
    loom_tensor_retain(r3);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 2);
    loom_tensor *r4 = loom_add(ctx, loom_exp(ctx, a), loom_scalar(ctx, LOOM_DTYPE_F32, 1.0));
    loom_tensor_retain(r4);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    loom_tensor *r5 = loom_add(ctx, loom_exp(ctx, a), loom_scalar(ctx, LOOM_DTYPE_F32, 2.0));
    loom_tensor_retain(r5);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 4); /* a constant is part of the graph */
    float o1[6], o2[6];
    assert_int_equal(loom_tensor_read(ctx, r1, o1, sizeof o1), LOOM_OK);
    assert_int_equal(loom_tensor_read(ctx, r3, o2, sizeof o2), LOOM_OK);
    assert_memory_equal(o1, o2, sizeof o1);
    assert_true(o1[0] == 2.71828182845904523536f);
    loom_tensor *all[] = {a, b, r1, r2, r3, r4, r5};
    for (int i = 0; i < 7; i++)
        loom_tensor_release(all[i]);
    loom_context_destroy(ctx);
}

static void test_releasing_an_assigned_tensor_drops_its_pending_write(void **state) {
    (void)state;
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(NULL, &ctx), LOOM_OK);
    float a = 1, b = 10, out = 0;
    loom_tensor *t = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 0, NULL, &a);
    assert_int_equal(loom_assign(ctx, t, loom_add(ctx, t, t)), LOOM_OK);
    loom_tensor_release(t); /* dies with its assignment pending */
    loom_tensor *u = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 0, NULL, &b); /* reuses the slot */
    assert_int_equal(loom_assign(ctx, u, loom_mul(ctx, u, u)), LOOM_OK);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    assert_int_equal(loom_tensor_read(ctx, u, &out, sizeof out), LOOM_OK);
    assert_float_equal(out, 100, 0);
    loom_tensor_release(u);
    loom_context_destroy(ctx);
}

/* A read in the middle of a step computes a pending assignment; the step then goes on. */
static void run_read_between_assignments(bool eager) {
    loom_context *ctx = tu_context(eager);
    float one = 1, ten = 10, got = 0;
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 0, NULL, &one);
    loom_tensor *old = loom_mul(ctx, x, loom_scalar(ctx, LOOM_DTYPE_F32, 10.0));
    loom_tensor_retain(old);
    assert_int_equal(loom_assign(ctx, x, loom_add(ctx, x, loom_scalar(ctx, LOOM_DTYPE_F32, 1))),
                     LOOM_OK);
    tu_read_f32(ctx, x, &got, 1);
    assert_true(got == 2);
    /* assigned again in the same step: one pending write, from the value read */
    assert_int_equal(loom_assign(ctx, x, loom_mul(ctx, x, loom_scalar(ctx, LOOM_DTYPE_F32, 3))),
                     LOOM_OK);
    loom_tensor *later = loom_add(ctx, x, loom_scalar(ctx, LOOM_DTYPE_F32, 0.5));
    loom_tensor_retain(later);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    tu_read_f32(ctx, x, &got, 1);
    assert_true(got == 6);
    tu_read_f32(ctx, later, &got, 1);
    assert_true(got == 6.5f);
    /* ops recorded before the assignment read the old value, although the read computed
     * the new one first */
    tu_read_f32(ctx, old, &got, 1);
    assert_true(got == 10);
    /* a tensor released after a read computed its assignment leaves no pending write for
     * the next tenant of its slot */
    assert_int_equal(loom_assign(ctx, x, loom_neg(ctx, x)), LOOM_OK);
    tu_read_f32(ctx, x, &got, 1);
    assert_true(got == -6);
    loom_tensor_release(x);
    loom_tensor *y = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 0, NULL, &ten);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    tu_read_f32(ctx, y, &got, 1);
    assert_true(got == 10);
    loom_tensor_release(y);
    loom_tensor_release(old);
    loom_tensor_release(later);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_a_read_between_assignments_neither_duplicates_nor_leaks_the_write(void **state) {
    (void)state;
    run_read_between_assignments(true);
    run_read_between_assignments(false);
}

/* loom_compile_step compiles the pending step without running it: the memory report is
 * known, nothing ran, and the mark_step that follows hits the cache. Ops recorded between
 * them make another graph; nothing pending compiles nothing. */
static void test_a_step_compiled_before_it_runs_is_not_compiled_again(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    assert_int_equal(loom_compile_step(NULL), LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_compile_step(ctx), LOOM_OK); /* nothing pending */
    assert_int_equal(loom_metric_value(ctx, "CompileTime"), 0);
    assert_string_equal(loom_memory_report(ctx), "");
    float ws[4] = {1, 2, 3, 4};
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 2}, ws);
    /* w <- w * w (an assignment: donated), and y = w * w + w read back */
    loom_tensor *sq = loom_mul(ctx, w, w);
    loom_tensor *y = loom_add(ctx, sq, w);
    loom_tensor_retain(y);
    assert_int_equal(loom_assign(ctx, w, sq), LOOM_OK);
    assert_int_equal(loom_compile_step(ctx), LOOM_OK);
    assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 1);
    assert_int_equal(loom_metric_value(ctx, "ExecuteTime"), 0); /* nothing ran */
    assert_int_equal(loom_context_step(ctx), 0);                /* the step is still open */
    assert_non_null(strstr(loom_memory_report(ctx), "memory: planned peak "));
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 1); /* the same graph: a hit */
    assert_int_equal(loom_metric_value(ctx, "CacheHit"), 1);
    assert_int_equal(loom_metric_value(ctx, "CompileTime"), 1);
    float got[4];
    tu_read_f32(ctx, y, got, 4);
    tu_read_f32(ctx, w, ws, 4);
    for (int i = 0; i < 4; i++) {
        float v = (float)(i + 1);
        assert_true(got[i] == v * v + v && ws[i] == v * v);
    }
    loom_tensor_release(y);
    /* ops recorded after loom_compile_step: mark_step compiles the larger graph */
    loom_tensor *a = loom_neg(ctx, w);
    loom_tensor_retain(a);
    assert_int_equal(loom_compile_step(ctx), LOOM_OK);
    loom_tensor *b2 = loom_exp(ctx, a);
    loom_tensor_retain(b2);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 3);
    tu_read_f32(ctx, a, got, 4);
    assert_true(got[3] == -16.0f);
    loom_tensor_release(a);
    loom_tensor_release(b2);
    loom_tensor_release(w);
    loom_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_1000_identical_steps_compile_once_with_flat_memory),
        cmocka_unit_test(test_a_step_compiled_before_it_runs_is_not_compiled_again),
        cmocka_unit_test(test_a_new_shape_misses_and_other_source_lines_hit),
        cmocka_unit_test(test_releasing_an_assigned_tensor_drops_its_pending_write),
        cmocka_unit_test(test_a_read_between_assignments_neither_duplicates_nor_leaks_the_write),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
