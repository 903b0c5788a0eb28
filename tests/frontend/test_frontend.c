/* Frontend: lazy recording, mark_step, reads, retain/release, broadcasting builders. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>
#include <unistd.h>

#include "test_util.h"

static loom_context *new_ctx(void) {
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(NULL, &ctx), LOOM_OK);
    return ctx;
}

static loom_tensor *f32(loom_context *ctx, int32_t rank, const int64_t *shape, const float *v) {
    loom_tensor *t = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, rank, shape, v);
    assert_non_null(t);
    return t;
}

static void test_ops_are_recorded_not_computed_until_mark_step(void **state) {
    (void)state;
    loom_context *ctx = new_ctx();
    loom_tensor *x = f32(ctx, 1, (int64_t[]){3}, (float[]){1, -2, 3});
    loom_tensor *y = loom_relu(ctx, loom_add(ctx, x, x));
    assert_non_null(y);
    assert_int_equal(loom_metric_value(ctx, "ExecuteTime"), 0);
    assert_int_equal(loom_metric_value(ctx, "TracedOps"), 2);
    loom_tensor_retain(y);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    assert_int_equal(loom_context_sync(ctx), LOOM_OK); /* steps run asynchronously */
    assert_int_equal(loom_metric_value(ctx, "ExecuteTime"), 1);
    assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 1);
    float out[3];
    tu_read_f32(ctx, y, out, 3);
    assert_true(out[0] == 2.0f && out[1] == 0.0f && out[2] == 6.0f);
    /* reading a computed tensor runs nothing more */
    assert_int_equal(loom_metric_value(ctx, "ExecuteTime"), 1);
    assert_int_equal(loom_metric_value(ctx, "ForcedReads"), 0);
    loom_tensor_release(y);
    loom_tensor_release(x);
    loom_context_destroy(ctx);
}

static void test_read_of_a_pending_tensor_forces_only_what_it_needs(void **state) {
    (void)state;
    loom_context *ctx = new_ctx();
    loom_tensor *x = f32(ctx, 1, (int64_t[]){2}, (float[]){4, 9});
    loom_tensor *s = loom_sqrt(ctx, x);
    loom_tensor *unrelated = loom_exp(ctx, loom_mul(ctx, x, x));
    assert_non_null(unrelated);
    float out[2];
    tu_read_f32(ctx, s, out, 2);
    assert_true(out[0] == 2.0f && out[1] == 3.0f);
    assert_int_equal(loom_metric_value(ctx, "ForcedReads"), 1);
    /* one graph was cut, holding only the input and the sqrt */
    assert_int_equal(loom_metric_value(ctx, "GraphNodes"), 1);
    assert_int_equal(loom_metric_total(ctx, "GraphNodes"), 2);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK); /* nothing retained: nothing to run */
    assert_int_equal(loom_metric_value(ctx, "ExecuteTime"), 1);
    loom_tensor_release(x);
    loom_context_destroy(ctx);
}

static void test_binary_ops_broadcast_numpy_style(void **state) {
    (void)state;
    loom_context *ctx = new_ctx();
    loom_tensor *m = f32(ctx, 2, (int64_t[]){2, 3}, (float[]){1, 2, 3, 4, 5, 6});
    loom_tensor *row = f32(ctx, 1, (int64_t[]){3}, (float[]){10, 20, 30});
    loom_tensor *col = f32(ctx, 2, (int64_t[]){2, 1}, (float[]){100, 200});
    loom_tensor *r = loom_add(ctx, loom_add(ctx, m, row), col);
    loom_tensor *half = loom_mul(ctx, m, loom_scalar(ctx, LOOM_DTYPE_F32, 0.5));
    loom_tensor_retain(r);
    loom_tensor_retain(half);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    float out[6];
    tu_read_f32(ctx, r, out, 6);
    const float want[6] = {111, 122, 133, 214, 225, 236};
    for (int i = 0; i < 6; i++)
        assert_true(out[i] == want[i]);
    tu_read_f32(ctx, half, out, 6);
    for (int i = 0; i < 6; i++)
        assert_true(out[i] == 0.5f * (float)(i + 1));
    int64_t shape[LOOM_MAX_RANK];
    int32_t rank;
    assert_int_equal(loom_tensor_rank(r, &rank), LOOM_OK);
    assert_int_equal(loom_tensor_shape(r, shape), LOOM_OK);
    assert_int_equal(rank, 2);
    assert_true(shape[0] == 2 && shape[1] == 3);
    loom_tensor_release(r);
    loom_tensor_release(half);
    loom_tensor_release(m);
    loom_tensor_release(row);
    loom_tensor_release(col);
    loom_context_destroy(ctx);
}

