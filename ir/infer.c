/* Shape and dtype inference: the one place that knows each op kind's typing rules. The
 * frontend calls it to validate user calls; the verifier calls it to re-check graphs. */
#include <math.h>
#include <string.h>

#include "ir.h"

#define TYPE(buf, node)                                                                            \
    loom_ir_format_type(buf, sizeof buf, (node)->dtype, (node)->rank, (node)->shape)

static void copy_type(const loom_ir_node *src, loom_dtype *dt, int32_t *rank, int64_t *shape) {
    *dt = src->dtype;
    *rank = src->rank;
    for (int32_t i = 0; i < src->rank; i++)
        shape[i] = src->shape[i];
}

static loom_status check_shape(const loom_ir_node_desc *desc, loom_ir_diag *d) {
    if (desc->rank < 0 || desc->rank > LOOM_MAX_RANK)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "rank %d is out of range (0..%d)",
                                (int)desc->rank, LOOM_MAX_RANK);
    if (desc->rank > 0 && !desc->shape)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "shape is NULL for rank %d",
                                (int)desc->rank);
    int64_t numel = 1;
    for (int32_t i = 0; i < desc->rank; i++) {
        if (desc->shape[i] < 0)
            return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                    "extent %lld of axis %d is negative", (long long)desc->shape[i],
                                    (int)i);
        if (desc->shape[i] > 0 && numel > INT64_MAX / 16 / desc->shape[i])
            return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "shape has too many elements");
        numel *= desc->shape[i];
    }
    return LOOM_OK;
}

static void set_desc_type(const loom_ir_node_desc *desc, loom_dtype dt, int32_t *rank,
                          int64_t *shape, loom_dtype *out_dt) {
    *out_dt = dt;
    *rank = desc->rank;
    for (int32_t i = 0; i < desc->rank; i++)
        shape[i] = desc->shape[i];
}

/* Checks that x [N,C,H,W], w [O,C/groups,KH,KW] and y [N,O,OH,OW] are one convolution under
 * attrs cv (for the gradients, which state x's or w's shape, the operands give the rest).
 * The messages name the op's operands as the user knows them. */
static loom_status check_conv(const loom_ir_conv *cv, loom_dtype dt, const int64_t *xs,
                              const int64_t *ws, const int64_t *ys, loom_ir_diag *d) {
    const loom_status BAD = LOOM_STATUS_INVALID_ARGUMENT;
    char tx[LOOM_IR_TYPE_STR_MAX], tw[LOOM_IR_TYPE_STR_MAX], ty[LOOM_IR_TYPE_STR_MAX];
    loom_ir_format_type(tx, sizeof tx, dt, 4, xs);
    loom_ir_format_type(tw, sizeof tw, dt, 4, ws);
    loom_ir_format_type(ty, sizeof ty, dt, 4, ys);
    int64_t g = cv->groups;
    if (g < 1 || g > INT32_MAX)
        return loom_ir_diag_set(d, BAD, "groups %lld must be in 1..%d", (long long)g, INT32_MAX);
    for (int i = 0; i < 2; i++) {
        if (cv->stride[i] < 1 || cv->stride[i] > INT32_MAX || cv->dilation[i] < 1 ||
            cv->dilation[i] > INT32_MAX || cv->padding[i] < 0 || cv->padding[i] > INT32_MAX)
            return loom_ir_diag_set(d, BAD,
                                    "stride [%lld, %lld] and dilation [%lld, %lld] must be in "
                                    "1..%d, padding [%lld, %lld] in 0..%d",
                                    (long long)cv->stride[0], (long long)cv->stride[1],
                                    (long long)cv->dilation[0], (long long)cv->dilation[1],
                                    INT32_MAX, (long long)cv->padding[0], (long long)cv->padding[1],
                                    INT32_MAX);
    }
    if (xs[1] % g || ws[0] % g)
        return loom_ir_diag_set(d, BAD,
                                "groups %lld must divide the input channels of x %s and the "
                                "output channels of weight %s",
                                (long long)g, tx, tw);
    if (ws[1] != xs[1] / g)
        return loom_ir_diag_set(d, BAD,
                                "weight %s needs %lld input channels (x %s has %lld, groups "
                                "%lld)",
                                tw, (long long)(xs[1] / g), tx, (long long)xs[1], (long long)g);
    if (ys[0] != xs[0] || ys[1] != ws[0])
        return loom_ir_diag_set(d, BAD,
                                "output %s needs batch %lld of x %s and %lld channels of weight "
                                "%s",
                                ty, (long long)xs[0], tx, (long long)ws[0], tw);
    for (int i = 0; i < 2; i++) {
        int64_t o = loom_ir_conv_out_extent(xs[2 + i], ws[2 + i], cv->stride[i], cv->padding[i],
                                            cv->dilation[i]);
        if (o < 1)
            return loom_ir_diag_set(d, BAD,
                                    "the %lldx%lld kernel of weight %s (dilation [%lld, %lld]) "
                                    "does not fit x %s padded by [%lld, %lld]: the output would "
                                    "be empty",
                                    (long long)ws[2], (long long)ws[3], tw,
                                    (long long)cv->dilation[0], (long long)cv->dilation[1], tx,
                                    (long long)cv->padding[0], (long long)cv->padding[1]);
        if (ys[2 + i] != o)
            return loom_ir_diag_set(d, BAD,
                                    "output %s does not match x %s and weight %s: extent %d "
                                    "of the output is %lld, the window sweep gives %lld",
                                    ty, tx, tw, 2 + i, (long long)ys[2 + i], (long long)o);
    }
    return LOOM_OK;
}

