/* Constant folding and algebraic simplification. One sweep in graph order builds the new
 * graph, simplifying each node against its already-simplified operands (so chains of
 * constants and of transposes collapse in the one sweep); DCE then drops what died. */
#include <math.h>
#include <string.h>

#include "passes.h"

/* ---- evaluation ----------------------------------------------------------------------------
 * Folded values must be bit-identical to what the reference interpreter (runtime/interp.c)
 * computes: both take the per-element rules of ir/scalar.c, and this evaluates one element
 * the way the interpreter's kernels apply them (which operand dtype, which path, where the
 * result is stored). test_cse_fold checks every folded value against the interpreter. */

/* One element of a value, as bytes: what a buffer of the node's dtype holds. */
typedef struct elem {
    unsigned char b[8];
} elem;

/* The element a constant node fills its buffer with (the interpreter's run_constant). */
static elem const_elem(const loom_ir_node *c) {
    elem e = {{0}};
    loom_ir_store_f64(e.b, c->dtype, 0, c->attrs.value);
    return e;
}

/* The element of node n (dtype n->dtype) computed from constant operands x[], as interp.c
 * computes it. false when the op has no scalar rule for these dtypes. */
static bool eval_elementwise(const loom_ir_node *n, const loom_ir_node *const *x, elem *out) {
    elem v[3];
    for (int32_t k = 0; k < n->n_inputs; k++)
        v[k] = const_elem(x[k]);
    loom_dtype dt = n->dtype;
    memset(out, 0, sizeof *out);
    bool is_float = loom_ir_dtype_is_float(dt), is_int = loom_ir_dtype_is_int(dt);
    loom_ir_op op = n->op;
    switch (loom_ir_op_table[op].kind) {
    case LOOM_IR_KIND_UNARY:
    case LOOM_IR_KIND_BINARY: { /* interp.c's run_arith; a unary rule gets a == b */
        const unsigned char *a = v[0].b, *b = v[n->n_inputs > 1 ? 1 : 0].b;
        loom_ir_scalar_f64_fn f = loom_ir_scalar_rule_f64(op);
        loom_ir_scalar_i64_fn fi = loom_ir_scalar_rule_i64(op);
        if (is_float && f)
            loom_ir_store_f64(out->b, dt, 0,
                              f(loom_ir_load_f64(a, dt, 0), loom_ir_load_f64(b, dt, 0)));
        else if (is_int && fi)
            loom_ir_store_i64(out->b, dt, 0,
                              fi(loom_ir_load_i64(a, dt, 0), loom_ir_load_i64(b, dt, 0)));
        else
            return false;
        return true;
    }
    case LOOM_IR_KIND_PREDICATE:
    case LOOM_IR_KIND_COMPARE: { /* interp.c's run_test: bool operands on the integer path */
        const unsigned char *a = v[0].b, *b = v[n->n_inputs > 1 ? 1 : 0].b;
        loom_dtype xt = x[0]->dtype;
        if (loom_ir_dtype_is_float(xt)) {
            loom_ir_scalar_f64_fn f = loom_ir_scalar_rule_f64(op);
            if (!f)
                return false;
            out->b[0] = f(loom_ir_load_f64(a, xt, 0), loom_ir_load_f64(b, xt, 0)) != 0.0;
        } else {
            loom_ir_scalar_i64_fn fi = loom_ir_scalar_rule_i64(op);
            if (!fi)
                return false;
            out->b[0] = fi(loom_ir_load_i64(a, xt, 0), loom_ir_load_i64(b, xt, 0)) != 0;
        }
        return true;
    }
    case LOOM_IR_KIND_SELECT: *out = v[0].b[0] ? v[1] : v[2]; return true;
    case LOOM_IR_KIND_CAST: {
        loom_dtype from = x[0]->dtype;
        if (loom_ir_dtype_is_float(from))
            loom_ir_store_f64(out->b, dt, 0, loom_ir_load_f64(v[0].b, from, 0));
        else
            loom_ir_store_i64(out->b, dt, 0, loom_ir_load_i64(v[0].b, from, 0));
        return true;
    }
    case LOOM_IR_KIND_SOURCE:
    case LOOM_IR_KIND_BROADCAST:
    case LOOM_IR_KIND_RESHAPE:
    case LOOM_IR_KIND_TRANSPOSE:
    case LOOM_IR_KIND_REDUCTION:
    case LOOM_IR_KIND_CONTRACTION:
    case LOOM_IR_KIND_CONV:
    case LOOM_IR_KIND_POOL:
    case LOOM_IR_KIND_SLICE:
    case LOOM_IR_KIND_PAD:
    case LOOM_IR_KIND_CONCAT:
    case LOOM_IR_KIND_IOTA:
    case LOOM_IR_KIND_RAND:
    case LOOM_IR_KIND_GATHER:
    case LOOM_IR_KIND_SCATTER:
    case LOOM_IR_KIND_ATTENTION:
    case LOOM_IR_KIND_COLLECTIVE: /* other ranks' values: never folded */
    case LOOM_IR_KIND_COUNT_: break;
    }
    return false;
}

