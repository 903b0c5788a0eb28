/* Fault injection: fail the N-th allocation of a small program, for every N until the
 * program no longer allocates that many times. Each failure must surface as
 * OUT_OF_MEMORY, leak nothing, and leave the context usable. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"
#include "loom/amp.h"
#include "loom/nn.h"
#include "loom/optim.h"

/* x[2,3] . w[3,2] -> relu(. + 0.5) -> sum: expected 1.5 + 0 + ... computed below. */
static loom_status program(loom_context *ctx, float *out_sum) {
    const float xs[6] = {1, 2, 3, -4, -5, -6}, ws[6] = {1, 0, 0, 1, 1, 1};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 3}, xs);
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){3, 2}, ws);
    loom_tensor *y = loom_relu(ctx, loom_add(ctx, loom_matmul(ctx, x, w),
                                             loom_scalar(ctx, LOOM_DTYPE_F32, 0.5)));
    loom_tensor *s = loom_sum(ctx, y, 0, NULL, false);
    loom_tensor_retain(s);
    loom_status st = loom_mark_step(ctx);
    if (st == LOOM_OK)
        st = loom_tensor_read(ctx, s, out_sum, sizeof *out_sum);
    loom_tensor_release(s);
    loom_tensor_release(x);
    loom_tensor_release(w);
    return st != LOOM_OK ? st : loom_context_error(ctx);
}

static void discard(const char *chunk, size_t len, void *ud) {
    (void)chunk;
    *(size_t *)ud += len;
}

/* Sweeps the failing allocation over context creation and the program (with profile:
 * also timing its kernels and reporting them). */
static void sweep_failed_allocations(bool profile) {
    /* x.w = [[4, 5], [-11, -11]] -> +0.5 -> relu -> [[4.5, 5.5], [0, 0]] -> 10 */
    const float want = 10.0f;
    int64_t n;
    int failures = 0, arena_failures = 0;
    for (n = 1; n < 10000; n++) {
        test_alloc ta = {.fail_at = n};
        loom_context_options opts;
        loom_context_options_init(&opts);
        opts.dump_dir = NULL;
        opts.allocator = test_alloc_make(&ta);
        opts.profile = profile;
        loom_context *ctx = NULL;
        loom_status st = loom_context_create(&opts, &ctx);
        if (st != LOOM_OK) {
            assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
            assert_null(ctx);
            assert_int_equal(ta.live_bytes, 0);
            failures++;
            continue;
        }
        float sum = 0;
        st = program(ctx, &sum);
        size_t written = 0;
        if (profile && st == LOOM_OK) {
            st = loom_profile_report(ctx, LOOM_REPORT_FORMAT_JSON, discard, &written);
            assert_true(st == LOOM_OK ? written > 0 : written == 0);
        }
        if (ta.n_failed == 0) { /* the program no longer reaches allocation n: done */
            assert_int_equal(st, LOOM_OK);
            assert_true(sum == want);
            loom_context_destroy(ctx);
            assert_int_equal(ta.live_bytes, 0);
            break;
        }
        failures++;
        assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
        if (written == 0 && loom_context_error(ctx) != LOOM_OK) { /* not the report's failure */
            const char *msg = loom_context_error_message(ctx);
            assert_non_null(strstr(msg, "out of memory"));
            if (strstr(msg, "-byte arena")) { /* the step's memory: where it goes */
                arena_failures++;
                if (!strstr(msg, "\nmemory: planned peak ") || !strstr(msg, "most alive at kernel"))
                    fail_msg("the arena's out-of-memory error lacks the memory report: %s", msg);
            }
        }
        /* the context stays usable: the same program now succeeds */
        ta.fail_at = 0;
        loom_context_clear_error(ctx);
        sum = 0;
        assert_int_equal(program(ctx, &sum), LOOM_OK);
        assert_true(sum == want);
        if (profile)
            assert_int_equal(loom_profile_report(ctx, LOOM_REPORT_FORMAT_TEXT, discard, &written),
                             LOOM_OK);
        loom_context_destroy(ctx);
        assert_int_equal(ta.live_bytes, 0);
        assert_int_equal(ta.live_blocks, 0);
    }
    assert_true(n < 10000);
    assert_true(failures >= 20); /* the sweep really covered the program's allocations */
    assert_true(arena_failures >= 1);
}

static void test_every_failed_allocation_reports_oom_leaks_nothing_and_recovers(void **state) {
    (void)state;
    sweep_failed_allocations(false);
}

static void test_profiling_survives_every_failed_allocation(void **state) {
    (void)state;
    /* each context prints its profile when destroyed: not into the test's log */
    fflush(stderr);
    int saved = dup(2), null = open("/dev/null", O_WRONLY);
    assert_true(saved >= 0 && null >= 0);
    dup2(null, 2);
    sweep_failed_allocations(true);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(null);
}

/* One training step: linear + cross-entropy, backward, gradient clipping, an Adam update of
 * both parameters; with amp, the forward under bf16 autocast (so the autocast and
 * matmul-casts passes run) and through a GradScaler (scale, unscale, the update skipped on
 * found_inf, the scale's update), and the optimizer made of two parameter groups (the
 * weight decayed, the bias not), so that both create entry points are swept. */
