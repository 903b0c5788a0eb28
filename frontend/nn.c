/* The functional ops of training (nn.h), composed from loom.h's primitive ops: each is
 * differentiable by loom_backward through its parts and fuses like any other expression.
 * Every public function validates its arguments first so errors name the composite op
 * (and the user's line), not one of its parts. */
#include <math.h>
#include <string.h>

#include "frontend.h"
#include "loom/nn.h"

/* Type of a handle, or false after recording the error (NULL: sticky, no new error). */
static char *fmt_type(char *buf, size_t n, loom_dtype dt, int32_t rank, const int64_t *shape) {
    return loom_ir_format_type(buf, n, dt, rank, shape);
}

static bool need_float(loom_context *ctx, loom_dtype dt, const char *what, const char *file,
                       int line, const char *op) {
    if (loom_ir_dtype_is_float(dt))
        return true;
    loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                  "%s must have a float dtype, got %s", what, loom_dtype_name(dt));
    return false;
}

static bool check_vec(loom_context *ctx, loom_tensor *t, const char *what, loom_dtype dt,
                      int32_t rank, const int64_t *shape, const char *file, int line,
                      const char *op) {
    if (!t)
        return true;
    loom_dtype d;
    int32_t r;
    int64_t s[LOOM_MAX_RANK];
    if (!loom_fe_type_of(ctx, t, what, file, line, op, &d, &r, s))
        return false;
    if (d == dt && r == rank && memcmp(s, shape, (size_t)rank * sizeof *s) == 0)
        return true;
    char ta[LOOM_IR_TYPE_STR_MAX], tb[LOOM_IR_TYPE_STR_MAX];
    loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op, "%s must be %s, got %s", what,
                  fmt_type(ta, sizeof ta, dt, rank, shape), fmt_type(tb, sizeof tb, d, r, s));
    return false;
}

/* ---- linear ----------------------------------------------------------------------------- */

/* x [..., in] times a weight [out, in] (torch's Linear) or, in_out, [in, out] (HF Conv1D). */
static loom_tensor *linear(loom_context *ctx, loom_tensor *x, loom_tensor *weight,
                           loom_tensor *bias, bool in_out, const char *file, int line,
                           const char *op) {
    loom_dtype dx, dw;
    int32_t rx, rw;
    int64_t sx[LOOM_MAX_RANK], sw[LOOM_MAX_RANK];
    if (!ctx || !loom_fe_type_of(ctx, x, "x", file, line, op, &dx, &rx, sx) ||
        !loom_fe_type_of(ctx, weight, "weight", file, line, op, &dw, &rw, sw))
        return NULL;
    char ta[LOOM_IR_TYPE_STR_MAX], tb[LOOM_IR_TYPE_STR_MAX];
    int64_t n_in = sw[in_out ? 0 : 1], n_out = sw[in_out ? 1 : 0];
    if (rx < 1 || rw != 2 || sx[rx - 1] != n_in || dx != dw) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "needs x [..., in] and weight %s of one dtype: %s x %s",
                      in_out ? "[in, out]" : "[out, in]", fmt_type(ta, sizeof ta, dx, rx, sx),
                      fmt_type(tb, sizeof tb, dw, rw, sw));
        return NULL;
    }
    if (!check_vec(ctx, bias, "bias", dw, 1, &n_out, file, line, op))
        return NULL;
    /* matmul folds x's leading axes into its rows and, for a weight that outweighs x and
     * y, computes (W x^T)^T rather than putting W^T in memory; [in, out] is used as it lies */
    loom_tensor *y = in_out ? loom_matmul_at(ctx, x, weight, file, line)
                            : loom_fe_matmul_t(ctx, x, weight, file, line);
    if (bias)
        y = loom_add_at(ctx, y, bias, file, line);
    return y;
}

LOOM_API loom_tensor *loom_linear_at(loom_context *ctx, loom_tensor *x, loom_tensor *weight,
                                     loom_tensor *bias, const char *file, int line) {
    LOOM_FE_USE(ctx, "linear", NULL);
    return linear(ctx, x, weight, bias, false, file, line, "linear");
}

LOOM_API loom_tensor *loom_linear_t_at(loom_context *ctx, loom_tensor *x, loom_tensor *weight,
                                       loom_tensor *bias, const char *file, int line) {
    LOOM_FE_USE(ctx, "linear_t", NULL);
    return linear(ctx, x, weight, bias, true, file, line, "linear_t");
}

