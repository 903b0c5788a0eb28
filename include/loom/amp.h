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
 *  - fp32 (exp, log, pow, reductions, and so softmax, log_softmax, the norms' statistics and
 *    the losses): 16-bit operands are cast to f32;
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

#ifdef __cplusplus
}
#endif

#endif
