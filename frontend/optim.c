/* Optimizers (SGD, Adam, AdamW) recorded as graph ops with PyTorch 1.13's single-tensor
 * update rules, written back in place with loom_assign; sync-free through found_inf. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "frontend.h"
#include "loom/optim.h"

/* Per parameter at most two state tensors: momentum_buffer, or exp_avg and exp_avg_sq. */
#define OPTIM_STATE_PER_PARAM 2

struct loom_optim {
    loom_context *ctx;
    loom_allocator alloc; /* a copy, so destroy works even after a mistaken context destroy */
    loom_optim_options o;
    int32_t n;
    loom_tensor **params; /* borrowed; the groups' parameters in group order */
    double *weight_decay; /* n: each parameter's group's */
    loom_tensor **state;  /* n * OPTIM_STATE_PER_PARAM, owned; NULL where the kind has none */
    loom_tensor *step;    /* f32 scalar, owned: clean steps taken so far */
    loom_tensor *lr;      /* f64 scalar, owned: a graph input, replaced by set_lr */
};

LOOM_API void loom_optim_options_init(loom_optim_options *o, loom_optim_kind kind) {
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->kind = kind;
    o->lr = 1e-3;
    o->weight_decay = kind == LOOM_OPTIM_ADAMW ? 1e-2 : 0.0;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8;
}

static const char *kind_name(loom_optim_kind k) {
    switch (k) {
    case LOOM_OPTIM_SGD: return "SGD";
    case LOOM_OPTIM_ADAM: return "Adam";
    case LOOM_OPTIM_ADAMW: return "AdamW";
    case LOOM_OPTIM_COUNT_: break;
    }
    return "?";
}

static bool valid_lr(double lr) {
    return lr >= 0 && isfinite(lr);
}

/* The checks of PyTorch's constructors, for the fields the kind uses. Negated comparisons
 * so that NaN is rejected too. */
static loom_status check_options(loom_context *ctx, const loom_optim_options *o, const char *op) {
#define BAD(...) loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, __VA_ARGS__)
    if ((int)o->kind < 0 || o->kind >= LOOM_OPTIM_COUNT_)
        return BAD("unknown optimizer kind %d", (int)o->kind);
    const char *k = kind_name(o->kind);
    if (!valid_lr(o->lr))
        return BAD("%s: lr must be finite and >= 0, got %g", k, o->lr);
    if (!(o->weight_decay >= 0) || !isfinite(o->weight_decay))
        return BAD("%s: weight_decay must be finite and >= 0, got %g", k, o->weight_decay);
    if (o->kind == LOOM_OPTIM_SGD) {
        if (!(o->momentum >= 0) || !isfinite(o->momentum))
            return BAD("SGD: momentum must be finite and >= 0, got %g", o->momentum);
        if (!isfinite(o->dampening))
            return BAD("SGD: dampening must be finite, got %g", o->dampening);
        if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
            return BAD("SGD: nesterov needs momentum > 0 and dampening == 0, got momentum %g, "
                       "dampening %g",
                       o->momentum, o->dampening);
    } else {
        if (!(o->beta1 >= 0 && o->beta1 < 1))
            return BAD("%s: beta1 must be in [0, 1), got %g", k, o->beta1);
        if (!(o->beta2 >= 0 && o->beta2 < 1))
            return BAD("%s: beta2 must be in [0, 1), got %g", k, o->beta2);
        if (!(o->eps >= 0) || !isfinite(o->eps))
            return BAD("%s: eps must be finite and >= 0, got %g", k, o->eps);
    }
    return LOOM_OK;
#undef BAD
}

/* How many state tensors parameter i has (besides the shared step). */
static int32_t n_state(const loom_optim_options *o) {
    if (o->kind == LOOM_OPTIM_SGD)
        return o->momentum != 0 ? 1 : 0;
    return 2;
}

static loom_tensor *lr_tensor(loom_context *ctx, double lr) {
    return loom_tensor_from_host(ctx, LOOM_DTYPE_F64, 0, NULL, &lr);
}

