/* Op builders: validate the user's call, record IR nodes in the trace, return step-scoped
 * results. Nothing is computed here. */
#include <string.h>

#include "frontend.h"

/* Resolves operands to trace nodes. NULL operands: NULL result, recording an error only if
 * none is recorded yet (so the first failure in an expression is the one reported). */
static bool operands(loom_context *ctx, int32_t n, loom_tensor *const *hs, int32_t *nodes,
                     const char *file, int line, const char *op) {
    for (int32_t k = 0; k < n; k++) {
        if (!hs[k]) {
            loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                          "operand %d is NULL (from an earlier failed op?)", (int)k);
            return false;
        }
        loom_fe_tensor *t = loom_fe_tensor_get(ctx, hs[k], file, line, op);
        if (!t)
            return false;
        nodes[k] = loom_fe_tensor_node(ctx, (int32_t)(t - ctx->tensors), file, line, op);
        if (nodes[k] < 0)
            return false;
    }
    return true;
}

/* Appends a node to the trace; -1 after recording the inference error. */
static int32_t record(loom_context *ctx, const loom_ir_node_desc *desc, const char *op) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    int32_t id;
    if (loom_ir_graph_add(&ctx->trace, desc, &id, &d) != LOOM_OK) {
        loom_fe_error(ctx, d.code, desc->loc.file, desc->loc.line, op, "%s", d.msg);
        return -1;
    }
    return id;
}

static loom_tensor *finish(loom_context *ctx, const loom_ir_node_desc *desc, const char *op) {
    int32_t id = record(ctx, desc, op);
    return id < 0 ? NULL : loom_fe_result(ctx, id, desc->loc.file, desc->loc.line, op);
}

static const loom_ir_node *node_of(const loom_context *ctx, int32_t id) {
    return &ctx->trace.nodes[id];
}

/* numpy broadcasting of n operands: the common shape, or false after recording an error. */
static bool broadcast_shape(loom_context *ctx, int32_t n, const int32_t *nodes, int32_t *out_rank,
                            int64_t *out_shape, const char *file, int line, const char *op) {
    int32_t rank = 0;
    for (int32_t k = 0; k < n; k++)
        if (node_of(ctx, nodes[k])->rank > rank)
            rank = node_of(ctx, nodes[k])->rank;
    for (int32_t i = 0; i < rank; i++)
        out_shape[i] = 1;
    for (int32_t k = 0; k < n; k++) {
        const loom_ir_node *x = node_of(ctx, nodes[k]);
        int32_t off = rank - x->rank;
        for (int32_t i = 0; i < x->rank; i++) {
            int64_t e = x->shape[i], *o = &out_shape[off + i];
            if (e == *o || e == 1)
                continue;
            if (*o == 1) {
                *o = e;
                continue;
            }
            char ta[LOOM_IR_TYPE_STR_MAX], tb[LOOM_IR_TYPE_STR_MAX];
            const loom_ir_node *y = node_of(ctx, nodes[0]);
            loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                          "shapes cannot be broadcast together: %s vs %s",
                          loom_ir_format_type(ta, sizeof ta, y->dtype, y->rank, y->shape),
                          loom_ir_format_type(tb, sizeof tb, x->dtype, x->rank, x->shape));
            return false;
        }
    }
    *out_rank = rank;
    return true;
}

/* Broadcasts each operand to the common shape, adding broadcast nodes where needed. */
static bool broadcast_all(loom_context *ctx, int32_t n, int32_t *nodes, const char *file,
                          int line, const char *op) {
    int32_t rank;
    int64_t shape[LOOM_MAX_RANK];
    if (!broadcast_shape(ctx, n, nodes, &rank, shape, file, line, op))
        return false;
    for (int32_t k = 0; k < n; k++) {
        const loom_ir_node *x = node_of(ctx, nodes[k]);
        if (x->rank == rank && memcmp(x->shape, shape, (size_t)rank * sizeof *shape) == 0)
            continue;
        loom_ir_node_desc desc = {.op = LOOM_IR_OP_BROADCAST, .n_inputs = 1, .inputs = &nodes[k],
                                  .rank = rank, .shape = shape, .loc = {file, line}};
        if ((nodes[k] = record(ctx, &desc, op)) < 0)
            return false;
    }
    return true;
}

