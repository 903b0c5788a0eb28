/* GPT-2 training example (issue 51), as nanoGPT and llm.c train it: the 124M model by
 * default, from random weights or from nanoGPT, Hugging Face or llm.c checkpoints, on llm.c
 * token shards or a file's bytes; AdamW with weight decay on the 2-D weights, warm-up and
 * cosine decay, gradient clipping, AMP; tokens/s and MFU; data parallel under `mpiexec -n N`;
 * sampling from one compiled graph after training. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <loom/amp.h>
#include <loom/dist.h>
#include <loom/loom.h>
#include <loom/nn.h>
#include <loom/optim.h>
#include <loom/safetensors.h>

#include "gpt2_data.h"
#include "gpt2_model.h"
#include "train_util.h"

#define PROG "gpt2"
/* Steps whose intervals the median skips (the first compiles, the second settles). */
#define WARMUP_STEPS 2
/* The GEMM whose compiled time gives the peak FLOP/s of MFU. */
#define PEAK_N 1024

typedef struct options {
    ex_flags f;
    gpt2_config cfg; /* 0: not given (from the file, else GPT-2 124M's) */
    gpt2_layout layout;
    const char *llmc_path, *data_path, *text_path, *prompt;
    int64_t seq_len, warmup_steps, sample_n, top_k;
    double grad_clip;
    bool shuffle, optimizer_set;
} options;

static void usage(FILE *f) {
    fprintf(
        f,
        "Usage: " PROG " (--data FILE.bin | --text FILE) [options]\n"
        "Trains GPT-2 (nanoGPT's model: pre-LayerNorm blocks, causal self-attention, tanh-GELU\n"
        "MLP, lm_head tied to wte) on a token file and reports the losses, tokens/s and MFU.\n"
        "\n"
        "Model (default GPT-2 124M; with --init/--init-llmc the sizes come from the file):\n"
        "  --n-layer N  --n-head N  --n-embd N  --vocab-size N  --block-size N\n"
        "                         defaults 12, 12, 768, 50257 (256 with --text), 1024\n"
        "  --init FILE            weights from a safetensors file: a nanoGPT state_dict\n"
        "                         ('transformer.wte.weight', 'transformer.h.0.attn.c_attn.weight'\n"
        "                         [3C, C] as nn.Linear, ...; lm_head.weight tied or absent) or\n"
        "                         Hugging Face GPT-2's model.safetensors (no prefix, Conv1D\n"
        "                         weights [in, out]; attn.bias/masked_bias buffers ignored); f32,\n"
        "                         f16 or bf16. n_head is not in the file: --n-head, else "
        "n_embd/64\n"
        "  --init-layout auto|nanogpt|hf   (default auto: told apart by c_attn.weight's shape)\n"
        "  --init-llmc FILE       weights from llm.c's gpt2_124M.bin (magic 20240326, version 3)\n"
        "\n"
        "Data:\n"
        "  --data FILE            llm.c token shard (magic 20240520, version 1, uint16 tokens)\n"
        "  --text FILE            the file's bytes as tokens (vocabulary 256)\n"
        "  --batch-size N         global batch of sequences (default 4); under mpiexec -n R each\n"
        "                         rank takes N/R of them\n"
        "  --seq-len N            tokens per sequence (default min(64, block size))\n"
        "  --shuffle              each sequence at a random offset (seeded); else batch k is\n"
        "                         tokens[k*B*T : (k+1)*B*T + 1], wrapping around the file\n"
        "\n");
    /* two strings: one would pass the 4095 characters C17 promises to support */
    fprintf(
        f,
        "Training:\n"
        "  --max-steps N          steps (default 50)\n"
        "  --optimizer adamw|adam|sgd   (default adamw, betas 0.9/0.95 and eps 1e-8 as nanoGPT)\n"
        "  --lr X                 peak learning rate (default 6e-4; 0.01 for sgd)\n"
        "  --momentum X           sgd momentum (default 0.9)\n"
        "  --weight-decay X       on the 2-D weights only (matmuls and embeddings; not biases or\n"
        "                         LayerNorms), as nanoGPT and llm.c (default 0.1 for adamw, else "
        "0)\n"
        "  --warmup-steps N       linear warm-up: lr * (step + 1) / N for the first N steps\n"
        "  --lr-schedule constant|cosine   after warm-up: constant, or cosine decay to lr/10 at\n"
        "                         the last step (nanoGPT's min_lr)\n"
        "  --grad-clip X          clip the gradients' global L2 norm to X (0: off; default 1.0)\n"
        "  --dropout P            nanoGPT's dropout while training, on the embeddings, the\n"
        "                         attention weights (inside the fused attention) and both\n"
        "                         residual branches (default 0, nanoGPT's for pretraining;\n"
        "                         Hugging Face GPT-2 trained with 0.1). Drawn from --seed, the\n"
        "                         rank and the step; sampling runs without it\n"
        "  --amp none|bf16|f16    autocast the forward (matmuls in 16-bit; default none)\n"
        "  --loss-scale dynamic|off|X   GradScaler (default dynamic for f16, off otherwise)\n"
        "  --seed N               initialisation and --shuffle (default 0)\n"
        "  --save FILE            write the weights after training (safetensors, nanoGPT names)\n"
        "  --log-every N          `step=<n> loss=<v> lr=<lr> ms=<step time>` every N steps\n"
        "                         (default 1; n counts from 0: the loss before that update)\n"
        "  --eager                run every step on the reference interpreter (slow; a check)\n"
        "  --json                 one JSON line of results at the end (every step's loss too)\n"
        "\n"
        "Sampling after training (rank 0):\n"
        "  --sample N             generate N tokens, each from the same compiled graph (context\n"
        "                         of seq-len tokens, right-padded; the logits read at the current\n"
        "                         position): no recompile per token\n"
        "  --prompt TEXT          the context to continue (--text mode; default a newline);\n"
        "                         with --data generation starts from <|endoftext|> (50256)\n"
        "  --top-k K              sample among the K most likely tokens (default 0: greedy)\n"
        "\n"
        "tokens/s is the median over the steps after the first %d (the first compiles); MFU is\n"
        "that times nanoGPT's estimate of the FLOPs per token, 6 N + 12 L C T (N the parameters\n"
        "without wpe, T the sequence length), over the peak measured at the end: the best of 4\n"
        "timed runs of a compiled Loom matmul %dx%dx%d in the dtype of the forward's matmuls\n"
        "(f32, or --amp's, on the path they take; times the ranks under mpiexec).\n"
        "LOOM_NUM_THREADS sets the device's threads. Exit status: 0 ok, 1 runtime error, 2 "
        "usage.\n",
        WARMUP_STEPS, PEAK_N, PEAK_N, PEAK_N);
}

