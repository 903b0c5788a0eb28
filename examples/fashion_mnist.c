/* Fashion-MNIST training example: an MLP or a small CNN trained with autograd and a graph
 * optimizer, one compiled step per batch, then evaluated on the test set; data parallel
 * (DistributedDataParallel's recipe) when started by `mpiexec -n N`. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <loom/data.h>
#include <loom/dist.h>
#include <loom/loom.h>
#include <loom/nn.h>
#include <loom/optim.h>
#include <loom/safetensors.h>

#include "fashion_models.h"

#define PROG "fashion_mnist"
#define EXIT_USAGE 2
/* 10000 test images split evenly, so evaluation compiles one graph. */
#define EVAL_BATCH 500
#define DEFAULT_DATA_DIR "/usr/share/datasets/fashion-mnist"

typedef struct options {
    model_kind model;
    int64_t epochs, batch_size, limit_steps, log_every;
    double lr, momentum, weight_decay;
    bool lr_set, momentum_set, weight_decay_set;
    loom_optim_kind optimizer;
    uint64_t seed;
    bool shuffle, eager, json;
    bool cosine; /* --lr-schedule cosine */
    const char *init_path, *save_path, *data_dir;
    loom_dtype amp;          /* --amp: LOOM_DTYPE_F32 for none */
    int loss_scale;          /* --loss-scale: LS_* */
    double loss_scale_value; /* LS_STATIC's scale */
    int32_t rank, world;     /* this process's rank and the world size (1 without mpiexec) */
} options;

enum { LS_DEFAULT, LS_DYNAMIC, LS_OFF, LS_STATIC };

/* ---- command line ---------------------------------------------------------------------- */

static void usage(FILE *f) {
    fprintf(f,
            "Usage: " PROG " [options]\n"
            "Trains a classifier on Fashion-MNIST and reports its test accuracy.\n"
            "\n"
            "  --model mlp|cnn        mlp: 784-512-512-10 with ReLU (default); cnn: conv\n"
            "                         1->32 3x3, ReLU, conv 32->64 3x3, ReLU, max pool 2,\n"
            "                         9216-128, ReLU, 128-10. Layers are named as in PyTorch's\n"
            "                         state_dict (fc1.weight, fc1.bias, ...)\n"
            "  --epochs N             passes over the training set (default 1; 0: evaluate only)\n"
            "  --batch-size N         training batch (default 64); the last partial batch of an\n"
            "                         epoch is dropped. Under mpiexec -n R it is the global\n"
            "                         batch: each rank takes N/R images (R must divide N)\n"
            "  --optimizer sgd|adam|adamw   (default sgd)\n"
            "  --lr X                 learning rate (default 0.01 for sgd, 0.001 for adam/adamw)\n"
            "  --lr-schedule constant|cosine   cosine: anneal the learning rate per step from\n"
            "                         --lr to 0 over the run, as PyTorch's CosineAnnealingLR\n"
            "                         with T_max = total steps (default constant)\n"
            "  --momentum X           sgd momentum (default 0.9)\n"
            "  --weight-decay X       default 0 (sgd, adam: L2 on the gradient), 0.01 (adamw:\n"
            "                         decoupled), as PyTorch\n"
            "  --seed N               initialisation and shuffling seed (default 0)\n"
            "  --no-shuffle           batches in file order (shuffled by seed + epoch otherwise)\n"
            "  --init FILE            start from these weights (safetensors, names as PyTorch's);\n"
            "                         under mpiexec only rank 0 reads it\n"
            "  --save FILE            write the trained weights (safetensors) after training\n"
            "  --limit-steps N        stop training after N steps in total\n"
            "  --amp none|bf16|f16    mixed precision (default none): the forward runs under\n"
            "                         autocast, matmuls and convolutions in 16-bit with f32\n"
            "                         accumulation, softmax and the loss in f32; weights and\n"
            "                         their gradients stay f32\n"
            "  --loss-scale dynamic|off|X   loss scaling (default dynamic for f16, off\n"
            "                         otherwise): dynamic is PyTorch's GradScaler (2^16, x2\n"
            "                         every 2000 clean steps, x0.5 on overflow); X a fixed\n"
            "                         scale. Overflowing steps are skipped on the device\n"
            "  --eager                run every step on the reference interpreter (slow; a check)\n"
            "  --log-every N          print `step=<n> loss=<value>` to stdout for every n that\n"
            "                         is a multiple of N: n counts batches from 0 over all\n"
            "                         epochs and the loss is the n-th batch's, before that\n"
            "                         batch's update\n"
            "  --json                 print one JSON line of results instead of the report\n"
            "  --data-dir DIR         where the IDX files are (default " DEFAULT_DATA_DIR ")\n"
            "  --help                 show this help\n"
            "\n"
            "Inputs are scaled to [0, 1] and normalised with mean 0.5 and std 0.5. samples/s\n"
            "is timed from the first step's launch, after its compile (reported apart).\n"
            "LOOM_NUM_THREADS sets the device's threads. Exit status: 0 ok, 1 runtime error,\n"
            "2 usage error.\n"
            "\n"
            "Data parallel: `mpiexec -n R " PROG " ...` runs R ranks, each on its own device with\n"
            "its share of the cores, a shard of every epoch (shuffled alike, as PyTorch's\n"
            "DistributedSampler) and rank 0's initial weights; gradients are averaged over the\n"
            "ranks before each update, so R ranks train as one process would on the same\n"
            "global batch. The logged loss is the global batch's mean. Rank 0 alone prints,\n"
            "writes --save and evaluates.\n");
}

