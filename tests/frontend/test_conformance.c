/* Conformance: every op of ops.def, on random shapes (odd sizes, size-1 and broadcast
 * dimensions, sizes that are not multiples of the vector width), through the reference
 * interpreter and through the JIT (passes -> plan -> codegen -> program), compared with
 * per-op tolerances. Then random fused DAGs, the same way. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "frontend/frontend.h"
#include "targets/targets.h"
#include "ir/samples.h"
#include "runtime/kernel.h"

/* ---- deterministic randomness ------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    return loom_ir_sample_next(&rng_state);
}
static int64_t rnd_int(int64_t lo, int64_t hi) {
    return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1));
}
static int64_t rnd_extent(void) {
    static const int64_t e[] = {1, 2, 3, 5, 7, 8, 16, 17, 31, 33, 64, 100};
    return e[rnd() % (sizeof e / sizeof e[0])];
}

/* ---- harness ------------------------------------------------------------------------------ */

static tu_runtime H;

static int setup(void **state) {
    (void)state;
    return tu_runtime_setup(&H);
}

static int teardown(void **state) {
    (void)state;
    tu_runtime_teardown(&H);
    return 0;
}

static void print_to_stderr(const char *chunk, size_t len, void *ud) {
    (void)ud;
    fwrite(chunk, 1, len, stderr);
}

/* Runs g through the interpreter and the JIT on the same random inputs and compares. */
static void check_graph(const loom_ir_graph *g, const loom_ir_sample *s, const char *what) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_tg_check_against_ref(g, s, &rng_state, H.pool, H.dev, &H.metrics, &d) != LOOM_OK) {
        /* the graph, for `loom-ir run --check` */
        fprintf(stderr, "%s: the graph:\n", what);
        loom_ir_graph_print(g, print_to_stderr, NULL);
        fail_msg("%s: %s", what, d.msg);
    }
}

/* ---- per-op cases (ir/samples.c builds them) ------------------------------------------- */

/* Collectives on one rank: the interpreter gives the operand (times the all-reduce's scale,
 * as one rounding of the exact product), and the JIT (which runs them on the host, through
 * the same code) gives exactly the interpreter's values. */
static void check_collective(const loom_ir_graph *g, const char *what) {
    const loom_ir_node *n = &g->nodes[g->outputs[0].node], *x = &g->nodes[n->inputs[0]];
    int64_t count = loom_ir_numel(x->rank, x->shape);
    void *in = calloc(1, tu_node_bytes(x) + 1), *out = calloc(1, tu_node_bytes(n) + 1);
    loom_ir_sample_fill(in, x->dtype, count, -4, 4, &rng_state);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_rt_interp_run(g, &H.alloc, (const void *const[]){in}, (void *const[]){out}, &d) !=
        LOOM_OK)
        fail_msg("%s: interpreter: %s", what, d.msg);
    double scale = n->op == LOOM_IR_OP_ALL_REDUCE ? n->attrs.value : 1.0;
    for (int64_t i = 0; i < count; i++) {
        double w = loom_ir_load_f64(in, x->dtype, i) * scale;
        if (!loom_ir_dtype_is_float(x->dtype))
            w = (double)loom_ir_load_i64(in, x->dtype, i);
        char one[8];
        loom_ir_store_f64(one, n->dtype, 0, w); /* the dtype's rounding of the exact value */
        double want = loom_ir_load_f64(one, n->dtype, 0), got = loom_ir_load_f64(out, n->dtype, i);
        if (want != got)
            fail_msg("%s: element %lld: interpreter %.17g, expected %.17g", what, (long long)i, got,
                     want);
    }
    free(in);
    free(out);
    check_graph(g, &(loom_ir_sample){.lo = -4, .hi = 4}, what);
}

