/* Op builders: validate the user's call, record IR nodes in the trace, return step-scoped
 * results. Nothing is computed here. */
#include <string.h>

#include "frontend.h"
#include "loom/dist.h"

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

/* Appends a node to the trace, tagged with the autocast scope in force (sources carry no
 * tag: there is nothing to run in another precision); -1 after recording the inference
 * error. */
static int32_t record(loom_context *ctx, const loom_ir_node_desc *desc, const char *op) {
    loom_ir_diag d;
    loom_ir_diag_init(&d);
    int32_t id;
    if (!loom_fe_graph_room(ctx, desc->loc.file, desc->loc.line, op))
        return -1;
    loom_ir_node_desc tagged = *desc;
    if (!tagged.loc.scope)
        tagged.loc.scope = ctx->scope;
    if (!loom_ir_op_traits(desc->op)->leaf)
        tagged.attrs.autocast = loom_autocast_dtype(ctx);
    if (loom_ir_graph_add(&ctx->trace, &tagged, &id, &d) != LOOM_OK) {
        loom_fe_error(ctx, d.code, desc->loc.file, desc->loc.line, op, "%s", d.msg);
        return -1;
    }
    return id;
}

static loom_tensor *finish(loom_context *ctx, const loom_ir_node_desc *desc, const char *op) {
    int32_t id = record(ctx, desc, op);
    return id < 0 ? NULL : loom_fe_result(ctx, id, desc->loc.file, desc->loc.line, op);
}

loom_tensor *loom_fe_record_op(loom_context *ctx, loom_ir_op opc, int32_t n,
                               loom_tensor *const *operand, loom_ir_attrs attrs, const char *file,
                               int line, const char *op) {
    int32_t nodes[LOOM_FE_RECORD_MAX];
    if (n > LOOM_FE_RECORD_MAX) {
        loom_fe_error(ctx, LOOM_STATUS_INTERNAL, file, line, op, "%d operands (at most %d)", (int)n,
                      (int)LOOM_FE_RECORD_MAX);
        return NULL;
    }
    if (!operands(ctx, n, operand, nodes, file, line, op))
        return NULL;
    loom_ir_node_desc desc = {
        .op = opc, .n_inputs = n, .inputs = nodes, .attrs = attrs, .loc = {file, line}};
    return finish(ctx, &desc, op);
}

static const loom_ir_node *node_of(const loom_context *ctx, int32_t id) {
    return &ctx->trace.nodes[id];
}

loom_tensor *loom_fe_conv2d(loom_context *ctx, loom_tensor *x, loom_tensor *w,
                            const loom_ir_conv *cv, const char *file, int line) {
    static const char op[] = "conv2d";
    loom_tensor *hs[2] = {x, w};
    int32_t nodes[2];
    if (!ctx || !operands(ctx, 2, hs, nodes, file, line, op))
        return NULL;
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_CONV2D,
                              .n_inputs = 2,
                              .inputs = nodes,
                              .attrs = {.conv = *cv},
                              .loc = {file, line}};
    return finish(ctx, &desc, op);
}

loom_tensor *loom_fe_max_pool2d(loom_context *ctx, loom_tensor *x, const loom_ir_conv *window,
                                const char *file, int line) {
    static const char op[] = "max_pool2d";
    int32_t node;
    if (!ctx || !operands(ctx, 1, &x, &node, file, line, op))
        return NULL;
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_MAX_POOL2D,
                              .n_inputs = 1,
                              .inputs = &node,
                              .attrs = {.conv = *window},
                              .loc = {file, line}};
    return finish(ctx, &desc, op);
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
DEFINE_UNARY(gelu_tanh, GELU_TANH)
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
    LOOM_FE_USE(ctx, "select", NULL);
    loom_tensor *hs[3] = {cond, a, b};
    return elementwise(ctx, LOOM_IR_OP_SELECT, 3, hs, file, line);
}

LOOM_API loom_tensor *loom_full_at(loom_context *ctx, loom_dtype dtype, int32_t rank,
                                   const int64_t *shape, double value, const char *file,
                                   int line) {
    LOOM_FE_USE(ctx, "full", NULL);
    if (!ctx)
        return NULL;
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_CONSTANT, .dtype = dtype, .rank = rank,
                              .shape = shape, .attrs = {.value = value}, .loc = {file, line}};
    return finish(ctx, &desc, "full");
}

