/* ResNet-18/50 training example, as Alibaba TorchAcc's ResNet-50 guide trains it: synthetic
 * ImageNet-shaped data (or a safetensors file of images and labels), SGD or sync-free AdamW,
 * AMP with the GradScaler, log lines with batch time, samples/s and peak device memory,
 * top-1/top-5 evaluation; data parallel under `mpiexec -n N` as fashion_mnist. */
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

#include "resnet_model.h"
#include "train_util.h"

#define PROG "resnet"
/* Steps after the first whose launch intervals are not timed for the median (warm-up). */
#define WARMUP_STEPS 2

typedef struct options {
    ex_flags f;
    resnet_arch arch;
    int64_t num_classes, image_size, train_images, eval_images, log_interval;
    const char *data_path;
} options;

static void usage(FILE *f) {
    fprintf(
        f,
        "Usage: " PROG " [options]\n"
        "Trains a ResNet (torchvision's layout and state_dict names) on synthetic ImageNet-shaped\n"
        "data or on images from a safetensors file, then reports top-1/top-5 accuracy.\n"
        "\n"
        "  --arch resnet18|resnet50   (default resnet50)\n"
        "  --num-classes N        classes of the fc layer and the labels (default 1000)\n"
        "  --image-size N         synthetic images are 3xNxN (default 224)\n"
        "  --train-images N       synthetic training set size (default 12800)\n"
        "  --data FILE            train on FILE.safetensors instead: 'images' f32 [N,3,H,W]\n"
        "                         (normalised) and 'labels' i64 [N] in [0, num-classes); the\n"
        "                         image size comes from the file\n"
        "  --eval-images N        images evaluated after training (default: one global batch;\n"
        "                         0: none): held-out synthetic images, or the file's first N\n"
        "  --epochs N             passes over the training set (default 1)\n"
        "  --max-steps N          stop training after N steps in total\n"
        "  --batch-size N         global batch (default 32); under mpiexec -n R each rank takes\n"
        "                         N/R images (R must divide N); the last partial batch of an\n"
        "                         epoch is dropped\n"
        "  --optimizer sgd|adam|adamw   (default sgd; AdamW is sync-free under AMP)\n"
        "  --lr X                 learning rate (default 0.1 for sgd, 0.001 for adam/adamw)\n"
        "  --momentum X           sgd momentum (default 0.9)\n"
        "  --weight-decay X       default 1e-4 (sgd, adam: L2 on the gradient), 0.01 (adamw:\n"
        "                         decoupled)\n"
        "  --lr-schedule constant|step|cosine   per step: step is StepLR (x gamma every\n"
        "                         step-size steps), cosine CosineAnnealingLR to 0 over the run\n"
        "  --lr-step-size N       StepLR's step_size, in steps (default 30)\n"
        "  --lr-gamma X           StepLR's gamma (default 0.1)\n"
        "  --amp none|bf16|f16    autocast the forward (default none): convolutions and the fc\n"
        "                         in 16-bit, batch norm and the loss in f32\n"
        "  --loss-scale dynamic|off|X   GradScaler (default dynamic for f16, off otherwise)\n"
        "  --seed N               initialisation, synthetic data and shuffling (default 0)\n"
        "  --no-shuffle           batches in dataset order (else shuffled by seed + epoch)\n"
        "  --init FILE            start from this checkpoint (safetensors: the model's\n"
        "                         state_dict, and the optimizer's and scaler's state if there)\n"
        "  --save FILE            write the model, optimizer and scaler state after training\n"
        "  --log-interval N       every N steps a line: epoch, step, batch size, loss, batch\n"
        "                         time, samples/s (global) and peak device memory (default 10;\n"
        "                         to stderr with --json)\n"
        "  --log-every N          print `step=<n> loss=<value>` for every n that is a multiple\n"
        "                         of N (n from 0: the loss before that batch's update)\n"
        "  --eager                run every step on the reference interpreter (slow; a check)\n"
        "  --json                 print one JSON line of results at the end\n"
        "  --help                 show this help\n"
        "\n"
        "The plan's memory (planned peak) is printed once the first step is compiled, before it\n"
        "runs. samples/s is timed from the first step's launch, after its compile (reported\n"
        "apart); the median is over steps after a warm-up. LOOM_NUM_THREADS sets the device's\n"
        "threads. Exit status: 0 ok, 1 runtime error, 2 usage error.\n");
}