/* The constant fill value that stores exactly the element e, if there is one: floats go
 * through their double value, integers through int64 (exact in a double up to 2^53). */
static bool elem_to_value(loom_dtype dt, const elem *e, double *out) {
    double v = loom_ir_dtype_is_float(dt) ? loom_ir_load_f64(e->b, dt, 0)
                                          : (double)loom_ir_load_i64(e->b, dt, 0);
    elem back = {{0}};
    loom_ir_store_f64(back.b, dt, 0, v);
    if (memcmp(back.b, e->b, loom_dtype_size(dt)) != 0)
        return false;
    *out = v;
    return true;
}

/* ---- rules -------------------------------------------------------------------------------- */

typedef enum fold_kind {
    FOLD_KEEP,    /* the node stays, over its (simplified) operands */
    FOLD_REPLACE, /* the node is an existing node: `replace` */
    FOLD_NEW,     /* the node becomes `desc` */
} fold_kind;

typedef struct fold_action {
    fold_kind kind;
    int32_t replace;
    loom_ir_node_desc desc;
    int32_t ins[1];
} fold_action;

static bool same_shape(const loom_ir_node *a, int32_t rank, const int64_t *shape) {
    return a->rank == rank && memcmp(a->shape, shape, (size_t)rank * sizeof *shape) == 0;
}

static bool same_type(const loom_ir_node *a, const loom_ir_node *b) {
    return a->dtype == b->dtype && same_shape(a, b->rank, b->shape);
}

/* Whether node c is a constant whose stored elements equal `want` (an integer for integer
 * dtypes) and, for floats, have the given sign (want_neg: -0.0 and +0.0 differ here). */
static bool is_const(const loom_ir_node *c, double want, bool want_neg) {
    if (c->op != LOOM_IR_OP_CONSTANT)
        return false;
    elem e = const_elem(c);
    if (loom_ir_dtype_is_float(c->dtype)) {
        double v = loom_ir_load_f64(e.b, c->dtype, 0);
        return v == want && (signbit(v) != 0) == want_neg;
    }
    return loom_ir_dtype_is_int(c->dtype) && loom_ir_load_i64(e.b, c->dtype, 0) == (int64_t)want;
}

static void set_replace(fold_action *a, int32_t id) {
    a->kind = FOLD_REPLACE;
    a->replace = id;
}

/* n becomes a constant of its own type filled with value. */
static void set_constant(fold_action *a, const loom_ir_node *n, double value) {
    a->kind = FOLD_NEW;
    a->desc = (loom_ir_node_desc){.op = LOOM_IR_OP_CONSTANT,
                                  .dtype = n->dtype,
                                  .rank = n->rank,
                                  .shape = n->shape,
                                  .attrs.value = value,
                                  .loc = n->loc};
}

