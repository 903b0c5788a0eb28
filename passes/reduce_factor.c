/* Factoring reductions: a sum (or mean) over axes A of a product in which some factors do
 * not vary along A takes those factors out: reduce_sum(a * b * w, A) with w a broadcast of a
 * value that is 1 on every axis of A becomes reduce_sum(a * b, A) * w', w' being w's operand
 * in the result's shape; constants (splats) come out the same way, and negations as one
 * negation of the result. The product is read through mul and neg nodes, whatever else reads
 * them; the factors left inside are multiplied in the order of their node ids, so that sums
 * of the same factors become identical nodes, which CSE then merges.
 *
 * What it is for: autograd's batch norm backward sums, over [N, H, W], dy, dy * xhat,
 * dy * w * (x - mean) and -dy * w / std: four passes over activation-sized values where two
 * distinct sums (of dy and of dy * (x - mean)) hold everything, as PyTorch's hand-written
 * batch norm backward computes them. After this pass and CSE they are two. Layer norm's
 * backward and a softmax's sum(dy * y * c) factor the same way.
 *
 * A sum whose terms cancel in exact arithmetic, c (x - mean(x)) with c the same along the
 * summed axes (sums_to_zero), becomes a constant 0: the variance's share of the mean's
 * gradient, which PyTorch's batch norm backward never computes.
 *
 * Only f32 and f64 sums: moving a factor out changes the rounding of the product (as XLA's
 * algebraic simplifier does), which in 16 bits would also drop a rounding per element.
 * Runs before CSE. Errors: OUT_OF_MEMORY (the graph is unchanged). */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

enum { RF_MAX_FACTORS = 16 };

typedef struct rf_product {
    int32_t var[RF_MAX_FACTORS], inv[RF_MAX_FACTORS];
    int32_t n_var, n_inv;
    bool neg;
} rf_product;

/* Whether leaf x of a sum over `axes` (of a rank-r operand) is the same all along them. */
static bool invariant(const loom_ir_graph *g, int32_t x, uint32_t axes, int32_t r) {
    const loom_ir_node *n = &g->nodes[x];
    if (n->op == LOOM_IR_OP_CONSTANT)
        return true;
    if (n->op != LOOM_IR_OP_BROADCAST)
        return false;
    const loom_ir_node *y = &g->nodes[n->inputs[0]];
    int32_t off = r - y->rank; /* numpy alignment: y's axis i is axis off + i */
    for (int32_t i = 0; i < y->rank; i++)
        if ((axes >> (off + i) & 1u) && y->shape[i] != 1)
            return false;
    return true;
}

/* The factors of x (through mul and neg): false when there are too many, or x is deeper
 * than a product of that many factors with a few negations can be (a chain of 100,000 muls
 * must not recurse 100,000 deep). */
static bool collect_at(const loom_ir_graph *g, int32_t x, uint32_t axes, int32_t r, rf_product *p,
                       int depth) {
    const loom_ir_node *n = &g->nodes[x];
    if ((n->op == LOOM_IR_OP_MUL || n->op == LOOM_IR_OP_NEG) && depth >= 4 * RF_MAX_FACTORS)
        return false;
    if (n->op == LOOM_IR_OP_MUL)
        return collect_at(g, n->inputs[0], axes, r, p, depth + 1) &&
               collect_at(g, n->inputs[1], axes, r, p, depth + 1);
    if (n->op == LOOM_IR_OP_NEG) {
        p->neg = !p->neg;
        return collect_at(g, n->inputs[0], axes, r, p, depth + 1);
    }
    if (invariant(g, x, axes, r)) {
        if (p->n_inv == RF_MAX_FACTORS)
            return false;
        p->inv[p->n_inv++] = x;
    } else {
        if (p->n_var == RF_MAX_FACTORS)
            return false;
        p->var[p->n_var++] = x;
    }
    return true;
}

static bool collect(const loom_ir_graph *g, int32_t x, uint32_t axes, int32_t r, rf_product *p) {
    return collect_at(g, x, axes, r, p, 0);
}

/* Whether v is x less its mean over axes within `axes`, broadcast back: v = sub(x,
 * broadcast(reduce_mean(x, A, keepdim))) with A a subset of axes, whose sum over axes is 0. */
