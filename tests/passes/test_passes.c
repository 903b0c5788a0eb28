/* Tests of the pass manager (order, callbacks, verification between passes, errors naming
 * the pass) and of dead-code elimination. */
#include <stdio.h>
#include <string.h>

#include "passes/passes.h"
#include "test_util.h"

static loom_allocator sys;

#define S(...) ((const int64_t[]){__VA_ARGS__})

/* ---- helpers ----------------------------------------------------------------------------- */

static int32_t add_input(loom_ir_graph *g, int64_t index) {
    return tu_add_desc(g, (loom_ir_node_desc){.op = LOOM_IR_OP_INPUT,
                                              .dtype = LOOM_DTYPE_F32,
                                              .rank = 2,
                                              .shape = S(2, 3),
                                              .attrs.index = index,
                                              .loc = {"model.c", (int32_t)(10 + index)}});
}

static int32_t add1(loom_ir_graph *g, loom_ir_op op, int32_t a) {
    return tu_add_desc(
        g, (loom_ir_node_desc){
               .op = op, .n_inputs = 1, .inputs = (int32_t[]){a}, .loc = {"model.c", 20 + a}});
}

static int32_t add2(loom_ir_graph *g, loom_ir_op op, int32_t a, int32_t b) {
    return tu_add_desc(g,
                       (loom_ir_node_desc){.op = op, .n_inputs = 2, .inputs = (int32_t[]){a, b}});
}

/* "input,input,exp(1),add(2,0)": the graph's nodes with their operands, to compare
 * whole node lists at once. */
static const char *node_list(const loom_ir_graph *g) {
    static char buf[2048];
    size_t n = 0;
    buf[0] = '\0';
    for (int32_t i = 0; i < g->n_nodes && n < sizeof buf; i++) {
        const loom_ir_node *nd = &g->nodes[i];
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", i ? "," : "",
                              loom_ir_op_name(nd->op));
        if (nd->op == LOOM_IR_OP_INPUT)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "#%lld", (long long)nd->attrs.index);
        for (int32_t k = 0; k < nd->n_inputs && n < sizeof buf; k++)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%d", k ? " " : "(",
                                  (int)nd->inputs[k]);
        if (nd->n_inputs && n < sizeof buf)
            n += (size_t)snprintf(buf + n, sizeof buf - n, ")");
    }
    return buf;
}

static loom_status run_dce(loom_ir_graph *g, bool *changed, loom_ir_diag *d) {
    loom_ir_diag_init(d);
    *changed = !*changed; /* the pass must set it either way */
    return loom_pass_dce.run(g, changed, d);
}

/* %0 = input 0; %1 = input 1 (unused); %2 = exp %0 (dead); %3 = neg %0;
 * %4 = tanh %2 (dead); %5 = add %3, %0; %6 = input 2; %7 = mul %6, %6 (dead);
 * return %5 */
static void build_with_dead_nodes(loom_ir_graph *g) {
    loom_ir_graph_init(g, &sys);
    int32_t x = add_input(g, 0);
    add_input(g, 1);
    int32_t e = add1(g, LOOM_IR_OP_EXP, x);
    int32_t n = add1(g, LOOM_IR_OP_NEG, x);
    add1(g, LOOM_IR_OP_TANH, e);
    int32_t s = add2(g, LOOM_IR_OP_ADD, n, x);
    int32_t z = add_input(g, 2);
    add2(g, LOOM_IR_OP_MUL, z, z);
    tu_output(g, s, -1);
}

/* ---- dce --------------------------------------------------------------------------------- */

static void test_dce_removes_dead_nodes_and_keeps_every_input(void **state) {
    (void)state;
    loom_ir_graph g;
    build_with_dead_nodes(&g);
    assert_string_equal(node_list(&g), "input#0,input#1,exp(0),neg(0),tanh(2),add(3 0),input#2,"
                                       "mul(6 6)");
    bool changed = false;
    loom_ir_diag d;
    assert_int_equal(run_dce(&g, &changed, &d), LOOM_OK);
    assert_true(changed);
    assert_int_equal(d.code, LOOM_OK);
    assert_string_equal(node_list(&g), "input#0,input#1,neg(0),add(2 0),input#2");
    assert_string_equal(tu_output_list(&g), "%3");
    assert_int_equal(g.n_graph_inputs, 3);
    /* locations move with their nodes */
    assert_string_equal(g.nodes[2].loc.file, "model.c");
    assert_int_equal(g.nodes[2].loc.line, 20);
    assert_int_equal(g.nodes[4].loc.line, 12);
    tu_verify(&g);
    /* a second run finds nothing */
    assert_int_equal(run_dce(&g, &changed, &d), LOOM_OK);
    assert_false(changed);
    loom_ir_graph_deinit(&g);
}

