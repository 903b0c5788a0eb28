/* ResNet-18/50 as torchvision.models builds them, over loom/nn.h (see resnet_model.h). */
#include "resnet_model.h"
#include "train_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const resnet_arch_names[] = {"resnet18", "resnet50"};

/* Blocks per stage and the block's expansion (output channels / planes). */
static const int32_t stage_blocks[RESNET_ARCH_COUNT_][4] = {{2, 2, 2, 2}, {3, 4, 6, 3}};
static const int64_t expansion[RESNET_ARCH_COUNT_] = {1, 4};

typedef struct builder {
    loom_context *ctx;
    resnet *m;
    loom_rng rng;
    int32_t cap;
    loom_status st;
} builder;

static void add_state(builder *b, const char *prefix, const char *name, loom_tensor *t,
                      bool param) {
    resnet *m = b->m;
    if (b->st != LOOM_OK)
        return;
    if (m->n_state == b->cap) {
        int32_t cap = b->cap ? 2 * b->cap : 128;
        loom_named_tensor *s = realloc(m->state, (size_t)cap * sizeof *s);
        if (s)
            m->state = s;
        char(*n)[64] = realloc(m->state_names, (size_t)cap * sizeof *n);
        if (n)
            m->state_names = n;
        loom_tensor **p = realloc(m->params, (size_t)cap * sizeof *p);
        if (p)
            m->params = p;
        int32_t *ps = realloc(m->param_state, (size_t)cap * sizeof *ps);
        if (ps)
            m->param_state = ps;
        if (!s || !n || !p || !ps) {
            b->st = LOOM_STATUS_OUT_OF_MEMORY;
            return;
        }
        b->cap = cap;
        /* The names moved: point the entries at their new place. */
        for (int32_t i = 0; i < m->n_state; i++)
            m->state[i].name = m->state_names[i];
    }
    snprintf(m->state_names[m->n_state], sizeof *m->state_names, "%s%s", prefix, name);
    m->state[m->n_state] = (loom_named_tensor){m->state_names[m->n_state], t};
    if (param) {
        m->param_state[m->n_params] = m->n_state;
        m->params[m->n_params++] = t;
    }
    m->n_state++;
}

/* conv "<conv>.weight" and its batch norm "<bn>.*", in state_dict order. */
static void conv_bn_init(builder *b, resnet_conv_bn *c, const char *conv, const char *bn,
                         int64_t in, int64_t out, int64_t k, int64_t stride) {
    if (b->st != LOOM_OK)
        return;
    c->stride = stride;
    c->padding = k / 2;
    snprintf(c->conv_name, sizeof c->conv_name, "%s", conv);
    snprintf(c->bn_name, sizeof c->bn_name, "%s", bn);
    /* kaiming_normal_(mode="fan_out", nonlinearity="relu"): std = sqrt(2 / (out * k * k));
     * each tensor made under its module's scope, which its step inputs then carry */
    c->weight = EX_SCOPED(b->ctx, conv,
                          loom_param_normal(b->ctx, 4, (int64_t[]){out, in, k, k}, 0.0,
                                            sqrt(2.0 / (double)(out * k * k)), &b->rng));
    int64_t zero = 0;
    loom_scope_push(b->ctx, bn);
    bool ok = c->weight && loom_nn_batch_norm2d_init(b->ctx, &c->bn, out) == LOOM_OK &&
              (c->num_batches_tracked =
                   loom_tensor_from_host(b->ctx, LOOM_DTYPE_I64, 0, NULL, &zero)) != NULL;
    loom_scope_pop(b->ctx);
    if (!ok) {
        b->st = loom_context_error(b->ctx) != LOOM_OK ? loom_context_error(b->ctx)
                                                      : LOOM_STATUS_OUT_OF_MEMORY;
        return;
    }
    char p[64];
    snprintf(p, sizeof p, "%s.", conv);
    add_state(b, p, "weight", c->weight, true);
    snprintf(p, sizeof p, "%s.", bn);
    add_state(b, p, "weight", c->bn.weight, true);
    add_state(b, p, "bias", c->bn.bias, true);
    add_state(b, p, "running_mean", c->bn.running_mean, false);
    add_state(b, p, "running_var", c->bn.running_var, false);
    add_state(b, p, "num_batches_tracked", c->num_batches_tracked, false);
}

