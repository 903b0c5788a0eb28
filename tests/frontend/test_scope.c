/* Module scopes (loom_scope_push / loom_scope_pop): nested names joined with '.', recorded on
 * every node beside its source line, carried by autograd to the backward nodes (marked
 * backward), printed by errors, the memory report and the profile, and never part of the
 * graph's hash: the same step with and without scopes compiles once and gives the same
 * values. Bad names and unbalanced pops are errors that leave the context usable. And
 * LOOM_DUMP_TENSORS, whose files name each node by its scope, op and id. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#include "frontend/frontend.h"
#include "loom/nn.h"
#include "loom/safetensors.h"

static loom_context *make_ctx(bool profile) {
    loom_context_options o;
    loom_context_options_init(&o);
    o.cache_dir = "";
    o.profile = profile;
    loom_context *ctx = NULL;
    assert_int_equal(loom_context_create(&o, &ctx), LOOM_OK);
    return ctx;
}

static void append(const char *chunk, size_t len, void *ud) {
    loom_ir_sbuf_write(chunk, len, ud);
}

static const float wv[6] = {0.5f, -1.0f, 0.25f, 2.0f, -0.75f, 1.5f};
static const float xv[6] = {1.0f, 0.5f, -2.0f, 0.25f, 0.75f, -1.0f};

/* loss = sum(exp(0.1 * (w @ x))) with w under "model.fc1" (where the matmul is), the
 * scale and exp under "model" when scoped; its gradient with respect to w recorded outside
 * every scope. Returns w's gradient (retained) and the loss (retained). */
static void record(loom_context *ctx, bool scoped, loom_tensor **grad, loom_tensor **loss) {
    if (scoped) {
        assert_int_equal(loom_scope_push(ctx, "model"), LOOM_OK);
        assert_int_equal(loom_scope_push(ctx, "fc1"), LOOM_OK);
        assert_string_equal(loom_scope_current(ctx), "model.fc1");
    }
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 3}, wv);
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){3, 2}, xv);
    loom_tensor *y = loom_matmul(ctx, w, x);
    if (scoped) {
        assert_int_equal(loom_scope_pop(ctx), LOOM_OK);
        assert_string_equal(loom_scope_current(ctx), "model");
    }
    loom_tensor *l =
        loom_sum(ctx, loom_exp(ctx, loom_mul(ctx, y, loom_scalar(ctx, LOOM_DTYPE_F32, 0.1))), 0,
                 NULL, false);
    if (scoped) {
        assert_int_equal(loom_scope_pop(ctx), LOOM_OK);
        assert_string_equal(loom_scope_current(ctx), "");
    }
    loom_tensor *g[1] = {NULL};
    assert_int_equal(loom_backward(ctx, l, 1, &w, g), LOOM_OK);
    loom_tensor_retain(g[0]);
    loom_tensor_retain(l);
    *grad = g[0];
    *loss = l;
    loom_tensor_release(w);
    loom_tensor_release(x);
}

static void test_nodes_carry_their_scope_and_backward_nodes_their_forwards(void **state) {
    (void)state;
    loom_context *ctx = make_ctx(false);
    loom_tensor *g, *l;
    record(ctx, true, &g, &l);
    const loom_ir_graph *t = &ctx->trace;
    int32_t matmuls = 0, fwd_scoped = 0, bwd = 0, bwd_fc1 = 0;
    bool seen_backward = false;
    for (int32_t i = 0; i < t->n_nodes; i++) {
        const loom_ir_node *n = &t->nodes[i];
        if (n->loc.backward) {
            seen_backward = true;
            bwd++;
            /* every backward node is the gradient of a scoped forward node */
            assert_non_null(n->loc.scope);
            bwd_fc1 += strcmp(n->loc.scope, "model.fc1") == 0;
            if (n->op == LOOM_IR_OP_MATMUL)
                assert_string_equal(n->loc.scope, "model.fc1");
            continue;
        }
        assert_false(seen_backward); /* forward nodes first, then the gradient's */
        assert_non_null(n->loc.scope);
        fwd_scoped++;
        if (n->op == LOOM_IR_OP_MATMUL || n->op == LOOM_IR_OP_INPUT) {
            assert_string_equal(n->loc.scope, "model.fc1");
            matmuls += n->op == LOOM_IR_OP_MATMUL;
        } else {
            assert_string_equal(n->loc.scope, "model");
        }
    }
    assert_int_equal(matmuls, 1);
    assert_true(fwd_scoped >= 5);
    assert_true(bwd >= 3);
    assert_true(bwd_fc1 >= 1); /* the matmul's VJP (and its transpose of x) */
    /* a node's text: "model.fc1.grad (test_scope.c:N)" */
    char buf[LOOM_IR_LOC_STR_MAX];
    for (int32_t i = 0; i < t->n_nodes; i++)
        if (t->nodes[i].loc.backward && t->nodes[i].op == LOOM_IR_OP_MATMUL) {
            loom_ir_format_loc(buf, sizeof buf, t->nodes[i].loc);
            assert_non_null(strstr(buf, "model.fc1.grad (test_scope.c:"));
        }
    loom_tensor_release(g);
    loom_tensor_release(l);
    loom_context_destroy(ctx);
}

