/* Optimizers: SGD, Adam and AdamW against PyTorch 1.13's update rules computed here in
 * double, on the interpreter and the JIT; sync-free skips, learning-rate changes without
 * recompiles, NULL gradients, option checks and the state accessor; parameter groups with
 * their own weight decay; gradient clipping by global norm. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "test_util.h"

#include "frontend/frontend.h"
#include "loom/optim.h"

#define N 4
#define STEPS 3

static const float P0[N] = {1.0f, -0.5f, 0.25f, 2.0f};
static const float G[STEPS][N] = {
    {0.5f, -0.25f, 1.0f, -2.0f},
    {0.125f, 0.75f, -0.5f, 1.5f},
    {-1.0f, 0.5f, 0.25f, 0.0625f},
};

/* ---- the reference: torch/optim/{sgd,adam,adamw}.py, single-tensor path, in double ---- */

typedef struct ref_state {
    double p[N], buf[N], m[N], v[N];
    int step;
} ref_state;

static void ref_init(ref_state *r) {
    memset(r, 0, sizeof *r);
    for (int i = 0; i < N; i++)
        r->p[i] = P0[i];
}

static void ref_step_d(const loom_optim_options *o, ref_state *r, const double *g_in) {
    if (o->kind == LOOM_OPTIM_SGD) {
        for (int i = 0; i < N; i++) {
            double g = g_in[i] + o->weight_decay * r->p[i];
            if (o->momentum != 0) {
                r->buf[i] = r->step == 0 ? g : o->momentum * r->buf[i] + (1 - o->dampening) * g;
                g = o->nesterov ? g + o->momentum * r->buf[i] : r->buf[i];
            }
            r->p[i] -= o->lr * g;
        }
        r->step++;
        return;
    }
    r->step++;
    double bc1 = 1 - pow(o->beta1, r->step), bc2 = 1 - pow(o->beta2, r->step);
    for (int i = 0; i < N; i++) {
        double g = g_in[i];
        if (o->kind == LOOM_OPTIM_ADAMW)
            r->p[i] *= 1 - o->lr * o->weight_decay;
        else
            g += o->weight_decay * r->p[i];
        r->m[i] = o->beta1 * r->m[i] + (1 - o->beta1) * g;
        r->v[i] = o->beta2 * r->v[i] + (1 - o->beta2) * g * g;
        r->p[i] -= o->lr / bc1 * r->m[i] / (sqrt(r->v[i]) / sqrt(bc2) + o->eps);
    }
}

static void ref_step(const loom_optim_options *o, ref_state *r, const float *g_in) {
    double g[N];
    for (int i = 0; i < N; i++)
        g[i] = g_in[i];
    ref_step_d(o, r, g);
}

static void expect_close(const float *got, const double *want, const char *what) {
    for (int i = 0; i < N; i++) {
        double err = fabs(got[i] - want[i]);
        if (err > 1e-6 * fabs(want[i]) + 3e-7) { /* absolute part: cancellation */
            print_error("%s[%d]: got %.9g, want %.9g (error %.3g)\n", what, i, got[i], want[i],
                        err);
            fail();
        }
    }
}

static void read_vec(loom_context *ctx, loom_tensor *t, float *out) {
    assert_int_equal(loom_tensor_read(ctx, t, out, N * sizeof *out), LOOM_OK);
}

static float read_scalar(loom_context *ctx, loom_tensor *t) {
    float v = -1;
    assert_int_equal(loom_tensor_read(ctx, t, &v, sizeof v), LOOM_OK);
    return v;
}

/* Compares parameter i, its state and the step counter with the reference. */
static void expect_state_of(loom_context *ctx, loom_optim *opt, int32_t i, loom_tensor *p,
                            const ref_state *r) {
    float got[N];
    read_vec(ctx, p, got);
    expect_close(got, r->p, "param");
    const char *names[4];
    loom_tensor *ts[4];
    int32_t k = loom_optim_state(opt, i, names, ts);
    for (int32_t j = 0; j < k; j++) {
        if (strcmp(names[j], "step") == 0) {
            assert_true(read_scalar(ctx, ts[j]) == (float)r->step);
            continue;
        }
        read_vec(ctx, ts[j], got);
        const double *want = strcmp(names[j], "momentum_buffer") == 0 ? r->buf
                             : strcmp(names[j], "exp_avg") == 0       ? r->m
                                                                      : r->v;
        expect_close(got, want, names[j]);
    }
}

static void expect_state(loom_context *ctx, loom_optim *opt, loom_tensor *p,
                         const loom_optim_options *o, const ref_state *r) {
    (void)o;
    expect_state_of(ctx, opt, 0, p, r);
}

/* Three steps of the optimizer against the reference, on the interpreter or the JIT. */
static void run_against_reference(const loom_optim_options *o, bool eager) {
    loom_context *ctx = tu_context(eager);
    int32_t live0 = ctx->n_live_tensors;
    loom_tensor *p = tu_f32(ctx, N, P0);
    loom_optim *opt = NULL;
    assert_int_equal(loom_optim_create(ctx, o, 1, &p, &opt), LOOM_OK);
    ref_state r;
    ref_init(&r);
    for (int s = 0; s < STEPS; s++) {
        loom_tensor *g = tu_f32(ctx, N, G[s]);
        assert_int_equal(loom_optim_step(opt, &g, NULL), LOOM_OK);
        assert_int_equal(loom_mark_step(ctx), LOOM_OK);
        loom_tensor_release(g);
        ref_step(o, &r, G[s]);
        expect_state(ctx, opt, p, o, &r);
    }
    if (!eager) { /* the JIT compiled one graph for all steps and ran it itself */
        assert_int_equal(loom_metric_value(ctx, "Fallbacks"), 0);
        assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 1);
    }
    loom_optim_destroy(opt);
    loom_tensor_release(p);
    assert_int_equal(ctx->n_live_tensors, live0); /* state, step and lr released */
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void run_both(const loom_optim_options *o) {
    run_against_reference(o, true);
    run_against_reference(o, false);
}

static void test_sgd_plain_subtracts_lr_times_gradient(void **state) {
    (void)state;
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_SGD);
    o.lr = 0.1;
    run_both(&o);
}

static void test_sgd_momentum_starts_the_buffer_with_the_first_gradient(void **state) {
    (void)state;
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_SGD);
    o.lr = 0.1;
    o.momentum = 0.9;
    run_both(&o);
}

static void test_sgd_dampening_scales_later_gradients_only(void **state) {
    (void)state;
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_SGD);
    o.lr = 0.1;
    o.momentum = 0.8;
    o.dampening = 0.5;
    run_both(&o);
}

static void test_sgd_nesterov_looks_ahead_by_momentum(void **state) {
    (void)state;
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_SGD);
    o.lr = 0.1;
    o.momentum = 0.9;
    o.nesterov = true;
    run_both(&o);
}