static int on_option(void *ud, const char *name, const char *val) {
    options *o = ud;
    if (!strcmp(name, "--arch")) {
        for (int a = 0; a < RESNET_ARCH_COUNT_; a++)
            if (!strcmp(val, resnet_arch_names[a])) {
                o->arch = (resnet_arch)a;
                return 0;
            }
        return ex_usage_error("--arch must be resnet18 or resnet50, not '%s'", val);
    }
    if (!strcmp(name, "--data")) {
        o->data_path = val;
        return 0;
    }
    static const ex_int_option ints[] = {{"--num-classes", 1, offsetof(options, num_classes)},
                                         {"--image-size", 1, offsetof(options, image_size)},
                                         {"--train-images", 1, offsetof(options, train_images)},
                                         {"--eval-images", 0, offsetof(options, eval_images)},
                                         {"--log-interval", 1, offsetof(options, log_interval)}};
    int st = ex_parse_int_option(ints, sizeof ints / sizeof *ints, name, val, o);
    return st < 0 ? 0 : st;
}

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.arch = RESNET50,
                   .num_classes = 1000,
                   .image_size = 224,
                   .train_images = 12800,
                   .eval_images = -1,
                   .log_interval = 10};
    static const char *const valued[] = {
        "--arch",        "--num-classes", "--image-size",   "--train-images",
        "--eval-images", "--data",        "--log-interval", NULL};
    ex_cli cli = {.valued = valued,
                  .on_option = on_option,
                  .usage = usage,
                  .ud = o,
                  .steps_flag = "--max-steps",
                  .lr_schedules = "constant|step|cosine",
                  .default_batch = 32};
    int rc = ex_parse_args(argc, argv, &cli, &o->f);
    if (rc >= 0)
        return rc;
    ex_flags *f = &o->f;
    ex_flags_defaults(f, 0.1, 1e-4); /* torchvision's reference recipe for SGD */
    if (o->eval_images < 0)
        o->eval_images = f->batch_size;
    return -1;
}

/* ---- data ------------------------------------------------------------------------------ */

/* Images [n, 3, h, w] and labels: the file's, or synthetic ones made from (seed, index) on
 * demand (uniform with variance 1, as normalised pixels; labels uniform over the classes). */
typedef struct dataset {
    int64_t n, h, w, classes;
    uint64_t seed;
    float *images; /* NULL: synthetic */
    int64_t *labels;
} dataset;

/* Image idx (any index: synthetic indices past n are the held-out ones) into x, its label. */
static void dataset_get(const dataset *ds, int64_t idx, float *x, int64_t *y) {
    size_t numel = (size_t)(3 * ds->h * ds->w);
    if (ds->images) {
        memcpy(x, ds->images + (size_t)idx * numel, numel * sizeof *x);
        *y = ds->labels[idx];
        return;
    }
    uint64_t s = ds->seed * 0x2545F4914F6CDD1Dull + (uint64_t)idx;
    *y = (int64_t)(ex_splitmix64(&s) % (uint64_t)ds->classes);
    uint64_t r = ex_splitmix64(&s) | 1;
    for (size_t i = 0; i < numel; i++) { /* xorshift64: cheap enough at 224x224 */
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        x[i] = (float)((double)(r >> 40) * (3.4641016151377544 / 16777216.0) - 1.7320508075688772);
    }
}

