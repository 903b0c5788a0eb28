/* Shared by the training examples and bench/bench_train: flags, per-rank error reporting,
 * the training step after the forward, checkpoints (see train_util.h). */
#include "train_util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include <loom/dist.h>
#include <loom/nn.h>

const char *ex_prog = "example";
const char *const ex_optim_names[] = {"sgd", "adam", "adamw"};

int ex_usage_error(const char *fmt, ...) {
    if (loom_dist_rank() != 0) /* every rank finds the same usage error; rank 0 reports it */
        return EXIT_USAGE;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", ex_prog);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry '%s --help'.\n", ex_prog);
    va_end(ap);
    return EXIT_USAGE;
}

bool ex_parse_int(const char *s, int64_t lo, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo)
        return false;
    *out = v;
    return true;
}

int ex_parse_int_option(const ex_int_option *t, size_t n, const char *name, const char *val,
                        void *base) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(name, t[i].name)) {
            if (!ex_parse_int(val, t[i].lo, (int64_t *)((char *)base + t[i].offset)))
                return ex_usage_error("%s needs an integer >= %lld, not '%s'", name,
                                      (long long)t[i].lo, val);
            return 0;
        }
    return -1;
}

uint64_t ex_splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

bool ex_parse_real(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < 0)
        return false;
    *out = v;
    return true;
}

static bool listed(const char *const *names, const char *name) {
    for (; names && *names; names++)
        if (!strcmp(*names, name))
            return true;
    return false;
}

/* One of the common valued options; 0 or EXIT_USAGE. */
static int common_option(const ex_cli *cli, ex_flags *f, const char *name, const char *val) {
    int64_t n;
    if (!strcmp(name, "--optimizer")) {
        if (!strcmp(val, "sgd"))
            f->optimizer = LOOM_OPTIM_SGD;
        else if (!strcmp(val, "adam"))
            f->optimizer = LOOM_OPTIM_ADAM;
        else if (!strcmp(val, "adamw"))
            f->optimizer = LOOM_OPTIM_ADAMW;
        else
            return ex_usage_error("--optimizer must be sgd, adam or adamw, not '%s'", val);
    } else if (!strcmp(name, "--epochs")) {
        if (!ex_parse_int(val, 0, &f->epochs))
            return ex_usage_error("--epochs needs an integer >= 0, not '%s'", val);
    } else if (!strcmp(name, "--batch-size")) {
        if (!ex_parse_int(val, 1, &f->batch_size))
            return ex_usage_error("--batch-size needs an integer >= 1, not '%s'", val);
    } else if (!strcmp(name, cli->steps_flag)) {
        if (!ex_parse_int(val, 1, &f->max_steps))
            return ex_usage_error("%s needs an integer >= 1, not '%s'", name, val);
    } else if (!strcmp(name, "--log-every")) {
        if (!ex_parse_int(val, 1, &f->log_every))
            return ex_usage_error("--log-every needs an integer >= 1, not '%s'", val);
    } else if (!strcmp(name, "--seed")) {
        if (!ex_parse_int(val, 0, &n))
            return ex_usage_error("--seed needs an integer >= 0, not '%s'", val);
        f->seed = (uint64_t)n;
    } else if (!strcmp(name, "--lr-schedule")) {
        bool has_step = strstr(cli->lr_schedules, "step") != NULL;
        if (!strcmp(val, "constant"))
            f->lr_schedule = EX_LR_CONSTANT;
        else if (!strcmp(val, "cosine"))
            f->lr_schedule = EX_LR_COSINE;
        else if (has_step && !strcmp(val, "step"))
            f->lr_schedule = EX_LR_STEP;
        else
            return ex_usage_error("--lr-schedule must be %s, not '%s'",
                                  has_step ? "constant, step or cosine" : "constant or cosine",
                                  val);
    } else if (!strcmp(name, "--lr-step-size")) {
        if (!ex_parse_int(val, 1, &f->lr_step_size))
            return ex_usage_error("--lr-step-size needs an integer >= 1, not '%s'", val);
    } else if (!strcmp(name, "--lr-gamma")) {
        if (!ex_parse_real(val, &f->lr_gamma))
            return ex_usage_error("--lr-gamma needs a finite number >= 0, not '%s'", val);
    } else if (!strcmp(name, "--lr")) {
        if (!ex_parse_real(val, &f->lr))
            return ex_usage_error("--lr needs a finite number >= 0, not '%s'", val);
        f->lr_set = true;
    } else if (!strcmp(name, "--momentum")) {
        if (!ex_parse_real(val, &f->momentum))
            return ex_usage_error("--momentum needs a finite number >= 0, not '%s'", val);
        f->momentum_set = true;
    } else if (!strcmp(name, "--weight-decay")) {
        if (!ex_parse_real(val, &f->weight_decay))
            return ex_usage_error("--weight-decay needs a finite number >= 0, not '%s'", val);
        f->weight_decay_set = true;
    } else if (!strcmp(name, "--init")) {
        f->init_path = val;
    } else if (!strcmp(name, "--save")) {
        f->save_path = val;
    } else if (!strcmp(name, "--amp")) {
        if (!strcmp(val, "none"))
            f->amp = LOOM_DTYPE_F32;
        else if (!strcmp(val, "bf16"))
            f->amp = LOOM_DTYPE_BF16;
        else if (!strcmp(val, "f16"))
            f->amp = LOOM_DTYPE_F16;
        else
            return ex_usage_error("--amp must be none, bf16 or f16, not '%s'", val);
    } else if (!strcmp(name, "--loss-scale")) {
        if (!strcmp(val, "dynamic"))
            f->loss_scale = EX_LS_DYNAMIC;
        else if (!strcmp(val, "off"))
            f->loss_scale = EX_LS_OFF;
        else if (ex_parse_real(val, &f->loss_scale_value) && f->loss_scale_value > 0 &&
                 f->loss_scale_value <= 3.4e38)
            f->loss_scale = EX_LS_STATIC;
        else
            return ex_usage_error("--loss-scale must be dynamic, off or a number > 0 that f32 "
                                  "holds, not '%s'",
                                  val);
    }
    return 0;
}

