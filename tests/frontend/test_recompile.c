/* The recompilation explainer and the planned memory report (loom_memory_report): a step that
 * misses the cache while a near graph is cached says what differs, with the user's source line
 * (loom_last_recompile), counts in the Recompiles metric, and loom_recompile_report lists each
 * distinct cause once with its count; a new graph is not a recompilation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

static int input_line, const_line;

/* Reads exp(a) before loom_mark_step: the read forces the pending step to run. */
enum { FORCED_LINE = __LINE__ + 4 };
static loom_status forced_read(loom_context *ctx) {
    loom_tensor *a = tu_f32(ctx, 2, (const float[]){1, 2});
    float v[2];
    loom_tensor *e = loom_exp(ctx, a);
    loom_status st = loom_tensor_read(ctx, e, v, sizeof v);
    loom_tensor_release(a);
    return st;
}

/* sum(x * c) for x of rows x 8 zeros. */
static void step(loom_context *ctx, int64_t rows, float c) {
    static const float zeros[64 * 8];
    input_line = __LINE__ + 1;
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){rows, 8}, zeros);
    const_line = __LINE__ + 1;
    loom_tensor *k = loom_scalar(ctx, LOOM_DTYPE_F32, c);
    loom_tensor *y = loom_sum(ctx, loom_mul(ctx, x, k), 0, NULL, false);
    loom_tensor_retain(y);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    float v;
    tu_read_f32(ctx, y, &v, 1);
    assert_true(v == 0);
    loom_tensor_release(y);
    loom_tensor_release(x);
}

static void write_sbuf(const char *chunk, size_t len, void *ud) {
    loom_ir_sbuf_append(ud, chunk, len);
}

static void test_a_recompiled_step_names_what_changed_and_where(void **state) {
    (void)state;
    loom_context_options o;
    loom_context_options_init(&o);
    o.cache_dir = "";
    o.dump_dir = NULL;
    o.debug = false;
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&o, &ctx), LOOM_OK);
    step(ctx, 64, 2);
    assert_string_equal(loom_last_recompile(ctx), "");
    assert_int_equal(loom_metric_value(ctx, "Recompiles"), 0);
    /* the batch shrinks: the input's type, where the user made it */
    char want[256];
    for (int s = 1; s <= 3; s++) {
        step(ctx, 64 - s, 2);
        snprintf(want, sizeof want,
                 "step %d recompiled: %%1 input 0 at test_recompile.c:%d has f32[%d,8] (was "
                 "f32[64,8])",
                 s, input_line, 64 - s);
        if (strncmp(loom_last_recompile(ctx), want, strlen(want)) != 0)
            fail_msg("\"%s\" does not start with \"%s\"", loom_last_recompile(ctx), want);
    }
    assert_int_equal(loom_metric_value(ctx, "Recompiles"), 3);
    step(ctx, 64, 2); /* cached: nothing new */
    assert_int_equal(loom_metric_value(ctx, "Recompiles"), 3);
    /* a constant that changes every step defeats the cache: named as such */
    step(ctx, 64, 3);
    snprintf(want, sizeof want,
             "step 5 recompiled: %%0 constant at test_recompile.c:%d is a constant that changes "
             "between graphs: value = 3 (was value = 2); a value that changes every step "
             "defeats the cache: pass it as a tensor instead",
             const_line);
    assert_string_equal(loom_last_recompile(ctx), want);
    step(ctx, 64, 4);
    assert_int_equal(loom_metric_value(ctx, "Recompiles"), 5);

    /* a new graph (a matmul) is not a recompilation */
    loom_tensor *a = tu_f32(ctx, 4, (const float[]){1, 2, 3, 4});
    loom_tensor *m = loom_matmul(ctx, loom_reshape(ctx, a, 2, (int64_t[]){2, 2}),
                                 loom_reshape(ctx, a, 2, (int64_t[]){2, 2}));
    loom_tensor *e = loom_exp(ctx, loom_tanh(ctx, m));
    loom_tensor_retain(e);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    loom_tensor_release(e);
    loom_tensor_release(a);
    assert_int_equal(loom_metric_value(ctx, "Recompiles"), 5);

    /* two distinct causes, each with its count and first message */
    loom_ir_sbuf sb;
    loom_allocator sys = loom_allocator_system();
    loom_ir_sbuf_init(&sb, &sys);
    assert_int_equal(loom_recompile_report(ctx, LOOM_REPORT_FORMAT_TEXT, write_sbuf, &sb), LOOM_OK);
    loom_ir_sbuf_append(&sb, "", 1);
    assert_non_null(strstr(sb.data, "Recompiles: 5 (2 distinct causes)\n"));
    assert_non_null(strstr(sb.data, "  3x, first: step 1 recompiled: %1 input 0 at "));
    assert_non_null(strstr(sb.data, "  2x, first: step 5 recompiled: %0 constant at "));
    sb.len = 0;
    assert_int_equal(loom_recompile_report(ctx, LOOM_REPORT_FORMAT_JSON, write_sbuf, &sb), LOOM_OK);
    loom_ir_sbuf_append(&sb, "", 1);
    assert_memory_equal(sb.data,
                        "{\"recompiles\":[{\"count\":3,\"first\":\"step 1 recompiled: ", 54);
    loom_ir_sbuf_deinit(&sb);
    assert_int_equal(loom_recompile_report(NULL, LOOM_REPORT_FORMAT_TEXT, write_sbuf, &sb),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_string_equal(loom_last_recompile(NULL), "");
    /* the planned memory of the last compiled step, known before it ran */
    const char *mem = loom_memory_report(ctx);
    if (strncmp(mem, "memory: planned peak ", 21) != 0 || !strstr(mem, "most alive at kernel"))
        fail_msg("memory report: \"%s\"", mem);
    assert_string_equal(loom_memory_report(NULL), "");
    loom_context_destroy(ctx);
}

