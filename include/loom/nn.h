/* Loom neural-network layer: autograd, the functional ops of training (linear, conv2d,
 * pooling, norms, softmax, cross-entropy, dropout, embedding, argmax) and parameter
 * helpers with PyTorch's default initialisations.
 *
 * Tutorial
 * --------
 *   loom_nn_linear fc1;
 *   loom_rng rng;
 *   loom_rng_init(&rng, 42);
 *   loom_nn_linear_init(ctx, &fc1, 784, 10, true, &rng);      // PyTorch's nn.Linear init
 *   loom_tensor *params[2] = {fc1.weight, fc1.bias};
 *   ...
 *   loom_tensor *logits = loom_nn_linear_forward(ctx, &fc1, x);
 *   loom_tensor *loss = loom_cross_entropy(ctx, logits, labels, LOOM_REDUCTION_MEAN);
 *   loom_tensor *grads[2] = {NULL, NULL};
 *   loom_backward(ctx, loss, 2, params, grads);              // lazy gradient tensors
 *
 * Every function here records IR through the ops of loom.h (or primitive ops of its own),
 * so everything is differentiable by loom_backward and compiled into the step. Errors
 * follow loom.h: NULL results with the first error recorded in the context.
 */
#ifndef LOOM_NN_H
#define LOOM_NN_H

#include "loom/loom.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- autograd -------------------------------------------------------------------------- */

/* Reverse-mode differentiation of `loss` (a float scalar, or any float tensor: then the
 * seed is all ones, i.e. the gradient of sum(loss)) with respect to n tensors wrt[i]
 * (parameters or any tensors recorded in this step). Builds the backward graph from the
 * recorded forward ops' VJP rules; nothing is computed. out_grads[i] receives a
 * step-scoped tensor of wrt[i]'s shape and dtype (zeros when loss does not depend on
 * wrt[i]). Accumulation: if out_grads[i] is not NULL on entry, it must be a tensor of
 * wrt[i]'s type and receives old + new (the old handle is left as it was), so calling
 * loom_backward several times with the same array sums the gradients, as PyTorch's
 * .grad does. Integer and bool values carry no gradient.
 * Errors (recorded, returned): INVALID_ARGUMENT (NULL, n < 1, non-float loss or wrt,
 * a grad of the wrong type), STALE_HANDLE, OUT_OF_MEMORY. */
LOOM_API loom_status loom_backward_at(loom_context *ctx, loom_tensor *loss, int32_t n,
                                      loom_tensor *const *wrt, loom_tensor **out_grads,
                                      const char *file, int line);
#define loom_backward(...) loom_backward_at(__VA_ARGS__, __FILE__, __LINE__)

/* The value of t as a new step-scoped tensor through which loom_backward passes no
 * gradient (torch.Tensor.detach / jax.lax.stop_gradient). Costs nothing at run time. */
LOOM_API loom_tensor *loom_detach_at(loom_context *ctx, loom_tensor *t, const char *file, int line);
#define loom_detach(...) loom_detach_at(__VA_ARGS__, __FILE__, __LINE__)

/* ---- functional ops -------------------------------------------------------------------- */

typedef enum loom_reduction {
    LOOM_REDUCTION_MEAN,
    LOOM_REDUCTION_SUM,
    LOOM_REDUCTION_NONE,
    LOOM_REDUCTION_COUNT_
} loom_reduction;

/* x [..., in] @ weight[out, in]^T + bias[out] (bias may be NULL), as torch.nn.functional.linear. */
LOOM_API loom_tensor *loom_linear_at(loom_context *ctx, loom_tensor *x, loom_tensor *weight,
                                     loom_tensor *bias, const char *file, int line);
#define loom_linear(...) loom_linear_at(__VA_ARGS__, __FILE__, __LINE__)
/* x [..., in] @ weight[in, out] + bias[out] (bias may be NULL): a weight stored [in, out], as
 * Hugging Face GPT-2's Conv1D (torch.addmm(bias, x, weight)), used as it lies: no transpose
 * of the weight or its gradient is made. */
