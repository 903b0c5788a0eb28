/* Reverse-mode autograd over the trace: loom_backward walks the recorded forward nodes from
 * the loss back to the requested tensors and appends each op's VJP as ordinary IR nodes, so
 * gradients are lazy tensors compiled into the same step as the forward.
 *
 * How it works
 *  - Only nodes on a path from some wrt tensor to the loss get a gradient: a forward sweep
 *    marks the float nodes that depend on a wrt node ("needs"), the backward sweep visits
 *    nodes from the loss down and skips the rest. Integer and bool values carry none.
 *  - Each visited node's gradient is complete when it is visited (all its users have larger
 *    ids, the trace being topological), so one pass in reverse id order suffices; a value
 *    used several times sums its contributions.
 *  - Backward nodes carry the location of the forward node they differentiate, so a dump
 *    or an error inside backward points at the user's forward line.
 *  - The rules below follow PyTorch's derivatives.yaml where a choice exists: relu'(0) = 0,
 *    |x|'(0) = 0, max/maximum split the gradient evenly among ties. */
#include <math.h>
#include <string.h>

#include "frontend.h"
#include "ir/plan.h"
#include "loom/nn.h"

typedef struct ag {
    loom_context *ctx;
    loom_ir_loc loc;     /* of the node being differentiated */
    loom_dtype autocast; /* and its autocast tag: its VJP runs at its precision */
    bool failed;
    /* the attention node whose statistics (lse, delta: -1 until made) its operands' VJPs,
     * made one after the other, share */
    int32_t att, att_lse, att_delta;
} ag;

static const loom_ir_node *nd(const ag *a, int32_t id) {
    return &a->ctx->trace.nodes[id];
}

/* Appends a node; -1 once anything failed (the first error is recorded). */
static int32_t emit(ag *a, const loom_ir_node_desc *desc) {
    if (a->failed)
        return -1;
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    int32_t id;
    loom_ir_node_desc dd = *desc;
    dd.loc = a->loc; /* the forward node's line and scope */
    dd.loc.backward = true;
    if (!loom_ir_op_traits(dd.op)->leaf)
        dd.attrs.autocast = a->autocast;
    if (loom_ir_graph_add(&a->ctx->trace, &dd, &id, &d) != LOOM_OK) {
        /* An inference failure here is Loom's own bug (a VJP rule built a bad node). */
        loom_fe_error(a->ctx, d.code, a->loc.file, a->loc.line, "backward",
                      "building the gradient of %s: %s", loom_ir_op_name(desc->op), d.msg);
        a->failed = true;
        return -1;
    }
    return id;
}

static int32_t un(ag *a, loom_ir_op op, int32_t x) {
    if (x < 0)
        return -1;
    return emit(a, &(loom_ir_node_desc){.op = op, .n_inputs = 1, .inputs = &x});
}

static int32_t bin(ag *a, loom_ir_op op, int32_t x, int32_t y) {
    if (x < 0 || y < 0)
        return -1;
    int32_t in[2] = {x, y};
    return emit(a, &(loom_ir_node_desc){.op = op, .n_inputs = 2, .inputs = in});
}

static int32_t sel(ag *a, int32_t c, int32_t x, int32_t y) {
    if (c < 0 || x < 0 || y < 0)
        return -1;
    int32_t in[3] = {c, x, y};
    return emit(a, &(loom_ir_node_desc){.op = LOOM_IR_OP_SELECT, .n_inputs = 3, .inputs = in});
}

/* A constant of `like`'s dtype and shape. */
static int32_t full_like(ag *a, int32_t like, double v) {
    if (like < 0)
        return -1;
    const loom_ir_node *n = nd(a, like);
    int64_t shape[LOOM_MAX_RANK];
    memcpy(shape, n->shape, sizeof shape);
    return emit(a, &(loom_ir_node_desc){.op = LOOM_IR_OP_CONSTANT,
                                        .dtype = n->dtype,
                                        .rank = n->rank,
                                        .shape = shape,
                                        .attrs = {.value = v}});
}

static int32_t shaped(ag *a, loom_ir_op op, int32_t x, int32_t rank, const int64_t *shape) {
    if (x < 0)
        return -1;
    int64_t s[LOOM_MAX_RANK];
    memcpy(s, shape, (size_t)rank * sizeof *s);
    return emit(
        a, &(loom_ir_node_desc){.op = op, .n_inputs = 1, .inputs = &x, .rank = rank, .shape = s});
}

/* x reshaped or broadcast (op) to the shape of node `like`; x itself when it has it. */
static int32_t shaped_like(ag *a, loom_ir_op op, int32_t x, int32_t like) {
    if (x < 0)
        return -1;
    const loom_ir_node *l = nd(a, like), *n = nd(a, x);
    if (l->rank == n->rank && memcmp(l->shape, n->shape, (size_t)l->rank * 8) == 0)
        return x;
    int64_t s[LOOM_MAX_RANK];
    memcpy(s, l->shape, sizeof s);
    return shaped(a, op, x, l->rank, s);
}

static int32_t reshape_like(ag *a, int32_t x, int32_t like) {
    return shaped_like(a, LOOM_IR_OP_RESHAPE, x, like);
}

static int32_t broadcast_like(ag *a, int32_t x, int32_t like) {
    return shaped_like(a, LOOM_IR_OP_BROADCAST, x, like);
}

static int32_t cast_to(ag *a, int32_t x, loom_dtype dt) {
    if (x < 0)
        return -1;
    if (nd(a, x)->dtype == dt)
        return x;
    return emit(
        a, &(loom_ir_node_desc){.op = LOOM_IR_OP_CAST, .n_inputs = 1, .inputs = &x, .dtype = dt});
}

static int32_t reduce(ag *a, loom_ir_op op, int32_t x, uint32_t axes, bool keepdim) {
    if (x < 0)
        return -1;
    return emit(
        a, &(loom_ir_node_desc){
               .op = op, .n_inputs = 1, .inputs = &x, .attrs = {.axes = axes, .keepdim = keepdim}});
}

static int32_t transpose(ag *a, int32_t x, const int32_t *perm) {
    if (x < 0)
        return -1;
    loom_ir_node_desc d = {.op = LOOM_IR_OP_TRANSPOSE, .n_inputs = 1, .inputs = &x};
    memcpy(d.attrs.perm, perm, sizeof d.attrs.perm);
    return emit(a, &d);
}

