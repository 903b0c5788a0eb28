/* Dead-code elimination: keep what the outputs and the ops with side effects (collectives)
 * depend on, and the graph's inputs. */
#include "passes.h"

static loom_status dce_run(loom_ir_graph *g, bool *out_changed, loom_ir_diag *d) {
    *out_changed = false;
    /* Cheap check first: most graphs reaching the pass have no dead nodes. */
    int32_t n_live = 0;
    uint8_t small[1024];
    uint8_t *live = small;
    if (g->n_nodes > (int32_t)sizeof small) {
        live = loom_ir_alloc(&g->alloc, (size_t)g->n_nodes);
        if (!live)
            return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    int32_t n_effects = 0; /* side-effect nodes: roots besides the outputs */
    for (int32_t i = 0; i < g->n_nodes; i++) {
        bool effect = (loom_ir_op_table[g->nodes[i].op].flags & LOOM_IR_OPF_SIDE_EFFECT) != 0;
        live[i] = g->nodes[i].op == LOOM_IR_OP_INPUT || effect;
        n_effects += effect;
    }
    for (int32_t o = 0; o < g->n_outputs; o++)
        live[g->outputs[o].node] = 1;
    for (int32_t i = g->n_nodes - 1; i >= 0; i--)
        if (live[i])
            for (int32_t k = 0; k < g->nodes[i].n_inputs; k++)
                live[g->nodes[i].inputs[k]] = 1;
    for (int32_t i = 0; i < g->n_nodes; i++)
        n_live += live[i];
    if (live != small)
        loom_ir_free(&g->alloc, live, (size_t)g->n_nodes);
    if (n_live == g->n_nodes)
        return LOOM_OK;

    loom_ir_graph out;
    loom_ir_graph_init(&out, &g->alloc);
    int32_t roots_small[64], aliases_small[64];
    int32_t *roots = roots_small, *aliases = aliases_small;
    int32_t n_roots = g->n_outputs + n_effects;
    size_t bytes = (size_t)n_roots * sizeof(int32_t);
    if (n_roots > 64) {
        roots = loom_ir_alloc(&g->alloc, bytes);
        aliases = loom_ir_alloc(&g->alloc, bytes);
    }
    loom_status st = LOOM_STATUS_OUT_OF_MEMORY;
    if (roots && aliases) {
        for (int32_t o = 0; o < g->n_outputs; o++) {
            roots[o] = g->outputs[o].node;
            aliases[o] = g->outputs[o].alias;
        }
        int32_t r = g->n_outputs;
        for (int32_t i = 0; i < g->n_nodes; i++)
            if (loom_ir_op_table[g->nodes[i].op].flags & LOOM_IR_OPF_SIDE_EFFECT) {
                roots[r] = i;
                aliases[r++] = -1;
            }
        st = loom_ir_graph_extract(&out, g, n_roots, roots, aliases, true, NULL);
        if (st == LOOM_OK)
            out.n_outputs = g->n_outputs; /* the extra roots were kept, not returned */
    }
    if (roots != roots_small) {
        loom_ir_free(&g->alloc, roots, bytes);
        loom_ir_free(&g->alloc, aliases, bytes);
    }
    if (st != LOOM_OK) {
        loom_ir_graph_deinit(&out);
        return loom_ir_diag_set(d, st, "out of memory");
    }
    loom_ir_graph_deinit(g);
    *g = out;
    *out_changed = true;
    return LOOM_OK;
}

const loom_pass loom_pass_dce = {.name = "dce", .run = dce_run};