static int on_option(void *ud, const char *name, const char *val) {
    options *o = ud;
    if (!strcmp(name, "--shuffle")) {
        o->shuffle = true;
        return 0;
    }
    if (!strcmp(name, "--init-layout")) {
        if (!strcmp(val, "auto"))
            o->layout = GPT2_LAYOUT_AUTO;
        else if (!strcmp(val, "nanogpt"))
            o->layout = GPT2_LAYOUT_NANOGPT;
        else if (!strcmp(val, "hf"))
            o->layout = GPT2_LAYOUT_HF;
        else
            return ex_usage_error("--init-layout must be auto, nanogpt or hf, not '%s'", val);
        return 0;
    }
    if (!strcmp(name, "--grad-clip")) {
        if (!ex_parse_real(val, &o->grad_clip))
            return ex_usage_error("--grad-clip needs a finite number >= 0, not '%s'", val);
        return 0;
    }
    if (!strcmp(name, "--dropout")) {
        if (!ex_parse_real(val, &o->cfg.dropout) || !(o->cfg.dropout < 1))
            return ex_usage_error("--dropout needs a probability in [0, 1), not '%s'", val);
        return 0;
    }
    const char **paths[] = {&o->llmc_path, &o->data_path, &o->text_path, &o->prompt};
    static const char *const path_names[] = {"--init-llmc", "--data", "--text", "--prompt"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++)
        if (!strcmp(name, path_names[i])) {
            *paths[i] = val;
            return 0;
        }
    static const ex_int_option ints[] = {{"--n-layer", 1, offsetof(options, cfg.n_layer)},
                                         {"--n-head", 1, offsetof(options, cfg.n_head)},
                                         {"--n-embd", 1, offsetof(options, cfg.n_embd)},
                                         {"--vocab-size", 1, offsetof(options, cfg.vocab_size)},
                                         {"--block-size", 1, offsetof(options, cfg.block_size)},
                                         {"--seq-len", 1, offsetof(options, seq_len)},
                                         {"--warmup-steps", 0, offsetof(options, warmup_steps)},
                                         {"--sample", 0, offsetof(options, sample_n)},
                                         {"--top-k", 0, offsetof(options, top_k)}};
    int st = ex_parse_int_option(ints, sizeof ints / sizeof *ints, name, val, o);
    return st < 0 ? 0 : st;
}

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.grad_clip = 1.0};
    static const char *const valued[] = {
        "--n-layer",      "--n-head",    "--n-embd", "--vocab-size", "--block-size",
        "--init-layout",  "--init-llmc", "--data",   "--text",       "--seq-len",
        "--warmup-steps", "--grad-clip", "--sample", "--prompt",     "--top-k",
        "--dropout",      NULL};
    static const char *const switches[] = {"--shuffle", NULL};
    ex_cli cli = {.valued = valued,
                  .switches = switches,
                  .on_option = on_option,
                  .usage = usage,
                  .ud = o,
                  .steps_flag = "--max-steps",
                  .lr_schedules = "constant|cosine",
                  .default_batch = 4};
    for (int i = 1; i < argc; i++) /* the parser defaults to sgd: gpt2's default is adamw */
        if (!strncmp(argv[i], "--optimizer", 11) && (argv[i][11] == '\0' || argv[i][11] == '='))
            o->optimizer_set = true;
    int rc = ex_parse_args(argc, argv, &cli, &o->f);
    if (rc >= 0)
        return rc;
    ex_flags *f = &o->f;
    if (!o->optimizer_set)
        f->optimizer = LOOM_OPTIM_ADAMW;
    if (!f->lr_set)
        f->lr = f->optimizer == LOOM_OPTIM_SGD ? 0.01 : 6e-4;
    if (!f->momentum_set)
        f->momentum = f->optimizer == LOOM_OPTIM_SGD ? 0.9 : 0.0;
    if (!f->weight_decay_set)
        f->weight_decay = f->optimizer == LOOM_OPTIM_ADAMW ? 0.1 : 0.0;
    if (!f->max_steps)
        f->max_steps = 50;
    if (!f->log_every)
        f->log_every = 1;
    if (!o->data_path == !o->text_path)
        return ex_usage_error("give one of --data FILE.bin (llm.c tokens) or --text FILE");
    if (f->init_path && o->llmc_path)
        return ex_usage_error("--init and --init-llmc exclude each other");
    if (o->text_path && !o->cfg.vocab_size && !f->init_path && !o->llmc_path)
        o->cfg.vocab_size = 256;
    if (o->prompt && !o->text_path)
        return ex_usage_error("--prompt needs --text (there is no tokenizer for --data)");
    return -1;
}

