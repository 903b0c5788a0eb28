/* Parameters and their initialisation: a seeded host generator, long-lived parameter
 * tensors, and Linear / Conv2d / BatchNorm2d modules with PyTorch's default inits. */
#include <math.h>
#include <string.h>

#include "frontend.h"
#include "loom/nn.h"

/* ---- generator: SplitMix64 (Steele, Lea, Flood 2014), one 64-bit word of state -------- */

LOOM_API void loom_rng_init(loom_rng *r, uint64_t seed) {
    if (r)
        r->state = seed;
}

static uint64_t next_u64(loom_rng *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

LOOM_API double loom_rng_uniform(loom_rng *r) {
    return r ? (double)(next_u64(r) >> 11) * 0x1.0p-53 : 0.0;
}

LOOM_API double loom_rng_normal(loom_rng *r) {
    if (!r)
        return 0.0;
    /* Box-Muller; 1 - u lies in (0, 1], so the log is finite. The second value of the pair
     * is dropped: the generator has no room to keep it. */
    double u1 = 1.0 - loom_rng_uniform(r), u2 = loom_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* ---- parameter tensors -------------------------------------------------------------------- */

typedef enum fill_kind { FILL_UNIFORM, FILL_NORMAL, FILL_VALUE } fill_kind;

/* Fills a host buffer on the context's allocator and copies it to a new long-lived f32
 * tensor. NULL after recording the error (op names the public function). */
static loom_tensor *make_param(loom_context *ctx, const char *op, int32_t rank,
                               const int64_t *shape, fill_kind kind, double a, double b,
                               loom_rng *rng) {
    if (!ctx)
        return NULL;
#define BAD(...) (loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, __VA_ARGS__), NULL)
    if (rank < 0 || rank > LOOM_MAX_RANK)
        return BAD("rank %d is outside [0, %d]", (int)rank, LOOM_MAX_RANK);
    if (rank > 0 && !shape)
        return BAD("shape is NULL");
    int64_t numel = 1;
    for (int32_t i = 0; i < rank; i++) {
        if (shape[i] < 0)
            return BAD("extent %lld of axis %d is negative", (long long)shape[i], (int)i);
        if (shape[i] > 0 && numel > (INT64_MAX / 4) / shape[i])
            return BAD("%d-d shape has too many elements", (int)rank);
        numel *= shape[i];
    }
    if (kind != FILL_VALUE && !rng)
        return BAD("rng is NULL");
    switch (kind) {
    case FILL_UNIFORM:
        if (!isfinite(a) || !isfinite(b) || !(a <= b))
            return BAD("needs finite bounds lo <= hi, got [%g, %g)", a, b);
        break;
    case FILL_NORMAL:
        if (!isfinite(a) || !isfinite(b) || !(b >= 0))
            return BAD("needs a finite mean and std >= 0, got mean %g, std %g", a, b);
        break;
    case FILL_VALUE:
        if (isnan(a))
            return BAD("value is NaN");
        break;
    }
#undef BAD
    size_t bytes = (size_t)numel * sizeof(float);
    float *host = bytes ? loom_ir_alloc(&ctx->alloc, bytes) : NULL;
    if (bytes && !host) {
        loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, NULL, 0, op,
                      "out of memory for %zu bytes of host staging", bytes);
        return NULL;
    }
    for (int64_t i = 0; i < numel; i++) {
        switch (kind) {
        case FILL_UNIFORM: {
            float v = (float)(a + (b - a) * loom_rng_uniform(rng));
            /* rounding to f32 may land on hi; keep the interval half-open */
            host[i] = v >= (float)b && a < b ? nextafterf((float)b, (float)a) : v;
            break;
        }
        case FILL_NORMAL: host[i] = (float)(a + b * loom_rng_normal(rng)); break;
        case FILL_VALUE: host[i] = (float)a; break;
        }
    }
    static const float dummy = 0; /* a non-NULL source for empty tensors */
    loom_tensor *t = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, rank, shape, host ? host : &dummy);
    loom_ir_free(&ctx->alloc, host, bytes);
    return t;
}

