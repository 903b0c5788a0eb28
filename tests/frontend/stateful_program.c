/* Random stateful programs (stateful_program.h): generation from a byte source, playing
 * them on a context step after step, comparing two contexts' states. */
#include "stateful_program.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- choices ----------------------------------------------------------------------------- */

void sp_source_from_seed(sp_source *src, uint64_t seed) {
    *src = (sp_source){.s = seed * 0x9E3779B97F4A7C15ull + 1};
}

void sp_source_from_bytes(sp_source *src, const uint8_t *bytes, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a: the generator after the bytes */
    for (size_t i = 0; i < n; i++)
        h = (h ^ bytes[i]) * 1099511628211ull;
    *src = (sp_source){.bytes = bytes, .n = n, .s = h | 1};
}

/* A choice in [0, n). */
static int32_t take(sp_source *s, int32_t n) {
    if (n <= 1)
        return 0;
    if (s->pos < s->n)
        return s->bytes[s->pos++] % n;
    s->s ^= s->s >> 12; /* xorshift64* */
    s->s ^= s->s << 25;
    s->s ^= s->s >> 27;
    return (int32_t)(((s->s * 0x2545F4914F6CDD1Dull) >> 33) % (uint64_t)n);
}

/* ---- generation -------------------------------------------------------------------------- */

static int64_t numel(sp_shape s) {
    return s.rank == 0 ? 1 : s.rank == 1 ? s.d[0] : s.d[0] * s.d[1];
}

static bool same(sp_shape a, sp_shape b) {
    return a.rank == b.rank && (a.rank < 1 || a.d[0] == b.d[0]) && (a.rank < 2 || a.d[1] == b.d[1]);
}

/* A value, recent ones more often. */
static int32_t pick(sp_source *s, const sp_program *p) {
    int32_t n = p->n_values;
    return take(s, 2) ? n - 1 - take(s, n < 6 ? n : 6) : take(s, n);
}

/* A value other than a for which ok(p, a, candidate), searched from a random start; -1. */
static int32_t find(sp_source *s, const sp_program *p, int32_t a,
                    bool (*ok)(const sp_program *, int32_t, int32_t)) {
    int32_t start = take(s, p->n_values);
    for (int32_t i = 0; i < p->n_values; i++) {
        int32_t c = (start + i) % p->n_values;
        if (c != a && ok(p, a, c))
            return c;
    }
    return -1;
}

static bool same_shape(const sp_program *p, int32_t a, int32_t c) {
    return same(p->shape[a], p->shape[c]);
}
static bool same_numel(const sp_program *p, int32_t k, int32_t c) { /* k: a state index */
    return numel(p->state[k]) == numel(p->shape[c]);
}
static bool rank2(const sp_program *p, int32_t a, int32_t c) {
    (void)a;
    return p->shape[c].rank == 2;
}

static void push(sp_program *p, sp_instr in, sp_shape result) {
    p->instr[p->n_instr++] = in;
    p->shape[p->n_values++] = result;
}