int ex_parse_args(int argc, char **argv, const ex_cli *cli, ex_flags *f) {
    *f = (ex_flags){.epochs = 1,
                    .batch_size = cli->default_batch > 0 ? cli->default_batch : 64,
                    .optimizer = LOOM_OPTIM_SGD,
                    .shuffle = true,
                    .lr_step_size = 30,
                    .lr_gamma = 0.1,
                    .amp = LOOM_DTYPE_F32};
    static const char *const common_valued[] = {"--epochs",       "--batch-size",
                                                "--lr",           "--optimizer",
                                                "--momentum",     "--seed",
                                                "--init",         "--save",
                                                "--weight-decay", "--log-every",
                                                "--amp",          "--lr-schedule",
                                                "--loss-scale",   NULL};
    static const char *const step_lr_valued[] = {"--lr-step-size", "--lr-gamma", NULL};
    bool has_step = strstr(cli->lr_schedules, "step") != NULL;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            if (loom_dist_rank() == 0)
                cli->usage(stdout);
            return 0;
        }
        if (!strcmp(arg, "--no-shuffle")) {
            f->shuffle = false;
            continue;
        }
        if (!strcmp(arg, "--eager")) {
            f->eager = true;
            continue;
        }
        if (!strcmp(arg, "--json")) {
            f->json = true;
            continue;
        }
        if (listed(cli->switches, arg)) {
            int rc = cli->on_option(cli->ud, arg, NULL);
            if (rc)
                return rc;
            continue;
        }
        /* The rest take a value: "--flag value" or "--flag=value". */
        char name[32];
        const char *val = NULL;
        const char *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) != 0)
            return ex_usage_error("unexpected argument '%s'", arg);
        if (eq) {
            size_t len = (size_t)(eq - arg);
            if (len >= sizeof name)
                return ex_usage_error("unknown option '%s'", arg);
            memcpy(name, arg, len);
            name[len] = '\0';
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg);
        }
        bool common = listed(common_valued, name) || !strcmp(name, cli->steps_flag) ||
                      (has_step && listed(step_lr_valued, name));
        if (!common && !listed(cli->valued, name))
            return ex_usage_error("unknown option '%s'", arg);
        if (!val) {
            if (i + 1 >= argc)
                return ex_usage_error("%s needs a value", name);
            val = argv[++i];
        }
        int rc = common ? common_option(cli, f, name, val) : cli->on_option(cli->ud, name, val);
        if (rc)
            return rc;
    }
    if (f->loss_scale == EX_LS_DEFAULT)
        f->loss_scale = f->amp == LOOM_DTYPE_F16 ? EX_LS_DYNAMIC : EX_LS_OFF;
    if (f->momentum_set && f->optimizer != LOOM_OPTIM_SGD)
        return ex_usage_error("--momentum applies to --optimizer sgd only");
    f->rank = loom_dist_rank();
    f->world = loom_dist_world_size();
    if (f->save_path && f->rank == 0 && !ex_save_path_ok(f->save_path))
        return 1; /* found now, not after the training it would have lost */
    if (f->batch_size % f->world != 0)
        return ex_usage_error("--batch-size %lld is the global batch, split evenly over the %d "
                              "ranks: it must be a multiple of %d",
                              (long long)f->batch_size, (int)f->world, (int)f->world);
    return -1;
}