static bool centered(const loom_ir_graph *g, int32_t v, uint32_t axes) {
    const loom_ir_node *n = &g->nodes[v];
    if (n->op != LOOM_IR_OP_SUB)
        return false;
    const loom_ir_node *b = &g->nodes[n->inputs[1]];
    if (b->op != LOOM_IR_OP_BROADCAST)
        return false;
    const loom_ir_node *m = &g->nodes[b->inputs[0]];
    return m->op == LOOM_IR_OP_REDUCE_MEAN && m->attrs.keepdim && m->inputs[0] == n->inputs[0] &&
           (m->attrs.axes & ~axes) == 0 && m->rank == n->rank;
}

/* Whether the sum of x over axes is 0 in exact arithmetic: x is a product of one centered
 * value (see centered) and factors that do not vary along the axes, or a sum, difference or
 * negation of such. Autograd's batch norm backward sums 2 c (x - mean) through the variance
 * into the mean's gradient: a full pass over the activations (and a copy of c (x - mean)
 * kept for it) for a rounding error, which PyTorch's batch norm backward never computes. */
static bool sums_to_zero(const loom_ir_graph *g, int32_t x, uint32_t axes, int32_t r, int depth) {
    const loom_ir_node *n = &g->nodes[x];
    if (depth > 8)
        return false;
    if (centered(g, x, axes))
        return true;
    if (n->op == LOOM_IR_OP_ADD || n->op == LOOM_IR_OP_SUB)
        return sums_to_zero(g, n->inputs[0], axes, r, depth + 1) &&
               sums_to_zero(g, n->inputs[1], axes, r, depth + 1);
    if (n->op == LOOM_IR_OP_NEG)
        return sums_to_zero(g, n->inputs[0], axes, r, depth + 1);
    if (n->op != LOOM_IR_OP_MUL)
        return false;
    rf_product p = {.n_var = 0, .n_inv = 0, .neg = false};
    return collect(g, x, axes, r, &p) && p.n_var == 1 && centered(g, p.var[0], axes);
}

typedef struct rf_state {
    const loom_ir_graph *g;
    loom_ir_graph out;
    int32_t *map; /* g node -> out node */
    loom_ir_loc loc;
    loom_ir_diag *d;
    loom_status st;
} rf_state;

static int32_t add(rf_state *s, loom_ir_op op, int32_t n_inputs, const int32_t *inputs,
                   loom_dtype dt, int32_t rank, const int64_t *shape, loom_ir_attrs attrs) {
    return loom_pass_add_node(&s->out,
                              &(loom_ir_node_desc){.op = op,
                                                   .n_inputs = n_inputs,
                                                   .inputs = inputs,
                                                   .dtype = dt,
                                                   .rank = rank,
                                                   .shape = shape,
                                                   .attrs = attrs,
                                                   .loc = s->loc},
                              &s->st, s->d);
}

static int32_t mul(rf_state *s, int32_t a, int32_t b) {
    const loom_ir_node *n = &s->out.nodes[a];
    return add(s, LOOM_IR_OP_MUL, 2, (int32_t[]){a, b}, n->dtype, n->rank, n->shape,
               (loom_ir_attrs){0});
}

/* Invariant factor x of sum node red (over red's operand) in red's result shape. */
static int32_t factor_value(rf_state *s, const loom_ir_node *red, int32_t x) {
    const loom_ir_graph *g = s->g;
    const loom_ir_node *n = &g->nodes[x], *op = &g->nodes[red->inputs[0]];
    if (n->op == LOOM_IR_OP_CONSTANT)
        return add(s, LOOM_IR_OP_CONSTANT, 0, NULL, red->dtype, red->rank, red->shape, n->attrs);
    /* the broadcast's operand, aligned to the sum's operand, with the summed axes dropped
     * (or kept as 1), then broadcast along the kept axes it does not span */
    const loom_ir_node *y = &g->nodes[n->inputs[0]];
    int64_t shape[LOOM_MAX_RANK];
    int32_t rank = 0, off = op->rank - y->rank;
    for (int32_t a = 0; a < op->rank; a++) {
        bool summed = red->attrs.axes >> a & 1u;
        if (summed && !red->attrs.keepdim)
            continue;
        shape[rank++] = summed || a < off ? 1 : y->shape[a - off];
    }
    int32_t v = s->map[n->inputs[0]];
    if (loom_ir_numel(rank, shape) != loom_ir_numel(y->rank, y->shape))
        return -1; /* not reached: the summed axes are 1 in y */
    if (rank != y->rank || memcmp(shape, y->shape, (size_t)rank * sizeof *shape) != 0)
        v = add(s, LOOM_IR_OP_RESHAPE, 1, &v, y->dtype, rank, shape, (loom_ir_attrs){0});
    if (memcmp(shape, red->shape, (size_t)rank * sizeof *shape) != 0)
        v = add(s, LOOM_IR_OP_BROADCAST, 1, &v, y->dtype, red->rank, red->shape,
                (loom_ir_attrs){0});
    return v;
}