LOOM_API void loom_optim_destroy(loom_optim *opt) {
    if (!opt)
        return;
    if (opt->state) {
        for (int32_t i = 0; i < opt->n * OPTIM_STATE_PER_PARAM; i++)
            loom_tensor_release(opt->state[i]);
        loom_ir_free(&opt->alloc, opt->state,
                     (size_t)opt->n * OPTIM_STATE_PER_PARAM * sizeof *opt->state);
    }
    loom_ir_free(&opt->alloc, opt->params, (size_t)opt->n * sizeof *opt->params);
    loom_ir_free(&opt->alloc, opt->weight_decay, (size_t)opt->n * sizeof *opt->weight_decay);
    loom_tensor_release(opt->step);
    loom_tensor_release(opt->lr);
    loom_allocator a = opt->alloc;
    loom_ir_free(&a, opt, sizeof *opt);
}

/* "params[3]", or "groups[1].params[2]" for flat index i of a grouped create. */
static const char *param_name(char *buf, size_t size, bool grouped, int32_t n_groups,
                              const loom_optim_group *groups, int32_t i) {
    if (!grouped) {
        snprintf(buf, size, "params[%d]", (int)i);
        return buf;
    }
    int32_t g = 0;
    while (g < n_groups - 1 && i >= groups[g].n)
        i -= groups[g++].n;
    snprintf(buf, size, "groups[%d].params[%d]", (int)g, (int)i);
    return buf;
}

/* The groups' own fields, before anything is allocated: their total size in *out_n. */
static loom_status check_groups(loom_context *ctx, const loom_optim_options *o, int32_t n_groups,
                                const loom_optim_group *groups, bool grouped, int32_t *out_n,
                                const char *op) {
#define BAD(...) loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, __VA_ARGS__)
    if (!grouped) { /* loom_optim_create: its messages name params and n */
        if (groups[0].n < 1)
            return BAD("needs at least one parameter, got n = %d", (int)groups[0].n);
        *out_n = groups[0].n;
        return LOOM_OK;
    }
    if (n_groups < 1)
        return BAD("needs at least one group, got n_groups = %d", (int)n_groups);
    int64_t total = 0;
    for (int32_t g = 0; g < n_groups; g++) {
        const loom_optim_group *gr = &groups[g];
        if (gr->n < 0)
            return BAD("groups[%d].n is negative (%d)", (int)g, (int)gr->n);
        if (gr->n > 0 && !gr->params)
            return BAD("groups[%d].params is NULL for n = %d", (int)g, (int)gr->n);
        if (!(gr->weight_decay >= 0) || !isfinite(gr->weight_decay))
            return BAD("%s: groups[%d].weight_decay must be finite and >= 0, got %g",
                       kind_name(o->kind), (int)g, gr->weight_decay);
        total += gr->n;
    }
    if (total < 1) /* PyTorch: "optimizer got an empty parameter list" */
        return BAD("needs at least one parameter, got none in %d groups", (int)n_groups);
    if (total > INT32_MAX)
        return BAD("more than %d parameters in all groups", (int)INT32_MAX);
    *out_n = (int32_t)total;
    return LOOM_OK;
#undef BAD
}

/* Checks parameter i of the flat list (live, long-lived, float, not listed before); its bytes
 * in *out_bytes. */