LOOM_API loom_tensor *loom_linear_t_at(loom_context *ctx, loom_tensor *x, loom_tensor *weight,
                                       loom_tensor *bias, const char *file, int line);
#define loom_linear_t(...) loom_linear_t_at(__VA_ARGS__, __FILE__, __LINE__)

/* softmax / log_softmax along axis (negative counts from the end), numerically stable. */
LOOM_API loom_tensor *loom_softmax_at(loom_context *ctx, loom_tensor *x, int32_t axis,
                                      const char *file, int line);
LOOM_API loom_tensor *loom_log_softmax_at(loom_context *ctx, loom_tensor *x, int32_t axis,
                                          const char *file, int line);
#define loom_softmax(...) loom_softmax_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_log_softmax(...) loom_log_softmax_at(__VA_ARGS__, __FILE__, __LINE__)

/* Cross-entropy of logits [..., C] against integer labels [...] (i32/i64), as
 * torch.nn.functional.cross_entropy with class indices: the label's log-probability picked by
 * a gather (no one-hot), reduced as asked (NONE: labels' shape; MEAN: over the counted
 * positions, NaN when none is). A label equal to ignore_index, or outside [0, C) (where
 * PyTorch raises), contributes 0 and is not counted. label_smoothing in [0, 1]: the target is
 * (1 - s) on the label plus s / C on every class. */
typedef struct loom_cross_entropy_options {
    loom_reduction reduction; /* LOOM_REDUCTION_MEAN */
    int64_t ignore_index;     /* -100 */
    double label_smoothing;   /* 0 */
} loom_cross_entropy_options;
#define LOOM_CROSS_ENTROPY_OPTIONS_DEFAULT {LOOM_REDUCTION_MEAN, -100, 0.0}
/* opts NULL: LOOM_CROSS_ENTROPY_OPTIONS_DEFAULT. */
LOOM_API loom_tensor *loom_cross_entropy_ex_at(loom_context *ctx, loom_tensor *logits,
                                               loom_tensor *labels,
                                               const loom_cross_entropy_options *opts,
                                               const char *file, int line);
#define loom_cross_entropy_ex(...) loom_cross_entropy_ex_at(__VA_ARGS__, __FILE__, __LINE__)
/* The same with the given reduction, ignore_index -100 and no smoothing. */
LOOM_API loom_tensor *loom_cross_entropy_at(loom_context *ctx, loom_tensor *logits,
                                            loom_tensor *labels, loom_reduction reduction,
                                            const char *file, int line);
#define loom_cross_entropy(...) loom_cross_entropy_at(__VA_ARGS__, __FILE__, __LINE__)

/* Index of the largest element along axis (the first one on ties), i64, axis removed. */
LOOM_API loom_tensor *loom_argmax_at(loom_context *ctx, loom_tensor *x, int32_t axis,
                                     const char *file, int line);
#define loom_argmax(...) loom_argmax_at(__VA_ARGS__, __FILE__, __LINE__)

/* One-hot encoding of integer labels [...] into dtype [..., classes]. */
LOOM_API loom_tensor *loom_one_hot_at(loom_context *ctx, loom_tensor *labels, int64_t classes,
                                      loom_dtype dtype, const char *file, int line);
#define loom_one_hot(...) loom_one_hot_at(__VA_ARGS__, __FILE__, __LINE__)

/* 2-D convolution as torch.nn.functional.conv2d: x [N, C, H, W], weight [O, C/groups, KH, KW],
 * bias [O] or NULL; stride, padding and dilation are {h, w} pairs (NULL: 1, 0, 1). */
LOOM_API loom_tensor *loom_conv2d_at(loom_context *ctx, loom_tensor *x, loom_tensor *weight,
                                     loom_tensor *bias, const int64_t *stride,
                                     const int64_t *padding, const int64_t *dilation,
                                     int64_t groups, const char *file, int line);
#define loom_conv2d(...) loom_conv2d_at(__VA_ARGS__, __FILE__, __LINE__)

