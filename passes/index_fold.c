/* Index-fold: gathers and scatters simplified against what surrounds them.
 *
 * A gather of an elementwise value reads a few of its elements (cross-entropy's label
 * log-probability: one of V = 50257 per row), yet the whole value was computed and stored
 * for it: the gather moves to the chain's leaves, which compute at the gathered elements only,
 *
 *   gather(f(x, broadcast(m), c), idx)  ->  f(gather(x, idx), broadcast(m), c')
 *
 * where f is a chain of elementwise ops (at most PUSH_MAX nodes), m has extent 1 along the
 * gather's axis (a row's max, its log-sum), c a constant (c' the constant of the indices'
 * shape), and the gather takes at most half of its axis. The values are the same bit for bit:
 * each op is evaluated at the same elements of the same operands.
 *
 * The scatter_add into zeros that autograd records as a gather's gradient (an embedding's
 * table, cross-entropy's picked log-probability) is folded into its readers,
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
 * One sweep in graph order; the sums are rewritten before the adds that follow them, so that
 * an add finds s with no other reader (cross-entropy's backward sums s, then adds it). Runs
 * after fold (which turns a broadcast zero into a constant), then DCE of what died. Errors:
 * OUT_OF_MEMORY (the graph is unchanged). */
#include "passes.h"

enum { PUSH_MAX = 32 }; /* elementwise nodes a gather moves through, at most */

/* ---- gathers of elementwise chains ------------------------------------------------------ */

typedef struct push_state {
    const loom_ir_graph *g;
    const loom_ir_node *gather; /* the gather being moved */
    loom_ir_graph *out;
    const int32_t *map;
    int32_t n, from[PUSH_MAX], to[PUSH_MAX]; /* the chain's nodes moved so far, and theirs */
    loom_status st;
    loom_ir_diag *d;
} push_state;

/* Node i's value at the gathered elements needs no gather of its own: a constant, or a
 * broadcast of a value of extent 1 along the axis (a = the gather's axis, in i's dims). */
static bool gather_free(const loom_ir_graph *g, int32_t i, int32_t a) {
    const loom_ir_node *n = &g->nodes[i];
    if (n->op == LOOM_IR_OP_CONSTANT)
        return true;
    if (n->op != LOOM_IR_OP_BROADCAST)
        return false;
    const loom_ir_node *m = &g->nodes[n->inputs[0]];
    int32_t off = n->rank - m->rank;
    return a < off || m->shape[a - off] == 1;
}

/* Node i is an elementwise op the gather moves through: its operands of its shape. */
static bool movable(const loom_ir_graph *g, int32_t i) {
    const loom_ir_node *n = &g->nodes[i];
    if (!loom_ir_op_traits(n->op)->loop)
        return false;
    for (int32_t k = 0; k < n->n_inputs; k++)
        if (!loom_ir_same_shape(&g->nodes[n->inputs[k]], n))
            return false;
    return true;
}

/* The nodes the gather of i moves through, counted into *n (stops past PUSH_MAX; shared
 * nodes counted once per path, an upper bound). */
static void count_chain(const loom_ir_graph *g, int32_t i, int32_t a, int32_t *n) {
    if (*n > PUSH_MAX || gather_free(g, i, a) || !movable(g, i))
        return;
    ++*n;
    for (int32_t k = 0; k < g->nodes[i].n_inputs; k++)
        count_chain(g, g->nodes[i].inputs[k], a, n);
}

/* The gather i moves through x's chain: a few elements of a longer axis, a chain of at
 * most PUSH_MAX elementwise nodes. */
static bool gather_moves(const loom_ir_graph *g, int32_t i) {
    const loom_ir_node *n = &g->nodes[i];
    if (n->op != LOOM_IR_OP_GATHER || !movable(g, n->inputs[0]))
        return false;
    int32_t a = (int32_t)n->attrs.index, count = 0;
    const loom_ir_node *x = &g->nodes[n->inputs[0]], *idx = &g->nodes[n->inputs[1]];
    if (2 * idx->shape[a] > x->shape[a])
        return false;
    count_chain(g, n->inputs[0], a, &count);
    return count <= PUSH_MAX;
}

/* Node i of the chain at the gathered elements, in s->out (its id there, or -1). */
static int32_t push(push_state *s, int32_t i) {
    const loom_ir_graph *g = s->g;
    const loom_ir_node *n = &g->nodes[i], *gn = s->gather;
    int32_t a = (int32_t)gn->attrs.index;
    for (int32_t k = 0; k < s->n; k++)
        if (s->from[k] == i)
            return s->to[k];
    const loom_ir_node *idx = &g->nodes[gn->inputs[1]];
    loom_ir_node_desc desc = {.op = n->op,
                              .dtype = n->dtype,
                              .rank = idx->rank,
                              .shape = idx->shape,
                              .attrs = n->attrs,
                              .loc = n->loc};
    int32_t in[3];
    if (n->op == LOOM_IR_OP_CONSTANT) {
        desc.n_inputs = 0;
    } else if (gather_free(g, i, a)) { /* the broadcast's operand to the indices' shape */
        in[0] = s->map[n->inputs[0]];
        desc.n_inputs = 1;
        if (loom_ir_same_shape(&g->nodes[n->inputs[0]], idx))
            return in[0];
    } else if (!movable(g, i)) { /* a leaf: gathered */
        in[0] = s->map[i];
        in[1] = s->map[gn->inputs[1]];
        desc = (loom_ir_node_desc){.op = LOOM_IR_OP_GATHER,
                                   .n_inputs = 2,
                                   .dtype = n->dtype,
                                   .rank = idx->rank,
                                   .shape = idx->shape,
                                   .attrs = gn->attrs,
                                   .loc = gn->loc};
    } else {
        desc.n_inputs = n->n_inputs;
        for (int32_t k = 0; k < n->n_inputs; k++)
            if ((in[k] = push(s, n->inputs[k])) < 0)
                return -1;
    }
    desc.inputs = in;
    int32_t id = loom_pass_add_node(s->out, &desc, &s->st, s->d);
    if (id >= 0 && s->n < PUSH_MAX) {
        s->from[s->n] = i;
        s->to[s->n++] = id;
    }
    return id;
}

/* ---- scatters into zeros ------------------------------------------------------------------ */

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
        if (zero_scatter(g, s) && uses[s] == 1 && a->dtype == n->dtype && loom_ir_same_shape(a, n))
            return k;
    }
    return -1;
}

static loom_status run(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d) {
    *out_changed = false;
    bool any = false;
    for (int32_t i = 0; i < g->n_nodes && !any; i++)
        any = zero_scatter(g, i) || gather_moves(g, i);
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
        if (gather_moves(g, i)) {
            push_state ps = {.g = g, .gather = n, .out = &out, .map = map, .st = st, .d = d};
            map[i] = push(&ps, n->inputs[0]);
            st = ps.st;
            changed = true;
            continue;
        }
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

const loom_pass loom_pass_index_fold = {"index-fold", run};
