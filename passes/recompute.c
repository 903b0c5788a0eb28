/* Recomputing cheap values at their readers instead of keeping them in memory.
 *
 * Fusion materializes a value that several kernels read (passes/fusion.c, rule 1): a
 * buffer alive from its producer to its last reader. In a training step that reader is
 * often in the backward, so the buffer lives through the whole forward. Two kinds of value
 * cost that memory for nothing, because reading them back costs as many bytes as computing
 * them again from what is in memory anyway:
 *  - A BROADCAST (a batch norm's per-channel mean, 1/std or weight, spread over
 *    [N, C, H, W]): its operand is smaller, and a reader that evaluates it at an index
 *    reads the operand at the mapped index.
 *  - An elementwise op (unary, binary, compare, select, cast) whose operands are
 *    broadcasts, constants, and one full-size value, its "leaf", read directly or through
 *    operands recomputed themselves (a chain), when the leaf stays alive at least as long
 *    as the op's value does, or is no larger (it then takes the value's place). A batch
 *    norm over a convolution's output x is such a chain, from (x - mean) to the ReLU: the
 *    backward recomputes it from x, which costs what keeping x - mean would in f32 and
 *    half of it in bf16, and the forward writes no x - mean. Only when every reader
 *    evaluates its operands at an index (no matmul, convolution, reshape, pad, concat or
 *    collective reads it): otherwise the value is materialized anyway. Small values of
 *    costly ops (under RC_MIN_BYTES) are kept.
 * Each reader that evaluates its operands at an index (elementwise and broadcast-like ops,
 * and reductions, whose prologue does) gets its own copy of such a value, of the values of
 * its chain and of the broadcasts they read, right before it; readers of other kinds keep
 * the shared node. Values with a single reader qualify too: copies of that reader would
 * otherwise all read one shared value.
 * Fusion then puts each copy in its reader's kernel. Nodes nothing reads any more are
 * dropped (DCE). "Alive" is judged by the position of a value's last reader in the node
 * order, which is the kernels' execution order. Runs after CSE, which would merge the
 * copies back, and before fusion.
 */
#include "passes.h"

enum { RC_NONE = 0, RC_BROADCAST = 1, RC_ELEMENTWISE = 2 };
enum { RC_MAX_DEPTH = 12 }; /* chains of copies: a batch norm's output from its input */
/* Smaller elementwise values computed by a costly op are kept: they cost little memory, and
 * recomputing one inside a larger loop (1/std under a broadcast) would evaluate it once per
 * element there. Cheap ones are still copied (an optimizer's found_inf test, which would
 * otherwise keep its update out of the weight gradient's epilogue). */
enum { RC_MIN_BYTES = 64 * 1024 };

typedef struct rc_state {
    const loom_ir_graph *g;
    loom_ir_graph out;
    int32_t *map;    /* g node -> out node (the shared original) */
    uint8_t *kind;   /* RC_*: how a node may be recomputed */
    int32_t *leaf;   /* RC_ELEMENTWISE: the full-size value it is recomputed from; else itself */
    int32_t *depth;  /* RC_ELEMENTWISE: copies stacked above its leaf (1: reads it directly) */
    int32_t *stamp;  /* per g node: the reader whose copy copy[] holds */
    int32_t *copy;   /* per g node: its copy for reader stamp[] */
    int32_t *inputs; /* scratch operand lists, RC_MAX_DEPTH + 1 of max_inputs each */
    int32_t max_inputs;
    loom_ir_diag *d;
    loom_status st;
} rc_state;

/* Whether reader u evaluates its operands at an index inside its kernel, so that a copy of
 * an operand joins it: elementwise ops, broadcasts, transposes, slices, and reductions (in
 * their prologue). */
static bool evaluates_operands(const loom_ir_graph *g, int32_t u) {
    return loom_ir_op_traits(g->nodes[u].op)->evaluates;
}

static bool is_costly(loom_ir_op op) {
    return op == LOOM_IR_OP_EXP || op == LOOM_IR_OP_LOG || op == LOOM_IR_OP_SQRT ||
           op == LOOM_IR_OP_RSQRT || op == LOOM_IR_OP_TANH || op == LOOM_IR_OP_SIGMOID ||
           op == LOOM_IR_OP_GELU || op == LOOM_IR_OP_DIV || op == LOOM_IR_OP_POW;
}

