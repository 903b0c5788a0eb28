/* The AMP GradScaler (PyTorch's torch.cuda.amp.GradScaler) recorded as graph ops: scale,
 * unscale with the inf/NaN check, and the scale update, with its state in device tensors. */
#include <math.h>
#include <string.h>

#include "frontend.h"
#include "loom/amp.h"
#include "loom/dist.h"

struct loom_grad_scaler {
    loom_context *ctx;
    loom_allocator alloc; /* a copy, so destroy works even after a mistaken context destroy */
    bool enabled;
    /* owned, long-lived scalars; all NULL when disabled */
    loom_tensor *scale;           /* f32 */
    loom_tensor *growth_tracker;  /* i32: consecutive clean steps */
    loom_tensor *growth_factor;   /* f64 */
    loom_tensor *backoff_factor;  /* f64 */
    loom_tensor *growth_interval; /* i64 */
};

LOOM_API void loom_grad_scaler_options_init(loom_grad_scaler_options *o) {
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->init_scale = 65536.0;
    o->growth_factor = 2.0;
    o->backoff_factor = 0.5;
    o->growth_interval = 2000;
    o->enabled = true;
}

/* Negated comparisons, so that NaN is rejected too. */
static loom_status check_options(loom_context *ctx, const loom_grad_scaler_options *o,
                                 const char *op) {
#define BAD(...) loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, __VA_ARGS__)
    if (!(o->init_scale > 0) || !isfinite((float)o->init_scale))
        return BAD("init_scale must be finite (in f32) and > 0, got %g", o->init_scale);
    if (!(o->growth_factor > 1) || !isfinite(o->growth_factor))
        return BAD("growth_factor must be finite and > 1, got %g", o->growth_factor);
    if (!(o->backoff_factor > 0 && o->backoff_factor < 1))
        return BAD("backoff_factor must be in (0, 1), got %g", o->backoff_factor);
    if (o->growth_interval < 1)
        return BAD("growth_interval must be >= 1, got %d", (int)o->growth_interval);
    return LOOM_OK;
#undef BAD
}

LOOM_API void loom_grad_scaler_destroy(loom_grad_scaler *s) {
    if (!s)
        return;
    loom_tensor_release(s->scale);
    loom_tensor_release(s->growth_tracker);
    loom_tensor_release(s->growth_factor);
    loom_tensor_release(s->backoff_factor);
    loom_tensor_release(s->growth_interval);
    loom_allocator a = s->alloc;
    loom_ir_free(&a, s, sizeof *s);
}

LOOM_API loom_status loom_grad_scaler_create(loom_context *ctx, const loom_grad_scaler_options *o,
                                             loom_grad_scaler **out) {
    LOOM_FE_USE(ctx, "grad_scaler_create", LOOM_STATUS_BUSY);
    static const char op[] = "grad_scaler_create";
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (out)
        *out = NULL;
    if (!o || !out)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, "%s is NULL",
                             !o ? "options" : "out");
    if (o->enabled) { /* PyTorch checks only an enabled scaler's options */
        loom_status st = check_options(ctx, o, op);
        if (st != LOOM_OK)
            return st;
    }
    loom_grad_scaler *s = loom_ir_alloc(&ctx->alloc, sizeof *s);
    if (!s)
        return loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, NULL, 0, op, "out of memory");
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    s->alloc = ctx->alloc;
    s->enabled = o->enabled;
    if (s->enabled) {
        float scale = (float)o->init_scale;
        int32_t tracker = 0;
        int64_t interval = o->growth_interval;
        s->scale = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 0, NULL, &scale);
        s->growth_tracker = loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 0, NULL, &tracker);
        s->growth_factor = loom_tensor_from_host(ctx, LOOM_DTYPE_F64, 0, NULL, &o->growth_factor);
        s->backoff_factor = loom_tensor_from_host(ctx, LOOM_DTYPE_F64, 0, NULL, &o->backoff_factor);
        s->growth_interval = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 0, NULL, &interval);
        if (!s->scale || !s->growth_tracker || !s->growth_factor || !s->backoff_factor ||
            !s->growth_interval) {
            loom_grad_scaler_destroy(s);
            return ctx->err != LOOM_OK ? ctx->err : LOOM_STATUS_OUT_OF_MEMORY;
        }
    }
    *out = s;
    return LOOM_OK;
}

LOOM_API bool loom_grad_scaler_is_enabled(const loom_grad_scaler *s) {
    return s && s->enabled;
}

/* The dtype (and element count) of t after checking that it is a live float tensor of ctx;
 * otherwise the recorded error, naming `what` (and index i when i >= 0). */