/* conv2d and its gradients: operand ranks and dtypes, then the convolution they describe. */
static loom_status infer_conv(const loom_ir_node_desc *desc, const loom_ir_node *const *in,
                              loom_dtype *out_dtype, int32_t *out_rank, int64_t *out_shape,
                              loom_ir_diag *d) {
    const loom_status BAD = LOOM_STATUS_INVALID_ARGUMENT;
    static const char *const names[3][2] = {{"x", "weight"}, {"dy", "weight"}, {"x", "dy"}};
    int which = desc->op == LOOM_IR_OP_CONV2D              ? 0
                : desc->op == LOOM_IR_OP_CONV2D_GRAD_INPUT ? 1
                                                           : 2;
    char ta[LOOM_IR_TYPE_STR_MAX], tb[LOOM_IR_TYPE_STR_MAX];
    TYPE(ta, in[0]);
    TYPE(tb, in[1]);
    if (in[0]->rank != 4 || in[1]->rank != 4)
        return loom_ir_diag_set(d, BAD, "needs rank-4 (NCHW) operands: %s %s, %s %s",
                                names[which][0], ta, names[which][1], tb);
    if (in[0]->dtype != in[1]->dtype)
        return loom_ir_diag_set(d, BAD, "dtypes differ: %s %s, %s %s", names[which][0], ta,
                                names[which][1], tb);
    *out_dtype = in[0]->dtype;
    *out_rank = 4;
    const loom_ir_conv *cv = &desc->attrs.conv;
    if (which == 0) { /* the output's extents, checked below against themselves */
        const int64_t *xs = in[0]->shape, *ws = in[1]->shape;
        out_shape[0] = xs[0];
        out_shape[1] = ws[0];
        for (int i = 0; i < 2; i++)
            out_shape[2 + i] = loom_ir_conv_out_extent(xs[2 + i], ws[2 + i], cv->stride[i],
                                                       cv->padding[i], cv->dilation[i]);
        loom_status st = check_conv(cv, *out_dtype, xs, ws, out_shape, d);
        if (st != LOOM_OK)
            return st;
        loom_ir_node_desc res = {.rank = 4, .shape = out_shape};
        return check_shape(&res, d);
    }
    loom_status st = check_shape(desc, d);
    if (st != LOOM_OK)
        return st;
    if (desc->rank != 4)
        return loom_ir_diag_set(d, BAD, "the stated result must have rank 4 (%s), got rank %d",
                                which == 1 ? "x's [N,C,H,W]" : "weight's [O,C/groups,KH,KW]",
                                (int)desc->rank);
    for (int32_t i = 0; i < 4; i++)
        out_shape[i] = desc->shape[i];
    if (which == 1)
        return check_conv(cv, *out_dtype, out_shape, in[1]->shape, in[0]->shape, d);
    return check_conv(cv, *out_dtype, in[0]->shape, out_shape, in[1]->shape, d);
}

/* gather(x, idx) and scatter_add(base, idx, src) along attrs.index: idx is i32 or i64 of the
 * data's rank, its extents off the axis the data's (x's, base's); src has idx's shape and
 * base's dtype. */
static loom_status infer_index(const loom_ir_node_desc *desc, const loom_ir_node *const *in,
                               loom_dtype *out_dtype, int32_t *out_rank, int64_t *out_shape,
                               loom_ir_diag *d) {
    const loom_status BAD = LOOM_STATUS_INVALID_ARGUMENT;
    char tx[LOOM_IR_TYPE_STR_MAX], ti[LOOM_IR_TYPE_STR_MAX], ts[LOOM_IR_TYPE_STR_MAX];
    const loom_ir_node *x = in[0], *idx = in[1];
    bool scatter = desc->op == LOOM_IR_OP_SCATTER_ADD;
    int64_t a = desc->attrs.index;
    TYPE(tx, x);
    TYPE(ti, idx);
    if (idx->dtype != LOOM_DTYPE_I32 && idx->dtype != LOOM_DTYPE_I64)
        return loom_ir_diag_set(d, BAD, "indices must be i32 or i64, got %s", ti);
    if (x->rank < 1)
        return loom_ir_diag_set(d, BAD, "indexes along an axis, but %s is a scalar", tx);
    if (a < 0 || a >= x->rank)
        return loom_ir_diag_set(d, BAD, "axis %lld is out of range for %s", (long long)a, tx);
    if (idx->rank != x->rank)
        return loom_ir_diag_set(d, BAD, "indices %s must have the rank of %s", ti, tx);
    for (int32_t k = 0; k < x->rank; k++)
        if (k != a && idx->shape[k] != x->shape[k])
            return loom_ir_diag_set(d, BAD,
                                    "indices %s and %s differ in extent along axis %d (only "
                                    "axis %lld may differ)",
                                    ti, tx, (int)k, (long long)a);
    if (idx->shape[a] > 0 && x->shape[a] == 0)
        return loom_ir_diag_set(d, BAD, "indices %s index the empty axis %lld of %s", ti,
                                (long long)a, tx);
    if (scatter) {
        const loom_ir_node *src = in[2];
        TYPE(ts, src);
        if (src->dtype != x->dtype)
            return loom_ir_diag_set(d, BAD, "dtypes differ: base %s, src %s", tx, ts);
        if (!loom_ir_same_shape(src, idx))
            return loom_ir_diag_set(d, BAD, "src %s must have the indices' shape %s", ts, ti);
        copy_type(x, out_dtype, out_rank, out_shape);
        return LOOM_OK;
    }
    copy_type(idx, out_dtype, out_rank, out_shape);
    *out_dtype = x->dtype;
    return LOOM_OK;
}

