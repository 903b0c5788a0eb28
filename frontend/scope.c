/* Module scopes (loom_scope_push): the name, "layer1.0.conv1", that every node recorded while
 * a scope is open carries on its location (ir.h's loom_ir_loc), with the source line; autograd
 * gives the backward nodes their forward node's scope. Each distinct joined name is kept
 * once, for the context's lifetime, so a node's scope pointer never changes under it (the
 * graphs intern scopes by pointer first). */
#include <string.h>

#include "frontend.h"

/* The context's copy of the joined name s[0..len), made once; NULL when out of memory. */
static const char *pooled(loom_context *ctx, const char *s, size_t len) {
    for (int32_t i = ctx->n_scope_pool - 1; i >= 0; i--) {
        const char *p = ctx->scope_pool[i];
        if (strncmp(p, s, len) == 0 && p[len] == '\0')
            return p;
    }
    if (!loom_ir_grow(&ctx->alloc, (void **)&ctx->scope_pool, &ctx->cap_scope_pool,
                      ctx->n_scope_pool + 1, sizeof *ctx->scope_pool))
        return NULL;
    char *copy = loom_ir_alloc(&ctx->alloc, len + 1);
    if (!copy)
        return NULL;
    memcpy(copy, s, len);
    copy[len] = '\0';
    ctx->scope_pool[ctx->n_scope_pool++] = copy;
    return copy;
}

void loom_fe_scope_deinit(loom_context *ctx) {
    for (int32_t i = 0; i < ctx->n_scope_pool; i++)
        loom_ir_free(&ctx->alloc, ctx->scope_pool[i], strlen(ctx->scope_pool[i]) + 1);
    loom_ir_free(&ctx->alloc, ctx->scope_pool,
                 (size_t)ctx->cap_scope_pool * sizeof *ctx->scope_pool);
    ctx->scope_pool = NULL;
    ctx->n_scope_pool = ctx->cap_scope_pool = 0;
}

LOOM_API loom_status loom_scope_push(loom_context *ctx, const char *name) {
    LOOM_FE_USE(ctx, "scope_push", LOOM_STATUS_BUSY);
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (!name || !name[0])
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, "scope_push",
                             "the scope's name is %s", name ? "empty" : "NULL");
    size_t n = strlen(name);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
            return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, "scope_push",
                                 "the scope's name has a control byte 0x%02x at %zu",
                                 (unsigned)(unsigned char)name[i], i);
    if (ctx->scope_depth == LOOM_SCOPE_MAX_DEPTH)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, "scope_push",
                             "more than %d nested scopes (a missing loom_scope_pop?)",
                             LOOM_SCOPE_MAX_DEPTH);
    size_t len = ctx->scope_len, joined = len + (len ? 1 : 0) + n;
    if (joined >= sizeof ctx->scope_buf)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, "scope_push",
                             "'%.40s%s' makes the scope %zu bytes long (at most %zu)", name,
                             n > 40 ? "..." : "", joined, sizeof ctx->scope_buf - 1);
    if (len)
        ctx->scope_buf[len++] = '.';
    memcpy(ctx->scope_buf + len, name, n + 1);
    const char *s = pooled(ctx, ctx->scope_buf, joined);
    if (!s) {
        ctx->scope_buf[ctx->scope_len] = '\0';
        return loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, NULL, 0, "scope_push",
                             "out of memory");
    }
    ctx->scope_ends[ctx->scope_depth++] = ctx->scope_len;
    ctx->scope_len = joined;
    ctx->scope = s;
    return LOOM_OK;
}

LOOM_API loom_status loom_scope_pop(loom_context *ctx) {
    LOOM_FE_USE(ctx, "scope_pop", LOOM_STATUS_BUSY);
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (ctx->scope_depth == 0)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, "scope_pop",
                             "no scope is open");
    ctx->scope_len = ctx->scope_ends[--ctx->scope_depth];
    ctx->scope_buf[ctx->scope_len] = '\0';
    /* an enclosing scope was pooled when it was pushed */
    ctx->scope = ctx->scope_len ? pooled(ctx, ctx->scope_buf, ctx->scope_len) : NULL;
    return LOOM_OK;
}

LOOM_API const char *loom_scope_current(const loom_context *ctx) {
    return ctx && ctx->scope ? ctx->scope : "";
}