static loom_status float_dtype(loom_context *ctx, loom_tensor *t, const char *what, int32_t i,
                               const char *op, loom_dtype *out_dt, int64_t *out_numel) {
    const loom_fe_tensor *f = loom_fe_tensor_get(ctx, t, NULL, 0, op);
    if (!f)
        return ctx->err;
    if (!loom_ir_dtype_is_float(f->dtype)) {
        char tf[LOOM_IR_TYPE_STR_MAX];
        loom_ir_format_type(tf, sizeof tf, f->dtype, f->rank, f->shape);
        return i < 0
                   ? loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, f->loc.file, f->loc.line, op,
                                   "%s is %s; it must be floating point", what, tf)
                   : loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, f->loc.file, f->loc.line, op,
                                   "%s[%d] is %s; it must be floating point", what, (int)i, tf);
    }
    *out_dt = f->dtype;
    if (out_numel)
        *out_numel = loom_ir_numel(f->rank, f->shape);
    return LOOM_OK;
}

/* x * factor (an f32 scalar), computed in f32 (f64 for f64 x) and rounded to x's dtype
 * once: PyTorch's opmath for scaling and unscaling. */
static loom_tensor *mul_in_opmath(loom_context *ctx, loom_tensor *x, loom_dtype dt,
                                  loom_tensor *factor) {
    switch (dt) {
    case LOOM_DTYPE_F32: return loom_mul(ctx, x, factor);
    case LOOM_DTYPE_F64: return loom_mul(ctx, x, loom_cast(ctx, factor, LOOM_DTYPE_F64));
    case LOOM_DTYPE_F16:
    case LOOM_DTYPE_BF16:
        return loom_cast(ctx, loom_mul(ctx, loom_cast(ctx, x, LOOM_DTYPE_F32), factor), dt);
    case LOOM_DTYPE_I32:
    case LOOM_DTYPE_I64:
    case LOOM_DTYPE_BOOL:
    case LOOM_DTYPE_COUNT_: break;
    }
    return NULL; /* callers checked the dtype */
}

LOOM_API loom_tensor *loom_grad_scaler_scale(loom_grad_scaler *s, loom_tensor *loss) {
    static const char op[] = "grad_scaler_scale";
    if (!s)
        return NULL;
    if (!s->enabled || !loss)
        return loss;
    LOOM_FE_USE(s->ctx, op, NULL);
    loom_dtype dt;
    if (float_dtype(s->ctx, loss, "loss", -1, op, &dt, NULL) != LOOM_OK)
        return NULL;
    return mul_in_opmath(s->ctx, loss, dt, s->scale);
}

LOOM_API loom_tensor *loom_grad_scaler_unscale(loom_grad_scaler *s, int32_t n,
                                               loom_tensor **grads) {
    static const char op[] = "grad_scaler_unscale";
    if (!s || !s->enabled)
        return NULL;
    loom_context *ctx = s->ctx;
    LOOM_FE_USE(ctx, op, NULL);
    if (n < 0) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, "n must be >= 0, got %d",
                      (int)n);
        return NULL;
    }
    if (n > 0 && !grads) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, "grads is NULL");
        return NULL;
    }
    loom_dtype dt;
    for (int32_t i = 0; i < n; i++)
        if (grads[i] && float_dtype(ctx, grads[i], "grads", i, op, &dt, NULL) != LOOM_OK)
            return NULL;

    /* The unscaled gradients are collected first so that a failure leaves grads as given. */
    size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(loom_tensor *);
    loom_tensor **out = loom_ir_alloc(&ctx->alloc, bytes);
    if (!out) {
        loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, NULL, 0, op, "out of memory");
        return NULL;
    }
    /* torch: inv_scale = self._scale.double().reciprocal().float() */
    loom_tensor *inv = loom_cast(ctx,
                                 loom_div(ctx, loom_scalar(ctx, LOOM_DTYPE_F64, 1.0),
                                          loom_cast(ctx, s->scale, LOOM_DTYPE_F64)),
                                 LOOM_DTYPE_F32);
    loom_tensor *found = NULL;
    bool ok = inv != NULL;
    for (int32_t i = 0; i < n && ok; i++) {
        out[i] = NULL;
        if (!grads[i])
            continue;
        int64_t numel = 0;
        float_dtype(ctx, grads[i], "grads", i, op, &dt, &numel);
        out[i] = mul_in_opmath(ctx, grads[i], dt, inv);
        ok = out[i] != NULL;
        if (!ok || numel == 0)
            continue;
        /* PyTorch flags the incoming (scaled) values: one reduction pass per gradient, which
         * does not wait for the product, so the product fuses into its consumers. */
        loom_tensor *bad =
            loom_select(ctx, loom_isfinite(ctx, grads[i]), loom_scalar(ctx, LOOM_DTYPE_F32, 0.0),
                        loom_scalar(ctx, LOOM_DTYPE_F32, 1.0));
        loom_tensor *flag = loom_max(ctx, bad, 0, NULL, false);
        found = found ? loom_maximum(ctx, found, flag) : flag;
        ok = found != NULL;
    }
    if (ok && !found) /* no gradient, or only empty ones */
        found = loom_scalar(ctx, LOOM_DTYPE_F32, 0.0);
    /* Data parallel: every rank must skip the same steps (and keep the same scale), so the
     * flags are max-reduced. One rank records nothing, and its step stays compiled. */
    if (ok && found && loom_dist_world_size() > 1) {
        found = loom_all_reduce(ctx, found, LOOM_REDUCE_MAX, 1.0);
        ok = found != NULL;
    }
    if (ok && found) {
        for (int32_t i = 0; i < n; i++)
            if (grads[i])
                grads[i] = out[i];
    } else {
        found = NULL;
        if (ctx->err == LOOM_OK)
            loom_fe_error(ctx, LOOM_STATUS_INTERNAL, NULL, 0, op, "an op failed without an error");
    }
    loom_ir_free(&ctx->alloc, out, bytes);
    return found;
}