static int64_t numel_of(const ag *a, int32_t x) {
    return loom_ir_numel(nd(a, x)->rank, nd(a, x)->shape);
}

/* Whether q^T as the first operand of an f32 matmul would be packed inside that matmul's
 * kernel rather than materialized (loom_ir_matmul_operand_fuses' rule for f32, the
 * product having as many rows as q has columns). */
static bool packs_transposed(const ag *a, int32_t q) {
    const loom_ir_node *qn = nd(a, q);
    return qn->dtype == LOOM_DTYPE_F32 && qn->rank == 2 &&
           loom_ir_f32_transpose_fuses(numel_of(a, q), qn->shape[1]);
}

/* A slice or pad (op) of x with attrs start/step, giving node `like`'s shape. */
static int32_t moved_like(ag *a, loom_ir_op op, int32_t x, int32_t like, const int64_t *start,
                          const int64_t *step) {
    if (x < 0)
        return -1;
    const loom_ir_node *l = nd(a, like);
    int64_t shape[LOOM_MAX_RANK];
    memcpy(shape, l->shape, sizeof shape);
    loom_ir_node_desc d = {.op = op, .n_inputs = 1, .inputs = &x, .rank = l->rank, .shape = shape};
    memcpy(d.attrs.start, start, (size_t)l->rank * sizeof *start);
    memcpy(d.attrs.step, step, (size_t)l->rank * sizeof *step);
    return emit(a, &d);
}

/* Elements a transpose of x would move: none when x is itself a transpose (it cancels). */
static int64_t cost_mT(const ag *a, int32_t x) {
    return loom_ir_swaps_last2(nd(a, x)) ? 0 : numel_of(a, x);
}

/* Swaps the last two axes (undoing such a swap instead of stacking a second one). */
static int32_t mT(ag *a, int32_t x) {
    if (x < 0)
        return -1;
    if (loom_ir_swaps_last2(nd(a, x)))
        return nd(a, x)->inputs[0];
    int32_t r = nd(a, x)->rank, perm[LOOM_MAX_RANK] = {0};
    for (int32_t i = 0; i < r; i++)
        perm[i] = i;
    perm[r - 2] = r - 1;
    perm[r - 1] = r - 2;
    return transpose(a, x, perm);
}

/* The gradient g of a reduction's result, shaped back over the reduced operand x. */
static int32_t unreduce(ag *a, int32_t g, const loom_ir_node *n, int32_t x) {
    const loom_ir_node *xn = nd(a, x);
    int64_t kept[LOOM_MAX_RANK];
    for (int32_t i = 0; i < xn->rank; i++)
        kept[i] = (n->attrs.axes >> i) & 1u ? 1 : xn->shape[i];
    int32_t r = xn->rank;
    if (!n->attrs.keepdim)
        g = shaped(a, LOOM_IR_OP_RESHAPE, g, r, kept);
    return broadcast_like(a, g, x);
}

/* Sums g (of a broadcast's result shape) down to operand x's shape. Axes of extent 1 in g
 * need no sum, only the reshape: a reduction over them is a copy (when conv2d's im2col gave
 * its windows a leading unit axis, those copies cost 3 ms of a CNN step). Of the same rank
 * as g, x is the sum with keepdim, no reshape: a reshape is read from a buffer, so the
 * readers of the sum (layer norm's and softmax's backward, over rows) could not join its
 * kernel as its later stages (passes/fusion.c). */
static int32_t unbroadcast(ag *a, int32_t g, int32_t x) {
    const loom_ir_node *xn = nd(a, x), *gn = nd(a, g);
    int32_t off = gn->rank - xn->rank;
    uint32_t mask = 0;
    for (int32_t i = 0; i < gn->rank; i++)
        if (gn->shape[i] != 1 && (i < off || xn->shape[i - off] == 1))
            mask |= 1u << i;
    if (mask)
        g = reduce(a, LOOM_IR_OP_REDUCE_SUM, g, mask, off == 0);
    return reshape_like(a, g, x);
}

/* Ops without a gradient rule (collectives other than a sum all-reduce): an error naming the
 * op at the user's forward line. */
static int32_t no_vjp(ag *a, const loom_ir_node *n) {
    if (!a->failed) {
        char t[LOOM_IR_TYPE_STR_MAX];
        loom_ir_format_type(t, sizeof t, n->dtype, n->rank, n->shape);
        if (n->op == LOOM_IR_OP_ALL_REDUCE)
            loom_fe_error(a->ctx, LOOM_STATUS_UNSUPPORTED, a->loc.file, a->loc.line, "backward",
                          "all_reduce {reduce = %s} of %s has no gradient rule (only sum has)",
                          loom_ir_reduce_op_name(n->attrs.index), t);
        else
            loom_fe_error(a->ctx, LOOM_STATUS_UNSUPPORTED, a->loc.file, a->loc.line, "backward",
                          "%s of %s has no gradient rule%s", loom_ir_op_name(n->op), t,
                          n->op == LOOM_IR_OP_CONV2D_GRAD_INPUT ||
                                  n->op == LOOM_IR_OP_CONV2D_GRAD_WEIGHT
                              ? " (differentiating conv2d's gradient, a second derivative, is "
                                "not supported)"
                          : n->op == LOOM_IR_OP_MAX_POOL2D_GRAD
                              ? " (differentiating max_pool2d's gradient, a second derivative, "
                                "is not supported)"
                              : "");
    }
    a->failed = true;
    return -1;
}

/* x [..., L] as [..., L, 1] broadcast to node `like`'s [..., L, S]. */
static int32_t rows_like(ag *a, int32_t x, int32_t like) {
    if (x < 0 || like < 0)
        return -1;
    const loom_ir_node *xn = nd(a, x);
    int64_t s[LOOM_MAX_RANK];
    memcpy(s, xn->shape, (size_t)xn->rank * sizeof *s);
    s[xn->rank] = 1;
    return broadcast_like(a, shaped(a, LOOM_IR_OP_RESHAPE, x, xn->rank + 1, s), like);
}