void ex_flags_defaults(ex_flags *f, double sgd_lr, double sgd_wd) {
    bool sgd = f->optimizer == LOOM_OPTIM_SGD;
    if (!f->lr_set)
        f->lr = sgd ? sgd_lr : 0.001;
    if (!f->momentum_set)
        f->momentum = sgd ? 0.9 : 0.0;
    if (!f->weight_decay_set)
        f->weight_decay = f->optimizer == LOOM_OPTIM_ADAMW ? 0.01 : sgd_wd;
}

bool ex_begin(const char *prog) {
    ex_prog = prog;
    if (loom_dist_init(NULL) != LOOM_OK) {
        fprintf(stderr, "%s: cannot join the job: %s\n", prog, loom_dist_error_message());
        return false;
    }
    return true;
}

loom_context *ex_context_create(const ex_flags *f, bool *out_eager) {
    loom_context_options co;
    loom_context_options_init(&co);
    co.eager = co.eager || f->eager;
    *out_eager = co.eager;
    loom_context *ctx = NULL;
    loom_status st = loom_context_create(&co, &ctx);
    if (st != LOOM_OK)
        fprintf(stderr, "%scannot create a context: %s\n", ex_who(), loom_status_name(st));
    return ctx;
}

bool ex_save_path_ok(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash == path ? 1 : slash - path) : 1,
             slash ? path : ".");
    struct stat sb;
    const char *why = NULL;
    if (!*path || (slash && !slash[1]))
        why = "names no file";
    else if (stat(dir, &sb) != 0)
        why = errno == ENOENT ? "its folder does not exist" : strerror(errno);
    else if (!S_ISDIR(sb.st_mode))
        why = "its folder is not a folder";
    else if (access(dir, W_OK | X_OK) != 0)
        why = "its folder is not writable";
    else if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        why = "it is a folder";
    if (why)
        fprintf(stderr, "%s--save %s: %s\n", ex_who(), path, why);
    return why == NULL;
}

/* The first float tensor of c holding inf or NaN (a damaged checkpoint, or one saved from a
 * diverged run), named on stderr: 1; else 0. */
static int check_finite(loom_context *ctx, const char *path, const ex_checkpoint *c) {
    for (int32_t i = 0; i < c->n; i++) {
        loom_dtype dt;
        int64_t n;
        if (loom_tensor_dtype(c->list[i].tensor, &dt) != LOOM_OK || dt != LOOM_DTYPE_F32 ||
            loom_tensor_numel(c->list[i].tensor, &n) != LOOM_OK)
            continue;
        float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
        if (!v || loom_tensor_read(ctx, c->list[i].tensor, v, (size_t)n * sizeof *v) != LOOM_OK) {
            free(v);
            return ex_runtime_error(ctx, "--init");
        }
        for (int64_t k = 0; k < n; k++)
            if (!isfinite(v[k])) {
                fprintf(stderr,
                        "%s--init %s: '%s' holds %f at element %lld: the checkpoint is damaged "
                        "or was saved from a run that diverged\n",
                        ex_who(), path, c->list[i].name, (double)v[k], (long long)k);
                free(v);
                return 1;
            }
        free(v);
    }
    return 0;
}