static void test_matmul_transpose_reshape_and_reductions(void **state) {
    (void)state;
    loom_context *ctx = new_ctx();
    loom_tensor *a = f32(ctx, 2, (int64_t[]){2, 3}, (float[]){1, 2, 3, 4, 5, 6});
    loom_tensor *p = loom_matmul(ctx, a, loom_transpose(ctx, a));        /* [2,2] */
    loom_tensor *v = loom_matmul(ctx, a, f32(ctx, 1, (int64_t[]){3}, (float[]){1, 0, -1}));
    loom_tensor *flat = loom_reshape(ctx, a, 1, (int64_t[]){-1});
    loom_tensor *rows = loom_sum(ctx, a, 1, (int32_t[]){-1}, true);      /* [2,1] */
    loom_tensor *mx = loom_max(ctx, a, 1, (int32_t[]){0}, false);        /* [3] */
    loom_tensor *mean = loom_mean(ctx, a, 0, NULL, false);               /* [] */
    loom_tensor *all[] = {p, v, flat, rows, mx, mean};
    for (int i = 0; i < 6; i++)
        loom_tensor_retain(all[i]);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    float o[6];
    tu_read_f32(ctx, p, o, 4);
    assert_true(o[0] == 14 && o[1] == 32 && o[2] == 32 && o[3] == 77);
    tu_read_f32(ctx, v, o, 2);
    assert_true(o[0] == -2 && o[1] == -2);
    tu_read_f32(ctx, flat, o, 6);
    assert_true(o[5] == 6);
    tu_read_f32(ctx, rows, o, 2);
    assert_true(o[0] == 6 && o[1] == 15);
    tu_read_f32(ctx, mx, o, 3);
    assert_true(o[0] == 4 && o[1] == 5 && o[2] == 6);
    tu_read_f32(ctx, mean, o, 1);
    assert_true(o[0] == 3.5f);
    int32_t rank;
    assert_int_equal(loom_tensor_rank(v, &rank), LOOM_OK);
    assert_int_equal(rank, 1);
    for (int i = 0; i < 6; i++)
        loom_tensor_release(all[i]);
    loom_tensor_release(a);
    loom_context_destroy(ctx);
}

static void test_compare_select_cast_and_16_bit_types(void **state) {
    (void)state;
    loom_context *ctx = new_ctx();
    loom_tensor *x = f32(ctx, 1, (int64_t[]){4}, (float[]){-1.5f, 0, 2.25f, 1e30f});
    loom_tensor *pos = loom_gt(ctx, x, loom_scalar(ctx, LOOM_DTYPE_F32, 0));
    loom_tensor *sel = loom_select(ctx, pos, x, loom_scalar(ctx, LOOM_DTYPE_F32, -7));
    loom_tensor *as_i32 = loom_cast(ctx, x, LOOM_DTYPE_I32);
    loom_tensor *as_bf16 = loom_cast(ctx, x, LOOM_DTYPE_BF16);
    loom_tensor *as_f16 = loom_cast(ctx, x, LOOM_DTYPE_F16);
    loom_tensor *fin = loom_isfinite(ctx, as_f16);
    loom_tensor *all[] = {pos, sel, as_i32, as_bf16, as_f16, fin};
    for (int i = 0; i < 6; i++)
        loom_tensor_retain(all[i]);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    uint8_t b[4];
    assert_int_equal(loom_tensor_read(ctx, pos, b, 4), LOOM_OK);
    assert_true(b[0] == 0 && b[1] == 0 && b[2] == 1 && b[3] == 1);
    float f[4];
    tu_read_f32(ctx, sel, f, 4);
    assert_true(f[0] == -7 && f[1] == -7 && f[2] == 2.25f && f[3] == 1e30f);
    int32_t i[4];
    assert_int_equal(loom_tensor_read(ctx, as_i32, i, sizeof i), LOOM_OK);
    assert_true(i[0] == -1 && i[1] == 0 && i[2] == 2 && i[3] == INT32_MAX);
    uint16_t h[4];
    assert_int_equal(loom_tensor_read(ctx, as_bf16, h, sizeof h), LOOM_OK);
    assert_int_equal(h[0], 0xbfc0); /* -1.5 */
    assert_int_equal(h[2], 0x4010); /* 2.25 */
    assert_int_equal(loom_tensor_read(ctx, as_f16, h, sizeof h), LOOM_OK);
    assert_int_equal(h[0], 0xbe00);
    assert_int_equal(h[3], 0x7c00); /* 1e30 overflows f16 to inf */
    assert_int_equal(loom_tensor_read(ctx, fin, b, 4), LOOM_OK);
    assert_true(b[0] == 1 && b[2] == 1 && b[3] == 0);
    for (int k = 0; k < 6; k++)
        loom_tensor_release(all[k]);
    loom_tensor_release(x);
    loom_context_destroy(ctx);
}