/* ---- softmax family --------------------------------------------------------------------- */

/* x - max(x, axis) with the max detached (it only shifts for stability: its gradient
 * contributions cancel exactly, so building them would be wasted work). Under autocast, x is
 * first cast to the dtype it was recorded with (f32), which the autocast pass keeps: the
 * softmax family is on torch.autocast's fp32 list, and its max and shift must not run in the
 * 16-bit dtype a matmul hands it. */
static loom_tensor *shifted(loom_context *ctx, loom_tensor *x, int32_t axis, const char *file,
                            int line) {
    loom_dtype dt;
    if (loom_autocast_dtype(ctx) != LOOM_DTYPE_F32 && loom_tensor_dtype(x, &dt) == LOOM_OK)
        x = loom_cast_at(ctx, x, dt, file, line);
    loom_tensor *m = loom_max_at(ctx, x, 1, &axis, true, file, line);
    return loom_sub_at(ctx, x, loom_detach_at(ctx, m, file, line), file, line);
}

static bool softmax_args(loom_context *ctx, loom_tensor *x, int32_t *axis, const char *file,
                         int line, const char *op) {
    loom_dtype dt;
    int32_t r;
    int64_t s[LOOM_MAX_RANK];
    return ctx && loom_fe_type_of(ctx, x, "x", file, line, op, &dt, &r, s) &&
           need_float(ctx, dt, "x", file, line, op) &&
           loom_fe_norm_axis(ctx, axis, r, file, line, op);
}

LOOM_API loom_tensor *loom_softmax_at(loom_context *ctx, loom_tensor *x, int32_t axis,
                                      const char *file, int line) {
    LOOM_FE_USE(ctx, "softmax", NULL);
    if (!softmax_args(ctx, x, &axis, file, line, "softmax"))
        return NULL;
    loom_tensor *e = loom_exp_at(ctx, shifted(ctx, x, axis, file, line), file, line);
    return loom_div_at(ctx, e, loom_sum_at(ctx, e, 1, &axis, true, file, line), file, line);
}

LOOM_API loom_tensor *loom_log_softmax_at(loom_context *ctx, loom_tensor *x, int32_t axis,
                                          const char *file, int line) {
    LOOM_FE_USE(ctx, "log_softmax", NULL);
    if (!softmax_args(ctx, x, &axis, file, line, "log_softmax"))
        return NULL;
    loom_tensor *z = shifted(ctx, x, axis, file, line);
    loom_tensor *lse = loom_log_at(
        ctx, loom_sum_at(ctx, loom_exp_at(ctx, z, file, line), 1, &axis, true, file, line), file,
        line);
    return loom_sub_at(ctx, z, lse, file, line);
}

/* ---- labels ----------------------------------------------------------------------------- */

LOOM_API loom_tensor *loom_one_hot_at(loom_context *ctx, loom_tensor *labels, int64_t classes,
                                      loom_dtype dtype, const char *file, int line) {
    LOOM_FE_USE(ctx, "one_hot", NULL);
    static const char op[] = "one_hot";
    loom_dtype dt;
    int32_t r;
    int64_t s[LOOM_MAX_RANK];
    if (!ctx || !loom_fe_type_of(ctx, labels, "labels", file, line, op, &dt, &r, s))
        return NULL;
    if (!loom_ir_dtype_is_int(dt) || r >= LOOM_MAX_RANK || classes < 1 ||
        !loom_ir_dtype_valid(dtype)) {
        char t[LOOM_IR_TYPE_STR_MAX];
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "needs integer labels of rank < %d, classes >= 1 and a valid dtype: "
                      "labels %s, classes %lld",
                      LOOM_MAX_RANK, fmt_type(t, sizeof t, dt, r, s), (long long)classes);
        return NULL;
    }
    s[r] = 1;
    loom_tensor *col = loom_reshape_at(ctx, labels, r + 1, s, file, line);
    s[r] = classes;
    loom_tensor *ids = loom_iota_at(ctx, dt, r + 1, s, r, file, line);
    return loom_cast_at(ctx, loom_eq_at(ctx, col, ids, file, line), dtype, file, line);
}

