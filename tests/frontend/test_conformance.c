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
#include "runtime/kernel.h"

/* ---- deterministic randomness ------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static int64_t rnd_int(int64_t lo, int64_t hi) { return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1)); }
static double rnd_unit(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }
static int64_t rnd_extent(void) {
    static const int64_t e[] = {1, 2, 3, 5, 7, 8, 16, 17, 31, 33, 64, 100};
    return e[rnd() % (sizeof e / sizeof e[0])];
}

/* ---- harness ------------------------------------------------------------------------------ */

typedef struct harness {
    loom_allocator alloc;
    loom_rt_pool *pool;
    loom_rt_device *dev;
    loom_rt_metrics metrics;
} harness;

static harness H;

static int setup(void **state) {
    (void)state;
    H.alloc = loom_allocator_system();
    loom_rt_metrics_init(&H.metrics);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_rt_pool_create(2, &H.alloc, &H.pool) != LOOM_OK)
        return -1;
    return loom_rt_device_create("npu:0", &H.alloc, &H.metrics, &H.dev, &d) == LOOM_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    loom_rt_pool_destroy(H.pool);
    loom_rt_device_destroy(H.dev);
    return 0;
}

/* Values in a domain where every op is defined: (lo, hi) for floats, small ints. */
static void fill_random(void *buf, loom_dtype dt, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; i++) {
        if (loom_ir_dtype_is_float(dt))
            loom_ir_store_f64(buf, dt, i, lo + (hi - lo) * rnd_unit());
        else if (dt == LOOM_DTYPE_BOOL)
            loom_ir_store_i64(buf, dt, i, (int64_t)(rnd() & 1));
        else
            loom_ir_store_i64(buf, dt, i, rnd_int((int64_t)lo, (int64_t)hi));
    }
}

typedef struct tolerance {
    double rel, abs;
} tolerance;

/* Runs g through the interpreter and the JIT on the same random inputs and compares.
 * Returns false (without failing) when codegen reports UNSUPPORTED. */
static void check_graph(const loom_ir_graph *g, double lo, double hi, tolerance tol,
                        const char *what) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    int32_t n_in = g->n_graph_inputs, n_out = g->n_outputs;
    loom_rt_buffer *ins[16], *outs[16];
    void *in_ptrs[16], *want[16];
    assert_true(n_in <= 16 && n_out <= 16);
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (n->op != LOOM_IR_OP_INPUT)
            continue;
        int32_t k = (int32_t)n->attrs.index;
        assert_int_equal(loom_rt_buffer_alloc(H.dev, tu_node_bytes(n), &ins[k]), LOOM_OK);
        fill_random(ins[k]->data, n->dtype, loom_ir_numel(n->rank, n->shape), lo, hi);
        in_ptrs[k] = ins[k]->data;
    }
    for (int32_t o = 0; o < n_out; o++) {
        const loom_ir_node *n = &g->nodes[g->outputs[o].node];
        want[o] = calloc(1, tu_node_bytes(n) + 1);
        assert_int_equal(loom_rt_buffer_alloc(H.dev, tu_node_bytes(n), &outs[o]), LOOM_OK);
    }
    if (loom_rt_interp_run(g, &H.alloc, (const void *const *)in_ptrs, want, &d) != LOOM_OK)
        fail_msg("%s: interpreter: %s", what, d.msg);

    loom_fe_jit_options o = {.compile_threads = 2, .verify_passes = true};
    loom_rt_executable *exe = NULL;
    loom_status st = loom_fe_jit_build(g, loom_ir_graph_hash(g), &o, H.pool, &H.alloc, &H.metrics,
                                       &exe, &d);
    if (st != LOOM_OK)
        fail_msg("%s: JIT build failed: %s: %s", what, loom_status_name(st), d.msg);
    loom_ir_diag_init(&d);
    if (exe->vt->run(exe, ins, outs, &d) != LOOM_OK)
        fail_msg("%s: JIT run: %s", what, d.msg);
    for (int32_t o2 = 0; o2 < n_out; o2++) {
        const loom_ir_node *n = &g->nodes[g->outputs[o2].node];
        int64_t count = loom_ir_numel(n->rank, n->shape);
        for (int64_t i = 0; i < count; i++) {
            double w = loom_ir_load_f64(want[o2], n->dtype, i);
            double got = loom_ir_load_f64(outs[o2]->data, n->dtype, i);
            if (isnan(w) && isnan(got))
                continue;
            if (w == got)
                continue;
            double err = fabs(w - got), lim = tol.abs + tol.rel * fabs(w);
            if (!(err <= lim)) {
                char ty[LOOM_IR_TYPE_STR_MAX];
                fail_msg("%s: output %d (%s) element %lld: JIT %.17g, interpreter %.17g "
                         "(error %.3g > %.3g)",
                         what, (int)o2,
                         loom_ir_format_type(ty, sizeof ty, n->dtype, n->rank, n->shape),
                         (long long)i, got, w, err, lim);
            }
        }
    }
    loom_rt_executable_destroy(exe);
    for (int32_t k = 0; k < n_in; k++)
        loom_rt_buffer_release(ins[k]);
    for (int32_t o2 = 0; o2 < n_out; o2++) {
        loom_rt_buffer_release(outs[o2]);
        free(want[o2]);
    }
}