LOOM_API loom_tensor *loom_cast_at(loom_context *ctx, loom_tensor *a, loom_dtype dtype,
                                   const char *file, int line) {
    LOOM_FE_USE(ctx, "cast", NULL);
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
    LOOM_FE_USE(ctx, "broadcast", NULL);
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
    LOOM_FE_USE(ctx, "reshape", NULL);
    static const char op[] = "reshape";
    int32_t node;
    if (!ctx || !operands(ctx, 1, &a, &node, file, line, op) ||
        !check_target(ctx, rank, shape, file, line, op))
        return NULL;
    /* Resolve one -1 extent from the element count. */
    int64_t target[LOOM_MAX_RANK];
    int32_t infer_at = -1;
    int64_t known = 1;
    bool known_overflows = false;
    for (int32_t i = 0; i < rank; i++) {
        target[i] = shape[i];
        if (shape[i] == -1) {
            if (infer_at >= 0) {
                loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                              "only one extent may be -1");
                return NULL;
            }
            infer_at = i;
        } else if (shape[i] >= 0 && !known_overflows) {
            known_overflows = __builtin_mul_overflow(known, shape[i], &known);
        }
    }
    if (infer_at >= 0) {
        const loom_ir_node *x = node_of(ctx, node);
        int64_t total = loom_ir_numel(x->rank, x->shape);
        char t[LOOM_IR_TYPE_STR_MAX];
        if (known == 0 || known_overflows) {
            loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                          "cannot infer the -1 extent of %s: the other extents' product %s",
                          loom_ir_format_type(t, sizeof t, x->dtype, x->rank, x->shape),
                          known_overflows ? "overflows a 64-bit integer"
                                          : "is 0, so any extent fits");
            return NULL;
        }
        if (total % known != 0) {
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
    LOOM_FE_USE(ctx, "permute", NULL);
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
    LOOM_FE_USE(ctx, "transpose", NULL);
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
    LOOM_FE_USE(ctx, "sum", NULL);
    return reduce(ctx, LOOM_IR_OP_REDUCE_SUM, "sum", a, n_axes, axes, keepdim, file, line);
}

LOOM_API loom_tensor *loom_mean_at(loom_context *ctx, loom_tensor *a, int32_t n_axes,
                                   const int32_t *axes, bool keepdim, const char *file, int line) {
    LOOM_FE_USE(ctx, "mean", NULL);
    return reduce(ctx, LOOM_IR_OP_REDUCE_MEAN, "mean", a, n_axes, axes, keepdim, file, line);
}

LOOM_API loom_tensor *loom_max_at(loom_context *ctx, loom_tensor *a, int32_t n_axes,
                                  const int32_t *axes, bool keepdim, const char *file, int line) {
    LOOM_FE_USE(ctx, "max", NULL);
    return reduce(ctx, LOOM_IR_OP_REDUCE_MAX, "max", a, n_axes, axes, keepdim, file, line);
}

/* Reshape helper for matmul's rank-1 promotion and batch broadcasting. */
static int32_t reshaped(loom_context *ctx, loom_ir_op opc, int32_t node, int32_t rank,
                        const int64_t *shape, const char *file, int line) {
    loom_ir_node_desc desc = {.op = opc, .n_inputs = 1, .inputs = &node, .rank = rank,
                              .shape = shape, .loc = {file, line}};
    return record(ctx, &desc, "matmul");
}

/* a [..., M, K] x b [..., K, N] with their batch axes broadcast to one rank and shape. */
static int32_t batched(loom_context *ctx, int32_t *nodes, const char *file, int line) {
    static const char op[] = "matmul";
    const loom_ir_node *x = node_of(ctx, nodes[0]), *y = node_of(ctx, nodes[1]);
    int64_t s[LOOM_MAX_RANK];
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
            return -1;
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
                return -1;
    }
    loom_ir_node_desc desc = {
        .op = LOOM_IR_OP_MATMUL, .n_inputs = 2, .inputs = nodes, .loc = {file, line}};
    return record(ctx, &desc, op);
}

