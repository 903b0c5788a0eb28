/* Autocast: scopes tag what they record (nested, disabled, with errors), backward inherits
 * the forward's tags, AMP compiles its own graph and nothing else recompiles, the autocast
 * pass casts each parameter once, and bf16/f16 steps agree with the interpreter and with
 * fp32 within 16-bit tolerances while every tensor the user sees keeps its dtype. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "frontend/frontend.h"
#include "loom/amp.h"
#include "loom/dist.h"
#include "loom/nn.h"
#include "passes/passes.h"

enum { B = 8, IN = 12, HID = 10, OUT = 4 };

/* Deterministic values in [-scale, scale). */
static void fill(float *v, int n, uint32_t seed, float scale) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = ((float)(seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f) * scale;
    }
}

typedef struct mlp {
    loom_tensor *x, *y, *w1, *b1, *w2, *b2;
} mlp;

static mlp mlp_make(loom_context *ctx) {
    float x[B * IN], w1[HID * IN], b1[HID], w2[OUT * HID], b2[OUT];
    fill(x, B * IN, 1, 1.0f);
    fill(w1, HID * IN, 2, 0.4f);
    fill(b1, HID, 3, 0.1f);
    fill(w2, OUT * HID, 4, 0.4f);
    fill(b2, OUT, 5, 0.1f);
    int64_t labels[B];
    for (int i = 0; i < B; i++)
        labels[i] = (i * 7) % OUT;
    mlp m = {
        .x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){B, IN}, x),
        .y = loom_tensor_from_host(ctx, LOOM_DTYPE_I64, 1, (int64_t[]){B}, labels),
        .w1 = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){HID, IN}, w1),
        .b1 = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){HID}, b1),
        .w2 = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){OUT, HID}, w2),
        .b2 = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 1, (int64_t[]){OUT}, b2),
    };
    assert_non_null(m.b2);
    return m;
}

static void mlp_free(mlp *m) {
    loom_tensor *all[6] = {m->x, m->y, m->w1, m->b1, m->w2, m->b2};
    for (int i = 0; i < 6; i++)
        loom_tensor_release(all[i]);
}

/* Records loss and the gradients of the four parameters, the forward under autocast `ac`
 * (LOOM_DTYPE_F32: no scope), backward outside it as PyTorch recommends. */
static loom_tensor *mlp_step(loom_context *ctx, const mlp *m, loom_dtype ac, loom_tensor **grads) {
    if (ac != LOOM_DTYPE_F32)
        assert_int_equal(loom_autocast_begin(ctx, ac), LOOM_OK);
    loom_tensor *h = loom_relu(ctx, loom_linear(ctx, m->x, m->w1, m->b1));
    loom_tensor *loss =
        loom_cross_entropy(ctx, loom_linear(ctx, h, m->w2, m->b2), m->y, LOOM_REDUCTION_MEAN);
    if (ac != LOOM_DTYPE_F32)
        assert_int_equal(loom_autocast_end(ctx), LOOM_OK);
    loom_tensor *params[4] = {m->w1, m->b1, m->w2, m->b2};
    memset(grads, 0, 4 * sizeof *grads);
    assert_int_equal(loom_backward(ctx, loss, 4, params, grads), LOOM_OK);
    return loss;
}

/* The step's loss and flattened gradients, in f32. */
typedef struct mlp_result {
    float loss;
    float g[HID * IN + HID + OUT * HID + OUT];
} mlp_result;

