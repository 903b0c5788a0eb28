/* Helpers of the compiled kernels' tests (test_codegen_kernels.c, test_codegen_ops.c):
 * graphs and hand-written plans built node by node, inputs filled with values and specials,
 * and each plan compiled, run and checked against the reference interpreter. */
#ifndef LOOM_TESTS_CODEGEN_TEST_UTIL_H
#define LOOM_TESTS_CODEGEN_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "codegen/codegen.h"
#include "passes/passes.h"
#include "runtime/runtime.h"

#define LEN(a) (sizeof(a) / sizeof((a)[0]))
#define S(...) ((const int64_t[]){__VA_ARGS__})
#define MAX_IN 64
#define MAX_OUT 16

/* ---- graphs ------------------------------------------------------------------------------- */

typedef struct fx {
    loom_allocator a;
    loom_ir_graph g;
    loom_ir_plan plan;
    loom_ir_diag d;
    uint64_t rng;
    void *in[MAX_IN];
    size_t in_bytes[MAX_IN];
    bool planned;
} fx;

static inline void fx_init(fx *f) {
    memset(f, 0, sizeof *f);
    f->a = loom_allocator_system();
    loom_ir_graph_init(&f->g, &f->a);
    loom_ir_plan_init(&f->plan, &f->a);
    loom_ir_diag_init(&f->d);
    f->rng = 0x2545f4914f6cdd1dull;
}

static inline void fx_deinit(fx *f) {
    for (int i = 0; i < MAX_IN; i++)
        free(f->in[i]);
    loom_ir_plan_deinit(&f->plan);
    loom_ir_graph_deinit(&f->g);
}

static inline int32_t add(fx *f, loom_ir_node_desc desc) {
    int32_t id = -1;
    if (loom_ir_graph_add(&f->g, &desc, &id, &f->d) != LOOM_OK)
        fail_msg("adding %s: %s", loom_ir_op_name(desc.op), f->d.msg);
    return id;
}

static inline int32_t input(fx *f, loom_dtype dt, int32_t rank, const int64_t *shape) {
    return add(f, (loom_ir_node_desc){.op = LOOM_IR_OP_INPUT,
                                      .dtype = dt,
                                      .rank = rank,
                                      .shape = shape,
                                      .attrs = {.index = f->g.n_graph_inputs}});
}

static inline int32_t cst(fx *f, loom_dtype dt, int32_t rank, const int64_t *shape, double v) {
    return add(f, (loom_ir_node_desc){.op = LOOM_IR_OP_CONSTANT,
                                      .dtype = dt,
                                      .rank = rank,
                                      .shape = shape,
                                      .attrs = {.value = v}});
}

static inline int32_t op1(fx *f, loom_ir_op op, int32_t x) {
    return add(f, (loom_ir_node_desc){.op = op, .n_inputs = 1, .inputs = (int32_t[]){x}});
}

static inline int32_t op2(fx *f, loom_ir_op op, int32_t x, int32_t y) {
    return add(f, (loom_ir_node_desc){.op = op, .n_inputs = 2, .inputs = (int32_t[]){x, y}});
}

static inline int32_t op3(fx *f, loom_ir_op op, int32_t x, int32_t y, int32_t z) {
    return add(f, (loom_ir_node_desc){.op = op, .n_inputs = 3, .inputs = (int32_t[]){x, y, z}});
}

static inline int32_t cast(fx *f, int32_t x, loom_dtype dt) {
    return add(f, (loom_ir_node_desc){
                      .op = LOOM_IR_OP_CAST, .n_inputs = 1, .inputs = (int32_t[]){x}, .dtype = dt});
}

/* broadcast or reshape */
static inline int32_t shaped(fx *f, loom_ir_op op, int32_t x, int32_t rank, const int64_t *shape) {
    return add(
        f, (loom_ir_node_desc){
               .op = op, .n_inputs = 1, .inputs = (int32_t[]){x}, .rank = rank, .shape = shape});
}

static inline int32_t transpose(fx *f, int32_t x, int32_t rank, const int32_t *perm) {
    loom_ir_attrs at = {0};
    memcpy(at.perm, perm, (size_t)rank * sizeof(int32_t));
    return add(
        f, (loom_ir_node_desc){
               .op = LOOM_IR_OP_TRANSPOSE, .n_inputs = 1, .inputs = (int32_t[]){x}, .attrs = at});
}

