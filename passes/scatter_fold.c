/* Scatter-fold: the scatter_add into zeros that autograd records as a gather's gradient (an
 * embedding's table, cross-entropy's picked log-probability) folded into its readers,
 *
 *   s = scatter_add(0, idx, u)
 *   reduce_sum(s, A), s's axis in A   ->  reduce_sum(u, A)
 *   add(a, s) or add(s, a)            ->  scatter_add(a, idx, u)   (s read by nothing else)
 *
 * The sum of s over its scatter axis is the sum of u over that axis: every element of u lands
 * in its row (indices are clamped into it), and the zeros add nothing. The add's scatter
 * starts its sums from a instead of from zeros: the zero fill of s (GPT-2's wte gradient:
 * 51 MB) and the add's pass over a and s (154 MB) are gone, and cross-entropy's gradient no
 * longer reads its [N, V] scatter for the sum. Floats are added in another order (a + u1 + u2
 * instead of a + (u1 + u2)) where one row takes several elements of u: the results differ by
 * rounding; in 16-bit dtypes they are rounded once instead of twice.
 *
 * The sums are rewritten first, in graph order, so that an add after them finds s with no
 * other reader (cross-entropy's backward sums s, then adds it). Runs after fold (which turns a
 * broadcast zero into a constant), then DCE of what died. Errors: OUT_OF_MEMORY (the graph is
 * unchanged). */
#include <string.h>

#include "passes.h"

/* s is a scatter_add whose base is a constant zero. */
static bool zero_scatter(const loom_ir_graph *g, int32_t s) {
    const loom_ir_node *n = &g->nodes[s];
    if (n->op != LOOM_IR_OP_SCATTER_ADD)
        return false;
    const loom_ir_node *b = &g->nodes[n->inputs[0]];
    return b->op == LOOM_IR_OP_CONSTANT && b->attrs.value == 0.0;
}

/* The zero scatter that reduce_sum i sums over its scatter axis, or -1. */
static int32_t summed_scatter(const loom_ir_graph *g, int32_t i) {
    const loom_ir_node *n = &g->nodes[i];
    if (n->op != LOOM_IR_OP_REDUCE_SUM || !zero_scatter(g, n->inputs[0]))
        return -1;
    const loom_ir_node *s = &g->nodes[n->inputs[0]];
    return n->dtype == s->dtype && (n->attrs.axes >> s->attrs.index & 1u) ? n->inputs[0] : -1;
}

/* The operand (0 or 1) of add i that is a zero scatter to fold into the other, or -1: the
 * other of the add's own type, the scatter read by the add alone (uses[] counts readers). */
static int32_t added_scatter(const loom_ir_graph *g, int32_t i, const int32_t *uses) {
    const loom_ir_node *n = &g->nodes[i];
    if (n->op != LOOM_IR_OP_ADD || n->inputs[0] == n->inputs[1])
        return -1;
    for (int32_t k = 0; k < 2; k++) {
        int32_t s = n->inputs[k];
        const loom_ir_node *a = &g->nodes[n->inputs[1 - k]];
        if (zero_scatter(g, s) && uses[s] == 1 && a->dtype == n->dtype && a->rank == n->rank &&
            memcmp(a->shape, n->shape, (size_t)n->rank * sizeof n->shape[0]) == 0)
            return k;
    }
    return -1;
}

static loom_status run(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d) {
    *out_changed = false;
    bool any = false;
    for (int32_t i = 0; i < g->n_nodes && !any; i++)
        any = zero_scatter(g, i);
    if (!any) /* most graphs: nothing allocated */
        return LOOM_OK;
    const size_t bytes = (size_t)g->n_nodes * sizeof(int32_t);
    int32_t *uses = loom_ir_alloc(&g->alloc, bytes), *map = loom_ir_alloc(&g->alloc, bytes);
    loom_ir_graph out;
    loom_ir_graph_init(&out, &g->alloc);
    loom_status st = LOOM_OK;
    if (!uses || !map)
        st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    for (int32_t i = 0; i < g->n_nodes && st == LOOM_OK; i++)
        uses[i] = 0;
    for (int32_t i = 0; i < g->n_nodes && st == LOOM_OK; i++)
        for (int32_t k = 0; k < g->nodes[i].n_inputs; k++)
            uses[g->nodes[i].inputs[k]]++;
    for (int32_t o = 0; o < g->n_outputs && st == LOOM_OK; o++)
        uses[g->outputs[o].node]++;
    bool changed = false;
    for (int32_t i = 0; i < g->n_nodes && st == LOOM_OK; i++) {
        const loom_ir_node *n = &g->nodes[i];
        int32_t s = summed_scatter(g, i), k = s < 0 ? added_scatter(g, i, uses) : -1;
        if (s < 0 && k < 0) {
            map[i] = loom_pass_add_mapped(&out, g, i, map, &st, d);
            continue;
        }
        changed = true;
        if (s >= 0) { /* the sum of u */
            uses[s]--;
            int32_t u = map[g->nodes[s].inputs[2]];
            map[i] = loom_pass_add_copy(&out, n, &u, &st, d);
            continue;
        }
        const loom_ir_node *sn = &g->nodes[n->inputs[k]];
        int32_t in[3] = {map[n->inputs[1 - k]], map[sn->inputs[1]], map[sn->inputs[2]]};
        map[i] = loom_pass_add_node(&out,
                                    &(loom_ir_node_desc){.op = LOOM_IR_OP_SCATTER_ADD,
                                                         .n_inputs = 3,
                                                         .inputs = in,
                                                         .dtype = n->dtype,
                                                         .rank = n->rank,
                                                         .shape = n->shape,
                                                         .attrs = sn->attrs,
                                                         .loc = n->loc},
                                    &st, d);
    }
    if (st == LOOM_OK)
        loom_pass_add_outputs(&out, g, map, &st, d);
    if (uses)
        loom_ir_free(&g->alloc, uses, bytes);
    if (map)
        loom_ir_free(&g->alloc, map, bytes);
    if (st == LOOM_OK && !changed) {
        loom_ir_graph_deinit(&out);
        return LOOM_OK;
    }
    bool dce_changed = false;
    if (st == LOOM_OK)
        st = loom_pass_dce.run(&out, &dce_changed, d);
    return loom_pass_replace_graph(g, &out, st, out_changed);
}

const loom_pass loom_pass_scatter_fold = {"scatter-fold", run};
