/* The pass manager: runs passes in order, verifying after each on request; and the default
 * JIT pipeline from a traced graph to a verified execution plan. */
#include <math.h>
#include <string.h>

#include "passes.h"

/* The registered passes, in the default JIT pipeline's order (loom_pass_build_plan). */
static const loom_pass *const all_passes[] = {&loom_pass_autocast,     &loom_pass_conv_decompose,
                                              &loom_pass_dce,          &loom_pass_reduce_factor,
                                              &loom_pass_cse,          &loom_pass_moments,
                                              &loom_pass_fold,         &loom_pass_index_fold,
                                              &loom_pass_reduce_split, &loom_pass_matmul_casts,
                                              &loom_pass_recompute};

const loom_pass *loom_pass_find(const char *name) {
    for (size_t i = 0; i < sizeof all_passes / sizeof all_passes[0]; i++)
        if (strcmp(all_passes[i]->name, name) == 0)
            return all_passes[i];
    return NULL;
}

const loom_pass *const *loom_pass_all(int32_t *out_n) {
    *out_n = (int32_t)(sizeof all_passes / sizeof all_passes[0]);
    return all_passes;
}

loom_status loom_pass_replace_graph(loom_ir_graph *g, loom_ir_graph *out, loom_status st,
                                    bool *out_changed) {
    if (st != LOOM_OK) {
        loom_ir_graph_deinit(out);
        return st;
    }
    out->n_graph_inputs = g->n_graph_inputs;
    loom_ir_graph_deinit(g);
    *g = *out;
    *out_changed = true;
    return LOOM_OK;
}

int32_t loom_pass_add_node(loom_ir_graph *out, const loom_ir_node_desc *desc, loom_status *st,
                           loom_ir_diag *d) {
    if (*st != LOOM_OK)
        return -1;
    int32_t id;
    *st = loom_ir_graph_add(out, desc, &id, d);
    return *st == LOOM_OK ? id : -1;
}

int32_t loom_pass_add_copy(loom_ir_graph *out, const loom_ir_node *n, const int32_t *inputs,
                           loom_status *st, loom_ir_diag *d) {
    return loom_pass_add_node(out,
                              &(loom_ir_node_desc){.op = n->op,
                                                   .n_inputs = n->n_inputs,
                                                   .inputs = inputs,
                                                   .dtype = n->dtype,
                                                   .rank = n->rank,
                                                   .shape = n->shape,
                                                   .attrs = n->attrs,
                                                   .loc = n->loc},
                              st, d);
}

int32_t loom_pass_add_mapped(loom_ir_graph *out, const loom_ir_graph *g, int32_t i,
                             const int32_t *map, loom_status *st, loom_ir_diag *d) {
    const loom_ir_node *n = &g->nodes[i];
    int32_t small[4] = {0}, *in = small;
    size_t bytes = (size_t)n->n_inputs * sizeof *in;
    if (*st != LOOM_OK)
        return -1;
    if (n->n_inputs > 4 && !(in = loom_ir_alloc(&out->alloc, bytes))) {
        *st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
        return -1;
    }
    for (int32_t k = 0; k < n->n_inputs; k++)
        in[k] = map[n->inputs[k]];
    int32_t id = loom_pass_add_copy(out, n, in, st, d);
    if (in != small)
        loom_ir_free(&out->alloc, in, bytes);
    return id;
}

void loom_pass_add_outputs(loom_ir_graph *out, const loom_ir_graph *g, const int32_t *map,
                           loom_status *st, loom_ir_diag *d) {
    for (int32_t o = 0; o < g->n_outputs && *st == LOOM_OK; o++)
        if (loom_ir_graph_add_output(out, map[g->outputs[o].node], g->outputs[o].alias) != LOOM_OK)
            *st = loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "out of memory");
}

loom_status loom_pass_run_pipeline(loom_ir_graph *g, const loom_pass *const *passes,
                                   int32_t n_passes, const loom_pass_options *opts,
                                   loom_ir_diag *d) {
    for (int32_t i = 0; i < n_passes; i++) {
        bool changed = false;
        loom_ir_diag sub;
        loom_ir_diag_init(&sub);
        loom_status st = passes[i]->run(g, &changed, &sub);
        if (st == LOOM_OK && opts && opts->verify_each)
            st = loom_ir_graph_verify(g, &sub);
        if (st != LOOM_OK) {
            if (d && d->code == LOOM_OK)
                d->node = sub.node;
            return loom_ir_diag_set(d, st, "pass %s: %s", passes[i]->name, sub.msg);
        }
        if (opts && opts->after_pass)
            opts->after_pass(passes[i]->name, changed, g, opts->ud);
    }
    return LOOM_OK;
}