static inline int32_t reduce(fx *f, loom_ir_op op, int32_t x, uint32_t axes, bool keepdim) {
    return add(f, (loom_ir_node_desc){.op = op,
                                      .n_inputs = 1,
                                      .inputs = (int32_t[]){x},
                                      .attrs = {.axes = axes, .keepdim = keepdim}});
}

static inline void output(fx *f, int32_t node) {
    assert_int_equal(loom_ir_graph_add_output(&f->g, node, -1), LOOM_OK);
}

static const loom_ir_node *node(fx *f, int32_t id) {
    return &f->g.nodes[id];
}

/* ---- hand-written plans --------------------------------------------------------------------
 * A kernel is given by its computed nodes; the constants they read join it, its args are
 * the values it reads from outside and its results the values used outside or output. */

static inline bool is_output(fx *f, int32_t id) {
    for (int32_t o = 0; o < f->g.n_outputs; o++)
        if (f->g.outputs[o].node == id)
            return true;
    return false;
}

static inline void begin_plan(fx *f) {
    assert_int_equal(loom_ir_plan_reset(&f->plan, &f->g), LOOM_OK);
    f->planned = true;
}

static inline void kernel(fx *f, loom_ir_kernel_kind kind, int32_t root, int32_t n,
                          const int32_t *nodes) {
    if (!f->planned)
        begin_plan(f);
    int32_t nn = f->g.n_nodes;
    bool *in = calloc((size_t)nn, 1);
    for (int32_t i = 0; i < n; i++)
        in[nodes[i]] = true;
    for (int32_t i = 0; i < nn; i++)
        if (in[i])
            for (int32_t k = 0; k < f->g.nodes[i].n_inputs; k++)
                if (f->g.nodes[f->g.nodes[i].inputs[k]].op == LOOM_IR_OP_CONSTANT)
                    in[f->g.nodes[i].inputs[k]] = true;
    int32_t *ids = loom_ir_arena_alloc(&f->plan.arena, 3 * (size_t)nn * sizeof(int32_t) + 16);
    int32_t *args = ids + nn, *results = ids + 2 * nn;
    int32_t n_ids = 0, n_args = 0, n_results = 0;
    for (int32_t i = 0; i < nn; i++) {
        if (!in[i])
            continue;
        ids[n_ids++] = i;
        const loom_ir_node *x = &f->g.nodes[i];
        for (int32_t k = 0; k < x->n_inputs; k++) {
            int32_t a = x->inputs[k];
            bool seen = in[a];
            for (int32_t j = 0; j < n_args && !seen; j++)
                seen = args[j] == a;
            if (!seen)
                args[n_args++] = a;
        }
        bool used_outside = is_output(f, i) && x->op != LOOM_IR_OP_CONSTANT;
        for (int32_t u = i + 1; u < nn && !used_outside; u++)
            if (!in[u])
                for (int32_t k = 0; k < f->g.nodes[u].n_inputs; k++)
                    used_outside |= f->g.nodes[u].inputs[k] == i;
        if (used_outside || (is_output(f, i) && i == root))
            results[n_results++] = i;
        if (x->op != LOOM_IR_OP_CONSTANT)
            f->plan.node_kernel[i] = f->plan.n_kernels;
    }
    assert_true(loom_ir_grow(&f->plan.alloc, (void **)&f->plan.kernels, &f->plan.cap_kernels,
                             f->plan.n_kernels + 1, sizeof(loom_ir_kernel)));
    f->plan.kernels[f->plan.n_kernels++] = (loom_ir_kernel){.kind = kind,
                                                            .root = root,
                                                            .n_nodes = n_ids,
                                                            .nodes = ids,
                                                            .n_args = n_args,
                                                            .args = args,
                                                            .n_results = n_results,
                                                            .results = results};
    free(in);
}

/* One kernel holding every computed node from `first` to `last` (ids). */
static inline void kernel_range(fx *f, loom_ir_kernel_kind kind, int32_t first, int32_t last) {
    int32_t *nodes = malloc((size_t)(last - first + 1) * sizeof(int32_t));
    int32_t n = 0;
    for (int32_t i = first; i <= last; i++) {
        loom_ir_op op = f->g.nodes[i].op;
        if (op != LOOM_IR_OP_INPUT && op != LOOM_IR_OP_CONSTANT && op != LOOM_IR_OP_RESHAPE)
            nodes[n++] = i;
    }
    kernel(f, kind, last, n, nodes);
    free(nodes);
}

