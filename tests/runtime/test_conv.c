/* conv2d and its gradients below the frontend: inference errors, the text format, the
 * reference interpreter against a plain convolution written here (scatter-form, unlike the
 * interpreter's gathers) over a sweep of windows in f32, bf16 and f16, which convolutions
 * the conv-decompose pass rewrites, its graph (the im2col path, forced with LOOM_CONV=im2col)
 * against the interpreter's direct ops, and fusion's convolution kernels. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "passes/passes.h"
#include "runtime/runtime.h"

#define S(...) ((const int64_t[]){__VA_ARGS__})

static loom_allocator sys;

static int setup(void **state) {
    (void)state;
    sys = loom_allocator_system();
    return 0;
}

/* ---- the sweep ---------------------------------------------------------------------------- */

typedef struct conv_case {
    const char *name;
    int64_t n, c, h, w, o, kh, kw;
    loom_ir_conv cv;
} conv_case;

static const conv_case sweep[] = {
    {"odd 7x5, 3x3 pad 1", 2, 3, 7, 5, 4, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 1, {0, 0}}},
    {"stride 2", 1, 2, 9, 8, 3, 3, 3, {{2, 2}, {1, 1}, {1, 1}, 1, {0, 0}}},
    {"dilation 2", 1, 2, 9, 9, 2, 3, 3, {{1, 1}, {2, 2}, {2, 2}, 1, {0, 0}}},
    {"groups 2, 3x2, stride 2x1", 2, 4, 6, 5, 6, 3, 2, {{2, 1}, {1, 0}, {1, 1}, 2, {0, 0}}},
    {"depthwise 3x3", 1, 3, 6, 6, 3, 3, 3, {{1, 1}, {1, 1}, {1, 1}, 3, {0, 0}}},
    {"depthwise, 2 per channel", 1, 2, 5, 5, 4, 3, 3, {{2, 2}, {0, 0}, {1, 1}, 2, {0, 0}}},
    {"1x1", 2, 5, 4, 3, 3, 1, 1, {{1, 1}, {0, 0}, {1, 1}, 1, {0, 0}}},
    {"7x7 stride 2 pad 3", 1, 3, 11, 10, 2, 7, 7, {{2, 2}, {3, 3}, {1, 1}, 1, {0, 0}}},
    {"2x4, stride 1x3, dilation 2x1", 1, 1, 5, 7, 1, 2, 4, {{1, 3}, {0, 2}, {2, 1}, 1, {0, 0}}},
};
#define N_SWEEP (sizeof sweep / sizeof sweep[0])

typedef struct conv_shapes {
    int64_t x[4], w[4], y[4];
} conv_shapes;

static conv_shapes shapes_of(const conv_case *k) {
    conv_shapes s = {{k->n, k->c, k->h, k->w}, {k->o, k->c / k->cv.groups, k->kh, k->kw}, {0}};
    s.y[0] = k->n;
    s.y[1] = k->o;
    s.y[2] =
        loom_ir_conv_out_extent(k->h, k->kh, k->cv.stride[0], k->cv.padding[0], k->cv.dilation[0]);
    s.y[3] =
        loom_ir_conv_out_extent(k->w, k->kw, k->cv.stride[1], k->cv.padding[1], k->cv.dilation[1]);
    return s;
}

/* y = conv(x, w), dx = conv^T(dy, w), dw = conv^T(x, dy) in double, by scattering every
 * (output pixel, window tap) product once. */
