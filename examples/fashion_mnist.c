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
/* 10000 test images split evenly, so evaluation compiles one graph. */
#define EVAL_BATCH 500
#define DEFAULT_DATA_DIR "/usr/share/datasets/fashion-mnist"

typedef struct options {
    ex_flags f; /* the flags every training example takes */
    model_kind model;
    const char *data_dir;
    bool keep_last; /* --keep-last */
} options;

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
            "  --keep-last            train on the last partial batch of each epoch too (as\n"
            "                         PyTorch's DataLoader does by default): a graph of another\n"
            "                         shape, compiled once more (LOOM_DEBUG=1 says why)\n"
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

static int on_option(void *ud, const char *name, const char *val) {
    options *o = ud;
    if (!strcmp(name, "--model")) {
        if (!strcmp(val, "mlp"))
            o->model = MODEL_MLP;
        else if (!strcmp(val, "cnn"))
            o->model = MODEL_CNN;
        else
            return ex_usage_error("--model must be mlp or cnn, not '%s'", val);
    } else if (!strcmp(name, "--data-dir")) {
        o->data_dir = val;
    } else if (!strcmp(name, "--keep-last")) {
        o->keep_last = true;
    }
    return 0;
}

/* Returns -1 when the options are good, else the exit status (0 after --help). */
static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.model = MODEL_MLP, .data_dir = DEFAULT_DATA_DIR};
    static const char *const valued[] = {"--model", "--data-dir", NULL};
    static const char *const switches[] = {"--keep-last", NULL};
    ex_cli cli = {.valued = valued,
                  .switches = switches,
                  .on_option = on_option,
                  .usage = usage,
                  .ud = o,
                  .steps_flag = "--limit-steps",
                  .lr_schedules = "constant|cosine"};
    int rc = ex_parse_args(argc, argv, &cli, &o->f);
    if (rc >= 0)
        return rc;
    ex_flags_defaults(&o->f, 0.01, 0.0);
    return -1;
}

/* ---- model ----------------------------------------------------------------------------- */

/* ---- progress -------------------------------------------------------------------------- */

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

typedef struct train_result {
    int64_t steps;
    int64_t skipped;   /* steps the loss scaler skipped for inf/NaN gradients */
    double final_loss; /* NAN when no step ran */
    double samples_per_sec;
} train_result;

static void clear_bar(void *p) {
    progress_clear(p);
}

