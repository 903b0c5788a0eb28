/* The JIT path through the public API: the on-disk compile cache across processes, its
 * recovery from corrupt files and unwritable folders, and asynchronous execution (a step
 * runs while the next is traced; its errors surface at the next sync point). */
#include <dirent.h>
#include <glob.h>
#include <inttypes.h>
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

/* LOOM_DUMP of a step whose code is in the disk cache still dumps its LLVM IR and assembly
 * (it compiles them again): the dumps of a warm run equal a cold run's. */
static void test_dumps_are_whole_when_the_disk_cache_holds_the_code(void **state) {
    (void)state;
    char cache[64], dumps[2][96];
    snprintf(cache, sizeof cache, "%s", new_dir());
    for (int run = 0; run < 2; run++) {
        snprintf(dumps[run], sizeof dumps[run], "%s/dump%d", cache, run);
        loom_context_options o;
        loom_context_options_init(&o);
        o.eager = false;
        o.cache_dir = cache;
        o.dump_dir = dumps[run];
        loom_context *ctx = NULL;
        assert_int_equal(loom_context_create(&o, &ctx), LOOM_OK);
        float out[2];
        assert_int_equal(step(ctx, out), LOOM_OK);
        expect_values(out);
        loom_context_destroy(ctx);
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "ls %s/*.m0.ll %s/*.m0.s %s/*.mlir >/dev/null", dumps[1], dumps[1],
             dumps[1]);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "diff -r -x '*.summary.txt' %s %s >/dev/null", dumps[0], dumps[1]);
    assert_int_equal(system(cmd), 0);
    /* the summary opens with what a person wants first (its times differ between runs) */
    snprintf(cmd, sizeof cmd,
             "head -3 %s/*.summary.txt | grep -q -E '^step[0-9]{6}-[0-9a-f]{16}: 1 kernel "
             "\\(1 reduction\\), [0-9.e-]+ GFLOP, [0-9.e-]+ MB moved, planned peak' && "
             "grep -q '^compile: [0-9.]* ms (passes and plan [0-9.]* ms, codegen [0-9.]* ms)$' "
             "%s/*.summary.txt && grep -q '^passes: autocast: unchanged, conv-decompose: "
             "unchanged, dce: ' %s/*.summary.txt",
             dumps[1], dumps[1], dumps[1]);
    if (system(cmd) != 0) {
        snprintf(cmd, sizeof cmd, "cat %s/*.summary.txt", dumps[1]);
        (void)system(cmd);
        fail_msg("the summary does not open as expected");
    }
    remove_dir(cache);
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

/* ---- LOOM_PROFILE: per-kernel times ---------------------------------------------------- */

static void append(const char *chunk, size_t len, void *ud) {
    loom_ir_sbuf_write(chunk, len, ud);
}

static char *profile_of(loom_context *ctx, loom_report_format format, loom_ir_sbuf *sb) {
    static loom_allocator sys; /* the sbuf keeps a pointer to it */
    sys = loom_allocator_system();
    loom_ir_sbuf_init(sb, &sys);
    assert_int_equal(loom_profile_report(ctx, format, append, sb), LOOM_OK);
    assert_false(sb->oom);
    return sb->data;
}

/* relu(x @ w) * 2 summed over rows, then the mean of that: a matmul and reductions. */
static loom_status profiled_step(loom_context *ctx, loom_tensor *x, loom_tensor *w, float *out) {
    loom_tensor *h = loom_relu(ctx, loom_matmul(ctx, x, w));
    loom_tensor *r = loom_sum(ctx, loom_mul(ctx, h, loom_scalar(ctx, LOOM_DTYPE_F32, 2)), 1,
                              (int32_t[]){1}, false);
    loom_tensor *y = loom_mean(ctx, r, 1, (int32_t[]){0}, false);
    loom_tensor_retain(y);
    loom_status st = loom_mark_step(ctx);
    if (st == LOOM_OK)
        st = loom_tensor_read(ctx, y, out, sizeof *out);
    loom_tensor_release(y);
    return st;
}

typedef struct profiled_kernel {
    char program[17], kind[16], loc[128];
    int index;
    int64_t calls, total_ns, thread_ns, idle_ns;
    double flops, bytes;
} profiled_kernel;