static void plain_conv(const conv_case *k, const conv_shapes *s, const double *x, const double *w,
                       const double *dy, double *y, double *dx, double *dw) {
    int64_t cg = s->w[1], og = k->o / k->cv.groups, oh = s->y[2], ow = s->y[3];
    memset(y, 0, (size_t)loom_ir_numel(4, s->y) * sizeof *y);
    memset(dx, 0, (size_t)loom_ir_numel(4, s->x) * sizeof *dx);
    memset(dw, 0, (size_t)loom_ir_numel(4, s->w) * sizeof *dw);
    for (int64_t n = 0; n < k->n; n++)
        for (int64_t o = 0; o < k->o; o++)
            for (int64_t i = 0; i < oh; i++)
                for (int64_t j = 0; j < ow; j++)
                    for (int64_t c = 0; c < cg; c++)
                        for (int64_t a = 0; a < k->kh; a++)
                            for (int64_t b = 0; b < k->kw; b++) {
                                int64_t ih =
                                    i * k->cv.stride[0] - k->cv.padding[0] + a * k->cv.dilation[0];
                                int64_t iw =
                                    j * k->cv.stride[1] - k->cv.padding[1] + b * k->cv.dilation[1];
                                if (ih < 0 || ih >= k->h || iw < 0 || iw >= k->w)
                                    continue;
                                int64_t xi = ((n * k->c + o / og * cg + c) * k->h + ih) * k->w + iw;
                                int64_t wi = ((o * cg + c) * k->kh + a) * k->kw + b;
                                int64_t yi = ((n * k->o + o) * oh + i) * ow + j;
                                y[yi] += x[xi] * w[wi];
                                dx[xi] += dy[yi] * w[wi];
                                dw[wi] += x[xi] * dy[yi];
                            }
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static double rnd_val(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* n random values in [-1, 1), rounded to dt, as stored (buf) and as doubles (vals). */
static void random_values(loom_dtype dt, int64_t n, void *buf, double *vals) {
    for (int64_t i = 0; i < n; i++) {
        loom_ir_store_f64(buf, dt, i, rnd_val());
        vals[i] = loom_ir_load_f64(buf, dt, i);
    }
}

/* The graph y = conv2d(x, w), dx = grad_input(dy, w), dw = grad_weight(x, dy). */
static void build_conv_graph(loom_ir_graph *g, const conv_case *k, const conv_shapes *s,
                             loom_dtype dt) {
    loom_ir_graph_init(g, &sys);
    int32_t x = tu_input(g, dt, 4, s->x), w = tu_input(g, dt, 4, s->w);
    int32_t dy = tu_input(g, dt, 4, s->y);
    loom_ir_attrs at = {.conv = k->cv};
    int32_t y = tu_add(g, LOOM_IR_OP_CONV2D, 2, (int32_t[]){x, w}, dt, 0, NULL, at);
    int32_t dx = tu_add(g, LOOM_IR_OP_CONV2D_GRAD_INPUT, 2, (int32_t[]){dy, w}, dt, 4, s->x, at);
    int32_t dw = tu_add(g, LOOM_IR_OP_CONV2D_GRAD_WEIGHT, 2, (int32_t[]){x, dy}, dt, 4, s->w, at);
    const int32_t ids[3] = {y, dx, dw};
    for (int i = 0; i < 3; i++)
        assert_int_equal(g->nodes[ids[i]].rank, 4);
    assert_int_equal(memcmp(g->nodes[y].shape, s->y, sizeof s->y), 0);
    tu_output(g, y, -1);
    tu_output(g, dx, -1);
    tu_output(g, dw, -1);
    tu_verify(g);
}

typedef struct conv_run {
    conv_shapes s;
    int64_t nx, nw, ny;
    void *in[3], *out[3];
    double *vx, *vw, *vdy;
} conv_run;

static void run_init(conv_run *r, const conv_case *k, loom_dtype dt) {
    r->s = shapes_of(k);
    r->nx = loom_ir_numel(4, r->s.x);
    r->nw = loom_ir_numel(4, r->s.w);
    r->ny = loom_ir_numel(4, r->s.y);
    int64_t n[3] = {r->nx, r->nw, r->ny}, on[3] = {r->ny, r->nx, r->nw};
    double **v[3] = {&r->vx, &r->vw, &r->vdy};
    size_t es = loom_dtype_size(dt);
    for (int i = 0; i < 3; i++) {
        r->in[i] = calloc((size_t)n[i], es);
        r->out[i] = calloc((size_t)on[i], es);
        *v[i] = calloc((size_t)n[i], sizeof(double));
        random_values(dt, n[i], r->in[i], *v[i]);
    }
}

static void run_deinit(conv_run *r) {
    for (int i = 0; i < 3; i++) {
        free(r->in[i]);
        free(r->out[i]);
    }
    free(r->vx);
    free(r->vw);
    free(r->vdy);
}

static void interp(const loom_ir_graph *g, conv_run *r) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_rt_interp_run(g, &sys, (const void *const *)r->in, r->out, &d) != LOOM_OK)
        fail_msg("interp: %s", d.msg);
}