void sp_generate(sp_program *p, sp_source *src) {
    memset(p, 0, sizeof *p);
    p->n_state = 1 + take(src, SP_MAX_STATE);
    for (int32_t k = 0; k < p->n_state; k++) {
        sp_shape s = {.rank = 1 + take(src, 2), .d = {1 + take(src, 5), 1 + take(src, 5)}};
        p->state[k] = p->shape[k] = s;
    }
    p->n_values = p->n_state;
    bool assigned[SP_MAX_STATE] = {false};
    int32_t outputs = 0;
    /* room at the end for one assignment of every state tensor */
    int32_t budget = 4 + take(src, SP_MAX_INSTR - 4 - SP_MAX_STATE);
    static const int32_t weights[SP_KIND_COUNT_] = {2, 3, 3, 2, 2, 2, 1, 1, 3, 2, 1};
    int32_t total = 0;
    for (int32_t i = 0; i < SP_KIND_COUNT_; i++)
        total += weights[i];
    while (p->n_instr < budget && p->n_values < SP_MAX_VALUES - SP_MAX_STATE) {
        int32_t w = take(src, total), kind = 0;
        while (w >= weights[kind])
            w -= weights[kind++];
        int32_t a = pick(src, p);
        sp_shape sa = p->shape[a];
        sp_instr in = {.kind = (sp_kind)kind, .a = a, .b = -1, .k = -1};
        switch ((sp_kind)kind) {
        case SP_INPUT: push(p, in, sa); break;
        case SP_UNARY:
            in.sub = take(src, 6);
            push(p, in, sa);
            break;
        case SP_BINARY:
            if ((in.b = find(src, p, a, same_shape)) < 0)
                break;
            in.sub = take(src, 5);
            push(p, in, sa);
            break;
        case SP_SCALAR:
            in.sub = take(src, 3);
            push(p, in, sa);
            break;
        case SP_RESHAPE: {
            sp_shape r = {.rank = 1, .d = {numel(sa), 1}};
            if (sa.rank == 1) { /* unflatten by a factor */
                int64_t f = 1 + take(src, (int32_t)sa.d[0]);
                while (sa.d[0] % f)
                    f--;
                r = (sp_shape){.rank = 2, .d = {f, sa.d[0] / f}};
                in.sub = (int32_t)f;
            }
            push(p, in, r);
            break;
        }
        case SP_TRANSPOSE:
        case SP_REDUCE:
        case SP_MATMUL: {
            if (sa.rank != 2 && (in.a = a = find(src, p, -1, rank2)) < 0)
                break;
            sa = p->shape[a];
            in.sub = take(src, 2);
            sp_shape r = kind == SP_TRANSPOSE ? (sp_shape){2, {sa.d[1], sa.d[0]}}
                         : kind == SP_MATMUL  ? (sp_shape){2, {sa.d[0], sa.d[0]}}
                                              : sa;
            push(p, in, r);
            break;
        }
        case SP_ASSIGN:
            in.k = take(src, p->n_state);
            if (!same_numel(p, in.k, a) && (in.a = find(src, p, in.k, same_numel)) < 0)
                in.a = in.k;
            assigned[in.k] = true;
            push(p, in, p->state[in.k]);
            break;
        case SP_RETAIN:
            if (outputs < SP_MAX_OUTPUTS) {
                outputs++;
                p->instr[p->n_instr++] = in;
            }
            break;
        case SP_READ: p->instr[p->n_instr++] = in; break;
        case SP_KIND_COUNT_: break;
        }
    }
    for (int32_t k = 0; k < p->n_state; k++) /* every state tensor is updated in every step */
        if (!assigned[k]) {
            int32_t a = find(src, p, k, same_numel);
            push(p, (sp_instr){.kind = SP_ASSIGN, .a = a >= 0 ? a : k, .b = -1, .k = k},
                 p->state[k]);
        }
}

void sp_print(const sp_program *p, char *buf, size_t size) {
    static const char *const kinds[] = {"input",   "unary",     "binary", "scalar",
                                        "reshape", "transpose", "reduce", "matmul",
                                        "assign",  "retain",    "read"};
    size_t at = 0;
#define SP_OUT(...)                                                                                \
    do {                                                                                           \
        if (at < size)                                                                             \
            at += (size_t)snprintf(buf + at, size - at, __VA_ARGS__);                              \
    } while (0)
    SP_OUT("%d state tensors (%%0..%%%d):", (int)p->n_state, (int)p->n_state - 1);
    for (int32_t k = 0; k < p->n_state; k++)
        SP_OUT(p->state[k].rank == 1 ? " [%lld]" : " [%lld,%lld]", (long long)p->state[k].d[0],
               (long long)p->state[k].d[1]);
    for (int32_t i = 0, v = p->n_state; i < p->n_instr; i++) {
        const sp_instr *in = &p->instr[i];
        if (in->kind == SP_RETAIN || in->kind == SP_READ) {
            SP_OUT("\n  %s %%%d", kinds[in->kind], (int)in->a);
            continue;
        }
        SP_OUT("\n  %%%d = %s %%%d", (int)v++, kinds[in->kind], (int)in->a);
        if (in->b >= 0)
            SP_OUT(", %%%d", (int)in->b);
        if (in->kind == SP_ASSIGN)
            SP_OUT(" into state %d", (int)in->k);
        else
            SP_OUT(" (variant %d)", (int)in->sub);
    }
#undef SP_OUT
}