static loom_status check_param(loom_context *ctx, loom_tensor *const *flat, int32_t i, bool grouped,
                               int32_t n_groups, const loom_optim_group *groups, size_t *out_bytes,
                               const char *op) {
    char name[48];
    if (!flat[i])
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, "%s is NULL",
                             param_name(name, sizeof name, grouped, n_groups, groups, i));
    const loom_fe_tensor *t = loom_fe_tensor_get(ctx, flat[i], NULL, 0, op);
    if (!t)
        return ctx->err;
    if (t->step_owned)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, t->loc.file, t->loc.line, op,
                             "%s is a result of this step; parameters must be long-lived "
                             "(loom_tensor_from_host, or retained across a mark_step)",
                             param_name(name, sizeof name, grouped, n_groups, groups, i));
    if (!loom_ir_dtype_is_float(t->dtype))
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, t->loc.file, t->loc.line, op,
                             "%s is %s; parameters must be floating point",
                             param_name(name, sizeof name, grouped, n_groups, groups, i),
                             loom_dtype_name(t->dtype));
    *out_bytes = (size_t)loom_ir_numel(t->rank, t->shape) * loom_dtype_size(t->dtype);
    for (int32_t j = 0; j < i; j++)
        if (flat[j] == flat[i]) {
            char first[48];
            return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op,
                                 "%s and %s are the same tensor",
                                 param_name(first, sizeof first, grouped, n_groups, groups, j),
                                 param_name(name, sizeof name, grouped, n_groups, groups, i));
        }
    return LOOM_OK;
}

/* loom_optim_create (one group, grouped false: messages name params[i]) and
 * loom_optim_create_groups. */
static loom_status create(loom_context *ctx, const loom_optim_options *o, int32_t n_groups,
                          const loom_optim_group *groups, bool grouped, loom_optim **out,
                          const char *op) {
    loom_status st = check_options(ctx, o, op);
    int32_t n = 0;
    if (st == LOOM_OK)
        st = check_groups(ctx, o, n_groups, groups, grouped, &n, op);
    if (st != LOOM_OK)
        return st;

    /* Each allocation is zeroed before anything can fail after it, so destroy can clean up
     * from any point. */
    void *zeros = NULL;
    size_t max_bytes = sizeof(float);
    loom_optim *opt = loom_ir_alloc(&ctx->alloc, sizeof *opt);
    if (!opt)
        goto oom;
    memset(opt, 0, sizeof *opt);
    opt->ctx = ctx;
    opt->alloc = ctx->alloc;
    opt->o = *o;
    opt->params = loom_ir_alloc(&ctx->alloc, (size_t)n * sizeof *opt->params);
    opt->weight_decay = loom_ir_alloc(&ctx->alloc, (size_t)n * sizeof *opt->weight_decay);
    opt->state = loom_ir_alloc(&ctx->alloc, (size_t)n * OPTIM_STATE_PER_PARAM * sizeof *opt->state);
    opt->n = n; /* destroy frees the three arrays by n; NULL ones are skipped */
    if (!opt->params || !opt->weight_decay || !opt->state)
        goto oom;
    memset(opt->state, 0, (size_t)n * OPTIM_STATE_PER_PARAM * sizeof *opt->state);
    /* The flat parameter list, in group order, and each parameter's group's decay. */
    for (int32_t g = 0, i = 0; g < n_groups && i < n; g++) {
        int32_t gn = grouped ? groups[g].n : n;
        for (int32_t j = 0; j < gn; j++, i++) {
            opt->params[i] = groups[g].params[j];
            opt->weight_decay[i] = groups[g].weight_decay;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        size_t bytes = 0;
        st = check_param(ctx, opt->params, i, grouped, n_groups, groups, &bytes, op);
        if (st != LOOM_OK)
            goto fail;
        if (bytes > max_bytes)
            max_bytes = bytes;
    }
    zeros = loom_ir_alloc(&ctx->alloc, max_bytes);
    if (!zeros)
        goto oom;
    memset(zeros, 0, max_bytes);

    /* State tensors: zero-filled, long-lived, of their parameter's type. The slot table may
     * move while tensors are created, so each parameter's type is copied out first. */
    for (int32_t i = 0; i < n; i++) {
        const loom_fe_tensor *t = loom_fe_tensor_get(ctx, opt->params[i], NULL, 0, op);
        loom_dtype dt = t->dtype;
        int32_t rank = t->rank;
        int64_t shape[LOOM_MAX_RANK];
        memcpy(shape, t->shape, sizeof shape);
        for (int32_t k = 0; k < n_state(o); k++) {
            loom_tensor *s = loom_tensor_from_host(ctx, dt, rank, shape, zeros);
            if (!s)
                goto fail;
            opt->state[i * OPTIM_STATE_PER_PARAM + k] = s;
        }
    }
    float zero = 0;
    opt->step = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 0, NULL, &zero);
    opt->lr = lr_tensor(ctx, o->lr);
    if (!opt->step || !opt->lr)
        goto fail;
    loom_ir_free(&ctx->alloc, zeros, max_bytes);
    *out = opt;
    return LOOM_OK;

oom:
    loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, NULL, 0, op, "out of memory");