/* --data: 'images' f32 [N, 3, H, W] and 'labels' i64 [N] in [0, classes). */
static int dataset_load(const char *path, int64_t classes, dataset *ds) {
    char err[512];
    loom_safetensors *f = NULL;
    if (loom_safetensors_open(path, &f, err, sizeof err) != LOOM_OK) {
        fprintf(stderr, "%s--data: %s\n", ex_who(), err);
        return 1;
    }
    int rc = 1;
    int32_t ii = loom_safetensors_find(f, "images"), li = loom_safetensors_find(f, "labels");
    loom_dtype idt, ldt;
    int32_t ir, lr;
    int64_t is[LOOM_MAX_RANK], ls[LOOM_MAX_RANK];
    const void *id, *ld;
    if (ii < 0 || li < 0) {
        fprintf(stderr, "%s--data %s: needs tensors 'images' and 'labels'\n", ex_who(), path);
        goto out;
    }
    loom_safetensors_tensor(f, ii, NULL, &idt, &ir, is, &id, NULL);
    loom_safetensors_tensor(f, li, NULL, &ldt, &lr, ls, &ld, NULL);
    if (idt != LOOM_DTYPE_F32 || ir != 4 || is[1] != 3 || is[0] < 1 || ldt != LOOM_DTYPE_I64 ||
        lr != 1 || ls[0] != is[0]) {
        fprintf(stderr,
                "%s--data %s: 'images' must be f32 [N, 3, H, W] and 'labels' i64 [N] with the "
                "same N\n",
                ex_who(), path);
        goto out;
    }
    *ds = (dataset){.n = is[0], .h = is[2], .w = is[3], .classes = classes};
    size_t numel = (size_t)(is[0] * 3 * is[2] * is[3]);
    ds->images = malloc(numel * sizeof *ds->images);
    ds->labels = malloc((size_t)ds->n * sizeof *ds->labels);
    if (!ds->images || !ds->labels) {
        fprintf(stderr, "%s--data %s: out of memory\n", ex_who(), path);
        goto out;
    }
    memcpy(ds->images, id, numel * sizeof *ds->images); /* the file's data may be unaligned */
    memcpy(ds->labels, ld, (size_t)ds->n * sizeof *ds->labels);
    for (int64_t i = 0; i < ds->n; i++)
        if (ds->labels[i] < 0 || ds->labels[i] >= classes) {
            fprintf(stderr, "%s--data %s: label %lld of image %lld is outside [0, %lld)\n",
                    ex_who(), path, (long long)ds->labels[i], (long long)i, (long long)classes);
            goto out;
        }
    rc = 0;
out:
    loom_safetensors_close(f);
    return rc;
}

/* Epoch e's order (a permutation from seed + e, or file order), trimmed to a multiple of the
 * world size; this rank takes every world-th entry from its rank, as DistributedSampler
 * with drop_last. Returns this rank's count. */