static int cmp_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Node i (a sum or mean) rebuilt with its invariant factors outside, or -1 to copy it. */
static int32_t factored(rf_state *s, int32_t i) {
    const loom_ir_graph *g = s->g;
    const loom_ir_node *n = &g->nodes[i];
    if ((n->op != LOOM_IR_OP_REDUCE_SUM && n->op != LOOM_IR_OP_REDUCE_MEAN) ||
        (n->dtype != LOOM_DTYPE_F32 && n->dtype != LOOM_DTYPE_F64))
        return -1;
    const loom_ir_node *x = &g->nodes[n->inputs[0]];
    if (sums_to_zero(g, n->inputs[0], n->attrs.axes, x->rank, 0)) {
        s->loc = n->loc;
        return add(s, LOOM_IR_OP_CONSTANT, 0, NULL, n->dtype, n->rank, n->shape,
                   (loom_ir_attrs){.value = 0.0});
    }
    if (x->op != LOOM_IR_OP_MUL && x->op != LOOM_IR_OP_NEG)
        return -1;
    rf_product p = {.n_var = 0, .n_inv = 0, .neg = false};
    if (!collect(g, n->inputs[0], n->attrs.axes, x->rank, &p) || p.n_var == 0 ||
        (p.n_inv == 0 && !p.neg))
        return -1;
    qsort(p.var, (size_t)p.n_var, sizeof p.var[0], cmp_id);
    s->loc = n->loc;
    int32_t prod = s->map[p.var[0]];
    for (int32_t k = 1; k < p.n_var; k++)
        prod = mul(s, prod, s->map[p.var[k]]);
    int32_t v = loom_pass_add_copy(&s->out, n, &prod, &s->st, s->d);
    for (int32_t k = 0; k < p.n_inv && s->st == LOOM_OK; k++) {
        int32_t f = factor_value(s, n, p.inv[k]);
        if (f < 0)
            return s->st == LOOM_OK ? -1 : v;
        v = mul(s, v, f);
    }
    if (p.neg)
        v = add(s, LOOM_IR_OP_NEG, 1, &v, n->dtype, n->rank, n->shape, (loom_ir_attrs){0});
    return v;
}

static loom_status run(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d) {
    *out_changed = false;
    bool any = false;
    for (int32_t i = 0; i < g->n_nodes && !any; i++) {
        const loom_ir_node *n = &g->nodes[i];
        loom_ir_op xop = n->n_inputs > 0 ? g->nodes[n->inputs[0]].op : LOOM_IR_OP_COUNT_;
        any = (n->op == LOOM_IR_OP_REDUCE_SUM || n->op == LOOM_IR_OP_REDUCE_MEAN) &&
              (xop == LOOM_IR_OP_MUL || xop == LOOM_IR_OP_NEG || xop == LOOM_IR_OP_ADD ||
               xop == LOOM_IR_OP_SUB);
    }
    if (!any)
        return LOOM_OK;
    const size_t bytes = (size_t)g->n_nodes * sizeof(int32_t);
    rf_state s = {.g = g, .d = d, .st = LOOM_OK};
    loom_ir_graph_init(&s.out, &g->alloc);
    s.map = loom_ir_alloc(&g->alloc, bytes);
    if (!s.map)
        s.st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    bool changed = false;
    for (int32_t i = 0; i < g->n_nodes && s.st == LOOM_OK; i++) {
        int32_t v = factored(&s, i);
        changed = changed || v >= 0;
        s.map[i] = v >= 0 ? v : loom_pass_add_mapped(&s.out, g, i, s.map, &s.st, d);
    }
    loom_pass_add_outputs(&s.out, g, s.map, &s.st, d);
    loom_ir_free(&g->alloc, s.map, bytes);
    if (!changed && s.st == LOOM_OK) {
        loom_ir_graph_deinit(&s.out);
        return LOOM_OK;
    }
    return loom_pass_replace_graph(g, &s.out, s.st, out_changed);
}

const loom_pass loom_pass_reduce_factor = {"reduce-factor", run};