/* An additive mask's gradient (operand mi of attention node n, whose gradient is g): dS =
 * P (dP - delta) over the scores [..., L, S], P = exp(scale q k^T + mask - lse) and dP = g
 * v^T, dropped as the forward dropped the weights, in f32 (f64 for f64 operands, as the
 * kernels compute), summed to the mask's shape. The one place the scores are materialized,
 * and only where the mask's gradient is asked for. */
static int32_t attention_mask_vjp(ag *a, const loom_ir_node *n, int32_t mi, int32_t lse,
                                  int32_t delta, int32_t g) {
    const loom_dtype F =
        nd(a, n->inputs[0])->dtype == LOOM_DTYPE_F64 ? LOOM_DTYPE_F64 : LOOM_DTYPE_F32;
    int32_t mask = n->inputs[mi];
    int32_t s =
        bin(a, LOOM_IR_OP_MATMUL, cast_to(a, n->inputs[0], F), mT(a, cast_to(a, n->inputs[1], F)));
    s = bin(a, LOOM_IR_OP_MUL, s, full_like(a, s, n->attrs.value));
    s = bin(a, LOOM_IR_OP_ADD, s, broadcast_like(a, cast_to(a, mask, F), s));
    int32_t p =
        un(a, LOOM_IR_OP_EXP, bin(a, LOOM_IR_OP_SUB, s, rows_like(a, cast_to(a, lse, F), s)));
    int32_t dp = bin(a, LOOM_IR_OP_MATMUL, cast_to(a, g, F), mT(a, cast_to(a, n->inputs[2], F)));
    if (n->attrs.dropout > 0 && dp >= 0) { /* the forward's draws (ops.def) */
        const loom_ir_node *dn = nd(a, dp);
        int64_t shape[LOOM_MAX_RANK];
        memcpy(shape, dn->shape, sizeof shape);
        int32_t seed = n->inputs[loom_ir_attention_operands(n->op)];
        int32_t u = emit(a, &(loom_ir_node_desc){.op = LOOM_IR_OP_RAND_UNIFORM,
                                                 .n_inputs = 1,
                                                 .inputs = &seed,
                                                 .dtype = F,
                                                 .rank = dn->rank,
                                                 .shape = shape});
        int32_t keep = bin(a, LOOM_IR_OP_GE, u, full_like(a, dp, n->attrs.dropout));
        dp = sel(a, keep,
                 bin(a, LOOM_IR_OP_MUL, dp, full_like(a, dp, 1.0 / (1.0 - n->attrs.dropout))),
                 full_like(a, dp, 0.0));
    }
    int32_t ds = bin(a, LOOM_IR_OP_MUL, p,
                     bin(a, LOOM_IR_OP_SUB, dp, rows_like(a, cast_to(a, delta, F), dp)));
    return ds < 0 ? -1 : cast_to(a, unbroadcast(a, ds, mask), nd(a, mask)->dtype);
}

/* Attention's gradient for operand k (q, k, v, or an additive mask) from its output gradient
 * g: the weights are recomputed by tiles from each row's logsumexp (attention_lse, of the
 * undropped masked scores) and delta = rowsum(g o) in f32 (FlashAttention's backward), made
 * once per attention node; the gradients take the seed (drawing the forward's keeps) and the
 * mask. The seed has no gradient. */
static int32_t attention_vjp(ag *a, int32_t id, const loom_ir_node *n, int32_t k, int32_t g) {
    int32_t mi = loom_ir_attention_mask(n), own = loom_ir_attention_operands(n->op);
    if (g < 0 || (k > 2 && k != mi))
        return -1; /* the seed: an integer operand, never asked for (as compare's) */
    int32_t q = n->inputs[0], kk = n->inputs[1], v = n->inputs[2], r = n->rank;
    /* the operands after each op's own: the seed (not attention_lse's), the mask */
    int32_t extra[2], n_extra = 0;
    for (int32_t e = own; e < n->n_inputs; e++)
        extra[n_extra++] = n->inputs[e];
    if (a->att != id) {
        a->att = id;
        a->att_lse = a->att_delta = -1;
    }
    loom_ir_attrs lse_attrs = n->attrs;
    lse_attrs.dropout = 0;
    if (a->att_lse < 0) {
        int32_t in[3] = {q, kk, mi >= 0 ? n->inputs[mi] : -1};
        a->att_lse = emit(a, &(loom_ir_node_desc){.op = LOOM_IR_OP_ATTENTION_LSE,
                                                  .n_inputs = 2 + (mi >= 0),
                                                  .inputs = in,
                                                  .attrs = lse_attrs});
    }
    int32_t lse = a->att_lse;
    if (k == 2) {
        int32_t in[6] = {q, kk, g, lse};
        memcpy(in + 4, extra, (size_t)n_extra * sizeof *extra);
        return lse < 0 ? -1
                       : emit(a, &(loom_ir_node_desc){.op = LOOM_IR_OP_ATTENTION_GRAD_V,
                                                      .n_inputs = 4 + n_extra,
                                                      .inputs = in,
                                                      .attrs = n->attrs});
    }
    if (a->att_delta < 0) {
        int32_t go =
            bin(a, LOOM_IR_OP_MUL, cast_to(a, g, LOOM_DTYPE_F32), cast_to(a, id, LOOM_DTYPE_F32));
        a->att_delta = reduce(a, LOOM_IR_OP_REDUCE_SUM, go, 1u << (r - 1), false);
    }
    int32_t delta = a->att_delta;
    if (lse < 0 || delta < 0)
        return -1;
    if (k == mi)
        return attention_mask_vjp(a, n, mi, lse, delta, g);
    int32_t in[8] = {q, kk, v, g, lse, delta};
    memcpy(in + 6, extra, (size_t)n_extra * sizeof *extra);
    return emit(a, &(loom_ir_node_desc){.op = k == 0 ? LOOM_IR_OP_ATTENTION_GRAD_Q
                                                     : LOOM_IR_OP_ATTENTION_GRAD_K,
                                        .n_inputs = 6 + n_extra,
                                        .inputs = in,
                                        .attrs = n->attrs});
}