/* The attention ops (ops.def): q [..., L, E], k [..., S, E], v [..., S, Ev] of one float dtype
 * and equal leading axes; do [..., L, Ev] in q's dtype, lse and delta f32 [..., L]. */
static loom_status infer_attention(const loom_ir_node_desc *desc, const loom_ir_node *const *in,
                                   loom_dtype *out_dtype, int32_t *out_rank, int64_t *out_shape,
                                   loom_ir_diag *d) {
    const loom_status BAD = LOOM_STATUS_INVALID_ARGUMENT;
    char ta[LOOM_IR_TYPE_STR_MAX], tb[LOOM_IR_TYPE_STR_MAX], tc[LOOM_IR_TYPE_STR_MAX];
    loom_ir_op op = desc->op;
    bool grad_v = op == LOOM_IR_OP_ATTENTION_GRAD_V;
    bool grad = op == LOOM_IR_OP_ATTENTION_GRAD_Q || op == LOOM_IR_OP_ATTENTION_GRAD_K || grad_v;
    if (desc->attrs.index != 0 && desc->attrs.index != 1)
        return loom_ir_diag_set(d, BAD, "causal must be 0 or 1, got %lld",
                                (long long)desc->attrs.index);
    if (!isfinite(desc->attrs.value) || desc->attrs.value < 0)
        return loom_ir_diag_set(d, BAD, "scale must be finite and >= 0, got %g", desc->attrs.value);
    double p = desc->attrs.dropout;
    if (!(p >= 0 && p < 1) || (p != 0 && op == LOOM_IR_OP_ATTENTION_LSE))
        return loom_ir_diag_set(
            d, BAD, "%s needs a dropout in [0, 1)%s, got %g", loom_ir_op_name(op),
            op == LOOM_IR_OP_ATTENTION_LSE ? " of 0 (its scores are not dropped)" : "", p);
    /* the op's own operands, then the seed where there is dropout, then any mask (ops.def) */
    int32_t own = loom_ir_attention_operands(op), at_mask = own + (p > 0);
    if (desc->n_inputs != at_mask && desc->n_inputs != at_mask + 1)
        return loom_ir_diag_set(d, BAD, "expects %d operands%s (or a mask after them), got %d",
                                (int)at_mask, p > 0 ? ", the last the dropout's i64 seed" : "",
                                (int)desc->n_inputs);
    if (p > 0) {
        const loom_ir_node *seed = in[own];
        TYPE(ta, seed);
        if (seed->dtype != LOOM_DTYPE_I64 || seed->rank != 0)
            return loom_ir_diag_set(d, BAD, "the dropout's seed must be an i64 scalar, got %s", ta);
    }
    /* v, do, lse, delta where the op has them */
    const loom_ir_node *v = op == LOOM_IR_OP_ATTENTION_LSE || grad_v ? NULL : in[2];
    const loom_ir_node *dout = !grad ? NULL : grad_v ? in[2] : in[3];
    const loom_ir_node *lse = !grad ? NULL : grad_v ? in[3] : in[4];
    const loom_ir_node *delta = grad && !grad_v ? in[5] : NULL;
    const loom_ir_node *q = in[0], *k = in[1];
    int32_t r = q->rank;
    TYPE(ta, q);
    TYPE(tb, k);
    if (!loom_ir_dtype_is_float(q->dtype) || k->dtype != q->dtype)
        return loom_ir_diag_set(d, BAD, "q %s and k %s need one float dtype", ta, tb);
    if (r < 2 || k->rank != r || memcmp(q->shape, k->shape, (size_t)(r - 2) * sizeof(int64_t)))
        return loom_ir_diag_set(d, BAD, "q %s and k %s need one rank >= 2 and equal leading axes",
                                ta, tb);
    if (k->shape[r - 1] != q->shape[r - 1])
        return loom_ir_diag_set(d, BAD, "q %s and k %s need one head size", ta, tb);
    int64_t S = k->shape[r - 2], Ev = 0;
    if (v) {
        TYPE(tb, v);
        if (v->dtype != q->dtype || v->rank != r ||
            memcmp(q->shape, v->shape, (size_t)(r - 2) * sizeof(int64_t)) || v->shape[r - 2] != S)
            return loom_ir_diag_set(d, BAD, "v %s must be [..., S, Ev] in q's dtype beside q %s",
                                    tb, ta);
        Ev = v->shape[r - 1];
    }
    if (dout) {
        TYPE(tb, dout);
        if (dout->dtype != q->dtype || dout->rank != r ||
            memcmp(q->shape, dout->shape, (size_t)(r - 1) * sizeof(int64_t)) ||
            (v && dout->shape[r - 1] != Ev))
            return loom_ir_diag_set(d, BAD,
                                    "the output gradient %s must have the output's type ([..., "
                                    "L, Ev] in q's dtype) beside q %s",
                                    tb, ta);
        Ev = dout->shape[r - 1];
    }
    const loom_ir_node *stats[2] = {lse, delta};
    for (int i = 0; i < 2; i++) {
        if (!stats[i])
            continue;
        TYPE(tb, stats[i]);
        if (stats[i]->dtype != LOOM_DTYPE_F32 || stats[i]->rank != r - 1 ||
            memcmp(q->shape, stats[i]->shape, (size_t)(r - 1) * sizeof(int64_t)))
            return loom_ir_diag_set(d, BAD, "%s %s must be f32 [..., L] beside q %s",
                                    i ? "delta" : "lse", tb, ta);
    }
    if (desc->n_inputs > at_mask) { /* the mask: bool or q's dtype, to [..., L, S] */
        const loom_ir_node *m = in[at_mask];
        TYPE(tb, m);
        if (desc->attrs.index)
            return loom_ir_diag_set(d, BAD, "a mask %s and causal exclude each other", tb);
        bool fits = (m->dtype == LOOM_DTYPE_BOOL || m->dtype == q->dtype) && m->rank <= r;
        for (int32_t i = 0; fits && i < m->rank; i++) {
            int64_t want = i == m->rank - 1   ? S
                           : i == m->rank - 2 ? q->shape[r - 2]
                                              : q->shape[r - m->rank + i];
            fits = m->shape[i] == 1 || m->shape[i] == want;
        }
        if (!fits)
            return loom_ir_diag_set(d, BAD,
                                    "the mask %s must be bool or q's dtype and broadcast to the "
                                    "scores [..., L, S] of q %s and k %s",
                                    tb, ta,
                                    loom_ir_format_type(tc, sizeof tc, k->dtype, r, k->shape));
    }
    *out_rank = r;
    memcpy(out_shape, q->shape, (size_t)r * sizeof(int64_t));
    *out_dtype = q->dtype;
    if (op == LOOM_IR_OP_ATTENTION) {
        out_shape[r - 1] = Ev;
    } else if (op == LOOM_IR_OP_ATTENTION_LSE) {
        *out_rank = r - 1;
        *out_dtype = LOOM_DTYPE_F32;
    } else if (op == LOOM_IR_OP_ATTENTION_GRAD_K || grad_v) {
        out_shape[r - 2] = S;
        if (grad_v)
            out_shape[r - 1] = Ev;
    }
    return LOOM_OK;
}