static void test_every_op_matches_the_interpreter_on_random_shapes(void **state) {
    (void)state;
    int cases = 0;
    for (int op = 0; op < LOOM_IR_OP_COUNT_; op++) {
        for (int t = 0; t < LOOM_IR_SAMPLE_N_DTYPES; t++) {
            loom_dtype dt = loom_ir_sample_dtypes[t];
            if (!loom_ir_op_accepts((loom_ir_op)op, dt))
                continue;
            int reps = dt == LOOM_DTYPE_F32 ? 6 : 2;
            for (int rep = 0; rep < reps; rep++) {
                loom_ir_graph g;
                loom_ir_graph_init(&g, &H.alloc);
                loom_ir_diag d;
                loom_ir_diag_init(&d);
                loom_ir_sample s;
                if (loom_ir_sample_build(&g, (loom_ir_op)op, dt, false, &rng_state, &s, &d) !=
                    LOOM_OK)
                    fail_msg("sampling %s %s: %s", loom_ir_op_name((loom_ir_op)op),
                             loom_dtype_name(dt), d.msg);
                char what[96];
                snprintf(what, sizeof what, "%s %s case %d", loom_ir_op_name((loom_ir_op)op),
                         loom_dtype_name(dt), rep);
                if (loom_ir_op_traits((loom_ir_op)op)->ranks)
                    check_collective(&g, what);
                else
                    check_graph(&g, &s, what);
                loom_ir_graph_deinit(&g);
                cases++;
            }
        }
    }
    assert_true(cases > 150);
}

/* ---- random fused graphs ------------------------------------------------------------------ */

/* A random DAG over one shape family: elementwise chains with broadcasts, reductions
 * feeding epilogues, matmuls with epilogues, several outputs. */
