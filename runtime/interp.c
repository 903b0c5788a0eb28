/* The reference interpreter: runs an IR graph node by node with plain C loops. It is the
 * oracle that every compiled kernel is tested against, so clarity beats speed here. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "collective.h"
#include "interp_attention.h"
#include "runtime.h"

/* ---- index helpers ------------------------------------------------------------------------ */

static void row_major_strides(int32_t rank, const int64_t *shape, int64_t *strides) {
    int64_t s = 1;
    for (int32_t i = rank - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i];
    }
}

/* Advances a row-major multi-index over `ext` by one (the last axis fastest). */
static void next_index(int32_t rank, const int64_t *ext, int64_t *idx) {
    for (int32_t i = rank - 1; i >= 0; i--) {
        if (++idx[i] < ext[i])
            return;
        idx[i] = 0;
    }
}

/* Per node while interpreting. */
typedef struct slot {
    void *data;       /* the node's value: a temporary, or the caller's input */
    size_t bytes;     /* the temporary's size (0 when not owned) */
    int32_t last_use; /* the last node that reads it; INT32_MAX for outputs; -1 if dead */
    bool owned;       /* allocated here (not the caller's input) */
} slot;

/* ---- kernels ------------------------------------------------------------------------------
 * `n` is the node, `x[k]` its operand nodes, `src[k]` their values, `dst` its buffer. What
 * an elementwise op computes per element is ir/scalar.c's rule, shared with constant folding. */

static loom_status internal_error(const loom_ir_node *n, loom_ir_diag *d) {
    char t[LOOM_IR_TYPE_STR_MAX];
    return loom_ir_diag_set(d, LOOM_STATUS_INTERNAL, "interp: %s has no kernel for %s",
                            loom_ir_op_name(n->op),
                            loom_ir_format_type(t, sizeof t, n->dtype, n->rank, n->shape));
}

/* Unary and binary arithmetic: operands and result of the node's dtype. A unary rule ignores
 * its second argument, so it gets the first operand again (a == b). */
static loom_status run_arith(const loom_ir_node *n, const void *a, const void *b, void *dst,
                             loom_ir_diag *d) {
    int64_t count = loom_ir_numel(n->rank, n->shape);
    loom_dtype dt = n->dtype;
    loom_ir_scalar_f64_fn f = loom_ir_scalar_rule_f64(n->op);
    loom_ir_scalar_i64_fn fi = loom_ir_scalar_rule_i64(n->op);
    if (loom_ir_dtype_is_float(dt) && f) {
        for (int64_t i = 0; i < count; i++)
            loom_ir_store_f64(dst, dt, i,
                              f(loom_ir_load_f64(a, dt, i), loom_ir_load_f64(b, dt, i)));
        return LOOM_OK;
    }
    if (loom_ir_dtype_is_int(dt) && fi) {
        for (int64_t i = 0; i < count; i++)
            loom_ir_store_i64(dst, dt, i,
                              fi(loom_ir_load_i64(a, dt, i), loom_ir_load_i64(b, dt, i)));
        return LOOM_OK;
    }
    return internal_error(n, d);
}

/* Compares and predicates: operands of dtype `dt` (bool compares as 0/1 on the integer
 * path), bool result. A predicate has one operand: b is a again, as in run_arith. */
static loom_status run_test(const loom_ir_node *n, loom_dtype dt, const void *a, const void *b,
                            void *dst, loom_ir_diag *d) {
    int64_t count = loom_ir_numel(n->rank, n->shape);
    uint8_t *out = dst;
    if (loom_ir_dtype_is_float(dt)) {
        loom_ir_scalar_f64_fn f = loom_ir_scalar_rule_f64(n->op);
        if (!f)
            return internal_error(n, d);
        for (int64_t i = 0; i < count; i++)
            out[i] = f(loom_ir_load_f64(a, dt, i), loom_ir_load_f64(b, dt, i)) != 0.0;
        return LOOM_OK;
    }
    loom_ir_scalar_i64_fn fi = loom_ir_scalar_rule_i64(n->op);
    if (!fi)
        return internal_error(n, d);
    for (int64_t i = 0; i < count; i++)
        out[i] = fi(loom_ir_load_i64(a, dt, i), loom_ir_load_i64(b, dt, i)) != 0;
    return LOOM_OK;
}

static void run_select(const loom_ir_node *n, const void *cond, const void *a, const void *b,
                       void *dst) {
    int64_t count = loom_ir_numel(n->rank, n->shape);
    size_t es = loom_dtype_size(n->dtype);
    const uint8_t *c = cond;
    for (int64_t i = 0; i < count; i++)
        memcpy((char *)dst + (size_t)i * es, (const char *)(c[i] ? a : b) + (size_t)i * es, es);
}

/* Floats go through double (float -> int truncates toward zero and saturates, NaN -> 0;
 * -> bool is != 0), integers and bool through int64 (narrowing wraps). */
static void run_cast(const loom_ir_node *n, loom_dtype from, const void *src, void *dst) {
    int64_t count = loom_ir_numel(n->rank, n->shape);
    if (loom_ir_dtype_is_float(from)) {
        for (int64_t i = 0; i < count; i++)
            loom_ir_store_f64(dst, n->dtype, i, loom_ir_load_f64(src, from, i));
    } else {
        for (int64_t i = 0; i < count; i++)
            loom_ir_store_i64(dst, n->dtype, i, loom_ir_load_i64(src, from, i));
    }
}

static void run_constant(const loom_ir_node *n, void *dst) {
    int64_t count = loom_ir_numel(n->rank, n->shape);
    for (int64_t i = 0; i < count; i++)
        loom_ir_store_f64(dst, n->dtype, i, n->attrs.value);
}

/* Result element idx (row-major over n's shape) is operand element base + sum_i idx[i] *
 * stride[i]: every movement op that reads its operand at an affine index. */