/* ---- playing ----------------------------------------------------------------------------- */

static loom_tensor *with_shape(loom_context *ctx, loom_tensor *t, sp_shape s) {
    return loom_reshape(ctx, t, s.rank, s.d);
}

/* Deterministic values in [-1, 1] for input `salt` of step `step`. */
static void fill(float *x, int64_t n, uint64_t salt) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)((double)(((uint64_t)i * 2654435761u + salt * 40503u) % 2001) / 1000.0 - 1.0);
}

loom_status sp_run_init(sp_run *r, const sp_program *p, bool eager, bool poison) {
    memset(r, 0, sizeof *r);
    loom_context_options o;
    loom_context_options_init(&o);
    o.eager = eager;
    o.poison = poison;
    o.cache_dir = "";
    o.dump_dir = NULL;
    loom_status st = loom_context_create(&o, &r->ctx);
    for (int32_t k = 0; k < p->n_state && st == LOOM_OK; k++) {
        float x[25];
        fill(x, numel(p->state[k]), 1000 + (uint64_t)k);
        r->state[k] =
            loom_tensor_from_host(r->ctx, LOOM_DTYPE_F32, p->state[k].rank, p->state[k].d, x);
        if (!r->state[k])
            st = loom_context_error(r->ctx);
    }
    return st;
}

static void release_outputs(sp_run *r) {
    for (int32_t i = 0; i < r->n_out; i++)
        loom_tensor_release(r->out[i]);
    r->n_out = 0;
}

void sp_run_deinit(sp_run *r) {
    release_outputs(r);
    for (int32_t k = 0; k < SP_MAX_STATE; k++)
        loom_tensor_release(r->state[k]);
    loom_context_destroy(r->ctx);
    memset(r, 0, sizeof *r);
}