/* n (a broadcast/reshape/transpose) applied to x's operand instead of to x. */
static void set_rebased(fold_action *a, const loom_ir_node *n, int32_t operand) {
    a->kind = FOLD_NEW;
    a->ins[0] = operand;
    a->desc = (loom_ir_node_desc){.op = n->op,
                                  .n_inputs = 1,
                                  .inputs = a->ins,
                                  .dtype = n->dtype,
                                  .rank = n->rank,
                                  .shape = n->shape,
                                  .attrs = n->attrs,
                                  .loc = n->loc};
}

/* x op c == x for every x: the neutral constants of each binary op, per dtype class. */
static bool right_neutral(loom_ir_op op, const loom_ir_node *c) {
    if (op == LOOM_IR_OP_ADD) /* x + (-0.0) for floats: x + (+0.0) turns -0.0 into +0.0 */
        return is_const(c, 0.0, !loom_ir_dtype_is_int(c->dtype));
    if (op == LOOM_IR_OP_SUB) /* x - (+0.0) */
        return is_const(c, 0.0, false);
    if (op == LOOM_IR_OP_MUL || op == LOOM_IR_OP_DIV)
        return is_const(c, 1.0, false);
    return false;
}

/* Decides what node n (from the graph being folded) becomes, given its operands `ops`, which
 * are ids in g (the graph being built, or the original for a dry run). Never changes g. */