/* Sets s->kind for every node. last[i]: the position of i's last reader (INT32_MAX for
 * outputs); readers/fusing: how many operand slots read i, and how many of them evaluate
 * it at an index. */
static bool classify(rc_state *s, const int32_t *last, const int32_t *readers,
                     const int32_t *fusing, const uint8_t *is_output) {
    const loom_ir_graph *g = s->g;
    bool any = false;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        s->kind[i] = RC_NONE;
        s->leaf[i] = i;
        s->depth[i] = 0;
        if (is_output[i] || fusing[i] == 0)
            continue;
        /* with one reader too: copies of that reader may multiply it */
        if (n->op == LOOM_IR_OP_BROADCAST) {
            s->kind[i] = RC_BROADCAST;
        } else if (loom_ir_op_is_elementwise(n->op) && fusing[i] == readers[i]) {
            /* the one value read from memory at full size, through operands that are
             * recomputed themselves (a chain: cast, x - mean, * 1/std, ...) */
            int32_t leaf = -1, depth = 1;
            bool ok = true;
            for (int32_t k = 0; k < n->n_inputs && ok; k++) {
                int32_t x = n->inputs[k];
                const loom_ir_node *xn = &g->nodes[x];
                if (xn->op == LOOM_IR_OP_BROADCAST || xn->op == LOOM_IR_OP_CONSTANT)
                    continue;
                ok = leaf < 0 || s->leaf[x] == leaf; /* x * x reads one value */
                leaf = s->leaf[x];
                depth = s->depth[x] + 1 > depth ? s->depth[x] + 1 : depth;
            }
            /* Reading the leaf instead costs no memory when the leaf stays alive anyway,
             * or when it is no larger: it then takes this value's place (a bf16
             * convolution's output instead of its f32 normalization). */
            const loom_ir_node *ln = leaf >= 0 ? &g->nodes[leaf] : NULL;
            bool keep = is_costly(n->op) && loom_ir_node_bytes(n) < RC_MIN_BYTES;
            /* from a bool leaf: measured slower than reading the value (a max pool's
             * gradient mask cast to f32 for two readers; bool loads vectorize poorly) */
            keep = keep || (ln && ln->dtype == LOOM_DTYPE_BOOL && n->dtype != LOOM_DTYPE_BOOL);
            if (ok && ln && depth < RC_MAX_DEPTH && !keep &&
                (ln->op == LOOM_IR_OP_INPUT || last[leaf] >= last[i] ||
                 loom_ir_node_bytes(ln) <= loom_ir_node_bytes(n))) {
                s->kind[i] = RC_ELEMENTWISE;
                s->leaf[i] = leaf;
                s->depth[i] = depth;
            }
        }
        any = any || s->kind[i] != RC_NONE;
    }
    return any;
}

/* The operand x of reader u in the new graph: a copy made for u when x may be recomputed
 * and u evaluates it at an index, else the shared node. */
static int32_t operand(rc_state *s, int32_t u, int32_t reader, int32_t x, int32_t depth) {
    const loom_ir_graph *g = s->g;
    if (s->st != LOOM_OK)
        return -1;
    if (s->kind[x] == RC_NONE || depth >= RC_MAX_DEPTH || !evaluates_operands(g, u))
        return s->map[x];
    if (s->stamp[x] == reader) /* u's kernel already has a copy */
        return s->copy[x];
    const loom_ir_node *xn = &g->nodes[x];
    int32_t *in = s->inputs + (size_t)(depth + 1) * (size_t)s->max_inputs;
    for (int32_t k = 0; k < xn->n_inputs; k++)
        in[k] = operand(s, x, reader, xn->inputs[k], depth + 1);
    int32_t id = loom_pass_add_copy(&s->out, xn, in, &s->st, s->d);
    s->stamp[x] = reader;
    s->copy[x] = id;
    return id;
}

