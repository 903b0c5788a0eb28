/* What the training examples (fashion_mnist, resnet) and bench/bench_train share: the
 * command-line flags of a training run and their parser, error reporting per rank, the
 * sync-free AMP training step after the forward, and checkpoints holding model, optimizer
 * and loss-scaler state under PyTorch's names. */
#ifndef LOOM_EXAMPLES_TRAIN_UTIL_H
#define LOOM_EXAMPLES_TRAIN_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <loom/amp.h>
#include <loom/loom.h>
#include <loom/optim.h>
#include <loom/safetensors.h>

#define EXIT_USAGE 2

/* Records expr (a loom_tensor *) under the module scope name (loom_scope_push), so that its
 * nodes read "layer1.0.conv1 (resnet_model.c:161) conv2d ..." in dumps, the profile and
 * errors: EX_SCOPED(ctx, "fc1", loom_nn_linear_forward(ctx, &fc1, x)). */
static inline loom_tensor *ex_scope_pop_with(loom_context *ctx, loom_tensor *t) {
    loom_scope_pop(ctx);
    return t;
}
#define EX_SCOPED(ctx, name, expr)                                                                 \
    (loom_scope_push((ctx), (name)), ex_scope_pop_with((ctx), (expr)))

/* The program's name in messages ("fashion_mnist"); set once by main. */
extern const char *ex_prog;

enum { EX_LS_DEFAULT, EX_LS_DYNAMIC, EX_LS_OFF, EX_LS_STATIC };
enum { EX_LR_CONSTANT, EX_LR_STEP, EX_LR_COSINE };

/* The flags every training example takes (ex_parse_args fills them). */
typedef struct ex_flags {
    int64_t epochs, batch_size, max_steps, log_every;
    double lr, momentum, weight_decay;
    bool lr_set, momentum_set, weight_decay_set;
    loom_optim_kind optimizer;
    uint64_t seed;
    bool shuffle, eager, json;
    int lr_schedule;      /* EX_LR_* */
    int64_t lr_step_size; /* --lr-step-size (steps), for EX_LR_STEP */
    double lr_gamma;      /* --lr-gamma, for EX_LR_STEP */
    const char *init_path, *save_path;
    loom_dtype amp;          /* --amp: LOOM_DTYPE_F32 for none */
    int loss_scale;          /* --loss-scale: EX_LS_* */
    double loss_scale_value; /* EX_LS_STATIC's scale */
    int32_t rank, world;     /* this process's rank and the world size (1 without mpiexec) */
} ex_flags;

/* A program's own options beside the common ones. on_option gets the option's name and its
 * value (NULL for a switch) and returns 0, or EXIT_USAGE after ex_usage_error. */
typedef struct ex_cli {
    const char *const *valued;   /* NULL-terminated names of the options taking a value */
    const char *const *switches; /* NULL-terminated names of the switches */
    int (*on_option)(void *ud, const char *name, const char *val);
    void (*usage)(FILE *f);
    void *ud;
    const char *steps_flag;   /* the name of the step limit ("--max-steps") */
    const char *lr_schedules; /* "constant|cosine" or "constant|step|cosine" */
    int64_t default_batch;    /* --batch-size when not given; 0: 64 */
} ex_cli;

/* Parses argv into f (defaults first: 1 epoch, cli's default batch, sgd, shuffled, no AMP; lr,
 * momentum and weight decay left to the caller when not *_set). Returns -1 when the options
 * are good, else the exit status (0 after --help). Sets rank and world from loom_dist and
 * checks that the world size divides the batch. */
int ex_parse_args(int argc, char **argv, const ex_cli *cli, ex_flags *f);

typedef struct ex_checkpoint ex_checkpoint;

/* The defaults PyTorch's recipes use where a flag was not given: lr sgd_lr for SGD, 0.001
 * otherwise; momentum 0.9 for SGD; weight decay 0.01 for AdamW (decoupled), else sgd_wd. */
void ex_flags_defaults(ex_flags *f, double sgd_lr, double sgd_wd);

/* Starts a program: sets ex_prog and joins the job (rank and world size from mpiexec's
 * environment; rank 0 of 1 without it). false after reporting a failure. */
bool ex_begin(const char *prog);
/* A context on the default device (the reference interpreter with f->eager); NULL after
 * reporting a failure. *out_eager tells whether steps run on the interpreter. */
loom_context *ex_context_create(const ex_flags *f, bool *out_eager);
/* --init (read by rank 0, in a step of its own so the training graph is the same from its
 * first batch on), then on several ranks every checkpoint tensor broadcast from rank 0.
 * Returns 0, or 1 after reporting the failure. */
int ex_restore(loom_context *ctx, const ex_flags *f, const ex_checkpoint *c, int32_t n_model);
/* Whether --save's path can be written (its folder exists and is writable, it is not a
 * folder); false after saying why on stderr. Checked before training, not after. */
bool ex_save_path_ok(const char *path);
/* The scaler's final scale as JSON ("65536"; "null" without loss scaling) into buf. */
void ex_scale_text(loom_context *ctx, const loom_grad_scaler *scaler, char *buf, size_t size);