/* The kernels of a JSON profile, in report order; returns how many. */
static int parse_profile(const char *json, profiled_kernel *out, int max) {
    int n = 0;
    for (const char *p = strstr(json, "{\"program\""); p && n < max;
         p = strstr(p + 1, "{\"program\"")) {
        profiled_kernel *k = &out[n];
        int used = 0;
        assert_int_equal(sscanf(p,
                                "{\"program\":\"%16[0-9a-f]\",\"index\":%d,\"kind\":\"%15[a-z]\","
                                "\"root\":\"%*[^\"]\",\"loc\":\"%127[^\"]\",\"calls\":%" SCNd64
                                ",\"total_ns\":%" SCNd64 ",\"thread_ns\":%" SCNd64
                                ",\"idle_ns\":%" SCNd64 ",\"flops\":%lf,\"bytes\":%lf}%n",
                                k->program, &k->index, k->kind, k->loc, &k->calls, &k->total_ns,
                                &k->thread_ns, &k->idle_ns, &k->flops, &k->bytes, &used),
                         10);
        assert_true(used > 0);
        n++;
    }
    return n;
}

/* The "cost:" line of kernel `index` in the plan dump of program `hash` under dir. */
static void plan_cost(const char *dir, const char *hash, int index, double *flops, double *bytes) {
    char pattern[4096];
    snprintf(pattern, sizeof pattern, "%s/step*-%s.plan.txt", dir, hash);
    glob_t gl;
    assert_int_equal(glob(pattern, 0, NULL, &gl), 0);
    FILE *f = fopen(gl.gl_pathv[0], "r");
    globfree(&gl);
    assert_non_null(f);
    char line[1024];
    int current = -1;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        int k;
        if (sscanf(line, "kernel %d:", &k) == 1)
            current = k;
        else if (current == index &&
                 sscanf(line, " cost: %lf flops, %lf bytes moved", flops, bytes) == 2)
            found = true;
    }
    fclose(f);
    assert_true(found);
}

enum { PROFILE_THREADS = 2 };

/* A JIT context of PROFILE_THREADS threads without the disk cache, profiling or not,
 * dumping into dump_dir (or not). */
static loom_context *profiling_context(bool profile, const char *dump_dir) {
    loom_context_options o;
    loom_context_options_init(&o);
    o.eager = false;
    o.num_threads = PROFILE_THREADS;
    o.cache_dir = "";
    o.dump_dir = dump_dir;
    o.profile = profile;
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&o, &ctx), LOOM_OK);
    return ctx;
}

