/* Autograd: every VJP rule and every composite nn op against central finite differences
 * in f64 on random inputs (reference interpreter), the JIT's gradients against the
 * interpreter's, accumulation, detach, and errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "frontend/frontend.h"
#include "loom/dist.h"
#include "loom/nn.h"

#define MAXIN 4

typedef loom_tensor *(*build_fn)(loom_context *ctx, loom_tensor *const *in);

typedef struct spec {
    int32_t rank;
    int64_t shape[LOOM_MAX_RANK];
    double lo, hi; /* uniform range of the random values */
} spec;

static uint64_t rng_state;
static double urand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * 0x1.0p-53;
}

static int64_t numel(const spec *s) {
    int64_t n = 1;
    for (int32_t i = 0; i < s->rank; i++)
        n *= s->shape[i];
    return n;
}

/* sum(f(x) * w) for fixed random weights w (so every output element matters differently). */
static loom_tensor *weighted_loss(loom_context *ctx, loom_tensor *y) {
    int32_t r;
    int64_t s[LOOM_MAX_RANK], n;
    assert_non_null(y);
    assert_int_equal(loom_tensor_rank(y, &r), LOOM_OK);
    assert_int_equal(loom_tensor_shape(y, s), LOOM_OK);
    assert_int_equal(loom_tensor_numel(y, &n), LOOM_OK);
    double *w = malloc((size_t)(n ? n : 1) * sizeof *w);
    uint64_t st = 12345;
    for (int64_t i = 0; i < n; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = 0.5 + (double)(st >> 11) * 0x1.0p-53;
    }
    loom_tensor *wt = loom_tensor_from_host(ctx, LOOM_DTYPE_F64, r, s, w);
    free(w);
    loom_tensor *loss = loom_sum(ctx, loom_mul(ctx, y, wt), 0, NULL, false);
    loom_tensor_release(wt);
    return loss;
}

static double eval_loss(loom_context *ctx, int n_in, const spec *sp, double *const *data,
                        build_fn f) {
    loom_tensor *in[MAXIN] = {0};
    for (int k = 0; k < n_in; k++)
        in[k] = loom_tensor_from_host(ctx, LOOM_DTYPE_F64, sp[k].rank, sp[k].shape, data[k]);
    loom_tensor *loss = weighted_loss(ctx, f(ctx, in));
    double v = NAN;
    if (loom_tensor_read(ctx, loss, &v, sizeof v) != LOOM_OK)
        fail_msg("%s", loom_context_error_message(ctx));
    for (int k = 0; k < n_in; k++)
        loom_tensor_release(in[k]);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    return v;
}

/* The op a case's graph must record (-1: any). */
static int expect_op = -1;

/* The analytic gradients of the weighted loss with respect to every input. */
static void analytic(loom_context *ctx, int n_in, const spec *sp, double *const *data, build_fn f,
                     double **grads) {
    loom_tensor *in[MAXIN], *g[MAXIN] = {0};
    for (int k = 0; k < n_in; k++)
        in[k] = loom_tensor_from_host(ctx, LOOM_DTYPE_F64, sp[k].rank, sp[k].shape, data[k]);
    loom_tensor *loss = weighted_loss(ctx, f(ctx, in));
    bool recorded = expect_op < 0;
    for (int32_t i = 0; i < ctx->trace.n_nodes && !recorded; i++)
        recorded = (int)ctx->trace.nodes[i].op == expect_op;
    if (!recorded)
        fail_msg("the case for %s records no %s", loom_ir_op_name((loom_ir_op)expect_op),
                 loom_ir_op_name((loom_ir_op)expect_op));
    if (loom_backward(ctx, loss, n_in, in, g) != LOOM_OK)
        fail_msg("%s", loom_context_error_message(ctx));
    for (int k = 0; k < n_in; k++) {
        if (loom_tensor_read(ctx, g[k], grads[k], (size_t)numel(&sp[k]) * 8) != LOOM_OK)
            fail_msg("%s", loom_context_error_message(ctx));
        loom_tensor_release(in[k]);
    }
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
}

/* The finite-difference step: 1e-6 except for functions only f32-accurate (below). */
static double fd_h = 1e-6;

/* Central differences with step fd_h against the analytic gradient: |num - ana| must stay
 * within tol * (1 + |num|). */
static void check_grad(const char *name, int n_in, const spec *sp, build_fn f, double tol) {
    loom_context *ctx = tu_context(true);
    double *data[MAXIN], *grads[MAXIN];
    rng_state = 0x9E3779B97F4A7C15ull ^ (uint64_t)strlen(name);
    for (int k = 0; k < n_in; k++) {
        int64_t n = numel(&sp[k]);
        data[k] = malloc((size_t)(n ? n : 1) * 8);
        grads[k] = malloc((size_t)(n ? n : 1) * 8);
        for (int64_t i = 0; i < n; i++)
            data[k][i] = sp[k].lo + (sp[k].hi - sp[k].lo) * urand();
    }
    analytic(ctx, n_in, sp, data, f, grads);
    const double h = fd_h;
    for (int k = 0; k < n_in; k++) {
        for (int64_t i = 0; i < numel(&sp[k]); i++) {
            double x0 = data[k][i];
            data[k][i] = x0 + h;
            double up = eval_loss(ctx, n_in, sp, data, f);
            data[k][i] = x0 - h;
            double down = eval_loss(ctx, n_in, sp, data, f);
            data[k][i] = x0;
            double num = (up - down) / (2 * h), ana = grads[k][i];
            if (!(fabs(num - ana) <= tol * (1 + fabs(num))))
                fail_msg("%s: d/d in%d[%lld]: analytic %.10g, finite differences %.10g", name, k,
                         (long long)i, ana, num);
        }
    }
    for (int k = 0; k < n_in; k++) {
        free(data[k]);
        free(grads[k]);
    }
    loom_context_destroy(ctx);
}

#define S1(a)                                                                                      \
    1, {                                                                                           \
        a                                                                                          \
    }
#define S2(a, b)                                                                                   \
    2, {                                                                                           \
        a, b                                                                                       \
    }