fail:
    loom_ir_free(&ctx->alloc, zeros, zeros ? max_bytes : 0);
    if (opt)
        loom_optim_destroy(opt);
    return ctx->err != LOOM_OK ? ctx->err : LOOM_STATUS_OUT_OF_MEMORY;
}

LOOM_API loom_status loom_optim_create(loom_context *ctx, const loom_optim_options *o, int32_t n,
                                       loom_tensor *const *params, loom_optim **out) {
    LOOM_FE_USE(ctx, "optim_create", LOOM_STATUS_BUSY);
    static const char op[] = "optim_create";
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (out)
        *out = NULL;
    if (!o || !params || !out)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, "%s is NULL",
                             !o        ? "options"
                             : !params ? "params"
                                       : "out");
    const loom_optim_group all = {n, params, o->weight_decay};
    return create(ctx, o, 1, &all, false, out, op);
}

LOOM_API loom_status loom_optim_create_groups(loom_context *ctx, const loom_optim_options *o,
                                              int32_t n_groups, const loom_optim_group *groups,
                                              loom_optim **out) {
    LOOM_FE_USE(ctx, "optim_create_groups", LOOM_STATUS_BUSY);
    static const char op[] = "optim_create_groups";
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (out)
        *out = NULL;
    if (!o || !groups || !out)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, "%s is NULL",
                             !o        ? "options"
                             : !groups ? "groups"
                                       : "out");
    return create(ctx, o, n_groups, groups, true, out, op);
}

/* The slot behind parameter or gradient h, after checking it (recorded error otherwise). */
static const loom_fe_tensor *get(loom_context *ctx, loom_tensor *h, const char *op) {
    return loom_fe_tensor_get(ctx, h, NULL, 0, op);
}

/* Validates everything before recording anything, so a bad call leaves no partial update. */
static loom_status check_step(loom_optim *opt, loom_tensor *const *grads, loom_tensor *found_inf,
                              bool *out_any, const char *op) {
    loom_context *ctx = opt->ctx;
    *out_any = false;
    for (int32_t i = 0; i < opt->n; i++) {
        if (!grads[i])
            continue;
        const loom_fe_tensor *p = get(ctx, opt->params[i], op);
        if (!p)
            return ctx->err;
        loom_dtype pdt = p->dtype;
        int32_t prank = p->rank;
        int64_t pshape[LOOM_MAX_RANK];
        memcpy(pshape, p->shape, sizeof pshape);
        const loom_fe_tensor *g = get(ctx, grads[i], op);
        if (!g)
            return ctx->err;
        if (g->dtype != pdt || g->rank != prank ||
            memcmp(g->shape, pshape, (size_t)prank * sizeof *pshape) != 0) {
            char tp[LOOM_IR_TYPE_STR_MAX], tg[LOOM_IR_TYPE_STR_MAX];
            return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, g->loc.file, g->loc.line, op,
                                 "grads[%d] is %s but its parameter is %s", (int)i,
                                 loom_ir_format_type(tg, sizeof tg, g->dtype, g->rank, g->shape),
                                 loom_ir_format_type(tp, sizeof tp, pdt, prank, pshape));
        }
        *out_any = true;
    }
    return found_inf ? loom_fe_check_found_inf(ctx, found_inf, op) : LOOM_OK;
}

