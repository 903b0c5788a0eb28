/* Tests of common-subexpression elimination and constant folding: the exact graphs they
 * produce, and that folded values are bit-identical to what the reference interpreter
 * computes from the original graph; and of the moments pass's values (its graphs are a
 * golden test), and of index-fold's and reduce-split's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "runtime/runtime.h"
#include "test_util.h"

static loom_allocator sys;

/* ---- helpers ----------------------------------------------------------------------------- */

static void parse_with(loom_ir_graph *g, const loom_allocator *a, const char *text) {
    loom_ir_graph_init(g, a);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_ir_graph_parse(g, text, strlen(text), &d) != LOOM_OK)
        fail_msg("parse: %d:%d: %s", (int)d.line, (int)d.col, d.msg);
}

static void parse(loom_ir_graph *g, const char *text) {
    parse_with(g, &sys, text);
}

/* "input#0,constant=5:f32[2],exp(0),transpose[1 0](2)": every node with its operands (and
 * a constant's value and type, a transpose's perm), to compare whole graphs at once. */
static const char *node_list(const loom_ir_graph *g) {
    static char buf[4096];
    size_t n = 0;
    buf[0] = '\0';
    for (int32_t i = 0; i < g->n_nodes && n < sizeof buf; i++) {
        const loom_ir_node *nd = &g->nodes[i];
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", i ? "," : "",
                              loom_ir_op_name(nd->op));
        if (nd->op == LOOM_IR_OP_INPUT)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "#%lld", (long long)nd->attrs.index);
        if (nd->op == LOOM_IR_OP_CONSTANT) {
            char t[LOOM_IR_TYPE_STR_MAX];
            n += (size_t)snprintf(buf + n, sizeof buf - n, "=%.17g:%s", nd->attrs.value,
                                  loom_ir_format_type(t, sizeof t, nd->dtype, nd->rank, nd->shape));
        }
        if (nd->op == LOOM_IR_OP_TRANSPOSE)
            for (int32_t k = 0; k < nd->rank && n < sizeof buf; k++)
                n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%d", k ? " " : "[",
                                      (int)nd->attrs.perm[k]);
        if (nd->op == LOOM_IR_OP_TRANSPOSE && n < sizeof buf)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "]");
        for (int32_t k = 0; k < nd->n_inputs && n < sizeof buf; k++)
            n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%d", k ? " " : "(",
                                  (int)nd->inputs[k]);
        if (nd->n_inputs && n < sizeof buf)
            n += (size_t)snprintf(buf + n, sizeof buf - n, ")");
    }
    return buf;
}

static bool run_pass(const loom_pass *pass, loom_ir_graph *g) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    bool changed = false;
    if (pass->run(g, &changed, &d) != LOOM_OK)
        fail_msg("%s: %s", pass->name, d.msg);
    loom_ir_diag_init(&d);
    if (loom_ir_graph_verify(g, &d) != LOOM_OK)
        fail_msg("after %s: %s", pass->name, d.msg);
    return changed;
}

/* Runs g on the interpreter over seeded inputs; returns the outputs, concatenated, in a
 * malloc'd block of *out_len bytes. */
static unsigned char *run_graph(const loom_ir_graph *g, uint64_t seed, size_t *out_len) {
    void **in = calloc((size_t)g->n_graph_inputs + 1, sizeof *in);
    void **out = calloc((size_t)g->n_outputs + 1, sizeof *out);
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (n->op != LOOM_IR_OP_INPUT)
            continue;
        int64_t count = loom_ir_numel(n->rank, n->shape);
        in[n->attrs.index] = calloc(1, tu_node_bytes(n) + 1);
        for (int64_t e = 0; e < count; e++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            double v = (double)(int64_t)(seed >> 40) / (double)(1 << 22) - 2.0;
            if (e % 7 == 3)
                v = -0.0; /* the value identities are about */
            if (loom_ir_dtype_is_float(n->dtype))
                loom_ir_store_f64(in[n->attrs.index], n->dtype, e, v);
            else
                loom_ir_store_i64(in[n->attrs.index], n->dtype, e, (int64_t)(seed >> 60) - 8);
        }
    }
    size_t total = 0;
    for (int32_t o = 0; o < g->n_outputs; o++) {
        out[o] = calloc(1, tu_node_bytes(&g->nodes[g->outputs[o].node]) + 1);
        total += tu_node_bytes(&g->nodes[g->outputs[o].node]);
    }
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_rt_interp_run(g, &sys, (const void *const *)in, out, &d) != LOOM_OK)
        fail_msg("interp: %s", d.msg);
    unsigned char *all = malloc(total + 1), *at = all;
    for (int32_t o = 0; o < g->n_outputs; o++) {
        size_t b = tu_node_bytes(&g->nodes[g->outputs[o].node]);
        memcpy(at, out[o], b);
        at += b;
        free(out[o]);
    }
    for (int32_t i = 0; i < g->n_graph_inputs; i++)
        free(in[i]);
    free(in);
    free(out);
    *out_len = total;
    return all;
}

static void expect_same_results(const loom_ir_graph *before, const loom_ir_graph *after) {
    for (uint64_t seed = 1; seed <= 3; seed++) {
        size_t na, nb;
        unsigned char *a = run_graph(before, seed, &na);
        unsigned char *b = run_graph(after, seed, &nb);
        assert_int_equal(na, nb);
        if (memcmp(a, b, na) != 0) {
            for (size_t i = 0; i < na; i++)
                if (a[i] != b[i])
                    fail_msg("results differ at byte %zu: %02x vs %02x (graph %s)", i, a[i], b[i],
                             node_list(after));
        }
        free(a);
        free(b);
    }
}

/* Runs pass on a copy of g, checks it computes the same bits, and returns the copy. */
static void run_checked(const loom_pass *pass, const loom_ir_graph *g, loom_ir_graph *out,
                        bool *changed) {
    loom_ir_graph_init(out, &sys);
    assert_int_equal(loom_ir_graph_copy(out, g), LOOM_OK);
    *changed = run_pass(pass, out);
    expect_same_results(g, out);
}

/* ---- cse --------------------------------------------------------------------------------- */

