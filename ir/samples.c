/* One-op sample graphs (samples.h): a random instance of each op of ops.def per dtype, built
 * by the op's kind, so a new op of an existing kind is sampled without a change here and a
 * new kind does not compile until it has a case. */
#include "ir/samples.h"

#include <math.h>
#include <string.h>

const loom_dtype loom_ir_sample_dtypes[LOOM_IR_SAMPLE_N_DTYPES] = {
    LOOM_DTYPE_F32,  LOOM_DTYPE_F64, LOOM_DTYPE_I32, LOOM_DTYPE_I64,
    LOOM_DTYPE_BF16, LOOM_DTYPE_F16, LOOM_DTYPE_BOOL};

uint64_t loom_ir_sample_next(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

bool loom_ir_op_accepts(loom_ir_op op, loom_dtype dt) {
    if (op < 0 || op >= LOOM_IR_OP_COUNT_ || dt < 0 || dt >= LOOM_DTYPE_COUNT_)
        return false;
    const loom_ir_op_info *info = &loom_ir_op_table[op];
    switch (info->kind) { /* kinds whose result dtype is the node's, not their operands' */
    case LOOM_IR_KIND_CAST: return true;
    case LOOM_IR_KIND_IOTA: return loom_ir_dtype_in_class(dt, LOOM_IR_DT_NUM);
    case LOOM_IR_KIND_RAND: return loom_ir_dtype_is_float(dt);
    case LOOM_IR_KIND_SOURCE:
    case LOOM_IR_KIND_UNARY:
    case LOOM_IR_KIND_PREDICATE:
    case LOOM_IR_KIND_BINARY:
    case LOOM_IR_KIND_COMPARE:
    case LOOM_IR_KIND_SELECT:
    case LOOM_IR_KIND_BROADCAST:
    case LOOM_IR_KIND_RESHAPE:
    case LOOM_IR_KIND_TRANSPOSE:
    case LOOM_IR_KIND_REDUCTION:
    case LOOM_IR_KIND_CONTRACTION:
    case LOOM_IR_KIND_SLICE:
    case LOOM_IR_KIND_PAD:
    case LOOM_IR_KIND_CONCAT:
    case LOOM_IR_KIND_COLLECTIVE:
    case LOOM_IR_KIND_CONV:
    case LOOM_IR_KIND_POOL:
    case LOOM_IR_KIND_GATHER:
    case LOOM_IR_KIND_SCATTER:
    case LOOM_IR_KIND_ATTENTION:
    case LOOM_IR_KIND_COUNT_: break;
    }
    return loom_ir_dtype_in_class(dt, info->dtypes);
}

/* The builder: the graph, the generator and the first error (every later add is a no-op). */
typedef struct sb {
    loom_ir_graph *g;
    uint64_t *rng;
    bool small;
    loom_ir_diag *d;
    loom_status st;
} sb;

static uint64_t rnd(sb *b) {
    return loom_ir_sample_next(b->rng);
}
static int64_t rnd_int(sb *b, int64_t lo, int64_t hi) {
    return lo + (int64_t)(rnd(b) % (uint64_t)(hi - lo + 1));
}
static int64_t rnd_extent(sb *b) {
    static const int64_t e[] = {1, 2, 3, 5, 7, 8, 16, 17, 31, 33, 64, 100};
    return e[rnd(b) % (b->small ? 6 : sizeof e / sizeof e[0])];
}

static int32_t add(sb *b, loom_ir_op op, int32_t n_in, const int32_t *in, loom_dtype dt,
                   int32_t rank, const int64_t *shape, loom_ir_attrs attrs) {
    if (b->st != LOOM_OK)
        return -1;
    for (int32_t i = 0; i < n_in; i++)
        if (in[i] < 0)
            return -1;
    loom_ir_node_desc desc = {.op = op,
                              .n_inputs = n_in,
                              .inputs = in,
                              .dtype = dt,
                              .rank = rank,
                              .shape = shape,
                              .attrs = attrs};
    int32_t id = -1;
    b->st = loom_ir_graph_add(b->g, &desc, &id, b->d);
    return b->st == LOOM_OK ? id : -1;
}

static int32_t input(sb *b, loom_dtype dt, int32_t rank, const int64_t *shape) {
    return add(b, LOOM_IR_OP_INPUT, 0, NULL, dt, rank, shape,
               (loom_ir_attrs){.index = b->g->n_graph_inputs});
}

static void output(sb *b, int32_t node) {
    if (b->st == LOOM_OK && node >= 0)
        b->st = loom_ir_graph_add_output(b->g, node, -1);
    if (b->st != LOOM_OK && b->d->code == LOOM_OK)
        loom_ir_diag_set(b->d, b->st, "sample: cannot add an output");
}

static bool is_num(loom_dtype dt) {
    return loom_ir_dtype_in_class(dt, LOOM_IR_DT_NUM);
}

/* The op node of a random instance of op in dt; extra outputs and consumers as described. */
static int32_t build(sb *b, loom_ir_op op, loom_dtype dt, int32_t *res) {
    int32_t rank = (int32_t)rnd_int(b, 0, 4);
    int64_t shape[LOOM_MAX_RANK];
    for (int32_t i = 0; i < rank; i++)
        shape[i] = rnd_extent(b);
    const loom_ir_attrs none = {0};
    int32_t s = -1; /* the subject */
    switch (loom_ir_op_table[op].kind) {
    case LOOM_IR_KIND_SOURCE:
        if (op == LOOM_IR_OP_INPUT) {
            s = *res = input(b, dt, rank, shape);
        } else { /* constant + x keeps an input */
            int32_t x = input(b, dt, rank, shape);
            s = add(b, LOOM_IR_OP_CONSTANT, 0, NULL, dt, rank, shape,
                    (loom_ir_attrs){.value = 1.25});
            *res = add(b, is_num(dt) ? LOOM_IR_OP_ADD : LOOM_IR_OP_EQ, 2, (int32_t[]){x, s}, dt, 0,
                       NULL, none);
            output(b, s);
        }
        break;
    case LOOM_IR_KIND_UNARY:
    case LOOM_IR_KIND_PREDICATE: {
        int32_t x = input(b, dt, rank, shape);
        s = *res = add(b, op, 1, &x, dt, 0, NULL, none);
        break;
    }
    case LOOM_IR_KIND_BINARY:
    case LOOM_IR_KIND_COMPARE: {
        int32_t in[2] = {input(b, dt, rank, shape), -1};
        if (rank > 0 && rnd(b) % 2) { /* second operand broadcast from a smaller shape */
            int64_t small[LOOM_MAX_RANK];
            for (int32_t i = 0; i < rank; i++)
                small[i] = rnd(b) % 2 ? 1 : shape[i];
            int32_t y = input(b, dt, rank, small);
            in[1] = add(b, LOOM_IR_OP_BROADCAST, 1, &y, dt, rank, shape, none);
        } else {
            in[1] = input(b, dt, rank, shape);
        }
        s = *res = add(b, op, 2, in, dt, 0, NULL, none);
        break;
    }
    case LOOM_IR_KIND_SELECT: {
        int32_t c = input(b, LOOM_DTYPE_BOOL, rank, shape);
        int32_t in[3] = {c, input(b, dt, rank, shape), input(b, dt, rank, shape)};
        s = *res = add(b, op, 3, in, dt, 0, NULL, none);
        break;
    }
    case LOOM_IR_KIND_CAST: {
        int32_t x = input(b, LOOM_DTYPE_F32, rank, shape);
        s = *res = add(b, op, 1, &x, dt, 0, NULL, none);
        break;
    }
    case LOOM_IR_KIND_BROADCAST: {
        int64_t small[LOOM_MAX_RANK];
        int32_t srank = rank ? (int32_t)rnd_int(b, 0, rank) : 0;
        for (int32_t i = 0; i < srank; i++)
            small[i] = rnd(b) % 2 ? 1 : shape[rank - srank + i];
        int32_t x = input(b, dt, srank, small);
        s = *res = add(b, op, 1, &x, dt, rank, shape, none);
        break;
    }
    case LOOM_IR_KIND_RESHAPE: { /* a reshape of an input as an output: a copy */
        int32_t x = input(b, dt, rank, shape);
        int64_t to[2] = {1, loom_ir_numel(rank, shape)};
        s = *res = add(b, op, 1, &x, dt, 2, to, none);
        if (is_num(dt)) { /* and read by a kernel */
            output(b, s);
            *res = add(b, LOOM_IR_OP_ADD, 2, (int32_t[]){s, s}, dt, 0, NULL, none);
        }
        break;
    }
    case LOOM_IR_KIND_TRANSPOSE: {
        if (rank < 2) {
            rank = 2;
            shape[0] = rnd_extent(b);
            shape[1] = rnd_extent(b);
        }
        int32_t x = input(b, dt, rank, shape);
        loom_ir_attrs at = {0};
        for (int32_t i = 0; i < rank; i++)
            at.perm[i] = i;
        for (int32_t i = rank - 1; i > 0; i--) { /* Fisher-Yates */
            int32_t j = (int32_t)rnd_int(b, 0, i), t = at.perm[i];
            at.perm[i] = at.perm[j];
            at.perm[j] = t;
        }
        s = *res = add(b, op, 1, &x, dt, 0, NULL, at);
        break;
    }
    case LOOM_IR_KIND_REDUCTION: {
        int32_t x = input(b, dt, rank, shape);
        loom_ir_attrs at = {.axes = rank ? (uint32_t)(rnd(b) % (1u << rank)) : 0,
                            .keepdim = rnd(b) % 2 == 0};
        s = *res = add(b, op, 1, &x, dt, 0, NULL, at);
        break;
    }
    case LOOM_IR_KIND_CONTRACTION: {
        int32_t r = (int32_t)rnd_int(b, 2, 3);
        int64_t a[3], bb[3];
        int64_t m = rnd_extent(b), n = rnd_extent(b), k = rnd_extent(b), batch = rnd_int(b, 1, 3);
        if (r == 3)
            a[0] = bb[0] = batch;
        a[r - 2] = m;
        a[r - 1] = k;
        bb[r - 2] = k;
        bb[r - 1] = n;
        int32_t in[2] = {input(b, dt, r, a), input(b, dt, r, bb)};
        s = *res = add(b, op, 2, in, dt, 0, NULL, none);
        break;
    }
    case LOOM_IR_KIND_SLICE: { /* random start, stride 1..3, the sizes that fit */
        if (rank == 0) {
            rank = 1;
            shape[0] = rnd_extent(b);
        }
        int32_t x = input(b, dt, rank, shape);
        loom_ir_attrs at = {0};
        int64_t size[LOOM_MAX_RANK];
        for (int32_t i = 0; i < rank; i++) {
            at.start[i] = rnd_int(b, 0, shape[i] - 1);
            at.step[i] = rnd_int(b, 1, 3);
            size[i] = rnd_int(b, 0, (shape[i] - 1 - at.start[i]) / at.step[i] + 1);
        }
        s = *res = add(b, op, 1, &x, dt, rank, size, at);
        if (is_num(dt)) { /* and fused into a consumer */
            output(b, s);
            *res = add(b, LOOM_IR_OP_ABS, 1, &s, dt, 0, NULL, none);
        }
        break;
    }
    case LOOM_IR_KIND_PAD: { /* low, high 0..2, interior 0..2 on random axes */
        int32_t x = input(b, dt, rank, shape);
        loom_ir_attrs at = {.value = rnd(b) % 2 ? -1.5 : 0.0};
        int64_t out[LOOM_MAX_RANK];
        for (int32_t i = 0; i < rank; i++) {
            bool pad = rnd(b) % 2;
            at.start[i] = pad ? rnd_int(b, 0, 2) : 0;
            at.step[i] = pad ? rnd_int(b, 0, 2) : 0;
            int64_t high = pad ? rnd_int(b, 0, 2) : 0;
            out[i] = at.start[i] + high + shape[i] + (shape[i] - 1) * at.step[i];
        }
        s = *res = add(b, op, 1, &x, dt, rank, out, at);
        if (is_num(dt) && rnd(b) % 2) { /* fused or not */
            output(b, s);
            *res = add(b, LOOM_IR_OP_NEG, 1, &s, dt, 0, NULL, none);
        }
        break;
    }
    case LOOM_IR_KIND_CONCAT: { /* 1..4 operands along a random axis, some computed */
        if (rank == 0) {
            rank = 1;
            shape[0] = rnd_extent(b);
        }
        int32_t axis = (int32_t)rnd_int(b, 0, rank - 1), n = (int32_t)rnd_int(b, 1, 4), in[4];
        for (int32_t k = 0; k < n; k++) {
            int64_t sh[LOOM_MAX_RANK];
            memcpy(sh, shape, sizeof sh);
            sh[axis] = rnd(b) % 4 ? rnd_extent(b) : 0;
            in[k] = input(b, dt, rank, sh);
            if (is_num(dt) && rnd(b) % 2)
                in[k] = add(b, LOOM_IR_OP_NEG, 1, &in[k], dt, 0, NULL, none);
        }
        s = *res = add(b, op, n, in, dt, 0, NULL, (loom_ir_attrs){.index = axis});
        break;
    }
    case LOOM_IR_KIND_IOTA: { /* alone and added to an input */
        if (rank == 0) {
            rank = 1;
            shape[0] = rnd_extent(b);
        }
        int32_t axis = (int32_t)rnd_int(b, 0, rank - 1);
        s = add(b, op, 0, NULL, dt, rank, shape, (loom_ir_attrs){.index = axis});
        output(b, s);
        int32_t x = input(b, dt, rank, shape);
        *res = add(b, LOOM_IR_OP_ADD, 2, (int32_t[]){x, s}, dt, 0, NULL, none);
        break;
    }
    case LOOM_IR_KIND_RAND: {
        int32_t seed = input(b, LOOM_DTYPE_I64, 0, NULL);
        s = *res = add(b, op, 1, &seed, dt, rank, shape, none);
        break;
    }
    case LOOM_IR_KIND_COLLECTIVE: { /* on one rank, the world size of a lone process */
        if (rank == 0) {
            rank = 1;
            shape[0] = rnd_extent(b);
        }
        int32_t x = input(b, dt, rank, shape);
        loom_ir_attrs at = {0};
        if (op == LOOM_IR_OP_ALL_REDUCE) {
            at.index = dt == LOOM_DTYPE_BOOL ? rnd_int(b, 1, 2) : rnd_int(b, 0, 2);
            at.value = loom_ir_dtype_is_float(dt) ? (double[]){1, 0.5, -0.25}[rnd_int(b, 0, 2)] : 1;
        } else if (op == LOOM_IR_OP_ALL_GATHER) {
            at.index = 1; /* the world size */
        }
        s = *res = add(b, op, 1, &x, dt, 0, NULL, at);
        break;
    }
    case LOOM_IR_KIND_CONV: { /* a random window; the gradients state x's or w's shape */
        int64_t grp = rnd_int(b, 1, 2), cg = rnd_int(b, 1, 3), og = rnd_int(b, 1, 2);
        loom_ir_conv cv = {{rnd_int(b, 1, 2), rnd_int(b, 1, 2)},
                           {rnd_int(b, 0, 1), rnd_int(b, 0, 1)},
                           {rnd_int(b, 1, 2), rnd_int(b, 1, 2)},
                           grp,
                           {0, 0}};
        int64_t xs[4] = {rnd_int(b, 1, 2), grp * cg, 0, 0};
        int64_t ws[4] = {grp * og, cg, rnd_int(b, 1, 3), 0};
        ws[3] = rnd_int(b, 1, 3);
        int64_t ys[4] = {xs[0], ws[0], 0, 0};
        for (int i = 0; i < 2; i++) {
            xs[2 + i] = cv.dilation[i] * (ws[2 + i] - 1) + 1 + rnd_int(b, 0, 6);
            ys[2 + i] = loom_ir_conv_out_extent(xs[2 + i], ws[2 + i], cv.stride[i], cv.padding[i],
                                                cv.dilation[i]);
        }
        int32_t in[2] = {input(b, dt, 4, op == LOOM_IR_OP_CONV2D_GRAD_INPUT ? ys : xs), -1};
        in[1] = input(b, dt, 4, op == LOOM_IR_OP_CONV2D_GRAD_WEIGHT ? ys : ws);
        const int64_t *stated = op == LOOM_IR_OP_CONV2D              ? NULL
                                : op == LOOM_IR_OP_CONV2D_GRAD_INPUT ? xs
                                                                     : ws;
        s = *res = add(b, op, 2, in, dt, stated ? 4 : 0, stated, (loom_ir_attrs){.conv = cv});
        break;
    }
    case LOOM_IR_KIND_POOL: { /* a random window with padding up to half of it */
        loom_ir_conv cv = {.groups = 0};
        int64_t xs[4] = {rnd_int(b, 1, 2), rnd_int(b, 1, 3), 0, 0}, ys[4] = {xs[0], xs[1], 0, 0};
        for (int i = 0; i < 2; i++) {
            cv.kernel[i] = rnd_int(b, 1, 3);
            cv.stride[i] = rnd_int(b, 1, 3); /* 3: the kernel reads taps pixel by pixel */
            cv.dilation[i] = rnd_int(b, 1, 2);
            int64_t span = cv.dilation[i] * (cv.kernel[i] - 1) + 1;
            cv.padding[i] = rnd_int(b, 0, span / 2);
            xs[2 + i] = span + rnd_int(b, 0, 6);
            ys[2 + i] = loom_ir_conv_out_extent(xs[2 + i], cv.kernel[i], cv.stride[i],
                                                cv.padding[i], cv.dilation[i]);
        }
        int32_t in[2] = {input(b, dt, 4, xs), -1};
        if (op == LOOM_IR_OP_MAX_POOL2D_GRAD)
            in[1] = input(b, dt, 4, ys);
        s = *res = add(b, op, in[1] >= 0 ? 2 : 1, in, dt, 0, NULL, (loom_ir_attrs){.conv = cv});
        break;
    }
    case LOOM_IR_KIND_GATHER:
    case LOOM_IR_KIND_SCATTER: { /* a random axis of 1..6, i32 or i64 indices in [-1, 6]:
                                  * some clamped (samples' domain) */
        if (rank == 0) {
            rank = 1;
            shape[0] = rnd_extent(b);
        }
        int32_t axis = (int32_t)rnd_int(b, 0, rank - 1);
        int64_t xs[LOOM_MAX_RANK];
        memcpy(xs, shape, sizeof xs);
        xs[axis] = rnd_int(b, 1, 6);
        loom_dtype it = rnd(b) % 2 ? LOOM_DTYPE_I64 : LOOM_DTYPE_I32;
        int32_t in[3] = {input(b, dt, rank, xs), input(b, it, rank, shape), -1};
        if (op == LOOM_IR_OP_SCATTER_ADD)
            in[2] = input(b, dt, rank, shape);
        s = *res = add(b, op, in[2] >= 0 ? 3 : 2, in, dt, 0, NULL, (loom_ir_attrs){.index = axis});
        break;
    }
    case LOOM_IR_KIND_ATTENTION: { /* [..., L, E] by [..., S, E] and [..., S, Ev], 1..3
                                    * leading extents; L and S across the kernels' tiles */
        rank = (int32_t)rnd_int(b, 2, 4);
        for (int32_t i = 0; i < rank - 2; i++)
            shape[i] = rnd_int(b, 1, 3);
        int64_t L = rnd_extent(b), S = rnd_extent(b), E = rnd_int(b, 1, 20), Ev = rnd_int(b, 1, 20);
        loom_ir_attrs at = {.index = (int64_t)(rnd(b) % 2), .value = 1.0 / sqrt((double)E)};
        int64_t qs[LOOM_MAX_RANK], ks[LOOM_MAX_RANK], vs[LOOM_MAX_RANK], os[LOOM_MAX_RANK];
        memcpy(qs, shape, sizeof qs);
        qs[rank - 2] = L;
        qs[rank - 1] = E;
        memcpy(ks, qs, sizeof ks);
        ks[rank - 2] = S;
        memcpy(vs, ks, sizeof vs);
        vs[rank - 1] = Ev;
        memcpy(os, qs, sizeof os);
        os[rank - 1] = Ev;
        int32_t q = input(b, dt, rank, qs), k = input(b, dt, rank, ks);
        /* half the samples without causal add a mask: additive (a bool one could mask a row
         * entirely, whose NaN and -inf the executors need not agree on), of a shape that
         * broadcasts to the scores [..., L, S] */
        int32_t mask = -1;
        if (!at.index && rnd(b) % 2) {
            int32_t mr = (int32_t)rnd_int(b, 1, rank);
            int64_t ms[LOOM_MAX_RANK];
            for (int32_t i = 0; i < mr; i++) {
                int64_t full = i == mr - 1 ? S : i == mr - 2 ? L : shape[rank - mr + i];
                ms[i] = rnd(b) % 3 ? full : 1;
            }
            mask = input(b, dt, mr, ms);
        }
        int32_t has_mask = mask >= 0;
        if (op == LOOM_IR_OP_ATTENTION_LSE) {
            s = *res =
                add(b, op, 2 + has_mask, (int32_t[]){q, k, mask}, LOOM_DTYPE_F32, 0, NULL, at);
            break;
        }
        int32_t v = op == LOOM_IR_OP_ATTENTION_GRAD_V ? -1 : input(b, dt, rank, vs);
        /* every other sample drops weights, from a constant seed */
        loom_ir_attrs atd = at;
        int32_t seed = -1;
        if (rnd(b) % 2) {
            atd.dropout = 0.3;
            seed = add(b, LOOM_IR_OP_CONSTANT, 0, NULL, LOOM_DTYPE_I64, 0, NULL,
                       (loom_ir_attrs){.value = (double)rnd_int(b, 0, 1 << 20)});
        }
        int32_t drop = seed >= 0;
        /* the operands after each op's own: the seed, the mask */
        int32_t extra[2] = {drop ? seed : mask, mask}, n_extra = drop + has_mask;
        if (op == LOOM_IR_OP_ATTENTION) {
            s = *res =
                add(b, op, 3 + n_extra, (int32_t[]){q, k, v, extra[0], extra[1]}, dt, 0, NULL, atd);
            break;
        }
        /* the gradients: the true lse (from its op), any output gradient and delta */
        int32_t dout = input(b, dt, rank, os);
        int32_t lse = add(b, LOOM_IR_OP_ATTENTION_LSE, 2 + has_mask, (int32_t[]){q, k, mask},
                          LOOM_DTYPE_F32, 0, NULL, at);
        if (op == LOOM_IR_OP_ATTENTION_GRAD_V) {
            s = *res = add(b, op, 4 + n_extra, (int32_t[]){q, k, dout, lse, extra[0], extra[1]}, dt,
                           0, NULL, atd);
            break;
        }
        int32_t delta = input(b, LOOM_DTYPE_F32, rank - 1, qs);
        s = *res =
            add(b, op, 6 + n_extra, (int32_t[]){q, k, v, dout, lse, delta, extra[0], extra[1]}, dt,
                0, NULL, atd);
        break;
    }
    case LOOM_IR_KIND_COUNT_: break;
    }
    return s;
}

/* Where op is defined and how close the JIT comes to the interpreter, for dt. */
static void domain(loom_ir_op op, loom_dtype dt, loom_ir_sample *out) {
    double lo = -4, hi = 4, rel = 1e-6, abs = 1e-7;
    switch (op) {
    case LOOM_IR_OP_LOG:
    case LOOM_IR_OP_SQRT:
    case LOOM_IR_OP_RSQRT:
    case LOOM_IR_OP_POW:
        lo = 0.05;
        rel = 1e-5;
        abs = 1e-6;
        break;
    case LOOM_IR_OP_EXP:
    case LOOM_IR_OP_TANH:
    case LOOM_IR_OP_SIGMOID:
    case LOOM_IR_OP_GELU:
    case LOOM_IR_OP_GELU_TANH:
        rel = 1e-5;
        abs = 1e-6;
        break;
    case LOOM_IR_OP_DIV: lo = 0.5; break;
    case LOOM_IR_OP_REDUCE_SUM:
    case LOOM_IR_OP_REDUCE_MEAN:
    case LOOM_IR_OP_MATMUL:
        rel = 1e-5;
        abs = 1e-4;
        break;
    case LOOM_IR_OP_MAX_POOL2D_GRAD: /* sums of dy where windows overlap */
        rel = 1e-5;
        abs = 1e-4;
        break;
    case LOOM_IR_OP_GATHER: /* indices in [-1, 6]: axes of 1..6, the ends clamped */
        lo = -1;
        hi = 6;
        break;
    case LOOM_IR_OP_SCATTER_ADD: /* likewise; sums where indices repeat */
        lo = -1;
        hi = 6;
        rel = 1e-5;
        abs = 1e-4;
        break;
    case LOOM_IR_OP_CONV2D: /* [-1, 1]: col2im's 16-bit window terms round each */
    case LOOM_IR_OP_CONV2D_GRAD_INPUT:
    case LOOM_IR_OP_CONV2D_GRAD_WEIGHT:
    case LOOM_IR_OP_ATTENTION: /* sums over S keys in f32 (the interpreter's in f64) */
    case LOOM_IR_OP_ATTENTION_LSE:
    case LOOM_IR_OP_ATTENTION_GRAD_Q:
    case LOOM_IR_OP_ATTENTION_GRAD_K:
    case LOOM_IR_OP_ATTENTION_GRAD_V:
        lo = -1;
        hi = 1;
        rel = 1e-5;
        abs = 1e-4;
        break;
    case LOOM_IR_OP_INPUT:
    case LOOM_IR_OP_CONSTANT:
    case LOOM_IR_OP_NEG:
    case LOOM_IR_OP_ABS:
    case LOOM_IR_OP_RELU:
    case LOOM_IR_OP_ISFINITE:
    case LOOM_IR_OP_ADD:
    case LOOM_IR_OP_SUB:
    case LOOM_IR_OP_MUL:
    case LOOM_IR_OP_MAXIMUM:
    case LOOM_IR_OP_MINIMUM:
    case LOOM_IR_OP_EQ:
    case LOOM_IR_OP_NE:
    case LOOM_IR_OP_LT:
    case LOOM_IR_OP_LE:
    case LOOM_IR_OP_GT:
    case LOOM_IR_OP_GE:
    case LOOM_IR_OP_SELECT:
    case LOOM_IR_OP_CAST:
    case LOOM_IR_OP_BROADCAST:
    case LOOM_IR_OP_RESHAPE:
    case LOOM_IR_OP_TRANSPOSE:
    case LOOM_IR_OP_REDUCE_MAX:
    case LOOM_IR_OP_SLICE:
    case LOOM_IR_OP_PAD:
    case LOOM_IR_OP_CONCAT:
    case LOOM_IR_OP_IOTA:
    case LOOM_IR_OP_RAND_UNIFORM:
    case LOOM_IR_OP_ALL_REDUCE:
    case LOOM_IR_OP_BROADCAST_FROM:
    case LOOM_IR_OP_ALL_GATHER:
    case LOOM_IR_OP_MAX_POOL2D:
    case LOOM_IR_OP_COUNT_: break;
    }
    if (dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16) { /* rounded after every node */
        rel = rel * 1e3 + 1e-2;
        abs = abs * 1e3 + 1e-2;
    } else if (dt == LOOM_DTYPE_F64) {
        rel = rel * 1e-3 + 1e-12;
        abs *= 1e-3;
    } else if (loom_ir_dtype_is_int(dt)) {
        lo = -20;
        hi = 20;
        rel = abs = 0;
    }
    if (loom_ir_op_traits(op)->exact || op == LOOM_IR_OP_MAX_POOL2D)
        rel = abs = 0;
    *out = (loom_ir_sample){.lo = lo, .hi = hi, .rel_tol = rel, .abs_tol = abs};
}

loom_status loom_ir_sample_build(loom_ir_graph *g, loom_ir_op op, loom_dtype dt, bool small,
                                 uint64_t *rng, loom_ir_sample *out, loom_ir_diag *d) {
    if (!g || !rng || !out)
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "sample: %s is NULL",
                                !g     ? "the graph"
                                : !rng ? "the generator"
                                       : "the output");
    if (!loom_ir_op_accepts(op, dt))
        return loom_ir_diag_set(d, LOOM_STATUS_INVALID_ARGUMENT, "sample: %s does not take %s",
                                loom_ir_op_name(op), loom_dtype_name(dt));
    sb b = {.g = g, .rng = rng, .small = small, .d = d, .st = LOOM_OK};
    domain(op, dt, out);
    int32_t res = -1;
    out->subject = build(&b, op, dt, &res);
    output(&b, res);
    return b.st;
}

void loom_ir_sample_fill(void *buf, loom_dtype dt, int64_t n, double lo, double hi, uint64_t *rng) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = loom_ir_sample_next(rng);
        if (loom_ir_dtype_is_float(dt))
            loom_ir_store_f64(buf, dt, i,
                              lo + (hi - lo) * ((double)(r >> 11) / 9007199254740992.0));
        else if (dt == LOOM_DTYPE_BOOL)
            loom_ir_store_i64(buf, dt, i, (int64_t)(r & 1));
        else
            loom_ir_store_i64(buf, dt, i, (int64_t)lo + (int64_t)(r % (uint64_t)(hi - lo + 1)));
    }
}