loom_status loom_fe_check_found_inf(loom_context *ctx, loom_tensor *found_inf, const char *op) {
    const loom_fe_tensor *f = get(ctx, found_inf, op);
    if (!f)
        return ctx->err;
    if (loom_ir_numel(f->rank, f->shape) != 1 ||
        (f->dtype != LOOM_DTYPE_BOOL && !loom_ir_dtype_is_float(f->dtype))) {
        char tf[LOOM_IR_TYPE_STR_MAX];
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, f->loc.file, f->loc.line, op,
                             "found_inf must be one float or bool element, got %s",
                             loom_ir_format_type(tf, sizeof tf, f->dtype, f->rank, f->shape));
    }
    return LOOM_OK;
}

loom_tensor *loom_fe_found_inf_flag(loom_context *ctx, loom_tensor *found_inf) {
    loom_tensor *f = loom_reshape(ctx, found_inf, 0, NULL);
    loom_dtype fdt = LOOM_DTYPE_BOOL;
    loom_tensor_dtype(found_inf, &fdt);
    /* non-zero (NaN included) means skip */
    return fdt == LOOM_DTYPE_BOOL ? f : loom_ne(ctx, f, loom_scalar(ctx, fdt, 0.0));
}

/* Shared per-step scalars, recorded once per loom_optim_step (f64 unless noted). */
typedef struct step_scalars {
    loom_tensor *skip;      /* bool scalar, NULL without found_inf */
    loom_tensor *step_new;  /* f32: step + 1 (or step when skipped) */
    loom_tensor *first;     /* SGD: bool, no clean step taken yet */
    loom_tensor *lr;        /* f64 */
    loom_tensor *step_size; /* Adam: lr / (1 - beta1^step) */
    loom_tensor *bc2_sqrt;  /* Adam: sqrt(1 - beta2^step) */
    loom_tensor *decay;     /* AdamW: 1 - lr * decay_wd, recorded when a group needs it */
    double decay_wd;
} step_scalars;

static loom_tensor *keep_if_skipped(loom_context *ctx, const step_scalars *s, loom_tensor *old,
                                    loom_tensor *updated) {
    return s->skip ? loom_select(ctx, s->skip, old, updated) : updated;
}

/* Bias corrections and lr products are computed in f64 inside the graph and only the
 * per-step factors rounded to the parameter's dtype: PyTorch computes them on the host in
 * double and passes them to its f32 kernels as scalars, which rounds them the same way. */
static void record_step_scalars(loom_optim *opt, loom_tensor *found_inf, step_scalars *s) {
    loom_context *ctx = opt->ctx;
    const loom_optim_options *o = &opt->o;
    memset(s, 0, sizeof *s);
    if (found_inf)
        s->skip = loom_fe_found_inf_flag(ctx, found_inf);
    loom_tensor *advanced = loom_add(ctx, opt->step, loom_scalar(ctx, LOOM_DTYPE_F32, 1.0));
    s->step_new = keep_if_skipped(ctx, s, opt->step, advanced);
    s->lr = opt->lr;
    if (o->kind == LOOM_OPTIM_SGD) {
        s->first = loom_eq(ctx, opt->step, loom_scalar(ctx, LOOM_DTYPE_F32, 0.0));
        return;
    }
    loom_tensor *t = loom_cast(ctx, s->step_new, LOOM_DTYPE_F64);
    loom_tensor *one = loom_scalar(ctx, LOOM_DTYPE_F64, 1.0);
    loom_tensor *bc1 =
        loom_sub(ctx, one, loom_pow(ctx, loom_scalar(ctx, LOOM_DTYPE_F64, o->beta1), t));
    loom_tensor *bc2 =
        loom_sub(ctx, one, loom_pow(ctx, loom_scalar(ctx, LOOM_DTYPE_F64, o->beta2), t));
    s->step_size = loom_div(ctx, opt->lr, bc1);
    s->bc2_sqrt = loom_sqrt(ctx, bc2);
}

