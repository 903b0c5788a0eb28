/* The reference interpreter's attention ops (ir/ops.def: attention, attention_lse and the
 * three gradients, with dropout on the weights), in f64 with plain loops over each (query,
 * key) pair: the oracle of codegen/lower_attention.c's tiled kernels. */
#include <math.h>
#include <string.h>

#include "interp_attention.h"

/* The mask (ops.def), broadcast to the scores [..., L, S]: its element strides along the
 * scores' axes (0 where it broadcasts). */
typedef struct mask_view {
    const loom_ir_node *node; /* NULL: none */
    const void *data;
    int64_t stride[LOOM_MAX_RANK];
} mask_view;

static void mask_init(mask_view *mv, const loom_ir_node *m, const void *data, int32_t r) {
    memset(mv, 0, sizeof *mv);
    if (!m)
        return;
    mv->node = m;
    mv->data = data;
    loom_ir_broadcast_strides(m->rank, m->shape, r, mv->stride);
}

/* The mask's element for (batch b of the leading shape lead[0..r-2), query i, key j). */
static int64_t mask_at(const mask_view *mv, int32_t r, const int64_t *lead, int64_t b, int64_t i,
                       int64_t j) {
    int64_t off = i * mv->stride[r - 2] + j * mv->stride[r - 1];
    for (int32_t d = r - 3; d >= 0; d--) {
        off += (b % lead[d]) * mv->stride[d];
        b /= lead[d];
    }
    return off;
}

/* Row i's scores s[j] = scale q_i . k_j (-inf above the diagonal when causal), masked. */
static void scores_row(const loom_ir_node *n, const void *q, const void *k, loom_dtype dt,
                       const mask_view *mv, int32_t r, const int64_t *lead, int64_t b, int64_t qb,
                       int64_t kb, int64_t i, int64_t S, int64_t E, double *s) {
    for (int64_t j = 0; j < S; j++) {
        if (n->attrs.index && j > i) {
            s[j] = -INFINITY;
            continue;
        }
        double acc = 0;
        for (int64_t e = 0; e < E; e++)
            acc +=
                loom_ir_load_f64(q, dt, qb + i * E + e) * loom_ir_load_f64(k, dt, kb + j * E + e);
        s[j] = n->attrs.value * acc;
        if (mv->node) {
            int64_t at = mask_at(mv, r, lead, b, i, j);
            if (mv->node->dtype == LOOM_DTYPE_BOOL)
                s[j] = loom_ir_load_i64(mv->data, LOOM_DTYPE_BOOL, at) ? s[j] : -INFINITY;
            else
                s[j] += loom_ir_load_f64(mv->data, mv->node->dtype, at);
        }
    }
}

/* Dropout's factor for weight (query i, key j) of batch b (ops.def): 1 / (1 - p) where its
 * draw, in f32 (f64 for f64 operands) like the composition's weights, is >= p; else 0. */
static double keep_factor(const loom_ir_node *n, loom_dtype dt, int64_t seed, int64_t b, int64_t i,
                          int64_t j, int64_t L, int64_t S) {
    double p = n->attrs.dropout;
    if (p == 0)
        return 1.0;
    double u = loom_ir_rand_uniform(seed, (b * L + i) * S + j);
    bool keep = dt == LOOM_DTYPE_F64 ? u >= p : (float)u >= (float)p;
    return keep ? 1.0 / (1.0 - p) : 0.0;
}

static double logsumexp(const double *s, int64_t S) {
    double m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < S; j++)
        m = s[j] > m ? s[j] : m;
    for (int64_t j = 0; j < S; j++)
        sum += exp(s[j] - m);
    return m + log(sum);
}