static void conv_bn_deinit(resnet_conv_bn *c) {
    loom_tensor_release(c->weight);
    loom_tensor_release(c->num_batches_tracked);
    loom_nn_batch_norm2d_deinit(&c->bn);
    *c = (resnet_conv_bn){0};
}

loom_status resnet_init(loom_context *ctx, resnet *m, resnet_arch arch, int64_t num_classes,
                        uint64_t seed) {
    *m = (resnet){.arch = arch, .num_classes = num_classes};
    builder b = {.ctx = ctx, .m = m};
    loom_rng_init(&b.rng, seed);
    conv_bn_init(&b, &m->stem, "conv1", "bn1", 3, 64, 7, 2);
    int64_t in = 64;
    for (int32_t s = 0; s < 4; s++) {
        int64_t planes = 64 << s, out = planes * expansion[arch];
        for (int32_t i = 0; i < stage_blocks[arch][s]; i++) {
            resnet_block *blk = &m->blocks[m->n_blocks++];
            int64_t stride = s > 0 && i == 0 ? 2 : 1;
            char c[64], n[64], p[32];
            snprintf(p, sizeof p, "layer%d.%d", (int)s + 1, (int)i);
            snprintf(blk->name, sizeof blk->name, "%s", p);
#define NAMES(k)                                                                                   \
    (snprintf(c, sizeof c, "%s.conv%d", p, k), snprintf(n, sizeof n, "%s.bn%d", p, k), c), n
            if (arch == RESNET18) {
                blk->n_conv = 2;
                conv_bn_init(&b, &blk->conv[0], NAMES(1), in, planes, 3, stride);
                conv_bn_init(&b, &blk->conv[1], NAMES(2), planes, planes, 3, 1);
            } else {
                blk->n_conv = 3;
                conv_bn_init(&b, &blk->conv[0], NAMES(1), in, planes, 1, 1);
                conv_bn_init(&b, &blk->conv[1], NAMES(2), planes, planes, 3, stride);
                conv_bn_init(&b, &blk->conv[2], NAMES(3), planes, out, 1, 1);
            }
#undef NAMES
            if (stride != 1 || in != out) {
                blk->has_downsample = true;
                snprintf(c, sizeof c, "%s.downsample.0", p);
                snprintf(n, sizeof n, "%s.downsample.1", p);
                conv_bn_init(&b, &blk->downsample, c, n, in, out, 1, stride);
            }
            in = out;
        }
    }
    /* torchvision leaves fc at nn.Linear's default initialisation. */
    if (b.st == LOOM_OK) {
        loom_scope_push(ctx, "fc");
        b.st = loom_nn_linear_init(ctx, &m->fc, in, num_classes, true, &b.rng);
        loom_scope_pop(ctx);
    }
    if (b.st == LOOM_OK) {
        add_state(&b, "fc.", "weight", m->fc.weight, true);
        add_state(&b, "fc.", "bias", m->fc.bias, true);
    }
    if (b.st != LOOM_OK)
        resnet_deinit(m);
    return b.st;
}

void resnet_deinit(resnet *m) {
    conv_bn_deinit(&m->stem);
    for (int32_t i = 0; i < m->n_blocks; i++) {
        for (int32_t k = 0; k < 3; k++)
            conv_bn_deinit(&m->blocks[i].conv[k]);
        conv_bn_deinit(&m->blocks[i].downsample);
    }
    loom_nn_linear_deinit(&m->fc);
    free(m->state);
    free(m->state_names);
    free(m->params);
    free(m->param_state);
    *m = (resnet){0};
}