static loom_tensor *elementwise(loom_context *ctx, loom_ir_op opc, int32_t n, loom_tensor *const *hs,
                                const char *file, int line) {
    const char *op = loom_ir_op_name(opc);
    int32_t nodes[3];
    if (!ctx || !operands(ctx, n, hs, nodes, file, line, op))
        return NULL;
    if (n > 1 && !broadcast_all(ctx, n, nodes, file, line, op))
        return NULL;
    loom_ir_node_desc desc = {.op = opc, .n_inputs = n, .inputs = nodes, .loc = {file, line}};
    return finish(ctx, &desc, op);
}

#define DEFINE_UNARY(name, OPC)                                                                \
    LOOM_API loom_tensor *loom_##name##_at(loom_context *ctx, loom_tensor *a, const char *file, \
                                           int line) {                                         \
        return elementwise(ctx, LOOM_IR_OP_##OPC, 1, &a, file, line);                          \
    }
#define DEFINE_BINARY(name, OPC)                                                               \
    LOOM_API loom_tensor *loom_##name##_at(loom_context *ctx, loom_tensor *a, loom_tensor *b,   \
                                           const char *file, int line) {                       \
        loom_tensor *hs[2] = {a, b};                                                           \
        return elementwise(ctx, LOOM_IR_OP_##OPC, 2, hs, file, line);                          \
    }
DEFINE_UNARY(neg, NEG)
DEFINE_UNARY(abs, ABS)
DEFINE_UNARY(exp, EXP)
DEFINE_UNARY(log, LOG)
DEFINE_UNARY(sqrt, SQRT)
DEFINE_UNARY(rsqrt, RSQRT)
DEFINE_UNARY(tanh, TANH)
DEFINE_UNARY(sigmoid, SIGMOID)
DEFINE_UNARY(relu, RELU)
DEFINE_UNARY(gelu, GELU)
DEFINE_UNARY(isfinite, ISFINITE)
DEFINE_BINARY(add, ADD)
DEFINE_BINARY(sub, SUB)
DEFINE_BINARY(mul, MUL)
DEFINE_BINARY(div, DIV)
DEFINE_BINARY(pow, POW)
DEFINE_BINARY(maximum, MAXIMUM)
DEFINE_BINARY(minimum, MINIMUM)
DEFINE_BINARY(eq, EQ)
DEFINE_BINARY(ne, NE)
DEFINE_BINARY(lt, LT)
DEFINE_BINARY(le, LE)
DEFINE_BINARY(gt, GT)
DEFINE_BINARY(ge, GE)

LOOM_API loom_tensor *loom_select_at(loom_context *ctx, loom_tensor *cond, loom_tensor *a,
                                     loom_tensor *b, const char *file, int line) {
    loom_tensor *hs[3] = {cond, a, b};
    return elementwise(ctx, LOOM_IR_OP_SELECT, 3, hs, file, line);
}

LOOM_API loom_tensor *loom_full_at(loom_context *ctx, loom_dtype dtype, int32_t rank,
                                   const int64_t *shape, double value, const char *file,
                                   int line) {
    if (!ctx)
        return NULL;
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_CONSTANT, .dtype = dtype, .rank = rank,
                              .shape = shape, .attrs = {.value = value}, .loc = {file, line}};
    return finish(ctx, &desc, "full");
}