static void mlp_run(bool eager, loom_dtype ac, mlp_result *r) {
    loom_context *ctx = tu_context(eager);
    mlp m = mlp_make(ctx);
    loom_tensor *grads[4];
    loom_tensor *loss = mlp_step(ctx, &m, ac, grads);
    tu_read_f32(ctx, loss, &r->loss, 1);
    static const int sizes[4] = {HID * IN, HID, OUT * HID, OUT};
    float *at = r->g;
    for (int i = 0; i < 4; i++) {
        loom_dtype dt;
        assert_int_equal(loom_tensor_dtype(grads[i], &dt), LOOM_OK);
        assert_int_equal(dt, LOOM_DTYPE_F32); /* master gradients stay f32 */
        tu_read_f32(ctx, grads[i], at, (size_t)sizes[i]);
        at += sizes[i];
    }
    loom_dtype dt;
    assert_int_equal(loom_tensor_dtype(loss, &dt), LOOM_OK);
    assert_int_equal(dt, LOOM_DTYPE_F32);
    mlp_free(&m);
    loom_context_destroy(ctx);
}

static int tags_of(const loom_context *ctx, loom_ir_op op, loom_dtype tag) {
    int n = 0;
    for (int32_t i = 0; i < ctx->trace.n_nodes; i++)
        n += ctx->trace.nodes[i].op == op && ctx->trace.nodes[i].attrs.autocast == tag;
    return n;
}

/* ---- scopes ------------------------------------------------------------------------------ */

static void test_ops_in_a_scope_carry_its_dtype_and_scopes_nest(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    float v[4] = {1, 2, 3, 4};
    loom_tensor *a = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 2, (int64_t[]){2, 2}, v);
    assert_int_equal(loom_autocast_dtype(ctx), LOOM_DTYPE_F32);
    loom_tensor *r0 = loom_exp(ctx, a); /* no scope */
    assert_int_equal(loom_autocast_begin(ctx, LOOM_DTYPE_BF16), LOOM_OK);
    loom_tensor *r1 = loom_matmul(ctx, a, a);
    assert_int_equal(loom_autocast_begin(ctx, LOOM_DTYPE_F16), LOOM_OK);
    loom_tensor *r2 = loom_matmul(ctx, r1, a);
    assert_int_equal(loom_autocast_begin(ctx, LOOM_DTYPE_F32), LOOM_OK); /* autocast off */
    assert_int_equal(loom_autocast_dtype(ctx), LOOM_DTYPE_F32);
    loom_tensor *r3 = loom_matmul(ctx, r2, a);
    assert_int_equal(loom_autocast_end(ctx), LOOM_OK);
    assert_int_equal(loom_autocast_dtype(ctx), LOOM_DTYPE_F16);
    assert_int_equal(loom_autocast_end(ctx), LOOM_OK);
    loom_tensor *r4 = loom_add(ctx, r3, a);
    assert_int_equal(loom_autocast_end(ctx), LOOM_OK);
    loom_tensor *r5 = loom_neg(ctx, r4);
    assert_non_null(r5);
    loom_tensor *rs[6] = {r0, r1, r2, r3, r4, r5};
    static const loom_dtype want[6] = {LOOM_DTYPE_F32, LOOM_DTYPE_BF16, LOOM_DTYPE_F16,
                                       LOOM_DTYPE_F32, LOOM_DTYPE_BF16, LOOM_DTYPE_F32};
    for (int i = 0; i < 6; i++) {
        loom_fe_tensor *t = loom_fe_tensor_get(ctx, rs[i], __FILE__, __LINE__, "test");
        assert_non_null(t);
        assert_int_equal(ctx->trace.nodes[t->node].attrs.autocast, want[i]);
        loom_dtype dt;
        assert_int_equal(loom_tensor_dtype(rs[i], &dt), LOOM_OK);
        assert_int_equal(dt, LOOM_DTYPE_F32); /* recorded types do not change */
    }
    /* sources carry no tag: an input recorded inside a scope is plain */
    for (int32_t i = 0; i < ctx->trace.n_nodes; i++)
        if (ctx->trace.nodes[i].op == LOOM_IR_OP_INPUT)
            assert_int_equal(ctx->trace.nodes[i].attrs.autocast, LOOM_DTYPE_F32);
    /* the values: r1 = a^2 in bf16 and r2 = a^3 in f16 (exact here); r3 = a^4 with autocast
     * off takes the f16 r2 and the f32 a, promoted to f32; r4 adds two f32 values, which
     * stays f32 under bf16 autocast (add is not a lower-precision op): 634 + 4 = 638 would
     * be 640 in bf16 */
    float out[4];
    tu_read_f32(ctx, r5, out, 4);
    static const float a4[4] = {199, 290, 435, 634};
    for (int i = 0; i < 4; i++)
        assert_float_equal(out[i], -(a4[i] + v[i]), 0.0f);
    loom_tensor_release(a);
    loom_context_destroy(ctx);
}

