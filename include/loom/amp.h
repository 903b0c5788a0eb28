/* Loom automatic mixed precision: the autocast scope and the GradScaler, as graph ops.
 *
 * Tutorial
 * --------
 *   loom_autocast_begin(ctx, LOOM_DTYPE_BF16);     // ops recorded below are tagged bf16
 *   loom_tensor *logits = loom_linear(ctx, x, w, b);   // matmul runs in bf16, f32 accumulation
 *   loom_tensor *loss = loom_cross_entropy(ctx, logits, y, ...);   // softmax/loss run in f32
 *   loom_autocast_end(ctx);
 *   loom_backward(ctx, loss, n, params, grads);     // VJPs run at their forward's precision
 *
 * Autocast records nothing by itself: it tags each op recorded inside the scope with the
 * scope's dtype (printed as `autocast = bf16` in the IR, part of the graph's hash, so turning
 * AMP on compiles a different graph and nothing else recompiles). The autocast pass then
 * inserts the casts when the step is compiled, by each op's autocast class (ir/ops.def):
 *  - lower precision (matmul, and so linear and conv2d): f32 operands are cast to the scope's
 *    dtype and the result has that dtype; the products accumulate in f32. A bias added to
 *    such a result (linear's, conv2d's) joins it, as PyTorch's addmm and conv do;
 *  - fp32 (exp, log, pow, rsqrt, sums and means, and so the norms' statistics and the
 *    losses; softmax and log_softmax cast their input to f32 themselves): 16-bit operands
 *    are cast to f32. A max runs in its operand's dtype (it is exact): max_pool2d of bf16
 *    is bf16;
 *  - promote (add, mul, select, concat, compares, ...): operands of mixed float dtypes are
 *    cast to the widest, tagged or not (PyTorch's type promotion);
 *  - every other op runs in the dtype its operands now have (relu of bf16 is bf16).
 * Tensors the user sees keep the dtype they were recorded with: a step's outputs (retained
 * results, parameters and optimizer state written back, gradients) are cast back, so master
 * weights and their gradients stay f32. Each value is cast at most once per dtype per step,
 * and the cast is shared by forward and backward. f64 values are never cast down.
 *
 * Thread-safety: as the context.
 */
#ifndef LOOM_AMP_H
#define LOOM_AMP_H

#include "loom/loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- autocast ------------------------------------------------------------------------- */

/* Opens an autocast scope: ops recorded until the matching loom_autocast_end carry `dtype`
 * (LOOM_DTYPE_BF16 or LOOM_DTYPE_F16). Scopes nest; LOOM_DTYPE_F32 opens a scope with
 * autocast off (PyTorch's autocast(enabled=False)), whose ops run as recorded. The VJP
 * nodes loom_backward builds for a tagged op carry the op's tag, wherever backward is
 * called. Scopes are per context and do not end with the step. Errors (also recorded in the
 * context): INVALID_ARGUMENT (NULL ctx, another dtype, more than LOOM_AUTOCAST_MAX_DEPTH
 * open scopes). */
#define LOOM_AUTOCAST_MAX_DEPTH 32
LOOM_API loom_status loom_autocast_begin(loom_context *ctx, loom_dtype dtype);
/* Closes the innermost scope. Errors: INVALID_ARGUMENT (NULL ctx, no open scope). */
LOOM_API loom_status loom_autocast_end(loom_context *ctx);
/* The dtype ops recorded now are tagged with: LOOM_DTYPE_BF16 or LOOM_DTYPE_F16 inside an
 * enabled scope, LOOM_DTYPE_F32 when autocast is off (no scope, a disabled scope, NULL). */
LOOM_API loom_dtype loom_autocast_dtype(const loom_context *ctx);

