/* ResNet-18 and ResNet-50 in torchvision's layout (torchvision.models.resnet18/resnet50:
 * BasicBlock / Bottleneck v1.5 with the stride on the 3x3 convolution), every parameter and
 * buffer named and shaped as torchvision's state_dict, initialised as torchvision does;
 * built from loom/nn.h's public ops. Shared by examples/resnet.c and its tests. */
#ifndef LOOM_EXAMPLES_RESNET_MODEL_H
#define LOOM_EXAMPLES_RESNET_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include <loom/nn.h>
#include <loom/safetensors.h>

typedef enum resnet_arch { RESNET18, RESNET50, RESNET_ARCH_COUNT_ } resnet_arch;

/* "resnet18", "resnet50". */
extern const char *const resnet_arch_names[];

/* A convolution without bias (as every one in a ResNet) and the batch norm after it. */
typedef struct resnet_conv_bn {
    loom_tensor *weight; /* [out, in, k, k], kaiming_normal(fan_out, relu) */
    int64_t stride, padding;
    loom_nn_batch_norm2d bn;
    loom_tensor *num_batches_tracked; /* i64 scalar buffer, counts training forwards */
    char conv_name[64], bn_name[64];  /* module paths: "layer1.0.conv1", "layer1.0.bn1" */
} resnet_conv_bn;

/* BasicBlock: conv1 3x3 (stride), conv2 3x3; Bottleneck: conv1 1x1, conv2 3x3 (stride),
 * conv3 1x1 (x4 channels). downsample: 1x1 (stride) + BN when the shape changes. */
typedef struct resnet_block {
    resnet_conv_bn conv[3];
    int32_t n_conv;
    bool has_downsample;
    resnet_conv_bn downsample;
    char name[32]; /* "layer1.0" */
} resnet_block;

#define RESNET_MAX_BLOCKS 16

typedef struct resnet {
    resnet_arch arch;
    int64_t num_classes;
    resnet_conv_bn stem; /* conv1, bn1 */
    resnet_block blocks[RESNET_MAX_BLOCKS];
    int32_t n_blocks;
    loom_nn_linear fc;
    /* The state_dict in torchvision's order: n_state entries (parameters and buffers)... */
    int32_t n_state;
    loom_named_tensor *state;
    char (*state_names)[64];
    /* ...and the trainable parameters alone (the optimizer's), in the same order. */
    int32_t n_params;
    loom_tensor **params;
    int32_t *param_state; /* params[i] is state[param_state[i]] */
} resnet;

/* Creates the model's parameters and buffers on ctx from seed. Returns LOOM_OK, the
 * context's error or OUT_OF_MEMORY (the model then owns nothing). */
loom_status resnet_init(loom_context *ctx, resnet *m, resnet_arch arch, int64_t num_classes,
                        uint64_t seed);
/* Releases everything; accepts a zeroed model. */
void resnet_deinit(resnet *m);

/* Logits [N, num_classes] of images x f32 [N, 3, H, W] (H, W >= 32 for every stage to keep
 * a pixel; smaller images work down to 1x1 maps). training: batch statistics, and the
 * running statistics and num_batches_tracked updated (assigned) as torchvision does;
 * otherwise the running statistics. Returns NULL on error (recorded in ctx). */
loom_tensor *resnet_forward(loom_context *ctx, const resnet *m, loom_tensor *x, bool training);

/* Correct predictions among logits [N, C] for labels [N]: top-1 and top-5 hit counts as
 * i64 scalars (a label counts in the top k when fewer than k logits exceed its own). */
loom_status resnet_topk_hits(loom_context *ctx, loom_tensor *logits, loom_tensor *labels,
                             loom_tensor **out_top1, loom_tensor **out_top5);

#endif