LOOM_API loom_tensor *loom_cast_at(loom_context *ctx, loom_tensor *a, loom_dtype dtype,
                                   const char *file, int line) {
    int32_t node;
    if (!ctx || !operands(ctx, 1, &a, &node, file, line, "cast"))
        return NULL;
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_CAST, .n_inputs = 1, .inputs = &node,
                              .dtype = dtype, .loc = {file, line}};
    return finish(ctx, &desc, "cast");
}

/* Shape-taking ops validate rank and pointer before the IR sees them. */
static bool check_target(loom_context *ctx, int32_t rank, const int64_t *shape, const char *file,
                         int line, const char *op) {
    if (rank < 0 || rank > LOOM_MAX_RANK) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "rank %d is out of range (0..%d)", (int)rank, LOOM_MAX_RANK);
        return false;
    }
    if (rank > 0 && !shape) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op, "shape is NULL");
        return false;
    }
    return true;
}

LOOM_API loom_tensor *loom_broadcast_at(loom_context *ctx, loom_tensor *a, int32_t rank,
                                        const int64_t *shape, const char *file, int line) {
    int32_t node;
    if (!ctx || !operands(ctx, 1, &a, &node, file, line, "broadcast") ||
        !check_target(ctx, rank, shape, file, line, "broadcast"))
        return NULL;
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_BROADCAST, .n_inputs = 1, .inputs = &node,
                              .rank = rank, .shape = shape, .loc = {file, line}};
    return finish(ctx, &desc, "broadcast");
}

LOOM_API loom_tensor *loom_reshape_at(loom_context *ctx, loom_tensor *a, int32_t rank,
                                      const int64_t *shape, const char *file, int line) {
    static const char op[] = "reshape";
    int32_t node;
    if (!ctx || !operands(ctx, 1, &a, &node, file, line, op) ||
        !check_target(ctx, rank, shape, file, line, op))
        return NULL;
    /* Resolve one -1 extent from the element count. */
    int64_t target[LOOM_MAX_RANK];
    int32_t infer_at = -1;
    int64_t known = 1;
    for (int32_t i = 0; i < rank; i++) {
        target[i] = shape[i];
        if (shape[i] == -1) {
            if (infer_at >= 0) {
                loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                              "only one extent may be -1");
                return NULL;
            }
            infer_at = i;
        } else if (shape[i] >= 0) {
            known *= shape[i];
        }
    }
    if (infer_at >= 0) {
        const loom_ir_node *x = node_of(ctx, node);
        int64_t total = loom_ir_numel(x->rank, x->shape);
        if (known == 0 || total % known != 0) {
            char t[LOOM_IR_TYPE_STR_MAX];
            loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                          "cannot infer the -1 extent: %lld elements of %s are not a multiple "
                          "of %lld",
                          (long long)total,
                          loom_ir_format_type(t, sizeof t, x->dtype, x->rank, x->shape),
                          (long long)known);
            return NULL;
        }
        target[infer_at] = total / known;
    }
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_RESHAPE, .n_inputs = 1, .inputs = &node,
                              .rank = rank, .shape = target, .loc = {file, line}};
    return finish(ctx, &desc, op);
}

LOOM_API loom_tensor *loom_permute_at(loom_context *ctx, loom_tensor *a, const int32_t *perm,
                                      const char *file, int line) {
    int32_t node;
    if (!ctx || !operands(ctx, 1, &a, &node, file, line, "permute"))
        return NULL;
    if (!perm && node_of(ctx, node)->rank > 0) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, "permute", "perm is NULL");
        return NULL;
    }
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_TRANSPOSE, .n_inputs = 1, .inputs = &node,
                              .loc = {file, line}};
    for (int32_t i = 0; i < node_of(ctx, node)->rank; i++)
        desc.attrs.perm[i] = perm[i];
    return finish(ctx, &desc, "permute");
}