#define S3(a, b, c)                                                                                \
    3, {                                                                                           \
        a, b, c                                                                                    \
    }
#define S4(a, b, c, d)                                                                             \
    4, {                                                                                           \
        a, b, c, d                                                                                 \
    }

/* ---- per-op rules ---------------------------------------------------------------------- */

#define UNARY_CASE(fname, expr)                                                                    \
    static loom_tensor *b_##fname(loom_context *ctx, loom_tensor *const *in) {                     \
        return expr;                                                                               \
    }
UNARY_CASE(neg, loom_neg(ctx, in[0]))
UNARY_CASE(abs, loom_abs(ctx, in[0]))
UNARY_CASE(exp, loom_exp(ctx, in[0]))
UNARY_CASE(log, loom_log(ctx, in[0]))
UNARY_CASE(sqrt, loom_sqrt(ctx, in[0]))
UNARY_CASE(rsqrt, loom_rsqrt(ctx, in[0]))
UNARY_CASE(tanh, loom_tanh(ctx, in[0]))
UNARY_CASE(sigmoid, loom_sigmoid(ctx, in[0]))
UNARY_CASE(relu, loom_relu(ctx, in[0]))
UNARY_CASE(gelu, loom_gelu(ctx, in[0]))
UNARY_CASE(gelu_tanh, loom_gelu_tanh(ctx, in[0]))
UNARY_CASE(add, loom_add(ctx, in[0], in[1]))
UNARY_CASE(sub, loom_sub(ctx, in[0], in[1]))
UNARY_CASE(mul, loom_mul(ctx, in[0], in[1]))
UNARY_CASE(div, loom_div(ctx, in[0], in[1]))
UNARY_CASE(pow, loom_pow(ctx, in[0], in[1]))
UNARY_CASE(maximum, loom_maximum(ctx, in[0], in[1]))
UNARY_CASE(minimum, loom_minimum(ctx, in[0], in[1]))
UNARY_CASE(select, loom_select(ctx, loom_gt(ctx, in[0], in[1]), loom_mul(ctx, in[0], in[0]),
                               loom_exp(ctx, in[1])))
UNARY_CASE(cast, loom_cast(ctx,
                           loom_mul(ctx, loom_cast(ctx, in[0], LOOM_DTYPE_F32),
                                    loom_scalar(ctx, LOOM_DTYPE_F32, 3.0)),
                           LOOM_DTYPE_F64))
UNARY_CASE(broadcast, loom_mul(ctx, in[0], in[1])) /* [3,1] * [4] -> [3,4] */
/* a new leading unit axis (its gradient is a reshape, no sum) and a repeated axis */
UNARY_CASE(broadcast_unit, loom_exp(ctx, loom_broadcast(ctx, in[0], 4, (int64_t[]){1, 3, 5, 4})))
UNARY_CASE(reshape, loom_exp(ctx, loom_reshape(ctx, in[0], 2, (int64_t[]){3, 4})))
UNARY_CASE(permute, loom_mul(ctx, loom_permute(ctx, in[0], (int32_t[]){2, 0, 1}), in[1]))
UNARY_CASE(sum, loom_exp(ctx, loom_sum(ctx, in[0], 1, (int32_t[]){1}, false)))
UNARY_CASE(sum_keepdim, loom_mul(ctx, loom_sum(ctx, in[0], 1, (int32_t[]){0}, true), in[0]))
UNARY_CASE(mean, loom_exp(ctx, loom_mean(ctx, in[0], 2, (int32_t[]){0, 2}, false)))
UNARY_CASE(max, loom_max(ctx, in[0], 1, (int32_t[]){-1}, false))
UNARY_CASE(matmul, loom_matmul(ctx, in[0], in[1]))
UNARY_CASE(matmul_vec, loom_matmul(ctx, in[0], in[1])) /* [2,3,4] x [4] */
UNARY_CASE(slice, loom_exp(ctx, loom_slice(ctx, in[0], (int64_t[]){1, 0}, (int64_t[]){2, 3},
                                           (int64_t[]){2, 2})))
UNARY_CASE(pad, loom_exp(ctx, loom_pad(ctx, in[0], (int64_t[]){1, 0}, (int64_t[]){0, 2},
                                       (int64_t[]){1, 1}, 0.5)))
UNARY_CASE(concat, loom_exp(ctx, loom_concat(ctx, 3, (loom_tensor *[]){in[0], in[1], in[0]}, 1)))
UNARY_CASE(reuse, loom_mul(ctx, loom_tanh(ctx, in[0]), loom_add(ctx, in[0], in[0])))

UNARY_CASE(all_reduce, loom_all_reduce(ctx, in[0], LOOM_REDUCE_SUM, 0.5)) /* one rank */
/* rows 2, 0, 2 and 1 of a [3,4] table (row 2 twice: its gradient sums), and a scatter_add of
 * [2,4] into a [3,4] base along axis 0, rows 1 and 0 summed where indices repeat */
static loom_tensor *b_gather(loom_context *ctx, loom_tensor *const *in) {
    static const int32_t rows[] = {2, 0, 2, 1};
    loom_tensor *ix = loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 1, (int64_t[]){4}, rows);
    loom_tensor *y = loom_exp(ctx, loom_index_select(ctx, in[0], 0, ix));
    loom_tensor_release(ix); /* the step keeps it */
    return y;
}
static loom_tensor *b_scatter_add(loom_context *ctx, loom_tensor *const *in) {
    static const int32_t rows[] = {1, 0, 1, 2, 1, 0, 1, 2};
    loom_tensor *ix = loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 2, (int64_t[]){2, 4}, rows);
    loom_tensor *y = loom_exp(ctx, loom_scatter_add(ctx, in[0], 0, ix, loom_tanh(ctx, in[1])));
    loom_tensor_release(ix);
    return y;
}
/* the fused attention op (no mask, no dropout), causal: L 3 against S 5 keys */
static loom_tensor *b_attention(loom_context *ctx, loom_tensor *const *in) {
    return loom_scaled_dot_product_attention(ctx, in[0], in[1], in[2], NULL, true, 0.0);
}
static loom_tensor *b_conv(loom_context *ctx, loom_tensor *const *in);
static loom_tensor *b_max_pool(loom_context *ctx, loom_tensor *const *in);