static void build_random_dag(loom_ir_graph *g, int n_ops) {
    int64_t m = rnd_extent(), n = rnd_extent();
    int64_t mn[2] = {m, n}, row[2] = {1, n}, col[2] = {m, 1};
    int32_t vals[256];
    int32_t n_vals = 0;
    vals[n_vals++] = tu_input(g, LOOM_DTYPE_F32, 2, mn);
    vals[n_vals++] = tu_input(g, LOOM_DTYPE_F32, 2, mn);
    int32_t r = tu_input(g, LOOM_DTYPE_F32, 2, row);
    vals[n_vals++] =
        tu_add(g, LOOM_IR_OP_BROADCAST, 1, &r, LOOM_DTYPE_F32, 2, mn, (loom_ir_attrs){0});
    static const loom_ir_op unary[] = {LOOM_IR_OP_NEG, LOOM_IR_OP_ABS, LOOM_IR_OP_TANH,
                                       LOOM_IR_OP_SIGMOID, LOOM_IR_OP_RELU, LOOM_IR_OP_EXP};
    static const loom_ir_op binary[] = {LOOM_IR_OP_ADD, LOOM_IR_OP_SUB, LOOM_IR_OP_MUL,
                                        LOOM_IR_OP_MAXIMUM, LOOM_IR_OP_MINIMUM};
    for (int i = 0; i < n_ops && n_vals < 250; i++) {
        int32_t a = vals[rnd() % (uint64_t)n_vals], b = vals[rnd() % (uint64_t)n_vals];
        int32_t v;
        switch (rnd() % 6) {
        case 0: {
            loom_ir_op op = unary[rnd() % (sizeof unary / sizeof unary[0])];
            if (op == LOOM_IR_OP_EXP) { /* keep values bounded */
                a = tu_add(g, LOOM_IR_OP_TANH, 1, &a, LOOM_DTYPE_F32, 0, NULL, (loom_ir_attrs){0});
            }
            v = tu_add(g, op, 1, &a, LOOM_DTYPE_F32, 0, NULL, (loom_ir_attrs){0});
            break;
        }
        case 1:
        case 2: {
            int32_t in[2] = {a, b};
            v = tu_add(g, binary[rnd() % (sizeof binary / sizeof binary[0])], 2, in, LOOM_DTYPE_F32,
                       0, NULL, (loom_ir_attrs){0});
            break;
        }
        case 3: { /* reduction over columns, broadcast back: a softmax-like pattern */
            int32_t s =
                tu_add(g, rnd() % 2 ? LOOM_IR_OP_REDUCE_MAX : LOOM_IR_OP_REDUCE_MEAN, 1, &a,
                       LOOM_DTYPE_F32, 0, NULL, (loom_ir_attrs){.axes = 2, .keepdim = true});
            int32_t sb =
                tu_add(g, LOOM_IR_OP_BROADCAST, 1, &s, LOOM_DTYPE_F32, 2, mn, (loom_ir_attrs){0});
            v = tu_add(g, LOOM_IR_OP_SUB, 2, (int32_t[]){a, sb}, LOOM_DTYPE_F32, 0, NULL,
                       (loom_ir_attrs){0});
            (void)col;
            break;
        }
        case 4: { /* matmul with the transpose of another value, plus an epilogue */
            int32_t bt = tu_add(g, LOOM_IR_OP_TRANSPOSE, 1, &b, LOOM_DTYPE_F32, 0, NULL,
                                (loom_ir_attrs){.perm = {1, 0}});
            int32_t p = tu_add(g, LOOM_IR_OP_MATMUL, 2, (int32_t[]){a, bt}, LOOM_DTYPE_F32, 0, NULL,
                               (loom_ir_attrs){0}); /* [m, m] */
            int32_t q = tu_add(g, LOOM_IR_OP_MATMUL, 2, (int32_t[]){p, a}, LOOM_DTYPE_F32, 0, NULL,
                               (loom_ir_attrs){0}); /* [m, n] */
            int32_t sc = tu_add(g, LOOM_IR_OP_CONSTANT, 0, NULL, LOOM_DTYPE_F32, 0, NULL,
                                (loom_ir_attrs){.value = 1.0 / (double)(n * m + 1)});
            int32_t scb =
                tu_add(g, LOOM_IR_OP_BROADCAST, 1, &sc, LOOM_DTYPE_F32, 2, mn, (loom_ir_attrs){0});
            v = tu_add(g, LOOM_IR_OP_MUL, 2, (int32_t[]){q, scb}, LOOM_DTYPE_F32, 0, NULL,
                       (loom_ir_attrs){0});
            break;
        }
        default: { /* a select on a comparison */
            int32_t c = tu_add(g, LOOM_IR_OP_GT, 2, (int32_t[]){a, b}, LOOM_DTYPE_BOOL, 0, NULL,
                               (loom_ir_attrs){0});
            v = tu_add(g, LOOM_IR_OP_SELECT, 3, (int32_t[]){c, a, b}, LOOM_DTYPE_F32, 0, NULL,
                       (loom_ir_attrs){0});
            break;
        }
        }
        vals[n_vals++] = v;
    }
    /* outputs: the last value, a reduction of it, and a random middle value */
    int32_t last = vals[n_vals - 1];
    assert_int_equal(loom_ir_graph_add_output(g, last, -1), LOOM_OK);
    int32_t total = tu_add(g, LOOM_IR_OP_REDUCE_SUM, 1, &last, LOOM_DTYPE_F32, 0, NULL,
                           (loom_ir_attrs){.axes = 3});
    assert_int_equal(loom_ir_graph_add_output(g, total, -1), LOOM_OK);
    assert_int_equal(loom_ir_graph_add_output(g, vals[3 + rnd() % (uint64_t)(n_vals - 3)], -1), LOOM_OK);
}

static void test_random_fused_graphs_match_the_interpreter(void **state) {
    (void)state;
    for (int i = 0; i < 60; i++) {
        loom_ir_graph g;
        loom_ir_graph_init(&g, &H.alloc);
        build_random_dag(&g, (int)rnd_int(3, 24));
        char what[64];
        snprintf(what, sizeof what, "random graph %d (%d nodes)", i, (int)g.n_nodes);
        check_graph(&g, &(loom_ir_sample){.lo = -2, .hi = 2, .rel_tol = 1e-4, .abs_tol = 1e-4},
                    what);
        loom_ir_graph_deinit(&g);
    }
}

/* The probes `loom-ir ops` asks the layers with: autograd's, codegen's check and the
 * comparison with the interpreter, each on cases whose answer is known. */