static void gather(const loom_ir_node *n, const void *src, void *dst, int64_t base,
                   const int64_t *stride) {
    int64_t count = loom_ir_numel(n->rank, n->shape);
    size_t es = loom_dtype_size(n->dtype);
    int64_t idx[LOOM_MAX_RANK] = {0};
    for (int64_t e = 0; e < count; e++) {
        int64_t s = base;
        for (int32_t i = 0; i < n->rank; i++)
            s += idx[i] * stride[i];
        memcpy((char *)dst + (size_t)e * es, (const char *)src + (size_t)s * es, es);
        next_index(n->rank, n->shape, idx);
    }
}

/* numpy broadcast: the operand's axes align with the result's last axes; an operand
 * extent of 1 repeats along that axis. */
static void run_broadcast(const loom_ir_node *n, const loom_ir_node *x, const void *src,
                          void *dst) {
    int64_t xstride[LOOM_MAX_RANK], stride[LOOM_MAX_RANK] = {0};
    row_major_strides(x->rank, x->shape, xstride);
    int32_t off = n->rank - x->rank;
    for (int32_t i = 0; i < x->rank; i++)
        stride[off + i] = x->shape[i] != 1 ? xstride[i] : 0;
    gather(n, src, dst, 0, stride);
}

/* Result axis i is operand axis perm[i]. */
static void run_transpose(const loom_ir_node *n, const loom_ir_node *x, const void *src,
                          void *dst) {
    int64_t xstride[LOOM_MAX_RANK], stride[LOOM_MAX_RANK];
    row_major_strides(x->rank, x->shape, xstride);
    for (int32_t i = 0; i < n->rank; i++)
        stride[i] = xstride[n->attrs.perm[i]];
    gather(n, src, dst, 0, stride);
}

/* Result element idx is operand element start + stride * idx (per axis). */
static void run_slice(const loom_ir_node *n, const loom_ir_node *x, const void *src, void *dst) {
    int64_t xstride[LOOM_MAX_RANK], stride[LOOM_MAX_RANK], base = 0;
    row_major_strides(x->rank, x->shape, xstride);
    for (int32_t i = 0; i < n->rank; i++) {
        base += n->attrs.start[i] * xstride[i];
        stride[i] = n->attrs.step[i] * xstride[i];
    }
    gather(n, src, dst, base, stride);
}

/* Every element is the pad value (stored in the dtype, as a constant is), then operand
 * element idx goes to low + idx * (interior + 1) (per axis). */
static void run_pad(const loom_ir_node *n, const loom_ir_node *x, const void *src, void *dst) {
    int64_t count = loom_ir_numel(n->rank, n->shape), xcount = loom_ir_numel(x->rank, x->shape);
    size_t es = loom_dtype_size(n->dtype);
    for (int64_t e = 0; e < count; e++)
        loom_ir_store_f64(dst, n->dtype, e, n->attrs.value);
    int64_t ostride[LOOM_MAX_RANK], idx[LOOM_MAX_RANK] = {0};
    row_major_strides(n->rank, n->shape, ostride);
    for (int64_t e = 0; e < xcount; e++) {
        int64_t o = 0;
        for (int32_t i = 0; i < n->rank; i++)
            o += (n->attrs.start[i] + idx[i] * (n->attrs.step[i] + 1)) * ostride[i];
        memcpy((char *)dst + (size_t)o * es, (const char *)src + (size_t)e * es, es);
        next_index(x->rank, x->shape, idx);
    }
}

/* The extents of a gather's or scatter_add's data around its axis a: outer (before it), the
 * axis, inner (after it). */
static void index_extents(const loom_ir_node *n, const loom_ir_node *data, int64_t *outer,
                          int64_t *len, int64_t *inner) {
    int32_t a = (int32_t)n->attrs.index;
    *outer = loom_ir_numel(a, data->shape);
    *len = data->shape[a];
    *inner = loom_ir_numel(data->rank - a - 1, data->shape + a + 1);
}

/* Index e of idx, clamped into [0, len) (ops.def: never out of bounds). */
static int64_t index_at(const loom_ir_node *idx, const void *ix, int64_t e, int64_t len) {
    int64_t t = loom_ir_load_i64(ix, idx->dtype, e);
    return t < 0 ? 0 : t >= len ? len - 1 : t;
}

/* out[o, j, i] = x[o, idx[o, j, i], i]: an exact copy of x's element. */
static void run_gather(const loom_ir_node *n, const loom_ir_node *x, const loom_ir_node *idx,
                       const void *xd, const void *ix, void *dst) {
    int64_t outer, len, inner, J = idx->shape[n->attrs.index];
    index_extents(n, x, &outer, &len, &inner);
    size_t es = loom_dtype_size(n->dtype);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < J; j++)
            for (int64_t i = 0; i < inner; i++) {
                int64_t e = (o * J + j) * inner + i;
                int64_t from = (o * len + index_at(idx, ix, e, len)) * inner + i;
                memcpy((char *)dst + (size_t)e * es, (const char *)xd + (size_t)from * es, es);
            }
}

/* base plus src[o, j, i] at [o, idx[o, j, i], i], summed exactly (double, or wrapping int64)
 * and rounded once to the dtype. */