static void test_dce_leaves_a_clean_graph_untouched(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_ir_graph g;
    loom_ir_graph_init(&g, &a);
    int32_t x = add_input(&g, 0);
    int32_t y = add_input(&g, 1);
    int32_t s = add2(&g, LOOM_IR_OP_SUB, x, y);
    tu_output(&g, s, 1);
    tu_output(&g, add1(&g, LOOM_IR_OP_RELU, s), -1);
    uint64_t h = loom_ir_graph_hash(&g);
    loom_ir_node *nodes = g.nodes;
    int64_t allocs = ta.n_allocs;
    bool changed = true;
    loom_ir_diag d;
    assert_int_equal(run_dce(&g, &changed, &d), LOOM_OK);
    assert_false(changed);
    assert_true(g.nodes == nodes); /* not rebuilt */
    assert_int_equal(ta.n_allocs, allocs);
    assert_true(loom_ir_graph_hash(&g) == h);
    assert_string_equal(tu_output_list(&g), "%2->1,%3");
    loom_ir_graph_deinit(&g);
    assert_int_equal(ta.live_bytes, 0);

    /* a graph of inputs only, without outputs, is clean too */
    loom_ir_graph_init(&g, &a);
    add_input(&g, 0);
    add_input(&g, 1);
    assert_int_equal(run_dce(&g, &changed, &d), LOOM_OK);
    assert_false(changed);
    assert_int_equal(g.n_nodes, 2);
    loom_ir_graph_deinit(&g);
    assert_int_equal(ta.live_bytes, 0);
}

static void test_dce_keeps_aliases_and_every_output(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    int32_t w = add_input(&g, 0);                           /* %0 param */
    int32_t gr = add_input(&g, 1);                          /* %1 grad */
    int32_t dead = add1(&g, LOOM_IR_OP_SQRT, gr);           /* %2 dead */
    int32_t upd = add2(&g, LOOM_IR_OP_SUB, w, gr);          /* %3 new param */
    add2(&g, LOOM_IR_OP_MUL, dead, dead);                   /* %4 dead */
    int32_t loss = add1(&g, LOOM_IR_OP_ABS, upd);           /* %5 */
    tu_output(&g, upd, 0);
    tu_output(&g, loss, -1);
    tu_output(&g, upd, -1); /* the same node twice */
    bool changed = false;
    loom_ir_diag d;
    assert_int_equal(run_dce(&g, &changed, &d), LOOM_OK);
    assert_true(changed);
    assert_string_equal(node_list(&g), "input#0,input#1,sub(0 1),abs(2)");
    assert_string_equal(tu_output_list(&g), "%2->0,%3,%2");
    tu_verify(&g);
    loom_ir_graph_deinit(&g);
}

/* Over 1024 nodes and 64 outputs DCE allocates its scratch; each allocation may fail, and
 * then the graph is as it was and nothing leaks. */
static void test_dce_fails_cleanly_when_memory_runs_out(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_ir_graph g;
    loom_ir_graph_init(&g, &a);
    int32_t x = add_input(&g, 0);
    int32_t last = x;
    for (int32_t i = 0; i < 1100; i++) {
        last = add1(&g, i % 2 ? LOOM_IR_OP_NEG : LOOM_IR_OP_EXP, last);
        if (i % 10 == 0)
            add1(&g, LOOM_IR_OP_TANH, last); /* dead */
        if (i >= 1000 && i < 1070)
            tu_output(&g, last, -1);
    }
    assert_int_equal(g.n_outputs, 70);
    int32_t n_before = g.n_nodes;
    uint64_t h = loom_ir_graph_hash(&g);
    int failures = 0;
    for (int64_t k = 1;; k++) {
        ta.fail_at = ta.n_allocs + k;
        ta.n_failed = 0;
        bool changed = false;
        loom_ir_diag d;
        int64_t live = ta.live_bytes;
        loom_status st = run_dce(&g, &changed, &d);
        if (ta.n_failed == 0) {
            assert_int_equal(st, LOOM_OK);
            assert_true(changed);
            break;
        }
        assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
        assert_int_equal(d.code, LOOM_STATUS_OUT_OF_MEMORY);
        assert_false(changed);
        assert_int_equal(g.n_nodes, n_before);
        assert_true(loom_ir_graph_hash(&g) == h);
        assert_int_equal(ta.live_bytes, live);
        failures++;
    }
    ta.fail_at = 0;
    assert_true(failures >= 4); /* liveness, roots/aliases, the new graph's arrays */
    /* gone: the 110 tanh nodes and the 30 chain nodes after the last output */
    assert_int_equal(g.n_nodes, n_before - 110 - 30);
    tu_verify(&g);
    loom_ir_graph_deinit(&g);
    assert_int_equal(ta.live_bytes, 0);
    assert_int_equal(ta.live_blocks, 0);
}