/* The sizes not given and not from a file: GPT-2 124M's. 0, or EXIT_USAGE. */
static int finish_config(options *o) {
    gpt2_config *c = &o->cfg;
    if (!c->n_layer)
        c->n_layer = 12;
    if (!c->n_head)
        c->n_head = 12;
    if (!c->n_embd)
        c->n_embd = 768;
    if (!c->vocab_size)
        c->vocab_size = 50257;
    if (!c->block_size)
        c->block_size = 1024;
    if (c->n_embd % c->n_head)
        return ex_usage_error("--n-head %" PRId64 " must divide --n-embd %" PRId64, c->n_head,
                              c->n_embd);
    if (c->vocab_size > 65536 && o->data_path)
        return ex_usage_error("--vocab-size %" PRId64 ": llm.c's tokens are 16-bit", c->vocab_size);
    if (o->text_path && c->vocab_size < 256)
        return ex_usage_error("--text needs --vocab-size >= 256 (bytes), not %" PRId64,
                              c->vocab_size);
    if (!o->seq_len)
        o->seq_len = c->block_size < 64 ? c->block_size : 64;
    if (o->seq_len > c->block_size)
        return ex_usage_error("--seq-len %" PRId64 " exceeds the block size %" PRId64, o->seq_len,
                              c->block_size);
    return 0;
}

/* ---- training -------------------------------------------------------------------------- */

/* nanoGPT's get_lr: linear warm-up, then constant or cosine down to lr/10 at the last step. */
static double lr_at(const options *o, int64_t step) {
    double lr = o->f.lr;
    if (step < o->warmup_steps)
        return lr * (double)(step + 1) / (double)o->warmup_steps;
    if (o->f.lr_schedule != EX_LR_COSINE)
        return lr;
    int64_t span = o->f.max_steps - 1 - o->warmup_steps;
    double ratio = span > 0 ? (double)(step - o->warmup_steps) / (double)span : 1.0;
    return 0.1 * lr + 0.5 * (1 + cos(3.14159265358979323846 * ratio)) * (lr - 0.1 * lr);
}

/* The optimizer: weight decay on the 2-D weights only, as nanoGPT's configure_optimizers:
 * two parameter groups of one loom_optim, whose parameter list is the matrices then the
 * rest (order[] maps it to the model's indices). */
typedef struct optimizer {
    loom_optim *opt;
    int32_t n;
    loom_tensor **params; /* the optimizer's order */
    int32_t *order;       /* params[i] is the model's parameter order[i] */
} optimizer;

static void optimizer_destroy(optimizer *opt) {
    loom_optim_destroy(opt->opt);
    free(opt->params);
    free(opt->order);
    *opt = (optimizer){0};
}

static loom_status optimizer_create(loom_context *ctx, const options *o, const gpt2 *m,
                                    optimizer *opt) {
    *opt = (optimizer){.n = m->n_params};
    opt->params = calloc((size_t)m->n_params, sizeof *opt->params);
    opt->order = calloc((size_t)m->n_params, sizeof *opt->order);
    if (!opt->params || !opt->order)
        return LOOM_STATUS_OUT_OF_MEMORY;
    int32_t n_matrices = 0, k = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int32_t i = 0; i < m->n_params; i++)
            if (gpt2_param_is_matrix(m, i) == (pass == 0)) {
                opt->order[k] = i;
                opt->params[k++] = m->params[i];
                n_matrices += pass == 0;
            }
    loom_optim_options oo;
    loom_optim_options_init(&oo, o->f.optimizer);
    oo.lr = o->f.lr;
    if (o->f.optimizer == LOOM_OPTIM_SGD)
        oo.momentum = o->f.momentum;
    else
        oo.beta2 = 0.95; /* nanoGPT's and llm.c's */
    loom_optim_group groups[2] = {{n_matrices, opt->params, o->f.weight_decay},
                                  {m->n_params - n_matrices, opt->params + n_matrices, 0.0}};
    return loom_optim_create_groups(ctx, &oo, 2, groups, &opt->opt);
}

static void optimizer_set_lr(optimizer *opt, double lr) {
    loom_optim_set_lr(opt->opt, lr);
}

/* PyTorch's clip_grad_norm_ (optim.h's loom_clip_grad_norm): each gradient times
 * min(1, max_norm / (norm + 1e-6)) in the graph. The global L2 norm, or NULL. */
static loom_tensor *clip_grad_norm(loom_context *ctx, int32_t n, loom_tensor **grads,
                                   double max_norm) {
    loom_tensor *norm = NULL;
    loom_clip_grad_norm(ctx, n, grads, max_norm, &norm);
    return norm;
}

/* A training step after the forward's loss: backward of the scaled loss, gradient
 * all-reduce, unscale and overflow check, clipping, the update (skipped on
 * overflow, in the graph), scale update. The loss (mean over the ranks) and the norm are
 * retained into out_loss / out_norm (NULL when they could not be built). */