LOOM_API loom_tensor *loom_cross_entropy_ex_at(loom_context *ctx, loom_tensor *logits,
                                               loom_tensor *labels,
                                               const loom_cross_entropy_options *opts,
                                               const char *file, int line) {
    LOOM_FE_USE(ctx, "cross_entropy", NULL);
    static const char op[] = "cross_entropy";
    const loom_cross_entropy_options o =
        opts ? *opts : (loom_cross_entropy_options)LOOM_CROSS_ENTROPY_OPTIONS_DEFAULT;
    loom_dtype dl, dy;
    int32_t rl, ry;
    int64_t sl[LOOM_MAX_RANK], sy[LOOM_MAX_RANK];
    if (!ctx || !loom_fe_type_of(ctx, logits, "logits", file, line, op, &dl, &rl, sl) ||
        !loom_fe_type_of(ctx, labels, "labels", file, line, op, &dy, &ry, sy))
        return NULL;
    char ta[LOOM_IR_TYPE_STR_MAX], tb[LOOM_IR_TYPE_STR_MAX];
    bool shapes = rl >= 1 && ry == rl - 1;
    for (int32_t i = 0; shapes && i < ry; i++)
        shapes = sy[i] == sl[i];
    if (!shapes || !loom_ir_dtype_is_float(dl) || !loom_ir_dtype_is_int(dy)) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "needs float logits [..., C] and integer labels [...] of the same leading "
                      "extents: %s and %s",
                      fmt_type(ta, sizeof ta, dl, rl, sl), fmt_type(tb, sizeof tb, dy, ry, sy));
        return NULL;
    }
    if ((unsigned)o.reduction >= LOOM_REDUCTION_COUNT_) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "reduction %d is not a loom_reduction", (int)o.reduction);
        return NULL;
    }
    if (!(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0)) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "label_smoothing %g is not in [0, 1]", o.label_smoothing);
        return NULL;
    }
    int64_t C = sl[rl - 1];
    loom_tensor *ls = loom_log_softmax_at(ctx, logits, -1, file, line);
    /* counted: label != ignore_index and in [0, C) */
    loom_tensor *no = loom_full_at(ctx, LOOM_DTYPE_BOOL, 0, NULL, 0.0, file, line);
    loom_tensor *in_range = loom_select_at(
        ctx, loom_ge_at(ctx, labels, loom_full_at(ctx, dy, 0, NULL, 0.0, file, line), file, line),
        loom_lt_at(ctx, labels, loom_full_at(ctx, dy, 0, NULL, (double)C, file, line), file, line),
        no, file, line);
    loom_tensor *ign = loom_full_at(ctx, dy, 0, NULL, (double)o.ignore_index, file, line);
    loom_tensor *counted =
        loom_select_at(ctx, loom_ne_at(ctx, labels, ign, file, line), in_range, no, file, line);
    /* the label's log-probability, by a gather at the label (0 where not counted) */
    loom_tensor *at = loom_select_at(ctx, counted, labels,
                                     loom_full_at(ctx, dy, 0, NULL, 0.0, file, line), file, line);
    sy[ry] = 1;
    at = loom_reshape_at(ctx, at, rl, sy, file, line);
    loom_tensor *picked = loom_gather_at(ctx, ls, -1, at, file, line);
    loom_tensor *loss =
        loom_neg_at(ctx, loom_reshape_at(ctx, picked, ry, sy, file, line), file, line);
    if (o.label_smoothing > 0.0) { /* (1 - s) nll + s mean over classes of -log p */
        loom_tensor *uniform = loom_neg_at(
            ctx, loom_mean_at(ctx, ls, 1, (int32_t[]){-1}, false, file, line), file, line);
        loom_tensor *keep = loom_full_at(ctx, dl, 0, NULL, 1.0 - o.label_smoothing, file, line);
        loom_tensor *spread = loom_full_at(ctx, dl, 0, NULL, o.label_smoothing, file, line);
        loss = loom_add_at(ctx, loom_mul_at(ctx, keep, loss, file, line),
                           loom_mul_at(ctx, spread, uniform, file, line), file, line);
    }
    loss = loom_select_at(ctx, counted, loss, loom_full_at(ctx, dl, 0, NULL, 0.0, file, line), file,
                          line);
    switch (o.reduction) {
    case LOOM_REDUCTION_NONE: return loss;
    case LOOM_REDUCTION_SUM: return loom_sum_at(ctx, loss, 0, NULL, false, file, line);
    case LOOM_REDUCTION_MEAN: {
        /* divided by the number of counted labels, as PyTorch with ignore_index */
        loom_tensor *count =
            loom_detach_at(ctx,
                           loom_sum_at(ctx, loom_cast_at(ctx, counted, dl, file, line), 0, NULL,
                                       false, file, line),
                           file, line);
        return loom_div_at(ctx, loom_sum_at(ctx, loss, 0, NULL, false, file, line), count, file,
                           line);
    }
    case LOOM_REDUCTION_COUNT_: break;
    }
    return NULL;
}