LOOM_API loom_tensor *loom_transpose_at(loom_context *ctx, loom_tensor *a, const char *file,
                                        int line) {
    int32_t node;
    if (!ctx || !operands(ctx, 1, &a, &node, file, line, "transpose"))
        return NULL;
    int32_t rank = node_of(ctx, node)->rank;
    if (rank < 2) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, "transpose",
                      "needs rank >= 2, got rank %d", (int)rank);
        return NULL;
    }
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_TRANSPOSE, .n_inputs = 1, .inputs = &node,
                              .loc = {file, line}};
    for (int32_t i = 0; i < rank; i++)
        desc.attrs.perm[i] = i;
    desc.attrs.perm[rank - 2] = rank - 1;
    desc.attrs.perm[rank - 1] = rank - 2;
    return finish(ctx, &desc, "transpose");
}

static loom_tensor *reduce(loom_context *ctx, loom_ir_op opc, const char *op, loom_tensor *a,
                           int32_t n_axes, const int32_t *axes, bool keepdim, const char *file,
                           int line) {
    int32_t node;
    if (!ctx || !operands(ctx, 1, &a, &node, file, line, op))
        return NULL;
    int32_t rank = node_of(ctx, node)->rank;
    uint32_t mask = 0;
    if (n_axes == 0) {
        mask = rank ? (uint32_t)((1u << rank) - 1) : 0;
    } else {
        if (n_axes < 0 || !axes) {
            loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                          n_axes < 0 ? "n_axes is negative" : "axes is NULL");
            return NULL;
        }
        for (int32_t i = 0; i < n_axes; i++) {
            int32_t ax = axes[i] < 0 ? axes[i] + rank : axes[i];
            if (ax < 0 || ax >= rank || (mask & (1u << ax))) {
                loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                              ax >= 0 && ax < rank ? "axis %d is listed twice"
                                                   : "axis %d is out of range for rank %d",
                              (int)axes[i], (int)rank);
                return NULL;
            }
            mask |= 1u << ax;
        }
    }
    loom_ir_node_desc desc = {.op = opc, .n_inputs = 1, .inputs = &node,
                              .attrs = {.axes = mask, .keepdim = keepdim}, .loc = {file, line}};
    return finish(ctx, &desc, op);
}

LOOM_API loom_tensor *loom_sum_at(loom_context *ctx, loom_tensor *a, int32_t n_axes,
                                  const int32_t *axes, bool keepdim, const char *file, int line) {
    return reduce(ctx, LOOM_IR_OP_REDUCE_SUM, "sum", a, n_axes, axes, keepdim, file, line);
}

LOOM_API loom_tensor *loom_mean_at(loom_context *ctx, loom_tensor *a, int32_t n_axes,
                                   const int32_t *axes, bool keepdim, const char *file, int line) {
    return reduce(ctx, LOOM_IR_OP_REDUCE_MEAN, "mean", a, n_axes, axes, keepdim, file, line);
}

LOOM_API loom_tensor *loom_max_at(loom_context *ctx, loom_tensor *a, int32_t n_axes,
                                  const int32_t *axes, bool keepdim, const char *file, int line) {
    return reduce(ctx, LOOM_IR_OP_REDUCE_MAX, "max", a, n_axes, axes, keepdim, file, line);
}

/* Reshape helper for matmul's rank-1 promotion and batch broadcasting. */
static int32_t reshaped(loom_context *ctx, loom_ir_op opc, int32_t node, int32_t rank,
                        const int64_t *shape, const char *file, int line) {
    loom_ir_node_desc desc = {.op = opc, .n_inputs = 1, .inputs = &node, .rank = rank,
                              .shape = shape, .loc = {file, line}};
    return record(ctx, &desc, "matmul");
}