/* The same step recorded with and then without scopes: one compile, the same values; the
 * profile and the memory report name the scopes of the graph that was compiled. */
static void test_scopes_change_neither_the_hash_nor_the_values(void **state) {
    (void)state;
    loom_context *ctx = make_ctx(true);
    float got[2][6], loss[2];
    for (int run = 0; run < 2; run++) {
        loom_tensor *g, *l;
        record(ctx, run == 0, &g, &l);
        assert_int_equal(loom_compile_step(ctx), LOOM_OK);
        if (run == 0) {
            const char *rep = loom_memory_report(ctx);
            assert_non_null(rep);
            assert_non_null(strstr(rep, "model.fc1"));
        }
        assert_int_equal(loom_mark_step(ctx), LOOM_OK);
        assert_int_equal(loom_tensor_read(ctx, g, got[run], sizeof got[run]), LOOM_OK);
        assert_int_equal(loom_tensor_read(ctx, l, &loss[run], sizeof loss[run]), LOOM_OK);
        loom_tensor_release(g);
        loom_tensor_release(l);
    }
    assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 1);
    assert_memory_equal(got[0], got[1], sizeof got[0]);
    assert_memory_equal(&loss[0], &loss[1], sizeof loss[0]);
    /* the hand-derived gradient: d/dw sum(exp(0.1 wx)) = 0.1 exp(0.1 wx) x^T */
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 3; k++) {
            double want = 0;
            for (int j = 0; j < 2; j++) {
                double y = 0;
                for (int q = 0; q < 3; q++)
                    y += (double)wv[i * 3 + q] * xv[q * 2 + j];
                want += 0.1 * exp(0.1 * y) * xv[k * 2 + j];
            }
            assert_float_equal(got[1][i * 3 + k], want, 1e-5);
        }
    loom_allocator sys = loom_allocator_system();
    loom_ir_sbuf prof;
    loom_ir_sbuf_init(&prof, &sys);
    assert_int_equal(loom_profile_report(ctx, LOOM_REPORT_FORMAT_TEXT, append, &prof), LOOM_OK);
    assert_false(prof.oom);
    assert_non_null(strstr(prof.data, "model.fc1 (test_scope.c:"));
    assert_non_null(strstr(prof.data, "model.fc1.grad (test_scope.c:"));
    loom_ir_sbuf_deinit(&prof);
    loom_context_destroy(ctx);
}

/* An op that fails inside a scope says where: "test_scope.c:N: model.fc1: matmul: ...". */
static void test_errors_name_the_scope(void **state) {
    (void)state;
    loom_context *ctx = make_ctx(false);
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 3}, wv);
    assert_int_equal(loom_scope_push(ctx, "model.fc1"), LOOM_OK);
    assert_null(loom_matmul(ctx, w, w));
    const char *msg = loom_context_error_message(ctx);
    assert_non_null(strstr(msg, "test_scope.c:"));
    assert_non_null(strstr(msg, ": model.fc1: matmul: inner dimensions differ"));
    loom_context_clear_error(ctx);
    assert_int_equal(loom_scope_pop(ctx), LOOM_OK);
    assert_null(loom_matmul(ctx, w, w));
    assert_null(strstr(loom_context_error_message(ctx), "model"));
    loom_context_clear_error(ctx);
    loom_tensor_release(w);
    loom_context_destroy(ctx);
}

static void expect_error(loom_context *ctx, loom_status st, const char *want) {
    assert_int_equal(st, LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_context_error(ctx), LOOM_STATUS_INVALID_ARGUMENT);
    const char *msg = loom_context_error_message(ctx);
    if (!strstr(msg, want))
        fail_msg("error '%s' does not say '%s'", msg, want);
    loom_context_clear_error(ctx);
}