static void test_sgd_weight_decay_adds_l2_to_the_gradient(void **state) {
    (void)state;
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_SGD);
    o.lr = 0.1;
    o.weight_decay = 0.1;
    run_both(&o);
    o.momentum = 0.9; /* and before the momentum buffer */
    run_both(&o);
}

static void test_adam_bias_corrects_both_moments(void **state) {
    (void)state;
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_ADAM);
    o.lr = 0.05;
    run_both(&o);
}

static void test_adam_weight_decay_is_l2_in_the_gradient(void **state) {
    (void)state;
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_ADAM);
    o.lr = 0.05;
    o.weight_decay = 0.1;
    o.beta1 = 0.8;
    o.beta2 = 0.99;
    o.eps = 1e-3; /* large enough to matter in the result */
    run_both(&o);
}

static void test_adamw_decays_the_parameter_before_the_adam_step(void **state) {
    (void)state;
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_ADAMW);
    assert_true(o.weight_decay == 1e-2);
    o.lr = 0.05;
    run_both(&o);
    o.weight_decay = 0.5;
    run_both(&o);
}

/* ---- sync-free steps --------------------------------------------------------------------- */

/* One step with found_inf (NULL, or a scalar f32/bool tensor of value `flag`). */
static void step_with(loom_context *ctx, loom_optim *opt, const float *g_host, loom_tensor *found) {
    loom_tensor *g = tu_f32(ctx, N, g_host);
    assert_int_equal(loom_optim_step(opt, &g, found), LOOM_OK);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    loom_tensor_release(g);
}

static void snapshot(loom_context *ctx, loom_optim *opt, loom_tensor *p, float *out) {
    read_vec(ctx, p, out);
    loom_tensor *ts[4];
    int32_t k = loom_optim_state(opt, 0, NULL, ts);
    for (int32_t j = 0; j + 1 < k; j++)
        read_vec(ctx, ts[j], out + N * (j + 1));
    out[3 * N] = read_scalar(ctx, ts[k - 1]);
}

static void run_found_inf(const loom_optim_options *o, bool eager) {
    loom_context *ctx = tu_context(eager);
    loom_tensor *p = tu_f32(ctx, N, P0);
    loom_optim *opt = NULL;
    assert_int_equal(loom_optim_create(ctx, o, 1, &p, &opt), LOOM_OK);
    loom_tensor *inf = tu_scalar_f32(ctx, 1.0f), *clean = tu_scalar_f32(ctx, 0.0f);
    bool yes = true;
    loom_tensor *inf_bool = loom_tensor_from_host(ctx, LOOM_DTYPE_BOOL, 1, (int64_t[]){1}, &yes);
    ref_state r;
    ref_init(&r);
    /* skipped before any clean step: SGD's buffer must still start from the next gradient */
    float before[3 * N + 1] = {0}, after[3 * N + 1] = {0};
    snapshot(ctx, opt, p, before);
    step_with(ctx, opt, G[2], inf_bool);
    snapshot(ctx, opt, p, after);
    assert_memory_equal(before, after, sizeof before);
    step_with(ctx, opt, G[0], NULL);
    ref_step(o, &r, G[0]);
    expect_state(ctx, opt, p, o, &r);
    snapshot(ctx, opt, p, before);
    step_with(ctx, opt, G[1], inf); /* skipped: param, state and step unchanged */
    snapshot(ctx, opt, p, after);
    assert_memory_equal(before, after, sizeof before);
    step_with(ctx, opt, G[2], clean); /* a clean step proceeds from where it was */
    ref_step(o, &r, G[2]);
    expect_state(ctx, opt, p, o, &r);
    assert_int_equal(r.step, 2);
    loom_tensor_release(inf);
    loom_tensor_release(clean);
    loom_tensor_release(inf_bool);
    loom_optim_destroy(opt);
    loom_tensor_release(p);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_found_inf_skips_every_update_and_the_step_count(void **state) {
    (void)state;
    loom_optim_options o;
    for (int kind = 0; kind < LOOM_OPTIM_COUNT_; kind++) {
        loom_optim_options_init(&o, (loom_optim_kind)kind);
        o.lr = 0.05;
        o.momentum = 0.9;
        o.dampening = 0.25;
        o.weight_decay = 0.1;
        run_found_inf(&o, true);
        run_found_inf(&o, false);
    }
}

static void test_nan_found_inf_also_skips(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    loom_tensor *p = tu_f32(ctx, N, P0);
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_ADAM);
    loom_optim *opt = NULL;
    assert_int_equal(loom_optim_create(ctx, &o, 1, &p, &opt), LOOM_OK);
    loom_tensor *nan = tu_scalar_f32(ctx, NAN);
    step_with(ctx, opt, G[0], nan);
    float got[N];
    read_vec(ctx, p, got);
    assert_memory_equal(got, P0, sizeof got);
    loom_tensor_release(nan);
    loom_optim_destroy(opt);
    loom_tensor_release(p);
    loom_context_destroy(ctx);
}

/* ---- learning rate ----------------------------------------------------------------------- */

static void run_set_lr(loom_optim_kind kind) {
    loom_context *ctx = tu_context(false);
    loom_tensor *p = tu_f32(ctx, N, P0);
    loom_optim_options o;
    loom_optim_options_init(&o, kind);
    o.lr = 0.1;
    o.momentum = kind == LOOM_OPTIM_SGD ? 0.5 : 0;
    loom_optim *opt = NULL;
    assert_int_equal(loom_optim_create(ctx, &o, 1, &p, &opt), LOOM_OK);
    ref_state r;
    ref_init(&r);
    step_with(ctx, opt, G[0], NULL);
    ref_step(&o, &r, G[0]);
    int64_t misses = loom_metric_value(ctx, "CacheMiss");
    assert_true(misses >= 1);
    step_with(ctx, opt, G[1], NULL);
    ref_step(&o, &r, G[1]);
    assert_int_equal(loom_optim_set_lr(opt, 0.01), LOOM_OK);
    o.lr = 0.01;
    step_with(ctx, opt, G[2], NULL);
    ref_step(&o, &r, G[2]);
    expect_state(ctx, opt, p, &o, &r);
    assert_int_equal(loom_metric_value(ctx, "CacheMiss"), misses); /* no recompile */
    assert_int_equal(loom_metric_value(ctx, "CacheHit"), 2);
    loom_optim_destroy(opt);
    loom_tensor_release(p);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_set_lr_changes_the_update_without_recompiling(void **state) {
    (void)state;
    run_set_lr(LOOM_OPTIM_SGD);
    run_set_lr(LOOM_OPTIM_ADAM);
    run_set_lr(LOOM_OPTIM_ADAMW);
}

static void test_set_lr_rejects_negative_and_non_finite_rates(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    loom_tensor *p = tu_f32(ctx, N, P0);
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_SGD);
    loom_optim *opt = NULL;
    assert_int_equal(loom_optim_create(ctx, &o, 1, &p, &opt), LOOM_OK);
    assert_int_equal(loom_optim_set_lr(opt, -1), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "optim_set_lr: lr must be finite"));
    loom_context_clear_error(ctx);
    assert_int_equal(loom_optim_set_lr(opt, INFINITY), LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_optim_set_lr(opt, NAN), LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_optim_set_lr(NULL, 0.1), LOOM_STATUS_INVALID_ARGUMENT);
    loom_context_clear_error(ctx);
    loom_optim_destroy(opt);
    loom_tensor_release(p);
    loom_context_destroy(ctx);
}