/* ---- GradScaler ------------------------------------------------------------------------ *
 * PyTorch's torch.cuda.amp.GradScaler as graph ops: nothing in it reads a value back to the
 * host, so an AMP training step never waits on the device.
 *
 *   loom_grad_scaler_options so;
 *   loom_grad_scaler_options_init(&so);            // 2^16, x2 every 2000 clean steps, x0.5
 *   loom_grad_scaler *scaler = NULL;
 *   loom_grad_scaler_create(ctx, &so, &scaler);
 *   for (...) {
 *       loom_tensor *loss = ..., *grads[N] = {0};
 *       loom_backward(ctx, loom_grad_scaler_scale(scaler, loss), N, params, grads);
 *       loom_tensor *found_inf = loom_grad_scaler_unscale(scaler, N, grads);
 *       loom_optim_step(opt, grads, found_inf);      // skipped on inf/NaN, inside the graph
 *       loom_grad_scaler_update(scaler, found_inf);
 *       loom_mark_step(ctx);
 *   }
 *   loom_grad_scaler_destroy(scaler);
 *
 * The state lives in long-lived device tensors (graph inputs written back in place): the
 * scale (f32 scalar) and the growth tracker (i32 scalar, consecutive clean steps), and the
 * hyperparameters growth_factor and backoff_factor (f64 scalars) and growth_interval (i64
 * scalar), so restoring a checkpoint or taking a step never recompiles. A disabled scaler
 * (options.enabled false) has no state: scale and unscale pass their inputs through and
 * update does nothing, as PyTorch's GradScaler(enabled=False).
 *
 * Thread-safety: as the context the scaler belongs to. */

typedef struct loom_grad_scaler_options {
    double init_scale;       /* 65536.0 (2^16); finite, > 0, and finite once rounded to f32 */
    double growth_factor;    /* 2.0; finite, > 1 */
    double backoff_factor;   /* 0.5; in (0, 1) */
    int32_t growth_interval; /* 2000 consecutive clean steps before the scale grows; >= 1 */
    bool enabled;            /* true */
} loom_grad_scaler_options;

/* Fills *o with PyTorch's defaults (values above). Accepts NULL (does nothing). */
LOOM_API void loom_grad_scaler_options_init(loom_grad_scaler_options *o);

typedef struct loom_grad_scaler loom_grad_scaler;

/* Creates a scaler whose state tensors live on ctx's device: scale = init_scale (rounded to
 * f32), growth tracker 0. A disabled scaler checks no option and creates no tensor. On
 * success *out is owned by the caller; on failure *out is NULL (when out is not NULL).
 * Errors (also recorded in ctx, naming the bad value): INVALID_ARGUMENT (NULL ctx, options
 * or out; init_scale not finite and > 0, growth_factor not finite and > 1, backoff_factor
 * outside (0, 1), growth_interval < 1), OUT_OF_MEMORY. */
LOOM_API loom_status loom_grad_scaler_create(loom_context *ctx, const loom_grad_scaler_options *o,
                                             loom_grad_scaler **out);
/* Destroys the scaler and releases its state tensors (handles from the accessors become
 * stale). Accepts NULL. */
LOOM_API void loom_grad_scaler_destroy(loom_grad_scaler *s);

/* Whether the scaler is enabled (false for NULL). */
LOOM_API bool loom_grad_scaler_is_enabled(const loom_grad_scaler *s);

/* loss * scale, a step-scoped tensor of loss's shape and float dtype (backward from it gives
 * gradients multiplied by the scale). The product is computed in f32 (f64 for an f64 loss)
 * and rounded once to loss's dtype, so the default scale 65536, which f16 cannot hold, does
 * not turn an f16 loss into inf by itself (PyTorch's f16 * f32 promotes to f32; Loom keeps
 * the loss's dtype). Reads the scale as of this call. Disabled scaler: returns loss itself.
 * Returns NULL for a NULL scaler (nothing recorded: there is no context) or a NULL loss
 * (the first error stands), and after recording INVALID_ARGUMENT (loss not floating
 * point), STALE_HANDLE or OUT_OF_MEMORY. */
LOOM_API loom_tensor *loom_grad_scaler_scale(loom_grad_scaler *s, loom_tensor *loss);

