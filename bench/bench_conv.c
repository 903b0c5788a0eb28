/* Convolution benchmark, Loom's side of bench/run_conv_bench.sh (bench/torch_conv.py is
 * PyTorch's): each distinct convolution shape of torchvision's ResNet-50 at 224x224, its
 * forward, input gradient and weight gradient timed separately, each as a compiled step that
 * computes only that convolution, run again and again with the same graph (one compile). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <loom/nn.h>

#include "bench_util.h"

/* A convolution of ResNet-50 (torchvision v1.5: a block's stride is on its 3x3), square input
 * hw x hw at 224x224 images (--image-size rescales it: stage_hw), kernel k x k, padding k / 2,
 * no bias, groups 1. Keep in step with LAYERS in bench/torch_conv.py (run_conv_bench.sh joins
 * the two sides by name). */
typedef struct layer {
    const char *name;
    int64_t c, o, hw, k, stride;
    int uses; /* how many of the network's 53 convolutions have this shape */
} layer;

static const layer layers[] = {
    {"stem_7x7s2_3_64", 3, 64, 224, 7, 2, 1},
    /* layer1: 56x56, 64 wide, 256 out; its downsample (1x1 64->256, stride 1) has conv3's shape */
    {"l1_1x1_64_64", 64, 64, 56, 1, 1, 1},
    {"l1_3x3_64_64", 64, 64, 56, 3, 1, 3},
    {"l1_1x1_64_256", 64, 256, 56, 1, 1, 4},
    {"l1_1x1_256_64", 256, 64, 56, 1, 1, 2},
    /* layer2: 28x28, 128 wide, 512 out; the first block's 3x3 and downsample take 56 to 28 */
    {"l2_1x1_256_128", 256, 128, 56, 1, 1, 1},
    {"l2_3x3s2_128_128", 128, 128, 56, 3, 2, 1},
    {"l2_1x1_128_512", 128, 512, 28, 1, 1, 4},
    {"l2_down_1x1s2_256_512", 256, 512, 56, 1, 2, 1},
    {"l2_3x3_128_128", 128, 128, 28, 3, 1, 3},
    {"l2_1x1_512_128", 512, 128, 28, 1, 1, 3},
    /* layer3: 14x14, 256 wide, 1024 out */
    {"l3_1x1_512_256", 512, 256, 28, 1, 1, 1},
    {"l3_3x3s2_256_256", 256, 256, 28, 3, 2, 1},
    {"l3_1x1_256_1024", 256, 1024, 14, 1, 1, 6},
    {"l3_down_1x1s2_512_1024", 512, 1024, 28, 1, 2, 1},
    {"l3_3x3_256_256", 256, 256, 14, 3, 1, 5},
    {"l3_1x1_1024_256", 1024, 256, 14, 1, 1, 5},
    /* layer4: 7x7, 512 wide, 2048 out */
    {"l4_1x1_1024_512", 1024, 512, 14, 1, 1, 1},
    {"l4_3x3s2_512_512", 512, 512, 14, 3, 2, 1},
    {"l4_1x1_512_2048", 512, 2048, 7, 1, 1, 3},
    {"l4_down_1x1s2_1024_2048", 1024, 2048, 14, 1, 2, 1},
    {"l4_3x3_512_512", 512, 512, 7, 3, 1, 2},
    {"l4_1x1_2048_512", 2048, 512, 7, 1, 1, 2},
};
enum { N_LAYERS = sizeof layers / sizeof *layers };

typedef enum pass { PASS_FORWARD, PASS_GRAD_INPUT, PASS_GRAD_WEIGHT, PASS_COUNT_ } pass;
static const char *const pass_names[PASS_COUNT_] = {"forward", "grad_input", "grad_weight"};

typedef struct args {
    int64_t batch, image_size;
    int32_t threads;
    int reps, warmup;
    bool json, best, check;
    loom_dtype dtype;
    bool layer_on[N_LAYERS], pass_on[PASS_COUNT_];
} args;

typedef struct result {
    double ms, wall_ms, compile_ms;
    int64_t kernels;
    double err; /* --check: relative RMS error against the interpreter; else NAN */
} result;