static void test_bad_scopes_are_errors_and_the_context_stays_usable(void **state) {
    (void)state;
    assert_int_equal(loom_scope_push(NULL, "a"), LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_scope_pop(NULL), LOOM_STATUS_INVALID_ARGUMENT);
    assert_string_equal(loom_scope_current(NULL), "");
    loom_context *ctx = make_ctx(false);
    expect_error(ctx, loom_scope_pop(ctx), "scope_pop: no scope is open");
    expect_error(ctx, loom_scope_push(ctx, NULL), "scope_push: the scope's name is NULL");
    expect_error(ctx, loom_scope_push(ctx, ""), "scope_push: the scope's name is empty");
    expect_error(ctx, loom_scope_push(ctx, "a\nb"), "a control byte 0x0a at 1");
    assert_int_equal(loom_scope_push(ctx, "outer"), LOOM_OK);
    for (int i = 1; i < LOOM_SCOPE_MAX_DEPTH; i++)
        assert_int_equal(loom_scope_push(ctx, "x"), LOOM_OK);
    expect_error(ctx, loom_scope_push(ctx, "x"), "more than 64 nested scopes");
    for (int i = 1; i < LOOM_SCOPE_MAX_DEPTH; i++)
        assert_int_equal(loom_scope_pop(ctx), LOOM_OK);
    assert_string_equal(loom_scope_current(ctx), "outer");
    char *big = malloc(LOOM_SCOPE_MAX_LEN);
    memset(big, 'n', LOOM_SCOPE_MAX_LEN - 1);
    big[LOOM_SCOPE_MAX_LEN - 1] = '\0';
    expect_error(ctx, loom_scope_push(ctx, big), "bytes long (at most 1023)");
    assert_string_equal(loom_scope_current(ctx), "outer"); /* a failed push changes nothing */
    big[LOOM_SCOPE_MAX_LEN - 6] = '\0';                    /* "outer." and 1017 bytes: 1023 */
    assert_int_equal(loom_scope_push(ctx, big), LOOM_OK);
    assert_int_equal(strlen(loom_scope_current(ctx)), LOOM_SCOPE_MAX_LEN);
    assert_int_equal(loom_scope_pop(ctx), LOOM_OK);
    free(big);
    /* still usable: a scoped op records and runs */
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){6}, wv);
    loom_tensor *y = loom_neg(ctx, w);
    assert_string_equal(ctx->trace.nodes[ctx->trace.n_nodes - 1].loc.scope, "outer");
    assert_int_equal(loom_scope_pop(ctx), LOOM_OK);
    float out[6];
    assert_int_equal(loom_tensor_read(ctx, y, out, sizeof out), LOOM_OK);
    assert_float_equal(out[3], -2.0f, 0);
    loom_tensor_release(y);
    loom_tensor_release(w);
    loom_context_destroy(ctx);
}

/* ---- LOOM_DUMP_TENSORS ------------------------------------------------------------------ */

static char dump_dir[64];

static void dump_env(const char *scopes, const char *steps, const char *pass) {
    snprintf(dump_dir, sizeof dump_dir, "/tmp/loom-dump-test-%d", (int)getpid());
    setenv("LOOM_DUMP_TENSORS", dump_dir, 1);
    scopes ? setenv("LOOM_DUMP_TENSORS_SCOPES", scopes, 1) : unsetenv("LOOM_DUMP_TENSORS_SCOPES");
    steps ? setenv("LOOM_DUMP_TENSORS_STEPS", steps, 1) : unsetenv("LOOM_DUMP_TENSORS_STEPS");
    pass ? setenv("LOOM_DUMP_TENSORS_PASS", pass, 1) : unsetenv("LOOM_DUMP_TENSORS_PASS");
}

static void dump_clean(void) {
    char path[128];
    for (int s = 0; s < 4; s++) {
        snprintf(path, sizeof path, "%s/step%d.safetensors", dump_dir, s);
        unlink(path);
    }
    rmdir(dump_dir);
    unsetenv("LOOM_DUMP_TENSORS");
    unsetenv("LOOM_DUMP_TENSORS_SCOPES");
    unsetenv("LOOM_DUMP_TENSORS_STEPS");
    unsetenv("LOOM_DUMP_TENSORS_PASS");
}

/* The dumped tensor whose name starts with prefix and has op `op` (one, or fails); its
 * float values into out (n of them). */
static void dumped(const loom_safetensors *f, const char *prefix, float *out, size_t n) {
    int32_t found = -1;
    for (int32_t i = 0; i < loom_safetensors_count(f); i++) {
        const char *name;
        assert_int_equal(loom_safetensors_tensor(f, i, &name, NULL, NULL, NULL, NULL, NULL),
                         LOOM_OK);
        if (strncmp(name, prefix, strlen(prefix)) == 0) {
            assert_int_equal(found, -1);
            found = i;
        }
    }
    if (found < 0)
        fail_msg("no dumped tensor named %s...", prefix);
    loom_dtype dt;
    const void *data;
    size_t size;
    assert_int_equal(loom_safetensors_tensor(f, found, NULL, &dt, NULL, NULL, &data, &size),
                     LOOM_OK);
    assert_int_equal(dt, LOOM_DTYPE_F32);
    assert_int_equal(size, n * sizeof(float));
    memcpy(out, data, size);
}

