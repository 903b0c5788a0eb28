/* The JIT path through the public API: the on-disk compile cache across processes, its
 * recovery from corrupt files and unwritable folders, and asynchronous execution (a step
 * runs while the next is traced; its errors surface at the next sync point). */
#include <dirent.h>
#include <math.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#include "frontend/frontend.h"

static loom_context *ctx_with_cache(const char *dir) {
    loom_context_options o;
    loom_context_options_init(&o);
    o.dump_dir = NULL;
    o.eager = false;
    o.cache_dir = dir;
    loom_context *ctx = NULL;
    if (loom_context_create(&o, &ctx) != LOOM_OK)
        return NULL;
    return ctx;
}

/* y = tanh(x * x + 1) summed over rows: a small graph with two kernels. */
static loom_status step(loom_context *ctx, float *out2) {
    float v[6] = {0.5f, -1, 2, 0, 1.5f, -0.25f};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 3}, v);
    loom_tensor *y = loom_sum(ctx, loom_tanh(ctx, loom_add(ctx, loom_mul(ctx, x, x),
                                                           loom_scalar(ctx, LOOM_DTYPE_F32, 1))),
                              1, (int32_t[]){1}, false);
    loom_tensor_retain(y);
    loom_status st = loom_mark_step(ctx);
    if (st == LOOM_OK)
        st = loom_tensor_read(ctx, y, out2, 2 * sizeof(float));
    loom_tensor_release(y);
    loom_tensor_release(x);
    return st;
}

static void expect_values(const float *got) {
    double want0 = tanh(1.25) + tanh(2.0) + tanh(5.0), want1 = tanh(1.0) + tanh(3.25) + tanh(1.0625);
    assert_true(fabs(got[0] - want0) < 1e-5 && fabs(got[1] - want1) < 1e-5);
}

static char *new_dir(void) {
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/loom-jit-test-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return dir;
}

static void remove_dir(const char *dir) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_a_second_process_hits_the_disk_cache(void **state) {
    (void)state;
    char *dir = new_dir();
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* the first process compiles and stores */
        loom_context *ctx = ctx_with_cache(dir);
        float out[2];
        int ok = ctx && step(ctx, out) == LOOM_OK && loom_metric_value(ctx, "DiskCacheMiss") == 1 &&
                 loom_metric_value(ctx, "DiskCacheHit") == 0 && loom_metric_value(ctx, "Fallbacks") == 0;
        loom_context_destroy(ctx);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    loom_context *ctx = ctx_with_cache(dir); /* the second loads the object code */
    float out[2];
    assert_int_equal(step(ctx, out), LOOM_OK);
    expect_values(out);
    assert_int_equal(loom_metric_value(ctx, "DiskCacheHit"), 1);
    assert_int_equal(loom_metric_value(ctx, "DiskCacheMiss"), 0);
    assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 1);
    loom_context_destroy(ctx);
    remove_dir(dir);
}

static void test_a_corrupt_cache_file_is_detected_and_recompiled(void **state) {
    (void)state;
    char *dir = new_dir();
    loom_context *ctx = ctx_with_cache(dir);
    float out[2];
    assert_int_equal(step(ctx, out), LOOM_OK);
    loom_context_destroy(ctx);
    /* flip a byte in the middle of every cache file */
    DIR *dp = opendir(dir);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(dp))) {
        if (e->d_name[0] == '.')
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r+b");
        assert_non_null(f);
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        fseek(f, size / 2, SEEK_SET);
        int c = fgetc(f);
        fseek(f, size / 2, SEEK_SET);
        fputc(c ^ 0x5a, f);
        fclose(f);
        files++;
    }
    closedir(dp);
    assert_int_equal(files, 1);
    ctx = ctx_with_cache(dir);
    assert_int_equal(step(ctx, out), LOOM_OK);
    expect_values(out);
    assert_int_equal(loom_metric_value(ctx, "DiskCacheCorrupt"), 1);
    assert_int_equal(loom_metric_value(ctx, "DiskCacheHit"), 0);
    loom_context_destroy(ctx);
    ctx = ctx_with_cache(dir); /* the entry was rewritten */
    assert_int_equal(step(ctx, out), LOOM_OK);
    assert_int_equal(loom_metric_value(ctx, "DiskCacheHit"), 1);
    loom_context_destroy(ctx);
    remove_dir(dir);
}