/* got (count values of dt) against want within rel * |want| + abs. */
static void expect_close(const char *what, loom_dtype dt, const void *got, const double *want,
                         int64_t count, double rel, double abs) {
    for (int64_t i = 0; i < count; i++) {
        double v = loom_ir_load_f64(got, dt, i);
        if (!(fabs(v - want[i]) <= rel * fabs(want[i]) + abs))
            fail_msg("%s: element %lld is %.9g, expected %.9g", what, (long long)i, v, want[i]);
    }
}

/* The interpreter's conv ops equal the plain convolution of the operands it read, rounded
 * once to the dtype (f64 accumulation): within half an ulp of the dtype and a little. */
static void test_interpreter_matches_a_plain_convolution_over_the_sweep(void **state) {
    (void)state;
    static const loom_dtype dts[] = {LOOM_DTYPE_F32, LOOM_DTYPE_BF16, LOOM_DTYPE_F16};
    static const double ulp[] = {0x1p-24, 0x1p-8, 0x1p-11};
    for (size_t t = 0; t < 3; t++) {
        for (size_t c = 0; c < N_SWEEP; c++) {
            conv_run r;
            run_init(&r, &sweep[c], dts[t]);
            loom_ir_graph g;
            build_conv_graph(&g, &sweep[c], &r.s, dts[t]);
            interp(&g, &r);
            double *y = calloc((size_t)r.ny, 8), *dx = calloc((size_t)r.nx, 8),
                   *dw = calloc((size_t)r.nw, 8);
            plain_conv(&sweep[c], &r.s, r.vx, r.vw, r.vdy, y, dx, dw);
            char what[128];
            const double *want[3] = {y, dx, dw};
            const int64_t count[3] = {r.ny, r.nx, r.nw};
            static const char *const names[3] = {"conv2d", "grad_input", "grad_weight"};
            for (int i = 0; i < 3; i++) {
                snprintf(what, sizeof what, "%s %s %s", sweep[c].name, names[i],
                         loom_dtype_name(dts[t]));
                expect_close(what, dts[t], r.out[i], want[i], count[i], ulp[t], 1e-12);
            }
            free(y);
            free(dx);
            free(dw);
            loom_ir_graph_deinit(&g);
            run_deinit(&r);
        }
    }
}

/* ---- the decomposition ------------------------------------------------------------------- */

static int count_op(const loom_ir_graph *g, loom_ir_op op) {
    int n = 0;
    for (int32_t i = 0; i < g->n_nodes; i++)
        n += g->nodes[i].op == op;
    return n;
}

/* conv-decompose's im2col + matmul graph computes what the direct ops compute, in f32 and
 * in bf16 (whose matmul results round before col2im sums them). */
static void test_decomposed_graph_matches_the_direct_ops_over_the_sweep(void **state) {
    (void)state;
    setenv("LOOM_CONV", "im2col", 1);
    static const loom_dtype dts[] = {LOOM_DTYPE_F32, LOOM_DTYPE_BF16};
    for (size_t t = 0; t < 2; t++) {
        for (size_t c = 0; c < N_SWEEP; c++) {
            conv_run r;
            run_init(&r, &sweep[c], dts[t]);
            loom_ir_graph g, h;
            build_conv_graph(&g, &sweep[c], &r.s, dts[t]);
            loom_ir_graph_init(&h, &sys);
            assert_int_equal(loom_ir_graph_copy(&h, &g), LOOM_OK);
            const loom_pass *pass = &loom_pass_conv_decompose;
            loom_pass_options o = {.verify_each = true};
            loom_ir_diag d;
            loom_ir_diag_init(&d);
            if (loom_pass_run_pipeline(&h, &pass, 1, &o, &d) != LOOM_OK)
                fail_msg("%s: %s", sweep[c].name, d.msg);
            assert_int_equal(count_op(&h, LOOM_IR_OP_CONV2D) +
                                 count_op(&h, LOOM_IR_OP_CONV2D_GRAD_INPUT) +
                                 count_op(&h, LOOM_IR_OP_CONV2D_GRAD_WEIGHT),
                             0);
            assert_int_equal(count_op(&h, LOOM_IR_OP_MATMUL), 3);
            interp(&g, &r);
            void *direct[3];
            int64_t count[3] = {r.ny, r.nx, r.nw};
            for (int i = 0; i < 3; i++) {
                direct[i] = r.out[i];
                r.out[i] = calloc((size_t)count[i], loom_dtype_size(dts[t]));
            }
            interp(&h, &r);
            for (int i = 0; i < 3; i++) {
                double *want = calloc((size_t)count[i], sizeof *want);
                for (int64_t e = 0; e < count[i]; e++)
                    want[e] = loom_ir_load_f64(direct[i], dts[t], e);
                char what[128];
                snprintf(what, sizeof what, "%s output %d %s", sweep[c].name, i,
                         loom_dtype_name(dts[t]));
                /* bf16: dx's window terms each round once (values in [-1, 1], sums of <= 27) */
                expect_close(what, dts[t], r.out[i], want, count[i], t ? 0x1p-6 : 1e-6,
                             t ? 0.05 : 1e-6);
                free(want);
                free(direct[i]);
            }
            loom_ir_graph_deinit(&h);
            loom_ir_graph_deinit(&g);
            run_deinit(&r);
        }
    }
}

