/* Loom optimizers: SGD, Adam and AdamW as graph ops with PyTorch's exact update rules;
 * parameter groups with their own weight decay; gradient clipping by global norm.
 *
 * Tutorial
 * --------
 *   loom_optim_options o;
 *   loom_optim_options_init(&o, LOOM_OPTIM_ADAMW);   // PyTorch's defaults for AdamW
 *   o.lr = 1e-3;
 *   loom_optim *opt = NULL;
 *   loom_optim_create(ctx, &o, n_params, params, &opt);
 *   for (...) {
 *       ... loss = ...; loom_tensor *grads[N] = {0};
 *       loom_backward(ctx, loss, n_params, params, grads);
 *       loom_optim_step(opt, grads, NULL);           // records the update; nothing runs yet
 *       loom_mark_step(ctx);                         // the step updates params in place
 *   }
 *   loom_optim_destroy(opt);
 *
 * The update is recorded as IR and assigned (loom_assign) to the parameters and to the
 * optimizer's state tensors, so the compiled step writes them in place (buffer donation).
 * The learning rate and the step counter are device tensors (graph inputs): changing the
 * learning rate or advancing the step never recompiles.
 *
 * Gradients: Loom keeps no `.grad` on parameters. loom_backward returns fresh gradient
 * tensors each call, so there is nothing to zero: PyTorch's `zero_grad()` corresponds to
 * starting each step with grads[] = {NULL}. To accumulate over several backward calls, pass
 * the previous gradients back into loom_backward (see its documentation).
 *
 * Sync-free steps: loom_optim_step takes an optional found_inf tensor (one element, f32 or
 * bool; non-zero or NaN means "skip"). Every parameter and state update is then a select on
 * it and the step counter advances only on clean steps, so no host round-trip is needed (AMP).
 *
 * Precision: bias corrections and lr products (lr / (1 - beta1^t), sqrt(1 - beta2^t),
 * 1 - lr * wd) are computed in f64 inside the graph and rounded once to the parameter's
 * dtype, as PyTorch computes them in host double and passes them to its f32 kernels.
 *
 * The step counter is one f32 scalar shared by all parameters (PyTorch keeps one per
 * parameter): it advances on every clean loom_optim_step that has at least one gradient.
 * The two agree unless a parameter's gradient is NULL on some steps and not on others.
 * SGD keeps it too, to apply PyTorch's first-step rule (the momentum buffer starts as a
 * copy of the first gradient, without dampening) inside the graph.
 *
 * Parameter groups: loom_optim_create_groups gives each group of parameters its own
 * weight_decay (PyTorch's param_groups), e.g. decay on the 2-D weights only, as nanoGPT and
 * llm.c do. Gradient clipping: loom_clip_grad_norm, PyTorch's clip_grad_norm_, also as graph
 * ops, so it combines with the GradScaler's sync-free skip (see its documentation).
 *
 * Thread-safety: as the context the optimizer belongs to.
 */
#ifndef LOOM_OPTIM_H
#define LOOM_OPTIM_H

#include "loom/loom.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum loom_optim_kind {
    LOOM_OPTIM_SGD,
    LOOM_OPTIM_ADAM,
    LOOM_OPTIM_ADAMW,
    LOOM_OPTIM_COUNT_
} loom_optim_kind;

typedef struct loom_optim_options {
    loom_optim_kind kind;
    double lr;           /* SGD 1e-3 (PyTorch requires one; pick yours), Adam/AdamW 1e-3 */
    double momentum;     /* SGD: default 0 */
    double dampening;    /* SGD: default 0 */
    bool nesterov;       /* SGD: default false; needs momentum > 0 and dampening == 0 */
    double weight_decay; /* SGD/Adam: L2 added to the gradient, default 0;
                            AdamW: decoupled (p *= 1 - lr * wd), default 1e-2 */
    double beta1, beta2; /* Adam/AdamW: 0.9, 0.999 */
    double eps;          /* Adam/AdamW: 1e-8, added to sqrt(v_hat) as PyTorch does */
} loom_optim_options;

/* Fills *o with PyTorch's defaults for `kind` (values above). */
LOOM_API void loom_optim_options_init(loom_optim_options *o, loom_optim_kind kind);

typedef struct loom_optim loom_optim;