static int32_t transposed(loom_context *ctx, int32_t node, const char *file, int line) {
    loom_ir_node_desc desc = {
        .op = LOOM_IR_OP_TRANSPOSE, .n_inputs = 1, .inputs = &node, .loc = {file, line}};
    desc.attrs.perm[0] = 1;
    desc.attrs.perm[1] = 0;
    return record(ctx, &desc, "matmul");
}

/* b's extents as the matmul sees it: [K, N], or with b_t (b a weight [N, K] used
 * transposed) b's own reversed. */
static void kn_of(const loom_ir_node *y, bool b_t, int64_t *K, int64_t *N) {
    *K = y->shape[b_t ? 1 : 0];
    *N = y->shape[b_t ? 0 : 1];
}

/* a [R, K] x b [K, N] (b_t: x b^T for b [N, K]) as one 2-D matmul node. A b that is a
 * recorded transpose of a 2-D S counts as S used transposed. When that weight outweighs a
 * and the result, computes (S a^T)^T: S^T would need a pass over the weight every step (and
 * in backward over its gradient), where a^T is the transpose made and the outer one fuses
 * into the consumer's reads. */
static int32_t matmul_rows(loom_context *ctx, int32_t a, int32_t b, bool b_t, const char *file,
                           int line) {
    const loom_ir_node *x = node_of(ctx, a), *y = node_of(ctx, b);
    if (!b_t && y->op == LOOM_IR_OP_TRANSPOSE && y->attrs.perm[0] == 1 &&
        node_of(ctx, y->inputs[0])->rank == 2) {
        b = y->inputs[0];
        b_t = true;
        y = node_of(ctx, b);
    }
    int64_t R = x->shape[0], K, N;
    kn_of(y, b_t, &K, &N);
    bool swap = b_t && x->shape[1] == K && N * K > R * (N + K);
    int32_t in[2] = {a, b};
    if (swap) {
        in[0] = b;
        in[1] = transposed(ctx, a, file, line);
    } else if (b_t) {
        in[1] = transposed(ctx, b, file, line);
    }
    if (in[1] < 0)
        return -1;
    loom_ir_node_desc desc = {
        .op = LOOM_IR_OP_MATMUL, .n_inputs = 2, .inputs = in, .loc = {file, line}};
    int32_t id = record(ctx, &desc, "matmul");
    return swap && id >= 0 ? transposed(ctx, id, file, line) : id;
}

/* a [..., M, K] x b [K, N] (b_t: b [N, K] used transposed): the leading axes fold into the
 * rows, as torch.matmul does, so b is never broadcast over them (a weight [C, V] against
 * x [B, T, C] would be B copies of it). The result is [..., M, N], without M for a vector a
 * (vec_a: made [1, K]) and without N for a vector b (vec_b: made [K, 1]). */
static loom_tensor *matmul_2d_weight(loom_context *ctx, const int32_t *nodes, bool b_t, bool vec_a,
                                     bool vec_b, const char *file, int line) {
    const loom_ir_node *x = node_of(ctx, nodes[0]), *y = node_of(ctx, nodes[1]);
    int32_t r = x->rank;
    int64_t K, N;
    kn_of(y, b_t, &K, &N);
    if (x->shape[r - 1] != K) {
        char ta[LOOM_IR_TYPE_STR_MAX], tb[LOOM_IR_TYPE_STR_MAX];
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, "matmul",
                      "inner dimensions differ: %s x %s%s",
                      loom_ir_format_type(ta, sizeof ta, x->dtype, x->rank, x->shape),
                      loom_ir_format_type(tb, sizeof tb, y->dtype, y->rank, y->shape),
                      b_t ? " transposed" : "");
        return NULL;
    }
    int64_t shape[LOOM_MAX_RANK], rows[2] = {loom_ir_numel(r - 1, x->shape), K};
    memcpy(shape, x->shape, (size_t)r * sizeof *shape);
    int32_t a = nodes[0];
    if (r != 2 && (a = reshaped(ctx, LOOM_IR_OP_RESHAPE, a, 2, rows, file, line)) < 0)
        return NULL;
    int32_t id = matmul_rows(ctx, a, nodes[1], b_t, file, line);
    if (id < 0)
        return NULL;
    int32_t n = r - 1 - vec_a;
    if (!vec_b)
        shape[n++] = N;
    if ((r != 2 || vec_a || vec_b) &&
        (id = reshaped(ctx, LOOM_IR_OP_RESHAPE, id, n, shape, file, line)) < 0)
        return NULL;
    return loom_fe_result(ctx, id, file, line, "matmul");
}

