/* Tensor ops built from others, as a transformer needs them (issue 51): tril and triu (a
 * mask of iota compares), masked_fill (a select), split and chunk (slices). Nothing here
 * adds an IR op: each records the ops it is made of, with the user's line on every node. */
#include <string.h>

#include "frontend.h"
#include "loom/loom.h"

/* x where (col - row) passes keep (lower: <= k, upper: >= k) over the last two axes, else 0. */
static loom_tensor *triangle(loom_context *ctx, loom_tensor *x, int64_t k, bool lower,
                             const char *file, int line, const char *op) {
    loom_dtype dt;
    int32_t r;
    int64_t s[LOOM_MAX_RANK];
    if (!loom_fe_type_of(ctx, x, "x", file, line, op, &dt, &r, s))
        return NULL;
    if (r < 2) {
        char t[LOOM_IR_TYPE_STR_MAX];
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "needs a matrix or a batch of them [..., M, N], got %s",
                      loom_ir_format_type(t, sizeof t, dt, r, s));
        return NULL;
    }
    int64_t mn[2] = {s[r - 2], s[r - 1]};
    loom_tensor *row = loom_iota_at(ctx, LOOM_DTYPE_I64, 2, mn, 0, file, line);
    loom_tensor *col = loom_iota_at(ctx, LOOM_DTYPE_I64, 2, mn, 1, file, line);
    loom_tensor *diag = loom_sub_at(ctx, col, row, file, line);
    loom_tensor *kk = loom_full_at(ctx, LOOM_DTYPE_I64, 0, NULL, (double)k, file, line);
    loom_tensor *keep =
        lower ? loom_le_at(ctx, diag, kk, file, line) : loom_ge_at(ctx, diag, kk, file, line);
    return loom_select_at(ctx, keep, x, loom_full_at(ctx, dt, 0, NULL, 0.0, file, line), file,
                          line);
}

LOOM_API loom_tensor *loom_tril_at(loom_context *ctx, loom_tensor *x, int64_t diagonal,
                                   const char *file, int line) {
    LOOM_FE_USE(ctx, "tril", NULL);
    return ctx ? triangle(ctx, x, diagonal, true, file, line, "tril") : NULL;
}

LOOM_API loom_tensor *loom_triu_at(loom_context *ctx, loom_tensor *x, int64_t diagonal,
                                   const char *file, int line) {
    LOOM_FE_USE(ctx, "triu", NULL);
    return ctx ? triangle(ctx, x, diagonal, false, file, line, "triu") : NULL;
}

LOOM_API loom_tensor *loom_masked_fill_at(loom_context *ctx, loom_tensor *x, loom_tensor *mask,
                                          double value, const char *file, int line) {
    LOOM_FE_USE(ctx, "masked_fill", NULL);
    static const char op[] = "masked_fill";
    loom_dtype dt, dm;
    int32_t r, rm;
    int64_t s[LOOM_MAX_RANK], sm[LOOM_MAX_RANK];
    if (!ctx || !loom_fe_type_of(ctx, x, "x", file, line, op, &dt, &r, s) ||
        !loom_fe_type_of(ctx, mask, "mask", file, line, op, &dm, &rm, sm))
        return NULL;
    if (dm != LOOM_DTYPE_BOOL) {
        char t[LOOM_IR_TYPE_STR_MAX];
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "mask must be bool, got %s", loom_ir_format_type(t, sizeof t, dm, rm, sm));
        return NULL;
    }
    /* the result keeps x's shape: a mask broadcasts to it, never the other way */
    loom_tensor *m = loom_broadcast_at(ctx, mask, r, s, file, line);
    return loom_select_at(ctx, m, loom_full_at(ctx, dt, 0, NULL, value, file, line), x, file, line);
}

/* x's shape into s and axis normalized for split/chunk, with out[0..n) cleared first (every
 * part NULL on error); false with the context's error set. */