/* The graph input whose buffer output o's copy reads (its node, through reshapes, is that
 * INPUT), or -1. */
static int32_t output_reads_input(const loom_ir_graph *g, int32_t o) {
    int32_t b = g->outputs[o].node;
    while (g->nodes[b].op == LOOM_IR_OP_RESHAPE)
        b = g->nodes[b].inputs[0];
    return g->nodes[b].op == LOOM_IR_OP_INPUT ? (int32_t)g->nodes[b].attrs.index : -1;
}

/* The output donated into input i, or -1 (an input is donated into at most once). */
static int32_t output_writing(const loom_ir_graph *g, int32_t i) {
    for (int32_t q = 0; q < g->n_outputs; q++)
        if (g->outputs[q].alias == i)
            return q;
    return -1;
}

/* Outputs that return a graph input while another output is donated into that input must
 * be copied before that other output's copy. When such outputs form a cycle (out0 = in1
 * into in0, out1 = in0 into in1), no order of copies works: one output per cycle is
 * redirected to a cast of its value to its own dtype, so a kernel copies the input into
 * the arena while every input is still intact. (Added after fold, which removes such
 * casts.) */
static loom_status copy_exchanged_inputs(loom_ir_graph *g, loom_ir_diag *d) {
    for (int32_t o = 0; o < g->n_outputs; o++) {
        /* follow o -> the output writing the input o reads -> ...; a cycle returns to o */
        int32_t at = o;
        bool cycle = false;
        for (int32_t step = 0; step < g->n_outputs && !cycle; step++) {
            int32_t in = output_reads_input(g, at);
            int32_t next = in >= 0 ? output_writing(g, in) : -1;
            if (next < 0 || next == at) /* the chain ends, or an input returned into itself */
                break;
            cycle = next == o;
            at = next;
        }
        if (!cycle)
            continue;
        int32_t x = g->outputs[o].node;
        loom_ir_node_desc desc = {.op = LOOM_IR_OP_CAST,
                                  .n_inputs = 1,
                                  .inputs = &x,
                                  .dtype = g->nodes[x].dtype,
                                  .loc = g->nodes[x].loc};
        int32_t id;
        loom_status st = loom_ir_graph_add(g, &desc, &id, d);
        if (st != LOOM_OK)
            return st;
        g->outputs[o].node = id;
    }
    return LOOM_OK;
}

/* loom_pass_options.allreduce_bucket_mb in bytes. */
static int64_t bucket_bytes(double mb) {
    if (mb == 0 || isnan(mb))
        mb = 25;
    if (mb < 0)
        return 0;
    double b = mb * 1024 * 1024;
    return b >= 0x1p62 ? INT64_MAX : (int64_t)b;
}

loom_status loom_pass_build_plan(loom_ir_graph *g, const loom_pass_options *opts,
                                 loom_ir_plan *plan, loom_ir_diag *d) {
    if (!g || !plan)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "build plan: %s is NULL",
                                !g ? "the graph" : "the plan");
    loom_status st = loom_pass_run_pipeline(
        g, all_passes, (int32_t)(sizeof all_passes / sizeof all_passes[0]), opts, d);
    if (st != LOOM_OK)
        return st;
    int64_t bucket = bucket_bytes(opts ? opts->allreduce_bucket_mb : 0);
    if ((st = loom_pass_fuse(g, plan, d)) != LOOM_OK ||
        (st = loom_pass_bucket_allreduces(g, plan, bucket, d)) != LOOM_OK)
        return st;
    loom_ir_diag sub;
    loom_ir_diag_init(&sub);
    st = loom_pass_plan_memory(g, plan, &sub);
    if (st == LOOM_STATUS_UNSUPPORTED) {
        loom_ir_diag_init(&sub);
        st = copy_exchanged_inputs(g, &sub);
        if (st == LOOM_OK)
            st = loom_pass_fuse(g, plan, &sub);
        if (st == LOOM_OK)
            st = loom_pass_bucket_allreduces(g, plan, bucket, &sub);
        if (st == LOOM_OK)
            st = loom_pass_plan_memory(g, plan, &sub);
    }
    if (st != LOOM_OK)
        return loom_ir_diag_set(d, st, "%s", sub.msg);
    return loom_ir_plan_verify(plan, g, d);
}