loom_tensor *loom_fe_matmul_t(loom_context *ctx, loom_tensor *x, loom_tensor *w, const char *file,
                              int line) {
    loom_tensor *hs[2] = {x, w};
    int32_t nodes[2];
    if (!operands(ctx, 2, hs, nodes, file, line, "matmul"))
        return NULL;
    bool vec_a = node_of(ctx, nodes[0])->rank == 1;
    if (vec_a &&
        (nodes[0] = reshaped(ctx, LOOM_IR_OP_RESHAPE, nodes[0], 2,
                             (int64_t[]){1, node_of(ctx, nodes[0])->shape[0]}, file, line)) < 0)
        return NULL;
    return matmul_2d_weight(ctx, nodes, true, vec_a, false, file, line);
}

LOOM_API loom_tensor *loom_matmul_at(loom_context *ctx, loom_tensor *a, loom_tensor *b,
                                     const char *file, int line) {
    LOOM_FE_USE(ctx, "matmul", NULL);
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
    x = node_of(ctx, nodes[0]);
    y = node_of(ctx, nodes[1]);
    if (y->rank == 2 && x->rank >= 2)
        return matmul_2d_weight(ctx, nodes, false, vec_a, vec_b, file, line);
    int32_t id = batched(ctx, nodes, file, line);
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

/* ---- movement and generated values ------------------------------------------------------ */

#define TYPE_OF(buf, x) loom_ir_format_type(buf, sizeof buf, (x)->dtype, (x)->rank, (x)->shape)

LOOM_API loom_tensor *loom_slice_at(loom_context *ctx, loom_tensor *a, const int64_t *start,
                                    const int64_t *size, const int64_t *stride, const char *file,
                                    int line) {
    LOOM_FE_USE(ctx, "slice", NULL);
    static const char op[] = "slice";
    int32_t node;
    if (!ctx || !operands(ctx, 1, &a, &node, file, line, op))
        return NULL;
    const loom_ir_node *x = node_of(ctx, node);
    char t[LOOM_IR_TYPE_STR_MAX];
    if (x->rank > 0 && (!start || !size)) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op, "%s is NULL for %s",
                      !start ? "start" : "size", TYPE_OF(t, x));
        return NULL;
    }
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_SLICE,
                              .n_inputs = 1,
                              .inputs = &node,
                              .rank = x->rank,
                              .shape = size,
                              .loc = {file, line}};
    for (int32_t i = 0; i < x->rank; i++) {
        int64_t st = stride ? stride[i] : 1, ext = x->shape[i];
        const char *why = NULL;
        if (st < 1)
            why = "stride must be >= 1";
        else if (size[i] < 0)
            why = "size is negative";
        else if (start[i] < 0 || start[i] > ext || (start[i] == ext && size[i] > 0))
            why = "start is outside the axis";
        else if (size[i] > 0 && size[i] - 1 > (ext - 1 - start[i]) / st)
            why = "start + stride * (size - 1) is past the end of the axis";
        if (why) {
            loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                          "axis %d of %s: %s (start %lld, size %lld, stride %lld, extent %lld)",
                          (int)i, TYPE_OF(t, x), why, (long long)start[i], (long long)size[i],
                          (long long)st, (long long)ext);
            return NULL;
        }
        desc.attrs.start[i] = start[i];
        desc.attrs.step[i] = st;
    }
    return finish(ctx, &desc, op);
}