LOOM_API loom_tensor *loom_cross_entropy_at(loom_context *ctx, loom_tensor *logits,
                                            loom_tensor *labels, loom_reduction reduction,
                                            const char *file, int line) {
    loom_cross_entropy_options o = LOOM_CROSS_ENTROPY_OPTIONS_DEFAULT;
    o.reduction = reduction;
    return loom_cross_entropy_ex_at(ctx, logits, labels, &o, file, line);
}

LOOM_API loom_tensor *loom_argmax_at(loom_context *ctx, loom_tensor *x, int32_t axis,
                                     const char *file, int line) {
    LOOM_FE_USE(ctx, "argmax", NULL);
    static const char op[] = "argmax";
    loom_dtype dt;
    int32_t r;
    int64_t s[LOOM_MAX_RANK];
    if (!ctx || !loom_fe_type_of(ctx, x, "x", file, line, op, &dt, &r, s) ||
        !loom_fe_norm_axis(ctx, &axis, r, file, line, op))
        return NULL;
    if (dt == LOOM_DTYPE_BOOL) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "x must be numeric, got bool");
        return NULL;
    }
    /* The first index holding the maximum: -max(-(x == max ? i : n)) over the axis. */
    loom_tensor *m = loom_max_at(ctx, x, 1, &axis, true, file, line);
    loom_tensor *ids = loom_iota_at(ctx, LOOM_DTYPE_I64, r, s, axis, file, line);
    loom_tensor *cand = loom_select_at(
        ctx, loom_eq_at(ctx, x, m, file, line), ids,
        loom_full_at(ctx, LOOM_DTYPE_I64, 0, NULL, (double)s[axis], file, line), file, line);
    loom_tensor *best =
        loom_max_at(ctx, loom_neg_at(ctx, cand, file, line), 1, &axis, false, file, line);
    return loom_neg_at(ctx, best, file, line);
}

/* ---- convolution and pooling ------------------------------------------------------------ */

static bool pair(loom_context *ctx, const int64_t *p, int64_t dflt, int64_t min, int64_t out[2],
                 const char *what, const char *file, int line, const char *op) {
    out[0] = p ? p[0] : dflt;
    out[1] = p ? p[1] : dflt;
    if (out[0] < min || out[1] < min) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "%s {%lld, %lld} must be >= %lld", what, (long long)out[0], (long long)out[1],
                      (long long)min);
        return false;
    }
    return true;
}

/* The KH*KW shifted, strided windows of x [A, B, H, W] (after padding with zeros), each
 * [A, B, OH, OW], in row-major (kh, kw) order: average pooling's (conv2d's im2col, the same,
 * is in passes/conv_decompose.c). */
static bool windows(loom_context *ctx, loom_tensor *x, const int64_t *s, const int64_t k[2],
                    const int64_t st[2], const int64_t pd[2], const int64_t o[2], loom_tensor **out,
                    const char *file, int line) {
    if (pd[0] || pd[1])
        x = loom_pad_at(ctx, x, (int64_t[]){0, 0, pd[0], pd[1]}, (int64_t[]){0, 0, pd[0], pd[1]},
                        NULL, 0.0, file, line);
    for (int64_t i = 0; i < k[0]; i++)
        for (int64_t j = 0; j < k[1]; j++)
            out[i * k[1] + j] =
                loom_slice_at(ctx, x, (int64_t[]){0, 0, i, j}, (int64_t[]){s[0], s[1], o[0], o[1]},
                              (int64_t[]){1, 1, st[0], st[1]}, file, line);
    return loom_context_error(ctx) == LOOM_OK;
}

enum { MAX_WINDOW = 1024 };