/* Creates an optimizer over n long-lived float parameters (borrowed: they must outlive the
 * optimizer; the optimizer assigns new values to them), all with o->weight_decay: the
 * one-group case of loom_optim_create_groups, whose messages name params[i]. Its state tensors
 * (momentum buffers, exp_avg, exp_avg_sq, step) are created zero-filled on the context's device.
 * Only the fields the kind uses are checked (SGD ignores betas and eps, Adam/AdamW ignore
 * momentum, dampening and nesterov). On success *out is owned by the caller; on failure
 * *out is NULL. Errors: INVALID_ARGUMENT (NULL, n < 1, a step-scoped, non-float or repeated
 * parameter, an unknown kind, lr < 0 or not finite, momentum < 0, nesterov without momentum
 * or with dampening, betas outside [0, 1), eps < 0, weight_decay < 0), STALE_HANDLE,
 * OUT_OF_MEMORY. Errors are also recorded in ctx. */
LOOM_API loom_status loom_optim_create(loom_context *ctx, const loom_optim_options *o, int32_t n,
                                       loom_tensor *const *params, loom_optim **out);

/* A parameter group, PyTorch's param_groups entry: n parameters (borrowed, as by
 * loom_optim_create; params may be NULL when n is 0) and the weight_decay they use in place
 * of loom_optim_options.weight_decay. */
typedef struct loom_optim_group {
    int32_t n;
    loom_tensor *const *params;
    double weight_decay;
} loom_optim_group;

/* Creates an optimizer over the parameters of n_groups groups. Their parameters, in group
 * order (group 0's first), form the optimizer's parameter list: grads[i] of loom_optim_step
 * and index i of loom_optim_state follow it. Each group's weight_decay replaces
 * o->weight_decay for its parameters, whatever the kind: the L2 term SGD and Adam add to the
 * gradient, AdamW's decoupled p *= 1 - lr * wd. It is checked as o->weight_decay is (finite,
 * >= 0); o->weight_decay is still checked although no parameter uses it. nanoGPT's and
 * llm.c's AdamW, decay on the matrices only:
 *
 *   loom_optim_group groups[2] = {{n_matrices, matrices, 0.1}, {n_others, others, 0.0}};
 *   loom_optim_create_groups(ctx, &o, 2, groups, &opt);   // grads[]: matrices', then others'
 *
 * An empty group (n == 0) is allowed, as in PyTorch, so that a model without biases or norms
 * can keep its no-decay group; the groups together need at least one parameter (PyTorch's
 * "optimizer got an empty parameter list"). A tensor may be listed once in all groups
 * together (PyTorch: "some parameters appear in more than one parameter group"). Ownership
 * and the rest as loom_optim_create. Errors (also recorded in ctx): as loom_optim_create,
 * naming parameters as groups[g].params[j] (a repeated one by both positions), and
 * INVALID_ARGUMENT for NULL groups, n_groups < 1, a group with n < 0 or with NULL params and
 * n > 0, a group's weight_decay < 0 or not finite, no parameter in any group. */
LOOM_API loom_status loom_optim_create_groups(loom_context *ctx, const loom_optim_options *o,
                                              int32_t n_groups, const loom_optim_group *groups,
                                              loom_optim **out);

/* Destroys the optimizer and its state tensors. Accepts NULL. */
LOOM_API void loom_optim_destroy(loom_optim *opt);

/* Records one update of every parameter i whose grads[i] is not NULL (NULL grads are
 * skipped, as parameters whose .grad is None in PyTorch; their state is untouched; when all
 * are NULL nothing is recorded and the step counter stays). Each grads[i] has its
 * parameter's shape and dtype. found_inf may be NULL. The update runs at the next
 * loom_mark_step. Every argument is checked before anything is recorded, so a rejected
 * call leaves no partial update. Errors (also recorded in the context): INVALID_ARGUMENT
 * (NULL opt or grads, a gradient of the wrong type, found_inf not one f32/bool element),
 * STALE_HANDLE, OUT_OF_MEMORY. */
LOOM_API loom_status loom_optim_step(loom_optim *opt, loom_tensor *const *grads,
                                     loom_tensor *found_inf);

/* Sets the learning rate used by steps recorded from now on (an f64 device scalar, replaced
 * by a new one of the same type: no recompile); a step already recorded keeps the old rate.
 * Errors: INVALID_ARGUMENT (NULL, lr < 0 or not finite), OUT_OF_MEMORY. */
LOOM_API loom_status loom_optim_set_lr(loom_optim *opt, double lr);

