/* The recompilation explainer (issue 11): when a step misses the executable cache while a
 * near graph is cached, say what differs, node by node, with the user's source line. The
 * nearest cached graph is the one whose sketch (ir/ir.h) differs least; it is "near" when
 * the diff finds at most 2 + a quarter of the nodes as differences of their own (type
 * changes that only follow from another difference do not count): a new graph, such as an
 * evaluation step beside a training step, is not a recompilation. Each distinct cause (what kind of
 * difference, at which op and source line) is counted; LOOM_DEBUG=1 prints each the first time it
 * happens. LOOM_DEBUG's other reports are in debug_report.c. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "frontend.h"

/* The cause's key: the kind of the first difference, and its node's op and source line in
 * the new graph (or the old one, for a removed node). Shapes are left out: a batch that
 * shrinks every step is one cause. */
static void cause_key(const loom_ir_diff *df, char *key, size_t n) {
    const loom_ir_diff_item *it = &df->items[0];
    const loom_ir_graph *g = it->b >= 0 ? df->b : df->a;
    int32_t node = it->b >= 0 ? it->b : it->a;
    char loc[LOOM_IR_LOC_STR_MAX] = "";
    const char *op = "output";
    if (node >= 0 && node < g->n_nodes) {
        op = loom_ir_op_name(g->nodes[node].op);
        loom_ir_format_loc(loc, sizeof loc, g->nodes[node].loc);
    }
    snprintf(key, n, "%d %s %s", (int)it->kind, op, loc);
}

/* Counts the cause (message msg, key key); *out_new: the first time it is seen.
 * Errors: OUT_OF_MEMORY. */
static loom_status count_cause(loom_context *ctx, const char *key, const char *msg, bool *out_new) {
    loom_fe_recompiles *r = &ctx->recompiles;
    *out_new = false;
    for (int32_t i = 0; i < r->n; i++)
        if (!strcmp(r->causes[i].key, key)) {
            r->causes[i].count++;
            return LOOM_OK;
        }
    if (!loom_ir_grow(&ctx->alloc, (void **)&r->causes, &r->cap, r->n + 1, sizeof *r->causes))
        return LOOM_STATUS_OUT_OF_MEMORY;
    loom_fe_recompile_cause *c = &r->causes[r->n++];
    snprintf(c->key, sizeof c->key, "%s", key);
    snprintf(c->first, sizeof c->first, "%s", msg);
    c->count = 1;
    *out_new = true;
    return LOOM_OK;
}

loom_status loom_fe_explain_recompile(loom_context *ctx, const loom_ir_graph *cut) {
    if (ctx->cache.n == 0)
        return LOOM_OK;
    loom_ir_sketch now, other;
    loom_ir_graph_sketch(cut, &now);
    int32_t best = -1;
    int64_t best_d = INT64_MAX;
    for (int32_t i = 0; i < ctx->cache.n; i++) {
        loom_ir_graph_sketch(&ctx->cache.entries[i].exe->graph, &other);
        int64_t dist = loom_ir_sketch_distance(&other, &now);
        if (dist < best_d) {
            best_d = dist;
            best = i;
        }
    }
    if (best < 0)
        return LOOM_OK;
    loom_ir_diff df;
    loom_ir_diff_init(&df, &ctx->alloc);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    /* near: few differences of their own (a batch that changed alters every type after it,
     * but those follow from one input's) */
    int32_t causes = 0;
    loom_status st = loom_ir_diff_compute(&df, &ctx->cache.entries[best].exe->graph, cut, &d);
    for (int32_t i = 0; i < df.n_items && st == LOOM_OK; i++)
        causes += !df.items[i].derived;
    if (causes > 0 && causes <= 2 + cut->n_nodes / 4) {
        char item[512], key[LOOM_IR_LOC_STR_MAX + 64];
        loom_ir_diff_format_item(&df, 0, item, sizeof item);
        loom_fe_recompiles *r = &ctx->recompiles;
        snprintf(r->last, sizeof r->last, "step %" PRId64 " recompiled: %s%s", ctx->step, item,
                 df.items[0].kind == LOOM_IR_DIFF_CONSTANT
                     ? "; a value that changes every step defeats the cache: pass it as a "
                       "tensor instead"
                     : "");
        if (causes > 1) {
            size_t len = strlen(r->last);
            snprintf(r->last + len, sizeof r->last - len, " (and %d more difference%s)",
                     (int)causes - 1, causes > 2 ? "s" : "");
        }
        loom_rt_metrics_add(&ctx->metrics, LOOM_RT_METRIC_RECOMPILES, 1);
        cause_key(&df, key, sizeof key);
        bool first = false;
        st = count_cause(ctx, key, r->last, &first);
        if (first && ctx->debug)
            fprintf(stderr, "loom: warning: %s\n", r->last);
    }
    loom_ir_diff_deinit(&df);
    return st == LOOM_STATUS_OUT_OF_MEMORY ? st : LOOM_OK; /* a bad graph explains nothing */
}

LOOM_API loom_status loom_recompile_report(const loom_context *ctx, loom_report_format format,
                                           void (*write)(const char *chunk, size_t len, void *ud),
                                           void *ud) {
    if (!ctx || !write || (unsigned)format >= LOOM_REPORT_FORMAT_COUNT_)
        return LOOM_STATUS_INVALID_ARGUMENT;
    const loom_fe_recompiles *r = &ctx->recompiles;
    loom_ir_writer w = {.write = write, .ud = ud};
    if (format == LOOM_REPORT_FORMAT_JSON) {
        loom_ir_writer_puts(&w, "{\"recompiles\":[");
        for (int32_t i = 0; i < r->n; i++) {
            loom_ir_writer_printf(&w, "%s{\"count\":%" PRId64 ",\"first\":", i ? "," : "",
                                  r->causes[i].count);
            loom_rt_json_string(&w, r->causes[i].first);
            loom_ir_writer_puts(&w, "}");
        }
        loom_ir_writer_puts(&w, "]}\n");
    } else {
        loom_ir_writer_printf(&w, "Recompiles: %" PRId64 " (%d distinct cause%s)\n",
                              loom_metric_value(ctx, "Recompiles"), (int)r->n,
                              r->n == 1 ? "" : "s");
        for (int32_t i = 0; i < r->n; i++)
            loom_ir_writer_printf(&w, "  %" PRId64 "x, first: %s\n", r->causes[i].count,
                                  r->causes[i].first);
    }
    loom_ir_writer_flush(&w);
    return LOOM_OK;
}

LOOM_API const char *loom_last_recompile(const loom_context *ctx) {
    return ctx ? ctx->recompiles.last : "";
}