/* Reports a usage error on rank 0 ("<prog>: <message>\nTry '<prog> --help'."): EXIT_USAGE. */
int ex_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
bool ex_parse_int(const char *s, int64_t lo, int64_t *out);
/* A program's integer option: its name, least value and where it goes (an int64_t at
 * `offset` in the program's options struct). */
typedef struct ex_int_option {
    const char *name;
    int64_t lo;
    size_t offset;
} ex_int_option;
/* If name is one of the n options in t, parses val into base + its offset: 0, or
 * EXIT_USAGE after ex_usage_error; -1 when name is none of them. */
int ex_parse_int_option(const ex_int_option *t, size_t n, const char *name, const char *val,
                        void *base);
/* A finite number >= 0. */
bool ex_parse_real(const char *s, double *out);
/* SplitMix64: advances *s and returns its next 64 random bits (data order, sampling, seeds). */
uint64_t ex_splitmix64(uint64_t *s);

/* "<prog>: " or, on several ranks, "<prog> (rank 1 of 2): ". Borrowed, static. */
const char *ex_who(void);
/* Prints what failed with the context's error message; returns 1. */
int ex_runtime_error(loom_context *ctx, const char *what);
/* Leaves the job with status rc (finalizes loom_dist unless a rank failed). */
int ex_leave(int rc);
/* A write callback for the report functions: chunks to the FILE *ud. */
void ex_print_chunk(const char *chunk, size_t len, void *ud);
double ex_now_s(void);
/* "none" for LOOM_DTYPE_F32, else the dtype's name. */
const char *ex_amp_name(loom_dtype amp);
extern const char *const ex_optim_names[]; /* by loom_optim_kind: "sgd", "adam", "adamw" */
/* The optimizer's step counter (clean steps only), read from the device; -1 on failure. */
int64_t ex_optimizer_steps(loom_context *ctx, const loom_optim *opt);
/* Reads a finished step's loss (no wait when the step after it has been launched, as a
 * launch waits for its predecessor) into *out and releases it; prints `step=<n> loss=<v>`
 * on rank 0 when --log-every asks, calling before_print(ud) first (may be NULL: a progress
 * bar clears its line). Returns 0, or 1 after reporting a read failure or a loss that is
 * not finite. */
int ex_take_loss(loom_context *ctx, const ex_flags *f, loom_tensor **loss, int64_t step,
                 void (*before_print)(void *ud), void *ud, double *out);
/* The learning rate of step `step` of total under f's schedule. */
double ex_lr_at(const ex_flags *f, int64_t step, int64_t total);

/* Mixed precision of a training step: the forward's autocast dtype (LOOM_DTYPE_F32: off)
 * and a loss scaler (NULL or disabled: none), whose scale is updated after each step unless
 * static_scale (a fixed scale that still skips overflowing steps). */
typedef struct model_amp {
    loom_dtype dtype;
    loom_grad_scaler *scaler;
    bool static_scale;
} model_amp;

/* The scaler f asks for (dynamic, static or disabled) on ctx's device. */
loom_status ex_grad_scaler_create(loom_context *ctx, const ex_flags *f, loom_grad_scaler **out);

/* The rest of a training step once the forward's loss is recorded: backward (of the scaled
 * loss), gradient all-reduce (mean over the ranks; nothing on one rank), unscale and
 * overflow check, optimizer update (skipped on overflow, in the graph), scale update, then
 * mark_step (asynchronous). amp may be NULL (fp32). With out_loss, the loss (unscaled) is
 * retained for the caller (NULL when it could not be built): on several ranks, the mean of
 * the ranks' losses (so every rank must pass out_loss alike: the ranks' steps must record
 * the same collectives). */
loom_status ex_train_step_finish(loom_context *ctx, loom_tensor *loss, int32_t n_params,
                                 loom_tensor *const *params, loom_optim *opt, const model_amp *amp,
                                 loom_tensor **out_loss);
/* The same without the mark_step (errors are recorded in ctx), for a caller that compiles
 * the step first (loom_compile_step) to report its plan before it runs. */
void ex_train_step_record(loom_context *ctx, loom_tensor *loss, int32_t n_params,
                          loom_tensor *const *params, loom_optim *opt, const model_amp *amp,
                          loom_tensor **out_loss);

/* A checkpoint's tensors: the model's (state_dict names), then with opt its state as
 * "optimizer.state.<i>.<key>" (i the parameter's index, as PyTorch's optimizer state_dict)
 * and "optimizer.step", then with an enabled scaler "scaler.<key>" (PyTorch's
 * scaler.state_dict() keys). */
struct ex_checkpoint {
    int32_t n;
    loom_named_tensor *list;
    char (*names)[64];
};
loom_status ex_checkpoint_init(ex_checkpoint *c, int32_t n_model, const loom_named_tensor *model,
                               const loom_optim *opt, int32_t n_params,
                               const loom_grad_scaler *scaler);
void ex_checkpoint_deinit(ex_checkpoint *c);
/* --init: every model tensor, and the optimizer's and the scaler's state when the file has
 * them (a file without them leaves them as created; a note says what was ignored). */
loom_status ex_checkpoint_load(loom_context *ctx, const char *path, const ex_checkpoint *c,
                               int32_t n_model);

#endif