/* ---- gradients ---------------------------------------------------------------------------- */

static void test_null_grads_leave_their_parameter_and_state_untouched(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    loom_tensor *ps[2] = {tu_f32(ctx, N, P0), tu_f32(ctx, N, G[0])};
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_ADAM);
    o.lr = 0.05;
    loom_optim *opt = NULL;
    assert_int_equal(loom_optim_create(ctx, &o, 2, ps, &opt), LOOM_OK);
    ref_state r;
    ref_init(&r);
    for (int s = 0; s < 2; s++) {
        loom_tensor *grads[2] = {tu_f32(ctx, N, G[s]), NULL};
        assert_int_equal(loom_optim_step(opt, grads, NULL), LOOM_OK);
        assert_int_equal(loom_mark_step(ctx), LOOM_OK);
        loom_tensor_release(grads[0]);
        ref_step(&o, &r, G[s]);
    }
    expect_state(ctx, opt, ps[0], &o, &r);
    float got[N], zero[N] = {0};
    read_vec(ctx, ps[1], got);
    assert_memory_equal(got, G[0], sizeof got);
    loom_tensor *ts[4];
    assert_int_equal(loom_optim_state(opt, 1, NULL, ts), 3);
    read_vec(ctx, ts[0], got);
    assert_memory_equal(got, zero, sizeof got);
    read_vec(ctx, ts[1], got);
    assert_memory_equal(got, zero, sizeof got);
    /* all NULL: nothing is recorded and the step does not advance */
    loom_tensor *none[2] = {NULL, NULL};
    assert_int_equal(loom_optim_step(opt, none, NULL), LOOM_OK);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    assert_true(read_scalar(ctx, ts[2]) == 2.0f);
    loom_optim_destroy(opt);
    loom_tensor_release(ps[0]);
    loom_tensor_release(ps[1]);
    loom_context_destroy(ctx);
}

static void test_step_rejects_mismatched_grads_and_found_inf_without_recording(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    loom_tensor *p = tu_f32(ctx, N, P0);
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_SGD);
    o.lr = 0.1;
    loom_optim *opt = NULL;
    assert_int_equal(loom_optim_create(ctx, &o, 1, &p, &opt), LOOM_OK);
    loom_tensor *short_g = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){3}, P0);
    assert_int_equal(loom_optim_step(opt, &short_g, NULL), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx),
                           "optim_step: grads[0] is f32[3] but its parameter is f32[4]"));
    loom_context_clear_error(ctx);
    double d[N] = {0};
    loom_tensor *g64 = loom_tensor_from_host(ctx, LOOM_DTYPE_F64, 1, (int64_t[]){N}, d);
    assert_int_equal(loom_optim_step(opt, &g64, NULL), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "grads[0] is f64[4]"));
    loom_context_clear_error(ctx);
    loom_tensor *g = tu_f32(ctx, N, G[0]);
    loom_tensor *two = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2}, P0);
    assert_int_equal(loom_optim_step(opt, &g, two), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx),
                           "found_inf must be one float or bool element, got f32[2]"));
    loom_context_clear_error(ctx);
    int32_t one = 1;
    loom_tensor *fi = loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 0, NULL, &one);
    assert_int_equal(loom_optim_step(opt, &g, fi), LOOM_STATUS_INVALID_ARGUMENT);
    loom_context_clear_error(ctx);
    assert_int_equal(loom_optim_step(opt, NULL, NULL), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "grads is NULL"));
    loom_context_clear_error(ctx);
    assert_int_equal(loom_optim_step(NULL, &g, NULL), LOOM_STATUS_INVALID_ARGUMENT);
    /* none of the rejected calls recorded an update */
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    float got[N];
    read_vec(ctx, p, got);
    assert_memory_equal(got, P0, sizeof got);
    loom_tensor *all[] = {short_g, g64, g, two, fi, p};
    loom_optim_destroy(opt);
    for (int i = 0; i < 6; i++)
        loom_tensor_release(all[i]);
    loom_context_destroy(ctx);
}

/* ---- options ---------------------------------------------------------------------------- */

static void expect_rejected(loom_context *ctx, const loom_optim_options *o, int32_t n,
                            loom_tensor *const *params, const char *message) {
    loom_optim *opt = (loom_optim *)&opt; /* must be reset to NULL */
    assert_int_equal(loom_optim_create(ctx, o, n, params, &opt), LOOM_STATUS_INVALID_ARGUMENT);
    assert_null(opt);
    if (!strstr(loom_context_error_message(ctx), message)) {
        print_error("message '%s' lacks '%s'\n", loom_context_error_message(ctx), message);
        fail();
    }
    loom_context_clear_error(ctx);
}