LOOM_API loom_tensor *loom_matmul_at(loom_context *ctx, loom_tensor *a, loom_tensor *b,
                                     const char *file, int line) {
    static const char op[] = "matmul";
    loom_tensor *hs[2] = {a, b};
    int32_t nodes[2];
    if (!ctx || !operands(ctx, 2, hs, nodes, file, line, op))
        return NULL;
    const loom_ir_node *x = node_of(ctx, nodes[0]), *y = node_of(ctx, nodes[1]);
    if (x->rank == 0 || y->rank == 0) {
        char ta[LOOM_IR_TYPE_STR_MAX], tb[LOOM_IR_TYPE_STR_MAX];
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "operands must have rank >= 1: %s x %s",
                      loom_ir_format_type(ta, sizeof ta, x->dtype, x->rank, x->shape),
                      loom_ir_format_type(tb, sizeof tb, y->dtype, y->rank, y->shape));
        return NULL;
    }
    bool vec_a = x->rank == 1, vec_b = y->rank == 1;
    int64_t s[LOOM_MAX_RANK];
    if (vec_a) { /* [K] -> [1, K] */
        s[0] = 1;
        s[1] = x->shape[0];
        if ((nodes[0] = reshaped(ctx, LOOM_IR_OP_RESHAPE, nodes[0], 2, s, file, line)) < 0)
            return NULL;
    }
    if (vec_b) { /* [K] -> [K, 1] */
        s[0] = node_of(ctx, nodes[1])->shape[0];
        s[1] = 1;
        if ((nodes[1] = reshaped(ctx, LOOM_IR_OP_RESHAPE, nodes[1], 2, s, file, line)) < 0)
            return NULL;
    }
    /* Broadcast batch dimensions to a common rank and shape. */
    x = node_of(ctx, nodes[0]);
    y = node_of(ctx, nodes[1]);
    int32_t rank = x->rank > y->rank ? x->rank : y->rank;
    int64_t batch[LOOM_MAX_RANK];
    for (int32_t i = 0; i < rank - 2; i++) {
        int32_t ix = i - (rank - x->rank), iy = i - (rank - y->rank);
        int64_t ex = ix >= 0 ? x->shape[ix] : 1, ey = iy >= 0 ? y->shape[iy] : 1;
        if (ex != ey && ex != 1 && ey != 1) {
            char ta[LOOM_IR_TYPE_STR_MAX], tb[LOOM_IR_TYPE_STR_MAX];
            loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                          "batch dimensions cannot be broadcast: %s x %s",
                          loom_ir_format_type(ta, sizeof ta, x->dtype, x->rank, x->shape),
                          loom_ir_format_type(tb, sizeof tb, y->dtype, y->rank, y->shape));
            return NULL;
        }
        batch[i] = ex == 1 ? ey : ex;
    }
    for (int32_t k = 0; k < 2; k++) {
        const loom_ir_node *z = node_of(ctx, nodes[k]);
        memcpy(s, batch, (size_t)(rank - 2) * sizeof *s);
        s[rank - 2] = z->shape[z->rank - 2];
        s[rank - 1] = z->shape[z->rank - 1];
        if (z->rank != rank || memcmp(z->shape, s, (size_t)rank * sizeof *s) != 0)
            if ((nodes[k] = reshaped(ctx, LOOM_IR_OP_BROADCAST, nodes[k], rank, s, file, line)) < 0)
                return NULL;
    }
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_MATMUL, .n_inputs = 2, .inputs = nodes,
                              .loc = {file, line}};
    int32_t id = record(ctx, &desc, op);
    if (id < 0)
        return NULL;
    if (vec_a || vec_b) { /* drop the axes that rank-1 operands gained */
        const loom_ir_node *r = node_of(ctx, id);
        int32_t n = 0;
        for (int32_t i = 0; i < r->rank; i++) {
            if ((vec_a && i == r->rank - 2) || (vec_b && i == r->rank - 1))
                continue;
            s[n++] = r->shape[i];
        }
        if ((id = reshaped(ctx, LOOM_IR_OP_RESHAPE, id, n, s, file, line)) < 0)
            return NULL;
    }
    return loom_fe_result(ctx, id, file, line, op);
}