/* One row per IR op, in ops.def's order (the _Static_assert below fails the build when an op
 * is added without one): the case that checks its VJP, or why it has none. Each case's
 * graph must record its op. */
typedef struct vjp_case {
    loom_ir_op op;
    build_fn f; /* NULL: no VJP, for the reason in why */
    int n_in;
    spec s[MAXIN];
    double tol, h;   /* h: the finite-difference step */
    const char *why; /* no VJP: why not */
} vjp_case;

#define ANY2 {S2(3, 4), -2, 2}
#define POS2 {S2(3, 4), 0.5, 3}
#define VJP(e, fn, n, ...) {LOOM_IR_OP_##e, fn, n, {__VA_ARGS__}, 1e-6, 1e-6, NULL}
#define NO_VJP(e, reason) {LOOM_IR_OP_##e, NULL, 0, {{0}}, 0, 0, reason}
static const vjp_case vjp_cases[] = {
    NO_VJP(INPUT, "a leaf: gradients are taken with respect to it"),
    NO_VJP(CONSTANT, "a leaf with no operand"),
    VJP(NEG, b_neg, 1, ANY2),
    VJP(ABS, b_abs, 1, ANY2),
    VJP(EXP, b_exp, 1, ANY2),
    VJP(LOG, b_log, 1, POS2),
    VJP(SQRT, b_sqrt, 1, POS2),
    VJP(RSQRT, b_rsqrt, 1, POS2),
    VJP(TANH, b_tanh, 1, ANY2),
    VJP(SIGMOID, b_sigmoid, 1, ANY2),
    VJP(RELU, b_relu, 1, ANY2),
    VJP(GELU, b_gelu, 1, ANY2),
    NO_VJP(ISFINITE, "a bool result: no gradient flows through it"),
    VJP(ADD, b_add, 2, ANY2, ANY2),
    VJP(SUB, b_sub, 2, ANY2, ANY2),
    VJP(MUL, b_mul, 2, ANY2, ANY2),
    VJP(DIV, b_div, 2, ANY2, POS2),
    VJP(POW, b_pow, 2, POS2, ANY2),
    VJP(MAXIMUM, b_maximum, 2, ANY2, ANY2),
    VJP(MINIMUM, b_minimum, 2, ANY2, ANY2),
    NO_VJP(EQ, "a bool result"),
    NO_VJP(NE, "a bool result"),
    NO_VJP(LT, "a bool result"),
    NO_VJP(LE, "a bool result"),
    NO_VJP(GT, "a bool result"),
    NO_VJP(GE, "a bool result"),
    VJP(SELECT, b_select, 2, ANY2, ANY2),
    /* through f32: a step of 1e-6 would be a few f32 ulps; the function is linear, so a
     * large step is exact up to f32 rounding */
    {LOOM_IR_OP_CAST, b_cast, 1, {ANY2}, 1e-5, 1e-2, NULL},
    VJP(BROADCAST, b_broadcast, 2, {S2(3, 1), -1, 1}, {S1(4), -1, 1}),
    VJP(RESHAPE, b_reshape, 1, {S3(2, 3, 2), -1, 1}),
    VJP(TRANSPOSE, b_permute, 2, {S3(2, 3, 4), -1, 1}, {S3(4, 2, 3), -1, 1}),
    VJP(REDUCE_SUM, b_sum, 1, {S3(2, 3, 4), -1, 1}),
    VJP(REDUCE_MEAN, b_mean, 1, {S3(2, 3, 4), -1, 1}),
    VJP(REDUCE_MAX, b_max, 1, {S3(2, 3, 4), -1, 1}),
    VJP(MATMUL, b_matmul, 2, {S3(2, 3, 4), -1, 1}, {S3(2, 4, 5), -1, 1}),
    VJP(SLICE, b_slice, 1, {S2(5, 6), -1, 1}),
    VJP(PAD, b_pad, 1, {S2(2, 3), -1, 1}),
    VJP(CONCAT, b_concat, 2, {S3(2, 2, 3), -1, 1}, {S3(2, 1, 3), -1, 1}),
    NO_VJP(IOTA, "no operand"),
    NO_VJP(RAND_UNIFORM, "its operand is an integer seed"),
    VJP(ALL_REDUCE, b_all_reduce, 1, ANY2),
    NO_VJP(BROADCAST_FROM, "no gradient rule (include/loom/dist.h)"),
    NO_VJP(ALL_GATHER, "no gradient rule (include/loom/dist.h)"),
    VJP(CONV2D, b_conv, 3, {S4(2, 2, 5, 6), -1, 1}, {S4(3, 2, 2, 3), -1, 1}, {S1(3), -1, 1}),
    NO_VJP(CONV2D_GRAD_INPUT, "conv2d's second derivative is not supported"),
    NO_VJP(CONV2D_GRAD_WEIGHT, "conv2d's second derivative is not supported"),
    VJP(MAX_POOL2D, b_max_pool, 1, {S4(1, 2, 4, 4), -1, 1}),
    NO_VJP(MAX_POOL2D_GRAD, "max_pool2d's second derivative is not supported"),
    VJP(GATHER, b_gather, 1, {S2(3, 4), -1, 1}),
    VJP(SCATTER_ADD, b_scatter_add, 2, {S2(3, 4), -1, 1}, {S2(2, 4), -1, 1}),
    VJP(GELU_TANH, b_gelu_tanh, 1, {S2(3, 4), -4, 4}),
    VJP(ATTENTION, b_attention, 3, {S4(1, 2, 3, 4), -1, 1}, {S4(1, 2, 5, 4), -1, 1},
        {S4(1, 2, 5, 3), -1, 1}),
    NO_VJP(ATTENTION_LSE, "a statistic only attention's VJP reads"),
    NO_VJP(ATTENTION_GRAD_Q, "attention's second derivative is not supported"),
    NO_VJP(ATTENTION_GRAD_K, "attention's second derivative is not supported"),
    NO_VJP(ATTENTION_GRAD_V, "attention's second derivative is not supported"),
};
_Static_assert(sizeof vjp_cases / sizeof vjp_cases[0] == LOOM_IR_OP_COUNT_,
               "a VJP case (or the reason for none) per op of ops.def");