/* ---- data --------------------------------------------------------------------------------- */

static inline double rnd(fx *f) { /* [0, 1) */
    f->rng ^= f->rng << 13;
    f->rng ^= f->rng >> 7;
    f->rng ^= f->rng << 17;
    return (double)(f->rng >> 11) * (1.0 / 9007199254740992.0);
}

static const double float_specials[] = {0.0,      -0.0,      1.0,   -1.0,  0.5,    NAN,
                                        INFINITY, -INFINITY, 1e-40, 100.0, -100.0, 2.5};

/* Fills input `idx` with values in [lo, hi]; floats get the special values first when
 * `specials`; integers get their extremes. */
static inline void fill(fx *f, int32_t idx, double lo, double hi, bool specials) {
    assert_true(idx < MAX_IN);
    const loom_ir_node *n = NULL;
    for (int32_t i = 0; i < f->g.n_nodes; i++)
        if (f->g.nodes[i].op == LOOM_IR_OP_INPUT && f->g.nodes[i].attrs.index == idx)
            n = &f->g.nodes[i];
    assert_non_null(n);
    size_t bytes = tu_node_bytes(n);
    free(f->in[idx]);
    f->in[idx] = calloc(bytes ? bytes : 1, 1);
    f->in_bytes[idx] = bytes;
    int64_t count = loom_ir_numel(n->rank, n->shape);
    for (int64_t i = 0; i < count; i++) {
        double v = lo + (hi - lo) * rnd(f);
        if (loom_ir_dtype_is_float(n->dtype)) {
            if (specials && (size_t)i < LEN(float_specials))
                v = float_specials[i];
            loom_ir_store_f64(f->in[idx], n->dtype, i, v);
        } else if (n->dtype == LOOM_DTYPE_BOOL) {
            loom_ir_store_i64(f->in[idx], n->dtype, i, rnd(f) < 0.5);
        } else {
            int64_t iv = (int64_t)floor(v);
            if (specials) {
                int64_t mn = n->dtype == LOOM_DTYPE_I32 ? INT32_MIN : INT64_MIN;
                int64_t mx = n->dtype == LOOM_DTYPE_I32 ? INT32_MAX : INT64_MAX;
                const int64_t sp[] = {0, -1, 1, mn, mx, mn + 1, 7, -7};
                if ((size_t)i < LEN(sp))
                    iv = sp[i];
            }
            loom_ir_store_i64(f->in[idx], n->dtype, i, iv);
        }
    }
}

static inline void fill_all(fx *f, double lo, double hi, bool specials) {
    for (int32_t i = 0; i < f->g.n_graph_inputs; i++)
        fill(f, i, lo, hi, specials);
}

/* ---- running ------------------------------------------------------------------------------ */

static inline void **alloc_outputs(fx *f) {
    assert_true(f->g.n_outputs <= MAX_OUT);
    void **outs = calloc(MAX_OUT, sizeof(void *));
    for (int32_t o = 0; o < f->g.n_outputs; o++) {
        size_t b = tu_node_bytes(node(f, f->g.outputs[o].node));
        outs[o] = calloc(b ? b : 1, 1);
    }
    return outs;
}

static inline void free_outputs(fx *f, void **outs) {
    for (int32_t o = 0; o < f->g.n_outputs; o++)
        free(outs[o]);
    free(outs);
}

static inline void run_interp(fx *f, void **outs) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_status st = loom_rt_interp_run(&f->g, &f->a, (const void *const *)f->in, outs, &d);
    if (st != LOOM_OK)
        fail_msg("interp: %s", d.msg);
}

/* Runs the plan's kernels, each over [0, extent) in `chunks` calls (exercising the split),
 * every materialized value in a buffer of its own. */