static void test_scope_errors_name_the_problem_and_leave_the_context_usable(void **state) {
    (void)state;
    assert_int_equal(loom_autocast_begin(NULL, LOOM_DTYPE_BF16), LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_autocast_end(NULL), LOOM_STATUS_INVALID_ARGUMENT);
    assert_int_equal(loom_autocast_dtype(NULL), LOOM_DTYPE_F32);
    loom_context *ctx = tu_context(true);
    assert_int_equal(loom_autocast_begin(ctx, LOOM_DTYPE_I32), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "bf16, f16 or f32 (off), not i32"));
    loom_context_clear_error(ctx);
    assert_int_equal(loom_autocast_end(ctx), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "no autocast scope is open"));
    loom_context_clear_error(ctx);
    for (int i = 0; i < LOOM_AUTOCAST_MAX_DEPTH; i++)
        assert_int_equal(loom_autocast_begin(ctx, LOOM_DTYPE_BF16), LOOM_OK);
    assert_int_equal(loom_autocast_begin(ctx, LOOM_DTYPE_BF16), LOOM_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(loom_context_error_message(ctx), "missing loom_autocast_end"));
    loom_context_clear_error(ctx);
    for (int i = 0; i < LOOM_AUTOCAST_MAX_DEPTH; i++)
        assert_int_equal(loom_autocast_end(ctx), LOOM_OK);
    assert_int_equal(loom_autocast_dtype(ctx), LOOM_DTYPE_F32);
    mlp_result r;
    loom_context_destroy(ctx);
    mlp_run(true, LOOM_DTYPE_BF16, &r); /* and a step still runs */
    assert_true(isfinite(r.loss));
}

static void test_backward_runs_each_vjp_at_its_forward_precision(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    mlp m = mlp_make(ctx);
    loom_tensor *grads[4];
    loom_tensor *loss = mlp_step(ctx, &m, LOOM_DTYPE_BF16, grads);
    assert_non_null(loss);
    /* backward ran outside the scope, yet every matmul (2 forward, at least 3 VJPs)
     * carries bf16, and nothing is tagged f16 */
    assert_true(tags_of(ctx, LOOM_IR_OP_MATMUL, LOOM_DTYPE_BF16) >= 5);
    assert_int_equal(tags_of(ctx, LOOM_IR_OP_MATMUL, LOOM_DTYPE_F32), 0);
    assert_int_equal(tags_of(ctx, LOOM_IR_OP_EXP, LOOM_DTYPE_F16), 0);
    /* ops recorded after backward are plain again */
    loom_tensor *after = loom_neg(ctx, loss);
    loom_fe_tensor *t = loom_fe_tensor_get(ctx, after, __FILE__, __LINE__, "test");
    assert_int_equal(ctx->trace.nodes[t->node].attrs.autocast, LOOM_DTYPE_F32);
    mlp_free(&m);
    loom_context_destroy(ctx);
}

/* ---- the graph ---------------------------------------------------------------------------- */