loom_status loom_rt_interp_attention(const loom_ir_node *n, const loom_ir_node *const *x,
                                     const void *const *src, void *dst, const loom_allocator *a,
                                     loom_ir_diag *d) {
    loom_ir_op op = n->op;
    const loom_ir_node *q = x[0], *k = x[1];
    loom_dtype dt = q->dtype;
    int32_t r = q->rank;
    int64_t B = loom_ir_numel(r - 2, q->shape), L = q->shape[r - 2], S = k->shape[r - 2];
    int64_t E = q->shape[r - 1];
    bool gv = op == LOOM_IR_OP_ATTENTION_GRAD_V;
    /* v, do, lse, delta (ops.def's operand order) */
    const void *v = op == LOOM_IR_OP_ATTENTION_LSE || gv ? NULL : src[2];
    const void *dout = op == LOOM_IR_OP_ATTENTION || op == LOOM_IR_OP_ATTENTION_LSE ? NULL
                       : gv                                                         ? src[2]
                                                                                    : src[3];
    const void *lse = !dout ? NULL : gv ? src[3] : src[4];
    const void *delta = dout && !gv ? src[5] : NULL;
    int64_t seed = n->attrs.dropout > 0
                       ? loom_ir_load_i64(src[loom_ir_attention_operands(op)], LOOM_DTYPE_I64, 0)
                       : 0;
    int32_t mi = loom_ir_attention_mask(n);
    mask_view mv;
    mask_init(&mv, mi >= 0 ? x[mi] : NULL, mi >= 0 ? src[mi] : NULL, r);
    /* Ev: v's last extent, or do's (grad_v's operand 2) */
    int64_t Ev = op == LOOM_IR_OP_ATTENTION_LSE ? 0 : x[2]->shape[r - 1];
    /* the result's rows and columns, summed into in f64 */
    int64_t rows = op == LOOM_IR_OP_ATTENTION_GRAD_K || gv ? S : L;
    int64_t cols = op == LOOM_IR_OP_ATTENTION_LSE ? 1 : op == LOOM_IR_OP_ATTENTION || gv ? Ev : E;
    size_t sb = (size_t)(S > 0 ? S : 1) * sizeof(double);
    size_t ab = (size_t)(rows * cols > 0 ? rows * cols : 1) * sizeof(double);
    double *s = loom_ir_alloc(a, sb), *acc = loom_ir_alloc(a, ab);
    if (!s || !acc) {
        loom_ir_free(a, s, sb);
        loom_ir_free(a, acc, ab);
        char t[LOOM_IR_TYPE_STR_MAX];
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "interp: out of memory for %s : %s",
                                loom_ir_op_name(op),
                                loom_ir_format_type(t, sizeof t, n->dtype, n->rank, n->shape));
    }
    for (int64_t b = 0; b < B; b++) {
        int64_t qb = b * L * E, kb = b * S * E, vb = b * S * Ev, ob = b * L * Ev;
        memset(acc, 0, ab);
        for (int64_t i = 0; i < L; i++) {
            scores_row(n, src[0], src[1], dt, &mv, r, q->shape, b, qb, kb, i, S, E, s);
            double l = lse ? loom_ir_load_f64(lse, LOOM_DTYPE_F32, b * L + i) : logsumexp(s, S);
            if (op == LOOM_IR_OP_ATTENTION_LSE) {
                acc[i] = l;
                continue;
            }
            for (int64_t j = 0; j < S; j++) {
                double p = exp(s[j] - l), keep = keep_factor(n, dt, seed, b, i, j, L, S);
                if (op == LOOM_IR_OP_ATTENTION) {
                    for (int64_t c = 0; c < Ev; c++)
                        acc[i * Ev + c] += keep * p * loom_ir_load_f64(v, dt, vb + j * Ev + c);
                    continue;
                }
                if (gv) {
                    for (int64_t c = 0; c < Ev; c++)
                        acc[j * Ev + c] += keep * p * loom_ir_load_f64(dout, dt, ob + i * Ev + c);
                    continue;
                }
                double dp = 0; /* of the dropped weight: d(keep p) = keep dp */
                for (int64_t c = 0; c < Ev; c++)
                    dp += loom_ir_load_f64(dout, dt, ob + i * Ev + c) *
                          loom_ir_load_f64(v, dt, vb + j * Ev + c);
                dp *= keep;
                double ds =
                    n->attrs.value * p * (dp - loom_ir_load_f64(delta, LOOM_DTYPE_F32, b * L + i));
                for (int64_t e = 0; e < E; e++) {
                    if (op == LOOM_IR_OP_ATTENTION_GRAD_Q)
                        acc[i * E + e] += ds * loom_ir_load_f64(src[1], dt, kb + j * E + e);
                    else
                        acc[j * E + e] += ds * loom_ir_load_f64(src[0], dt, qb + i * E + e);
                }
            }
        }
        for (int64_t e = 0; e < rows * cols; e++)
            loom_ir_store_f64(dst, n->dtype, b * rows * cols + e, acc[e]);
    }
    loom_ir_free(a, s, sb);
    loom_ir_free(a, acc, ab);
    return LOOM_OK;
}
