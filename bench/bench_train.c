/* Training throughput, Loom's side of the PyTorch comparison (bench/torch_train.py --bench):
 * the Fashion-MNIST example's MLP at batch 64 and 256 and its CNN at batch 64 on synthetic
 * in-memory data; samples/s compiled (median of timed runs after warm-up) and on the
 * reference interpreter, first-step and compile time, peak device memory. Under
 * `mpiexec -n R` it trains data-parallel (bench/run_dp_bench.sh): each rank takes its 1/R of
 * the same global batch, gradients are all-reduced before the update, rank 0 reports global
 * samples/s. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <loom/nn.h>
#include <loom/optim.h>

#include "bench_util.h"
#include "../examples/fashion_models.h"

typedef struct config {
    const char *name;
    bool cnn;
    int64_t batch;
} config;

static const config configs[] = {{"mlp64", false, 64}, {"mlp256", false, 256}, {"cnn64", true, 64}};
enum { N_CONFIGS = sizeof configs / sizeof *configs };

typedef struct args {
    int32_t threads;
    int32_t rank, world; /* loom_dist_*: 0 of 1 without mpiexec */
    int runs, steps, warmup, interp_steps;
    bool best, json;
    const char *optimizer;
    loom_dtype amp; /* LOOM_DTYPE_F32: none */
    bool selected[N_CONFIGS];
} args;

typedef struct result {
    double samples_per_sec, first_step_ms, compile_ms, first_loss;
    double collective_ms_per_step; /* CollectiveTime over the timed steps (overlap included) */
    size_t peak_device_bytes;
    int64_t kernels;
} result;

static int fail(loom_context *ctx, const char *cfg, const char *what) {
    char who[48] = "";
    if (loom_dist_world_size() > 1)
        snprintf(who, sizeof who, " (rank %d of %d)", (int)loom_dist_rank(),
                 (int)loom_dist_world_size());
    fprintf(stderr, "bench_train%s: %s: %s: %s\n", who, cfg, what,
            ctx ? loom_context_error_message(ctx) : "cannot create a context");
    return 1;
}

/* *out = the wall clock once ctx's steps have finished and every rank has reached this point
 * (after a barrier when there are several): a run timed between two such points on rank 0
 * ends with the slowest rank. The steps finish first because the barrier must not race a
 * step's collectives on the stream thread: MPI needs them in the same order on every rank.
 * false on failure (reported). */
static bool synced_now(loom_context *ctx, const config *c, const args *a, double *out) {
    if (loom_context_sync(ctx) != LOOM_OK) {
        fail(ctx, c->name, "step");
        return false;
    }
    if (a->world > 1 && loom_dist_barrier() != LOOM_OK) {
        fprintf(stderr, "bench_train (rank %d of %d): barrier: %s\n", (int)a->rank, (int)a->world,
                loom_dist_error_message());
        return false;
    }
    *out = bench_now();
    return true;
}

/* Measures one configuration on a fresh context (so its peak memory is its own; no disk
 * cache, so the first step really compiles). steps == 0 asks for the interpreter run: one
 * step at a time, a median of a.interp_steps. On several ranks each rank trains on its
 * rows of the global batch, from rank 0's parameters; samples/s count the global batch. */