static int64_t epoch_order(const dataset *ds, const ex_flags *f, int64_t epoch, int64_t *order,
                           int64_t *mine) {
    for (int64_t i = 0; i < ds->n; i++)
        order[i] = i;
    if (f->shuffle) {
        uint64_t s = f->seed + (uint64_t)epoch;
        for (int64_t i = ds->n - 1; i > 0; i--) {
            int64_t j = (int64_t)(ex_splitmix64(&s) % (uint64_t)(i + 1));
            int64_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
    }
    int64_t per_rank = ds->n / f->world;
    for (int64_t i = 0; i < per_rank; i++)
        mine[i] = order[i * f->world + f->rank];
    return per_rank;
}

/* ---- training -------------------------------------------------------------------------- */

typedef struct train_result {
    int64_t steps, skipped;
    double final_loss, samples_per_sec, samples_per_sec_median, first_step_ms, compile_ms;
    int64_t planned_peak;
} train_result;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* "memory: planned peak N bytes ..." of the step just launched: N, or -1. */
static int64_t planned_peak(loom_context *ctx) {
    const char *r = loom_memory_report(ctx);
    const char *p = r ? strstr(r, "planned peak ") : NULL;
    return p ? strtoll(p + 13, NULL, 10) : -1;
}

typedef struct trainer {
    loom_context *ctx;
    const options *o;
    const resnet *m;
    loom_optim *opt;
    const model_amp *amp;
    const dataset *ds;
    FILE *log; /* --log-interval lines */
} trainer;

/* The --log-interval line (TorchAcc's log_metrics) after `done` steps, the last of them in
 * epoch `epoch` (from 0), which took dt seconds each on average. Rank 0 only. */
static void log_line(const trainer *t, int64_t epoch, int64_t done, int64_t total, double loss,
                     double dt) {
    const ex_flags *f = &t->o->f;
    if (f->rank != 0)
        return;
    size_t cur = 0, peak = 0;
    loom_device_memory(t->ctx, &cur, &peak);
    fprintf(t->log,
            "epoch %lld step %lld/%lld batch_size %lld loss %.4f batch_time %.3fs samples/s %.1f "
            "peak_mem %.1f MB\n",
            (long long)epoch + 1, (long long)done, (long long)total, (long long)f->batch_size, loss,
            dt, dt > 0 ? (double)f->batch_size / dt : 0.0, (double)peak / 1e6);
    fflush(t->log);
}

static int train(const trainer *t, train_result *res) {
    const options *o = t->o;
    const ex_flags *f = &o->f;
    loom_context *ctx = t->ctx;
    const dataset *ds = t->ds;
    int rc = 1;
    int64_t b = f->batch_size / f->world; /* this rank's images per step */
    size_t img = (size_t)(3 * ds->h * ds->w);
    int64_t *order = malloc((size_t)ds->n * sizeof *order);
    int64_t *mine = malloc((size_t)ds->n * sizeof *mine);
    float *xb = malloc((size_t)b * img * sizeof *xb);
    int64_t *yb = malloc((size_t)b * sizeof *yb);
    double *launch = NULL;
    loom_tensor *pending = NULL;
    int64_t pending_step = -1, pending_epoch = 0;
    *res = (train_result){.final_loss = NAN, .planned_peak = -1};
    int64_t per_epoch = ds->n / f->world / b;
    int64_t total = f->epochs * per_epoch;
    if (f->max_steps && f->max_steps < total)
        total = f->max_steps;
    launch = malloc((size_t)(total + 1) * sizeof *launch);
    if (!order || !mine || !xb || !yb || !launch) {
        fprintf(stderr, "%sout of memory\n", ex_who());
        goto out;
    }
    if (per_epoch == 0) {
        if (f->rank == 0)
            fprintf(stderr, "%s--batch-size %lld exceeds the %lld training images\n", ex_who(),
                    (long long)f->batch_size, (long long)ds->n);
        goto out;
    }
    double t_rate = 0, last_loss = NAN, t_log = 0;
    int64_t compile_ns = 0, step = 0, log_step = 0;
    for (int64_t epoch = 0; epoch < f->epochs && step < total; epoch++) {
        epoch_order(ds, f, epoch, order, mine);
        for (int64_t k = 0; k < per_epoch && step < total; k++) {
            for (int64_t i = 0; i < b; i++)
                dataset_get(ds, mine[k * b + i], xb + (size_t)i * img, yb + i);
            if (f->lr_schedule != EX_LR_CONSTANT) /* a device scalar: never recompiles */
                loom_optim_set_lr(t->opt, ex_lr_at(f, step, total));
            double t0 = ex_now_s();
            loom_tensor *x =
                loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, (int64_t[]){b, 3, ds->h, ds->w}, xb);
            loom_tensor *y = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 1, (int64_t[]){b}, yb);
            bool autocast = t->amp->dtype != LOOM_DTYPE_F32;
            if (autocast)
                loom_autocast_begin(ctx, t->amp->dtype);
            loom_tensor *loss =
                loom_cross_entropy(ctx, resnet_forward(ctx, t->m, x, true), y, LOOM_REDUCTION_MEAN);
            if (autocast)
                loom_autocast_end(ctx);
            loom_tensor *out_loss = NULL;
            ex_train_step_record(ctx, loss, t->m->n_params, t->m->params, t->opt, t->amp,
                                 &out_loss);
            if (step == 0 && loom_compile_step(ctx) == LOOM_OK && f->rank == 0) {
                /* compiled, not yet run: the plan's memory is known */
                const char *r = loom_memory_report(ctx);
                const char *nl = strchr(r, '\n');
                fprintf(f->json ? stderr : stdout, "%.*s\n",
                        (int)(nl ? nl - r : (ptrdiff_t)strlen(r)), r);
                fflush(f->json ? stderr : stdout);
            }
            loom_status st = loom_mark_step(ctx);
            loom_tensor_release(x);
            loom_tensor_release(y);
            if (st != LOOM_OK || !out_loss) {
                loom_tensor_release(out_loss);
                rc = ex_runtime_error(ctx, "training step");
                goto out;
            }
            double now = ex_now_s();
            launch[step] = now;
            if (step == 0) {
                res->first_step_ms = (now - t0) * 1e3;
                t_rate = t_log = now;
                compile_ns = loom_metric_total(ctx, "CompileTime");
                res->compile_ms = (double)compile_ns / 1e6;
                res->planned_peak = planned_peak(ctx);
            }
            /* Launching this step waited for the previous one: its loss is ready. */
            if (pending) {
                bool log = f->log_every && pending_step % f->log_every == 0;
                bool line = (pending_step + 1) % o->log_interval == 0;
                if ((log || line) &&
                    ex_take_loss(ctx, f, &pending, pending_step, NULL, NULL, &last_loss))
                    goto out;
                if (line) {
                    log_line(t, pending_epoch, pending_step + 1, total, last_loss,
                             (now - t_log) / (double)(step - log_step));
                    t_log = now;
                    log_step = step;
                }
                loom_tensor_release(pending);
            }
            pending = out_loss;
            pending_step = step;
            pending_epoch = epoch;
            step++;
        }
    }
    if (pending && ex_take_loss(ctx, f, &pending, pending_step, NULL, NULL, &last_loss))
        goto out;
    if (loom_context_sync(ctx) != LOOM_OK) {
        rc = ex_runtime_error(ctx, "training");
        goto out;
    }
    double end = ex_now_s();
    launch[step] = end;
    if (step > log_step && step % o->log_interval == 0) /* the last step's line */
        log_line(t, pending_epoch, step, total, last_loss,
                 (end - t_log) / (double)(step - log_step));
    double elapsed =
        end - t_rate - (double)(loom_metric_total(ctx, "CompileTime") - compile_ns) * 1e-9;
    res->steps = step;
    if (loom_grad_scaler_is_enabled(t->amp->scaler)) {
        int64_t clean = ex_optimizer_steps(ctx, t->opt);
        res->skipped = clean >= 0 ? step - clean : 0;
    }
    res->final_loss = last_loss;
    /* From the first launch (its compile done) to the end: steps 1.. ran in that time (the
     * first step's run overlaps the second's tracing). */
    res->samples_per_sec =
        elapsed > 0 && step > 1 ? (double)(step - 1) * (double)f->batch_size / elapsed : 0;
    /* Step i's time: from its launch to the next's (a launch waits for its predecessor). */
    int64_t first = step > WARMUP_STEPS + 1 ? WARMUP_STEPS + 1 : 1, n = step - first;
    if (n > 0) {
        double *d = malloc((size_t)n * sizeof *d);
        if (d) {
            for (int64_t i = 0; i < n; i++)
                d[i] = launch[first + i + 1] - launch[first + i];
            qsort(d, (size_t)n, sizeof *d, cmp_double);
            double med = n % 2 ? d[n / 2] : 0.5 * (d[n / 2 - 1] + d[n / 2]);
            res->samples_per_sec_median = med > 0 ? (double)f->batch_size / med : 0;
            free(d);
        }
    }
    rc = 0;