/* max_pool2d and its gradient: x [N,C,H,W] and the window; the gradient's dy must have the
 * pooled shape. Padding at most half the kernel keeps every window on a pixel of x. */
static loom_status infer_pool(const loom_ir_node_desc *desc, const loom_ir_node *const *in,
                              loom_dtype *out_dtype, int32_t *out_rank, int64_t *out_shape,
                              loom_ir_diag *d) {
    const loom_status BAD = LOOM_STATUS_INVALID_ARGUMENT;
    const loom_ir_conv *cv = &desc->attrs.conv;
    char tx[LOOM_IR_TYPE_STR_MAX], ty[LOOM_IR_TYPE_STR_MAX];
    TYPE(tx, in[0]);
    if (in[0]->rank != 4)
        return loom_ir_diag_set(d, BAD, "needs a rank-4 (NCHW) x, got %s", tx);
    for (int i = 0; i < 2; i++)
        if (cv->kernel[i] < 1 || cv->kernel[i] > INT32_MAX || cv->stride[i] < 1 ||
            cv->stride[i] > INT32_MAX || cv->dilation[i] < 1 || cv->dilation[i] > INT32_MAX ||
            cv->padding[i] < 0 || 2 * cv->padding[i] > (cv->kernel[i] - 1) * cv->dilation[i] + 1)
            return loom_ir_diag_set(
                d, BAD,
                "kernel [%lld, %lld], stride [%lld, %lld] and dilation "
                "[%lld, %lld] must be in 1..%d, padding [%lld, %lld] in 0.."
                "half the dilated kernel",
                (long long)cv->kernel[0], (long long)cv->kernel[1], (long long)cv->stride[0],
                (long long)cv->stride[1], (long long)cv->dilation[0], (long long)cv->dilation[1],
                INT32_MAX, (long long)cv->padding[0], (long long)cv->padding[1]);
    if (cv->kernel[0] * cv->kernel[1] > LOOM_IR_POOL_TAPS_MAX)
        return loom_ir_diag_set(d, BAD, "a %lldx%lld window has more than %d taps",
                                (long long)cv->kernel[0], (long long)cv->kernel[1],
                                LOOM_IR_POOL_TAPS_MAX);
    int64_t ys[4] = {in[0]->shape[0], in[0]->shape[1], 0, 0};
    for (int i = 0; i < 2; i++) {
        ys[2 + i] = loom_ir_conv_out_extent(in[0]->shape[2 + i], cv->kernel[i], cv->stride[i],
                                            cv->padding[i], cv->dilation[i]);
        if (ys[2 + i] < 1)
            return loom_ir_diag_set(d, BAD,
                                    "the %lldx%lld window (dilation [%lld, %lld]) does not fit "
                                    "x %s padded by [%lld, %lld]: the output would be empty",
                                    (long long)cv->kernel[0], (long long)cv->kernel[1],
                                    (long long)cv->dilation[0], (long long)cv->dilation[1], tx,
                                    (long long)cv->padding[0], (long long)cv->padding[1]);
    }
    *out_dtype = in[0]->dtype;
    *out_rank = 4;
    if (desc->op == LOOM_IR_OP_MAX_POOL2D) {
        memcpy(out_shape, ys, sizeof ys);
        loom_ir_node_desc res = {.rank = 4, .shape = out_shape};
        return check_shape(&res, d);
    }
    TYPE(ty, in[1]);
    if (in[1]->dtype != in[0]->dtype || in[1]->rank != 4 ||
        memcmp(in[1]->shape, ys, sizeof ys) != 0) {
        char tp[LOOM_IR_TYPE_STR_MAX];
        loom_ir_format_type(tp, sizeof tp, in[0]->dtype, 4, ys);
        return loom_ir_diag_set(d, BAD, "dy %s must be the pooled %s of x %s", ty, tp, tx);
    }
    memcpy(out_shape, in[0]->shape, sizeof ys);
    return LOOM_OK;
}

