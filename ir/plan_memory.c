/* The planned memory report: where a plan's memory peaks and what is alive there, before
 * anything runs (plan.h). A value in the arena lives from the kernel that writes it to the
 * last kernel that reads it (through views), to the end when a copy reads it, and at least
 * until a collective writing it completes; output buffers that alias no input are the
 * caller's for the whole step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

/* first[i]/last[i]: the kernels arena value i is alive over; -1 for other nodes. */
static void lifetimes(const loom_ir_plan *p, const loom_ir_graph *g, int32_t *first,
                      int32_t *last) {
    for (int32_t i = 0; i < g->n_nodes; i++)
        first[i] = last[i] = -1;
    for (int32_t k = 0; k < p->n_kernels; k++) {
        const loom_ir_kernel *kn = &p->kernels[k];
        for (int32_t r = 0; r < kn->n_results; r++) {
            int32_t x = kn->results[r];
            first[x] = k;
            last[x] =
                kn->kind == LOOM_IR_KERNEL_COLLECTIVE && kn->wait_before > k ? kn->wait_before : k;
        }
        for (int32_t a = 0; a < kn->n_args; a++) {
            int32_t b = loom_ir_view_base(g, kn->args[a]);
            if (first[b] >= 0 && k > last[b])
                last[b] = k;
        }
    }
    for (int32_t c = 0; c < p->n_copies; c++) {
        int32_t b = loom_ir_view_base(g, p->copies[c].node);
        if (first[b] >= 0)
            last[b] = p->n_kernels;
    }
    for (int32_t i = 0; i < g->n_nodes; i++)
        if (!p->has_placement[i] || p->placement[i].kind != LOOM_IR_BUFFER_ARENA ||
            g->nodes[i].op == LOOM_IR_OP_RESHAPE)
            first[i] = last[i] = -1;
}

/* Output buffers the caller allocates for the step: outputs that alias no input, once each. */
static size_t output_bytes(const loom_ir_plan *p, const loom_ir_graph *g) {
    size_t total = 0;
    for (int32_t o = 0; o < g->n_outputs; o++)
        if (g->outputs[o].alias < 0)
            total += loom_ir_node_bytes(&g->nodes[g->outputs[o].node]);
    return total;
}

static int by_bytes(const void *a, const void *b) {
    const loom_ir_live_value *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return (x->node > y->node) - (x->node < y->node);
}

