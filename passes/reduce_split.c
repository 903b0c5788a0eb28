/* Splitting a large sum into few outputs in two: a reduction kernel runs one task per output
 * (codegen/lower_reduction.c), so a sum of a whole [50257, 256] gradient's squares (gradient
 * clipping's norm) ran on one thread: 7.6 ms of a GPT-2 step with the other core idle. Such a
 * sum, of an f32 value over A (two axes or more) into fewer than SPLIT_OUTPUTS_MAX outputs of
 * at least SPLIT_MIN_ELEMS summed elements each, becomes
 *
 *   p = reduce_sum(cast(x, f64), A without a0, keepdim)     one output per element of a0
 *   s = cast(reduce_sum(p, A, keepdim as before), f32)
 *
 * a0 the outermost axis of A at least SPLIT_MIN_ROWS long: the first sum runs a task per
 * element of a0, the second reads its few f64 partial sums. Both add in f64 (where the single
 * sum accumulated in f64 too), in another order: the results differ by f64 rounding before
 * the one rounding to f32 at the end (s is the f64 sum rounded, as before), equal in all but
 * a rare last bit. The cast joins the first sum's kernel (its prologue): x is read once.
 * Runs after fold. Errors: OUT_OF_MEMORY (the graph is unchanged). */
#include <string.h>

#include "passes.h"

enum {
    SPLIT_OUTPUTS_MAX = 16,    /* outputs of a sum split, fewer than */
    SPLIT_MIN_ELEMS = 1 << 20, /* summed elements per output, at least */
    SPLIT_MIN_ROWS = 64,       /* the extent of the axis the first sum keeps, at least */
};

/* The axis a sum i keeps in its first half, or -1 when i is not split. */
static int32_t split_axis(const loom_ir_graph *g, int32_t i) {
    const loom_ir_node *n = &g->nodes[i];
    if (n->op != LOOM_IR_OP_REDUCE_SUM || n->dtype != LOOM_DTYPE_F32)
        return -1;
    const loom_ir_node *x = &g->nodes[n->inputs[0]];
    if (x->dtype != LOOM_DTYPE_F32 || loom_ir_numel(n->rank, n->shape) >= SPLIT_OUTPUTS_MAX)
        return -1;
    int64_t summed = 1;
    int32_t axes = 0, a0 = -1;
    for (int32_t d = 0; d < x->rank; d++) {
        if (!(n->attrs.axes >> d & 1u))
            continue;
        summed *= x->shape[d];
        axes++;
        if (a0 < 0 && x->shape[d] >= SPLIT_MIN_ROWS)
            a0 = d;
    }
    return axes >= 2 && summed >= SPLIT_MIN_ELEMS ? a0 : -1;
}

/* A node of one operand into out. */
static int32_t add1(loom_ir_graph *out, loom_ir_op op, int32_t in, loom_dtype dt, int32_t rank,
                    const int64_t *shape, loom_ir_attrs attrs, loom_ir_loc loc, loom_status *st,
                    loom_ir_diag *d) {
    return loom_pass_add_node(out,
                              &(loom_ir_node_desc){.op = op,
                                                   .n_inputs = 1,
                                                   .inputs = &in,
                                                   .dtype = dt,
                                                   .rank = rank,
                                                   .shape = shape,
                                                   .attrs = attrs,
                                                   .loc = loc},
                              st, d);
}

static loom_status run(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d) {
    *out_changed = false;
    bool any = false;
    for (int32_t i = 0; i < g->n_nodes && !any; i++)
        any = split_axis(g, i) >= 0;
    if (!any) /* most graphs: nothing allocated */
        return LOOM_OK;
    const size_t bytes = (size_t)g->n_nodes * sizeof(int32_t);
    int32_t *map = loom_ir_alloc(&g->alloc, bytes);
    loom_ir_graph out;
    loom_ir_graph_init(&out, &g->alloc);
    loom_status st =
        map ? LOOM_OK : loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int32_t i = 0; i < g->n_nodes && st == LOOM_OK; i++) {
        const loom_ir_node *n = &g->nodes[i];
        int32_t a0 = split_axis(g, i);
        if (a0 < 0) {
            map[i] = loom_pass_add_mapped(&out, g, i, map, &st, d);
            continue;
        }
        const loom_ir_node *x = &g->nodes[n->inputs[0]];
        int64_t shape[LOOM_MAX_RANK];
        memcpy(shape, x->shape, sizeof shape);
        for (int32_t k = 0; k < x->rank; k++)
            if (k != a0 && (n->attrs.axes >> k & 1u))
                shape[k] = 1;
        loom_ir_attrs first = n->attrs;
        first.axes &= ~(1u << a0);
        first.keepdim = true;
        int32_t in = add1(&out, LOOM_IR_OP_CAST, map[n->inputs[0]], LOOM_DTYPE_F64, x->rank,
                          x->shape, (loom_ir_attrs){0}, n->loc, &st, d);
        in = add1(&out, LOOM_IR_OP_REDUCE_SUM, in, LOOM_DTYPE_F64, x->rank, shape, first, n->loc,
                  &st, d);
        in = add1(&out, LOOM_IR_OP_REDUCE_SUM, in, LOOM_DTYPE_F64, n->rank, n->shape, n->attrs,
                  n->loc, &st, d);
        map[i] = add1(&out, LOOM_IR_OP_CAST, in, LOOM_DTYPE_F32, n->rank, n->shape,
                      (loom_ir_attrs){0}, n->loc, &st, d);
    }
    if (st == LOOM_OK)
        loom_pass_add_outputs(&out, g, map, &st, d);
    if (map)
        loom_ir_free(&g->alloc, map, bytes);
    return loom_pass_replace_graph(g, &out, st, out_changed);
}

const loom_pass loom_pass_reduce_split = {"reduce-split", run};