static void train_step_record(loom_context *ctx, const options *o, const gpt2 *m, optimizer *opt,
                              const model_amp *amp, loom_tensor *loss, loom_tensor **out_loss,
                              loom_tensor **out_norm) {
    int32_t n = m->n_params;
    loom_tensor **grads = calloc((size_t)n, sizeof *grads);
    loom_tensor **gg = calloc((size_t)n, sizeof *gg);
    loom_grad_scaler *scaler = amp->scaler;
    bool scaling = loom_grad_scaler_is_enabled(scaler);
    loom_tensor *scaled = scaling ? loom_grad_scaler_scale(scaler, loss) : loss;
    loom_tensor *norm = NULL;
    if (grads && gg && scaled && loom_backward(ctx, scaled, n, m->params, grads) == LOOM_OK &&
        loom_allreduce_gradients(ctx, n, grads) == LOOM_OK) {
        loom_tensor *found_inf = scaling ? loom_grad_scaler_unscale(scaler, n, grads) : NULL;
        if (o->grad_clip > 0)
            norm = EX_SCOPED(ctx, "clip_grad_norm", clip_grad_norm(ctx, n, grads, o->grad_clip));
        for (int32_t i = 0; i < n; i++)
            gg[i] = grads[opt->order[i]];
        loom_scope_push(ctx, "optimizer"); /* the gradients keep their forward's scopes */
        loom_status st = loom_optim_step(opt->opt, gg, found_inf);
        loom_scope_pop(ctx);
        if (st == LOOM_OK && found_inf && !amp->static_scale)
            loom_grad_scaler_update(scaler, found_inf);
    }
    free(grads);
    free(gg);
    int32_t world = loom_dist_world_size();
    if (world > 1)
        loss = loom_all_reduce(ctx, loss, LOOM_REDUCE_SUM, 1.0 / world);
    loom_tensor_retain(loss);
    *out_loss = loss;
    loom_tensor_retain(norm);
    *out_norm = norm;
}

typedef struct train_result {
    int64_t steps, skipped;
    double *losses;
    double tokens_per_sec_median, tokens_per_sec, first_step_ms, compile_ms;
    double first_loss_ms; /* step 0's start until its loss was read (its run, step 1's trace) */
    double planned_peak_mb, device_peak_mb; /* the training step's plan; the device's peak */
} train_result;

/* The planned peak of the last compiled step, from loom_memory_report ("planned peak N
 * bytes ..."), in MiB; 0 when there is none (the interpreter). */