LOOM_API loom_tensor *loom_pad_at(loom_context *ctx, loom_tensor *a, const int64_t *low,
                                  const int64_t *high, const int64_t *interior, double value,
                                  const char *file, int line) {
    LOOM_FE_USE(ctx, "pad", NULL);
    static const char op[] = "pad";
    int32_t node;
    if (!ctx || !operands(ctx, 1, &a, &node, file, line, op))
        return NULL;
    const loom_ir_node *x = node_of(ctx, node);
    char t[LOOM_IR_TYPE_STR_MAX];
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_PAD,
                              .n_inputs = 1,
                              .inputs = &node,
                              .rank = x->rank,
                              .attrs = {.value = value},
                              .loc = {file, line}};
    int64_t out[LOOM_MAX_RANK];
    for (int32_t i = 0; i < x->rank; i++) {
        int64_t lo = low ? low[i] : 0, hi = high ? high[i] : 0, in = interior ? interior[i] : 0;
        if (lo < 0 || hi < 0 || in < 0) {
            loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                          "axis %d of %s: padding must be >= 0 (low %lld, high %lld, interior "
                          "%lld)",
                          (int)i, TYPE_OF(t, x), (long long)lo, (long long)hi, (long long)in);
            return NULL;
        }
        /* out = low + high + ext + (ext - 1) * interior, checked for overflow */
        int64_t ext = x->shape[i], gaps = 0, o = 0;
        bool overflow = ext > 0 && __builtin_mul_overflow(ext - 1, in, &gaps);
        overflow = overflow || __builtin_add_overflow(lo, hi, &o) ||
                   __builtin_add_overflow(o, ext, &o) || __builtin_add_overflow(o, gaps, &o);
        if (overflow) {
            loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                          "axis %d of %s: the padded extent overflows", (int)i, TYPE_OF(t, x));
            return NULL;
        }
        out[i] = o;
        desc.attrs.start[i] = lo;
        desc.attrs.step[i] = in;
    }
    desc.shape = out;
    return finish(ctx, &desc, op);
}

LOOM_API loom_tensor *loom_concat_at(loom_context *ctx, int32_t n, loom_tensor *const *ts,
                                     int32_t axis, const char *file, int line) {
    LOOM_FE_USE(ctx, "concat", NULL);
    static const char op[] = "concat";
    if (!ctx)
        return NULL;
    if (n < 1 || !ts) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      n < 1 ? "needs at least one tensor, got %d"
                            : "the tensor list is NULL "
                              "(n = %d)",
                      (int)n);
        return NULL;
    }
    int32_t small[16], *nodes = small;
    size_t bytes = (size_t)n * sizeof *nodes;
    if (n > 16 && !(nodes = loom_ir_alloc(&ctx->alloc, bytes))) {
        loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, file, line, op,
                      "out of memory for %d operands", (int)n);
        return NULL;
    }
    loom_tensor *result = NULL;
    if (!operands(ctx, n, ts, nodes, file, line, op))
        goto done;
    const loom_ir_node *x = node_of(ctx, nodes[0]);
    char ta[LOOM_IR_TYPE_STR_MAX], tb[LOOM_IR_TYPE_STR_MAX];
    int32_t ax = axis < 0 ? axis + x->rank : axis;
    if (x->rank < 1 || ax < 0 || ax >= x->rank) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "axis %d is out of range for %s", (int)axis, TYPE_OF(ta, x));
        goto done;
    }
    for (int32_t k = 1; k < n; k++) {
        const loom_ir_node *y = node_of(ctx, nodes[k]);
        bool same = y->dtype == x->dtype && y->rank == x->rank;
        for (int32_t i = 0; same && i < x->rank; i++)
            same = i == ax || y->shape[i] == x->shape[i];
        if (!same) {
            loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                          "tensor %d is %s, tensor 0 is %s: dtypes and every extent but axis "
                          "%d must match",
                          (int)k, TYPE_OF(tb, y), TYPE_OF(ta, x), (int)ax);
            goto done;
        }
    }
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_CONCAT,
                              .n_inputs = n,
                              .inputs = nodes,
                              .attrs = {.index = ax},
                              .loc = {file, line}};
    result = finish(ctx, &desc, op);
done:
    if (nodes != small)
        loom_ir_free(&ctx->alloc, nodes, bytes);
    return result;
}

/* gather(x, index) and scatter_add(x, index, src) along axis: the operands, the axis in range,
 * and a constant index inside x's extent (a runtime one is clamped: ops.def). */