/* Max / average pooling over [N, C, H, W] with window kernel {kh, kw}; stride NULL means
 * the kernel size, padding NULL means 0 (avg: padded zeros count, count_include_pad). Max
 * pooling is one op each way (max_pool2d, max_pool2d_grad in the IR) and sends each
 * window's gradient to the pixel PyTorch's does: its first maximum (the last NaN). */
LOOM_API loom_tensor *loom_max_pool2d_at(loom_context *ctx, loom_tensor *x, const int64_t *kernel,
                                         const int64_t *stride, const int64_t *padding,
                                         const char *file, int line);
LOOM_API loom_tensor *loom_avg_pool2d_at(loom_context *ctx, loom_tensor *x, const int64_t *kernel,
                                         const int64_t *stride, const int64_t *padding,
                                         const char *file, int line);
#define loom_max_pool2d(...) loom_max_pool2d_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_avg_pool2d(...) loom_avg_pool2d_at(__VA_ARGS__, __FILE__, __LINE__)

/* Batch norm over axis 1 of x [N, C, ...] as torch.nn.functional.batch_norm. training:
 * normalise by the batch's mean and biased variance and, when running_mean/var are given
 * (long-lived tensors [C]), assign them (1 - momentum) * running + momentum * batch (the
 * variance unbiased); eval: normalise by the running statistics. weight/bias [C] or NULL. */
LOOM_API loom_tensor *loom_batch_norm_at(loom_context *ctx, loom_tensor *x,
                                         loom_tensor *running_mean, loom_tensor *running_var,
                                         loom_tensor *weight, loom_tensor *bias, bool training,
                                         double momentum, double eps, const char *file, int line);
#define loom_batch_norm(...) loom_batch_norm_at(__VA_ARGS__, __FILE__, __LINE__)

/* Layer norm over the last n_norm axes; weight/bias of those axes' shape or NULL. */
LOOM_API loom_tensor *loom_layer_norm_at(loom_context *ctx, loom_tensor *x, int32_t n_norm,
                                         loom_tensor *weight, loom_tensor *bias, double eps,
                                         const char *file, int line);
#define loom_layer_norm(...) loom_layer_norm_at(__VA_ARGS__, __FILE__, __LINE__)

/* Dropout: with training, zeroes each element with probability p (drawn by
 * loom_rand_uniform from the i64 scalar seed tensor, plus `stream` so that several dropout
 * layers in one step draw independently) and scales the rest by 1/(1-p); identity
 * otherwise. */
LOOM_API loom_tensor *loom_dropout_at(loom_context *ctx, loom_tensor *x, double p, bool training,
                                      loom_tensor *seed, int64_t stream, const char *file,
                                      int line);
#define loom_dropout(...) loom_dropout_at(__VA_ARGS__, __FILE__, __LINE__)

/* Rows of table [V, D] picked by integer indices [...] -> [..., D] (differentiable in
 * table, as torch.nn.functional.embedding): a gather, its gradient a scatter_add of rows
 * into the table. In the table's dtype, also under autocast (as PyTorch's). An index
 * outside [0, V) reads the nearest row, clamped (PyTorch raises). */
LOOM_API loom_tensor *loom_embedding_at(loom_context *ctx, loom_tensor *indices, loom_tensor *table,
                                        const char *file, int line);
#define loom_embedding(...) loom_embedding_at(__VA_ARGS__, __FILE__, __LINE__)

/* ---- attention -------------------------------------------------------------------------- */

/* Where the token axis sits in q, k, v and the result: [B, H, T, D] (PyTorch's
 * F.scaled_dot_product_attention) or [B, T, H, D] (a linear layer's output split into heads
 * without a transpose). */
typedef enum loom_attention_layout {
    LOOM_ATTENTION_BHTD,
    LOOM_ATTENTION_BTHD,
    LOOM_ATTENTION_LAYOUT_COUNT_
} loom_attention_layout;