/* A finished step's loss (see ex_take_loss), clearing the progress bar before printing. */
static int take_loss(loom_context *ctx, const options *o, loom_tensor **loss, int64_t step,
                     progress *p, double *out) {
    return ex_take_loss(ctx, &o->f, loss, step, clear_bar, p, out);
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
    loom_optim_options_init(&oo, o->f.optimizer);
    oo.lr = o->f.lr;
    oo.weight_decay = o->f.weight_decay;
    if (o->f.optimizer == LOOM_OPTIM_SGD)
        oo.momentum = o->f.momentum;
    loom_tensor *params[MAX_PARAMS];
    if (loom_optim_create(ctx, &oo, model_tensors(m, params), params, &opt) != LOOM_OK) {
        rc = ex_runtime_error(ctx, "creating the optimizer");
        goto out;
    }
    /* This rank's shard of each epoch, its share of the global batch. */
    loom_batch_options bo;
    loom_batch_options_init(&bo);
    bo.batch_size = o->f.batch_size / o->f.world;
    bo.shuffle = o->f.shuffle;
    bo.seed = o->f.seed;
    bo.rank = o->f.rank;
    bo.world_size = o->f.world;
    bo.drop_last = !o->keep_last;
    if (loom_batches_create(ds, &bo, &it) != LOOM_OK) {
        fprintf(stderr, "%scannot create the batch iterator\n", ex_who());
        goto out;
    }
    const int64_t per_epoch = loom_batches_per_epoch(it);
    if (per_epoch == 0) {
        if (o->f.rank == 0)
            fprintf(stderr, PROG ": --batch-size %lld exceeds the %lld training images\n",
                    (long long)o->f.batch_size, (long long)loom_dataset_count(ds));
        goto out;
    }
    progress p = {.tty = o->f.rank == 0 && isatty(STDERR_FILENO) == 1,
                  .quiet = o->f.json || o->f.rank != 0,
                  .last = ex_now_s(),
                  .every = per_epoch >= 10 ? per_epoch / 10 : 1};
    int64_t total_steps = o->f.epochs * per_epoch;
    if (o->f.max_steps && o->f.max_steps < total_steps)
        total_steps = o->f.max_steps;
    double t_rate = 0;      /* when the first step was launched, its compile done */
    int64_t compile_ns = 0; /* CompileTime then: later compiles are not training time */
    double last_loss = NAN;
    int64_t step = 0;
    bool stop = false;
    for (int64_t epoch = 0; epoch < o->f.epochs && !stop; epoch++) {
        loom_batches_set_epoch(it, epoch);
        const float *xb;
        const int64_t *yb;
        int64_t n;
        for (int64_t b = 0; loom_batches_next(it, &xb, &yb, &n); b++) {
            if (o->f.lr_schedule != EX_LR_CONSTANT) /* a device scalar: never recompiles */
                loom_optim_set_lr(opt, ex_lr_at(&o->f, step, total_steps));
            loom_tensor *loss = NULL;
            loom_status st = model_train_step(ctx, m, params, opt, amp, xb, yb, n, &loss);
            if (st != LOOM_OK || !loss) {
                loom_tensor_release(loss);
                progress_clear(&p);
                rc = ex_runtime_error(ctx, "training step");
                goto out;
            }
            if (step == 0) {
                t_rate = ex_now_s();
                compile_ns = loom_metric_total(ctx, "CompileTime");
            }
            /* Launching this step waited for the previous one: its loss is ready. */
            if (pending) {
                double t = ex_now_s();
                bool log = o->f.log_every && pending_step % o->f.log_every == 0;
                bool show = p.tty ? t - p.last >= 0.1 : pending_step % p.every == 0;
                if (log || show) {
                    if (take_loss(ctx, o, &pending, pending_step, &p, &last_loss))
                        goto out;
                }
                if (show) {
                    double rate =
                        t > t_rate ? (double)step * (double)o->f.batch_size / (t - t_rate) : 0;
                    progress_show(&p, epoch, o->f.epochs, b, per_epoch, last_loss, rate);
                    p.last = t;
                }
                loom_tensor_release(pending);
            }
            pending = loss;
            pending_step = step;
            step++;
            if (o->f.max_steps && step >= o->f.max_steps) {
                stop = true;
                break;
            }
        }
        /* A summary line per epoch (one wait for the device per epoch). */
        if (!o->f.json && pending && o->f.epochs > 1) {
            if (take_loss(ctx, o, &pending, pending_step, &p, &last_loss))
                goto out;
            double t =
                ex_now_s() - (double)(loom_metric_total(ctx, "CompileTime") - compile_ns) * 1e-9;
            progress_clear(&p);
            if (o->f.rank == 0)
                fprintf(stderr, "epoch %lld/%lld: last loss %.4f, %.0f samples/s\n",
                        (long long)epoch + 1, (long long)o->f.epochs, last_loss,
                        t > t_rate ? (double)step * (double)o->f.batch_size / (t - t_rate) : 0.0);
        }
    }
    if (pending) { /* the last step: reading it waits for the device */
        if (take_loss(ctx, o, &pending, pending_step, &p, &last_loss))
            goto out;
    }
    if (loom_context_sync(ctx) != LOOM_OK) {
        rc = ex_runtime_error(ctx, "training");
        goto out;
    }
    double elapsed =
        ex_now_s() - t_rate - (double)(loom_metric_total(ctx, "CompileTime") - compile_ns) * 1e-9;
    progress_clear(&p);
    res->steps = step;
    if (loom_grad_scaler_is_enabled(amp->scaler)) {
        int64_t clean = ex_optimizer_steps(ctx, opt);
        res->skipped = clean >= 0 ? step - clean : 0;
    }
    res->final_loss = last_loss;
    /* From the first launch (its compile done) to the end: every step ran in that time. */
    res->samples_per_sec = elapsed > 0 ? (double)step * (double)o->f.batch_size / elapsed : 0;
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
        return ex_runtime_error(ctx, "evaluation");
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
            rc = ex_runtime_error(ctx, "evaluation step");
            goto out;
        }
        total += n;
    }
    if (loom_tensor_read(ctx, counter, &correct, sizeof correct) != LOOM_OK) {
        rc = ex_runtime_error(ctx, "reading the evaluation result");
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
        fprintf(stderr, "%s%s\n", ex_who(), err);
        if (access(images, F_OK) != 0 || access(labels, F_OK) != 0)
            fprintf(stderr,
                    "%sthe Fashion-MNIST files come with Debian's "
                    "dataset-fashion-mnist package; or pass --data-dir DIR\n",
                    ex_who());
        return NULL;
    }
    /* IDX labels are bytes: a file with a label past the ten classes would train to NaN */
    const uint8_t *y = loom_dataset_labels(ds);
    for (int64_t i = 0; i < loom_dataset_count(ds); i++)
        if (y[i] >= 10) {
            fprintf(stderr, "%s%s: label %u of image %lld is not one of the 10 classes (0..9)\n",
                    ex_who(), labels, (unsigned)y[i], (long long)i);
            loom_dataset_destroy(ds);
            return NULL;
        }
    return ds;
}