static loom_tensor *index_op(loom_context *ctx, loom_ir_op opc, loom_tensor *x, int32_t axis,
                             loom_tensor *index, loom_tensor *src, const char *file, int line,
                             const char *op) {
    int32_t n = opc == LOOM_IR_OP_GATHER ? 2 : 3, nodes[3];
    if (!ctx || !operands(ctx, n, (loom_tensor *const[]){x, index, src}, nodes, file, line, op))
        return NULL;
    const loom_ir_node *xn = node_of(ctx, nodes[0]), *in = node_of(ctx, nodes[1]);
    char tx[LOOM_IR_TYPE_STR_MAX];
    int32_t ax = axis < 0 ? axis + xn->rank : axis;
    if (xn->rank < 1 || ax < 0 || ax >= xn->rank) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "axis %d is out of range for %s", (int)axis, TYPE_OF(tx, xn));
        return NULL;
    }
    if (in->op == LOOM_IR_OP_CONSTANT && loom_ir_numel(in->rank, in->shape) > 0 &&
        (in->attrs.value < 0 || in->attrs.value >= (double)xn->shape[ax])) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "index %.17g is out of range for axis %d of %s", in->attrs.value, (int)ax,
                      TYPE_OF(tx, xn));
        return NULL;
    }
    loom_ir_node_desc desc = {
        .op = opc, .n_inputs = n, .inputs = nodes, .attrs = {.index = ax}, .loc = {file, line}};
    return finish(ctx, &desc, op);
}

LOOM_API loom_tensor *loom_gather_at(loom_context *ctx, loom_tensor *x, int32_t axis,
                                     loom_tensor *index, const char *file, int line) {
    LOOM_FE_USE(ctx, "gather", NULL);
    return index_op(ctx, LOOM_IR_OP_GATHER, x, axis, index, NULL, file, line, "gather");
}

LOOM_API loom_tensor *loom_scatter_add_at(loom_context *ctx, loom_tensor *base, int32_t axis,
                                          loom_tensor *index, loom_tensor *src, const char *file,
                                          int line) {
    LOOM_FE_USE(ctx, "scatter_add", NULL);
    return index_op(ctx, LOOM_IR_OP_SCATTER_ADD, base, axis, index, src, file, line, "scatter_add");
}

/* index [I...] -> [1.., I (flattened), 1..] broadcast over x's other axes, gathered, and the
 * result's axis unflattened into index's axes. */
LOOM_API loom_tensor *loom_index_select_at(loom_context *ctx, loom_tensor *x, int32_t axis,
                                           loom_tensor *index, const char *file, int line) {
    LOOM_FE_USE(ctx, "index_select", NULL);
    static const char op[] = "index_select";
    int32_t nodes[2];
    if (!ctx || !operands(ctx, 2, (loom_tensor *const[]){x, index}, nodes, file, line, op))
        return NULL;
    const loom_ir_node *xn = node_of(ctx, nodes[0]), *in = node_of(ctx, nodes[1]);
    char tx[LOOM_IR_TYPE_STR_MAX];
    int32_t r = xn->rank, ax = axis < 0 ? axis + r : axis;
    if (r < 1 || ax < 0 || ax >= r) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "axis %d is out of range for %s", (int)axis, TYPE_OF(tx, xn));
        return NULL;
    }
    if (r - 1 + in->rank > LOOM_MAX_RANK) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "the result of %s at %d-D indices has more than %d axes", TYPE_OF(tx, xn),
                      (int)in->rank, LOOM_MAX_RANK);
        return NULL;
    }
    int64_t flat[LOOM_MAX_RANK], wide[LOOM_MAX_RANK], out[LOOM_MAX_RANK];
    int64_t count = loom_ir_numel(in->rank, in->shape);
    int32_t o = 0;
    for (int32_t k = 0; k < r; k++) {
        flat[k] = k == ax ? count : 1;
        wide[k] = k == ax ? count : xn->shape[k];
    }
    for (int32_t k = 0; k < ax; k++)
        out[o++] = xn->shape[k];
    for (int32_t k = 0; k < in->rank; k++)
        out[o++] = in->shape[k];
    for (int32_t k = ax + 1; k < r; k++)
        out[o++] = xn->shape[k];
    loom_tensor *ix = loom_reshape_at(ctx, index, r, flat, file, line);
    ix = loom_broadcast_at(ctx, ix, r, wide, file, line);
    return loom_reshape_at(ctx, loom_gather_at(ctx, x, ax, ix, file, line), o, out, file, line);
}