/* The layer's input extent at image x image: its stage's (224 -> 56 -> 28 -> 14 -> 7 at 224,
 * the stem 7x7/2 and max pool 3x3/2 before layer1, then a stride-2 conv per stage) as the
 * network computes it; 64 gives 64 -> 16 -> 8 -> 4 -> 2. Keep in step with stage_hw in
 * bench/torch_conv.py. */
static int64_t stage_hw(int64_t hw224, int64_t image) {
    int64_t hw = image;
    if (hw224 == 224)
        return hw;
    hw = ((hw + 6 - 7) / 2 + 1 + 2 - 3) / 2 + 1; /* stem conv, then max pool */
    for (int64_t s = 56; s > hw224; s /= 2)
        hw = (hw + 2 - 3) / 2 + 1;
    return hw;
}

static layer scaled_layer(const layer *l, int64_t image) {
    layer r = *l;
    r.hw = stage_hw(l->hw, image);
    return r;
}

static int64_t out_extent(const layer *l) {
    return (l->hw + 2 * (l->k / 2) - l->k) / l->stride + 1;
}

/* Multiply-adds x 2 of one pass; the forward and both gradients do the same work. */
static double layer_flops(const layer *l, int64_t batch) {
    int64_t oh = out_extent(l);
    return 2.0 * (double)batch * (double)l->o * (double)(oh * oh) * (double)l->c *
           (double)(l->k * l->k);
}