static void simplify(const loom_ir_graph *g, const loom_ir_node *n, const int32_t *ops,
                     fold_action *a) {
    a->kind = FOLD_KEEP;
    loom_ir_kind kind = loom_ir_op_table[n->op].kind;
    const loom_ir_node *x[3] = {NULL, NULL, NULL};
    bool all_const = n->n_inputs > 0 && n->n_inputs <= 3;
    for (int32_t k = 0; k < n->n_inputs && k < 3; k++) {
        x[k] = &g->nodes[ops[k]];
        all_const = all_const && x[k]->op == LOOM_IR_OP_CONSTANT;
    }
    if (all_const && loom_ir_op_is_elementwise(n->op)) {
        elem e;
        double v;
        if (eval_elementwise(n, x, &e) && elem_to_value(n->dtype, &e, &v))
            set_constant(a, n, v);
        return;
    }
    switch (kind) {
    case LOOM_IR_KIND_UNARY:
        if (n->op == LOOM_IR_OP_NEG && x[0]->op == LOOM_IR_OP_NEG)
            set_replace(a, x[0]->inputs[0]);
        return;
    case LOOM_IR_KIND_SELECT: /* a constant condition is all true or all false */
        if (x[0]->op == LOOM_IR_OP_CONSTANT)
            set_replace(a, const_elem(x[0]).b[0] ? ops[1] : ops[2]);
        return;
    case LOOM_IR_KIND_BINARY: {
        bool is_int = loom_ir_dtype_is_int(n->dtype);
        bool commutative = (loom_ir_op_table[n->op].flags & LOOM_IR_OPF_COMMUTATIVE) != 0;
        if (same_type(x[0], n) && right_neutral(n->op, x[1]))
            set_replace(a, ops[0]);
        else if (commutative && same_type(x[1], n) && right_neutral(n->op, x[0]))
            set_replace(a, ops[1]);
        else if (n->op == LOOM_IR_OP_MUL && is_int &&
                 (is_const(x[0], 0.0, false) || is_const(x[1], 0.0, false)))
            set_constant(a, n, 0.0); /* integers only: NaN * 0 and inf * 0 are NaN */
        return;
    }
    case LOOM_IR_KIND_CAST:
        if (x[0]->dtype == n->dtype)
            set_replace(a, ops[0]);
        return;
    case LOOM_IR_KIND_BROADCAST:
    case LOOM_IR_KIND_RESHAPE:
        if (x[0]->op == LOOM_IR_OP_CONSTANT) {
            set_constant(a, n, x[0]->attrs.value);
        } else if (same_shape(x[0], n->rank, n->shape)) {
            set_replace(a, ops[0]);
        } else if (x[0]->op == n->op) {
            /* a broadcast of a broadcast is one broadcast (each stage only repeats along
             * axes of extent 1 or prepends axes); reshapes compose trivially */
            int32_t inner = x[0]->inputs[0];
            if (same_shape(&g->nodes[inner], n->rank, n->shape))
                set_replace(a, inner);
            else
                set_rebased(a, n, inner);
        }
        return;
    case LOOM_IR_KIND_TRANSPOSE: {
        if (x[0]->op == LOOM_IR_OP_CONSTANT) {
            set_constant(a, n, x[0]->attrs.value);
            return;
        }
        /* transpose(transpose(y, p), q): axis j of the result is axis q[j] of the inner
         * transpose, which is axis p[q[j]] of y */
        int32_t perm[LOOM_MAX_RANK];
        int32_t base = ops[0];
        memcpy(perm, n->attrs.perm, sizeof perm);
        /* transpose(f(transpose(y, p)), q) with p then q the identity is f(y) for an
         * elementwise unary f: layers that permute a result, apply an activation and
         * permute it back (one conv feeding another) then cost no pass over memory. */
        if (loom_ir_op_traits(x[0]->op)->unary &&
            g->nodes[x[0]->inputs[0]].op == LOOM_IR_OP_TRANSPOSE) {
            const loom_ir_node *t = &g->nodes[x[0]->inputs[0]];
            bool cancels = true;
            for (int32_t j = 0; j < n->rank; j++)
                cancels = cancels && t->attrs.perm[n->attrs.perm[j]] == j;
            if (cancels) {
                set_rebased(a, x[0], t->inputs[0]);
                a->desc.rank = n->rank;
                a->desc.shape = n->shape;
                return;
            }
        }
        if (x[0]->op == LOOM_IR_OP_TRANSPOSE) {
            for (int32_t j = 0; j < n->rank; j++)
                perm[j] = x[0]->attrs.perm[n->attrs.perm[j]];
            base = x[0]->inputs[0];
        }
        bool identity = true;
        for (int32_t j = 0; j < n->rank; j++)
            identity = identity && perm[j] == j;
        if (identity) {
            set_replace(a, base);
        } else if (base != ops[0]) {
            set_rebased(a, n, base);
            memcpy(a->desc.attrs.perm, perm, sizeof perm);
        }
        return;
    }
    case LOOM_IR_KIND_SLICE: {
        /* a slice of a fill is a fill; a slice that takes everything is its operand */
        if (x[0]->op == LOOM_IR_OP_CONSTANT) {
            set_constant(a, n, x[0]->attrs.value);
            return;
        }
        bool identity = same_shape(x[0], n->rank, n->shape);
        for (int32_t i = 0; i < n->rank && identity; i++)
            identity = n->attrs.start[i] == 0 && (n->attrs.step[i] == 1 || n->shape[i] <= 1);
        if (identity)
            set_replace(a, ops[0]);
        return;
    }
    case LOOM_IR_KIND_PAD: {
        if (same_shape(x[0], n->rank, n->shape)) { /* no padding on any axis */
            set_replace(a, ops[0]);
            return;
        }
        /* a fill padded with its own value (as stored in the dtype) */
        elem pv = {{0}};
        loom_ir_store_f64(pv.b, n->dtype, 0, n->attrs.value);
        elem cv = x[0]->op == LOOM_IR_OP_CONSTANT ? const_elem(x[0]) : pv;
        if (x[0]->op == LOOM_IR_OP_CONSTANT && memcmp(pv.b, cv.b, sizeof pv.b) == 0)
            set_constant(a, n, x[0]->attrs.value);
        return;
    }
    case LOOM_IR_KIND_CONCAT:
        if (n->n_inputs == 1)
            set_replace(a, ops[0]);
        return;
    case LOOM_IR_KIND_SOURCE:
    case LOOM_IR_KIND_PREDICATE:
    case LOOM_IR_KIND_COMPARE:
    case LOOM_IR_KIND_REDUCTION:
    case LOOM_IR_KIND_CONTRACTION:
    case LOOM_IR_KIND_CONV:
    case LOOM_IR_KIND_POOL:
    case LOOM_IR_KIND_IOTA:
    case LOOM_IR_KIND_RAND:
    case LOOM_IR_KIND_GATHER:
    case LOOM_IR_KIND_SCATTER:
    case LOOM_IR_KIND_ATTENTION:
    case LOOM_IR_KIND_COLLECTIVE:
    case LOOM_IR_KIND_COUNT_: return;
    }
}

