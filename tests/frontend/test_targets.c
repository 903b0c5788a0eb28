/* Devices bring their compiler (runtime/target.h): a target registered from outside the
 * frontend builds the steps of a context whose device names it, its fallback builds what it
 * answers UNSUPPORTED for (counted, as the JIT's fallback to the interpreter is), and
 * LOOM_EAGER's "ref" target is what an eager context builds with. */
#include <string.h>

#include "test_util.h"
#include "runtime/target.h"
#include "targets/targets.h"

static int toy_builds, shy_builds;

/* A target whose compiler is the reference interpreter's, counted. */
static loom_status toy_build(const loom_ir_graph *cut, uint64_t hash,
                             const loom_rt_build_options *o, struct loom_rt_pool *pool,
                             const loom_allocator *a, loom_rt_metrics *m,
                             loom_rt_executable **out_exe, loom_ir_diag *d) {
    toy_builds++;
    return loom_rt_target_find("ref")->build(cut, hash, o, pool, a, m, out_exe, d);
}

/* A target that supports nothing: every step falls back to "ref". */
static loom_status shy_build(const loom_ir_graph *cut, uint64_t hash,
                             const loom_rt_build_options *o, struct loom_rt_pool *pool,
                             const loom_allocator *a, loom_rt_metrics *m,
                             loom_rt_executable **out_exe, loom_ir_diag *d) {
    (void)cut, (void)hash, (void)o, (void)pool, (void)a, (void)m, (void)out_exe;
    shy_builds++;
    return loom_ir_diag_set(d, LOOM_STATUS_UNSUPPORTED, "shy: no kernels at all");
}

static loom_status none_supported(const loom_ir_graph *g, loom_ir_diag *d) {
    (void)g;
    return loom_ir_diag_set(d, LOOM_STATUS_UNSUPPORTED, "shy: no kernels at all");
}

static const loom_rt_target toy = {.name = "toy", .compiler = "the toy", .build = toy_build};
static const loom_rt_target shy = {.name = "shy",
                                   .compiler = "the shy compiler",
                                   .build = shy_build,
                                   .supports = none_supported,
                                   .fallback = "ref"};

/* (x + 1) * 2 of x = {1, 2, 3} on a context of device `device`, checked. */
static loom_context *run_step(const char *device, bool eager) {
    loom_context_options o;
    loom_context_options_init(&o);
    o.device = device;
    o.eager = eager;
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&o, &ctx), LOOM_OK);
    const float xv[3] = {1, 2, 3};
    loom_tensor *x = tu_f32(ctx, 3, xv);
    loom_tensor *y = loom_mul(ctx, loom_add(ctx, x, loom_scalar(ctx, LOOM_DTYPE_F32, 1.0)),
                              loom_scalar(ctx, LOOM_DTYPE_F32, 2.0));
    assert_non_null(y);
    loom_tensor_retain(y);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    float got[3] = {0};
    assert_int_equal(loom_tensor_read(ctx, y, got, sizeof got), LOOM_OK);
    assert_true(got[0] == 4 && got[1] == 6 && got[2] == 8);
    loom_tensor_release(y);
    loom_tensor_release(x);
    return ctx;
}

static void test_a_registered_target_builds_its_devices_steps(void **state) {
    (void)state;
    assert_int_equal(loom_rt_target_register(&toy), LOOM_OK);
    assert_ptr_equal(loom_rt_target_find("toy"), &toy);
    toy_builds = 0;
    loom_context *ctx = run_step("toy:1", false);
    assert_int_equal(toy_builds, 1);
    assert_int_equal(loom_metric_value(ctx, "Fallbacks"), 0);
    loom_context_destroy(ctx);
    /* an eager context builds with "ref" whatever its device */
    ctx = run_step("toy:0", true);
    assert_int_equal(toy_builds, 1);
    loom_context_destroy(ctx);
    /* the default device's target is the built-in npu */
    loom_tg_register_builtin();
    assert_non_null(loom_rt_target_find("npu"));
    assert_non_null(loom_rt_target_find("ref"));
    assert_null(loom_rt_target_find("gpu"));
}

static void test_what_a_target_does_not_support_falls_back_and_is_counted(void **state) {
    (void)state;
    assert_int_equal(loom_rt_target_register(&shy), LOOM_OK);
    shy_builds = 0;
    loom_context *ctx = run_step("shy", false);
    assert_int_equal(shy_builds, 1);
    assert_int_equal(loom_metric_value(ctx, "Fallbacks"), 1);
    loom_context_destroy(ctx);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_target_find("shy")->supports(NULL, &d), LOOM_STATUS_UNSUPPORTED);
    assert_non_null(strstr(d.msg, "no kernels"));
}

static void test_an_unknown_device_is_an_error_naming_it(void **state) {
    (void)state;
    loom_context_options o;
    loom_context_options_init(&o);
    o.device = "gpu:0";
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&o, &ctx), LOOM_STATUS_INVALID_ARGUMENT);
    assert_null(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_registered_target_builds_its_devices_steps),
        cmocka_unit_test(test_what_a_target_does_not_support_falls_back_and_is_counted),
        cmocka_unit_test(test_an_unknown_device_is_an_error_naming_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