static void test_cse_merges_identical_nodes_and_keeps_the_first(void **state) {
    (void)state;
    loom_ir_graph g, h;
    parse(&g, "loom.graph {\n"
              "  %0 = input {index = 0} : f32[2,3]\n"
              "  %1 = exp %0 : f32[2,3] loc(\"a.c\":1)\n"
              "  %2 = exp %0 : f32[2,3] loc(\"a.c\":2)\n"
              "  %3 = neg %1 : f32[2,3]\n"
              "  %4 = neg %2 : f32[2,3]\n" /* equal once %2 is %1 */
              "  %5 = sub %3, %4 : f32[2,3]\n"
              "  %6 = input {index = 1} : f32[2,3]\n"
              "  return %5, %4 {alias = 1}, %2\n}\n");
    bool changed;
    run_checked(&loom_pass_cse, &g, &h, &changed);
    assert_true(changed);
    assert_string_equal(node_list(&h), "input#0,exp(0),neg(1),sub(2 2),input#1");
    assert_string_equal(tu_output_list(&h), "%3,%2->1,%1");
    assert_int_equal(h.nodes[1].loc.line, 1); /* the first one's location */
    assert_int_equal(h.n_graph_inputs, 2);
    /* a second run finds nothing */
    assert_false(run_pass(&loom_pass_cse, &h));
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

/* Collectives have side effects: two identical all_reduces are two collectives every rank
 * runs, and one that no output reads still runs. */
static void test_cse_and_dce_keep_every_collective(void **state) {
    (void)state;
    loom_ir_graph g, h;
    parse(&g, "loom.graph {\n"
              "  %0 = input {index = 0} : f32[2,3]\n"
              "  %1 = all_reduce %0 {reduce = sum, scale = 0.5} : f32[2,3]\n"
              "  %2 = all_reduce %0 {reduce = sum, scale = 0.5} : f32[2,3]\n"
              "  %3 = broadcast_from %0 {root = 0} : f32[2,3]\n"
              "  %4 = all_gather %0 {world = 1} : f32[2,3]\n"
              "  %5 = exp %0 : f32[2,3]\n" /* dead: dropped */
              "  %6 = neg %4 : f32[2,3]\n" /* reads a collective, but dead: dropped */
              "  return %1, %2\n}\n");
    bool changed;
    run_checked(&loom_pass_cse, &g, &h, &changed);
    assert_false(changed);
    assert_int_equal(h.n_nodes, 7);
    loom_ir_graph_deinit(&h);
    run_checked(&loom_pass_dce, &g, &h, &changed);
    assert_true(changed);
    assert_string_equal(node_list(&h),
                        "input#0,all_reduce(0),all_reduce(0),broadcast_from(0),all_gather(0)");
    assert_string_equal(tu_output_list(&h), "%1,%2");
    assert_false(run_pass(&loom_pass_dce, &h));
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

static void test_cse_merges_commutative_ops_with_swapped_operands(void **state) {
    (void)state;
    loom_ir_graph g, h;
    parse(&g, "loom.graph {\n"
              "  %0 = input {index = 0} : f32[4]\n"
              "  %1 = input {index = 1} : f32[4]\n"
              "  %2 = add %0, %1 : f32[4]\n"
              "  %3 = add %1, %0 : f32[4]\n" /* = %2 */
              "  %4 = mul %1, %0 : f32[4]\n"
              "  %5 = mul %0, %1 : f32[4]\n" /* = %4 */
              "  %6 = maximum %1, %0 : f32[4]\n"
              "  %7 = maximum %0, %1 : f32[4]\n" /* = %6 */
              "  %8 = eq %0, %1 : bool[4]\n"
              "  %9 = eq %1, %0 : bool[4]\n" /* = %8 */
              "  %10 = sub %0, %1 : f32[4]\n"
              "  %11 = sub %1, %0 : f32[4]\n" /* not commutative */
              "  %12 = lt %0, %1 : bool[4]\n"
              "  %13 = gt %1, %0 : bool[4]\n" /* the same values, another op: kept */
              "  %14 = div %1, %0 : f32[4]\n"
              "  %15 = pow %1, %0 : f32[4]\n"
              "  %16 = pow %0, %1 : f32[4]\n"
              "  return %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16\n}\n");
    bool changed;
    run_checked(&loom_pass_cse, &g, &h, &changed);
    assert_true(changed);
    assert_string_equal(node_list(&h), "input#0,input#1,add(0 1),mul(1 0),maximum(1 0),eq(0 1),"
                                       "sub(0 1),sub(1 0),lt(0 1),gt(1 0),div(1 0),pow(1 0),"
                                       "pow(0 1)");
    assert_string_equal(tu_output_list(&h), "%2,%2,%3,%3,%4,%4,%5,%5,%6,%7,%8,%9,%10,%11,%12");
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

static void test_cse_does_not_merge_different_attrs_types_or_operands(void **state) {
    (void)state;
    loom_ir_graph g, h;
    parse(&g, "loom.graph {\n"
              "  %0 = input {index = 0} : f32[2,3,4]\n"
              "  %1 = transpose %0 {perm = [1, 0, 2]} : f32[3,2,4]\n"
              "  %2 = transpose %0 {perm = [0, 2, 1]} : f32[2,4,3]\n"
              "  %3 = transpose %0 {perm = [1, 0, 2]} : f32[3,2,4]\n" /* = %1 */
              "  %4 = reduce_sum %0 {axes = [1], keepdim = false} : f32[2,4]\n"
              "  %5 = reduce_sum %0 {axes = [1], keepdim = true} : f32[2,1,4]\n"
              "  %6 = reduce_sum %0 {axes = [2], keepdim = false} : f32[2,3]\n"
              "  %7 = reduce_max %0 {axes = [1], keepdim = false} : f32[2,4]\n"
              "  %8 = reduce_sum %0 {axes = [1], keepdim = false} : f32[2,4]\n" /* = %4 */
              "  %9 = constant {value = 0} : f32[2]\n"
              "  %10 = constant {value = -0} : f32[2]\n"
              "  %11 = constant {value = 0} : f64[2]\n"
              "  %12 = constant {value = 0} : f32[3]\n"
              "  %13 = constant {value = 0} : f32[2]\n" /* = %9 */
              "  %14 = constant {value = nan} : f32[2]\n"
              "  %15 = constant {value = nan} : f32[2]\n" /* = %14 */
              "  %16 = cast %0 : f16[2,3,4]\n"
              "  %17 = cast %0 : bf16[2,3,4]\n"
              "  %18 = reshape %0 : f32[6,4]\n"
              "  %19 = reshape %0 : f32[2,12]\n"
              "  %20 = broadcast %9 : f32[3,2]\n"
              "  %21 = broadcast %9 : f32[4,2]\n"
              "  %22 = input {index = 1} : f32[2,3,4]\n"
              "  %23 = neg %22 : f32[2,3,4]\n"
              "  %24 = neg %0 : f32[2,3,4]\n"
              "  return %1, %2, %3, %4, %5, %6, %7, %8, %10, %11, %12, %13, %15, %16, %17, %18,"
              " %19, %20, %21, %23, %24\n}\n");
    bool changed;
    run_checked(&loom_pass_cse, &g, &h, &changed);
    assert_true(changed);
    /* merged: %3 into %1, %8 into %4, %13 into %9, %15 into %14 (NaN equals itself) */
    assert_int_equal(h.n_nodes, g.n_nodes - 4);
    assert_string_equal(tu_output_list(&h), "%1,%2,%1,%3,%4,%5,%6,%3,%8,%9,%10,%7,%11,%12,%13,"
                                            "%14,%15,%16,%17,%19,%20");
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

static void test_cse_compares_slice_pad_and_concat_attributes(void **state) {
    (void)state;
    loom_ir_graph g, h;
    parse(&g, "loom.graph {\n"
              "  %0 = input {index = 0} : f32[4,6]\n"
              "  %1 = slice %0 {start = [0, 1], stride = [2, 2]} : f32[2,2]\n"
              "  %2 = slice %0 {start = [1, 1], stride = [2, 2]} : f32[2,2]\n"
              "  %3 = slice %0 {start = [0, 1], stride = [2, 3]} : f32[2,2]\n"
              "  %4 = slice %0 {start = [0, 1], stride = [2, 2]} : f32[2,2]\n" /* = %1 */
              "  %5 = pad %0 {low = [1, 0], interior = [0, 0], value = 0} : f32[5,6]\n"
              "  %6 = pad %0 {low = [1, 0], interior = [0, 0], value = 1} : f32[5,6]\n"
              "  %7 = pad %0 {low = [0, 0], interior = [0, 0], value = 0} : f32[5,6]\n"
              "  %8 = pad %0 {low = [1, 0], interior = [0, 0], value = 0} : f32[5,6]\n" /* = %5 */
              "  %9 = concat %0, %0 {axis = 0} : f32[8,6]\n"
              "  %10 = concat %0, %0 {axis = 1} : f32[4,12]\n"
              "  %11 = concat %0, %0 {axis = 0} : f32[8,6]\n" /* = %9 */
              "  %12 = iota {axis = 0} : i32[4,6]\n"
              "  %13 = iota {axis = 1} : i32[4,6]\n"
              "  %14 = iota {axis = 0} : i32[4,6]\n" /* = %12 */
              "  return %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14\n}\n");
    bool changed;
    run_checked(&loom_pass_cse, &g, &h, &changed);
    assert_true(changed);
    assert_int_equal(h.n_nodes, g.n_nodes - 4);
    assert_string_equal(tu_output_list(&h), "%1,%2,%3,%1,%4,%5,%6,%4,%7,%8,%7,%9,%10,%9");
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

static void test_fold_drops_identity_slices_pads_and_single_concats(void **state) {
    (void)state;
    loom_ir_graph g, h;
    parse(&g, "loom.graph {\n"
              "  %0 = input {index = 0} : f32[4,6]\n"
              "  %1 = slice %0 {start = [0, 0], stride = [1, 1]} : f32[4,6]\n"
              "  %2 = pad %1 {low = [0, 0], interior = [0, 0], value = 3} : f32[4,6]\n"
              "  %3 = concat %2 {axis = 1} : f32[4,6]\n"
              "  %4 = constant {value = 2} : f32[4,6]\n"
              "  %5 = slice %4 {start = [1, 0], stride = [2, 3]} : f32[2,2]\n"
              "  %6 = pad %5 {low = [1, 1], interior = [1, 0], value = 2} : f32[4,3]\n"
              "  return %3, %6\n}\n");
    bool changed;
    run_checked(&loom_pass_fold, &g, &h, &changed);
    assert_true(changed);
    /* the input itself, and a constant of the pad's shape */
    assert_int_equal(h.n_nodes, 2);
    assert_int_equal(h.nodes[h.outputs[0].node].op, LOOM_IR_OP_INPUT);
    assert_int_equal(h.nodes[h.outputs[1].node].op, LOOM_IR_OP_CONSTANT);
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

static void test_cse_leaves_a_graph_without_duplicates_untouched(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_ir_graph g;
    parse_with(&g, &a,
               "loom.graph {\n"
               "  %0 = input {index = 0} : f32[4]\n"
               "  %1 = input {index = 1} : f32[4]\n" /* inputs are never merged */
               "  %2 = add %0, %1 : f32[4]\n"
               "  %3 = sub %0, %1 : f32[4]\n"
               "  return %2, %3\n}\n");
    uint64_t hash = loom_ir_graph_hash(&g);
    loom_ir_node *nodes = g.nodes;
    int64_t live = ta.live_bytes;
    assert_false(run_pass(&loom_pass_cse, &g));
    assert_true(g.nodes == nodes);
    assert_true(loom_ir_graph_hash(&g) == hash);
    assert_int_equal(ta.live_bytes, live); /* its scratch is freed */
    loom_ir_graph_deinit(&g);
    assert_int_equal(ta.live_bytes, 0);
}

/* ---- fold: constants --------------------------------------------------------------------- */

static double value_of(const loom_ir_graph *g, int32_t output) {
    const loom_ir_node *n = &g->nodes[g->outputs[output].node];
    if (n->op != LOOM_IR_OP_CONSTANT)
        fail_msg("output %d is a %s, not a constant", (int)output, loom_ir_op_name(n->op));
    return n->attrs.value;
}

static void test_fold_evaluates_ops_on_constants_as_the_interpreter_does(void **state) {
    (void)state;
    loom_ir_graph g, h;
    parse(&g, "loom.graph {\n"
              "  %0 = constant {value = 2} : f32[2]\n"
              "  %1 = constant {value = 3} : f32[2]\n"
              "  %2 = add %0, %1 : f32[2]\n" /* 5 */
              "  %3 = constant {value = 1} : f32[]\n"
              "  %4 = exp %3 : f32[]\n" /* e rounded to f32 */
              "  %5 = constant {value = 2147483647} : i32[3]\n"
              "  %6 = constant {value = 1} : i32[3]\n"
              "  %7 = add %5, %6 : i32[3]\n" /* wraps to INT32_MIN */
              "  %8 = constant {value = 0} : i32[3]\n"
              "  %9 = div %5, %8 : i32[3]\n" /* x / 0 is 0 */
              "  %10 = constant {value = -7} : i64[]\n"
              "  %11 = constant {value = 2} : i64[]\n"
              "  %12 = div %10, %11 : i64[]\n" /* toward zero: -3 */
              "  %13 = constant {value = 1} : f16[]\n"
              "  %14 = constant {value = 3} : f16[]\n"
              "  %15 = div %13, %14 : f16[]\n"         /* 1/3 in f16 */
              "  %16 = lt %13, %14 : bool[]\n"         /* true */
              "  %17 = select %16, %14, %13 : f16[]\n" /* 3 */
              "  %18 = constant {value = -1.7} : f32[]\n"
              "  %19 = cast %18 : i32[]\n" /* truncation: -1 */
              "  %20 = constant {value = inf} : bf16[]\n"
              "  %21 = isfinite %20 : bool[]\n" /* false */
              "  %22 = constant {value = 0.1} : bf16[]\n"
              "  %23 = mul %22, %22 : bf16[]\n" /* 0.1 rounded twice */
              "  %24 = constant {value = -1} : f64[]\n"
              "  %25 = sqrt %24 : f64[]\n"         /* nan */
              "  %26 = maximum %25, %24 : f64[]\n" /* nan propagates */
              "  %27 = constant {value = -0} : f32[]\n"
              "  %28 = constant {value = 0} : f32[]\n"
              "  %29 = maximum %27, %28 : f32[]\n" /* +0 is greater */
              "  %30 = cast %16 : f32[]\n"         /* bool -> 1.0 */
              "  %31 = gelu %3 : f32[]\n"
              "  return %2, %4, %7, %9, %12, %15, %17, %19, %21, %23, %26, %29, %30, %31\n}\n");
    bool changed;
    run_checked(&loom_pass_fold, &g, &h, &changed);
    assert_true(changed);
    for (int32_t i = 0; i < h.n_nodes; i++)
        assert_int_equal(h.nodes[i].op, LOOM_IR_OP_CONSTANT); /* everything folded, the rest died */
    assert_int_equal(h.n_nodes, 14);
    assert_true(value_of(&h, 0) == 5.0);
    assert_true(value_of(&h, 1) == (double)(float)exp(1.0));
    assert_true(value_of(&h, 2) == -2147483648.0);
    assert_true(value_of(&h, 3) == 0.0);
    assert_true(value_of(&h, 4) == -3.0);
    assert_true(value_of(&h, 5) == 0.333251953125); /* 0x3555 */
    assert_true(value_of(&h, 6) == 3.0);
    assert_true(value_of(&h, 7) == -1.0);
    assert_true(value_of(&h, 8) == 0.0);
    assert_true(value_of(&h, 9) == 0.010009765625); /* bf16(0.1)^2 = 0.0100097..., rounded */
    assert_true(isnan(value_of(&h, 10)));
    assert_true(value_of(&h, 11) == 0.0 && !signbit(value_of(&h, 11)));
    assert_true(value_of(&h, 12) == 1.0);
    assert_true(value_of(&h, 13) == (double)(float)(0.5 * (1.0 + erf(1.0 / M_SQRT2))));
    assert_int_equal(h.nodes[h.outputs[2].node].dtype, LOOM_DTYPE_I32);
    assert_int_equal(h.nodes[h.outputs[2].node].shape[0], 3);
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

static void test_fold_keeps_an_i64_that_a_constant_cannot_hold(void **state) {
    (void)state;
    loom_ir_graph g, h;
    parse(&g, "loom.graph {\n"
              "  %0 = constant {value = 9007199254740992} : i64[]\n" /* 2^53 */
              "  %1 = constant {value = 1} : i64[]\n"
              "  %2 = add %0, %1 : i64[]\n" /* 2^53 + 1: no double holds it */
              "  %3 = add %0, %0 : i64[]\n" /* 2^54: fine */
              "  return %2, %3\n}\n");
    bool changed;
    run_checked(&loom_pass_fold, &g, &h, &changed);
    assert_true(changed);
    assert_string_equal(node_list(&h), "constant=9007199254740992:i64[],constant=1:i64[],"
                                       "add(0 1),constant=18014398509481984:i64[]");
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

static void test_fold_turns_movement_of_a_constant_into_a_constant(void **state) {
    (void)state;
    loom_ir_graph g, h;
    parse(&g, "loom.graph {\n"
              "  %0 = constant {value = 0.25} : f32[3]\n"
              "  %1 = broadcast %0 : f32[2,3]\n"
              "  %2 = reshape %1 : f32[6]\n"
              "  %3 = transpose %1 {perm = [1, 0]} : f32[3,2]\n"
              "  %4 = input {index = 0} : f32[3,2]\n"
              "  %5 = add %3, %4 : f32[3,2]\n"
              "  return %2, %5\n}\n");
    bool changed;
    run_checked(&loom_pass_fold, &g, &h, &changed);
    assert_true(changed);
    assert_string_equal(node_list(&h), "constant=0.25:f32[6],constant=0.25:f32[3,2],input#0,"
                                       "add(1 2)");
    assert_string_equal(tu_output_list(&h), "%0,%3");
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

/* ---- fold: identities -------------------------------------------------------------------- */

static void test_fold_removes_additive_and_multiplicative_identities(void **state) {
    (void)state;
    loom_ir_graph g, h;
    parse(&g, "loom.graph {\n"
              "  %0 = input {index = 0} : f32[8]\n"
              "  %1 = constant {value = -0} : f32[8]\n"
              "  %2 = constant {value = 0} : f32[8]\n"
              "  %3 = constant {value = 1} : f32[8]\n"
              "  %4 = add %0, %1 : f32[8]\n" /* x + (-0) */
              "  %5 = add %1, %4 : f32[8]\n" /* (-0) + x */
              "  %6 = sub %5, %2 : f32[8]\n" /* x - 0 */
              "  %7 = mul %6, %3 : f32[8]\n" /* x * 1 */
              "  %8 = mul %3, %7 : f32[8]\n" /* 1 * x */
              "  %9 = div %8, %3 : f32[8]\n" /* x / 1 */
              "  %10 = input {index = 1} : i32[8]\n"
              "  %11 = constant {value = 0} : i32[8]\n"
              "  %12 = constant {value = 1} : i32[8]\n"
              "  %13 = add %10, %11 : i32[8]\n"
              "  %14 = add %11, %13 : i32[8]\n"
              "  %15 = sub %14, %11 : i32[8]\n"
              "  %16 = mul %12, %15 : i32[8]\n"
              "  %17 = div %16, %12 : i32[8]\n"
              "  %18 = mul %17, %11 : i32[8]\n" /* integers: x * 0 is 0 */
              "  %19 = neg %18 : i32[8]\n"
              "  return %9 {alias = 0}, %17, %19\n}\n");
    bool changed;
    run_checked(&loom_pass_fold, &g, &h, &changed);
    assert_true(changed);
    assert_string_equal(node_list(&h), "input#0,input#1,constant=0:i32[8]");
    assert_string_equal(tu_output_list(&h), "%0->0,%1,%2");
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

static void test_fold_keeps_float_ops_that_only_look_like_identities(void **state) {
    (void)state;
    /* -0.0 + 0.0 is +0.0, -0.0 - (-0.0) is +0.0, NaN * 0 and inf * 0 are NaN: none of these
     * is x (or 0) for every x. */
    static const char text[] = "loom.graph {\n"
                               "  %0 = input {index = 0} : f32[8]\n"
                               "  %1 = constant {value = 0} : f32[8]\n"
                               "  %2 = constant {value = -0} : f32[8]\n"
                               "  %3 = add %0, %1 : f32[8]\n"
                               "  %4 = sub %0, %2 : f32[8]\n"
                               "  %5 = mul %0, %1 : f32[8]\n"
                               "  %6 = sub %1, %0 : f32[8]\n"
                               "  %7 = constant {value = 1.0000001} : f32[8]\n"
                               "  %8 = mul %0, %7 : f32[8]\n"
                               "  %9 = constant {value = 1} : f32[8]\n"
                               "  %10 = div %9, %0 : f32[8]\n"
                               "  return %3, %4, %5, %6, %8, %10\n}\n";
    loom_ir_graph g, h;
    parse(&g, text);
    bool changed;
    run_checked(&loom_pass_fold, &g, &h, &changed);
    assert_false(changed);
    assert_true(loom_ir_graph_equal(&g, &h));
    loom_ir_graph_deinit(&h);

    /* why: with x = -0.0, x + 0.0 is +0.0 */
    float x = -0.0f, out[8];
    const void *in[1] = {(float[8]){x, x, x, x, x, x, x, x}};
    void *outs[6] = {out,           (float[8]){0}, (float[8]){0},
                     (float[8]){0}, (float[8]){0}, (float[8]){0}};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_rt_interp_run(&g, &sys, in, outs, &d), LOOM_OK);
    assert_true(out[0] == 0.0f && !signbit(out[0]));
    loom_ir_graph_deinit(&g);
}

static void test_fold_cancels_double_negation_no_op_casts_movements_and_selects(void **state) {
    (void)state;
    loom_ir_graph g, h;
    parse(&g, "loom.graph {\n"
              "  %0 = input {index = 0} : f32[2,3]\n"
              "  %1 = neg %0 : f32[2,3]\n"
              "  %2 = neg %1 : f32[2,3]\n"                       /* x */
              "  %3 = cast %2 : f32[2,3]\n"                      /* x */
              "  %4 = broadcast %3 : f32[2,3]\n"                 /* x */
              "  %5 = reshape %4 : f32[2,3]\n"                   /* x */
              "  %6 = transpose %5 {perm = [0, 1]} : f32[2,3]\n" /* x */
              "  %7 = cast %6 : f64[2,3]\n"                      /* a real cast: kept */
              "  %8 = neg %7 : f64[2,3]\n"
              "  %9 = input {index = 1} : i64[5]\n"
              "  %10 = neg %9 : i64[5]\n"
              "  %11 = neg %10 : i64[5]\n" /* integers too */
              "  %12 = constant {value = 1} : bool[2,3]\n"
              "  %13 = constant {value = 0} : bool[2,3]\n"
              "  %14 = exp %0 : f32[2,3]\n"
              "  %15 = select %12, %14, %0 : f32[2,3]\n" /* exp x */
              "  %16 = select %13, %14, %0 : f32[2,3]\n" /* x */
              "  return %8, %6, %11, %15, %16\n}\n");
    bool changed;
    run_checked(&loom_pass_fold, &g, &h, &changed);
    assert_true(changed);
    assert_string_equal(node_list(&h), "input#0,cast(0),neg(1),input#1,exp(0)");
    assert_string_equal(tu_output_list(&h), "%2,%0,%3,%4,%0");
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

static void test_fold_composes_reshapes_broadcasts_and_transposes(void **state) {
    (void)state;
    loom_ir_graph g, h;
    parse(&g, "loom.graph {\n"
              "  %0 = input {index = 0} : f32[2,3,4]\n"
              "  %1 = reshape %0 : f32[6,4]\n"
              "  %2 = reshape %1 : f32[24]\n"    /* reshape(x) */
              "  %3 = reshape %2 : f32[2,3,4]\n" /* x */
              "  %4 = transpose %0 {perm = [1, 2, 0]} : f32[3,4,2]\n"
              "  %5 = transpose %4 {perm = [2, 0, 1]} : f32[2,3,4]\n" /* the inverse: x */
              "  %6 = transpose %4 {perm = [1, 0, 2]} : f32[4,3,2]\n" /* one transpose */
              "  %7 = transpose %6 {perm = [0, 2, 1]} : f32[4,2,3]\n" /* and again */
              "  %8 = input {index = 1} : f32[4]\n"
              "  %9 = broadcast %8 : f32[3,4]\n"
              "  %10 = broadcast %9 : f32[2,3,4]\n" /* broadcast(y) */
              "  %11 = add %10, %5 : f32[2,3,4]\n"
              "  %12 = add %11, %3 : f32[2,3,4]\n"
              "  return %2, %12, %7\n}\n");
    bool changed;
    run_checked(&loom_pass_fold, &g, &h, &changed);
    assert_true(changed);
    /* %6: axis j of it is axis [1,0,2][j] of %4, which is axis [1,2,0] of that in x:
     * [2,1,0]; %7 then [2,1,0][[0,2,1][j]] = [2,0,1] */
    assert_string_equal(node_list(&h), "input#0,reshape(0),transpose[2 0 1](0),input#1,"
                                       "broadcast(3),add(4 0),add(5 0)");
    assert_string_equal(tu_output_list(&h), "%1,%6,%2");
    assert_int_equal(h.nodes[1].rank, 1);
    assert_int_equal(h.nodes[1].shape[0], 24);
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

static void test_fold_collapses_chains_in_one_run_and_drops_what_died(void **state) {
    (void)state;
    loom_ir_graph g, h;
    parse(&g, "loom.graph {\n"
              "  %0 = input {index = 0} : f32[4]\n"
              "  %1 = input {index = 1} : f32[4]\n" /* unused: inputs stay */
              "  %2 = constant {value = 0.5} : f32[]\n"
              "  %3 = constant {value = 1.5} : f32[]\n"
              "  %4 = add %2, %3 : f32[]\n"
              "  %5 = log %4 : f32[]\n"
              "  %6 = exp %5 : f32[]\n"
              "  %7 = broadcast %6 : f32[4]\n"
              "  %8 = mul %0, %7 : f32[4]\n"
              "  %9 = constant {value = 0.5} : f32[4]\n"
              "  %10 = mul %9, %7 : f32[4]\n"
              "  %11 = mul %8, %10 : f32[4]\n"
              "  return %11\n}\n");
    bool changed;
    run_checked(&loom_pass_fold, &g, &h, &changed);
    assert_true(changed);
    /* exp(log(2)) rounds to 2 in f32, so 0.5 * 2 is 1 and the last mul folds away too */
    assert_string_equal(node_list(&h), "input#0,input#1,constant=2:f32[4],mul(0 2)");
    assert_string_equal(tu_output_list(&h), "%3");
    assert_false(run_pass(&loom_pass_fold, &h)); /* nothing left */
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

static void test_fold_cancels_a_transpose_pair_around_an_activation(void **state) {
    (void)state;
    loom_ir_graph g, h;
    parse(&g, "loom.graph {\n"
              "  %0 = input {index = 0} : f32[2,3,4]\n"
              "  %1 = transpose %0 {perm = [1, 0, 2]} : f32[3,2,4]\n"
              "  %2 = relu %1 : f32[3,2,4]\n"
              "  %3 = transpose %2 {perm = [1, 0, 2]} : f32[2,3,4]\n" /* relu(x) */
              "  %4 = transpose %0 {perm = [1, 2, 0]} : f32[3,4,2]\n"
              "  %5 = exp %4 : f32[3,4,2]\n"
              "  %6 = transpose %5 {perm = [1, 2, 0]} : f32[4,2,3]\n" /* not the inverse */
              "  return %3, %6\n}\n");
    bool changed;
    run_checked(&loom_pass_fold, &g, &h, &changed);
    assert_true(changed);
    assert_string_equal(node_list(&h),
                        "input#0,relu(0),transpose[1 2 0](0),exp(2),transpose[1 2 0](3)");
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

static void test_fold_leaves_a_graph_with_nothing_to_fold_untouched(void **state) {
    (void)state;
    test_alloc ta = {0};
    loom_allocator a = test_alloc_make(&ta);
    loom_ir_graph g;
    parse_with(&g, &a,
               "loom.graph {\n"
               "  %0 = input {index = 0} : f32[4,4]\n"
               "  %1 = constant {value = 2} : f32[4,4]\n"
               "  %2 = mul %0, %1 : f32[4,4]\n"
               "  %3 = transpose %2 {perm = [1, 0]} : f32[4,4]\n"
               "  %4 = neg %3 : f32[4,4]\n"
               "  return %4\n}\n");
    int64_t allocs = ta.n_allocs;
    loom_ir_node *nodes = g.nodes;
    assert_false(run_pass(&loom_pass_fold, &g));
    assert_int_equal(ta.n_allocs, allocs); /* the dry run allocates nothing */
    assert_true(g.nodes == nodes);
    loom_ir_graph_deinit(&g);
    assert_int_equal(ta.live_bytes, 0);
}

/* ---- fold: every op, every dtype, against the interpreter ---------------------------------- */

static void test_fold_matches_the_interpreter_for_every_elementwise_op(void **state) {
    (void)state;
    static const double values[] = {0.0,       -0.0, 1.0,     -1.0, 2.5,
                                    -3.75,     0.1,  1e30,    -7.0, INFINITY,
                                    -INFINITY, NAN,  65504.0, 3e-8, 2147483647.0};
    enum { N_VALUES = sizeof values / sizeof values[0] };
    static const loom_dtype dtypes[] = {LOOM_DTYPE_F32, LOOM_DTYPE_F16, LOOM_DTYPE_BF16,
                                        LOOM_DTYPE_F64, LOOM_DTYPE_I32, LOOM_DTYPE_I64,
                                        LOOM_DTYPE_BOOL};
    int folded = 0, kept = 0;
    for (int op = 0; op < LOOM_IR_OP_COUNT_; op++) {
        const loom_ir_op_info *info = &loom_ir_op_table[op];
        if (!loom_ir_op_is_elementwise((loom_ir_op)op))
            continue;
        for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++) {
            loom_dtype dt = dtypes[t];
            bool is_select = loom_ir_kind_table[info->kind].cond_first;
            if (!is_select && !loom_ir_dtype_in_class(dt, info->dtypes))
                continue;
            /* one graph per (op, dtype): every value (pair) as one output */
            loom_ir_graph g;
            loom_ir_graph_init(&g, &sys);
            int32_t c[N_VALUES];
            loom_ir_diag d;
            loom_ir_diag_init(&d);
            for (int v = 0; v < N_VALUES; v++) {
                loom_ir_node_desc cd = {.op = LOOM_IR_OP_CONSTANT,
                                        .dtype = dt,
                                        .rank = 1,
                                        .shape = (int64_t[]){2},
                                        .attrs.value = values[v]};
                assert_int_equal(loom_ir_graph_add(&g, &cd, &c[v], &d), LOOM_OK);
            }
            int32_t cond[2];
            for (int b = 0; b < 2; b++) {
                loom_ir_node_desc cd = {.op = LOOM_IR_OP_CONSTANT,
                                        .dtype = LOOM_DTYPE_BOOL,
                                        .rank = 1,
                                        .shape = (int64_t[]){2},
                                        .attrs.value = b};
                assert_int_equal(loom_ir_graph_add(&g, &cd, &cond[b], &d), LOOM_OK);
            }
            for (int v = 0; v < N_VALUES; v++) {
                for (int w = 0; w < (info->arity == 1 ? 1 : N_VALUES); w++) {
                    int32_t ins[3] = {c[v], c[w], c[v]};
                    if (is_select) {
                        ins[0] = cond[(v + w) % 2];
                        ins[1] = c[v];
                        ins[2] = c[w];
                    }
                    loom_ir_node_desc nd = {.op = (loom_ir_op)op,
                                            .n_inputs = info->arity,
                                            .inputs = ins,
                                            .dtype = LOOM_DTYPE_F32};
                    int32_t id;
                    if (info->kind == LOOM_IR_KIND_CAST) /* cast to every dtype */
                        for (size_t u = 0; u < sizeof dtypes / sizeof dtypes[0]; u++) {
                            nd.dtype = dtypes[u];
                            assert_int_equal(loom_ir_graph_add(&g, &nd, &id, &d), LOOM_OK);
                            assert_int_equal(loom_ir_graph_add_output(&g, id, -1), LOOM_OK);
                        }
                    else {
                        if (loom_ir_graph_add(&g, &nd, &id, &d) != LOOM_OK)
                            fail_msg("%s %s: %s", info->name, loom_dtype_name(dt), d.msg);
                        assert_int_equal(loom_ir_graph_add_output(&g, id, -1), LOOM_OK);
                    }
                }
            }
            loom_ir_graph h;
            bool changed;
            run_checked(&loom_pass_fold, &g, &h, &changed);
            assert_true(changed);
            for (int32_t o = 0; o < h.n_outputs; o++) {
                const loom_ir_node *n = &h.nodes[h.outputs[o].node];
                if (n->op == LOOM_IR_OP_CONSTANT) {
                    folded++;
                    continue;
                }
                kept++;
                if (n->dtype != LOOM_DTYPE_I64)
                    fail_msg("%s on %s was not folded to a %s constant", info->name,
                             loom_dtype_name(dt), loom_dtype_name(n->dtype));
            }
            loom_ir_graph_deinit(&h);
            loom_ir_graph_deinit(&g);
        }
    }
    /* only i64 results beyond 2^53 stay unfolded */
    print_message("# %d values folded, %d kept\n", folded, kept);
    assert_true(folded > 10000);
    assert_true(kept < folded / 50);
}

/* ---- out of memory ------------------------------------------------------------------------- */

static void oom_sweep(const loom_pass *pass, const char *text, int min_failures) {
    int failures = 0;
    for (int64_t k = 1;; k++) {
        test_alloc ta = {0};
        loom_allocator a = test_alloc_make(&ta);
        loom_ir_graph g;
        parse_with(&g, &a, text);
        uint64_t hash = loom_ir_graph_hash(&g);
        ta.fail_at = ta.n_allocs + k;
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        bool changed = true;
        loom_status st = pass->run(&g, &changed, &d);
        ta.fail_at = 0;
        if (ta.n_failed == 0) {
            assert_int_equal(st, LOOM_OK);
            assert_true(changed);
            loom_ir_graph_deinit(&g);
            assert_int_equal(ta.live_bytes, 0);
            break;
        }
        assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
        assert_int_equal(d.code, LOOM_STATUS_OUT_OF_MEMORY);
        assert_false(changed);
        assert_true(loom_ir_graph_hash(&g) == hash); /* untouched */
        loom_ir_graph_deinit(&g);
        assert_int_equal(ta.live_bytes, 0);
        assert_int_equal(ta.live_blocks, 0);
        failures++;
    }
    assert_true(failures >= min_failures);
}

static void test_cse_and_fold_fail_cleanly_when_memory_runs_out(void **state) {
    (void)state;
    static const char text[] = "loom.graph {\n"
                               "  %0 = input {index = 0} : f32[4] loc(\"m.c\":1)\n"
                               "  %1 = exp %0 : f32[4] loc(\"m.c\":2)\n"
                               "  %2 = exp %0 : f32[4] loc(\"n.c\":3)\n"
                               "  %3 = constant {value = 1} : f32[4]\n"
                               "  %4 = mul %1, %3 : f32[4] loc(\"o.c\":4)\n"
                               "  %5 = add %4, %2 : f32[4] loc(\"p.c\":5)\n"
                               "  %6 = constant {value = 2} : f32[4]\n"
                               "  %7 = neg %6 : f32[4]\n"
                               "  %8 = mul %5, %7 : f32[4]\n"
                               "  %9 = exp %8 : f32[4]\n"
                               "  return %9, %2\n}\n";
    oom_sweep(&loom_pass_cse, text, 3);  /* scratch, the new graph's nodes, arena chunk */
    oom_sweep(&loom_pass_fold, text, 4); /* map, nodes, arena, outputs, dce's rebuild */
}

/* The moments pass computes batch norm's statistics from the f64 sums of x and x^2: the
 * mean stays bit for bit, and the variance, where the mean is 600 times the deviation
 * (values 1000 + [-2, 2), so that s2 - s1^2 cancels 5.7 decimal digits), within 2^-22 of
 * the two-pass variance the interpreter computes. Over batch norm's axes, and layer norm's
 * (the last). */
static void test_moments_keep_the_mean_and_the_variance_within_rounding(void **state) {
    (void)state;
    static const char *const axes[] = {"[0, 2, 3]", "[3]"};
    static const char *const kept[] = {"[1,3,1,1]", "[4,3,5,1]"};
    for (int a = 0; a < 2; a++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "loom.graph {\n"
                 "  %%x = input {index = 0} : f32[4,3,5,6]\n"
                 "  %%c = constant {value = 1000.0} : f32[4,3,5,6]\n"
                 "  %%y = add %%x, %%c : f32[4,3,5,6]\n"
                 "  %%m = reduce_mean %%y {axes = %s, keepdim = true} : f32%s\n"
                 "  %%b = broadcast %%m : f32[4,3,5,6]\n"
                 "  %%d = sub %%y, %%b : f32[4,3,5,6]\n"
                 "  %%q = mul %%d, %%d : f32[4,3,5,6]\n"
                 "  %%v = reduce_mean %%q {axes = %s, keepdim = true} : f32%s\n"
                 "  return %%m, %%v\n"
                 "}\n",
                 axes[a], kept[a], axes[a], kept[a]);
        loom_ir_graph before, after;
        parse(&before, text);
        parse(&after, text);
        assert_true(run_pass(&loom_pass_moments, &after));
        assert_true(run_pass(&loom_pass_dce, &after));
        int32_t f64_means = 0;
        for (int32_t i = 0; i < after.n_nodes; i++)
            f64_means += after.nodes[i].op == LOOM_IR_OP_REDUCE_MEAN &&
                         after.nodes[i].dtype == LOOM_DTYPE_F64;
        assert_int_equal(f64_means, 2);
        int64_t n = loom_ir_numel(before.nodes[3].rank, before.nodes[3].shape);
        for (uint64_t seed = 1; seed <= 3; seed++) {
            size_t na, nb;
            float *x = (float *)run_graph(&before, seed, &na);
            float *y = (float *)run_graph(&after, seed, &nb);
            assert_int_equal(na, nb);
            assert_memory_equal(x, y, (size_t)n * sizeof(float)); /* the means */
            for (int64_t i = n; i < 2 * n; i++)
                if (!(fabsf(x[i] - y[i]) <= 0x1p-22f * x[i]) || !(x[i] > 0.01f))
                    fail_msg("axes %s: variance %lld: two passes %.9g, moments %.9g", axes[a],
                             (long long)(i - n), x[i], y[i]);
            free(x);
            free(y);
        }
        loom_ir_graph_deinit(&before);
        loom_ir_graph_deinit(&after);
    }
}

/* Runs both graphs on the interpreter over seeds 1..n_seeds: their f32 outputs are equal
 * bit for bit in the first `exact` bytes, then within tol * (floor + |before's|). */
static void expect_f32_results(const loom_ir_graph *before, const loom_ir_graph *after,
                               int n_seeds, size_t exact, float tol, float floor) {
    for (uint64_t seed = 1; seed <= (uint64_t)n_seeds; seed++) {
        size_t na, nb;
        float *x = (float *)run_graph(before, seed, &na);
        float *y = (float *)run_graph(after, seed, &nb);
        assert_int_equal(na, nb);
        assert_memory_equal(x, y, exact);
        for (size_t k = exact / sizeof(float); k < na / sizeof(float); k++)
            if (!(fabsf(x[k] - y[k]) <= tol * (floor + fabsf(x[k]))))
                fail_msg("seed %llu: element %zu: before %.9g, after %.9g",
                         (unsigned long long)seed, k, x[k], y[k]);
        free(x);
        free(y);
    }
}

/* Index-fold gives the values the unfolded graph gives: bit for bit where a gather moves to
 * the leaves of its chain (cross-entropy's forward: a log-softmax read at the label), within
 * float rounding where a scatter into zeros folds into its add (it adds in another order):
 * cross-entropy's backward and a tied embedding table's gradient. The indices (the seeded
 * inputs, -8..7) repeat and fall out of range, clamped. */
static void test_index_fold_keeps_the_values(void **state) {
    (void)state;
    static const char text[] = "loom.graph {\n"
                               "  %l = input {index = 6} : f32[4,3,9]\n"
                               "  %li = input {index = 7} : i32[4,3,2]\n"
                               "  %mx = reduce_max %l {axes = [2], keepdim = true} : f32[4,3,1]\n"
                               "  %mxb = broadcast %mx : f32[4,3,9]\n"
                               "  %z0 = sub %l, %mxb : f32[4,3,9]\n"
                               "  %ez = exp %z0 : f32[4,3,9]\n"
                               "  %se = reduce_sum %ez {axes = [2], keepdim = true} : f32[4,3,1]\n"
                               "  %lse = log %se : f32[4,3,1]\n"
                               "  %lsb = broadcast %lse : f32[4,3,9]\n"
                               "  %ls = sub %z0, %lsb : f32[4,3,9]\n"
                               "  %pk = gather %ls, %li {axis = 2} : f32[4,3,2]\n"
                               "  %x = input {index = 0} : f32[4,3,9]\n"
                               "  %i = input {index = 1} : i64[4,3,2]\n"
                               "  %u = input {index = 2} : f32[4,3,2]\n"
                               "  %z = constant {value = 0} : f32[4,3,9]\n"
                               "  %s = scatter_add %z, %i, %u {axis = 2} : f32[4,3,9]\n"
                               "  %r = reduce_sum %s {axes = [0, 2], keepdim = true} : f32[1,3,1]\n"
                               "  %b = broadcast %r : f32[4,3,9]\n"
                               "  %e = mul %b, %x : f32[4,3,9]\n"
                               "  %g = add %s, %e : f32[4,3,9]\n"
                               "  %t = input {index = 3} : f32[7,5]\n"
                               "  %ti = input {index = 4} : i32[16,5]\n"
                               "  %tu = input {index = 5} : f32[16,5]\n"
                               "  %tz = constant {value = 0} : f32[7,5]\n"
                               "  %ts = scatter_add %tz, %ti, %tu {axis = 0} : f32[7,5]\n"
                               "  %tg = add %t, %ts : f32[7,5]\n"
                               "  return %pk, %g, %tg\n"
                               "}\n";
    loom_ir_graph before, after;
    parse(&before, text);
    parse(&after, text);
    assert_true(run_pass(&loom_pass_index_fold, &after));
    int32_t scatters = 0, adds = 0, zeros = 0, wide_subs = 0;
    for (int32_t i = 0; i < after.n_nodes; i++) {
        const loom_ir_node *n = &after.nodes[i];
        scatters += n->op == LOOM_IR_OP_SCATTER_ADD;
        adds += n->op == LOOM_IR_OP_ADD;
        zeros += n->op == LOOM_IR_OP_CONSTANT;
        wide_subs += n->op == LOOM_IR_OP_SUB && n->shape[n->rank - 1] == 9;
    }
    assert_int_equal(scatters, 2);
    assert_int_equal(adds, 0);
    assert_int_equal(zeros, 0);
    assert_int_equal(wide_subs, 1); /* x - max, for the sum; the log-softmax died */
    expect_f32_results(&before, &after, 4, 4 * 3 * 2 * sizeof(float), 1e-5f, 1.0f);
    loom_ir_graph_deinit(&before);
    loom_ir_graph_deinit(&after);
    oom_sweep(&loom_pass_index_fold, text, 4); /* uses, map, nodes, outputs, dce's rebuild */
}

/* Reduce-split's two f64 sums give the single f64 sum's f32 result within one rounding: a
 * gradient's sum of squares over [128, 8192] and a keepdim sum over [1024, 2, 1024]. */
static void test_reduce_split_keeps_the_sums(void **state) {
    (void)state;
    static const char text[] = "loom.graph {\n"
                               "  %g = input {index = 0} : f32[128,8192]\n"
                               "  %g2 = mul %g, %g : f32[128,8192]\n"
                               "  %n = reduce_sum %g2 {axes = [0, 1], keepdim = false} : f32[]\n"
                               "  %x = input {index = 1} : f32[1024,2,1024]\n"
                               "  %k = reduce_sum %x {axes = [0, 2], keepdim = true} : f32[1,2,1]\n"
                               "  return %n, %k\n"
                               "}\n";
    loom_ir_graph before, after;
    parse(&before, text);
    parse(&after, text);
    assert_true(run_pass(&loom_pass_reduce_split, &after));
    int32_t f64_sums = 0;
    for (int32_t i = 0; i < after.n_nodes; i++)
        f64_sums +=
            after.nodes[i].op == LOOM_IR_OP_REDUCE_SUM && after.nodes[i].dtype == LOOM_DTYPE_F64;
    assert_int_equal(f64_sums, 4);
    expect_f32_results(&before, &after, 2, 0, 0x1p-23f, 0.0f);
    loom_ir_graph_deinit(&before);
    loom_ir_graph_deinit(&after);
    oom_sweep(&loom_pass_reduce_split, text, 3); /* map, nodes, outputs */
}

int main(void) {
    sys = loom_allocator_system();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cse_merges_identical_nodes_and_keeps_the_first),
        cmocka_unit_test(test_cse_and_dce_keep_every_collective),
        cmocka_unit_test(test_cse_merges_commutative_ops_with_swapped_operands),
        cmocka_unit_test(test_cse_does_not_merge_different_attrs_types_or_operands),
        cmocka_unit_test(test_cse_leaves_a_graph_without_duplicates_untouched),
        cmocka_unit_test(test_fold_evaluates_ops_on_constants_as_the_interpreter_does),
        cmocka_unit_test(test_fold_keeps_an_i64_that_a_constant_cannot_hold),
        cmocka_unit_test(test_fold_turns_movement_of_a_constant_into_a_constant),
        cmocka_unit_test(test_fold_removes_additive_and_multiplicative_identities),
        cmocka_unit_test(test_fold_keeps_float_ops_that_only_look_like_identities),
        cmocka_unit_test(test_fold_cancels_double_negation_no_op_casts_movements_and_selects),
        cmocka_unit_test(test_fold_composes_reshapes_broadcasts_and_transposes),
        cmocka_unit_test(test_fold_collapses_chains_in_one_run_and_drops_what_died),
        cmocka_unit_test(test_fold_cancels_a_transpose_pair_around_an_activation),
        cmocka_unit_test(test_fold_leaves_a_graph_with_nothing_to_fold_untouched),
        cmocka_unit_test(test_fold_matches_the_interpreter_for_every_elementwise_op),
        cmocka_unit_test(test_cse_and_fold_fail_cleanly_when_memory_runs_out),
        cmocka_unit_test(test_cse_compares_slice_pad_and_concat_attributes),
        cmocka_unit_test(test_fold_drops_identity_slices_pads_and_single_concats),
        cmocka_unit_test(test_moments_keep_the_mean_and_the_variance_within_rounding),
        cmocka_unit_test(test_index_fold_keeps_the_values),
        cmocka_unit_test(test_reduce_split_keeps_the_sums),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