out:
    loom_tensor_release(pending);
    free(order);
    free(mine);
    free(xb);
    free(yb);
    free(launch);
    return rc;
}

/* Top-1/top-5 over the evaluation images (eval mode: the running statistics), counted in the
 * graph and read once. Rank 0 only. */
static int evaluate(const trainer *t, int64_t *out_n, double *out_top1, double *out_top5) {
    const options *o = t->o;
    const dataset *ds = t->ds;
    loom_context *ctx = t->ctx;
    int64_t total = o->eval_images;
    if (ds->images && total > ds->n)
        total = ds->n;
    int64_t b = total < o->f.batch_size ? total : o->f.batch_size;
    *out_n = b > 0 ? total / b * b : 0; /* whole batches: one compiled graph */
    *out_top1 = *out_top5 = 0;
    if (*out_n == 0)
        return 0;
    size_t img = (size_t)(3 * ds->h * ds->w);
    float *xb = malloc((size_t)b * img * sizeof *xb);
    int64_t *yb = malloc((size_t)b * sizeof *yb);
    int64_t zero[2] = {0, 0}, hits[2];
    loom_tensor *counter = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 1, (int64_t[]){2}, zero);
    int rc = 1;
    if (!xb || !yb || !counter) {
        rc = ex_runtime_error(ctx, "evaluation");
        goto out;
    }
    /* Synthetic: held-out images after the training set's; a file: its first images. */
    int64_t base = ds->images ? 0 : ds->n;
    for (int64_t k = 0; k < *out_n; k += b) {
        for (int64_t i = 0; i < b; i++)
            dataset_get(ds, base + k + i, xb + (size_t)i * img, yb + i);
        loom_tensor *x =
            loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, (int64_t[]){b, 3, ds->h, ds->w}, xb);
        loom_tensor *y = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 1, (int64_t[]){b}, yb);
        if (t->amp->dtype != LOOM_DTYPE_F32) /* evaluated as trained */
            loom_autocast_begin(ctx, t->amp->dtype);
        loom_tensor *logits = resnet_forward(ctx, t->m, x, false);
        if (t->amp->dtype != LOOM_DTYPE_F32)
            loom_autocast_end(ctx);
        loom_tensor *top1 = NULL, *top5 = NULL;
        if (logits && resnet_topk_hits(ctx, logits, y, &top1, &top5) == LOOM_OK) {
            loom_tensor *both =
                loom_concat(ctx, 2,
                            (loom_tensor *[]){loom_reshape(ctx, top1, 1, (int64_t[]){1}),
                                              loom_reshape(ctx, top5, 1, (int64_t[]){1})},
                            0);
            loom_assign(ctx, counter, loom_add(ctx, counter, both));
        }
        loom_status st = loom_mark_step(ctx);
        loom_tensor_release(x);
        loom_tensor_release(y);
        if (st != LOOM_OK || !top1) {
            rc = ex_runtime_error(ctx, "evaluation step");
            goto out;
        }
    }
    if (loom_tensor_read(ctx, counter, hits, sizeof hits) != LOOM_OK) {
        rc = ex_runtime_error(ctx, "reading the evaluation result");
        goto out;
    }
    *out_top1 = (double)hits[0] / (double)*out_n;
    *out_top5 = (double)hits[1] / (double)*out_n;
    rc = 0;