/* d(out)/d(input k) * g for node `id` (whose gradient is g); -1 on failure. */
static int32_t vjp(ag *a, int32_t id, int32_t k, int32_t g) {
    loom_ir_node n = *nd(a, id); /* by value: emitting may move the node array */
    int32_t x = n.inputs[0], y = n.n_inputs > 1 ? n.inputs[1] : -1;
    switch (n.op) {
    case LOOM_IR_OP_INPUT:
    case LOOM_IR_OP_CONSTANT:
    case LOOM_IR_OP_IOTA:
    case LOOM_IR_OP_RAND_UNIFORM:
    case LOOM_IR_OP_ISFINITE:
    case LOOM_IR_OP_EQ:
    case LOOM_IR_OP_NE:
    case LOOM_IR_OP_LT:
    case LOOM_IR_OP_LE:
    case LOOM_IR_OP_GT:
    case LOOM_IR_OP_GE: return -1; /* never reached: no float operand needs it */
    case LOOM_IR_OP_ALL_REDUCE:    /* y = s * sum_r x_r: each rank's x_r gets s * sum_r g_r */
        if (n.attrs.index == LOOM_REDUCE_SUM) {
            loom_ir_node_desc dd = {
                .op = LOOM_IR_OP_ALL_REDUCE, .n_inputs = 1, .inputs = &g, .attrs = n.attrs};
            return emit(a, &dd);
        }
        return no_vjp(a, &n);
    case LOOM_IR_OP_BROADCAST_FROM:
    case LOOM_IR_OP_ALL_GATHER:
    case LOOM_IR_OP_CONV2D_GRAD_INPUT: /* conv2d's second derivative: not supported */
    case LOOM_IR_OP_CONV2D_GRAD_WEIGHT:
    case LOOM_IR_OP_MAX_POOL2D_GRAD:
    case LOOM_IR_OP_ATTENTION_LSE:    /* only attention's VJP reads it (as a statistic) */
    case LOOM_IR_OP_ATTENTION_GRAD_Q: /* attention's second derivative: not supported */
    case LOOM_IR_OP_ATTENTION_GRAD_K:
    case LOOM_IR_OP_ATTENTION_GRAD_V: return no_vjp(a, &n);
    case LOOM_IR_OP_ATTENTION: return attention_vjp(a, id, &n, k, g);
    case LOOM_IR_OP_MAX_POOL2D: { /* g to the pixel each window selected */
        int32_t in[2] = {x, g};
        return g < 0 ? -1
                     : emit(a, &(loom_ir_node_desc){.op = LOOM_IR_OP_MAX_POOL2D_GRAD,
                                                    .n_inputs = 2,
                                                    .inputs = in,
                                                    .attrs = {.conv = n.attrs.conv}});
    }
    case LOOM_IR_OP_CONV2D: { /* the gradient ops with the forward's window, x's / w's shape */
        if (g < 0)
            return -1;
        const loom_ir_node *like = nd(a, k == 0 ? x : y);
        int64_t shape[LOOM_MAX_RANK];
        memcpy(shape, like->shape, sizeof shape);
        int32_t in[2] = {k == 0 ? g : x, k == 0 ? y : g};
        return emit(a, &(loom_ir_node_desc){.op = k == 0 ? LOOM_IR_OP_CONV2D_GRAD_INPUT
                                                         : LOOM_IR_OP_CONV2D_GRAD_WEIGHT,
                                            .n_inputs = 2,
                                            .inputs = in,
                                            .rank = 4,
                                            .shape = shape,
                                            .attrs = {.conv = n.attrs.conv}});
    }
    case LOOM_IR_OP_GATHER: { /* g added back where each element was read from */
        if (g < 0)
            return -1;
        int32_t in[3] = {full_like(a, x, 0.0), y, g};
        return in[0] < 0 ? -1
                         : emit(a, &(loom_ir_node_desc){.op = LOOM_IR_OP_SCATTER_ADD,
                                                        .n_inputs = 3,
                                                        .inputs = in,
                                                        .attrs = {.index = n.attrs.index}});
    }
    case LOOM_IR_OP_SCATTER_ADD: { /* base: g; src: g read where each element was added */
        if (k == 0 || g < 0)
            return g;
        int32_t in[2] = {g, y};
        return emit(a, &(loom_ir_node_desc){.op = LOOM_IR_OP_GATHER,
                                            .n_inputs = 2,
                                            .inputs = in,
                                            .attrs = {.index = n.attrs.index}});
    }
    case LOOM_IR_OP_NEG: return un(a, LOOM_IR_OP_NEG, g);
    case LOOM_IR_OP_ABS: {
        int32_t zero = full_like(a, x, 0.0);
        int32_t pos = sel(a, bin(a, LOOM_IR_OP_GT, x, zero), g, full_like(a, g, 0.0));
        return sel(a, bin(a, LOOM_IR_OP_LT, x, zero), un(a, LOOM_IR_OP_NEG, g), pos);
    }
    case LOOM_IR_OP_EXP: return bin(a, LOOM_IR_OP_MUL, g, id);
    case LOOM_IR_OP_LOG: return bin(a, LOOM_IR_OP_DIV, g, x);
    case LOOM_IR_OP_SQRT: /* g / (2 sqrt x) */
        return bin(a, LOOM_IR_OP_DIV, g, bin(a, LOOM_IR_OP_ADD, id, id));
    case LOOM_IR_OP_RSQRT: { /* -0.5 x^-1.5 = -0.5 y^3 */
        int32_t y3 = bin(a, LOOM_IR_OP_MUL, bin(a, LOOM_IR_OP_MUL, id, id), id);
        return bin(a, LOOM_IR_OP_MUL, g, bin(a, LOOM_IR_OP_MUL, y3, full_like(a, id, -0.5)));
    }
    case LOOM_IR_OP_TANH: { /* 1 - y^2 */
        int32_t d = bin(a, LOOM_IR_OP_SUB, full_like(a, id, 1.0), bin(a, LOOM_IR_OP_MUL, id, id));
        return bin(a, LOOM_IR_OP_MUL, g, d);
    }
    case LOOM_IR_OP_SIGMOID: { /* y (1 - y) */
        int32_t d = bin(a, LOOM_IR_OP_MUL, id, bin(a, LOOM_IR_OP_SUB, full_like(a, id, 1.0), id));
        return bin(a, LOOM_IR_OP_MUL, g, d);
    }
    case LOOM_IR_OP_RELU: /* y > 0 exactly where x > 0: the output, which the next layer
                           * keeps anyway, not the input (as PyTorch's threshold_backward) */
        return sel(a, bin(a, LOOM_IR_OP_GT, id, full_like(a, id, 0.0)), g, full_like(a, g, 0.0));
    case LOOM_IR_OP_GELU: {
        /* gelu = x Phi(x): d = Phi(x) + x phi(x). Phi(x) = gelu(x) / x away from 0 (exact
         * in floating point: a quotient keeps relative precision), 1/2 at 0. */
        int32_t zero = full_like(a, x, 0.0);
        int32_t phi_cdf = sel(a, bin(a, LOOM_IR_OP_NE, x, zero), bin(a, LOOM_IR_OP_DIV, id, x),
                              full_like(a, x, 0.5));
        int32_t x2 = bin(a, LOOM_IR_OP_MUL, x, x);
        int32_t pdf = bin(a, LOOM_IR_OP_MUL,
                          un(a, LOOM_IR_OP_EXP, bin(a, LOOM_IR_OP_MUL, x2, full_like(a, x, -0.5))),
                          full_like(a, x, 0.39894228040143267794));
        int32_t d = bin(a, LOOM_IR_OP_ADD, phi_cdf, bin(a, LOOM_IR_OP_MUL, x, pdf));
        return bin(a, LOOM_IR_OP_MUL, g, d);
    }
    case LOOM_IR_OP_GELU_TANH: {
        /* y = x s, s = sigmoid(2u), u = C (x + K x^3): d = s + x s (1 - s) 2C (1 + 3K x^2) */
        int32_t x2 = bin(a, LOOM_IR_OP_MUL, x, x);
        int32_t u = bin(a, LOOM_IR_OP_MUL, full_like(a, x, 2.0 * LOOM_IR_GELU_TANH_C),
                        bin(a, LOOM_IR_OP_ADD, x,
                            bin(a, LOOM_IR_OP_MUL, full_like(a, x, LOOM_IR_GELU_TANH_K),
                                bin(a, LOOM_IR_OP_MUL, x2, x))));
        int32_t s = un(a, LOOM_IR_OP_SIGMOID, u);
        int32_t du =
            bin(a, LOOM_IR_OP_MUL, full_like(a, x, 2.0 * LOOM_IR_GELU_TANH_C),
                bin(a, LOOM_IR_OP_ADD, full_like(a, x, 1.0),
                    bin(a, LOOM_IR_OP_MUL, full_like(a, x, 3.0 * LOOM_IR_GELU_TANH_K), x2)));
        int32_t ds = bin(a, LOOM_IR_OP_MUL, s, bin(a, LOOM_IR_OP_SUB, full_like(a, s, 1.0), s));
        int32_t d =
            bin(a, LOOM_IR_OP_ADD, s, bin(a, LOOM_IR_OP_MUL, x, bin(a, LOOM_IR_OP_MUL, ds, du)));
        return bin(a, LOOM_IR_OP_MUL, g, d);
    }
    case LOOM_IR_OP_ADD: return g;
    case LOOM_IR_OP_SUB: return k == 0 ? g : un(a, LOOM_IR_OP_NEG, g);
    case LOOM_IR_OP_MUL: return bin(a, LOOM_IR_OP_MUL, g, k == 0 ? y : x);
    case LOOM_IR_OP_DIV: /* d/dx = 1/y; d/dy = -x/y^2 = -out/y */
        if (k == 0)
            return bin(a, LOOM_IR_OP_DIV, g, y);
        return un(a, LOOM_IR_OP_NEG, bin(a, LOOM_IR_OP_DIV, bin(a, LOOM_IR_OP_MUL, g, id), y));
    case LOOM_IR_OP_POW:
        if (k == 0) { /* b x^(b-1) */
            int32_t bm1 = bin(a, LOOM_IR_OP_SUB, y, full_like(a, y, 1.0));
            int32_t d = bin(a, LOOM_IR_OP_MUL, y, bin(a, LOOM_IR_OP_POW, x, bm1));
            return bin(a, LOOM_IR_OP_MUL, g, d);
        } else { /* x^b log x, 0 where x <= 0 (PyTorch's masked rule) */
            int32_t d = bin(a, LOOM_IR_OP_MUL, id, un(a, LOOM_IR_OP_LOG, x));
            int32_t pos = bin(a, LOOM_IR_OP_GT, x, full_like(a, x, 0.0));
            return sel(a, pos, bin(a, LOOM_IR_OP_MUL, g, d), full_like(a, g, 0.0));
        }
    case LOOM_IR_OP_MAXIMUM:
    case LOOM_IR_OP_MINIMUM: {
        /* The winner takes g, ties split it evenly. */
        int32_t me = k == 0 ? x : y, other = k == 0 ? y : x;
        loom_ir_op wins = n.op == LOOM_IR_OP_MAXIMUM ? LOOM_IR_OP_GT : LOOM_IR_OP_LT;
        int32_t half = bin(a, LOOM_IR_OP_MUL, g, full_like(a, g, 0.5));
        int32_t tie = sel(a, bin(a, LOOM_IR_OP_EQ, me, other), half, full_like(a, g, 0.0));
        return sel(a, bin(a, wins, me, other), g, tie);
    }
    case LOOM_IR_OP_SELECT: {
        int32_t c = n.inputs[0], zero = full_like(a, g, 0.0);
        return k == 1 ? sel(a, c, g, zero) : sel(a, c, zero, g);
    }
    case LOOM_IR_OP_CAST: return cast_to(a, g, nd(a, x)->dtype);
    case LOOM_IR_OP_BROADCAST: return unbroadcast(a, g, x);
    case LOOM_IR_OP_RESHAPE: return reshape_like(a, g, x);
    case LOOM_IR_OP_TRANSPOSE: {
        /* The gradient of B^T in C = A B^T (linear layers, the B-side VJP of a matmul) is
         * a matmul P Q; its transpose is Q^T P^T, and where P or Q is itself a transpose
         * that costs a transpose of the small factor instead of one of the (large) result. */
        const loom_ir_node *gn = nd(a, g);
        if (loom_ir_swaps_last2(&n) && gn->op == LOOM_IR_OP_MATMUL) {
            int32_t p = gn->inputs[0], q = gn->inputs[1];
            int64_t out = loom_ir_numel(gn->rank, gn->shape);
            bool pt = loom_ir_swaps_last2(nd(a, p)), qt = loom_ir_swaps_last2(nd(a, q));
            /* q^T as the new A costs nothing where the matmul packs it: GPT-2's tied
             * lm_head, whose wte gradient dy^T x then comes out [V, C] as wte is, instead of
             * [C, V] transposed by its readers */
            if ((pt && (qt || numel_of(a, q) <= out || packs_transposed(a, q))) ||
                (qt && numel_of(a, p) <= out))
                return bin(a, LOOM_IR_OP_MATMUL, mT(a, q), mT(a, p));
        }
        int32_t inv[LOOM_MAX_RANK] = {0};
        for (int32_t i = 0; i < n.rank; i++)
            inv[n.attrs.perm[i]] = i;
        return transpose(a, g, inv);
    }
    case LOOM_IR_OP_REDUCE_SUM: return unreduce(a, g, &n, x);
    case LOOM_IR_OP_REDUCE_MEAN: {
        const loom_ir_node *xn = nd(a, x);
        double count = 1;
        for (int32_t i = 0; i < xn->rank; i++)
            if ((n.attrs.axes >> i) & 1u)
                count *= (double)xn->shape[i];
        int32_t gb = unreduce(a, g, &n, x);
        return bin(a, LOOM_IR_OP_MUL, gb, full_like(a, gb, 1.0 / count));
    }
    case LOOM_IR_OP_REDUCE_MAX: {
        /* amax: g spread evenly over the elements equal to the maximum. */
        int32_t yb = unreduce(a, id, &n, x);
        int32_t m = cast_to(a, bin(a, LOOM_IR_OP_EQ, x, yb), nd(a, x)->dtype);
        int32_t cnt = reduce(a, LOOM_IR_OP_REDUCE_SUM, m, n.attrs.axes, true);
        cnt = broadcast_like(a, cnt, x);
        int32_t gb = unreduce(a, g, &n, x);
        return bin(a, LOOM_IR_OP_DIV, bin(a, LOOM_IR_OP_MUL, gb, m), cnt);
    }
    case LOOM_IR_OP_SLICE: { /* scatter g back: pad with start below, stride-1 between */
        int64_t low[LOOM_MAX_RANK], interior[LOOM_MAX_RANK];
        for (int32_t i = 0; i < n.rank; i++) {
            low[i] = n.attrs.start[i];
            interior[i] = n.attrs.step[i] - 1;
        }
        return moved_like(a, LOOM_IR_OP_PAD, g, x, low, interior);
    }
    case LOOM_IR_OP_PAD: { /* the operand's elements sit at low + i * (interior + 1) */
        int64_t start[LOOM_MAX_RANK], stride[LOOM_MAX_RANK];
        for (int32_t i = 0; i < n.rank; i++) {
            start[i] = n.attrs.start[i];
            stride[i] = n.attrs.step[i] + 1;
        }
        return moved_like(a, LOOM_IR_OP_SLICE, g, x, start, stride);
    }
    case LOOM_IR_OP_CONCAT: { /* operand k's slab of g */
        int64_t start[LOOM_MAX_RANK] = {0}, stride[LOOM_MAX_RANK];
        int32_t ax = (int32_t)n.attrs.index;
        for (int32_t j = 0; j < k; j++)
            start[ax] += nd(a, n.inputs[j])->shape[ax];
        for (int32_t i = 0; i < n.rank; i++)
            stride[i] = 1;
        return moved_like(a, LOOM_IR_OP_SLICE, g, n.inputs[k], start, stride);
    }
    case LOOM_IR_OP_MATMUL: {
        /* C = A B: dA = G B^T = (B G^T)^T, dB = A^T G = (G^T A)^T. Each form materialises
         * some transposes (a transpose of a transpose is free; the outer one of the second
         * form usually fuses into the consumer but is counted too): take the one moving
         * less, which for im2col convolutions avoids transposing the huge column matrix. */
        int32_t other = k == 0 ? y : x;
        int64_t direct = cost_mT(a, other);
        int64_t flipped = cost_mT(a, g) + numel_of(a, k == 0 ? x : y);
        if (direct <= flipped)
            return k == 0 ? bin(a, LOOM_IR_OP_MATMUL, g, mT(a, y))
                          : bin(a, LOOM_IR_OP_MATMUL, mT(a, x), g);
        return k == 0 ? mT(a, bin(a, LOOM_IR_OP_MATMUL, y, mT(a, g)))
                      : mT(a, bin(a, LOOM_IR_OP_MATMUL, mT(a, g), x));
    }
    case LOOM_IR_OP_COUNT_: break;
    }
    return -1;
}