static loom_status run_scatter_add(const loom_ir_node *n, const loom_ir_node *const *x,
                                   const void *const *src, void *dst, const loom_allocator *a,
                                   loom_ir_diag *d) {
    const loom_ir_node *idx = x[1];
    int64_t outer, len, inner, J = idx->shape[n->attrs.index];
    index_extents(n, n, &outer, &len, &inner);
    int64_t count = loom_ir_numel(n->rank, n->shape);
    bool fl = loom_ir_dtype_is_float(n->dtype);
    size_t bytes = (size_t)(count > 0 ? count : 1) * sizeof(double);
    double *facc = fl ? loom_ir_alloc(a, bytes) : NULL;
    int64_t *iacc = fl ? NULL : loom_ir_alloc(a, bytes);
    if (!facc && !iacc) {
        char t[LOOM_IR_TYPE_STR_MAX];
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                                "interp: out of memory for the sums of scatter_add : %s",
                                loom_ir_format_type(t, sizeof t, n->dtype, n->rank, n->shape));
    }
    loom_ir_scalar_i64_fn add_i = loom_ir_scalar_rule_i64(LOOM_IR_OP_ADD); /* wrapping */
    for (int64_t e = 0; e < count; e++) {
        if (fl)
            facc[e] = loom_ir_load_f64(src[0], n->dtype, e);
        else
            iacc[e] = loom_ir_load_i64(src[0], n->dtype, e);
    }
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < J; j++)
            for (int64_t i = 0; i < inner; i++) {
                int64_t e = (o * J + j) * inner + i;
                int64_t to = (o * len + index_at(idx, src[1], e, len)) * inner + i;
                if (fl)
                    facc[to] += loom_ir_load_f64(src[2], n->dtype, e);
                else
                    iacc[to] = add_i(iacc[to], loom_ir_load_i64(src[2], n->dtype, e));
            }
    for (int64_t e = 0; e < count; e++) {
        if (fl)
            loom_ir_store_f64(dst, n->dtype, e, facc[e]);
        else
            loom_ir_store_i64(dst, n->dtype, e, iacc[e]);
    }
    loom_ir_free(a, fl ? (void *)facc : (void *)iacc, bytes);
    return LOOM_OK;
}

/* For each index of the axes before `axis` (outer), the operands' blocks follow each other:
 * operand k contributes its extent along axis times the extents after it. */
static void run_concat(const loom_ir_graph *g, const loom_ir_node *n, const slot *srcs, void *dst) {
    int32_t axis = (int32_t)n->attrs.index;
    size_t es = loom_dtype_size(n->dtype);
    int64_t outer = loom_ir_numel(axis, n->shape);
    int64_t inner = loom_ir_numel(n->rank - axis - 1, n->shape + axis + 1);
    int64_t row = n->shape[axis] * inner; /* elements of the result per outer index */
    int64_t at = 0;                       /* where operand k starts inside a row */
    for (int32_t k = 0; k < n->n_inputs; k++) {
        const loom_ir_node *x = &g->nodes[n->inputs[k]];
        int64_t chunk = x->shape[axis] * inner;
        for (int64_t o = 0; o < outer && chunk > 0; o++)
            memcpy((char *)dst + (size_t)(o * row + at) * es,
                   (const char *)srcs[n->inputs[k]].data + (size_t)(o * chunk) * es,
                   (size_t)chunk * es);
        at += chunk;
    }
}

/* Element e's index along `axis` (row-major), as an integer or a float of the dtype. */
static void run_iota(const loom_ir_node *n, void *dst) {
    int64_t count = loom_ir_numel(n->rank, n->shape);
    int32_t axis = (int32_t)n->attrs.index;
    int64_t inner = loom_ir_numel(n->rank - axis - 1, n->shape + axis + 1);
    for (int64_t e = 0; e < count; e++) {
        int64_t v = (e / inner) % n->shape[axis];
        if (loom_ir_dtype_is_float(n->dtype))
            loom_ir_store_f64(dst, n->dtype, e, (double)v);
        else
            loom_ir_store_i64(dst, n->dtype, e, v);
    }
}

/* ir/scalar.c's counter-based generator at every row-major index. */
static void run_rand_uniform(const loom_ir_node *n, const void *seed, void *dst) {
    int64_t count = loom_ir_numel(n->rank, n->shape);
    int64_t s = loom_ir_load_i64(seed, LOOM_DTYPE_I64, 0);
    for (int64_t e = 0; e < count; e++)
        loom_ir_store_f64(dst, n->dtype, e, loom_ir_rand_uniform(s, e));
}

/* Reductions: for each result element (the kept axes in row-major order; keepdim only
 * inserts extents of 1, which does not change that order), walk the reduced axes.
 * Floats accumulate in double, integers in int64 (wrapping). */
static loom_status run_reduce(const loom_ir_node *n, const loom_ir_node *x, const void *src,
                              void *dst, loom_ir_diag *d) {
    loom_dtype dt = x->dtype;
    int64_t xstride[LOOM_MAX_RANK];
    row_major_strides(x->rank, x->shape, xstride);
    int64_t kext[LOOM_MAX_RANK], kstride[LOOM_MAX_RANK], rext[LOOM_MAX_RANK],
        rstride[LOOM_MAX_RANK];
    int32_t nk = 0, nr = 0;
    for (int32_t i = 0; i < x->rank; i++) {
        if (n->attrs.axes & (1u << i)) {
            rext[nr] = x->shape[i];
            rstride[nr++] = xstride[i];
        } else {
            kext[nk] = x->shape[i];
            kstride[nk++] = xstride[i];
        }
    }
    int64_t n_out = loom_ir_numel(nk, kext), n_red = loom_ir_numel(nr, rext);
    loom_ir_scalar_i64_fn add_i = loom_ir_scalar_rule_i64(LOOM_IR_OP_ADD); /* wrapping */
    bool is_float = loom_ir_dtype_is_float(dt);
    if (!is_float && !loom_ir_dtype_is_int(dt))
        return internal_error(n, d);
    if (n->op == LOOM_IR_OP_REDUCE_MEAN && !is_float)
        return internal_error(n, d);
    /* the smallest value of the dtype: the identity of max (INT32_MIN for i32, since
     * storing INT64_MIN into an i32 would wrap to 0) */
    int64_t imin = dt == LOOM_DTYPE_I32 ? INT32_MIN : INT64_MIN;
    int64_t kidx[LOOM_MAX_RANK] = {0};
    for (int64_t o = 0; o < n_out; o++) {
        int64_t base = 0;
        for (int32_t j = 0; j < nk; j++)
            base += kidx[j] * kstride[j];
        int64_t ridx[LOOM_MAX_RANK] = {0};
        double facc = n->op == LOOM_IR_OP_REDUCE_MAX ? -INFINITY : 0.0;
        int64_t iacc = n->op == LOOM_IR_OP_REDUCE_MAX ? imin : 0;
        for (int64_t r = 0; r < n_red; r++) {
            int64_t s = base;
            for (int32_t j = 0; j < nr; j++)
                s += ridx[j] * rstride[j];
            if (is_float) {
                double v = loom_ir_load_f64(src, dt, s);
                if (n->op != LOOM_IR_OP_REDUCE_MAX)
                    facc += v;
                else if (isnan(v) || v > facc) /* NaN sticks: nothing compares above it */
                    facc = isnan(facc) ? facc : v;
            } else {
                int64_t v = loom_ir_load_i64(src, dt, s);
                if (n->op != LOOM_IR_OP_REDUCE_MAX)
                    iacc = add_i(iacc, v);
                else if (v > iacc)
                    iacc = v;
            }
            next_index(nr, rext, ridx);
        }
        if (is_float) {
            if (n->op == LOOM_IR_OP_REDUCE_MEAN)
                facc = n_red > 0 ? facc / (double)n_red : NAN;
            loom_ir_store_f64(dst, n->dtype, o, facc);
        } else {
            loom_ir_store_i64(dst, n->dtype, o, iacc);
        }
        next_index(nk, kext, kidx);
    }
    return LOOM_OK;
}