static void rebuild(rc_state *s) {
    const loom_ir_graph *g = s->g;
    for (int32_t i = 0; i < g->n_nodes && s->st == LOOM_OK; i++) {
        const loom_ir_node *n = &g->nodes[i];
        for (int32_t k = 0; k < n->n_inputs; k++)
            s->inputs[k] = operand(s, i, i, n->inputs[k], 0);
        s->map[i] = loom_pass_add_copy(&s->out, n, s->inputs, &s->st, s->d);
    }
    loom_pass_add_outputs(&s->out, g, s->map, &s->st, s->d);
}

static loom_status run(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d) {
    *out_changed = false;
    const int32_t n = g->n_nodes;
    int32_t max_inputs = 1;
    for (int32_t i = 0; i < n; i++)
        max_inputs = g->nodes[i].n_inputs > max_inputs ? g->nodes[i].n_inputs : max_inputs;
    const size_t words = (size_t)n * sizeof(int32_t);
    const size_t scratch = (size_t)(RC_MAX_DEPTH + 1) * (size_t)max_inputs * sizeof(int32_t);
    rc_state s = {.g = g, .d = d, .st = LOOM_OK, .max_inputs = max_inputs};
    int32_t *last = loom_ir_alloc(&g->alloc, words);
    int32_t *readers = loom_ir_alloc(&g->alloc, words);
    int32_t *fusing = loom_ir_alloc(&g->alloc, words);
    uint8_t *is_output = loom_ir_alloc(&g->alloc, (size_t)n);
    s.kind = loom_ir_alloc(&g->alloc, (size_t)n);
    s.map = loom_ir_alloc(&g->alloc, words);
    s.stamp = loom_ir_alloc(&g->alloc, words);
    s.copy = loom_ir_alloc(&g->alloc, words);
    s.leaf = loom_ir_alloc(&g->alloc, words);
    s.depth = loom_ir_alloc(&g->alloc, words);
    s.inputs = loom_ir_alloc(&g->alloc, scratch);
    loom_status st = LOOM_OK;
    if (!last || !readers || !fusing || !is_output || !s.kind || !s.map || !s.stamp || !s.copy ||
        !s.leaf || !s.depth || !s.inputs) {
        st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    for (int32_t i = 0; i < n; i++) {
        last[i] = -1;
        readers[i] = fusing[i] = 0;
        is_output[i] = 0;
        s.stamp[i] = -1;
    }
    for (int32_t o = 0; o < g->n_outputs; o++) {
        is_output[g->outputs[o].node] = 1;
        last[g->outputs[o].node] = INT32_MAX;
    }
    for (int32_t i = 0; i < n; i++) {
        bool evaluates = evaluates_operands(g, i);
        for (int32_t k = 0; k < g->nodes[i].n_inputs; k++) {
            int32_t x = g->nodes[i].inputs[k];
            last[x] = last[x] > i ? last[x] : i;
            readers[x]++;
            fusing[x] += evaluates;
        }
    }
    if (!classify(&s, last, readers, fusing, is_output))
        goto done;
    loom_ir_graph_init(&s.out, &g->alloc);
    rebuild(&s);
    st = loom_pass_replace_graph(g, &s.out, s.st, out_changed);
    if (st == LOOM_OK) { /* the shared nodes every reader now copies */
        bool dropped = false;
        st = loom_pass_dce.run(g, &dropped, d);
    }
done:
    loom_ir_free(&g->alloc, last, words);
    loom_ir_free(&g->alloc, readers, words);
    loom_ir_free(&g->alloc, fusing, words);
    loom_ir_free(&g->alloc, is_output, (size_t)n);
    loom_ir_free(&g->alloc, s.kind, (size_t)n);
    loom_ir_free(&g->alloc, s.map, words);
    loom_ir_free(&g->alloc, s.stamp, words);
    loom_ir_free(&g->alloc, s.copy, words);
    loom_ir_free(&g->alloc, s.leaf, words);
    loom_ir_free(&g->alloc, s.depth, words);
    loom_ir_free(&g->alloc, s.inputs, scratch);
    return st;
}

const loom_pass loom_pass_recompute = {"recompute", run};