bool loom_fe_is_detached(const loom_context *ctx, int32_t node) {
    return ctx->detached_step == ctx->step && node < ctx->n_detached && ctx->detached[node];
}

LOOM_API loom_tensor *loom_detach_at(loom_context *ctx, loom_tensor *t, const char *file,
                                     int line) {
    LOOM_FE_USE(ctx, "detach", NULL);
    static const char op[] = "detach";
    if (!ctx)
        return NULL;
    if (!t) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "operand 0 is NULL (from an earlier failed op?)");
        return NULL;
    }
    loom_fe_tensor *ft = loom_fe_tensor_get(ctx, t, file, line, op);
    if (!ft)
        return NULL;
    int32_t x = loom_fe_tensor_node(ctx, (int32_t)(ft - ctx->tensors), file, line, op);
    if (x < 0)
        return NULL;
    /* A reshape to its own shape: a view the planner makes free, marked as a barrier. */
    const loom_ir_node *xn = &ctx->trace.nodes[x];
    int64_t shape[LOOM_MAX_RANK];
    memcpy(shape, xn->shape, sizeof shape);
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_RESHAPE,
                              .n_inputs = 1,
                              .inputs = &x,
                              .rank = xn->rank,
                              .shape = shape,
                              .loc = {file, line, ctx->scope, false}};
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    int32_t id;
    if (loom_ir_graph_add(&ctx->trace, &desc, &id, &d) != LOOM_OK) {
        loom_fe_error(ctx, d.code, file, line, op, "%s", d.msg);
        return NULL;
    }
    if (ctx->detached_step != ctx->step) { /* marks of earlier steps are void */
        ctx->n_detached = 0;
        ctx->detached_step = ctx->step;
    }
    if (!loom_ir_grow(&ctx->alloc, (void **)&ctx->detached, &ctx->cap_detached, id + 1, 1)) {
        loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, file, line, op, "out of memory");
        return NULL;
    }
    /* grow leaves new bytes uninitialised: clear between the old and the new end. */
    if (id + 1 > ctx->n_detached) {
        memset(ctx->detached + ctx->n_detached, 0, (size_t)(id + 1 - ctx->n_detached));
        ctx->n_detached = id + 1;
    }
    ctx->detached[id] = 1;
    return loom_fe_result(ctx, id, file, line, op);
}