static void test_every_op_vjp_matches_finite_differences(void **state) {
    (void)state;
    int checked = 0;
    for (int op = 0; op < LOOM_IR_OP_COUNT_; op++) {
        const vjp_case *c = &vjp_cases[op];
        if (c->op != (loom_ir_op)op)
            fail_msg("vjp_cases[%d] is %s's row, not %s's: rows go in ops.def's order", op,
                     loom_ir_op_name(c->op), loom_ir_op_name((loom_ir_op)op));
        if (!c->f) {
            assert_true(c->why && *c->why);
            continue;
        }
        expect_op = op;
        fd_h = c->h;
        check_grad(loom_ir_op_name(c->op), c->n_in, c->s, c->f, c->tol);
        checked++;
    }
    expect_op = -1;
    fd_h = 1e-6;
    print_message("# %d ops' VJPs checked, %d ops without one\n", checked,
                  LOOM_IR_OP_COUNT_ - checked);
}

static loom_tensor *b_matmul_weight_t(loom_context *ctx, loom_tensor *const *in) {
    return loom_matmul(ctx, in[0], loom_transpose(ctx, in[1]));
}

/* Cases beyond one per op: what a rule does in another position or shape. */
static void test_more_vjp_cases_match_finite_differences(void **state) {
    (void)state;
    const spec any = ANY2;
    check_grad("reuse", 1, &any, b_reuse, 1e-6);
    spec bu = {S3(3, 1, 4), -1, 1};
    check_grad("broadcast_unit", 1, &bu, b_broadcast_unit, 1e-6);
    spec rd = {S3(2, 3, 4), -1, 1};
    check_grad("sum_keepdim", 1, &rd, b_sum_keepdim, 1e-6);
    spec mv[2] = {{S3(2, 3, 4), -1, 1}, {S1(4), -1, 1}};
    check_grad("matmul_vec", 2, mv, b_matmul_vec, 1e-6);
    spec mw[2] = {{S3(2, 3, 4), -1, 1}, {S2(4, 5), -1, 1}};
    check_grad("matmul [..., M, K] x [K, N]", 2, mw, b_matmul, 1e-6);
    spec mt[2] = {{S3(1, 2, 6), -1, 1}, {S2(40, 6), -1, 1}};
    check_grad("matmul [..., M, K] x a large weight's transpose", 2, mt, b_matmul_weight_t, 1e-6);
}

/* x [B, T, C] @ W^T for a W [V, C] larger than x and the result (a tied lm_head), and x @ U
 * for U [C, V]: computed as 2-D matmuls over the B*T rows, with no broadcast of the weight
 * and no transpose of W in memory (W's transpose is (W x^T)^T), same values as a loop. */
static void test_matmul_with_a_2d_weight_folds_rows_and_never_copies_the_weight(void **state) {
    (void)state;
    enum { B = 2, T = 3, C = 8, V = 64 };
    float x[B * T * C], w[V * C], wt[C * V], y[B * T * V];
    for (int i = 0; i < B * T * C; i++)
        x[i] = (float)((i * 37 % 17) - 8) / 8;
    for (int i = 0; i < V * C; i++)
        w[i] = (float)((i * 11 % 13) - 6) / 4;
    for (int v = 0; v < V; v++)
        for (int c = 0; c < C; c++)
            wt[c * V + v] = w[v * C + c];
    for (int eager = 0; eager < 2; eager++) {
        loom_context *ctx = tu_context(eager);
        loom_tensor *tx = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 3, (int64_t[]){B, T, C}, x);
        loom_tensor *tw = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){V, C}, w);
        loom_tensor *u = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){C, V}, wt);
        loom_tensor *y1 = loom_matmul(ctx, tx, loom_transpose(ctx, tw));
        /* W itself is the matmul's operand (the transpose recorded above is left unused) */
        int32_t w_node = loom_fe_tensor_get(ctx, tw, NULL, 0, "test")->input_node, n_w = 0;
        for (int32_t i = 0; i < ctx->trace.n_nodes; i++) {
            const loom_ir_node *nd = &ctx->trace.nodes[i];
            n_w += nd->op == LOOM_IR_OP_MATMUL && nd->inputs[0] == w_node;
        }
        assert_int_equal(n_w, 1);
        loom_tensor *y2 = loom_matmul(ctx, tx, u);
        for (int32_t i = 0; i < ctx->trace.n_nodes; i++)
            assert_int_not_equal(ctx->trace.nodes[i].op, LOOM_IR_OP_BROADCAST);
        int64_t s[3];
        assert_int_equal(loom_tensor_shape(y1, s), LOOM_OK);
        assert_true(s[0] == B && s[1] == T && s[2] == V);
        for (int k = 0; k < 2; k++) {
            tu_read_f32(ctx, k ? y2 : y1, y, B * T * V);
            for (int r = 0; r < B * T; r++)
                for (int v = 0; v < V; v++) {
                    double want = 0;
                    for (int c = 0; c < C; c++)
                        want += (double)x[r * C + c] * w[v * C + c];
                    assert_float_equal(y[r * V + v], want, 1e-5);
                }
        }
        loom_tensor_release(tx);
        loom_tensor_release(tw);
        loom_tensor_release(u);
        loom_context_destroy(ctx);
    }
}

/* ---- composite nn ops ------------------------------------------------------------------ */

static loom_tensor *seed_of(loom_context *ctx, int64_t v) {
    loom_tensor *t = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 0, NULL, &v);
    return t;
}