static double planned_peak_mb(const loom_context *ctx) {
    const char *r = strstr(loom_memory_report(ctx), "planned peak ");
    return r ? strtod(r + strlen("planned peak "), NULL) / (1024.0 * 1024.0) : 0.0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Reads a finished step's loss (and norm) and prints its line. 0, or 1 after a message. */
static int take_loss(loom_context *ctx, const options *o, int64_t step, loom_tensor **loss,
                     loom_tensor **norm, double lr, double ms, train_result *res) {
    float v = NAN, nv = NAN;
    loom_status st = loom_tensor_read(ctx, *loss, &v, sizeof v);
    if (st == LOOM_OK && *norm)
        st = loom_tensor_read(ctx, *norm, &nv, sizeof nv);
    loom_tensor_release(*loss);
    loom_tensor_release(*norm);
    *loss = *norm = NULL;
    if (st != LOOM_OK)
        return ex_runtime_error(ctx, "reading the loss");
    res->losses[step] = v;
    if (!isfinite(v)) {
        if (o->f.rank == 0)
            fprintf(stderr, "%sthe loss became %f at step %" PRId64 ": try a smaller --lr\n",
                    ex_who(), (double)v, step);
        return 1;
    }
    if (o->f.rank == 0 && step % o->f.log_every == 0) {
        printf("step=%" PRId64 " loss=%.6f lr=%.6g", step, (double)v, lr);
        if (o->grad_clip > 0)
            printf(" norm=%.4f", (double)nv);
        printf(" ms=%.1f\n", ms);
        fflush(stdout);
    }
    return 0;
}

/* Step `step`'s dropout seed on this rank: every (seed, rank, step) its own draws. */
static uint64_t dropout_seed(uint64_t seed, int64_t rank, int64_t step) {
    uint64_t s = seed ^ (uint64_t)rank << 48 ^ (uint64_t)step * 0xD1B54A32D192ED03ull;
    return ex_splitmix64(&s);
}

static int train(loom_context *ctx, const options *o, const gpt2 *m, optimizer *opt,
                 const model_amp *amp, const gpt2_tokens *tok, train_result *res) {
    const ex_flags *f = &o->f;
    int64_t B = f->batch_size, b = B / f->world, T = o->seq_len, total = f->max_steps;
    int64_t *in = malloc((size_t)(b * T) * sizeof *in);
    int64_t *out = malloc((size_t)(b * T) * sizeof *out);
    double *launch = malloc((size_t)(total + 1) * sizeof *launch);
    double *lrs = malloc((size_t)(total + 1) * sizeof *lrs);
    res->losses = malloc((size_t)total * sizeof *res->losses);
    loom_tensor *pending = NULL, *pending_norm = NULL;
    int rc = 1;
    if (!in || !out || !launch || !lrs || !res->losses) {
        fprintf(stderr, "%sout of memory\n", ex_who());
        goto out;
    }
    bool fixed_lr = o->warmup_steps == 0 && f->lr_schedule == EX_LR_CONSTANT;
    int64_t compile_ns = 0;
    double t_first = 0, t_start = 0;
    for (int64_t step = 0; step < total; step++) {
        lrs[step] = lr_at(o, step);
        if (!fixed_lr) /* a device scalar: never recompiles */
            optimizer_set_lr(opt, lrs[step]);
        gpt2_batch(tok, step, B, T, f->rank * b, b, o->shuffle, f->seed, in, out);
        double t0 = ex_now_s();
        loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 2, (int64_t[]){b, T}, in);
        loom_tensor *y = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 2, (int64_t[]){b, T}, out);
        /* the step's dropout seed: a graph input, so a new one each step never recompiles */
        int64_t seed_v = (int64_t)dropout_seed(f->seed, f->rank, step);
        loom_tensor *seed = m->cfg.dropout > 0
                                ? loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 0, NULL, &seed_v)
                                : NULL;
        if (amp->dtype != LOOM_DTYPE_F32)
            loom_autocast_begin(ctx, amp->dtype);
        loom_tensor *loss =
            loom_cross_entropy(ctx, gpt2_forward(ctx, m, x, seed), y, LOOM_REDUCTION_MEAN);
        if (amp->dtype != LOOM_DTYPE_F32)
            loom_autocast_end(ctx);
        loom_tensor *step_loss = NULL, *step_norm = NULL;
        train_step_record(ctx, o, m, opt, amp, loss, &step_loss, &step_norm);
        loom_status st = loom_mark_step(ctx);
        loom_tensor_release(x);
        loom_tensor_release(y);
        loom_tensor_release(seed);
        if (st != LOOM_OK || !step_loss) {
            loom_tensor_release(step_loss);
            loom_tensor_release(step_norm);
            rc = ex_runtime_error(ctx, "training step");
            goto out;
        }
        double now = ex_now_s();
        launch[step] = now;
        if (step == 0) {
            res->first_step_ms = (now - t0) * 1e3;
            t_start = t0;
            compile_ns = loom_metric_total(ctx, "CompileTime");
            res->compile_ms = (double)compile_ns / 1e6;
            t_first = now;
        }
        /* Launching this step waited for the previous one: its loss is ready. */
        if (pending &&
            take_loss(ctx, o, step - 1, &pending, &pending_norm, lrs[step - 1],
                      step >= 2 ? (now - launch[step - 1]) * 1e3 : res->first_step_ms, res))
            goto out;
        if (step == 1)
            res->first_loss_ms = (ex_now_s() - t_start) * 1e3;
        pending = step_loss;
        pending_norm = step_norm;
        res->steps = step + 1;
    }
    if (loom_context_sync(ctx) != LOOM_OK) {
        rc = ex_runtime_error(ctx, "training");
        goto out;
    }
    double end = ex_now_s();
    launch[total] = end;
    if (pending &&
        take_loss(ctx, o, total - 1, &pending, &pending_norm, lrs[total - 1],
                  total >= 2 ? (end - launch[total - 1]) * 1e3 : res->first_step_ms, res))
        goto out;
    if (total == 1)
        res->first_loss_ms = (ex_now_s() - t_start) * 1e3;
    double elapsed =
        end - t_first - (double)(loom_metric_total(ctx, "CompileTime") - compile_ns) * 1e-9;
    res->tokens_per_sec = total > 1 && elapsed > 0 ? (double)((total - 1) * B * T) / elapsed : 0;
    /* Step i ran from its launch to the next's (a launch waits for its predecessor): the
     * steady state. The last step's interval, from its launch to the end, lacks the next
     * step's tracing: with no other interval left the overall rate stands in. */
    int64_t first = total > WARMUP_STEPS ? WARMUP_STEPS : 1, n = total - 1 - first;
    res->tokens_per_sec_median = res->tokens_per_sec;
    double *d = n > 0 ? malloc((size_t)n * sizeof *d) : NULL;
    if (d) {
        for (int64_t i = 0; i < n; i++)
            d[i] = launch[first + i + 1] - launch[first + i];
        qsort(d, (size_t)n, sizeof *d, cmp_double);
        double med = n % 2 ? d[n / 2] : 0.5 * (d[n / 2 - 1] + d[n / 2]);
        res->tokens_per_sec_median = med > 0 ? (double)(B * T) / med : 0;
        free(d);
    }
    if (loom_grad_scaler_is_enabled(amp->scaler)) {
        int64_t clean = ex_optimizer_steps(ctx, opt->opt);
        res->skipped = clean >= 0 ? total - clean : 0;
    }
    rc = 0;
out:
    loom_tensor_release(pending);
    loom_tensor_release(pending_norm);
    free(in);
    free(out);
    free(launch);
    free(lrs);
    return rc;
}

/* The peak FLOP/s of this rank's device for matmuls of dtype (f32, or autocast's 16-bit
 * dtype, on the path its matmuls take): the best of 4 timed runs of a compiled PEAK_N^3
 * matmul (after one that compiles it), its operands cast to dtype by a step of their own.
 * 0 on failure. */