static int measure(const args *a, const config *c, bool eager, result *r) {
    *r = (result){0};
    loom_context *ctx = bench_context(eager, "", a->threads);
    if (!ctx)
        return fail(NULL, c->name, "context");
    int rc = 1;
    model m = {0};
    loom_tensor *params[MAX_PARAMS];
    loom_optim *opt = NULL;
    loom_grad_scaler *scaler = NULL;
    const int64_t b = c->batch, rb = b / a->world; /* global and per-rank batch */
    float *xs = malloc(sizeof(float) * (size_t)(b * 784));
    int64_t *ys = malloc(sizeof(int64_t) * (size_t)b);
    double *t = malloc(sizeof(double) * (size_t)(a->runs + a->interp_steps + 1));
    if (!xs || !ys || !t) {
        fprintf(stderr, "bench_train: out of memory\n");
        goto out;
    }
    /* Normal-ish pixels (sum of uniforms) and uniform labels: a fixed batch, as the PyTorch
     * side's torch.randn batch. */
    uint64_t s = 0x9E3779B97F4A7C15u;
    for (int64_t i = 0; i < b * 784; i++) {
        double v = 0;
        for (int k = 0; k < 4; k++) {
            s = s * 6364136223846793005u + 1442695040888963407u;
            v += (double)(s >> 11) / 9007199254740992.0;
        }
        xs[i] = (float)((v - 2.0) * 1.7320508);
    }
    for (int64_t i = 0; i < b; i++) {
        s = s * 6364136223846793005u + 1442695040888963407u;
        ys[i] = (int64_t)((s >> 33) % 10);
    }
    if (model_init(ctx, &m, c->cnn ? MODEL_CNN : MODEL_MLP, 28, 28, 0) != LOOM_OK) {
        rc = fail(ctx, c->name, "model");
        goto out;
    }
    model_tensors(&m, params);
    /* DDP's start: every rank begins from rank 0's weights (a step of its own, so the training
     * step's graph is the same from the first batch on). */
    if (a->world > 1 && (loom_broadcast_parameters(ctx, m.n_params, params) != LOOM_OK ||
                         loom_mark_step(ctx) != LOOM_OK)) {
        rc = fail(ctx, c->name, "parameter broadcast");
        goto out;
    }
    /* This rank's rows of the global batch. */
    const float *rxs = xs + a->rank * rb * 784;
    const int64_t *rys = ys + a->rank * rb;
    loom_optim_kind kind = !strcmp(a->optimizer, "adam")    ? LOOM_OPTIM_ADAM
                           : !strcmp(a->optimizer, "adamw") ? LOOM_OPTIM_ADAMW
                                                            : LOOM_OPTIM_SGD;
    loom_optim_options oo;
    loom_optim_options_init(&oo, kind);
    oo.lr = kind == LOOM_OPTIM_SGD ? 0.01 : 0.001;
    if (kind == LOOM_OPTIM_SGD)
        oo.momentum = 0.9;
    if (loom_optim_create(ctx, &oo, m.n_params, params, &opt) != LOOM_OK) {
        rc = fail(ctx, c->name, "optimizer");
        goto out;
    }
    /* AMP as the example runs it: f16 with PyTorch's dynamic loss scale, bf16 without. */
    loom_grad_scaler_options so;
    loom_grad_scaler_options_init(&so);
    so.enabled = a->amp == LOOM_DTYPE_F16;
    if (loom_grad_scaler_create(ctx, &so, &scaler) != LOOM_OK) {
        rc = fail(ctx, c->name, "loss scaler");
        goto out;
    }
    model_amp amp = {.dtype = a->amp, .scaler = scaler};

    /* First step: trace, compile (CompileTime), run; its loss checks the setup. */
    loom_tensor *loss = NULL;
    double t0, t1;
    if (!synced_now(ctx, c, a, &t0))
        goto out;
    if (model_train_step(ctx, &m, params, opt, &amp, rxs, rys, rb, &loss) != LOOM_OK ||
        loom_context_sync(ctx) != LOOM_OK) {
        loom_tensor_release(loss);
        rc = fail(ctx, c->name, "first step");
        goto out;
    }
    if (!synced_now(ctx, c, a, &t1))
        goto out;
    r->first_step_ms = (t1 - t0) * 1e3;
    float l0 = NAN;
    loom_tensor_read(ctx, loss, &l0, sizeof l0);
    loom_tensor_release(loss);
    r->first_loss = l0;
    r->compile_ms = (double)loom_metric_total(ctx, "CompileTime") / 1e6;
    r->kernels = loom_metric_total(ctx, "KernelsPerGraph");

    int samples;
    if (eager) {
        /* The interpreter runs each step on this thread: time them one by one. */
        for (samples = 0; samples < a->interp_steps; samples++) {
            if (!synced_now(ctx, c, a, &t0))
                goto out;
            if (model_train_step(ctx, &m, params, opt, &amp, rxs, rys, rb, NULL) != LOOM_OK ||
                loom_context_sync(ctx) != LOOM_OK) {
                rc = fail(ctx, c->name, "interpreter step");
                goto out;
            }
            if (!synced_now(ctx, c, a, &t1))
                goto out;
            t[samples] = (double)b / (t1 - t0);
        }
    } else {
        for (int i = 0; i < a->warmup; i++) {
            if (model_train_step(ctx, &m, params, opt, &amp, rxs, rys, rb, NULL) != LOOM_OK) {
                rc = fail(ctx, c->name, "warm-up step");
                goto out;
            }
        }
        /* Runs of back-to-back asynchronous steps, as a training loop issues them: the host
         * traces step n+1 while the device runs step n. */
        if (loom_context_sync(ctx) != LOOM_OK) {
            rc = fail(ctx, c->name, "warm-up step");
            goto out;
        }
        int64_t coll_ns = loom_metric_total(ctx, "CollectiveTime");
        for (samples = 0; samples < a->runs; samples++) {
            if (!synced_now(ctx, c, a, &t0))
                goto out;
            for (int i = 0; i < a->steps; i++) {
                if (model_train_step(ctx, &m, params, opt, &amp, rxs, rys, rb, NULL) != LOOM_OK) {
                    rc = fail(ctx, c->name, "step");
                    goto out;
                }
            }
            if (!synced_now(ctx, c, a, &t1))
                goto out;
            t[samples] = (double)(a->steps * b) / (t1 - t0);
        }
        r->collective_ms_per_step = (double)(loom_metric_total(ctx, "CollectiveTime") - coll_ns) /
                                    1e6 / (a->runs * a->steps);
    }
    if (a->best) {
        r->samples_per_sec = 0;
        for (int i = 0; i < samples; i++)
            r->samples_per_sec = t[i] > r->samples_per_sec ? t[i] : r->samples_per_sec;
    } else {
        r->samples_per_sec = samples > 0 ? bench_median(t, samples) : 0;
    }
    size_t cur = 0;
    loom_device_memory(ctx, &cur, &r->peak_device_bytes);
    rc = 0;
out:
    loom_grad_scaler_destroy(scaler);
    loom_optim_destroy(opt);
    model_deinit(&m);
    loom_context_destroy(ctx);
    free(t);
    free(ys);
    free(xs);
    return rc;
}