static loom_tensor *b_linear(loom_context *ctx, loom_tensor *const *in) {
    return loom_linear(ctx, in[0], in[1], in[2]);
}
static loom_tensor *b_linear_t(loom_context *ctx, loom_tensor *const *in) {
    return loom_gelu_tanh(ctx, loom_linear_t(ctx, in[0], in[1], in[2]));
}
static loom_tensor *b_softmax(loom_context *ctx, loom_tensor *const *in) {
    return loom_softmax(ctx, in[0], 0);
}
static loom_tensor *b_log_softmax(loom_context *ctx, loom_tensor *const *in) {
    return loom_log_softmax(ctx, in[0], -1);
}
static loom_tensor *b_cross_entropy(loom_context *ctx, loom_tensor *const *in) {
    int64_t labels[4] = {2, 0, 4, 1};
    loom_tensor *y = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 1, (int64_t[]){4}, labels);
    loom_tensor *l = loom_cross_entropy(ctx, in[0], y, LOOM_REDUCTION_MEAN);
    loom_tensor_release(y);
    return l;
}
/* logits [2,2,5], labels [2,2] with one ignored (class 3), label smoothing 0.2 */
static loom_tensor *b_cross_entropy_smooth(loom_context *ctx, loom_tensor *const *in) {
    int32_t labels[4] = {2, 3, 4, 0};
    loom_tensor *y = loom_tensor_from_host(ctx, LOOM_DTYPE_I32, 2, (int64_t[]){2, 2}, labels);
    loom_cross_entropy_options o = {LOOM_REDUCTION_MEAN, 3, 0.2};
    loom_tensor *l = loom_cross_entropy_ex(ctx, in[0], y, &o);
    loom_tensor_release(y);
    return l;
}
static loom_tensor *b_conv(loom_context *ctx, loom_tensor *const *in) {
    return loom_conv2d(ctx, in[0], in[1], in[2], (int64_t[]){2, 1}, (int64_t[]){1, 1},
                       (int64_t[]){1, 2}, 1);
}
static loom_tensor *b_conv_groups(loom_context *ctx, loom_tensor *const *in) {
    return loom_conv2d(ctx, in[0], in[1], NULL, NULL, (int64_t[]){0, 1}, NULL, 2);
}
static loom_tensor *b_max_pool(loom_context *ctx, loom_tensor *const *in) {
    return loom_max_pool2d(ctx, in[0], (int64_t[]){2, 2}, (int64_t[]){1, 2}, (int64_t[]){1, 0});
}
static loom_tensor *b_max_pool_tiled(loom_context *ctx, loom_tensor *const *in) {
    return loom_max_pool2d(ctx, in[0], (int64_t[]){2, 2}, NULL, NULL);
}
static loom_tensor *b_avg_pool(loom_context *ctx, loom_tensor *const *in) {
    return loom_avg_pool2d(ctx, in[0], (int64_t[]){2, 3}, NULL, NULL);
}
static loom_tensor *b_batch_norm(loom_context *ctx, loom_tensor *const *in) {
    return loom_batch_norm(ctx, in[0], NULL, NULL, in[1], in[2], true, 0.1, 1e-5);
}
static loom_tensor *b_layer_norm(loom_context *ctx, loom_tensor *const *in) {
    return loom_layer_norm(ctx, in[0], 2, in[1], in[2], 1e-5);
}
static loom_tensor *b_embedding(loom_context *ctx, loom_tensor *const *in) {
    int64_t idx[5] = {3, 0, 3, 1, 9}; /* 9 is out of range: clamped to the last row, 3 */
    loom_tensor *t = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 1, (int64_t[]){5}, idx);
    loom_tensor *e = loom_embedding(ctx, t, in[0]);
    loom_tensor_release(t);
    return e;
}
static loom_tensor *b_dropout(loom_context *ctx, loom_tensor *const *in) {
    loom_tensor *seed = seed_of(ctx, 7);
    loom_tensor *y = loom_dropout(ctx, in[0], 0.4, true, seed, 1);
    loom_tensor_release(seed);
    return y;
}

/* q [1,2,3,4], k [1,2,5,4], v [1,2,5,3] with an additive mask [3,5] (differentiable too) */
static loom_tensor *b_attention_masked(loom_context *ctx, loom_tensor *const *in) {
    return loom_scaled_dot_product_attention(ctx, in[0], in[1], in[2], in[3], false, 0.7);
}
/* causal, in the token-major layout: q, k, v [1,4,2,3] (B, T, H, D) */
static loom_tensor *b_attention_causal_bthd(loom_context *ctx, loom_tensor *const *in) {
    loom_attention_options o;
    loom_attention_options_init(&o);
    o.causal = true;
    o.layout = LOOM_ATTENTION_BTHD;
    return loom_scaled_dot_product_attention_ex(ctx, in[0], in[1], in[2], &o);
}
static loom_tensor *b_attention_dropout(loom_context *ctx, loom_tensor *const *in) {
    loom_attention_options o;
    loom_attention_options_init(&o);
    o.dropout_p = 0.3;
    o.seed = seed_of(ctx, 5);
    o.stream = 2;
    loom_tensor *y = loom_scaled_dot_product_attention_ex(ctx, in[0], in[1], in[2], &o);
    loom_tensor_release(o.seed);
    return y;
}