/* The weight gradient rebuilds the forward's im2col, which CSE merges: one concat of windows
 * for the two, as when the frontend built im2col itself. */
static void test_forward_and_weight_gradient_share_one_im2col_after_cse(void **state) {
    (void)state;
    setenv("LOOM_CONV", "im2col", 1);
    conv_shapes s = shapes_of(&sweep[0]);
    loom_ir_graph g;
    build_conv_graph(&g, &sweep[0], &s, LOOM_DTYPE_F32);
    const loom_pass *pipe[] = {&loom_pass_conv_decompose, &loom_pass_dce, &loom_pass_cse,
                               &loom_pass_fold};
    loom_pass_options o = {.verify_each = true};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_pass_run_pipeline(&g, pipe, 4, &o, &d), LOOM_OK);
    assert_int_equal(count_op(&g, LOOM_IR_OP_CONCAT), 1);
    assert_int_equal(count_op(&g, LOOM_IR_OP_SLICE), 9 + 9 + 1); /* windows, slabs, unpad */
    assert_int_equal(count_op(&g, LOOM_IR_OP_PAD), 1 + 9);       /* x, each slab */
    assert_int_equal(count_op(&g, LOOM_IR_OP_MATMUL), 3);
    loom_ir_graph_deinit(&g);
}

/* loom_conv2d's bias add goes into the matmul's [O, L] result (its epilogue) and the bias
 * gradient, a sum of dy over N, H, W, reads dy in that layout; the values stay the direct
 * ops'. */