static void usage(FILE *f) {
    fprintf(f, "Usage: bench_train [--threads N] [--runs N] [--steps N] [--warmup N]\n"
               "                   [--interp-steps N] [--config mlp64,mlp256,cnn64]\n"
               "                   [--optimizer sgd|adam|adamw] [--amp none|bf16|f16] [--best]\n"
               "                   [--json]\n"
               "  --threads N       device threads (default LOOM_NUM_THREADS, else all cores)\n"
               "  --runs N          timed runs, the median is reported (default 7)\n"
               "  --steps N         back-to-back steps per timed run (default 20)\n"
               "  --warmup N        untimed steps after the first (default 20)\n"
               "  --interp-steps N  steps on the reference interpreter (default 2; 0: skip)\n"
               "  --config LIST     which configurations (default all)\n"
               "  --optimizer K     sgd (lr 0.01, momentum 0.9; default), adam or adamw (lr 1e-3)\n"
               "  --amp M           mixed precision as the example's --amp: bf16, or f16 with a\n"
               "                    dynamic loss scale (default none)\n"
               "  --best            report the best run rather than the median (noisy machines)\n"
               "  --json            one JSON line per configuration instead of the table\n"
               "Data parallel: `mpiexec -n R bench_train ...` runs R ranks (default threads:\n"
               "LOOM_NUM_THREADS, else cores / ranks on this machine); each takes 1/R of the\n"
               "configuration's batch (the global batch, which R must divide), gradients are\n"
               "all-reduced (loom_allreduce_gradients), rank 0 prints global samples/s timed\n"
               "between barriers.\n");
}