out:
    loom_tensor_release(counter);
    free(xb);
    free(yb);
    return rc;
}

int main(int argc, char **argv) {
    if (!ex_begin(PROG))
        return 1;
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return ex_leave(rc);
    rc = 1;
    const ex_flags *f = &o.f;
    loom_context *ctx = NULL;
    resnet m = {0};
    loom_grad_scaler *scaler = NULL;
    loom_optim *opt = NULL;
    ex_checkpoint ck = {0};
    dataset ds = {.n = o.train_images,
                  .h = o.image_size,
                  .w = o.image_size,
                  .classes = o.num_classes,
                  .seed = f->seed};
    train_result tr = {.final_loss = NAN, .planned_peak = -1};
    int64_t n_eval = 0;
    double top1 = 0, top5 = 0;
    if (o.data_path && dataset_load(o.data_path, o.num_classes, &ds) != 0)
        goto out;

    bool eager;
    if (!(ctx = ex_context_create(f, &eager)))
        goto out;
    if (resnet_init(ctx, &m, o.arch, o.num_classes, f->seed) != LOOM_OK) {
        rc = ex_runtime_error(ctx, "creating the model");
        goto out;
    }
    if (ex_grad_scaler_create(ctx, f, &scaler) != LOOM_OK) {
        rc = ex_runtime_error(ctx, "creating the loss scaler");
        goto out;
    }
    loom_optim_options oo;
    loom_optim_options_init(&oo, f->optimizer);
    oo.lr = f->lr;
    oo.weight_decay = f->weight_decay;
    if (f->optimizer == LOOM_OPTIM_SGD)
        oo.momentum = f->momentum;
    if (loom_optim_create(ctx, &oo, m.n_params, m.params, &opt) != LOOM_OK) {
        rc = ex_runtime_error(ctx, "creating the optimizer");
        goto out;
    }
    model_amp amp = {
        .dtype = f->amp, .scaler = scaler, .static_scale = f->loss_scale == EX_LS_STATIC};
    if (ex_checkpoint_init(&ck, m.n_state, m.state, opt, m.n_params, scaler) != LOOM_OK) {
        fprintf(stderr, "%sout of memory\n", ex_who());
        goto out;
    }
    /* Every rank starts from rank 0's model, optimizer and scaler state. */
    if ((rc = ex_restore(ctx, f, &ck, m.n_state)) != 0)
        goto out;
    rc = 1;
    if (!f->json && f->rank == 0) {
        printf("%s (%d parameter tensors, %d in the state_dict), %s %lld images %lldx%lld, "
               "%lld classes, batch %lld, %s lr %g, amp %s%s",
               resnet_arch_names[o.arch], (int)m.n_params, (int)m.n_state,
               o.data_path ? o.data_path : "synthetic", (long long)ds.n, (long long)ds.h,
               (long long)ds.w, (long long)o.num_classes, (long long)f->batch_size,
               ex_optim_names[f->optimizer], f->lr, ex_amp_name(f->amp),
               eager ? ", reference interpreter" : "");
        if (f->world > 1)
            printf(", %d ranks", (int)f->world);
        printf("\n");
        fflush(stdout);
    }
    trainer t = {.ctx = ctx,
                 .o = &o,
                 .m = &m,
                 .opt = opt,
                 .amp = &amp,
                 .ds = &ds,
                 .log = f->json ? stderr : stdout};
    if (f->epochs > 0 && (rc = train(&t, &tr)) != 0)
        goto out;
    double train_compile_ms = (double)loom_metric_total(ctx, "CompileTime") / 1e6;
    rc = 0;
    if (f->rank != 0) /* the ranks' weights are equal: rank 0 saves, evaluates, reports */
        goto out;
    rc = 1;
    if (f->save_path && loom_safetensors_save(ctx, f->save_path, ck.n, ck.list) != LOOM_OK) {
        rc = ex_runtime_error(ctx, "--save");
        goto out;
    }
    if ((rc = evaluate(&t, &n_eval, &top1, &top5)) != 0)
        goto out;
    rc = 1;
    char scale[32];
    ex_scale_text(ctx, scaler, scale, sizeof scale);
    size_t mem_now = 0, mem_peak = 0;
    loom_device_memory(ctx, &mem_now, &mem_peak);
    double eval_compile_ms = (double)loom_metric_total(ctx, "CompileTime") / 1e6 - train_compile_ms;
    if (f->json) {
        char loss[32] = "null";
        if (isfinite(tr.final_loss))
            snprintf(loss, sizeof loss, "%.6f", tr.final_loss);
        printf("{\"arch\":\"%s\",\"optimizer\":\"%s\",\"amp\":\"%s\",\"batch_size\":%lld,"
               "\"image_size\":%lld,\"num_classes\":%lld,\"epochs\":%lld,\"steps\":%lld,"
               "\"skipped_steps\":%lld,\"final_loss\":%s,\"loss_scale\":%s,\"eval_images\":%lld,"
               "\"top1\":%.4f,\"top5\":%.4f,\"samples_per_sec\":%.2f,"
               "\"samples_per_sec_median\":%.2f,\"first_step_ms\":%.1f,\"compile_time_ms\":%.1f,"
               "\"eval_compile_time_ms\":%.1f,\"planned_peak_bytes\":%lld,"
               "\"peak_device_memory_bytes\":%zu,\"world_size\":%d,\"collective_bytes\":%lld,"
               "\"collective_time_ms\":%.1f}\n",
               resnet_arch_names[o.arch], ex_optim_names[f->optimizer], ex_amp_name(f->amp),
               (long long)f->batch_size, (long long)ds.h, (long long)o.num_classes,
               (long long)f->epochs, (long long)tr.steps, (long long)tr.skipped, loss, scale,
               (long long)n_eval, top1, top5, tr.samples_per_sec, tr.samples_per_sec_median,
               tr.first_step_ms, tr.compile_ms, eval_compile_ms, (long long)tr.planned_peak,
               mem_peak, (int)f->world, (long long)loom_metric_value(ctx, "CollectiveBytes"),
               (double)loom_metric_total(ctx, "CollectiveTime") / 1e6);
    } else {
        if (tr.steps > 0)
            printf("trained %lld steps, final loss %.4f, %.1f samples/s (median %.1f), first "
                   "step %.0f ms (compile %.0f ms)\n",
                   (long long)tr.steps, tr.final_loss, tr.samples_per_sec,
                   tr.samples_per_sec_median, tr.first_step_ms, tr.compile_ms);
        if (loom_grad_scaler_is_enabled(scaler))
            printf("loss scale %s, %lld of %lld steps skipped for inf/NaN gradients\n", scale,
                   (long long)tr.skipped, (long long)tr.steps);
        if (n_eval > 0)
            printf("evaluation on %lld %s images: top-1 %.4f, top-5 %.4f\n", (long long)n_eval,
                   o.data_path ? "training" : "held-out synthetic", top1, top5);
        printf("peak device memory %.1f MB\n", (double)mem_peak / 1e6);
        if (f->save_path)
            printf("saved the model, optimizer and scaler state to %s\n", f->save_path);
    }
    rc = 0;
out:
    ex_checkpoint_deinit(&ck);
    loom_optim_destroy(opt);
    loom_grad_scaler_destroy(scaler);
    resnet_deinit(&m);
    loom_context_destroy(ctx);
    free(ds.images);
    free(ds.labels);
    return ex_leave(rc);
}
