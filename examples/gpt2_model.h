/* GPT-2 (Radford et al. 2019) as nanoGPT writes it, built from loom/nn.h's public ops:
 * pre-LayerNorm blocks, causal multi-head attention, tanh-GELU MLP, lm_head tied to the
 * token embedding; parameters named as nanoGPT's state_dict, and loaded from nanoGPT or
 * Hugging Face safetensors files or from llm.c's gpt2_124M.bin. */
#ifndef LOOM_EXAMPLES_GPT2_MODEL_H
#define LOOM_EXAMPLES_GPT2_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include <loom/nn.h>
#include <loom/safetensors.h>

typedef struct gpt2_config {
    int64_t n_layer, n_head, n_embd, vocab_size, block_size;
    double dropout; /* nanoGPT's: on the embeddings, the attention weights and both residual
                       branches while training (0: none; not read from files) */
} gpt2_config;

/* Tensors per block (ln_1 w/b, c_attn w/b, attn c_proj w/b, ln_2 w/b, c_fc w/b, mlp c_proj
 * w/b) and outside them (wte, wpe, ln_f w/b). */
#define GPT2_PER_LAYER 12
#define GPT2_OUTER 4

/* How --init's file names and lays out the weights. */
typedef enum gpt2_layout {
    GPT2_LAYOUT_AUTO,    /* told apart by c_attn.weight's shape */
    GPT2_LAYOUT_NANOGPT, /* "transformer." prefix, nn.Linear [out, in] */
    GPT2_LAYOUT_HF,      /* no prefix, Conv1D [in, out] */
    GPT2_LAYOUT_COUNT_
} gpt2_layout;

/* Host weights in the model's order (nanoGPT's names and [out, in] shapes). */
typedef struct gpt2_weights {
    gpt2_config cfg;
    int32_t n;
    char (*names)[64];
    int32_t(*rank);
    int64_t (*shape)[2];
    float **data;
} gpt2_weights;

/* Names and shapes for cfg, data allocated (uninitialised). 0, or 1 after saying why. */
int gpt2_weights_alloc(gpt2_weights *w, const gpt2_config *cfg);
void gpt2_weights_free(gpt2_weights *w);
/* GPT-2's initialisation (nanoGPT's _init_weights): every weight N(0, 0.02), the residual
 * projections (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2 n_layer)), biases 0, LayerNorms
 * weight 1 bias 0; from seed. */
void gpt2_weights_init_random(gpt2_weights *w, uint64_t seed);
/* Reads a safetensors file (nanoGPT or HF layout): fills the unset (0) fields of *cfg from
 * the file's shapes, allocates and fills w. 0, or 1 after a message naming the file, the
 * tensor and the shapes. */
int gpt2_weights_load_safetensors(gpt2_weights *w, gpt2_config *cfg, const char *path,
                                  gpt2_layout layout);
/* Reads llm.c's model file (gpt2_124M.bin: magic 20240326, version 3, f32). As above. */
int gpt2_weights_load_llmc(gpt2_weights *w, gpt2_config *cfg, const char *path);

typedef struct gpt2 {
    gpt2_config cfg;
    int32_t n_params;
    loom_tensor **params;     /* long-lived f32, owned */
    loom_named_tensor *named; /* nanoGPT's state_dict names (lm_head.weight not listed) */
    char (*names)[64];
} gpt2;

/* Uploads w's tensors as the model's parameters. Returns LOOM_OK or the context's error. */
loom_status gpt2_init(loom_context *ctx, gpt2 *m, const gpt2_weights *w);
void gpt2_deinit(gpt2 *m);
/* The parameter count (wte counted once: tied), and without wpe (nanoGPT's
 * get_num_params(non_embedding=True), used for the FLOPs estimate). */
int64_t gpt2_num_params(const gpt2_config *cfg, bool non_embedding);
/* Whether parameter i is a 2-D weight (matmuls and embeddings: weight-decayed). */
bool gpt2_param_is_matrix(const gpt2 *m, int32_t i);

/* Logits [B, T, vocab] of tokens idx [B, T] (i64, T <= block_size), with cfg.dropout drawn
 * from the i64 scalar seed (NULL: none, as in evaluation; a new seed each step). Streams:
 * 0 the embeddings, then per layer l 1 + 3 l the attention weights (inside the fused
 * attention), 2 + 3 l its projection, 3 + 3 l the MLP's. NULL on error. */
loom_tensor *gpt2_forward(loom_context *ctx, const gpt2 *m, loom_tensor *idx, loom_tensor *seed);

#endif