/* Every rank finds the same usage error; rank 0 reports it. */
static int usage_error(const char *fmt, ...) {
    if (loom_dist_rank() != 0)
        return EXIT_USAGE;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry '" PROG " --help'.\n");
    va_end(ap);
    return EXIT_USAGE;
}

static bool parse_int(const char *s, int64_t lo, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo)
        return false;
    *out = v;
    return true;
}

static bool parse_real(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < 0)
        return false;
    *out = v;
    return true;
}

/* Returns -1 when the options are good, else the exit status (0 after --help). */
static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.model = MODEL_MLP,
                   .epochs = 1,
                   .batch_size = 64,
                   .optimizer = LOOM_OPTIM_SGD,
                   .shuffle = true,
                   .data_dir = DEFAULT_DATA_DIR};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            if (loom_dist_rank() == 0)
                usage(stdout);
            return 0;
        }
        if (!strcmp(arg, "--no-shuffle")) {
            o->shuffle = false;
            continue;
        }
        if (!strcmp(arg, "--eager")) {
            o->eager = true;
            continue;
        }
        if (!strcmp(arg, "--json")) {
            o->json = true;
            continue;
        }
        /* The rest take a value: "--flag value" or "--flag=value". */
        char name[32];
        const char *val = NULL;
        const char *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) != 0)
            return usage_error("unexpected argument '%s'", arg);
        if (eq) {
            size_t len = (size_t)(eq - arg);
            if (len >= sizeof name)
                return usage_error("unknown option '%s'", arg);
            memcpy(name, arg, len);
            name[len] = '\0';
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg);
        }
        static const char *const valued[] = {
            "--model",     "--epochs",      "--batch-size",   "--lr",
            "--optimizer", "--momentum",    "--weight-decay", "--seed",
            "--init",      "--save",        "--limit-steps",  "--log-every",
            "--data-dir",  "--lr-schedule", "--amp",          "--loss-scale",
        };
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof *valued; k++)
            known |= !strcmp(name, valued[k]);
        if (!known)
            return usage_error("unknown option '%s'", arg);
        if (!val) {
            if (i + 1 >= argc)
                return usage_error("%s needs a value", name);
            val = argv[++i];
        }
        int64_t n;
        if (!strcmp(name, "--model")) {
            if (!strcmp(val, "mlp"))
                o->model = MODEL_MLP;
            else if (!strcmp(val, "cnn"))
                o->model = MODEL_CNN;
            else
                return usage_error("--model must be mlp or cnn, not '%s'", val);
        } else if (!strcmp(name, "--optimizer")) {
            if (!strcmp(val, "sgd"))
                o->optimizer = LOOM_OPTIM_SGD;
            else if (!strcmp(val, "adam"))
                o->optimizer = LOOM_OPTIM_ADAM;
            else if (!strcmp(val, "adamw"))
                o->optimizer = LOOM_OPTIM_ADAMW;
            else
                return usage_error("--optimizer must be sgd, adam or adamw, not '%s'", val);
        } else if (!strcmp(name, "--epochs")) {
            if (!parse_int(val, 0, &o->epochs))
                return usage_error("--epochs needs an integer >= 0, not '%s'", val);
        } else if (!strcmp(name, "--batch-size")) {
            if (!parse_int(val, 1, &o->batch_size))
                return usage_error("--batch-size needs an integer >= 1, not '%s'", val);
        } else if (!strcmp(name, "--limit-steps")) {
            if (!parse_int(val, 1, &o->limit_steps))
                return usage_error("--limit-steps needs an integer >= 1, not '%s'", val);
        } else if (!strcmp(name, "--log-every")) {
            if (!parse_int(val, 1, &o->log_every))
                return usage_error("--log-every needs an integer >= 1, not '%s'", val);
        } else if (!strcmp(name, "--seed")) {
            if (!parse_int(val, 0, &n))
                return usage_error("--seed needs an integer >= 0, not '%s'", val);
            o->seed = (uint64_t)n;
        } else if (!strcmp(name, "--lr-schedule")) {
            if (strcmp(val, "constant") && strcmp(val, "cosine"))
                return usage_error("--lr-schedule must be constant or cosine, not '%s'", val);
            o->cosine = !strcmp(val, "cosine");
        } else if (!strcmp(name, "--lr")) {
            if (!parse_real(val, &o->lr))
                return usage_error("--lr needs a finite number >= 0, not '%s'", val);
            o->lr_set = true;
        } else if (!strcmp(name, "--momentum")) {
            if (!parse_real(val, &o->momentum))
                return usage_error("--momentum needs a finite number >= 0, not '%s'", val);
            o->momentum_set = true;
        } else if (!strcmp(name, "--weight-decay")) {
            if (!parse_real(val, &o->weight_decay))
                return usage_error("--weight-decay needs a finite number >= 0, not '%s'", val);
            o->weight_decay_set = true;
        } else if (!strcmp(name, "--init")) {
            o->init_path = val;
        } else if (!strcmp(name, "--save")) {
            o->save_path = val;
        } else if (!strcmp(name, "--data-dir")) {
            o->data_dir = val;
        } else if (!strcmp(name, "--amp")) {
            if (!strcmp(val, "none"))
                o->amp = LOOM_DTYPE_F32;
            else if (!strcmp(val, "bf16"))
                o->amp = LOOM_DTYPE_BF16;
            else if (!strcmp(val, "f16"))
                o->amp = LOOM_DTYPE_F16;
            else
                return usage_error("--amp must be none, bf16 or f16, not '%s'", val);
        } else if (!strcmp(name, "--loss-scale")) {
            if (!strcmp(val, "dynamic"))
                o->loss_scale = LS_DYNAMIC;
            else if (!strcmp(val, "off"))
                o->loss_scale = LS_OFF;
            else if (parse_real(val, &o->loss_scale_value) && o->loss_scale_value > 0 &&
                     o->loss_scale_value <= 3.4e38)
                o->loss_scale = LS_STATIC;
            else
                return usage_error("--loss-scale must be dynamic, off or a number > 0 that f32 "
                                   "holds, not '%s'",
                                   val);
        }
    }
    if (o->loss_scale == LS_DEFAULT)
        o->loss_scale = o->amp == LOOM_DTYPE_F16 ? LS_DYNAMIC : LS_OFF;
    if (o->momentum_set && o->optimizer != LOOM_OPTIM_SGD)
        return usage_error("--momentum applies to --optimizer sgd only");
    if (!o->lr_set)
        o->lr = o->optimizer == LOOM_OPTIM_SGD ? 0.01 : 0.001;
    if (!o->momentum_set)
        o->momentum = o->optimizer == LOOM_OPTIM_SGD ? 0.9 : 0.0;
    if (!o->weight_decay_set)
        o->weight_decay = o->optimizer == LOOM_OPTIM_ADAMW ? 0.01 : 0.0;
    o->rank = loom_dist_rank();
    o->world = loom_dist_world_size();
    if (o->batch_size % o->world != 0)
        return usage_error("--batch-size %lld is the global batch, split evenly over the %d "
                           "ranks: it must be a multiple of %d",
                           (long long)o->batch_size, (int)o->world, (int)o->world);
    return -1;
}