/* ---- pass manager ------------------------------------------------------------------------ */

typedef struct pass_log {
    char names[8][32];
    bool changed[8];
    int32_t n_nodes[8];
    int n;
} pass_log;

static void log_pass(const char *name, bool changed, const loom_ir_graph *g, void *ud) {
    pass_log *log = ud;
    assert_true(log->n < 8);
    snprintf(log->names[log->n], sizeof log->names[0], "%s", name);
    log->changed[log->n] = changed;
    log->n_nodes[log->n] = g->n_nodes;
    log->n++;
}

/* Test passes. Each appends its letter to a trace so the order can be checked. */
static char trace[64];

static void trace_add(char c) {
    size_t n = strlen(trace);
    assert_true(n + 1 < sizeof trace);
    trace[n] = c;
    trace[n + 1] = '\0';
}

static loom_status nop_run(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d) {
    (void)g;
    (void)d;
    trace_add('n');
    *out_changed = false;
    return LOOM_OK;
}

/* Appends a neg of the last output and makes it the output: a valid change. */
static loom_status grow_run(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d) {
    trace_add('g');
    int32_t last = g->outputs[g->n_outputs - 1].node;
    int32_t id;
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_NEG, .n_inputs = 1, .inputs = &last};
    loom_status st = loom_ir_graph_add(g, &desc, &id, d);
    if (st != LOOM_OK)
        return st;
    g->outputs[g->n_outputs - 1].node = id;
    *out_changed = true;
    return LOOM_OK;
}

/* Breaks the graph without saying so: the first output's declared shape no longer matches
 * what its operands give. */
static loom_status break_run(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d) {
    (void)d;
    trace_add('b');
    g->nodes[g->outputs[0].node].shape[0] += 1;
    *out_changed = true;
    return LOOM_OK;
}

static loom_status fail_run(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d) {
    (void)g;
    trace_add('f');
    *out_changed = false;
    return loom_ir_diag_set(d, LOOM_STATUS_UNSUPPORTED, "cannot handle %s nodes", "conv");
}

static const loom_pass nop_pass = {.name = "nop", .run = nop_run};
static const loom_pass grow_pass = {.name = "grow", .run = grow_run};
static const loom_pass break_pass = {.name = "break-types", .run = break_run};
static const loom_pass fail_pass = {.name = "lower-conv", .run = fail_run};

static void test_pipeline_runs_passes_in_order_and_reports_each(void **state) {
    (void)state;
    loom_ir_graph g;
    build_with_dead_nodes(&g);
    trace[0] = '\0';
    pass_log log = {0};
    loom_pass_options opts = {.verify_each = true, .after_pass = log_pass, .ud = &log};
    const loom_pass *const passes[] = {&nop_pass, &loom_pass_dce, &grow_pass, &loom_pass_dce,
                                       &nop_pass};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_pass_run_pipeline(&g, passes, 5, &opts, &d), LOOM_OK);
    assert_int_equal(d.code, LOOM_OK);
    assert_string_equal(trace, "ngn");
    assert_int_equal(log.n, 5);
    static const char *const want_names[] = {"nop", "dce", "grow", "dce", "nop"};
    static const bool want_changed[] = {false, true, true, false, false};
    static const int32_t want_nodes[] = {8, 5, 6, 6, 6};
    for (int i = 0; i < 5; i++) {
        assert_string_equal(log.names[i], want_names[i]);
        assert_int_equal(log.changed[i], want_changed[i]);
        assert_int_equal(log.n_nodes[i], want_nodes[i]);
    }
    assert_string_equal(node_list(&g), "input#0,input#1,neg(0),add(2 0),input#2,neg(3)");
    assert_string_equal(tu_output_list(&g), "%5");
    /* no passes, no options, no diagnostic: nothing happens */
    assert_int_equal(loom_pass_run_pipeline(&g, NULL, 0, NULL, NULL), LOOM_OK);
    assert_int_equal(g.n_nodes, 6);
    loom_ir_graph_deinit(&g);
}