static void test_nn_op_gradients_match_finite_differences(void **state) {
    (void)state;
    spec lin[3] = {{S2(4, 3), -1, 1}, {S2(5, 3), -1, 1}, {S1(5), -1, 1}};
    check_grad("linear", 3, lin, b_linear, 1e-6);
    /* a weight larger than x and y: computed as (W x^T)^T, whose backward avoids
     * transposing W or its gradient; x of rank 3 goes through the row reshape */
    spec wide[3] = {{S3(1, 2, 4), -1, 1}, {S2(9, 4), -1, 1}, {S1(9), -1, 1}};
    check_grad("linear with a large weight", 3, wide, b_linear, 1e-6);
    spec lint[3] = {{S3(2, 2, 3), -1, 1}, {S2(3, 5), -1, 1}, {S1(5), -1, 1}};
    check_grad("linear_t, a weight [in, out]", 3, lint, b_linear_t, 1e-6);
    spec sm = {S2(4, 5), -2, 2};
    check_grad("softmax", 1, &sm, b_softmax, 1e-6);
    check_grad("log_softmax", 1, &sm, b_log_softmax, 1e-6);
    check_grad("cross_entropy", 1, &sm, b_cross_entropy, 1e-6);
    spec sm3 = {S3(2, 2, 5), -2, 2};
    check_grad("cross_entropy over [B, T, C], ignore_index, smoothing", 1, &sm3,
               b_cross_entropy_smooth, 1e-6);
    spec cg[2] = {{S4(1, 4, 3, 3), -1, 1}, {S4(2, 2, 2, 2), -1, 1}};
    check_grad("conv2d groups", 2, cg, b_conv_groups, 1e-6);
    spec pl = {S4(1, 2, 4, 4), -1, 1};
    check_grad("max_pool2d, windows tiling x", 1, &pl, b_max_pool_tiled, 1e-6);
    spec ap = {S4(1, 2, 4, 6), -1, 1};
    check_grad("avg_pool2d", 1, &ap, b_avg_pool, 1e-6);
    spec bn[3] = {{S4(3, 2, 2, 2), -1, 1}, {S1(2), 0.5, 1.5}, {S1(2), -1, 1}};
    check_grad("batch_norm", 3, bn, b_batch_norm, 1e-5);
    spec ln[3] = {{S3(2, 3, 4), -1, 1}, {S2(3, 4), 0.5, 1.5}, {S2(3, 4), -1, 1}};
    check_grad("layer_norm", 3, ln, b_layer_norm, 1e-5);
    spec em = {S2(4, 3), -1, 1};
    check_grad("embedding", 1, &em, b_embedding, 1e-6);
    spec dr = {S2(4, 5), -1, 1};
    check_grad("dropout", 1, &dr, b_dropout, 1e-6);
    spec at[4] = {{S4(1, 2, 3, 4), -1, 1},
                  {S4(1, 2, 5, 4), -1, 1},
                  {S4(1, 2, 5, 3), -1, 1},
                  {S2(3, 5), -1, 1}};
    check_grad("scaled_dot_product_attention, additive mask", 4, at, b_attention_masked, 1e-6);
    spec ac[3] = {{S4(1, 4, 2, 3), -1, 1}, {S4(1, 4, 2, 3), -1, 1}, {S4(1, 4, 2, 3), -1, 1}};
    check_grad("scaled_dot_product_attention, causal, [B, T, H, D]", 3, ac, b_attention_causal_bthd,
               1e-6);
    check_grad("scaled_dot_product_attention, dropout", 3, at, b_attention_dropout, 1e-6);
}

/* ---- semantics ------------------------------------------------------------------------- */

static void test_gradients_of_a_hand_derived_expression(void **state) {
    (void)state;
    /* loss = sum(x * w) + sum(w^2): dL/dx = w, dL/dw = x + 2w. */
    loom_context *ctx = tu_context(false);
    float xv[3] = {1, 2, 3}, wv[3] = {0.5f, -1, 2};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){3}, xv);
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){3}, wv);
    loom_tensor *loss = loom_add(ctx, loom_sum(ctx, loom_mul(ctx, x, w), 0, NULL, false),
                                 loom_sum(ctx, loom_mul(ctx, w, w), 0, NULL, false));
    loom_tensor *g[2] = {NULL, NULL};
    assert_int_equal(loom_backward(ctx, loss, 2, (loom_tensor *[]){x, w}, g), LOOM_OK);
    float gx[3], gw[3];
    tu_read_f32(ctx, g[0], gx, 3);
    tu_read_f32(ctx, g[1], gw, 3);
    for (int i = 0; i < 3; i++) {
        assert_float_equal(gx[i], wv[i], 0);
        assert_float_equal(gw[i], xv[i] + 2 * wv[i], 0);
    }
    loom_tensor_release(x);
    loom_tensor_release(w);
    loom_context_destroy(ctx);
}

static void test_relu_gradient_reads_the_output_not_the_input(void **state) {
    (void)state;
    /* As PyTorch's threshold_backward: relu(x) > 0 exactly where x > 0, and the output is
     * what the next layer keeps for its own gradient anyway, so x need not be kept. */
    loom_context *ctx = tu_context(false);
    float xv[4] = {-1, 0, 2, -0.0f};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){4}, xv);
    loom_tensor *y = loom_relu(ctx, loom_mul(ctx, x, x));
    loom_tensor *loss = loom_sum(ctx, loom_mul(ctx, y, x), 0, NULL, false);
    loom_tensor *g = NULL;
    assert_int_equal(loom_backward(ctx, loss, 1, &x, &g), LOOM_OK);
    loom_fe_tensor *yt = loom_fe_tensor_get(ctx, y, __FILE__, __LINE__, "test");
    int32_t compares = 0;
    for (int32_t i = 0; i < ctx->trace.n_nodes; i++)
        if (ctx->trace.nodes[i].op == LOOM_IR_OP_GT) {
            assert_int_equal(ctx->trace.nodes[i].inputs[0], yt->node);
            compares++;
        }
    assert_int_equal(compares, 1);
    /* d/dx [relu(x^2) x] = 3x^2 where x^2 > 0, else 0 */
    float gv[4];
    tu_read_f32(ctx, g, gv, 4);
    for (int i = 0; i < 4; i++)
        assert_float_equal(gv[i], xv[i] * xv[i] > 0 ? 3 * xv[i] * xv[i] : 0, 0);
    loom_tensor_release(x);
    loom_context_destroy(ctx);
}

/* The gradient of a broadcast along axes of extent 1 of the same rank ([4, 1] -> [4, 32]) is
 * the sum with keepdim, no reshape (a reshape is read from a buffer, so its readers could
 * not join the sum's kernel as row stages: layer norm's backward); from a lower rank it is
 * the sum reshaped. Values by hand: d/db sum(x * b) is x's row sum, d/dc its column sum. */