static double measure_peak(loom_context *ctx, loom_dtype dtype) {
    size_t n = (size_t)PEAK_N * PEAK_N;
    float *a = malloc(n * sizeof *a), *c = malloc(n * sizeof *c);
    double best = INFINITY;
    loom_tensor *ta = NULL, *tb = NULL;
    if (a && c) {
        for (size_t i = 0; i < n; i++)
            a[i] = (float)((double)(i % 7) * 0.25 - 0.75);
        ta = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){PEAK_N, PEAK_N}, a);
        tb = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){PEAK_N, PEAK_N}, a);
    }
    if (ta && tb && dtype != LOOM_DTYPE_F32) {
        loom_tensor *ca = loom_cast(ctx, ta, dtype), *cb = loom_cast(ctx, tb, dtype);
        loom_tensor_retain(ca);
        loom_tensor_retain(cb);
        loom_tensor_release(ta);
        loom_tensor_release(tb);
        ta = ca;
        tb = cb;
        if (loom_mark_step(ctx) != LOOM_OK || loom_context_sync(ctx) != LOOM_OK) {
            loom_tensor_release(ta);
            loom_tensor_release(tb);
            ta = tb = NULL;
        }
    }
    for (int r = 0; ta && tb && r < 5; r++) {
        loom_tensor *p = loom_matmul(ctx, ta, tb);
        loom_tensor_retain(p);
        if (loom_context_sync(ctx) != LOOM_OK)
            break;
        double t0 = ex_now_s();
        loom_status st = loom_mark_step(ctx);
        if (st == LOOM_OK)
            st = loom_context_sync(ctx);
        double dt = ex_now_s() - t0;
        if (st == LOOM_OK && dtype == LOOM_DTYPE_F32)
            st = loom_tensor_read(ctx, p, c, n * sizeof *c);
        loom_tensor_release(p);
        if (st != LOOM_OK)
            break;
        if (r > 0 && dt < best)
            best = dt;
    }
    loom_tensor_release(ta);
    loom_tensor_release(tb);
    free(a);
    free(c);
    loom_context_clear_error(ctx);
    return isfinite(best) && best > 0 ? 2.0 * PEAK_N * (double)PEAK_N * PEAK_N / best : 0;
}

/* ---- sampling -------------------------------------------------------------------------- */

typedef struct sample_result {
    int64_t n, compiles;
    double seconds;
} sample_result;

/* The next token from logits [V]: argmax (top_k 0), else a draw among the top k by softmax. */
static int64_t pick(const float *logits, int64_t V, int64_t top_k, uint64_t *rng, int64_t *idx) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (logits[v] > logits[best])
            best = v;
    if (top_k <= 1)
        return best;
    int64_t k = top_k < V ? top_k : V;
    for (int64_t i = 0; i < k; i++) { /* a partial selection sort: k is small */
        int64_t arg = -1;
        for (int64_t v = 0; v < V; v++) {
            bool taken = false;
            for (int64_t j = 0; j < i && !taken; j++)
                taken = idx[j] == v;
            if (!taken && (arg < 0 || logits[v] > logits[arg]))
                arg = v;
        }
        idx[i] = arg;
    }
    double sum = 0, w[256];
    int64_t kk = k < 256 ? k : 256;
    for (int64_t i = 0; i < kk; i++)
        sum += (w[i] = exp((double)logits[idx[i]] - (double)logits[best]));
    double u = (double)(ex_splitmix64(rng) >> 11) * 0x1.0p-53 * sum;
    for (int64_t i = 0; i < kk; i++)
        if ((u -= w[i]) <= 0)
            return idx[i];
    return idx[kk - 1];
}

static int sample(loom_context *ctx, const options *o, const gpt2 *m, const model_amp *amp,
                  sample_result *res) {
    int64_t T = o->seq_len, V = m->cfg.vocab_size, cur = 0;
    int64_t *ctxbuf = calloc((size_t)T, sizeof *ctxbuf);
    float *row = malloc((size_t)V * sizeof *row);
    int64_t idx[256];
    uint64_t rng = o->f.seed ^ 0x5A5A5A5Aull;
    int rc = 1;
    if (!ctxbuf || !row) {
        fprintf(stderr, "%sout of memory\n", ex_who());
        goto out;
    }
    if (o->text_path) {
        const char *p = o->prompt && *o->prompt ? o->prompt : "\n";
        size_t len = strlen(p);
        if ((int64_t)len > T)
            p += len - (size_t)T, len = (size_t)T; /* the last T bytes */
        for (size_t i = 0; i < len; i++)
            ctxbuf[cur++] = (unsigned char)p[i];
        printf("sample: %s", o->prompt ? o->prompt : "\n");
    } else {
        ctxbuf[cur++] = V > 50256 ? 50256 : 0; /* <|endoftext|> */
        printf("sample (token ids):");
    }
    int64_t misses = loom_metric_value(ctx, "CacheMiss");
    double t0 = ex_now_s();
    for (int64_t s = 0; s < o->sample_n; s++) {
        int64_t pos = cur - 1;
        loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 2, (int64_t[]){1, T}, ctxbuf);
        loom_tensor *p = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 1, (int64_t[]){1}, &pos);
        if (amp->dtype != LOOM_DTYPE_F32)
            loom_autocast_begin(ctx, amp->dtype);
        loom_tensor *logits = loom_index_select(ctx, gpt2_forward(ctx, m, x, NULL), 1, p);
        if (amp->dtype != LOOM_DTYPE_F32)
            loom_autocast_end(ctx);
        loom_tensor *last = loom_cast(ctx, logits, LOOM_DTYPE_F32);
        loom_tensor_retain(last);
        loom_status st = loom_mark_step(ctx);
        if (st == LOOM_OK)
            st = loom_tensor_read(ctx, last, row, (size_t)V * sizeof *row);
        loom_tensor_release(last);
        loom_tensor_release(x);
        loom_tensor_release(p);
        if (st != LOOM_OK || !last) {
            rc = ex_runtime_error(ctx, "sampling");
            goto out;
        }
        int64_t t = pick(row, V, o->top_k, &rng, idx);
        if (cur == T) { /* full: slide the window */
            memmove(ctxbuf, ctxbuf + 1, (size_t)(T - 1) * sizeof *ctxbuf);
            cur--;
        }
        ctxbuf[cur++] = t;
        if (o->text_path)
            putchar((int)t);
        else
            printf(" %" PRId64, t);
        fflush(stdout);
    }
    printf("\n");
    res->n = o->sample_n;
    res->seconds = ex_now_s() - t0;
    res->compiles = loom_metric_value(ctx, "CacheMiss") - misses;
    rc = 0;