LOOM_API loom_tensor *loom_conv2d_at(loom_context *ctx, loom_tensor *x, loom_tensor *weight,
                                     loom_tensor *bias, const int64_t *stride,
                                     const int64_t *padding, const int64_t *dilation,
                                     int64_t groups, const char *file, int line) {
    LOOM_FE_USE(ctx, "conv2d", NULL);
    static const char op[] = "conv2d";
    loom_dtype dx, dw;
    int32_t rx, rw;
    int64_t sx[LOOM_MAX_RANK], sw[LOOM_MAX_RANK];
    int64_t st[2], pd[2], dl[2];
    if (!ctx || !loom_fe_type_of(ctx, x, "x", file, line, op, &dx, &rx, sx) ||
        !loom_fe_type_of(ctx, weight, "weight", file, line, op, &dw, &rw, sw) ||
        !pair(ctx, stride, 1, 1, st, "stride", file, line, op) ||
        !pair(ctx, padding, 0, 0, pd, "padding", file, line, op) ||
        !pair(ctx, dilation, 1, 1, dl, "dilation", file, line, op))
        return NULL;
    char ta[LOOM_IR_TYPE_STR_MAX], tb[LOOM_IR_TYPE_STR_MAX];
    if (rx != 4 || rw != 4 || dx != dw || !loom_ir_dtype_is_float(dx) || groups < 1 ||
        sx[1] % groups || sw[0] % groups || sw[1] != sx[1] / groups) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "needs float x [N, C, H, W] and weight [O, C/groups, KH, KW] of one "
                      "dtype, with groups dividing C and O: x %s, weight %s, groups %lld",
                      fmt_type(ta, sizeof ta, dx, rx, sx), fmt_type(tb, sizeof tb, dw, rw, sw),
                      (long long)groups);
        return NULL;
    }
    if (!check_vec(ctx, bias, "bias", dw, 1, sw, file, line, op))
        return NULL;
    int64_t k[2] = {sw[2], sw[3]};
    int64_t o[2] = {loom_ir_conv_out_extent(sx[2], k[0], st[0], pd[0], dl[0]),
                    loom_ir_conv_out_extent(sx[3], k[1], st[1], pd[1], dl[1])};
    if (o[0] < 1 || o[1] < 1) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "the %lldx%lld kernel (dilation {%lld, %lld}) does not fit the padded "
                      "input %s (padding {%lld, %lld})",
                      (long long)k[0], (long long)k[1], (long long)dl[0], (long long)dl[1],
                      fmt_type(ta, sizeof ta, dx, rx, sx), (long long)pd[0], (long long)pd[1]);
        return NULL;
    }
    /* One conv2d node (the JIT decomposes it until codegen has a conv kernel); the bias is
     * an add over the channel axis, an epilogue the autocast pass keeps in the conv's dtype. */
    loom_ir_conv cv = {{st[0], st[1]}, {pd[0], pd[1]}, {dl[0], dl[1]}, groups, {0, 0}};
    loom_tensor *y = loom_fe_conv2d(ctx, x, weight, &cv, file, line);
    if (!bias)
        return y;
    loom_tensor *b = loom_reshape_at(ctx, bias, 4, (int64_t[]){1, sw[0], 1, 1}, file, line);
    return loom_add_at(ctx, y, b, file, line);
}

static loom_tensor *pool(loom_context *ctx, loom_tensor *x, const int64_t *kernel,
                         const int64_t *stride, const int64_t *padding, bool is_max,
                         const char *file, int line) {
    const char *op = is_max ? "max_pool2d" : "avg_pool2d";
    loom_dtype dx;
    int32_t rx;
    int64_t sx[LOOM_MAX_RANK], k[2], st[2], pd[2];
    if (!ctx || !loom_fe_type_of(ctx, x, "x", file, line, op, &dx, &rx, sx))
        return NULL;
    if (!kernel) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op, "kernel is NULL");
        return NULL;
    }
    if (!pair(ctx, kernel, 1, 1, k, "kernel", file, line, op) ||
        !pair(ctx, stride ? stride : k, 1, 1, st, "stride", file, line, op) ||
        !pair(ctx, padding, 0, 0, pd, "padding", file, line, op))
        return NULL;
    char t[LOOM_IR_TYPE_STR_MAX];
    if (rx != 4 || !loom_ir_dtype_is_float(dx)) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "needs float x [N, C, H, W], got %s", fmt_type(t, sizeof t, dx, rx, sx));
        return NULL;
    }
    int64_t o[2] = {loom_ir_conv_out_extent(sx[2], k[0], st[0], pd[0], 1),
                    loom_ir_conv_out_extent(sx[3], k[1], st[1], pd[1], 1)};
    if (o[0] < 1 || o[1] < 1 || 2 * pd[0] > k[0] || 2 * pd[1] > k[1] || k[0] * k[1] > MAX_WINDOW) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "kernel {%lld, %lld} with padding {%lld, %lld} does not fit %s (padding "
                      "may be at most half the kernel)",
                      (long long)k[0], (long long)k[1], (long long)pd[0], (long long)pd[1],
                      fmt_type(t, sizeof t, dx, rx, sx));
        return NULL;
    }
    if (is_max) { /* one kernel each way (codegen/lower_pool.c), PyTorch's choice of pixel */
        loom_ir_conv window = {{st[0], st[1]}, {pd[0], pd[1]}, {1, 1}, 0, {k[0], k[1]}};
        return loom_fe_max_pool2d(ctx, x, &window, file, line);
    }
    if (st[0] == k[0] && st[1] == k[1] && !pd[0] && !pd[1] && sx[2] % k[0] == 0 &&
        sx[3] % k[1] == 0) {
        /* Windows that tile x exactly: x as [N, C, OH, KH, OW, KW] averaged over the window
         * axes, one reduction forward and one elementwise pass backward (strided slices
         * would come back as interior pads, which cost several passes). */
        loom_tensor *tiles = loom_reshape_at(
            ctx, x, 6, (int64_t[]){sx[0], sx[1], o[0], k[0], o[1], k[1]}, file, line);
        return loom_mean_at(ctx, tiles, 2, (int32_t[]){3, 5}, false, file, line);
    }
    loom_tensor *win[MAX_WINDOW]; /* the sum of the windows (zero padded) over their size */
    if (!windows(ctx, x, sx, k, st, pd, o, win, file, line))
        return NULL;
    loom_tensor *acc = win[0];
    for (int64_t i = 1; i < k[0] * k[1]; i++)
        acc = loom_add_at(ctx, acc, win[i], file, line);
    return loom_mul_at(ctx, acc,
                       loom_full_at(ctx, dx, 0, NULL, 1.0 / (double)(k[0] * k[1]), file, line),
                       file, line);
}