static void test_a_broadcasts_gradient_keeps_the_reduced_axes(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    float xv[4 * 32], bv[4] = {1, 2, 3, 4}, cv[32];
    for (int i = 0; i < 4 * 32; i++)
        xv[i] = (float)((i * 7 % 11) - 5) / 4;
    for (int i = 0; i < 32; i++)
        cv[i] = (float)i / 8;
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){4, 32}, xv);
    loom_tensor *b = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){4, 1}, bv);
    loom_tensor *c = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){32}, cv);
    loom_tensor *loss =
        loom_sum(ctx, loom_add(ctx, loom_mul(ctx, x, b), loom_mul(ctx, x, c)), 0, NULL, false);
    loom_tensor *in[2] = {b, c}, *g[2] = {NULL, NULL};
    int32_t first = ctx->trace.n_nodes;
    assert_int_equal(loom_backward(ctx, loss, 2, in, g), LOOM_OK);
    int32_t keep = 0, flat = 0;
    for (int32_t i = first; i < ctx->trace.n_nodes; i++) {
        const loom_ir_node *nd = &ctx->trace.nodes[i];
        if (nd->op != LOOM_IR_OP_REDUCE_SUM)
            continue;
        if (nd->attrs.keepdim && nd->rank == 2 && nd->shape[0] == 4 && nd->shape[1] == 1)
            keep++;
        if (!nd->attrs.keepdim && nd->rank == 1 && nd->shape[0] == 32)
            flat++;
    }
    assert_int_equal(keep, 1);
    assert_int_equal(flat, 1);
    float gb[4], gc[32];
    tu_read_f32(ctx, g[0], gb, 4);
    tu_read_f32(ctx, g[1], gc, 32);
    for (int r = 0; r < 4; r++) {
        double want = 0;
        for (int j = 0; j < 32; j++)
            want += xv[r * 32 + j];
        assert_float_equal(gb[r], want, 1e-5);
    }
    for (int j = 0; j < 32; j++) {
        double want = 0;
        for (int r = 0; r < 4; r++)
            want += xv[r * 32 + j];
        assert_float_equal(gc[j], want, 1e-5);
    }
    loom_tensor_release(x);
    loom_tensor_release(b);
    loom_tensor_release(c);
    loom_context_destroy(ctx);
}

static void test_backward_twice_accumulates_and_unrelated_inputs_get_zeros(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    float xv[2] = {1.5f, -2}, zv[2] = {7, 8};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2}, xv);
    loom_tensor *z = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2}, zv);
    loom_tensor *g[2] = {NULL, NULL};
    /* d/dx sum(x^2) = 2x, then d/dx sum(3x) = 3 added on top. */
    loom_tensor *l1 = loom_sum(ctx, loom_mul(ctx, x, x), 0, NULL, false);
    assert_int_equal(loom_backward(ctx, l1, 2, (loom_tensor *[]){x, z}, g), LOOM_OK);
    loom_tensor *first = g[0];
    loom_tensor *l2 =
        loom_sum(ctx, loom_mul(ctx, x, loom_scalar(ctx, LOOM_DTYPE_F32, 3)), 0, NULL, false);
    assert_int_equal(loom_backward(ctx, l2, 2, (loom_tensor *[]){x, z}, g), LOOM_OK);
    float a[2], b[2], c[2];
    tu_read_f32(ctx, first, a, 2);
    tu_read_f32(ctx, g[0], b, 2);
    tu_read_f32(ctx, g[1], c, 2);
    for (int i = 0; i < 2; i++) {
        assert_float_equal(a[i], 2 * xv[i], 0);
        assert_float_equal(b[i], 2 * xv[i] + 3, 0);
        assert_float_equal(c[i], 0, 0);
    }
    loom_tensor_release(x);
    loom_tensor_release(z);
    loom_context_destroy(ctx);
}

static void test_detach_stops_the_gradient(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    float xv[2] = {3, -1};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2}, xv);
    /* loss = sum(x * detach(x)): gradient detach(x) = x, not 2x */
    loom_tensor *loss = loom_sum(ctx, loom_mul(ctx, x, loom_detach(ctx, x)), 0, NULL, false);
    loom_tensor *g = NULL;
    assert_int_equal(loom_backward(ctx, loss, 1, &x, &g), LOOM_OK);
    float gv[2];
    tu_read_f32(ctx, g, gv, 2);
    assert_float_equal(gv[0], 3, 0);
    assert_float_equal(gv[1], -1, 0);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    /* marks do not leak into the next step: the same node ids are differentiable again */
    loss = loom_sum(ctx, loom_mul(ctx, x, x), 0, NULL, false);
    g = NULL;
    assert_int_equal(loom_backward(ctx, loss, 1, &x, &g), LOOM_OK);
    tu_read_f32(ctx, g, gv, 2);
    assert_float_equal(gv[0], 6, 0);
    loom_tensor_release(x);
    loom_context_destroy(ctx);
}

/* A small MLP step: the JIT's gradients equal the interpreter's (f32, to rounding). */
static void mlp_grads(bool eager, float *out_w1, float *out_b2) {
    loom_context *ctx = tu_context(eager);
    enum { N = 8, IN = 6, H = 5, C = 3 };
    float x[N * IN], w1[H * IN], b1[H], w2[C * H], b2[C];
    int64_t y[N];
    uint64_t st = 99;
    float *all[] = {x, w1, b1, w2, b2};
    size_t cnt[] = {N * IN, H * IN, H, C * H, C};
    for (int k = 0; k < 5; k++)
        for (size_t i = 0; i < cnt[k]; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            all[k][i] = (float)((double)(st >> 11) * 0x1.0p-53 - 0.5);
        }
    for (int i = 0; i < N; i++)
        y[i] = i % C;
    loom_tensor *tx = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){N, IN}, x);
    loom_tensor *ty = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 1, (int64_t[]){N}, y);
    loom_tensor *p[4] = {
        loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){H, IN}, w1),
        loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){H}, b1),
        loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){C, H}, w2),
        loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){C}, b2),
    };
    loom_tensor *h = loom_relu(ctx, loom_linear(ctx, tx, p[0], p[1]));
    loom_tensor *loss =
        loom_cross_entropy(ctx, loom_linear(ctx, h, p[2], p[3]), ty, LOOM_REDUCTION_MEAN);
    loom_tensor *g[4] = {0};
    assert_int_equal(loom_backward(ctx, loss, 4, p, g), LOOM_OK);
    tu_read_f32(ctx, g[0], out_w1, H * IN);
    tu_read_f32(ctx, g[3], out_b2, C);
    loom_tensor_release(tx);
    loom_tensor_release(ty);
    for (int k = 0; k < 4; k++)
        loom_tensor_release(p[k]);
    loom_context_destroy(ctx);
}