LOOM_API loom_tensor *loom_param_uniform(loom_context *ctx, int32_t rank, const int64_t *shape,
                                         double lo, double hi, loom_rng *rng) {
    LOOM_FE_USE(ctx, "param_uniform", NULL);
    return make_param(ctx, "param_uniform", rank, shape, FILL_UNIFORM, lo, hi, rng);
}

LOOM_API loom_tensor *loom_param_normal(loom_context *ctx, int32_t rank, const int64_t *shape,
                                        double mean, double std, loom_rng *rng) {
    LOOM_FE_USE(ctx, "param_normal", NULL);
    return make_param(ctx, "param_normal", rank, shape, FILL_NORMAL, mean, std, rng);
}

LOOM_API loom_tensor *loom_param_full(loom_context *ctx, int32_t rank, const int64_t *shape,
                                      double value) {
    LOOM_FE_USE(ctx, "param_full", NULL);
    return make_param(ctx, "param_full", rank, shape, FILL_VALUE, value, 0, NULL);
}

/* ---- modules -------------------------------------------------------------------------- */

/* Checks the arguments common to every init: a context, a module, and positive sizes. */
static loom_status check_sizes(loom_context *ctx, const void *m, const char *op, int32_t n,
                               const int64_t *sizes, const char *const *names) {
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (!m)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, "module is NULL");
    for (int32_t i = 0; i < n; i++)
        if (sizes[i] < 1)
            return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op,
                                 "%s must be >= 1, got %lld", names[i], (long long)sizes[i]);
    return LOOM_OK;
}

/* The context's error after a failed parameter creation (never LOOM_OK). */
static loom_status failed(loom_context *ctx) {
    return ctx->err != LOOM_OK ? ctx->err : LOOM_STATUS_INTERNAL;
}

LOOM_API loom_status loom_nn_linear_init(loom_context *ctx, loom_nn_linear *m, int64_t in,
                                         int64_t out, bool bias, loom_rng *rng) {
    LOOM_FE_USE(ctx, "nn_linear_init", LOOM_STATUS_BUSY);
    static const char op[] = "nn_linear_init";
    if (m)
        memset(m, 0, sizeof *m);
    loom_status st = check_sizes(ctx, m, op, 2, (int64_t[]){in, out},
                                 (const char *const[]){"in_features", "out_features"});
    if (st != LOOM_OK)
        return st;
    if (!rng)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, "rng is NULL");
    /* kaiming_uniform_(a=sqrt(5)) gives bound sqrt(6 / ((1 + 5) * fan_in)) = 1/sqrt(fan_in),
     * the bias bound PyTorch uses too. Weight first, then bias, as reset_parameters. */
    double bound = 1.0 / sqrt((double)in);
    m->weight = loom_param_uniform(ctx, 2, (int64_t[]){out, in}, -bound, bound, rng);
    if (m->weight && bias)
        m->bias = loom_param_uniform(ctx, 1, (int64_t[]){out}, -bound, bound, rng);
    if (!m->weight || (bias && !m->bias)) {
        loom_nn_linear_deinit(m);
        return failed(ctx);
    }
    return LOOM_OK;
}

LOOM_API loom_tensor *loom_nn_linear_forward_at(loom_context *ctx, const loom_nn_linear *m,
                                                loom_tensor *x, const char *file, int line) {
    LOOM_FE_USE(ctx, "nn_linear_forward", NULL);
    if (!ctx)
        return NULL;
    if (!m || !m->weight) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, "nn_linear_forward",
                      "the module is NULL or not initialised");
        return NULL;
    }
    return loom_linear_at(ctx, x, m->weight, m->bias, file, line);
}

LOOM_API void loom_nn_linear_deinit(loom_nn_linear *m) {
    if (!m)
        return;
    loom_tensor_release(m->weight);
    loom_tensor_release(m->bias);
    memset(m, 0, sizeof *m);
}