static const char *const model_names[] = {"mlp", "cnn"};
int main(int argc, char **argv) {
    if (!ex_begin(PROG))
        return 1;
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0)
        return ex_leave(rc);
    rc = 1;

    loom_context *ctx = NULL;
    model m = {0};
    loom_dataset *train_ds = NULL, *test_ds = NULL;
    loom_grad_scaler *scaler = NULL;
    train_result tr = {.final_loss = NAN};
    ex_checkpoint ck = {0};
    double acc = 0;

    train_ds = load_split(o.data_dir, "train");
    test_ds = train_ds ? load_split(o.data_dir, "t10k") : NULL;
    if (!test_ds)
        goto out;
    int64_t rows, cols, trows, tcols;
    loom_dataset_image_shape(train_ds, &rows, &cols);
    loom_dataset_image_shape(test_ds, &trows, &tcols);
    if (rows != trows || cols != tcols || rows < 6 || cols < 6) {
        fprintf(stderr, "%strain images are %lldx%lld and test images %lldx%lld\n", ex_who(),
                (long long)rows, (long long)cols, (long long)trows, (long long)tcols);
        goto out;
    }

    bool eager;
    if (!(ctx = ex_context_create(&o.f, &eager)))
        goto out;
    if (model_init(ctx, &m, o.model, rows, cols, o.f.seed) != LOOM_OK) {
        rc = ex_runtime_error(ctx, "creating the model");
        goto out;
    }
    if (ex_grad_scaler_create(ctx, &o.f, &scaler) != LOOM_OK) {
        rc = ex_runtime_error(ctx, "creating the loss scaler");
        goto out;
    }
    model_amp amp = {
        .dtype = o.f.amp, .scaler = scaler, .static_scale = o.f.loss_scale == EX_LS_STATIC};
    /* The checkpoint: the parameters, then the loss scaler's state (the optimizer is made
     * per training run and not saved). */
    if (ex_checkpoint_init(&ck, m.n_params, m.params, NULL, 0, scaler) != LOOM_OK) {
        fprintf(stderr, "%sout of memory\n", ex_who());
        goto out;
    }
    /* Every rank starts from rank 0's parameters and loss-scaler state (the optimizer's
     * state is created zeroed on every rank). */
    if ((rc = ex_restore(ctx, &o.f, &ck, m.n_params)) != 0)
        goto out;
    rc = 1;
    char ranks[96] = "";
    if (o.f.world > 1)
        snprintf(ranks, sizeof ranks, ", %d ranks (%lld images per rank and step)", (int)o.f.world,
                 (long long)(o.f.batch_size / o.f.world));
    if (!o.f.json && o.f.rank == 0)
        printf("model %s (%d tensors), %lld training and %lld test images, %s lr %g%s, amp %s%s"
               "%s%s\n",
               model_names[o.model], (int)m.n_params, (long long)loom_dataset_count(train_ds),
               (long long)loom_dataset_count(test_ds), ex_optim_names[o.f.optimizer], o.f.lr,
               o.f.lr_schedule == EX_LR_COSINE ? " (cosine schedule)" : "", ex_amp_name(o.f.amp),
               o.f.loss_scale == EX_LS_DYNAMIC  ? " (dynamic loss scale)"
               : o.f.loss_scale == EX_LS_STATIC ? " (static loss scale)"
                                                : "",
               eager ? ", reference interpreter" : "", ranks);
    fflush(stdout); /* before the progress lines on stderr, also when stdout is a pipe */
    if (o.f.epochs > 0 && (rc = train(ctx, &o, &m, &amp, train_ds, &tr)) != 0)
        goto out;
    rc = 0;
    /* The ranks' weights are equal: rank 0 saves, evaluates and reports. */
    if (o.f.rank != 0)
        goto out;
    rc = 1;
    if (o.f.save_path && loom_safetensors_save(ctx, o.f.save_path, ck.n, ck.list) != LOOM_OK) {
        rc = ex_runtime_error(ctx, "--save");
        goto out;
    }
    if ((rc = evaluate(ctx, &m, o.f.amp, test_ds, &acc)) != 0)
        goto out;
    rc = 1;
    /* The final loss scale (a read of the device's scalar), null without loss scaling. */
    char scale[32];
    ex_scale_text(ctx, scaler, scale, sizeof scale);

    size_t mem_now = 0, mem_peak = 0;
    loom_device_memory(ctx, &mem_now, &mem_peak);
    double compile_ms = (double)loom_metric_total(ctx, "CompileTime") / 1e6;
    double collective_ms = (double)loom_metric_total(ctx, "CollectiveTime") / 1e6;
    int64_t collective_bytes = loom_metric_value(ctx, "CollectiveBytes");
    if (o.f.json) {
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
               model_names[o.model], ex_optim_names[o.f.optimizer], ex_amp_name(o.f.amp),
               (long long)o.f.batch_size, (long long)o.f.epochs, (long long)tr.steps,
               (long long)tr.skipped, loss, scale, acc, tr.samples_per_sec, compile_ms, mem_peak,
               (int)o.f.world, (long long)collective_bytes, collective_ms);
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
        if (o.f.world > 1)
            printf("%d ranks: %.1f MB in collectives on rank 0, %.1f ms\n", (int)o.f.world,
                   (double)collective_bytes / 1e6, collective_ms);
        if (o.f.save_path)
            printf("saved weights to %s\n", o.f.save_path);
        printf("\n--- metrics ---\n");
        loom_metrics_report(ctx, LOOM_REPORT_FORMAT_TEXT, ex_print_chunk, stdout);
    }
    rc = 0;
out:
    ex_checkpoint_deinit(&ck);
    loom_grad_scaler_destroy(scaler);
    model_deinit(&m);
    loom_context_destroy(ctx);
    loom_dataset_destroy(test_ds);
    loom_dataset_destroy(train_ds);
    return ex_leave(rc);
}