static void test_amp_compiles_its_own_graph_and_nothing_else_recompiles(void **state) {
    (void)state;
    loom_context *ctx = tu_context(false);
    mlp m = mlp_make(ctx);
    static const loom_dtype modes[7] = {LOOM_DTYPE_BF16, LOOM_DTYPE_BF16, LOOM_DTYPE_F32,
                                        LOOM_DTYPE_BF16, LOOM_DTYPE_F32,  LOOM_DTYPE_F16,
                                        LOOM_DTYPE_F16};
    static const int misses[7] = {1, 1, 2, 2, 2, 3, 3};
    for (int s = 0; s < 7; s++) {
        loom_tensor *grads[4];
        loom_tensor *loss = mlp_step(ctx, &m, modes[s], grads);
        loom_tensor_retain(loss);
        assert_int_equal(loom_mark_step(ctx), LOOM_OK);
        float v;
        tu_read_f32(ctx, loss, &v, 1);
        assert_true(isfinite(v));
        loom_tensor_release(loss);
        assert_int_equal(loom_metric_value(ctx, "CacheMiss"), misses[s]);
    }
    mlp_free(&m);
    loom_context_destroy(ctx);
}

/* The trace's subgraph for the step's n (<= 4) gradients, through the autocast pass and dce. */
static void cut_and_autocast_n(loom_context *ctx, int32_t n, loom_tensor **grads,
                               loom_ir_graph *g) {
    int32_t roots[4];
    for (int i = 0; i < n; i++)
        roots[i] = loom_fe_tensor_get(ctx, grads[i], __FILE__, __LINE__, "test")->node;
    loom_ir_graph_init(g, &ctx->alloc);
    assert_int_equal(loom_ir_graph_extract(g, &ctx->trace, n, roots, NULL, false, NULL), LOOM_OK);
    static const loom_pass *const passes[] = {&loom_pass_autocast, &loom_pass_conv_decompose,
                                              &loom_pass_dce};
    loom_pass_options o = {.verify_each = true};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_pass_run_pipeline(g, passes, 3, &o, &d), LOOM_OK);
}

static void cut_and_autocast(loom_context *ctx, loom_tensor **grads, loom_ir_graph *g) {
    cut_and_autocast_n(ctx, 4, grads, g);
}

enum { CONV_XN = 2 * 3 * 7 * 7, CONV_WN = 4 * 3 * 3 * 3 };

/* x [2,3,7,7] and w [4,3,3,3] from fixed seeds, and conv2d(x, w) (under whatever autocast
 * scope the caller opened). */
static loom_tensor *conv_xw(loom_context *ctx, loom_tensor **x, loom_tensor **w) {
    float xs[CONV_XN], ws[CONV_WN];
    fill(xs, CONV_XN, 11, 1.0f);
    fill(ws, CONV_WN, 12, 0.5f);
    *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, (int64_t[]){2, 3, 7, 7}, xs);
    *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, (int64_t[]){4, 3, 3, 3}, ws);
    return loom_conv2d(ctx, *x, *w, NULL, NULL, (int64_t[]){1, 1}, NULL, 1);
}

/* loss = sum(conv2d(x, w)^2) with conv2d under autocast dtype ac (f32: none); the gradients
 * of x and w into gx, gw (when not NULL) and the graph after the autocast and conv-decompose
 * passes into g. */
static void conv_grads(loom_dtype ac, loom_ir_graph *g, float *gx, float *gw) {
    loom_context *ctx = tu_context(true);
    loom_tensor *x, *w;
    assert_int_equal(loom_autocast_begin(ctx, ac), LOOM_OK);
    loom_tensor *y = conv_xw(ctx, &x, &w);
    assert_int_equal(loom_autocast_end(ctx), LOOM_OK);
    loom_tensor *loss = loom_sum(ctx, loom_mul(ctx, y, y), 0, NULL, false);
    loom_tensor *grads[2] = {NULL, NULL};
    assert_int_equal(loom_backward(ctx, loss, 2, (loom_tensor *[]){x, w}, grads), LOOM_OK);
    if (g)
        cut_and_autocast_n(ctx, 2, grads, g);
    if (gx)
        tu_read_f32(ctx, grads[0], gx, CONV_XN);
    if (gw)
        tu_read_f32(ctx, grads[1], gw, CONV_WN);
    loom_tensor_release(x);
    loom_tensor_release(w);
    loom_context_destroy(ctx);
}