static bool is_float_node(const ag *a, int32_t id) {
    return loom_ir_dtype_is_float(nd(a, id)->dtype);
}

LOOM_API loom_status loom_backward_at(loom_context *ctx, loom_tensor *loss, int32_t n,
                                      loom_tensor *const *wrt, loom_tensor **out_grads,
                                      const char *file, int line) {
    LOOM_FE_USE(ctx, "backward", LOOM_STATUS_BUSY);
    static const char op[] = "backward";
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (!loss || n < 1 || !wrt || !out_grads)
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                             !loss   ? "loss is NULL (from an earlier failed op?)"
                             : n < 1 ? "n must be >= 1, got %d"
                                     : "wrt or out_grads is NULL",
                             (int)n);
    loom_fe_tensor *lt = loom_fe_tensor_get(ctx, loss, file, line, op);
    if (!lt)
        return ctx->err;
    if (!loom_ir_dtype_is_float(lt->dtype))
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                             "loss must have a float dtype, got %s", loom_dtype_name(lt->dtype));
    int32_t loss_node = loom_fe_tensor_node(ctx, (int32_t)(lt - ctx->tensors), file, line, op);
    if (loss_node < 0)
        return ctx->err;

    /* Resolve wrt and accumulation targets before touching anything. */
    size_t wbytes = (size_t)n * sizeof(int32_t);
    int32_t *wnode = loom_ir_alloc(&ctx->alloc, wbytes);
    if (!wnode)
        return loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, file, line, op, "out of memory");
    loom_status st = LOOM_OK;
    for (int32_t i = 0; i < n && st == LOOM_OK; i++) {
        if (!wrt[i]) {
            st = loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op, "wrt[%d] is NULL",
                               (int)i);
            break;
        }
        loom_fe_tensor *t = loom_fe_tensor_get(ctx, wrt[i], file, line, op);
        if (!t) {
            st = ctx->err;
            break;
        }
        if (!loom_ir_dtype_is_float(t->dtype)) {
            st = loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                               "wrt[%d] must have a float dtype, got %s", (int)i,
                               loom_dtype_name(t->dtype));
            break;
        }
        loom_dtype dt = t->dtype;
        int32_t rank = t->rank;
        int64_t shape[LOOM_MAX_RANK];
        memcpy(shape, t->shape, sizeof shape);
        wnode[i] = loom_fe_tensor_node(ctx, (int32_t)(t - ctx->tensors), file, line, op);
        if (wnode[i] < 0) {
            st = ctx->err;
            break;
        }
        if (out_grads[i]) {
            loom_fe_tensor *o = loom_fe_tensor_get(ctx, out_grads[i], file, line, op);
            if (!o) {
                st = ctx->err;
                break;
            }
            if (o->dtype != dt || o->rank != rank ||
                memcmp(o->shape, shape, (size_t)rank * sizeof *shape) != 0) {
                char ta[LOOM_IR_TYPE_STR_MAX], tb[LOOM_IR_TYPE_STR_MAX];
                st = loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                                   "out_grads[%d] is %s but wrt[%d] is %s", (int)i,
                                   loom_ir_format_type(ta, sizeof ta, o->dtype, o->rank, o->shape),
                                   (int)i, loom_ir_format_type(tb, sizeof tb, dt, rank, shape));
            }
        }
    }
    /* Resolving a wrt may have added an INPUT node after the loss: such a tensor cannot be
     * among the loss's ancestors, so ids past the loss simply get no gradient. */
    int32_t total = ctx->trace.n_nodes;
    uint8_t *needs = NULL;
    int32_t *grad = NULL;
    size_t nbytes = (size_t)total;
    if (st == LOOM_OK) {
        needs = loom_ir_alloc(&ctx->alloc, nbytes);
        grad = loom_ir_alloc(&ctx->alloc, (size_t)total * sizeof *grad);
        if (!needs || !grad)
            st = loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, file, line, op, "out of memory");
    }
    if (st == LOOM_OK) {
        ag a = {.ctx = ctx, .loc = {file, line}, .autocast = LOOM_DTYPE_F32, .att = -1};
        memset(needs, 0, nbytes);
        for (int32_t i = 0; i < total; i++)
            grad[i] = -1;
        for (int32_t i = 0; i < n; i++)
            needs[wnode[i]] = 1;
        for (int32_t i = 0; i <= loss_node; i++) {
            const loom_ir_node *x = nd(&a, i);
            if (needs[i] || !is_float_node(&a, i) || loom_fe_is_detached(ctx, i))
                continue;
            for (int32_t k = 0; k < x->n_inputs; k++)
                if (needs[x->inputs[k]] && is_float_node(&a, x->inputs[k]))
                    needs[i] = 1;
        }
        if (needs[loss_node]) {
            a.loc = nd(&a, loss_node)->loc;
            grad[loss_node] = full_like(&a, loss_node, 1.0);
        }
        for (int32_t i = loss_node; i >= 0 && !a.failed; i--) {
            if (grad[i] < 0 || !needs[i])
                continue;
            a.loc = nd(&a, i)->loc;
            a.autocast = nd(&a, i)->attrs.autocast;
            int32_t nin = nd(&a, i)->n_inputs;
            /* operands in order: for conv2d the input gradient, which reads the weight,
             * before the weight gradient, into whose epilogue fusion moves the optimizer's
             * update, so that the update writes the weight (and its momentum) in place */
            for (int32_t k = 0; k < nin && !a.failed; k++) {
                int32_t in = nd(&a, i)->inputs[k];
                if (!needs[in] || !is_float_node(&a, in))
                    continue;
                int32_t c = vjp(&a, i, k, grad[i]);
                if (c < 0) {
                    if (!a.failed)
                        loom_fe_error(ctx, LOOM_STATUS_INTERNAL, a.loc.file, a.loc.line, op,
                                      "no gradient rule for %s", loom_ir_op_name(nd(&a, i)->op));
                    a.failed = true;
                    break;
                }
                grad[in] = grad[in] < 0 ? c : bin(&a, LOOM_IR_OP_ADD, grad[in], c);
            }
        }
        /* Hand out the results: zeros where the loss does not depend on wrt[i]. */
        a.loc = (loom_ir_loc){.file = file, .line = line, .backward = true};
        a.autocast = LOOM_DTYPE_F32;
        int32_t *res = wnode; /* reused: per i, the gradient node */
        for (int32_t i = 0; i < n && !a.failed; i++) {
            int32_t w = wnode[i];
            int32_t gnode = w <= loss_node && grad[w] >= 0 ? grad[w] : full_like(&a, w, 0.0);
            if (out_grads[i] && gnode >= 0) {
                loom_fe_tensor *o = loom_fe_tensor_get(ctx, out_grads[i], file, line, op);
                int32_t on =
                    o ? loom_fe_tensor_node(ctx, (int32_t)(o - ctx->tensors), file, line, op) : -1;
                gnode = on < 0 ? -1 : bin(&a, LOOM_IR_OP_ADD, on, gnode);
                a.failed = a.failed || gnode < 0;
            }
            res[i] = gnode;
        }
        if (a.failed) {
            st = ctx->err ? ctx->err : LOOM_STATUS_INTERNAL;
        } else {
            /* All-or-nothing: make every handle only once every node exists. */
            for (int32_t i = 0; i < n; i++) {
                loom_tensor *h = loom_fe_result(ctx, res[i], file, line, op);
                if (!h) {
                    st = ctx->err;
                    break;
                }
                out_grads[i] = h;
            }
        }
    }
    loom_ir_free(&ctx->alloc, grad, (size_t)total * sizeof *grad);
    loom_ir_free(&ctx->alloc, needs, nbytes);
    loom_ir_free(&ctx->alloc, wnode, wbytes);
    return st;
}