LOOM_API loom_tensor *loom_max_pool2d_at(loom_context *ctx, loom_tensor *x, const int64_t *kernel,
                                         const int64_t *stride, const int64_t *padding,
                                         const char *file, int line) {
    LOOM_FE_USE(ctx, "max_pool2d", NULL);
    return pool(ctx, x, kernel, stride, padding, true, file, line);
}

LOOM_API loom_tensor *loom_avg_pool2d_at(loom_context *ctx, loom_tensor *x, const int64_t *kernel,
                                         const int64_t *stride, const int64_t *padding,
                                         const char *file, int line) {
    LOOM_FE_USE(ctx, "avg_pool2d", NULL);
    return pool(ctx, x, kernel, stride, padding, false, file, line);
}

/* ---- normalisation ---------------------------------------------------------------------- */

/* A per-channel [C] tensor viewed as [1, C, 1, ...] against a rank-r input. */
static loom_tensor *channel_view(loom_context *ctx, loom_tensor *t, int32_t r, int64_t c,
                                 const char *file, int line) {
    int64_t s[LOOM_MAX_RANK];
    for (int32_t i = 0; i < r; i++)
        s[i] = i == 1 ? c : 1;
    return loom_reshape_at(ctx, t, r, s, file, line);
}

LOOM_API loom_tensor *loom_batch_norm_at(loom_context *ctx, loom_tensor *x,
                                         loom_tensor *running_mean, loom_tensor *running_var,
                                         loom_tensor *weight, loom_tensor *bias, bool training,
                                         double momentum, double eps, const char *file, int line) {
    LOOM_FE_USE(ctx, "batch_norm", NULL);
    static const char op[] = "batch_norm";
    loom_dtype dt;
    int32_t r;
    int64_t s[LOOM_MAX_RANK];
    if (!ctx || !loom_fe_type_of(ctx, x, "x", file, line, op, &dt, &r, s))
        return NULL;
    char t[LOOM_IR_TYPE_STR_MAX];
    if (r < 2 || !loom_ir_dtype_is_float(dt) || !(eps >= 0) || !(momentum >= 0) || momentum > 1) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "needs float x [N, C, ...], eps >= 0 and momentum in [0, 1]: x %s, eps %g, "
                      "momentum %g",
                      fmt_type(t, sizeof t, dt, r, s), eps, momentum);
        return NULL;
    }
    int64_t c = s[1];
    if (!check_vec(ctx, running_mean, "running_mean", dt, 1, &c, file, line, op) ||
        !check_vec(ctx, running_var, "running_var", dt, 1, &c, file, line, op) ||
        !check_vec(ctx, weight, "weight", dt, 1, &c, file, line, op) ||
        !check_vec(ctx, bias, "bias", dt, 1, &c, file, line, op))
        return NULL;
    if (!training && (!running_mean || !running_var)) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "eval mode needs running_mean and running_var");
        return NULL;
    }
    int32_t axes[LOOM_MAX_RANK], na = 0;
    int64_t count = 1;
    for (int32_t i = 0; i < r; i++)
        if (i != 1) {
            axes[na++] = i;
            count *= s[i];
        }
    loom_tensor *mean, *var;
    if (training) {
        mean = loom_mean_at(ctx, x, na, axes, true, file, line);
        loom_tensor *d = loom_sub_at(ctx, x, mean, file, line);
        var = loom_mean_at(ctx, loom_mul_at(ctx, d, d, file, line), na, axes, true, file, line);
        if (running_mean && running_var) {
            double unbias = count > 1 ? (double)count / (double)(count - 1) : 1.0;
            loom_tensor *m1 =
                loom_reshape_at(ctx, loom_detach_at(ctx, mean, file, line), 1, &c, file, line);
            loom_tensor *v1 =
                loom_reshape_at(ctx, loom_detach_at(ctx, var, file, line), 1, &c, file, line);
            loom_tensor *keep = loom_full_at(ctx, dt, 0, NULL, 1.0 - momentum, file, line);
            loom_assign_at(
                ctx, running_mean,
                loom_add_at(ctx, loom_mul_at(ctx, running_mean, keep, file, line),
                            loom_mul_at(ctx, m1,
                                        loom_full_at(ctx, dt, 0, NULL, momentum, file, line), file,
                                        line),
                            file, line),
                file, line);
            loom_assign_at(ctx, running_var,
                           loom_add_at(ctx, loom_mul_at(ctx, running_var, keep, file, line),
                                       loom_mul_at(ctx, v1,
                                                   loom_full_at(ctx, dt, 0, NULL, momentum * unbias,
                                                                file, line),
                                                   file, line),
                                       file, line),
                           file, line);
        }
    } else {
        mean = channel_view(ctx, running_mean, r, c, file, line);
        var = channel_view(ctx, running_var, r, c, file, line);
    }
    loom_tensor *inv = loom_rsqrt_at(
        ctx, loom_add_at(ctx, var, loom_full_at(ctx, dt, 0, NULL, eps, file, line), file, line),
        file, line);
    loom_tensor *y = loom_mul_at(ctx, loom_sub_at(ctx, x, mean, file, line), inv, file, line);
    if (weight)
        y = loom_mul_at(ctx, y, channel_view(ctx, weight, r, c, file, line), file, line);
    if (bias)
        y = loom_add_at(ctx, y, channel_view(ctx, bias, r, c, file, line), file, line);
    return y;
}