static void test_retained_result_survives_and_unretained_dies(void **state) {
    (void)state;
    loom_context *ctx = new_ctx();
    loom_tensor *x = f32(ctx, 1, (int64_t[]){1}, (float[]){3});
    loom_tensor *kept = loom_neg(ctx, x);
    loom_tensor *dropped = loom_abs(ctx, x);
    loom_tensor_retain(kept);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    float v;
    tu_read_f32(ctx, kept, &v, 1);
    assert_true(v == -3);
    /* a step later, the kept tensor feeds new ops as a graph input */
    loom_tensor *again = loom_add(ctx, kept, x);
    loom_tensor_retain(again);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    tu_read_f32(ctx, again, &v, 1);
    assert_true(v == 0);
    assert_int_equal(loom_tensor_read(ctx, dropped, &v, sizeof v), LOOM_STATUS_STALE_HANDLE);
    loom_context_clear_error(ctx);
    loom_tensor_release(kept);
    loom_tensor_release(again);
    loom_tensor_release(x);
    /* all device memory is back */
    size_t cur, peak;
    assert_int_equal(loom_device_memory(ctx, &cur, &peak), LOOM_OK);
    assert_int_equal(cur, 0);
    assert_true(peak >= 3 * 64);
    loom_context_destroy(ctx);
}