static void test_create_rejects_invalid_options_with_clear_messages(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    int32_t live0 = ctx->n_live_tensors;
    loom_tensor *p = tu_f32(ctx, N, P0);
    loom_optim_options o;
#define REJECT(kind, field, value, msg)                                                            \
    do {                                                                                           \
        loom_optim_options_init(&o, kind);                                                         \
        o.field = value;                                                                           \
        expect_rejected(ctx, &o, 1, &p, msg);                                                      \
    } while (0)
    REJECT(LOOM_OPTIM_SGD, lr, -0.1, "optim_create: SGD: lr must be finite and >= 0, got -0.1");
    REJECT(LOOM_OPTIM_ADAM, lr, NAN, "Adam: lr must be finite and >= 0, got nan");
    REJECT(LOOM_OPTIM_SGD, momentum, -0.5, "SGD: momentum must be finite and >= 0, got -0.5");
    REJECT(LOOM_OPTIM_SGD, nesterov, true, "SGD: nesterov needs momentum > 0 and dampening == 0");
    REJECT(LOOM_OPTIM_ADAMW, weight_decay, -1, "AdamW: weight_decay must be finite and >= 0");
    REJECT(LOOM_OPTIM_ADAM, beta1, 1.0, "Adam: beta1 must be in [0, 1), got 1");
    REJECT(LOOM_OPTIM_ADAMW, beta2, -0.1, "AdamW: beta2 must be in [0, 1), got -0.1");
    REJECT(LOOM_OPTIM_ADAM, eps, -1e-8, "Adam: eps must be finite and >= 0");
    REJECT(LOOM_OPTIM_SGD, kind, LOOM_OPTIM_COUNT_, "unknown optimizer kind 3");
#undef REJECT
    loom_optim_options_init(&o, LOOM_OPTIM_SGD);
    o.momentum = 0.9;
    o.dampening = 0.1;
    o.nesterov = true;
    expect_rejected(ctx, &o, 1, &p, "got momentum 0.9, dampening 0.1");
    /* betas of SGD are not looked at */
    loom_optim_options_init(&o, LOOM_OPTIM_SGD);
    o.beta1 = 2;
    loom_optim *opt = NULL;
    assert_int_equal(loom_optim_create(ctx, &o, 1, &p, &opt), LOOM_OK);
    loom_optim_destroy(opt);

    loom_optim_options_init(&o, LOOM_OPTIM_ADAM);
    expect_rejected(ctx, &o, 0, &p, "needs at least one parameter, got n = 0");
    expect_rejected(ctx, &o, 1, NULL, "optim_create: params is NULL");
    expect_rejected(ctx, NULL, 1, &p, "optim_create: options is NULL");
    loom_tensor *with_null[2] = {p, NULL};
    expect_rejected(ctx, &o, 2, with_null, "params[1] is NULL");
    loom_tensor *twice[2] = {p, p};
    expect_rejected(ctx, &o, 2, twice, "params[0] and params[1] are the same tensor");
    loom_tensor *result = loom_add(ctx, p, p);
    expect_rejected(ctx, &o, 1, &result, "params[0] is a result of this step");
    int32_t iv[N] = {1, 2, 3, 4};
    loom_tensor *ip = loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 1, (int64_t[]){N}, iv);
    expect_rejected(ctx, &o, 1, &ip, "params[0] is i32; parameters must be floating point");
    loom_tensor_release(ip);
    loom_optim *opt2 = NULL; /* a released parameter */
    assert_int_equal(loom_optim_create(ctx, &o, 1, &ip, &opt2), LOOM_STATUS_STALE_HANDLE);
    assert_null(opt2);
    loom_context_clear_error(ctx);
    assert_int_equal(loom_optim_create(ctx, &o, 1, &p, NULL), LOOM_STATUS_INVALID_ARGUMENT);
    loom_context_clear_error(ctx);
    assert_int_equal(loom_optim_create(NULL, &o, 1, &p, &opt), LOOM_STATUS_INVALID_ARGUMENT);
    loom_optim_destroy(NULL);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    loom_tensor_release(p);
    assert_int_equal(ctx->n_live_tensors, live0); /* rejected creates left nothing behind */
    loom_context_destroy(ctx);
}

static void test_options_init_gives_pytorch_defaults(void **state) {
    (void)state;
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_ADAM);
    assert_true(o.kind == LOOM_OPTIM_ADAM && o.lr == 1e-3 && o.beta1 == 0.9 && o.beta2 == 0.999 &&
                o.eps == 1e-8 && o.weight_decay == 0);
    loom_optim_options_init(&o, LOOM_OPTIM_ADAMW);
    assert_true(o.weight_decay == 1e-2 && o.lr == 1e-3);
    loom_optim_options_init(&o, LOOM_OPTIM_SGD);
    assert_true(o.momentum == 0 && o.dampening == 0 && !o.nesterov && o.weight_decay == 0);
    loom_optim_options_init(NULL, LOOM_OPTIM_SGD); /* ignored */
}

/* ---- state accessor --------------------------------------------------------------------- */

static void test_state_names_follow_pytorch_state_dict_keys(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    loom_tensor *ps[2] = {tu_f32(ctx, N, P0),
                          loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 3}, G[0])};
    const char *names[4];
    loom_tensor *ts[4];
    loom_optim_options o;
    loom_optim *opt = NULL;

    loom_optim_options_init(&o, LOOM_OPTIM_ADAMW);
    assert_int_equal(loom_optim_create(ctx, &o, 2, ps, &opt), LOOM_OK);
    assert_int_equal(loom_optim_state(opt, 1, names, ts), 3);
    assert_string_equal(names[0], "exp_avg");
    assert_string_equal(names[1], "exp_avg_sq");
    assert_string_equal(names[2], "step");
    int32_t rank = 0;
    int64_t shape[LOOM_MAX_RANK];
    assert_int_equal(loom_tensor_rank(ts[0], &rank), LOOM_OK);
    assert_int_equal(loom_tensor_shape(ts[0], shape), LOOM_OK);
    assert_true(rank == 2 && shape[0] == 2 && shape[1] == 3); /* the parameter's shape */
    assert_int_equal(loom_tensor_rank(ts[2], &rank), LOOM_OK);
    assert_int_equal(rank, 0);
    float zeros[6] = {0}, got[6];
    assert_int_equal(loom_tensor_read(ctx, ts[1], got, sizeof got), LOOM_OK);
    assert_memory_equal(got, zeros, sizeof got);
    loom_tensor *step_of_0[4];
    assert_int_equal(loom_optim_state(opt, 0, NULL, step_of_0), 3);
    assert_ptr_equal(step_of_0[2], ts[2]); /* one shared counter */
    assert_int_equal(loom_optim_state(opt, 2, names, ts), 0);
    assert_int_equal(loom_optim_state(opt, -1, names, ts), 0);
    assert_int_equal(loom_optim_state(NULL, 0, names, ts), 0);
    assert_int_equal(loom_optim_state(opt, 0, NULL, NULL), 3);
    loom_optim_destroy(opt);

    loom_optim_options_init(&o, LOOM_OPTIM_SGD);
    assert_int_equal(loom_optim_create(ctx, &o, 2, ps, &opt), LOOM_OK);
    assert_int_equal(loom_optim_state(opt, 0, names, ts), 1);
    assert_string_equal(names[0], "step");
    loom_optim_destroy(opt);
    o.momentum = 0.9;
    assert_int_equal(loom_optim_create(ctx, &o, 2, ps, &opt), LOOM_OK);
    assert_int_equal(loom_optim_state(opt, 0, names, ts), 2);
    assert_string_equal(names[0], "momentum_buffer");
    assert_string_equal(names[1], "step");
    loom_optim_destroy(opt);
    loom_tensor_release(ps[0]);
    loom_tensor_release(ps[1]);
    loom_context_destroy(ctx);
}

/* ---- parameter groups ------------------------------------------------------------------- */

static const float Q0[N] = {0.5f, 1.5f, -1.0f, 0.75f};

/* Three steps over a [2,2] matrix decayed by 0.1 and a [4] vector not decayed (an empty
 * group between them), whatever o->weight_decay says, against two references. */