/* ---- model ----------------------------------------------------------------------------- */

/* ---- progress -------------------------------------------------------------------------- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct progress {
    bool tty, quiet;
    bool bar_shown; /* a bar is drawn on the current stderr line */
    double last;    /* when the bar or line was last shown */
    int64_t every;  /* plain mode: a line every this many steps */
} progress;

static void progress_clear(progress *p) {
    if (p->bar_shown) {
        fputs("\r\033[K", stderr);
        p->bar_shown = false;
    }
}

static void progress_show(progress *p, int64_t epoch, int64_t epochs, int64_t step, int64_t total,
                          double loss, double rate) {
    if (p->tty) {
        enum { WIDTH = 30 };
        int filled = total > 0 ? (int)(WIDTH * step / total) : 0;
        char bar[WIDTH + 1];
        for (int i = 0; i < WIDTH; i++)
            bar[i] = i < filled ? '=' : i == filled ? '>' : ' ';
        bar[WIDTH] = '\0';
        fprintf(stderr, "\r\033[Kepoch %lld/%lld [%s] %lld/%lld loss %.4f %.0f samples/s",
                (long long)epoch + 1, (long long)epochs, bar, (long long)step, (long long)total,
                loss, rate);
        fflush(stderr);
        p->bar_shown = true;
    } else if (!p->quiet) {
        fprintf(stderr, "epoch %lld/%lld step %lld/%lld loss %.4f %.0f samples/s\n",
                (long long)epoch + 1, (long long)epochs, (long long)step, (long long)total, loss,
                rate);
    }
}