/* ---- per-op cases ------------------------------------------------------------------------- */

static void random_shape(int32_t *rank, int64_t *shape, int32_t max_rank) {
    *rank = (int32_t)rnd_int(0, max_rank);
    for (int32_t i = 0; i < *rank; i++)
        shape[i] = rnd_extent();
}

/* Per-op domain and tolerance for f32; 16-bit types loosen the tolerance. */
static void op_domain(loom_ir_op op, double *lo, double *hi, tolerance *tol) {
    *lo = -4;
    *hi = 4;
    *tol = (tolerance){1e-6, 1e-7};
    switch (op) {
    case LOOM_IR_OP_LOG:
    case LOOM_IR_OP_SQRT:
    case LOOM_IR_OP_RSQRT:
    case LOOM_IR_OP_POW: *lo = 0.05; *hi = 4; *tol = (tolerance){1e-5, 1e-6}; break;
    case LOOM_IR_OP_EXP:
    case LOOM_IR_OP_TANH:
    case LOOM_IR_OP_SIGMOID:
    case LOOM_IR_OP_GELU: *tol = (tolerance){1e-5, 1e-6}; break;
    case LOOM_IR_OP_DIV: *lo = 0.5; *hi = 4; break;
    case LOOM_IR_OP_REDUCE_SUM:
    case LOOM_IR_OP_REDUCE_MEAN:
    case LOOM_IR_OP_MATMUL: *tol = (tolerance){1e-5, 1e-4}; break;
    case LOOM_IR_OP_CONV2D: /* [-1, 1]: col2im's 16-bit window terms round each */
    case LOOM_IR_OP_CONV2D_GRAD_INPUT:
    case LOOM_IR_OP_CONV2D_GRAD_WEIGHT:
        *lo = -1;
        *hi = 1;
        *tol = (tolerance){1e-5, 1e-4};
        break;
    case LOOM_IR_OP_INPUT:
    case LOOM_IR_OP_CONSTANT:
    case LOOM_IR_OP_NEG:
    case LOOM_IR_OP_ABS:
    case LOOM_IR_OP_RELU:
    case LOOM_IR_OP_ISFINITE:
    case LOOM_IR_OP_ADD:
    case LOOM_IR_OP_SUB:
    case LOOM_IR_OP_MUL:
    case LOOM_IR_OP_MAXIMUM:
    case LOOM_IR_OP_MINIMUM:
    case LOOM_IR_OP_EQ:
    case LOOM_IR_OP_NE:
    case LOOM_IR_OP_LT:
    case LOOM_IR_OP_LE:
    case LOOM_IR_OP_GT:
    case LOOM_IR_OP_GE:
    case LOOM_IR_OP_SELECT:
    case LOOM_IR_OP_CAST:
    case LOOM_IR_OP_BROADCAST:
    case LOOM_IR_OP_RESHAPE:
    case LOOM_IR_OP_TRANSPOSE:
    case LOOM_IR_OP_REDUCE_MAX:
    case LOOM_IR_OP_SLICE:
    case LOOM_IR_OP_PAD:
    case LOOM_IR_OP_CONCAT:
    case LOOM_IR_OP_IOTA:
    case LOOM_IR_OP_RAND_UNIFORM:
    case LOOM_IR_OP_ALL_REDUCE:
    case LOOM_IR_OP_BROADCAST_FROM:
    case LOOM_IR_OP_ALL_GATHER:
    case LOOM_IR_OP_COUNT_: break;
    }
}

