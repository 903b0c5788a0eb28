/* Training throughput, Loom's side of the PyTorch comparison (bench/torch_train.py --bench):
 * the Fashion-MNIST example's MLP at batch 64 and 256 and its CNN at batch 64 on synthetic
 * in-memory data; samples/s compiled (median of timed runs after warm-up) and on the
 * reference interpreter, first-step and compile time, peak device memory. */
#include <errno.h>
#include <math.h>
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
    int runs, steps, warmup, interp_steps;
    bool best, json;
    const char *optimizer;
    loom_dtype amp; /* LOOM_DTYPE_F32: none */
    bool selected[N_CONFIGS];
} args;

typedef struct result {
    double samples_per_sec, first_step_ms, compile_ms, first_loss;
    size_t peak_device_bytes;
    int64_t kernels;
} result;

static int fail(loom_context *ctx, const char *cfg, const char *what) {
    fprintf(stderr, "bench_train: %s: %s: %s\n", cfg, what,
            ctx ? loom_context_error_message(ctx) : "cannot create a context");
    return 1;
}

/* Measures one configuration on a fresh context (so its peak memory is its own; no disk
 * cache, so the first step really compiles). steps == 0 asks for the interpreter run: one
 * step at a time, a median of a.interp_steps. */
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
    const int64_t b = c->batch;
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
    double t0 = bench_now();
    if (model_train_step(ctx, &m, params, opt, &amp, xs, ys, b, &loss) != LOOM_OK ||
        loom_context_sync(ctx) != LOOM_OK) {
        loom_tensor_release(loss);
        rc = fail(ctx, c->name, "first step");
        goto out;
    }
    r->first_step_ms = (bench_now() - t0) * 1e3;
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
            t0 = bench_now();
            if (model_train_step(ctx, &m, params, opt, &amp, xs, ys, b, NULL) != LOOM_OK ||
                loom_context_sync(ctx) != LOOM_OK) {
                rc = fail(ctx, c->name, "interpreter step");
                goto out;
            }
            t[samples] = (double)b / (bench_now() - t0);
        }
    } else {
        for (int i = 0; i < a->warmup; i++) {
            if (model_train_step(ctx, &m, params, opt, &amp, xs, ys, b, NULL) != LOOM_OK) {
                rc = fail(ctx, c->name, "warm-up step");
                goto out;
            }
        }
        /* Runs of back-to-back asynchronous steps, as a training loop issues them: the host
         * traces step n+1 while the device runs step n. */
        for (samples = 0; samples < a->runs; samples++) {
            if (loom_context_sync(ctx) != LOOM_OK) {
                rc = fail(ctx, c->name, "step");
                goto out;
            }
            t0 = bench_now();
            for (int i = 0; i < a->steps; i++) {
                if (model_train_step(ctx, &m, params, opt, &amp, xs, ys, b, NULL) != LOOM_OK) {
                    rc = fail(ctx, c->name, "step");
                    goto out;
                }
            }
            if (loom_context_sync(ctx) != LOOM_OK) {
                rc = fail(ctx, c->name, "step");
                goto out;
            }
            t[samples] = (double)(a->steps * b) / (bench_now() - t0);
        }
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
               "  --json            one JSON line per configuration instead of the table\n");
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
    const char *env = getenv("LOOM_NUM_THREADS");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    a->threads = env && atoi(env) > 0 ? atoi(env) : cores > 0 ? (int32_t)cores : 1;
    bool any = false;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int n;
        if (!strcmp(f, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(f, "--best")) {
            a->best = true;
        } else if (!strcmp(f, "--json")) {
            a->json = true;
        } else if (!v) {
            fprintf(stderr, "bench_train: unknown option or missing value: %s\n", f);
            return 2;
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
                if (k == N_CONFIGS) {
                    fprintf(stderr, "bench_train: unknown config '%s' (mlp64, mlp256, cnn64)\n",
                            tok);
                    return 2;
                }
                a->selected[k] = any = true;
            }
            i++;
        } else {
            fprintf(stderr, "bench_train: bad option or value: %s %s\n", f, v);
            return 2;
        }
    }
    if (!any)
        for (int k = 0; k < N_CONFIGS; k++)
            a->selected[k] = true;
    return -1;
}

int main(int argc, char **argv) {
    args a;
    int rc = parse(argc, argv, &a);
    if (rc >= 0)
        return rc;
    if (!a.json)
        printf("%-7s %5s %7s %12s %9s %12s %11s %10s %9s %12s %8s\n", "config", "batch", "threads",
               "samples/s", "step ms", "1st step ms", "compile ms", "kernels", "peak MB",
               "interp s/s", "vs interp");
    for (int k = 0; k < N_CONFIGS; k++) {
        if (!a.selected[k])
            continue;
        const config *c = &configs[k];
        result jit, interp = {0};
        if (measure(&a, c, false, &jit) != 0)
            return 1;
        if (a.interp_steps > 0 && measure(&a, c, true, &interp) != 0)
            return 1;
        if (a.json) {
            printf("{\"side\":\"loom\",\"config\":\"%s\",\"model\":\"%s\",\"batch\":%lld,"
                   "\"threads\":%d,\"optimizer\":\"%s\",\"amp\":\"%s\",\"samples_per_sec\":%.1f,"
                   "\"step_ms\":%.3f,\"first_step_ms\":%.2f,\"compile_ms\":%.2f,"
                   "\"kernels\":%lld,\"first_loss\":%.6f,\"peak_device_memory_bytes\":%zu,"
                   "\"interp_samples_per_sec\":%.2f}\n",
                   c->name, c->cnn ? "cnn" : "mlp", (long long)c->batch, (int)a.threads,
                   a.optimizer, a.amp == LOOM_DTYPE_F32 ? "none" : loom_dtype_name(a.amp),
                   jit.samples_per_sec, 1e3 * (double)c->batch / jit.samples_per_sec,
                   jit.first_step_ms, jit.compile_ms, (long long)jit.kernels, jit.first_loss,
                   jit.peak_device_bytes, interp.samples_per_sec);
        } else {
            char ip[32] = "-", ratio[32] = "-";
            if (a.interp_steps > 0) {
                snprintf(ip, sizeof ip, "%.1f", interp.samples_per_sec);
                snprintf(ratio, sizeof ratio, "%.0fx",
                         interp.samples_per_sec > 0 ? jit.samples_per_sec / interp.samples_per_sec
                                                    : 0.0);
            }
            printf("%-7s %5lld %7d %12.1f %9.3f %12.1f %11.1f %10lld %9.1f %12s %8s\n", c->name,
                   (long long)c->batch, (int)a.threads, jit.samples_per_sec,
                   1e3 * (double)c->batch / jit.samples_per_sec, jit.first_step_ms, jit.compile_ms,
                   (long long)jit.kernels, (double)jit.peak_device_bytes / 1e6, ip, ratio);
        }
        fflush(stdout);
    }
    return 0;
}