loom_status loom_ir_plan_memory(const loom_ir_plan *p, const loom_ir_graph *g,
                                loom_ir_memory_report *out) {
    if (!p || !g || !out || p->n_nodes != g->n_nodes)
        return LOOM_STATUS_INVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    out->alloc = p->alloc;
    out->peak_bytes = p->peak_bytes;
    out->arena_bytes = p->arena_bytes;
    out->output_bytes = output_bytes(p, g);
    out->peak_kernel = -1;
    int32_t n = g->n_nodes, K = p->n_kernels;
    if (n == 0 || K == 0)
        return LOOM_OK;
    size_t bytes = (size_t)n * 2 * sizeof(int32_t) + (size_t)(K + 2) * sizeof(int64_t);
    int32_t *first = loom_ir_alloc(&p->alloc, bytes);
    if (!first)
        return LOOM_STATUS_OUT_OF_MEMORY;
    int32_t *last = first + n;
    int64_t *delta = (int64_t *)(last + n); /* live arena bytes change at each kernel */
    lifetimes(p, g, first, last);
    memset(delta, 0, (size_t)(K + 2) * sizeof *delta);
    for (int32_t i = 0; i < n; i++)
        if (first[i] >= 0) {
            delta[first[i]] += (int64_t)p->placement[i].bytes;
            delta[last[i] + 1] -= (int64_t)p->placement[i].bytes;
        }
    out->live_per_kernel = loom_ir_alloc(&p->alloc, (size_t)K * sizeof *out->live_per_kernel);
    if (!out->live_per_kernel) {
        loom_ir_free(&p->alloc, first, bytes);
        return LOOM_STATUS_OUT_OF_MEMORY;
    }
    out->n_kernels = K;
    int64_t live = 0;
    for (int32_t k = 0; k < K; k++) {
        live += delta[k];
        out->live_per_kernel[k] = (size_t)live + out->output_bytes;
        if (out->peak_kernel < 0 || out->live_per_kernel[k] > out->live_bytes) {
            out->peak_kernel = k;
            out->live_bytes = out->live_per_kernel[k];
        }
    }
    /* the live set at the peak: its arena values and the output buffers, largest first */
    int32_t n_live = 0;
    for (int32_t i = 0; i < n; i++)
        n_live += first[i] >= 0 && first[i] <= out->peak_kernel && last[i] >= out->peak_kernel;
    for (int32_t o = 0; o < g->n_outputs; o++)
        n_live += g->outputs[o].alias < 0;
    out->live = loom_ir_alloc(&p->alloc, (size_t)(n_live ? n_live : 1) * sizeof *out->live);
    if (!out->live) {
        loom_ir_free(&p->alloc, first, bytes);
        loom_ir_memory_report_deinit(out);
        return LOOM_STATUS_OUT_OF_MEMORY;
    }
    for (int32_t i = 0; i < n; i++)
        if (first[i] >= 0 && first[i] <= out->peak_kernel && last[i] >= out->peak_kernel)
            out->live[out->n_live++] = (loom_ir_live_value){
                .node = i, .bytes = p->placement[i].bytes, .kind = LOOM_IR_BUFFER_ARENA};
    for (int32_t o = 0; o < g->n_outputs; o++)
        if (g->outputs[o].alias < 0)
            out->live[out->n_live++] =
                (loom_ir_live_value){.node = g->outputs[o].node,
                                     .bytes = loom_ir_node_bytes(&g->nodes[g->outputs[o].node]),
                                     .kind = LOOM_IR_BUFFER_OUTPUT,
                                     .output = o};
    qsort(out->live, (size_t)out->n_live, sizeof *out->live, by_bytes);
    loom_ir_free(&p->alloc, first, bytes);
    return LOOM_OK;
}

void loom_ir_memory_report_deinit(loom_ir_memory_report *r) {
    if (!r)
        return;
    loom_ir_free(&r->alloc, r->live_per_kernel, (size_t)r->n_kernels * sizeof *r->live_per_kernel);
    loom_ir_free(&r->alloc, r->live, (size_t)(r->n_live ? r->n_live : 1) * sizeof *r->live);
    r->live_per_kernel = NULL;
    r->live = NULL;
    r->n_live = r->n_kernels = 0;
}

void loom_ir_memory_report_print(const loom_ir_memory_report *r, const loom_ir_plan *p,
                                 const loom_ir_graph *g, int32_t top, loom_ir_write_fn write,
                                 void *ud) {
    if (!r || !p || !g || !write)
        return;
    loom_ir_writer w = {.write = write, .ud = ud};
    loom_ir_writer_printf(
        &w, "memory: planned peak %zu bytes (%.2f MiB) = arena %zu + outputs %zu\n", r->peak_bytes,
        (double)r->peak_bytes / 1048576.0, r->arena_bytes, r->output_bytes);
    if (r->peak_kernel < 0) {
        loom_ir_writer_flush(&w);
        return;
    }
    const loom_ir_kernel *kn = &p->kernels[r->peak_kernel];
    char loc[LOOM_IR_LOC_STR_MAX], ty[LOOM_IR_TYPE_STR_MAX];
    const loom_ir_node *root = &g->nodes[kn->root];
    loom_ir_format_loc(loc, sizeof loc, root->loc);
    loom_ir_writer_printf(&w, "  most alive at kernel %d (%s, root %s%s%s): %zu bytes in %d values",
                          (int)r->peak_kernel, loom_ir_kernel_kind_name(kn->kind),
                          loom_ir_op_name(root->op), loc[0] ? " at " : "", loc, r->live_bytes,
                          (int)r->n_live);
    int32_t shown = top >= 0 && top < r->n_live ? top : r->n_live;
    loom_ir_writer_puts(&w, shown < r->n_live ? ", the largest:\n" : ":\n");
    for (int32_t i = 0; i < shown; i++) {
        const loom_ir_live_value *v = &r->live[i];
        const loom_ir_node *nd = &g->nodes[v->node];
        loom_ir_format_loc(loc, sizeof loc, nd->loc);
        char out[32] = "";
        if (v->kind == LOOM_IR_BUFFER_OUTPUT)
            snprintf(out, sizeof out, "(output %d) ", (int)v->output);
        loom_ir_writer_printf(
            &w, "    %12zu  %%%d %s %s %s%s\n", v->bytes, (int)v->node, loom_ir_op_name(nd->op),
            loom_ir_format_type(ty, sizeof ty, nd->dtype, nd->rank, nd->shape), out, loc);
    }
    loom_ir_writer_flush(&w);
}