/* Builds one random instance of op in dtype dt into g (inputs first, the op, one output). */
static void build_case(loom_ir_graph *g, loom_ir_op op, loom_dtype dt) {
    int32_t rank;
    int64_t shape[LOOM_MAX_RANK];
    random_shape(&rank, shape, 4);
    const loom_ir_op_info *info = &loom_ir_op_table[op];
    int32_t res = -1;
    switch (info->kind) {
    case LOOM_IR_KIND_SOURCE:
        if (op == LOOM_IR_OP_INPUT) {
            res = tu_input(g, dt, rank, shape);
        } else {
            int32_t x = tu_input(g, dt, rank, shape); /* constant + x keeps an input */
            int32_t c = tu_add(g, LOOM_IR_OP_CONSTANT, 0, NULL, dt, rank, shape,
                               (loom_ir_attrs){.value = 1.25});
            int32_t in[2] = {x, c};
            res = tu_add(
                g, loom_ir_dtype_in_class(dt, LOOM_IR_DT_NUM) ? LOOM_IR_OP_ADD : LOOM_IR_OP_EQ, 2,
                in, dt, 0, NULL, (loom_ir_attrs){0});
            assert_int_equal(loom_ir_graph_add_output(g, c, -1), LOOM_OK);
        }
        break;
    case LOOM_IR_KIND_UNARY:
    case LOOM_IR_KIND_PREDICATE: {
        int32_t x = tu_input(g, dt, rank, shape);
        res = tu_add(g, op, 1, &x, dt, 0, NULL, (loom_ir_attrs){0});
        break;
    }
    case LOOM_IR_KIND_BINARY:
    case LOOM_IR_KIND_COMPARE: {
        int32_t in[2] = {tu_input(g, dt, rank, shape), -1};
        if (rank > 0 && rnd() % 2) { /* second operand broadcast from a smaller shape */
            int64_t small[LOOM_MAX_RANK];
            for (int32_t i = 0; i < rank; i++)
                small[i] = rnd() % 2 ? 1 : shape[i];
            int32_t s = tu_input(g, dt, rank, small);
            in[1] = tu_add(g, LOOM_IR_OP_BROADCAST, 1, &s, dt, rank, shape, (loom_ir_attrs){0});
        } else {
            in[1] = tu_input(g, dt, rank, shape);
        }
        res = tu_add(g, op, 2, in, dt, 0, NULL, (loom_ir_attrs){0});
        break;
    }
    case LOOM_IR_KIND_SELECT: {
        int32_t c = tu_input(g, LOOM_DTYPE_BOOL, rank, shape);
        int32_t in[3] = {c, tu_input(g, dt, rank, shape), tu_input(g, dt, rank, shape)};
        res = tu_add(g, op, 3, in, dt, 0, NULL, (loom_ir_attrs){0});
        break;
    }
    case LOOM_IR_KIND_CAST: {
        int32_t x = tu_input(g, LOOM_DTYPE_F32, rank, shape);
        res = tu_add(g, op, 1, &x, dt, 0, NULL, (loom_ir_attrs){0});
        break;
    }
    case LOOM_IR_KIND_BROADCAST: {
        int64_t small[LOOM_MAX_RANK];
        int32_t srank = rank ? (int32_t)rnd_int(0, rank) : 0;
        for (int32_t i = 0; i < srank; i++)
            small[i] = rnd() % 2 ? 1 : shape[rank - srank + i];
        int32_t x = tu_input(g, dt, srank, small);
        res = tu_add(g, op, 1, &x, dt, rank, shape, (loom_ir_attrs){0});
        break;
    }
    case LOOM_IR_KIND_RESHAPE: {
        int32_t x = tu_input(g, dt, rank, shape);
        int64_t flat = loom_ir_numel(rank, shape);
        int64_t to[2] = {1, flat};
        int32_t x2 = tu_add(g, op, 1, &x, dt, 2, to, (loom_ir_attrs){0});
        res = x2; /* a reshape of an input as an output: a copy */
        if (loom_ir_dtype_in_class(dt, LOOM_IR_DT_NUM)) { /* and read by a kernel */
            assert_int_equal(loom_ir_graph_add_output(g, x2, -1), LOOM_OK);
            res =
                tu_add(g, LOOM_IR_OP_ADD, 2, (int32_t[]){x2, x2}, dt, 0, NULL, (loom_ir_attrs){0});
        }
        break;
    }
    case LOOM_IR_KIND_TRANSPOSE: {
        if (rank < 2) {
            rank = 2;
            shape[0] = rnd_extent();
            shape[1] = rnd_extent();
        }
        int32_t x = tu_input(g, dt, rank, shape);
        loom_ir_attrs at = {0};
        for (int32_t i = 0; i < rank; i++)
            at.perm[i] = i;
        for (int32_t i = rank - 1; i > 0; i--) { /* Fisher-Yates */
            int32_t j = (int32_t)rnd_int(0, i), t = at.perm[i];
            at.perm[i] = at.perm[j];
            at.perm[j] = t;
        }
        res = tu_add(g, op, 1, &x, dt, 0, NULL, at);
        break;
    }
    case LOOM_IR_KIND_REDUCTION: {
        int32_t x = tu_input(g, dt, rank, shape);
        loom_ir_attrs at = {.axes = rank ? (uint32_t)(rnd() % (1u << rank)) : 0,
                            .keepdim = rnd() % 2 == 0};
        res = tu_add(g, op, 1, &x, dt, 0, NULL, at);
        break;
    }
    case LOOM_IR_KIND_CONTRACTION: {
        int32_t r = (int32_t)rnd_int(2, 3);
        int64_t a[3], b[3];
        int64_t m = rnd_extent(), n = rnd_extent(), k = rnd_extent(), batch = rnd_int(1, 3);
        if (r == 3) {
            a[0] = b[0] = batch;
        }
        a[r - 2] = m;
        a[r - 1] = k;
        b[r - 2] = k;
        b[r - 1] = n;
        int32_t in[2] = {tu_input(g, dt, r, a), tu_input(g, dt, r, b)};
        res = tu_add(g, op, 2, in, dt, 0, NULL, (loom_ir_attrs){0});
        break;
    }
    case LOOM_IR_KIND_SLICE: { /* random start, stride 1..3, the sizes that fit */
        if (rank == 0) {
            rank = 1;
            shape[0] = rnd_extent();
        }
        int32_t x = tu_input(g, dt, rank, shape);
        loom_ir_attrs at = {0};
        int64_t size[LOOM_MAX_RANK];
        for (int32_t i = 0; i < rank; i++) {
            at.start[i] = rnd_int(0, shape[i] - 1);
            at.step[i] = rnd_int(1, 3);
            size[i] = rnd_int(0, (shape[i] - 1 - at.start[i]) / at.step[i] + 1);
        }
        res = tu_add(g, op, 1, &x, dt, rank, size, at);
        if (loom_ir_dtype_in_class(dt, LOOM_IR_DT_NUM)) { /* and fused into a consumer */
            assert_int_equal(loom_ir_graph_add_output(g, res, -1), LOOM_OK);
            res = tu_add(g, LOOM_IR_OP_ABS, 1, &res, dt, 0, NULL, (loom_ir_attrs){0});
        }
        break;
    }
    case LOOM_IR_KIND_PAD: { /* low, high 0..2, interior 0..2 on random axes */
        int32_t x = tu_input(g, dt, rank, shape);
        loom_ir_attrs at = {.value = rnd() % 2 ? -1.5 : 0.0};
        int64_t out[LOOM_MAX_RANK];
        for (int32_t i = 0; i < rank; i++) {
            bool pad = rnd() % 2;
            at.start[i] = pad ? rnd_int(0, 2) : 0;
            at.step[i] = pad ? rnd_int(0, 2) : 0;
            int64_t high = pad ? rnd_int(0, 2) : 0;
            out[i] = at.start[i] + high + shape[i] + (shape[i] - 1) * at.step[i];
        }
        res = tu_add(g, op, 1, &x, dt, rank, out, at);
        if (loom_ir_dtype_in_class(dt, LOOM_IR_DT_NUM) && rnd() % 2) { /* fused or not */
            assert_int_equal(loom_ir_graph_add_output(g, res, -1), LOOM_OK);
            res = tu_add(g, LOOM_IR_OP_NEG, 1, &res, dt, 0, NULL, (loom_ir_attrs){0});
        }
        break;
    }
    case LOOM_IR_KIND_CONCAT: { /* 1..4 operands along a random axis, some computed */
        if (rank == 0) {
            rank = 1;
            shape[0] = rnd_extent();
        }
        int32_t axis = (int32_t)rnd_int(0, rank - 1), n = (int32_t)rnd_int(1, 4), in[4];
        for (int32_t k = 0; k < n; k++) {
            int64_t sh[LOOM_MAX_RANK];
            memcpy(sh, shape, sizeof sh);
            sh[axis] = rnd() % 4 ? rnd_extent() : 0;
            in[k] = tu_input(g, dt, rank, sh);
            if (loom_ir_dtype_in_class(dt, LOOM_IR_DT_NUM) && rnd() % 2)
                in[k] = tu_add(g, LOOM_IR_OP_NEG, 1, &in[k], dt, 0, NULL, (loom_ir_attrs){0});
        }
        res = tu_add(g, op, n, in, dt, 0, NULL, (loom_ir_attrs){.index = axis});
        break;
    }
    case LOOM_IR_KIND_IOTA: { /* alone and added to an input */
        if (rank == 0) {
            rank = 1;
            shape[0] = rnd_extent();
        }
        int32_t axis = (int32_t)rnd_int(0, rank - 1);
        res = tu_add(g, op, 0, NULL, dt, rank, shape, (loom_ir_attrs){.index = axis});
        assert_int_equal(loom_ir_graph_add_output(g, res, -1), LOOM_OK);
        int32_t x = tu_input(g, dt, rank, shape);
        res = tu_add(g, LOOM_IR_OP_ADD, 2, (int32_t[]){x, res}, dt, 0, NULL, (loom_ir_attrs){0});
        break;
    }
    case LOOM_IR_KIND_RAND: { /* bit-identical: compared with a zero tolerance below */
        int32_t seed = tu_input(g, LOOM_DTYPE_I64, 0, NULL);
        res = tu_add(g, op, 1, &seed, dt, rank, shape, (loom_ir_attrs){0});
        break;
    }
    case LOOM_IR_KIND_COLLECTIVE: { /* one rank: checked by check_collective below */
        if (rank == 0) {
            rank = 1;
            shape[0] = rnd_extent();
        }
        int32_t x = tu_input(g, dt, rank, shape);
        loom_ir_attrs at = {0};
        if (op == LOOM_IR_OP_ALL_REDUCE) {
            at.index = dt == LOOM_DTYPE_BOOL ? rnd_int(1, 2) : rnd_int(0, 2);
            at.value = loom_ir_dtype_is_float(dt) ? (double[]){1, 0.5, -0.25}[rnd_int(0, 2)] : 1;
        } else if (op == LOOM_IR_OP_ALL_GATHER) {
            at.index = 1; /* the world size */
        }
        res = tu_add(g, op, 1, &x, dt, 0, NULL, at);
        break;
    }
    case LOOM_IR_KIND_CONV: { /* a random window; the gradients state x's or w's shape */
        int64_t grp = rnd_int(1, 2), cg = rnd_int(1, 3), og = rnd_int(1, 2);
        loom_ir_conv cv = {{rnd_int(1, 2), rnd_int(1, 2)},
                           {rnd_int(0, 1), rnd_int(0, 1)},
                           {rnd_int(1, 2), rnd_int(1, 2)},
                           grp};
        int64_t xs[4] = {rnd_int(1, 2), grp * cg, 0, 0}, ws[4] = {grp * og, cg, rnd_int(1, 3), 0};
        ws[3] = rnd_int(1, 3);
        int64_t ys[4] = {xs[0], ws[0], 0, 0};
        for (int i = 0; i < 2; i++) {
            xs[2 + i] = cv.dilation[i] * (ws[2 + i] - 1) + 1 + rnd_int(0, 6);
            ys[2 + i] = loom_ir_conv_out_extent(xs[2 + i], ws[2 + i], cv.stride[i], cv.padding[i],
                                                cv.dilation[i]);
        }
        int32_t in[2] = {tu_input(g, dt, 4, op == LOOM_IR_OP_CONV2D_GRAD_INPUT ? ys : xs), -1};
        in[1] = tu_input(g, dt, 4, op == LOOM_IR_OP_CONV2D_GRAD_WEIGHT ? ys : ws);
        const int64_t *stated = op == LOOM_IR_OP_CONV2D              ? NULL
                                : op == LOOM_IR_OP_CONV2D_GRAD_INPUT ? xs
                                                                     : ws;
        res = tu_add(g, op, 2, in, dt, stated ? 4 : 0, stated, (loom_ir_attrs){.conv = cv});
        break;
    }
    case LOOM_IR_KIND_COUNT_: break;
    }
    assert_int_equal(loom_ir_graph_add_output(g, res, -1), LOOM_OK);
}