/* Node x is a window of col2im: a PAD, or a cast of one. */
static bool is_window(const loom_ir_graph *g, int32_t x) {
    if (g->nodes[x].op == LOOM_IR_OP_CAST)
        x = g->nodes[x].inputs[0];
    return g->nodes[x].op == LOOM_IR_OP_PAD;
}

/* The conv ops run in bf16 (autocast's LOWER class). Their kernels accumulate each output
 * in f32 and round once. Decomposed (LOOM_CONV=im2col), conv2d's input gradient (col2im: the
 * 9 padded windows of a 3x3 kernel added up) sums in f32 and rounds once too, as oneDNN's
 * bf16 convolution backward does, instead of rounding after every add, and the matmuls are
 * bf16; what the user gets is as close to fp32 as before or closer. */
static void test_conv_input_gradients_sum_their_windows_in_f32(void **state) {
    (void)state;
    loom_ir_graph g;
    unsetenv("LOOM_CONV");
    conv_grads(LOOM_DTYPE_BF16, &g, NULL, NULL);
    int bf16_convs = 0;
    for (int32_t i = 0; i < g.n_nodes; i++) {
        assert_int_not_equal(g.nodes[i].op, LOOM_IR_OP_MATMUL);
        bf16_convs += loom_ir_op_table[g.nodes[i].op].kind == LOOM_IR_KIND_CONV &&
                      g.nodes[i].dtype == LOOM_DTYPE_BF16;
    }
    assert_int_equal(bf16_convs, 3); /* forward, and the gradients of x and w */
    loom_ir_graph_deinit(&g);

    setenv("LOOM_CONV", "im2col", 1);
    conv_grads(LOOM_DTYPE_BF16, &g, NULL, NULL);
    unsetenv("LOOM_CONV");
    int window_adds = 0, bf16_matmuls = 0;
    for (int32_t i = 0; i < g.n_nodes; i++) {
        const loom_ir_node *n = &g.nodes[i];
        if (n->op == LOOM_IR_OP_MATMUL)
            bf16_matmuls += n->dtype == LOOM_DTYPE_BF16;
        if (n->op == LOOM_IR_OP_ADD &&
            (is_window(&g, n->inputs[0]) || is_window(&g, n->inputs[1]))) {
            assert_int_equal(n->dtype, LOOM_DTYPE_F32);
            window_adds++;
        }
    }
    assert_int_equal(window_adds, 8);  /* 9 windows */
    assert_int_equal(bf16_matmuls, 3); /* forward, and the gradients of w and of the columns */
    loom_ir_graph_deinit(&g);

    float gx16[2 * 3 * 7 * 7], gx32[2 * 3 * 7 * 7];
    conv_grads(LOOM_DTYPE_BF16, NULL, gx16, NULL);
    conv_grads(LOOM_DTYPE_F32, NULL, gx32, NULL);
    double err = 0, norm = 0;
    for (int i = 0; i < 2 * 3 * 7 * 7; i++) {
        err = fmax(err, fabs(gx16[i] - gx32[i]));
        norm = fmax(norm, fabs(gx32[i]));
    }
    assert_true(norm > 1 && err <= 2e-2 * norm);
}

/* Gradients all-reduced inside an autocast scope reduce in the dtype they were recorded
 * with (f32 for an f32 weight), as DDP reduces the f32 gradients of f32 master weights,
 * although the weight gradient comes out of a bf16 matmul. */