typedef struct loom_attention_options {
    loom_tensor *mask; /* NULL, or bool (true: attend) or q's dtype (added to the scores),
                          broadcasting to the scores [..., L, S] */
    bool causal;       /* PyTorch's is_causal: query i attends to keys 0..i (top-left
                          aligned); not together with a mask */
    double scale;      /* multiplies q k^T; 0: 1/sqrt(E) */
    double dropout_p;  /* on the attention weights, in [0, 1) (PyTorch applies it whatever
                          the module's mode: pass 0 to evaluate) */
    loom_tensor *seed; /* i64 scalar for dropout, as loom_dropout's; NULL when dropout_p == 0 */
    int64_t stream;    /* dropout stream, as loom_dropout's */
    loom_attention_layout layout;
} loom_attention_options;

/* Fills *o with no mask, not causal, scale 0 (1/sqrt(E)), no dropout, [B, H, T, D]. */
LOOM_API void loom_attention_options_init(loom_attention_options *o);

/* torch.nn.functional.scaled_dot_product_attention: softmax(q k^T * scale + mask) v for
 * q [..., L, E], k [..., S, E], v [..., S, Ev] -> [..., L, Ev] (or all four [B, T, H, *] with
 * the BTHD layout), of one float dtype with equal leading axes. One fused op (tiles of
 * queries and keys with an online softmax; causal tiles skipped, a mask read where the
 * kernels read the scores, every tile computed; dropout drawn per weight inside the kernel;
 * the backward recomputes the weights and their draws by tiles from each row's logsumexp:
 * the scores [..., L, S] are never in memory), run in q's dtype with its scores, softmax
 * and sums in f32 (bf16/f16 operands widened as they are read), autocast or not. Its dropout
 * keeps the weights loom_dropout(weights, dropout_p, true, seed, stream) of the f32 weights
 * [..., L, S] would keep. A query whose keys are all masked gets NaN, as PyTorch's.
 * Differentiable in q, k and v, and in an additive mask: its gradient, where asked for, is
 * the one value that puts the scores [..., L, S] in memory. Returns a
 * step-scoped tensor, or NULL with the error recorded (INVALID_ARGUMENT naming the shapes:
 * mismatched E or S, dtypes, a mask that does not broadcast, a mask together with causal,
 * scale < 0, dropout_p outside [0, 1) or without a seed; STALE_HANDLE; OUT_OF_MEMORY). */
LOOM_API loom_tensor *loom_scaled_dot_product_attention_ex_at(loom_context *ctx, loom_tensor *q,
                                                              loom_tensor *k, loom_tensor *v,
                                                              const loom_attention_options *o,
                                                              const char *file, int line);
/* The common case: loom_scaled_dot_product_attention_ex with only mask, causal and scale. */
LOOM_API loom_tensor *loom_scaled_dot_product_attention_at(loom_context *ctx, loom_tensor *q,
                                                           loom_tensor *k, loom_tensor *v,
                                                           loom_tensor *mask, bool causal,
                                                           double scale, const char *file,
                                                           int line);
#define loom_scaled_dot_product_attention(...)                                                     \
    loom_scaled_dot_product_attention_at(__VA_ARGS__, __FILE__, __LINE__)
#define loom_scaled_dot_product_attention_ex(...)                                                  \
    loom_scaled_dot_product_attention_ex_at(__VA_ARGS__, __FILE__, __LINE__)

/* ---- parameters and their initialisation ----------------------------------------------- */

/* A seeded host generator for parameter initialisation (deterministic per seed; not
 * PyTorch's Mersenne Twister, so values differ from PyTorch's, distributions do not). */
typedef struct loom_rng {
    uint64_t state;
} loom_rng;
LOOM_API void loom_rng_init(loom_rng *r, uint64_t seed);
/* Uniform in [0, 1) (53 bits), and standard normal (Box-Muller). */
LOOM_API double loom_rng_uniform(loom_rng *r);
LOOM_API double loom_rng_normal(loom_rng *r);

/* Long-lived parameter tensors (the caller owns one reference, or use the module deinit):
 * uniform in [lo, hi), normal(mean, std), or filled with value. */