/* [..., M, K] x [..., K, N] -> [..., M, N], batch dims equal; double / int64 accumulation. */
static loom_status run_matmul(const loom_ir_node *n, const loom_ir_node *x, const void *a,
                              const void *b, void *dst, loom_ir_diag *d) {
    loom_dtype dt = x->dtype;
    int32_t r = x->rank;
    int64_t batch = loom_ir_numel(r - 2, x->shape);
    int64_t M = x->shape[r - 2], K = x->shape[r - 1], N = n->shape[r - 1];
    loom_ir_scalar_i64_fn add_i = loom_ir_scalar_rule_i64(LOOM_IR_OP_ADD); /* wrapping */
    loom_ir_scalar_i64_fn mul_i = loom_ir_scalar_rule_i64(LOOM_IR_OP_MUL);
    bool is_float = loom_ir_dtype_is_float(dt);
    if (!is_float && !loom_ir_dtype_is_int(dt))
        return internal_error(n, d);
    for (int64_t p = 0; p < batch; p++) {
        for (int64_t i = 0; i < M; i++) {
            for (int64_t j = 0; j < N; j++) {
                double facc = 0.0;
                int64_t iacc = 0;
                for (int64_t k = 0; k < K; k++) {
                    int64_t ia = (p * M + i) * K + k, ib = (p * K + k) * N + j;
                    if (is_float)
                        facc += loom_ir_load_f64(a, dt, ia) * loom_ir_load_f64(b, dt, ib);
                    else
                        iacc = add_i(
                            iacc, mul_i(loom_ir_load_i64(a, dt, ia), loom_ir_load_i64(b, dt, ib)));
                }
                int64_t io = (p * M + i) * N + j;
                if (is_float)
                    loom_ir_store_f64(dst, dt, io, facc);
                else
                    loom_ir_store_i64(dst, dt, io, iacc);
            }
        }
    }
    return LOOM_OK;
}

/* conv2d and its gradients, each output element a sum over its window in double, rounded
 * once. x [N,C,H,W], w [O,C/G,KH,KW], y [N,O,OH,OW]; input pixel ih = oh*stride - pad +
 * kh*dilation (likewise w). The gradients gather the same terms: dx[ih] from the (oh, kh)
 * pairs that reach it, dw[kh] over every n, oh. */
/* The input pixel (*ih, *iw) that window tap (kh, kw) of output pixel (oh, ow) reads;
 * false when it falls in the padding of an H x W input. */
static bool conv_tap(const loom_ir_conv *cv, int64_t oh, int64_t ow, int64_t kh, int64_t kw,
                     int64_t H, int64_t W, int64_t *ih, int64_t *iw) {
    *ih = oh * cv->stride[0] - cv->padding[0] + kh * cv->dilation[0];
    *iw = ow * cv->stride[1] - cv->padding[1] + kw * cv->dilation[1];
    return *ih >= 0 && *ih < H && *iw >= 0 && *iw < W;
}

static void run_conv(const loom_ir_node *n, const loom_ir_node *const *x, const void *a,
                     const void *b, void *dst) {
    const loom_ir_conv *cv = &n->attrs.conv;
    bool fwd = n->op == LOOM_IR_OP_CONV2D, gin = n->op == LOOM_IR_OP_CONV2D_GRAD_INPUT;
    const int64_t *xs = fwd ? x[0]->shape : gin ? n->shape : x[0]->shape;
    const int64_t *ws = fwd || gin ? x[1]->shape : n->shape;
    const int64_t *ys = fwd ? n->shape : gin ? x[0]->shape : x[1]->shape;
    const void *xd = gin ? NULL : a, *wd = gin ? b : fwd ? b : NULL;
    const void *yd = gin ? a : fwd ? NULL : b;
    loom_dtype dt = n->dtype;
    int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], O = ws[0], Cg = ws[1], KH = ws[2],
            KW = ws[3], OH = ys[2], OW = ys[3], Og = O / cv->groups;
