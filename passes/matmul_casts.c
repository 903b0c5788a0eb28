/* Private casts for 16-bit matmuls: a cast to bf16/f16 read by several matmuls (the
 * autocast of a weight, used by the forward and by the backward's input gradient; of an
 * activation, used by the next layer and by the weight gradient) would be a value shared by
 * several kernels, so fusion would materialize it: a pass over memory of its own. Each
 * 16-bit matmul instead evaluates its operands while it packs them
 * (loom_ir_matmul_operand_fuses), so this pass gives every such matmul its own copy of the
 * cast, and of the transpose between them, right before it. A cast that something else
 * reads keeps its node for those readers. Run after CSE, which would merge the copies. */
#include "passes.h"

typedef struct mc_state {
    loom_ir_graph out;
    int32_t *map; /* g node -> out node */
    loom_status st;
} mc_state;

/* A cast of an f32 value to a 16-bit float: what packing can convert. */
static bool is_pack_cast(const loom_ir_graph *g, int32_t c) {
    const loom_ir_node *n = &g->nodes[c];
    return n->op == LOOM_IR_OP_CAST &&
           (n->dtype == LOOM_DTYPE_BF16 || n->dtype == LOOM_DTYPE_F16) &&
           g->nodes[n->inputs[0]].dtype == LOOM_DTYPE_F32;
}

/* The cast that operand x of 16-bit matmul mm is (directly, or through one transpose), or
 * -1. */
static int32_t pack_cast_of(const loom_ir_graph *g, int32_t mm, int32_t x) {
    if (!loom_ir_matmul_operand_fuses(g, mm, x))
        return -1;
    if (g->nodes[x].op == LOOM_IR_OP_TRANSPOSE)
        x = g->nodes[x].inputs[0];
    return is_pack_cast(g, x) ? x : -1;
}

static loom_status run(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d) {
    *out_changed = false;
    /* readers[c]: how many matmul operand slots read cast c through packing (directly or
     * through a transpose); others[x]: whether anything else reads x (or it is an output) */
    const size_t n0 = (size_t)g->n_nodes, bytes = n0 * sizeof(int32_t); /* g is replaced */
    int32_t *readers = loom_ir_alloc(&g->alloc, bytes);
    uint8_t *others = loom_ir_alloc(&g->alloc, n0);
    if (!readers || !others) {
        loom_ir_free(&g->alloc, readers, bytes);
        loom_ir_free(&g->alloc, others, n0);
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    for (int32_t i = 0; i < g->n_nodes; i++)
        readers[i] = others[i] = 0;
    for (int32_t o = 0; o < g->n_outputs; o++)
        others[g->outputs[o].node] = 1;
    bool any = false;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        for (int32_t k = 0; k < n->n_inputs; k++) {
            int32_t x = n->inputs[k];
            int32_t c = n->op == LOOM_IR_OP_MATMUL ? pack_cast_of(g, i, x) : -1;
            if (c >= 0)
                readers[c]++;
            else if (!(n->op == LOOM_IR_OP_TRANSPOSE && is_pack_cast(g, x)))
                others[x] = 1; /* a transpose of a cast is settled below, by its readers */
        }
    }
    /* a transpose of a cast that something besides packing reads needs the cast too */
    for (int32_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == LOOM_IR_OP_TRANSPOSE && is_pack_cast(g, g->nodes[i].inputs[0]) &&
            others[i])
            others[g->nodes[i].inputs[0]] = 1;
    for (int32_t i = 0; i < g->n_nodes && !any; i++)
        any = is_pack_cast(g, i) && readers[i] > 1;
    loom_status st = LOOM_OK;
    if (any) {
        mc_state s = {.st = LOOM_OK};
        loom_ir_graph_init(&s.out, &g->alloc);
        s.map = loom_ir_alloc(&g->alloc, bytes);
        if (!s.map)
            s.st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
        for (int32_t i = 0; i < g->n_nodes && s.st == LOOM_OK; i++) {
            const loom_ir_node *n = &g->nodes[i];
            s.map[i] = -1;
            /* a shared cast (or transpose of one) read only by packing: copied at each
             * reader below instead */
            bool shared_cast = is_pack_cast(g, i) && readers[i] > 1 && !others[i];
            bool via = n->op == LOOM_IR_OP_TRANSPOSE && is_pack_cast(g, n->inputs[0]) &&
                       readers[n->inputs[0]] > 1 && !others[i];
            if (shared_cast || via)
                continue;
            int32_t in[3];
            int32_t small = n->n_inputs <= 3;
            for (int32_t k = 0; k < n->n_inputs && small; k++) {
                int32_t x = n->inputs[k];
                int32_t c = n->op == LOOM_IR_OP_MATMUL ? pack_cast_of(g, i, x) : -1;
                if (c < 0 || readers[c] < 2 || (others[c] && x == c) ||
                    (x != c && others[x])) {
                    in[k] = s.map[x];
                    continue;
                }
                /* a private copy of the cast, and of the transpose when there is one */
                int32_t src = s.map[g->nodes[c].inputs[0]];
                int32_t v = loom_pass_add_copy(&s.out, &g->nodes[c], &src, &s.st, d);
                if (x != c && v >= 0)
                    v = loom_pass_add_copy(&s.out, &g->nodes[x], &v, &s.st, d);
                in[k] = v;
            }
            if (small) {
                s.map[i] = loom_pass_add_copy(&s.out, n, in, &s.st, d);
                continue;
            }
            /* wide nodes (concat) read no matmul operand slot */
            s.map[i] = loom_pass_add_mapped(&s.out, g, i, s.map, &s.st, d);
        }
        loom_pass_add_outputs(&s.out, g, s.map, &s.st, d);
        loom_ir_free(&g->alloc, s.map, bytes);
        st = loom_pass_replace_graph(g, &s.out, s.st, out_changed);
    }
    loom_ir_free(&g->alloc, readers, bytes);
    loom_ir_free(&g->alloc, others, n0);
    return st;
}

const loom_pass loom_pass_matmul_casts = {"matmul-casts", run};