LOOM_API loom_tensor *loom_param_uniform(loom_context *ctx, int32_t rank, const int64_t *shape,
                                         double lo, double hi, loom_rng *rng);
LOOM_API loom_tensor *loom_param_normal(loom_context *ctx, int32_t rank, const int64_t *shape,
                                        double mean, double std, loom_rng *rng);
LOOM_API loom_tensor *loom_param_full(loom_context *ctx, int32_t rank, const int64_t *shape,
                                      double value);

/* Modules. The forward functions are macros over `_at` forms that record the caller's
 * location, as the ops do. Each init creates f32 parameters with PyTorch's default initialisation
 * and returns LOOM_OK or the context's error (the module is then zeroed and owns nothing); deinit
 * releases them (accepts a zeroed module). Parameter names in PyTorch's state_dict are the member
 * names ("weight", "bias", "running_mean", "running_var"). */
typedef struct loom_nn_linear {
    loom_tensor *weight; /* [out, in], U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform a=sqrt(5)) */
    loom_tensor *bias;   /* [out] or NULL, U(-1/sqrt(in), 1/sqrt(in)) */
} loom_nn_linear;
LOOM_API loom_status loom_nn_linear_init(loom_context *ctx, loom_nn_linear *m, int64_t in,
                                         int64_t out, bool bias, loom_rng *rng);
LOOM_API loom_tensor *loom_nn_linear_forward_at(loom_context *ctx, const loom_nn_linear *m,
                                                loom_tensor *x, const char *file, int line);
#define loom_nn_linear_forward(...) loom_nn_linear_forward_at(__VA_ARGS__, __FILE__, __LINE__)
LOOM_API void loom_nn_linear_deinit(loom_nn_linear *m);

typedef struct loom_nn_conv2d {
    loom_tensor *weight; /* [out, in/groups, kh, kw], bound 1/sqrt(fan_in) as Linear */
    loom_tensor *bias;   /* [out] or NULL */
    int64_t stride[2], padding[2], dilation[2], groups;
} loom_nn_conv2d;
/* Stride 1, padding 0, dilation 1, groups 1; stride, padding and dilation may be changed
 * after init. groups may not: the weight is made for groups 1. A grouped convolution
 * creates its weight [out, in/groups, kh, kw] with loom_param_uniform (bound
 * 1/sqrt(in/groups*kh*kw)) and calls loom_conv2d. */
LOOM_API loom_status loom_nn_conv2d_init(loom_context *ctx, loom_nn_conv2d *m, int64_t in,
                                         int64_t out, int64_t kh, int64_t kw, bool bias,
                                         loom_rng *rng);
LOOM_API loom_tensor *loom_nn_conv2d_forward_at(loom_context *ctx, const loom_nn_conv2d *m,
                                                loom_tensor *x, const char *file, int line);
#define loom_nn_conv2d_forward(...) loom_nn_conv2d_forward_at(__VA_ARGS__, __FILE__, __LINE__)
LOOM_API void loom_nn_conv2d_deinit(loom_nn_conv2d *m);

typedef struct loom_nn_batch_norm2d {
    loom_tensor *weight, *bias;              /* [C]: ones, zeros */
    loom_tensor *running_mean, *running_var; /* [C]: zeros, ones (buffers, not parameters) */
    double momentum, eps;                    /* 0.1, 1e-5 */
} loom_nn_batch_norm2d;
LOOM_API loom_status loom_nn_batch_norm2d_init(loom_context *ctx, loom_nn_batch_norm2d *m,
                                               int64_t channels);
LOOM_API loom_tensor *loom_nn_batch_norm2d_forward_at(loom_context *ctx,
                                                      const loom_nn_batch_norm2d *m, loom_tensor *x,
                                                      bool training, const char *file, int line);
#define loom_nn_batch_norm2d_forward(...)                                                          \
    loom_nn_batch_norm2d_forward_at(__VA_ARGS__, __FILE__, __LINE__)
LOOM_API void loom_nn_batch_norm2d_deinit(loom_nn_batch_norm2d *m);

#ifdef __cplusplus
}
#endif

#endif