#define X_AT(nn, c, h, w) ((((nn)*C + (c)) * H + (h)) * W + (w))
#define W_AT(o, c, h, w) ((((o)*Cg + (c)) * KH + (h)) * KW + (w))
#define Y_AT(nn, o, h, w) ((((nn)*O + (o)) * OH + (h)) * OW + (w))
    if (fwd) {
        for (int64_t nn = 0; nn < N; nn++)
            for (int64_t o = 0; o < O; o++)
                for (int64_t oh = 0; oh < OH; oh++)
                    for (int64_t ow = 0; ow < OW; ow++) {
                        double acc = 0.0;
                        int64_t c0 = o / Og * Cg;
                        for (int64_t c = 0; c < Cg; c++)
                            for (int64_t kh = 0; kh < KH; kh++)
                                for (int64_t kw = 0, ih, iw; kw < KW; kw++) {
                                    if (!conv_tap(cv, oh, ow, kh, kw, H, W, &ih, &iw))
                                        continue;
                                    acc += loom_ir_load_f64(xd, dt, X_AT(nn, c0 + c, ih, iw)) *
                                           loom_ir_load_f64(wd, dt, W_AT(o, c, kh, kw));
                                }
                        loom_ir_store_f64(dst, dt, Y_AT(nn, o, oh, ow), acc);
                    }
    } else if (gin) {
        for (int64_t nn = 0; nn < N; nn++)
            for (int64_t ci = 0; ci < C; ci++)
                for (int64_t ih = 0; ih < H; ih++)
                    for (int64_t iw = 0; iw < W; iw++) {
                        double acc = 0.0;
                        int64_t grp = ci / Cg, c = ci % Cg;
                        for (int64_t o = grp * Og; o < (grp + 1) * Og; o++)
                            for (int64_t kh = 0; kh < KH; kh++)
                                for (int64_t kw = 0; kw < KW; kw++) {
                                    int64_t th = ih + cv->padding[0] - kh * cv->dilation[0];
                                    int64_t tw = iw + cv->padding[1] - kw * cv->dilation[1];
                                    if (th < 0 || tw < 0 || th % cv->stride[0] ||
                                        tw % cv->stride[1])
                                        continue;
                                    int64_t oh = th / cv->stride[0], ow = tw / cv->stride[1];
                                    if (oh >= OH || ow >= OW)
                                        continue;
                                    acc += loom_ir_load_f64(yd, dt, Y_AT(nn, o, oh, ow)) *
                                           loom_ir_load_f64(wd, dt, W_AT(o, c, kh, kw));
                                }
                        loom_ir_store_f64(dst, dt, X_AT(nn, ci, ih, iw), acc);
                    }
    } else {
        for (int64_t o = 0; o < O; o++)
            for (int64_t c = 0; c < Cg; c++)
                for (int64_t kh = 0; kh < KH; kh++)
                    for (int64_t kw = 0; kw < KW; kw++) {
                        double acc = 0.0;
                        int64_t ci = o / Og * Cg + c;
                        for (int64_t nn = 0; nn < N; nn++)
                            for (int64_t oh = 0; oh < OH; oh++)
                                for (int64_t ow = 0, ih, iw; ow < OW; ow++) {
                                    if (!conv_tap(cv, oh, ow, kh, kw, H, W, &ih, &iw))
                                        continue;
                                    acc += loom_ir_load_f64(xd, dt, X_AT(nn, ci, ih, iw)) *
                                           loom_ir_load_f64(yd, dt, Y_AT(nn, o, oh, ow));
                                }
                        loom_ir_store_f64(dst, dt, W_AT(o, c, kh, kw), acc);
                    }
    }
#undef X_AT
#undef W_AT
#undef Y_AT
}

/* The pixel (ih W + iw) that window (oh, ow) of the H x W plane at x[base] selects, as
 * PyTorch's kernel does: the first tap (in row-major order) until a tap is greater than
 * the value so far or NaN (so the last NaN wins); its value in *val. Every window holds a pixel
 * (infer.c: padding <= half the window). */
static int64_t pool_argmax(const loom_ir_conv *cv, const void *x, loom_dtype dt, int64_t base,
                           int64_t H, int64_t W, int64_t oh, int64_t ow, double *val) {
    int64_t best = -1;
    double m = -INFINITY;
    for (int64_t kh = 0; kh < cv->kernel[0]; kh++)
        for (int64_t kw = 0, ih, iw; kw < cv->kernel[1]; kw++) {
            if (!conv_tap(cv, oh, ow, kh, kw, H, W, &ih, &iw))
                continue;
            double v = loom_ir_load_f64(x, dt, base + ih * W + iw);
            if (best < 0)
                best = ih * W + iw;
            if (v > m || isnan(v)) {
                m = v;
                best = ih * W + iw;
            }
        }
    *val = m;
    return best;
}

/* max_pool2d(x) and max_pool2d_grad(x, dy): each window's value, or each pixel's sum of the
 * dy elements whose windows selected it (gathered in window order: the scatter's sum). */
static void run_pool(const loom_ir_node *n, const loom_ir_node *const *x, const void *xd,
                     const void *dyd, void *dst) {
    const loom_ir_conv *cv = &n->attrs.conv;
    const int64_t *xs = x[0]->shape;
    loom_dtype dt = n->dtype;
    const int64_t *ys = n->op == LOOM_IR_OP_MAX_POOL2D ? n->shape : x[1]->shape; /* pooled */
    int64_t H = xs[2], W = xs[3], planes = xs[0] * xs[1], OH = ys[2], OW = ys[3];
    double v;
    for (int64_t p = 0; p < planes; p++) {
        if (n->op == LOOM_IR_OP_MAX_POOL2D) {
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    pool_argmax(cv, xd, dt, p * H * W, H, W, oh, ow, &v);
                    loom_ir_store_f64(dst, dt, (p * OH + oh) * OW + ow, v);
                }
            continue;
        }
        for (int64_t ih = 0; ih < H; ih++)
            for (int64_t iw = 0; iw < W; iw++) {
                double acc = 0.0;
                for (int64_t oh = 0; oh < OH; oh++)
                    for (int64_t ow = 0; ow < OW; ow++) {
                        int64_t h0 = oh * cv->stride[0] - cv->padding[0];
                        int64_t w0 = ow * cv->stride[1] - cv->padding[1];
                        if (ih < h0 || ih > h0 + (cv->kernel[0] - 1) * cv->dilation[0] || iw < w0 ||
                            iw > w0 + (cv->kernel[1] - 1) * cv->dilation[1])
                            continue;
                        if (pool_argmax(cv, xd, dt, p * H * W, H, W, oh, ow, &v) == ih * W + iw)
                            acc += loom_ir_load_f64(dyd, dt, (p * OH + oh) * OW + ow);
                    }
                loom_ir_store_f64(dst, dt, (p * H + ih) * W + iw, acc);
            }
    }
}