/* LOOM_DEBUG's messages (stderr, captured in a child process): a recompilation warned once
 * per cause, a forced read once per source line, and the summary at destroy. */
static void test_debug_reports_recompiles_forced_reads_and_a_summary(void **state) {
    (void)state;
    char path[] = "/tmp/loom-debug-test-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen(path, "w", stderr))
            _exit(3);
        loom_context_options o;
        loom_context_options_init(&o);
        o.cache_dir = "";
        o.dump_dir = NULL;
        o.debug = true;
        loom_context *ctx = NULL;
        if (loom_context_create(&o, &ctx) != LOOM_OK)
            _exit(4);
        for (int s = 0; s < 6; s++)
            step(ctx, 64 - s % 3, 2); /* steps 1, 2 recompile for one cause; 3.. hit */
        for (int s = 0; s < 2; s++)
            if (forced_read(ctx) != LOOM_OK)
                _exit(5);
        loom_context_destroy(ctx);
        fflush(stderr);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    unlink(path);
    char want[256];
    snprintf(want, sizeof want,
             "loom: warning: step 1 recompiled: %%1 input 0 at test_recompile.c:%d has f32[63,8] "
             "(was f32[64,8])",
             input_line);
    if (!strstr(text, want))
        fail_msg("stderr lacks \"%s\":\n%s", want, text);
    assert_null(strstr(text, "step 2 recompiled")); /* the same cause: warned once */
    snprintf(want, sizeof want,
             "loom: debug: step 6: reading the f32[2] recorded at test_recompile.c:%d forced the "
             "pending step to run before loom_mark_step",
             (int)FORCED_LINE);
    if (!strstr(text, want))
        fail_msg("stderr lacks \"%s\":\n%s", want, text);
    assert_null(strstr(strstr(text, want) + strlen(want), "forced the")); /* once per line */
    if (!strstr(text, "loom: debug: step 6 compiles a graph of ") ||
        !strstr(text, " nodes after the 3-step warm-up (1 such compile so far)\n"))
        fail_msg("stderr lacks the late compile:\n%s", text);
    if (!strstr(text, "loom: debug: 6 steps; 1 compile after the first 3 steps, 2 recompiles "
                      "of a near graph, 2 forced reads, 0 interpreter fallbacks\n"))
        fail_msg("stderr lacks the summary:\n%s", text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_recompiled_step_names_what_changed_and_where),
        cmocka_unit_test(test_debug_reports_recompiles_forced_reads_and_a_summary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