static void test_an_unusable_cache_dir_does_not_fail_the_step(void **state) {
    (void)state;
    char *dir = new_dir();
    char file[128], under_file[160];
    snprintf(file, sizeof file, "%s/plain-file", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(under_file, sizeof under_file, "%s/cache", file); /* cannot be created */
    loom_context *ctx = ctx_with_cache(under_file);
    float out[2];
    assert_int_equal(step(ctx, out), LOOM_OK);
    expect_values(out);
    assert_int_equal(loom_metric_value(ctx, "DiskCacheMiss"), 1);
    loom_context_destroy(ctx);
    ctx = ctx_with_cache(""); /* the disk cache off */
    assert_int_equal(step(ctx, out), LOOM_OK);
    expect_values(out);
    assert_int_equal(loom_metric_value(ctx, "DiskCacheMiss"), 0);
    loom_context_destroy(ctx);
    remove_dir(dir);
}

/* ---- asynchronous execution: wrap the compiled executable's run ---------------------------- */

static const loom_rt_executable_vtable *real_vt;
static sem_t gate;
static bool fail_next;

static loom_status gated_run(loom_rt_executable *exe, loom_rt_buffer *const *in,
                             loom_rt_buffer *const *out, loom_ir_diag *d) {
    sem_wait(&gate); /* the test decides when the step may run */
    if (fail_next) {
        fail_next = false;
        return loom_ir_diag_set(d, LOOM_STATUS_DEVICE_ERROR, "injected device fault");
    }
    return real_vt->run(exe, in, out, d);
}

static void gated_destroy(loom_rt_executable *exe) { real_vt->destroy(exe); }

static const loom_rt_executable_vtable gated_vt = {.run = gated_run, .destroy = gated_destroy};

static loom_tensor *affine(loom_context *ctx, loom_tensor *x) {
    return loom_add(ctx, loom_mul(ctx, x, loom_scalar(ctx, LOOM_DTYPE_F32, 2)),
                    loom_scalar(ctx, LOOM_DTYPE_F32, 1));
}

static void test_steps_run_while_the_next_is_traced_and_errors_surface_at_sync(void **state) {
    (void)state;
    loom_context *ctx = ctx_with_cache("");
    float v[3] = {1, 2, 3}, out[3];
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){3}, v);
    loom_tensor *y = affine(ctx, x);
    loom_tensor_retain(y);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK); /* compiles; runs */
    assert_int_equal(loom_tensor_read(ctx, y, out, sizeof out), LOOM_OK);
    loom_tensor_release(y);
    /* every later step of this graph now waits at the gate */
    assert_int_equal(ctx->cache.n, 1);
    loom_rt_executable *exe = ctx->cache.entries[0].exe;
    assert_false(exe->host_thread_only);
    real_vt = exe->vt;
    exe->vt = &gated_vt;
    sem_init(&gate, 0, 0);

    loom_tensor *y1 = affine(ctx, x);
    loom_tensor_retain(y1);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK); /* returns: the step is blocked at the gate */
    loom_tensor *traced = loom_exp(ctx, loom_neg(ctx, x)); /* the host traces meanwhile */
    assert_non_null(traced);
    assert_int_equal(loom_metric_value(ctx, "ExecuteTime"), 1); /* step 1 has not finished */
    sem_post(&gate);
    assert_int_equal(loom_tensor_read(ctx, y1, out, sizeof out), LOOM_OK);
    assert_true(out[0] == 3 && out[1] == 5 && out[2] == 7);
    assert_int_equal(loom_metric_value(ctx, "ExecuteTime"), 2);
    loom_tensor_release(y1);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK); /* nothing retained: nothing runs */

    /* a fault while running is reported at the next sync point, naming the step */
    fail_next = true;
    loom_tensor *y2 = affine(ctx, x);
    loom_tensor_retain(y2);
    int64_t failing_step = loom_context_step(ctx);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    sem_post(&gate);
    assert_int_equal(loom_context_sync(ctx), LOOM_STATUS_DEVICE_ERROR);
    char want[128];
    snprintf(want, sizeof want, "mark_step: executing step %lld: injected device fault",
             (long long)failing_step);
    assert_string_equal(loom_context_error_message(ctx), want);
    loom_context_clear_error(ctx);
    /* the failed step's result has no value; the context goes on */
    assert_int_equal(loom_tensor_read(ctx, y2, out, sizeof out), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "has no value"));
    loom_context_clear_error(ctx);
    loom_tensor_release(y2);
    loom_tensor *y3 = affine(ctx, x);
    loom_tensor_retain(y3);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    sem_post(&gate);
    assert_int_equal(loom_tensor_read(ctx, y3, out, sizeof out), LOOM_OK);
    assert_true(out[0] == 3 && out[2] == 7);
    loom_tensor_release(y3);
    loom_tensor_release(x);
    loom_context_destroy(ctx);
    sem_destroy(&gate);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_second_process_hits_the_disk_cache),
        cmocka_unit_test(test_a_corrupt_cache_file_is_detected_and_recompiled),
        cmocka_unit_test(test_an_unusable_cache_dir_does_not_fail_the_step),
        cmocka_unit_test(test_steps_run_while_the_next_is_traced_and_errors_surface_at_sync),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