/* A usage error: every rank finds it, rank 0 reports it. Returns the exit status 2. */
__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...) {
    if (loom_dist_rank() == 0) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "bench_train: ");
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, " (--help for usage)\n");
        va_end(ap);
    }
    return 2;
}

static bool int_arg(const char *s, int lo, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > 1000000)
        return false;
    *out = (int)v;
    return true;
}

static int parse(int argc, char **argv, args *a) {
    *a = (args){.runs = 7, .steps = 20, .warmup = 20, .interp_steps = 2, .optimizer = "sgd"};
    a->rank = loom_dist_rank();
    a->world = loom_dist_world_size();
    /* As a context's default: the cores shared by this machine's ranks. */
    const char *env = getenv("LOOM_NUM_THREADS");
    long cores = sysconf(_SC_NPROCESSORS_ONLN) / loom_dist_local_size();
    a->threads = env && atoi(env) > 0 ? atoi(env) : cores > 0 ? (int32_t)cores : 1;
    bool any = false;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int n;
        if (!strcmp(f, "--help")) {
            if (a->rank == 0)
                usage(stdout);
            return 0;
        } else if (!strcmp(f, "--best")) {
            a->best = true;
        } else if (!strcmp(f, "--json")) {
            a->json = true;
        } else if (!v) {
            return usage_error("unknown option or missing value: %s", f);
        } else if (!strcmp(f, "--threads") && int_arg(v, 1, &n)) {
            a->threads = n, i++;
        } else if (!strcmp(f, "--runs") && int_arg(v, 1, &n)) {
            a->runs = n, i++;
        } else if (!strcmp(f, "--steps") && int_arg(v, 1, &n)) {
            a->steps = n, i++;
        } else if (!strcmp(f, "--warmup") && int_arg(v, 0, &n)) {
            a->warmup = n, i++;
        } else if (!strcmp(f, "--interp-steps") && int_arg(v, 0, &n)) {
            a->interp_steps = n, i++;
        } else if (!strcmp(f, "--optimizer") &&
                   (!strcmp(v, "sgd") || !strcmp(v, "adam") || !strcmp(v, "adamw"))) {
            a->optimizer = v, i++;
        } else if (!strcmp(f, "--amp") &&
                   (!strcmp(v, "none") || !strcmp(v, "bf16") || !strcmp(v, "f16"))) {
            a->amp = !strcmp(v, "bf16")  ? LOOM_DTYPE_BF16
                     : !strcmp(v, "f16") ? LOOM_DTYPE_F16
                                         : LOOM_DTYPE_F32;
            i++;
        } else if (!strcmp(f, "--config")) {
            char buf[128];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
                 tok = strtok_r(NULL, ",", &save)) {
                int k = 0;
                while (k < N_CONFIGS && strcmp(tok, configs[k].name))
                    k++;
                if (k == N_CONFIGS)
                    return usage_error("unknown config '%s' (mlp64, mlp256, cnn64)", tok);
                a->selected[k] = any = true;
            }
            i++;
        } else {
            return usage_error("bad option or value: %s %s", f, v);
        }
    }
    for (int k = 0; k < N_CONFIGS; k++) {
        a->selected[k] = a->selected[k] || !any;
        if (a->selected[k] && configs[k].batch % a->world != 0)
            return usage_error("%s: its batch %lld is not a multiple of the %d ranks",
                               configs[k].name, (long long)configs[k].batch, (int)a->world);
    }
    return -1;
}

/* Leaves the job with status rc. After a failure on several ranks MPI is not finalized
 * (another rank may wait in a collective): exiting non-zero makes mpiexec end the job. */
