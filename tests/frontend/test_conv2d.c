/* loom_conv2d as one conv2d node: what it records, its gradients against central finite
 * differences in f64 over a sweep of windows (reference interpreter), differentiating a
 * gradient op is a clear error, and a compiled forward + backward step (the convolution
 * kernels of codegen/lower_conv.c, a ReLU in conv2d's epilogue) against the interpreter
 * over the sweep and over shapes that take several blocks of K, pixels, rows and tasks, in
 * f32, under bf16 autocast on each path this CPU has, and under f16 autocast. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "loom/amp.h"
#include "loom/nn.h"

typedef struct conv_case {
    const char *name;
    int64_t n, c, h, w, o, kh, kw;
    int64_t stride[2], pad[2], dil[2], groups;
    bool bias;
} conv_case;

static const conv_case sweep[] = {
    {"odd 5x4, 3x3 pad 1", 2, 2, 5, 4, 3, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {"stride 2", 1, 2, 7, 6, 2, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, false},
    {"dilation 2", 1, 1, 7, 7, 2, 3, 3, {1, 1}, {2, 2}, {2, 2}, 1, true},
    {"groups 2, 3x2, stride 2x1", 1, 4, 5, 4, 4, 3, 2, {2, 1}, {1, 0}, {1, 1}, 2, true},
    {"depthwise 3x3", 1, 3, 5, 5, 3, 3, 3, {1, 1}, {1, 1}, {1, 1}, 3, false},
    {"1x1", 2, 3, 3, 3, 2, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, true},
    {"7x7 stride 2 pad 3", 1, 1, 8, 7, 2, 7, 7, {2, 2}, {3, 3}, {1, 1}, 1, false},
    /* rows of 9 and 25 pixels whose last is padding: on AVX2, LLVM 19 read the source past a
     * row's end there (conv_internal.h's cv_maskload_if) */
    {"1x1 pad 1 at 3x7", 1, 2, 3, 7, 2, 1, 1, {1, 1}, {0, 1}, {1, 1}, 1, false},
    {"1x2 pad 1 dilation 2 at 2x23", 1, 1, 2, 23, 1, 1, 2, {1, 1}, {0, 1}, {1, 2}, 1, true},
};
#define N_SWEEP (sizeof sweep / sizeof sweep[0])

/* Bigger than one block of the kernels: K of 360 (two chunks of 256), 26 rows of 13 pixels
 * (two column blocks), 36 output channels (rows split for 4 tasks); a strided 1x1 (the
 * ResNet downsample: an input gradient with destination pixels the windows skip); grouped
 * and strided; rows of 16 pixels or more, which the kernels copy as runs instead of through
 * a table of pixels (strided, and dilated with a 5x3 window); a 1x1 whose windows are its
 * images' channels (copied a run per image, blocks spanning images); a K of 405 window rows
 * in two chunks of 203, so that the second chunk's pairs of rows start at an odd row; rows
 * of 50 and 99 pixels, read 16 (or 32 pixels' pairs) at a time in a loop; weight gradients
 * whose row blocks of whole channels are dealt out evenly: 128 channels of a 3x3 in 4
 * blocks of 288 rows (not 5), and the stem's 3 channels of a 7x7 in one row block with its
 * 40 output channels in two column blocks (32 and 8); a 1x1 from 24 to 128 channels whose
 * weight gradient splits its columns (dy the bigger operand) into 4 blocks of 32; 3 groups
 * of 3 channels (2 row blocks each); and an empty batch, whose weight gradient is zeros. */