static bool parts_of(loom_context *ctx, loom_tensor *x, int32_t *axis, int64_t *s,
                     loom_tensor **out, int32_t n, const char *file, int line, const char *op) {
    for (int32_t i = 0; i < n; i++)
        out[i] = NULL;
    loom_dtype dt;
    int32_t r;
    return loom_fe_type_of(ctx, x, "x", file, line, op, &dt, &r, s) &&
           loom_fe_norm_axis(ctx, axis, r, file, line, op);
}

/* The n consecutive slices of x (shape s) along axis: part i is sizes[i] long, or (sizes
 * NULL) `each` long with the last one cut at the axis's end. On error every out[i] is NULL. */
static loom_status cut(loom_context *ctx, loom_tensor *x, int32_t axis, const int64_t *s, int32_t n,
                       const int64_t *sizes, int64_t each, loom_tensor **out, const char *file,
                       int line) {
    int64_t start[LOOM_MAX_RANK] = {0}, size[LOOM_MAX_RANK];
    memcpy(size, s, sizeof size);
    for (int32_t i = 0; i < n; i++) {
        int64_t left = s[axis] - start[axis];
        size[axis] = sizes ? sizes[i] : each < left ? each : left;
        out[i] = loom_slice_at(ctx, x, start, size, NULL, file, line);
        if (!out[i]) {
            for (int32_t k = 0; k < i; k++)
                out[k] = NULL;
            return loom_context_error(ctx);
        }
        start[axis] += size[axis];
    }
    return LOOM_OK;
}

LOOM_API loom_status loom_split_at(loom_context *ctx, loom_tensor *x, int32_t n,
                                   const int64_t *sizes, int32_t axis, loom_tensor **out,
                                   const char *file, int line) {
    LOOM_FE_USE(ctx, "split", LOOM_STATUS_BUSY);
    static const char op[] = "split";
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (n < 1 || !sizes || !out)
        return loom_fe_error(
            ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
            n < 1 ? "needs at least one part, got %d" : "sizes or out is NULL (n = %d)", (int)n);
    int64_t s[LOOM_MAX_RANK];
    if (!parts_of(ctx, x, &axis, s, out, n, file, line, op))
        return loom_context_error(ctx);
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (sizes[i] < 0 || sizes[i] > s[axis] - total)
            return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                                 "part %d of %lld does not fit: parts so far take %lld of axis "
                                 "%d's %lld",
                                 (int)i, (long long)sizes[i], (long long)total, (int)axis,
                                 (long long)s[axis]);
        total += sizes[i];
    }
    if (total != s[axis])
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                             "the parts sum to %lld, axis %d has %lld", (long long)total, (int)axis,
                             (long long)s[axis]);
    return cut(ctx, x, axis, s, n, sizes, 0, out, file, line);
}

LOOM_API loom_status loom_chunk_at(loom_context *ctx, loom_tensor *x, int32_t chunks, int32_t axis,
                                   loom_tensor **out, int32_t *out_n, const char *file, int line) {
    LOOM_FE_USE(ctx, "chunk", LOOM_STATUS_BUSY);
    static const char op[] = "chunk";
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (out_n)
        *out_n = 0;
    if (chunks < 1 || !out || !out_n)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                             !out || !out_n ? "out or out_n is NULL" : "chunks %d is below 1",
                             (int)chunks);
    int64_t s[LOOM_MAX_RANK];
    if (!parts_of(ctx, x, &axis, s, out, chunks, file, line, op))
        return loom_context_error(ctx);
    /* as torch.chunk: parts of ceil(extent / chunks), the last smaller, fewer when they run
     * out (an empty axis: one empty part) */
    int64_t ext = s[axis], each = (ext + chunks - 1) / chunks;
    int32_t n = ext == 0 ? 1 : (int32_t)((ext + each - 1) / each);
    loom_status st = cut(ctx, x, axis, s, n, NULL, each, out, file, line);
    if (st == LOOM_OK)
        *out_n = n;
    return st;
}