static void test_bias_add_and_bias_gradient_move_to_the_matmul_layout(void **state) {
    (void)state;
    setenv("LOOM_CONV", "im2col", 1);
    const conv_case *k = &sweep[3]; /* groups 2 */
    conv_shapes s = shapes_of(k);
    loom_ir_graph g;
    build_conv_graph(&g, k, &s, LOOM_DTYPE_F32);
    const loom_dtype F = LOOM_DTYPE_F32;
    int32_t b = tu_input(&g, F, 1, S(k->o));
    int32_t b4 = tu_add(&g, LOOM_IR_OP_RESHAPE, 1, &b, F, 4, S(1, k->o, 1, 1), (loom_ir_attrs){0});
    int32_t bb = tu_add(&g, LOOM_IR_OP_BROADCAST, 1, &b4, F, 4, s.y, (loom_ir_attrs){0});
    int32_t y = g.outputs[0].node;
    g.outputs[0].node =
        tu_add(&g, LOOM_IR_OP_ADD, 2, (int32_t[]){y, bb}, F, 0, NULL, (loom_ir_attrs){0});
    int32_t db = tu_add(&g, LOOM_IR_OP_REDUCE_SUM, 1, (int32_t[]){2}, F, 0, NULL,
                        (loom_ir_attrs){.axes = 0xD}); /* input 2 is dy */
    tu_output(&g, db, -1);
    tu_verify(&g);
    loom_ir_graph h;
    loom_ir_graph_init(&h, &sys);
    assert_int_equal(loom_ir_graph_copy(&h, &g), LOOM_OK);
    const loom_pass *pipe[] = {&loom_pass_conv_decompose, &loom_pass_dce, &loom_pass_cse};
    loom_pass_options o = {.verify_each = true};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    assert_int_equal(loom_pass_run_pipeline(&h, pipe, 3, &o, &d), LOOM_OK);
    int bias_epilogues = 0, sums_of_rows = 0;
    for (int32_t i = 0; i < h.n_nodes; i++) {
        const loom_ir_node *n = &h.nodes[i];
        if (n->op == LOOM_IR_OP_ADD && h.nodes[n->inputs[0]].op == LOOM_IR_OP_MATMUL)
            bias_epilogues++;
        if (n->op == LOOM_IR_OP_REDUCE_SUM)
            sums_of_rows += h.nodes[n->inputs[0]].rank == 2 && n->attrs.axes == 2u;
    }
    assert_int_equal(bias_epilogues, 1);
    assert_int_equal(sums_of_rows, 1);
    /* the same values: y + b, dx, dw, db */
    conv_run r;
    run_init(&r, k, F);
    float bias[6], outs[2][4][512];
    for (int i = 0; i < k->o; i++)
        bias[i] = (float)(i + 1) * 0.25f;
    const void *ins[4] = {r.in[0], r.in[1], r.in[2], bias};
    assert_true(r.ny <= 512 && r.nx <= 512 && r.nw <= 512);
    const loom_ir_graph *gs[2] = {&g, &h};
    for (int v = 0; v < 2; v++) {
        void *o4[4] = {outs[v][0], outs[v][1], outs[v][2], outs[v][3]};
        if (loom_rt_interp_run(gs[v], &sys, ins, o4, &d) != LOOM_OK)
            fail_msg("interp: %s", d.msg);
    }
    int64_t count[4] = {r.ny, r.nx, r.nw, k->o};
    for (int t = 0; t < 4; t++)
        for (int64_t i = 0; i < count[t]; i++)
            if (!(fabsf(outs[0][t][i] - outs[1][t][i]) <= 1e-5f * (1 + fabsf(outs[0][t][i]))))
                fail_msg("output %d element %lld: %g, direct %g", t, (long long)i, outs[1][t][i],
                         outs[0][t][i]);
    run_deinit(&r);
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

/* Without LOOM_CONV=im2col the pass rewrites only the convolutions codegen has no kernel
 * for (f64) and leaves f32, bf16 and f16 ones to the convolution kernels. */
static void test_decomposition_is_left_to_dtypes_without_a_kernel(void **state) {
    (void)state;
    unsetenv("LOOM_CONV");
    static const loom_dtype dts[] = {LOOM_DTYPE_F32, LOOM_DTYPE_BF16, LOOM_DTYPE_F16,
                                     LOOM_DTYPE_F64};
    for (size_t t = 0; t < 4; t++) {
        conv_shapes s = shapes_of(&sweep[0]);
        loom_ir_graph g;
        build_conv_graph(&g, &sweep[0], &s, dts[t]);
        const loom_pass *pass = &loom_pass_conv_decompose;
        loom_pass_options o = {.verify_each = true};
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        assert_int_equal(loom_pass_run_pipeline(&g, &pass, 1, &o, &d), LOOM_OK);
        int convs = count_op(&g, LOOM_IR_OP_CONV2D) + count_op(&g, LOOM_IR_OP_CONV2D_GRAD_INPUT) +
                    count_op(&g, LOOM_IR_OP_CONV2D_GRAD_WEIGHT);
        assert_int_equal(convs, dts[t] == LOOM_DTYPE_F64 ? 0 : 3);
        assert_int_equal(count_op(&g, LOOM_IR_OP_MATMUL), dts[t] == LOOM_DTYPE_F64 ? 3 : 0);
        loom_ir_graph_deinit(&g);
    }
}

/* Fusion makes each convolution the root of a kernel of its own (the MATMUL kind: a
 * contraction with an epilogue) whose operands are args, and a bias add and ReLU after
 * conv2d its epilogue. */
static void test_fusion_gives_each_conv_a_kernel_with_its_epilogue(void **state) {
    (void)state;
    const conv_case *k = &sweep[1];
    conv_shapes s = shapes_of(k);
    loom_ir_graph g;
    build_conv_graph(&g, k, &s, LOOM_DTYPE_F32);
    /* relu(conv2d + broadcast(bias [1, O, 1, 1])) as a fourth output */
    int32_t bias = tu_input(&g, LOOM_DTYPE_F32, 4, S(1, s.y[1], 1, 1));
    loom_ir_attrs none = {0};
    int32_t bb = tu_add(&g, LOOM_IR_OP_BROADCAST, 1, &bias, LOOM_DTYPE_F32, 4, s.y, none);
    int32_t sum = tu_add(&g, LOOM_IR_OP_ADD, 2, (int32_t[]){3, bb}, LOOM_DTYPE_F32, 0, NULL, none);
    int32_t act = tu_add(&g, LOOM_IR_OP_RELU, 1, &sum, LOOM_DTYPE_F32, 0, NULL, none);
    tu_output(&g, act, -1);
    tu_verify(&g);
    loom_ir_plan plan;
    loom_ir_plan_init(&plan, &sys);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_pass_fuse(&g, &plan, &d) != LOOM_OK ||
        loom_pass_plan_memory(&g, &plan, &d) != LOOM_OK ||
        loom_ir_plan_verify(&plan, &g, &d) != LOOM_OK)
        fail_msg("%s", d.msg);
    int conv_kernels = 0;
    for (int32_t i = 0; i < plan.n_kernels; i++) {
        const loom_ir_kernel *kn = &plan.kernels[i];
        if (loom_ir_op_table[g.nodes[kn->root].op].kind != LOOM_IR_KIND_CONV)
            continue;
        conv_kernels++;
        assert_int_equal(kn->kind, LOOM_IR_KERNEL_ROOTED);
        assert_int_equal(kn->n_args, 2 + (kn->root == 3)); /* conv2d's epilogue reads bias */
        for (int32_t q = 0; q < 2; q++)
            assert_int_equal(plan.node_kernel[g.nodes[kn->root].inputs[q]], -1); /* inputs */
    }
    assert_int_equal(conv_kernels, 3);
    assert_int_equal(plan.node_kernel[act], plan.node_kernel[3]);
    assert_int_equal(plan.node_kernel[sum], plan.node_kernel[3]);
    loom_ir_plan_deinit(&plan);
    loom_ir_graph_deinit(&g);
}

