/* Autocast scopes: which dtype the ops recorded now are tagged with (the autocast pass
 * turns the tags into casts when the step is compiled). */
#include "frontend.h"

LOOM_API loom_status loom_autocast_begin(loom_context *ctx, loom_dtype dtype) {
    LOOM_FE_USE(ctx, "autocast_begin", LOOM_STATUS_BUSY);
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (dtype != LOOM_DTYPE_BF16 && dtype != LOOM_DTYPE_F16 && dtype != LOOM_DTYPE_F32)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, "autocast_begin",
                             "autocast dtype must be bf16, f16 or f32 (off), not %s",
                             loom_dtype_name(dtype));
    if (ctx->autocast_depth == LOOM_AUTOCAST_MAX_DEPTH)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, "autocast_begin",
                             "more than %d nested autocast scopes (a missing "
                             "loom_autocast_end?)",
                             LOOM_AUTOCAST_MAX_DEPTH);
    ctx->autocast_stack[ctx->autocast_depth++] = dtype;
    return LOOM_OK;
}

LOOM_API loom_status loom_autocast_end(loom_context *ctx) {
    LOOM_FE_USE(ctx, "autocast_end", LOOM_STATUS_BUSY);
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (ctx->autocast_depth == 0)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, "autocast_end",
                             "no autocast scope is open");
    ctx->autocast_depth--;
    return LOOM_OK;
}

LOOM_API loom_dtype loom_autocast_dtype(const loom_context *ctx) {
    if (!ctx || ctx->autocast_depth == 0)
        return LOOM_DTYPE_F32;
    return ctx->autocast_stack[ctx->autocast_depth - 1];
}
