/* LOOM_DEBUG's reports beside the recompilation explainer (recompile.c): reads that forced
 * a step to run early, the summary printed when the context is destroyed; and the memory
 * report's accessor. */
#include <inttypes.h>
#include <stdio.h>

#include "frontend.h"

void loom_fe_debug_forced_read(loom_context *ctx, const loom_fe_tensor *t) {
    for (int32_t i = 0; i < ctx->n_forced_seen; i++)
        if (ctx->forced_seen[i].file == t->loc.file && ctx->forced_seen[i].line == t->loc.line)
            return;
    if (ctx->n_forced_seen < (int32_t)(sizeof ctx->forced_seen / sizeof ctx->forced_seen[0]))
        ctx->forced_seen[ctx->n_forced_seen++] = t->loc;
    char loc[LOOM_IR_LOC_STR_MAX], ty[LOOM_IR_TYPE_STR_MAX];
    loom_ir_format_loc(loc, sizeof loc, t->loc);
    loom_ir_format_type(ty, sizeof ty, t->dtype, t->rank, t->shape);
    fprintf(stderr,
            "loom: debug: step %" PRId64 ": reading the %s recorded at %s forced the pending "
            "step to run before loom_mark_step (read it after the step to keep steps whole)\n",
            ctx->step, ty, loc[0] ? loc : "an unknown line");
}

void loom_fe_debug_summary(const loom_context *ctx) {
    fprintf(stderr,
            "loom: debug: %" PRId64 " steps; %" PRId64
            " compile%s after the first %d steps, %" PRId64 " recompiles of a near graph, %" PRId64
            " forced read%s, %" PRId64 " interpreter fallback%s\n",
            ctx->step, ctx->late_compiles, ctx->late_compiles == 1 ? "" : "s", LOOM_FE_DEBUG_WARMUP,
            loom_metric_value(ctx, "Recompiles"), loom_metric_value(ctx, "ForcedReads"),
            loom_metric_value(ctx, "ForcedReads") == 1 ? "" : "s",
            loom_metric_value(ctx, "Fallbacks"),
            loom_metric_value(ctx, "Fallbacks") == 1 ? "" : "s");
}

LOOM_API const char *loom_memory_report(const loom_context *ctx) {
    return ctx && ctx->memory_report ? ctx->memory_report : "";
}