out:
    free(ctxbuf);
    free(row);
    return rc;
}

/* ---- main ------------------------------------------------------------------------------ */

static void print_json(const options *o, const gpt2 *m, const train_result *tr, double flops_tok,
                       double peak, const sample_result *sr, loom_context *ctx) {
    const gpt2_config *c = &m->cfg;
    double achieved = flops_tok * tr->tokens_per_sec_median;
    printf("{\"model\":\"gpt2\",\"n_layer\":%" PRId64 ",\"n_head\":%" PRId64 ",\"n_embd\":%" PRId64
           ",\"vocab_size\":%" PRId64 ",\"block_size\":%" PRId64 ",\"n_params\":%" PRId64
           ",\"batch_size\":%" PRId64 ",\"seq_len\":%" PRId64
           ",\"optimizer\":\"%s\",\"lr\":%g,\"weight_decay\":%g,\"grad_clip\":%g,\"amp\":\"%s\","
           "\"steps\":%" PRId64 ",\"skipped_steps\":%" PRId64 ",\"first_loss\":%.8g,"
           "\"final_loss\":%.8g,\"losses\":[",
           c->n_layer, c->n_head, c->n_embd, c->vocab_size, c->block_size,
           gpt2_num_params(c, false), o->f.batch_size, o->seq_len, ex_optim_names[o->f.optimizer],
           o->f.lr, o->f.weight_decay, o->grad_clip, ex_amp_name(o->f.amp), tr->steps, tr->skipped,
           tr->losses[0], tr->losses[tr->steps - 1]);
    for (int64_t i = 0; i < tr->steps; i++)
        printf("%s%.8g", i ? "," : "", tr->losses[i]);
    printf("],\"tokens_per_sec\":%.1f,\"tokens_per_sec_median\":%.1f,\"flops_per_token\":%.0f,"
           "\"peak_flops\":%.4g,\"peak_dtype\":\"%s\",\"mfu\":%.4f,\"first_step_ms\":%.1f,"
           "\"compile_time_ms\":%.1f,"
           "\"first_loss_ms\":%.1f,"
           "\"planned_peak_mb\":%.1f,\"device_peak_mb\":%.1f,"
           "\"recompiles\":%lld,\"sample_tokens\":%" PRId64 ",\"sample_compiles\":%" PRId64
           ",\"world_size\":%d,\"collective_bytes\":%lld}\n",
           tr->tokens_per_sec, tr->tokens_per_sec_median, flops_tok, peak,
           loom_dtype_name(o->f.amp), peak > 0 ? achieved / peak : 0.0, tr->first_step_ms,
           tr->compile_ms, tr->first_loss_ms, tr->planned_peak_mb, tr->device_peak_mb,
           (long long)loom_metric_value(ctx, "Recompiles"), sr->n, sr->compiles, (int)o->f.world,
           (long long)loom_metric_value(ctx, "CollectiveBytes"));
}