static void test_dump_dir_gets_a_loom_and_a_dot_file_per_compiled_graph(void **state) {
    (void)state;
    char dir[] = "/tmp/loom-dump-XXXXXX";
    assert_non_null(mkdtemp(dir));
    loom_context_options opts;
    loom_context_options_init(&opts);
    opts.dump_dir = dir;
    opts.cache_dir = ""; /* compile for real, so codegen's dumps are written */
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&opts, &ctx), LOOM_OK);
    loom_tensor *x = f32(ctx, 1, (int64_t[]){2}, (float[]){1, 2});
    for (int step = 0; step < 3; step++) { /* the same graph thrice: compiled once */
        loom_tensor *y = loom_exp(ctx, x);
        loom_tensor_retain(y);
        assert_int_equal(loom_mark_step(ctx), LOOM_OK);
        loom_tensor_release(y);
    }
    loom_tensor_release(x);
    loom_context_destroy(ctx);
    DIR *dp = opendir(dir);
    assert_non_null(dp);
    /* one compiled graph: its traced IR (stepNNNNNN-<hash>.loom, the only name with one
     * dot), DOT, the IR after each pass, the plan, MLIR before/after lowering, LLVM IR and
     * assembly */
    int n_traced = 0, n_dot = 0, n_after_pass = 0, n_plan = 0, n_mlir = 0, n_ll = 0, n_asm = 0;
    char loom_path[512] = "", dot_path[512] = "";
    struct dirent *e;
    while ((e = readdir(dp))) {
        const char *name = e->d_name, *dot = strchr(name, '.');
        size_t len = strlen(name);
        bool ends_loom = len > 5 && strcmp(name + len - 5, ".loom") == 0;
        if (ends_loom && dot == name + len - 5) {
            n_traced++;
            snprintf(loom_path, sizeof loom_path, "%s/%s", dir, name);
        } else if (ends_loom && strstr(name, "-dce.loom")) {
            n_after_pass++;
        }
        if (len > 4 && strcmp(name + len - 4, ".dot") == 0) {
            n_dot++;
            snprintf(dot_path, sizeof dot_path, "%s/%s", dir, name);
        }
        n_plan += strstr(name, ".plan.txt") != NULL;
        n_mlir += len > 5 && strcmp(name + len - 5, ".mlir") == 0;
        n_ll += len > 3 && strcmp(name + len - 3, ".ll") == 0;
        n_asm += len > 2 && strcmp(name + len - 2, ".s") == 0;
    }
    closedir(dp);
    assert_int_equal(n_traced, 1);
    assert_int_equal(n_dot, 1);
    assert_int_equal(n_after_pass, 1);
    assert_int_equal(n_plan, 1);
    assert_int_equal(n_mlir, 2);
    assert_int_equal(n_ll, 1);
    assert_int_equal(n_asm, 1);
    FILE *f = fopen(loom_path, "r");
    assert_non_null(f);
    char text[2048];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    /* the step's graph: its input and the exp, located at the user's call */
    assert_non_null(strstr(text, "%0 = input {index = 0} : f32[2]"));
    assert_non_null(strstr(text, "%1 = exp %0 : f32[2] loc(\""));
    assert_non_null(strstr(text, "test_frontend.c\":"));
    assert_non_null(strstr(text, "return %1"));
    char cmd[1200];
    if (system("command -v dot >/dev/null 2>&1") == 0) { /* the DOT dump renders */
        snprintf(cmd, sizeof cmd, "dot -Tsvg -o /dev/null '%s'", dot_path);
        assert_int_equal(system(cmd), 0);
    } else {
        printf("# Graphviz's dot is not installed (scripts/setup.sh installs it): the DOT dump "
               "is not rendered\n");
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

typedef struct text_buf {
    char data[16384];
    size_t len;
} text_buf;

static void append_chunk(const char *chunk, size_t len, void *ud) {
    text_buf *tb = ud;
    assert_true(tb->len + len < sizeof tb->data);
    memcpy(tb->data + tb->len, chunk, len);
    tb->len += len;
    tb->data[tb->len] = '\0';
}

static void test_metrics_report_as_text_and_json(void **state) {
    (void)state;
    loom_context *ctx = new_ctx();
    loom_tensor *x = f32(ctx, 1, (int64_t[]){1}, (float[]){1});
    for (int i = 0; i < 3; i++) {
        loom_tensor *y = loom_add(ctx, x, x);
        loom_tensor_retain(y);
        assert_int_equal(loom_mark_step(ctx), LOOM_OK);
        loom_tensor_release(y);
    }
    assert_int_equal(loom_context_sync(ctx), LOOM_OK);
    assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 1);
    assert_int_equal(loom_metric_value(ctx, "CacheHit"), 2);
    assert_int_equal(loom_metric_value(ctx, "MarkStep"), 3);
    assert_int_equal(loom_metric_value(ctx, "TransferToDeviceBytes"), 4);
    assert_int_equal(loom_metric_value(ctx, "NoSuchMetric"), -1);
    static text_buf tb;
    tb.len = 0;
    assert_int_equal(loom_metrics_report(ctx, LOOM_REPORT_FORMAT_TEXT, append_chunk, &tb), LOOM_OK);
    assert_non_null(strstr(tb.data, "Counter: CacheHit\n  Value: 2\n"));
    assert_non_null(strstr(tb.data, "Metric: ExecuteTime\n  TotalSamples: 3\n"));
    tb.len = 0;
    assert_int_equal(loom_metrics_report(ctx, LOOM_REPORT_FORMAT_JSON, append_chunk, &tb), LOOM_OK);
    assert_int_equal(tb.data[0], '{');
    assert_non_null(strstr(tb.data, "\"CacheMiss\":1,"));
    assert_non_null(strstr(tb.data, "\"ExecuteTime\":{\"count\":3,"));
    assert_int_equal(loom_metrics_report(ctx, LOOM_REPORT_FORMAT_COUNT_, append_chunk, &tb),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_metrics_report(ctx, LOOM_REPORT_FORMAT_TEXT, NULL, &tb),
                     LOOM_STATUS_INVALID_ARGUMENT);
    loom_tensor_release(x);
    loom_context_destroy(ctx);
}