/* ---- inference and text --------------------------------------------------------------------- */

/* The error inferring op(a, b) with the stated result shape (the gradients; NULL: none). */
static const char *infer_msg(loom_ir_graph *g, loom_ir_op op, int32_t a, int32_t b,
                             int32_t rank_stated, const int64_t *stated, loom_ir_conv cv) {
    static loom_ir_diag d;
    loom_ir_diag_init(&d);
    loom_dtype dt;
    int32_t rank;
    int64_t shape[LOOM_MAX_RANK];
    loom_ir_node_desc desc = {.op = op,
                              .n_inputs = 2,
                              .inputs = (int32_t[]){a, b},
                              .rank = rank_stated,
                              .shape = stated,
                              .attrs = {.conv = cv}};
    assert_int_equal(loom_ir_infer(g, &desc, &dt, &rank, shape, &d), LOOM_STATUS_INVALID_ARGUMENT);
    return d.msg;
}

static void test_inference_errors_name_the_operands_and_the_window(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    const loom_dtype F = LOOM_DTYPE_F32;
    int32_t x = tu_input(&g, F, 4, S(2, 6, 5, 5)), w = tu_input(&g, F, 4, S(4, 3, 3, 3));
    int32_t x3 = tu_input(&g, F, 3, S(6, 5, 5)), dy = tu_input(&g, F, 4, S(2, 4, 3, 3));
    int32_t wh = tu_input(&g, LOOM_DTYPE_F64, 4, S(4, 3, 3, 3));
    const loom_ir_conv one = {{1, 1}, {0, 0}, {1, 1}, 1, {0, 0}},
                       two = {{1, 1}, {0, 0}, {1, 1}, 2, {0, 0}};
    assert_string_equal(infer_msg(&g, LOOM_IR_OP_CONV2D, x3, w, 0, NULL, one),
                        "needs rank-4 (NCHW) operands: x f32[6,5,5], weight f32[4,3,3,3]");
    assert_string_equal(infer_msg(&g, LOOM_IR_OP_CONV2D, x, wh, 0, NULL, two),
                        "dtypes differ: x f32[2,6,5,5], weight f64[4,3,3,3]");
    assert_string_equal(infer_msg(&g, LOOM_IR_OP_CONV2D, x, w, 0, NULL, one),
                        "weight f32[4,3,3,3] needs 6 input channels (x f32[2,6,5,5] has 6, "
                        "groups 1)");
    assert_string_equal(infer_msg(&g, LOOM_IR_OP_CONV2D, x, w, 0, NULL,
                                  (loom_ir_conv){{1, 1}, {0, 0}, {1, 1}, 4, {0, 0}}),
                        "groups 4 must divide the input channels of x f32[2,6,5,5] and the "
                        "output channels of weight f32[4,3,3,3]");
    assert_string_equal(infer_msg(&g, LOOM_IR_OP_CONV2D, x, w, 0, NULL,
                                  (loom_ir_conv){{1, 1}, {0, 0}, {3, 3}, 2, {0, 0}}),
                        "the 3x3 kernel of weight f32[4,3,3,3] (dilation [3, 3]) does not fit "
                        "x f32[2,6,5,5] padded by [0, 0]: the output would be empty");
    assert_non_null(strstr(infer_msg(&g, LOOM_IR_OP_CONV2D, x, w, 0, NULL,
                                     (loom_ir_conv){{0, 1}, {0, 0}, {1, 1}, 2, {0, 0}}),
                           "stride [0, 1] and dilation [1, 1] must be in 1.."));
    assert_non_null(strstr(infer_msg(&g, LOOM_IR_OP_CONV2D, x, w, 0, NULL,
                                     (loom_ir_conv){{1, 1}, {0, 0}, {1, 1}, 0, {0, 0}}),
                           "groups 0 must be in 1.."));
    /* the gradients check the shape they state against their operands */
    assert_string_equal(infer_msg(&g, LOOM_IR_OP_CONV2D_GRAD_INPUT, dy, w, 4, S(2, 6, 6, 5), two),
                        "output f32[2,4,3,3] does not match x f32[2,6,6,5] and weight "
                        "f32[4,3,3,3]: extent 2 of the output is 3, the window sweep gives 4");
    assert_string_equal(infer_msg(&g, LOOM_IR_OP_CONV2D_GRAD_WEIGHT, x, dy, 3, S(4, 3, 3), two),
                        "the stated result must have rank 4 (weight's [O,C/groups,KH,KW]), got "
                        "rank 3");
    assert_string_equal(infer_msg(&g, LOOM_IR_OP_CONV2D_GRAD_WEIGHT, x, dy, 4, S(5, 3, 3, 3), two),
                        "groups 2 must divide the input channels of x f32[2,6,5,5] and the "
                        "output channels of weight f32[5,3,3,3]");
    loom_ir_graph_deinit(&g);
}