/* bn(conv(x)), with the running statistics and num_batches_tracked updated in training. */
static loom_tensor *conv_bn(loom_context *ctx, const resnet_conv_bn *c, loom_tensor *x,
                            bool training) {
    const int64_t stride[2] = {c->stride, c->stride}, pad[2] = {c->padding, c->padding};
    loom_tensor *h =
        EX_SCOPED(ctx, c->conv_name, loom_conv2d(ctx, x, c->weight, NULL, stride, pad, NULL, 1));
    loom_scope_push(ctx, c->bn_name);
    h = loom_nn_batch_norm2d_forward(ctx, &c->bn, h, training);
    if (training && h)
        loom_assign(ctx, c->num_batches_tracked,
                    loom_add(ctx, c->num_batches_tracked, loom_scalar(ctx, LOOM_DTYPE_I64, 1)));
    loom_scope_pop(ctx);
    return h;
}

loom_tensor *resnet_forward(loom_context *ctx, const resnet *m, loom_tensor *x, bool training) {
    /* module scopes as torchvision's module paths: conv1, bn1, relu, maxpool, layer1.0 (its
     * relus and the residual add) with layer1.0.conv1, ..., avgpool, fc */
    loom_tensor *h = EX_SCOPED(ctx, "relu", loom_relu(ctx, conv_bn(ctx, &m->stem, x, training)));
    h = EX_SCOPED(ctx, "maxpool",
                  loom_max_pool2d(ctx, h, (int64_t[]){3, 3}, (int64_t[]){2, 2}, (int64_t[]){1, 1}));
    for (int32_t i = 0; i < m->n_blocks; i++) {
        const resnet_block *blk = &m->blocks[i];
        loom_tensor *identity =
            blk->has_downsample ? conv_bn(ctx, &blk->downsample, h, training) : h;
        loom_tensor *y = h;
        for (int32_t k = 0; k < blk->n_conv; k++) {
            y = conv_bn(ctx, &blk->conv[k], y, training);
            if (k + 1 < blk->n_conv)
                y = EX_SCOPED(ctx, blk->name, loom_relu(ctx, y));
        }
        h = EX_SCOPED(ctx, blk->name, loom_relu(ctx, loom_add(ctx, y, identity)));
    }
    /* AdaptiveAvgPool2d((1, 1)) then flatten: the mean over H and W. */
    h = EX_SCOPED(ctx, "avgpool", loom_mean(ctx, h, 2, (int32_t[]){2, 3}, false));
    return EX_SCOPED(ctx, "fc", loom_nn_linear_forward(ctx, &m->fc, h));
}

loom_status resnet_topk_hits(loom_context *ctx, loom_tensor *logits, loom_tensor *labels,
                             loom_tensor **out_top1, loom_tensor **out_top5) {
    int64_t shape[LOOM_MAX_RANK];
    if (loom_tensor_shape(logits, shape) != LOOM_OK)
        return loom_context_error(ctx) != LOOM_OK ? loom_context_error(ctx)
                                                  : LOOM_STATUS_INVALID_ARGUMENT;
    loom_tensor *l = loom_cast(ctx, logits, LOOM_DTYPE_F32);
    /* The label's own logit, then how many logits beat it: its rank (0 = top-1). */
    loom_tensor *own =
        loom_sum(ctx, loom_mul(ctx, l, loom_one_hot(ctx, labels, shape[1], LOOM_DTYPE_F32)), 1,
                 (int32_t[]){1}, true);
    loom_tensor *rank = loom_sum(ctx, loom_cast(ctx, loom_gt(ctx, l, own), LOOM_DTYPE_I64), 1,
                                 (int32_t[]){1}, false);
    loom_tensor *top1 =
        loom_sum(ctx, loom_cast(ctx, loom_eq(ctx, loom_argmax(ctx, l, 1), labels), LOOM_DTYPE_I64),
                 0, NULL, false);
    loom_tensor *top5 = loom_sum(
        ctx,
        loom_cast(ctx, loom_lt(ctx, rank, loom_scalar(ctx, LOOM_DTYPE_I64, 5)), LOOM_DTYPE_I64), 0,
        NULL, false);
    *out_top1 = top1;
    *out_top5 = top5;
    return top1 && top5 ? LOOM_OK : loom_context_error(ctx);
}