LOOM_API loom_tensor *loom_iota_at(loom_context *ctx, loom_dtype dtype, int32_t rank,
                                   const int64_t *shape, int32_t axis, const char *file, int line) {
    LOOM_FE_USE(ctx, "iota", NULL);
    static const char op[] = "iota";
    if (!ctx || !check_target(ctx, rank, shape, file, line, op))
        return NULL;
    if (!loom_ir_dtype_in_class(dtype, LOOM_IR_DT_NUM)) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "dtype %s is not numeric (iota counts 0, 1, 2, ...)",
                      loom_ir_dtype_valid(dtype) ? loom_dtype_name(dtype) : "(invalid)");
        return NULL;
    }
    int32_t ax = axis < 0 ? axis + rank : axis;
    if (ax < 0 || ax >= rank) {
        char t[LOOM_IR_TYPE_STR_MAX];
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "axis %d is out of range for %s", (int)axis,
                      loom_ir_format_type(t, sizeof t, dtype, rank, shape));
        return NULL;
    }
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_IOTA,
                              .dtype = dtype,
                              .rank = rank,
                              .shape = shape,
                              .attrs = {.index = ax},
                              .loc = {file, line}};
    return finish(ctx, &desc, op);
}

LOOM_API loom_tensor *loom_rand_uniform_at(loom_context *ctx, loom_tensor *seed, loom_dtype dtype,
                                           int32_t rank, const int64_t *shape, const char *file,
                                           int line) {
    LOOM_FE_USE(ctx, "rand_uniform", NULL);
    static const char op[] = "rand_uniform";
    int32_t node;
    if (!ctx || !operands(ctx, 1, &seed, &node, file, line, op) ||
        !check_target(ctx, rank, shape, file, line, op))
        return NULL;
    const loom_ir_node *s = node_of(ctx, node);
    char t[LOOM_IR_TYPE_STR_MAX];
    if (s->dtype != LOOM_DTYPE_I64 || s->rank != 0) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "seed must be an i64 scalar (i64[]), got %s", TYPE_OF(t, s));
        return NULL;
    }
    if (!loom_ir_dtype_valid(dtype) || !loom_ir_dtype_is_float(dtype)) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                      "dtype %s is not a float dtype",
                      loom_ir_dtype_valid(dtype) ? loom_dtype_name(dtype) : "(invalid)");
        return NULL;
    }
    loom_ir_node_desc desc = {.op = LOOM_IR_OP_RAND_UNIFORM,
                              .n_inputs = 1,
                              .inputs = &node,
                              .dtype = dtype,
                              .rank = rank,
                              .shape = shape,
                              .loc = {file, line}};
    return finish(ctx, &desc, op);
}

/* ---- collectives (loom/dist.h) --------------------------------------------------------------- */

static loom_tensor *collective(loom_context *ctx, loom_ir_op opc, loom_tensor *x, int64_t index,
                               double value, const char *file, int line) {
    const char *op = loom_ir_op_name(opc);
    int32_t node;
    if (!ctx || !operands(ctx, 1, &x, &node, file, line, op))
        return NULL;
    loom_ir_node_desc desc = {.op = opc,
                              .n_inputs = 1,
                              .inputs = &node,
                              .loc = {file, line},
                              .attrs = {.index = index, .value = value}};
    return finish(ctx, &desc, op);
}

LOOM_API loom_tensor *loom_all_reduce_at(loom_context *ctx, loom_tensor *x, loom_reduce_op op,
                                         double scale, const char *file, int line) {
    LOOM_FE_USE(ctx, "all_reduce", NULL);
    return collective(ctx, LOOM_IR_OP_ALL_REDUCE, x, (int64_t)op, scale, file, line);
}

LOOM_API loom_tensor *loom_broadcast_from_at(loom_context *ctx, loom_tensor *x, int32_t root,
                                             const char *file, int line) {
    LOOM_FE_USE(ctx, "broadcast_from", NULL);
    int32_t world = loom_dist_world_size();
    if (ctx && x && (root < 0 || root >= world)) {
        loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, "broadcast_from",
                      "root %d is not a rank of this job (world size %d)", (int)root, (int)world);
        return NULL;
    }
    return collective(ctx, LOOM_IR_OP_BROADCAST_FROM, x, root, 0.0, file, line);
}