static void test_an_all_reduce_of_an_f32_gradient_stays_f32_under_autocast(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    loom_tensor *x, *w;
    assert_int_equal(loom_autocast_begin(ctx, LOOM_DTYPE_BF16), LOOM_OK);
    loom_tensor *y = conv_xw(ctx, &x, &w);
    loom_tensor *loss = loom_sum(ctx, loom_mul(ctx, y, y), 0, NULL, false);
    loom_tensor *gw = NULL;
    assert_int_equal(loom_backward(ctx, loss, 1, (loom_tensor *[]){w}, &gw), LOOM_OK);
    loom_tensor *r = loom_all_reduce(ctx, gw, LOOM_REDUCE_SUM, 1.0);
    assert_int_equal(loom_autocast_end(ctx), LOOM_OK);
    loom_ir_graph g;
    cut_and_autocast_n(ctx, 1, &r, &g);
    int reduces = 0;
    for (int32_t i = 0; i < g.n_nodes; i++)
        if (g.nodes[i].op == LOOM_IR_OP_ALL_REDUCE) {
            assert_int_equal(g.nodes[i].dtype, LOOM_DTYPE_F32);
            assert_int_equal(g.nodes[g.nodes[i].inputs[0]].dtype, LOOM_DTYPE_F32);
            reduces++;
        }
    assert_int_equal(reduces, 1);
    loom_ir_graph_deinit(&g);
    loom_tensor_release(x);
    loom_tensor_release(w);
    loom_context_destroy(ctx);
}

static void test_each_parameter_is_cast_once_for_forward_and_backward(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    mlp m = mlp_make(ctx);
    loom_tensor *grads[4];
    mlp_step(ctx, &m, LOOM_DTYPE_BF16, grads);
    loom_ir_graph g;
    cut_and_autocast(ctx, grads, &g);
    int casts_of_input[8] = {0}, n_bf16_matmuls = 0, tagged = 0;
    for (int32_t i = 0; i < g.n_nodes; i++) {
        const loom_ir_node *n = &g.nodes[i];
        tagged += n->attrs.autocast != LOOM_DTYPE_F32;
        if (n->op == LOOM_IR_OP_CAST && g.nodes[n->inputs[0]].op == LOOM_IR_OP_INPUT)
            casts_of_input[g.nodes[n->inputs[0]].attrs.index]++;
        if (n->op == LOOM_IR_OP_MATMUL) {
            assert_int_equal(n->dtype, LOOM_DTYPE_BF16);
            assert_int_equal(g.nodes[n->inputs[0]].dtype, LOOM_DTYPE_BF16);
            n_bf16_matmuls++;
        }
    }
    assert_int_equal(tagged, 0); /* the pass consumed every tag */
    assert_int_equal(n_bf16_matmuls, 5);
    for (int32_t k = 0; k < g.n_graph_inputs; k++) /* x, w1, b1, w2, b2: one cast each */
        if (g.nodes[k].op == LOOM_IR_OP_INPUT && g.nodes[k].dtype == LOOM_DTYPE_F32)
            assert_true(casts_of_input[g.nodes[k].attrs.index] <= 1);
    int n_cast_inputs = 0;
    for (int k = 0; k < 8; k++)
        n_cast_inputs += casts_of_input[k];
    assert_int_equal(n_cast_inputs, 5);
    for (int32_t o = 0; o < g.n_outputs; o++) /* gradients keep their recorded f32 */
        assert_int_equal(g.nodes[g.outputs[o].node].dtype, LOOM_DTYPE_F32);
    loom_ir_graph_deinit(&g);
    mlp_free(&m);
    loom_context_destroy(ctx);
}

/* "A cast never costs a pass over memory of its own": in the JIT's plan of a bf16 step no
 * kernel exists for a 16-bit cast (each is fused into its producer, its consumer, or the
 * packing of every matmul that reads it), and the plan has no more kernels than fp32's. */