loom_status loom_ir_infer(const loom_ir_graph *g, const loom_ir_node_desc *desc,
                          loom_dtype *out_dtype, int32_t *out_rank, int64_t *out_shape,
                          loom_ir_diag *d) {
    const loom_status BAD = LOOM_STATUS_INVALID_ARGUMENT;
    if ((unsigned)desc->op >= LOOM_IR_OP_COUNT_)
        return loom_ir_diag_set(d, BAD, "unknown op %d", (int)desc->op);
    const loom_ir_op_info *info = &loom_ir_op_table[desc->op];
    if (info->arity >= 0 && desc->n_inputs != info->arity)
        return loom_ir_diag_set(d, BAD, "expects %d operand%s, got %d", (int)info->arity,
                                info->arity == 1 ? "" : "s", (int)desc->n_inputs);
    if (desc->n_inputs > 0 && !desc->inputs)
        return loom_ir_diag_set(d, BAD, "operand list is NULL");
    enum { IN_MAX = LOOM_IR_ROLE_OPERANDS_MAX };
    const loom_ir_node *in[IN_MAX] = {NULL};
    for (int32_t k = 0; k < desc->n_inputs; k++) {
        int32_t id = desc->inputs[k];
        if (id < 0 || id >= g->n_nodes)
            return loom_ir_diag_set(d, BAD, "operand %d refers to %%%d, which does not exist",
                                    (int)k, (int)id);
        if (k < IN_MAX)
            in[k] = &g->nodes[id];
    }
    /* operand dtype class (select's condition is checked below, attention's seed by its rule) */
    int32_t n_classed = info->kind == LOOM_IR_KIND_ATTENTION ? loom_ir_attention_operands(desc->op)
                                                             : desc->n_inputs;
    for (int32_t k = loom_ir_kind_table[info->kind].cond_first ? 1 : 0;
         k < desc->n_inputs && k < n_classed && k < IN_MAX; k++) {
        if (!loom_ir_dtype_in_class(in[k]->dtype, info->dtypes)) {
            char t[LOOM_IR_TYPE_STR_MAX];
            return loom_ir_diag_set(
                d, BAD, "operand %d has dtype %s; %s needs %s", (int)k, TYPE(t, in[k]), info->name,
                info->dtypes == LOOM_IR_DT_FLOAT ? "a float dtype" : "a numeric dtype");
        }
    }
    char ta[LOOM_IR_TYPE_STR_MAX], tb[LOOM_IR_TYPE_STR_MAX], tc[LOOM_IR_TYPE_STR_MAX];
    loom_status st;
    loom_dtype ac = desc->attrs.autocast;
    if (ac != LOOM_DTYPE_F32 && ac != LOOM_DTYPE_BF16 && ac != LOOM_DTYPE_F16)
        return loom_ir_diag_set(d, BAD, "autocast dtype %s is not bf16 or f16",
                                loom_ir_dtype_valid(ac) ? loom_dtype_name(ac) : "(invalid)");
    switch (info->kind) {
    case LOOM_IR_KIND_SOURCE:
        if (!loom_ir_dtype_valid(desc->dtype))
            return loom_ir_diag_set(d, BAD, "dtype %d is not a valid dtype", (int)desc->dtype);
        if ((st = check_shape(desc, d)) != LOOM_OK)
            return st;
        if (info->attrs == LOOM_IR_ATTRS_INDEX &&
            (desc->attrs.index < 0 || desc->attrs.index >= INT32_MAX))
            return loom_ir_diag_set(d, BAD, "input index %lld is out of range",
                                    (long long)desc->attrs.index);
        set_desc_type(desc, desc->dtype, out_rank, out_shape, out_dtype);
        return LOOM_OK;
    case LOOM_IR_KIND_UNARY: copy_type(in[0], out_dtype, out_rank, out_shape); return LOOM_OK;
    case LOOM_IR_KIND_PREDICATE:
        copy_type(in[0], out_dtype, out_rank, out_shape);
        *out_dtype = LOOM_DTYPE_BOOL;
        return LOOM_OK;
    case LOOM_IR_KIND_BINARY:
    case LOOM_IR_KIND_COMPARE:
        if (in[0]->dtype != in[1]->dtype)
            return loom_ir_diag_set(d, BAD, "dtypes differ: %s vs %s", TYPE(ta, in[0]),
                                    TYPE(tb, in[1]));
        if (!loom_ir_same_shape(in[0], in[1]))
            return loom_ir_diag_set(d, BAD, "shapes differ: %s vs %s", TYPE(ta, in[0]),
                                    TYPE(tb, in[1]));
        copy_type(in[0], out_dtype, out_rank, out_shape);
        if (loom_ir_kind_table[info->kind].bool_out)
            *out_dtype = LOOM_DTYPE_BOOL;
        return LOOM_OK;
    case LOOM_IR_KIND_SELECT:
        if (in[0]->dtype != LOOM_DTYPE_BOOL)
            return loom_ir_diag_set(d, BAD, "condition must be bool, got %s", TYPE(ta, in[0]));
        if (in[1]->dtype != in[2]->dtype)
            return loom_ir_diag_set(d, BAD, "dtypes differ: %s vs %s", TYPE(tb, in[1]),
                                    TYPE(tc, in[2]));
        if (!loom_ir_same_shape(in[0], in[1]) || !loom_ir_same_shape(in[1], in[2]))
            return loom_ir_diag_set(d, BAD, "shapes differ: %s, %s, %s", TYPE(ta, in[0]),
                                    TYPE(tb, in[1]), TYPE(tc, in[2]));
        copy_type(in[1], out_dtype, out_rank, out_shape);
        return LOOM_OK;
    case LOOM_IR_KIND_CAST:
        if (!loom_ir_dtype_valid(desc->dtype))
            return loom_ir_diag_set(d, BAD, "target dtype %d is not a valid dtype",
                                    (int)desc->dtype);
        copy_type(in[0], out_dtype, out_rank, out_shape);
        *out_dtype = desc->dtype;
        return LOOM_OK;
    case LOOM_IR_KIND_BROADCAST: {
        if ((st = check_shape(desc, d)) != LOOM_OK)
            return st;
        if (desc->rank < in[0]->rank)
            goto bad_broadcast;
        int32_t off = desc->rank - in[0]->rank;
        for (int32_t i = 0; i < in[0]->rank; i++)
            if (in[0]->shape[i] != 1 && in[0]->shape[i] != desc->shape[off + i])
                goto bad_broadcast;
        set_desc_type(desc, in[0]->dtype, out_rank, out_shape, out_dtype);
        return LOOM_OK;
    bad_broadcast:
        return loom_ir_diag_set(
            d, BAD, "cannot broadcast %s to %s", TYPE(ta, in[0]),
            loom_ir_format_type(tb, sizeof tb, in[0]->dtype, desc->rank, desc->shape));
    }
    case LOOM_IR_KIND_RESHAPE:
        if ((st = check_shape(desc, d)) != LOOM_OK)
            return st;
        if (loom_ir_numel(desc->rank, desc->shape) != loom_ir_numel(in[0]->rank, in[0]->shape))
            return loom_ir_diag_set(
                d, BAD, "cannot reshape %s to %s: element counts differ", TYPE(ta, in[0]),
                loom_ir_format_type(tb, sizeof tb, in[0]->dtype, desc->rank, desc->shape));
        set_desc_type(desc, in[0]->dtype, out_rank, out_shape, out_dtype);
        return LOOM_OK;
    case LOOM_IR_KIND_TRANSPOSE: {
        uint32_t seen = 0;
        for (int32_t i = 0; i < in[0]->rank; i++) {
            int32_t p = desc->attrs.perm[i];
            if (p < 0 || p >= in[0]->rank || (seen & (1u << p)))
                return loom_ir_diag_set(d, BAD, "perm is not a permutation of the %d axes of %s",
                                        (int)in[0]->rank, TYPE(ta, in[0]));
            seen |= 1u << p;
        }
        *out_dtype = in[0]->dtype;
        *out_rank = in[0]->rank;
        for (int32_t i = 0; i < in[0]->rank; i++)
            out_shape[i] = in[0]->shape[desc->attrs.perm[i]];
        return LOOM_OK;
    }
    case LOOM_IR_KIND_REDUCTION: {
        uint32_t axes = desc->attrs.axes;
        if (axes >> in[0]->rank)
            return loom_ir_diag_set(d, BAD, "reduction axes 0x%x are out of range for %s",
                                    (unsigned)axes, TYPE(ta, in[0]));
        *out_dtype = in[0]->dtype;
        int32_t r = 0;
        for (int32_t i = 0; i < in[0]->rank; i++) {
            if (axes & (1u << i)) {
                if (desc->attrs.keepdim)
                    out_shape[r++] = 1;
            } else {
                out_shape[r++] = in[0]->shape[i];
            }
        }
        *out_rank = r;
        return LOOM_OK;
    }
    case LOOM_IR_KIND_CONTRACTION: {
        const loom_ir_node *a = in[0], *b = in[1];
        if (a->dtype != b->dtype)
            return loom_ir_diag_set(d, BAD, "dtypes differ: %s x %s", TYPE(ta, a), TYPE(tb, b));
        if (a->rank < 2 || a->rank != b->rank)
            return loom_ir_diag_set(d, BAD, "operands need equal ranks >= 2: %s x %s", TYPE(ta, a),
                                    TYPE(tb, b));
        int32_t r = a->rank;
        for (int32_t i = 0; i < r - 2; i++)
            if (a->shape[i] != b->shape[i])
                return loom_ir_diag_set(d, BAD, "batch dimensions differ: %s x %s", TYPE(ta, a),
                                        TYPE(tb, b));
        if (a->shape[r - 1] != b->shape[r - 2])
            return loom_ir_diag_set(d, BAD, "inner dimensions differ: %s x %s", TYPE(ta, a),
                                    TYPE(tb, b));
        copy_type(a, out_dtype, out_rank, out_shape);
        out_shape[r - 1] = b->shape[r - 1];
        loom_ir_node_desc res = {.rank = r, .shape = out_shape};
        if ((st = check_shape(&res, d)) != LOOM_OK)
            return st;
        return LOOM_OK;
    }
    case LOOM_IR_KIND_SLICE: {
        const loom_ir_node *x = in[0];
        if ((st = check_shape(desc, d)) != LOOM_OK)
            return st;
        if (desc->rank != x->rank)
            return loom_ir_diag_set(d, BAD, "sizes have %d entries, but the operand %s has rank %d",
                                    (int)desc->rank, TYPE(ta, x), (int)x->rank);
        for (int32_t i = 0; i < x->rank; i++) {
            int64_t start = desc->attrs.start[i], stride = desc->attrs.step[i];
            int64_t size = desc->shape[i], ext = x->shape[i];
            if (stride < 1)
                return loom_ir_diag_set(d, BAD, "stride %lld of axis %d must be >= 1",
                                        (long long)stride, (int)i);
            /* start + stride * (size - 1) < ext, without overflow; size 0 needs start <= ext */
            bool ok = start >= 0 && start <= ext &&
                      (size == 0 || (start < ext && size - 1 <= (ext - 1 - start) / stride));
            if (!ok)
                return loom_ir_diag_set(d, BAD,
                                        "axis %d: start %lld, size %lld, stride %lld reach "
                                        "outside extent %lld of %s",
                                        (int)i, (long long)start, (long long)size,
                                        (long long)stride, (long long)ext, TYPE(ta, x));
        }
        set_desc_type(desc, x->dtype, out_rank, out_shape, out_dtype);
        return LOOM_OK;
    }
    case LOOM_IR_KIND_PAD: {
        const loom_ir_node *x = in[0];
        if ((st = check_shape(desc, d)) != LOOM_OK)
            return st;
        if (desc->rank != x->rank)
            return loom_ir_diag_set(d, BAD, "result has rank %d, but the operand %s has rank %d",
                                    (int)desc->rank, TYPE(ta, x), (int)x->rank);
        for (int32_t i = 0; i < x->rank; i++) {
            int64_t low = desc->attrs.start[i], interior = desc->attrs.step[i];
            int64_t out = desc->shape[i], ext = x->shape[i];
            if (low < 0 || interior < 0)
                return loom_ir_diag_set(d, BAD, "axis %d: %s %lld is negative", (int)i,
                                        low < 0 ? "low" : "interior",
                                        (long long)(low < 0 ? low : interior));
            /* high = out - low - (ext - 1) * (interior + 1) - 1 (ext > 0) must be >= 0 */
            bool ok = low <= out &&
                      (ext == 0 || (out - low >= 1 && ext - 1 <= (out - low - 1) / (interior + 1)));
            if (!ok)
                return loom_ir_diag_set(d, BAD,
                                        "axis %d: extent %lld of %s with low %lld and interior "
                                        "%lld does not fit in %lld (the high side would be "
                                        "negative)",
                                        (int)i, (long long)ext, TYPE(ta, x), (long long)low,
                                        (long long)interior, (long long)out);
        }
        set_desc_type(desc, x->dtype, out_rank, out_shape, out_dtype);
        return LOOM_OK;
    }
    case LOOM_IR_KIND_CONCAT: {
        if (desc->n_inputs < 1)
            return loom_ir_diag_set(d, BAD, "expects at least 1 operand, got %d",
                                    (int)desc->n_inputs);
        const loom_ir_node *x = in[0];
        int64_t axis = desc->attrs.index;
        if (x->rank < 1 || axis < 0 || axis >= x->rank)
            return loom_ir_diag_set(d, BAD, "axis %lld is out of range for %s", (long long)axis,
                                    TYPE(ta, x));
        copy_type(x, out_dtype, out_rank, out_shape);
        for (int32_t k = 1; k < desc->n_inputs; k++) {
            const loom_ir_node *y = &g->nodes[desc->inputs[k]];
            bool same = y->dtype == x->dtype && y->rank == x->rank;
            for (int32_t i = 0; same && i < x->rank; i++)
                same = i == axis || y->shape[i] == x->shape[i];
            if (!same)
                return loom_ir_diag_set(d, BAD,
                                        "operand %d is %s, operand 0 is %s: dtypes, ranks and "
                                        "every extent but axis %lld must match",
                                        (int)k, TYPE(tb, y), TYPE(ta, x), (long long)axis);
            if (y->shape[axis] > INT64_MAX / 16 - out_shape[axis])
                return loom_ir_diag_set(d, BAD, "shape has too many elements");
            out_shape[axis] += y->shape[axis];
        }
        loom_ir_node_desc res = {.rank = *out_rank, .shape = out_shape};
        return check_shape(&res, d);
    }
    case LOOM_IR_KIND_IOTA:
        if (!loom_ir_dtype_in_class(desc->dtype, LOOM_IR_DT_NUM))
            return loom_ir_diag_set(d, BAD, "dtype %s is not a numeric dtype",
                                    loom_dtype_name(desc->dtype));
        if ((st = check_shape(desc, d)) != LOOM_OK)
            return st;
        if (desc->attrs.index < 0 || desc->attrs.index >= desc->rank)
            return loom_ir_diag_set(d, BAD, "axis %lld is out of range for rank %d",
                                    (long long)desc->attrs.index, (int)desc->rank);
        set_desc_type(desc, desc->dtype, out_rank, out_shape, out_dtype);
        return LOOM_OK;
    case LOOM_IR_KIND_RAND:
        if (in[0]->dtype != LOOM_DTYPE_I64 || in[0]->rank != 0)
            return loom_ir_diag_set(d, BAD, "seed must be i64[], got %s", TYPE(ta, in[0]));
        if (!loom_ir_dtype_valid(desc->dtype) || !loom_ir_dtype_is_float(desc->dtype))
            return loom_ir_diag_set(d, BAD, "dtype %s is not a float dtype",
                                    loom_dtype_name(desc->dtype));
        if ((st = check_shape(desc, d)) != LOOM_OK)
            return st;
        set_desc_type(desc, desc->dtype, out_rank, out_shape, out_dtype);
        return LOOM_OK;
    case LOOM_IR_KIND_COLLECTIVE: {
        const loom_ir_node *x = in[0];
        copy_type(x, out_dtype, out_rank, out_shape);
        int64_t a = desc->attrs.index;
        if (desc->op == LOOM_IR_OP_ALL_REDUCE) {
            double scale = desc->attrs.value;
            if (a < 0 || a >= LOOM_REDUCE_COUNT_)
                return loom_ir_diag_set(d, BAD, "reduce op %lld is not sum, max or min",
                                        (long long)a);
            if (!isfinite(scale))
                return loom_ir_diag_set(d, BAD, "scale %g is not finite", scale);
            if (x->dtype == LOOM_DTYPE_BOOL && a == LOOM_REDUCE_SUM)
                return loom_ir_diag_set(d, BAD, "a sum of %s is not defined (use max or min)",
                                        TYPE(ta, x));
            if (!loom_ir_dtype_is_float(x->dtype) && scale != 1.0)
                return loom_ir_diag_set(d, BAD, "scale %g on %s: only float dtypes scale", scale,
                                        TYPE(ta, x));
            return LOOM_OK;
        }
        if (desc->op == LOOM_IR_OP_BROADCAST_FROM) {
            if (a < 0 || a > INT32_MAX)
                return loom_ir_diag_set(d, BAD, "root rank %lld is out of range", (long long)a);
            return LOOM_OK;
        }
        /* all_gather: the world size is an attribute, as shapes are static */
        if (a < 1 || a > INT32_MAX)
            return loom_ir_diag_set(d, BAD, "world size %lld is out of range (>= 1)", (long long)a);
        if (x->rank < 1)
            return loom_ir_diag_set(d, BAD, "gathers along axis 0, but the operand %s is a scalar",
                                    TYPE(ta, x));
        if (x->shape[0] > 0 && a > INT64_MAX / 16 / x->shape[0])
            return loom_ir_diag_set(d, BAD, "shape has too many elements");
        out_shape[0] = x->shape[0] * a;
        loom_ir_node_desc res = {.rank = *out_rank, .shape = out_shape};
        return check_shape(&res, d);
    }
    case LOOM_IR_KIND_CONV: return infer_conv(desc, in, out_dtype, out_rank, out_shape, d);
    case LOOM_IR_KIND_POOL: return infer_pool(desc, in, out_dtype, out_rank, out_shape, d);
    case LOOM_IR_KIND_GATHER:
    case LOOM_IR_KIND_SCATTER: return infer_index(desc, in, out_dtype, out_rank, out_shape, d);
    case LOOM_IR_KIND_ATTENTION:
        return infer_attention(desc, in, out_dtype, out_rank, out_shape, d);
    case LOOM_IR_KIND_COUNT_: break;
    }
    return loom_ir_diag_set(d, LOOM_STATUS_INTERNAL, "op %s has no inference rule", info->name);
}