void loom_ir_memory_report_svg(const loom_ir_memory_report *r, const loom_ir_plan *p,
                               const loom_ir_graph *g, loom_ir_write_fn write, void *ud) {
    if (!r || !p || !g || !write)
        return;
    loom_ir_writer w = {.write = write, .ud = ud};
    enum { W = 960, H = 420, L = 90, R = 20, T = 40, B = 50 };
    double maxb = r->live_bytes > 0 ? (double)r->live_bytes : 1;
    int32_t K = r->n_kernels > 0 ? r->n_kernels : 1;
    loom_ir_writer_printf(&w,
                          "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                          "font-family=\"sans-serif\" font-size=\"12\">\n"
                          "<title>live bytes over the kernel schedule</title>\n"
                          "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n",
                          W, H, W, H);
    loom_ir_writer_printf(&w,
                          "<text x=\"%d\" y=\"20\">live bytes per kernel (arena values + "
                          "outputs); planned peak %zu bytes, arena %zu</text>\n",
                          L, r->peak_bytes, r->arena_bytes);
    /* axes */
    loom_ir_writer_printf(&w,
                          "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n"
                          "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n",
                          L, H - B, W - R, H - B, L, T, L, H - B);
    loom_ir_writer_printf(&w, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.3g MB</text>\n", L - 6,
                          T + 4, maxb / 1e6);
    loom_ir_writer_printf(&w, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">0</text>\n", L - 6,
                          H - B + 4);
    loom_ir_writer_printf(
        &w, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">kernel (0 .. %d)</text>\n",
        (L + W - R) / 2, H - 15, (int)K - 1);
    /* a step per kernel */
    loom_ir_writer_puts(&w, "<polyline fill=\"#cde\" stroke=\"#258\" points=\"");
    loom_ir_writer_printf(&w, "%d,%d ", L, H - B);
    for (int32_t k = 0; k < r->n_kernels; k++) {
        double x0 = L + (double)(W - L - R) * k / K, x1 = L + (double)(W - L - R) * (k + 1) / K;
        double y = H - B - (double)(H - T - B) * (double)r->live_per_kernel[k] / maxb;
        loom_ir_writer_printf(&w, "%.1f,%.1f %.1f,%.1f ", x0, y, x1, y);
    }
    loom_ir_writer_printf(&w, "%d,%d\"/>\n", W - R, H - B);
    if (r->peak_kernel >= 0) {
        double x = L + (double)(W - L - R) * (r->peak_kernel + 0.5) / K;
        const loom_ir_node *root = &g->nodes[p->kernels[r->peak_kernel].root];
        char loc[LOOM_IR_LOC_STR_MAX];
        loom_ir_format_loc(loc, sizeof loc, root->loc);
        loom_ir_writer_printf(&w,
                              "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"red\" "
                              "stroke-dasharray=\"4 3\"/>\n"
                              "<text x=\"%.1f\" y=\"%d\" fill=\"red\">peak: kernel %d (%s %s) "
                              "%zu bytes</text>\n",
                              x, T, x, H - B, x + 4, T + 14, (int)r->peak_kernel,
                              loom_ir_op_name(root->op), loc, r->live_bytes);
    }
    loom_ir_writer_puts(&w, "</svg>\n");
    loom_ir_writer_flush(&w);
}