LOOM_API loom_tensor *loom_layer_norm_at(loom_context *ctx, loom_tensor *x, int32_t n_norm,
                                         loom_tensor *weight, loom_tensor *bias, double eps,
                                         const char *file, int line) {
    LOOM_FE_USE(ctx, "layer_norm", NULL);
    static const char op[] = "layer_norm";
    loom_dtype dt;
    int32_t r;
    int64_t s[LOOM_MAX_RANK];
    if (!ctx || !loom_fe_type_of(ctx, x, "x", file, line, op, &dt, &r, s))
        return NULL;
    char t[LOOM_IR_TYPE_STR_MAX];
    if (n_norm < 1 || n_norm > r || !loom_ir_dtype_is_float(dt) || !(eps >= 0)) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "needs float x, 1 <= n_norm <= rank and eps >= 0: x %s, n_norm %d, eps %g",
                      fmt_type(t, sizeof t, dt, r, s), (int)n_norm, eps);
        return NULL;
    }
    const int64_t *ns = s + (r - n_norm);
    if (!check_vec(ctx, weight, "weight", dt, n_norm, ns, file, line, op) ||
        !check_vec(ctx, bias, "bias", dt, n_norm, ns, file, line, op))
        return NULL;
    int32_t axes[LOOM_MAX_RANK];
    for (int32_t i = 0; i < n_norm; i++)
        axes[i] = r - n_norm + i;
    loom_tensor *mean = loom_mean_at(ctx, x, n_norm, axes, true, file, line);
    loom_tensor *d = loom_sub_at(ctx, x, mean, file, line);
    loom_tensor *var =
        loom_mean_at(ctx, loom_mul_at(ctx, d, d, file, line), n_norm, axes, true, file, line);
    loom_tensor *y = loom_mul_at(
        ctx, d,
        loom_rsqrt_at(
            ctx, loom_add_at(ctx, var, loom_full_at(ctx, dt, 0, NULL, eps, file, line), file, line),
            file, line),
        file, line);
    if (weight)
        y = loom_mul_at(ctx, y, weight, file, line);
    if (bias)
        y = loom_add_at(ctx, y, bias, file, line);
    return y;
}