/* Collectives on one rank: the interpreter gives the operand (times the all-reduce's scale,
 * as one rounding of the exact product), and the JIT (which runs them on the host, through
 * the same code) gives exactly the interpreter's values. */
static void check_collective(const loom_ir_graph *g, const char *what) {
    const loom_ir_node *n = &g->nodes[g->outputs[0].node], *x = &g->nodes[n->inputs[0]];
    int64_t count = loom_ir_numel(x->rank, x->shape);
    void *in = calloc(1, tu_node_bytes(x) + 1), *out = calloc(1, tu_node_bytes(n) + 1);
    fill_random(in, x->dtype, count, -4, 4);
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
    check_graph(g, -4, 4, (tolerance){0, 0}, what);
}

static bool op_accepts(loom_ir_op op, loom_dtype dt) {
    const loom_ir_op_info *info = &loom_ir_op_table[op];
    if (info->kind == LOOM_IR_KIND_CAST)
        return true;
    if (info->kind == LOOM_IR_KIND_IOTA) /* result dtypes: iota numeric, rand float */
        return loom_ir_dtype_in_class(dt, LOOM_IR_DT_NUM);
    if (info->kind == LOOM_IR_KIND_RAND)
        return loom_ir_dtype_is_float(dt);
    return loom_ir_dtype_in_class(dt, info->dtypes);
}