loom_status sp_run_step(sp_run *r, const sp_program *p, int64_t step) {
    loom_context *ctx = r->ctx;
    loom_tensor *v[SP_MAX_VALUES] = {NULL};
    loom_tensor *inputs[SP_MAX_INSTR];
    int32_t n_inputs = 0, n = p->n_state;
    release_outputs(r);
    for (int32_t k = 0; k < p->n_state; k++)
        v[k] = r->state[k];
    for (int32_t i = 0; i < p->n_instr; i++) {
        const sp_instr *in = &p->instr[i];
        loom_tensor *a = v[in->a], *res = NULL;
        switch (in->kind) {
        case SP_INPUT: {
            float x[25];
            sp_shape s = p->shape[n];
            fill(x, numel(s), (uint64_t)step * 131 + (uint64_t)i);
            res = inputs[n_inputs++] = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, s.rank, s.d, x);
            break;
        }
        case SP_UNARY:
            res = in->sub == 0   ? loom_neg(ctx, a)
                  : in->sub == 1 ? loom_tanh(ctx, a)
                  : in->sub == 2 ? loom_sigmoid(ctx, a)
                  : in->sub == 3 ? loom_relu(ctx, a)
                  : in->sub == 4 ? loom_abs(ctx, a)
                                 : loom_mul(ctx, a, loom_scalar(ctx, LOOM_DTYPE_F32, 0.5));
            break;
        case SP_BINARY: {
            loom_tensor *b = v[in->b];
            res = in->sub == 0   ? loom_add(ctx, a, b)
                  : in->sub == 1 ? loom_sub(ctx, a, b)
                  : in->sub == 2 ? loom_mul(ctx, a, b)
                  : in->sub == 3 ? loom_maximum(ctx, a, b)
                                 : loom_minimum(ctx, a, b);
            break;
        }
        case SP_SCALAR: {
            loom_tensor *c = loom_scalar(ctx, LOOM_DTYPE_F32, in->sub == 1 ? 1.5 : 0.25);
            res = in->sub == 0   ? loom_add(ctx, a, c)
                  : in->sub == 1 ? loom_mul(ctx, a, c)
                                 : loom_maximum(ctx, a, c);
            break;
        }
        case SP_RESHAPE: res = with_shape(ctx, a, p->shape[n]); break;
        case SP_TRANSPOSE: res = loom_transpose(ctx, a); break;
        case SP_REDUCE: {
            int32_t axis = in->sub;
            loom_tensor *s = loom_sum(ctx, a, 1, &axis, true);
            res = loom_broadcast(ctx, s, 2, p->shape[n].d);
            break;
        }
        case SP_MATMUL: res = loom_matmul(ctx, a, loom_transpose(ctx, a)); break;
        case SP_ASSIGN: {
            loom_tensor *t = loom_tanh(ctx, with_shape(ctx, a, p->state[in->k]));
            if (!t || loom_assign(ctx, r->state[in->k], t) != LOOM_OK)
                goto fail;
            res = r->state[in->k]; /* ops recorded from here read the new value */
            break;
        }
        case SP_RETAIN:
            loom_tensor_retain(a);
            r->out[r->n_out++] = a;
            continue;
        case SP_READ: {
            float x[25];
            if (loom_tensor_read(ctx, a, x, (size_t)numel(p->shape[in->a]) * sizeof *x) != LOOM_OK)
                goto fail;
            continue;
        }
        case SP_KIND_COUNT_: break;
        }
        if (!res)
            goto fail;
        v[n++] = res;
    }
    loom_status st = loom_mark_step(ctx);
    for (int32_t i = 0; i < n_inputs; i++)
        loom_tensor_release(inputs[i]);
    return st;
fail:
    for (int32_t i = 0; i < n_inputs; i++)
        loom_tensor_release(inputs[i]);
    return loom_context_error(ctx) != LOOM_OK ? loom_context_error(ctx) : LOOM_STATUS_INTERNAL;
}

/* ---- comparing --------------------------------------------------------------------------- */

static bool compare_one(sp_run *got, sp_run *want, loom_tensor *g, loom_tensor *w, const char *what,
                        int32_t index, char *msg, size_t size) {
    int64_t n = 0;
    float x[25], y[25];
    if (loom_tensor_numel(w, &n) != LOOM_OK || n > 25 ||
        loom_tensor_read(got->ctx, g, x, (size_t)n * sizeof *x) != LOOM_OK ||
        loom_tensor_read(want->ctx, w, y, (size_t)n * sizeof *y) != LOOM_OK) {
        snprintf(msg, size, "%s %d: cannot be read: %s / %s", what, (int)index,
                 loom_context_error_message(got->ctx), loom_context_error_message(want->ctx));
        return false;
    }
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)x[i] - (double)y[i]);
        if (!(e <= 1e-4 * (1 + fabs((double)y[i])))) {
            snprintf(msg, size, "%s %d element %lld: %.9g, the interpreter's %.9g", what,
                     (int)index, (long long)i, (double)x[i], (double)y[i]);
            return false;
        }
    }
    return true;
}

bool sp_compare(sp_run *got, sp_run *want, const sp_program *p, char *msg, size_t size) {
    for (int32_t k = 0; k < p->n_state; k++)
        if (!compare_one(got, want, got->state[k], want->state[k], "state tensor", k, msg, size))
            return false;
    for (int32_t i = 0; i < want->n_out; i++)
        if (!compare_one(got, want, got->out[i], want->out[i], "output", i, msg, size))
            return false;
    return true;
}