int main(int argc, char **argv) {
    if (!ex_begin(PROG))
        return 1;
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return ex_leave(rc);
    ex_flags *f = &o.f;
    loom_context *ctx = NULL;
    gpt2_weights w = {0};
    gpt2 m = {0};
    gpt2_tokens tok = {0};
    optimizer opt = {0};
    loom_grad_scaler *scaler = NULL;
    train_result tr = {0};
    sample_result sr = {0};
    rc = 1;
    /* Every rank reads the files (the sizes come from them), rank 0's weights are broadcast. */
    if (f->init_path  ? gpt2_weights_load_safetensors(&w, &o.cfg, f->init_path, o.layout)
        : o.llmc_path ? gpt2_weights_load_llmc(&w, &o.cfg, o.llmc_path)
                      : 0)
        goto out;
    if ((rc = finish_config(&o)) != 0)
        goto out;
    rc = 1;
    if (!w.data) {
        if (gpt2_weights_alloc(&w, &o.cfg))
            goto out;
        gpt2_weights_init_random(&w, f->seed);
    }
    if (o.data_path ? gpt2_tokens_load_llmc(&tok, o.data_path, o.cfg.vocab_size)
                    : gpt2_tokens_load_text(&tok, o.text_path))
        goto out;
    bool eager;
    if (!(ctx = ex_context_create(f, &eager)))
        goto out;
    if (gpt2_init(ctx, &m, &w) != LOOM_OK) {
        rc = ex_runtime_error(ctx, "creating the model");
        goto out;
    }
    gpt2_weights_free(&w);
    if (f->world > 1 && (loom_broadcast_parameters(ctx, m.n_params, m.params) != LOOM_OK ||
                         loom_mark_step(ctx) != LOOM_OK)) {
        rc = ex_runtime_error(ctx, "broadcasting rank 0's parameters");
        goto out;
    }
    if (ex_grad_scaler_create(ctx, f, &scaler) != LOOM_OK) {
        rc = ex_runtime_error(ctx, "creating the loss scaler");
        goto out;
    }
    if (optimizer_create(ctx, &o, &m, &opt) != LOOM_OK) {
        rc = ex_runtime_error(ctx, "creating the optimizer");
        goto out;
    }
    model_amp amp = {
        .dtype = f->amp, .scaler = scaler, .static_scale = f->loss_scale == EX_LS_STATIC};
    const gpt2_config *c = &m.cfg;
    if (f->rank == 0 && !f->json) {
        printf("gpt2: %" PRId64 " layers, %" PRId64 " heads, n_embd %" PRId64 ", vocab %" PRId64
               ", block %" PRId64 " (%.2fM parameters), %s %s (%" PRId64 " tokens), batch %" PRId64
               " x %" PRId64 ", %s lr %g wd %g, amp %s%s",
               c->n_layer, c->n_head, c->n_embd, c->vocab_size, c->block_size,
               (double)gpt2_num_params(c, false) / 1e6, o.data_path ? "--data" : "--text",
               o.data_path ? o.data_path : o.text_path, tok.n, f->batch_size, o.seq_len,
               ex_optim_names[f->optimizer], f->lr, f->weight_decay, ex_amp_name(f->amp),
               eager ? ", reference interpreter" : "");
        if (f->world > 1)
            printf(", %d ranks", (int)f->world);
        printf("\n");
        fflush(stdout);
    }
    if (train(ctx, &o, &m, &opt, &amp, &tok, &tr) != 0)
        goto out;
    /* before sampling and the GEMM timing add steps of their own */
    size_t dev_now = 0, dev_peak = 0;
    loom_device_memory(ctx, &dev_now, &dev_peak);
    tr.planned_peak_mb = planned_peak_mb(ctx);
    tr.device_peak_mb = (double)dev_peak / (1024.0 * 1024.0);
    rc = 0;
    if (f->rank != 0)
        goto out;
    rc = 1;
    if (f->save_path) {
        loom_named_tensor *list = malloc((size_t)(m.n_params + 1) * sizeof *list);
        if (!list)
            goto out;
        memcpy(list, m.named, (size_t)m.n_params * sizeof *list);
        list[m.n_params] = (loom_named_tensor){"lm_head.weight", m.params[0]}; /* tied */
        loom_status st = loom_safetensors_save(ctx, f->save_path, m.n_params + 1, list);
        free(list);
        if (st != LOOM_OK) {
            rc = ex_runtime_error(ctx, "--save");
            goto out;
        }
    }
    if (o.sample_n > 0 && sample(ctx, &o, &m, &amp, &sr) != 0)
        goto out;
    double flops_tok = 6.0 * (double)gpt2_num_params(c, true) +
                       12.0 * (double)(c->n_layer * c->n_embd * o.seq_len);
    double peak = eager ? 0 : measure_peak(ctx, amp.dtype) * f->world;
    if (f->json)
        print_json(&o, &m, &tr, flops_tok, peak, &sr, ctx);
    else {
        printf("trained %" PRId64 " steps, loss %.6f -> %.6f, %.0f tokens/s (median after %d "
               "steps; %.0f overall), first step %.0f ms (compile %.0f ms)\n",
               tr.steps, tr.losses[0], tr.losses[tr.steps - 1], tr.tokens_per_sec_median,
               WARMUP_STEPS, tr.tokens_per_sec, tr.first_step_ms, tr.compile_ms);
        if (tr.planned_peak_mb > 0)
            printf("memory: planned peak %.1f MiB for the training step, device peak %.1f MiB\n",
                   tr.planned_peak_mb, tr.device_peak_mb);
        if (peak > 0)
            printf("MFU %.2f%%: %.3g FLOPs/token x %.0f tokens/s over a measured %s GEMM peak "
                   "of %.1f GFLOP/s\n",
                   100.0 * flops_tok * tr.tokens_per_sec_median / peak, flops_tok,
                   tr.tokens_per_sec_median, loom_dtype_name(amp.dtype), peak / 1e9);
        else
            printf("MFU not measured (%s)\n",
                   eager ? "the reference interpreter" : "the peak GEMM failed");
        if (sr.n)
            printf("sampled %" PRId64 " tokens in %.2f s (%.1f tokens/s), %" PRId64
                   " compile(s) for them\n",
                   sr.n, sr.seconds, sr.seconds > 0 ? (double)sr.n / sr.seconds : 0.0, sr.compiles);
        if (tr.skipped)
            printf("%" PRId64 " of %" PRId64 " steps skipped for inf/NaN gradients\n", tr.skipped,
                   tr.steps);
        if (f->save_path)
            printf("saved the weights to %s\n", f->save_path);
    }
    rc = 0;
out:
    free(tr.losses);
    optimizer_destroy(&opt);
    loom_grad_scaler_destroy(scaler);
    gpt2_deinit(&m);
    gpt2_weights_free(&w);
    gpt2_tokens_free(&tok);
    loom_context_destroy(ctx);
    return ex_leave(rc);
}