/* ---- training and evaluation ----------------------------------------------------------- */

static void print_chunk(const char *chunk, size_t len, void *ud) {
    fwrite(chunk, 1, len, (FILE *)ud);
}

/* "fashion_mnist: " or, on several ranks, "fashion_mnist (rank 1 of 2): ": every rank reports
 * its own failures. */
static const char *who(void) {
    static char buf[64];
    if (loom_dist_world_size() == 1)
        return PROG ": ";
    snprintf(buf, sizeof buf, PROG " (rank %d of %d): ", (int)loom_dist_rank(),
             (int)loom_dist_world_size());
    return buf;
}

static int runtime_error(loom_context *ctx, const char *what) {
    fprintf(stderr, "%s%s: %s\n", who(), what,
            ctx && loom_context_error(ctx) != LOOM_OK ? loom_context_error_message(ctx)
                                                      : "unknown error");
    return 1;
}

typedef struct train_result {
    int64_t steps;
    int64_t skipped;   /* steps the loss scaler skipped for inf/NaN gradients */
    double final_loss; /* NAN when no step ran */
    double samples_per_sec;
} train_result;

/* Reads a finished step's loss (no wait: the step after it has been launched, and a launch
 * waits for its predecessor), logs it if asked, and releases it. */
static int take_loss(loom_context *ctx, const options *o, loom_tensor **loss, int64_t step,
                     progress *p, double *out) {
    float v;
    if (loom_tensor_read(ctx, *loss, &v, sizeof v) != LOOM_OK)
        return runtime_error(ctx, "reading the loss");
    loom_tensor_release(*loss);
    *loss = NULL;
    if (!isfinite(v)) {
        progress_clear(p);
        if (o->rank == 0) /* the same mean loss on every rank */
            fprintf(stderr, PROG ": the loss became %f at step %lld; try a smaller --lr\n",
                    (double)v, (long long)step);
        return 1;
    }
    if (o->log_every && step % o->log_every == 0 && o->rank == 0) {
        progress_clear(p);
        printf("step=%lld loss=%.6f\n", (long long)step, (double)v);
        fflush(stdout);
    }
    *out = v;
    return 0;
}

/* The optimizer's step counter (clean steps only), read from the device: one sync. */
static int64_t optimizer_steps(loom_context *ctx, const loom_optim *opt) {
    const char *names[4];
    loom_tensor *state[4];
    int32_t n = loom_optim_state(opt, 0, names, state);
    for (int32_t i = 0; i < n; i++) {
        float v;
        if (!strcmp(names[i], "step") && loom_tensor_read(ctx, state[i], &v, sizeof v) == LOOM_OK)
            return (int64_t)v;
    }
    return -1;
}