static void run_groups(loom_optim_kind kind, bool eager) {
    loom_context *ctx = tu_context(eager);
    int32_t live0 = ctx->n_live_tensors;
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 2}, P0);
    loom_tensor *b = tu_f32(ctx, N, Q0);
    loom_optim_options o;
    loom_optim_options_init(&o, kind);
    o.lr = 0.05;
    o.momentum = 0.9;
    o.weight_decay = 0.3; /* used by no parameter: every group has its own */
    const loom_optim_group groups[3] = {{1, &w, 0.1}, {0, NULL, 0.3}, {1, &b, 0.0}};
    loom_optim *opt = NULL;
    assert_int_equal(loom_optim_create_groups(ctx, &o, 3, groups, &opt), LOOM_OK);
    loom_optim_options ow = o, ob = o;
    ow.weight_decay = 0.1;
    ob.weight_decay = 0.0;
    ref_state rw, rb;
    ref_init(&rw);
    ref_init(&rb);
    memcpy(rb.p, (double[]){Q0[0], Q0[1], Q0[2], Q0[3]}, sizeof rb.p);
    for (int s = 0; s < STEPS; s++) {
        loom_tensor *g[2] = {loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 2}, G[s]),
                             tu_f32(ctx, N, G[(s + 1) % STEPS])};
        assert_int_equal(loom_optim_step(opt, g, NULL), LOOM_OK);
        assert_int_equal(loom_mark_step(ctx), LOOM_OK);
        loom_tensor_release(g[0]);
        loom_tensor_release(g[1]);
        ref_step(&ow, &rw, G[s]);
        ref_step(&ob, &rb, G[(s + 1) % STEPS]);
        expect_state_of(ctx, opt, 0, w, &rw); /* group 0's parameter is index 0 */
        expect_state_of(ctx, opt, 1, b, &rb);
    }
    if (!eager) {
        assert_int_equal(loom_metric_value(ctx, "Fallbacks"), 0);
        assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 1);
    }
    assert_int_equal(loom_optim_state(opt, 2, NULL, NULL), 0); /* two parameters in all */
    loom_optim_destroy(opt);
    loom_tensor_release(w);
    loom_tensor_release(b);
    assert_int_equal(ctx->n_live_tensors, live0);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_groups_apply_their_own_weight_decay_for_every_kind(void **state) {
    (void)state;
    for (int kind = 0; kind < LOOM_OPTIM_COUNT_; kind++) {
        run_groups((loom_optim_kind)kind, true);
        run_groups((loom_optim_kind)kind, false);
    }
}

static void expect_groups_rejected(loom_context *ctx, const loom_optim_options *o, int32_t n_groups,
                                   const loom_optim_group *groups, const char *message) {
    loom_optim *opt = (loom_optim *)&opt; /* must be reset to NULL */
    assert_int_equal(loom_optim_create_groups(ctx, o, n_groups, groups, &opt),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_null(opt);
    if (!strstr(loom_context_error_message(ctx), message)) {
        print_error("message '%s' lacks '%s'\n", loom_context_error_message(ctx), message);
        fail();
    }
    loom_context_clear_error(ctx);
}

static void test_create_groups_rejects_bad_groups_naming_the_position(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    int32_t live0 = ctx->n_live_tensors;
    loom_tensor *p = tu_f32(ctx, N, P0), *q = tu_f32(ctx, N, Q0);
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_ADAMW);
    loom_tensor *pq[2] = {p, q}, *qp[2] = {q, p};
    expect_groups_rejected(ctx, &o, 2, (loom_optim_group[]){{2, pq, 0.1}, {1, &p, 0.0}},
                           "optim_create_groups: groups[0].params[0] and groups[1].params[0] are "
                           "the same tensor");
    expect_groups_rejected(ctx, &o, 2, (loom_optim_group[]){{1, &q, 0.1}, {2, pq, 0.0}},
                           "groups[0].params[0] and groups[1].params[1] are the same tensor");
    expect_groups_rejected(ctx, &o, 1, (loom_optim_group[]){{2, (loom_tensor *[]){p, p}, 0.1}},
                           "groups[0].params[0] and groups[0].params[1] are the same tensor");
    expect_groups_rejected(ctx, &o, 2, (loom_optim_group[]){{1, &p, 0.1}, {1, &q, -1}},
                           "AdamW: groups[1].weight_decay must be finite and >= 0, got -1");
    expect_groups_rejected(ctx, &o, 1, (loom_optim_group[]){{1, &p, NAN}},
                           "groups[0].weight_decay must be finite and >= 0, got nan");
    expect_groups_rejected(ctx, &o, 2, (loom_optim_group[]){{0, NULL, 0.1}, {0, pq, 0.0}},
                           "needs at least one parameter, got none in 2 groups");
    expect_groups_rejected(ctx, &o, 0, (loom_optim_group[]){{1, &p, 0.1}},
                           "needs at least one group, got n_groups = 0");
    expect_groups_rejected(ctx, &o, 1, NULL, "optim_create_groups: groups is NULL");
    expect_groups_rejected(ctx, NULL, 1, (loom_optim_group[]){{1, &p, 0.1}}, "options is NULL");
    expect_groups_rejected(ctx, &o, 2, (loom_optim_group[]){{1, &p, 0.1}, {-1, &q, 0.0}},
                           "groups[1].n is negative (-1)");
    expect_groups_rejected(ctx, &o, 1, (loom_optim_group[]){{2, NULL, 0.1}},
                           "groups[0].params is NULL for n = 2");
    expect_groups_rejected(ctx, &o, 2,
                           (loom_optim_group[]){{1, &p, 0.1}, {1, (loom_tensor *[]){NULL}, 0.0}},
                           "groups[1].params[0] is NULL");
    loom_tensor *result = loom_add(ctx, p, p);
    expect_groups_rejected(
        ctx, &o, 2, (loom_optim_group[]){{0, NULL, 0.1}, {2, (loom_tensor *[]){q, result}, 0}},
        "groups[1].params[1] is a result of this step");
    int32_t iv[N] = {1, 2, 3, 4};
    loom_tensor *ip = loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 1, (int64_t[]){N}, iv);
    expect_groups_rejected(ctx, &o, 2, (loom_optim_group[]){{1, &p, 0.1}, {1, &ip, 0.0}},
                           "groups[1].params[0] is i32; parameters must be floating point");
    o.weight_decay = -0.5; /* the default is checked even when every group has its own */
    expect_groups_rejected(ctx, &o, 1, (loom_optim_group[]){{1, &p, 0.1}},
                           "AdamW: weight_decay must be finite and >= 0, got -0.5");
    loom_optim *opt = NULL;
    assert_int_equal(
        loom_optim_create_groups(NULL, &o, 1, (loom_optim_group[]){{1, &p, 0.1}}, &opt),
        LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_context_error(ctx), LOOM_OK); /* nothing recorded for a NULL ctx */
    /* the same parameters in two groups of their own are fine, in either order */
    o.weight_decay = 0;
    assert_int_equal(loom_optim_create_groups(
                         ctx, &o, 2, (loom_optim_group[]){{1, &qp[0], 0.1}, {1, &qp[1], 0}}, &opt),
                     LOOM_OK);
    loom_optim_destroy(opt);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    loom_tensor_release(ip);
    loom_tensor_release(p);
    loom_tensor_release(q);
    assert_int_equal(ctx->n_live_tensors, live0); /* rejected creates left nothing behind */
    loom_context_destroy(ctx);
}