LOOM_API loom_tensor *loom_all_gather_at(loom_context *ctx, loom_tensor *x, const char *file,
                                         int line) {
    LOOM_FE_USE(ctx, "all_gather", NULL);
    return collective(ctx, LOOM_IR_OP_ALL_GATHER, x, loom_dist_world_size(), 0.0, file, line);
}

LOOM_API loom_status loom_allreduce_gradients_at(loom_context *ctx, int32_t n, loom_tensor **grads,
                                                 const char *file, int line) {
    LOOM_FE_USE(ctx, "allreduce_gradients", LOOM_STATUS_BUSY);
    const char *op = "allreduce_gradients";
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (n < 0 || (n > 0 && !grads))
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                             n < 0 ? "n is negative (%d)" : "grads is NULL for n = %d", (int)n);
    /* Check every gradient before recording anything: on failure no entry is replaced. */
    for (int32_t i = 0; i < n; i++) {
        if (!grads[i])
            continue;
        int32_t node;
        if (!operands(ctx, 1, &grads[i], &node, file, line, op))
            return ctx->err;
        const loom_ir_node *g = node_of(ctx, node);
        if (!loom_ir_dtype_is_float(g->dtype)) {
            char t[LOOM_IR_TYPE_STR_MAX];
            return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                                 "grads[%d] is %s, not floating point", (int)i,
                                 loom_ir_format_type(t, sizeof t, g->dtype, g->rank, g->shape));
        }
    }
    /* One rank's average is its own gradient: record nothing, so that one process's step
     * holds no collective (no copy and host round trip per gradient), as
     * loom_broadcast_parameters and the GradScaler do. */
    if (loom_dist_world_size() == 1)
        return LOOM_OK;
    /* The results are collected first so that a failure leaves grads as given. */
    size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(loom_tensor *);
    loom_tensor **out = loom_ir_alloc(&ctx->alloc, bytes);
    if (!out)
        return loom_fe_error(ctx, LOOM_STATUS_OUT_OF_MEMORY, file, line, op, "out of memory");
    double scale = 1.0 / (double)loom_dist_world_size();
    loom_status st = LOOM_OK;
    for (int32_t i = 0; i < n && st == LOOM_OK; i++) {
        out[i] =
            grads[i] ? loom_all_reduce_at(ctx, grads[i], LOOM_REDUCE_SUM, scale, file, line) : NULL;
        if (grads[i] && !out[i])
            st = ctx->err != LOOM_OK ? ctx->err : LOOM_STATUS_INTERNAL;
    }
    if (st == LOOM_OK && n > 0)
        memcpy(grads, out, (size_t)n * sizeof *grads);
    loom_ir_free(&ctx->alloc, out, bytes);
    return st;
}

LOOM_API loom_status loom_broadcast_parameters_at(loom_context *ctx, int32_t n,
                                                  loom_tensor *const *tensors, const char *file,
                                                  int line) {
    LOOM_FE_USE(ctx, "broadcast_parameters", LOOM_STATUS_BUSY);
    const char *op = "broadcast_parameters";
    if (!ctx)
        return LOOM_STATUS_INVALID_ARGUMENT;
    if (n < 0 || (n > 0 && !tensors))
        return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                             n < 0 ? "n is negative (%d)" : "tensors is NULL for n = %d", (int)n);
    /* Check every entry before recording anything. */
    for (int32_t i = 0; i < n; i++) {
        if (!tensors[i])
            continue;
        const loom_fe_tensor *t = loom_fe_tensor_get(ctx, tensors[i], file, line, op);
        if (!t)
            return ctx->err;
        if (t->step_owned)
            return loom_fe_error(ctx, LOOM_STATUS_INVALID_ARGUMENT, file, line, op,
                                 "tensors[%d] is a result of this step; only long-lived tensors "
                                 "can be broadcast into",
                                 (int)i);
    }
    if (loom_dist_world_size() == 1)
        return LOOM_OK;
    for (int32_t i = 0; i < n; i++) {
        if (!tensors[i])
            continue;
        loom_tensor *b = loom_broadcast_from_at(ctx, tensors[i], 0, file, line);
        loom_status st = b ? loom_assign_at(ctx, tensors[i], b, file, line) : ctx->err;
        if (st != LOOM_OK)
            return st;
    }
    return LOOM_OK;
}