static int train(loom_context *ctx, const options *o, const model *m, const model_amp *amp,
                 const loom_dataset *ds, train_result *res) {
    int rc = 1;
    loom_optim *opt = NULL;
    loom_batches *it = NULL;
    loom_tensor *pending = NULL; /* the previous step's loss, not read yet */
    int64_t pending_step = -1;
    *res = (train_result){.final_loss = NAN};

    loom_optim_options oo;
    loom_optim_options_init(&oo, o->optimizer);
    oo.lr = o->lr;
    oo.weight_decay = o->weight_decay;
    if (o->optimizer == LOOM_OPTIM_SGD)
        oo.momentum = o->momentum;
    loom_tensor *params[MAX_PARAMS];
    if (loom_optim_create(ctx, &oo, model_tensors(m, params), params, &opt) != LOOM_OK) {
        rc = runtime_error(ctx, "creating the optimizer");
        goto out;
    }
    /* This rank's shard of each epoch, its share of the global batch. */
    loom_batch_options bo;
    loom_batch_options_init(&bo);
    bo.batch_size = o->batch_size / o->world;
    bo.shuffle = o->shuffle;
    bo.seed = o->seed;
    bo.rank = o->rank;
    bo.world_size = o->world;
    if (loom_batches_create(ds, &bo, &it) != LOOM_OK) {
        fprintf(stderr, "%scannot create the batch iterator\n", who());
        goto out;
    }
    const int64_t per_epoch = loom_batches_per_epoch(it);
    if (per_epoch == 0) {
        if (o->rank == 0)
            fprintf(stderr, PROG ": --batch-size %lld exceeds the %lld training images\n",
                    (long long)o->batch_size, (long long)loom_dataset_count(ds));
        goto out;
    }
    progress p = {.tty = o->rank == 0 && isatty(STDERR_FILENO) == 1,
                  .quiet = o->json || o->rank != 0,
                  .last = now_s(),
                  .every = per_epoch >= 10 ? per_epoch / 10 : 1};
    int64_t total_steps = o->epochs * per_epoch;
    if (o->limit_steps && o->limit_steps < total_steps)
        total_steps = o->limit_steps;
    double t_rate = 0;      /* when the first step was launched, its compile done */
    int64_t compile_ns = 0; /* CompileTime then: later compiles are not training time */
    double last_loss = NAN;
    int64_t step = 0;
    bool stop = false;
    for (int64_t epoch = 0; epoch < o->epochs && !stop; epoch++) {
        loom_batches_set_epoch(it, epoch);
        const float *xb;
        const int64_t *yb;
        int64_t n;
        for (int64_t b = 0; loom_batches_next(it, &xb, &yb, &n); b++) {
            if (o->cosine) /* a device scalar: a new value never recompiles */
                loom_optim_set_lr(opt, 0.5 * o->lr *
                                           (1 + cos(3.14159265358979323846 * (double)step /
                                                    (double)total_steps)));
            loom_tensor *loss = NULL;
            loom_status st = model_train_step(ctx, m, params, opt, amp, xb, yb, n, &loss);
            if (st != LOOM_OK || !loss) {
                loom_tensor_release(loss);
                progress_clear(&p);
                rc = runtime_error(ctx, "training step");
                goto out;
            }
            if (step == 0) {
                t_rate = now_s();
                compile_ns = loom_metric_total(ctx, "CompileTime");
            }
            /* Launching this step waited for the previous one: its loss is ready. */
            if (pending) {
                double t = now_s();
                bool log = o->log_every && pending_step % o->log_every == 0;
                bool show = p.tty ? t - p.last >= 0.1 : pending_step % p.every == 0;
                if (log || show) {
                    if (take_loss(ctx, o, &pending, pending_step, &p, &last_loss))
                        goto out;
                }
                if (show) {
                    double rate =
                        t > t_rate ? (double)step * (double)o->batch_size / (t - t_rate) : 0;
                    progress_show(&p, epoch, o->epochs, b, per_epoch, last_loss, rate);
                    p.last = t;
                }
                loom_tensor_release(pending);
            }
            pending = loss;
            pending_step = step;
            step++;
            if (o->limit_steps && step >= o->limit_steps) {
                stop = true;
                break;
            }
        }
        /* A summary line per epoch (one wait for the device per epoch). */
        if (!o->json && pending && o->epochs > 1) {
            if (take_loss(ctx, o, &pending, pending_step, &p, &last_loss))
                goto out;
            double t =
                now_s() - (double)(loom_metric_total(ctx, "CompileTime") - compile_ns) * 1e-9;
            progress_clear(&p);
            if (o->rank == 0)
                fprintf(stderr, "epoch %lld/%lld: last loss %.4f, %.0f samples/s\n",
                        (long long)epoch + 1, (long long)o->epochs, last_loss,
                        t > t_rate ? (double)step * (double)o->batch_size / (t - t_rate) : 0.0);
        }
    }
    if (pending) { /* the last step: reading it waits for the device */
        if (take_loss(ctx, o, &pending, pending_step, &p, &last_loss))
            goto out;
    }
    if (loom_context_sync(ctx) != LOOM_OK) {
        rc = runtime_error(ctx, "training");
        goto out;
    }
    double elapsed =
        now_s() - t_rate - (double)(loom_metric_total(ctx, "CompileTime") - compile_ns) * 1e-9;
    progress_clear(&p);
    res->steps = step;
    if (loom_grad_scaler_is_enabled(amp->scaler)) {
        int64_t clean = optimizer_steps(ctx, opt);
        res->skipped = clean >= 0 ? step - clean : 0;
    }
    res->final_loss = last_loss;
    /* From the first launch (its compile done) to the end: every step ran in that time. */
    res->samples_per_sec = elapsed > 0 ? (double)step * (double)o->batch_size / elapsed : 0;
    rc = 0;
out:
    loom_tensor_release(pending);
    loom_batches_destroy(it);
    loom_optim_destroy(opt);
    return rc;
}

/* Counts correct predictions in the graph (an i64 counter updated by assign), so the host
 * reads one number at the end. */
