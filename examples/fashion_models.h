/* The Fashion-MNIST models of examples/fashion_mnist.c, shared with bench/bench_train.c so the
 * benchmark times exactly what the example trains: the MLP 784-512-512-10 and the CNN
 * conv 1->32 3x3, conv 32->64 3x3, max pool 2, 9216-128-10 (ReLU between), layers named and
 * laid out as PyTorch's state_dict. Header-only: static functions over loom/nn.h (the step
 * after the forward is train_util.c's). */
#ifndef LOOM_EXAMPLES_FASHION_MODELS_H
#define LOOM_EXAMPLES_FASHION_MODELS_H

#include <loom/amp.h>
#include <loom/dist.h>
#include <loom/nn.h>
#include <loom/optim.h>
#include <loom/safetensors.h>

#include "train_util.h"

#define MAX_PARAMS 8

typedef enum model_kind { MODEL_MLP, MODEL_CNN } model_kind;

typedef struct model {
    model_kind kind;
    loom_nn_linear fc[3];   /* mlp: fc1..fc3; cnn: fc1, fc2 */
    loom_nn_conv2d conv[2]; /* cnn: conv1, conv2 */
    int64_t rows, cols;
    int32_t n_params;
    loom_named_tensor params[MAX_PARAMS]; /* PyTorch state_dict names, module order */
} model;

static void add_param(model *m, const char *name, loom_tensor *t) {
    m->params[m->n_params++] = (loom_named_tensor){name, t};
}

static loom_status model_init(loom_context *ctx, model *m, model_kind kind, int64_t rows,
                              int64_t cols, uint64_t seed) {
    *m = (model){.kind = kind, .rows = rows, .cols = cols};
    loom_rng rng;
    loom_rng_init(&rng, seed);
    loom_status st;
    if (kind == MODEL_MLP) {
        if ((st = loom_nn_linear_init(ctx, &m->fc[0], rows * cols, 512, true, &rng)) ||
            (st = loom_nn_linear_init(ctx, &m->fc[1], 512, 512, true, &rng)) ||
            (st = loom_nn_linear_init(ctx, &m->fc[2], 512, 10, true, &rng)))
            return st;
        add_param(m, "fc1.weight", m->fc[0].weight);
        add_param(m, "fc1.bias", m->fc[0].bias);
        add_param(m, "fc2.weight", m->fc[1].weight);
        add_param(m, "fc2.bias", m->fc[1].bias);
        add_param(m, "fc3.weight", m->fc[2].weight);
        add_param(m, "fc3.bias", m->fc[2].bias);
        return LOOM_OK;
    }
    /* Two valid 3x3 convolutions then a 2x2 pool: 28x28 -> 26 -> 24 -> 12, 64*12*12 = 9216. */
    int64_t flat = 64 * ((rows - 4) / 2) * ((cols - 4) / 2);
    if ((st = loom_nn_conv2d_init(ctx, &m->conv[0], 1, 32, 3, 3, true, &rng)) ||
        (st = loom_nn_conv2d_init(ctx, &m->conv[1], 32, 64, 3, 3, true, &rng)) ||
        (st = loom_nn_linear_init(ctx, &m->fc[0], flat, 128, true, &rng)) ||
        (st = loom_nn_linear_init(ctx, &m->fc[1], 128, 10, true, &rng)))
        return st;
    add_param(m, "conv1.weight", m->conv[0].weight);
    add_param(m, "conv1.bias", m->conv[0].bias);
    add_param(m, "conv2.weight", m->conv[1].weight);
    add_param(m, "conv2.bias", m->conv[1].bias);
    add_param(m, "fc1.weight", m->fc[0].weight);
    add_param(m, "fc1.bias", m->fc[0].bias);
    add_param(m, "fc2.weight", m->fc[1].weight);
    add_param(m, "fc2.bias", m->fc[1].bias);
    return LOOM_OK;
}

/* The parameter tensors alone, in state_dict order (out has room for MAX_PARAMS). */
static int32_t model_tensors(const model *m, loom_tensor **out) {
    for (int32_t i = 0; i < m->n_params; i++)
        out[i] = m->params[i].tensor;
    return m->n_params;
}

static void model_deinit(model *m) {
    for (int i = 0; i < 3; i++)
        loom_nn_linear_deinit(&m->fc[i]);
    for (int i = 0; i < 2; i++)
        loom_nn_conv2d_deinit(&m->conv[i]);
    m->n_params = 0;
}

/* Logits [n, 10] of images x [n, rows*cols], each layer under its parameters' module scope
 * (fc1, conv1, ...; the functional relus, pooling and reshapes outside them). */
static loom_tensor *model_forward(loom_context *ctx, const model *m, loom_tensor *x, int64_t n) {
    if (m->kind == MODEL_MLP) {
        loom_tensor *h =
            loom_relu(ctx, EX_SCOPED(ctx, "fc1", loom_nn_linear_forward(ctx, &m->fc[0], x)));
        h = loom_relu(ctx, EX_SCOPED(ctx, "fc2", loom_nn_linear_forward(ctx, &m->fc[1], h)));
        return EX_SCOPED(ctx, "fc3", loom_nn_linear_forward(ctx, &m->fc[2], h));
    }
    loom_tensor *h = loom_reshape(ctx, x, 4, (int64_t[]){n, 1, m->rows, m->cols});
    h = loom_relu(ctx, EX_SCOPED(ctx, "conv1", loom_nn_conv2d_forward(ctx, &m->conv[0], h)));
    h = loom_relu(ctx, EX_SCOPED(ctx, "conv2", loom_nn_conv2d_forward(ctx, &m->conv[1], h)));
    h = loom_max_pool2d(ctx, h, (int64_t[]){2, 2}, NULL, NULL);
    h = loom_reshape(ctx, h, 2, (int64_t[]){n, -1}); /* flatten: channel-major, as PyTorch */
    h = loom_relu(ctx, EX_SCOPED(ctx, "fc1", loom_nn_linear_forward(ctx, &m->fc[0], h)));
    return EX_SCOPED(ctx, "fc2", loom_nn_linear_forward(ctx, &m->fc[1], h));
}

/* One training step on a batch of n images xs [n, rows*cols] with labels ys: upload,
 * forward (under autocast with amp), mean cross-entropy, then ex_train_step_finish (backward,
 * all-reduce, unscale, update, mark_step). amp may be NULL (fp32). out_loss as there: on
 * several ranks the global batch's mean loss when every rank's batch has n images. */
static loom_status model_train_step(loom_context *ctx, const model *m, loom_tensor *const *params,
                                    loom_optim *opt, const model_amp *amp, const float *xs,
                                    const int64_t *ys, int64_t n, loom_tensor **out_loss) {
    loom_tensor *x =
        loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){n, m->rows * m->cols}, xs);
    loom_tensor *y = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 1, (int64_t[]){n}, ys);
    bool autocast = amp && amp->dtype != LOOM_DTYPE_F32;
    if (autocast)
        loom_autocast_begin(ctx, amp->dtype);
    loom_tensor *loss =
        loom_cross_entropy(ctx, model_forward(ctx, m, x, n), y, LOOM_REDUCTION_MEAN);
    if (autocast)
        loom_autocast_end(ctx);
    loom_status st = ex_train_step_finish(ctx, loss, m->n_params, params, opt, amp, out_loss);
    /* The step holds what it reads: the host copies can go. */
    loom_tensor_release(x);
    loom_tensor_release(y);
    return st;
}

#endif