static const conv_case blocks[] = {
    {"blocks: 3x3 C40 O36 at 13x13", 2, 40, 13, 13, 36, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {"blocks: 1x1 stride 2 C24 O40", 2, 24, 15, 15, 40, 1, 1, {2, 2}, {0, 0}, {1, 1}, 1, false},
    {"blocks: groups 4 3x3 stride 2", 1, 32, 12, 11, 48, 3, 3, {2, 2}, {1, 1}, {1, 1}, 4, true},
    {"wide: 3x3 stride 2 at 9x35", 2, 6, 9, 35, 10, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, true},
    {"wide: 5x3 dilation 2 at 7x21", 1, 5, 7, 21, 6, 5, 3, {1, 1}, {3, 1}, {2, 2}, 1, false},
    {"1x1 C40 O24 at 9x11 (runs)", 3, 40, 9, 11, 24, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, true},
    {"K 405 in odd chunks", 1, 45, 6, 18, 20, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
    {"wide: 3x3 at 3x50 (block loop)", 1, 3, 3, 50, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {"wide: 1x3 stride 1x2 at 2x197", 1, 2, 2, 197, 3, 1, 3, {1, 2}, {0, 1}, {1, 1}, 1, false},
    {"dw: 3x3 C128 in 4 row blocks", 1, 128, 5, 5, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
    {"dw: 7x7 stride 2 C3 O40", 1, 3, 12, 12, 40, 7, 7, {2, 2}, {3, 3}, {1, 1}, 1, false},
    {"dw: 1x1 C24 O128, columns split", 2, 24, 6, 5, 128, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, false},
    {"dw: groups 3, 3x3 C9 O12", 1, 9, 6, 6, 12, 3, 3, {1, 1}, {1, 1}, {1, 1}, 3, false},
    {"batch 0", 0, 4, 5, 5, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
};
#define N_BLOCKS (sizeof blocks / sizeof blocks[0])

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double urand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

typedef struct operands {
    int64_t xs[4], ws[4], nx, nw, no;
    double *x, *w, *b;
} operands;

static void operands_init(operands *p, const conv_case *k) {
    int64_t xs[4] = {k->n, k->c, k->h, k->w}, ws[4] = {k->o, k->c / k->groups, k->kh, k->kw};
    memcpy(p->xs, xs, sizeof xs);
    memcpy(p->ws, ws, sizeof ws);
    p->nx = loom_ir_numel(4, xs);
    p->nw = loom_ir_numel(4, ws);
    p->no = k->o;
    p->x = malloc((size_t)p->nx * 8);
    p->w = malloc((size_t)p->nw * 8);
    p->b = malloc((size_t)p->no * 8);
    for (int64_t i = 0; i < p->nx; i++)
        p->x[i] = urand();
    for (int64_t i = 0; i < p->nw; i++)
        p->w[i] = urand();
    for (int64_t i = 0; i < p->no; i++)
        p->b[i] = urand();
}

/* An f32 tensor of v's n values (rounded from f64). */
static loom_tensor *f32_tensor(loom_context *ctx, int32_t rank, const int64_t *shape,
                               const double *v, int64_t n) {
    float *f = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++)
        f[i] = (float)v[i];
    loom_tensor *t = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, rank, shape, f);
    free(f);
    return t;
}

static void operands_deinit(operands *p) {
    free(p->x);
    free(p->w);
    free(p->b);
}

/* sum(conv2d(x, w, b) * r) with r fixed pseudo-random weights in [0.5, 1.5), in y's dtype. */
static loom_tensor *weighted_loss(loom_context *ctx, const conv_case *k, loom_tensor *x,
                                  loom_tensor *w, loom_tensor *b) {
    loom_tensor *y = loom_conv2d(ctx, x, w, b, k->stride, k->pad, k->dil, k->groups);
    assert_non_null(y);
    int64_t s[4], n;
    loom_dtype dt;
    assert_int_equal(loom_tensor_dtype(y, &dt), LOOM_OK);
    assert_int_equal(loom_tensor_shape(y, s), LOOM_OK);
    assert_int_equal(loom_tensor_numel(y, &n), LOOM_OK);
    double *r = malloc((size_t)n * 8);
    uint64_t st = 777;
    for (int64_t i = 0; i < n; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        r[i] = 0.5 + (double)(st >> 11) * 0x1.0p-53;
    }
    loom_tensor *rt = loom_tensor_from_host(ctx, LOOM_DTYPE_F64, 4, s, r);
    free(r);
    loom_tensor *loss = loom_sum(
        ctx, loom_mul(ctx, y, dt == LOOM_DTYPE_F64 ? rt : loom_cast(ctx, rt, dt)), 0, NULL, false);
    loom_tensor_release(rt);
    return loss;
}

/* The loss in f64 at p's values, or its gradients into gx, gw, gb when they are not NULL. */
static double loss_at(loom_context *ctx, const conv_case *k, const operands *p, double *gx,
                      double *gw, double *gb) {
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F64, 4, p->xs, p->x);
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F64, 4, p->ws, p->w);
    loom_tensor *b = k->bias ? loom_tensor_from_host(ctx, LOOM_DTYPE_F64, 1, &p->no, p->b) : NULL;
    loom_tensor *loss = weighted_loss(ctx, k, x, w, b);
    double v = NAN;
    if (gx) {
        loom_tensor *g[3] = {NULL, NULL, NULL};
        if (loom_backward(ctx, loss, k->bias ? 3 : 2, (loom_tensor *[]){x, w, b}, g) != LOOM_OK)
            fail_msg("%s", loom_context_error_message(ctx));
        assert_int_equal(loom_tensor_read(ctx, g[0], gx, (size_t)p->nx * 8), LOOM_OK);
        assert_int_equal(loom_tensor_read(ctx, g[1], gw, (size_t)p->nw * 8), LOOM_OK);
        if (k->bias)
            assert_int_equal(loom_tensor_read(ctx, g[2], gb, (size_t)p->no * 8), LOOM_OK);
    } else if (loom_tensor_read(ctx, loss, &v, sizeof v) != LOOM_OK) {
        fail_msg("%s", loom_context_error_message(ctx));
    }
    loom_tensor_release(x);
    loom_tensor_release(w);
    loom_tensor_release(b);
    assert_int_equal(loom_mark_step(ctx), LOOM_OK);
    return v;
}

/* Central differences (h = 1e-6) at up to 12 elements of each operand, spread over it. */
static void test_gradients_match_finite_differences_over_the_sweep(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    for (size_t c = 0; c < N_SWEEP; c++) {
        const conv_case *k = &sweep[c];
        operands p;
        operands_init(&p, k);
        double *g[3] = {malloc((size_t)p.nx * 8), malloc((size_t)p.nw * 8),
                        malloc((size_t)p.no * 8)};
        loss_at(ctx, k, &p, g[0], g[1], g[2]);
        double *vals[3] = {p.x, p.w, p.b};
        int64_t count[3] = {p.nx, p.nw, k->bias ? p.no : 0};
        for (int t = 0; t < 3; t++) {
            int64_t stride = count[t] / 12 + 1;
            for (int64_t i = (int64_t)c % stride; i < count[t]; i += stride) {
                double v0 = vals[t][i], h = 1e-6;
                vals[t][i] = v0 + h;
                double up = loss_at(ctx, k, &p, NULL, NULL, NULL);
                vals[t][i] = v0 - h;
                double down = loss_at(ctx, k, &p, NULL, NULL, NULL);
                vals[t][i] = v0;
                double num = (up - down) / (2 * h);
                if (!(fabs(num - g[t][i]) <= 1e-6 * (1 + fabs(num))))
                    fail_msg("%s: d/d%s[%lld]: analytic %.10g, finite differences %.10g", k->name,
                             (const char *[]){"x", "w", "b"}[t], (long long)i, g[t][i], num);
            }
        }
        for (int t = 0; t < 3; t++)
            free(g[t]);
        operands_deinit(&p);
    }
    loom_context_destroy(ctx);
}

/* The trace holds one conv2d node with the window (no im2col), its bias one add. */
static void test_conv2d_records_one_node_with_its_window(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    const conv_case *k = &sweep[3];
    operands p;
    operands_init(&p, k);
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F64, 4, p.xs, p.x);
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F64, 4, p.ws, p.w);
    int32_t before = ctx->trace.n_nodes;
    loom_tensor *y = loom_conv2d(ctx, x, w, NULL, k->stride, k->pad, k->dil, k->groups);
    assert_non_null(y);
    int n_conv = 0, n_other = 0;
    for (int32_t i = before; i < ctx->trace.n_nodes; i++) {
        const loom_ir_node *n = &ctx->trace.nodes[i];
        if (n->op == LOOM_IR_OP_CONV2D) {
            n_conv++;
            assert_int_equal(n->attrs.conv.stride[0], 2);
            assert_int_equal(n->attrs.conv.stride[1], 1);
            assert_int_equal(n->attrs.conv.padding[0], 1);
            assert_int_equal(n->attrs.conv.groups, 2);
        } else if (n->op != LOOM_IR_OP_INPUT) {
            n_other++;
        }
    }
    assert_int_equal(n_conv, 1);
    assert_int_equal(n_other, 0);
    loom_tensor_release(x);
    loom_tensor_release(w);
    operands_deinit(&p);
    loom_context_destroy(ctx);
}

/* conv2d's gradient has no gradient of its own: differentiating it (a second derivative)
 * says so, naming the op and the user's line. */