static bool has_prefix(const loom_safetensors *f, const char *prefix) {
    for (int32_t i = 0; i < loom_safetensors_count(f); i++) {
        const char *name;
        loom_safetensors_tensor(f, i, &name, NULL, NULL, NULL, NULL, NULL);
        if (strncmp(name, prefix, strlen(prefix)) == 0)
            return true;
    }
    return false;
}

/* Scopes by glob: model.fc1's matmul (w x, hand-computed) and its gradient (what the step
 * returns), nothing of "model" itself; the step's own results as without the dump. */
static void test_tensor_dumps_are_named_by_scope_and_hold_the_values(void **state) {
    (void)state;
    float plain[6], y[4], gw[6], got[6];
    loom_context *ctx = make_ctx(false);
    loom_tensor *g, *l;
    record(ctx, true, &g, &l);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    assert_int_equal(loom_tensor_read(ctx, g, plain, sizeof plain), LOOM_OK);
    loom_tensor_release(g);
    loom_tensor_release(l);
    loom_context_destroy(ctx);

    dump_env("model.fc1*", NULL, NULL);
    ctx = make_ctx(false);
    record(ctx, true, &g, &l);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    assert_int_equal(loom_tensor_read(ctx, g, got, sizeof got), LOOM_OK);
    assert_memory_equal(got, plain, sizeof got);
    char path[128], err[256];
    snprintf(path, sizeof path, "%s/step0.safetensors", dump_dir);
    loom_safetensors *f = NULL;
    assert_int_equal(loom_safetensors_open(path, &f, err, sizeof err), LOOM_OK);
    dumped(f, "model.fc1.matmul.%", y, 4);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            double want = 0;
            for (int q = 0; q < 3; q++)
                want += (double)wv[i * 3 + q] * xv[q * 2 + j];
            assert_float_equal(y[i * 2 + j], want, 1e-6);
        }
    dumped(f, "model.fc1.grad.matmul.%", gw, 6);
    assert_memory_equal(gw, got, sizeof gw);
    assert_true(has_prefix(f, "model.fc1.input.%")); /* w and x as the step read them */
    assert_false(has_prefix(f, "model.exp"));        /* "model" is not model.fc1* */
    loom_safetensors_close(f);
    loom_tensor_release(g);
    loom_tensor_release(l);
    loom_context_destroy(ctx);
    dump_clean();
}

/* LOOM_DUMP_TENSORS_STEPS and _PASS select; a bad pass is an error naming it. */
static void test_tensor_dumps_select_steps_and_passes(void **state) {
    (void)state;
    dump_env(NULL, "1", "forward");
    loom_context *ctx = make_ctx(false);
    for (int step = 0; step < 2; step++) {
        loom_tensor *g, *l;
        record(ctx, true, &g, &l);
        assert_int_equal(loom_mark_step(ctx), LOOM_OK);
        loom_tensor_release(g);
        loom_tensor_release(l);
    }
    char path[128], err[256];
    snprintf(path, sizeof path, "%s/step0.safetensors", dump_dir);
    assert_int_equal(access(path, F_OK), -1); /* step 0 not selected */
    snprintf(path, sizeof path, "%s/step1.safetensors", dump_dir);
    loom_safetensors *f = NULL;
    assert_int_equal(loom_safetensors_open(path, &f, err, sizeof err), LOOM_OK);
    assert_true(has_prefix(f, "model.exp.%"));
    assert_true(has_prefix(f, "model.fc1.matmul.%"));
    for (int32_t i = 0; i < loom_safetensors_count(f); i++) {
        const char *name;
        loom_safetensors_tensor(f, i, &name, NULL, NULL, NULL, NULL, NULL);
        assert_null(strstr(name, ".grad."));
    }
    loom_safetensors_close(f);
    setenv("LOOM_DUMP_TENSORS_PASS", "sideways", 1);
    setenv("LOOM_DUMP_TENSORS_STEPS", "2", 1);
    loom_tensor *g, *l;
    record(ctx, true, &g, &l);
    assert_int_equal(loom_mark_step(ctx), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx),
                           "LOOM_DUMP_TENSORS_PASS=sideways: give forward, backward or all"));
    loom_context_clear_error(ctx);
    loom_tensor_release(g);
    loom_tensor_release(l);
    loom_context_destroy(ctx);
    dump_clean();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nodes_carry_their_scope_and_backward_nodes_their_forwards),
        cmocka_unit_test(test_scopes_change_neither_the_hash_nor_the_values),
        cmocka_unit_test(test_errors_name_the_scope),
        cmocka_unit_test(test_bad_scopes_are_errors_and_the_context_stays_usable),
        cmocka_unit_test(test_tensor_dumps_are_named_by_scope_and_hold_the_values),
        cmocka_unit_test(test_tensor_dumps_select_steps_and_passes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