static char *print_graph(const loom_ir_graph *g) {
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, &sys);
    assert_int_equal(loom_ir_graph_print(g, loom_ir_sbuf_write, &sb), LOOM_OK);
    assert_false(sb.oom);
    return sb.data; /* malloc'd by the system allocator */
}

static const char conv_text[] =
    "loom.graph {\n"
    "  %x = input {index = 0} : f32[1,4,7,6]\n"
    "  %w = input {index = 1} : f32[6,2,3,2]\n"
    "  %y = conv2d %x, %w {stride = [2, 1], padding = [1, 0], dilation = [1, 2], groups = 2} "
    ": f32[1,6,4,4] loc(\"net.c\":12)\n"
    "  %dx = conv2d_grad_input %y, %w {stride = [2, 1], padding = [1, 0], dilation = [1, 2], "
    "groups = 2, autocast = bf16} : f32[1,4,7,6]\n"
    "  return %y, %dx\n"
    "}\n";

static void test_text_shows_and_reads_the_window(void **state) {
    (void)state;
    loom_ir_graph g;
    loom_ir_graph_init(&g, &sys);
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    if (loom_ir_graph_parse(&g, conv_text, strlen(conv_text), &d) != LOOM_OK)
        fail_msg("parse: %s", d.msg);
    assert_int_equal(g.nodes[2].attrs.conv.stride[0], 2);
    assert_int_equal(g.nodes[2].attrs.conv.dilation[1], 2);
    assert_int_equal(g.nodes[3].attrs.conv.groups, 2);
    char *text = print_graph(&g);
    assert_non_null(strstr(text, "%2 = conv2d %0, %1 {stride = [2, 1], padding = [1, 0], "
                                 "dilation = [1, 2], groups = 2} : f32[1,6,4,4] "
                                 "loc(\"net.c\":12)"));
    loom_ir_graph h;
    loom_ir_graph_init(&h, &sys);
    assert_int_equal(loom_ir_graph_parse(&h, text, strlen(text), &d), LOOM_OK);
    assert_true(loom_ir_graph_equal(&g, &h));
    assert_int_equal(loom_ir_graph_hash(&g), loom_ir_graph_hash(&h));
    /* another window is another graph */
    h.nodes[2].attrs.conv.padding[1] = 1;
    assert_false(loom_ir_graph_equal(&g, &h));
    assert_true(loom_ir_graph_hash(&g) != loom_ir_graph_hash(&h));
    loom_ir_sbuf sb;
    loom_ir_sbuf_init(&sb, &sys);
    assert_int_equal(loom_ir_graph_dot(&g, loom_ir_sbuf_write, &sb), LOOM_OK);
    assert_non_null(strstr(sb.data, "%2 conv2d\\nf32[1,6,4,4]\\nstride = [2, 1], padding = [1, "
                                    "0], dilation = [1, 2], groups = 2\\nnet.c:12"));
    loom_ir_sbuf_deinit(&sb);
    free(text);
    loom_ir_graph_deinit(&h);
    loom_ir_graph_deinit(&g);
}