/* ---- the pass ----------------------------------------------------------------------------- */

static loom_status fold_build(const loom_ir_graph *g, loom_ir_graph *out, int32_t *map,
                              loom_ir_diag *d) {
    int32_t small[16], *ops = small, max_in = 16;
    for (int32_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].n_inputs > max_in)
            max_in = g->nodes[i].n_inputs;
    if (max_in > 16 && !(ops = loom_ir_alloc(&g->alloc, (size_t)max_in * sizeof *ops)))
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    fold_action act;
    loom_status st = LOOM_OK;
    for (int32_t i = 0; i < g->n_nodes && st == LOOM_OK; i++) {
        const loom_ir_node *n = &g->nodes[i];
        for (int32_t k = 0; k < n->n_inputs; k++)
            ops[k] = map[n->inputs[k]];
        /* the rules look at up to 16 operands; a longer concat is kept as it is */
        if (n->n_inputs <= 16)
            simplify(out, n, ops, &act);
        else
            act.kind = FOLD_KEEP;
        switch (act.kind) {
        case FOLD_KEEP: map[i] = loom_pass_add_copy(out, n, ops, &st, d); break;
        case FOLD_REPLACE: map[i] = act.replace; break;
        case FOLD_NEW: st = loom_ir_graph_add(out, &act.desc, &map[i], d); break;
        }
    }
    for (int32_t o = 0; o < g->n_outputs && st == LOOM_OK; o++)
        if (loom_ir_graph_add_output(out, map[g->outputs[o].node], g->outputs[o].alias) != LOOM_OK)
            st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    out->n_graph_inputs = g->n_graph_inputs; /* inputs are never folded away */
    if (ops != small)
        loom_ir_free(&g->alloc, ops, (size_t)max_in * sizeof *ops);
    return st;
}

static loom_status fold_run(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d) {
    *out_changed = false;
    /* A dry run first: a graph with nothing to fold costs no allocation and stays as is. */
    fold_action act;
    bool any = false;
    for (int32_t i = 0; i < g->n_nodes && !any; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (n->n_inputs > 16)
            continue;
        simplify(g, n, n->inputs, &act);
        any = act.kind != FOLD_KEEP;
    }
    if (!any)
        return LOOM_OK;

    size_t map_bytes = (size_t)g->n_nodes * sizeof(int32_t);
    int32_t *map = loom_ir_alloc(&g->alloc, map_bytes);
    if (!map)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    loom_ir_graph out;
    loom_ir_graph_init(&out, &g->alloc);
    loom_status st = fold_build(g, &out, map, d);
    loom_ir_free(&g->alloc, map, map_bytes);
    bool dce_changed = false;
    if (st == LOOM_OK)
        st = loom_pass_dce.run(&out, &dce_changed, d);
    if (st != LOOM_OK) {
        loom_ir_graph_deinit(&out);
        return st;
    }
    loom_ir_graph_deinit(g);
    *g = out;
    *out_changed = true;
    return LOOM_OK;
}

const loom_pass loom_pass_fold = {.name = "fold", .run = fold_run};
