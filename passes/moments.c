/* Moments in one pass: a variance computed as the mean of squared deviations from a mean,
 *
 *   m = reduce_mean(x, A, keepdim)            v = reduce_mean(d * d, A, keepdim)
 *   d = x - broadcast(m)
 *
 * (batch norm's and layer norm's statistics, as the frontend records them) reads x twice,
 * one pass after the other. Both come from the sums of x and of x^2 instead, in f64:
 *
 *   s1 = reduce_mean(x64, A)   s2 = reduce_mean(x64 * x64, A)   x64 = cast(x, f64)
 *   m' = cast(s1)              v' = cast(relu(s2 - s1 * s1))
 *
 * two sums over the same operand, which fusion runs as one reduction kernel: x is read once.
 * m' is m bit for bit (the reduction sums f32 values in f64 either way and rounds the mean
 * once). v' differs from v by less than f32's rounding: the squares of f32 values are exact
 * in f64, the sums' relative error is about n 2^-53 (n the reduced elements), and the
 * difference loses what m^2 / v amplifies, far below 2^-24 for activations. The relu keeps a
 * constant channel's variance, whose rounding can leave s2 - s1^2 a hair below 0, at 0.
 *
 * Only f32 x (f64 would lose the precision it is asked for; 16-bit statistics are not
 * recorded: autocast runs normalisations in f32). d stays for its other readers (autograd's
 * backward reads x - m); the old v dies. Runs after CSE, before fold. Errors: OUT_OF_MEMORY
 * (the graph is unchanged). */
#include <string.h>

#include "passes.h"

/* The mean node m of which variance v = reduce_mean(d * d) takes the squared deviations,
 * d = x - broadcast(m) over v's axes, or -1. */
static int32_t variance_of(const loom_ir_graph *g, int32_t v) {
    const loom_ir_node *n = &g->nodes[v];
    if (n->op != LOOM_IR_OP_REDUCE_MEAN || n->dtype != LOOM_DTYPE_F32 || !n->attrs.keepdim)
        return -1;
    const loom_ir_node *sq = &g->nodes[n->inputs[0]];
    if (sq->op != LOOM_IR_OP_MUL || sq->inputs[0] != sq->inputs[1])
        return -1;
    const loom_ir_node *d = &g->nodes[sq->inputs[0]];
    if (d->op != LOOM_IR_OP_SUB)
        return -1;
    const loom_ir_node *b = &g->nodes[d->inputs[1]];
    if (b->op != LOOM_IR_OP_BROADCAST)
        return -1;
    int32_t m = b->inputs[0];
    const loom_ir_node *mn = &g->nodes[m];
    const loom_ir_node *x = &g->nodes[d->inputs[0]];
    if (mn->op != LOOM_IR_OP_REDUCE_MEAN || mn->inputs[0] != d->inputs[0] || !mn->attrs.keepdim ||
        mn->attrs.axes != n->attrs.axes || mn->dtype != LOOM_DTYPE_F32 ||
        x->dtype != LOOM_DTYPE_F32 || x->rank != d->rank ||
        memcmp(x->shape, d->shape, (size_t)x->rank * sizeof x->shape[0]) != 0)
        return -1;
    return m;
}

typedef struct mo_state {
    loom_ir_graph out;
    loom_ir_loc loc;
    loom_ir_diag *d;
    loom_status st;
} mo_state;

static int32_t add(mo_state *s, loom_ir_op op, int32_t a, int32_t b, loom_dtype dt,
                   const loom_ir_node *like, loom_ir_attrs attrs) {
    int32_t in[2] = {a, b};
    return loom_pass_add_node(&s->out,
                              &(loom_ir_node_desc){.op = op,
                                                   .n_inputs = b >= 0 ? 2 : 1,
                                                   .inputs = in,
                                                   .dtype = dt,
                                                   .rank = like->rank,
                                                   .shape = like->shape,
                                                   .attrs = attrs,
                                                   .loc = s->loc},
                              &s->st, s->d);
}

static loom_status run(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d) {
    *out_changed = false;
    bool any = false;
    for (int32_t i = 0; i < g->n_nodes && !any; i++)
        any = variance_of(g, i) >= 0;
    if (!any) /* most graphs: nothing allocated */
        return LOOM_OK;
    const size_t bytes = (size_t)g->n_nodes * sizeof(int32_t);
    /* var_of[m]: the variance taken around mean m (the first), or -1 */
    int32_t *var_of = loom_ir_alloc(&g->alloc, bytes), *map = loom_ir_alloc(&g->alloc, bytes);
    mo_state s = {.d = d, .st = LOOM_OK};
    loom_ir_graph_init(&s.out, &g->alloc);
    if (!var_of || !map)
        s.st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int32_t i = 0; i < g->n_nodes && s.st == LOOM_OK; i++)
        var_of[i] = map[i] = -1;
    for (int32_t i = 0; i < g->n_nodes && s.st == LOOM_OK; i++) {
        int32_t m = variance_of(g, i);
        if (m >= 0 && var_of[m] < 0)
            var_of[m] = i;
    }
    if (s.st == LOOM_OK) {
        const loom_ir_attrs none = {0};
        for (int32_t i = 0; i < g->n_nodes && s.st == LOOM_OK; i++) {
            int32_t v = var_of[i];
            if (map[i] >= 0) /* a variance, rewritten with its mean */
                continue;
            if (v < 0) {
                map[i] = loom_pass_add_mapped(&s.out, g, i, map, &s.st, d);
                continue;
            }
            const loom_ir_node *mn = &g->nodes[i], *vn = &g->nodes[v];
            const loom_ir_node *x = &g->nodes[mn->inputs[0]];
            s.loc = mn->loc;
            int32_t x64 = add(&s, LOOM_IR_OP_CAST, map[mn->inputs[0]], -1, LOOM_DTYPE_F64, x, none);
            int32_t s1 = add(&s, LOOM_IR_OP_REDUCE_MEAN, x64, -1, LOOM_DTYPE_F64, mn, mn->attrs);
            map[i] = add(&s, LOOM_IR_OP_CAST, s1, -1, LOOM_DTYPE_F32, mn, none);
            s.loc = vn->loc;
            int32_t sq = add(&s, LOOM_IR_OP_MUL, x64, x64, LOOM_DTYPE_F64, x, none);
            int32_t s2 = add(&s, LOOM_IR_OP_REDUCE_MEAN, sq, -1, LOOM_DTYPE_F64, vn, vn->attrs);
            int32_t m2 = add(&s, LOOM_IR_OP_MUL, s1, s1, LOOM_DTYPE_F64, mn, none);
            int32_t dv = add(&s, LOOM_IR_OP_SUB, s2, m2, LOOM_DTYPE_F64, vn, none);
            dv = add(&s, LOOM_IR_OP_RELU, dv, -1, LOOM_DTYPE_F64, vn, none);
            map[v] = add(&s, LOOM_IR_OP_CAST, dv, -1, LOOM_DTYPE_F32, vn, none);
        }
        loom_pass_add_outputs(&s.out, g, map, &s.st, d);
    }
    if (var_of)
        loom_ir_free(&g->alloc, var_of, bytes);
    if (map)
        loom_ir_free(&g->alloc, map, bytes);
    return loom_pass_replace_graph(g, &s.out, s.st, out_changed);
}

const loom_pass loom_pass_moments = {"moments", run};