static void test_the_probes_give_each_layers_answer(void **state) {
    (void)state;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    bool applies = false;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &H.alloc);
    loom_ir_sample s;
    uint64_t rng = 7;
    assert_int_equal(
        loom_ir_sample_build(&g, LOOM_IR_OP_MATMUL, LOOM_DTYPE_F32, true, &rng, &s, &d), LOOM_OK);
    assert_int_equal(g.nodes[s.subject].op, LOOM_IR_OP_MATMUL);
    assert_int_equal(loom_fe_vjp_probe(&g, s.subject, &applies, &d), LOOM_OK);
    assert_true(applies);
    assert_int_equal(loom_tg_npu_supports(&g, &d), LOOM_OK);
    loom_ir_graph_deinit(&g);

    loom_ir_graph_init(&g, &H.alloc); /* a bool result: nothing to differentiate */
    assert_int_equal(loom_ir_sample_build(&g, LOOM_IR_OP_LT, LOOM_DTYPE_F32, true, &rng, &s, &d),
                     LOOM_OK);
    assert_int_equal(loom_fe_vjp_probe(&g, s.subject, &applies, &d), LOOM_OK);
    assert_false(applies);
    loom_ir_graph_deinit(&g);

    loom_ir_graph_init(&g, &H.alloc); /* a max all-reduce has no gradient rule */
    int64_t n8[1] = {8};
    int32_t x = tu_input(&g, LOOM_DTYPE_F32, 1, n8);
    int32_t r = tu_add(&g, LOOM_IR_OP_ALL_REDUCE, 1, &x, LOOM_DTYPE_F32, 0, NULL,
                       (loom_ir_attrs){.index = LOOM_REDUCE_MAX, .value = 1});
    tu_output(&g, r, -1);
    assert_int_equal(loom_fe_vjp_probe(&g, r, &applies, &d), LOOM_STATUS_UNSUPPORTED);
    assert_true(applies);
    assert_non_null(strstr(d.msg, "all_reduce {reduce = max} of f32[8] has no gradient rule"));
    assert_int_equal(loom_fe_vjp_probe(&g, 5, &applies, &d), LOOM_STATUS_INVALID_ARGUMENT);
    loom_ir_graph_deinit(&g);

    loom_ir_graph_init(&g, &H.alloc); /* f32 exp is a polynomial: not bit-exact */
    int64_t n256[1] = {256};
    x = tu_input(&g, LOOM_DTYPE_F32, 1, n256);
    tu_output(&g, tu_add(&g, LOOM_IR_OP_EXP, 1, &x, LOOM_DTYPE_F32, 0, NULL, (loom_ir_attrs){0}),
              -1);
    loom_ir_sample exact = {.lo = -4, .hi = 4}, loose = {.lo = -4, .hi = 4, .rel_tol = 1e-5};
    loom_ir_diag_init(&d);
    assert_int_equal(loom_tg_check_against_ref(&g, &exact, &rng, NULL, H.dev, &H.metrics, &d),
                     LOOM_OK); /* the interpreter alone */
    assert_int_equal(loom_tg_check_against_ref(&g, &exact, &rng, H.pool, H.dev, &H.metrics, &d),
                     LOOM_STATUS_INTERNAL);
    assert_non_null(strstr(d.msg, "output 0 (f32[256]) element "));
    assert_non_null(strstr(d.msg, "(error "));
    loom_ir_diag_init(&d);
    assert_int_equal(loom_tg_check_against_ref(&g, &loose, &rng, H.pool, H.dev, &H.metrics, &d),
                     LOOM_OK);
    loom_ir_graph_deinit(&g);

    loom_ir_graph_init(&g, &H.alloc); /* a dtype the op does not take */
    assert_int_equal(loom_ir_sample_build(&g, LOOM_IR_OP_EXP, LOOM_DTYPE_I32, true, &rng, &s, &d),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_string_equal(d.msg, "sample: exp does not take i32");
    loom_ir_graph_deinit(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_probes_give_each_layers_answer),
        cmocka_unit_test(test_every_op_matches_the_interpreter_on_random_shapes),
        cmocka_unit_test(test_random_fused_graphs_match_the_interpreter),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