/* aten _amp_update_scale_ (AmpKernels.cu, amp_update_scale_cuda_kernel), as selects. */
LOOM_API loom_status loom_grad_scaler_update(loom_grad_scaler *s, loom_tensor *found_inf) {
    static const char op[] = "grad_scaler_update";
    if (!s)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (!s->enabled)
        return LOOM_OK;
    loom_context *ctx = s->ctx;
    LOOM_FE_USE(ctx, op, LOOM_STATUS_BUSY);
    if (!found_inf)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, "found_inf is NULL");
    loom_status st = loom_fe_check_found_inf(ctx, found_inf, op);
    if (st != LOOM_OK)
        return st;
    loom_tensor *found = loom_fe_found_inf_flag(ctx, found_inf);
    /* float scale times double factor, narrowed to float */
    loom_tensor *scale64 = loom_cast(ctx, s->scale, LOOM_DTYPE_F64);
    loom_tensor *backed_off =
        loom_cast(ctx, loom_mul(ctx, scale64, s->backoff_factor), LOOM_DTYPE_F32);
    loom_tensor *grown = loom_cast(ctx, loom_mul(ctx, scale64, s->growth_factor), LOOM_DTYPE_F32);
    /* a clean step: the tracker counts it before comparing with the interval */
    loom_tensor *zero = loom_scalar(ctx, LOOM_DTYPE_I32, 0.0);
    loom_tensor *successful =
        loom_add(ctx, s->growth_tracker, loom_scalar(ctx, LOOM_DTYPE_I32, 1.0));
    loom_tensor *due = loom_eq(ctx, loom_cast(ctx, successful, LOOM_DTYPE_I64), s->growth_interval);
    /* never grow past f32's range to inf */
    loom_tensor *clean_scale = loom_select(
        ctx, due, loom_select(ctx, loom_isfinite(ctx, grown), grown, s->scale), s->scale);
    loom_tensor *clean_tracker = loom_select(ctx, due, zero, successful);
    loom_tensor *new_scale = loom_select(ctx, found, backed_off, clean_scale);
    loom_tensor *new_tracker = loom_select(ctx, found, zero, clean_tracker);
    if (!new_scale || !new_tracker) /* both recorded before either is assigned */
        return ctx->err != LOOM_OK ? ctx->err : LOOM_STATUS_INTERNAL;
    st = loom_assign(ctx, s->scale, new_scale);
    if (st == LOOM_OK)
        st = loom_assign(ctx, s->growth_tracker, new_tracker);
    return st;
}

LOOM_API loom_tensor *loom_grad_scaler_scale_tensor(const loom_grad_scaler *s) {
    return s ? s->scale : NULL;
}

LOOM_API loom_tensor *loom_grad_scaler_growth_tracker(const loom_grad_scaler *s) {
    return s ? s->growth_tracker : NULL;
}

LOOM_API int32_t loom_grad_scaler_state(const loom_grad_scaler *s, const char **names,
                                        loom_tensor **tensors) {
    if (!s || !s->enabled)
        return 0;
    static const char *const keys[LOOM_GRAD_SCALER_STATE_MAX] = {
        "scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"};
    loom_tensor *const ts[LOOM_GRAD_SCALER_STATE_MAX] = {
        s->scale, s->growth_factor, s->backoff_factor, s->growth_interval, s->growth_tracker};
    for (int32_t j = 0; j < LOOM_GRAD_SCALER_STATE_MAX; j++) {
        if (names)
            names[j] = keys[j];
        if (tensors)
            tensors[j] = ts[j];
    }
    return LOOM_GRAD_SCALER_STATE_MAX;
}