/* Before the first collective of a step on several ranks, the ranks check that they are about
 * to run the same collectives (collective.h): a mismatch would otherwise hang or corrupt
 * inside MPI. */
static loom_status agree_on_collectives(const loom_ir_graph *g, loom_ir_diag *d) {
    int32_t first = -1, count = 0;
    uint64_t h = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (!loom_ir_op_traits(n->op)->ranks)
            continue;
        const loom_ir_node *x = &g->nodes[n->inputs[0]];
        h = loom_rt_collective_digest(h, n, (size_t)loom_ir_numel(x->rank, x->shape));
        first = first < 0 ? i : first;
        count++;
    }
    return loom_rt_collectives_agree(g, first, count, loom_rt_step_digest(h, g), g, d);
}

/* ---- the interpreter loop ----------------------------------------------------------------- */

static void release_slot(const loom_allocator *a, slot *s) {
    if (s->owned)
        loom_ir_free(a, s->data, s->bytes);
    s->data = NULL;
    s->bytes = 0;
    s->owned = false;
}

/* Computes node i into slots[i].data (already allocated). */
static loom_status run_node(const loom_ir_graph *g, int32_t i, const slot *slots,
                            const loom_allocator *a, loom_ir_diag *d) {
    const loom_ir_node *n = &g->nodes[i];
    enum { IN_MAX = LOOM_IR_ROLE_OPERANDS_MAX };
    const loom_ir_node *x[IN_MAX] = {NULL};
    const void *src[IN_MAX] = {NULL};
    for (int32_t k = 0; k < n->n_inputs && k < IN_MAX; k++) {
        x[k] = &g->nodes[n->inputs[k]];
        src[k] = slots[n->inputs[k]].data;
    }
    void *dst = slots[i].data;
    switch (n->op) {
    case LOOM_IR_OP_INPUT: return LOOM_OK; /* read in place, never copied */
    case LOOM_IR_OP_CONSTANT: run_constant(n, dst); return LOOM_OK;
    case LOOM_IR_OP_NEG:
    case LOOM_IR_OP_ABS:
    case LOOM_IR_OP_EXP:
    case LOOM_IR_OP_LOG:
    case LOOM_IR_OP_SQRT:
    case LOOM_IR_OP_RSQRT:
    case LOOM_IR_OP_TANH:
    case LOOM_IR_OP_SIGMOID:
    case LOOM_IR_OP_RELU:
    case LOOM_IR_OP_GELU:
    case LOOM_IR_OP_GELU_TANH: return run_arith(n, src[0], src[0], dst, d);
    case LOOM_IR_OP_ISFINITE: return run_test(n, x[0]->dtype, src[0], src[0], dst, d);
    case LOOM_IR_OP_ADD:
    case LOOM_IR_OP_SUB:
    case LOOM_IR_OP_MUL:
    case LOOM_IR_OP_DIV:
    case LOOM_IR_OP_POW:
    case LOOM_IR_OP_MAXIMUM:
    case LOOM_IR_OP_MINIMUM: return run_arith(n, src[0], src[1], dst, d);
    case LOOM_IR_OP_EQ:
    case LOOM_IR_OP_NE:
    case LOOM_IR_OP_LT:
    case LOOM_IR_OP_LE:
    case LOOM_IR_OP_GT:
    case LOOM_IR_OP_GE: return run_test(n, x[0]->dtype, src[0], src[1], dst, d);
    case LOOM_IR_OP_SELECT: run_select(n, src[0], src[1], src[2], dst); return LOOM_OK;
    case LOOM_IR_OP_CAST: run_cast(n, x[0]->dtype, src[0], dst); return LOOM_OK;
    case LOOM_IR_OP_BROADCAST: run_broadcast(n, x[0], src[0], dst); return LOOM_OK;
    case LOOM_IR_OP_RESHAPE: /* row-major data is unchanged by a reshape */
        if (slots[i].bytes)
            memcpy(dst, src[0], slots[i].bytes);
        return LOOM_OK;
    case LOOM_IR_OP_TRANSPOSE: run_transpose(n, x[0], src[0], dst); return LOOM_OK;
    case LOOM_IR_OP_REDUCE_SUM:
    case LOOM_IR_OP_REDUCE_MEAN:
    case LOOM_IR_OP_REDUCE_MAX: return run_reduce(n, x[0], src[0], dst, d);
    case LOOM_IR_OP_MATMUL: return run_matmul(n, x[0], src[0], src[1], dst, d);
    case LOOM_IR_OP_SLICE: run_slice(n, x[0], src[0], dst); return LOOM_OK;
    case LOOM_IR_OP_PAD: run_pad(n, x[0], src[0], dst); return LOOM_OK;
    case LOOM_IR_OP_CONCAT: run_concat(g, n, slots, dst); return LOOM_OK;
    case LOOM_IR_OP_IOTA: run_iota(n, dst); return LOOM_OK;
    case LOOM_IR_OP_RAND_UNIFORM: run_rand_uniform(n, src[0], dst); return LOOM_OK;
    case LOOM_IR_OP_ALL_REDUCE:
    case LOOM_IR_OP_BROADCAST_FROM:
    case LOOM_IR_OP_ALL_GATHER: return loom_rt_collective_run(g, i, src[0], dst, d);
    case LOOM_IR_OP_CONV2D:
    case LOOM_IR_OP_CONV2D_GRAD_INPUT:
    case LOOM_IR_OP_CONV2D_GRAD_WEIGHT: run_conv(n, x, src[0], src[1], dst); return LOOM_OK;
    case LOOM_IR_OP_MAX_POOL2D:
    case LOOM_IR_OP_MAX_POOL2D_GRAD:
        run_pool(n, x, src[0], n->op == LOOM_IR_OP_MAX_POOL2D ? NULL : src[1], dst);
        return LOOM_OK;
    case LOOM_IR_OP_GATHER: run_gather(n, x[0], x[1], src[0], src[1], dst); return LOOM_OK;
    case LOOM_IR_OP_SCATTER_ADD: return run_scatter_add(n, x, src, dst, a, d);
    case LOOM_IR_OP_ATTENTION:
    case LOOM_IR_OP_ATTENTION_LSE:
    case LOOM_IR_OP_ATTENTION_GRAD_Q:
    case LOOM_IR_OP_ATTENTION_GRAD_K:
    case LOOM_IR_OP_ATTENTION_GRAD_V: return loom_rt_interp_attention(n, x, src, dst, a, d);
    case LOOM_IR_OP_COUNT_: break;
    }
    return internal_error(n, d);
}

