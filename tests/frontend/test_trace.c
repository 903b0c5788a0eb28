/* LOOM_TRACE (loom_context_options.trace_path): the Chrome trace a context writes at
 * destroy holds an event for each thing Loom did (tracing, passes, compile modules,
 * disk-cache loads, steps, kernels named by root op and source line, transfers,
 * collectives), as JSON that Perfetto opens; a path that cannot be written is reported and
 * leaves the program running. LOOM_PERF_MAP (.perf_map): perf's map of the compiled
 * kernels, compiled or loaded from the disk cache. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"
#include "loom/dist.h"

static loom_context *traced_context(const char *trace, const char *cache, bool perf_map) {
    loom_context_options o;
    loom_context_options_init(&o);
    o.eager = false;
    o.dump_dir = NULL;
    o.cache_dir = cache;
    o.trace_path = trace;
    o.perf_map = perf_map;
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&o, &ctx), LOOM_OK);
    return ctx;
}

static int step_line; /* the source line of the step's matmul */

/* One compiled step: a matmul and an all-reduce (a collective kernel), read back. */
static void one_step(loom_context *ctx) {
    const float a[4] = {1, 2, 3, 4};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 2}, a);
    step_line = __LINE__ + 1;
    loom_tensor *y = loom_matmul(ctx, x, x);
    loom_tensor *r = loom_all_reduce(ctx, y, LOOM_REDUCE_SUM, 0.5);
    loom_tensor_retain(r);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    float out[4];
    tu_read_f32(ctx, r, out, 4);
    assert_true(out[0] == 3.5f && out[1] == 5.0f && out[2] == 7.5f && out[3] == 11.0f);
    loom_tensor_release(r);
    loom_tensor_release(x);
}

static void expect(const char *trace, const char *part) {
    if (!trace || !strstr(trace, part))
        fail_msg("the trace lacks %s:\n%.2000s", part, trace ? trace : "(no file)");
}

static void test_the_trace_has_an_event_for_each_thing_loom_did(void **state) {
    (void)state;
    char dir[] = "/tmp/loom-trace-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char trace[128], cache[128];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    for (int run = 0; run < 2; run++) { /* compiled, then from the disk cache */
        snprintf(trace, sizeof trace, "%s/run%d.json", dir, run);
        loom_context *ctx = traced_context(trace, cache, false);
        one_step(ctx);
        loom_context_destroy(ctx);
        char *t = tu_read_file(trace);
        assert_non_null(t);
        assert_memory_equal(t, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", 39);
        assert_non_null(strstr(t, "\n]}\n"));
        expect(t, "\"cat\":\"trace\",\"name\":\"trace step 0\"");
        expect(t, "\"cat\":\"compile\",\"name\":\"compile step 0\"");
        expect(t, "\"cat\":\"pass\",\"name\":\"autocast\"");
        expect(t, "\"cat\":\"pass\",\"name\":\"plan\"");
        expect(t, "\"cat\":\"step\",\"name\":\"step 0\"");
        expect(t, "\"cat\":\"transfer\",\"name\":\"to device\"");
        expect(t, "\"cat\":\"transfer\",\"name\":\"from device\"");
        expect(t, "\"args\":{\"bytes\":16}");
        char kernel[96];
        snprintf(kernel, sizeof kernel,
                 "\"cat\":\"kernel\",\"name\":\"k0 matmul f32[2,2] test_trace.c:%d\"", step_line);
        expect(t, kernel);
        expect(t, "\"cat\":\"collective\",\"name\":\"k1 all_reduce f32[2,2] test_trace.c:");
        expect(t, run == 0 ? "\"cat\":\"compile\",\"name\":\"module 0: kernels 0..0\""
                           : "\"cat\":\"cache\",\"name\":\"disk cache load\"");
        free(t);
    }
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* A trace that cannot be written: destroy says so on stderr and returns; nothing aborts. */
static void test_an_unwritable_trace_path_is_reported_at_destroy(void **state) {
    (void)state;
    loom_context *ctx = traced_context("/nonexistent-dir/trace.json", "", false);
    one_step(ctx);
    loom_context_destroy(ctx);
    FILE *f = fopen("/nonexistent-dir/trace.json", "rb");
    assert_null(f);
}

/* Two contexts, the second loading the step from the disk cache: each appends its matmul's
 * code to /tmp/perf-<pid>.map, named as the profile names it; the all-reduce has no code. */
static void test_the_perf_map_names_compiled_and_cached_kernels(void **state) {
    (void)state;
    char dir[] = "/tmp/loom-perf-map-test-XXXXXX", map[64];
    assert_non_null(mkdtemp(dir));
    snprintf(map, sizeof map, "/tmp/perf-%ld.map", (long)getpid());
    unlink(map);
    for (int run = 0; run < 2; run++) {
        loom_context *ctx = traced_context(NULL, dir, true);
        one_step(ctx);
        loom_context_destroy(ctx);
    }
    char *m = tu_read_file(map);
    assert_non_null(m);
    const char *line = m;
    for (int run = 0; run < 2; run++) {
        unsigned long start = 0, size = 0;
        int used = 0;
        char hash[17] = "", tail[96];
        assert_int_equal(sscanf(line, "%lx %lx loom %16[0-9a-f]:0 %n", &start, &size, hash, &used),
                         3);
        assert_true(start != 0 && size > 16 && size < 65536 && strlen(hash) == 16);
        snprintf(tail, sizeof tail, "matmul f32[2,2] test_trace.c:%d\n", step_line);
        assert_memory_equal(line + used, tail, strlen(tail));
        line += used + strlen(tail);
    }
    assert_string_equal(line, ""); /* nothing for the all-reduce */
    free(m);
    unlink(map);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_trace_has_an_event_for_each_thing_loom_did),
        cmocka_unit_test(test_an_unwritable_trace_path_is_reported_at_destroy),
        cmocka_unit_test(test_the_perf_map_names_compiled_and_cached_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