static void test_differentiating_a_conv_gradient_is_a_clear_error(void **state) {
    (void)state;
    loom_context *ctx = tu_context(true);
    const conv_case *k = &sweep[0];
    operands p;
    operands_init(&p, k);
    loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F64, 4, p.xs, p.x);
    loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F64, 4, p.ws, p.w);
    loom_tensor *loss = weighted_loss(ctx, k, x, w, NULL);
    loom_tensor *gx = NULL;
    assert_int_equal(loom_backward(ctx, loss, 1, &x, &gx), LOOM_OK);
    loom_tensor *gg = NULL;
    loom_tensor *loss2 = loom_sum(ctx, loom_mul(ctx, gx, gx), 0, NULL, false);
    assert_int_equal(loom_backward(ctx, loss2, 1, &w, &gg), LOOM_STATUS_UNSUPPORTED);
    const char *msg = loom_context_error_message(ctx);
    if (!strstr(msg, "conv2d_grad_input of f64[2,2,5,4] has no gradient rule (differentiating "
                     "conv2d's gradient, a second derivative, is not supported)") ||
        !strstr(msg, "test_conv2d.c:"))
        fail_msg("unexpected message: %s", msg);
    loom_tensor_release(x);
    loom_tensor_release(w);
    operands_deinit(&p);
    loom_context_destroy(ctx);
}

/* One training-step graph (forward, ReLU, loss, gradients of x, w, b) compiled by the JIT
 * against the interpreter running the conv ops directly, for cases[0, n). */
/* The gradients of x, w and b (got[t], malloc'd, count[t] values) of sum(relu(y) * y), y =
 * conv2d(x, w, b) of case k (operands from seed), compiled or eager. */
static void case_gradients(const conv_case *k, uint64_t seed, int eager, loom_dtype autocast,
                           float *got[3], int64_t count[3]) {
    loom_context *ctx = tu_context(eager);
    rng = seed;
    operands p;
    operands_init(&p, k);
    count[0] = p.nx;
    count[1] = p.nw;
    count[2] = p.no;
    loom_tensor *x = f32_tensor(ctx, 4, p.xs, p.x, p.nx);
    loom_tensor *w = f32_tensor(ctx, 4, p.ws, p.w, p.nw);
    loom_tensor *b = f32_tensor(ctx, 1, &p.no, p.b, p.no);
    if (autocast != LOOM_DTYPE_F32)
        assert_int_equal(loom_autocast_begin(ctx, autocast), LOOM_OK);
    loom_tensor *y = loom_conv2d(ctx, x, w, b, k->stride, k->pad, k->dil, k->groups);
    if (autocast != LOOM_DTYPE_F32)
        assert_int_equal(loom_autocast_end(ctx), LOOM_OK);
    loom_tensor *act = loom_relu(ctx, y);
    loom_tensor *loss = loom_sum(ctx, loom_mul(ctx, act, y), 0, NULL, false);
    loom_tensor *g[3] = {NULL, NULL, NULL};
    assert_int_equal(loom_backward(ctx, loss, 3, (loom_tensor *[]){x, w, b}, g), LOOM_OK);
    for (int t = 0; t < 3; t++) {
        got[t] = malloc((size_t)count[t] * 4);
        loom_tensor_retain(g[t]);
    }
    if (loom_mark_step(ctx) != LOOM_OK)
        fail_msg("%s: %s", k->name, loom_context_error_message(ctx));
    for (int t = 0; t < 3; t++) {
        tu_read_f32(ctx, g[t], got[t], (size_t)count[t]);
        loom_tensor_release(g[t]);
    }
    loom_tensor_release(x);
    loom_tensor_release(w);
    loom_tensor_release(b);
    operands_deinit(&p);
    loom_context_destroy(ctx);
}

/* Each gradient of the JIT against the interpreter's: every element within tol of the
 * largest (rms false), or, where an algorithm's rounding is spread over every element
 * (F(4x4, 3x3) on bf16 operands), the relative RMS error ||jit - ref|| / ||ref|| within tol. */
static void compare_with_the_interpreter(const conv_case *cases, size_t n, loom_dtype autocast,
                                         double tol, bool rms) {
    for (size_t c = 0; c < n; c++) {
        const conv_case *k = &cases[c];
        float *got[2][3];
        int64_t count[3];
        for (int eager = 0; eager < 2; eager++)
            case_gradients(k, 0x1234567ull + c, eager, autocast, got[eager], count);
        for (int t = 0; t < 3; t++) {
            double scale = 0, se = 0, sr = 0;
            for (int64_t i = 0; i < count[t]; i++) {
                double d = (double)got[0][t][i] - got[1][t][i];
                scale = fmax(scale, fabs(got[1][t][i]));
                se += d * d;
                sr += (double)got[1][t][i] * got[1][t][i];
            }
            if (rms && !(sqrt(se) <= tol * sqrt(sr) + 1e-6))
                fail_msg("%s %s: gradient %d: relative RMS error %.3g, more than %.3g", k->name,
                         loom_dtype_name(autocast), t, sqrt(se / fmax(sr, 1e-300)), tol);
            for (int64_t i = 0; i < count[t] && !rms; i++)
                if (!(fabs(got[0][t][i] - got[1][t][i]) <= tol * (scale + 1e-3)))
                    fail_msg("%s %s: gradient %d element %lld: JIT %.9g, interpreter %.9g", k->name,
                             loom_dtype_name(autocast), t, (long long)i, got[0][t][i],
                             got[1][t][i]);
            free(got[0][t]);
            free(got[1][t]);
        }
    }
}

static void compiled_step_matches_the_interpreter(const conv_case *cases, size_t n,
                                                  loom_dtype autocast, double tol) {
    compare_with_the_interpreter(cases, n, autocast, tol, false);
}

static void test_compiled_step_matches_the_interpreter_in_f32(void **state) {
    (void)state;
    compiled_step_matches_the_interpreter(sweep, N_SWEEP, LOOM_DTYPE_F32, 1e-5);
    compiled_step_matches_the_interpreter(blocks, N_BLOCKS, LOOM_DTYPE_F32, 1e-5);
    setenv("LOOM_CONV", "im2col", 1); /* the decomposition, compiled */
    compiled_step_matches_the_interpreter(sweep, N_SWEEP, LOOM_DTYPE_F32, 1e-5);
    unsetenv("LOOM_CONV");
    /* the microkernel's C tiles of the other ISA than this host's (AVX2's 6 x 16 on AVX-512
     * hosts, AVX-512's 8 x 32 elsewhere; any x86-64 host runs both) */
    static const char *const tiles[] = {"avx2", "avx512"};
    for (size_t i = 0; i < 2; i++) {
        setenv("LOOM_MATMUL_ISA", tiles[i], 1);
        compiled_step_matches_the_interpreter(sweep, N_SWEEP, LOOM_DTYPE_F32, 1e-5);
        compiled_step_matches_the_interpreter(blocks, N_BLOCKS, LOOM_DTYPE_F32, 1e-5);
    }
    unsetenv("LOOM_MATMUL_ISA");
}

