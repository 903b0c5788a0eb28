/* Gradient clipping by global norm (PyTorch 1.13's torch.nn.utils.clip_grad_norm_, norm_type 2)
 * recorded as graph ops: nothing is read back, so it composes with the GradScaler's skip. */
#include <math.h>
#include <string.h>

#include "frontend.h"
#include "loom/optim.h"

/* An f32 scalar constant. */
static loom_tensor *f32_constant(loom_context *ctx, double v, const char *file, int line) {
    return loom_full_at(ctx, LOOM_DTYPE_F32, 0, NULL, v, file, line);
}

/* ||g||_2 as an f32 [1]: squares summed in f32 (bf16/f16 cast up first, so that neither the
 * squares nor the norm round to 8 or 11 bits; f64 in f64, rounded once), so that the norms
 * stack into one f32 vector. */
static loom_tensor *grad_norm(loom_context *ctx, loom_tensor *g, loom_dtype dt, const char *file,
                              int line) {
    loom_tensor *x = dt == LOOM_DTYPE_F32 || dt == LOOM_DTYPE_F64
                         ? g
                         : loom_cast_at(ctx, g, LOOM_DTYPE_F32, file, line);
    loom_tensor *squares = loom_mul_at(ctx, x, x, file, line);
    loom_tensor *norm =
        loom_sqrt_at(ctx, loom_sum_at(ctx, squares, 0, NULL, false, file, line), file, line);
    if (dt == LOOM_DTYPE_F64)
        norm = loom_cast_at(ctx, norm, LOOM_DTYPE_F32, file, line);
    return loom_reshape_at(ctx, norm, 1, (int64_t[]){1}, file, line);
}

LOOM_API loom_status loom_clip_grad_norm_at(loom_context *ctx, int32_t n, loom_tensor **grads,
                                            double max_norm, loom_tensor **out_total_norm,
                                            const char *file, int line) {
    static const char op[] = "clip_grad_norm";
    LOOM_FE_USE(ctx, op, LOOM_STATUS_BUSY);
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (out_total_norm)
        *out_total_norm = NULL;
    if (n < 0 || (n > 0 && !grads))
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                             n < 0 ? "n is negative (%d)" : "grads is NULL for n = %d", (int)n);
    /* The coefficient is computed in f32, so max_norm must survive the rounding. Negated
     * comparisons so that NaN is rejected too. */
    if (!(max_norm > 0) || !((float)max_norm > 0) || !isfinite((float)max_norm))
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                             "max_norm must be finite and > 0 (in f32), got %g", max_norm);
    /* Every gradient is checked before anything is recorded: on failure grads is as given. */
    int32_t n_norms = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!grads[i])
            continue;
        loom_dtype dt;
        int32_t rank;
        int64_t shape[LOOM_MAX_RANK];
        if (!loom_fe_type_of(ctx, grads[i], "grads", file, line, op, &dt, &rank, shape))
            return ctx->err;
        if (!loom_ir_dtype_is_float(dt)) {
            char t[LOOM_IR_TYPE_STR_MAX];
            return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                                 "grads[%d] is %s, not floating point", (int)i,
                                 loom_ir_format_type(t, sizeof t, dt, rank, shape));
        }
        if (loom_ir_numel(rank, shape) > 0) /* an empty gradient adds 0 to the norm */
            n_norms++;
    }
    if (n_norms == 0) { /* PyTorch returns torch.tensor(0.) and scales nothing */
        loom_tensor *zero = f32_constant(ctx, 0.0, file, line);
        if (!zero)
            return ctx->err != LOOM_OK ? ctx->err : LOOM_STATUS_INTERNAL;
        if (out_total_norm)
            *out_total_norm = zero;
        return LOOM_OK;
    }

    /* The norms, then the clipped gradients, collected first so that a failure leaves grads
     * as given. */
    size_t bytes = (size_t)(n_norms + n) * sizeof(loom_tensor *);
    loom_tensor **norms = loom_ir_alloc(&ctx->alloc, bytes);
    if (!norms)
        return loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, file, line, op, "out of memory");
    loom_tensor **out = norms + n_norms;
    bool ok = true;
    int32_t k = 0;
    for (int32_t i = 0; i < n && ok; i++) {
        int64_t numel = 0;
        if (!grads[i] || loom_tensor_numel(grads[i], &numel) != LOOM_OK || numel == 0)
            continue;
        loom_dtype dt = LOOM_DTYPE_F32;
        loom_tensor_dtype(grads[i], &dt);
        norms[k] = grad_norm(ctx, grads[i], dt, file, line);
        ok = norms[k++] != NULL;
    }
    /* torch.norm(torch.stack(norms), 2): the per-tensor norms are squared again, as there. */
    loom_tensor *stacked = ok ? loom_concat_at(ctx, n_norms, norms, 0, file, line) : NULL;
    loom_tensor *squares = loom_mul_at(ctx, stacked, stacked, file, line);
    loom_tensor *total =
        loom_sqrt_at(ctx, loom_sum_at(ctx, squares, 0, NULL, false, file, line), file, line);
    /* clip_coef = max_norm / (total_norm + 1e-6): Tensor.__rtruediv__ is reciprocal() * max_norm,
     * in f32. torch.clamp(coef, max=1.0) keeps a NaN coefficient NaN (a select on coef > 1 does
     * too), so a NaN norm poisons every gradient as in PyTorch; found_inf skips that step. */
    loom_tensor *one = f32_constant(ctx, 1.0, file, line);
    loom_tensor *denom = loom_add_at(ctx, total, f32_constant(ctx, 1e-6, file, line), file, line);
    loom_tensor *coef = loom_mul_at(ctx, loom_div_at(ctx, one, denom, file, line),
                                    f32_constant(ctx, max_norm, file, line), file, line);
    loom_tensor *clamped =
        loom_select_at(ctx, loom_gt_at(ctx, coef, one, file, line), one, coef, file, line);
    ok = clamped != NULL;
    /* g.mul_(coef): the f32 coefficient is cast to the gradient's dtype (TensorIterator's common
     * dtype is the gradient's), then multiplied. */
    for (int32_t i = 0; i < n && ok; i++) {
        out[i] = NULL;
        if (!grads[i])
            continue;
        loom_dtype dt = LOOM_DTYPE_F32;
        loom_tensor_dtype(grads[i], &dt);
        loom_tensor *c =
            dt == LOOM_DTYPE_F32 ? clamped : loom_cast_at(ctx, clamped, dt, file, line);
        out[i] = loom_mul_at(ctx, grads[i], c, file, line);
        ok = out[i] != NULL;
    }
    loom_status st = LOOM_OK;
    if (ok) {
        memcpy(grads, out, (size_t)n * sizeof *grads);
        if (out_total_norm)
            *out_total_norm = total;
    } else {
        st = ctx->err != LOOM_OK ? ctx->err : LOOM_STATUS_INTERNAL;
    }
    loom_ir_free(&ctx->alloc, norms, bytes);
    return st;
}