static uint16_t bf16_bits(float f) { /* round to nearest even; the values here are finite */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* A long-lived tensor of `shape` with values uniform in [-scale, scale), in f32 or bf16. */
static loom_tensor *random_tensor(loom_context *ctx, loom_dtype dt, const int64_t shape[4],
                                  double scale, uint64_t seed) {
    int64_t n = shape[0] * shape[1] * shape[2] * shape[3];
    float *f = malloc(sizeof(float) * (size_t)n);
    uint16_t *h = dt == LOOM_DTYPE_BF16 ? malloc(sizeof(uint16_t) * (size_t)n) : NULL;
    loom_tensor *t = NULL;
    if (f && (dt != LOOM_DTYPE_BF16 || h)) {
        uint64_t s = seed * 0x9E3779B97F4A7C15u + 1;
        for (int64_t i = 0; i < n; i++) {
            s = s * 6364136223846793005u + 1442695040888963407u;
            f[i] = (float)(((double)(s >> 11) * 0x1.0p-53 * 2.0 - 1.0) * scale);
            if (h)
                h[i] = bf16_bits(f[i]);
        }
        t = loom_tensor_from_host(ctx, dt, 4, shape, h ? (const void *)h : f);
    } else {
        fprintf(stderr, "bench_conv: out of memory for %lld values\n", (long long)n);
    }
    free(f);
    free(h);
    return t;
}

/* Records the pass's graph: conv2d(x, w) for the forward; for a gradient, the gradient of
 * sum(conv2d(x, w) * dy) with respect to x or w, which is conv2d_grad_input(dy, w) or
 * conv2d_grad_weight(x, dy): the forward and the loss are not step outputs, so dead-code
 * elimination leaves the gradient op alone in the compiled step. */
static loom_tensor *record(loom_context *ctx, const layer *l, pass p, loom_tensor *x,
                           loom_tensor *w, loom_tensor *dy) {
    int64_t stride[2] = {l->stride, l->stride}, pad[2] = {l->k / 2, l->k / 2};
    loom_tensor *y = loom_conv2d(ctx, x, w, NULL, stride, pad, NULL, 1);
    if (p == PASS_FORWARD)
        return y;
    loom_tensor *loss = loom_sum(ctx, loom_mul(ctx, y, dy), 0, NULL, false);
    loom_tensor *wrt = p == PASS_GRAD_INPUT ? x : w, *g = NULL;
    if (!loss || loom_backward(ctx, loss, 1, &wrt, &g) != LOOM_OK)
        return NULL;
    return g;
}

static int fail(loom_context *ctx, const layer *l, pass p, const char *what) {
    fprintf(stderr, "bench_conv: %s %s: %s: %s\n", l->name, pass_names[p], what,
            ctx ? loom_context_error_message(ctx) : "cannot create a context");
    return 1;
}

/* One step of the pass: record, then (timed) launch and wait. *out_exec_ms is the step's
 * ExecuteTime (the executable's run on the device, without tracing, the cache lookup or the
 * output's allocation), *out_wall_ms mark_step to the end of the sync. The first call finds the
 * graph pending (compiled by loom_compile_step): pending is its retained result. */
static int one_step(loom_context *ctx, const layer *l, pass p, loom_tensor *x, loom_tensor *w,
                    loom_tensor *dy, loom_tensor *pending, double *out_exec_ms,
                    double *out_wall_ms) {
    loom_tensor *out = pending;
    if (!out) {
        out = record(ctx, l, p, x, w, dy);
        if (!out)
            return fail(ctx, l, p, "recording");
        loom_tensor_retain(out);
    }
    int64_t exec0 = loom_metric_total(ctx, "ExecuteTime");
    double t0 = bench_now();
    loom_status st = loom_mark_step(ctx);
    if (st == LOOM_OK)
        st = loom_context_sync(ctx);
    double t1 = bench_now();
    loom_tensor_release(out);
    if (st != LOOM_OK)
        return fail(ctx, l, p, "step");
    *out_exec_ms = (double)(loom_metric_total(ctx, "ExecuteTime") - exec0) / 1e6;
    *out_wall_ms = (t1 - t0) * 1e3;
    return 0;
}

/* Compiles the pass's step once (compile_ms: its CompileTime, kernels: the compiled graph's
 * kernel count), runs it a.warmup times, then a.reps timed times; fails if a timed step
 * compiled anything. */
static int measure(loom_context *ctx, const args *a, const layer *l, pass p, loom_tensor *x,
                   loom_tensor *w, loom_tensor *dy, result *r) {
    *r = (result){.err = NAN};
    int64_t compile0 = loom_metric_total(ctx, "CompileTime");
    int64_t kernels0 = loom_metric_total(ctx, "KernelsPerGraph");
    loom_tensor *out = record(ctx, l, p, x, w, dy);
    if (!out)
        return fail(ctx, l, p, "recording");
    loom_tensor_retain(out);
    if (loom_compile_step(ctx) != LOOM_OK) {
        loom_tensor_release(out);
        return fail(ctx, l, p, "compiling");
    }
    r->compile_ms = (double)(loom_metric_total(ctx, "CompileTime") - compile0) / 1e6;
    r->kernels = loom_metric_total(ctx, "KernelsPerGraph") - kernels0;
    double exec_ms, wall_ms;
    for (int i = 0; i < a->warmup; i++) { /* warmup >= 1: the first runs the pending graph */
        if (one_step(ctx, l, p, x, w, dy, i == 0 ? out : NULL, &exec_ms, &wall_ms) != 0)
            return 1;
    }
    double *exec = malloc(sizeof(double) * (size_t)a->reps * 2), *wall = exec + a->reps;
    if (!exec) {
        fprintf(stderr, "bench_conv: out of memory\n");
        return 1;
    }
    int64_t misses0 = loom_metric_total(ctx, "CacheMiss");
    for (int i = 0; i < a->reps; i++) {
        if (one_step(ctx, l, p, x, w, dy, NULL, &exec[i], &wall[i]) != 0) {
            free(exec);
            return 1;
        }
    }
    int64_t misses = loom_metric_total(ctx, "CacheMiss") - misses0;
    if (misses != 0) {
        fprintf(stderr,
                "bench_conv: %s %s: %lld timed steps compiled (a graph that changes per "
                "step): the times would include compilation\n",
                l->name, pass_names[p], (long long)misses);
        free(exec);
        return 1;
    }
    if (a->best) {
        r->ms = exec[0];
        r->wall_ms = wall[0];
        for (int i = 1; i < a->reps; i++) {
            r->ms = fmin(r->ms, exec[i]);
            r->wall_ms = fmin(r->wall_ms, wall[i]);
        }
    } else {
        r->ms = bench_median(exec, a->reps);
        r->wall_ms = bench_median(wall, a->reps);
    }
    free(exec);
    return 0;
}

static void print_result(const args *a, const layer *l, pass p, const result *r) {
    int64_t oh = out_extent(l);
    double gflops = layer_flops(l, a->batch) / (r->ms * 1e-3) / 1e9;
    if (a->json) {
        printf("{\"side\":\"loom\",\"layer\":\"%s\",\"pass\":\"%s\",\"dtype\":\"%s\","
               "\"batch\":%lld,\"image_size\":%lld,\"threads\":%d,\"c\":%lld,\"o\":%lld,\"h\":%lld,"
               "\"w\":%lld,"
               "\"k\":%lld,\"stride\":%lld,\"pad\":%lld,\"oh\":%lld,\"ow\":%lld,\"uses\":%d,"
               "\"flops\":%.0f,\"ms\":%.4f,\"gflops\":%.2f,\"stat\":\"%s\",\"reps\":%d,"
               "\"warmup\":%d,\"wall_ms\":%.4f,\"compile_ms\":%.2f,\"kernels\":%lld",
               l->name, pass_names[p], loom_dtype_name(a->dtype), (long long)a->batch,
               (long long)a->image_size, (int)a->threads, (long long)l->c, (long long)l->o,
               (long long)l->hw, (long long)l->hw, (long long)l->k, (long long)l->stride,
               (long long)(l->k / 2), (long long)oh, (long long)oh, l->uses,
               layer_flops(l, a->batch), r->ms, gflops, a->best ? "best" : "median", a->reps,
               a->warmup, r->wall_ms, r->compile_ms, (long long)r->kernels);
        if (a->check)
            printf(",\"rel_rms_err\":%.3e", r->err);
        printf("}\n");
    } else {
        char shape[64];
        snprintf(shape, sizeof shape, "%lld->%lld %lldx%lld/%lld %lld->%lld", (long long)l->c,
                 (long long)l->o, (long long)l->k, (long long)l->k, (long long)l->stride,
                 (long long)l->hw, (long long)oh);
        printf("%-24s %-22s %4d  %-11s %9.3f %9.3f %9.1f %11.1f %7lld", l->name, shape, l->uses,
               pass_names[p], r->ms, r->wall_ms, gflops, r->compile_ms, (long long)r->kernels);
        if (a->check)
            printf(" %9.2e", r->err);
        printf("\n");
    }
    fflush(stdout);
}

/* The pass's result (n values of the operands' dtype) as f32 into out, from one more step
 * on ctx: on the compiled context the timed graph again (a cache hit), on an eager one the
 * reference interpreter (f64 accumulation over the same operands). */
static int pass_values(loom_context *ctx, const layer *l, pass p, loom_tensor *x, loom_tensor *w,
                       loom_tensor *dy, loom_dtype dt, float *out, int64_t n) {
    loom_tensor *g = record(ctx, l, p, x, w, dy);
    if (!g)
        return fail(ctx, l, p, "recording the check");
    loom_tensor_retain(g);
    size_t esz = dt == LOOM_DTYPE_BF16 ? 2 : 4;
    loom_status st = loom_mark_step(ctx);
    if (st == LOOM_OK)
        st = loom_tensor_read(ctx, g, out, (size_t)n * esz);
    loom_tensor_release(g);
    if (st != LOOM_OK)
        return fail(ctx, l, p, "the check's step");
    if (esz == 2) { /* widen in place, from the end: bf16 is f32's upper half */
        const uint16_t *h = (const uint16_t *)out;
        for (int64_t i = n - 1; i >= 0; i--) {
            uint32_t u = (uint32_t)h[i] << 16;
            memcpy(&out[i], &u, sizeof u);
        }
    }
    return 0;
}

/* --check: r->err = ||jit - ref|| / ||ref|| over the pass's result, ref from the interpreter
 * (ectx, with its own copies of the operands). */
static int check_pass(loom_context *ctx, loom_context *ectx, const args *a, const layer *l,
                      pass p, loom_tensor *ops[2][3], result *r) {
    int64_t oh = out_extent(l);
    int64_t n = p == PASS_FORWARD      ? a->batch * l->o * oh * oh
                : p == PASS_GRAD_INPUT ? a->batch * l->c * l->hw * l->hw
                                       : l->o * l->c * l->k * l->k;
    float *jit = malloc(sizeof(float) * (size_t)n * 2), *ref = jit + n;
    if (!jit) {
        fprintf(stderr, "bench_conv: out of memory for the check\n");
        return 1;
    }
    int rc = pass_values(ctx, l, p, ops[0][0], ops[0][1], ops[0][2], a->dtype, jit, n);
    if (rc == 0)
        rc = pass_values(ectx, l, p, ops[1][0], ops[1][1], ops[1][2], a->dtype, ref, n);
    if (rc == 0) {
        double se = 0, sr = 0;
        for (int64_t i = 0; i < n; i++) {
            double d = (double)jit[i] - (double)ref[i];
            se += d * d;
            sr += (double)ref[i] * (double)ref[i];
        }
        r->err = sr > 0 ? sqrt(se / sr) : sqrt(se);
    }
    free(jit);
    return rc;
}

/* All of a layer's passes on a fresh context (its compiled steps and their memory go with
 * it), from the same operands: x [N, C, H, W], w [O, C, K, K] (PyTorch's default init
 * scale), dy [N, O, OH, OW]. */
static int run_layer(const args *a, const layer *l) {
    /* bench_context's options, but LOOM_DUMP and LOOM_PROFILE still apply: the compiled
     * steps and their kernels' times can be looked at. No disk cache: compiles are cold. */
    loom_context_options o;
    loom_context_options_init(&o);
    o.num_threads = a->threads;
    o.cache_dir = "";
    loom_context *ctx = NULL, *ectx = NULL;
    if (loom_context_create(&o, &ctx) != LOOM_OK)
        return fail(NULL, l, PASS_FORWARD, "context");
    if (a->check && !(ectx = bench_context(true, "", a->threads))) {
        loom_context_destroy(ctx);
        return fail(NULL, l, PASS_FORWARD, "the interpreter's context");
    }
    int64_t oh = out_extent(l);
    int64_t xs[4] = {a->batch, l->c, l->hw, l->hw}, ws[4] = {l->o, l->c, l->k, l->k},
            ys[4] = {a->batch, l->o, oh, oh};
    double bound = 1.0 / sqrt((double)(l->c * l->k * l->k));
    /* ops[0]: x, w, dy on the compiled context; ops[1]: the same values on the interpreter's */
    loom_tensor *ops[2][3] = {{NULL}};
    int rc = 0;
    for (int e = 0; e < (ectx ? 2 : 1); e++) {
        loom_context *c = e ? ectx : ctx;
        ops[e][0] = random_tensor(c, a->dtype, xs, 1.0, 1);
        ops[e][1] = random_tensor(c, a->dtype, ws, bound, 2);
        ops[e][2] = random_tensor(c, a->dtype, ys, 1.0, 3);
        if (rc == 0 && !(ops[e][0] && ops[e][1] && ops[e][2]))
            rc = fail(c, l, PASS_FORWARD, "operands");
    }
    for (int p = 0; p < PASS_COUNT_ && rc == 0; p++) {
        if (!a->pass_on[p])
            continue;
        result r;
        rc = measure(ctx, a, l, (pass)p, ops[0][0], ops[0][1], ops[0][2], &r);
        if (rc == 0 && ectx)
            rc = check_pass(ctx, ectx, a, l, (pass)p, ops, &r);
        if (rc == 0)
            print_result(a, l, (pass)p, &r);
    }
    for (int e = 0; e < 2; e++)
        for (int t = 0; t < 3; t++)
            loom_tensor_release(ops[e][t]);
    loom_context_destroy(ctx);
    loom_context_destroy(ectx);
    return rc;
}

static int usage(FILE *f) {
    fprintf(f,
            "Usage: bench_conv [--batch N] [--image-size N] [--threads N] [--dtype f32|bf16]\n"
            "                  [--reps N] [--warmup N] [--layer NAME[,NAME...]] [--pass LIST]\n"
            "                  [--best] [--check] [--json] [--list]\n"
            "  --batch N     images per batch (default 8)\n"
            "  --image-size N  the network's input images are N x N (default 224): each\n"
            "                layer's input is its stage's extent (64: 64, 16, 8, 4, 2)\n"
            "  --threads N   the context's threads (default 2)\n"
            "  --dtype D     f32 (default) or bf16 (x, w and dy are bf16 tensors: bf16 convs\n"
            "                with f32 accumulation, bf16 results)\n"
            "  --reps N      timed steps per pass (default 10); --warmup N >= 1 untimed ones\n"
            "                before them (default 3)\n"
            "  --layer L     only these layers (repeatable; --list names them)\n"
            "  --pass LIST   comma-separated among forward,grad_input,grad_weight (default all)\n"
            "  --best        the best timed step instead of the median\n"
            "  --check       also run each pass on the reference interpreter (slow: f64 loops)\n"
            "                and print the result's relative RMS error, ||jit - ref|| / ||ref||\n"
            "  --json        one JSON object per layer and pass\n"
            "  --list        print the layer names, one a line, and exit\n");
    return f == stderr ? 2 : 0;
}

static bool parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* Selects the comma-separated names of `list` among names[0..n); false on an unknown one. */
static bool select_names(const char *list, const char *const *names, int n, bool *on) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < n && strcmp(tok, names[k]))
            k++;
        if (k == n) {
            fprintf(stderr, "bench_conv: unknown name '%s'\n", tok);
            return false;
        }
        on[k] = true;
    }
    return true;
}