/* Whether this CPU runs bf16 pairs (vdpbf16ps: AVX512-BF16). Where it does they are forced
 * (LOOM_MATMUL_ISA=avx512bf16, which the caller unsets): the default takes them only where
 * they are faster than the f32 path (codegen's measured cost), and both are tested
 * everywhere. Where it does not, says that `what` is skipped. */
static bool use_bf16_pairs(const char *what) {
    if (strstr(loom_cg_target_key(), "+avx512bf16,")) {
        setenv("LOOM_MATMUL_ISA", "avx512bf16", 1);
        return true;
    }
    print_message("# skipping %s on bf16 pairs (vdpbf16ps): this CPU has no AVX512-BF16\n", what);
    return false;
}

/* Under bf16 autocast both run the convolutions in bf16, accumulating in f32 and rounding
 * each output once; the sums' order differs. Each 16-bit path this CPU has, forced with
 * LOOM_MATMUL_ISA (bf16 pairs for vdpbf16ps; values converted to f32 for FMAs). */
static void test_compiled_step_matches_the_interpreter_under_bf16_autocast(void **state) {
    (void)state;
    for (int i = 0; i < 2; i++) {
        if (i == 0 && !use_bf16_pairs("the sweep and the blocks"))
            continue;
        if (i == 1)
            setenv("LOOM_MATMUL_ISA", "f32", 1);
        compiled_step_matches_the_interpreter(sweep, N_SWEEP, LOOM_DTYPE_BF16, 3e-2);
        compiled_step_matches_the_interpreter(blocks, N_BLOCKS, LOOM_DTYPE_BF16, 3e-2);
        unsetenv("LOOM_MATMUL_ISA");
    }
}

static void test_compiled_step_matches_the_interpreter_under_f16_autocast(void **state) {
    (void)state;
    compiled_step_matches_the_interpreter(sweep, N_SWEEP, LOOM_DTYPE_F16, 4e-3);
    compiled_step_matches_the_interpreter(blocks, N_BLOCKS, LOOM_DTYPE_F16, 4e-3);
}

/* Winograd F(2x2, 3x3) (codegen/conv_winograd.c, unless LOOM_CONV=direct) for the forwards and
 * input gradients it takes: 3x3 of stride 1 with a destination (y; dx) of 4 tiles a row or
 * more (7 pixels: an odd size's last tiles overhang it; 2 tiles, 3 pixels, where the GEMMs
 * multiply f32, so that there the 3-tile cases below are Winograd too) and the channels
 * summed over (x's; dy's) in 16s. Tiles 7 to a row (14x14: a row's tiles fill half a
 * vector), 18 (a vector and 2), 4; no padding (the input gradient's window padded by 2) and
 * padding 2 (its by 0); channels in 3
 * chunks that accumulate (144 = 3 x 48); 136 rows in one row block (up to 256) and 272 in two
 * (144 and 128), forwards and input gradients; blocks of 3 tile rows over
 * images of 2; forwards whose input gradient is direct (O not in 16s) and the other way round (C
 * not in 16s); and cases left to the direct kernels both ways (C and O not in 16s, 3 tiles a row).
 * Odd destinations, all three passes: 7x7 over 3 images (layer4's: blocks of tile rows span images
 * whose last tile row has one pixel row), 9x8, 8x9 (padding 0 from 10x11, whose input gradient's dx
 * is odd too) and 15x15 over 3 images (the weight gradient's two K chunks of 12 tile rows straddle
 * an image). The weight gradients, Winograd where y is 7 or more wide and C and O are 16 or more:
 * tiles summed in two K chunks (147 tiles over 21 tile rows of 7: 77 and 70, pairs of tiles
 * that straddle tile rows, an odd count's last pair half zeros); x's channels in two row blocks (C
 * 16: 8 each) and dy's in two column blocks (O 136: 80 and 56, a GEMM's columns past dy^T's zeros);
 * O 20 (one panel of 16 and one of 4); O 8, left direct; and C and O 272, in blocks of up to 256
 * channels a side (WG_BIG: 2 row blocks of 136, column blocks of 144 and 128).
 * F(4x4, 3x3) where the GEMMs multiply f32 (f32, f16, bf16 converted to f32) and a destination is
 * 7 tiles of 4 wide (25 pixels): of the cases above 4x36 (9 tiles a row; three chunks), and the
 * "wino4" ones: 13x26 (tile rows and columns overhanging by 3 and 2), 70 wide (18 tiles: a
 * vector and 2), padding 2 (26 wide) and 0 (28 wide), and 30x30 over 3 images (192 tiles: the
 * weight gradient's two K chunks). LOOM_CONV=winograd2 runs them all as F(2x2, 3x3), and
 * LOOM_CONV=winograd4 as F(4x4, 3x3) under the bf16 pairs too. */