/* AdamW's 1 - lr * wd (f64), recorded once per run of parameters with the same decay: a
 * group's parameters are consecutive, so that is once per group. */
static loom_tensor *adamw_decay(loom_context *ctx, step_scalars *s, double wd) {
    if (!s->decay || s->decay_wd != wd) {
        s->decay = loom_sub(ctx, loom_scalar(ctx, LOOM_DTYPE_F64, 1.0),
                            loom_mul(ctx, s->lr, loom_scalar(ctx, LOOM_DTYPE_F64, wd)));
        s->decay_wd = wd;
    }
    return s->decay;
}

/* value * c for a graph constant c of dtype dt. */
static loom_tensor *scale(loom_context *ctx, loom_tensor *value, double c, loom_dtype dt) {
    return loom_mul(ctx, value, loom_scalar(ctx, dt, c));
}

/* Assigns value to dst; a NULL value means an op above failed and recorded why. */
static loom_status put(loom_context *ctx, loom_tensor *dst, loom_tensor *value) {
    if (!value)
        return ctx->err != LOOM_OK ? ctx->err : LOOM_STATUS_INTERNAL;
    return loom_assign(ctx, dst, value);
}

/* torch.optim.sgd._single_tensor_sgd */
static loom_status sgd_update(loom_optim *opt, int32_t i, loom_tensor *g, loom_dtype dt,
                              const step_scalars *s) {
    loom_context *ctx = opt->ctx;
    const loom_optim_options *o = &opt->o;
    loom_tensor *p = opt->params[i];
    loom_tensor *d = g;
    double wd = opt->weight_decay[i];
    if (wd != 0)
        d = loom_add(ctx, d, scale(ctx, p, wd, dt));
    if (o->momentum != 0) {
        loom_tensor *buf = opt->state[i * OPTIM_STATE_PER_PARAM];
        loom_tensor *damped = o->dampening != 0 ? scale(ctx, d, 1.0 - o->dampening, dt) : d;
        loom_tensor *next = loom_add(ctx, scale(ctx, buf, o->momentum, dt), damped);
        /* PyTorch starts the buffer as a clone of the first gradient (no dampening). */
        next = loom_select(ctx, s->first, d, next);
        d = o->nesterov ? loom_add(ctx, d, scale(ctx, next, o->momentum, dt)) : next;
        loom_status st = put(ctx, buf, keep_if_skipped(ctx, s, buf, next));
        if (st != LOOM_OK)
            return st;
    }
    loom_tensor *lr = loom_cast(ctx, s->lr, dt);
    return put(ctx, p, keep_if_skipped(ctx, s, p, loom_sub(ctx, p, loom_mul(ctx, d, lr))));
}

/* torch.optim.adam._single_tensor_adam and adamw._single_tensor_adamw (no amsgrad) */
static loom_status adam_update(loom_optim *opt, int32_t i, loom_tensor *g, loom_dtype dt,
                               step_scalars *s) {
    loom_context *ctx = opt->ctx;
    const loom_optim_options *o = &opt->o;
    loom_tensor *p = opt->params[i];
    loom_tensor *m = opt->state[i * OPTIM_STATE_PER_PARAM];
    loom_tensor *v = opt->state[i * OPTIM_STATE_PER_PARAM + 1];
    loom_tensor *base = p; /* the parameter the Adam step starts from */
    double wd = opt->weight_decay[i];
    if (wd != 0 && o->kind == LOOM_OPTIM_ADAMW)
        base = loom_mul(ctx, p, loom_cast(ctx, adamw_decay(ctx, s, wd), dt));
    else if (wd != 0)
        g = loom_add(ctx, g, scale(ctx, p, wd, dt));
    loom_tensor *m_new =
        loom_add(ctx, scale(ctx, m, o->beta1, dt), scale(ctx, g, 1.0 - o->beta1, dt));
    loom_tensor *v_new = loom_add(ctx, scale(ctx, v, o->beta2, dt),
                                  scale(ctx, loom_mul(ctx, g, g), 1.0 - o->beta2, dt));
    loom_tensor *denom =
        loom_add(ctx, loom_div(ctx, loom_sqrt(ctx, v_new), loom_cast(ctx, s->bc2_sqrt, dt)),
                 loom_scalar(ctx, dt, o->eps));
    loom_tensor *p_new = loom_sub(
        ctx, base, loom_mul(ctx, loom_div(ctx, m_new, denom), loom_cast(ctx, s->step_size, dt)));
    loom_status st = put(ctx, m, keep_if_skipped(ctx, s, m, m_new));
    if (st == LOOM_OK)
        st = put(ctx, v, keep_if_skipped(ctx, s, v, v_new));
    if (st == LOOM_OK)
        st = put(ctx, p, keep_if_skipped(ctx, s, p, p_new));
    return st;
}