/* Malformed windows are parse errors with a position, never crashes. */
static void test_parser_rejects_bad_windows(void **state) {
    (void)state;
    static const struct {
        const char *attrs, *msg;
    } bad[] = {
        {"stride = [2], padding = [0, 0], dilation = [1, 1], groups = 1",
         "stride has 1 entries; a 2-D window needs [h, w]"},
        {"stride = [1, 1, 1], padding = [0, 0], dilation = [1, 1], groups = 1",
         "stride has 3 entries"},
        {"stride = [1, 1], padding = [0, 0], dilation = [1, 1]", "needs attribute 'groups'"},
        {"stride = [1, 1], padding = [0, 0], dilation = [1, 1], groups = 0",
         "groups 0 must be in 1.."},
        {"stride = [1, 1], padding = [0, 0], dilation = [1, 0], groups = 1", "must be in 1.."},
        {"stride = [1, 1], padding = [0, 99999999999], dilation = [1, 1], groups = 1",
         "out of range"},
        {"stride = [1, 1], padding = [0, 0], dilation = [1, 1], groups = 1, perm = [0]",
         "unknown attribute"},
        {"stride = [1, 1], padding = [0, 0], dilation = [1, 1], groups = 3",
         "groups 3 must divide"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "loom.graph {\n  %%x = input {index = 0} : f32[1,4,7,6]\n"
                 "  %%w = input {index = 1} : f32[6,2,3,2]\n"
                 "  %%y = conv2d %%x, %%w {%s} : f32[1,6,5,5]\n  return %%y\n}\n",
                 bad[i].attrs);
        loom_ir_graph g;
        loom_ir_graph_init(&g, &sys);
        loom_ir_diag d;
        loom_ir_diag_init(&d);
        assert_int_equal(loom_ir_graph_parse(&g, text, strlen(text), &d), LOOM_STATUS_PARSE_ERROR);
        if (!strstr(d.msg, bad[i].msg))
            fail_msg("case %d: \"%s\" lacks \"%s\"", (int)i, d.msg, bad[i].msg);
        assert_int_equal(d.line, 4);
        loom_ir_graph_deinit(&g);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interpreter_matches_a_plain_convolution_over_the_sweep),
        cmocka_unit_test(test_decomposed_graph_matches_the_direct_ops_over_the_sweep),
        cmocka_unit_test(test_forward_and_weight_gradient_share_one_im2col_after_cse),
        cmocka_unit_test(test_bias_add_and_bias_gradient_move_to_the_matmul_layout),
        cmocka_unit_test(test_decomposition_is_left_to_dtypes_without_a_kernel),
        cmocka_unit_test(test_fusion_gives_each_conv_a_kernel_with_its_epilogue),
        cmocka_unit_test(test_inference_errors_name_the_operands_and_the_window),
        cmocka_unit_test(test_text_shows_and_reads_the_window),
        cmocka_unit_test(test_parser_rejects_bad_windows),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