static inline void run_kernels(fx *f, const loom_rt_kernel *ks, int chunks, void **outs) {
    int32_t nn = f->g.n_nodes;
    void **val = calloc((size_t)nn, sizeof(void *));
    bool *owned = calloc((size_t)nn, 1);
    for (int32_t i = 0; i < nn; i++)
        if (node(f, i)->op == LOOM_IR_OP_INPUT)
            val[i] = f->in[node(f, i)->attrs.index];
    for (int32_t k = 0; k < f->plan.n_kernels; k++) {
        const loom_ir_kernel *kr = &f->plan.kernels[k];
        void *bufs[64];
        assert_true(kr->n_args + kr->n_results <= 64);
        for (int32_t i = 0; i < kr->n_args; i++) {
            int32_t a = kr->args[i];
            while (node(f, a)->op == LOOM_IR_OP_RESHAPE)
                a = node(f, a)->inputs[0];
            assert_non_null(val[a]);
            bufs[i] = val[a];
        }
        for (int32_t i = 0; i < kr->n_results; i++) {
            int32_t r = kr->results[i];
            size_t b = tu_node_bytes(node(f, r));
            val[r] = malloc(b ? b : 1);
            memset(val[r], 0xa5, b ? b : 1); /* garbage: every element must be written */
            owned[r] = true;
            bufs[kr->n_args + i] = val[r];
        }
        int64_t e = ks[k].extent;
        assert_true(e >= 1);
        assert_true(ks[k].grain >= 1);
        for (int c = 0; c < chunks; c++) {
            int64_t lo = e * c / chunks, hi = e * (c + 1) / chunks;
            if (lo < hi)
                ks[k].fn(bufs, lo, hi);
        }
    }
    for (int32_t o = 0; o < f->g.n_outputs; o++) {
        int32_t id = f->g.outputs[o].node;
        while (node(f, id)->op == LOOM_IR_OP_RESHAPE)
            id = node(f, id)->inputs[0];
        assert_non_null(val[id]);
        memcpy(outs[o], val[id], tu_node_bytes(node(f, f->g.outputs[o].node)));
    }
    for (int32_t i = 0; i < nn; i++)
        if (owned[i])
            free(val[i]);
    free(val);
    free(owned);
}

static inline bool close_enough(double got, double want, double rtol, double atol) {
    if (isnan(want))
        return isnan(got);
    if (isinf(want))
        return got == want;
    return fabs(got - want) <= atol + rtol * fabs(want);
}

static inline void compare(fx *f, void **got, void **want, double rtol, double atol,
                           const char *what) {
    for (int32_t o = 0; o < f->g.n_outputs; o++) {
        const loom_ir_node *n = node(f, f->g.outputs[o].node);
        int64_t count = loom_ir_numel(n->rank, n->shape);
        for (int64_t i = 0; i < count; i++) {
            if (loom_ir_dtype_is_float(n->dtype)) {
                double g = loom_ir_load_f64(got[o], n->dtype, i);
                double w = loom_ir_load_f64(want[o], n->dtype, i);
                if (!close_enough(g, w, rtol, atol))
                    fail_msg("%s: output %d [%lld]: got %.9g, want %.9g", what, (int)o,
                             (long long)i, g, w);
            } else {
                int64_t g = loom_ir_load_i64(got[o], n->dtype, i);
                int64_t w = loom_ir_load_i64(want[o], n->dtype, i);
                if (g != w)
                    fail_msg("%s: output %d [%lld]: got %lld, want %lld", what, (int)o,
                             (long long)i, (long long)g, (long long)w);
            }
        }
    }
}

static inline loom_status compile(fx *f, int32_t threads, loom_cg_code **code, loom_rt_kernel *ks) {
    loom_cg_options opts = {.compile_threads = threads};
    loom_ir_diag_init(&f->d);
    return loom_cg_compile(&f->g, &f->plan, &opts, code, ks, &f->d);
}

/* Compiles the plan, runs it (split in 3 calls per kernel) and the interpreter, compares. */
static inline void check_with(fx *f, int32_t threads, double rtol, double atol, const char *what) {
    loom_rt_kernel *ks = calloc((size_t)f->plan.n_kernels + 1, sizeof *ks);
    loom_cg_code *code = NULL;
    if (compile(f, threads, &code, ks) != LOOM_OK)
        fail_msg("%s: compile: %s", what, f->d.msg);
    void **got = alloc_outputs(f), **want = alloc_outputs(f);
    run_kernels(f, ks, 3, got);
    run_interp(f, want);
    compare(f, got, want, rtol, atol, what);
    free_outputs(f, got);
    free_outputs(f, want);
    loom_cg_code_destroy(code);
    free(ks);
}

static inline void check(fx *f, double rtol, double atol, const char *what) {
    check_with(f, 1, rtol, atol, what);
}

#endif