LOOM_API loom_status loom_optim_step(loom_optim *opt, loom_tensor *const *grads,
                                     loom_tensor *found_inf) {
    static const char op[] = "optim_step";
    if (!opt)
        return LOOM_STATUS_INVALID_ARGUMENT;
    loom_context *ctx = opt->ctx;
    LOOM_FE_USE(ctx, op, LOOM_STATUS_BUSY);
    if (!grads)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op, "grads is NULL");
    bool any = false;
    loom_status st = check_step(opt, grads, found_inf, &any, op);
    if (st != LOOM_OK || !any)
        return st; /* no gradient at all: nothing to do, as in PyTorch */
    step_scalars s;
    record_step_scalars(opt, found_inf, &s);
    for (int32_t i = 0; i < opt->n && st == LOOM_OK; i++) {
        if (!grads[i])
            continue;
        loom_dtype dt = LOOM_DTYPE_F32;
        loom_tensor_dtype(opt->params[i], &dt);
        st = opt->o.kind == LOOM_OPTIM_SGD ? sgd_update(opt, i, grads[i], dt, &s)
                                           : adam_update(opt, i, grads[i], dt, &s);
    }
    /* The step counter last: every update above read its old value. */
    if (st == LOOM_OK)
        st = put(ctx, opt->step, s.step_new);
    return st;
}

LOOM_API loom_status loom_optim_set_lr(loom_optim *opt, double lr) {
    static const char op[] = "optim_set_lr";
    if (!opt)
        return LOOM_STATUS_INVALID_ARGUMENT;
    LOOM_FE_USE(opt->ctx, op, LOOM_STATUS_BUSY);
    if (!valid_lr(lr))
        return loom_fe_error(opt->ctx, LOOM_STATUS_INVALID_ARGUMENT, NULL, 0, op,
                             "lr must be finite and >= 0, got %g", lr);
    /* A fresh graph input of the same type: the graph keeps its hash. Steps recorded
     * before hold the old buffer, so they still use the old rate. */
    loom_tensor *t = lr_tensor(opt->ctx, lr);
    if (!t)
        return opt->ctx->err;
    loom_tensor_release(opt->lr);
    opt->lr = t;
    opt->o.lr = lr;
    return LOOM_OK;
}

LOOM_API int32_t loom_optim_state(const loom_optim *opt, int32_t i, const char **names,
                                  loom_tensor **tensors) {
    if (!opt || i < 0 || i >= opt->n)
        return 0;
    static const char *const sgd_names[] = {"momentum_buffer"};
    static const char *const adam_names[] = {"exp_avg", "exp_avg_sq"};
    const char *const *kn = opt->o.kind == LOOM_OPTIM_SGD ? sgd_names : adam_names;
    int32_t k = n_state(&opt->o);
    for (int32_t j = 0; j < k; j++) {
        if (names)
            names[j] = kn[j];
        if (tensors)
            tensors[j] = opt->state[i * OPTIM_STATE_PER_PARAM + j];
    }
    if (names)
        names[k] = "step";
    if (tensors)
        tensors[k] = opt->step;
    return k + 1;
}