static void test_the_profile_counts_every_kernel_run_with_the_plans_costs(void **state) {
    (void)state;
    char *dir = new_dir();
    loom_context *ctx = profiling_context(true, dir);
    float xs[32 * 48], ws[48 * 40];
    for (int i = 0; i < 32 * 48; i++)
        xs[i] = (float)((i * 7) % 13) / 13.0f - 0.4f;
    for (int i = 0; i < 48 * 40; i++)
        ws[i] = (float)((i * 5) % 11) / 11.0f - 0.5f;
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){32, 48}, xs);
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){48, 40}, ws);
    enum { STEPS = 5 };
    float first = 0, out = 0;
    for (int s = 0; s < STEPS; s++) {
        assert_int_equal(profiled_step(ctx, x, w, &out), LOOM_OK);
        if (s == 0)
            first = out;
        assert_true(out == first); /* timing changes nothing */
    }
    assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 1);

    loom_ir_sbuf sb;
    profiled_kernel ks[16];
    int n = parse_profile(profile_of(ctx, LOOM_REPORT_FORMAT_JSON, &sb), ks, 16);
    int64_t kernel_ns = -1, execute_ns = -1, calls = -1, thread_ns = -1, idle_ns = -1;
    assert_int_equal(sscanf(sb.data,
                            "{\"kernel_ns\":%" SCNd64 ",\"execute_ns\":%" SCNd64
                            ",\"calls\":%" SCNd64 ",\"thread_ns\":%" SCNd64 ",\"idle_ns\":%" SCNd64,
                            &kernel_ns, &execute_ns, &calls, &thread_ns, &idle_ns),
                     5);
    loom_ir_sbuf_deinit(&sb);
    assert_int_equal(n, loom_metric_total(ctx, "KernelsPerGraph"));
    assert_true(n >= 2);
    assert_int_equal(calls, (int64_t)n * STEPS);
    assert_int_equal(execute_ns, loom_metric_total(ctx, "ExecuteTime"));
    assert_true(kernel_ns > 0 && kernel_ns <= execute_ns);
    bool seen[16] = {false}, matmul = false;
    int64_t sum = 0, idle_sum = 0;
    for (int i = 0; i < n; i++) {
        assert_int_equal(ks[i].calls, STEPS);
        assert_true(ks[i].total_ns > 0);
        /* both threads' time in the kernel, some of it idle: a thread with no chunk idles
         * throughout, and two chunks never start the moment the kernel does */
        assert_int_equal(ks[i].thread_ns, PROFILE_THREADS * ks[i].total_ns);
        assert_true(ks[i].idle_ns > 0 && ks[i].idle_ns < ks[i].thread_ns);
        idle_sum += ks[i].idle_ns;
        if (i > 0)
            assert_true(ks[i].total_ns <= ks[i - 1].total_ns); /* by total time */
        assert_string_equal(ks[i].program, ks[0].program);
        assert_true(ks[i].index >= 0 && ks[i].index < n && !seen[ks[i].index]);
        seen[ks[i].index] = true;
        sum += ks[i].total_ns;
        double flops = -1, bytes = -1;
        plan_cost(dir, ks[i].program, ks[i].index, &flops, &bytes);
        assert_true(ks[i].flops == flops && ks[i].bytes == bytes);
        assert_non_null(strstr(ks[i].loc, "test_jit.c:"));
        if (strcmp(ks[i].kind, "rooted") == 0) {
            matmul = true;
            assert_true(ks[i].flops >= 2.0 * 32 * 48 * 40); /* plus its relu epilogue */
            assert_true(ks[i].bytes >= 4.0 * (32 * 48 + 48 * 40));
        }
    }
    assert_true(matmul);
    assert_int_equal(sum, kernel_ns);
    assert_int_equal(thread_ns, PROFILE_THREADS * kernel_ns);
    assert_int_equal(idle_ns, idle_sum);

    /* the text names the table's columns, the source line and the total */
    const char *text = profile_of(ctx, LOOM_REPORT_FORMAT_TEXT, &sb);
    assert_non_null(strstr(text, "rank  total ms"));
    assert_non_null(strstr(text, "GFLOP/s"));
    assert_non_null(strstr(text, "idle%"));
    assert_non_null(strstr(text, "threads idle "));
    assert_non_null(strstr(text, "matmul f32[32,40]"));
    assert_non_null(strstr(text, "test_jit.c:"));
    assert_non_null(strstr(text, "\ntotal: "));
    loom_ir_sbuf_deinit(&sb);
    assert_int_equal(loom_profile_report(NULL, LOOM_REPORT_FORMAT_TEXT, append, &sb),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_profile_report(ctx, LOOM_REPORT_FORMAT_COUNT_, append, &sb),
                     LOOM_STATUS_INVALID_ARGUMENT);
    loom_tensor_release(x);
    loom_tensor_release(w);
    loom_context_destroy(ctx);
    remove_dir(dir);
}

static void test_nothing_is_timed_without_profiling(void **state) {
    (void)state;
    loom_context *ctx = profiling_context(false, NULL);
    float xs[4 * 3] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, ws[3 * 2] = {1, 0, 0, 1, 1, 1};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){4, 3}, xs);
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){3, 2}, ws);
    float out = 0;
    for (int s = 0; s < 3; s++)
        assert_int_equal(profiled_step(ctx, x, w, &out), LOOM_OK);
    /* rows of x @ w: (1+3, 2+3), (4+6, 5+6), ...; relu keeps them; 2 * row sums, mean */
    assert_true(fabsf(out - 2.0f * (9 + 21 + 33 + 45) / 4) < 1e-4f);
    loom_ir_sbuf sb;
    const char *json = profile_of(ctx, LOOM_REPORT_FORMAT_JSON, &sb);
    char want[128];
    snprintf(want, sizeof want,
             "{\"kernel_ns\":0,\"execute_ns\":%" PRId64
             ",\"calls\":0,\"thread_ns\":0,\"idle_ns\":0,\"kernels\":[]}\n",
             loom_metric_total(ctx, "ExecuteTime"));
    assert_string_equal(json, want);
    loom_ir_sbuf_deinit(&sb);
    loom_tensor_release(x);
    loom_tensor_release(w);
    loom_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_second_process_hits_the_disk_cache),
        cmocka_unit_test(test_dumps_are_whole_when_the_disk_cache_holds_the_code),
        cmocka_unit_test(test_a_corrupt_cache_file_is_detected_and_recompiled),
        cmocka_unit_test(test_an_unusable_cache_dir_does_not_fail_the_step),
        cmocka_unit_test(test_steps_run_while_the_next_is_traced_and_errors_surface_at_sync),
        cmocka_unit_test(test_the_profile_counts_every_kernel_run_with_the_plans_costs),
        cmocka_unit_test(test_nothing_is_timed_without_profiling),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