/* ---- gradient clipping ------------------------------------------------------------------ */

/* PyTorch's coefficient in f32: reciprocal(total + 1e-6) * max_norm, clamped to 1. */
static float torch_clip_coef(float total, double max_norm) {
    float r = 1.0f / (total + (float)1e-6);
    float c = r * (float)max_norm;
    return c > 1.0f ? 1.0f : c;
}

static float read_f32_scalar(loom_context *ctx, loom_tensor *t) {
    float v = -1;
    tu_read_f32(ctx, t, &v, 1);
    return v;
}

static void run_clip_values(bool eager) {
    loom_context *ctx = tu_context(eager);
    loom_tensor *a = tu_f32(ctx, 2, (float[]){3, 4});
    loom_tensor *b = loom_tensor_from_host(ctx, LOOM_DTYPE_F64, 1, (int64_t[]){1}, (double[]){12});
    loom_tensor *grads[3] = {a, NULL, b}, *norm = NULL;
    /* norms 5 and 12 (this one in f64), total sqrt(5^2 + 12^2) = 13 */
    assert_int_equal(loom_clip_grad_norm(ctx, 3, grads, 6.5, &norm), LOOM_OK);
    assert_true(grads[0] != a && grads[2] != b);
    assert_null(grads[1]);
    float c = torch_clip_coef(13.0f, 6.5);
    assert_true(fabs(c - 6.5 / (13 + 1e-6)) < 1e-7); /* the formula, to f32's precision */
    float ga[2];
    double gb = 0;
    tu_read_f32(ctx, grads[0], ga, 2);
    assert_int_equal(loom_tensor_read(ctx, grads[2], &gb, sizeof gb), LOOM_OK);
    assert_true(ga[0] == 3.0f * c && ga[1] == 4.0f * c && gb == 12.0 * (double)c);
    loom_dtype dt;
    int32_t rank = -1;
    assert_int_equal(loom_tensor_dtype(norm, &dt), LOOM_OK);
    assert_int_equal(loom_tensor_rank(norm, &rank), LOOM_OK);
    assert_true(dt == LOOM_DTYPE_F32 && rank == 0);
    assert_true(read_f32_scalar(ctx, norm) == 13.0f);
    tu_read_f32(ctx, a, ga, 2); /* the original gradients are untouched */
    assert_true(ga[0] == 3.0f && ga[1] == 4.0f);
    loom_tensor_release(a);
    loom_tensor_release(b);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_clip_grad_norm_scales_by_max_norm_over_the_total_norm(void **state) {
    (void)state;
    run_clip_values(true);
    run_clip_values(false);
}

static void run_no_clip(bool eager) {
    loom_context *ctx = tu_context(eager);
    loom_tensor *orig[2] = {tu_f32(ctx, N, G[0]), tu_f32(ctx, N, G[1])};
    loom_tensor *grads[2] = {orig[0], orig[1]}, *norm = NULL;
    assert_int_equal(loom_clip_grad_norm(ctx, 2, grads, 100.0, &norm), LOOM_OK);
    float got[N];
    for (int j = 0; j < 2; j++) { /* coefficient clamped to 1: the same bits */
        assert_true(grads[j] != orig[j]);
        read_vec(ctx, grads[j], got);
        assert_memory_equal(got, G[j], sizeof got);
    }
    double sq = 0;
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < N; i++)
            sq += (double)G[j][i] * G[j][i];
    assert_true(fabs(read_f32_scalar(ctx, norm) - sqrt(sq)) < 1e-6 * sqrt(sq));
    loom_tensor_release(orig[0]);
    loom_tensor_release(orig[1]);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_clip_grad_norm_below_max_norm_keeps_gradients_bit_identical(void **state) {
    (void)state;
    run_no_clip(true);
    run_no_clip(false);
}

/* A bf16 [15,20] of ones (300 squares: a bf16 sum would stall at 256), an f16 [5,12] and an
 * f32 [12]: the norms in f32; the coefficient cast to the gradient's dtype, then multiplied
 * (12 * c rounds to another f16 than 12 * f16(c) does). */
static void run_clip_16_bit(bool eager) {
    loom_context *ctx = tu_context(eager);
    uint16_t ones[300], h[2] = {loom_ir_f32_to_f16(5.0f), loom_ir_f32_to_f16(12.0f)};
    for (int i = 0; i < 300; i++)
        ones[i] = loom_ir_f32_to_bf16(1.0f);
    loom_tensor *orig[3] = {
        loom_tensor_from_host(ctx, LOOM_DTYPE_BF16, 2, (int64_t[]){15, 20}, ones),
        loom_tensor_from_host(ctx, LOOM_DTYPE_F16, 1, (int64_t[]){2}, h),
        tu_f32(ctx, 1, (float[]){12}),
    };
    loom_tensor *grads[3] = {orig[0], orig[1], orig[2]}, *norm = NULL;
    assert_int_equal(loom_clip_grad_norm(ctx, 3, grads, 2.0, &norm), LOOM_OK);
    float n0 = sqrtf(300.0f), total = sqrtf(n0 * n0 + 169.0f + 144.0f);
    float c = torch_clip_coef(total, 2.0);
    assert_true(read_f32_scalar(ctx, norm) == total);
    loom_dtype dt;
    uint16_t got[300];
    assert_int_equal(loom_tensor_dtype(grads[0], &dt), LOOM_OK);
    assert_int_equal(dt, LOOM_DTYPE_BF16);
    assert_int_equal(loom_tensor_read(ctx, grads[0], got, sizeof got), LOOM_OK);
    uint16_t want_bf = loom_ir_f32_to_bf16(loom_ir_bf16_to_f32(loom_ir_f32_to_bf16(c)));
    for (int i = 0; i < 300; i++)
        assert_int_equal(got[i], want_bf);
    assert_int_equal(loom_tensor_read(ctx, grads[1], got, 2 * sizeof *got), LOOM_OK);
    float c16 = loom_ir_f16_to_f32(loom_ir_f32_to_f16(c)); /* the coefficient in f16 */
    assert_int_equal(got[0], loom_ir_f32_to_f16(5.0f * c16));
    assert_int_equal(got[1], loom_ir_f32_to_f16(12.0f * c16));
    assert_int_not_equal(got[1], loom_ir_f32_to_f16(12.0f * c)); /* the case tells them apart */
    float g32 = 0;
    tu_read_f32(ctx, grads[2], &g32, 1);
    assert_true(g32 == 12.0f * c);
    for (int i = 0; i < 3; i++)
        loom_tensor_release(orig[i]);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_clip_grad_norm_of_16_bit_gradients_sums_in_f32(void **state) {
    (void)state;
    run_clip_16_bit(true);
    run_clip_16_bit(false);
}

static void test_clip_grad_norm_without_gradients_gives_a_zero_norm(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    loom_tensor *norm = NULL;
    assert_int_equal(loom_clip_grad_norm(ctx, 0, NULL, 1.0, &norm), LOOM_OK);
    assert_non_null(norm);
    assert_true(read_f32_scalar(ctx, norm) == 0.0f);
    float unused = 0;
    loom_tensor *empty = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){0, 3}, &unused);
    loom_tensor *grads[3] = {NULL, empty, NULL};
    norm = NULL;
    assert_int_equal(loom_clip_grad_norm(ctx, 3, grads, 1.0, &norm), LOOM_OK);
    assert_true(grads[0] == NULL && grads[1] == empty && grads[2] == NULL); /* left as given */
    assert_true(read_f32_scalar(ctx, norm) == 0.0f);
    assert_int_equal(loom_clip_grad_norm(ctx, 3, grads, 1.0, NULL), LOOM_OK); /* no norm wanted */
    /* an empty gradient beside a real one: scaled (to nothing), and adds 0 to the norm */
    loom_tensor *g = tu_f32(ctx, 2, (float[]){3, 4});
    grads[0] = g;
    assert_int_equal(loom_clip_grad_norm(ctx, 3, grads, 1.0, &norm), LOOM_OK);
    assert_true(read_f32_scalar(ctx, norm) == 5.0f);
    float got[2];
    tu_read_f32(ctx, grads[0], got, 2);
    float c = torch_clip_coef(5.0f, 1.0);
    assert_true(got[0] == 3.0f * c && got[1] == 4.0f * c);
    int64_t numel = -1;
    assert_int_equal(loom_tensor_numel(grads[1], &numel), LOOM_OK);
    assert_int_equal(numel, 0);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    loom_tensor_release(g);
    loom_tensor_release(empty);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

/* Clipping then AdamW over two parameters for three steps (clipped, not clipped, clipped)
 * against the reference in double, with the norm read back each step. */
static void run_clip_then_step(bool eager) {
    loom_context *ctx = tu_context(eager);
    loom_tensor *ps[2] = {tu_f32(ctx, N, P0), tu_f32(ctx, N, Q0)};
    loom_optim_options o;
    loom_optim_options_init(&o, LOOM_OPTIM_ADAMW);
    o.lr = 0.05;
    loom_optim *opt = NULL;
    assert_int_equal(loom_optim_create(ctx, &o, 2, ps, &opt), LOOM_OK);
    ref_state r[2];
    ref_init(&r[0]);
    ref_init(&r[1]);
    memcpy(r[1].p, (double[]){Q0[0], Q0[1], Q0[2], Q0[3]}, sizeof r[1].p);
    const double max_norm = 2.5;
    bool clipped[STEPS];
    for (int s = 0; s < STEPS; s++) {
        const float *gs[2] = {G[s], G[(s + 1) % STEPS]};
        loom_tensor *g[2] = {tu_f32(ctx, N, gs[0]), tu_f32(ctx, N, gs[1])};
        loom_tensor *grads[2] = {g[0], g[1]}, *norm = NULL;
        assert_int_equal(loom_clip_grad_norm(ctx, 2, grads, max_norm, &norm), LOOM_OK);
        loom_tensor_retain(norm);
        assert_int_equal(loom_optim_step(opt, grads, NULL), LOOM_OK);
        assert_int_equal(loom_mark_step(ctx), LOOM_OK);
        double sq = 0, want[2][N];
        for (int j = 0; j < 2; j++)
            for (int i = 0; i < N; i++)
                sq += (double)gs[j][i] * gs[j][i];
        double total = sqrt(sq), coef = fmin(1.0, max_norm / (total + 1e-6));
        clipped[s] = coef < 1;
        float got = read_f32_scalar(ctx, norm);
        assert_true(fabs(got - total) < 1e-6 * total);
        for (int j = 0; j < 2; j++) {
            for (int i = 0; i < N; i++)
                want[j][i] = gs[j][i] * coef;
            ref_step_d(&o, &r[j], want[j]);
            expect_state_of(ctx, opt, j, ps[j], &r[j]);
        }
        loom_tensor_release(norm);
        loom_tensor_release(g[0]);
        loom_tensor_release(g[1]);
    }
    assert_true(clipped[0] && !clipped[1] && clipped[2]); /* both cases were run */
    if (!eager) {
        assert_int_equal(loom_metric_value(ctx, "Fallbacks"), 0);
        assert_int_equal(loom_metric_value(ctx, "CacheMiss"), 1);
    }
    loom_optim_destroy(opt);
    loom_tensor_release(ps[0]);
    loom_tensor_release(ps[1]);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

static void test_clip_then_step_matches_the_reference_on_the_interpreter_and_the_jit(void **state) {
    (void)state;
    run_clip_then_step(true);
    run_clip_then_step(false);
}

/* A rejected clip: code and message, grads as given, *out_total_norm NULL. */
static void expect_clip_rejected(loom_context *ctx, int32_t n, loom_tensor **grads, double max_norm,
                                 loom_status code, const char *message) {
    loom_tensor *before[4] = {0};
    if (grads && n > 0)
        memcpy(before, grads, (size_t)n * sizeof *grads);
    loom_tensor *norm = (loom_tensor *)&norm;
    assert_int_equal(loom_clip_grad_norm(ctx, n, grads, max_norm, &norm), code);
    assert_null(norm);
    if (grads && n > 0)
        assert_memory_equal(before, grads, (size_t)n * sizeof *grads);
    if (!strstr(loom_context_error_message(ctx), message)) {
        print_error("message '%s' lacks '%s'\n", loom_context_error_message(ctx), message);
        fail();
    }
    loom_context_clear_error(ctx);
}

static void test_clip_grad_norm_rejects_bad_arguments_before_recording(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    loom_tensor *g = tu_f32(ctx, N, G[0]);
    int32_t iv[N] = {1, 2, 3, 4};
    loom_tensor *ig = loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 1, (int64_t[]){N}, iv);
    loom_tensor *grads[2] = {g, NULL};
    const loom_status bad = LOOM_STATUS_INVALID_ARGUMENT;
    expect_clip_rejected(ctx, -1, grads, 1.0, bad, "clip_grad_norm: n is negative (-1)");
    expect_clip_rejected(ctx, 2, NULL, 1.0, bad, "clip_grad_norm: grads is NULL for n = 2");
    expect_clip_rejected(ctx, 2, grads, 0.0, bad, "test_optim.c:" /* the caller's file */);
    expect_clip_rejected(ctx, 2, grads, 0.0, bad,
                         "clip_grad_norm: max_norm must be finite and > 0 (in f32), got 0");
    expect_clip_rejected(ctx, 2, grads, -1.0, bad,
                         "max_norm must be finite and > 0 (in f32), got -1");
    expect_clip_rejected(ctx, 2, grads, INFINITY, bad, "got inf");
    expect_clip_rejected(ctx, 2, grads, NAN, bad, "got nan");
    expect_clip_rejected(ctx, 2, grads, 1e39, bad, "got 1e+39");  /* inf in f32 */
    expect_clip_rejected(ctx, 2, grads, 1e-50, bad, "got 1e-50"); /* 0 in f32 */
    loom_tensor *with_int[2] = {g, ig};
    expect_clip_rejected(ctx, 2, with_int, 1.0, bad,
                         "clip_grad_norm: grads[1] is i32[4], not floating point");
    loom_tensor *tmp = loom_neg(ctx, g);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    loom_tensor *with_stale[2] = {g, tmp};
    expect_clip_rejected(ctx, 2, with_stale, 1.0, LOOM_STATUS_STALE_HANDLE, "stale");
    assert_int_equal(loom_clip_grad_norm(NULL, 2, grads, 1.0, NULL), LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    /* FLT_MAX, the largest max_norm, measures without clipping */
    loom_tensor *norm = NULL;
    assert_int_equal(loom_clip_grad_norm(ctx, 2, grads, FLT_MAX, &norm), LOOM_OK);
    float got[N];
    read_vec(ctx, grads[0], got);
    assert_memory_equal(got, G[0], sizeof got);
    loom_tensor_release(g);
    loom_tensor_release(ig);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    assert_int_equal(loom_context_error(ctx), LOOM_OK);
    loom_context_destroy(ctx);
}

/* ---- out of memory ---------------------------------------------------------------------- */

/* create, create_groups, clip_grad_norm and step, failing each allocation in turn. */
static void test_create_and_step_fail_cleanly_out_of_memory(void **state) {
    (void)state;
    for (int64_t fail_at = 1;; fail_at++) {
        test_alloc ta = {0};
        loom_context *ctx = tu_context_alloc(true, &ta);
        loom_tensor *p = tu_f32(ctx, N, P0), *g = tu_f32(ctx, N, G[0]);
        loom_tensor *q = tu_f32(ctx, N, Q0), *h = tu_f32(ctx, N, G[1]);
        int32_t live0 = ctx->n_live_tensors;
        ta.fail_at = ta.n_allocs + fail_at;
        loom_optim_options o;
        loom_optim_options_init(&o, LOOM_OPTIM_ADAM);
        loom_optim *opt = NULL, *grouped = NULL;
        loom_status st = loom_optim_create(ctx, &o, 1, &p, &opt);
        if (st == LOOM_OK)
            st = loom_optim_step(opt, &g, NULL);
        o.kind = LOOM_OPTIM_ADAMW;
        if (st == LOOM_OK)
            st = loom_optim_create_groups(
                ctx, &o, 2, (loom_optim_group[]){{1, &q, 0.1}, {1, &p, 0.0}}, &grouped);
        if (st != LOOM_OK)
            assert_null(grouped);
        loom_tensor *grads[2] = {h, g}, *norm = NULL;
        if (st == LOOM_OK) {
            st = loom_clip_grad_norm(ctx, 2, grads, 1.0, &norm);
            if (st != LOOM_OK) /* left as given */
                assert_true(grads[0] == h && grads[1] == g && !norm);
        }
        if (st == LOOM_OK)
            st = loom_optim_step(grouped, grads, NULL);
        bool failed = ta.n_failed > 0;
        if (failed) {
            assert_int_equal(st, LOOM_STATUS_OUT_OF_MEMORY);
            if (!opt)
                assert_int_equal(ctx->n_live_tensors, live0);
        } else {
            assert_int_equal(st, LOOM_OK);
        }
        ta.fail_at = 0;
        loom_context_clear_error(ctx);
        loom_optim_destroy(opt);
        loom_optim_destroy(grouped);
        loom_tensor_release(p);
        loom_tensor_release(g);
        loom_tensor_release(q);
        loom_tensor_release(h);
        loom_context_destroy(ctx);
        assert_int_equal(ta.live_bytes, 0);
        if (!failed)
            break;
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_plain_subtracts_lr_times_gradient),
        cmocka_unit_test(test_sgd_momentum_starts_the_buffer_with_the_first_gradient),
        cmocka_unit_test(test_sgd_dampening_scales_later_gradients_only),
        cmocka_unit_test(test_sgd_nesterov_looks_ahead_by_momentum),
        cmocka_unit_test(test_sgd_weight_decay_adds_l2_to_the_gradient),
        cmocka_unit_test(test_adam_bias_corrects_both_moments),
        cmocka_unit_test(test_adam_weight_decay_is_l2_in_the_gradient),
        cmocka_unit_test(test_adamw_decays_the_parameter_before_the_adam_step),
        cmocka_unit_test(test_found_inf_skips_every_update_and_the_step_count),
        cmocka_unit_test(test_nan_found_inf_also_skips),
        cmocka_unit_test(test_set_lr_changes_the_update_without_recompiling),
        cmocka_unit_test(test_set_lr_rejects_negative_and_non_finite_rates),
        cmocka_unit_test(test_null_grads_leave_their_parameter_and_state_untouched),
        cmocka_unit_test(test_step_rejects_mismatched_grads_and_found_inf_without_recording),
        cmocka_unit_test(test_create_rejects_invalid_options_with_clear_messages),
        cmocka_unit_test(test_options_init_gives_pytorch_defaults),
        cmocka_unit_test(test_state_names_follow_pytorch_state_dict_keys),
        cmocka_unit_test(test_groups_apply_their_own_weight_decay_for_every_kind),
        cmocka_unit_test(test_create_groups_rejects_bad_groups_naming_the_position),
        cmocka_unit_test(test_clip_grad_norm_scales_by_max_norm_over_the_total_norm),
        cmocka_unit_test(test_clip_grad_norm_below_max_norm_keeps_gradients_bit_identical),
        cmocka_unit_test(test_clip_grad_norm_of_16_bit_gradients_sums_in_f32),
        cmocka_unit_test(test_clip_grad_norm_without_gradients_gives_a_zero_norm),
        cmocka_unit_test(test_clip_then_step_matches_the_reference_on_the_interpreter_and_the_jit),
        cmocka_unit_test(test_clip_grad_norm_rejects_bad_arguments_before_recording),
        cmocka_unit_test(test_create_and_step_fail_cleanly_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