static bool ranges_overlap(const void *p, size_t np, const void *q, size_t nq) {
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return np > 0 && nq > 0 && a < b + nq && b < a + np;
}

/* Checks the caller's pointers: every input and output with data needs a buffer. */
static loom_status check_buffers(const loom_ir_graph *g, const void *const *inputs,
                                 void *const *outputs, loom_ir_diag *d) {
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (n->op == LOOM_IR_OP_INPUT && loom_ir_node_bytes(n) > 0 && (!inputs || !inputs[n->attrs.index]))
            return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                    "interp: graph input %lld (%%%d) has no buffer",
                                    (long long)n->attrs.index, (int)i);
    }
    for (int32_t o = 0; o < g->n_outputs; o++)
        if (loom_ir_node_bytes(&g->nodes[g->outputs[o].node]) > 0 && (!outputs || !outputs[o]))
            return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                    "interp: output %d (%%%d) has no buffer", (int)o,
                                    (int)g->outputs[o].node);
    return LOOM_OK;
}

static loom_status oom(loom_ir_diag *d, const loom_ir_graph *g, int32_t i, size_t bytes) {
    char t[LOOM_IR_TYPE_STR_MAX];
    const loom_ir_node *n = &g->nodes[i];
    return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                            "interp: out of memory allocating %zu bytes for %%%d = %s : %s", bytes,
                            (int)i, loom_ir_op_name(n->op),
                            loom_ir_format_type(t, sizeof t, n->dtype, n->rank, n->shape));
}

loom_status loom_rt_interp_run(const loom_ir_graph *g, const loom_allocator *a,
                               const void *const *inputs, void *const *outputs, loom_ir_diag *d) {
    if (!g || !a || !a->fn)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "interp: %s is NULL",
                                !g ? "the graph" : "the allocator");
    /* The kernels trust shapes, dtypes and operand ids: verify them first. */
    loom_status st = loom_ir_graph_verify(g, d);
    if (st != LOOM_OK)
        return st;
    if ((st = check_buffers(g, inputs, outputs, d)) != LOOM_OK)
        return st;
    if (g->n_nodes == 0)
        return LOOM_OK;
    if ((st = agree_on_collectives(g, d)) != LOOM_OK)
        return st;

    size_t slots_bytes = (size_t)g->n_nodes * sizeof(slot);
    slot *slots = loom_ir_alloc(a, slots_bytes);
    if (!slots)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                                "interp: out of memory allocating state for %d nodes",
                                (int)g->n_nodes);
    memset(slots, 0, slots_bytes);
    /* Liveness: outputs live to the end; walking backwards, a node's last use is its
     * latest live user. Nodes no output depends on keep last_use -1 and are not run. */
    for (int32_t i = 0; i < g->n_nodes; i++)
        slots[i].last_use = -1;
    for (int32_t o = 0; o < g->n_outputs; o++)
        slots[g->outputs[o].node].last_use = INT32_MAX;
    /* Collectives run on every rank even when nothing reads them: each rank's graph is the
     * same, but skipping one here would still break the order the peers rely on. */
    for (int32_t i = 0; i < g->n_nodes; i++)
        if ((loom_ir_op_table[g->nodes[i].op].flags & LOOM_IR_OPF_SIDE_EFFECT) &&
            slots[i].last_use < 0)
            slots[i].last_use = i;
    for (int32_t i = g->n_nodes - 1; i >= 0; i--) {
        if (slots[i].last_use < 0)
            continue;
        const loom_ir_node *n = &g->nodes[i];
        for (int32_t k = 0; k < n->n_inputs; k++)
            if (slots[n->inputs[k]].last_use < i)
                slots[n->inputs[k]].last_use = i;
    }

    for (int32_t i = 0; i < g->n_nodes && st == LOOM_OK; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (slots[i].last_use < 0)
            continue;
        if (n->op == LOOM_IR_OP_INPUT) {
            /* const only in spirit: the interpreter never writes through it */
            slots[i].data = (void *)(uintptr_t)(inputs ? inputs[n->attrs.index] : NULL);
            continue;
        }
        size_t bytes = loom_ir_node_bytes(n);
        if (bytes > 0) {
            slots[i].data = loom_ir_alloc(a, bytes);
            if (!slots[i].data) {
                st = oom(d, g, i, bytes);
                break;
            }
            slots[i].bytes = bytes;
            slots[i].owned = true;
        }
        st = run_node(g, i, slots, a, d);
        /* Free operands whose last reader was this node (an operand may repeat: the first
         * release clears the slot, the second is a no-op). */
        for (int32_t k = 0; k < n->n_inputs; k++)
            if (slots[n->inputs[k]].last_use == i)
                release_slot(a, &slots[n->inputs[k]]);
    }

    /* An output that is a graph input still points at the caller's buffer, which another
     * output may be written into (swaps, donation): copy such values aside first. */
    for (int32_t o = 0; o < g->n_outputs && st == LOOM_OK; o++) {
        slot *s = &slots[g->outputs[o].node];
        size_t bytes = loom_ir_node_bytes(&g->nodes[g->outputs[o].node]);
        if (s->owned || bytes == 0)
            continue;
        bool clobbered = false;
        for (int32_t p = 0; p < g->n_outputs; p++)
            if (p != o && ranges_overlap(s->data, bytes, outputs[p],
                                         loom_ir_node_bytes(&g->nodes[g->outputs[p].node])))
                clobbered = true;
        if (!clobbered)
            continue;
        void *copy = loom_ir_alloc(a, bytes);
        if (!copy) {
            st = oom(d, g, g->outputs[o].node, bytes);
            break;
        }
        memcpy(copy, s->data, bytes);
        *s = (slot){.data = copy, .bytes = bytes, .last_use = s->last_use, .owned = true};
    }
    for (int32_t o = 0; o < g->n_outputs && st == LOOM_OK; o++) {
        const slot *s = &slots[g->outputs[o].node];
        size_t bytes = loom_ir_node_bytes(&g->nodes[g->outputs[o].node]);
        if (bytes > 0 && outputs[o] != s->data)
            memmove(outputs[o], s->data, bytes);
    }
    for (int32_t i = 0; i < g->n_nodes; i++)
        release_slot(a, &slots[i]);
    loom_ir_free(a, slots, slots_bytes);
    return st;
}