static void test_pipeline_stops_at_a_failing_pass_and_names_it(void **state) {
    (void)state;
    loom_ir_graph g;
    build_with_dead_nodes(&g);
    trace[0] = '\0';
    pass_log log = {0};
    loom_pass_options opts = {.verify_each = false, .after_pass = log_pass, .ud = &log};
    const loom_pass *const passes[] = {&nop_pass, &fail_pass, &grow_pass};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_pass_run_pipeline(&g, passes, 3, &opts, &d), LOOM_STATUS_UNSUPPORTED);
    assert_int_equal(d.code, LOOM_STATUS_UNSUPPORTED);
    assert_string_equal(d.msg, "pass lower-conv: cannot handle conv nodes");
    assert_string_equal(trace, "nf"); /* grow never ran */
    assert_int_equal(log.n, 1);       /* only the passes that succeeded are reported */
    assert_string_equal(log.names[0], "nop");
    assert_int_equal(g.n_nodes, 8);
    loom_ir_graph_deinit(&g);
}

static void test_pipeline_verify_each_catches_a_pass_that_breaks_the_graph(void **state) {
    (void)state;
    loom_ir_graph g;
    build_with_dead_nodes(&g);
    trace[0] = '\0';
    pass_log log = {0};
    loom_pass_options opts = {.verify_each = true, .after_pass = log_pass, .ud = &log};
    const loom_pass *const passes[] = {&loom_pass_dce, &break_pass, &nop_pass};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_pass_run_pipeline(&g, passes, 3, &opts, &d),
                     LOOM_STATUS_VERIFY_FAILED);
    /* after dce the output is %3 = add %2, %0, now declared f32[3,3] */
    assert_string_equal(d.msg, "pass break-types: %3: declared type f32[3,3], but the operands "
                               "give f32[2,3]");
    assert_int_equal(d.node, 3);
    assert_string_equal(trace, "b");
    assert_int_equal(log.n, 1);
    assert_string_equal(log.names[0], "dce");
    loom_ir_graph_deinit(&g);

    /* without verify_each the same pipeline runs to the end: nothing checks */
    build_with_dead_nodes(&g);
    trace[0] = '\0';
    log.n = 0;
    opts.verify_each = false;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_pass_run_pipeline(&g, passes, 3, &opts, &d), LOOM_OK);
    assert_string_equal(trace, "bn");
    assert_int_equal(log.n, 3);
    assert_true(log.changed[1]);
    loom_ir_graph_deinit(&g);
}

static void test_pipeline_keeps_an_earlier_error_in_the_diagnostic(void **state) {
    (void)state;
    loom_ir_graph g;
    build_with_dead_nodes(&g);
    const loom_pass *const passes[] = {&fail_pass};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_ir_diag_set(&d, LOOM_STATUS_IO_ERROR, "earlier");
    trace[0] = '\0';
    assert_int_equal(loom_pass_run_pipeline(&g, passes, 1, NULL, &d), LOOM_STATUS_UNSUPPORTED);
    assert_int_equal(d.code, LOOM_STATUS_IO_ERROR); /* the first error wins */
    assert_string_equal(d.msg, "earlier");
    assert_int_equal(d.node, -1);
    /* a NULL diagnostic is allowed */
    assert_int_equal(loom_pass_run_pipeline(&g, passes, 1, NULL, NULL), LOOM_STATUS_UNSUPPORTED);
    loom_ir_graph_deinit(&g);
}

static void test_pass_find_knows_dce_and_nothing_else(void **state) {
    (void)state;
    const loom_pass *p = loom_pass_find("dce");
    assert_non_null(p);
    assert_true(p == &loom_pass_dce);
    assert_string_equal(p->name, "dce");
    assert_null(loom_pass_find("DCE"));
    assert_null(loom_pass_find("dc"));
    assert_null(loom_pass_find("dce "));
    assert_null(loom_pass_find(""));
    assert_null(loom_pass_find("no-such-pass"));
}

int main(void) {
    sys = loom_allocator_system();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dce_removes_dead_nodes_and_keeps_every_input),
        cmocka_unit_test(test_dce_leaves_a_clean_graph_untouched),
        cmocka_unit_test(test_dce_keeps_aliases_and_every_output),
        cmocka_unit_test(test_dce_fails_cleanly_when_memory_runs_out),
        cmocka_unit_test(test_pipeline_runs_passes_in_order_and_reports_each),
        cmocka_unit_test(test_pipeline_stops_at_a_failing_pass_and_names_it),
        cmocka_unit_test(test_pipeline_verify_each_catches_a_pass_that_breaks_the_graph),
        cmocka_unit_test(test_pipeline_keeps_an_earlier_error_in_the_diagnostic),
        cmocka_unit_test(test_pass_find_knows_dce_and_nothing_else),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