static void test_no_kernel_is_spent_on_a_16_bit_cast(void **state) {
    (void)state;
    int kernels[2];
    for (int k = 0; k < 2; k++) {
        loom_context *ctx = tu_context(true);
        mlp m = mlp_make(ctx);
        loom_tensor *grads[4];
        mlp_step(ctx, &m, k ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32, grads);
        int32_t roots[4];
        for (int i = 0; i < 4; i++)
            roots[i] = loom_fe_tensor_get(ctx, grads[i], __FILE__, __LINE__, "test")->node;
        loom_ir_graph g;
        loom_ir_graph_init(&g, &ctx->alloc);
        assert_int_equal(loom_ir_graph_extract(&g, &ctx->trace, 4, roots, NULL, false, NULL),
                         LOOM_OK);
        loom_ir_plan plan;
        loom_ir_plan_init(&plan, &ctx->alloc);
        loom_pass_options o = {.verify_each = true};
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        assert_int_equal(loom_pass_build_plan(&g, &o, &plan, &d), LOOM_OK);
        for (int32_t j = 0; j < plan.n_kernels; j++) {
            const loom_ir_node *root = &g.nodes[plan.kernels[j].root];
            if (root->op == LOOM_IR_OP_CAST && root->dtype != LOOM_DTYPE_F32)
                print_error("kernel %d is a cast to %s\n", (int)j, loom_dtype_name(root->dtype));
            assert_false(root->op == LOOM_IR_OP_CAST && root->dtype != LOOM_DTYPE_F32);
        }
        kernels[k] = plan.n_kernels;
        loom_ir_plan_deinit(&plan);
        loom_ir_graph_deinit(&g);
        mlp_free(&m);
        loom_context_destroy(ctx);
    }
    assert_true(kernels[1] <= kernels[0]);
}

/* ---- values ------------------------------------------------------------------------------ */

static void expect_close(const mlp_result *a, const mlp_result *b, double rtol, double atol,
                         const char *what) {
    int bad = 0;
    if (fabs(a->loss - b->loss) > atol + rtol * fabs(b->loss)) {
        print_error("%s: loss %.7g vs %.7g\n", what, a->loss, b->loss);
        bad++;
    }
    for (size_t i = 0; i < sizeof a->g / sizeof a->g[0]; i++)
        if (fabs(a->g[i] - b->g[i]) > atol + rtol * fabs(b->g[i])) {
            if (bad++ < 5)
                print_error("%s: gradient %zu: %.7g vs %.7g\n", what, i, a->g[i], b->g[i]);
        }
    assert_int_equal(bad, 0);
}

static void test_16_bit_steps_match_the_interpreter_and_stay_near_fp32(void **state) {
    (void)state;
    mlp_result f32, jit, ref;
    mlp_run(true, LOOM_DTYPE_F32, &f32);
    static const loom_dtype dts[2] = {LOOM_DTYPE_BF16, LOOM_DTYPE_F16};
    for (int k = 0; k < 2; k++) {
        mlp_run(false, dts[k], &jit);
        mlp_run(true, dts[k], &ref);
        /* same graph on both: they differ by accumulation order (f32 vs f64) before a
         * 16-bit rounding, so by one 16-bit ulp at most */
        double ulp = dts[k] == LOOM_DTYPE_BF16 ? 0x1p-7 : 0x1p-10;
        expect_close(&jit, &ref, 2 * ulp, 1e-6, "jit vs interpreter");
        /* against fp32: a few 16-bit roundings of inputs, weights and activations */
        expect_close(&ref, &f32, 16 * ulp, 2e-3, "16-bit vs fp32");
        /* and it is not fp32: the 16-bit loss differs somewhere */
        assert_true(ref.loss != f32.loss || memcmp(ref.g, f32.g, sizeof ref.g) != 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_in_a_scope_carry_its_dtype_and_scopes_nest),
        cmocka_unit_test(test_scope_errors_name_the_problem_and_leave_the_context_usable),
        cmocka_unit_test(test_backward_runs_each_vjp_at_its_forward_precision),
        cmocka_unit_test(test_amp_compiles_its_own_graph_and_nothing_else_recompiles),
        cmocka_unit_test(test_each_parameter_is_cast_once_for_forward_and_backward),
        cmocka_unit_test(test_no_kernel_is_spent_on_a_16_bit_cast),
        cmocka_unit_test(test_conv_input_gradients_sum_their_windows_in_f32),
        cmocka_unit_test(test_an_all_reduce_of_an_f32_gradient_stays_f32_under_autocast),
        cmocka_unit_test(test_16_bit_steps_match_the_interpreter_and_stay_near_fp32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