/* ---- executable ----------------------------------------------------------------------------- */

/* The graph it runs is its own: the caller may replace base.graph, which the cache compares,
 * by the graph as traced (the frontend runs the autocast pass before interpreting). */
typedef struct interp_exe {
    loom_rt_executable base;
    loom_ir_graph run;
} interp_exe;

static loom_status interp_exe_run(loom_rt_executable *exe, loom_rt_buffer *const *inputs,
                                  loom_rt_buffer *const *outputs, loom_ir_diag *d) {
    const loom_ir_graph *g = &((interp_exe *)exe)->run;
    int32_t n_in = g->n_graph_inputs, n_out = g->n_outputs;
    size_t bytes = (size_t)(n_in + n_out) * sizeof(void *);
    void **ptrs = loom_ir_alloc(&exe->alloc, bytes);
    if (!ptrs && bytes > 0)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY,
                                "interp: out of memory preparing %d buffers", (int)(n_in + n_out));
    if (ptrs)
        memset(ptrs, 0, bytes);
    loom_status st = LOOM_OK;
    for (int32_t i = 0; i < g->n_nodes && st == LOOM_OK; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (n->op != LOOM_IR_OP_INPUT || n->attrs.index >= n_in)
            continue; /* an index out of range fails verification in loom_rt_interp_run */
        const loom_rt_buffer *buf = inputs ? inputs[n->attrs.index] : NULL;
        if (buf && buf->size < loom_ir_node_bytes(n))
            st = loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                  "interp: input %lld holds %zu bytes, needs %zu",
                                  (long long)n->attrs.index, buf->size, loom_ir_node_bytes(n));
        else
            ptrs[n->attrs.index] = buf ? buf->data : NULL;
    }
    for (int32_t o = 0; o < n_out && st == LOOM_OK; o++) {
        const loom_rt_buffer *buf = outputs ? outputs[o] : NULL;
        size_t need = loom_ir_node_bytes(&g->nodes[g->outputs[o].node]);
        if (buf && buf->size < need)
            st = loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT,
                                  "interp: output %d holds %zu bytes, needs %zu", (int)o, buf->size,
                                  need);
        else
            ptrs[n_in + o] = buf ? buf->data : NULL;
    }
    if (st == LOOM_OK)
        st = loom_rt_interp_run(g, &exe->alloc, (const void *const *)ptrs, ptrs + n_in, d);
    loom_ir_free(&exe->alloc, ptrs, bytes);
    return st;
}

static void interp_exe_destroy(loom_rt_executable *exe) {
    if (!exe)
        return;
    loom_allocator a = exe->alloc;
    loom_ir_graph_deinit(&exe->graph);
    loom_ir_graph_deinit(&((interp_exe *)exe)->run);
    loom_ir_free(&a, exe, sizeof(interp_exe));
}

static const loom_rt_executable_vtable interp_exe_vtable = {
    .run = interp_exe_run,
    .destroy = interp_exe_destroy,
};

loom_status loom_rt_interp_executable_create(const loom_ir_graph *g, uint64_t hash,
                                             const loom_allocator *a,
                                             loom_rt_executable **out_exe) {
    if (!g || !a || !out_exe)
        return LOOM_STATUS_INVALID_ARGUMENT;
    *out_exe = NULL;
    interp_exe *ie = loom_ir_alloc(a, sizeof *ie);
    if (!ie)
        return LOOM_STATUS_OUT_OF_MEMORY;
    loom_rt_executable *exe = &ie->base;
    *exe = (loom_rt_executable){.vt = &interp_exe_vtable, .alloc = *a, .hash = hash,
                                .host_thread_only = true};
    loom_ir_graph_init(&exe->graph, a);
    loom_ir_graph_init(&ie->run, a);
    loom_status st = loom_ir_graph_copy(&exe->graph, g);
    if (st == LOOM_OK)
        st = loom_ir_graph_copy(&ie->run, g);
    if (st != LOOM_OK) {
        interp_exe_destroy(exe);
        return st;
    }
    *out_exe = exe;
    return LOOM_OK;
}