/* The optimizer's state tensors for parameter i, named as PyTorch's optimizer state_dict
 * keys, then the shared step counter ("step", f32 scalar, as PyTorch's): SGD
 * "momentum_buffer" (only with momentum != 0), "step"; Adam/AdamW "exp_avg", "exp_avg_sq",
 * "step". (PyTorch's SGD state has no "step"; Loom's marks the first step.) Borrowed; they
 * may be assigned (loom_assign) to restore a checkpoint. Returns the number of state
 * tensors of parameter i (0 for NULL or out of range); names/tensors may be NULL, else
 * have room for 4. */
LOOM_API int32_t loom_optim_state(const loom_optim *opt, int32_t i, const char **names,
                                  loom_tensor **tensors);

/* ---- gradient clipping ------------------------------------------------------------------- *
 * PyTorch 1.13's torch.nn.utils.clip_grad_norm_(params, max_norm) (norm_type 2) as graph ops.
 * With the GradScaler, clip the unscaled gradients (PyTorch's recipe calls scaler.unscale_
 * before clip_grad_norm_):
 *
 *   loom_tensor *grads[N] = {0}, *norm = NULL;
 *   loom_backward(ctx, loom_grad_scaler_scale(scaler, loss), N, params, grads);
 *   loom_tensor *found_inf = loom_grad_scaler_unscale(scaler, N, grads);
 *   loom_clip_grad_norm(ctx, N, grads, 1.0, &norm);  // *= min(1, 1.0 / (norm + 1e-6))
 *   loom_optim_step(opt, grads, found_inf);          // skipped on inf/NaN, inside the graph
 *   loom_grad_scaler_update(scaler, found_inf);
 *   loom_tensor_retain(norm);                        // to read (log) it after the step
 *   loom_mark_step(ctx);
 *
 * total_norm is the 2-norm of the vector of the non-NULL gradients' 2-norms, each computed in
 * f32 (bf16 and f16 gradients cast to f32 first; f64 ones in f64, rounded to f32: PyTorch
 * keeps a 16-bit gradient's norm 16-bit). clip_coef = max_norm / (total_norm + 1e-6),
 * computed as PyTorch does (reciprocal, then times max_norm, in f32), clamped to at most 1
 * (a NaN stays NaN). Each non-NULL grads[i] is replaced in the array by the step-scoped
 * grads[i] * clip_coef, the coefficient cast to the gradient's dtype first (PyTorch's
 * g.mul_(clip_coef_clamped)); when the coefficient is clamped to 1 the values stay bit for
 * bit. The slots are overwritten without releasing the tensors they held (a caller owning
 * one keeps its own handle); NULL entries are skipped and stay NULL. *out_total_norm (when
 * out_total_norm is not NULL) is the step-scoped f32 scalar total_norm; with no gradient
 * (n == 0, all NULL or empty) it is 0 and grads is left as given. grads may be NULL when n
 * is 0.
 *
 * Sync-free: nothing is read back; the norm and the coefficient are device values. An inf or
 * NaN gradient makes total_norm inf or NaN and the clipped gradients NaN, but found_inf was
 * taken from the gradients before the clip, so loom_optim_step leaves the parameters and the
 * optimizer state untouched and the scaler backs off, as PyTorch's scaler.step skips
 * optimizer.step. Under loom_dist, clip the averaged gradients (after
 * loom_allreduce_gradients): every rank then computes the same coefficient.
 *
 * max_norm must be finite and > 0, also once rounded to f32. PyTorch accepts 0 (every
 * gradient zeroed), a negative value (every gradient's sign flipped) and inf; Loom rejects
 * them as mistakes. To measure the norm without clipping, pass FLT_MAX: the coefficient is
 * then 1 for every total norm below 1e38.
 *
 * Errors (recorded in ctx with the caller's line; grads left as given and *out_total_norm
 * NULL): INVALID_ARGUMENT (NULL ctx, returned only; n < 0; NULL grads with n > 0; max_norm
 * as above; a gradient that is not floating point), STALE_HANDLE, OUT_OF_MEMORY.
 * Thread-safety: as the context. */
LOOM_API loom_status loom_clip_grad_norm_at(loom_context *ctx, int32_t n, loom_tensor **grads,
                                            double max_norm, loom_tensor **out_total_norm,
                                            const char *file, int line);
#define loom_clip_grad_norm(...) loom_clip_grad_norm_at(__VA_ARGS__, __FILE__, __LINE__)

#ifdef __cplusplus
}
#endif

#endif