/* ---- dropout and embedding -------------------------------------------------------------- */

loom_tensor *loom_fe_dropout_key(loom_context *ctx, loom_tensor *seed, int64_t stream,
                                 const char *file, int line, const char *op) {
    loom_dtype ds;
    int32_t rs;
    int64_t ss[LOOM_MAX_RANK];
    if (!loom_fe_type_of(ctx, seed, "seed", file, line, op, &ds, &rs, ss))
        return NULL;
    if (ds != LOOM_DTYPE_I64 || rs != 0) {
        char t[LOOM_IR_TYPE_STR_MAX];
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "seed must be an i64 scalar, got %s", fmt_type(t, sizeof t, ds, rs, ss));
        return NULL;
    }
    /* Streams are spread far apart in the counter space of loom_rand_uniform's generator. */
    return loom_add_at(ctx, seed,
                       loom_full_at(ctx, LOOM_DTYPE_I64, 0, NULL,
                                    (double)(stream * (INT64_C(1) << 40)), file, line),
                       file, line);
}

LOOM_API loom_tensor *loom_dropout_at(loom_context *ctx, loom_tensor *x, double p, bool training,
                                      loom_tensor *seed, int64_t stream, const char *file,
                                      int line) {
    LOOM_FE_USE(ctx, "dropout", NULL);
    static const char op[] = "dropout";
    loom_dtype dt;
    int32_t r;
    int64_t s[LOOM_MAX_RANK];
    if (!ctx || !loom_fe_type_of(ctx, x, "x", file, line, op, &dt, &r, s))
        return NULL;
    if (!(p >= 0 && p <= 1) || !loom_ir_dtype_is_float(dt)) {
        char t[LOOM_IR_TYPE_STR_MAX];
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "needs a float x and p in [0, 1]: x %s, p %g",
                      fmt_type(t, sizeof t, dt, r, s), p);
        return NULL;
    }
    if (!training || p == 0)
        return x;
    loom_tensor *key = loom_fe_dropout_key(ctx, seed, stream, file, line, op);
    if (!key)
        return NULL;
    loom_tensor *zero = loom_full_at(ctx, dt, 0, NULL, 0.0, file, line);
    if (p == 1)
        return loom_mul_at(ctx, x, zero, file, line);
    loom_tensor *u = loom_rand_uniform_at(ctx, key, dt, r, s, file, line);
    loom_tensor *keep =
        loom_ge_at(ctx, u, loom_full_at(ctx, dt, 0, NULL, p, file, line), file, line);
    loom_tensor *scaled = loom_mul_at(
        ctx, x, loom_full_at(ctx, dt, 0, NULL, 1.0 / (1.0 - p), file, line), file, line);
    return loom_select_at(ctx, keep, scaled, zero, file, line);
}

LOOM_API loom_tensor *loom_embedding_at(loom_context *ctx, loom_tensor *indices, loom_tensor *table,
                                        const char *file, int line) {
    LOOM_FE_USE(ctx, "embedding", NULL);
    static const char op[] = "embedding";
    loom_dtype di, dt;
    int32_t ri, rt;
    int64_t si[LOOM_MAX_RANK], st[LOOM_MAX_RANK];
    if (!ctx || !loom_fe_type_of(ctx, indices, "indices", file, line, op, &di, &ri, si) ||
        !loom_fe_type_of(ctx, table, "table", file, line, op, &dt, &rt, st))
        return NULL;
    if (!loom_ir_dtype_is_int(di) || rt != 2 || !loom_ir_dtype_is_float(dt) ||
        ri >= LOOM_MAX_RANK) {
        char ta[LOOM_IR_TYPE_STR_MAX], tb[LOOM_IR_TYPE_STR_MAX];
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "needs integer indices and a float table [V, D]: %s and %s",
                      fmt_type(ta, sizeof ta, di, ri, si), fmt_type(tb, sizeof tb, dt, rt, st));
        return NULL;
    }
    /* a gather of rows (its gradient the scatter_add of rows PyTorch computes): no one-hot
     * matmul, and in the table's dtype under autocast too (gather is not on the lower list) */
    return loom_index_select_at(ctx, table, 0, indices, file, line);
}
