/* Dead-code elimination: keep what the outputs depend on, and the graph's inputs. */
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
    for (int32_t i = 0; i < g->n_nodes; i++)
        live[i] = g->nodes[i].op == LOOM_IR_OP_INPUT;
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
    size_t bytes = (size_t)g->n_outputs * sizeof(int32_t);
    if (g->n_outputs > 64) {
        roots = loom_ir_alloc(&g->alloc, bytes);
        aliases = loom_ir_alloc(&g->alloc, bytes);
    }
    loom_status st = LOOM_STATUS_OUT_OF_MEMORY;
    if (roots && aliases) {
        for (int32_t o = 0; o < g->n_outputs; o++) {
            roots[o] = g->outputs[o].node;
            aliases[o] = g->outputs[o].alias;
        }
        st = loom_ir_graph_extract(&out, g, g->n_outputs, roots, aliases, true, NULL);
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