/* The gradient of W in y = x W^T for a wide W (a tied lm_head): with dy [R, V] large enough
 * to be packed transposed, it is dy^T x, [V, C] as W is, not (x^T dy)^T. Values against the
 * sum they must be (loss = sum(y): dW[v, c] = sum over rows of x[r, c]). */
static void test_a_wide_weights_gradient_is_computed_in_its_own_layout(void **state) {
    (void)state;
    enum { R = 64, C = 8, V = 16384 };
    float *x = malloc(R * C * 4), *w = malloc((size_t)V * C * 4), *gw = malloc((size_t)V * C * 4);
    for (int i = 0; i < R * C; i++)
        x[i] = (float)((i * 13) % 11) / 4 - 1;
    for (int i = 0; i < V * C; i++)
        w[i] = (float)((i * 7) % 5) / 8;
    for (int eager = 0; eager < 2; eager++) {
        loom_context *ctx = tu_context(eager);
        loom_tensor *tx = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){R, C}, x);
        loom_tensor *tw = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){V, C}, w);
        loom_tensor *loss =
            loom_sum(ctx, loom_matmul(ctx, tx, loom_transpose(ctx, tw)), 0, NULL, false);
        loom_tensor *g[1] = {0};
        assert_int_equal(loom_backward(ctx, loss, 1, &tw, g), LOOM_OK);
        bool direct = false;
        for (int32_t i = 0; i < ctx->trace.n_nodes; i++) {
            const loom_ir_node *n = &ctx->trace.nodes[i];
            direct =
                direct || (n->op == LOOM_IR_OP_MATMUL && n->shape[0] == V && n->shape[1] == C &&
                           ctx->trace.nodes[n->inputs[0]].op == LOOM_IR_OP_TRANSPOSE);
        }
        assert_true(direct);
        tu_read_f32(ctx, g[0], gw, (size_t)V * C);
        for (int c = 0; c < C; c++) {
            double want = 0;
            for (int r = 0; r < R; r++)
                want += x[r * C + c];
            for (int v = 0; v < V; v += 997)
                assert_float_equal(gw[v * C + c], want, 1e-5);
        }
        loom_tensor_release(tx);
        loom_tensor_release(tw);
        loom_context_destroy(ctx);
    }
    free(x);
    free(w);
    free(gw);
}

static void test_jit_gradients_match_the_interpreter(void **state) {
    (void)state;
    float w1_i[30], b2_i[3], w1_j[30], b2_j[3];
    mlp_grads(true, w1_i, b2_i);
    mlp_grads(false, w1_j, b2_j);
    double sum_b2 = 0;
    for (int i = 0; i < 30; i++)
        assert_float_equal(w1_j[i], w1_i[i], 1e-6 + 1e-5 * fabsf(w1_i[i]));
    for (int i = 0; i < 3; i++) {
        assert_float_equal(b2_j[i], b2_i[i], 1e-6);
        sum_b2 += b2_i[i];
    }
    /* softmax - one_hot sums to zero over classes, so the bias gradient does too */
    assert_float_equal(sum_b2, 0, 1e-6);
}

static void test_backward_rejects_bad_arguments_and_stays_usable(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    float v[2] = {1, 2};
    int64_t iv[2] = {1, 2};
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){2}, v);
    loom_tensor *i = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 1, (int64_t[]){2}, iv);
    loom_tensor *g = NULL;
    assert_int_equal(loom_backward(ctx, NULL, 1, &x, &g), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "loss is NULL"));
    loom_context_clear_error(ctx);
    assert_int_equal(loom_backward(ctx, loom_sum(ctx, i, 0, NULL, false), 1, &x, &g),
                     LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "float dtype"));
    loom_context_clear_error(ctx);
    loom_tensor *loss = loom_sum(ctx, x, 0, NULL, false);
    assert_int_equal(loom_backward(ctx, loss, 1, &i, &g), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "wrt[0]"));
    loom_context_clear_error(ctx);
    g = loom_full(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){3}, 0.0);
    assert_int_equal(loom_backward(ctx, loss, 1, &x, &g), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "out_grads[0] is f32[3]"));
    loom_context_clear_error(ctx);
    g = NULL;
    assert_int_equal(loom_backward(ctx, loss, 1, &x, &g), LOOM_OK);
    float gv[2];
    tu_read_f32(ctx, g, gv, 2);
    assert_float_equal(gv[0], 1, 0);
    loom_tensor_release(x);
    loom_tensor_release(i);
    loom_context_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_vjp_matches_finite_differences),
        cmocka_unit_test(test_more_vjp_cases_match_finite_differences),
        cmocka_unit_test(test_nn_op_gradients_match_finite_differences),
        cmocka_unit_test(test_gradients_of_a_hand_derived_expression),
        cmocka_unit_test(test_relu_gradient_reads_the_output_not_the_input),
        cmocka_unit_test(test_a_broadcasts_gradient_keeps_the_reduced_axes),
        cmocka_unit_test(test_backward_twice_accumulates_and_unrelated_inputs_get_zeros),
        cmocka_unit_test(test_detach_stops_the_gradient),
        cmocka_unit_test(test_matmul_with_a_2d_weight_folds_rows_and_never_copies_the_weight),
        cmocka_unit_test(test_a_wide_weights_gradient_is_computed_in_its_own_layout),
        cmocka_unit_test(test_jit_gradients_match_the_interpreter),
        cmocka_unit_test(test_backward_rejects_bad_arguments_and_stays_usable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