enum { PROBE_MAX_INPUTS = 8 }; /* a sample's operands per node and float inputs */

loom_status loom_fe_vjp_probe(const loom_ir_graph *g, int32_t subject, bool *applies,
                              loom_ir_diag *d) {
    static const char op[] = "vjp probe";
    *applies = false;
    if (!g || subject < 0 || subject >= g->n_nodes)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "%s: no node %d", op,
                                (int)subject);
    const loom_ir_node *sn = &g->nodes[subject];
    bool float_operand = false;
    for (int32_t k = 0; k < sn->n_inputs; k++)
        float_operand = float_operand || loom_ir_dtype_is_float(g->nodes[sn->inputs[k]].dtype);
    if (!loom_ir_dtype_is_float(sn->dtype) || !float_operand)
        return LOOM_OK;
    loom_context_options o;
    loom_context_options_init(&o);
    o.eager = o.debug = o.profile = false;
    o.dump_dir = o.trace_path = NULL;
    o.cache_dir = "";
    o.num_threads = 1;
    loom_context *ctx = NULL;
    if (loom_context_create(&o, &ctx) != LOOM_OK)
        return loom_ir_diag_set(d, LOOM_STATUS_OUT_OF_MEMORY, "%s: cannot create a context", op);
    size_t map_bytes = (size_t)(subject + 1) * sizeof(int32_t);
    int32_t *map = loom_ir_alloc(&ctx->alloc, map_bytes);
    loom_tensor *wrt[PROBE_MAX_INPUTS], *grads[PROBE_MAX_INPUTS] = {0};
    int32_t n_wrt = 0;
    loom_status st = map ? LOOM_OK : LOOM_STATUS_OUT_OF_MEMORY;
    for (int32_t i = 0; i <= subject && st == LOOM_OK; i++) {
        const loom_ir_node *n = &g->nodes[i];
        if (n->op == LOOM_IR_OP_INPUT) {
            size_t bytes = loom_ir_node_bytes(n);
            void *zeros = loom_ir_alloc(&ctx->alloc, bytes + 1);
            loom_tensor *t = NULL;
            if (zeros) {
                memset(zeros, 0, bytes + 1);
                t = loom_tensor_from_host(ctx, n->dtype, n->rank, n->shape, zeros);
                loom_ir_free(&ctx->alloc, zeros, bytes + 1);
            }
            loom_fe_tensor *ft = t ? loom_fe_tensor_get(ctx, t, __FILE__, __LINE__, op) : NULL;
            map[i] =
                ft ? loom_fe_tensor_node(ctx, (int32_t)(ft - ctx->tensors), __FILE__, __LINE__, op)
                   : -1;
            if (map[i] >= 0 && loom_ir_dtype_is_float(n->dtype) && n_wrt < PROBE_MAX_INPUTS)
                wrt[n_wrt++] = t;
        } else {
            int32_t in[PROBE_MAX_INPUTS];
            for (int32_t k = 0; k < n->n_inputs && k < PROBE_MAX_INPUTS; k++)
                in[k] = map[n->inputs[k]];
            loom_ir_node_desc desc = {.op = n->op,
                                      .n_inputs = n->n_inputs,
                                      .inputs = in,
                                      .dtype = n->dtype,
                                      .rank = n->rank,
                                      .shape = n->shape,
                                      .attrs = n->attrs,
                                      .loc = {0}};
            if (n->n_inputs > PROBE_MAX_INPUTS)
                st = loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "%s: %%%d has %d operands",
                                      op, (int)i, (int)n->n_inputs);
            else
                st = loom_ir_graph_add(&ctx->trace, &desc, &map[i], d);
        }
        if (st == LOOM_OK && map[i] < 0)
            st = loom_ir_diag_set(d, loom_context_error(ctx), "%s: %s", op,
                                  loom_context_error_message(ctx));
    }
    if (st == LOOM_OK && n_wrt > 0) {
        *applies = true;
        loom_tensor *s = loom_fe_result(ctx, map[subject], __FILE__, __LINE__, op);
        if (!s || loom_backward(ctx, s, n_wrt, wrt, grads) != LOOM_OK)
            st =
                loom_ir_diag_set(d, loom_context_error(ctx), "%s", loom_context_error_message(ctx));
    }
    if (map)
        loom_ir_free(&ctx->alloc, map, map_bytes);
    loom_context_destroy(ctx);
    return st;
}