static int evaluate(loom_context *ctx, const model *m, loom_dtype amp, const loom_dataset *ds,
                    double *out_acc) {
    int rc = 1;
    loom_batches *it = NULL;
    int64_t zero = 0, total = 0, correct = 0;
    loom_tensor *counter = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 0, NULL, &zero);
    if (!counter)
        return runtime_error(ctx, "evaluation");
    loom_batch_options bo;
    loom_batch_options_init(&bo);
    bo.batch_size = EVAL_BATCH;
    bo.shuffle = false;
    bo.drop_last = false; /* every test image counts */
    if (loom_batches_create(ds, &bo, &it) != LOOM_OK) {
        fprintf(stderr, PROG ": cannot create the test batch iterator\n");
        goto out;
    }
    const float *xb;
    const int64_t *yb;
    int64_t n;
    while (loom_batches_next(it, &xb, &yb, &n)) {
        loom_tensor *x =
            loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){n, m->rows * m->cols}, xb);
        loom_tensor *y = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 1, (int64_t[]){n}, yb);
        if (amp != LOOM_DTYPE_F32) /* evaluated as trained */
            loom_autocast_begin(ctx, amp);
        loom_tensor *logits = model_forward(ctx, m, x, n);
        if (amp != LOOM_DTYPE_F32)
            loom_autocast_end(ctx);
        loom_tensor *pred = loom_argmax(ctx, logits, 1);
        loom_tensor *hits =
            loom_sum(ctx, loom_cast(ctx, loom_eq(ctx, pred, y), LOOM_DTYPE_I64), 0, NULL, false);
        if (hits)
            loom_assign(ctx, counter, loom_add(ctx, counter, hits));
        loom_status st = loom_mark_step(ctx);
        loom_tensor_release(x);
        loom_tensor_release(y);
        if (st != LOOM_OK || !hits) {
            rc = runtime_error(ctx, "evaluation step");
            goto out;
        }
        total += n;
    }
    if (loom_tensor_read(ctx, counter, &correct, sizeof correct) != LOOM_OK) {
        rc = runtime_error(ctx, "reading the evaluation result");
        goto out;
    }
    *out_acc = total > 0 ? (double)correct / (double)total : 0;
    rc = 0;
out:
    loom_batches_destroy(it);
    loom_tensor_release(counter);
    return rc;
}

static loom_dataset *load_split(const char *dir, const char *split) {
    char images[PATH_MAX], labels[PATH_MAX], err[512];
    snprintf(images, sizeof images, "%s/%s-images-idx3-ubyte.gz", dir, split);
    snprintf(labels, sizeof labels, "%s/%s-labels-idx1-ubyte.gz", dir, split);
    loom_dataset *ds = NULL;
    if (loom_dataset_load_idx(images, labels, &ds, err, sizeof err) != LOOM_OK) {
        fprintf(stderr, "%s%s\n", who(), err);
        if (access(images, F_OK) != 0 || access(labels, F_OK) != 0)
            fprintf(stderr,
                    "%sthe Fashion-MNIST files come with Debian's "
                    "dataset-fashion-mnist package; or pass --data-dir DIR\n",
                    who());
        return NULL;
    }
    return ds;
}

/* The checkpoint: the model's parameters, then (with a loss scaler) the scaler's state under
 * "scaler." as PyTorch's scaler.state_dict() keys. Returns the count; out has room for
 * MAX_PARAMS + LOOM_GRAD_SCALER_STATE_MAX, names for the scaler's prefixed names. */
static int32_t checkpoint_list(const model *m, const loom_grad_scaler *scaler, char names[][48],
                               loom_named_tensor *out) {
    int32_t n = 0;
    for (int32_t i = 0; i < m->n_params; i++)
        out[n++] = m->params[i];
    const char *keys[LOOM_GRAD_SCALER_STATE_MAX];
    loom_tensor *state[LOOM_GRAD_SCALER_STATE_MAX];
    int32_t k = loom_grad_scaler_state(scaler, keys, state);
    for (int32_t i = 0; i < k; i++) {
        snprintf(names[i], 48, "scaler.%s", keys[i]);
        out[n++] = (loom_named_tensor){names[i], state[i]};
    }
    return n;
}

/* --init: the parameters, and the scaler's state when the file has it and this run scales
 * the loss (a file without it leaves the scaler at its defaults). */
static loom_status load_checkpoint(loom_context *ctx, const char *path, const model *m,
                                   const loom_grad_scaler *scaler) {
    char names[LOOM_GRAD_SCALER_STATE_MAX][48], err[256];
    loom_named_tensor list[MAX_PARAMS + LOOM_GRAD_SCALER_STATE_MAX];
    loom_safetensors *f = NULL;
    bool has_scaler = false;
    if (loom_safetensors_open(path, &f, err, sizeof err) == LOOM_OK) {
        has_scaler = loom_safetensors_find(f, "scaler.scale") >= 0;
        loom_safetensors_close(f);
    } /* else the load below reports the problem */
    bool with_scaler = has_scaler && loom_grad_scaler_is_enabled(scaler);
    if (has_scaler && !with_scaler)
        fprintf(stderr,
                PROG ": note: --init %s: ignoring its loss scaler state (no loss "
                     "scaling in this run)\n",
                path);
    int32_t n = checkpoint_list(m, with_scaler ? scaler : NULL, names, list);
    return loom_safetensors_load(ctx, path, n, list, !has_scaler || with_scaler);
}