/* Unscales the n gradients in place in the array and checks them for inf/NaN, as
 * PyTorch's unscale_ (_amp_foreach_non_finite_check_and_unscale_): inv_scale = 1 / scale
 * computed in f64 and rounded to f32, then each non-NULL grads[i] is replaced by a
 * step-scoped grads[i] * inv_scale, computed in f32 (f64 for f64 gradients) and rounded to
 * the gradient's dtype (f32, f16, bf16 or f64). The array slot is overwritten without
 * releasing the tensor it held: a caller owning that tensor keeps its own copy of the
 * handle. NULL entries are skipped. Returns found_inf, a step-scoped f32 scalar: 1.0 when
 * any element of any incoming (still scaled) gradient is inf, -inf or NaN, else 0.0 (also
 * with no or only empty gradients). Under loom_dist with a world size above 1, found_inf is
 * max-reduced across the ranks (loom_all_reduce, LOOM_REDUCE_MAX), so every rank skips the
 * same steps even when only one rank's gradients overflow. PyTorch checks the values before
 * multiplying them, so with a scale below 1 a finite gradient that overflows when unscaled is
 * not flagged. Cost: one reduction pass per gradient (the check; the per-gradient flags
 * combine with a max in the reductions' epilogues). The check does not wait for the product, so the
 * product fuses into its consumers, such as the optimizer's update; it gets a pass of its
 * own only when the unscaled gradient itself is kept (retained, assigned, read).
 * Every argument is checked before anything is recorded.
 * Disabled scaler: grads untouched, returns NULL with no error (loom_optim_step accepts a
 * NULL found_inf). NULL scaler: returns NULL, nothing recorded. Errors (recorded, NULL
 * returned, grads untouched): INVALID_ARGUMENT (n < 0, grads NULL with n > 0, a gradient
 * that is not floating point), STALE_HANDLE, OUT_OF_MEMORY; loom_context_error tells a
 * failure from a disabled scaler. */
LOOM_API loom_tensor *loom_grad_scaler_unscale(loom_grad_scaler *s, int32_t n, loom_tensor **grads);

/* Records PyTorch's scale update (_amp_update_scale_) and assigns its results to the scale
 * and the growth tracker (they change at the next loom_mark_step): when found_inf is
 * non-zero (NaN included), scale = scale * backoff_factor and tracker = 0; otherwise
 * tracker + 1, and when that equals growth_interval the scale becomes scale * growth_factor
 * if that is finite in f32 (else it stays: the scale never grows to inf) and tracker = 0.
 * Products are computed in f64 and rounded to f32, as PyTorch's kernel does. found_inf is
 * one element, f32/f16/bf16/f64 or bool (normally loom_grad_scaler_unscale's result; sum
 * several optimizers' flags first, as PyTorch's update does). Disabled scaler: does
 * nothing and returns LOOM_OK. Errors (recorded, nothing assigned): INVALID_ARGUMENT (NULL
 * found_inf, found_inf not one float/bool element; a NULL scaler is returned, not
 * recorded), STALE_HANDLE, OUT_OF_MEMORY (only an OUT_OF_MEMORY in assigning the tracker,
 * after the scale, leaves one of the two assigned). */
LOOM_API loom_status loom_grad_scaler_update(loom_grad_scaler *s, loom_tensor *found_inf);

/* The scale (f32 scalar) and the growth tracker (i32 scalar): long-lived state tensors,
 * borrowed (valid until loom_grad_scaler_destroy). Read them with loom_tensor_read (a
 * host sync, the caller's choice: PyTorch's get_scale()) or assign them with loom_assign.
 * NULL for a NULL or disabled scaler. */
LOOM_API loom_tensor *loom_grad_scaler_scale_tensor(const loom_grad_scaler *s);
LOOM_API loom_tensor *loom_grad_scaler_growth_tracker(const loom_grad_scaler *s);

/* The state, named as the keys of PyTorch's scaler.state_dict(): "scale" (f32 scalar),
 * "growth_factor" (f64), "backoff_factor" (f64), "growth_interval" (i64), "_growth_tracker"
 * (i32), in that order; all 0-d tensors (PyTorch's state_dict holds Python numbers).
 * Borrowed; save them with loom_safetensors_save under a prefix ("scaler.scale", ...) and
 * restore them with loom_safetensors_load or loom_assign: steps recorded afterwards use the
 * restored values, hyperparameters included (not re-validated, as PyTorch's
 * load_state_dict). Returns the number of entries: 5, or 0 for a NULL or disabled scaler
 * (PyTorch's state_dict() is empty then). names and tensors may be NULL, else have room for
 * LOOM_GRAD_SCALER_STATE_MAX entries. */
#define LOOM_GRAD_SCALER_STATE_MAX 5
LOOM_API int32_t loom_grad_scaler_state(const loom_grad_scaler *s, const char **names,
                                        loom_tensor **tensors);

#ifdef __cplusplus
}
#endif

#endif