int ex_restore(loom_context *ctx, const ex_flags *f, const ex_checkpoint *c, int32_t n_model) {
    if (f->init_path && f->rank == 0 &&
        (ex_checkpoint_load(ctx, f->init_path, c, n_model) != LOOM_OK ||
         loom_mark_step(ctx) != LOOM_OK))
        return ex_runtime_error(ctx, "--init");
    if (f->init_path && f->rank == 0 && check_finite(ctx, f->init_path, c) != 0)
        return 1;
    if (f->world == 1)
        return 0;
    loom_tensor **state = malloc((size_t)(c->n > 0 ? c->n : 1) * sizeof *state);
    for (int32_t i = 0; state && i < c->n; i++)
        state[i] = c->list[i].tensor;
    loom_status st =
        state ? loom_broadcast_parameters(ctx, c->n, state) : LOOM_STATUS_OUT_OF_MEMORY;
    free(state);
    if (st != LOOM_OK || loom_mark_step(ctx) != LOOM_OK)
        return ex_runtime_error(ctx, "broadcasting rank 0's parameters");
    return 0;
}

void ex_scale_text(loom_context *ctx, const loom_grad_scaler *scaler, char *buf, size_t size) {
    float v;
    snprintf(buf, size, "null");
    if (loom_grad_scaler_is_enabled(scaler) &&
        loom_tensor_read(ctx, loom_grad_scaler_scale_tensor(scaler), &v, sizeof v) == LOOM_OK)
        snprintf(buf, size, "%g", (double)v);
}

const char *ex_who(void) {
    static char buf[96];
    if (loom_dist_world_size() == 1)
        snprintf(buf, sizeof buf, "%s: ", ex_prog);
    else
        snprintf(buf, sizeof buf, "%s (rank %d of %d): ", ex_prog, (int)loom_dist_rank(),
                 (int)loom_dist_world_size());
    return buf;
}

int ex_runtime_error(loom_context *ctx, const char *what) {
    fprintf(stderr, "%s%s: %s\n", ex_who(), what,
            ctx && loom_context_error(ctx) != LOOM_OK ? loom_context_error_message(ctx)
                                                      : "unknown error");
    return 1;
}

/* After a runtime error on several ranks MPI is not finalized: another rank may be waiting
 * in a collective, and MPICH's MPI_Finalize would wait for it (up to LOOM_DIST_TIMEOUT_S);
 * exiting non-zero instead makes mpiexec end the job. */
int ex_leave(int rc) {
    if (rc == 1 && loom_dist_world_size() > 1)
        return rc;
    if (loom_dist_finalize() != LOOM_OK) {
        fprintf(stderr, "%sfinalize: %s\n", ex_who(), loom_dist_error_message());
        return rc ? rc : 1;
    }
    return rc;
}

void ex_print_chunk(const char *chunk, size_t len, void *ud) {
    fwrite(chunk, 1, len, (FILE *)ud);
}

double ex_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *ex_amp_name(loom_dtype amp) {
    return amp == LOOM_DTYPE_F32 ? "none" : loom_dtype_name(amp);
}