static loom_status train_step(loom_context *ctx, bool amp, float *out_w) {
    const float xs[6] = {1, 2, 3, -4, -5, -6}, ws[6] = {0.1f, 0.2f, -0.3f, 0.4f, 0.5f, -0.6f};
    const float bs[2] = {0.5f, -0.5f};
    const int64_t ys[2] = {1, 0};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 3}, xs);
    loom_tensor *y = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 1, (int64_t[]){2}, ys);
    loom_tensor *p[2] = {loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 3}, ws),
                         loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2}, bs)};
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_ADAM);
    loom_optim *opt = NULL;
    loom_grad_scaler *scaler = NULL;
    loom_grad_scaler_options so;
    loom_grad_scaler_options_init(&so);
    so.enabled = amp;
    const loom_optim_group groups[2] = {{1, &p[0], 0.01}, {1, &p[1], 0.0}};
    loom_status st = !p[0] || !p[1] ? loom_context_error(ctx)
                     : amp          ? loom_optim_create_groups(ctx, &o, 2, groups, &opt)
                                    : loom_optim_create(ctx, &o, 2, p, &opt);
    if (st == LOOM_OK)
        st = loom_grad_scaler_create(ctx, &so, &scaler);
    if (st == LOOM_OK) {
        if (amp)
            loom_autocast_begin(ctx, LOOM_DTYPE_BF16);
        loom_tensor *loss =
            loom_cross_entropy(ctx, loom_linear(ctx, x, p[0], p[1]), y, LOOM_REDUCTION_MEAN);
        if (amp)
            loom_autocast_end(ctx);
        loom_tensor *g[2] = {NULL, NULL};
        st = loom_backward(ctx, loom_grad_scaler_scale(scaler, loss), 2, p, g);
        loom_tensor *found = NULL;
        if (st == LOOM_OK && amp) {
            found = loom_grad_scaler_unscale(scaler, 2, g);
            st = loom_context_error(ctx);
        }
        if (st == LOOM_OK) /* the loss's gradient has a norm above 0.5: a real clip */
            st = loom_clip_grad_norm(ctx, 2, g, 0.5, NULL);
        if (st == LOOM_OK)
            st = loom_optim_step(opt, g, found);
        if (st == LOOM_OK)
            st = loom_grad_scaler_update(scaler, found);
        if (st == LOOM_OK)
            st = loom_mark_step(ctx);
        if (st == LOOM_OK)
            st = loom_tensor_read(ctx, p[0], out_w, 6 * sizeof *out_w);
    }
    loom_grad_scaler_destroy(scaler);
    loom_optim_destroy(opt);
    loom_tensor_release(x);
    loom_tensor_release(y);
    loom_tensor_release(p[0]);
    loom_tensor_release(p[1]);
    return st != LOOM_OK ? st : loom_context_error(ctx);
}

static void training_step_survives_every_failed_allocation(bool amp) {
    float want[6];
    loom_context *ref = NULL;
    assert_int_equal(loom_context_create(NULL, &ref), LOOM_OK);
    assert_int_equal(train_step(ref, amp, want), LOOM_OK);
    loom_context_destroy(ref);
    int64_t n;
    int failures = 0;
    for (n = 1; n < 100000; n++) {
        test_alloc ta = {.fail_at = n};
        loom_context_options opts;
        loom_context_options_init(&opts);
        opts.allocator = test_alloc_make(&ta);
        loom_context *ctx = NULL;
        if (loom_context_create(&opts, &ctx) != LOOM_OK) {
            assert_int_equal(ta.live_bytes, 0);
            failures++;
            continue;
        }
        float w[6] = {0};
        loom_status st = train_step(ctx, amp, w);
        if (ta.n_failed == 0) {
            assert_int_equal(st, LOOM_OK);
            assert_memory_equal(w, want, sizeof w);
            loom_context_destroy(ctx);
            assert_int_equal(ta.live_bytes, 0);
            break;
        }
        failures++;
        if (st != LOOM_STATUS_OUT_OF_MEMORY)
            fail_msg("allocation %lld failed: %s instead of OUT_OF_MEMORY: %s", (long long)n,
                     loom_status_name(st), loom_context_error_message(ctx));
        ta.fail_at = 0;
        loom_context_clear_error(ctx);
        if ((st = train_step(ctx, amp, w)) != LOOM_OK)
            fail_msg("after failing allocation %lld, the next step fails: %s", (long long)n,
                     loom_context_error_message(ctx));
        assert_memory_equal(w, want, sizeof w);
        loom_context_destroy(ctx);
        assert_int_equal(ta.live_bytes, 0);
        assert_int_equal(ta.live_blocks, 0);
    }
    assert_true(n < 100000);
    assert_true(failures >= 50);
}

static void test_a_training_step_survives_every_failed_allocation(void **state) {
    (void)state;
    training_step_survives_every_failed_allocation(false);
}

static void test_an_amp_training_step_survives_every_failed_allocation(void **state) {
    (void)state;
    training_step_survives_every_failed_allocation(true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_failed_allocation_reports_oom_leaks_nothing_and_recovers),
        cmocka_unit_test(test_profiling_survives_every_failed_allocation),
        cmocka_unit_test(test_a_training_step_survives_every_failed_allocation),
        cmocka_unit_test(test_an_amp_training_step_survives_every_failed_allocation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