static void run_assign_updates_in_place(bool eager) {
    loom_context_options o;
    loom_context_options_init(&o);
    o.dump_dir = NULL;
    o.eager = eager;
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&o, &ctx), LOOM_OK);
    /* gradient descent on sum((w - t)^2): w <- w - 0.1 * 2 (w - t) = 0.8 w + 0.2 t */
    float w0[3] = {1, -2, 4}, target[3] = {0.5f, 0.25f, -1};
    loom_tensor *w = f32(ctx, 1, (int64_t[]){3}, w0);
    loom_tensor *t = f32(ctx, 1, (int64_t[]){3}, target);
    size_t cur0 = 0, peak0 = 0, cur, peak;
    for (int step = 0; step < 50; step++) {
        loom_tensor *g = loom_mul(ctx, loom_sub(ctx, w, t), loom_scalar(ctx, LOOM_DTYPE_F32, 2));
        assert_int_equal(loom_assign(ctx, w, loom_sub(ctx, w, loom_mul(ctx, g,
                                                                      loom_scalar(ctx, LOOM_DTYPE_F32, 0.1)))),
                         LOOM_OK);
        assert_int_equal(loom_mark_step(ctx), LOOM_OK);
        if (step == 0) { /* after one step: exactly the values after one update */
            float one[3];
            tu_read_f32(ctx, w, one, 3);
            for (int i = 0; i < 3; i++)
                assert_true(fabsf(one[i] - (0.8f * w0[i] + 0.2f * target[i])) < 1e-6f);
        }
        if (step == 2) {
            assert_int_equal(loom_context_sync(ctx), LOOM_OK);
            assert_int_equal(loom_device_memory(ctx, &cur0, &peak0), LOOM_OK);
        }
    }
    float got[3];
    tu_read_f32(ctx, w, got, 3);
    for (int i = 0; i < 3; i++) /* converged to the target, 0.8^50 of the way left */
        assert_true(fabsf(got[i] - target[i]) < 1e-4f);
    /* written back into its own buffer: no new buffer per step */
    assert_int_equal(loom_device_memory(ctx, &cur, &peak), LOOM_OK);
    assert_int_equal(cur, cur0);
    assert_int_equal(peak, peak0);
    assert_int_equal(cur, 2 * 64); /* just w and t: the update is written in place */
    /* a read after an assignment sees the new value, computed on demand */
    assert_int_equal(loom_assign(ctx, w, loom_neg(ctx, t)), LOOM_OK);
    tu_read_f32(ctx, w, got, 3);
    assert_true(got[0] == -0.5f && got[1] == -0.25f && got[2] == 1);
    /* bad assignments */
    loom_tensor *r = loom_neg(ctx, w);
    assert_int_equal(loom_assign(ctx, r, w), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "assign: dst is a result of this step"));
    loom_context_clear_error(ctx);
    loom_tensor *wide = f32(ctx, 1, (int64_t[]){4}, (float[]){0, 0, 0, 0});
    assert_int_equal(loom_assign(ctx, w, wide), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "assign: types differ: dst f32[3], value f32[4]"));
    loom_context_clear_error(ctx);
    loom_tensor_release(wide);
    loom_tensor_release(w);
    loom_tensor_release(t);
    loom_context_destroy(ctx);
}

static void test_assign_updates_a_tensor_in_its_own_buffer(void **state) {
    (void)state;
    run_assign_updates_in_place(false);
}

static void test_assign_updates_in_place_on_the_interpreter_too(void **state) {
    (void)state;
    run_assign_updates_in_place(true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_are_recorded_not_computed_until_mark_step),
        cmocka_unit_test(test_read_of_a_pending_tensor_forces_only_what_it_needs),
        cmocka_unit_test(test_binary_ops_broadcast_numpy_style),
        cmocka_unit_test(test_matmul_transpose_reshape_and_reductions),
        cmocka_unit_test(test_compare_select_cast_and_16_bit_types),
        cmocka_unit_test(test_retained_result_survives_and_unretained_dies),
        cmocka_unit_test(test_dump_dir_gets_a_loom_and_a_dot_file_per_compiled_graph),
        cmocka_unit_test(test_metrics_report_as_text_and_json),
        cmocka_unit_test(test_assign_updates_a_tensor_in_its_own_buffer),
        cmocka_unit_test(test_assign_updates_in_place_on_the_interpreter_too),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