static const char *const model_names[] = {"mlp", "cnn"};
static const char *const optim_names[] = {"sgd", "adam", "adamw"};

static const char *amp_name(loom_dtype amp) {
    return amp == LOOM_DTYPE_F32 ? "none" : loom_dtype_name(amp);
}

/* Leaves the job with status rc. After a runtime error on several ranks MPI is not
 * finalized: another rank may be waiting in a collective, and MPICH's MPI_Finalize would wait
 * for it (up to LOOM_DIST_TIMEOUT_S); exiting non-zero instead makes mpiexec end the job. */
static int leave(int rc) {
    if (rc == 1 && loom_dist_world_size() > 1)
        return rc;
    if (loom_dist_finalize() != LOOM_OK) {
        fprintf(stderr, "%sfinalize: %s\n", who(), loom_dist_error_message());
        return rc ? rc : 1;
    }
    return rc;
}

int main(int argc, char **argv) {
    /* Rank and world size from mpiexec's environment; rank 0 of 1 without it. */
    if (loom_dist_init(NULL) != LOOM_OK) {
        fprintf(stderr, PROG ": cannot join the job: %s\n", loom_dist_error_message());
        return 1;
    }
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return leave(rc);
    rc = 1;

    loom_context *ctx = NULL;
    model m = {0};
    loom_dataset *train_ds = NULL, *test_ds = NULL;
    loom_grad_scaler *scaler = NULL;
    train_result tr = {.final_loss = NAN};
    double acc = 0;

    train_ds = load_split(o.data_dir, "train");
    test_ds = train_ds ? load_split(o.data_dir, "t10k") : NULL;
    if (!test_ds)
        goto out;
    int64_t rows, cols, trows, tcols;
    loom_dataset_image_shape(train_ds, &rows, &cols);
    loom_dataset_image_shape(test_ds, &trows, &tcols);
    if (rows != trows || cols != tcols || rows < 6 || cols < 6) {
        fprintf(stderr, "%strain images are %lldx%lld and test images %lldx%lld\n", who(),
                (long long)rows, (long long)cols, (long long)trows, (long long)tcols);
        goto out;
    }

    loom_context_options co;
    loom_context_options_init(&co);
    co.eager = co.eager || o.eager;
    loom_status st = loom_context_create(&co, &ctx);
    if (st != LOOM_OK) {
        fprintf(stderr, "%scannot create a context: %s\n", who(), loom_status_name(st));
        goto out;
    }
    if (model_init(ctx, &m, o.model, rows, cols, o.seed) != LOOM_OK) {
        rc = runtime_error(ctx, "creating the model");
        goto out;
    }
    loom_grad_scaler_options so;
    loom_grad_scaler_options_init(&so);
    so.enabled = o.loss_scale != LS_OFF;
    if (o.loss_scale == LS_STATIC)
        so.init_scale = o.loss_scale_value;
    if (loom_grad_scaler_create(ctx, &so, &scaler) != LOOM_OK) {
        rc = runtime_error(ctx, "creating the loss scaler");
        goto out;
    }
    model_amp amp = {.dtype = o.amp, .scaler = scaler, .static_scale = o.loss_scale == LS_STATIC};
    /* The loaded values land in a step of their own, so the training step's graph is the
     * same from its first batch on (one compile). Rank 0 reads the file; the others get its
     * values from the broadcast below. */
    if (o.init_path && o.rank == 0 &&
        (load_checkpoint(ctx, o.init_path, &m, scaler) != LOOM_OK ||
         loom_mark_step(ctx) != LOOM_OK)) {
        rc = runtime_error(ctx, "--init");
        goto out;
    }
    /* Every rank starts from rank 0's parameters and loss-scaler state, in a step of their own
     * (the optimizer's state is created zeroed on every rank). One rank records nothing. */
    char ck_names[LOOM_GRAD_SCALER_STATE_MAX][48];
    loom_named_tensor ck[MAX_PARAMS + LOOM_GRAD_SCALER_STATE_MAX];
    int32_t n_ck = checkpoint_list(&m, scaler, ck_names, ck);
    if (o.world > 1) {
        loom_tensor *state[MAX_PARAMS + LOOM_GRAD_SCALER_STATE_MAX];
        for (int32_t i = 0; i < n_ck; i++)
            state[i] = ck[i].tensor;
        if (loom_broadcast_parameters(ctx, n_ck, state) != LOOM_OK ||
            loom_mark_step(ctx) != LOOM_OK) {
            rc = runtime_error(ctx, "broadcasting rank 0's parameters");
            goto out;
        }
    }
    char ranks[96] = "";
    if (o.world > 1)
        snprintf(ranks, sizeof ranks, ", %d ranks (%lld images per rank and step)", (int)o.world,
                 (long long)(o.batch_size / o.world));
    if (!o.json && o.rank == 0)
        printf("model %s (%d tensors), %lld training and %lld test images, %s lr %g%s, amp %s%s"
               "%s%s\n",
               model_names[o.model], (int)m.n_params, (long long)loom_dataset_count(train_ds),
               (long long)loom_dataset_count(test_ds), optim_names[o.optimizer], o.lr,
               o.cosine ? " (cosine schedule)" : "", amp_name(o.amp),
               o.loss_scale == LS_DYNAMIC  ? " (dynamic loss scale)"
               : o.loss_scale == LS_STATIC ? " (static loss scale)"
                                           : "",
               co.eager ? ", reference interpreter" : "", ranks);
    fflush(stdout); /* before the progress lines on stderr, also when stdout is a pipe */
    if (o.epochs > 0 && (rc = train(ctx, &o, &m, &amp, train_ds, &tr)) != 0)
        goto out;
    rc = 0;
    /* The ranks' weights are equal: rank 0 saves, evaluates and reports. */
    if (o.rank != 0)
        goto out;
    rc = 1;
    if (o.save_path && loom_safetensors_save(ctx, o.save_path, n_ck, ck) != LOOM_OK) {
        rc = runtime_error(ctx, "--save");
        goto out;
    }
    if ((rc = evaluate(ctx, &m, o.amp, test_ds, &acc)) != 0)
        goto out;
    rc = 1;
    /* The final loss scale (a read of the device's scalar), null without loss scaling. */
    char scale[32] = "null";
    float scale_v;
    if (loom_grad_scaler_is_enabled(scaler) &&
        loom_tensor_read(ctx, loom_grad_scaler_scale_tensor(scaler), &scale_v, sizeof scale_v) ==
            LOOM_OK)
        snprintf(scale, sizeof scale, "%g", (double)scale_v);

    size_t mem_now = 0, mem_peak = 0;
    loom_device_memory(ctx, &mem_now, &mem_peak);
    double compile_ms = (double)loom_metric_total(ctx, "CompileTime") / 1e6;
    double collective_ms = (double)loom_metric_total(ctx, "CollectiveTime") / 1e6;
    int64_t collective_bytes = loom_metric_value(ctx, "CollectiveBytes");
    if (o.json) {
        /* JSON has no NaN: a run without steps reports null. */
        char loss[32];
        if (isfinite(tr.final_loss))
            snprintf(loss, sizeof loss, "%.6f", tr.final_loss);
        else
            snprintf(loss, sizeof loss, "null");
        printf("{\"model\":\"%s\",\"optimizer\":\"%s\",\"amp\":\"%s\",\"batch_size\":%lld,"
               "\"epochs\":%lld,\"steps\":%lld,\"skipped_steps\":%lld,\"final_loss\":%s,"
               "\"loss_scale\":%s,\"test_accuracy\":%.4f,\"samples_per_sec\":%.1f,"
               "\"compile_time_ms\":%.1f,\"peak_device_memory_bytes\":%zu,\"world_size\":%d,"
               "\"collective_bytes\":%lld,\"collective_time_ms\":%.1f}\n",
               model_names[o.model], optim_names[o.optimizer], amp_name(o.amp),
               (long long)o.batch_size, (long long)o.epochs, (long long)tr.steps,
               (long long)tr.skipped, loss, scale, acc, tr.samples_per_sec, compile_ms, mem_peak,
               (int)o.world, (long long)collective_bytes, collective_ms);
    } else {
        if (tr.steps > 0)
            printf("trained %lld steps, final loss %.4f, %.0f samples/s (after the compile)\n",
                   (long long)tr.steps, tr.final_loss, tr.samples_per_sec);
        if (loom_grad_scaler_is_enabled(scaler))
            printf("loss scale %s, %lld of %lld steps skipped for inf/NaN gradients\n", scale,
                   (long long)tr.skipped, (long long)tr.steps);
        printf("test accuracy: %.4f\n", acc);
        printf("compile time %.1f ms, peak device memory %.1f MB\n", compile_ms,
               (double)mem_peak / 1e6);
        if (o.world > 1)
            printf("%d ranks: %.1f MB in collectives on rank 0, %.1f ms\n", (int)o.world,
                   (double)collective_bytes / 1e6, collective_ms);
        if (o.save_path)
            printf("saved weights to %s\n", o.save_path);
        printf("\n--- metrics ---\n");
        loom_metrics_report(ctx, LOOM_REPORT_FORMAT_TEXT, print_chunk, stdout);
    }
    rc = 0;
out:
    loom_grad_scaler_destroy(scaler);
    model_deinit(&m);
    loom_context_destroy(ctx);
    loom_dataset_destroy(test_ds);
    loom_dataset_destroy(train_ds);
    return leave(rc);
}