int64_t ex_optimizer_steps(loom_context *ctx, const loom_optim *opt) {
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

int ex_take_loss(loom_context *ctx, const ex_flags *f, loom_tensor **loss, int64_t step,
                 void (*before_print)(void *ud), void *ud, double *out) {
    float v;
    if (loom_tensor_read(ctx, *loss, &v, sizeof v) != LOOM_OK)
        return ex_runtime_error(ctx, "reading the loss");
    loom_tensor_release(*loss);
    *loss = NULL;
    bool print = !isfinite(v) || (f->log_every && step % f->log_every == 0);
    if (print && before_print)
        before_print(ud);
    if (!isfinite(v)) {
        if (f->rank == 0) /* the same mean loss on every rank */
            fprintf(stderr,
                    "%s: the loss became %f at step %lld: the training diverged (the labels "
                    "were in range and the initial weights finite); try a smaller --lr\n",
                    ex_prog, (double)v, (long long)step);
        return 1;
    }
    if (print && f->rank == 0) {
        printf("step=%lld loss=%.6f\n", (long long)step, (double)v);
        fflush(stdout);
    }
    *out = v;
    return 0;
}

double ex_lr_at(const ex_flags *f, int64_t step, int64_t total) {
    switch (f->lr_schedule) {
    case EX_LR_COSINE: /* CosineAnnealingLR with T_max = total steps, stepped per batch */
        return 0.5 * f->lr * (1 + cos(3.14159265358979323846 * (double)step / (double)total));
    case EX_LR_STEP: /* StepLR(step_size, gamma), stepped per batch */
        return f->lr * pow(f->lr_gamma, (double)(step / f->lr_step_size));
    default: return f->lr;
    }
}

loom_status ex_grad_scaler_create(loom_context *ctx, const ex_flags *f, loom_grad_scaler **out) {
    loom_grad_scaler_options so;
    loom_grad_scaler_options_init(&so);
    so.enabled = f->loss_scale != EX_LS_OFF;
    if (f->loss_scale == EX_LS_STATIC)
        so.init_scale = f->loss_scale_value;
    return loom_grad_scaler_create(ctx, &so, out);
}

void ex_train_step_record(loom_context *ctx, loom_tensor *loss, int32_t n_params,
                          loom_tensor *const *params, loom_optim *opt, const model_amp *amp,
                          loom_tensor **out_loss) {
    loom_grad_scaler *scaler = amp ? amp->scaler : NULL;
    loom_tensor **grads = calloc((size_t)n_params, sizeof *grads);
    /* the gradients carry their forward nodes' scopes; the rest is named here */
    loom_tensor *scaled = loom_grad_scaler_is_enabled(scaler)
                              ? EX_SCOPED(ctx, "scaler", loom_grad_scaler_scale(scaler, loss))
                              : loss;
    if (grads && scaled && loom_backward(ctx, scaled, n_params, params, grads) == LOOM_OK) {
        loom_scope_push(ctx, "ddp");
        loom_status st = loom_allreduce_gradients(ctx, n_params, grads);
        loom_scope_pop(ctx);
        loom_tensor *found_inf =
            st == LOOM_OK && loom_grad_scaler_is_enabled(scaler)
                ? EX_SCOPED(ctx, "scaler", loom_grad_scaler_unscale(scaler, n_params, grads))
                : NULL;
        loom_scope_push(ctx, "optimizer");
        if (st == LOOM_OK) /* a skipped step (found_inf) leaves everything as it was */
            st = loom_optim_step(opt, grads, found_inf);
        loom_scope_pop(ctx);
        if (st == LOOM_OK && found_inf && !amp->static_scale) {
            loom_scope_push(ctx, "scaler");
            loom_grad_scaler_update(scaler, found_inf);
            loom_scope_pop(ctx);
        }
    }
    free(grads);
    int32_t world = loom_dist_world_size();
    if (out_loss && world > 1)
        loss = loom_all_reduce(ctx, loss, LOOM_REDUCE_SUM, 1.0 / world);
    if (out_loss) {
        loom_tensor_retain(loss);
        *out_loss = loss;
    }
}

loom_status ex_train_step_finish(loom_context *ctx, loom_tensor *loss, int32_t n_params,
                                 loom_tensor *const *params, loom_optim *opt, const model_amp *amp,
                                 loom_tensor **out_loss) {
    ex_train_step_record(ctx, loss, n_params, params, opt, amp, out_loss);
    return loom_mark_step(ctx);
}

loom_status ex_checkpoint_init(ex_checkpoint *c, int32_t n_model, const loom_named_tensor *model,
                               const loom_optim *opt, int32_t n_params,
                               const loom_grad_scaler *scaler) {
    int32_t cap = n_model + (opt ? 2 * n_params + 1 : 0) + LOOM_GRAD_SCALER_STATE_MAX;
    *c = (ex_checkpoint){0};
    c->list = calloc((size_t)cap, sizeof *c->list);
    c->names = calloc((size_t)cap, sizeof *c->names);
    if (!c->list || !c->names) {
        ex_checkpoint_deinit(c);
        return LOOM_STATUS_OUT_OF_MEMORY;
    }
    for (int32_t i = 0; i < n_model; i++)
        c->list[c->n++] = model[i];
    loom_tensor *step = NULL;
    for (int32_t p = 0; opt && p < n_params; p++) {
        const char *keys[4];
        loom_tensor *state[4];
        int32_t k = loom_optim_state(opt, p, keys, state);
        for (int32_t j = 0; j < k; j++) {
            if (!strcmp(keys[j], "step")) { /* one counter shared by every parameter */
                step = state[j];
                continue;
            }
            snprintf(c->names[c->n], sizeof *c->names, "optimizer.state.%d.%s", (int)p, keys[j]);
            c->list[c->n] = (loom_named_tensor){c->names[c->n], state[j]};
            c->n++;
        }
    }
    if (step)
        c->list[c->n++] = (loom_named_tensor){"optimizer.step", step};
    const char *keys[LOOM_GRAD_SCALER_STATE_MAX];
    loom_tensor *state[LOOM_GRAD_SCALER_STATE_MAX];
    int32_t k = loom_grad_scaler_state(scaler, keys, state);
    for (int32_t i = 0; i < k; i++) {
        snprintf(c->names[c->n], sizeof *c->names, "scaler.%s", keys[i]);
        c->list[c->n] = (loom_named_tensor){c->names[c->n], state[i]};
        c->n++;
    }
    return LOOM_OK;
}

void ex_checkpoint_deinit(ex_checkpoint *c) {
    free(c->list);
    free(c->names);
    *c = (ex_checkpoint){0};
}

loom_status ex_checkpoint_load(loom_context *ctx, const char *path, const ex_checkpoint *c,
                               int32_t n_model) {
    char err[256];
    loom_safetensors *f = NULL;
    if (loom_safetensors_open(path, &f, err, sizeof err) != LOOM_OK) /* load reports it */
        return loom_safetensors_load(ctx, path, c->n, c->list, true);
    bool file_optim = loom_safetensors_find(f, "optimizer.step") >= 0;
    bool file_scaler = loom_safetensors_find(f, "scaler.scale") >= 0;
    /* The file's optimizer and scaler entries, to match against this run's. */
    int32_t file_n[2] = {0, 0}, run_n[2] = {0, 0};
    for (int32_t i = 0; i < loom_safetensors_count(f); i++) {
        const char *name = NULL;
        loom_safetensors_tensor(f, i, &name, NULL, NULL, NULL, NULL, NULL);
        if (!strncmp(name, "optimizer.", 10))
            file_n[0]++;
        else if (!strncmp(name, "scaler.", 7))
            file_n[1]++;
    }
    /* A group is loaded when this run has it and the file holds exactly its names. */
    bool run_optim = false, run_scaler = false, optim_all = true, scaler_all = true;
    for (int32_t i = n_model; i < c->n; i++) {
        bool is_scaler = !strncmp(c->list[i].name, "scaler.", 7);
        bool found = loom_safetensors_find(f, c->list[i].name) >= 0;
        run_n[is_scaler]++;
        if (is_scaler) {
            run_scaler = true;
            scaler_all &= found;
        } else {
            run_optim = true;
            optim_all &= found;
        }
    }
    loom_safetensors_close(f);
    bool with_optim = file_optim && run_optim && optim_all && file_n[0] == run_n[0];
    bool with_scaler = file_scaler && run_scaler && scaler_all && file_n[1] == run_n[1];
    if (file_scaler && !with_scaler)
        fprintf(stderr, "%snote: --init %s: ignoring its loss scaler state (%s)\n", ex_who(), path,
                run_scaler ? "another kind" : "no loss scaling in this run");
    if (file_optim && !with_optim)
        fprintf(stderr, "%snote: --init %s: ignoring its optimizer state (%s)\n", ex_who(), path,
                run_optim ? "another optimizer" : "not used by this run");
    loom_named_tensor *list = malloc((size_t)(c->n > 0 ? c->n : 1) * sizeof *list);
    if (!list)
        return LOOM_STATUS_OUT_OF_MEMORY;
    int32_t n = 0;
    for (int32_t i = 0; i < c->n; i++) {
        bool is_scaler = !strncmp(c->list[i].name, "scaler.", 7);
        if (i < n_model || (is_scaler ? with_scaler : with_optim))
            list[n++] = c->list[i];
    }
    bool strict = (!file_scaler || with_scaler) && (!file_optim || with_optim);
    loom_status st = loom_safetensors_load(ctx, path, n, list, strict);
    free(list);
    return st;
}