/* Parses argv into *a; -1 to go on, else the exit status. */
static int parse(int argc, char **argv, args *a) {
    *a = (args){.batch = 8,
                .image_size = 224,
                .threads = 2,
                .reps = 10,
                .warmup = 3,
                .dtype = LOOM_DTYPE_F32};
    bool any_layer = false, any_pass = false;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
        if (!strcmp(f, "-h") || !strcmp(f, "--help"))
            return usage(stdout);
        if (!strcmp(f, "--list")) {
            for (int k = 0; k < N_LAYERS; k++)
                printf("%s\n", layers[k].name);
            return 0;
        }
        if (!strcmp(f, "--json") || !strcmp(f, "--best") || !strcmp(f, "--check")) {
            *(f[2] == 'j' ? &a->json : f[2] == 'b' ? &a->best : &a->check) = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "bench_conv: %s needs a value\n", f);
            return usage(stderr);
        }
        i++;
        if (!strcmp(f, "--batch") && parse_int(v, 1, 1 << 20, &n)) {
            a->batch = n;
        } else if (!strcmp(f, "--image-size") && parse_int(v, 32, 4096, &n)) {
            a->image_size = n;
        } else if (!strcmp(f, "--threads") && parse_int(v, 1, 1024, &n)) {
            a->threads = (int32_t)n;
        } else if (!strcmp(f, "--reps") && parse_int(v, 1, 1 << 20, &n)) {
            a->reps = (int)n;
        } else if (!strcmp(f, "--warmup") && parse_int(v, 1, 1 << 20, &n)) {
            a->warmup = (int)n;
        } else if (!strcmp(f, "--dtype") && (!strcmp(v, "f32") || !strcmp(v, "bf16"))) {
            a->dtype = !strcmp(v, "bf16") ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32;
        } else if (!strcmp(f, "--layer")) {
            const char *names[N_LAYERS];
            for (int k = 0; k < N_LAYERS; k++)
                names[k] = layers[k].name;
            if (!select_names(v, names, N_LAYERS, a->layer_on))
                return usage(stderr);
            any_layer = true;
        } else if (!strcmp(f, "--pass")) {
            if (!select_names(v, pass_names, PASS_COUNT_, a->pass_on))
                return usage(stderr);
            any_pass = true;
        } else {
            fprintf(stderr, "bench_conv: bad option or value: %s %s\n", f, v);
            return usage(stderr);
        }
    }
    for (int k = 0; k < N_LAYERS; k++)
        a->layer_on[k] = a->layer_on[k] || !any_layer;
    for (int p = 0; p < PASS_COUNT_; p++)
        a->pass_on[p] = a->pass_on[p] || !any_pass;
    return -1;
}

int main(int argc, char **argv) {
    args a;
    int rc = parse(argc, argv, &a);
    if (rc >= 0)
        return rc;
    if (!a.json) {
        printf("ResNet-50 convolutions at %lldx%lld, batch %lld, %s, %d threads; ms: %s "
               "ExecuteTime of %d steps after %d warm-up steps (wall: mark_step to sync); "
               "GFLOP/s from ms\n",
               (long long)a.image_size, (long long)a.image_size, (long long)a.batch,
               loom_dtype_name(a.dtype), (int)a.threads, a.best ? "best" : "median", a.reps,
               a.warmup);
        printf("%-24s %-22s %4s  %-11s %9s %9s %9s %11s %7s%s\n", "layer", "C->O KxK/s H->OH",
               "uses", "pass", "ms", "wall ms", "GFLOP/s", "compile ms", "kernels",
               a.check ? "   rel err" : "");
    }
    for (int k = 0; k < N_LAYERS && rc <= 0; k++) {
        if (a.layer_on[k]) {
            layer l = scaled_layer(&layers[k], a.image_size);
            rc = run_layer(&a, &l);
        }
    }
    return rc > 0 ? 1 : 0;
}