static int leave(int rc) {
    if (rc == 1 && loom_dist_world_size() > 1)
        return rc;
    if (loom_dist_finalize() != LOOM_OK) {
        fprintf(stderr, "bench_train: finalize: %s\n", loom_dist_error_message());
        return 1;
    }
    return rc;
}

int main(int argc, char **argv) {
    /* Rank and world size from mpiexec's environment; rank 0 of 1 without it. */
    if (loom_dist_init(NULL) != LOOM_OK) {
        fprintf(stderr, "bench_train: cannot join the job: %s\n", loom_dist_error_message());
        return 1;
    }
    args a;
    int rc = parse(argc, argv, &a);
    if (rc >= 0)
        return leave(rc);
    /* Threads as "2", or ranks x threads as "2x1" on several ranks. */
    char threads[32];
    if (a.world > 1)
        snprintf(threads, sizeof threads, "%dx%d", (int)a.world, (int)a.threads);
    else
        snprintf(threads, sizeof threads, "%d", (int)a.threads);
    if (!a.json && a.rank == 0)
        printf("%-7s %5s %7s %12s %9s %12s %11s %10s %9s %12s %8s\n", "config", "batch", "threads",
               "samples/s", "step ms", "1st step ms", "compile ms", "kernels", "peak MB",
               "interp s/s", "vs interp");
    for (int k = 0; k < N_CONFIGS; k++) {
        if (!a.selected[k])
            continue;
        const config *c = &configs[k];
        result jit, interp = {0};
        if (measure(&a, c, false, &jit) != 0)
            return leave(1);
        if (a.interp_steps > 0 && measure(&a, c, true, &interp) != 0)
            return leave(1);
        if (a.rank != 0) {
            continue;
        } else if (a.json) {
            printf("{\"side\":\"loom\",\"config\":\"%s\",\"model\":\"%s\",\"batch\":%lld,"
                   "\"threads\":%d,\"world_size\":%d,\"batch_per_rank\":%lld,"
                   "\"optimizer\":\"%s\",\"amp\":\"%s\",\"samples_per_sec\":%.1f,"
                   "\"step_ms\":%.3f,\"first_step_ms\":%.2f,\"compile_ms\":%.2f,"
                   "\"kernels\":%lld,\"first_loss\":%.6f,\"peak_device_memory_bytes\":%zu,"
                   "\"collective_ms_per_step\":%.3f,\"interp_samples_per_sec\":%.2f}\n",
                   c->name, c->cnn ? "cnn" : "mlp", (long long)c->batch, (int)a.threads,
                   (int)a.world, (long long)(c->batch / a.world), a.optimizer,
                   a.amp == LOOM_DTYPE_F32 ? "none" : loom_dtype_name(a.amp), jit.samples_per_sec,
                   1e3 * (double)c->batch / jit.samples_per_sec, jit.first_step_ms, jit.compile_ms,
                   (long long)jit.kernels, jit.first_loss, jit.peak_device_bytes,
                   jit.collective_ms_per_step, interp.samples_per_sec);
        } else {
            char ip[32] = "-", ratio[32] = "-";
            if (a.interp_steps > 0) {
                snprintf(ip, sizeof ip, "%.1f", interp.samples_per_sec);
                snprintf(ratio, sizeof ratio, "%.0fx",
                         interp.samples_per_sec > 0 ? jit.samples_per_sec / interp.samples_per_sec
                                                    : 0.0);
            }
            printf("%-7s %5lld %7s %12.1f %9.3f %12.1f %11.1f %10lld %9.1f %12s %8s\n", c->name,
                   (long long)c->batch, threads, jit.samples_per_sec,
                   1e3 * (double)c->batch / jit.samples_per_sec, jit.first_step_ms, jit.compile_ms,
                   (long long)jit.kernels, (double)jit.peak_device_bytes / 1e6, ip, ratio);
        }
        fflush(stdout);
    }
    return leave(0);
}