static void test_every_op_matches_the_interpreter_on_random_shapes(void **state) {
    (void)state;
    static const loom_dtype dtypes[] = {LOOM_DTYPE_F32, LOOM_DTYPE_F64, LOOM_DTYPE_I32,
                                        LOOM_DTYPE_I64, LOOM_DTYPE_BF16, LOOM_DTYPE_F16,
                                        LOOM_DTYPE_BOOL};
    int cases = 0;
    for (int op = 0; op < LOOM_IR_OP_COUNT_; op++) {
        for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++) {
            loom_dtype dt = dtypes[t];
            if (!op_accepts((loom_ir_op)op, dt))
                continue;
            int reps = dt == LOOM_DTYPE_F32 ? 6 : 2;
            for (int rep = 0; rep < reps; rep++) {
                loom_ir_graph g;
                loom_ir_graph_init(&g, &H.alloc);
                build_case(&g, (loom_ir_op)op, dt);
                double lo, hi;
                tolerance tol;
                op_domain((loom_ir_op)op, &lo, &hi, &tol);
                if (dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16)
                    tol = (tolerance){tol.rel * 1e3 + 1e-2, tol.abs * 1e3 + 1e-2};
                if (dt == LOOM_DTYPE_F64)
                    tol = (tolerance){tol.rel * 1e-3 + 1e-12, tol.abs * 1e-3};
                if (loom_ir_dtype_is_int(dt)) {
                    lo = -20;
                    hi = 20;
                    tol = (tolerance){0, 0};
                }
                loom_ir_kind kind = loom_ir_op_table[op].kind;
                if (kind == LOOM_IR_KIND_SLICE || kind == LOOM_IR_KIND_PAD ||
                    kind == LOOM_IR_KIND_CONCAT || kind == LOOM_IR_KIND_IOTA ||
                    kind == LOOM_IR_KIND_RAND)
                    tol = (tolerance){0, 0}; /* data movement and exact generators */
                char what[96];
                snprintf(what, sizeof what, "%s %s case %d", loom_ir_op_name((loom_ir_op)op),
                         loom_dtype_name(dt), rep);
                if (kind == LOOM_IR_KIND_COLLECTIVE)
                    check_collective(&g, what);
                else
                    check_graph(&g, lo, hi, tol, what);
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
        check_graph(&g, -2, 2, (tolerance){1e-4, 1e-4}, what);
        loom_ir_graph_deinit(&g);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_matches_the_interpreter_on_random_shapes),
        cmocka_unit_test(test_random_fused_graphs_match_the_interpreter),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