static const conv_case wino[] = {
    {"wino: C16 O24 at 6x8", 2, 16, 6, 8, 24, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {"wino: C32 O20 at 14x14", 3, 32, 14, 14, 20, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
    {"wino: pad 0, C48 O16 at 10x12", 2, 48, 10, 12, 16, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1, true},
    {"wino: C144 O136 at 4x36", 1, 144, 4, 36, 136, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {"wino: C16 O16 at 4x8, 5 images", 5, 16, 4, 8, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
    {"wino: direct, C16 O8 at 2x6", 3, 16, 2, 6, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
    {"wino: gi only, C24 O32 at 12x14", 2, 24, 12, 14, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {"wino: pad 2, C16 O16 at 4x8", 1, 16, 4, 8, 16, 3, 3, {1, 1}, {2, 2}, {1, 1}, 1, false},
    {"wino: gi, O144 C136 at 6x8", 1, 136, 6, 8, 144, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
    {"wino: direct, C12 at 7x6", 2, 12, 7, 6, 20, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {"wino: odd, C32 O32 at 7x7", 3, 32, 7, 7, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
    {"wino: odd height, C16 O24 at 9x8", 2, 16, 9, 8, 24, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {"wino: pad 0, odd width at 10x11", 2, 16, 10, 11, 16, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1, false},
    {"wino: odd, C16 O16 at 15x15", 3, 16, 15, 15, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
    {"wino: O272 at 4x8", 1, 16, 4, 8, 272, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {"wino: gi, C272 at 4x8", 1, 272, 4, 8, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
    {"wino: gw, C272 O272 at 4x8", 1, 272, 4, 8, 272, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
    {"wino4: 13x26 over 2 images", 2, 16, 13, 26, 24, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
    {"wino4: 70 wide", 1, 16, 6, 70, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
    {"wino4: pad 2, C16 O16 at 12x24", 1, 16, 12, 24, 16, 3, 3, {1, 1}, {2, 2}, {1, 1}, 1, false},
    {"wino4: pad 0, C32 O16 at 18x30", 2, 32, 18, 30, 16, 3, 3, {1, 1}, {0, 0}, {1, 1}, 1, false},
    {"wino4: C16 O20 at 30x30, 3 images",
     3,
     16,
     30,
     30,
     20,
     3,
     3,
     {1, 1},
     {1, 1},
     {1, 1},
     1,
     false},
};
#define N_WINO (sizeof wino / sizeof wino[0])
#define N_WINO4 5 /* the "wino4" cases, last in wino[] */

static void test_winograd_convolutions_match_the_interpreter(void **state) {
    (void)state;
    compiled_step_matches_the_interpreter(wino, N_WINO, LOOM_DTYPE_F32, 1e-5);
    compiled_step_matches_the_interpreter(wino, N_WINO, LOOM_DTYPE_F16, 4e-3);
    if (use_bf16_pairs("the Winograd cases"))
        compiled_step_matches_the_interpreter(wino, N_WINO, LOOM_DTYPE_BF16, 3e-2);
    setenv("LOOM_MATMUL_ISA", "f32", 1); /* bf16 values converted to f32 */
    compiled_step_matches_the_interpreter(wino, N_WINO, LOOM_DTYPE_BF16, 3e-2);
    unsetenv("LOOM_MATMUL_ISA");
    setenv("LOOM_CONV", "direct", 1); /* the same cases on the direct kernels */
    compiled_step_matches_the_interpreter(wino, N_WINO, LOOM_DTYPE_F32, 1e-5);
    setenv("LOOM_CONV", "winograd2", 1); /* F(2x2, 3x3) where F(4x4, 3x3) would run */
    compiled_step_matches_the_interpreter(wino, N_WINO, LOOM_DTYPE_F32, 1e-5);
    /* F(4x4, 3x3) under bf16 pairs, a switch to compare with: its transforms rounded to bf16
     * cost 2.5e-2 relative RMS error on ResNet's layer1 (bench_conv --check; F(2x2) 4.5e-3),
     * too much for a per-element bound, but a wrong transform would be off by 100%. The
     * "wino4" cases only (at most 2.7e-2 there; 3.7e-2 over all of wino[]), to keep the
     * sanitizer run's time. */
    setenv("LOOM_CONV", "winograd4", 1);
    if (use_bf16_pairs("F(4x4, 3x3)"))
        compare_with_the_interpreter(wino + N_WINO - N_WINO4, N_WINO4, LOOM_DTYPE_BF16, 6e-2, true);
    unsetenv("LOOM_MATMUL_ISA");
    unsetenv("LOOM_CONV");
}

/* The tile is F(4x4, 3x3)'s where the destination is 25 pixels wide or more, F(2x2, 3x3)'s
 * below (its rounding, 6.5x F(2x2)'s, made 64x64 ResNet steps part from PyTorch's: issue 48):
 * LOOM_CONV=winograd2 changes the rounding of a 28x28 convolution's output and gradients (a
 * different sum: some differ in their last bits) but not of a 16x16 one (bit for bit). */
static void test_winograd_tiles_are_chosen_by_width(void **state) {
    (void)state;
    static const conv_case cases[2] = {
        {"28x28", 2, 16, 28, 28, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
        {"16x16", 2, 16, 16, 16, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
    };
    for (int c = 0; c < 2; c++) {
        float *got[2][3];
        int64_t count[3];
        for (int mode = 0; mode < 2; mode++) {
            if (mode == 1)
                setenv("LOOM_CONV", "winograd2", 1);
            case_gradients(&cases[c], 0x5EEDull, 0, LOOM_DTYPE_F32, got[mode], count);
            unsetenv("LOOM_CONV");
        }
        int64_t differ[3] = {0, 0, 0};
        for (int t = 0; t < 3; t++) {
            for (int64_t i = 0; i < count[t]; i++)
                differ[t] += memcmp(&got[0][t][i], &got[1][t][i], 4) != 0;
            free(got[0][t]);
            free(got[1][t]);
        }
        for (int t = 0; t < 3; t++)
            if (c == 0 ? differ[t] == 0 : differ[t] != 0)
                fail_msg("%s: gradient %d: %lld of %lld values differ between the two tilings",
                         cases[c].name, t, (long long)differ[t], (long long)count[t]);
    }
}

/* LOOM_CONV=im2col and LOOM_CONV=direct compile other kernels for the same graph: they are
 * part of the compile cache key, so a cached program of one kind never serves another. */
/* relu(conv2d(x, w) + v) as one kernel (v fused into the epilogue), compiled against the
 * interpreter in f32, with v per channel [1, O, 1, 1] and full-size: the epilogue runs over
 * a task's pixels of one image in one loop (here blocks of 42 rows of 6 pixels over 9
 * images of 5 rows: the first spans images and ends mid-image, where the second starts); with v per
 * row [1, 1, OH, 1] or per column [1, 1, 1, OW], which are not contiguous from one row's end to the
 * next, row by row. */
static void test_epilogues_by_pixels_and_by_rows_match_the_interpreter(void **state) {
    (void)state;
    static const int64_t vshape[4][4] = {{1, 24, 1, 1}, {9, 24, 5, 6}, {1, 1, 5, 1}, {1, 1, 1, 6}};
    const int64_t xs[4] = {9, 8, 5, 6}, ws[4] = {24, 8, 3, 3}, ys = 9 * 24 * 5 * 6;
    const int64_t one[2] = {1, 1};
    for (int v = 0; v < 4; v++) {
        int64_t nv = vshape[v][0] * vshape[v][1] * vshape[v][2] * vshape[v][3];
        float *got[2];
        for (int eager = 0; eager < 2; eager++) {
            loom_context *ctx = tu_context(eager);
            float *xf = malloc(9 * 8 * 5 * 6 * 4), *wf = malloc(24 * 8 * 9 * 4),
                  *vf = malloc((size_t)nv * 4);
            rng = 0xC0FFEEull + (uint64_t)v;
            for (int64_t i = 0; i < 9 * 8 * 5 * 6; i++)
                xf[i] = (float)(urand() - 0.5);
            for (int64_t i = 0; i < 24 * 8 * 9; i++)
                wf[i] = (float)(urand() - 0.5);
            for (int64_t i = 0; i < nv; i++)
                vf[i] = (float)(urand() - 0.5);
            loom_tensor *x = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, xs, xf);
            loom_tensor *w = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, ws, wf);
            loom_tensor *vt = loom_tensor_from_host(ctx, LOOM_DTYPE_F32, 4, vshape[v], vf);
            loom_tensor *y = loom_conv2d(ctx, x, w, NULL, one, one, one, 1);
            loom_tensor *out = loom_relu(ctx, loom_add(ctx, y, vt));
            assert_non_null(out);
            loom_tensor_retain(out);
            if (loom_mark_step(ctx) != LOOM_OK)
                fail_msg("v %d: %s", v, loom_context_error_message(ctx));
            got[eager] = malloc((size_t)ys * 4);
            tu_read_f32(ctx, out, got[eager], (size_t)ys);
            loom_tensor_release(out);
            loom_tensor_release(x);
            loom_tensor_release(w);
            loom_tensor_release(vt);
            free(xf);
            free(wf);
            free(vf);
            loom_context_destroy(ctx);
        }
        for (int64_t i = 0; i < ys; i++)
            if (!(fabsf(got[0][i] - got[1][i]) <= 1e-5f * (1 + fabsf(got[1][i]))))
                fail_msg("v of shape [%lld,%lld,%lld,%lld]: element %lld: JIT %.9g, "
                         "interpreter %.9g",
                         (long long)vshape[v][0], (long long)vshape[v][1], (long long)vshape[v][2],
                         (long long)vshape[v][3], (long long)i, got[0][i], got[1][i]);
        free(got[0]);
        free(got[1]);
    }
}

/* The input gradient of a strided convolution with the ReLU's mask fused into its epilogue,
 * d/dx0 sum(conv2d(relu(x0), w) * r), compiled against the interpreter, in f32 and under
 * bf16 autocast. Its destination pixels run per phase (ph0 + st0 y, ph1 + st1 q): at 28x28
 * with stride 2 (and 28x30 with stride 2x3, 12x28 with 1x2: one row phase) every phase has
 * taps and all are one size, so a task runs the phases along W side by side and writes
 * whole rows (blocks of 18 phase rows over 3 images of 14: they span images; at 6x40 a
 * phase row of 20, interleaved by a vector of 16 and a tail); at 27x27 the phases
 * differ in size and run one by one; a strided 1x1 has one phase with taps, whose epilogue writes
 * the zeros of the others. */
static void test_strided_input_gradients_match_the_interpreter(void **state) {
    (void)state;
    static const conv_case cases[] = {
        {"3x3 stride 2 at 28x28", 3, 24, 28, 28, 16, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, false},
        {"3x3 stride 2x3 at 28x30", 3, 24, 28, 30, 16, 3, 3, {2, 3}, {1, 1}, {1, 1}, 1, false},
        {"3x3 stride 1x2 at 12x28", 3, 24, 12, 28, 16, 3, 3, {1, 2}, {1, 1}, {1, 1}, 1, false},
        {"3x3 stride 2 at 27x27", 3, 24, 27, 27, 16, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, false},
        {"3x3 stride 2 at 6x40", 3, 24, 6, 40, 16, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, false},
        {"1x1 stride 2 at 28x28", 3, 24, 28, 28, 16, 1, 1, {2, 2}, {0, 0}, {1, 1}, 1, false},
    };
    static const loom_dtype amps[] = {LOOM_DTYPE_F32, LOOM_DTYPE_BF16};
    for (size_t a = 0; a < 2; a++) {
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            const conv_case *k = &cases[c];
            int64_t nx = 0;
            float *got[2];
            for (int eager = 0; eager < 2; eager++) {
                loom_context *ctx = tu_context(eager);
                rng = 0xABCDEFull + c;
                operands p;
                operands_init(&p, k);
                nx = p.nx;
                loom_tensor *x = f32_tensor(ctx, 4, p.xs, p.x, p.nx);
                loom_tensor *w = f32_tensor(ctx, 4, p.ws, p.w, p.nw);
                if (amps[a] != LOOM_DTYPE_F32)
                    assert_int_equal(loom_autocast_begin(ctx, amps[a]), LOOM_OK);
                loom_tensor *loss = weighted_loss(ctx, k, loom_relu(ctx, x), w, NULL);
                if (amps[a] != LOOM_DTYPE_F32)
                    assert_int_equal(loom_autocast_end(ctx), LOOM_OK);
                loom_tensor *g = NULL;
                assert_int_equal(loom_backward(ctx, loss, 1, &x, &g), LOOM_OK);
                loom_tensor_retain(g);
                if (loom_mark_step(ctx) != LOOM_OK)
                    fail_msg("%s: %s", k->name, loom_context_error_message(ctx));
                got[eager] = malloc((size_t)p.nx * 4);
                tu_read_f32(ctx, g, got[eager], (size_t)p.nx);
                loom_tensor_release(g);
                loom_tensor_release(x);
                loom_tensor_release(w);
                operands_deinit(&p);
                loom_context_destroy(ctx);
            }
            float scale = 0, tol = amps[a] == LOOM_DTYPE_F32 ? 1e-5f : 3e-2f;
            int64_t zeros = 0;
            for (int64_t i = 0; i < nx; i++) {
                scale = fmaxf(scale, fabsf(got[1][i]));
                zeros += got[1][i] == 0.0f;
            }
            if (zeros < nx / 4 || zeros > nx - nx / 16) /* the mask took effect, not all 0 */
                fail_msg("%s %s: %lld of %lld zeros", k->name, loom_dtype_name(amps[a]),
                         (long long)zeros, (long long)nx);
            for (int64_t i = 0; i < nx; i++)
                if (!(fabsf(got[0][i] - got[1][i]) <= tol * scale))
                    fail_msg("%s %s: element %lld: JIT %.9g, interpreter %.9g", k->name,
                             loom_dtype_name(amps[a]), (long long)i, got[0][i], got[1][i]);
            free(got[0]);
            free(got[1]);
        }
    }
}

/* Border classes (codegen/lower_conv.c): a stride-1 conv2d or input gradient of a small
 * image as a GEMM per class of destination pixels over only the taps that reach them. By
 * default where half the taps are padding and bf16 weights pair straight from w (a 2x2 image
 * of a 3x3: four classes of one pixel and a 2x2 of taps; with groups; a 2x6, 41% padding,
 * which the default leaves direct); LOOM_CONV=border takes them wherever a quarter are
 * padding: a 4x4's nine classes (corners of 4 taps, edges of 6, the middle 9), 3x5 (rows
 * one a class), a 5x5 window of padding 2 over one row of 3, a dilated 3x3 (padding 2) at
 * 4x4, a 1x1 image (one class, the middle tap: a window row is its channel), channel
 * counts that leave K odd, and padding past a 1x2 or 2x1 window (classes without taps, all
 * of one size, beside the one with both: zeros through their own epilogues). Channels not in 16s
 * keep the 2x6 and the 4x4 off Winograd, which f32 would take there. */
static void test_border_classes_match_the_interpreter(void **state) {
    (void)state;
    static const conv_case cases[] = {
        {"border: 2x2", 3, 16, 2, 2, 24, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
        {"border: 2x2, groups 2", 2, 16, 2, 2, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2, false},
        {"border: 2x6", 2, 12, 2, 6, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
        {"border: 4x4", 3, 12, 4, 4, 20, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
        {"border: 3x5, C 5", 2, 5, 3, 5, 7, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
        {"border: 5x5 pad 2 at 1x3", 2, 6, 1, 3, 8, 5, 5, {1, 1}, {2, 2}, {1, 1}, 1, false},
        {"border: dilation 2 at 4x4", 2, 8, 4, 4, 8, 3, 3, {1, 1}, {2, 2}, {2, 2}, 1, false},
        {"border: 1x1 image", 4, 16, 1, 1, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
        {"border: rows of padding only", 2, 16, 1, 6, 8, 1, 2, {1, 1}, {1, 0}, {1, 1}, 1, false},
        {"border: columns of padding only", 2, 16, 6, 1, 8, 2, 1, {1, 1}, {0, 1}, {1, 1}, 1, true},
    };
    size_t n = sizeof cases / sizeof cases[0];
    bool pairs = use_bf16_pairs("the border cases");
    if (pairs) /* the default convolution path: the 2x2s as classes */
        compiled_step_matches_the_interpreter(cases, n, LOOM_DTYPE_BF16, 3e-2);
    unsetenv("LOOM_MATMUL_ISA");
    setenv("LOOM_CONV", "border", 1);
    compiled_step_matches_the_interpreter(cases, n, LOOM_DTYPE_F32, 1e-5);
    if (pairs) {
        setenv("LOOM_MATMUL_ISA", "avx512bf16", 1);
        compiled_step_matches_the_interpreter(cases, n, LOOM_DTYPE_BF16, 3e-2);
    }
    setenv("LOOM_MATMUL_ISA", "f32", 1); /* bf16 values converted to f32 */
    compiled_step_matches_the_interpreter(cases, n, LOOM_DTYPE_BF16, 3e-2);
    unsetenv("LOOM_MATMUL_ISA");
    unsetenv("LOOM_CONV");
}

/* Small images under bf16 pairs (codegen/conv_stage.c, cv_stage_window_pairs_img and
 * cv_stage_window_kpairs_img): where the source image is 64 pixels or fewer, the destination
 * 16 or fewer, and a block holds whole images, each image's channel is read once into a vector
 * (16, 32 or 64 lanes) and each tap's window row (conv2d, the input gradient) or its pixel
 * pairs (the weight gradient) are one shuffle of it. A 4x4 3x3 (ResNet-50's layer3 at 64x64) with K
 * in chunks that split a channel (45 channels: 405 rows in two chunks of 203), two column blocks of
 * 12 images, a 3x3 image (rows of 3 pixels: the weight gradient's pairs of a row's pixels 0 and 2,
 * 1 and zero), a stride 2 from 4x4 to 2x2 (layer4's first 3x3), groups 2, a 1x1 at 4x4 (its weight
 * gradient), a dilated 2x3 window at 4x2, a 1x1 image (the weight gradient's window one
 * pixel; the forward by border classes), and strides of 2 from 8x8 to 4x4 (a 3x3 and a 1x1:
 * layer3's first block, a 64-lane source) and from 5x5 to 3x3 (32 lanes), whose input
 * gradients run by phases, each phase's grid and taps staged an image at a time. */
static void test_small_images_are_staged_whole_under_bf16_pairs(void **state) {
    (void)state;
    static const conv_case cases[] = {
        {"small: 4x4, K 405 in two chunks", 3, 45, 4, 4, 20, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
        {"small: 4x4, 24 images", 24, 8, 4, 4, 12, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
        {"small: 3x3 image", 5, 16, 3, 3, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
        {"small: 4x4 to 2x2, stride 2", 4, 16, 4, 4, 24, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, true},
        {"small: 4x4, groups 2", 2, 16, 4, 4, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, 2, false},
        {"small: 1x1 at 4x4", 3, 24, 4, 4, 16, 1, 1, {1, 1}, {0, 0}, {1, 1}, 1, false},
        {"small: 2x3 dilation 2 at 4x2", 2, 8, 4, 2, 8, 2, 3, {1, 1}, {1, 2}, {2, 1}, 1, true},
        {"small: 1x1 image", 6, 16, 1, 1, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
        {"small: 8x8 to 4x4, stride 2", 2, 16, 8, 8, 12, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, false},
        {"small: 1x1 stride 2, 8x8 to 4x4", 3, 24, 8, 8, 16, 1, 1, {2, 2}, {0, 0}, {1, 1}, 1, true},
        {"small: 5x5 to 3x3, stride 2", 2, 8, 5, 5, 8, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, false},
    };
    if (!use_bf16_pairs("the small images"))
        return;
    compiled_step_matches_the_interpreter(cases, sizeof cases / sizeof cases[0], LOOM_DTYPE_BF16,
                                          3e-2);
    unsetenv("LOOM_MATMUL_ISA");
}

/* Small images by taps (codegen/conv_taps.c): a 3x3 conv2d or gradient (stride 1 or 2) of
 * images of at most 16 pixels with a quarter or more of its taps on padding or between strides,
 * batch in 16s and channels summed over in 16s, runs a GEMM per destination pixel over the taps
 * that reach a source pixel, columns (the weight gradient's K) its images. 4x4 over 16 images
 * (tiles of 16 x 16) with C 16 and O 32; 2x2 over 32 images (tiles of 8 x 32) with O 48 in 3
 * row blocks; C 288 in two K chunks of 144; a 3x3 image (an odd pixel count); a 1x1 image (the
 * centre tap only); padding 2 from 2x2 to 4x4 (source and destination of other sizes; its input
 * gradient from 4x4 to 2x2); O 24, a forward whose last row block is short and whose input
 * gradient (24 channels summed) stays direct; a forward of stride 2 from 4x4 to 2x2 (its input
 * gradient's dx pixels each reached by 1 to 4 taps). f32 and bf16 pairs against the
 * interpreter; and, so that the test sees the path run, in f32 each x gradient differs in its
 * last bits somewhere from LOOM_CONV=direct's, whose sums run in another order (but the 1x1
 * image's, whose one tap sums in the direct kernel's order). */
static void test_small_images_run_by_taps(void **state) {
    (void)state;
    static const conv_case cases[] = {
        {"taps: 4x4, 16 images", 16, 16, 4, 4, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
        {"taps: 2x2, 32 images, O 48", 32, 32, 2, 2, 48, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
        {"taps: C 288 in two chunks", 16, 288, 4, 4, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
        {"taps: 3x3 image", 16, 16, 3, 3, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
        {"taps: 1x1 image", 16, 32, 1, 1, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, false},
        {"taps: pad 2, 2x2 to 4x4", 16, 16, 2, 2, 16, 3, 3, {1, 1}, {2, 2}, {1, 1}, 1, false},
        {"taps: O 24, dx direct", 16, 16, 4, 4, 24, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, true},
        {"taps: stride 2, 4x4 to 2x2", 16, 16, 4, 4, 32, 3, 3, {2, 2}, {1, 1}, {1, 1}, 1, false},
    };
    size_t n = sizeof cases / sizeof cases[0];
    compiled_step_matches_the_interpreter(cases, n, LOOM_DTYPE_F32, 1e-5);
    if (use_bf16_pairs("the taps cases")) {
        compiled_step_matches_the_interpreter(cases, n, LOOM_DTYPE_BF16, 3e-2);
        unsetenv("LOOM_MATMUL_ISA");
    }
    for (size_t c = 0; c < n; c++) {
        float *got[2][3];
        int64_t count[3];
        for (int mode = 0; mode < 2; mode++) {
            if (mode == 1)
                setenv("LOOM_CONV", "direct", 1);
            case_gradients(&cases[c], 0x7A95ull, 0, LOOM_DTYPE_F32, got[mode], count);
            unsetenv("LOOM_CONV");
        }
        int64_t differ = 0;
        for (int64_t i = 0; i < count[0]; i++)
            differ += memcmp(&got[0][0][i], &got[1][0][i], 4) != 0;
        for (int t = 0; t < 3; t++) {
            free(got[0][t]);
            free(got[1][t]);
        }
        if (cases[c].h > 1 && differ == 0) /* 1x1: one tap, summed in the direct order */
            fail_msg("%s: %lld of %lld values of dx differ from the direct kernel's", cases[c].name,
                     (long long)differ, (long long)count[0]);
    }
}

static void test_conv_switches_are_part_of_the_cache_key(void **state) {
    (void)state;
    unsetenv("LOOM_CONV");
    char key[8192];
    snprintf(key, sizeof key, "%s", loom_cg_target_key());
    assert_null(strstr(key, "conv-im2col"));
    setenv("LOOM_CONV", "im2col", 1);
    assert_non_null(strstr(loom_cg_target_key(), ";conv-im2col"));
    setenv("LOOM_CONV", "direct", 1); /* no Winograd: other kernels too */
    assert_non_null(strstr(loom_cg_target_key(), ";conv-direct"));
    setenv("LOOM_CONV", "winograd2", 1); /* Winograd's tiles chosen otherwise */
    assert_non_null(strstr(loom_cg_target_key(), ";conv-wino2"));
    setenv("LOOM_CONV", "winograd4", 1);
    assert_non_null(strstr(loom_cg_target_key(), ";conv-wino4"));
    setenv("LOOM_CONV", "border", 1); /* border classes taken otherwise */
    assert_non_null(strstr(loom_cg_target_key(), ";conv-border"));
    setenv("LOOM_CONV", "winograd", 1); /* not a mode: the default */
    assert_string_equal(key, loom_cg_target_key());
    unsetenv("LOOM_CONV");
    assert_string_equal(key, loom_cg_target_key());
}

/* Three executables (tests/meson.build), so that each stays within its time under the
 * sanitizers and they run side by side: conv2d, conv2d_small (CONV2D_PART=1) with the small
 * images' paths, and conv2d_wino (CONV2D_PART=2) with Winograd's (105 of conv2d's 150 s
 * under ASan before they were split off). */
#ifndef CONV2D_PART
#define CONV2D_PART 0
#endif
int main(void) {
    const struct CMUnitTest small[] = {
        cmocka_unit_test(test_border_classes_match_the_interpreter),
        cmocka_unit_test(test_small_images_are_staged_whole_under_bf16_pairs),
        cmocka_unit_test(test_small_images_run_by_taps),
    };
    const struct CMUnitTest winograd[] = {
        cmocka_unit_test(test_winograd_convolutions_match_the_interpreter),
        cmocka_unit_test(test_winograd_tiles_are_chosen_by_width),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d_records_one_node_with_its_window),
        cmocka_unit_test(test_gradients_match_finite_differences_over_the_sweep),
        cmocka_unit_test(test_differentiating_a_conv_gradient_is_a_clear_error),
        cmocka_unit_test(test_compiled_step_matches_the_interpreter_in_f32),
        cmocka_unit_test(test_compiled_step_matches_the_interpreter_under_bf16_autocast),
        cmocka_unit_test(test_compiled_step_matches_the_interpreter_under_f16_autocast),
        cmocka_unit_test(test_epilogues_by_pixels_and_by_rows_match_the_interpreter),
        cmocka_unit_test(test_strided_input_gradients_match_the_interpreter),
        cmocka_unit_test(test_conv_switches_are_part_of_the_cache_key),
    };
    return CONV2D_PART == 1   ? cmocka_run_group_tests(small, NULL, NULL)
           : CONV2D_PART == 2 ? cmocka_run_group_tests(winograd, NULL, NULL)
                              : cmocka_run_group_tests(tests, NULL, NULL);
}