LOOM_API loom_status loom_nn_conv2d_init(loom_context *ctx, loom_nn_conv2d *m, int64_t in,
                                         int64_t out, int64_t kh, int64_t kw, bool bias,
                                         loom_rng *rng) {
    LOOM_FE_USE(ctx, "nn_conv2d_init", LOOM_STATUS_BUSY);
    static const char op[] = "nn_conv2d_init";
    if (m)
        memset(m, 0, sizeof *m);
    loom_status st = check_sizes(
        ctx, m, op, 4, (int64_t[]){in, out, kh, kw},
        (const char *const[]){"in_channels", "out_channels", "kernel height", "kernel width"});
    if (st != LOOM_OK)
        return st;
    if (!rng)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, "rng is NULL");
    /* fan_in = in / groups * kh * kw with groups 1 (the only value init creates weights for) */
    double bound = 1.0 / sqrt((double)in * (double)kh * (double)kw);
    m->weight = loom_param_uniform(ctx, 4, (int64_t[]){out, in, kh, kw}, -bound, bound, rng);
    if (m->weight && bias)
        m->bias = loom_param_uniform(ctx, 1, (int64_t[]){out}, -bound, bound, rng);
    if (!m->weight || (bias && !m->bias)) {
        loom_nn_conv2d_deinit(m);
        return failed(ctx);
    }
    m->stride[0] = m->stride[1] = 1;
    m->dilation[0] = m->dilation[1] = 1;
    m->groups = 1;
    return LOOM_OK;
}

LOOM_API loom_tensor *loom_nn_conv2d_forward_at(loom_context *ctx, const loom_nn_conv2d *m,
                                                loom_tensor *x, const char *file, int line) {
    LOOM_FE_USE(ctx, "nn_conv2d_forward", NULL);
    if (!ctx)
        return NULL;
    if (!m || !m->weight) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, "nn_conv2d_forward",
                      "the module is NULL or not initialised");
        return NULL;
    }
    return loom_conv2d_at(ctx, x, m->weight, m->bias, m->stride, m->padding, m->dilation, m->groups,
                          file, line);
}

LOOM_API void loom_nn_conv2d_deinit(loom_nn_conv2d *m) {
    if (!m)
        return;
    loom_tensor_release(m->weight);
    loom_tensor_release(m->bias);
    memset(m, 0, sizeof *m);
}

LOOM_API loom_status loom_nn_batch_norm2d_init(loom_context *ctx, loom_nn_batch_norm2d *m,
                                               int64_t channels) {
    LOOM_FE_USE(ctx, "nn_batch_norm2d_init", LOOM_STATUS_BUSY);
    static const char op[] = "nn_batch_norm2d_init";
    if (m)
        memset(m, 0, sizeof *m);
    loom_status st = check_sizes(ctx, m, op, 1, &channels, (const char *const[]){"channels"});
    if (st != LOOM_OK)
        return st;
    const int64_t shape[1] = {channels};
    m->weight = loom_param_full(ctx, 1, shape, 1.0);
    m->bias = m->weight ? loom_param_full(ctx, 1, shape, 0.0) : NULL;
    m->running_mean = m->bias ? loom_param_full(ctx, 1, shape, 0.0) : NULL;
    m->running_var = m->running_mean ? loom_param_full(ctx, 1, shape, 1.0) : NULL;
    if (!m->running_var) {
        loom_nn_batch_norm2d_deinit(m);
        return failed(ctx);
    }
    m->momentum = 0.1;
    m->eps = 1e-5;
    return LOOM_OK;
}

LOOM_API loom_tensor *loom_nn_batch_norm2d_forward_at(loom_context *ctx,
                                                      const loom_nn_batch_norm2d *m, loom_tensor *x,
                                                      bool training, const char *file, int line) {
    LOOM_FE_USE(ctx, "nn_batch_norm2d_forward", NULL);
    if (!ctx)
        return NULL;
    if (!m || !m->weight) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, "nn_batch_norm2d_forward",
                      "the module is NULL or not initialised");
        return NULL;
    }
    return loom_batch_norm_at(ctx, x, m->running_mean, m->running_var, m->weight, m->bias, training,
                              m->momentum, m->eps, file, line);
}

LOOM_API void loom_nn_batch_norm2d_deinit(loom_nn_batch_norm2d *m) {
    if (!m)
        return;
    loom_tensor_release(m->weight);
    loom_tensor_release(m->bias);
    loom_tensor_release(m->running_mean);
    loom_tensor_release(m->running_var);
    memset(m, 0, sizeof *m);
}
